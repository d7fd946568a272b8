//! The local multi-process testnet end to end: the real `sigma-testnet` binary driving
//! real `sigma run` processes on 127.0.0.1.
//!
//! The `sigma` binary belongs to another package (sigma-daemon), so `CARGO_BIN_EXE_sigma`
//! is not available here: the tests look for it in this test's target directory
//! (`target/<profile>/sigma`) and build it with `cargo build -p sigma-daemon --bin sigma`
//! first (a no-op when `cargo test --workspace` built it already). The tests run one
//! at a time: each starts several processes, and the machine may have two cores.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

const TESTNET: &str = env!("CARGO_BIN_EXE_sigma-testnet");

/// One test at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// `target/<profile>/sigma`, built if needed.
fn sigma_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        // target/<profile>/deps/testnet-HASH → target/<profile>
        let exe = std::env::current_exe().expect("current_exe");
        let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>").to_path_buf();
        let bin = profile_dir.join("sigma");
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "--quiet", "-p", "sigma-daemon", "--bin", "sigma"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("CARGO_TARGET_DIR", profile_dir.parent().expect("target dir"));
        // Not the variables cargo set for this test: build scripts that watch them
        // (ring watches CARGO_MANIFEST_DIR) would rebuild half the dependency tree.
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            let set_by_cargo_test = k.starts_with("CARGO_PKG_")
                || k.starts_with("CARGO_BIN_EXE_")
                || matches!(
                    &*k,
                    "CARGO_MANIFEST_DIR"
                        | "CARGO_MANIFEST_PATH"
                        | "CARGO_MANIFEST_LINKS"
                        | "CARGO_CRATE_NAME"
                        | "CARGO_BIN_NAME"
                        | "CARGO_PRIMARY_PACKAGE"
                        | "CARGO_TARGET_TMPDIR"
                        | "CARGO_RUSTC_CURRENT_DIR"
                        | "OUT_DIR"
                );
            if set_by_cargo_test {
                cmd.env_remove(&key);
            }
        }
        if release {
            cmd.arg("--release");
        }
        let status = cmd.status();
        match status {
            Ok(s) if s.success() => {}
            other if bin.is_file() => {
                eprintln!("building sigma failed ({other:?}); using the existing {}", bin.display())
            }
            other => panic!("cannot build the sigma binary ({other:?}) and {} does not exist", bin.display()),
        }
        assert!(bin.is_file(), "{} missing after the build", bin.display());
        bin
    })
}

fn testnet(args: &[&str]) -> Output {
    let out = Command::new(TESTNET)
        .args(args)
        .env("SIGMA_BIN", sigma_bin())
        .env_remove("RUST_LOG")
        .output()
        .expect("run sigma-testnet");
    eprintln!(
        "$ sigma-testnet {}\n--- exit: {:?}\n--- stdout:\n{}--- stderr:\n{}",
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

/// A live process (a zombie, whose parent has exited and nobody reaps, is gone).
fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next().map(str::to_owned)))
        .is_some_and(|state| state != "Z")
}

