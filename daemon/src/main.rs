//! `sigma`: the peer daemon (`run`), a lock around a command (`lock`), and `status`.
//!
//! `lock` and `status` talk to a local daemon through its HTTP control API
//! (`sigma_daemon::http`), `127.0.0.1:7591` unless `--api` or `$SIGMA_API` says otherwise.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Args, Parser, Subcommand};
use libp2p::multiaddr::Protocol;
use libp2p::Multiaddr;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use prometheus_client::registry::Registry;
use sigma_daemon::client::{AcquireOptions, Client, ClientError, Holding};
use sigma_daemon::http::{self, Api, DEFAULT_API};
use sigma_node::metrics::Metrics;
use sigma_node::{ConnectionBounds, Node, NodeConfig};
use tokio::signal::unix::{signal, SignalKind};

mod cli {
    pub mod config_file;
}
#[cfg(target_os = "linux")]
mod heap;
use cli::config_file;

/// Exit code of `sigma lock` when the lock was not acquired within `--timeout`.
const EXIT_TIMEOUT: u8 = 75;
/// How long `sigma lock --try` tries.
const TRY_TIMEOUT: Duration = Duration::from_secs(1);
/// Exit code of `sigma lock` when the lock was lost while the command ran.
const EXIT_LOST: u8 = 76;
/// Exit code when the daemon cannot be reached or fails.
const EXIT_UNAVAILABLE: u8 = 69;
/// Exit code for a request the daemon refused (bad lock name or quorum).
const EXIT_USAGE: u8 = 64;
/// Exit code of `sigma lock` when the daemon does not serve: it has not joined its
/// swarm yet, or reaches no majority of the peers it knows.
const EXIT_NOT_READY: u8 = 78;

#[derive(Parser, Debug)]
#[command(name = "sigma", version, about = "A Sigma distributed lock peer and its command line")]
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
    /// SIGTERM and SIGHUP are forwarded to it.
    ///
    /// Exit status: the command's (128+N if killed by signal N); 75 if the lock was not
    /// acquired within --timeout; 76 if the lock was lost while the command ran; 78 if
    /// the daemon is not ready (not joined to its swarm, or cut off from the majority of
    /// it) when --timeout runs out; 69 if the daemon cannot be reached; 64 for a bad lock
    /// name or quorum or a usage error; 126/127 if the command cannot be started.
    Lock(LockArgs),
    /// Show the local peer: id, addresses, peers, replicas, locks held and waited for.
    Status(StatusCmdArgs),
    /// List the locks this peer holds (with their fencing tokens) and waits for.
    Locks(StatusArgs),
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

