//! The holder contract, end to end on real daemons: a holder is never told more than the
//! daemon keeps. Each test is a way a lock used to end up with two holders (or a holder
//! with no lock) while the swarm itself did nothing wrong: an overloaded API, a token
//! read from `/v1/status`, a graceful stop, a killed `sigma lock`, a daemon gone under
//! `sigma lock`, idle sockets on the API's listeners.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use tokio::process::Command;

mod daemon;

use daemon::{daemon_with, eventually, get_json, get_text, http, sigma_lock, Daemon, PATIENCE, SIGMA};

/// One daemon that grants at once: a one-node swarm with a short takeover delay (its
/// replicas have never been anyone else's).
async fn lone(dir: &Path, tag: &str, extra: &[&str]) -> Daemon {
    let mut args = vec!["--listen", "/ip4/127.0.0.1/tcp/0", "--takeover-delay", "100ms"];
    args.extend_from_slice(extra);
    let d = daemon_with(dir, tag, &[], &args).await;
    let status = format!("http://{}/v1/status", d.api);
    eventually("the daemon to serve", || async { get_json(&status).await["ready"] == true }).await;
    d
}

/// Three daemons, each connected to the other two. A quorum of 17 of 32 votes: the two
/// that stay when one stops host enough replicas between them (about 21) to grant at
/// once, without waiting out the takeover delay of the stopped one's replicas, so that
/// a stop that released too early would show.
async fn three(dir: &Path) -> Vec<Daemon> {
    let args = ["--listen", "/ip4/127.0.0.1/tcp/0", "--n", "32", "--m", "17"];
    let a = daemon_with(dir, "a", &[], &args).await;
    let boot = vec![a.listen[0].clone()];
    let b = daemon_with(dir, "b", &boot, &args).await;
    let c = daemon_with(dir, "c", &boot, &args).await;
    let nodes = vec![a, b, c];
    for d in &nodes {
        let url = format!("http://{}/v1/status", d.api);
        eventually("every daemon to connect to the other two and serve", || {
            let url = url.clone();
            async move {
                let st = get_json(&url).await;
                st["connected_peers"].as_array().map_or(0, Vec::len) >= 2 && st["ready"] == true
            }
        })
        .await;
    }
    nodes
}

