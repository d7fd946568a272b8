//! `sigma run` as operators deploy it: settings from a config file, a key file that
//! persists by default and that two daemons cannot share, /metrics on its own address,
//! JSON logs, and systemd's readiness notification (Type=notify).

use std::collections::HashMap;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

mod daemon;

use daemon::{get_text, have_tool, PATIENCE, SIGMA};

/// `sigma run ARGS` with a clean environment of SIGMA_* variables plus `env`; returns
/// the child and its `SIGMA_…=` lines once it printed `SIGMA_READY`.
async fn start(args: &[&str], env: &[(&str, &Path)], stderr: Stdio) -> (Child, HashMap<String, String>) {
    let mut cmd = Command::new(SIGMA);
    cmd.arg("run").args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(stderr).kill_on_drop(true);
    for (k, _) in std::env::vars() {
        if k.starts_with("SIGMA_") || k == "STATE_DIRECTORY" || k == "NOTIFY_SOCKET" {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn sigma run");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = HashMap::new();
    let ready = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line == "SIGMA_READY" {
                return true;
            }
            if let Some((k, v)) = line.split_once('=') {
                seen.insert(k.to_owned(), v.to_owned());
            }
        }
        false
    };
    assert!(tokio::time::timeout(PATIENCE, ready).await.unwrap_or(false), "sigma run {args:?} did not get ready");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, seen)
}

fn sigterm(child: &Child) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_metrics_address_json_logs_and_a_key_file_two_daemons_cannot_share() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k");
    let config = dir.path().join("sigma.toml");
    std::fs::write(
        &config,
        format!(
            "listen = [\"/ip4/127.0.0.1/tcp/0\"]\napi = \"127.0.0.1:0\"\nmetrics = \"127.0.0.1:0\"\n\
             log-format = \"json\"\nkey-file = \"{}\"\n",
            key.display()
        ),
    )
    .unwrap();
    let log = dir.path().join("a.log");
    let cfg = config.to_str().unwrap();
    let (mut a, lines) = start(&["--config", cfg], &[], std::fs::File::create(&log).unwrap().into()).await;
    let metrics = lines.get("SIGMA_METRICS").expect("SIGMA_METRICS= printed");
    let text = get_text(&format!("http://{metrics}/metrics")).await;
    assert!(text.contains("sigma_ready"), "{text}");
    // Only /metrics there: the lock API stays on loopback behind its gate.
    let other = daemon::http().get(format!("http://{metrics}/v1/status")).send().await.unwrap();
    assert_eq!(other.status(), 404);
    assert_eq!(other.json::<serde_json::Value>().await.unwrap()["code"], "not_found", "JSON there too");
    assert!(key.exists(), "the key file named in the config file");
    let first = std::fs::read_to_string(&log).unwrap();
    let line = first.lines().next().expect("a log line");
    let json: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert!(json["level"].is_string() && json["message"].is_string(), "{json}");

    // The same key file for a second daemon: refused, exit 69.
    let out = Command::new(SIGMA)
        .args(["run", "--listen", "/ip4/127.0.0.1/tcp/0", "--api", "127.0.0.1:0", "--key-file"])
        .arg(&key)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use by another sigma daemon"));

    // The command line wins over the file: another API address. The first daemon is
    // gone before the second starts (its key file's lock with it): a kill on drop does
    // not wait for the exit, and the second daemon found the key file still in use.
    a.kill().await.expect("kill the first daemon");
    let (_b, lines) =
        start(&["--config", cfg, "--api", "127.0.0.2:0", "--log-format", "text"], &[], Stdio::null()).await;
    assert!(lines["SIGMA_API"].starts_with("127.0.0.2:"), "{lines:?}");

    // A typo in the file is a usage error.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "lisen = [\"/ip4/127.0.0.1/tcp/0\"]\n").unwrap();
    let out = Command::new(SIGMA).args(["run", "--config", bad.to_str().unwrap()]).output().await.unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown setting \"lisen\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_key_file_keeps_the_peer_id_and_systemd_is_told_ready_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    let env = [("XDG_STATE_HOME", dir.path()), ("NOTIFY_SOCKET", socket_path.as_path())];
    let args = ["--listen", "/ip4/127.0.0.1/tcp/0", "--api", "127.0.0.1:0"];
    let (mut a, lines) = start(&args, &env, Stdio::null()).await;
    let peer = lines["SIGMA_PEER_ID"].clone();
    assert!(dir.path().join("sigma/key").exists(), "the key file in $XDG_STATE_HOME/sigma");
    let mut buf = [0u8; 512];
    let n = socket.recv(&mut buf).unwrap();
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg}");
    sigterm(&a);
    let n = socket.recv(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).lines().any(|l| l == "STOPPING=1"));
    assert!(tokio::time::timeout(PATIENCE, a.wait()).await.unwrap().unwrap().success());

    let (_again, lines) = start(&args, &env, Stdio::null()).await;
    assert_eq!(lines["SIGMA_PEER_ID"], peer, "a restart keeps the peer id");
    let (_other, lines) = start(&[&args[..], &["--ephemeral-key"]].concat(), &env, Stdio::null()).await;
    assert_ne!(lines["SIGMA_PEER_ID"], peer, "--ephemeral-key: a new identity, the key file untouched");
}

