//! `sigma`: the peer daemon (`run`), a lock around a command (`lock`), and `status`.
//!
//! `lock` and `status` talk to a local daemon through its HTTP control API
//! (`sigma_daemon::http`), `127.0.0.1:7591` unless `--api` or `$SIGMA_API` says otherwise.
//!
//! `main` parses the command line and hands each subcommand to its module in `cmd/`.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

mod cli {
    pub mod config_file;
}
mod cmd;
#[cfg(target_os = "linux")]
mod heap;
use cli::config_file;
use cmd::admin::{forget_cmd, inspect, release_cmd, AdminCmd, InspectArgs, ReleaseArgs};
use cmd::lock::{elect, lock, ElectArgs, LockArgs};
use cmd::run::{run, RunArgs};
use cmd::status::{locks, status, LocksArgs, StatusCmdArgs};
use cmd::top::{top, TopArgs};
use cmd::watch::{observe, watch, WatchArgs};
use cmd::{Fail, EXIT_UNAVAILABLE, EXIT_USAGE};

#[derive(Parser, Debug)]
#[command(name = "sigma", version = sigma_daemon::version::line(), about = "A Sigma distributed lock peer and its command line")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a peer: join the swarm, host replicas, serve the local control API and
    /// metrics, until SIGINT or SIGTERM.
    ///
    /// Prints parseable lines on stdout once up: `SIGMA_PEER_ID=…`, one
    /// `SIGMA_LISTEN=…/p2p/…` per address (usable as another peer's --bootstrap),
    /// `SIGMA_API=IP:PORT`, then `SIGMA_READY` (listening), and `SIGMA_SERVING` once the
    /// peer serves with no new lock held back (`GET /readyz` would answer 200). Logs go
    /// to stderr (RUST_LOG, default info).
    Run(Box<RunArgs>),
    /// Hold a lock while a command runs (the etcdctl/consul `lock` convention), or,
    /// without a command, until SIGINT/SIGTERM, printing SIGMA_LOCK_NAME=,
    /// SIGMA_FENCING_TOKEN= and SIGMA_LOCK_VALID_UNTIL_MS= lines.
    ///
    /// The command gets SIGMA_LOCK_NAME, SIGMA_FENCING_TOKEN and
    /// SIGMA_LOCK_VALID_UNTIL_MS (the lock's deadline when the command started, ms since
    /// the Unix epoch: the lock may go to someone else after it, never before; renewals
    /// move it on without changing the variable) in its environment and runs in its own
    /// process group. It dies with `sigma lock` (a parent-death SIGKILL), so a killed
    /// `sigma lock` leaves no command running without the lock.
    /// The lock is renewed while it runs; if it is lost (the daemon no longer holds it,
    /// is stopping, is gone, or no renewal came before the deadline), the command gets
    /// SIGTERM, then SIGKILL after --grace, by the deadline at the latest. SIGINT,
    /// SIGTERM and SIGHUP are forwarded to it. With --slots K it holds one of K slots of
    /// a semaphore NAME instead (at most K holders at once; SIGMA_LOCK_SLOT says which).
    ///
    /// Exit status: the command's (128+N if killed by signal N); 75 if the lock was not
    /// acquired within --timeout; 76 if the lock was lost while the command ran; 78 if
    /// the daemon is not ready (not joined to its swarm, or cut off from the majority of
    /// it) when --timeout runs out; 69 if the daemon cannot be reached; 64 for a bad lock
    /// name or quorum or a usage error; 126/127 if the command cannot be started.
    Lock(LockArgs),
    /// Leader election: campaign for NAME with VALUE (e.g. this candidate's address),
    /// lead while the command runs, resign when it ends: `sigma lock NAME --value VALUE
    /// [-- CMD]`, with the same options, environment and exit status. `sigma observe
    /// NAME` prints each leader's value.
    Elect(ElectArgs),
    /// Follow a lock: a line each time it changes (held, free or unknown; holder, fencing
    /// token, value, waiters), the first at once, until interrupted. Each holder comes
    /// once and in token order; a change shows within about --interval. Exit status 69 if
    /// the daemon cannot be reached.
    Watch(WatchArgs),
    /// Follow an election: each leader's value (see `sigma elect`), a line each time
    /// the leader or its value changes, once and in token order, until interrupted.
    Observe(WatchArgs),
    /// Show the local peer: id, addresses, peers, replicas, locks held and waited for.
    Status(StatusCmdArgs),
    /// List the locks this peer holds (with their fencing tokens) and waits for; with
    /// --swarm, those held and waited for across the swarm.
    Locks(LocksArgs),
    /// A live view of this peer (name, id, serving state, members reachable), the
    /// swarm's members (alive or departed), the replicas hosted here, and the locks held
    /// and waited for across the swarm with their holders and queues, redrawn every
    /// --interval; `q` or Ctrl-C quits. When stdout is not a terminal (or with --once)
    /// it prints one frame as plain text and exits. Exit status 69 if the daemon
    /// cannot be reached (for one frame).
    Top(TopArgs),
    /// Show a lock as the whole swarm sees it: the holder (fencing token, validity), the
    /// waiters with their places in line, and each replica as its host answered.
    /// Changes nothing. Exit status 69 if the daemon cannot be reached.
    Inspect(InspectArgs),
    /// An operator's break-lock: the holder of NAME under fencing token --token gives
    /// it up, wherever it runs (its command, if `sigma lock` holds it, is stopped as for
    /// a lost lock), and the next waiter gets it. A remote holder obeys only if its
    /// daemon lists this one with --admin-peer. Exit status 0 when revoked, 1 if no
    /// holder has that token (or it refused), 69 if the daemon cannot be reached.
    Release(ReleaseArgs),
    /// Operator commands on the swarm's membership (they need the admin token).
    #[command(subcommand)]
    Admin(AdminCmd),
    /// Print a shell completion script, e.g. `sigma completions bash >
    /// /etc/bash_completion.d/sigma` (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), e.g. `sigma man > /usr/local/share/man/man1/sigma.1`.
    Man,
    /// Print a new random swarm key for `sigma run --swarm-key`, e.g. `(umask 077;
    /// sigma swarm-key > /etc/sigma/swarm.key)`; give every peer of the swarm a copy.
    SwarmKey,
}

