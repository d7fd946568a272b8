//! The daemon serves its OpenAPI document (`GET /v1/openapi.json`), and what it answers
//! matches it: every property an answer carries is in its schema, and every required
//! one is there; an enumeration's value is one of its values. And the error contract,
//! walked over every route and method of the document: each answers the errors it
//! declares and no other, every error JSON with a code of the document.

use serde_json::Value;
use sigma_daemon::client::{AcquireOptions, Client};
use sigma_daemon::http::ErrorCode;

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

// ---------------------------------------------------------------------------------
// The error contract, route by route

/// The lock the walk uses (percent-encoded in paths: its `/` is part of the name).
const NAME: &str = "contract%2Fwalk";

/// What a request of the walk sends.
struct Req {
    method: &'static str,
    /// The path as the document writes it (`{name}` filled in with `name`), or an
    /// unknown one.
    template: String,
    name: &'static str,
    /// The query string, without `?`.
    query: String,
    /// Whether to send the route's bearer token.
    bearer: bool,
    host: Option<&'static str>,
    origin: Option<&'static str>,
    /// Whether a POST says `Content-Type: application/json`.
    json: bool,
    body: Vec<u8>,
}

impl Req {
    fn new(method: &'static str, template: &str) -> Req {
        Req {
            method,
            template: template.to_owned(),
            name: NAME,
            query: String::new(),
            bearer: true,
            host: None,
            origin: None,
            json: true,
            body: b"{}".to_vec(),
        }
    }
    fn query(mut self, q: &str) -> Req {
        self.query = q.to_owned();
        self
    }
    fn name(mut self, name: &'static str) -> Req {
        self.name = name;
        self
    }
    fn body(mut self, body: Value) -> Req {
        self.body = body.to_string().into_bytes();
        self
    }
}

/// Walks the served document: sends requests, checks each answer against the contract,
/// and records which declared statuses were answered.
struct Walk {
    doc: Value,
    api: String,
    http: reqwest::Client,
    api_token: String,
    admin_token: String,
    /// `(template, method, status)` of every answer to a route of the document.
    answered: std::collections::BTreeSet<(String, String, u16)>,
}

impl Walk {
    /// The statuses the document declares for `method` on `template`; `None` if it
    /// lists no such operation.
    fn declared(&self, template: &str, method: &str) -> Option<Vec<u16>> {
        let op = self.doc["paths"][template][method.to_lowercase()].as_object()?;
        Some(op["responses"].as_object().unwrap().keys().map(|s| s.parse().unwrap()).collect())
    }

