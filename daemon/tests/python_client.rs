//! examples/python/sigma_lock.py against a real daemon: two Python clients for one lock
//! take turns (the second is granted only after the first released, with a larger
//! fencing token), and the client lease is renewed past its TTL; a lock not won in time
//! (423 `not_won`) exits 75. A two-slot semaphore is shared by two holders at a time.

use std::path::Path;

use tokio::process::Command;

mod daemon;

use daemon::{daemon_with, eventually, get_json, have_tool};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/python/sigma_lock.py");
/// How to get python3 (a missing one fails these tests unless SIGMA_SKIP_MISSING_TOOLS is
/// set; .ci/run installs it).
const PYTHON: &str = "apt-get install python3";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_clients_take_turns_and_renew_their_lease() {
    if !have_tool("python3", PYTHON).await {
        return;
    }
    assert!(Path::new(SCRIPT).exists(), "{SCRIPT}");
    let dir = tempfile::tempdir().unwrap();
    let d = daemon_with(dir.path(), "py", &[], &["--listen", "/ip4/127.0.0.1/tcp/0"]).await;
    let status = format!("http://{}/v1/status", d.api);
    eventually("the daemon to serve", || async { get_json(&status).await["ready"] == true }).await;

    // The first holds for 10 s, twice the 5 s client TTL: only its renewals keep it.
    let first = Command::new("python3")
        .args([SCRIPT, "--api", &d.api, "--hold", "10", "py/turns"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    eventually("the first client to hold the lock", || async {
        get_json(&status).await["locks_held"].as_array().is_some_and(|h| !h.is_empty())
    })
    .await;
    // Not won in time: 423 `not_won` (sigma_lock.NotWon), exit 75.
    let late =
        Command::new("python3").args([SCRIPT, "--api", &d.api, "--timeout", "0.3", "py/turns"]).output().await.unwrap();
    let said = String::from_utf8_lossy(&late.stderr);
    assert_eq!(late.status.code(), Some(75), "not won within --timeout: {said}");
    assert!(said.contains("not_won") && !said.contains("Traceback"), "{said}");
    let waiting = std::time::Instant::now();
    let second =
        Command::new("python3").args([SCRIPT, "--api", &d.api, "--timeout", "30", "py/turns"]).output().await.unwrap();
    let waited = waiting.elapsed();
    let first = first.wait_with_output().await.unwrap();
    let (out1, out2) = (String::from_utf8_lossy(&first.stdout), String::from_utf8_lossy(&second.stdout));
    assert!(first.status.success(), "first: {out1}\n{}", String::from_utf8_lossy(&first.stderr));
    assert!(second.status.success(), "second: {out2}\n{}", String::from_utf8_lossy(&second.stderr));
    let token = |out: &str, word: &str| -> u64 {
        let line = out.lines().find(|l| l.starts_with(word)).unwrap_or_else(|| panic!("no {word} line in {out}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let (t1, t2) = (token(&out1, "acquired"), token(&out2, "acquired"));
    assert_eq!(token(&out1, "released"), t1, "the first kept its lock past its TTL: {out1}");
    assert!(t2 > t1, "tokens {t1} then {t2}");
    // Without renewals the daemon would have released the first lock one TTL (5 s) after
    // it was taken; the second was granted only when the first released, near 10 s.
    assert!(waited.as_secs_f64() > 7.0, "the second got the lock after {waited:?}: {out1}");
    assert!(!out1.contains("lost"), "{out1}");
}

/// A semaphore from Python (`--slots 2`): two holders at once on distinct slots, a third
/// not won while both hold (exit 75), won once one released; a slot count out of range
/// is refused (400 `bad_request`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_clients_share_a_two_slot_semaphore() {
    if !have_tool("python3", PYTHON).await {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = daemon_with(dir.path(), "py", &[], &["--listen", "/ip4/127.0.0.1/tcp/0"]).await;
    let status = format!("http://{}/v1/status", d.api);
    eventually("the daemon to serve", || async { get_json(&status).await["ready"] == true }).await;
    let holder = |hold: &str| {
        Command::new("python3")
            .args([SCRIPT, "--api", &d.api, "--slots", "2", "--hold", hold, "--timeout", "30", "py/pool"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (holder("4"), holder("8"));
    eventually("both slots to be held", || async {
        get_json(&status).await["locks_held"].as_array().is_some_and(|h| h.len() == 2)
    })
    .await;
    let try_one = |timeout: &'static str| {
        let api = d.api.clone();
        async move {
            Command::new("python3")
                .args([SCRIPT, "--api", &api, "--slots", "2", "--timeout", timeout, "py/pool"])
                .output()
                .await
                .unwrap()
        }
    };
    let late = try_one("0.3").await;
    assert_eq!(late.status.code(), Some(75), "a third holder of 2 slots: {}", String::from_utf8_lossy(&late.stdout));
    let third = try_one("30").await;
    let (a, b) = (a.wait_with_output().await.unwrap(), b.wait_with_output().await.unwrap());
    let slot = |out: &[u8]| -> String {
        let out = String::from_utf8_lossy(out).into_owned();
        let line = out.lines().find(|l| l.starts_with("acquired")).unwrap_or_else(|| panic!("{out}")).to_owned();
        line.split(' ').nth(1).unwrap().to_owned()
    };
    let (sa, sb, sc) = (slot(&a.stdout), slot(&b.stdout), slot(&third.stdout));
    assert!(a.status.success() && b.status.success() && third.status.success(), "{sa} {sb} {sc}");
    assert!(sa.starts_with("py/pool/.slot/") && sb.starts_with("py/pool/.slot/"), "{sa} {sb}");
    assert_ne!(sa, sb, "two holders on one slot");
    assert_eq!(sc, sa, "the third took the slot the first (4 s, the earlier) released");
    let bad =
        Command::new("python3").args([SCRIPT, "--api", &d.api, "--slots", "0", "py/pool"]).output().await.unwrap();
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && said.contains("bad_request") && said.contains("between 1 and 64"), "{said}");
}

/// The holder contract in the Python client: with its daemon hung (SIGSTOP: keep-alives
/// time out, as under an overload), `lost` is set by the deadline its last renewal was
/// answered with, counted from that renewal's send: within one client TTL (1 s here) of
/// the hang. It used to wait on, holding, for as long as the daemon did not answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_holder_is_lost_by_its_deadline_when_its_daemon_hangs() {
    use tokio::io::AsyncBufReadExt as _;
    if !have_tool("python3", PYTHON).await {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d =
        daemon_with(dir.path(), "hang", &[], &["--listen", "/ip4/127.0.0.1/tcp/0", "--takeover-delay", "100ms"]).await;
    let status = format!("http://{}/v1/status", d.api);
    eventually("the daemon to serve", || async { get_json(&status).await["ready"] == true }).await;
    let mut holder = Command::new("python3")
        .args([SCRIPT, "--api", &d.api, "--hold", "60", "--ttl", "1", "py/hang"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(holder.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(daemon::PATIENCE, lines.next_line()).await.unwrap().unwrap().unwrap();
    assert!(first.starts_with("acquired py/hang"), "{first}");
    // A few renewals first.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(d.child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let hung = std::time::Instant::now();
    let next = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line()).await;
    let after = hung.elapsed();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let line = next.expect("the Python holder never noticed it lost the lock").unwrap().unwrap();
    assert!(line.starts_with("lost py/hang"), "{line}");
    assert!(after < std::time::Duration::from_millis(1500), "lost {after:?} after the hang, the TTL is 1 s");
}

/// The Python client over the daemon's unix socket (`--api unix:PATH`), and a clear
/// error, not a traceback, when no daemon answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_speaks_over_the_unix_socket() {
    if !have_tool("python3", PYTHON).await {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let api = format!("unix:{}", dir.path().join("api.sock").display());
    let _d = daemon_with(
        dir.path(),
        "pysock",
        &[],
        &["--listen", "/ip4/127.0.0.1/tcp/0", "--takeover-delay", "100ms", "--api", &api],
    )
    .await;
    let out =
        Command::new("python3").args([SCRIPT, "--api", &api, "--timeout", "30", "py/sock"]).output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("acquired py/sock token") && stdout.contains("released py/sock token"), "{stdout}");
    let gone = format!("unix:{}", dir.path().join("nobody.sock").display());
    let out = Command::new("python3").args([SCRIPT, "--api", &gone, "py/sock"]).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(stderr.contains("cannot reach the sigma daemon") && !stderr.contains("Traceback"), "{stderr}");
    // Without --api, the daemon's config file says where it listens.
    let config = dir.path().join("sigma.toml");
    std::fs::write(&config, format!("api = \"{gone}\"\n")).unwrap();
    let out = Command::new("python3")
        .args([SCRIPT, "py/sock"])
        .env_remove("SIGMA_API")
        .env("SIGMA_CONFIG", &config)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "the configured socket, not the default port: {stderr}");
    assert!(stderr.contains("nobody.sock"), "{stderr}");
}

/// The Python client's value, watch and observe: a candidate campaigns with a value,
/// proclaims a new one (bytes that are not text travel as base64), a second leads
/// after it; the observer sees the three once and in order, the watcher the lock free
/// first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_elects_observes_and_watches() {
    if !have_tool("python3", PYTHON).await {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let extra = ["--listen", "/ip4/127.0.0.1/tcp/0", "--takeover-delay", "0s"];
    let d = daemon_with(dir.path(), "pyelect", &[], &extra).await;
    let status = format!("http://{}/v1/status", d.api);
    eventually("the daemon to serve", || async { get_json(&status).await["ready"] == true }).await;
    let program = r#"
import json, sys, threading
sys.path.insert(0, sys.argv[1])
from sigma_lock import SigmaLock, observe, watch
api = sys.argv[2]
leaders, counts = [], {k: threading.Event() for k in (1, 2, 3)}
def follow():
    for leader in observe("py/elect", api=api, interval_s=0.1):
        leaders.append([leader["token"], leader.get("value"), leader.get("value_base64")])
        counts[len(leaders)].set()
        if len(leaders) == 3:
            return
threading.Thread(target=follow, daemon=True).start()
first = next(watch("py/elect", api=api, interval_s=0.1))
assert first["state"] == "free" and first["seq"] == 1, first
def seen(k):
    assert counts[k].wait(30), f"leader {k} not observed: {leaders}"
with SigmaLock("py/elect", api=api, value="10.0.0.1:8080") as a:
    seen(1)
    assert a.set_value(b"\xff") == 2
    seen(2)
with SigmaLock("py/elect", api=api, value="10.0.0.2:8080") as b:
    seen(3)
print(json.dumps({"leaders": leaders, "tokens": [a.token, b.token]}))
"#;
    let lib = Path::new(SCRIPT).parent().unwrap().to_str().unwrap().to_owned();
    let out = Command::new("python3").args(["-c", program, &lib, &d.api]).output().await.unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (ta, tb) = (v["tokens"][0].as_u64().unwrap(), v["tokens"][1].as_u64().unwrap());
    let want = serde_json::json!([[ta, "10.0.0.1:8080", null], [ta, null, "/w=="], [tb, "10.0.0.2:8080", null]]);
    assert_eq!(v["leaders"], want, "each leader and value once, in order");
    assert!(tb > ta);
}