fn manifest_pids(dir: &Path) -> Vec<u64> {
    let m = read_json(&dir.join("manifest.json"));
    m["nodes"].as_array().expect("nodes").iter().map(|n| n["pid"].as_u64().expect("pid")).collect()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn short_run_passes_with_no_violation() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let net = dir.path().join("net");
    let json = dir.path().join("run.json");
    let csv = dir.path().join("cs.csv");
    let out = testnet(&[
        "run",
        "--nodes",
        "4",
        "--resources",
        "2",
        "--clients",
        "6",
        "--duration",
        "8",
        "--dir",
        path(&net),
        "--json",
        path(&json),
        "--records",
        path(&csv),
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "run must PASS:\n{text}");
    assert!(text.trim_end().ends_with("PASS"), "{text}");
    for line in ["exclusion violations:    0", "waiters never served:    0", "protocol messages / CS:"] {
        assert!(text.contains(line), "{line:?} missing:\n{text}");
    }
    let r = read_json(&json);
    assert_eq!(r["pass"], true);
    assert_eq!(r["violations"], 0, "{r}");
    assert_eq!(r["token_regressions"], 0, "{r}");
    assert_eq!(r["never_served"], Value::Array(vec![]), "{r}");
    let entries = r["entries"].as_u64().unwrap();
    assert!(entries > 0, "{r}");
    let per: u64 = r["per_resource"].as_array().unwrap().iter().map(|p| p["entries"].as_u64().unwrap()).sum();
    assert_eq!(per, entries);
    // Every CS costs at least a REQUEST and a RESPONSE per vote: 2m = 48 with m = 24.
    let mpe = r["messages_per_entry"].as_f64().unwrap();
    assert!(mpe >= 48.0, "messages per CS entry {mpe}");
    assert!(r["acquire_latency"]["p50_ms"].as_f64().unwrap() > 0.0, "{r}");
    // One CSV row per critical section.
    let rows = std::fs::read_to_string(&csv).unwrap().lines().count() as u64;
    assert_eq!(rows, entries + 1);
    // The testnet is down afterwards and the manifest says so.
    let m = read_json(&net.join("manifest.json"));
    assert!(m["nodes"].as_array().unwrap().iter().all(|n| n["state"] == "stopped"), "{m}");
    for pid in manifest_pids(&net) {
        assert!(!alive(pid), "node pid {pid} still running after run");
    }
}

/// The testnet's checker catches a planted fault of the core: with every node's
/// replicas granting over live votes (`--test-mutant grant-over-live-vote`, `sigma run
/// --test-mutant`), clients through different nodes hold one lock at once, and the run
/// fails on its exclusion violations. The same run without the fault passes
/// (`short_run_passes_with_no_violation`).
#[test]
fn a_run_whose_replicas_grant_over_live_votes_fails() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let net = dir.path().join("net");
    let json = dir.path().join("run.json");
    #[rustfmt::skip]
    let out = testnet(&[
        "run", "--nodes", "3", "--resources", "1", "--clients", "6", "--duration", "6",
        "--test-mutant", "grant-over-live-vote", "--dir", path(&net), "--json", path(&json),
    ]);
    let text = stdout(&out);
    assert_ne!(out.status.code(), Some(0), "a run with a double-granting core must FAIL:\n{text}");
    let r = read_json(&json);
    assert_eq!(r["pass"], false, "{r}");
    assert!(r["violations"].as_u64() > Some(0), "no exclusion violation caught:\n{text}");
    assert!(text.contains("[FAIL] exclusion violations:"), "{text}");
}

/// `--message-delay` reaches every daemon (`sigma run --test-message-delay`): each vote
/// is a REQUEST and a RESPONSE held 30 ms each, so no acquire of a contended lock takes
/// under 60 ms; and the simulator's figure for the same setting is printed beside the
/// run's own (the paper's Fig. 7 on real nodes).
#[test]
fn a_run_with_a_message_delay_prints_the_simulators_figure_beside_its_own() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let net = dir.path().join("net");
    let json = dir.path().join("run.json");
    #[rustfmt::skip]
    let out = testnet(&[
        "run", "--nodes", "3", "--resources", "1", "--clients", "4", "--duration", "6", "--hold-ms", "0",
        "--n", "5", "--m", "3", "--message-delay", "const:30", "--dir", path(&net), "--json", path(&json),
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "run must PASS:\n{text}{}", stderr(&out));
    let line = text.lines().find(|l| l.starts_with("message delay const 30ms:")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("the simulator, same setting (n = 5, m = 3, CS 0 ms"), "{line}");
    let r = read_json(&json);
    assert!(r["entries"].as_u64() > Some(0), "{r}");
    let fastest = r["acquire_latency"]["p50_ms"].as_f64().unwrap();
    assert!(fastest >= 60.0, "acquire p50 {fastest} ms: the delay did not hold the messages");
}

/// Crashes, restarts and a graceful restart (SIGTERM then a start, as `systemctl
/// restart`) on 4 real nodes, with HTTP clients and two `sigma lock NAME -- CMD`
/// holders: the run passes, every fault took effect, restarted nodes keep their
/// identity, and no two commands of one lock ran at once.
#[test]
fn chaos_run_with_kill_and_restart_fires_and_passes() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let net = dir.path().join("net");
    let json = dir.path().join("run.json");
    let out = testnet(&[
        "run",
        "--nodes",
        "4",
        "--resources",
        "2",
        "--clients",
        "6",
        "--duration",
        "12",
        "--chaos",
        "kill,restart,restart-graceful",
        "--chaos-interval",
        "1.5",
        "--holders",
        "2",
        "--seed",
        "7",
        "--dir",
        path(&net),
        "--json",
        path(&json),
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "chaos run must PASS:\n{text}");
    let r = read_json(&json);
    let kills = r["faults_fired"]["kill"].as_u64().unwrap();
    let restarts = r["faults_fired"]["restart"].as_u64().unwrap();
    assert!(kills >= 1, "no kill fired: {r}");
    assert!(kills + restarts >= 2, "expected a kill and a restart in 12 s at a 1.5 s mean: {r}");
    assert!(r["faults_fired"]["restart-graceful"].as_u64() >= Some(1), "no graceful restart fired: {r}");
    // `sigma lock NAME -- CMD` holders beside the HTTP clients: their commands ran, and
    // never two of one lock at once.
    let holders = &r["holders"];
    assert!(holders["commands"].as_u64() > Some(0), "no `sigma lock` command ran: {r}");
    assert_eq!(holders["overlaps"], Value::Array(vec![]), "{r}");
    assert_eq!(r["violations"], 0, "{r}");
    assert_eq!(r["crashes"], Value::Array(vec![]), "{r}");
    assert!(r["entries"].as_u64().unwrap() > 0);
    // Restarts kept the identity: each restarted node has the peer id it had.
    for e in r["fault_events"].as_array().unwrap() {
        assert_eq!(e["ok"], true, "{e}");
        if e["kind"] == "restart" {
            assert!(e["detail"].as_str().unwrap().contains("same identity"), "{e}");
        }
    }
    assert!(stderr(&out).contains("fault kill"), "faults are reported as they fire");
    for pid in manifest_pids(&net) {
        assert!(!alive(pid), "node pid {pid} still running after run");
    }
}