async fn post(url: String, body: Value) -> (u16, Value) {
    let resp = http().post(url).json(&body).timeout(PATIENCE).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// `POST …/acquire?QUERY`, which must succeed.
async fn acquire(api: &str, name: &str, query: &str) -> Value {
    let (status, body) = post(format!("http://{api}/v1/locks/{name}/acquire?{query}"), json!({})).await;
    assert_eq!(status, 200, "acquire {name}: {body}");
    body
}

/// The body a holder sends with keepalive and release: its token and its lease id.
fn holder(acquired: &Value) -> Value {
    json!({ "token": acquired["token"], "lease": acquired["lease"] })
}

fn held_here(view: &Value) -> bool {
    view["held"].as_array().is_some_and(|h| !h.is_empty())
}

/// Nanoseconds since the Unix epoch, as `date +%s%N` prints them.
fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

async fn read_ns(path: &Path) -> u128 {
    let p = path.to_owned();
    eventually(&format!("{} to be written", path.display()), || {
        let p = p.clone();
        async move { std::fs::read_to_string(&p).is_ok_and(|t| t.ends_with('\n')) }
    })
    .await;
    std::fs::read_to_string(path).unwrap().trim().parse().unwrap()
}

/// A command that records when it started and when it was told to stop (SIGTERM), in
/// `date +%s%N` nanoseconds, and otherwise runs for a minute.
fn recording_command(started: &Path, stopped: &Path) -> String {
    format!(
        "trap 'date +%s%N > {stop}; exit 0' TERM; date +%s%N > {start}; sleep 60 & wait $!",
        start = started.display(),
        stop = stopped.display()
    )
}

/// The text of a log without its terminal colour sequences (`ESC [ … m`).
fn without_colours(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn process_is_gone(pid: i32) -> bool {
    // A zombie (exited, not yet reaped by its new parent) runs nothing.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Scenario 1 of the holder contract, small form: the API takes at most 3 requests at
/// once and 3 acquires wait for a held lock; the holder of another lock keeps it alive
/// every 300 ms with a 1 s client lease. Its keep-alives must be served (they used to
/// get 503 `busy`, and the daemon released the lock at 1 s while its client still
/// believed it held it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalives_are_served_while_waiting_acquires_fill_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let d = lone(dir.path(), "busy", &["--api-max-requests", "3"]).await;
    let api = d.api.clone();
    let x = acquire(&api, "x", "ttl_ms=1000").await;
    let y = acquire(&api, "y", "ttl_ms=60000").await;
    let waiters: Vec<_> = (0..3)
        .map(|_| tokio::spawn(post(format!("http://{api}/v1/locks/y/acquire?timeout_ms=30000"), json!({}))))
        .collect();
    // All three wait (a daemon whose only pool is full answers even its status 503).
    let status = format!("http://{api}/v1/status");
    eventually("the three acquires to wait", || {
        let status = status.clone();
        async move {
            let resp = http().get(&status).send().await.unwrap();
            if resp.status() == 503 {
                return true;
            }
            let st: Value = resp.json().await.unwrap();
            st["locks_waiting"].as_array().is_some_and(|w| w.iter().filter(|n| *n == "y").count() == 3)
        }
    })
    .await;
    let (status, body) = post(format!("http://{api}/v1/locks/z/acquire?timeout_ms=1"), json!({})).await;
    assert_eq!((status, body["code"].as_str()), (503, Some("busy")), "the acquire pool is full: {body}");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        let (status, body) = post(format!("http://{api}/v1/locks/x/keepalive"), holder(&x)).await;
        assert_eq!(status, 200, "a keep-alive was refused while acquires waited: {body}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let view = get_json(&format!("http://{api}/v1/locks/x")).await;
    assert!(held_here(&view), "x was released under its holder: {view}");
    let (status, body) = post(format!("http://{api}/v1/locks/x/release"), holder(&x)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(format!("http://{api}/v1/locks/y/release"), holder(&y)).await;
    assert_eq!(status, 200, "{body}");
    for w in waiters {
        let (status, _) = w.await.unwrap();
        assert_eq!(status, 200, "every waiter is served in turn once y is free");
        // (each held y under its own lease; they run out on their own)
    }
}

/// The deadline the daemon tells a holder is the one it keeps: never later than the
/// client lease (`ttl_ms`), and the lock is still held just before it, with no
/// keep-alive at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_told_is_kept_and_is_never_past_the_client_lease() {
    let dir = tempfile::tempdir().unwrap();
    let d = lone(dir.path(), "deadline", &[]).await;
    let api = d.api.clone();
    let sent = Instant::now();
    let x = acquire(&api, "x", "ttl_ms=1000").await;
    let told = x["valid_for_ms"].as_u64().unwrap();
    assert!(told <= 1000, "told {told} ms but the client lease is 1000 ms: {x}");
    let deadline = sent + Duration::from_millis(told);
    tokio::time::sleep_until(tokio::time::Instant::from_std(deadline - Duration::from_millis(150))).await;
    let view = get_json(&format!("http://{api}/v1/locks/x")).await;
    assert!(held_here(&view), "released before the deadline it told ({told} ms): {view}");
    eventually("the lease to run out", || {
        let api = api.clone();
        async move { !held_here(&get_json(&format!("http://{api}/v1/locks/x")).await) }
    })
    .await;
}

/// Scenario 3: the fencing token is public (status, locks, inspect show it), so it must
/// not be what proves ownership. A stranger who read it releases and renews nothing; the
/// lease id that does is never shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_read_from_status_releases_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = lone(dir.path(), "stranger", &[]).await;
    let api = d.api.clone();
    let x = acquire(&api, "x", "ttl_ms=30000").await;
    let view = get_json(&format!("http://{api}/v1/locks/x")).await;
    let token = view["held"][0]["token"].as_u64().expect("the token is public");
    for action in ["release", "keepalive"] {
        let (status, body) = post(format!("http://{api}/v1/locks/x/{action}"), json!({ "token": token })).await;
        assert_ne!(status, 200, "a stranger's {action} by token succeeded: {body}");
        let wrong = json!({ "token": token, "lease": "0123456789abcdef0123456789abcdef" });
        let (status, body) = post(format!("http://{api}/v1/locks/x/{action}"), wrong).await;
        assert_eq!(status, 404, "a stranger's {action} with a made-up lease: {body}");
        assert_eq!(body["code"], "not_held", "{body}");
    }
    assert!(held_here(&get_json(&format!("http://{api}/v1/locks/x")).await), "the holder lost x to a stranger");
    let lease = x["lease"].as_str().expect("acquire answers a lease id");
    assert_eq!(lease.len(), 32, "128 bits in hex: {lease}");
    for path in ["/v1/status", "/v1/locks/x", "/v1/inspect/x", "/metrics"] {
        let text = get_text(&format!("http://{api}{path}")).await;
        assert!(!text.contains(lease), "{path} shows the lease id");
    }
    let log = std::fs::read_to_string(&d.log).unwrap();
    assert!(!log.contains(lease), "the log shows the lease id");
    let (status, body) = post(format!("http://{api}/v1/locks/x/release"), holder(&x)).await;
    assert_eq!(status, 200, "{body}");
    let metrics = get_text(&format!("http://{api}/metrics")).await;
    assert!(
        daemon::sample(&metrics, "sigma_http_rejected_total{reason=\"not_held\"}").is_some_and(|n| n >= 2),
        "refusals are counted: {metrics}"
    );
}

/// Scenario 2: a graceful stop (SIGTERM, as `systemctl stop` sends) of the daemon a
/// `sigma lock` holds through: the command is stopped before anyone else gets the lock
/// (it used to be released at once while the command still ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_never_cuts_a_holder_short() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = three(dir.path()).await;
    let (started1, stopped1, started2) =
        (dir.path().join("started1"), dir.path().join("stopped1"), dir.path().join("started2"));
    let first = sigma_lock(&nodes[0].api, "rolling", &[], &recording_command(&started1, &stopped1)).spawn().unwrap();
    read_ns(&started1).await;
    let second_script = format!("date +%s%N > {}", started2.display());
    let second = sigma_lock(&nodes[1].api, "rolling", &["--timeout", "60s"], &second_script).spawn().unwrap();
    let b_status = format!("http://{}/v1/status", nodes[1].api);
    eventually("the second to wait on B", || async {
        get_json(&b_status).await["locks_waiting"].as_array().is_some_and(|w| w.iter().any(|n| n == "rolling"))
    })
    .await;
    let a = nix::unistd::Pid::from_raw(i32::try_from(nodes[0].child.id().unwrap()).unwrap());
    nix::sys::signal::kill(a, nix::sys::signal::Signal::SIGTERM).unwrap();
    let exit = tokio::time::timeout(PATIENCE, nodes[0].child.wait()).await.expect("the daemon did not stop").unwrap();
    assert!(exit.success(), "a graceful stop exits 0: {exit:?}");
    let out1 = tokio::time::timeout(PATIENCE, first.wait_with_output()).await.unwrap().unwrap();
    let out2 = tokio::time::timeout(PATIENCE, second.wait_with_output()).await.unwrap().unwrap();
    let err1 = String::from_utf8_lossy(&out1.stderr);
    assert_eq!(out1.status.code(), Some(76), "the first holder's lock is lost when its daemon stops: {err1}");
    assert!(err1.contains("stopping"), "{err1}");
    assert!(out2.status.success(), "the second got the lock: {}", String::from_utf8_lossy(&out2.stderr));
    let (stop1, start2) = (read_ns(&stopped1).await, read_ns(&started2).await);
    assert!(
        stop1 <= start2,
        "the second command started {} ms before the first was told to stop",
        (stop1 - start2) / 1_000_000
    );
}

/// Scenario 4, first half: `kill -9` of `sigma lock` used to orphan its command, which
/// ran on without the lock; the command now dies with it (parent-death signal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sigma_lock_takes_its_command_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = lone(dir.path(), "orphan", &[]).await;
    let pidfile = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 60", pidfile.display());
    let mut lock = sigma_lock(&d.api, "orphan", &[], &script).spawn().unwrap();
    let p = pidfile.clone();
    eventually("the command to start", || {
        let p = p.clone();
        async move { std::fs::read_to_string(&p).is_ok_and(|t| t.ends_with('\n')) }
    })
    .await;
    let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    lock.start_kill().unwrap(); // SIGKILL
    let _ = lock.wait().await;
    let start = Instant::now();
    while !process_is_gone(pid) {
        assert!(start.elapsed() < Duration::from_secs(5), "the command (pid {pid}) outlived sigma lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Scenario 4, second half: a refused connection to the daemon is a lost lock at once
/// (the daemon is gone and its client lease no longer renewed), not a transient error
/// to wait out until the lock's validity (9 s here) nearly ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_a_lost_lock_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = lone(dir.path(), "gone", &["--lease-ms", "10000"]).await;
    let (started, stopped) = (dir.path().join("started"), dir.path().join("stopped"));
    let lock =
        sigma_lock(&d.api, "gone", &["--grace", "500ms"], &recording_command(&started, &stopped)).spawn().unwrap();
    read_ns(&started).await;
    // Past the first keep-alive: the validity is renewed, not the one of the acquire.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    d.child.start_kill().unwrap();
    d.child.wait().await.unwrap();
    let killed = now_ns();
    let out = tokio::time::timeout(PATIENCE, lock.wait_with_output()).await.unwrap().unwrap();
    assert_eq!(out.status.code(), Some(76), "{}", String::from_utf8_lossy(&out.stderr));
    let after_ms = (read_ns(&stopped).await.saturating_sub(killed)) / 1_000_000;
    assert!(after_ms < 4_000, "the command ran {after_ms} ms after its daemon was gone");
}

/// Scenario 5: idle sockets on the metrics listener (and the API's) are closed after
/// the header-read timeout, and connections past the cap are refused at once; scrapes
/// still work. They used to stay open for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_are_closed_and_connections_capped() {
    use tokio::io::AsyncReadExt as _;
    let dir = tempfile::tempdir().unwrap();
    let extra = ["--metrics", "127.0.0.1:0", "--http-header-timeout", "1s", "--http-max-connections", "64"];
    let d = lone(dir.path(), "idle", &extra).await;
    let metrics_addr = d.metrics.clone().expect("SIGMA_METRICS= line");
    for (listener, addr) in [("metrics", metrics_addr), ("api", d.api.clone())] {
        let mut idle = Vec::new();
        for _ in 0..100 {
            idle.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
        }
        let start = Instant::now();
        for (i, s) in idle.iter_mut().enumerate() {
            let mut buf = [0u8; 256];
            let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("idle socket {i} to {addr} still open after 20 s"));
            // Closed: end of stream, or a reset, or a 408 answer then the close.
            if let Ok(n) = n {
                assert!(n == 0 || buf.starts_with(b"HTTP/1.1 408"), "socket {i}: {:?}", &buf[..n]);
            }
        }
        assert!(start.elapsed() < Duration::from_secs(20));
        let text = get_text(&format!("http://{addr}/metrics")).await;
        let refused = format!("sigma_http_connections_refused_total{{listener=\"{listener}\"}}");
        assert!(
            daemon::sample(&text, &refused).is_some_and(|n| n >= 36),
            "connections past the cap are counted as {refused}: {text}"
        );
    }
}

