//! The Go client (examples/go, its command cmd/sigma-lock-go built here with `go build`)
//! and the TypeScript one (examples/typescript, its compiled dist/cli.js run by `node`)
//! against real daemons, in the scenarios of python_client.rs: two clients for one lock
//! take turns (the second is granted only after the first released, with a larger fencing
//! token) while the first renews its client lease past its TTL; a holder whose daemon
//! hangs is lost by its deadline; a lock not won within the timeout (423 `not_won`, exit
//! 75); the unix socket, the configured address, and a clear error when no daemon answers. And the Python client (python_client.rs runs its
//! scenarios) installed with pip.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::io::AsyncBufReadExt as _;
use tokio::process::Command;

mod daemon;

use daemon::{daemon_with, eventually, get_json, have_tool};

const GO_MODULE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/go");
const TS_CLI: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/typescript/dist/cli.js");
/// How to get the tools (a missing one fails these tests unless SIGMA_SKIP_MISSING_TOOLS
/// is set; .ci/run installs golang-go).
const GO: &str = "apt-get install golang-go";
const NODE: &str = "apt-get install nodejs";
const PYTHON: &str = "apt-get install python3 python3-venv";
const PYTHON_PACKAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/python");

/// A client's command: the program and the arguments before sigma_lock.py's own.
struct Client {
    what: &'static str,
    program: PathBuf,
    args: Vec<String>,
}

impl Client {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args).args(args).stdin(Stdio::null()).kill_on_drop(true);
        cmd
    }
}

/// Whether go runs: have_tool's rules by hand (`go version`, not `--version`).
async fn have_go() -> bool {
    let found = Command::new("go").arg("version").output().await.is_ok_and(|o| o.status.success());
    if !found {
        let missing = format!("go is not installed ({GO})");
        if std::env::var_os(daemon::SKIP_MISSING_TOOLS).is_some_and(|v| !v.is_empty()) {
            eprintln!("{missing}: skipped, {} is set", daemon::SKIP_MISSING_TOOLS);
            return false;
        }
        panic!("{missing}; set {}=1 to skip the tests that need it", daemon::SKIP_MISSING_TOOLS);
    }
    true
}

/// `go SUBCOMMAND ARGS` in examples/go, with the standard library only: nothing to
/// download (GOPROXY=off), whatever the environment says; the build cache in the target
/// directory.
fn go_command(args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new("go");
    cmd.args(args)
        .current_dir(GO_MODULE)
        .env("GOPROXY", "off")
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .env("GOCACHE", Path::new(env!("CARGO_TARGET_TMPDIR")).join("go-build"));
    cmd
}

/// The Go client's command, built once per test run into the target directory (about a
/// second). None if go is missing and SIGMA_SKIP_MISSING_TOOLS is set.
async fn go() -> Option<Client> {
    if !have_go().await {
        return None;
    }
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let program = BUILT.get_or_init(|| {
        let program = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sigma-lock-go");
        let started = Instant::now();
        let out =
            go_command(&["build", "-o", program.to_str().unwrap(), "./cmd/sigma-lock-go"]).output().expect("go build");
        assert!(out.status.success(), "go build: {}", String::from_utf8_lossy(&out.stderr));
        eprintln!("go build of sigma-lock-go: {:?}", started.elapsed());
        program
    });
    Some(Client { what: "go", program: program.clone(), args: vec![] })
}

/// The TypeScript client's command (its compiled JavaScript: only node is needed). None
/// if node is missing and SIGMA_SKIP_MISSING_TOOLS is set.
async fn typescript() -> Option<Client> {
    if !have_tool("node", NODE).await {
        return None;
    }
    assert!(Path::new(TS_CLI).exists(), "{TS_CLI} (npm run build in examples/typescript)");
    Some(Client { what: "typescript", program: "node".into(), args: vec![TS_CLI.to_owned()] })
}

