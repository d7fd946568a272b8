//! The behaviour's configuration: [`Config`] with its builder methods, [`Admin`],
//! [`BootClock`] (the clock leases are counted on) and the defaults (`DEFAULT_*`).
//! Setters clamp what could not work (intervals to at least 10 ms, counts to at least
//! 1); the delays derived from several settings ([`Config::liveness_timeout`],
//! [`Config::takeover_delay`]) are computed here.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libp2p::PeerId;

use crate::proto;

// Up to the parent for documentation links only.
#[cfg(doc)]
use super::Behaviour;
#[cfg(doc)]
use crate::wire;

/// Configuration of the behaviour.
#[derive(Clone, Debug)]
pub struct Config {
    pub(super) proto: proto::Config,
    pub(super) request_timeout: Duration,
    pub(super) max_redirects: u8,
    pub(super) finished_memory: usize,
    pub(super) max_concurrent_streams: usize,
    pub(super) boot_clock: BootClock,
    pub(super) joining: bool,
    pub(super) members: Option<HashSet<PeerId>>,
    pub(super) external_address_required: bool,
    pub(super) min_voters: Option<usize>,
    pub(super) membership_window: Duration,
    takeover_delay: Option<Duration>,
    pub(super) ping_interval: Duration,
    pub(super) ping_timeout: Duration,
    pub(super) max_replicas: usize,
    pub(super) max_replicas_per_peer: usize,
    pub(super) max_entries: usize,
    pub(super) max_entries_per_peer: usize,
    pub(super) peer_rate: (u32, u32),
    pub(super) admin: Admin,
    pub(super) ownership_ttl: Duration,
    pub(super) idle_hosts_ttl: Duration,
    pub(super) ownership_timeout: Duration,
    pub(super) gossip_interval: Duration,
    pub(super) gossip_fanout: usize,
    pub(super) gossip_liveness: Duration,
    pub(super) connection_watermarks: Option<(usize, usize)>,
    pub(super) message_delay: Option<crate::latency::Latency>,
}

/// Which remote peers may revoke a lock held through this peer ([`wire::Request::Revoke`]).
/// The local application always may ([`Behaviour::revoke`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Admin {
    /// No remote peer (the default: in an open swarm, any peer could break any lock).
    #[default]
    Nobody,
    /// These peers (an operator's own nodes).
    Peers(HashSet<PeerId>),
    /// Any peer of the swarm (a swarm whose every peer is trusted, such as a testnet).
    Any,
}

impl Admin {
    /// Whether `peer` may revoke.
    pub fn allows(&self, peer: &PeerId) -> bool {
        match self {
            Admin::Nobody => false,
            Admin::Peers(set) => set.contains(peer),
            Admin::Any => true,
        }
    }
}

/// Default cap on queue entries of remote peers' acquisitions in all hosted replicas
/// (about 100 bytes each: ~200 MB at most).
pub const DEFAULT_MAX_ENTRIES: usize = 2_000_000;
/// Default cap per remote peer: 10,000 held or awaited locks of one gateway peer in a
/// 3-peer swarm (about 11 replicas each per host) fit twice over.
pub const DEFAULT_MAX_ENTRIES_PER_PEER: usize = 200_000;

/// Default membership window: a departed peer still counts toward the majority a
/// serving peer must reach for this long.
pub const DEFAULT_MEMBERSHIP_WINDOW: Duration = Duration::from_secs(600);
/// Default interval between liveness pings on each connection.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(1);
/// Default time a ping may take before its connection is closed as dead.
pub const DEFAULT_PING_TIMEOUT: Duration = Duration::from_secs(3);

/// The source of time since boot (suspends included) that leases are counted on.
/// The default reads `CLOCK_BOOTTIME`; tests substitute a clock that jumps, as a
/// suspended machine's does when it resumes.
#[derive(Clone)]
pub struct BootClock(Arc<dyn Fn() -> Duration + Send + Sync>);

impl BootClock {
    /// A clock read by `f` (monotonic, never going back).
    pub fn new(f: impl Fn() -> Duration + Send + Sync + 'static) -> Self {
        BootClock(Arc::new(f))
    }
    pub(super) fn read(&self) -> Duration {
        (self.0)()
    }
}

impl Default for BootClock {
    fn default() -> Self {
        BootClock::new(boottime)
    }
}

impl std::fmt::Debug for BootClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BootClock")
    }
}