#[derive(Args, Debug)]
struct RunArgs {
    /// Read settings from this TOML file: one `flag-name = value` per option of `sigma
    /// run` (lists as arrays), e.g. `listen = ["/ip4/0.0.0.0/tcp/7590"]`. Precedence: the
    /// command line, then the environment (SIGMA_…), then the file.
    #[arg(long, value_name = "PATH", env = "SIGMA_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on for peers (repeatable, or comma-separated) [default: TCP and
    /// QUIC on port 7590].
    #[arg(long, value_name = "MULTIADDR", num_args = 1.., value_delimiter = ',', default_values = DEFAULT_LISTEN, hide_default_value = true, env = "SIGMA_LISTEN")]
    listen: Vec<Multiaddr>,
    /// A peer to join through, ending with /p2p/PEER_ID (repeatable, or comma-separated).
    #[arg(long, value_name = "MULTIADDR", num_args = 1.., value_delimiter = ',', env = "SIGMA_BOOTSTRAP")]
    bootstrap: Vec<Multiaddr>,
    /// An address other peers can dial this node at: a public IP, a port a NAT forwards,
    /// a DNS name (repeatable, or comma-separated). Listen addresses as wide as the
    /// bootstrap peers' (loopback, LAN) count as external without it, and AutoNAT
    /// confirms public ones peers observe; a node with none hosts no replica.
    #[arg(long, value_name = "MULTIADDR", num_args = 1.., value_delimiter = ',', env = "SIGMA_EXTERNAL_ADDRESS")]
    external_address: Vec<Multiaddr>,
    /// Persistent identity, created on first start [default: `key` in $STATE_DIRECTORY
    /// (systemd), else $XDG_STATE_HOME/sigma, else ~/.local/state/sigma]. A restart keeps
    /// the peer id others bootstrap from. Two daemons cannot share one key file.
    #[arg(long, value_name = "PATH", env = "SIGMA_KEY_FILE")]
    key_file: Option<PathBuf>,
    /// A new identity each run, kept nowhere (instead of the key file).
    #[arg(long, conflicts_with = "key_file", env = "SIGMA_EPHEMERAL_KEY")]
    ephemeral_key: bool,
    /// Closed membership: accept connections only from this peer (repeatable, or
    /// comma-separated; with --allow-peers-file, the union). This peer itself is always
    /// allowed. Given any allowed peer, every other peer is refused. Default: open.
    #[arg(long, value_name = "PEER_ID", value_delimiter = ',', value_parser = sigma_node::admission::parse_peer_id, env = "SIGMA_ALLOW_PEERS")]
    allow_peer: Vec<libp2p::PeerId>,
    /// Closed membership: the allowed peers from a file, one peer id per line (`#`
    /// comments, blank lines allowed); see --allow-peer.
    #[arg(long, value_name = "PATH", env = "SIGMA_ALLOW_PEERS_FILE")]
    allow_peers_file: Option<PathBuf>,
    /// Private swarm: a pre-shared key file (`sigma swarm-key` makes one) that encrypts
    /// every connection; peers without the same key cannot connect. TCP only: QUIC
    /// listen addresses are refused.
    #[arg(long, value_name = "PATH", env = "SIGMA_SWARM_KEY")]
    swarm_key: Option<PathBuf>,
    /// Control API address: a loopback IP:PORT (port 0 picks a free port; see
    /// SIGMA_API=), or unix:PATH, a socket of mode 0660 (its owner and group may use the
    /// API; the connecting user's id is logged for every lock taken, revoke and block).
    /// The shipped unit uses unix:/run/sigma/api.sock.
    #[arg(long, value_name = "IP:PORT|unix:PATH", default_value = DEFAULT_API, env = "SIGMA_API")]
    api: String,
    /// Also serve /metrics (only) on this address, e.g. 0.0.0.0:9590 for a remote
    /// Prometheus; port 0 picks a free port (see SIGMA_METRICS=). /metrics is always
    /// served on the control API as well.
    #[arg(long, value_name = "IP:PORT", env = "SIGMA_METRICS")]
    metrics: Option<std::net::SocketAddr>,
    /// Log format on stderr: `text`, or `json` (one object per line, for log shippers).
    #[arg(long, value_name = "FORMAT", default_value = "text", env = "SIGMA_LOG_FORMAT")]
    log_format: LogFormat,
    /// Require `Authorization: Bearer <token>` on every API request, the token read from
    /// this file (created with a random token, mode 0600, if missing). For machines with
    /// several users: only those who can read the file can use the API.
    #[arg(long, value_name = "PATH", env = "SIGMA_API_TOKEN_FILE")]
    api_token_file: Option<PathBuf>,
    /// The admin routes (`/v1/admin/*`, `/v1/revoke/*`: break-lock and the block list)
    /// need `Authorization: Bearer <token>` with the token of this file (created with a
    /// random token, mode 0600, if missing), and no other [default: `admin.token` beside
    /// the key file; with --ephemeral-key and no file, the admin routes are refused].
    #[arg(long, value_name = "PATH", env = "SIGMA_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
    /// Acquires served at once by the API (waiting ones included); more are refused with
    /// 503 `busy`. Keep-alives and releases have a pool of their own: waiting acquires
    /// never starve a holder.
    #[arg(long, value_name = "N", default_value_t = http::gate::DEFAULT_MAX_IN_FLIGHT, env = "SIGMA_API_MAX_REQUESTS")]
    api_max_requests: usize,
    /// Acquires waiting at once for one lock name through this daemon; more are refused
    /// with 503 `too_many_waiters`.
    #[arg(long, value_name = "N", default_value_t = http::DEFAULT_MAX_WAITERS_PER_LOCK, env = "SIGMA_API_MAX_WAITERS_PER_LOCK")]
    api_max_waiters_per_lock: usize,
    /// Connections open at once on the API's listener (and on the metrics listener);
    /// more are closed on accept.
    #[arg(long, value_name = "N", default_value_t = http::DEFAULT_MAX_CONNECTIONS, env = "SIGMA_HTTP_MAX_CONNECTIONS")]
    http_max_connections: usize,
    /// An HTTP connection that sends no complete request head for this long (idle
    /// between requests included) is closed.
    #[arg(long, value_parser = parse_duration, default_value = "10s", env = "SIGMA_HTTP_HEADER_TIMEOUT")]
    http_header_timeout: Duration,
    /// On SIGTERM/SIGINT, how long to wait for HTTP clients to release their locks (they
    /// are told the daemon is stopping; a lock not released runs out with its client
    /// lease). Locks still held after it are left to lapse on their own, as after a
    /// crash, rather than released under their holders. Keep the service manager's stop
    /// timeout above it (the unit's TimeoutStopSec). A second signal stops at once.
    #[arg(long, value_parser = parse_duration, default_value = "30s", env = "SIGMA_STOP_TIMEOUT")]
    stop_timeout: Duration,
    /// Logical replicas per lock (default 32). Every peer of a swarm must agree.
    #[arg(long, requires = "m", env = "SIGMA_N")]
    n: Option<usize>,
    /// Votes needed to win, a strict majority of n (default 24).
    #[arg(long, requires = "n", env = "SIGMA_M")]
    m: Option<usize>,
    /// Lease of a vote in milliseconds (default 10000); renewals every third of it.
    #[arg(long, value_name = "MS", env = "SIGMA_LEASE_MS")]
    lease_ms: Option<u64>,
    /// Quorum diversity D: a lock is won only with votes hosted by at least D distinct
    /// peers [default: 2 once another peer is known, 1 in a one-node swarm].
    #[arg(long, value_name = "D", env = "SIGMA_MIN_PEERS")]
    min_peers: Option<usize>,
    /// Takeover delay: a replica this peer takes over (after its start, a split, or a
    /// closer peer's departure) grants nothing for this long [default: lease + drift +
    /// liveness timeout + 1s]. Shorter than that, a replica reset can break exclusion.
    #[arg(long, value_parser = parse_duration, env = "SIGMA_TAKEOVER_DELAY")]
    takeover_delay: Option<Duration>,
    /// A departed peer still counts toward the majority this peer must reach to serve,
    /// for this long (only while serving: the minority side of a split forgets nobody).
    #[arg(long, value_parser = parse_duration, default_value = "10m", env = "SIGMA_MEMBERSHIP_WINDOW")]
    membership_window: Duration,
    /// Liveness pings on every connection: interval.
    #[arg(long, value_parser = parse_duration, default_value = "1s", env = "SIGMA_PING_INTERVAL")]
    ping_interval: Duration,
    /// Liveness pings: a connection whose ping takes longer is closed as dead.
    #[arg(long, value_parser = parse_duration, default_value = "3s", env = "SIGMA_PING_TIMEOUT")]
    ping_timeout: Duration,
    /// Membership gossip: how often this peer sends its heartbeat table to a few members,
    /// so that peers connected to only some of the swarm know who is alive.
    #[arg(long, value_parser = parse_duration, default_value = "500ms", env = "SIGMA_GOSSIP_INTERVAL")]
    gossip_interval: Duration,
    /// Membership gossip: to how many random alive members per round.
    #[arg(long, value_name = "N", default_value_t = sigma_behaviour::DEFAULT_GOSSIP_FANOUT, env = "SIGMA_GOSSIP_FANOUT")]
    gossip_fanout: usize,
    /// Membership gossip: a member not connected here counts as alive for this long after
    /// its heartbeat last advanced (a cut-off peer stops serving within it, plus 1s).
    #[arg(long, value_parser = parse_duration, default_value = "5s", env = "SIGMA_GOSSIP_LIVENESS")]
    gossip_liveness: Duration,
    /// Most established connections (both directions); past it a new one is refused.
    #[arg(long, value_name = "N", default_value_t = ConnectionBounds::default().max_established, env = "SIGMA_MAX_CONNECTIONS")]
    max_connections: u32,
    /// Most established incoming connections (the rest is kept for this peer's dials).
    #[arg(long, value_name = "N", default_value_t = ConnectionBounds::default().max_established_incoming, env = "SIGMA_MAX_INCOMING")]
    max_incoming: u32,
    /// Most connections to one peer.
    #[arg(long, value_name = "N", default_value_t = ConnectionBounds::default().max_established_per_peer, env = "SIGMA_MAX_CONNECTIONS_PER_PEER")]
    max_connections_per_peer: u32,
    /// Most incoming connections in their handshake at once.
    #[arg(long, value_name = "N", default_value_t = ConnectionBounds::default().max_pending_incoming, env = "SIGMA_MAX_PENDING_INCOMING")]
    max_pending_incoming: u32,
    /// No new connection while the daemon's resident memory is above this many MiB
    /// [default: 80% of the machine's memory].
    #[arg(long, value_name = "MIB", env = "SIGMA_MAX_MEMORY_MB")]
    max_memory_mb: Option<usize>,
    /// A connection no protocol has used for this long is closed.
    #[arg(long, value_parser = parse_duration, default_value = "10s", env = "SIGMA_IDLE_TIMEOUT")]
    idle_timeout: Duration,
    /// Most replicas this peer hosts (all locks); past it a new one is refused.
    #[arg(long, value_name = "N", default_value_t = 100_000, env = "SIGMA_MAX_REPLICAS")]
    max_replicas: usize,
    /// Most replicas one remote peer's requests may have created here.
    #[arg(long, value_name = "N", default_value_t = 50_000, env = "SIGMA_MAX_REPLICAS_PER_PEER")]
    max_replicas_per_peer: usize,
    /// How long an idle replica (no owner, no waiter) is kept after its last release
    /// before it is dropped; with the lock rate and this peer's share of the keys it sets
    /// how many replicas this peer holds.
    #[arg(long, value_parser = parse_duration, default_value = "5s", env = "SIGMA_REPLICA_IDLE_TTL")]
    replica_idle_ttl: Duration,
    /// Test only: holds each protocol message this node sends for a one-way latency drawn
    /// from u:LO,HI | const:MS | exp:MEAN (milliseconds), as the simulator delays its
    /// messages, and batches none (how `sigma-testnet run --message-delay` reproduces the
    /// paper's Fig. 7 on real nodes). Never on a real swarm.
    #[arg(long, value_name = "DIST", hide = true, env = "SIGMA_TEST_MESSAGE_DELAY")]
    test_message_delay: Option<sigma_behaviour::latency::Latency>,
    /// Most queue entries (owners and waiters of other peers' acquisitions, ~100 bytes
    /// each) in all the replicas this peer hosts; past it a new one is refused.
    #[arg(long, value_name = "N", default_value_t = sigma_behaviour::DEFAULT_MAX_ENTRIES, env = "SIGMA_MAX_QUEUE_ENTRIES")]
    max_queue_entries: usize,
    /// Most queue entries one remote peer's acquisitions may occupy here.
    #[arg(long, value_name = "N", default_value_t = sigma_behaviour::DEFAULT_MAX_ENTRIES_PER_PEER, env = "SIGMA_MAX_QUEUE_ENTRIES_PER_PEER")]
    max_queue_entries_per_peer: usize,
    /// Requests per second one remote peer may send (token bucket, burst twice that).
    #[arg(long, value_name = "N", default_value_t = 20_000, env = "SIGMA_PEER_RATE")]
    peer_rate: u32,
    /// Worker threads of the daemon's async runtime. The hot path is one event-loop
    /// task, so more threads mostly add wake-ups between them (`bench --vs etcd`, 3 and 8
    /// daemons on 2 cores: 6–25% less CPU per lock with 1 than with 2); more may help a
    /// daemon with many busy connections on a machine of its own.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024), env = "SIGMA_WORKER_THREADS")]
    worker_threads: u16,
    /// A peer whose operator may revoke the locks held through this one (`sigma
    /// release NAME --token T` run there); repeatable, or `any` for every peer of the
    /// swarm. Default: none (only this node's own API may).
    #[arg(long, value_name = "PEER_ID|any", value_delimiter = ',', env = "SIGMA_ADMIN_PEERS")]
    admin_peer: Vec<String>,
}

