//! What an operator sees of a running daemon: `sigma --version`, `/metrics` against its
//! table in docs/operating.md, the Grafana dashboard and alert rules in `deploy/` against
//! `/metrics`, and logs without colour codes when they do not go to a terminal.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Command;

mod daemon;

use daemon::{daemon_with, get_text, have_tool, serving_with, PATIENCE, SIGMA};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `sigma --version` (and `-V`): the crate version, the commit built and the wire
/// protocol, on one line.
#[tokio::test]
async fn version_names_the_commit_and_the_wire_protocol() {
    let expected = format!(
        "sigma {} (commit {}, protocol {})\n",
        env!("CARGO_PKG_VERSION"),
        sigma_daemon::version::COMMIT,
        sigma_behaviour::wire::PROTOCOL
    );
    for flag in ["--version", "-V"] {
        let out = Command::new(SIGMA).arg(flag).output().await.unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
    }
    assert!(expected.contains("protocol /sigma/"), "{expected}");
    // Built from a git checkout (not given $SIGMA_BUILD_COMMIT): its HEAD.
    let head = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).current_dir(repo()).output().await;
    match head {
        Ok(h) if h.status.success() && std::env::var_os("SIGMA_BUILD_COMMIT").is_none() => {
            assert_eq!(sigma_daemon::version::COMMIT, String::from_utf8_lossy(&h.stdout).trim());
        }
        _ => eprintln!("no git checkout: commit {}", sigma_daemon::version::COMMIT),
    }
}

/// `sigma run` with stderr to a pipe (a journal, a file, `2>&1 | tee`): plain log lines,
/// no ANSI escape codes; likewise the client commands' messages. On a terminal (through
/// `script`, when it is installed) the same lines are coloured, so the check is not
/// vacuous.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ansi_escapes_when_stderr_is_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    let run_args = ["run", "--listen", "/ip4/127.0.0.1/tcp/0", "--api", "127.0.0.1:0", "--log-format", "text"];
    let mut child = Command::new(SIGMA)
        .args(run_args)
        .arg("--key-file")
        .arg(&key)
        .env("RUST_LOG", "debug")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let log = tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line == "SIGMA_READY" {
                return true;
            }
        }
        false
    };
    assert!(tokio::time::timeout(PATIENCE, ready).await.unwrap_or(false), "sigma run did not get ready");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    assert!(tokio::time::timeout(PATIENCE, child.wait()).await.unwrap().unwrap().success());
    let log = log.await.unwrap();
    assert!(log.contains(" INFO ") && log.contains("DEBUG"), "levels in the log: {log}");
    assert!(!log.contains("\x1b["), "ANSI escapes in a log to a pipe:\n{log:?}");

    // A client's complaint and a usage error, to a pipe.
    for args in [&["status", "--api", "127.0.0.1:1"][..], &["lock", "--no-such-flag"][..]] {
        let out = Command::new(SIGMA).args(args).env("RUST_LOG", "debug").output().await.unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && !err.is_empty(), "{args:?}");
        assert!(!err.contains("\x1b["), "ANSI escapes from sigma {args:?}:\n{err:?}");
    }

    // The control: on a terminal, colours.
    if Command::new("script").arg("--version").output().await.is_ok_and(|o| o.status.success()) {
        let cmd = format!(
            "RUST_LOG=info timeout -s INT 3 {SIGMA} {} --key-file {}",
            run_args.join(" "),
            dir.path().join("key2").display()
        );
        let out =
            Command::new("script").args(["-qec", &cmd, "/dev/null"]).env_remove("NO_COLOR").output().await.unwrap();
        let tty = String::from_utf8_lossy(&out.stdout);
        assert!(tty.contains("\x1b["), "no colours on a terminal: {tty:?}");
    } else {
        eprintln!("script (util-linux) is not installed: the terminal control is skipped");
    }
}

/// One metric family of a `/metrics` text.
#[derive(Debug)]
struct Family {
    /// The name as queried in PromQL: a counter's with `_total`, an info's with `_info`.
    name: String,
    kind: String,
}

/// The families of an OpenMetrics text, from its `# TYPE` lines.
fn families(text: &str) -> Vec<Family> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("# TYPE ")?.split(' ');
            let (family, kind) = (w.next()?, w.next()?);
            let suffix = match kind {
                "counter" => "_total",
                "info" => "_info",
                _ => "",
            };
            Some(Family { name: format!("{family}{suffix}"), kind: kind.to_owned() })
        })
        .collect()
}

/// The sample names of an OpenMetrics text (`x_bucket`, `x_sum`, `x_total`, …).
fn samples(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next().map(str::to_owned))
        .collect()
}

/// The metrics table of docs/operating.md: name (in backticks, first column) → type.
fn documented() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(repo().join("docs/operating.md")).unwrap();
    doc.lines()
        .filter_map(|l| {
            let mut cells = l.strip_prefix("| `")?.splitn(3, '|');
            let name = cells.next()?.trim().strip_suffix('`')?;
            let kind = cells.next()?.trim();
            ["counter", "gauge", "histogram", "info"].contains(&kind).then(|| (name.to_owned(), kind.to_owned()))
        })
        .collect()
}

/// Metric names (`sigma_…`, `process_…`, `libp2p_…`) in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = ["sigma_", "process_", "libp2p_"].iter().filter_map(|p| rest.find(p)).min() {
        let before = rest[..at].chars().next_back();
        let name: String = rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        rest = &rest[at + name.len()..];
        // Part of another word (a label value such as `job="sigma_x"` is not a metric).
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '"') {
            continue;
        }
        names.push(name);
    }
    names
}

