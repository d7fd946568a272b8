//! `sigma run` processes: finding the binary, spawning a daemon detached from the
//! driver (own session, stdio to files), reading its `SIGMA_*` lines, signals.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use libp2p::multiaddr::Protocol;
use libp2p::Multiaddr;
use nix::sys::signal::Signal;

/// Lines of a node's log shown when it fails.
pub const LOG_TAIL: usize = 20;

/// Finds the `sigma` binary: `explicit`, else `$SIGMA_BIN`, else `sigma` next to the
/// running executable (cargo puts both binaries in the same target directory).
pub fn locate_sigma(explicit: Option<&Path>) -> Result<PathBuf> {
    let hint = "build it with `cargo build --release -p sigma-daemon` (or pass --sigma-bin PATH / set SIGMA_BIN)";
    let (path, from) = if let Some(p) = explicit {
        (p.to_path_buf(), "--sigma-bin")
    } else if let Some(p) = std::env::var_os("SIGMA_BIN").filter(|p| !p.is_empty()) {
        (PathBuf::from(p), "$SIGMA_BIN")
    } else {
        let exe = std::env::current_exe().context("locating the running executable")?;
        let dir = exe.parent().context("the running executable has no directory")?;
        (dir.join("sigma"), "next to sigma-testnet")
    };
    if !path.is_file() && from == "next to sigma-testnet" {
        build_sigma_next_to(&path)?;
    }
    if !path.is_file() {
        bail!("the sigma binary was not found at {} ({from}): {hint}", path.display());
    }
    Ok(path)
}

/// Under `cargo run`, builds the `sigma` binary into the same target directory and
/// profile as the running `sigma-testnet`, so that one command is enough on a fresh
/// checkout. Does nothing outside cargo.
///
/// The package selection is `cargo run -p sigma-testnet`'s plus sigma-daemon, which
/// sigma-testnet depends on: cargo unifies the dependencies' features over the selected
/// packages, so the set is the one the running binary was built with, every dependency
/// (sigma-daemon's library included) is fresh, and only the `sigma` binary is compiled
/// and linked. `-p sigma-daemon` alone would unify fewer features (sigma-testnet's own
/// dependencies turn some on) and compile much of the tree a second time.
fn build_sigma_next_to(path: &Path) -> Result<()> {
    let (Some(cargo), Some(manifest)) = (std::env::var_os("CARGO"), std::env::var_os("CARGO_MANIFEST_DIR")) else {
        return Ok(());
    };
    let release = path.parent().and_then(Path::file_name).is_some_and(|d| d == "release");
    eprintln!(
        "building the sigma binary (cargo build{} -p sigma-testnet -p sigma-daemon --bin sigma)…",
        if release { " --release" } else { "" }
    );
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-q", "-p", "sigma-testnet", "-p", "sigma-daemon", "--bin", "sigma"]).current_dir(manifest);
    // Variables `cargo run` set for us would look like a changed build environment to
    // some build scripts and rebuild half the tree: pass only the ones a user sets.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_") && !matches!(&*key, "CARGO_HOME" | "CARGO_TARGET_DIR") {
            cmd.env_remove(&*key);
        }
    }
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().context("running cargo build for the sigma binary")?;
    if !status.success() {
        bail!("cargo build of the sigma binary failed ({status})");
    }
    Ok(())
}

/// Protocol parameters passed to every node (`None`: the daemon's default).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Params {
    /// Replicas per lock (with `m`).
    pub n: Option<usize>,
    /// Votes needed (with `n`).
    pub m: Option<usize>,
    /// Lease of a vote, ms.
    pub lease_ms: Option<u64>,
    /// Bound on each node's established connections (`--max-connections`; incoming:
    /// three quarters of it). None: the daemon's default.
    #[serde(default)]
    pub max_connections: Option<u32>,
    /// Nodes the testnet starts with: past [`LARGE_SWARM`] the nodes ping and gossip
    /// less often, so that two cores can host them all.
    #[serde(default)]
    pub swarm_size: usize,
    /// Test only: the one-way latency each node holds its protocol messages for
    /// (`sigma run --test-message-delay`), as text (`U(0,200)ms`).
    #[serde(default)]
    pub message_delay: Option<String>,
    /// Test only: every node but node 0 runs with a clock this many parts per million
    /// fast (negative: slow), under libfaketime ([`FAKETIME_LIB`]); node 0 runs on the
    /// real clock.
    #[serde(default)]
    pub clock_drift_ppm: Option<i64>,
    /// Test only: every node but node 0 reads its wall clock through libfaketime with an
    /// offset in [`clock_file`], which the `clock-step` fault rewrites; the
    /// monotonic clocks stay real (`FAKETIME_DONT_FAKE_MONOTONIC`), as an NTP step or
    /// `date -s` leaves them.
    #[serde(default)]
    pub clock_steps: bool,
    /// Test only: a planted fault of the core every node runs (`sigma run
    /// --test-mutant`), to show that the checker catches it.
    #[serde(default)]
    pub mutant: Option<String>,
}