/// The `--admin-peer` list as a policy.
fn admin_policy(list: &[String]) -> anyhow::Result<sigma_behaviour::Admin> {
    if list.is_empty() {
        return Ok(sigma_behaviour::Admin::Nobody);
    }
    if list.iter().any(|p| p == "any") {
        return Ok(sigma_behaviour::Admin::Any);
    }
    let peers = list
        .iter()
        .map(|p| p.parse::<libp2p::PeerId>().map_err(|e| fail(EXIT_USAGE, format!("--admin-peer {p}: {e}"))))
        .collect::<anyhow::Result<_>>()?;
    Ok(sigma_behaviour::Admin::Peers(peers))
}

/// The membership policy of `--allow-peer`, `--allow-peers-file` and `--swarm-key`, and
/// whether the listen addresses fit it.
fn membership_policy(args: &RunArgs) -> anyhow::Result<sigma_node::Admission> {
    use sigma_node::admission;
    let mut allowed: Option<std::collections::HashSet<libp2p::PeerId>> =
        (!args.allow_peer.is_empty()).then(|| args.allow_peer.iter().copied().collect());
    if let Some(path) = &args.allow_peers_file {
        let peers =
            admission::read_allow_list(path).map_err(|e| fail(EXIT_USAGE, format!("--allow-peers-file {e}")))?;
        if peers.is_empty() {
            // An empty list would refuse everyone: more likely a mistake than a wish.
            return Err(fail(EXIT_USAGE, format!("--allow-peers-file {}: no peer ids in it", path.display())));
        }
        allowed.get_or_insert_with(Default::default).extend(peers);
    }
    let swarm_key = match &args.swarm_key {
        Some(path) => Some(admission::read_swarm_key(path).map_err(|e| fail(EXIT_USAGE, format!("--swarm-key {e}")))?),
        None => None,
    };
    let policy = sigma_node::Admission { allowed_peers: allowed, swarm_key };
    for addr in &args.listen {
        policy.check_listen(addr).map_err(|why| fail(EXIT_USAGE, format!("--listen {addr}: {why}")))?;
    }
    Ok(policy)
}

