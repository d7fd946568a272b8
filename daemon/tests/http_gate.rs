//! The control API's gate on real daemons: what a web page in the user's browser could
//! send (a form POST, a page from another origin, a DNS-rebound host name), more
//! requests at once than allowed, and the bearer token of `--api-token-file`.

use serde_json::Value;
use tokio::process::Command;

mod daemon;

use daemon::{daemon_with, eventually, get_text, http, sample, SIGMA};

/// A client with no header of its own: what a browser or `curl` sends by default.
fn bare() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn code(resp: reqwest::Response) -> (u16, String) {
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or_default();
    (status, body["code"].as_str().unwrap_or_default().to_owned())
}

/// Waits until the one-node swarm serves (its start-up takeover delay has passed).
async fn ready(api: &str) {
    let url = format!("http://{api}/v1/status");
    eventually("the daemon to serve", || async {
        let st: Value = serde_json::from_str(&get_text(&url).await).unwrap();
        st["ready"] == true
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_pages_rebound_names_and_floods_are_refused_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon_with(dir.path(), "a", &[], &["--listen", "/ip4/127.0.0.1/tcp/0", "--api-max-requests", "3"]).await;
    let a = d.api.clone();
    ready(&a).await;
    let acquire = |name: &str| format!("http://{a}/v1/locks/{name}/acquire?timeout_ms=20000");

    // A web page's form POST (a simple request: no preflight) takes no lock.
    let form = bare()
        .post(acquire("deploy"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("x=1")
        .send()
        .await
        .unwrap();
    assert_eq!(code(form).await, (415, "bad_content_type".to_owned()));
    let plain = bare().post(acquire("deploy")).send().await.unwrap();
    assert_eq!(code(plain).await, (415, "bad_content_type".to_owned()), "no content type at all");
    // A page of another origin, and a rebound name, even with a JSON body.
    let cross = bare()
        .post(acquire("deploy"))
        .header("content-type", "application/json")
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(code(cross).await, (403, "bad_origin".to_owned()));
    let rebound =
        bare().get(format!("http://{a}/v1/locks/deploy")).header("host", "evil.example:7700").send().await.unwrap();
    assert_eq!(code(rebound).await, (403, "bad_host".to_owned()));
    let big = http()
        .post(format!("http://{a}/v1/locks/deploy/release"))
        .header("content-type", "application/json")
        .body(vec![b' '; 100_000])
        .send()
        .await
        .unwrap();
    assert_eq!(code(big).await, (413, "body_too_large".to_owned()));
    let view: Value = serde_json::from_str(&get_text(&format!("http://{a}/v1/locks/deploy")).await).unwrap();
    assert_eq!(view["held_by_this_node"], false, "a refused request took the lock: {view}");
    // A program that says it is one (JSON content type) gets it.
    let ok = bare().post(acquire("deploy")).header("content-type", "application/json").send().await.unwrap();
    assert_eq!(ok.status(), 200);

    // Four acquires for the held lock at once: three wait (the lock's holder keeps it
    // for its 5 s client lease), the fourth is refused at once, not queued.
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let url = acquire("deploy");
            tokio::spawn(async move { http().post(url).send().await })
        })
        .collect();
    let (first, _, waiters) = futures::future::select_all(waiters).await;
    let busy = code(first.unwrap().unwrap()).await;
    assert_eq!(busy, (503, "busy".to_owned()));
    let status = format!("http://{a}/v1/status");
    // Clients that go away give their places back.
    for w in &waiters {
        w.abort();
    }
    eventually("the API to answer again", || async { bare().get(&status).send().await.unwrap().status() == 200 }).await;

    let metrics = get_text(&format!("http://{a}/metrics")).await;
    for reason in ["bad_content_type", "bad_origin", "bad_host", "body_too_large", "busy"] {
        let n = sample(&metrics, &format!("sigma_http_rejected_total{{reason=\"{reason}\"}}"));
        let want = if reason == "bad_content_type" { 2 } else { 1 };
        if reason == "busy" {
            assert!(n >= Some(1), "{reason}: {n:?}");
        } else {
            assert_eq!(n, Some(want), "{reason}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_locks_the_api_to_those_who_can_read_it() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("api-token");
    let file = token_file.to_str().unwrap();
    let d = daemon_with(dir.path(), "t", &[], &["--listen", "/ip4/127.0.0.1/tcp/0", "--api-token-file", file]).await;
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the created token file is private");
    let token = std::fs::read_to_string(&token_file).unwrap().trim().to_owned();
    assert_eq!(token.len(), 64);

    let status = format!("http://{}/v1/status", d.api);
    let resp = http().get(&status).send().await.unwrap();
    assert_eq!(code(resp).await, (401, "unauthorized".to_owned()));
    let resp = http().get(&status).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(code(resp).await, (401, "unauthorized".to_owned()));
    eventually("the daemon to serve", || async {
        let st: Value = http().get(&status).bearer_auth(&token).send().await.unwrap().json().await.unwrap();
        st["ready"] == true
    })
    .await;

    // The CLI reads the file (flag or environment); without it, it is told why.
    let out = Command::new(SIGMA).args(["status", "--api", &d.api]).output().await.unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Bearer"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(SIGMA).args(["status", "--api", &d.api, "--api-token-file", file]).output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(SIGMA)
        .args(["lock", "tok", "--api", &d.api, "--timeout", "20s", "--", "true"])
        .env("SIGMA_API_TOKEN_FILE", file)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // A restart keeps the token.
    drop(d);
    let d = daemon_with(dir.path(), "t2", &[], &["--listen", "/ip4/127.0.0.1/tcp/0", "--api-token-file", file]).await;
    let resp = http().get(format!("http://{}/v1/status", d.api)).bearer_auth(&token).send().await.unwrap();
    assert_eq!(resp.status(), 200);
}
