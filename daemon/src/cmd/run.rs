//! `sigma run`: the peer daemon.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Args;
use libp2p::multiaddr::Protocol;
use libp2p::Multiaddr;
use prometheus_client::registry::Registry;
use sigma_daemon::http::{self, Api, DEFAULT_API};
use sigma_node::metrics::Metrics;
use sigma_node::{ConnectionBounds, Node, NodeConfig};
use tokio::signal::unix::{signal, SignalKind};

use super::api::{load_or_create_token, ADMIN_TOKEN_FILE};
use super::{default_key_file, fail, init_tracing_as, parse_duration, LogFormat, EXIT_UNAVAILABLE, EXIT_USAGE};

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// Read settings from this TOML file: one `flag-name = value` per option of `sigma
    /// run` (lists as arrays), e.g. `listen = ["/ip4/0.0.0.0/tcp/7590"]`. Precedence: the
    /// command line, then the environment (SIGMA_…), then the file.
    #[arg(long, value_name = "PATH", env = "SIGMA_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// Address to listen on for peers (repeatable, or comma-separated) [default: TCP and
    /// QUIC on port 7590].
    #[arg(long, value_name = "MULTIADDR", num_args = 1.., value_delimiter = ',', default_values = DEFAULT_LISTEN, hide_default_value = true, env = "SIGMA_LISTEN")]
    pub(crate) listen: Vec<Multiaddr>,
    /// A peer to join through, ending with /p2p/PEER_ID (repeatable, or comma-separated).
    #[arg(long, value_name = "MULTIADDR", num_args = 1.., value_delimiter = ',', env = "SIGMA_BOOTSTRAP")]
    pub(crate) bootstrap: Vec<Multiaddr>,
    /// An address other peers can dial this node at: a public IP, a port a NAT forwards,
    /// a DNS name (repeatable, or comma-separated). Listen addresses as wide as the
    /// bootstrap peers' (loopback, LAN) count as external without it, and AutoNAT
    /// confirms public ones peers observe; a node with none hosts no replica.
    #[arg(long, value_name = "MULTIADDR", num_args = 1.., value_delimiter = ',', env = "SIGMA_EXTERNAL_ADDRESS")]
    pub(crate) external_address: Vec<Multiaddr>,
    /// A short label for this peer, shown by the other peers next to its id (`sigma
    /// status`, `inspect`, `locks --swarm`, `top`), e.g. db-1: 1 to 32 characters of
    /// ASCII letters, digits, '.', '_' and '-'. A label for people, not an identity:
    /// any peer may take any name.
    #[arg(long, value_name = "NAME", value_parser = sigma_node::names::parse_name, env = "SIGMA_NAME")]
    pub(crate) name: Option<String>,
    /// Persistent identity, created on first start [default: `key` in $STATE_DIRECTORY
    /// (systemd), else $XDG_STATE_HOME/sigma, else ~/.local/state/sigma]. A restart keeps
    /// the peer id others bootstrap from. Two daemons cannot share one key file.
    #[arg(long, value_name = "PATH", env = "SIGMA_KEY_FILE")]
    pub(crate) key_file: Option<PathBuf>,
    /// A new identity each run, kept nowhere (instead of the key file).
    #[arg(long, conflicts_with = "key_file", env = "SIGMA_EPHEMERAL_KEY")]
    pub(crate) ephemeral_key: bool,
    /// A development node, to try the API and the CLI: one peer alone on 127.0.0.1 (a
    /// random swarm key refuses every other peer), a throwaway identity, and no takeover
    /// delay, so the first lock is granted at once. Not for real use: without the delay
    /// a restarted node may grant a lock that a command of its previous run still holds.
    #[arg(
        long,
        env = "SIGMA_DEV",
        conflicts_with_all = ["bootstrap", "key_file", "ephemeral_key", "swarm_key", "allow_peer", "allow_peers_file", "takeover_delay", "listen", "external_address"]
    )]
    pub(crate) dev: bool,
    /// Closed membership: accept connections only from this peer (repeatable, or
    /// comma-separated; with --allow-peers-file, the union). This peer itself is always
    /// allowed. Given any allowed peer, every other peer is refused. Default: open.
    #[arg(long, value_name = "PEER_ID", value_delimiter = ',', value_parser = sigma_node::admission::parse_peer_id, env = "SIGMA_ALLOW_PEERS")]
    pub(crate) allow_peer: Vec<libp2p::PeerId>,
    /// Closed membership: the allowed peers from a file, one peer id per line (`#`
    /// comments, blank lines allowed); see --allow-peer.
    #[arg(long, value_name = "PATH", env = "SIGMA_ALLOW_PEERS_FILE")]
    pub(crate) allow_peers_file: Option<PathBuf>,
    /// Private swarm: a pre-shared key file (`sigma swarm-key` makes one) that encrypts
    /// every connection; peers without the same key cannot connect. TCP only: QUIC
    /// listen addresses are refused.
    #[arg(long, value_name = "PATH", env = "SIGMA_SWARM_KEY")]
    pub(crate) swarm_key: Option<PathBuf>,
    /// Control API address: a loopback IP:PORT (port 0 picks a free port; see
    /// SIGMA_API=), or unix:PATH, a socket of mode 0660 (its owner and group may use the
    /// API; the connecting user's id is logged for every lock taken, revoke and block).
    /// The shipped unit uses unix:/run/sigma/api.sock.
    #[arg(long, value_name = "IP:PORT|unix:PATH", default_value = DEFAULT_API, env = "SIGMA_API")]
    pub(crate) api: String,
    /// Also serve /metrics (only) on this address, e.g. 0.0.0.0:9590 for a remote
    /// Prometheus; port 0 picks a free port (see SIGMA_METRICS=). /metrics is always
    /// served on the control API as well.
    #[arg(long, value_name = "IP:PORT", env = "SIGMA_METRICS")]
    pub(crate) metrics: Option<std::net::SocketAddr>,
    /// Log format on stderr: `text`, or `json` (one object per line, for log shippers).
    #[arg(long, value_name = "FORMAT", default_value = "text", env = "SIGMA_LOG_FORMAT")]
    pub(crate) log_format: LogFormat,
    /// Require `Authorization: Bearer <token>` on every API request, the token read from
    /// this file (created with a random token, mode 0600, if missing). For machines with
    /// several users: only those who can read the file can use the API.
    #[arg(long, value_name = "PATH", env = "SIGMA_API_TOKEN_FILE")]
    pub(crate) api_token_file: Option<PathBuf>,
    /// The admin routes (`/v1/admin/*`, `/v1/revoke/*`: break-lock and the block list)
    /// need `Authorization: Bearer <token>` with the token of this file (created with a
    /// random token, mode 0600, if missing), and no other [default: `admin.token` beside
    /// the key file; with --ephemeral-key and no file, the admin routes are refused].
    #[arg(long, value_name = "PATH", env = "SIGMA_ADMIN_TOKEN_FILE")]
    pub(crate) admin_token_file: Option<PathBuf>,
    /// Acquires served at once by the API (waiting ones included); more are refused with
    /// 503 `busy`. Keep-alives and releases have a pool of their own: waiting acquires
    /// never starve a holder.
    #[arg(long, value_name = "N", default_value_t = http::gate::DEFAULT_MAX_IN_FLIGHT, env = "SIGMA_API_MAX_REQUESTS")]
    pub(crate) api_max_requests: usize,
    /// Acquires waiting at once for one lock name through this daemon; more are refused
    /// with 503 `too_many_waiters`.
    #[arg(long, value_name = "N", default_value_t = http::DEFAULT_MAX_WAITERS_PER_LOCK, env = "SIGMA_API_MAX_WAITERS_PER_LOCK")]
    pub(crate) api_max_waiters_per_lock: usize,
    /// Connections open at once on the API's listener (and on the metrics listener);
    /// more are closed on accept.
    #[arg(long, value_name = "N", default_value_t = http::DEFAULT_MAX_CONNECTIONS, env = "SIGMA_HTTP_MAX_CONNECTIONS")]
    pub(crate) http_max_connections: usize,
    /// An HTTP connection that sends no complete request head for this long (idle
    /// between requests included) is closed.
    #[arg(long, value_parser = parse_duration, default_value = "10s", env = "SIGMA_HTTP_HEADER_TIMEOUT")]
    pub(crate) http_header_timeout: Duration,
    /// On SIGTERM/SIGINT, how long to wait for HTTP clients to release their locks (they
    /// are told the daemon is stopping; a lock not released runs out with its client
    /// lease). Locks still held after it are left to lapse on their own, as after a
    /// crash, rather than released under their holders. Keep the service manager's stop
    /// timeout above it (the unit's TimeoutStopSec). A second signal stops at once.
    #[arg(long, value_parser = parse_duration, default_value = "30s", env = "SIGMA_STOP_TIMEOUT")]
    pub(crate) stop_timeout: Duration,
    /// Logical replicas per lock (default 32). Every peer of a swarm must agree.
    #[arg(long, requires = "m", env = "SIGMA_N")]
    pub(crate) n: Option<usize>,
    /// Votes needed to win, a strict majority of n (default 24).
    #[arg(long, requires = "n", env = "SIGMA_M")]
    pub(crate) m: Option<usize>,
    /// Lease of a vote in milliseconds (default 10000); renewals every third of it.
    #[arg(long, value_name = "MS", env = "SIGMA_LEASE_MS")]
    pub(crate) lease_ms: Option<u64>,
    /// Quorum diversity D: a lock is won only with votes hosted by at least D distinct
    /// peers [default: 2 once another peer is known, 1 in a one-node swarm].
    #[arg(long, value_name = "D", env = "SIGMA_MIN_PEERS")]
    pub(crate) min_peers: Option<usize>,
    /// Takeover delay: a replica this peer takes over (after its start, a split, or a
    /// closer peer's departure) grants nothing for this long [default: lease + drift +
    /// liveness timeout + 1s]. Shorter than that, a replica reset can break exclusion.
    #[arg(long, value_parser = parse_duration, env = "SIGMA_TAKEOVER_DELAY")]
    pub(crate) takeover_delay: Option<Duration>,
    /// A departed peer still counts toward the majority this peer must reach to serve,
    /// for this long (only while serving: the minority side of a split forgets nobody).
    #[arg(long, value_parser = parse_duration, default_value = "10m", env = "SIGMA_MEMBERSHIP_WINDOW")]
    pub(crate) membership_window: Duration,
    /// Liveness pings on every connection: interval.
    #[arg(long, value_parser = parse_duration, default_value = "1s", env = "SIGMA_PING_INTERVAL")]
    pub(crate) ping_interval: Duration,
    /// Liveness pings: a connection whose ping takes longer is closed as dead.
    #[arg(long, value_parser = parse_duration, default_value = "3s", env = "SIGMA_PING_TIMEOUT")]
    pub(crate) ping_timeout: Duration,
    /// Membership gossip: how often this peer sends its heartbeat table to a few members,
    /// so that peers connected to only some of the swarm know who is alive.
    #[arg(long, value_parser = parse_duration, default_value = "500ms", env = "SIGMA_GOSSIP_INTERVAL")]
    pub(crate) gossip_interval: Duration,
    /// Membership gossip: to how many random alive members per round.
    #[arg(long, value_name = "N", default_value_t = sigma_behaviour::DEFAULT_GOSSIP_FANOUT, env = "SIGMA_GOSSIP_FANOUT")]
    pub(crate) gossip_fanout: usize,
    /// Membership gossip: a member not connected here counts as alive for this long after
    /// its heartbeat last advanced (a cut-off peer stops serving within it, plus 1s).
    #[arg(long, value_parser = parse_duration, default_value = "5s", env = "SIGMA_GOSSIP_LIVENESS")]
    pub(crate) gossip_liveness: Duration,
    /// Most established connections (both directions); past it a new one is refused.
    #[arg(long, value_name = "N", default_value_t = ConnectionBounds::default().max_established, env = "SIGMA_MAX_CONNECTIONS")]
    pub(crate) max_connections: u32,
    /// Most established incoming connections (the rest is kept for this peer's dials).
    #[arg(long, value_name = "N", default_value_t = ConnectionBounds::default().max_established_incoming, env = "SIGMA_MAX_INCOMING")]
    pub(crate) max_incoming: u32,
    /// Most connections to one peer.
    #[arg(long, value_name = "N", default_value_t = ConnectionBounds::default().max_established_per_peer, env = "SIGMA_MAX_CONNECTIONS_PER_PEER")]
    pub(crate) max_connections_per_peer: u32,
    /// Most incoming connections in their handshake at once.
    #[arg(long, value_name = "N", default_value_t = ConnectionBounds::default().max_pending_incoming, env = "SIGMA_MAX_PENDING_INCOMING")]
    pub(crate) max_pending_incoming: u32,
    /// No new connection while the daemon's resident memory is above this many MiB
    /// [default: 80% of the machine's memory].
    #[arg(long, value_name = "MIB", env = "SIGMA_MAX_MEMORY_MB")]
    pub(crate) max_memory_mb: Option<usize>,
    /// A connection no protocol has used for this long is closed.
    #[arg(long, value_parser = parse_duration, default_value = "10s", env = "SIGMA_IDLE_TIMEOUT")]
    pub(crate) idle_timeout: Duration,
    /// Most replicas this peer hosts (all locks); past it a new one is refused.
    #[arg(long, value_name = "N", default_value_t = 100_000, env = "SIGMA_MAX_REPLICAS")]
    pub(crate) max_replicas: usize,
    /// Most replicas one remote peer's requests may have created here.
    #[arg(long, value_name = "N", default_value_t = 50_000, env = "SIGMA_MAX_REPLICAS_PER_PEER")]
    pub(crate) max_replicas_per_peer: usize,
    /// How long an idle replica (no owner, no waiter) is kept after its last release
    /// before it is dropped; with the lock rate and this peer's share of the keys it sets
    /// how many replicas this peer holds.
    #[arg(long, value_parser = parse_duration, default_value = "5s", env = "SIGMA_REPLICA_IDLE_TTL")]
    pub(crate) replica_idle_ttl: Duration,
    /// Test only: holds each protocol message this node sends for a one-way latency drawn
    /// from u:LO,HI | const:MS | exp:MEAN (milliseconds), as the simulator delays its
    /// messages, and batches none (how `sigma-testnet run --message-delay` reproduces the
    /// paper's Fig. 7 on real nodes). Never on a real swarm.
    #[arg(long, value_name = "DIST", hide = true, env = "SIGMA_TEST_MESSAGE_DELAY")]
    pub(crate) test_message_delay: Option<sigma_behaviour::latency::Latency>,
    /// Test only: runs a planted fault of the protocol core in this node's replicas and
    /// clients (grant-over-live-vote, count-lapsed-vote, disposal-forgets-floor), so that
    /// `sigma-testnet run --test-mutant` can show its checker catches it. Breaks mutual
    /// exclusion on purpose: never on a real swarm.
    #[arg(long, value_name = "FAULT", hide = true, value_parser = parse_mutant, env = "SIGMA_TEST_MUTANT")]
    pub(crate) test_mutant: Option<sigma_behaviour::proto::Mutant>,
    /// Most queue entries (owners and waiters of other peers' acquisitions, ~100 bytes
    /// each) in all the replicas this peer hosts; past it a new one is refused.
    #[arg(long, value_name = "N", default_value_t = sigma_behaviour::DEFAULT_MAX_ENTRIES, env = "SIGMA_MAX_QUEUE_ENTRIES")]
    pub(crate) max_queue_entries: usize,
    /// Most queue entries one remote peer's acquisitions may occupy here.
    #[arg(long, value_name = "N", default_value_t = sigma_behaviour::DEFAULT_MAX_ENTRIES_PER_PEER, env = "SIGMA_MAX_QUEUE_ENTRIES_PER_PEER")]
    pub(crate) max_queue_entries_per_peer: usize,
    /// Requests per second one remote peer may send (token bucket, burst twice that).
    #[arg(long, value_name = "N", default_value_t = 20_000, env = "SIGMA_PEER_RATE")]
    pub(crate) peer_rate: u32,
    /// Worker threads of the daemon's async runtime. The hot path is one event-loop
    /// task, so more threads mostly add wake-ups between them (`bench --vs etcd`, 3 and 8
    /// daemons on 2 cores: 6–25% less CPU per lock with 1 than with 2); more may help a
    /// daemon with many busy connections on a machine of its own.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024), env = "SIGMA_WORKER_THREADS")]
    pub(crate) worker_threads: u16,
    /// A peer whose operator may revoke the locks held through this one (`sigma
    /// release NAME --token T` run there); repeatable, or `any` for every peer of the
    /// swarm. Default: none (only this node's own API may).
    #[arg(long, value_name = "PEER_ID|any", value_delimiter = ',', env = "SIGMA_ADMIN_PEERS")]
    pub(crate) admin_peer: Vec<String>,
}

