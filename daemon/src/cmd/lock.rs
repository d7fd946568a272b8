//! `sigma lock`: hold a lock while a command runs, or until a signal.

use std::ffi::OsString;
use std::io::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use sigma_daemon::client::{AcquireOptions, Client, ClientError, Holding};
use sigma_daemon::http::ErrorCode;
use tokio::signal::unix::{signal, SignalKind};

use super::api::{api_error, ApiArgs};
use super::{fail, init_tracing, parse_duration, EXIT_LOST, EXIT_TIMEOUT, EXIT_USAGE, TRY_TIMEOUT};

#[derive(Args, Debug)]
pub(crate) struct LockArgs {
    /// Lock name: 1 to 200 bytes of [A-Za-z0-9._/-].
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) opts: LockOpts,
    /// A value to attach to the lock while held (text, at most 4096 bytes): `sigma
    /// inspect`, `sigma watch` and `sigma observe` show it with the token.
    #[arg(long = "value", id = "lock_value", value_name = "TEXT")]
    pub(crate) value: Option<String>,
    /// The command and its arguments, after `--`. Without one, `sigma lock` prints the
    /// lock's name and fencing token and holds the lock until SIGINT or SIGTERM.
    #[arg(last = true, value_name = "CMD")]
    pub(crate) command: Vec<OsString>,
}

/// The options `sigma lock` and `sigma elect` share.
#[derive(Args, Debug)]
pub(crate) struct LockOpts {
    /// Give up after this long (e.g. 500ms, 10s, 2m); default: wait as long as it takes.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) timeout: Option<Duration>,
    #[command(flatten)]
    pub(crate) api: ApiArgs,
    /// Quorum for this lock: replicas (with --m). Must be the swarm's n (one lock, one
    /// replica set); default: the daemon's.
    #[arg(long, requires = "m")]
    pub(crate) n: Option<usize>,
    /// Quorum for this lock: votes needed (with --n), at least the swarm's m.
    #[arg(long, requires = "n")]
    pub(crate) m: Option<usize>,
    /// Quorum diversity for this lock: votes from at least this many distinct peers
    /// [default: the daemon's].
    #[arg(long, value_name = "D")]
    pub(crate) min_peers: Option<usize>,
    /// Client lease: `sigma lock` renews it while the command runs; if `sigma lock`
    /// itself dies (SIGKILL, OOM, crash), the daemon releases the lock this long after
    /// the last renewal.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub(crate) ttl: Duration,
    /// Stop the command this long before the lock's deadline when no renewal moved it
    /// on (SIGTERM, then SIGKILL at the deadline); a lost lock also leaves it at most
    /// this long between SIGTERM and SIGKILL. At most half of what the deadline leaves
    /// (the daemon's lease and --ttl).
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    pub(crate) grace: Duration,
    /// A semaphore: take one of K slots of NAME (1 to 64), at most K holders at once.
    /// The command's SIGMA_LOCK_NAME is then the slot's lock (NAME/.slot/N, what its
    /// SIGMA_FENCING_TOKEN orders) and SIGMA_LOCK_SLOT the slot.
    #[arg(long, value_name = "K")]
    pub(crate) slots: Option<u16>,
    /// Try once: give up after about a second if the lock is not won (exit 75), saying why
    /// when this peer knows (not ready, or new locks held back by the takeover delay).
    #[arg(long = "try", conflicts_with = "timeout")]
    pub(crate) try_once: bool,
}

/// `sigma elect NAME VALUE [-- CMD]`: `sigma lock NAME --value VALUE [-- CMD]`.
#[derive(Args, Debug)]
pub(crate) struct ElectArgs {
    /// Election name (a lock name): 1 to 200 bytes of [A-Za-z0-9._/-].
    pub(crate) name: String,
    /// The candidate's value (text, at most 4096 bytes), e.g. its address: observers
    /// (`sigma observe NAME`) print it while this candidate leads.
    #[arg(value_name = "VALUE")]
    pub(crate) proposal: String,
    #[command(flatten)]
    pub(crate) opts: LockOpts,
    /// The command the leader runs, after `--`; it resigns when the command ends.
    /// Without one, it leads until SIGINT or SIGTERM.
    #[arg(last = true, value_name = "CMD")]
    pub(crate) command: Vec<OsString>,
}