/// Where libfaketime's multi-threaded library is looked for (`SIGMA_LIBFAKETIME` wins):
/// Debian's `faketime` package.
pub const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// The libfaketime library to preload, or how to get it.
pub fn faketime_lib() -> Result<PathBuf> {
    let path = std::env::var_os("SIGMA_LIBFAKETIME").map_or_else(|| PathBuf::from(FAKETIME_LIB), PathBuf::from);
    anyhow::ensure!(
        path.exists(),
        "--clock-drift and the clock-step fault run nodes under libfaketime, not found at {} (install it: apt-get \
         install faketime; or set SIGMA_LIBFAKETIME to the library)",
        path.display()
    );
    Ok(path)
}

/// libfaketime's `FAKETIME` for a clock `ppm` parts per million fast (slow if
/// negative): no offset, the rate 1 + ppm/10⁶. It scales every clock the daemon reads
/// (`CLOCK_MONOTONIC`, which the leases and timers use, and the wall clock) and its
/// sleeps and poll timeouts.
pub fn faketime_rate(ppm: i64) -> String {
    format!("+0 x{:.6}", 1.0 + ppm as f64 / 1e6)
}

/// Swarms larger than this run their nodes with the daemon's liveness pings (1 s, 3 s
/// timeout) and a slower gossip (500 ms rounds, 3 s liveness) instead of the fast
/// loopback settings.
pub const LARGE_SWARM: usize = 32;
/// Swarms larger than this (a hundred processes or more on two cores) ping every 5 s
/// (10 s timeout) and gossip every 2 s (20 s liveness): with 500 ms rounds a 200-node
/// testnet never formed (load average ≈ 500; nodes saw 118–197 of 200 members alive).
pub const HUGE_SWARM: usize = 100;

/// What to start.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Index in the testnet (names the files).
    pub index: usize,
    /// TCP port for peers (0: ephemeral).
    pub tcp_port: u16,
    /// API port (0: ephemeral).
    pub api_port: u16,
    /// Identity file.
    pub key_file: PathBuf,
    /// stderr of the node.
    pub log_file: PathBuf,
    /// stdout of the node (its `SIGMA_*` lines).
    pub stdout_file: PathBuf,
    /// Peers to join through (`…/p2p/ID`).
    pub bootstrap: Vec<String>,
    /// Protocol parameters.
    pub params: Params,
    /// Append to the log (a restart) instead of starting it anew.
    pub append_log: bool,
}

impl Spec {
    /// The files of node `index` under `dir`.
    pub fn new(dir: &Path, index: usize, params: Params) -> Spec {
        Spec {
            index,
            tcp_port: 0,
            api_port: 0,
            key_file: dir.join(format!("node-{index}.key")),
            log_file: dir.join(format!("node-{index}.log")),
            stdout_file: dir.join(format!("node-{index}.stdout")),
            bootstrap: Vec::new(),
            params,
            append_log: false,
        }
    }
}

/// The wall-clock offset of the node whose key is `key_file`, under
/// [`Params::clock_steps`], in libfaketime's format (`+0`, `-90`: seconds); it outlives
/// a restart, as a host's clock does.
pub fn clock_file(key_file: &Path) -> PathBuf {
    key_file.with_extension("clock")
}

/// The content of a [`clock_file`] for a wall clock `offset_s` seconds off.
pub fn clock_offset(offset_s: i64) -> String {
    format!("{offset_s:+}\n")
}

