//! End to end: real `sigma run` daemons on 127.0.0.1 (ephemeral ports), driven by the
//! real `sigma lock` and `sigma status` and by the HTTP control API.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use sigma_daemon::client::ACQUIRE_SLACK;
use sigma_daemon::http::DEFAULT_CLIENT_TTL;
use tokio::process::Command;

mod daemon;
#[path = "../../node/tests/port/mod.rs"]
mod port;

use daemon::{daemon, daemon_with, eventually, get_json, http, Daemon, PATIENCE, SIGMA};

/// Three daemons; returns once each is connected to the other two.
async fn swarm(dir: &Path) -> Vec<Daemon> {
    let a = daemon(dir, "a", &[]).await;
    let boot = vec![a.listen[0].clone()];
    let b = daemon(dir, "b", &boot).await;
    let c = daemon(dir, "c", &boot).await;
    let nodes = vec![a, b, c];
    for d in &nodes {
        let url = format!("http://{}/v1/status", d.api);
        eventually(&format!("{} to connect to two peers", d.peer_id), || {
            let url = url.clone();
            async move {
                let st = get_json(&url).await;
                st["connected_peers"].as_array().map_or(0, Vec::len) >= 2
            }
        })
        .await;
    }
    nodes
}

fn lock_cmd(api: &str, name: &str, script: &str) -> Command {
    lock_cmd_with(api, name, &[], script)
}

/// `sigma lock NAME --api API OPTIONS -- sh -c SCRIPT`.
fn lock_cmd_with(api: &str, name: &str, options: &[&str], script: &str) -> Command {
    daemon::sigma_lock(api, name, options, script)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sigma_lock_never_interleaves_then_status_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = swarm(dir.path()).await;
    let file = dir.path().join("cs.log");
    let script = format!(
        "echo \"start $$ $SIGMA_LOCK_NAME $SIGMA_FENCING_TOKEN\" >> {f}; sleep 0.3; echo \"end $$\" >> {f}",
        f = file.display()
    );
    // One contender per daemon, all at once.
    let runs: Vec<_> = nodes.iter().map(|d| lock_cmd(&d.api, "jobs/nightly", &script).output()).collect();
    let outputs = tokio::time::timeout(PATIENCE, futures::future::join_all(runs)).await.expect("sigma lock hung");
    for o in &outputs {
        let o = o.as_ref().unwrap();
        assert!(o.status.success(), "sigma lock failed: {:?}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    }

    // The critical sections follow each other: start X, end X, start Y, end Y, ...
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2 * nodes.len(), "{text}");
    let mut pids = Vec::new();
    let mut tokens = Vec::new();
    for pair in lines.chunks(2) {
        let start: Vec<&str> = pair[0].split(' ').collect();
        let end: Vec<&str> = pair[1].split(' ').collect();
        assert_eq!(start[0], "start", "interleaved critical sections:\n{text}");
        assert_eq!(end[0], "end", "interleaved critical sections:\n{text}");
        assert_eq!(start[1], end[1], "interleaved critical sections:\n{text}");
        assert_eq!(start[2], "jobs/nightly", "SIGMA_LOCK_NAME");
        pids.push(start[1].to_owned());
        tokens.push(start[3].parse::<u64>().expect("SIGMA_FENCING_TOKEN is a number"));
    }
    pids.sort();
    pids.dedup();
    assert_eq!(pids.len(), nodes.len(), "every contender ran once:\n{text}");
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "fencing tokens increase with each holder: {tokens:?}");

    // Released: nobody holds it any more.
    for d in &nodes {
        let v = get_json(&format!("http://{}/v1/locks/jobs%2Fnightly", d.api)).await;
        assert_eq!(v["held"], Value::Array(vec![]), "{v}");
    }

    // sigma status --json parses and describes the daemon; the human form too.
    let out = Command::new(SIGMA).args(["status", "--json", "--api", &nodes[0].api]).output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let st: Value = serde_json::from_slice(&out.stdout).expect("status --json is JSON");
    assert_eq!(st["peer_id"], nodes[0].peer_id.to_string().as_str());
    assert!(st["connected_peers"].as_array().unwrap().len() >= 2, "{st}");
    assert!(st["listen_addrs"].as_array().is_some_and(|a| !a.is_empty()), "{st}");
    let out = Command::new(SIGMA).args(["status", "--api", &nodes[1].api]).output().await.unwrap();
    let human = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && human.contains(&nodes[1].peer_id.to_string()), "{human}");
    assert!(human.contains("replicas hosted:"), "{human}");

    // Metrics: ours, with the acquisitions just made.
    let mut acquired = 0;
    let mut grants = 0;
    for d in &nodes {
        let text = http().get(format!("http://{}/metrics", d.api)).send().await.unwrap().text().await.unwrap();
        for needle in [
            "sigma_messages_in_total",
            "sigma_messages_out_total{kind=\"request\"}",
            "sigma_replicas_created_total",
            "sigma_redirects_sent_total",
            "sigma_acquire_duration_seconds_count{outcome=\"acquired\"} 1",
            // libp2p's own families, recorded by the node's event loop.
            "libp2p_swarm_connections_established_total{",
            "libp2p_identify_",
            "# EOF",
        ] {
            assert!(text.contains(needle), "{needle} missing from /metrics of {}:\n{text}", d.peer_id);
        }
        acquired += value(&text, "sigma_acquired_total");
        grants += value(&text, "sigma_replica_grants_total");
    }
    assert_eq!(acquired, nodes.len() as u64);
    assert!(grants >= acquired, "grants {grants}");
}