#[derive(Args, Debug)]
struct LockArgs {
    /// Lock name: 1 to 200 bytes of [A-Za-z0-9._/-].
    name: String,
    /// Give up after this long (e.g. 500ms, 10s, 2m); default: wait as long as it takes.
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
    #[command(flatten)]
    api: ApiArgs,
    /// Quorum for this lock: replicas (with --m). Must be the swarm's n (one lock, one
    /// replica set); default: the daemon's.
    #[arg(long, requires = "m")]
    n: Option<usize>,
    /// Quorum for this lock: votes needed (with --n), at least the swarm's m.
    #[arg(long, requires = "n")]
    m: Option<usize>,
    /// Quorum diversity for this lock: votes from at least this many distinct peers
    /// [default: the daemon's].
    #[arg(long, value_name = "D")]
    min_peers: Option<usize>,
    /// Client lease: `sigma lock` renews it while the command runs; if `sigma lock`
    /// itself dies (SIGKILL, OOM, crash), the daemon releases the lock this long after
    /// the last renewal.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    ttl: Duration,
    /// Stop the command this long before the lock's deadline when no renewal moved it
    /// on (SIGTERM, then SIGKILL at the deadline); a lost lock also leaves it at most
    /// this long between SIGTERM and SIGKILL. At most half of what the deadline leaves
    /// (the daemon's lease and --ttl).
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    grace: Duration,
    /// Try once: give up after about a second if the lock is not won (exit 75), saying why
    /// when this peer knows (not ready, or new locks held back by the takeover delay).
    #[arg(long = "try", conflicts_with = "timeout")]
    try_once: bool,
    /// The command and its arguments, after `--`. Without one, `sigma lock` prints the
    /// lock's name and fencing token and holds the lock until SIGINT or SIGTERM.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// How the client commands reach the local daemon's control API.
#[derive(Args, Debug)]
struct ApiArgs {
    /// Control API of the local daemon: IP:PORT or unix:PATH [default: $SIGMA_API, else
    /// the `api` of the daemon's config file ($SIGMA_CONFIG, else /etc/sigma/sigma.toml),
    /// else unix:/run/sigma/api.sock if that socket exists, else 127.0.0.1:7591].
    #[arg(long, value_name = "IP:PORT|unix:PATH")]
    api: Option<String>,
    /// File holding the API's bearer token (the daemon's --api-token-file).
    #[arg(long, value_name = "PATH", env = "SIGMA_API_TOKEN_FILE")]
    api_token_file: Option<PathBuf>,
    /// File holding the daemon's admin token, for `sigma release` (the daemon's
    /// --admin-token-file) [default: admin.token in the default state directory, else
    /// /var/lib/sigma/admin.token, if readable].
    #[arg(long, value_name = "PATH", env = "SIGMA_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct InspectArgs {
    /// Lock name.
    name: String,
    #[command(flatten)]
    api: ApiArgs,
    /// Print the daemon's JSON answer.
    #[arg(long)]
    json: bool,
    /// One line per replica (by default they are summed up in one line).
    #[arg(long)]
    replicas: bool,
}

#[derive(Args, Debug)]
struct ReleaseArgs {
    /// Lock name.
    name: String,
    /// The holder's fencing token (from `sigma inspect NAME`, or the holder's
    /// SIGMA_FENCING_TOKEN).
    #[arg(long)]
    token: u64,
    #[command(flatten)]
    api: ApiArgs,
}

#[derive(Subcommand, Debug)]
enum AdminCmd {
    /// Take peers gone for good (killed, decommissioned, never to return) out of this
    /// daemon's membership counts at once. A peer stopped gracefully leaves by itself;
    /// one killed stays a departed member, and a swarm that lost more than half its
    /// members that way serves again only once every survivor has forgotten them: run
    /// this on each. A peer alive here, or on the member list, is refused. Forgetting a
    /// peer that is in fact alive behind a partition lets both sides serve: only
    /// forget what you know is gone. Exit status 0 if all were forgotten, 1 if one was
    /// refused, 69 if the daemon cannot be reached.
    Forget {
        /// Peer ids (from `sigma status`, which lists departed members).
        #[arg(required = true)]
        peers: Vec<String>,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(Args, Debug)]
struct StatusCmdArgs {
    #[command(flatten)]
    base: StatusArgs,
    /// A readiness check for scripts and probes: exit 0 if the peer serves and no new
    /// lock waits for the takeover delay (what `GET /readyz` answers 200 to), else
    /// print why and exit 1 (69 if the daemon cannot be reached).
    #[arg(long, conflicts_with = "json")]
    check: bool,
}

#[derive(Args, Debug)]
struct StatusArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// Print the daemon's JSON answer.
    #[arg(long)]
    json: bool,
}

/// An error with a chosen exit code.
#[derive(Debug)]
struct Fail {
    code: u8,
    msg: String,
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Fail {}

fn fail(code: u8, msg: impl Into<String>) -> anyhow::Error {
    Fail { code, msg: msg.into() }.into()
}

/// Parses "500ms", "10s", "2m", "1h", "1m30s", "1.5s"; a bare number is seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".to_owned());
    }
    let bad = || format!("bad duration {s:?}: expected e.g. 500ms, 10s, 2m, 1h, 1m30s");
    if let Ok(secs) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|_| bad());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        if num_len == 0 {
            return Err(bad());
        }
        let value: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" | "sec" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        let part = Duration::try_from_secs_f64(value * scale).map_err(|_| bad())?;
        total = total.checked_add(part).ok_or_else(bad)?;
    }
    Ok(total)
}

fn init_tracing(default: &str) {
    init_tracing_as(LogFormat::Text, default);
}

/// Logs on stderr, filtered by RUST_LOG (else `default`), as text or JSON lines.
fn init_tracing_as(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Default p2p listen address; the API's is 7591 (`http::DEFAULT_API`). Clear of the
/// ports of services often run beside a peer: IPFS 4001, Meilisearch 7700, etcd
/// 2379–2380, ZooKeeper 2181, Consul 8300–8600, Prometheus 9090, node exporter 9100.
/// QUIC (UDP) beside TCP: a connection in one round trip, and no head-of-line blocking
/// between a peer's streams.
const DEFAULT_LISTEN: [&str; 2] = ["/ip4/0.0.0.0/tcp/7590", "/ip4/0.0.0.0/udp/7590/quic-v1"];

/// The default key file: `key` in systemd's $STATE_DIRECTORY (`StateDirectory=sigma`),
/// else in $XDG_STATE_HOME/sigma, else in ~/.local/state/sigma.
fn default_key_file() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let dir = env("STATE_DIRECTORY")
        // systemd may pass several, separated by ':'; the first is ours.
        .map(|d| PathBuf::from(d.to_string_lossy().split(':').next().unwrap_or_default()))
        .or_else(|| env("XDG_STATE_HOME").map(|d| d.join("sigma")))
        .or_else(|| env("HOME").map(|h| h.join(".local/state/sigma")))?;
    Some(dir.join("key"))
}

/// Takes an exclusive lock on `KEY.lock` beside the key file, held while the returned
/// handle lives: two daemons with one identity would be one peer to the swarm, each
/// dropping the other's connections and replicas.
fn lock_key_file(key: &std::path::Path) -> anyhow::Result<nix::fcntl::Flock<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(dir) = key.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut path = key.as_os_str().to_owned();
    path.push(".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("opening {}", PathBuf::from(&path).display()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
        fail(
            EXIT_UNAVAILABLE,
            format!(
                "key file {} is in use by another sigma daemon ({errno}): give each daemon its own --key-file",
                key.display()
            ),
        )
    })
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
            Cmd::Status(args) => status(args).await,
            Cmd::Locks(args) => locks(args).await,
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

// ---------------------------------------------------------------------------------
// sigma run