/// Default bound on a connection's inbound requests awaiting this peer's replies (the
/// transport, `link.rs`, reads no more of the peer's stream past it). The name stays
/// from request-response, where it bounded the streams per connection (yamux's own
/// limit; libp2p's default, 100, dropped inbound requests by the thousand when a paused
/// peer came back to a backlog of retries).
pub const DEFAULT_MAX_CONCURRENT_STREAMS: usize = 512;
/// How often a hosted key's ownership is looked up again while its replica lives: a
/// second host that neither knew of the other serves for at most this long.
pub const DEFAULT_OWNERSHIP_TTL: Duration = Duration::from_secs(30);

/// How often Kademlia refreshes every bucket (its periodic bootstrap; kad's default is
/// 5 minutes).
pub const KAD_REFRESH: Duration = Duration::from_secs(30 * 60);
/// How often a peer gossips its heartbeat table.
pub const DEFAULT_GOSSIP_INTERVAL: Duration = Duration::from_millis(500);
/// To how many random alive members per round.
pub const DEFAULT_GOSSIP_FANOUT: usize = 2;
/// How long a member heard of through gossip stays alive after its heartbeat last
/// advanced: several gossip rounds, so that a swarm of hundreds does not flap.
pub const DEFAULT_GOSSIP_LIVENESS: Duration = Duration::from_secs(5);

/// How long the hosts of a lock stay cached after its last local acquisition ended (the
/// next acquisition of a busy lock goes straight to them instead of a redirect per
/// replica), and how many such idle replica slots are kept at most (the oldest lock's
/// go first).
pub const DEFAULT_IDLE_HOSTS_TTL: Duration = Duration::from_secs(30);
pub(super) const MAX_IDLE_HOSTS: usize = 8192;

/// A connection used (a request or gossip sent or received) this recently is never
/// trimmed.
pub const TRIM_GRACE: Duration = Duration::from_secs(2);
/// How long an ownership lookup may run before it is decided on what it has heard.
pub const DEFAULT_OWNERSHIP_TIMEOUT: Duration = Duration::from_secs(2);

/// Timers sleep on the monotonic clock, which stops during a suspend: the behaviour
/// wakes at least this often, so a lease that ran out while the machine slept is noticed
/// within this time of resuming.
pub(super) const MAX_TIMER: Duration = Duration::from_secs(1);

impl Default for Config {
    fn default() -> Self {
        Config {
            proto: proto::Config::default(),
            request_timeout: Duration::from_secs(5),
            max_redirects: 3,
            finished_memory: 4096,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            boot_clock: BootClock::default(),
            joining: false,
            members: None,
            external_address_required: false,
            min_voters: None,
            membership_window: DEFAULT_MEMBERSHIP_WINDOW,
            takeover_delay: None,
            ping_interval: DEFAULT_PING_INTERVAL,
            ping_timeout: DEFAULT_PING_TIMEOUT,
            max_replicas: 100_000,
            max_replicas_per_peer: 50_000,
            max_entries: DEFAULT_MAX_ENTRIES,
            max_entries_per_peer: DEFAULT_MAX_ENTRIES_PER_PEER,
            peer_rate: (20_000, 40_000),
            admin: Admin::Nobody,
            ownership_ttl: DEFAULT_OWNERSHIP_TTL,
            idle_hosts_ttl: DEFAULT_IDLE_HOSTS_TTL,
            ownership_timeout: DEFAULT_OWNERSHIP_TIMEOUT,
            gossip_interval: DEFAULT_GOSSIP_INTERVAL,
            gossip_fanout: DEFAULT_GOSSIP_FANOUT,
            gossip_liveness: DEFAULT_GOSSIP_LIVENESS,
            connection_watermarks: None,
            message_delay: None,
        }
    }
}