/// A started daemon, once it printed `SIGMA_READY`.
#[derive(Debug)]
pub struct Started {
    /// The process (the driver's child until it exits).
    pub child: Child,
    /// Its pid.
    pub pid: u32,
    /// `SIGMA_PEER_ID=`.
    pub peer_id: String,
    /// `SIGMA_LISTEN=` lines (each ends with /p2p/ID).
    pub listen: Vec<String>,
    /// `SIGMA_API=`.
    pub api: SocketAddr,
    /// The TCP port it listens on for peers.
    pub tcp_port: u16,
}

/// The last `n` lines of a file (empty if unreadable).
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A failure report: what happened plus the last lines of the node's log.
pub fn with_log(what: &str, log: &Path) -> String {
    let t = tail(log, LOG_TAIL);
    if t.trim().is_empty() {
        format!("{what} (log {} is empty)", log.display())
    } else {
        let indented: Vec<String> = t.lines().map(|l| format!("    | {l}")).collect();
        format!("{what}; last lines of {}:\n{}", log.display(), indented.join("\n"))
    }
}

/// The TCP port of a multiaddr, if any.
pub fn tcp_port(addr: &str) -> Option<u16> {
    let a: Multiaddr = addr.parse().ok()?;
    a.iter().find_map(|p| match p {
        Protocol::Tcp(port) => Some(port),
        _ => None,
    })
}

/// Default log filter for the nodes (`RUST_LOG` wins): info, without the per-lock line
/// of the HTTP layer (the event loop logs each acquisition already).
const NODE_LOG: &str = "info,sigma_daemon::http=warn";