async fn run(args: RunArgs) -> anyhow::Result<u8> {
    init_tracing_as(args.log_format, "info");
    raise_open_file_limit();
    let admission = membership_policy(&args)?;
    let api_addr = http::ApiAddr::parse(&args.api)?;
    // The identity: the key file (default in the state directory), locked for as long
    // as this daemon runs; or a throwaway one.
    let (key_file, _key_lock) = if args.ephemeral_key {
        (None, None)
    } else {
        let path =
            match args.key_file.clone().or_else(default_key_file) {
                Some(p) => p,
                None => return Err(fail(
                    EXIT_USAGE,
                    "no state directory for the key file (neither STATE_DIRECTORY, XDG_STATE_HOME nor HOME is set): \
                     give --key-file PATH or --ephemeral-key",
                )),
            };
        let lock = lock_key_file(&path)?;
        (Some(path), Some(lock))
    };
    let token = match &args.api_token_file {
        Some(path) => Some(load_or_create_token(path).with_context(|| format!("API token file {}", path.display()))?),
        None => None,
    };
    let admin_token_file =
        args.admin_token_file.clone().or_else(|| Some(key_file.as_ref()?.parent()?.join(ADMIN_TOKEN_FILE)));
    let admin_token = match &admin_token_file {
        Some(path) => Some(load_or_create_token(path).with_context(|| format!("admin token file {}", path.display()))?),
        None => {
            tracing::warn!("no admin token file (--ephemeral-key): the admin routes are refused");
            None
        }
    };
    if args.api_max_requests == 0 {
        bail!("--api-max-requests must be at least 1");
    }
    let mut proto = sigma_behaviour::proto::Config::default().with_idle_ttl(args.replica_idle_ttl);
    if let (Some(n), Some(m)) = (args.n, args.m) {
        proto = proto.with_quorum(n, m);
    }
    if let Some(ms) = args.lease_ms {
        proto = proto.with_lease(Duration::from_millis(ms));
    }
    proto.validate().context("bad protocol parameters")?;
    if args.min_peers.is_some_and(|d| d == 0 || d > proto.m()) {
        bail!("--min-peers must be between 1 and m = {}", proto.m());
    }
    let behaviour = sigma_behaviour::Config::default()
        .with_protocol(proto)
        .with_min_voters(args.min_peers)
        .with_takeover_delay(args.takeover_delay)
        .with_membership_window(args.membership_window)
        .with_ping(args.ping_interval, args.ping_timeout)
        .with_gossip(args.gossip_interval, args.gossip_fanout, args.gossip_liveness)
        .with_limits(args.max_replicas, args.max_replicas_per_peer, (args.peer_rate, args.peer_rate.saturating_mul(2)))
        .with_entry_limits(args.max_queue_entries, args.max_queue_entries_per_peer)
        .with_admin(admin_policy(&args.admin_peer)?)
        .with_message_delay(args.test_message_delay);
    if let Some(delay) = args.test_message_delay {
        tracing::warn!(%delay, "test-only message delay: every protocol message is held");
    }

    // One registry for /metrics: libp2p's metrics (prefix libp2p_), recorded by the
    // node's event loop from the swarm's events, and ours (sigma_).
    let mut registry = Registry::default();
    let libp2p_metrics = sigma_node::Libp2pMetrics(Arc::new(libp2p::metrics::Metrics::new(&mut registry)));
    let metrics = Metrics::register(&mut registry);
    // pnet cannot wrap QUIC: with a swarm key the default listens on TCP only (a QUIC
    // address given explicitly is refused by the node).
    let mut listen = args.listen;
    if admission.swarm_key.is_some() && listen.iter().map(|m| m.to_string()).eq(DEFAULT_LISTEN) {
        listen.retain(|m| !m.iter().any(|p| matches!(p, Protocol::Udp(_))));
    }
    let config = NodeConfig {
        listen,
        bootstrap: args.bootstrap,
        external_addresses: args.external_address,
        key_file,
        behaviour,
        libp2p_metrics: Some(libp2p_metrics),
        idle_connection_timeout: args.idle_timeout,
        bounds: ConnectionBounds {
            max_established: args.max_connections,
            max_established_incoming: args.max_incoming.min(args.max_connections),
            max_established_per_peer: args.max_connections_per_peer.max(1),
            max_pending_incoming: args.max_pending_incoming,
            max_pending_outgoing: ConnectionBounds::default().max_pending_outgoing,
            max_memory_bytes: args.max_memory_mb.map(|mb| mb.saturating_mul(1024 * 1024)),
        },
        admission,
        ..NodeConfig::default()
    };
    let mut node = Node::start(config).await.context("cannot start the node")?;
    let handle = node.handle();
    let api_options = http::ApiOptions {
        max_in_flight: args.api_max_requests,
        max_waiters_per_lock: args.api_max_waiters_per_lock,
        token,
        admin_token,
        metrics_addr: args.metrics,
        max_connections: args.http_max_connections,
        header_timeout: args.http_header_timeout,
    };
    let api = match Api::bind_with(api_addr, handle.clone(), metrics, Arc::new(registry), api_options).await {
        Ok(api) => api,
        Err(e) => {
            let _ = node.shutdown().await;
            return Err(e.into());
        }
    };

    // Before anyone is told the daemon is up: a SIGTERM from then on is a clean stop.
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let peer = node.peer_id();
    let listen: Vec<Multiaddr> = node.listen_addrs().to_vec();
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "SIGMA_PEER_ID={peer}")?;
        for a in &listen {
            let full = if matches!(a.iter().last(), Some(Protocol::P2p(_))) {
                a.clone()
            } else {
                a.clone().with(Protocol::P2p(peer))
            };
            writeln!(out, "SIGMA_LISTEN={full}")?;
        }
        writeln!(out, "SIGMA_API={}", api.local_addr())?;
        if let Some(m) = api.metrics_addr() {
            writeln!(out, "SIGMA_METRICS={m}")?;
        }
        writeln!(out, "SIGMA_READY")?;
        out.flush()?;
    }
    tracing::info!(%peer, api = %api.local_addr(), metrics = ?api.metrics_addr(), "sigma daemon ready");
    // systemd (Type=notify): up and listening. Whether the peer serves locks yet (it
    // may still be joining its swarm) is in `sigma status` and /metrics.
    let status = format!("STATUS=peer {peer}, API {}", api.local_addr());
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready, sd_notify::NotifyState::Custom(&status)]) {
        tracing::warn!(%e, "cannot notify systemd of readiness");
    }
    // `SIGMA_SERVING` (and systemd's STATUS) once the peer serves with nothing held
    // back: a lock taken then is granted at once (SIGMA_READY means listening).
    {
        let handle = handle.clone();
        tokio::spawn(async move {
            loop {
                match handle.status().await {
                    Ok(st) if st.ready && st.held_back_ms == 0 => {
                        println!("SIGMA_SERVING");
                        let _ = sd_notify::notify(&[sd_notify::NotifyState::Custom("STATUS=serving")]);
                        return;
                    }
                    Ok(_) => tokio::time::sleep(Duration::from_millis(250)).await,
                    Err(_) => return,
                }
            }
        });
    }
    // systemd's watchdog (WatchdogSec=): fed only while the node's event loop answers,
    // so that a hung loop is restarted rather than left listening.
    if let Some(interval) = sd_notify::watchdog_enabled() {
        let handle = handle.clone();
        tokio::spawn(async move {
            let every = interval / 2;
            loop {
                tokio::time::sleep(every).await;
                if let Ok(Ok(_)) = tokio::time::timeout(every, handle.status()).await {
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                } else {
                    tracing::warn!("the event loop did not answer: the systemd watchdog is not fed");
                }
            }
        });
    }

    let which = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        why = node.failed() => {
            tracing::error!(%why, "stopping the daemon");
            api.shutdown(Duration::ZERO).await;
            return Err(anyhow::anyhow!(why));
        }
    };
    tracing::info!(signal = which, "shutting down");
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    // Holders first: they are told the daemon stops, stop their work and release; only
    // then does the node go (and with it what it still renews).
    let stopped = tokio::select! {
        stopped = api.shutdown(args.stop_timeout) => stopped,
        _ = term.recv() => http::Stopped::Abandoned(0),
        _ = int.recv() => http::Stopped::Abandoned(0),
    };
    match stopped {
        http::Stopped::Clean => node.shutdown().await.context("stopping the node")?,
        http::Stopped::Abandoned(held) => {
            // Releasing these would hand them on before the deadline their holders were
            // told; without their renewals their votes lapse after it.
            tracing::warn!(held, "stopping without releasing the locks HTTP clients still hold");
            drop(node);
        }
    }
    tracing::info!("stopped");
    Ok(0)
}

