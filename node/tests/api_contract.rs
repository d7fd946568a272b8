//! The daemon serves its OpenAPI document (`GET /v1/openapi.json`), and what it answers
//! matches it: every property an answer carries is in its schema, and every required
//! one is there.

use serde_json::Value;
use sigma_node::client::{AcquireOptions, Client};

mod daemon;

use daemon::{daemon, get_json};

/// Checks `value` against the component schema `name`: object keys within its
/// properties, its required properties present; nested objects by their `$ref`s.
fn conforms(doc: &Value, name: &str, value: &Value, path: &str) {
    let schema = &doc["components"]["schemas"][name];
    assert!(schema.is_object(), "{path}: no schema {name}");
    let props = schema["properties"].as_object().unwrap_or_else(|| panic!("{path}: {name} has no properties"));
    let obj = value.as_object().unwrap_or_else(|| panic!("{path}: {name} is not an object: {value}"));
    for key in obj.keys() {
        assert!(props.contains_key(key), "{path}: {key:?} is not in the schema of {name}");
    }
    for req in schema["required"].as_array().into_iter().flatten() {
        let req = req.as_str().unwrap();
        assert!(obj.contains_key(req), "{path}: required {req:?} of {name} missing: {value}");
    }
    for (key, prop) in props {
        let Some(v) = obj.get(key).filter(|v| !v.is_null()) else { continue };
        let target = prop["$ref"]
            .as_str()
            .or_else(|| prop["items"]["$ref"].as_str())
            .or_else(|| prop["oneOf"].as_array()?.iter().find_map(|o| o["$ref"].as_str()));
        if let Some(r) = target.and_then(|r| r.strip_prefix("#/components/schemas/")) {
            match v {
                Value::Array(items) => items.iter().for_each(|i| conforms(doc, r, i, &format!("{path}.{key}[]"))),
                v => conforms(doc, r, v, &format!("{path}.{key}")),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_match_the_served_openapi_document() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path(), "a", &[]).await;
    let doc = get_json(&format!("http://{}/v1/openapi.json", d.api)).await;
    assert_eq!(doc["openapi"].as_str().map(|v| &v[..2]), Some("3."), "{doc}");

    let client = Client::new(d.api.parse::<std::net::SocketAddr>().unwrap());
    let opts = AcquireOptions { timeout: Some(std::time::Duration::from_secs(30)), ..AcquireOptions::default() };
    let held = client.acquire("contract/x", &opts).await.expect("a one-node swarm grants");
    conforms(&doc, "Acquired", &serde_json::to_value(&held).unwrap(), "acquire");

    let status = get_json(&format!("http://{}/v1/status", d.api)).await;
    conforms(&doc, "Status", &status, "status");
    let lock = get_json(&format!("http://{}/v1/locks/contract%2Fx", d.api)).await;
    conforms(&doc, "LockView", &lock, "lock");
    let inspection = get_json(&format!("http://{}/v1/inspect/contract%2Fx", d.api)).await;
    assert!(inspection["holder"].is_object(), "{inspection}");
    conforms(&doc, "Inspection", &inspection, "inspect");
    let kept = client.keepalive("contract/x", held.token, &held.lease).await.unwrap();
    conforms(&doc, "KeptAlive", &serde_json::to_value(&kept).unwrap(), "keepalive");

    // An error body too.
    let resp = daemon::http()
        .post(format!("http://{}/v1/locks/contract%2Fx/release", d.api))
        .json(&serde_json::json!({ "token": held.token + 1, "lease": held.lease }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    conforms(&doc, "ErrorBody", &resp.json::<Value>().await.unwrap(), "release");
    client.release("contract/x", held.token, &held.lease).await.unwrap();
}