/// The `--admin-peer` list as a policy.
pub(crate) fn admin_policy(list: &[String]) -> anyhow::Result<sigma_behaviour::Admin> {
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
pub(crate) fn membership_policy(args: &RunArgs) -> anyhow::Result<sigma_node::Admission> {
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

/// Default p2p listen address; the API's is 7591 (`http::DEFAULT_API`). Clear of the
/// ports of services often run beside a peer: IPFS 4001, Meilisearch 7700, etcd
/// 2379–2380, ZooKeeper 2181, Consul 8300–8600, Prometheus 9090, node exporter 9100.
/// QUIC (UDP) beside TCP: a connection in one round trip, and no head-of-line blocking
/// between a peer's streams.
pub(crate) const DEFAULT_LISTEN: [&str; 2] = ["/ip4/0.0.0.0/tcp/7590", "/ip4/0.0.0.0/udp/7590/quic-v1"];

/// Takes an exclusive lock on `KEY.lock` beside the key file, held while the returned
/// handle lives: two daemons with one identity would be one peer to the swarm, each
/// dropping the other's connections and replicas.
pub(crate) fn lock_key_file(key: &std::path::Path) -> anyhow::Result<nix::fcntl::Flock<std::fs::File>> {
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

/// The listen address of `--dev`: loopback TCP, a port of the system's choice.
const DEV_LISTEN: &str = "/ip4/127.0.0.1/tcp/0";

pub(crate) async fn run(mut args: RunArgs) -> anyhow::Result<u8> {
    init_tracing_as(args.log_format, "info");
    raise_open_file_limit();
    if args.dev {
        args.ephemeral_key = true;
        args.takeover_delay = Some(Duration::ZERO);
        args.listen = vec![DEV_LISTEN.parse().expect("a valid multiaddr")];
    }
    let mut admission = membership_policy(&args)?;
    if args.dev {
        let key = sigma_node::admission::new_swarm_key().context("no randomness for the --dev swarm key")?;
        admission.swarm_key = Some(key);
        let warning = "development node (--dev): alone on 127.0.0.1, a throwaway identity, no takeover delay. \
                       Not for real use: a restart may grant a lock that a command of the previous run still holds";
        eprintln!("WARNING: {warning}");
        tracing::warn!("{warning}");
    }
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
    if let Some(mutant) = args.test_mutant {
        tracing::warn!(?mutant, "test-only planted fault in the protocol core: mutual exclusion is broken on purpose");
        proto = proto.with_mutant(mutant);
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
    // node's event loop from the swarm's events, ours (sigma_), the build and the
    // process (process_).
    let mut registry = Registry::default();
    let libp2p_metrics = sigma_node::Libp2pMetrics(Arc::new(libp2p::metrics::Metrics::new(&mut registry)));
    let metrics = Metrics::register(&mut registry);
    sigma_daemon::metrics::register(&mut registry);
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
        name: args.name,
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
pub(crate) fn raise_open_file_limit() {
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

/// `--test-mutant`'s names of the core's planted faults.
fn parse_mutant(s: &str) -> Result<sigma_behaviour::proto::Mutant, String> {
    use sigma_behaviour::proto::Mutant;
    match s {
        "grant-over-live-vote" => Ok(Mutant::GrantOverLiveVote),
        "count-lapsed-vote" => Ok(Mutant::CountLapsedVote),
        "disposal-forgets-floor" => Ok(Mutant::DisposalForgetsFloor),
        _ => Err(format!("{s:?}: grant-over-live-vote, count-lapsed-vote or disposal-forgets-floor")),
    }
}