#[test]
fn up_status_down_round_trip() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let net = dir.path().join("net");
    let out = testnet(&["up", "--nodes", "3", "--dir", path(&net), "--lease-ms", "3000"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let m = read_json(&net.join("manifest.json"));
    let nodes = m["nodes"].as_array().unwrap().clone();
    assert_eq!(nodes.len(), 3);
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(n["index"], i);
        assert!(n["peer_id"].as_str().unwrap().starts_with("12D3KooW"), "{n}");
        assert!(n["listen"][0].as_str().unwrap().starts_with("/ip4/127.0.0.1/tcp/"), "{n}");
        assert!(n["api"].as_str().unwrap().starts_with("127.0.0.1:"), "{n}");
        assert!(Path::new(n["key_file"].as_str().unwrap()).is_file(), "{n}");
        assert!(Path::new(n["log_file"].as_str().unwrap()).is_file(), "{n}");
        assert_eq!(n["state"], "running");
    }
    let pids = manifest_pids(&net);
    // `up` has exited; the nodes live on.
    assert!(pids.iter().all(|p| alive(*p)), "nodes must outlive `up`");

    // A second `up` on the same directory refuses.
    let again = testnet(&["up", "--nodes", "3", "--dir", path(&net)]);
    assert_eq!(again.status.code(), Some(2));
    assert!(stderr(&again).contains("already running"), "{}", stderr(&again));

    // status: three nodes up, each with two peers.
    let st = testnet(&["status", "--dir", path(&net), "--json"]);
    assert_eq!(st.status.code(), Some(0), "{}", stderr(&st));
    let rows: Value = serde_json::from_slice(&st.stdout).unwrap();
    for row in rows.as_array().unwrap() {
        assert_eq!(row["process"], true, "{row}");
        assert_eq!(row["answering"], true, "{row}");
        assert_eq!(row["status"]["connected_peers"].as_array().unwrap().len(), 2, "{row}");
    }
    let table = stdout(&testnet(&["status", "--dir", path(&net)]));
    assert_eq!(table.lines().filter(|l| l.contains(" up ")).count(), 3, "{table}");

    // The nodes serve locks: take one through node 1 with the real `sigma lock`.
    let api = nodes[1]["api"].as_str().unwrap();
    let lock = Command::new(sigma_bin())
        .args(["lock", "demo", "--api", api, "--timeout", "20s", "--", "sh", "-c", "echo token=$SIGMA_FENCING_TOKEN"])
        .output()
        .unwrap();
    assert!(lock.status.success(), "{}", String::from_utf8_lossy(&lock.stderr));
    assert!(String::from_utf8_lossy(&lock.stdout).contains("token="));

    // down: every pid gone, files kept, manifest marked.
    let t0 = Instant::now();
    let down = testnet(&["down", "--dir", path(&net)]);
    assert_eq!(down.status.code(), Some(0), "{}", stderr(&down));
    assert!(t0.elapsed() < Duration::from_secs(20));
    for pid in &pids {
        assert!(!alive(*pid), "pid {pid} still alive after down");
    }
    let m = read_json(&net.join("manifest.json"));
    assert!(m["nodes"].as_array().unwrap().iter().all(|n| n["state"] == "stopped"), "{m}");
    assert!(net.join("node-0.log").is_file() && net.join("node-0.key").is_file());
    let st = testnet(&["status", "--dir", path(&net)]);
    assert_eq!(stdout(&st).lines().filter(|l| l.contains("stopped")).count(), 3, "{}", stdout(&st));
    // down again: nothing to stop, nothing else touched.
    let again = testnet(&["down", "--dir", path(&net)]);
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(stdout(&again).matches("not running").count(), 3, "{}", stdout(&again));
}