fn value(metrics: &str, name: &str) -> u64 {
    daemon::sample(metrics, name).unwrap_or_else(|| panic!("{name} missing:\n{metrics}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_holder_timeout_errors_and_loss() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = swarm(dir.path()).await;
    let client = http();
    let a = nodes[0].api.clone();

    // Held over HTTP by daemon A (the name contains '/', sent as is).
    let resp = client.post(format!("http://{a}/v1/locks/held/x/acquire?timeout_ms=20000")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let acq: Value = resp.json().await.unwrap();
    assert_eq!(acq["name"], "held/x");
    let token = acq["token"].as_u64().unwrap();
    let lease = acq["lease"].as_str().unwrap().to_owned();
    assert!(acq["valid_for_ms"].as_u64().unwrap() > 0, "{acq}");
    let view = get_json(&format!("http://{a}/v1/locks/held%2Fx")).await;
    assert_eq!(view["held"][0]["token"].as_u64(), Some(token), "{view}");
    assert_eq!(view["held_by_this_node"], true, "{view}");

    // Another daemon's client times out: distinct exit code and message.
    let start = Instant::now();
    let out = Command::new(SIGMA)
        .args(["lock", "held/x", "--timeout", "300ms", "--api", &nodes[1].api, "--", "true"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("timed out"));
    assert!(start.elapsed() < Duration::from_secs(20));

    // Bad requests.
    let r = client.post(format!("http://{a}/v1/locks/bad%20name/acquire")).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let r = client.post(format!("http://{a}/v1/locks/q/acquire?n=5")).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let r = client.post(format!("http://{a}/v1/locks/q/acquire?n=4&m=2")).send().await.unwrap();
    assert_eq!(r.status(), 400, "m must be a strict majority");
    let out = Command::new(SIGMA).args(["lock", "bad name", "--api", &a, "--", "true"]).output().await.unwrap();
    assert_eq!(out.status.code(), Some(64));

    // A waiting `sigma lock` that dies abandons its wait: the daemon does not go on to
    // take the lock for nobody.
    let b_status = format!("http://{}/v1/status", nodes[1].api);
    let waiting = |st: Value| st["locks_waiting"].as_array().is_some_and(|w| w.iter().any(|n| n == "held/x"));
    let mut waiter = lock_cmd(&nodes[1].api, "held/x", "true").spawn().unwrap();
    eventually("the waiter to queue", || async { waiting(get_json(&b_status).await) }).await;
    waiter.start_kill().unwrap();
    waiter.wait().await.unwrap();
    eventually("the wait to be abandoned", || async { !waiting(get_json(&b_status).await) }).await;

    // Release: wrong token 404, right token 200, twice 404.
    let release = |token: u64| {
        let body = serde_json::json!({ "token": token, "lease": lease });
        client.post(format!("http://{a}/v1/locks/held/x/release")).json(&body).send()
    };
    assert_eq!(release(token + 1).await.unwrap().status(), 404);
    assert_eq!(release(token).await.unwrap().status(), 200);
    assert_eq!(release(token).await.unwrap().status(), 404);
    let out = Command::new(SIGMA)
        .args(["lock", "held/x", "--timeout", "20s", "--api", &nodes[1].api, "--", "true"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "free again: {}", String::from_utf8_lossy(&out.stderr));
    let st = get_json(&b_status).await;
    assert_eq!(st["locks_held"], Value::Array(vec![]), "{st}");

    // A command whose lock is lost is stopped: its daemon dies under it.
    let started = dir.path().join("started");
    let script = format!("echo $$ > {}; sleep 60", started.display());
    let lock = lock_cmd(&nodes[2].api, "lost/x", &script).spawn().unwrap();
    let s = started.clone();
    eventually("the command to start", || {
        let s = s.clone();
        async move { std::fs::read_to_string(&s).is_ok_and(|t| t.ends_with('\n')) }
    })
    .await;
    let child_pid: i32 = std::fs::read_to_string(&started).unwrap().trim().parse().unwrap();
    nodes[2].child.start_kill().unwrap();
    let start = Instant::now();
    let out = tokio::time::timeout(PATIENCE, lock.wait_with_output()).await.expect("sigma lock hung").unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(76), "{stderr}");
    assert!(stderr.contains("lost"), "{stderr}");
    assert!(start.elapsed() < Duration::from_secs(30), "stopped within a few leases: {:?}", start.elapsed());
    // No signal: only checks that the process exists.
    let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child_pid), None).is_ok();
    assert!(!alive, "the command (pid {child_pid}) was stopped");
}

#[tokio::test]
async fn run_refuses_a_non_loopback_api() {
    let out = Command::new(SIGMA)
        .args(["run", "--listen", "/ip4/127.0.0.1/tcp/0", "--api", "0.0.0.0:0"])
        .stdin(Stdio::null())
        .output();
    let out = tokio::time::timeout(PATIENCE, out).await.unwrap().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("loopback"), "{stderr}");
}

#[tokio::test]
async fn lock_without_a_daemon_says_so() {
    // A port nobody listens on: bind one, then close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out = Command::new(SIGMA)
        .args(["lock", "x", "--api", &format!("127.0.0.1:{port}"), "--", "true"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the sigma daemon"));
}

/// Usage errors exit 64 like sigma's own refusals (clap's default is 2); help is not an
/// error; the lock-name limit in the help and the error is the wire's (200 bytes).
#[tokio::test]
async fn usage_errors_exit_64_and_the_name_limit_is_the_wires() {
    let run = |args: &'static [&'static str]| async move { Command::new(SIGMA).args(args).output().await.unwrap() };
    for args in [&["lock"][..], &["lock", "x", "--ttl", "soon"], &["frobnicate"], &["run", "--api-max-requests", "x"]] {
        let out = run(args).await;
        assert_eq!(out.status.code(), Some(64), "sigma {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let out = run(&["lock", "--help"]).await;
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("1 to 200 bytes"), "{help}");
    let long = "a".repeat(201);
    let out = Command::new(SIGMA).args(["lock", &long, "--", "true"]).output().await.unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("1 to 200 bytes"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `sigma completions bash` is a script bash accepts and that knows the subcommands;
/// `sigma man` is a roff page.
#[tokio::test]
async fn completions_and_man_page() {
    let out = Command::new(SIGMA).args(["completions", "bash"]).output().await.unwrap();
    assert!(out.status.success());
    let script = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(script.contains("_sigma") && script.contains("lock") && script.contains("--api-token-file"), "{script}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sigma.bash");
    std::fs::write(&file, &script).unwrap();
    let check = Command::new("bash").arg("-n").arg(&file).output().await.unwrap();
    assert!(check.status.success(), "bash -n: {}", String::from_utf8_lossy(&check.stderr));
    let out = Command::new(SIGMA).arg("man").output().await.unwrap();
    assert!(out.status.success());
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.contains(".TH sigma 1") && page.contains("lock"), "{page}");
}

/// The split-brain issue's first scenario: a daemon whose bootstrap peer is down does
/// not grant itself the lock (before, it won with 24 votes from one peer: itself); it
/// says it is not ready, with its own exit code; once the bootstrap peer is up it joins
/// and the same command succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_whose_bootstrap_peer_is_down_is_not_ready_until_it_joins() {
    let dir = tempfile::tempdir().unwrap();
    // A bootstrap peer that existed (key file, address), then went down.
    // The peer restarts at the same address.
    let port = port::port_outside_ephemeral_range();
    let listen = format!("/ip4/127.0.0.1/tcp/{port}");
    let boot = daemon_with(dir.path(), "boot", &[], &["--listen", &listen]).await;
    let boot_addr = boot.listen[0].clone();
    drop(boot);
    let lonely = daemon(dir.path(), "lonely", &[boot_addr]).await;
    let status = get_json(&format!("http://{}/v1/status", lonely.api)).await;
    assert_eq!(status["ready"], false, "{status}");
    assert_eq!(status["readiness"], "joining", "{status}");

    let out = lock_cmd_with(&lonely.api, "solo", &["--timeout", "2s"], "echo got $SIGMA_FENCING_TOKEN")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "stdout {:?} stderr {stderr}", String::from_utf8_lossy(&out.stdout));
    assert!(stderr.contains("not ready"), "{stderr}");
    assert!(out.stdout.is_empty(), "the command ran without the lock");
    let metrics = daemon::get_text(&format!("http://{}/metrics", lonely.api)).await;
    assert_eq!(daemon::sample(&metrics, "sigma_ready"), Some(0), "{metrics}");
    assert_eq!(daemon::sample(&metrics, "sigma_joining"), Some(1));

    // The bootstrap peer comes back (same key, same address): the lonely daemon joins.
    let _boot = daemon_with(dir.path(), "boot", &[], &["--listen", &listen]).await;
    eventually("the lonely daemon to join", || async {
        get_json(&format!("http://{}/v1/status", lonely.api)).await["ready"] == true
    })
    .await;
    let out = lock_cmd_with(&lonely.api, "solo", &["--timeout", "30s"], "echo got $SIGMA_FENCING_TOKEN")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("got "));
}

/// The client-lease issue's scenario: `sigma lock` is SIGKILLed while its command runs.
/// Before, the daemon kept renewing the lock for good and the next `sigma lock` timed
/// out; now the daemon releases it one client TTL after the last keep-alive.
///
/// The next `sigma lock`, started after the kill, waits at most the TTL plus
/// [`HANDOFF_SLACK`]: the killed client's last keep-alive came before the kill, so its
/// client lease ends within one TTL of it. A daemon that ignored `--ttl` (its default
/// client TTL is 5 s) would make it time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sigma_lock_loses_its_lock_within_its_ttl() {
    const TTL: Duration = Duration::from_secs(1);
    /// The handoff after the client lease ends (a RELEASE and a grant on loopback), with
    /// room for a loaded machine; small enough that the default TTL does not fit.
    const HANDOFF_SLACK: Duration = Duration::from_secs(2);
    const _: () = assert!(TTL.as_millis() + HANDOFF_SLACK.as_millis() < DEFAULT_CLIENT_TTL.as_millis());
    let dir = tempfile::tempdir().unwrap();
    let nodes = swarm(dir.path()).await;
    let marker = dir.path().join("holding");
    let script = format!("touch {}; exec sleep 30", marker.display());
    let ttl = format!("{}ms", TTL.as_millis());
    let mut holder = lock_cmd_with(&nodes[0].api, "dead", &["--ttl", &ttl], &script).spawn().unwrap();
    eventually("the first sigma lock to hold the lock", || {
        let marker = marker.clone();
        async move { marker.exists() }
    })
    .await;
    holder.start_kill().unwrap(); // SIGKILL: no release, no more keep-alives
    let _ = holder.wait().await;
    let t = Instant::now();
    let timeout = format!("{}ms", (TTL + HANDOFF_SLACK).as_millis());
    let out = lock_cmd_with(&nodes[1].api, "dead", &["--timeout", &timeout], "echo second").output().await.unwrap();
    assert!(
        out.status.success(),
        "the dead client's lock was not freed within its TTL ({TTL:?}) and {HANDOFF_SLACK:?}: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "second");
    eprintln!("second holder after {:?}", t.elapsed());
    let metrics = daemon::get_text(&format!("http://{}/metrics", nodes[0].api)).await;
    assert_eq!(daemon::sample(&metrics, "sigma_client_leases_expired_total"), Some(1), "{metrics}");
}

/// `sigma lock NAME` without a command holds the lock until SIGINT and prints its token
/// (like `etcdctl lock NAME`); `sigma locks` lists it; `sigma lock --try` elsewhere gives
/// up at once with exit 75, and wins once the holder let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_mode_locks_listing_and_try() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let nodes = swarm(dir.path()).await;
    let mut holder = Command::new(SIGMA)
        .args(["lock", "by-hand", "--api", &nodes[0].api])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(holder.stdout.take().unwrap()).lines();
    let mut token = None;
    tokio::time::timeout(PATIENCE, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(t) = line.strip_prefix("SIGMA_FENCING_TOKEN=") {
                token = Some(t.parse::<u64>().expect("a token"));
                break;
            }
        }
    })
    .await
    .expect("sigma lock printed no token");
    let token = token.expect("SIGMA_FENCING_TOKEN line");

    let out = Command::new(SIGMA).args(["locks", "--api", &nodes[0].api]).output().await.unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && listing.contains(&format!("held     by-hand token {token}")), "{listing}");

    let out = lock_cmd_with(&nodes[1].api, "by-hand", &["--try"], "echo ran").output().await.unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("held elsewhere"));
    assert!(out.stdout.is_empty(), "the command ran without the lock");

    let pid = nix::unistd::Pid::from_raw(i32::try_from(holder.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let status = tokio::time::timeout(PATIENCE, holder.wait()).await.unwrap().unwrap();
    assert!(status.success(), "released on SIGINT: {status:?}");
    let out = lock_cmd_with(&nodes[1].api, "by-hand", &["--try"], "echo ran").output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A daemon that accepts the connection and never answers must not make `sigma lock
/// --timeout` hang: it gives up [`ACQUIRE_SLACK`] after the timeout, exit 75.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_daemon_does_not_make_the_timeout_hang() {
    const TIMEOUT: Duration = Duration::from_secs(1);
    /// The process's start and exit, with room for a loaded machine; well below the
    /// client's 30 s default deadline, which the acquire must not fall back on.
    const START_SLACK: Duration = Duration::from_secs(5);
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap(); // never accepts nor answers
    let api = hung.local_addr().unwrap().to_string();
    let timeout = format!("{}ms", TIMEOUT.as_millis());
    let bound = TIMEOUT + ACQUIRE_SLACK + START_SLACK;
    let t = Instant::now();
    // The child is killed if still running at the bound (kill_on_drop).
    let out = tokio::time::timeout(bound, lock_cmd_with(&api, "hung", &["--timeout", &timeout], "echo ran").output())
        .await
        .unwrap_or_else(|_| panic!("sigma lock --timeout {TIMEOUT:?} still waiting after {bound:?}"))
        .unwrap();
    let took = t.elapsed();
    eprintln!("sigma lock gave up after {took:?}");
    assert_eq!(out.status.code(), Some(75), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(took >= TIMEOUT, "gave up after {took:?}, before its own timeout");
    assert!(out.stdout.is_empty());
    drop(hung);
}

/// The loopback admin control cuts a daemon off for real (both sides block): the cut-off
/// daemon reaches 1 of 3 members, serves nothing and refuses the lock as not ready; the
/// other two still serve; unblocked, it reconnects by itself and serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_daemon_is_not_ready_and_rejoins_when_unblocked() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = swarm(dir.path()).await;
    let (c, others) = (&nodes[2], &nodes[..2]);
    let blocked = admin(dir.path(), &c.api, "block", others.iter().map(|d| d.peer_id.to_string()).collect()).await;
    assert_eq!(blocked["peers"].as_array().map(Vec::len), Some(2), "{blocked}");
    for d in others {
        admin(dir.path(), &d.api, "block", vec![c.peer_id.to_string()]).await;
    }
    let status_url = format!("http://{}/v1/status", c.api);
    eventually("the cut-off daemon to see it is in a minority", || {
        let url = status_url.clone();
        async move {
            let st = get_json(&url).await;
            st["readiness"] == "minority" && st["connected_peers"].as_array().is_some_and(Vec::is_empty)
        }
    })
    .await;
    let out = lock_cmd_with(&c.api, "island", &["--timeout", "2s"], "echo ran").output().await.unwrap();
    assert_eq!(out.status.code(), Some(78), "{}", String::from_utf8_lossy(&out.stderr));
    let out = lock_cmd_with(&nodes[0].api, "mainland", &["--timeout", "30s"], "echo ran").output().await.unwrap();
    assert!(out.status.success(), "the majority serves: {}", String::from_utf8_lossy(&out.stderr));

    admin(dir.path(), &c.api, "unblock", others.iter().map(|d| d.peer_id.to_string()).collect()).await;
    for d in others {
        admin(dir.path(), &d.api, "unblock", vec![c.peer_id.to_string()]).await;
    }
    eventually("the healed daemon to reconnect and serve", || {
        let url = status_url.clone();
        async move { get_json(&url).await["ready"] == true }
    })
    .await;
    let out = lock_cmd_with(&c.api, "island", &["--timeout", "30s"], "echo ran").output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `POST /v1/admin/{action}` with `{"peers": [...]}`, with the admin token of the
/// daemons whose key files are in `dir`.
async fn admin(dir: &Path, api: &str, action: &str, peers: Vec<String>) -> Value {
    let url = format!("http://{api}/v1/admin/{action}");
    let resp = http()
        .post(&url)
        .bearer_auth(daemon::admin_token(dir))
        .json(&serde_json::json!({ "peers": peers }))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{action}: {}", resp.status());
    resp.json::<Value>().await.unwrap()
}

/// `sigma inspect` on any daemon shows the holder and its token; `sigma release NAME
/// --token T` there breaks the lock held through another daemon that takes orders from
/// any peer (`--admin-peer any`): the holding `sigma lock` stops its command as for a
/// lost lock (exit 76). A token nobody holds is an error (exit 1), and so is a lock whose
/// holder takes no orders from this daemon: 403 `revoke_refused`, which says so (it used
/// to be a 404 saying the lock was not held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_release_from_another_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let a = daemon_with(dir.path(), "a", &[], &["--admin-peer", "any"]).await;
    let boot = vec![a.listen[0].clone()];
    let b = daemon(dir.path(), "b", &boot).await;
    let c = daemon(dir.path(), "c", &boot).await;
    for d in [&a, &b, &c] {
        let url = format!("http://{}/v1/status", d.api);
        eventually("every daemon to be ready", || {
            let url = url.clone();
            async move { get_json(&url).await["ready"].as_bool() == Some(true) }
        })
        .await;
    }
    let marker = dir.path().join("holding");
    let script = format!("touch {}; exec sleep 30", marker.display());
    let holder = lock_cmd_with(&a.api, "broken", &["--grace", "1s"], &script).spawn().unwrap();
    eventually("sigma lock to hold the lock", || {
        let marker = marker.clone();
        async move { marker.exists() }
    })
    .await;

    let out = Command::new(SIGMA).args(["inspect", "broken", "--api", &c.api, "--json"]).output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["holder"]["acquisition"]["peer"].as_str(), Some(a.peer_id.to_string().as_str()), "{view}");
    let token = view["holder"]["token"].as_u64().expect("the holder's token");
    let out = Command::new(SIGMA).args(["inspect", "broken", "--api", &c.api]).output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains(&format!("token {token}")), "{text}");
    // Compact by default: the replicas in one line; one each with --replicas.
    assert!(text.lines().count() < 8 && text.contains("owned by the holder"), "{text}");
    let out = Command::new(SIGMA).args(["inspect", "broken", "--replicas", "--api", &c.api]).output().await.unwrap();
    let full = String::from_utf8_lossy(&out.stdout);
    assert!(full.lines().filter(|l| l.contains("  host ")).count() >= 3, "{full}");

    let out = Command::new(SIGMA)
        .args(["release", "broken", "--token", &token.to_string(), "--api", &c.api])
        .arg("--admin-token-file")
        .arg(dir.path().join("admin.token"))
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("revoked broken token {token}")));
    let status = tokio::time::timeout(PATIENCE, holder.wait_with_output()).await.unwrap().unwrap();
    assert_eq!(status.status.code(), Some(76), "{}", String::from_utf8_lossy(&status.stderr));

    let out = Command::new(SIGMA)
        .args(["release", "broken", "--token", &token.to_string(), "--api", &b.api])
        .arg("--admin-token-file")
        .arg(dir.path().join("admin.token"))
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let out = lock_cmd_with(&b.api, "broken", &["--try"], "echo ran").output().await.unwrap();
    assert!(out.status.success(), "free after the revoke: {}", String::from_utf8_lossy(&out.stderr));

    // b takes no orders from other peers: a revoke from c is refused, and says so.
    let kept = http().post(format!("http://{}/v1/locks/kept/acquire?timeout_ms=20000&ttl_ms=60000", b.api));
    let kept: Value = kept.send().await.unwrap().json().await.unwrap();
    let token = kept["token"].as_u64().unwrap_or_else(|| panic!("{kept}"));
    let refused = http()
        .post(format!("http://{}/v1/revoke/kept", c.api))
        .bearer_auth(daemon::admin_token(dir.path()))
        .json(&serde_json::json!({ "token": token }))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "revoke_refused", "{body}");
    let said = body["error"].as_str().unwrap();
    assert!(said.contains("not revoked") && said.contains("not_allowed") && !said.contains("not held"), "{said}");
    let out = Command::new(SIGMA)
        .args(["release", "kept", "--token", &token.to_string(), "--api", &c.api])
        .arg("--admin-token-file")
        .arg(dir.path().join("admin.token"))
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not revoked"), "{stderr}");
}

