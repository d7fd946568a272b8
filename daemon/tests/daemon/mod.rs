//! Real `sigma run` daemons for end-to-end tests (cli.rs, bad_input.rs): spawned on
//! 127.0.0.1 with ephemeral ports, ready once they print `SIGMA_READY`, killed on drop,
//! their log printed when a test fails; and the HTTP helpers to talk to them.

#![allow(dead_code)] // each test file uses part of it

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use libp2p::{Multiaddr, PeerId};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Set (non-empty) to let a test whose tool is missing (python3, etcd) skip instead of
/// fail. CI installs the tools (.ci/run) and does not set it.
pub const SKIP_MISSING_TOOLS: &str = "SIGMA_SKIP_MISSING_TOOLS";

/// Whether `program --version` (or `program -V`, tmux's) runs. If it does not, the test
/// fails saying how to get it (`install`), unless [`SKIP_MISSING_TOOLS`] is set: then
/// false, and the test skips.
pub async fn have_tool(program: &str, install: &str) -> bool {
    for flag in ["--version", "-V"] {
        if Command::new(program).arg(flag).output().await.is_ok_and(|o| o.status.success()) {
            return true;
        }
    }
    let missing = format!("{program} is not installed ({install})");
    if std::env::var_os(SKIP_MISSING_TOOLS).is_some_and(|v| !v.is_empty()) {
        eprintln!("{missing}: skipped, {SKIP_MISSING_TOOLS} is set");
        return false;
    }
    panic!("{missing}; set {SKIP_MISSING_TOOLS}=1 to skip the tests that need it");
}

/// The `sigma` binary under test.
pub const SIGMA: &str = env!("CARGO_BIN_EXE_sigma");
/// Upper bound for anything that should take a second or two.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A `sigma run` process; killed when dropped. Its log is printed if the test fails.
pub struct Daemon {
    pub child: Child,
    pub peer_id: PeerId,
    pub listen: Vec<Multiaddr>,
    pub api: String,
    /// The `--metrics` listener's address, if one was asked for.
    pub metrics: Option<String>,
    /// Set once the daemon printed `SIGMA_SERVING`.
    pub serving: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub log: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!("--- log of daemon {} (last lines) ---", self.peer_id);
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

/// Starts `sigma run` (key file and log in `dir`, named after `tag`) and waits until it
/// is up (listening; `sigma status` says when it serves).
pub async fn daemon(dir: &Path, tag: &str, bootstrap: &[Multiaddr]) -> Daemon {
    daemon_with(dir, tag, bootstrap, &["--listen", "/ip4/127.0.0.1/tcp/0"]).await
}

/// [`daemon`] with more arguments (a `--listen` among them). 3 s leases (unless `extra`
/// gives `--lease-ms`), fast liveness pings and gossip keep the takeover delay near 5 s;
/// the API on a free loopback port unless `extra` gives `--api`.
pub async fn daemon_with(dir: &Path, tag: &str, bootstrap: &[Multiaddr], extra: &[&str]) -> Daemon {
    let log = dir.join(format!("{tag}.log"));
    let mut cmd = Command::new(SIGMA);
    cmd.arg("run");
    if !extra.contains(&"--api") {
        cmd.args(["--api", "127.0.0.1:0"]);
    }
    if !extra.contains(&"--lease-ms") {
        cmd.args(["--lease-ms", "3000"]);
    }
    cmd.args([
        "--ping-interval",
        "200ms",
        "--ping-timeout",
        "500ms",
        "--gossip-interval",
        "100ms",
        "--gossip-liveness",
        "500ms",
    ])
    .args(extra)
    .arg("--key-file")
    .arg(dir.join(format!("{tag}.key")))
    .env("RUST_LOG", "info,sigma_node=debug,sigma_behaviour=debug")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(std::fs::File::create(&log).unwrap())
    .kill_on_drop(true);
    for b in bootstrap {
        cmd.args(["--bootstrap", &b.to_string()]);
    }
    let mut child = cmd.spawn().expect("spawn sigma run");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut peer_id, mut listen, mut api, mut metrics) = (String::new(), Vec::new(), String::new(), None);
    let ready = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(v) = line.strip_prefix("SIGMA_PEER_ID=") {
                peer_id = v.to_owned();
            } else if let Some(v) = line.strip_prefix("SIGMA_LISTEN=") {
                listen.push(v.parse::<Multiaddr>().expect("SIGMA_LISTEN is a multiaddr"));
            } else if let Some(v) = line.strip_prefix("SIGMA_API=") {
                api = v.to_owned();
            } else if let Some(v) = line.strip_prefix("SIGMA_METRICS=") {
                metrics = Some(v.to_owned());
            } else if line == "SIGMA_READY" {
                return true;
            }
        }
        false
    };
    let ok = tokio::time::timeout(PATIENCE, ready).await.unwrap_or(false);
    if !ok {
        panic!("daemon {tag} did not get ready:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
    }
    // Keep draining stdout so the daemon never blocks on a full pipe.
    let serving = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = serving.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if line == "SIGMA_SERVING" {
                seen.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    let peer_id: PeerId = peer_id.parse().expect("SIGMA_PEER_ID is a peer id");
    assert!(!listen.is_empty() && !api.is_empty());
    assert!(listen.iter().all(|a| a.to_string().ends_with(&format!("/p2p/{peer_id}"))), "{listen:?}");
    Daemon { child, peer_id, listen, api, metrics, serving, log }
}

/// An HTTP client that never goes through a proxy (loopback only).
pub fn http() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(sigma_daemon::http::gate::CLIENT_HEADER, reqwest::header::HeaderValue::from_static("tests"));
    reqwest::Client::builder().no_proxy().default_headers(headers).build().unwrap()
}

