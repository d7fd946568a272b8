//! Runs each example program with small parameters and checks its exit status and the
//! lines a reader of its README is told to expect.

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// Upper bound for one program run (each program also has its own, shorter, timeout).
const LIMIT: Duration = Duration::from_secs(50);

struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Run {
    fn assert_success(&self) {
        assert!(self.status.success(), "exit status {}\n{}", self.status, self.dump());
    }

    fn assert_line(&self, line: &str) {
        assert!(self.stdout.lines().any(|l| l.trim() == line), "no line {line:?} in the output\n{}", self.dump());
    }

    /// The number after `prefix` on the line starting with it.
    fn number_after(&self, prefix: &str) -> u64 {
        let line = self.stdout.lines().find(|l| l.starts_with(prefix));
        let number = line.and_then(|l| l[prefix.len()..].split_whitespace().next()?.parse().ok());
        number.unwrap_or_else(|| panic!("no number after {prefix:?}\n{}", self.dump()))
    }

    fn dump(&self) -> String {
        format!("--- stdout ---\n{}--- stderr ---\n{}", self.stdout, self.stderr)
    }
}

/// Runs an example binary to completion (killed after [`LIMIT`]).
fn run(bin: &str, args: &[&str]) -> Run {
    let mut child = Command::new(bin)
        .args(args)
        .env("RUST_LOG", "warn")
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
    let read = |mut pipe: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("piped")));
    let stderr = read(Box::new(child.stderr.take().expect("piped")));
    let deadline = Instant::now() + LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the example") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let (out, err) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
            panic!("{bin} {args:?} still running after {LIMIT:?}\n--- stdout ---\n{out}--- stderr ---\n{err}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    Run { status, stdout: stdout.join().expect("stdout reader"), stderr: stderr.join().expect("stderr reader") }
}

const SHARED_COUNTER: &str = env!("CARGO_BIN_EXE_shared-counter");
const LEADER_ELECTION: &str = env!("CARGO_BIN_EXE_leader-election");
const EMBED: &str = env!("CARGO_BIN_EXE_embed");

#[test]
fn shared_counter_counts_every_increment_once() {
    let run = run(SHARED_COUNTER, &["--nodes", "3", "--increments", "5", "--timeout-s", "40"]);
    run.assert_success();
    run.assert_line("final counter: 15 (expected 15)");
    run.assert_line("stale writes rejected: 0");
    for w in 0..3 {
        run.assert_line(&format!("worker {w}: 5 increments"));
    }
}

#[test]
fn shared_counter_rejects_the_paused_holders_stale_write() {
    let args = ["--nodes", "3", "--increments", "3", "--pause-holder", "--lease-ms", "1000", "--timeout-s", "40"];
    let run = run(SHARED_COUNTER, &args);
    run.assert_success();
    // The refused increment is redone under a new lock: nothing is lost, nothing doubled.
    run.assert_line("final counter: 9 (expected 9)");
    assert!(run.number_after("stale writes rejected: ") >= 1, "{}", run.dump());
    assert!(run.stdout.contains("worker 0: stale write rejected by the storage"), "{}", run.dump());
}

#[test]
fn shared_counter_fails_on_bad_arguments() {
    let run = run(SHARED_COUNTER, &["--nodes", "0"]);
    assert!(!run.status.success(), "{}", run.dump());
}

#[test]
fn leader_election_survives_the_leaders_death() {
    let args = ["--nodes", "3", "--lease-ms", "1000", "--kill-after-ms", "800", "--heartbeat-ms", "200"];
    let run = run(LEADER_ELECTION, &args);
    run.assert_success();
    run.assert_line("overlapping leaders: 0");
    let seen = run.stdout.lines().find(|l| l.starts_with("observer: saw ")).unwrap_or_default();
    assert!(seen.ends_with("in token order: true, none that did not lead: true"), "{}", run.dump());
    let takeover = run.stdout.lines().find(|l| l.starts_with("takeover: node ") && l.contains(" -> node "));
    let takeover = takeover.unwrap_or_else(|| panic!("no takeover line\n{}", run.dump()));
    assert!(takeover.ends_with("token increased"), "{takeover}");
    // Two terms in the timeline: the killed leader's and its successor's.
    assert!(run.stdout.contains("(node killed)") && run.stdout.contains("(demo over)"), "{}", run.dump());
}

#[test]
fn leader_election_refuses_to_kill_everyone() {
    let run = run(LEADER_ELECTION, &["--nodes", "2", "--kills", "2"]);
    assert!(!run.status.success(), "{}", run.dump());
}

#[test]
fn embed_two_apps_take_turns() {
    let run = run(EMBED, &["--hold-ms", "100", "--timeout-s", "40"]);
    run.assert_success();
    for app in ["alice", "bob"] {
        assert!(run.stdout.lines().any(|l| l.starts_with(&format!("{app}: Acquired "))), "{}", run.dump());
        assert!(run.stdout.lines().any(|l| l.starts_with(&format!("{app}: release("))), "{}", run.dump());
    }
    assert!(run.stdout.lines().any(|l| l.starts_with("lock held by ")), "{}", run.dump());
}