/// Raises the soft limit on open files to the hard limit: every peer connection and API
/// client is a file descriptor, and the usual soft limit (1,024) is a few hundred peers.
fn raise_open_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!(%e, "cannot read the open-file limit");
            return;
        }
    };
    if soft >= hard {
        tracing::debug!(limit = soft, "open-file limit already at its hard limit");
        return;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => tracing::info!(from = soft, to = hard, "raised the open-file limit"),
        Err(e) => tracing::warn!(%e, from = soft, to = hard, "cannot raise the open-file limit"),
    }
}

// ---------------------------------------------------------------------------------
// the client side of the control API

impl ApiArgs {
    /// A client of the daemon's API (with its token, if one is given).
    fn connect(&self) -> anyhow::Result<Client> {
        let given = match self.api.clone().or_else(|| std::env::var("SIGMA_API").ok()) {
            Some(s) => Some(s),
            None => config_file::configured_api().map_err(|e| fail(EXIT_USAGE, format!("{e:#}")))?,
        };
        let addr = match given {
            Some(s) => http::ApiAddr::parse(&s)?,
            None if std::path::Path::new(http::DEFAULT_API_SOCKET).exists() => {
                http::ApiAddr::Unix(http::DEFAULT_API_SOCKET.into())
            }
            None => http::ApiAddr::parse(DEFAULT_API)?,
        };
        let mut client = Client::new(addr);
        if let Some(path) = &self.api_token_file {
            let token = read_token(path)
                .map_err(|e| fail(EXIT_UNAVAILABLE, format!("API token file {}: {e:#}", path.display())))?;
            client = client
                .with_token(&token)
                .map_err(|_| fail(EXIT_USAGE, format!("API token file {}: not a valid token", path.display())))?;
        }
        let admin = match &self.admin_token_file {
            Some(path) => Some(
                read_token(path)
                    .map_err(|e| fail(EXIT_UNAVAILABLE, format!("admin token file {}: {e:#}", path.display())))?,
            ),
            // The daemons this user runs, then the shipped unit's; unreadable: none.
            None => default_key_file()
                .and_then(|k| Some(k.parent()?.join(ADMIN_TOKEN_FILE)))
                .into_iter()
                .chain([PathBuf::from("/var/lib/sigma").join(ADMIN_TOKEN_FILE)])
                .find_map(|p| read_token(&p).ok()),
        };
        match admin {
            Some(token) => client
                .with_admin_token(&token)
                .map_err(|_| fail(EXIT_USAGE, "the admin token is not a valid token".to_owned())),
            None => Ok(client),
        }
    }
}

/// The exit code for a failed call (`what` names the command in the message).
fn api_error(what: &str, e: ClientError) -> anyhow::Error {
    let code = match &e {
        ClientError::BadRequest(_) => EXIT_USAGE,
        ClientError::NotReady(_) => EXIT_NOT_READY,
        _ => EXIT_UNAVAILABLE,
    };
    fail(code, format!("{what}: {e}"))
}

/// The token in `path` (surrounding whitespace removed; must not be empty).
fn read_token(path: &std::path::Path) -> anyhow::Result<String> {
    let token = std::fs::read_to_string(path)?.trim().to_owned();
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        bail!("the token must be one word of printable ASCII");
    }
    Ok(token)
}

/// A token file: read from `path`, or, if it does not exist, a new random token written
/// there with mode 0600. The file appears whole or not at all (written aside, then
/// linked into place), so daemons that share it and start together read one token.
fn load_or_create_token(path: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    if path.exists() {
        return read_token(path);
    }
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".{}.new", std::process::id()));
    let aside = PathBuf::from(aside);
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&aside)?;
    writeln!(file, "{token}")?;
    drop(file);
    let linked = std::fs::hard_link(&aside, path);
    let _ = std::fs::remove_file(&aside);
    match linked {
        Ok(()) => {
            tracing::info!(path = %path.display(), "created a token file");
            Ok(token)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read_token(path),
        Err(e) => Err(e.into()),
    }
}

/// The admin token file's name, in the directory of the daemon's key file by default.
const ADMIN_TOKEN_FILE: &str = "admin.token";

// ---------------------------------------------------------------------------------
// sigma status

/// `GET /v1/status` of the daemon at `api` (`what` names the command in errors).
async fn fetch_status(api: &ApiArgs, what: &str) -> anyhow::Result<serde_json::Value> {
    init_tracing("warn");
    let status = api.connect()?.status().await.map_err(|e| api_error(what, e))?;
    Ok(serde_json::to_value(status)?)
}