/// `deploy/sigma.service` passes `systemd-analyze verify` (pointed at the binary under
/// test), and its command, run as systemd runs it (Type=notify: $NOTIFY_SOCKET;
/// StateDirectory: $STATE_DIRECTORY), starts with the shipped `deploy/sigma.toml`
/// (addresses moved to loopback through the environment, which wins over the file),
/// tells systemd it is ready and keeps its key in the state directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_systemd_unit_verifies_and_its_command_runs_as_systemd_runs_it() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let unit = std::fs::read_to_string(deploy.join("sigma.service")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let here = dir.path().join("sigma.service");
    std::fs::write(&here, unit.replace("/usr/local/bin/sigma", SIGMA)).unwrap();
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&here)
        .output()
        .await
        .unwrap_or_else(|e| panic!("systemd-analyze: {e} (Debian: apt-get install systemd; .ci/run installs it)"));
    let complaints = String::from_utf8_lossy(&verify.stderr);
    assert!(verify.status.success() && complaints.trim().is_empty(), "systemd-analyze verify: {complaints}");
    let config_text = std::fs::read_to_string(deploy.join("sigma.toml")).unwrap();
    assert!(config_text.contains("api = \"unix:/run/sigma/api.sock\""), "the shipped config uses the socket");
    assert!(config_text.contains("metrics = \"127.0.0.1:"), "the shipped config keeps metrics on loopback");
    for line in ["Type=notify", "StateDirectory=sigma", "RuntimeDirectory=sigma", "KillSignal=SIGTERM"] {
        assert!(unit.lines().any(|l| l == line), "the unit lacks {line}");
    }

    let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("ExecStart=");
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/sigma"));
    let config = deploy.join("sigma.toml");
    let args: Vec<String> =
        words.map(|w| if w == "/etc/sigma/sigma.toml" { config.display().to_string() } else { w.to_owned() }).collect();
    assert_eq!(args[0], "run");
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let socket_path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    // The shipped config's API socket in /run/sigma (RuntimeDirectory), moved here.
    let api = format!("unix:{}", dir.path().join("api.sock").display());
    let env: [(&str, &Path); 5] = [
        ("STATE_DIRECTORY", &state),
        ("NOTIFY_SOCKET", &socket_path),
        ("SIGMA_LISTEN", Path::new("/ip4/127.0.0.1/tcp/0")),
        ("SIGMA_API", Path::new(&api)),
        ("SIGMA_METRICS", Path::new("127.0.0.1:0")),
    ];
    let args: Vec<&str> = args[1..].iter().map(String::as_str).collect();
    let log = dir.path().join("unit.log");
    let (_unit, lines) = start(&args, &env, std::fs::File::create(&log).unwrap().into()).await;
    assert_eq!(lines["SIGMA_API"], api);
    assert!(lines["SIGMA_METRICS"].starts_with("127.0.0.1:"));
    let mut buf = [0u8; 512];
    let n = socket.recv(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).lines().any(|l| l == "READY=1"));
    assert!(state.join("key").exists(), "the key file in the state directory");
    let first = std::fs::read_to_string(&log).unwrap();
    assert!(first.lines().next().is_some_and(|l| l.starts_with('{')), "JSON logs from the shipped config: {first}");
}

/// The unit's sandbox: `systemd-analyze security` (offline, on the file) scores it 2.0
/// or below ("OK"; 5.4 "MEDIUM" before the unit was hardened).
#[tokio::test]
async fn the_systemd_unit_is_sandboxed_to_an_exposure_of_2_or_less() {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/sigma.service");
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&unit)
        .output()
        .await
        .unwrap_or_else(|e| panic!("systemd-analyze: {e} (Debian: apt-get install systemd; .ci/run installs it)"));
    let text = String::from_utf8_lossy(&out.stdout);
    let overall = text
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for sigma.service: ").map(|(_, v)| v.to_owned()))
        .unwrap_or_else(|| panic!("no overall exposure in:\n{text}{}", String::from_utf8_lossy(&out.stderr)));
    let score: f64 = overall.split_whitespace().next().and_then(|s| s.parse().ok()).expect("a score");
    assert!(score <= 2.0, "exposure {overall}, above 2.0:\n{text}");
}