    fn operations(&self) -> Vec<(String, &'static str)> {
        let mut ops = Vec::new();
        for (template, item) in self.doc["paths"].as_object().unwrap() {
            for method in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
                if item.get(method.to_lowercase()).is_some() {
                    ops.push((template.clone(), method));
                }
            }
        }
        ops
    }

    fn admin(template: &str) -> bool {
        template.starts_with("/v1/admin/") || template.starts_with("/v1/revoke/")
    }

    /// Sends `req` and checks its answer: any error is JSON, an `ErrorBody` whose code
    /// is one of the document's and has that status; an operation of the document
    /// answers only statuses it declares. Answers the status and the body.
    async fn send(&mut self, req: Req) -> (u16, Value) {
        let path = req.template.replace("{name}", req.name);
        let mut url = format!("http://{}{path}", self.api);
        if !req.query.is_empty() {
            url = format!("{url}?{}", req.query);
        }
        let method = reqwest::Method::from_bytes(req.method.as_bytes()).unwrap();
        let mut request = self.http.request(method, &url);
        if req.bearer {
            let token = if Walk::admin(&req.template) { &self.admin_token } else { &self.api_token };
            request = request.bearer_auth(token);
        }
        if let Some(host) = req.host {
            request = request.header("host", host);
        }
        if let Some(origin) = req.origin {
            request = request.header("origin", origin);
        }
        if req.method != "GET" {
            if req.json {
                request = request.header("content-type", "application/json");
            }
            request = request.body(req.body);
        }
        let resp = request.send().await.unwrap_or_else(|e| panic!("{} {url}: {e}", req.method));
        let status = resp.status().as_u16();
        let json = resp.headers().get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
        let allow = resp.headers().get("allow").map(|v| v.to_str().unwrap().to_owned());
        let text = resp.text().await.unwrap();
        let what = format!("{} {url} answered {status} {text}", req.method);
        let body: Value =
            if status == 200 && !json { Value::Null } else { serde_json::from_str(&text).unwrap_or_default() };
        if status >= 400 {
            assert!(json, "{what}: an error answer that is not JSON");
            conforms(&self.doc, "ErrorBody", &body, &what);
            let code = body["code"].as_str().unwrap();
            let code = ErrorCode::parse(code).unwrap_or_else(|| panic!("{what}: {code} is no ErrorCode"));
            assert_eq!(code.status().as_u16(), status, "{what}: code {code} has status {}", code.status());
            if status == 405 {
                assert!(allow.is_some(), "{what}: a 405 without Allow");
            }
        }
        if let Some(declared) = self.declared(&req.template, req.method) {
            assert!(declared.contains(&status), "{what}, which it does not declare ({declared:?})");
            self.answered.insert((req.template.clone(), req.method.to_owned(), status));
        }
        (status, body)
    }

    /// [`Walk::send`], and the answer must be `status` with `code`.
    async fn expect(&mut self, req: Req, status: u16, code: &str) -> Value {
        let what = format!("{} {} ?{}", req.method, req.template, req.query);
        let (got, body) = self.send(req).await;
        assert_eq!((got, body["code"].as_str()), (status, Some(code)), "{what}: {body}");
        body
    }
}

/// A POST with a body of `len` bytes sent in chunks (no `Content-Length`, so the gate
/// cannot see its size coming): its status and body.
async fn post_chunked(api: &str, path: &str, bearer: &str, len: usize) -> (u16, Value) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(api).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {api}\r\nAuthorization: Bearer {bearer}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b' '; len];
    // The daemon may answer and close before it read it all.
    let _ = s.write_all(format!("{len:x}\r\n").as_bytes()).await;
    let _ = s.write_all(&chunk).await;
    let _ = s.write_all(b"\r\n0\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{answer}"));
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    (status, serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}")))
}

/// Declared error statuses the walk does not provoke, and why.
fn not_provoked(template: &str, method: &str, status: u16) -> Option<&'static str> {
    match (template, method, status) {
        ("/v1/locks/{name}/acquire", "POST", 409) => Some("lost between its win and its answer: a race"),
        (_, _, 500) => Some("the daemon's own failure (no randomness, metrics that do not encode)"),
        ("/v1/locks/{name}/acquire" | "/v1/locks/{name}/keepalive" | "/readyz", _, 503) => None,
        (_, _, 503) => Some(
            "`busy` needs 256 requests of this kind at once, `unresponsive` a stopped node; http_gate.rs fills the \
             acquires' pool",
        ),
        _ => None,
    }
}