async fn status(cmd: StatusCmdArgs) -> anyhow::Result<u8> {
    let args = cmd.base;
    let v = fetch_status(&args.api, "status").await?;
    if cmd.check {
        let held_back = v["held_back_ms"].as_u64().unwrap_or(0);
        return Ok(if v["ready"] != true {
            println!("not ready: {}", v["readiness_detail"].as_str().unwrap_or("?"));
            1
        } else if held_back > 0 {
            println!("serving, but a new lock waits {held_back} ms more for the takeover delay");
            1
        } else {
            println!("ready: serving");
            0
        });
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    print!("{}", render_status(&v));
    Ok(0)
}

async fn locks(args: StatusArgs) -> anyhow::Result<u8> {
    let v = fetch_status(&args.api, "locks").await?;
    let held = v.get("locks_held").cloned().unwrap_or_default();
    let waiting = v.get("waiting").cloned().unwrap_or_default();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "held": held, "waiting": waiting }))?);
        return Ok(0);
    }
    print!("{}", render_locks(&held, &waiting));
    Ok(0)
}

// ---------------------------------------------------------------------------------
// sigma inspect, sigma release

async fn inspect(args: InspectArgs) -> anyhow::Result<u8> {
    init_tracing("warn");
    let view = args.api.connect()?.inspect(&args.name).await.map_err(|e| api_error("inspect", e))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print!("{}", view.render_with(args.replicas));
    }
    Ok(0)
}

async fn release_cmd(args: ReleaseArgs) -> anyhow::Result<u8> {
    init_tracing("warn");
    match args.api.connect()?.revoke(&args.name, args.token).await {
        Ok(done) => {
            println!("revoked {} token {} (held through peer {})", done.name, done.token, done.holder);
            Ok(0)
        }
        Err(ClientError::NotFound(msg)) => Err(fail(1, format!("release: {msg}"))),
        Err(e) => Err(api_error("release", e)),
    }
}

async fn forget_cmd(peers: &[String], api: ApiArgs) -> anyhow::Result<u8> {
    init_tracing("warn");
    match api.connect()?.forget(peers).await {
        Ok(answer) => {
            for p in &answer.forgotten {
                println!("forgotten {p}");
            }
            for r in &answer.refused {
                println!("refused   {}: {}", r.peer, r.reason);
            }
            Ok(u8::from(!answer.refused.is_empty()))
        }
        Err(e) => Err(api_error("admin forget", e)),
    }
}

/// One line per lock: `held NAME token T` or `waiting NAME position P (V votes)`.
fn render_locks(held: &serde_json::Value, waiting: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for h in held.as_array().into_iter().flatten() {
        if let Some([name, token]) = h.as_array().map(Vec::as_slice) {
            let _ = writeln!(out, "held     {} token {token}", name.as_str().unwrap_or("?"));
        }
    }
    for w in waiting.as_array().into_iter().flatten() {
        let name = w["name"].as_str().unwrap_or("?");
        let place = w["position"].as_u64().map_or_else(|| "not yet known".to_owned(), |p| p.to_string());
        let _ = writeln!(out, "waiting  {name} position {place} ({} votes)", w["votes"].as_u64().unwrap_or(0));
    }
    if out.is_empty() {
        out.push_str("no locks held or waited for through this peer\n");
    }
    out
}

fn render_status(v: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let str_list = |key: &str| -> Vec<String> {
        match v.get(key) {
            Some(serde_json::Value::Array(a)) => {
                a.iter().map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned)).collect()
            }
            _ => Vec::new(),
        }
    };
    let num = |key: &str| v.get(key).map_or_else(|| "?".to_owned(), |x| x.to_string());
    let mut out = String::new();
    let _ = writeln!(out, "peer id:          {}", v.get("peer_id").and_then(|x| x.as_str()).unwrap_or("?"));
    let listen = str_list("listen_addrs");
    let _ = writeln!(
        out,
        "listening on:     {}",
        if listen.is_empty() { "-".to_owned() } else { listen.join("\n                  ") }
    );
    let external = str_list("external_addrs");
    let _ = writeln!(
        out,
        "external:         {}",
        if external.is_empty() {
            "- (no address other peers can dial: hosts no replica)".to_owned()
        } else {
            external.join("\n                  ")
        }
    );
    let connected = str_list("connected_peers");
    let _ = writeln!(out, "connected peers:  {}", connected.len());
    for p in &connected {
        let _ = writeln!(out, "                  {p}");
    }
    let _ = writeln!(out, "routable peers:   {}", num("routable_peers"));
    let ready = v.get("ready").and_then(serde_json::Value::as_bool);
    let detail = v.get("readiness_detail").and_then(|x| x.as_str()).unwrap_or("?");
    let _ = writeln!(
        out,
        "ready:            {} ({detail}; {} of {} known peers reachable)",
        match ready {
            Some(true) => "yes",
            Some(false) => "no",
            None => "?",
        },
        num("reachable_members"),
        num("members"),
    );
    let departed = str_list("departed_members");
    if !departed.is_empty() {
        let _ = writeln!(out, "departed peers:   {} (sigma admin forget, if gone for good)", departed.join(", "));
    }
    if let Some(ms) = v.get("held_back_ms").and_then(serde_json::Value::as_u64).filter(|ms| *ms > 0) {
        let _ = writeln!(out, "new locks wait:   {ms} ms more (the takeover delay after serving began)");
    }
    let _ = writeln!(out, "replicas hosted:  {}", num("replicas_hosted"));
    let held: Vec<String> = match v.get("locks_held") {
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|x| match x {
                serde_json::Value::Array(p) if p.len() == 2 => {
                    format!("{} (token {})", p[0].as_str().unwrap_or("?"), p[1])
                }
                other => other.to_string(),
            })
            .collect(),
        _ => Vec::new(),
    };
    let _ = writeln!(out, "locks held:       {}", if held.is_empty() { "-".to_owned() } else { held.join(", ") });
    let waiting = str_list("locks_waiting");
    let _ = writeln!(out, "locks waited for: {}", if waiting.is_empty() { "-".to_owned() } else { waiting.join(", ") });
    out
}

// ---------------------------------------------------------------------------------
// sigma lock

/// How long `sigma lock` waits before saying why it waits, and how often it asks again.
const WHY_AFTER: Duration = Duration::from_secs(1);
const WHY_EVERY: Duration = Duration::from_secs(5);