/// `sigma elect`: campaign with the value, lead while the command runs (or until a
/// signal), resign when it ends.
pub(crate) async fn elect(args: ElectArgs) -> anyhow::Result<u8> {
    lock(LockArgs { name: args.name, opts: args.opts, value: Some(args.proposal), command: args.command }).await
}

/// How long `sigma lock` waits before saying why it waits, and how often it asks again.
pub(crate) const WHY_AFTER: Duration = Duration::from_secs(1);
pub(crate) const WHY_EVERY: Duration = Duration::from_secs(5);

/// Why a lock may not be won through this daemon yet, if the daemon knows: it is not
/// ready (joining, a minority…), or its replicas hold new grants back for the takeover
/// delay. `None`: it serves with nothing held back (the lock is held elsewhere or
/// contended), or the daemon did not answer.
/// The reason's kind comes first (the readiness, or `held_back`): it is said once.
pub(crate) async fn why_waiting(client: &Client) -> Option<(String, String)> {
    let st = client.clone().with_timeout(Duration::from_secs(2)).status().await.ok()?;
    if !st.ready {
        Some((st.readiness.clone(), format!("this peer is not ready: {}", st.readiness_detail)))
    } else if st.held_back_ms > 0 {
        Some((
            "held_back".to_owned(),
            format!(
            "this peer began serving recently and grants nothing for {:.1} s more (the takeover delay: a peer that \
             took replicas over waits out every vote their previous host could have granted)",
            st.held_back_ms as f64 / 1000.0
        ),
        ))
    } else {
        None
    }
}