/// Scenario 3, the local API's access: on a unix socket (mode 0660) only its owner and
/// group can connect, every lock taken is logged with the connecting user's id, no
/// other process can take the socket over while the daemon runs, and it is gone once
/// the daemon stopped (a client then finds no daemon rather than an impostor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_on_a_unix_socket_is_its_owners_and_logs_who_holds() {
    use sigma_daemon::client::Client;
    use sigma_daemon::http::ApiAddr;
    use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("api.sock");
    let api = format!("unix:{}", socket.display());
    let mut d = daemon_with(
        dir.path(),
        "sock",
        &[],
        &["--listen", "/ip4/127.0.0.1/tcp/0", "--takeover-delay", "100ms", "--api", &api],
    )
    .await;
    assert_eq!(d.api, api, "SIGMA_API= names the socket");
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o660, "owner and group only");
    let client = Client::new(ApiAddr::Unix(socket.clone()));
    eventually("the daemon to serve", || {
        let client = client.clone();
        async move { client.status().await.is_ok_and(|s| s.ready) }
    })
    .await;
    let out =
        sigma_lock(&api, "sock/x", &["--timeout", "30s"], "echo held $SIGMA_FENCING_TOKEN").output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("held "));
    // This process's user id: the owner of the directory it just made.
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(dir.path()).unwrap());
    let log = without_colours(&std::fs::read_to_string(&d.log).unwrap());
    assert!(
        log.lines().any(|l| l.contains("lock acquired for an HTTP client") && l.contains(&format!("uid={uid}"))),
        "the hold is logged with the client's uid {uid}"
    );
    // A second daemon cannot take the socket over.
    let out = Command::new(SIGMA)
        .args(["run", "--ephemeral-key", "--listen", "/ip4/127.0.0.1/tcp/0", "--api", &api])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("another process answers"), "{out:?}");
    // Stopped, the daemon leaves no socket behind.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(d.child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    assert!(tokio::time::timeout(PATIENCE, d.child.wait()).await.unwrap().unwrap().success());
    assert!(!socket.exists(), "the socket outlived the daemon");
}