/// Why a lock may not be won through this daemon yet, if the daemon knows: it is not
/// ready (joining, a minority…), or its replicas hold new grants back for the takeover
/// delay. `None`: it serves with nothing held back (the lock is held elsewhere or
/// contended), or the daemon did not answer.
/// The reason's kind comes first (the readiness, or `held_back`): it is said once.
async fn why_waiting(client: &Client) -> Option<(String, String)> {
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

async fn lock(args: LockArgs) -> anyhow::Result<u8> {
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
    let client = args.api.connect()?;
    let mut signals = Signals::new()?;

    // Acquire (the client has a deadline too: a hung daemon must not make --timeout
    // hang forever).
    let timeout = if args.try_once { Some(TRY_TIMEOUT) } else { args.timeout };
    let opts = AcquireOptions { timeout, ttl: Some(args.ttl), quorum: args.n.zip(args.m), min_peers: args.min_peers };
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
                Err(ClientError::Timeout) if args.try_once => {
                    let why = why_waiting(&client).await.map_or_else(|| "it is held elsewhere".to_owned(), |(_, why)| why);
                    return Err(fail(EXIT_TIMEOUT, format!("lock {name} not won within {TRY_TIMEOUT:?}: {why}")));
                }
                Err(ClientError::Timeout) => {
                    let waited = timeout.map_or_else(String::new, |t| format!(" after {t:?}"));
                    return Err(fail(EXIT_TIMEOUT, format!("timed out{waited} waiting for lock {name}")));
                }
                Err(e) => return Err(api_error(&format!("lock {name}"), e)),
            },
            _ = ask.tick(), if !args.try_once => {
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
    tracing::info!(%name, token, "lock acquired");
    let mut holding =
        Holding::confirm(client, name.clone(), acquired, args.ttl).await.map_err(|e| fail(EXIT_LOST, e.to_string()))?;
    if args.command.is_empty() {
        return hold_until_signal(&mut holding, &mut signals).await;
    }
    // The command is stopped --grace before the deadline, so that its SIGKILL lands by
    // the deadline. A daemon whose lease leaves less than that (a short --lease-ms) gets
    // half of what it leaves.
    let span = holding.deadline().saturating_duration_since(holding.confirmed_at());
    let grace = args.grace.min(span / 2);
    if grace < args.grace {
        eprintln!(
            "sigma: warning: --grace {:?} is more than half of what lock {name}'s deadline leaves ({span:?}); using \
             {grace:?}",
            args.grace
        );
    }

    // Run the command.
    let mut cmd = tokio::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("SIGMA_LOCK_NAME", &name)
        .env("SIGMA_FENCING_TOKEN", token.to_string())
        .env("SIGMA_LOCK_VALID_UNTIL_MS", holding.valid_until_ms().to_string())
        .process_group(0);
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
async fn hold_until_signal(holding: &mut Holding, signals: &mut Signals) -> anyhow::Result<u8> {
    let (name, token) = (holding.name().to_owned(), holding.token());
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "SIGMA_LOCK_NAME={name}")?;
        writeln!(out, "SIGMA_FENCING_TOKEN={token}")?;
        writeln!(out, "SIGMA_LOCK_VALID_UNTIL_MS={}", holding.valid_until_ms())?;
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

fn exit_code(status: &std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        (None, None) => 1,
    }
}

fn kill_group(pgid: Pid, sig: Signal) {
    // The group may be gone already (ESRCH): nothing to stop then.
    let _ = nix::sys::signal::killpg(pgid, sig);
}

/// SIGTERM to the command's process group, SIGKILL after `grace`.
async fn stop_child(
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
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        Ok(Signals {
            int: signal(SignalKind::interrupt()).context("installing a SIGINT handler")?,
            term: signal(SignalKind::terminate()).context("installing a SIGTERM handler")?,
            hup: signal(SignalKind::hangup()).context("installing a SIGHUP handler")?,
        })
    }

    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

/// While the command runs in its own process group, it owns the terminal (if stdin is
/// one), so it can read it and gets the terminal's Ctrl-C itself. Given back on drop.
struct Terminal {
    ours: Option<Pid>,
}

impl Terminal {
    fn give_to(pgid: Option<Pid>) -> Terminal {
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
fn set_foreground(pg: Pid) -> nix::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("500ms"), Ok(ms(500)));
        assert_eq!(parse_duration("10s"), Ok(ms(10_000)));
        assert_eq!(parse_duration("2m"), Ok(ms(120_000)));
        assert_eq!(parse_duration("1h"), Ok(ms(3_600_000)));
        assert_eq!(parse_duration("1m30s"), Ok(ms(90_000)));
        assert_eq!(parse_duration("1.5s"), Ok(ms(1_500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration(" 3 "), Ok(ms(3_000)));
        assert_eq!(parse_duration("0.25"), Ok(ms(250)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn bad_durations() {
        for s in ["", "ms", "10x", "-1s", "s10", "1.2.3s", "10 s", "1e999", "-5", "NaN", "inf", "99999999999999999999h"]
        {
            assert!(parse_duration(s).is_err(), "{s:?} parsed as {:?}", parse_duration(s));
        }
    }

    #[test]
    fn locks_render_with_places_in_line() {
        let held = serde_json::json!([["orders/42", 7]]);
        let waiting = serde_json::json!([
            {"name": "a", "position": 2, "votes": 3},
            {"name": "b", "position": null, "votes": 0},
        ]);
        let s = render_locks(&held, &waiting);
        assert!(s.contains("held     orders/42 token 7"), "{s}");
        assert!(s.contains("waiting  a position 2 (3 votes)"), "{s}");
        assert!(s.contains("waiting  b position not yet known (0 votes)"), "{s}");
    }

    #[test]
    fn status_renders() {
        let v = serde_json::json!({
            "peer_id": "12D3KooW",
            "listen_addrs": ["/ip4/127.0.0.1/tcp/1"],
            "connected_peers": ["A", "B"],
            "routable_peers": 2,
            "replicas_hosted": 5,
            "locks_held": [["orders/42", 7]],
            "locks_waiting": [],
        });
        let s = render_status(&v);
        assert!(s.contains("peer id:          12D3KooW"), "{s}");
        assert!(s.contains("external:         - (no address other peers can dial"), "{s}");
        let mut with_external = v.clone();
        with_external["external_addrs"] = serde_json::json!(["/ip4/203.0.113.7/tcp/7590"]);
        assert!(render_status(&with_external).contains("external:         /ip4/203.0.113.7/tcp/7590"));
        assert!(s.contains("connected peers:  2"), "{s}");
        assert!(s.contains("orders/42 (token 7)"), "{s}");
        assert!(s.contains("locks waited for: -"), "{s}");
    }

    #[test]
    fn cli_parses() {
        let cli = Cli::try_parse_from(["sigma", "lock", "x", "--timeout", "2s", "--", "sh", "-c", "true"]).unwrap();
        match cli.command {
            Cmd::Lock(a) => {
                assert_eq!(a.timeout, Some(Duration::from_secs(2)));
                assert_eq!(a.command, ["sh", "-c", "true"]);
            }
            other => panic!("{other:?}"),
        }
        match Cli::try_parse_from(["sigma", "lock", "x"]).unwrap().command {
            Cmd::Lock(a) => assert!(a.command.is_empty() && !a.try_once, "no command: hold until a signal"),
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