/// The token of the line of `out` that starts with `word`.
fn token(out: &str, word: &str) -> u64 {
    let line = out.lines().find(|l| l.starts_with(word)).unwrap_or_else(|| panic!("no {word} line in {out}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

async fn take_turns_and_renew_their_lease(c: Client) {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon_with(dir.path(), c.what, &[], &["--listen", "/ip4/127.0.0.1/tcp/0"]).await;
    let status = format!("http://{}/v1/status", d.api);
    eventually("the daemon to serve", || async { get_json(&status).await["ready"] == true }).await;
    let name = format!("{}/turns", c.what);

    // The first holds for 4 s, four times its 1 s client TTL: only its renewals keep it.
    let first =
        c.command(&["--api", &d.api, "--hold", "4", "--ttl", "1", &name]).stdout(Stdio::piped()).spawn().unwrap();
    eventually("the first client to hold the lock", || async {
        get_json(&status).await["locks_held"].as_array().is_some_and(|h| !h.is_empty())
    })
    .await;
    // Not won in time: 423 `not_won`, which the client tells from any other refusal.
    let late = c.command(&["--api", &d.api, "--timeout", "0.3", &name]).output().await.unwrap();
    let said = String::from_utf8_lossy(&late.stderr);
    assert_eq!(late.status.code(), Some(75), "not won within --timeout: {said}");
    assert!(said.contains("not_won"), "{said}");
    let waiting = Instant::now();
    let second = c.command(&["--api", &d.api, "--timeout", "30", &name]).output().await.unwrap();
    let waited = waiting.elapsed();
    let first = first.wait_with_output().await.unwrap();
    let (out1, out2) = (String::from_utf8_lossy(&first.stdout), String::from_utf8_lossy(&second.stdout));
    assert!(first.status.success(), "first: {out1}\n{}", String::from_utf8_lossy(&first.stderr));
    assert!(second.status.success(), "second: {out2}\n{}", String::from_utf8_lossy(&second.stderr));
    let (t1, t2) = (token(&out1, "acquired"), token(&out2, "acquired"));
    assert_eq!(token(&out1, "released"), t1, "the first kept its lock past its TTL: {out1}");
    assert_eq!(token(&out2, "released"), t2, "{out2}");
    assert!(t2 > t1, "tokens {t1} then {t2}");
    // Without renewals the daemon would have released the first lock one TTL (1 s) after
    // it was taken; the second was granted only when the first released, near 4 s.
    assert!(waited > Duration::from_millis(2500), "the second got the lock after {waited:?}: {out1}");
    assert!(!out1.contains("lost"), "{out1}");
}

/// The holder contract: with its daemon hung (SIGSTOP: keep-alives time out, as under an
/// overload), the holder prints `lost` by the deadline its last renewal was answered
/// with, counted from that renewal's send: within one client TTL (1 s here) of the hang.
async fn lost_by_its_deadline_when_its_daemon_hangs(c: Client) {
    let dir = tempfile::tempdir().unwrap();
    let d =
        daemon_with(dir.path(), c.what, &[], &["--listen", "/ip4/127.0.0.1/tcp/0", "--takeover-delay", "100ms"]).await;
    let status = format!("http://{}/v1/status", d.api);
    eventually("the daemon to serve", || async { get_json(&status).await["ready"] == true }).await;
    let name = format!("{}/hang", c.what);
    let mut holder =
        c.command(&["--api", &d.api, "--hold", "60", "--ttl", "1", &name]).stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(holder.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(daemon::PATIENCE, lines.next_line()).await.unwrap().unwrap().unwrap();
    assert!(first.starts_with(&format!("acquired {name}")), "{first}");
    // A few renewals first.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(d.child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let hung = Instant::now();
    let next = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await;
    let after = hung.elapsed();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let line =
        next.unwrap_or_else(|_| panic!("the {} holder never noticed it lost the lock", c.what)).unwrap().unwrap();
    assert!(line.starts_with(&format!("lost {name}")), "{line}");
    assert!(after < Duration::from_millis(1500), "lost {after:?} after the hang, the TTL is 1 s");
    let exit = tokio::time::timeout(daemon::PATIENCE, holder.wait()).await.unwrap().unwrap();
    assert_eq!(exit.code(), Some(76), "a lost holder exits 76");
}

/// Over the daemon's unix socket (`--api unix:PATH`); a clear error, exit 69 and no stack
/// trace, when no daemon answers; and without --api, where the daemon's config file says.
async fn speaks_over_the_unix_socket(c: Client) {
    let dir = tempfile::tempdir().unwrap();
    let api = format!("unix:{}", dir.path().join("api.sock").display());
    let _d = daemon_with(
        dir.path(),
        c.what,
        &[],
        &["--listen", "/ip4/127.0.0.1/tcp/0", "--takeover-delay", "100ms", "--api", &api],
    )
    .await;
    let name = format!("{}/sock", c.what);
    let out = c.command(&["--api", &api, "--timeout", "30", &name]).output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains(&format!("acquired {name} token")) && stdout.contains(&format!("released {name} token")),
        "{stdout}"
    );
    let no_trace = |stderr: &str| !stderr.contains("\n    at ") && !stderr.contains("goroutine ");
    let gone = format!("unix:{}", dir.path().join("nobody.sock").display());
    let out = c.command(&["--api", &gone, &name]).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(stderr.contains("cannot reach the sigma daemon") && no_trace(&stderr), "{stderr}");
    // Without --api, the daemon's config file says where it listens.
    let config = dir.path().join("sigma.toml");
    std::fs::write(&config, format!("# where clients go\napi = \"{gone}\"\n\n[limits]\napi = \"127.0.0.1:1\"\n"))
        .unwrap();
    let out = c.command(&[&name]).env_remove("SIGMA_API").env("SIGMA_CONFIG", &config).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "the configured socket, not the default port: {stderr}");
    assert!(stderr.contains("nobody.sock") && no_trace(&stderr), "{stderr}");
}

/// Each client knows every code of the daemon's errors: a code added to `ErrorCode`
/// needs a line in each.
#[test]
fn every_client_knows_every_error_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for client in ["examples/python/sigma_lock.py", "examples/go/sigmalock.go", "examples/typescript/src/index.ts"] {
        let source = std::fs::read_to_string(root.join(client)).unwrap();
        for code in sigma_daemon::http::ErrorCode::ALL {
            assert!(source.contains(&format!("\"{code}\"")), "{client} does not know the code {code}");
        }
    }
}

/// `go vet` finds nothing, and the module's own tests pass (the deadline accounting
/// against a fake daemon that hangs, is busy or says not_held; a few seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_module_is_vetted_and_its_unit_tests_pass() {
    if !have_go().await {
        return;
    }
    for args in [&["vet", "./..."][..], &["test", "./..."]] {
        let out = tokio::task::spawn_blocking(move || go_command(args).output().expect("go")).await.unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "go {}: {said}", args.join(" "));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_clients_take_turns_and_renew_their_lease() {
    if let Some(c) = go().await {
        take_turns_and_renew_their_lease(c).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_holder_is_lost_by_its_deadline_when_its_daemon_hangs() {
    if let Some(c) = go().await {
        lost_by_its_deadline_when_its_daemon_hangs(c).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_client_speaks_over_the_unix_socket() {
    if let Some(c) = go().await {
        speaks_over_the_unix_socket(c).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_clients_take_turns_and_renew_their_lease() {
    if let Some(c) = typescript().await {
        take_turns_and_renew_their_lease(c).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typescript_holder_is_lost_by_its_deadline_when_its_daemon_hangs() {
    if let Some(c) = typescript().await {
        lost_by_its_deadline_when_its_daemon_hangs(c).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_client_speaks_over_the_unix_socket() {
    if let Some(c) = typescript().await {
        speaks_over_the_unix_socket(c).await;
    }
}

/// `pip install ./examples/python` in a new virtual environment gives the module and the
/// `sigma-lock-py` command, which holds a lock through a real daemon. The build backend
/// (setuptools) comes from the package index, as for any user (about 4 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_installs_with_pip() {
    if !have_tool("python3", PYTHON).await {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let venv = dir.path().join("venv");
    let run = |cmd: &mut Command| {
        let cmd = cmd.env("PIP_DISABLE_PIP_VERSION_CHECK", "1").stdin(Stdio::null()).output();
        async move {
            let out = cmd.await.unwrap();
            let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "{said}");
            said
        }
    };
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv)).await;
    run(Command::new(venv.join("bin/pip")).args(["install", "--quiet", PYTHON_PACKAGE])).await;
    let d =
        daemon_with(dir.path(), "pip", &[], &["--listen", "/ip4/127.0.0.1/tcp/0", "--takeover-delay", "100ms"]).await;
    let out =
        run(Command::new(venv.join("bin/sigma-lock-py")).args(["--api", &d.api, "--timeout", "30", "pip/lock"])).await;
    assert_eq!(token(&out, "acquired"), token(&out, "released"), "{out}");
    // The module, from the environment rather than the source tree.
    let out = run(Command::new(venv.join("bin/python"))
        .args(["-c", "import sigma_lock; print(sigma_lock.__file__)"])
        .current_dir(dir.path()))
    .await;
    assert!(out.contains("site-packages"), "{out}");
}