/// GET `url`, which must succeed, as text.
pub async fn get_text(url: &str) -> String {
    let resp = http().get(url).timeout(Duration::from_secs(10)).send().await.unwrap();
    assert!(resp.status().is_success(), "{url}: {}", resp.status());
    resp.text().await.unwrap()
}

/// GET `url`, which must succeed, as JSON.
pub async fn get_json(url: &str) -> Value {
    serde_json::from_str(&get_text(url).await).unwrap()
}

/// Polls `check` every 20 ms until it holds; panics after [`PATIENCE`].
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of the sample `series` (name and labels, as printed) in a `/metrics` text.
pub fn sample(metrics: &str, series: &str) -> Option<u64> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The admin token of the daemons whose key files are in `dir` (`admin.token` beside
/// them, created by the first to start).
pub fn admin_token(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("admin.token")).expect("the daemons' admin token file").trim().to_owned()
}

/// `sigma lock NAME --api API OPTIONS -- sh -c SCRIPT`, its output piped, killed on drop.
pub fn sigma_lock(api: &str, name: &str, options: &[&str], script: &str) -> Command {
    let mut cmd = Command::new(SIGMA);
    cmd.args(["lock", name, "--api", api])
        .args(options)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// `GET /v1/status` of `d`.
pub async fn status(d: &Daemon) -> Value {
    get_json(&format!("http://{}/v1/status", d.api)).await
}

/// Waits until `d` serves and counts `members` members (itself included).
pub async fn serving_with(d: &Daemon, members: u64) {
    eventually(&format!("{} to serve with {members} members", d.peer_id), || async move {
        let st = status(d).await;
        st["ready"] == true && st["members"] == members
    })
    .await;
}

/// `sigma lock NAME --timeout T -- sh -c 'echo ran'` through daemon `d`.
pub async fn lock_echo(d: &Daemon, name: &str, timeout: &str) -> std::process::Output {
    Command::new(SIGMA)
        .args(["lock", name, "--api", &d.api, "--timeout", timeout, "--", "sh", "-c", "echo ran"])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap()
}

/// The lock was held and the command ran.
pub fn assert_locked(out: &std::process::Output, who: &str) {
    assert!(out.status.success(), "{who}: {:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n", "{who}");
}