/// The daemon runs on jemalloc with its own options (one arena, pages returned by a
/// background thread): jemalloc prints its options at exit when asked to.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_binary_runs_on_jemalloc_with_one_arena_and_background_purging() {
    let out = Command::new(SIGMA).arg("--version").env("_RJEM_MALLOC_CONF", "stats_print:true").output().await.unwrap();
    assert!(out.status.success());
    let stats = String::from_utf8_lossy(&out.stderr);
    assert!(stats.contains("opt.narenas: 1\n"), "jemalloc's options: {stats}");
    assert!(stats.contains("opt.background_thread: true"), "jemalloc's options: {stats}");
}

/// A newcomer's first lock says why it waits. A lone daemon that just began serving
/// grants nothing for its takeover delay (4 s here): `sigma lock --try` says so instead
/// of "held elsewhere", and a waiting `sigma lock` prints the reason (once) after a
/// second, then wins once the delay has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_lock_says_it_waits_for_the_takeover_delay() {
    let dir = tempfile::tempdir().unwrap();
    let d =
        daemon_with(dir.path(), "first", &[], &["--listen", "/ip4/127.0.0.1/tcp/0", "--takeover-delay", "4s"]).await;
    let tried =
        Command::new(SIGMA).args(["lock", "first", "--try", "--api", &d.api, "--", "true"]).output().await.unwrap();
    let said = String::from_utf8_lossy(&tried.stderr);
    assert_eq!(tried.status.code(), Some(75), "{said}");
    assert!(said.contains("takeover delay") && !said.contains("held elsewhere"), "{said}");
    let out = Command::new(SIGMA)
        .args(["lock", "first", "--timeout", "30s", "--api", &d.api, "--", "sh", "-c", "echo ran"])
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    assert_eq!(said.matches("waiting for lock first: this peer began serving recently").count(), 1, "{said}");
}