impl Config {
    /// Protocol parameters (n, m, lease, …); n and m are the default quorum.
    pub fn with_protocol(mut self, proto: proto::Config) -> Self {
        self.proto = proto;
        self
    }
    /// Timeout of one request (its reply is due within it).
    pub fn with_request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }
    /// Bound on the inbound requests awaiting this peer's replies per connection;
    /// beyond it the peer's stream is not read until replies go (its requests wait in
    /// the stream's window; a sender kept waiting past its timeout retries).
    pub fn with_max_concurrent_streams(mut self, n: usize) -> Self {
        self.max_concurrent_streams = n.max(1);
        self
    }
    /// The clock leases are counted on (default: time since boot, suspends included).
    pub fn with_boot_clock(mut self, clock: BootClock) -> Self {
        self.boot_clock = clock;
        self
    }
    /// This peer was given bootstrap peers: it hosts nothing and starts no acquisition
    /// until a Kademlia bootstrap has completed with a sigma peer connected and it has
    /// heard from a peer that serves (it joins through that peer). Without this, the
    /// peer is a one-node swarm until others join it.
    pub fn with_joining(mut self, joining: bool) -> Self {
        self.joining = joining;
        self
    }
    /// The swarm's members are these peers (an allow-list every peer shares): a peer
    /// serves while it reaches a strict majority of them, itself included, and no
    /// other peer counts; a joining peer needs no serving peer to join through.
    /// Default: none, members are the peers that have been alive here while it had a
    /// majority (docs/design/membership.md).
    pub fn with_members(mut self, peers: Option<HashSet<PeerId>>) -> Self {
        self.members = peers;
        self
    }
    /// Host replicas only while the swarm has a confirmed external address (one that
    /// other peers can dial: `Swarm::add_external_address`, or confirmed by AutoNAT).
    /// Without one the peer is [`Readiness::Unreachable`](crate::Readiness): Kademlia in
    /// client mode (no peer puts it in its routing table), no gossip, no replica, and
    /// never its own host; its acquisitions go to the others. Default: off (every peer
    /// hosts, Kademlia in server mode), for swarms where every listen address is
    /// dialable (loopback, one LAN). Whatever this says, the addresses a peer keeps of
    /// others are those at least as wide as its own external ones ([`crate::addr`]).
    pub fn with_external_address_required(mut self, required: bool) -> Self {
        self.external_address_required = required;
        self
    }
    /// Quorum diversity D: a win needs votes hosted by at least D distinct peers
    /// (capped at m). Default: 2 once this peer has known another sigma peer, 1 in a
    /// one-node swarm, so that a peer cut off from its swarm cannot win alone.
    pub fn with_min_voters(mut self, d: Option<usize>) -> Self {
        self.min_voters = d;
        self
    }
    /// How long a departed peer still counts toward the majority (see
    /// [`DEFAULT_MEMBERSHIP_WINDOW`]).
    pub fn with_membership_window(mut self, d: Duration) -> Self {
        self.membership_window = d;
        self
    }
    /// The takeover delay; `None` (default) is [`Config::takeover_delay`]'s formula.
    pub fn with_takeover_delay(mut self, d: Option<Duration>) -> Self {
        self.takeover_delay = d;
        self
    }
    /// Liveness pings: interval, and how long one may take before the connection is
    /// closed as dead.
    pub fn with_ping(mut self, interval: Duration, timeout: Duration) -> Self {
        self.ping_interval = interval.max(Duration::from_millis(10));
        self.ping_timeout = timeout.max(Duration::from_millis(10));
        self
    }
    /// What a remote peer may cost: replicas hosted here at most (all peers together;
    /// default 100,000), replicas one remote peer's requests may have created and still
    /// hosted (default 10,000), and requests per second from one peer with a burst
    /// (token bucket; default 20,000/s, burst 40,000). Past them a request is refused
    /// (`Rejection::TooManyReplicas`, `PeerQuota`, `RateLimited`) and counted.
    pub fn with_limits(mut self, max_replicas: usize, max_replicas_per_peer: usize, peer_rate: (u32, u32)) -> Self {
        self.max_replicas = max_replicas;
        self.max_replicas_per_peer = max_replicas_per_peer;
        self.peer_rate = (peer_rate.0.max(1), peer_rate.1.max(1));
        self
    }
    /// Which remote peers may revoke locks held through this peer (default none).
    pub fn with_admin(mut self, admin: Admin) -> Self {
        self.admin = admin;
        self
    }
    /// Queue entries (owners and waiters of remote peers' acquisitions) in all the
    /// hosted replicas, and per remote peer (defaults [`DEFAULT_MAX_ENTRIES`],
    /// [`DEFAULT_MAX_ENTRIES_PER_PEER`]). A REQUEST that would add one past either is
    /// refused (`Rejection::QueueQuota`) and counted; an acquisition already queued is
    /// always served (renewals, retries).
    pub fn with_entry_limits(mut self, max_entries: usize, max_entries_per_peer: usize) -> Self {
        self.max_entries = max_entries;
        self.max_entries_per_peer = max_entries_per_peer;
        self
    }
    /// How long the hosts of a lock stay cached after its last local acquisition ended
    /// ([`DEFAULT_IDLE_HOSTS_TTL`]; at most 8,192 such entries, the oldest go first).
    pub fn with_idle_hosts_ttl(mut self, ttl: Duration) -> Self {
        self.idle_hosts_ttl = ttl;
        self
    }
    /// Ownership checks (ARCHITECTURE.md, "One host per key"): a key this peer would
    /// host is served only after a Kademlia lookup found no closer peer, and looked up
    /// again every `ttl` while its replica lives here (default
    /// [`DEFAULT_OWNERSHIP_TTL`]); a lookup still running after `timeout` (default
    /// [`DEFAULT_OWNERSHIP_TIMEOUT`]) is decided on the peers it has heard from.
    pub fn with_ownership(mut self, ttl: Duration, timeout: Duration) -> Self {
        self.ownership_ttl = ttl.max(Duration::from_millis(10));
        self.ownership_timeout = timeout.max(Duration::from_millis(10));
        self
    }
    /// Membership gossip (ARCHITECTURE.md, "Membership gossip"): every `interval` this
    /// peer sends its heartbeat table to `fanout` random alive members; a member heard of
    /// through gossip stays alive `liveness` after its heartbeat last advanced.
    pub fn with_gossip(mut self, interval: Duration, fanout: usize, liveness: Duration) -> Self {
        self.gossip_interval = interval.max(Duration::from_millis(10));
        self.gossip_fanout = fanout.max(1);
        self.gossip_liveness = liveness.max(self.gossip_interval);
        self
    }
    /// Connection trimming (ARCHITECTURE.md, "Connections"): past `high` connected
    /// peers, the least recently used ones (none used within [`TRIM_GRACE`]) are closed
    /// until `low` remain, so that the connection limit keeps room for the dials that
    /// the protocol needs (a limit alone refuses new connections and never frees old
    /// ones). Off by default; the node sets it from its connection limits.
    pub fn with_connection_watermarks(mut self, high: usize, low: usize) -> Self {
        let high = high.max(1);
        self.connection_watermarks = Some((high, low.min(high)));
        self
    }
    /// The connection-trimming watermarks, if set.
    pub fn connection_watermarks(&self) -> Option<(usize, usize)> {
        self.connection_watermarks
    }
    /// How long a dead or cut-off peer can go unnoticed, and a cut-off peer can go on
    /// believing it reaches a majority: one ping interval plus its timeout for a
    /// connected member, the gossip liveness window plus one second of housekeeping for
    /// one heard of through gossip; the longer of the two.
    pub fn liveness_timeout(&self) -> Duration {
        (self.ping_interval + self.ping_timeout).max(self.gossip_liveness + MAX_TIMER)
    }
    /// The takeover delay: a replica this peer starts while its previous host may have
    /// granted it grants nothing for this long. Default: the lease stretched by the
    /// clock-drift bound (a vote the previous host granted has run out by then on every
    /// clock), plus the liveness timeout (the previous host, cut off, may go on granting
    /// until it notices it is in a minority), plus the 1 s wake-up.
    pub fn takeover_delay(&self) -> Duration {
        self.takeover_delay.unwrap_or_else(|| {
            let lease = self.proto.lease();
            let drift = lease.mul_f64(f64::from(self.proto.max_drift_ppm()) / 1e6);
            lease + drift + self.liveness_timeout() + MAX_TIMER
        })
    }
    /// Protocol parameters.
    pub fn protocol(&self) -> &proto::Config {
        &self.proto
    }
    /// Test only: holds every protocol message this peer sends for a latency drawn
    /// from `latency` (see `outbox.rs`); `None` (the default) sends at once.
    pub fn with_message_delay(mut self, latency: Option<crate::latency::Latency>) -> Self {
        self.message_delay = latency;
        self
    }
}

/// Time since boot, suspends included.
#[cfg(target_os = "linux")]
fn boottime() -> Duration {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) {
        Ok(ts) => Duration::new(u64::try_from(ts.tv_sec()).unwrap_or(0), u32::try_from(ts.tv_nsec()).unwrap_or(0)),
        Err(_) => monotonic(),
    }
}

/// Elsewhere, the monotonic clock (it may stop during a suspend).
#[cfg(not(target_os = "linux"))]
fn boottime() -> Duration {
    monotonic()
}

fn monotonic() -> Duration {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}