/// The system calls of a daemon at work (start, a lock through the API socket, a
/// scrape, a clean stop), traced with strace, are all allowed by the unit's
/// SystemCallFilter= lines (as `systemd-analyze syscall-filter` expands their groups):
/// a call outside them would fail with EPERM under systemd. Needs strace, which
/// .ci/run installs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_makes_only_system_calls_the_unit_allows() {
    if !have_tool("strace", "Debian: apt-get install strace").await {
        return;
    }
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let unit = std::fs::read_to_string(deploy.join("sigma.service")).unwrap();
    let listing = Command::new("systemd-analyze").args(["syscall-filter", "--no-pager"]).output().await.unwrap();
    let groups = syscall_groups(&String::from_utf8_lossy(&listing.stdout));
    let mut allowed = expand(&groups, "@default");
    for line in unit.lines().filter_map(|l| l.strip_prefix("SystemCallFilter=")) {
        let (deny, names) = match line.strip_prefix('~') {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        for name in names.split_whitespace() {
            let set = expand(&groups, name);
            if deny {
                allowed.retain(|c| !set.contains(c));
            } else {
                allowed.extend(set);
            }
        }
    }
    assert!(allowed.contains("epoll_wait") && !allowed.contains("setuid"), "the unit's filter: {allowed:?}");

    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace");
    let api = format!("unix:{}", dir.path().join("api.sock").display());
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-qq", "-o"])
        .arg(&trace)
        .args([SIGMA, "run", "--config"])
        .arg(deploy.join("sigma.toml"))
        .env("STATE_DIRECTORY", dir.path())
        .env("SIGMA_LISTEN", "/ip4/127.0.0.1/tcp/0,/ip4/127.0.0.1/udp/0/quic-v1")
        .env("SIGMA_API", &api)
        .env("SIGMA_METRICS", "127.0.0.1:0")
        .env("SIGMA_LEASE_MS", "1000")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut strace = cmd.spawn().unwrap();
    let mut lines = BufReader::new(strace.stdout.take().unwrap()).lines();
    let mut metrics = String::new();
    let ready = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(m) = line.strip_prefix("SIGMA_METRICS=") {
                metrics = m.to_owned();
            }
            if line == "SIGMA_READY" {
                return true;
            }
        }
        false
    };
    assert!(tokio::time::timeout(PATIENCE, ready).await.unwrap_or(false), "sigma run under strace did not get ready");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    assert!(get_text(&format!("http://{metrics}/metrics")).await.contains("process_cpu_seconds_total"));
    let out = Command::new(SIGMA)
        .args(["lock", "traced", "--api", &api, "--timeout", "60s", "--", "true"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // strace's child is the daemon: a SIGTERM to it is a clean stop.
    let tracer = strace.id().unwrap();
    let children = std::fs::read_to_string(format!("/proc/{tracer}/task/{tracer}/children")).unwrap();
    let daemon: i32 = children.split_whitespace().next().expect("strace's child").parse().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon), nix::sys::signal::Signal::SIGTERM).unwrap();
    assert!(tokio::time::timeout(PATIENCE, strace.wait()).await.unwrap().unwrap().success());

    let trace = std::fs::read_to_string(&trace).unwrap();
    let mut used = std::collections::BTreeSet::new();
    for line in trace.lines() {
        // "PID name(args…" (lines such as "PID +++ exited" or "--- SIGTERM" are not calls).
        let Some((_, call)) = line.split_once(' ') else { continue };
        let name: String = call.trim_start().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if !name.is_empty() && call.trim_start()[name.len()..].starts_with('(') {
            used.insert(name);
        }
    }
    assert!(used.len() > 20 && used.contains("epoll_wait"), "calls traced: {used:?}");
    let refused: Vec<&String> = used.iter().filter(|c| !allowed.contains(*c)).collect();
    assert!(refused.is_empty(), "system calls the unit's SystemCallFilter= refuses: {refused:?}");
}

/// `systemd-analyze syscall-filter`'s listing: each `@group` and its members (calls
/// and other groups).
fn syscall_groups(listing: &str) -> HashMap<String, Vec<String>> {
    let mut groups: HashMap<String, Vec<String>> = HashMap::new();
    let mut current = None;
    for line in listing.lines() {
        if line.starts_with('@') {
            current = Some(line.trim().to_owned());
            groups.entry(line.trim().to_owned()).or_default();
        } else if let Some(group) = &current {
            let item = line.trim();
            if !item.is_empty() && !item.starts_with('#') {
                groups.get_mut(group).unwrap().push(item.to_owned());
            }
        }
    }
    groups
}

fn expand(groups: &HashMap<String, Vec<String>>, name: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut todo = vec![name.to_owned()];
    let mut seen = std::collections::HashSet::new();
    while let Some(n) = todo.pop() {
        if !seen.insert(n.clone()) {
            continue;
        }
        match groups.get(&n) {
            Some(members) => todo.extend(members.iter().cloned()),
            None if !n.starts_with('@') => {
                out.insert(n);
            }
            None => panic!("unknown system call group {n}"),
        }
    }
    out
}