pub(crate) async fn lock(args: LockArgs) -> anyhow::Result<u8> {
    init_tracing("warn");
    let name = args.name.clone();
    if sigma_behaviour::wire::validate_resource(&name).is_err() || name == "." || name == ".." {
        return Err(fail(
            EXIT_USAGE,
            format!(
                "invalid lock name {name:?}: 1 to {} bytes of [A-Za-z0-9._/-]",
                sigma_behaviour::wire::MAX_RESOURCE_LEN
            ),
        ));
    }
    if let Some(k) = args.opts.slots {
        sigma_node::semaphore::check(&name, k).map_err(|e| fail(EXIT_USAGE, format!("lock {name}: {e}")))?;
    }
    let client = args.opts.api.connect()?;
    let mut signals = Signals::new()?;

    // Acquire (the client has a deadline too: a hung daemon must not make --timeout
    // hang forever).
    let timeout = if args.opts.try_once { Some(TRY_TIMEOUT) } else { args.opts.timeout };
    let opts = AcquireOptions {
        timeout,
        ttl: Some(args.opts.ttl),
        quorum: args.opts.n.zip(args.opts.m),
        min_peers: args.opts.min_peers,
        value: args.value.clone().map(String::into_bytes),
        slots: args.opts.slots,
    };
    let waiter = client.clone();
    let acquire = waiter.acquire(&name, &opts);
    tokio::pin!(acquire);
    // A wait past a second says why, once per reason, if this peer knows one.
    let mut ask = tokio::time::interval_at(tokio::time::Instant::now() + WHY_AFTER, WHY_EVERY);
    let mut said: Option<String> = None;
    let acquired = loop {
        tokio::select! {
            r = &mut acquire => break match r {
                Ok(a) => a,
                Err(ClientError::NoAnswer { .. }) => {
                    return Err(fail(EXIT_TIMEOUT, format!("lock {name}: the daemon did not answer within the timeout")));
                }
                Err(ClientError::Refused { code: ErrorCode::NotWon, .. }) if args.opts.try_once => {
                    let why = why_waiting(&client).await.map_or_else(|| "it is held elsewhere".to_owned(), |(_, why)| why);
                    return Err(fail(EXIT_TIMEOUT, format!("lock {name} not won within {TRY_TIMEOUT:?}: {why}")));
                }
                Err(ClientError::Refused { code: ErrorCode::NotWon, .. }) => {
                    let waited = timeout.map_or_else(String::new, |t| format!(" after {t:?}"));
                    return Err(fail(EXIT_TIMEOUT, format!("timed out{waited} waiting for lock {name}")));
                }
                Err(e) => return Err(api_error(&format!("lock {name}"), e)),
            },
            _ = ask.tick(), if !args.opts.try_once => {
                if let Some((kind, why)) = why_waiting(&client).await.filter(|(k, _)| said.as_ref() != Some(k)) {
                    eprintln!("sigma: waiting for lock {name}: {why}");
                    said = Some(kind);
                }
            }
            sig = signals.recv() => {
                // Dropping the request closes the connection: the daemon abandons the wait.
                return Err(fail(128 + sig as u8, format!("interrupted while waiting for lock {name}")));
            }
        }
    };
    let token = acquired.token;
    // A semaphore's slot is held, and renewed, under its slot lock's name.
    let (name, slot) = (acquired.name.clone(), acquired.slot);
    tracing::info!(%name, token, ?slot, "lock acquired");
    let mut holding = Holding::confirm(client, name.clone(), acquired, args.opts.ttl)
        .await
        .map_err(|e| fail(EXIT_LOST, e.to_string()))?;
    if args.command.is_empty() {
        return hold_until_signal(&mut holding, &mut signals).await;
    }
    // The command is stopped --grace before the deadline, so that its SIGKILL lands by
    // the deadline. A daemon whose lease leaves less than that (a short --lease-ms) gets
    // half of what it leaves.
    let span = holding.deadline().saturating_duration_since(holding.confirmed_at());
    let grace = args.opts.grace.min(span / 2);
    if grace < args.opts.grace {
        eprintln!(
            "sigma: warning: --grace {:?} is more than half of what lock {name}'s deadline leaves ({span:?}); using \
             {grace:?}",
            args.opts.grace
        );
    }

    // Run the command.
    let mut cmd = tokio::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("SIGMA_LOCK_NAME", &name)
        .env("SIGMA_FENCING_TOKEN", token.to_string())
        .env("SIGMA_LOCK_VALID_UNTIL_MS", holding.valid_until_ms().to_string())
        .process_group(0);
    if let Some(slot) = slot {
        cmd.env("SIGMA_LOCK_SLOT", slot.to_string());
    }
    let parent = nix::unistd::getpid();
    // SAFETY: between fork and exec the closure makes two system calls and nothing else
    // (no allocation, no lock): async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            // The command dies with `sigma lock` (`kill -9`, OOM): it must not run on
            // without the lock. The signal follows the thread that forked, which is the
            // runtime's main thread (`block_on`), alive until `sigma lock` exits.
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if nix::unistd::getppid() != parent {
                // `sigma lock` died before the line above took effect.
                return Err(std::io::Error::other("sigma lock is gone"));
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            let _ = holding.release().await;
            return Err(fail(code, format!("cannot run {:?}: {e}", args.command[0])));
        }
    };
    let pgid = child.id().and_then(|p| i32::try_from(p).ok()).map(Pid::from_raw);
    let terminal = Terminal::give_to(pgid);

    let mut lost: Option<String> = None;
    let status = loop {
        let stop_at = holding.deadline().checked_sub(grace).unwrap_or(holding.deadline());
        tokio::select! {
            st = child.wait() => break st.context("waiting for the command")?,
            sig = signals.recv() => {
                if let Some(pg) = pgid {
                    kill_group(pg, sig);
                }
            }
            () = tokio::time::sleep_until(holding.next_renewal(stop_at).into()) => {
                lost = holding.renew(stop_at).await;
                if let Some(why) = &lost {
                    eprintln!("sigma: lock {name} (token {token}) was lost: {why}; stopping the command");
                    break stop_child(&mut child, pgid, grace.min(holding.left())).await?;
                }
            }
        }
    };
    drop(terminal);

    let code = exit_code(&status);
    if lost.is_some() {
        let _ = holding.release().await;
        return Err(fail(
            EXIT_LOST,
            format!("lock {name} was lost while the command ran (command exit status {code})"),
        ));
    }
    match holding.release().await {
        Ok(true) => Ok(code),
        Ok(false) => Err(fail(
            EXIT_LOST,
            format!("lock {name} (token {token}) was no longer held when the command ended (exit status {code})"),
        )),
        Err(e) => {
            eprintln!("sigma: warning: could not release lock {name} (it runs out with its lease): {e:#}");
            Ok(code)
        }
    }
}