fn main() -> ExitCode {
    if let Err(e) = config_file::apply(std::env::args_os().collect()) {
        eprintln!("sigma: {e:#}");
        return ExitCode::from(EXIT_USAGE);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Help and version print and exit 0; a usage error exits 64 (EX_USAGE), like
        // sigma's own refusals of a bad lock name or quorum.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match cli.command {
        Cmd::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "sigma",
                &mut std::io::stdout(),
            );
            return ExitCode::SUCCESS;
        }
        Cmd::SwarmKey => {
            return match sigma_node::admission::new_swarm_key() {
                Ok(key) => {
                    println!("{key}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("sigma: swarm-key: no randomness from the system: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Cmd::Man => {
            let page = clap_mangen::Man::new(<Cli as clap::CommandFactory>::command());
            return match page.render(&mut std::io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("sigma: man: {e}");
                    ExitCode::from(EXIT_UNAVAILABLE)
                }
            };
        }
        _ => {}
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Cmd::Run(args) = &cli.command {
        builder.worker_threads(usize::from(args.worker_threads));
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sigma: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Cmd::Run(args) => run(*args).await,
            Cmd::Lock(args) => lock(args).await,
            Cmd::Elect(args) => elect(args).await,
            Cmd::Watch(args) => watch(args).await,
            Cmd::Observe(args) => observe(args).await,
            Cmd::Status(args) => status(args).await,
            Cmd::Locks(args) => locks(args).await,
            Cmd::Top(args) => top(args).await,
            Cmd::Inspect(args) => inspect(args).await,
            Cmd::Release(args) => release_cmd(args).await,
            Cmd::Admin(AdminCmd::Forget { peers, api }) => forget_cmd(&peers, api).await,
            Cmd::Completions { .. } | Cmd::Man | Cmd::SwarmKey => Ok(0),
        }
    });
    // Do not wait for tasks still blocked (e.g. an HTTP request waiting for a lock).
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => match e.downcast_ref::<Fail>() {
            Some(f) => {
                eprintln!("sigma: {}", f.msg);
                ExitCode::from(f.code)
            }
            None => {
                eprintln!("sigma: error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cmd::run::DEFAULT_LISTEN;

    #[test]
    fn cli_parses() {
        let cli = Cli::try_parse_from(["sigma", "lock", "x", "--timeout", "2s", "--", "sh", "-c", "true"]).unwrap();
        match cli.command {
            Cmd::Lock(a) => {
                assert_eq!(a.opts.timeout, Some(Duration::from_secs(2)));
                assert_eq!(a.command, ["sh", "-c", "true"]);
            }
            other => panic!("{other:?}"),
        }
        match Cli::try_parse_from(["sigma", "lock", "x"]).unwrap().command {
            Cmd::Lock(a) => assert!(a.command.is_empty() && !a.opts.try_once, "no command: hold until a signal"),
            other => panic!("{other:?}"),
        }
        assert!(Cli::try_parse_from(["sigma", "lock", "x", "--try", "--timeout", "1s"]).is_err(), "--try or --timeout");
        assert!(Cli::try_parse_from(["sigma", "run", "--n", "5"]).is_err(), "--n needs --m");
        assert!(Cli::try_parse_from(["sigma", "run", "--worker-threads", "0"]).is_err(), "no runtime without a thread");
        let Cmd::Run(a) = Cli::try_parse_from(["sigma", "run", "--worker-threads", "4"]).unwrap().command else {
            panic!("run")
        };
        assert_eq!(a.worker_threads, 4);
        let cli =
            Cli::try_parse_from(["sigma", "run", "--listen", "/ip4/127.0.0.1/tcp/0", "--api", "127.0.0.1:0"]).unwrap();
        assert!(matches!(cli.command, Cmd::Run(_)));
        // SIGMA_LISTEN from the test's environment would change the defaults.
        if std::env::var_os("SIGMA_LISTEN").is_none() {
            let Cmd::Run(a) = Cli::try_parse_from(["sigma", "run"]).unwrap().command else { panic!("run") };
            let listen: Vec<String> = a.listen.iter().map(|m| m.to_string()).collect();
            assert_eq!(listen, DEFAULT_LISTEN, "TCP and QUIC by default");
        }
    }
}