/// `sigma run --dev`: a lone development node with no takeover delay, so a newcomer's
/// first lock is granted at once (`sigma lock --try` wins right after the daemon is up,
/// where a fresh real node answers "takeover delay", as above); it says loudly what it
/// is, and refuses the options of a real swarm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dev_node_grants_the_first_lock_at_once_and_says_what_it_is() {
    use tokio::io::{AsyncBufReadExt as _, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("dev.log");
    let mut child = Command::new(SIGMA)
        .args(["run", "--dev", "--api", "127.0.0.1:0"])
        .env("XDG_STATE_HOME", dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut api, mut listen) = (String::new(), Vec::new());
    let up = tokio::time::timeout(PATIENCE, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(v) = line.strip_prefix("SIGMA_API=") {
                api = v.to_owned();
            } else if let Some(v) = line.strip_prefix("SIGMA_LISTEN=") {
                listen.push(v.to_owned());
            } else if line == "SIGMA_SERVING" {
                return true;
            }
        }
        false
    })
    .await;
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(up, Ok(true), "the dev node did not serve:\n{said}");
    assert!(said.contains("WARNING: development node (--dev)"), "{said}");
    assert!(listen.iter().all(|a| a.starts_with("/ip4/127.0.0.1/tcp/")), "{listen:?}");
    let started = Instant::now();
    let tried =
        Command::new(SIGMA).args(["lock", "demo", "--try", "--api", &api, "--", "true"]).output().await.unwrap();
    let took = started.elapsed();
    assert_eq!(tried.status.code(), Some(0), "{}", String::from_utf8_lossy(&tried.stderr));
    println!("first lock on a --dev node: {took:?} (a real node holds its first grants for its takeover delay)");
    let status = get_json(&format!("http://{api}/v1/status")).await;
    assert_eq!(status["held_back_ms"], 0, "{status}");
    child.start_kill().unwrap();
    for real in [["--key-file", "k"], ["--bootstrap", "/ip4/127.0.0.1/tcp/1"], ["--takeover-delay", "1s"]] {
        let out = Command::new(SIGMA).args(["run", "--dev"]).args(real).output().await.unwrap();
        assert_eq!(out.status.code(), Some(64), "--dev {real:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// `sigma status` of the daemon at `api`, as text.
async fn status_text(api: &str) -> String {
    let out = Command::new(SIGMA).args(["status", "--api", api]).output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_peers_show_each_others_names() {
    // A bad name is a usage error that says what a name may be.
    let out = Command::new(SIGMA).args(["run", "--name", "db 1\u{1b}"]).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("1 to 32 characters"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let a = daemon_with(dir.path(), "a", &[], &["--listen", "/ip4/127.0.0.1/tcp/0", "--name", "db-1"]).await;
    let boot = vec![a.listen[0].clone()];
    let b = daemon_with(dir.path(), "b", &boot, &["--listen", "/ip4/127.0.0.1/tcp/0", "--name", "db-2"]).await;
    for (d, other, name) in [(&a, &b, "db-2"), (&b, &a, "db-1")] {
        eventually(&format!("{} to know {name}", d.peer_id), || async move {
            daemon::status(d).await["peer_names"][other.peer_id.to_string()] == name
        })
        .await;
        let text = status_text(&d.api).await;
        assert!(text.contains(&format!("{} ({name})", other.peer_id)), "{text}");
    }
    let st = daemon::status(&a).await;
    assert_eq!(st["name"], "db-1", "{st}");
    assert!(status_text(&a.api).await.contains("name:             db-1\n"));
    let members = st["member_peers"].as_array().unwrap();
    assert_eq!(members.len(), 1, "{st}");
    assert_eq!(members[0]["peer"], b.peer_id.to_string(), "{st}");

    // inspect names the holder (through b, held through a).
    serving_with_members(&[&a, &b], 2).await;
    let marker = dir.path().join("holding");
    let script = format!("touch {}; exec sleep 30", marker.display());
    let _holder = lock_cmd(&a.api, "named", &script).spawn().unwrap();
    eventually("sigma lock to hold the lock", || {
        let marker = marker.clone();
        async move { marker.exists() }
    })
    .await;
    let out = Command::new(SIGMA).args(["inspect", "named", "--api", &b.api]).output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("holder: {} (db-1) #", a.peer_id)), "{text}");
}

/// Waits until each of `nodes` serves with `members` members.
async fn serving_with_members(nodes: &[&Daemon], members: u64) {
    for d in nodes {
        daemon::serving_with(d, members).await;
    }
}

/// Three named daemons, each connected to the other two and serving.
async fn named_swarm(dir: &Path) -> Vec<Daemon> {
    let listen = ["--listen", "/ip4/127.0.0.1/tcp/0"];
    let a = daemon_with(dir, "a", &[], &[&listen[..], &["--name", "db-1"]].concat()).await;
    let boot = vec![a.listen[0].clone()];
    let b = daemon_with(dir, "b", &boot, &[&listen[..], &["--name", "db-2"]].concat()).await;
    let c = daemon_with(dir, "c", &boot, &[&listen[..], &["--name", "db-3"]].concat()).await;
    serving_with_members(&[&a, &b, &c], 3).await;
    vec![a, b, c]
}

/// `sigma lock NAME` through `api` holding until killed; returns once it holds.
async fn hold(dir: &Path, api: &str, name: &str) -> tokio::process::Child {
    let marker = dir.join(format!("holding-{name}"));
    let script = format!("touch {}; exec sleep 60", marker.display());
    let child = lock_cmd(api, name, &script).spawn().unwrap();
    eventually(&format!("sigma lock to hold {name}"), || {
        let marker = marker.clone();
        async move { marker.exists() }
    })
    .await;
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_swarm_lists_the_locks_held_through_other_daemons() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = named_swarm(dir.path()).await;
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let _on_a = hold(dir.path(), &a.api, "held-a").await;
    let _on_b = hold(dir.path(), &b.api, "held-b").await;
    // b waits for a's lock.
    let _waiting = lock_cmd_with(&b.api, "held-a", &["--timeout", "60s"], "true").spawn().unwrap();
    let url = format!("http://{}/v1/swarm/locks", c.api);
    eventually("b's wait for held-a to show", || {
        let url = url.clone();
        async move {
            let v = get_json(&url).await;
            v["locks"].as_array().into_iter().flatten().any(|l| l["name"] == "held-a" && l["waiters"][0].is_object())
        }
    })
    .await;

    let out = Command::new(SIGMA).args(["locks", "--swarm", "--api", &c.api]).output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line =
        |name: &str| text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{text}"));
    assert!(line("held-a").contains(&format!("{} (db-1)", a.peer_id)), "{text}");
    assert!(line("held-a").ends_with(" 1"), "one waiter: {text}");
    assert!(line("held-b").contains(&format!("{} (db-2)", b.peer_id)), "{text}");
    assert!(line("held-b").ends_with(" 0"), "no waiter: {text}");
    assert!(text.contains("3 of 3 peers answered"), "{text}");

    let out = Command::new(SIGMA).args(["locks", "--swarm", "--json", "--api", &c.api]).output().await.unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let locks = v["locks"].as_array().unwrap();
    let held_a = locks.iter().find(|l| l["name"] == "held-a").unwrap();
    assert_eq!(held_a["holders"][0]["peer"], a.peer_id.to_string(), "{v}");
    assert!(held_a["holders"][0]["token"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(held_a["waiters"][0]["peer"], b.peer_id.to_string(), "{v}");
    assert_eq!(v["names"][b.peer_id.to_string()], "db-2", "{v}");
}

/// A lone named daemon that grants its first lock at once.
async fn lone(dir: &Path, name: &str) -> Daemon {
    let d =
        daemon_with(dir, name, &[], &["--listen", "/ip4/127.0.0.1/tcp/0", "--takeover-delay", "0s", "--name", name])
            .await;
    serving_with_members(&[&d], 1).await;
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_prints_one_frame_as_text_when_not_on_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let d = lone(dir.path(), "solo").await;
    let _held = hold(dir.path(), &d.api, "framed").await;
    let out = Command::new(SIGMA).args(["top", "--api", &d.api]).output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!text.contains('\u{1b}'), "no terminal codes in a pipe: {text:?}");
    assert!(text.starts_with("sigma top: solo ") && text.contains("  serving  "), "{text}");
    assert!(text.contains("MEMBERS (1)") && text.contains("this peer"), "{text}");
    let row = text.lines().find(|l| l.trim_start().starts_with("framed ")).unwrap_or_else(|| panic!("{text}"));
    assert!(row.contains("solo "), "the holder by its name: {text}");
    assert!(text.trim_end().ends_with("q: quit"), "{text}");
    // No daemon: exit 69, said on stderr.
    let out = Command::new(SIGMA).args(["top", "--api", "127.0.0.1:9"]).output().await.unwrap();
    assert_eq!(out.status.code(), Some(69), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `tmux -L SOCKET ARGS`: a tmux server of the test's own.
fn tmux(socket: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new("tmux").arg("-L").arg(socket).args(args).env("TERM", "xterm").output().unwrap()
}

/// Polls the pane until `check` holds on its text; panics (with the pane) after PATIENCE.
async fn pane_until(socket: &str, what: &str, check: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let out = tmux(socket, &["capture-pane", "-p", "-t", "top"]);
        let pane = String::from_utf8_lossy(&out.stdout).into_owned();
        if check(&pane) {
            return pane;
        }
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}; the pane:\n{pane}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_under_tmux_shows_a_lock_and_its_holder_and_quits_on_q() {
    if !daemon::have_tool("tmux", "apt-get install tmux").await {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = lone(dir.path(), "viewed").await;
    let socket = format!("sigma-top-test-{}", std::process::id());
    // After top: its exit status, and whether the terminal is back in cooked mode.
    let shell = format!(
        "{SIGMA} top --api {} --interval 200ms; echo \"exit=$?\"; stty -a | tr ' ' '\\n' | grep -x -- '-\\?icanon'; sleep 60",
        d.api
    );
    struct Server(String);
    impl Drop for Server {
        fn drop(&mut self) {
            let _ = tmux(&self.0, &["kill-server"]);
        }
    }
    let out = tmux(&socket, &["new-session", "-d", "-s", "top", "-x", "120", "-y", "30", &shell]);
    assert!(out.status.success(), "tmux: {}", String::from_utf8_lossy(&out.stderr));
    let _server = Server(socket.clone());
    pane_until(&socket, "the first frame", |p| p.contains("sigma top: viewed") && p.contains("q: quit")).await;
    let alternate = tmux(&socket, &["display-message", "-p", "-t", "top", "#{alternate_on}"]);
    assert_eq!(String::from_utf8_lossy(&alternate.stdout).trim(), "1", "the view is on the alternate screen");

    let _held = hold(dir.path(), &d.api, "watched").await;
    let pane = pane_until(&socket, "the lock and its holder", |p| {
        p.lines().any(|l| l.trim_start().starts_with("watched ") && l.contains("viewed "))
    })
    .await;
    assert!(pane.contains("LOCKS (1 held"), "{pane}");

    let out = tmux(&socket, &["send-keys", "-t", "top", "q"]);
    assert!(out.status.success());
    let pane = pane_until(&socket, "top to exit and stty to answer", |p| {
        p.contains("exit=") && p.lines().any(|l| l.ends_with("icanon"))
    })
    .await;
    assert!(pane.contains("exit=0"), "{pane}");
    assert!(pane.lines().any(|l| l == "icanon"), "the terminal is back in canonical mode: {pane}");
    assert!(!pane.contains("sigma top:"), "the view's screen is gone: {pane}");
    let alternate = tmux(&socket, &["display-message", "-p", "-t", "top", "#{alternate_on}"]);
    assert_eq!(String::from_utf8_lossy(&alternate.stdout).trim(), "0", "back from the alternate screen");
    let cursor = tmux(&socket, &["display-message", "-p", "-t", "top", "#{cursor_flag}"]);
    assert_eq!(String::from_utf8_lossy(&cursor.stdout).trim(), "1", "the cursor shown again");
}

/// The next line of a command's stdout within [`PATIENCE`].
async fn next_line(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    who: &str,
) -> String {
    match tokio::time::timeout(PATIENCE, lines.next_line()).await {
        Ok(Ok(Some(line))) => line,
        other => panic!("{who}: no line: {other:?}"),
    }
}

/// `sigma elect`, `sigma observe` and `sigma watch` end to end: two candidates lead in
/// turn; the observer prints each leader's value once, in order; the watcher's lines
/// show the lock free, each holder with its token and value, and the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_observe_and_watch_through_the_cli() {
    use tokio::io::{AsyncBufReadExt as _, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let d = lone(dir.path(), "elect").await;
    let api = d.api.as_str();
    let follow = |cmd: &str, json: bool| {
        let mut c = Command::new(SIGMA);
        c.args([cmd, "jobs/leader", "--api", api, "--interval", "100ms"]);
        if json {
            c.arg("--json");
        }
        let mut child = c.stdout(Stdio::piped()).kill_on_drop(true).spawn().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        (child, lines)
    };
    let (_observer, mut observed) = follow("observe", false);
    let (_watcher, mut watched) = follow("watch", true);
    let first: Value = serde_json::from_str(&next_line(&mut watched, "watch").await).unwrap();
    assert_eq!((first["seq"].as_u64(), first["state"].as_str()), (Some(1), Some("free")), "{first}");

    // Candidate A leads for a while; B campaigns meanwhile and leads once A resigns.
    let elect = |value: &str, script: &str| {
        Command::new(SIGMA)
            .args(["elect", "jobs/leader", value, "--api", api, "--grace", "500ms", "--", "sh", "-c", script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let a = elect("10.0.0.1:8080", "sleep 1.5; echo a $SIGMA_FENCING_TOKEN");
    assert_eq!(next_line(&mut observed, "observe").await, "10.0.0.1:8080");
    let b = elect("10.0.0.2:8080", "sleep 1; echo b $SIGMA_FENCING_TOKEN");
    assert_eq!(next_line(&mut observed, "observe").await, "10.0.0.2:8080", "each leader once, in order");
    let (a, b) = (a.wait_with_output().await.unwrap(), b.wait_with_output().await.unwrap());
    assert!(a.status.success() && b.status.success(), "{a:?} {b:?}");
    let token = |out: &std::process::Output| -> u64 {
        String::from_utf8_lossy(&out.stdout).split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    assert!(token(&b) > token(&a));

    // The watcher saw A hold with its value, B wait, B hold, then the lock free.
    let mut seen: Vec<Value> = vec![first];
    while seen.last().is_some_and(|s| s["state"] != "free" || seen.len() < 3) {
        seen.push(serde_json::from_str(&next_line(&mut watched, "watch").await).unwrap());
    }
    let held: Vec<(u64, &str)> = seen
        .iter()
        .filter(|s| s["state"] == "held")
        .map(|s| (s["holder"]["token"].as_u64().unwrap(), s["holder"]["value"].as_str().unwrap()))
        .collect();
    assert!(held.contains(&(token(&a), "10.0.0.1:8080")) && held.contains(&(token(&b), "10.0.0.2:8080")), "{seen:#?}");
    assert!(held.windows(2).all(|w| w[0].0 <= w[1].0), "in token order: {held:?}");
    assert!(seen.iter().any(|s| s["state"] == "held" && s["waiters"] == 1), "B seen waiting: {seen:#?}");
    assert!(seen.iter().enumerate().all(|(i, s)| s["seq"] == i as u64 + 1), "numbered: {seen:#?}");

    // Usage errors: no value, a value too long.
    let out = Command::new(SIGMA).args(["elect", "x", "--api", api]).output().await.unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", String::from_utf8_lossy(&out.stderr));
    let long = "x".repeat(4097);
    let out =
        Command::new(SIGMA).args(["lock", "x", "--value", &long, "--api", api, "--", "true"]).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("at most 4096 bytes") && stderr.contains("bad_value"), "{stderr}");
}

/// The value over HTTP: attached at acquire, replaced under the lease, read by inspect,
/// refused when too long, given twice or not base64, or for a lease that does not hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_with_the_lock_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let d = lone(dir.path(), "value").await;
    let base = format!("http://{}/v1/locks/cfg%2Fprimary", d.api);
    let post = |url: String, body: Value| async move {
        let resp = http().post(url).json(&body).send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json::<Value>().await.unwrap())
    };
    let (status, acquired) = post(format!("{base}/acquire"), serde_json::json!({"value": "db-1:5432"})).await;
    assert_eq!(status, 200, "{acquired}");
    let (token, lease) = (acquired["token"].as_u64().unwrap(), acquired["lease"].as_str().unwrap().to_owned());
    let inspect = format!("http://{}/v1/inspect/cfg%2Fprimary", d.api);
    let seen = get_json(&inspect).await;
    assert_eq!(
        (seen["holder"]["value"].as_str(), seen["holder"]["value_version"].as_u64()),
        (Some("db-1:5432"), Some(1))
    );

    let set = |body: Value| post(format!("{base}/value"), body);
    let (status, answer) = set(serde_json::json!({"token": token, "lease": lease, "value_base64": "/wBB"})).await;
    assert_eq!((status, answer["value_version"].as_u64()), (200, Some(2)), "{answer}");
    let seen = get_json(&inspect).await;
    assert_eq!((seen["holder"]["value_base64"].as_str(), seen["holder"].get("value")), (Some("/wBB"), None), "{seen}");

    let refusals = [
        (serde_json::json!({"token": token, "lease": lease, "value": "x".repeat(4097)}), 400, "bad_value"),
        (serde_json::json!({"token": token, "lease": lease, "value": "a", "value_base64": "YQ=="}), 400, "bad_value"),
        (serde_json::json!({"token": token, "lease": lease, "value_base64": "not base64!"}), 400, "bad_value"),
        (serde_json::json!({"token": token, "lease": "0".repeat(32), "value": "a"}), 404, "not_held"),
        (serde_json::json!({"token": token, "value": "a"}), 400, "bad_lease"),
    ];
    for (body, want_status, want_code) in refusals {
        let (status, answer) = set(body.clone()).await;
        assert_eq!((status, answer["code"].as_str()), (want_status, Some(want_code)), "{body}: {answer}");
    }
    let (status, answer) = post(format!("{base}/acquire?timeout_ms=100"), serde_json::json!({"vaule": "x"})).await;
    assert_eq!((status, answer["code"].as_str()), (400, Some("bad_request")), "{answer}");
    // None of it changed the value.
    assert_eq!(get_json(&inspect).await["holder"]["value_version"].as_u64(), Some(2));
    let (status, _) = post(format!("{base}/release"), serde_json::json!({"token": token, "lease": lease})).await;
    assert_eq!(status, 200);
}