#[test]
fn a_node_that_cannot_start_is_reported_with_its_log() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let net = dir.path().join("net");
    // Node 0's peer port is taken.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = testnet(&["up", "--nodes", "2", "--base-port", &port.to_string(), "--dir", path(&net)]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("node 0"), "{err}");
    assert!(err.contains("last lines of") && err.contains("node-0.log"), "the log tail is shown: {err}");
    drop(taken);

    // No binary: a clear error saying how to build it.
    let out = Command::new(TESTNET)
        .args(["up", "--dir", path(&net)])
        .env("SIGMA_BIN", dir.path().join("no-such-sigma"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("cargo build --release -p sigma-daemon"), "{}", stderr(&out));

    // `restart` brings killed nodes back: alone it would fire nothing.
    let out = testnet(&["run", "--chaos", "restart", "--dir", path(&net)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("give it with kill"), "{}", stderr(&out));
}

/// Partitions, 50/50 splits and isolations really cut the traffic (the daemons' admin
/// block list), heal, and the run still passes: no two holders, no token regression,
/// every waiter served; the summary says how long the locks were unavailable per fault.
#[test]
fn partition_split_and_isolate_cut_heal_and_pass() {
    let dir = tempfile::tempdir().unwrap();
    let net = dir.path().join("net");
    let json = dir.path().join("run.json");
    let out = testnet(&[
        "run",
        "--nodes",
        "5",
        "--resources",
        "2",
        "--clients",
        "8",
        "--duration",
        "18",
        "--chaos",
        "partition,split,isolate",
        "--chaos-interval",
        "3",
        "--cut",
        "5",
        "--seed",
        "2",
        "--dir",
        path(&net),
        "--json",
        path(&json),
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "partition run must PASS:\n{text}");
    let r = read_json(&json);
    let fired: u64 = ["partition", "split", "isolate"].iter().map(|k| r["faults_fired"][k].as_u64().unwrap()).sum();
    assert!(fired >= 2, "expected at least two cuts in 18 s at a 3 s mean (5 s each): {r}");
    assert_eq!(r["violations"], 0, "{r}");
    assert_eq!(r["token_regressions"], 0, "{r}");
    let unavailable = r["unavailability"].as_array().unwrap();
    assert_eq!(unavailable.len() as u64, fired, "one unavailability figure per fault: {r}");
    assert!(text.contains("unavailability per fault"), "{text}");
    assert!(stderr(&out).contains("healed"), "heals are reported");
    for pid in manifest_pids(&net) {
        assert!(!alive(pid), "node pid {pid} still running after run");
    }
}

#[test]
fn soak_streams_names_samples_every_node_and_counts_the_flood() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let net = dir.path().join("net");
    let json = dir.path().join("soak.json");
    let out = testnet(&[
        "soak",
        "--nodes",
        "3",
        "--names",
        "300",
        "--clients",
        "6",
        "--sample",
        "1",
        "--idle",
        "1",
        "--flood",
        "3000",
        "--probe-rounds",
        "20",
        "--lease-ms",
        "3000",
        "--dir",
        path(&net),
        "--json",
        path(&json),
        "--sigma-bin",
        path(sigma_bin()),
    ]);
    assert!(out.status.success(), "soak failed:\n{}{}", stdout(&out), stderr(&out));
    let r = read_json(&json);
    assert_eq!(r["names_done"], 300, "{}", stdout(&out));
    assert_eq!(r["failures"], 0, "{}", stdout(&out));
    let samples = r["samples"].as_array().expect("samples");
    assert!(samples.len() >= 2, "{}", stdout(&out));
    for s in samples {
        let nodes = s["nodes"].as_array().expect("nodes");
        assert_eq!(nodes.len(), 3);
        assert!(nodes.iter().all(|n| n["rss_kib"].as_u64() > Some(1024)), "RSS read: {s}");
    }
    let hosted = samples.iter().flat_map(|s| s["nodes"].as_array().unwrap()).map(|n| n["replicas"].as_u64().unwrap());
    assert!(hosted.max() > Some(0), "replica counts read from the nodes");
    let flood = &r["flood"];
    let sent = flood["sent"].as_u64().expect("flood sent");
    let answered: u64 = flood["answers"].as_object().expect("answers").values().map(|v| v.as_u64().unwrap()).sum();
    assert!(sent > 0 && answered == sent, "every flood REQUEST answered or failed: {flood}");
    assert!(flood["answers"]["accepted"].as_u64() > Some(0), "some made-up names reached their host: {flood}");
    assert_eq!(r["targets"].as_array().map(Vec::len), Some(3));
    assert!(stdout(&out).contains("RSS at the end within 20 MB"), "{}", stdout(&out));
    assert!(!manifest_pids(&net).into_iter().any(alive), "soak leaves no node running");
}

/// The JSON that `--json` prints after the summary.
fn trailing_json(text: &str) -> Value {
    let start = text.find("\n{").map(|i| i + 1).unwrap_or_else(|| panic!("no JSON in:\n{text}"));
    serde_json::from_str(&text[start..]).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// `bench --vs etcd` on 3 daemons with small counts (3 waiters for 1 s, 1.5 s leases).
fn bench_vs_etcd(etcd_bin: &str, rounds: u32) -> Output {
    let rounds = rounds.to_string();
    #[rustfmt::skip]
    let args = [
        "bench", "--vs", "etcd", "--etcd-bin", etcd_bin, "--daemons", "3", "--rounds", &rounds, "--waiters", "3",
        "--seconds", "1", "--lease-ms", "1500", "--json",
    ];
    testnet(&args)
}

#[test]
fn bench_vs_etcd_without_etcd_says_how_to_get_it_and_measures_sigma_alone() {
    let _serial = serial();
    let out = bench_vs_etcd("/nonexistent/etcd", 5);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(stderr(&out).contains("apt-get install etcd-server"), "{}", stderr(&out));
    assert!(text.contains("etcd: not run: --etcd-bin /nonexistent/etcd: no such file"), "{text}");
    assert!(text.contains("apt-get install etcd-server"), "{text}");
    assert!(text.contains("| sigma, 3 daemons"), "{text}");
    assert!(text.contains("[PASS] no overlapping holds"), "{text}");
    let report = trailing_json(&text);
    assert!(report["etcd"].is_null(), "{report}");
    let rows = report["sigma"].as_array().expect("sigma rows");
    assert_eq!(rows.len(), 1);
    assert!(rows[0]["entries"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(rows[0]["overlaps"], 0);
    assert_eq!(rows[0]["token_regressions"], 0);
    assert!(rows[0]["leftover"].is_null(), "{report}");
    assert!(rows[0]["lock_unlock_p50_ms"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_vs_etcd_refuses_bad_options() {
    // Options of the in-process bench do not mix with --vs; a swarm of 0 daemons is refused.
    let out = testnet(&["bench", "--vs", "etcd", "--nodes", "4"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--nodes"), "{}", stderr(&out));
    let out = testnet(&["bench", "--daemons", "3"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--vs"), "{}", stderr(&out));
    let out = testnet(&["bench", "--vs", "etcd", "--daemons", "0", "--etcd-bin", "/nonexistent/etcd"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--daemons needs"), "{}", stderr(&out));
}

/// Both systems, small counts (about 10 s). Needs etcd on PATH (`apt-get install
/// etcd-server`; .ci/run installs it): without it the test fails, unless
/// SIGMA_SKIP_MISSING_TOOLS is set (non-empty), when it skips.
#[test]
fn bench_vs_etcd_measures_both_when_etcd_is_installed() {
    let etcd = match sigma_testnet::etcd::locate(None) {
        Ok(etcd) => etcd,
        Err(e) if std::env::var_os("SIGMA_SKIP_MISSING_TOOLS").is_some_and(|v| !v.is_empty()) => {
            eprintln!("{e}: skipped, SIGMA_SKIP_MISSING_TOOLS is set");
            return;
        }
        Err(e) => panic!("{e}; set SIGMA_SKIP_MISSING_TOOLS=1 to skip this test"),
    };
    let _serial = serial();
    let out = bench_vs_etcd(path(&etcd), 10);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("| etcd, 3 members"), "{text}");
    assert!(text.contains("| sigma, 3 daemons / etcd"), "{text}");
    assert!(text.contains("[goal "), "{text}");
    let report = trailing_json(&text);
    for row in std::iter::once(&report["etcd"]).chain(report["sigma"].as_array().unwrap()) {
        assert!(row["entries"].as_u64().unwrap() > 0, "{report}");
        assert_eq!(row["overlaps"], 0, "{report}");
        assert_eq!(row["token_regressions"], 0, "{report}");
        assert!(row["leftover"].is_null(), "{report}");
    }
}
