//! The daemon serves its OpenAPI document (`GET /v1/openapi.json`), and what it answers
//! matches it: every property an answer carries is in its schema, and every required
//! one is there; an enumeration's value is one of its values.

use serde_json::Value;
use sigma_daemon::client::{AcquireOptions, Client};

mod daemon;

use daemon::{daemon, daemon_with, eventually, get_json, http, SIGMA};

/// Checks `value` against the component schema `name`: object keys within its
/// properties, its required properties present; nested objects by their `$ref`s.
fn conforms(doc: &Value, name: &str, value: &Value, path: &str) {
    let schema = &doc["components"]["schemas"][name];
    assert!(schema.is_object(), "{path}: no schema {name}");
    if let Some(values) = schema["enum"].as_array() {
        assert!(values.contains(value), "{path}: {value} is not one of the {name} values {values:?}");
        return;
    }
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

/// The probes tell the truth. A lone daemon serves at once but holds new locks back for
/// its takeover delay: `GET /readyz` answers 503 `held_back` and `sigma status --check`
/// exits 1 until the delay has passed, then 200 and 0; `GET /healthz` answers 200
/// throughout; `SIGMA_SERVING` is printed only then. The answers conform to the
/// document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probes_say_ready_only_once_nothing_is_held_back() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let delay = Duration::from_secs(8);
    let d =
        daemon_with(dir.path(), "probes", &[], &["--listen", "/ip4/127.0.0.1/tcp/0", "--takeover-delay", "8s"]).await;
    let started = Instant::now();
    let doc = get_json(&format!("http://{}/v1/openapi.json", d.api)).await;
    let probe = |path: &'static str| {
        let url = format!("http://{}{path}", d.api);
        async move {
            let resp = http().get(url).send().await.unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    let check = || async {
        let out =
            tokio::process::Command::new(SIGMA).args(["status", "--check", "--api", &d.api]).output().await.unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (code, body) = probe("/readyz").await;
    let printed = || d.serving.load(std::sync::atomic::Ordering::SeqCst);
    assert!(!printed(), "SIGMA_SERVING printed while new locks are held back");
    assert!(started.elapsed() < delay, "the machine is too slow for this test's 8 s delay");
    assert_eq!((code, body["code"].as_str()), (503, Some("held_back")), "{body}");
    conforms(&doc, "ErrorBody", &body, "/readyz");
    let (exit, said) = check().await;
    assert_eq!(exit, Some(1), "{said}");
    assert!(said.contains("takeover delay"), "{said}");
    let (code, body) = probe("/healthz").await;
    assert_eq!(code, 200, "{body}");
    conforms(&doc, "Probe", &body, "/healthz");
    eventually("/readyz to answer 200", || async { probe("/readyz").await.0 == 200 }).await;
    assert!(started.elapsed() >= delay - Duration::from_secs(1), "ready before the takeover delay passed");
    let (code, body) = probe("/readyz").await;
    assert_eq!((code, body["readiness"].as_str()), (200, Some("serving")));
    conforms(&doc, "Probe", &body, "/readyz");
    assert_eq!(check().await.0, Some(0));
    eventually("SIGMA_SERVING on stdout", || async { printed() }).await;
}