/// The error contract, walked over every route and method of the served document: each
/// error status an operation declares is provoked (the gate's, the query check's and
/// its own) unless [`not_provoked`] says why not; every answer is one it declares; every
/// error is JSON with an `ErrorCode` of the document, of its status; a method a path does
/// not list answers 405 and a path the document does not list 404, JSON too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_the_errors_it_declares_and_no_other() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("api.token");
    let extra = [
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--api-token-file",
        token_file.to_str().unwrap(),
        "--takeover-delay",
        "5s",
        "--api-max-waiters-per-lock",
        "1",
    ];
    let d = daemon_with(dir.path(), "walk", &[], &extra).await;
    let started = Instant::now();
    let api_token = std::fs::read_to_string(&token_file).unwrap().trim().to_owned();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let doc_url = format!("http://{}/v1/openapi.json", d.api);
    let doc: Value = http.get(&doc_url).bearer_auth(&api_token).send().await.unwrap().json().await.unwrap();
    let mut w = Walk {
        doc,
        api: d.api.clone(),
        http,
        api_token,
        admin_token: daemon::admin_token(dir.path()),
        answered: Default::default(),
    };
    let listed: Vec<&str> = w.doc["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(listed, ErrorCode::ALL.map(|c| c.as_str()), "the document lists every code");

    // Held back for the takeover delay at first.
    w.expect(Req::new("GET", "/readyz"), 503, "held_back").await;
    assert!(started.elapsed() < Duration::from_secs(4), "the machine is too slow for this test's 5 s delay");

    // What every route answers, whatever it is.
    let ops = w.operations();
    assert!(ops.len() >= 15, "{ops:?}");
    for (template, method) in &ops {
        let (t, m) = (template.as_str(), *method);
        let mut no_bearer = Req::new(m, t);
        no_bearer.bearer = false;
        w.expect(no_bearer, 401, "unauthorized").await;
        let mut rebound = Req::new(m, t);
        rebound.host = Some("evil.example:7591");
        w.expect(rebound, 403, "bad_host").await;
        let mut page = Req::new(m, t);
        page.origin = Some("http://evil.example");
        w.expect(page, 403, "bad_origin").await;
        let body = w.expect(Req::new(m, t).query("bogus=1"), 400, "unknown_parameter").await;
        assert!(body["error"].as_str().unwrap().contains("bogus"), "{m} {t}: names the parameter: {body}");
        if m == "POST" {
            let mut form = Req::new(m, t);
            form.json = false;
            w.expect(form, 415, "bad_content_type").await;
            let mut big = Req::new(m, t);
            big.body = vec![b' '; 70_000];
            w.expect(big, 413, "body_too_large").await;
            let token = if Walk::admin(t) { w.admin_token.clone() } else { w.api_token.clone() };
            let (status, body) = post_chunked(&w.api, &t.replace("{name}", NAME), &token, 70_000).await;
            assert_eq!((status, body["code"].as_str()), (413, Some("body_too_large")), "{t} chunked: {body}");
        }
        // The methods the path does not list.
        for other in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
            if w.declared(t, other).is_some() {
                continue;
            }
            let lock_view = t == "/v1/locks/{name}";
            match (t.starts_with("/v1/locks/"), other) {
                // `GET /v1/locks/NAME/acquire` shows the lock named `NAME/acquire`.
                (true, "GET") => continue,
                // `POST /v1/locks/A%2FB` reads `B` as the action on lock `A`.
                (true, "POST") if lock_view => w.expect(Req::new(other, t), 404, "not_found").await,
                _ => w.expect(Req::new(other, t), 405, "method_not_allowed").await,
            };
        }
    }
    // Paths the document does not list.
    for (m, path) in [("GET", "/v1/nope"), ("POST", "/nope"), ("GET", "/"), ("POST", "/v1/locks/x")] {
        w.expect(Req::new(m, path), 404, "not_found").await;
    }

    // Each route's own.
    let acquire = "/v1/locks/{name}/acquire";
    w.expect(Req::new("POST", acquire).name("bad%20name"), 400, "bad_name").await;
    w.expect(Req::new("POST", acquire).query("n=3"), 400, "bad_quorum").await;
    w.expect(Req::new("POST", acquire).query("timeout_ms=soon"), 400, "bad_request").await;
    w.expect(Req::new("POST", acquire).query("ttl_ms=1"), 400, "bad_request").await;
    let (status, held) = w.send(Req::new("POST", acquire).query("timeout_ms=30000&ttl_ms=60000")).await;
    assert_eq!(status, 200, "{held}");
    let holder = serde_json::json!({ "token": held["token"], "lease": held["lease"] });
    w.expect(Req::new("POST", acquire).query("timeout_ms=200"), 423, "not_won").await;
    let waiting = {
        let url = format!("http://{}/v1/locks/{NAME}/acquire?timeout_ms=20000", w.api);
        let request = w.http.post(url).bearer_auth(&w.api_token).header("content-type", "application/json");
        tokio::spawn(request.send())
    };
    let waiters = format!("http://{}/v1/locks/{NAME}", w.api);
    eventually("an acquire to wait", || async {
        let view: Value = w.http.get(&waiters).bearer_auth(&w.api_token).send().await.unwrap().json().await.unwrap();
        view["waiting_on_this_node"] == true
    })
    .await;
    w.expect(Req::new("POST", acquire).query("timeout_ms=20000"), 503, "too_many_waiters").await;
    waiting.abort();
    let too_long = serde_json::json!({ "value": "x".repeat(4097) });
    w.expect(Req::new("POST", acquire).query("timeout_ms=200").body(too_long), 400, "bad_value").await;
    let both =
        serde_json::json!({ "token": held["token"], "lease": held["lease"], "value": "a", "value_base64": "YQ==" });
    w.expect(Req::new("POST", "/v1/locks/{name}/value").body(both), 400, "bad_value").await;
    for action in ["keepalive", "release", "value"] {
        let t = format!("/v1/locks/{{name}}/{action}");
        w.expect(Req::new("POST", &t), 400, "bad_lease").await;
        let stranger = serde_json::json!({ "token": held["token"], "lease": "0".repeat(32) });
        w.expect(Req::new("POST", &t).body(stranger), 404, "not_held").await;
    }
    w.expect(Req::new("GET", "/v1/locks/{name}").name("bad%20name"), 400, "bad_name").await;
    w.expect(Req::new("GET", "/v1/locks/{name}").name("%FF"), 400, "bad_name").await;
    w.expect(Req::new("GET", "/v1/inspect/{name}").name("bad%20name"), 400, "bad_name").await;
    let revoke = "/v1/revoke/{name}";
    w.expect(Req::new("POST", revoke), 400, "bad_request").await;
    w.expect(Req::new("POST", revoke).name("bad%20name").body(serde_json::json!({ "token": 1 })), 400, "bad_name")
        .await;
    let wrong = serde_json::json!({ "token": held["token"].as_u64().unwrap() + 1 });
    w.expect(Req::new("POST", revoke).body(wrong), 404, "not_held").await;
    for t in ["/v1/admin/block", "/v1/admin/unblock", "/v1/admin/forget"] {
        w.expect(Req::new("POST", t), 400, "bad_request").await;
        w.expect(Req::new("POST", t).body(serde_json::json!({ "peers": ["nobody"] })), 400, "bad_request").await;
    }
    let (status, kept) = w.send(Req::new("POST", "/v1/locks/{name}/keepalive").body(holder.clone())).await;
    assert_eq!(status, 200, "{kept}");

    // Stopping: no new acquire, and the holder is told to stop; its release is served.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(d.child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let stopping = Req::new("POST", "/v1/locks/{name}/keepalive").body(holder.clone());
    eventually_stopping(&mut w, stopping).await;
    w.expect(Req::new("POST", acquire).name("other"), 503, "stopping").await;
    let (status, released) = w.send(Req::new("POST", "/v1/locks/{name}/release").body(holder)).await;
    assert_eq!(status, 200, "{released}");

    // Every error status each operation declares was answered, or is excused.
    let mut missing = Vec::new();
    for (template, method) in &ops {
        for status in w.declared(template, method).unwrap().into_iter().filter(|s| *s >= 400) {
            let answered = w.answered.contains(&(template.clone(), method.to_string(), status));
            if !answered && not_provoked(template, method, status).is_none() {
                missing.push(format!("{method} {template} {status}"));
            }
        }
    }
    assert!(missing.is_empty(), "declared, never answered, no reason given: {missing:?}");
}

/// Sends `req` (a keep-alive) until the daemon, told to stop, answers 503 `stopping`.
async fn eventually_stopping(w: &mut Walk, req: Req) {
    let deadline = std::time::Instant::now() + daemon::PATIENCE;
    loop {
        let again = Req { body: req.body.clone(), template: req.template.clone(), query: req.query.clone(), ..req };
        let (status, body) = w.send(again).await;
        if status == 503 {
            assert_eq!(body["code"], "stopping", "{body}");
            return;
        }
        assert_eq!(status, 200, "{body}");
        assert!(std::time::Instant::now() < deadline, "the daemon never said it stops");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