/// The PromQL expressions of deploy/alerts.yml (`expr:` values, folded `>-` blocks
/// included) and of deploy/grafana-dashboard.json (its panels' targets).
fn deploy_exprs() -> (Vec<String>, Vec<String>) {
    let rules = std::fs::read_to_string(repo().join("deploy/alerts.yml")).unwrap();
    let mut alerts = Vec::new();
    let mut lines = rules.lines().peekable();
    while let Some(l) = lines.next() {
        let Some(v) = l.trim_start().strip_prefix("expr:") else { continue };
        let indent = l.len() - l.trim_start().len();
        let mut expr = v.trim().to_owned();
        if expr == ">-" || expr == "|" {
            expr.clear();
            while let Some(next) = lines.next_if(|n| n.len() - n.trim_start().len() > indent || n.trim().is_empty()) {
                expr.push_str(next.trim());
                expr.push(' ');
            }
        }
        alerts.push(expr);
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("deploy/grafana-dashboard.json")).unwrap())
            .expect("the dashboard is JSON");
    let mut panels = Vec::new();
    for p in dashboard["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().into_iter().flatten() {
            panels.push(t["expr"].as_str().expect("a target's expr").to_owned());
        }
    }
    (alerts, panels)
}

/// Two daemons (so that the connection metrics exist), a lock won through the API (so
/// that the latency histogram has a sample): every metric `/metrics` exports is in
/// docs/operating.md's table with its type, and every metric the alert rules and the
/// dashboard query is exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_exported_is_documented_and_every_metric_queried_is_exported() {
    let dir = tempfile::tempdir().unwrap();
    let extra = ["--listen", "/ip4/127.0.0.1/tcp/0", "--metrics", "127.0.0.1:0"];
    let a = daemon_with(dir.path(), "a", &[], &extra).await;
    let b = daemon_with(dir.path(), "b", &[a.listen[0].clone()], &extra).await;
    serving_with(&b, 2).await;
    let out = daemon::lock_echo(&b, "observed", "60s").await;
    daemon::assert_locked(&out, "b");

    let mut text = String::new();
    for d in [&a, &b] {
        text.push_str(&get_text(&format!("http://{}/metrics", d.metrics.as_ref().unwrap())).await);
    }
    let table = documented();
    let mut missing = Vec::new();
    for f in families(&text) {
        match table.iter().find(|(n, _)| *n == f.name) {
            Some((_, kind)) => assert_eq!(*kind, f.kind, "the type of {} in docs/operating.md", f.name),
            None => missing.push(format!("| `{}` | {} | … |", f.name, f.kind)),
        }
    }
    assert!(missing.is_empty(), "exported but not in docs/operating.md's metrics table:\n{}", missing.join("\n"));
    for name in ["sigma_build_info", "process_resident_memory_bytes", "process_cpu_seconds_total"] {
        assert!(table.iter().any(|(n, _)| n == name), "{name} in the table");
    }

    let exported = samples(&text);
    let (alerts, panels) = deploy_exprs();
    assert!(alerts.len() >= 6 && panels.len() >= 10, "{} rules, {} panel queries", alerts.len(), panels.len());
    let mut queried = BTreeSet::new();
    for expr in alerts.iter().chain(&panels) {
        queried.extend(metric_names(expr));
    }
    let unknown: Vec<&String> = queried.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(unknown.is_empty(), "queried by deploy/alerts.yml or the dashboard but not exported: {unknown:?}");
    for needed in [
        "sigma_ready",
        "sigma_reachable_members",
        "sigma_acquire_duration_seconds_bucket",
        "sigma_client_leases_expired_total",
        "sigma_token_regressions_total",
        "process_resident_memory_bytes",
    ] {
        assert!(queried.contains(needed), "{needed} is used by the rules or the dashboard");
    }
}

/// deploy/alerts.yml is valid YAML and PromQL (`promtool check rules`), its rules fire
/// as deploy/alerts.test.yml says (`promtool test rules`), and the dashboard's queries
/// parse as PromQL (checked the same way, as recording rules, with Grafana's variables
/// filled in).
#[tokio::test]
async fn alert_rules_and_dashboard_queries_pass_promtool() {
    if !have_tool("promtool", "Debian: apt-get install prometheus").await {
        return;
    }
    let deploy = repo().join("deploy");
    for args in [&["check", "rules", "alerts.yml"][..], &["test", "rules", "alerts.test.yml"][..]] {
        let out = Command::new("promtool").args(args).current_dir(&deploy).output().await.unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (_, panels) = deploy_exprs();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in panels.iter().enumerate() {
        let expr = expr
            .replace("$__rate_interval", "5m")
            .replace("$__range", "6h")
            .replace("$job", ".*")
            .replace("$instance", ".*");
        rules.push_str(&format!(
            "      - record: dashboard:query{i}\n        expr: {}\n",
            serde_json::to_string(&expr).unwrap()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-rules.yml");
    std::fs::write(&file, rules).unwrap();
    let out = Command::new("promtool").args(["check", "rules"]).arg(&file).output().await.unwrap();
    assert!(
        out.status.success(),
        "the dashboard's queries:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn metric_names_in_promql() {
    assert_eq!(
        metric_names(
            r#"histogram_quantile(0.99, sum by (le) (rate(sigma_acquire_duration_seconds_bucket{job="sigma_x"}[5m])))"#
        ),
        ["sigma_acquire_duration_seconds_bucket"]
    );
    assert_eq!(metric_names("up{job=\"sigma\"} == 0"), Vec::<String>::new());
    assert_eq!(metric_names("process_open_fds / process_max_fds"), ["process_open_fds", "process_max_fds"]);
}