/// Spawns `sigma run` for `spec`, detached (own session: it outlives the driver and
/// does not get the terminal's signals), and waits up to `timeout` for `SIGMA_READY`.
pub fn start(bin: &Path, spec: &Spec, timeout: Duration) -> Result<Started> {
    let mut log = if spec.append_log {
        OpenOptions::new().create(true).append(true).open(&spec.log_file)
    } else {
        File::create(&spec.log_file)
    }
    .with_context(|| format!("creating {}", spec.log_file.display()))?;
    let _ = writeln!(
        log,
        "=== sigma-testnet: starting node {} ({} ms since the epoch) ===",
        spec.index,
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis()
    );
    let out = File::create(&spec.stdout_file).with_context(|| format!("creating {}", spec.stdout_file.display()))?;

    let mut cmd = Command::new(bin);
    cmd.arg("run")
        .arg("--listen")
        .arg(format!("/ip4/127.0.0.1/tcp/{}", spec.tcp_port))
        .arg("--api")
        .arg(format!("127.0.0.1:{}", spec.api_port))
        .arg("--key-file")
        .arg(&spec.key_file);
    for b in &spec.bootstrap {
        cmd.arg("--bootstrap").arg(b);
    }
    if let (Some(n), Some(m)) = (spec.params.n, spec.params.m) {
        cmd.arg("--n").arg(n.to_string()).arg("--m").arg(m.to_string());
    }
    if let Some(ms) = spec.params.lease_ms {
        cmd.arg("--lease-ms").arg(ms.to_string());
    }
    if let Some(delay) = &spec.params.message_delay {
        cmd.arg("--test-message-delay").arg(delay);
    }
    if let Some(mutant) = &spec.params.mutant {
        cmd.arg("--test-mutant").arg(mutant);
    }
    // Loopback: a dead peer is noticed within 1.25 s, and a peer cut off from the
    // gossip within 1.5 s, which keeps the takeover delay (lease + liveness timeout +
    // 1 s) short. A large swarm on two cores cannot afford that many messages.
    let ((ping, ping_timeout), (gossip, gossip_liveness)) = if spec.params.swarm_size > HUGE_SWARM {
        (("5s", "10s"), ("2s", "20s"))
    } else if spec.params.swarm_size > LARGE_SWARM {
        (("1s", "3s"), ("500ms", "3s"))
    } else {
        (("250ms", "1s"), ("250ms", "1500ms"))
    };
    cmd.args(["--ping-interval", ping, "--ping-timeout", ping_timeout]);
    cmd.args(["--gossip-interval", gossip, "--gossip-liveness", gossip_liveness]);
    if let Some(max) = spec.params.max_connections {
        cmd.arg("--max-connections").arg(max.to_string());
        cmd.arg("--max-incoming").arg((max * 3 / 4).max(1).to_string());
    }
    if let Some(ppm) = spec.params.clock_drift_ppm.filter(|_| spec.index != 0) {
        cmd.env("LD_PRELOAD", faketime_lib()?).env("FAKETIME", faketime_rate(ppm)).env("FAKETIME_DONT_RESET", "1");
    }
    if spec.params.clock_steps && spec.index != 0 {
        let file = clock_file(&spec.key_file);
        if !file.exists() {
            std::fs::write(&file, clock_offset(0)).with_context(|| format!("writing {}", file.display()))?;
        }
        // The offset is read again at most a second after it changed. Checked: with
        // the offset moved from +3600 to -600, `CLOCK_REALTIME` follows within a second
        // while `CLOCK_MONOTONIC` and `CLOCK_BOOTTIME` (the leases', the timers' and the
        // behaviour's clocks) go on unchanged, and epoll timeouts still expire on time.
        cmd.env("LD_PRELOAD", faketime_lib()?)
            .env("FAKETIME_TIMESTAMP_FILE", &file)
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env("FAKETIME_CACHE_DURATION", "1")
            .env("FAKETIME_DONT_RESET", "1");
    }
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", NODE_LOG);
    }
    // Plain text logs (tracing-subscriber honours NO_COLOR).
    cmd.env("NO_COLOR", "1").stdin(Stdio::null()).stdout(out).stderr(log);
    // SAFETY: the closure runs in the child between fork and exec; setsid is
    // async-signal-safe, allocates nothing and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
    }
    let mut child = cmd.spawn().with_context(|| format!("spawning {} for node {}", bin.display(), spec.index))?;
    let pid = child.id();

    let deadline = Instant::now() + timeout;
    loop {
        let text = std::fs::read_to_string(&spec.stdout_file).unwrap_or_default();
        if text.lines().any(|l| l.trim() == "SIGMA_READY") {
            return parse_ready(&text, child, pid);
        }
        if let Some(st) = child.try_wait().context("waiting for the node")? {
            bail!(with_log(&format!("node {} exited during start-up ({st})", spec.index), &spec.log_file));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(with_log(
                &format!("node {} printed no SIGMA_READY within {:.0} s (killed)", spec.index, timeout.as_secs_f64()),
                &spec.log_file
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn parse_ready(text: &str, child: Child, pid: u32) -> Result<Started> {
    let (mut peer_id, mut listen, mut api) = (String::new(), Vec::new(), None);
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("SIGMA_PEER_ID=") {
            peer_id = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("SIGMA_LISTEN=") {
            listen.push(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("SIGMA_API=") {
            api = Some(v.trim().parse::<SocketAddr>().map_err(|e| anyhow!("bad SIGMA_API={v}: {e}"))?);
        }
    }
    let api = api.context("no SIGMA_API= line")?;
    let tcp = listen.iter().find_map(|a| tcp_port(a)).context("no TCP SIGMA_LISTEN= line")?;
    if peer_id.is_empty() {
        bail!("no SIGMA_PEER_ID= line");
    }
    Ok(Started { child, pid, peer_id, listen, api, tcp_port: tcp })
}

/// Sends `sig` to `pid`; false if there is no such process.
pub fn signal(pid: u32, sig: Signal) -> bool {
    let Ok(pid) = i32::try_from(pid) else { return false };
    // A positive pid: that one process, never a group.
    pid > 0 && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).is_ok()
}

/// The CPU time (user + system, all threads) `pid` has used so far, from
/// `/proc/PID/stat`, in the kernel's clock ticks (usually 10 ms); None if it is gone.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    // utime and stime are fields 14 and 15, the 12th and 13th after the command.
    let stat = stat_after_comm(pid)?;
    let mut fields = stat.split_whitespace();
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().filter(|&h| h > 0).unwrap_or(100);
    Some(Duration::from_secs_f64((utime + stime) as f64 / hz as f64))
}

/// The CPU time all of `pids` have used so far (those gone count nothing).
pub fn total_cpu_time(pids: &[u32]) -> Duration {
    pids.iter().filter_map(|&p| cpu_time(p)).sum()
}

/// Whether `pid` is a live (not zombie) process.
pub fn alive(pid: u32) -> bool {
    // The state is the first field after the command.
    stat_after_comm(pid).is_some_and(|rest| rest.split_whitespace().next().is_some_and(|s| s != "Z"))
}

/// `/proc/PID/stat` from the field after the command on ("pid (comm) state ..."; the
/// command may hold spaces and parentheses, so it ends at the last ')'); None if there
/// is no such process.
fn stat_after_comm(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')').map(|(_, rest)| rest.to_owned())
}

/// Whether `pid` is alive and is `sigma run` with this key file: a pid from a manifest
/// may have been reused by an unrelated process, which must never be signalled.
pub fn is_our_node(pid: u32, key_file: &Path) -> bool {
    if !alive(pid) {
        return false;
    }
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let args: Vec<&[u8]> = raw.split(|b| *b == 0).collect();
    let key = key_file.as_os_str().as_encoded_bytes();
    args.contains(&&b"run"[..]) && args.contains(&key)
}

/// SIGTERM, then SIGKILL if still there after `grace`; returns whether it was killed.
/// `exited` tells whether the process is gone (for a child: `try_wait`).
pub fn terminate(pid: u32, grace: Duration, mut exited: impl FnMut() -> bool) -> bool {
    if exited() {
        return false;
    }
    signal(pid, Signal::SIGCONT);
    signal(pid, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if exited() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    signal(pid, Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !exited() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_clock_drift_is_a_libfaketime_rate() {
        assert_eq!(faketime_rate(500), "+0 x1.000500");
        assert_eq!(faketime_rate(-500), "+0 x0.999500");
        assert_eq!(faketime_rate(0), "+0 x1.000000");
        assert_eq!(faketime_rate(1_000_000), "+0 x2.000000");
        assert_eq!(clock_offset(0), "+0\n");
        assert_eq!(clock_offset(-90), "-90\n");
        assert_eq!(clock_offset(3600), "+3600\n");
    }

    use super::*;

    #[test]
    fn cpu_time_grows_with_work_and_is_none_for_no_process() {
        let me = std::process::id();
        let start = cpu_time(me).expect("this process's CPU time");
        assert_eq!(cpu_time(u32::MAX), None);
        assert!(total_cpu_time(&[u32::MAX]).is_zero(), "a missing pid counts nothing");
        // Work until the kernel's tick counts it (10 ms at 100 Hz), within a generous bound.
        let began = Instant::now();
        let mut x = 0u64;
        while cpu_time(me).expect("still here") <= start {
            for i in 0..100_000u64 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
            }
            std::hint::black_box(x);
            assert!(began.elapsed() < Duration::from_secs(30), "no CPU time counted after 30 s of work");
        }
    }

    #[test]
    fn ready_lines_are_parsed() {
        let id = "12D3KooWS9B3dcm1KwPfCybJExn8vfkJfXPadaAvTSEddzVzGTuk";
        let text = format!(
            "SIGMA_PEER_ID={id}\nSIGMA_LISTEN=/ip4/127.0.0.1/tcp/4242/p2p/{id}\nSIGMA_API=127.0.0.1:7701\nSIGMA_READY\n"
        );
        let child = Command::new("true").spawn().unwrap();
        let s = parse_ready(&text, child, 1).unwrap();
        assert_eq!(s.peer_id, id);
        assert_eq!(s.tcp_port, 4242);
        assert_eq!(s.api, "127.0.0.1:7701".parse().unwrap());
        let mut c = s.child;
        c.wait().unwrap();
    }

    #[test]
    fn our_own_process_is_not_a_node() {
        assert!(alive(std::process::id()));
        assert!(!is_our_node(std::process::id(), Path::new("/nonexistent/node-0.key")));
        assert!(!alive(u32::MAX - 1));
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        std::fs::write(&p, (0..30).map(|i| format!("line {i}\n")).collect::<String>()).unwrap();
        let t = tail(&p, 3);
        assert_eq!(t, "line 27\nline 28\nline 29");
        assert!(with_log("x failed", &p).contains("    | line 29"));
    }
}