/// `sigma lock NAME` without a command: prints the lock and its token, keeps the client
/// lease alive, releases on SIGINT/SIGTERM/SIGHUP (exit 0), exits 76 if the lock is lost
/// (at its deadline at the latest).
pub(crate) async fn hold_until_signal(holding: &mut Holding, signals: &mut Signals) -> anyhow::Result<u8> {
    let (name, token) = (holding.name().to_owned(), holding.token());
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "SIGMA_LOCK_NAME={name}")?;
        writeln!(out, "SIGMA_FENCING_TOKEN={token}")?;
        writeln!(out, "SIGMA_LOCK_VALID_UNTIL_MS={}", holding.valid_until_ms())?;
        if let Some((_, slot)) = sigma_node::semaphore::parse_slot_lock_name(&name) {
            writeln!(out, "SIGMA_LOCK_SLOT={slot}")?;
        }
        out.flush()?;
    }
    loop {
        let stop_at = holding.deadline();
        tokio::select! {
            _ = signals.recv() => {
                return match holding.release().await {
                    Ok(true) => Ok(0),
                    Ok(false) => Err(fail(EXIT_LOST, format!("lock {name} (token {token}) was no longer held"))),
                    Err(e) => {
                        eprintln!("sigma: warning: could not release lock {name} (it runs out with its lease): {e:#}");
                        Ok(0)
                    }
                };
            }
            () = tokio::time::sleep_until(holding.next_renewal(stop_at).into()) => {
                if let Some(why) = holding.renew(stop_at).await {
                    let _ = holding.release().await;
                    return Err(fail(EXIT_LOST, format!("lock {name} (token {token}) was lost: {why}")));
                }
            }
        }
    }
}

pub(crate) fn exit_code(status: &std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        (None, None) => 1,
    }
}

pub(crate) fn kill_group(pgid: Pid, sig: Signal) {
    // The group may be gone already (ESRCH): nothing to stop then.
    let _ = nix::sys::signal::killpg(pgid, sig);
}

/// SIGTERM to the command's process group, SIGKILL after `grace`.
pub(crate) async fn stop_child(
    child: &mut tokio::process::Child,
    pgid: Option<Pid>,
    grace: Duration,
) -> anyhow::Result<std::process::ExitStatus> {
    match pgid {
        Some(pg) => kill_group(pg, Signal::SIGTERM),
        None => return child.wait().await.context("waiting for the command"),
    }
    if let Ok(st) = tokio::time::timeout(grace, child.wait()).await {
        return st.context("waiting for the command");
    }
    eprintln!("sigma: the command did not stop within {grace:?}; sending SIGKILL");
    if let Some(pg) = pgid {
        kill_group(pg, Signal::SIGKILL);
    }
    child.wait().await.context("waiting for the command")
}

/// SIGINT, SIGTERM, SIGHUP as they arrive.
pub(crate) struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn new() -> anyhow::Result<Self> {
        Ok(Signals {
            int: signal(SignalKind::interrupt()).context("installing a SIGINT handler")?,
            term: signal(SignalKind::terminate()).context("installing a SIGTERM handler")?,
            hup: signal(SignalKind::hangup()).context("installing a SIGHUP handler")?,
        })
    }

    pub(crate) async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

/// While the command runs in its own process group, it owns the terminal (if stdin is
/// one), so it can read it and gets the terminal's Ctrl-C itself. Given back on drop.
pub(crate) struct Terminal {
    ours: Option<Pid>,
}

impl Terminal {
    pub(crate) fn give_to(pgid: Option<Pid>) -> Terminal {
        use nix::unistd::{getpgrp, isatty, tcgetpgrp};
        let Some(pg) = pgid else { return Terminal { ours: None } };
        let stdin = std::io::stdin();
        let ours = getpgrp();
        if !isatty(&stdin).unwrap_or(false) || tcgetpgrp(&stdin).ok() != Some(ours) {
            return Terminal { ours: None };
        }
        if set_foreground(pg).is_err() {
            return Terminal { ours: None };
        }
        // The command may have tried to read before it owned the terminal.
        let _ = nix::sys::signal::killpg(pg, Signal::SIGCONT);
        Terminal { ours: Some(ours) }
    }
}

/// Makes `pg` the terminal's foreground process group. A process outside it that does
/// this gets SIGTTOU (which would stop it) unless the signal is blocked: it is blocked
/// in this thread for the call.
pub(crate) fn set_foreground(pg: Pid) -> nix::Result<()> {
    use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow};
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let mut before = SigSet::empty();
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut before))?;
    let done = nix::unistd::tcsetpgrp(std::io::stdin(), pg);
    let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None);
    done
}

impl Drop for Terminal {
    fn drop(&mut self) {
        if let Some(ours) = self.ours {
            let _ = set_foreground(ours);
        }
    }
}