/// Scenario 3, the admin routes: break-lock and the block list need the daemon's admin
/// token (beside its key file by default), and neither no credential nor the lock
/// routes' token will do; a daemon without one refuses them. They used to be open to
/// every local process that could reach the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_routes_need_their_own_credential() {
    let dir = tempfile::tempdir().unwrap();
    let api_token = dir.path().join("api.token");
    let extra = ["--listen", "/ip4/127.0.0.1/tcp/0", "--api-token-file", api_token.to_str().unwrap()];
    let d = daemon_with(dir.path(), "admin", &[], &extra).await;
    let api_token = std::fs::read_to_string(&api_token).unwrap().trim().to_owned();
    let admin_token = daemon::admin_token(dir.path());
    assert_ne!(api_token, admin_token);
    let call = |path: &str, bearer: Option<&str>, body: Value| {
        let mut request = http().post(format!("http://{}{path}", d.api)).json(&body);
        if let Some(b) = bearer {
            request = request.bearer_auth(b);
        }
        async move {
            let resp = request.send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    for bearer in [None, Some(api_token.as_str())] {
        let (status, body) = call("/v1/admin/block", bearer, json!({ "peers": [] })).await;
        assert_eq!((status, body["code"].as_str()), (401, Some("unauthorized")), "block with {bearer:?}: {body}");
        let (status, body) = call("/v1/revoke/x", bearer, json!({ "token": 1 })).await;
        assert_eq!((status, body["code"].as_str()), (401, Some("unauthorized")), "revoke with {bearer:?}: {body}");
    }
    let (status, body) = call("/v1/admin/block", Some(&admin_token), json!({ "peers": [] })).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call("/v1/revoke/x", Some(&admin_token), json!({ "token": 1 })).await;
    assert_eq!(status, 404, "authorised, and nobody holds x under token 1: {body}");
    let status = http().get(format!("http://{}/v1/status", d.api)).bearer_auth(&api_token).send().await.unwrap();
    assert_eq!(status.status(), 200, "the lock routes take the API token");

    let out = Command::new(SIGMA)
        .args(["run", "--ephemeral-key", "--listen", "/ip4/127.0.0.1/tcp/0", "--api", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(out.stdout.unwrap()));
    let mut api = String::new();
    while let Some(line) = tokio::time::timeout(PATIENCE, lines.next_line()).await.unwrap().unwrap() {
        if let Some(a) = line.strip_prefix("SIGMA_API=") {
            api = a.to_owned();
            break;
        }
    }
    let resp = http()
        .post(format!("http://{api}/v1/admin/block"))
        .bearer_auth(&admin_token)
        .json(&json!({ "peers": [] }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "admin_disabled");
}

/// Scenario 1 from `sigma lock`'s side: its daemon hangs (SIGSTOP; keep-alives time
/// out, as under an overload), so no renewal moves the deadline on; the command is told
/// to stop before the deadline of its last renewal, which is within one client TTL
/// (2 s here) of the hang. It used to run on until the lock's validity (≈ 9 s with
/// this daemon's 10 s lease) was nearly over, past the client lease the daemon keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigma_lock_stops_its_command_by_the_deadline_when_its_daemon_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let d = lone(dir.path(), "hang", &["--lease-ms", "10000"]).await;
    let (started, stopped) = (dir.path().join("started"), dir.path().join("stopped"));
    let options = ["--ttl", "2s", "--grace", "500ms"];
    let lock = sigma_lock(&d.api, "hang", &options, &recording_command(&started, &stopped)).spawn().unwrap();
    read_ns(&started).await;
    // A few renewals first.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(d.child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let hung = now_ns();
    let stop = read_ns(&stopped).await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let out = tokio::time::timeout(PATIENCE, lock.wait_with_output()).await.unwrap().unwrap();
    assert_eq!(out.status.code(), Some(76), "{}", String::from_utf8_lossy(&out.stderr));
    let after_ms = stop.saturating_sub(hung) / 1_000_000;
    assert!(after_ms < 2_000, "the command was told to stop {after_ms} ms after its daemon hung; the TTL is 2 s");
}

/// The typed client's holder keeps the same rules as `sigma lock`: its daemon hangs
/// (SIGSTOP: keep-alives time out), and [`sigma_daemon::client::Holding::renew`] says the
/// lock is lost at the deadline of its last confirmed renewal, not before and not
/// later, whatever the daemon (not) answers; it stays lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typed_clients_holder_is_lost_at_its_deadline_when_its_daemon_hangs() {
    use sigma_daemon::client::{AcquireOptions, Client, Holding};
    let dir = tempfile::tempdir().unwrap();
    let d = lone(dir.path(), "typed", &["--lease-ms", "10000"]).await;
    let client = Client::new(d.api.parse::<std::net::SocketAddr>().unwrap());
    let ttl = Duration::from_secs(2);
    let opts = AcquireOptions { ttl: Some(ttl), ..AcquireOptions::default() };
    let acquired = client.acquire("typed", &opts).await.unwrap();
    let mut holding = Holding::confirm(client, "typed".to_owned(), acquired, ttl).await.unwrap();
    // One renewal confirmed, then the daemon hangs.
    let deadline = holding.deadline();
    assert_eq!(holding.renew(deadline).await, None);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(d.child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let deadline = holding.deadline();
    assert!(deadline <= Instant::now() + ttl, "the deadline is within one client TTL of a renewal's send");
    let lost = loop {
        tokio::time::sleep_until(holding.next_renewal(deadline).into()).await;
        if let Some(why) = holding.renew(deadline).await {
            break why;
        }
        assert!(Instant::now() < deadline + Duration::from_millis(200), "not lost past its deadline");
    };
    let at = Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert!(at >= deadline, "lost {:?} before its deadline: {lost}", deadline - at);
    assert!(at < deadline + Duration::from_millis(200), "lost {:?} after its deadline", at - deadline);
    assert!(lost.contains("before its deadline"), "{lost}");
    assert_eq!(holding.is_lost(), Some(lost.as_str()));
    assert!(holding.renew(Instant::now() + ttl).await.is_some(), "lost stays lost");
}

/// Scenario 3, an impostor on the port: while the daemon is down, any local process can
/// bind the default TCP port and answer `Acquired`. A client whose daemon's config file
/// names the socket goes there and finds no daemon (exit 69) instead of falling back to
/// the port; it used to take the impostor's word and run its command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impostor_on_the_default_port_is_not_asked_when_the_config_names_the_socket() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let impostor = tokio::net::TcpListener::bind(sigma_daemon::http::DEFAULT_API)
        .await
        .unwrap_or_else(|e| panic!("this test binds {} (the default API port): {e}", sigma_daemon::http::DEFAULT_API));
    let answer = json!({
        "name": "x", "token": 1, "lease": "00000000000000000000000000000000", "valid_until_ms": 4_000_000_000_000u64,
        "valid_for_ms": 60_000, "distinct_peers": 3, "ttl_ms": 5_000
    })
    .to_string();
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = asked.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = impostor.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                        answer.len()
                    );
                    if s.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sigma.toml");
    std::fs::write(&config, format!("api = \"unix:{}\"\n", dir.path().join("api.sock").display())).unwrap();
    let out = Command::new(SIGMA)
        .args(["lock", "x", "--", "sh", "-c", "echo ran"])
        .env_remove("SIGMA_API")
        .env("SIGMA_CONFIG", &config)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ran"), "the command ran on an impostor's word: {stderr}");
    assert_eq!(out.status.code(), Some(69), "no daemon on the configured socket: {stderr}");
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 0, "the impostor was asked");
}
