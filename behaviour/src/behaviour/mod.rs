//! `sigma::Behaviour`: the Sigma protocol inside a Kademlia DHT.
//!
//! Thin glue around the sans-IO core ([`crate::proto`]): it composes
//! `kad::Behaviour` (replica placement) with `request_response::cbor::Behaviour`
//! (the wire, [`crate::wire`]), maps libp2p ids and events to core inputs, drives one
//! timer from the core's next deadline, and turns core outputs into requests and
//! replies.
//!
//! Replica `i` of resource `R` is named `"R:i"` and hosted by the peer XOR-closest to
//! the SHA-256 of that name (`kad::KBucketKey`). A peer serves a replica only while no
//! *connected* peer is closer to its key (otherwise it answers with a redirect), and
//! only after a Kademlia lookup of the key found no closer peer either, looked up again
//! every [`DEFAULT_OWNERSHIP_TTL`](config::DEFAULT_OWNERSHIP_TTL) while it hosts the key: two peers that do not know
//! each other do not both serve one key. A peer that becomes closest starts with empty
//! state for the key — the paper's replica reset, arising from churn by itself — and
//! informed backoff rebuilds the queue.
//!
//! Clients resolve a replica's host from their routing table (self included), cache
//! it, and correct it on a redirect or, after a failed dial, with a Kademlia
//! `get_closest_peers` lookup. Replicas hosted by the local peer take no network hop.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use libp2p::core::transport::PortUse;
use libp2p::core::Endpoint;
use libp2p::kad::{self, store::MemoryStore, KBucketKey};
use libp2p::ping;
use libp2p::request_response::{self, OutboundRequestId, ProtocolSupport};
use libp2p::swarm::{
    CloseConnection, ConnectionDenied, ConnectionId, FromSwarm, NetworkBehaviour, THandler, THandlerInEvent,
    THandlerOutEvent, ToSwarm,
};
use libp2p::{Multiaddr, PeerId};
use tokio::time::Sleep;

use crate::membership::{Membership, Readiness};
use crate::proto::{self, client::Phase, Client, LamportClock, Replica, Response, Time, Timestamp, ToReplica};
use crate::wire::{self, Rejection, Reply, Request};

mod config;

use config::MAX_IDLE_HOSTS;
pub use config::{
    Admin, BootClock, Config, DEFAULT_GOSSIP_FANOUT, DEFAULT_GOSSIP_INTERVAL, DEFAULT_GOSSIP_LIVENESS,
    DEFAULT_IDLE_HOSTS_TTL, DEFAULT_MAX_CONCURRENT_STREAMS, DEFAULT_MAX_ENTRIES, DEFAULT_MAX_ENTRIES_PER_PEER,
    DEFAULT_MEMBERSHIP_WINDOW, DEFAULT_PING_INTERVAL, DEFAULT_PING_TIMEOUT, KAD_REFRESH, TRIM_GRACE,
};

mod types;

pub use types::{
    AcquireError, AcquisitionId, AcquisitionInfo, Counters, Event, ProbeId, ReplicaAnswer, ReplicaInfo, ReplicaTotals,
    StateSizes,
};

mod host;
mod placement;
mod util;

use host::{EntryShape, InboundBatch};
#[cfg(doc)]
use placement::MAX_OWNERSHIP_CHECKS;
use placement::{Neighbourhood, Ownership, Parked, ReplyTo};
use util::{shrink_if_sparse, Clock, DeadlineIndex};

/// Confirmed external addresses tracked at most.
const MAX_EXTERNALS: usize = 32;
/// Every this many gossip rounds, one target is a member that is not connected.
const GOSSIP_MIXING: u64 = 4;

/// A fan-out to the hosts of a lock's replicas, or one question to one peer.
struct Probe {
    started: Instant,
    kind: ProbeKind,
    outstanding: usize,
}

enum ProbeKind {
    /// Round trips, by replica index.
    Ping(Vec<Option<Duration>>),
    /// Replica states, by replica index.
    Inspect(Vec<ReplicaAnswer>),
    /// One request to one peer.
    Ask,
}

/// The inner behaviours, composed by the derive macro.
#[derive(NetworkBehaviour)]
#[behaviour(to_swarm = "InnerEvent")]
pub struct Inner {
    /// Replica placement.
    pub kad: kad::Behaviour<MemoryStore>,
    /// The sigma wire.
    pub rr: request_response::Behaviour<wire::Codec>,
    /// Liveness: a connection whose ping fails is closed.
    pub ping: ping::Behaviour,
    /// Membership gossip: heartbeats.
    pub gossip: request_response::Behaviour<request_response::cbor::codec::Codec<wire::Gossip, wire::Gossip>>,
}

/// Events of [`Inner`].
#[derive(Debug)]
pub enum InnerEvent {
    /// From Kademlia.
    Kad(kad::Event),
    /// From request-response.
    Rr(request_response::Event<Request, Reply>),
    /// From ping.
    Ping(ping::Event),
    /// From the membership gossip.
    Gossip(request_response::Event<wire::Gossip, wire::Gossip>),
}

impl From<request_response::Event<wire::Gossip, wire::Gossip>> for InnerEvent {
    fn from(e: request_response::Event<wire::Gossip, wire::Gossip>) -> Self {
        InnerEvent::Gossip(e)
    }
}

impl From<ping::Event> for InnerEvent {
    fn from(e: ping::Event) -> Self {
        InnerEvent::Ping(e)
    }
}

impl From<kad::Event> for InnerEvent {
    fn from(e: kad::Event) -> Self {
        InnerEvent::Kad(e)
    }
}

impl From<request_response::Event<Request, Reply>> for InnerEvent {
    fn from(e: request_response::Event<Request, Reply>) -> Self {
        InnerEvent::Rr(e)
    }
}

struct Acquisition {
    resource: String,
    n: u16,
    client: Client<PeerId>,
    /// Started while this peer was joining: nothing sent yet; started afresh (same
    /// timestamp) once it is ready.
    deferred: Option<proto::Config>,
    /// D was the default (not named by the caller): lowered to 1 if the lock's keys come
    /// to fall on one alive peer (see [`Behaviour::relax_diversity`]).
    default_d: bool,
}

/// An outbound request, kept for redirects and failures.
/// What a transport request carried: one message, or a batch (an entry per item;
/// `None` for a notice, which expects nothing but an acknowledgement).
#[derive(Debug)]
enum Sent {
    One(Pending),
    Batch(Vec<Option<Pending>>),
}

#[derive(Debug)]
struct Pending {
    peer: PeerId,
    resource: String,
    index: u16,
    n: u16,
    /// The client message, or `None` for a probe.
    msg: Option<ToReplica<PeerId>>,
    probe: Option<ProbeId>,
    hops: u8,
}

/// How often departed members are dialled again, and how many at a time (picked at
/// random): a healed partition reconnects without waiting for traffic, and a swarm
/// under churn, where most departed members are dead for good, spends at most two
/// dials a second on them.
const REDIAL_INTERVAL: Duration = Duration::from_secs(2);
const REDIAL_BATCH: usize = 4;
/// How often waiters short of distinct voters are looked at ([`Behaviour::relax_diversity`]).
const RELAX_INTERVAL: Duration = Duration::from_secs(1);

/// Timers sleep on the monotonic clock, which stops during a suspend: the behaviour
/// wakes at least this often, so a lease that ran out while the machine slept is noticed
/// within this time of resuming.
const MAX_TIMER: Duration = Duration::from_secs(1);

/// The Sigma network behaviour.
pub struct Behaviour {
    inner: Inner,
    local: PeerId,
    local_key: KBucketKey<PeerId>,
    config: Config,
    clock: Clock,
    lamport: LamportClock,
    /// Peers with at least one open connection: the "live" peers of ownership checks.
    connected: HashMap<PeerId, usize>,
    /// Peers Kademlia put in its routing table (client-side host estimates).
    routable: HashSet<PeerId>,
    /// The swarm's confirmed external addresses (at most [`MAX_EXTERNALS`]).
    externals: Vec<Multiaddr>,
    /// When each connected peer was last used by sigma (connection trimming).
    last_used: HashMap<PeerId, Time>,
    /// Peers whose connections are to be closed (trimmed), and those asked to close
    /// and not yet disconnected (a subset of the connected peers).
    to_trim: VecDeque<PeerId>,
    trimming: HashSet<PeerId>,
    /// Past the high watermark: trimming goes on until the low one is reached, even
    /// when a pass found fewer idle peers than it needed.
    trim_active: bool,
    /// Gossip rounds so far (every few, one target is a member not connected).
    gossip_rounds: u64,
    /// Addresses of peers left out of a full k-bucket, oldest first
    /// ([`Behaviour::remember_address`]).
    extra_addrs: HashMap<PeerId, Vec<Multiaddr>>,
    extra_order: VecDeque<PeerId>,
    /// The last bootstrap started through [`Behaviour::bootstrap`].
    bootstrap_query: Option<kad::QueryId>,
    replicas: HashMap<(String, u16), Replica<PeerId>>,
    /// When each hosted replica next has work (a timer, or becoming disposable): an
    /// event costs O(log n), not a walk over every replica.
    replica_due: DeadlineIndex<(String, u16)>,
    acquisitions: HashMap<AcquisitionId, Acquisition>,
    /// The same for the acquisitions' timers.
    acquisition_due: DeadlineIndex<AcquisitionId>,
    by_ts: HashMap<Timestamp<PeerId>, AcquisitionId>,
    /// Recently finished acquisitions, their lock name and replica count: a late grant
    /// to one of them is handed back with a RELEASE.
    finished: HashMap<Timestamp<PeerId>, (String, u16)>,
    finished_order: VecDeque<Timestamp<PeerId>>,
    /// Host of each replica as last known, for locks with a live local acquisition, and
    /// for a while after ([`Config::with_idle_hosts_ttl`], at most [`MAX_IDLE_HOSTS`] idle
    /// entries).
    hosts: HashMap<(String, u16), PeerId>,
    /// Expiry of the cached hosts of locks without a live local acquisition.
    idle_hosts: DeadlineIndex<(String, u16)>,
    /// Live local acquisitions per lock name.
    live_locks: HashMap<String, usize>,
    /// Which remote peer's request created each hosted replica, and how many each has.
    creators: HashMap<(String, u16), PeerId>,
    created_by: HashMap<PeerId, usize>,
    /// The remote peers present (owner or waiter, with multiplicity) in each hosted
    /// replica as last counted, and their entries in all: the queue-entry quotas.
    entries: HashMap<(String, u16), (EntryShape, Vec<PeerId>)>,
    entries_by: HashMap<PeerId, usize>,
    entries_total: usize,
    /// Request budget per connected peer: (tokens, last refill).
    buckets: HashMap<PeerId, (f64, Time)>,
    pending: HashMap<OutboundRequestId, Sent>,
    /// Messages for other peers from the current step, sent (one transport request per
    /// peer, batched) before the behaviour next waits: drained on every poll.
    outbox: HashMap<PeerId, Vec<(Request, Option<Pending>)>>,
    outbox_order: Vec<PeerId>,
    /// Inbound batches waiting for some items' ownership lookups: bounded by the
    /// lookups and the requests each may park.
    inbound_batches: HashMap<u64, InboundBatch>,
    next_batch: u64,
    lookups: HashMap<kad::QueryId, (String, u16)>,
    /// Keys this peer would host, checked (or being checked) with a Kademlia lookup;
    /// bounded by the hosted replicas plus [`MAX_OWNERSHIP_CHECKS`].
    ownership: HashMap<(String, u16), Ownership>,
    /// When each entry next needs work: a running lookup's deadline, a recheck.
    ownership_due: DeadlineIndex<(String, u16)>,
    /// The peers closest to this one as the last self-lookup found them: a key much
    /// closer to this peer than they are needs no lookup of its own.
    neighbourhood: Option<Neighbourhood>,
    /// The self-lookup running for it.
    neighbourhood_query: Option<kad::QueryId>,
    /// The ownership lookups in flight.
    checks: HashMap<kad::QueryId, (String, u16)>,
    probes: HashMap<ProbeId, Probe>,
    events: VecDeque<Event>,
    timer: Option<(Time, Pin<Box<Sleep>>)>,
    waker: Option<Waker>,
    counters: Counters,
    membership: Membership,
    /// Connections whose liveness ping failed, to close.
    to_close: VecDeque<(PeerId, ConnectionId)>,
    /// Departed members to dial again (a healed partition reconnects by itself).
    to_dial: VecDeque<PeerId>,
    next_redial: Time,
    next_relax: Time,
    /// When the next gossip round is due.
    next_gossip: Time,
    /// Picks gossip targets (seeded from the peer id and the start time).
    rng: rand_chacha::ChaCha8Rng,
    /// Acquisitions started while joining (their start is deferred) since last ready.
    deferred: usize,
    /// Frames the codec refused (shared with every connection's codec).
    codec_stats: Arc<wire::CodecStats>,
    next_id: u64,
}

impl Behaviour {
    /// A behaviour for `local`, with Kademlia in server mode (set explicitly: on
    /// loopback there is no confirmed external address, and in client mode the routing
    /// tables of a local swarm stay empty).
    pub fn new(local: PeerId, config: Config) -> Self {
        // Our own Kademlia protocol: sigma peers form their own DHT and never join another
        // network's by accident.
        let mut kad_config = kad::Config::new(kad_protocol(config.proto.n()));
        // Peers enter the routing table through `add_address` only, and not when their
        // bucket is full: Kademlia's own insertion then dials the bucket's least recently
        // seen disconnected peer to test it, and with bounded connections most entries
        // are disconnected, so every new connection set off another dial (a chain
        // reaction of ~20 dials per peer per second in a 100-peer swarm at 64
        // connections). A full bucket keeps its old peers, as in Kademlia; a dead one
        // leaves it when a lookup fails to reach it.
        kad_config.set_kbucket_inserts(kad::BucketInserts::Manual);
        // Kademlia's own bucket refresh (a bootstrap: one lookup per bucket, ~370
        // requests in a 300-peer swarm) every 30 minutes instead of 5: the drivers' own
        // self-lookups (every 5 minutes once joined) keep the neighbourhood fresh, and the
        // lookups of placement fill the far buckets. Every 5 minutes it was most of a
        // large swarm's traffic (ARCHITECTURE.md, "Bounded connections").
        kad_config.set_periodic_bootstrap_interval(Some(KAD_REFRESH));
        let mut kad = kad::Behaviour::with_config(local, MemoryStore::new(local), kad_config);
        // With an external address required, Kademlia's own rule: server mode while the
        // swarm has a confirmed external address, client mode (not in other peers'
        // routing tables) without.
        kad.set_mode((!config.external_address_required).then_some(kad::Mode::Server));
        let codec_stats = Arc::new(wire::CodecStats::default());
        let rr = request_response::Behaviour::with_codec(
            wire::Codec::new(codec_stats.clone()),
            [(wire::PROTOCOL, ProtocolSupport::Full)],
            request_response::Config::default()
                .with_request_timeout(config.request_timeout)
                .with_max_concurrent_streams(config.max_concurrent_streams),
        );
        let ping = ping::Behaviour::new(
            ping::Config::new().with_interval(config.ping_interval).with_timeout(config.ping_timeout),
        );
        let gossip = request_response::Behaviour::with_codec(
            request_response::cbor::codec::Codec::default()
                .set_request_size_maximum(wire::MAX_GOSSIP_BYTES)
                .set_response_size_maximum(wire::MAX_GOSSIP_BYTES),
            [(wire::GOSSIP_PROTOCOL, ProtocolSupport::Full)],
            request_response::Config::default().with_request_timeout(config.gossip_liveness),
        );
        // A stall is what other peers may take for death: the shorter of the two ways.
        let stall = (config.ping_interval + config.ping_timeout).min(config.gossip_liveness);
        // The incarnation: a restarted peer's heartbeats must rank above its old ones.
        let incarnation = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_millis() as u64).max(1);
        let mut membership = Membership::new(config.joining, config.membership_window, config.takeover_delay(), stall)
            .with_gossip(config.gossip_liveness, incarnation);
        membership.set_dialable(!config.external_address_required);
        let clock = Clock::new(config.boot_clock.clone());
        Behaviour {
            inner: Inner { kad, rr, ping, gossip },
            local,
            local_key: KBucketKey::from(local),
            config,
            clock,
            lamport: LamportClock::new(),
            connected: HashMap::new(),
            routable: HashSet::new(),
            externals: Vec::new(),
            last_used: HashMap::new(),
            to_trim: VecDeque::new(),
            trimming: HashSet::new(),
            trim_active: false,
            gossip_rounds: 0,
            bootstrap_query: None,
            extra_addrs: HashMap::new(),
            extra_order: VecDeque::new(),
            replicas: HashMap::new(),
            replica_due: DeadlineIndex::default(),
            acquisitions: HashMap::new(),
            acquisition_due: DeadlineIndex::default(),
            by_ts: HashMap::new(),
            finished: HashMap::new(),
            finished_order: VecDeque::new(),
            hosts: HashMap::new(),
            idle_hosts: DeadlineIndex::default(),
            live_locks: HashMap::new(),
            creators: HashMap::new(),
            created_by: HashMap::new(),
            entries: HashMap::new(),
            entries_by: HashMap::new(),
            entries_total: 0,
            buckets: HashMap::new(),
            pending: HashMap::new(),
            outbox: HashMap::new(),
            outbox_order: Vec::new(),
            inbound_batches: HashMap::new(),
            next_batch: 0,
            lookups: HashMap::new(),
            ownership: HashMap::new(),
            ownership_due: DeadlineIndex::default(),
            neighbourhood: None,
            neighbourhood_query: None,
            checks: HashMap::new(),
            probes: HashMap::new(),
            events: VecDeque::new(),
            timer: None,
            waker: None,
            counters: Counters::default(),
            membership,
            to_close: VecDeque::new(),
            to_dial: VecDeque::new(),
            next_redial: Duration::ZERO,
            next_relax: Duration::ZERO,
            next_gossip: Duration::ZERO,
            rng: {
                use rand::SeedableRng;
                let mut seed = [0u8; 32];
                for (i, b) in local.to_bytes().iter().rev().chain(incarnation.to_le_bytes().iter()).enumerate() {
                    seed[i % 32] ^= *b;
                }
                rand_chacha::ChaCha8Rng::from_seed(seed)
            },
            deferred: 0,
            codec_stats,
            next_id: 0,
        }
    }

    /// The local peer id.
    pub fn local_peer_id(&self) -> PeerId {
        self.local
    }

    /// Kademlia, for bootstrapping and inspection.
    pub fn kad_mut(&mut self) -> &mut kad::Behaviour<MemoryStore> {
        &mut self.inner.kad
    }

    /// Counters for metrics (a snapshot).
    pub fn counters(&self) -> Counters {
        let mut c = self.counters.clone();
        c.stalls = self.membership.stalls();
        c.serving = self.membership.serving();
        c.joining = !self.membership.ready();
        (c.reachable_members, c.members) = self.members();
        for (kind, n) in [("malformed", &self.codec_stats.malformed), ("oversized", &self.codec_stats.oversized)] {
            let n = n.load(Ordering::Relaxed);
            if n > 0 {
                *c.inbound_failures.entry(kind).or_default() += n;
            }
        }
        c
    }

    /// Sizes of the per-lock and per-peer state.
    pub fn state_sizes(&self) -> StateSizes {
        StateSizes {
            replicas: self.replicas.len(),
            acquisitions: self.acquisitions.len(),
            hosts: self.hosts.len(),
            finished: self.finished.len(),
            pending: self.pending.len(),
            lookups: self.lookups.len(),
            entries: self.entries_total,
            ownership: self.ownership.len(),
        }
    }

    /// Starts acquiring `resource` with the configured quorum, or `(n, m)`: n must be
    /// the swarm's (replicas are shared by every client of a lock, so a client on fewer
    /// replicas could win beside one on more) and m at least the swarm's.
    pub fn acquire(&mut self, resource: &str, quorum: Option<(usize, usize)>) -> Result<AcquisitionId, AcquireError> {
        self.acquire_with(resource, quorum, None)
    }

    /// [`Behaviour::acquire`] with a per-lock quorum diversity: the win needs votes
    /// hosted by at least `min_peers` distinct peers (default: the node's, see
    /// [`Config::with_min_voters`]). While this peer is joining its swarm the acquisition
    /// waits, sending nothing.
    pub fn acquire_with(
        &mut self,
        resource: &str,
        quorum: Option<(usize, usize)>,
        min_peers: Option<usize>,
    ) -> Result<AcquisitionId, AcquireError> {
        wire::validate_resource(resource).map_err(|_| AcquireError::BadName)?;
        let mut config = self.config.proto.clone();
        if let Some((n, m)) = quorum {
            let (swarm_n, swarm_m) = (config.n(), config.m());
            if n != swarm_n || m < swarm_m || m > n {
                return Err(AcquireError::SwarmQuorum { n, m, swarm_n, swarm_m });
            }
            config = config.with_quorum(n, m);
        }
        let m = config.m();
        let explicit = min_peers.or(self.config.min_voters);
        let d = match explicit {
            Some(d) if d == 0 || d > m => return Err(AcquireError::MinPeers { d, m }),
            Some(d) => d,
            None => self.default_min_voters(resource, config.n()).min(m),
        };
        let config = config.with_min_voters(d);
        config.validate()?;
        let n = u16::try_from(config.n()).map_err(|_| proto::ConfigError::TooManyReplicas(config.n()))?;
        let now = self.clock.now();
        let ts = self.lamport.stamp(now, self.local);
        let id = AcquisitionId(self.next_id);
        self.next_id += 1;
        self.counters.acquisitions += 1;
        let deferred = (!self.membership.ready()).then(|| config.clone());
        self.deferred += usize::from(deferred.is_some());
        let mut client = Client::new(config, ts, now);
        if deferred.is_some() {
            while client.poll_transmit().is_some() {}
        }
        self.by_ts.insert(ts, id);
        if !self.live_locks.contains_key(resource) && self.idle_hosts.len() > 0 {
            for index in 0..n {
                self.idle_hosts.set(&(resource.to_owned(), index), None);
            }
        }
        *self.live_locks.entry(resource.to_owned()).or_default() += 1;
        let acquisition =
            Acquisition { resource: resource.to_owned(), n, client, deferred, default_d: explicit.is_none() };
        self.acquisitions.insert(id, acquisition);
        self.drain_acquisition(id);
        self.wake();
        Ok(id)
    }

    /// The default quorum diversity: 2, unless every replica of the lock falls on one
    /// peer even when every member this peer knows (present or departed) is counted —
    /// a one-node swarm, or a lock whose n keys all land on one peer of a small swarm —
    /// where 2 could never be met. An island still needs 2: its departed members host
    /// some of the keys. This peer counts as a possible host only when others can dial
    /// it: an unreachable one hosts nothing.
    fn default_min_voters(&self, resource: &str, n: usize) -> usize {
        if Self::one_host(resource, n, self.membership.peers().chain(self.self_as_host())) {
            1
        } else {
            2
        }
    }

    /// Whether all `n` keys of `resource` fall on one of `peers` (the closest to each).
    fn one_host<'a>(resource: &str, n: usize, peers: impl Iterator<Item = &'a PeerId> + Clone) -> bool {
        let mut first: Option<PeerId> = None;
        for index in 0..n {
            let key = Self::key(resource, u16::try_from(index).unwrap_or(u16::MAX));
            let host = peers.clone().map(|p| (KBucketKey::from(*p).distance(&key), *p)).min().map(|(_, p)| p);
            match (first, host) {
                (None, h) => first = h,
                (Some(a), Some(b)) if a != b => return false,
                _ => {}
            }
        }
        true
    }

    /// A default D = 2 set while the lock's keys fell on several peers must not outlive
    /// them: once members departed and every key falls on one *alive* peer (this one
    /// included when others can dial it), a waiter holding m live votes from that one
    /// peer could never win until a departed member returned (up to the membership
    /// window). While this peer reaches a majority of its members (no island; serving
    /// or not, an unreachable peer's locks are served by the others), such a waiter's D is
    /// lowered to 1; the majority rule and the takeover delay still stand. Only waiters
    /// that are short of voters alone are looked at, once a second.
    fn relax_diversity(&mut self, now: Time) {
        if now < self.next_relax || !self.membership.majority() {
            return;
        }
        self.next_relax = now + RELAX_INTERVAL;
        let short: Vec<AcquisitionId> = self
            .acquisitions
            .iter()
            .filter(|(_, a)| a.default_d && a.deferred.is_none() && a.client.short_of_voters(now))
            .map(|(id, _)| *id)
            .collect();
        for id in short {
            let Some(a) = self.acquisitions.get(&id) else { continue };
            let alive = self.membership.alive().chain(self.self_as_host());
            if Self::one_host(&a.resource, usize::from(a.n), alive) {
                tracing::info!(resource = %a.resource, "every key on one alive peer: quorum diversity lowered to 1");
                if let Some(a) = self.acquisitions.get_mut(&id) {
                    a.client.lower_min_voters(now, 1);
                }
                self.drain_acquisition(id);
            }
        }
    }

    /// Whether this peer serves replicas, and why not.
    pub fn readiness(&self) -> Readiness {
        if self.membership.serving() {
            Readiness::Serving
        } else {
            match self.membership.readiness() {
                // Majority regained, not yet noticed by the housekeeping.
                Readiness::Serving => Readiness::Minority {
                    reachable: self.membership.reachable() + 1,
                    members: self.membership.members(),
                },
                r => r,
            }
        }
    }

    /// The membership view: (reachable members, members), this peer included in both.
    pub fn members(&self) -> (usize, usize) {
        (self.membership.reachable() + 1, self.membership.members())
    }

    /// The takeover delay in force.
    pub fn takeover_delay(&self) -> Duration {
        self.membership.delay()
    }

    /// Times this peer's event loop was found stalled past the liveness timeout.
    pub fn stalls(&self) -> u64 {
        self.membership.stalls()
    }

    /// Membership housekeeping (see [`Membership::tick`]): drops every hosted replica
    /// when serving stops or restarts, starts deferred acquisitions once ready.
    fn housekeeping(&mut self, now: Time) {
        self.trim_connections(now);
        self.relax_diversity(now);
        if now >= self.next_redial {
            use rand::seq::IteratorRandom;
            self.next_redial = now + REDIAL_INTERVAL;
            let departed = self.membership.departed().copied().choose_multiple(&mut self.rng, REDIAL_BATCH);
            self.to_dial.extend(departed);
        }
        if self.membership.tick(now) && !self.replicas.is_empty() {
            self.counters.replicas_dropped_not_serving += self.replicas.len() as u64;
            tracing::info!(dropped = self.replicas.len(), readiness = %self.membership.readiness(), "not serving: replicas dropped");
            let owned: Vec<(String, u16)> = self.replicas.keys().cloned().collect();
            for key in &owned {
                self.forget_ownership(key);
            }
            self.replicas = HashMap::new();
            self.replica_due.clear();
            self.creators = HashMap::new();
            self.created_by = HashMap::new();
            self.entries = HashMap::new();
            self.entries_by = HashMap::new();
            self.entries_total = 0;
        }
        if self.membership.ready() && self.deferred > 0 {
            self.deferred = 0;
            let deferred: Vec<AcquisitionId> =
                self.acquisitions.iter().filter(|(_, a)| a.deferred.is_some()).map(|(id, _)| *id).collect();
            for id in deferred {
                if let Some(a) = self.acquisitions.get_mut(&id) {
                    if let Some(config) = a.deferred.take() {
                        if a.client.phase() == Phase::Waiting {
                            a.client = Client::new(config, *a.client.ts(), now);
                        }
                    }
                }
                self.drain_acquisition(id);
            }
        }
    }

    /// Releases (or abandons) an acquisition. Unknown ids are ignored.
    pub fn release(&mut self, id: AcquisitionId) {
        let now = self.clock.now();
        if let Some(a) = self.acquisitions.get_mut(&id) {
            a.client.release(now);
            self.drain_acquisition(id);
            self.wake();
        }
    }

    /// The state of an acquisition, while it exists.
    pub fn acquisition(&self, id: AcquisitionId) -> Option<AcquisitionInfo> {
        let a = self.acquisitions.get(&id)?;
        let holding = a.client.phase() == Phase::Holding;
        Some(AcquisitionInfo {
            resource: a.resource.clone(),
            phase: a.client.phase(),
            token: a.client.token(),
            votes: a.client.votes(),
            position: a.client.position(),
            valid_until: a.client.valid_until().filter(|_| holding).map(|t| self.clock.instant(t)),
        })
    }

    /// Acquisitions in progress or held: (id, lock name, phase).
    pub fn acquisitions(&self) -> Vec<(AcquisitionId, String, Phase)> {
        let mut v: Vec<_> =
            self.acquisitions.iter().map(|(id, a)| (*id, a.resource.clone(), a.client.phase())).collect();
        v.sort_by_key(|(id, _, _)| *id);
        v
    }

    fn wake(&mut self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// Sends a client message to the host of replica `index` (locally if that is us).
    fn send_to_replica(&mut self, resource: String, n: u16, index: u16, msg: ToReplica<PeerId>, hops: u8) {
        let mut host = self.host(&resource, index);
        if host == self.local {
            // The local estimate may predate a closer peer's connection.
            if let Some(closer) = self.closer_live_peer(&resource, index) {
                self.cache_host(&resource, index, closer);
                host = closer;
            }
        }
        Counters::bump(&mut self.counters.messages_out, msg.kind());
        if host == self.local {
            // A local refusal (a duplicate RELEASE, say) needs no answer: the core retries
            // on its timers like for a lost message.
            if !self.membership.serving() {
                return; // not serving: as if lost; the core retries
            }
            if self.owns(&resource, index) {
                let now = self.clock.now();
                self.serve_local(&resource, index, msg, now);
            } else if self.room_to_check(self.local, &resource, index).is_ok() {
                let parked =
                    Parked { from: self.local, heard: self.clock.now(), n, msg, hops, reply_to: ReplyTo::Local };
                self.park(&resource, index, parked);
            }
            return;
        }
        let request = Request::Replica { resource: resource.clone(), index, n, msg: msg.clone() };
        let pending = Pending { peer: host, resource, index, n, msg: Some(msg), probe: None, hops };
        self.enqueue(host, request, Some(pending));
    }

    /// Queues a message for `peer`: everything queued for one peer in one step goes as
    /// one transport request ([`Behaviour::flush_outbox`]).
    fn enqueue(&mut self, peer: PeerId, request: Request, pending: Option<Pending>) {
        self.used(peer);
        match self.outbox.get_mut(&peer) {
            Some(items) => items.push((request, pending)),
            None => {
                self.outbox.insert(peer, vec![(request, pending)]);
                self.outbox_order.push(peer);
            }
        }
        self.wake();
    }

    /// Sends what the current step queued: per peer, a message alone or batches of up
    /// to [`wire::MAX_BATCH`]. Answers whether anything was sent.
    fn flush_outbox(&mut self) -> bool {
        if self.outbox_order.is_empty() {
            return false;
        }
        for peer in std::mem::take(&mut self.outbox_order) {
            let Some(mut items) = self.outbox.remove(&peer) else { continue };
            while !items.is_empty() {
                let rest = items.split_off(items.len().min(wire::MAX_BATCH));
                let chunk = std::mem::replace(&mut items, rest);
                self.counters.requests_out += 1;
                if chunk.len() == 1 {
                    let Some((request, pending)) = chunk.into_iter().next() else { break };
                    let id = self.inner.rr.send_request(&peer, request);
                    if let Some(p) = pending {
                        self.pending.insert(id, Sent::One(p));
                    }
                } else {
                    self.counters.batches_out += 1;
                    let (requests, pendings): (Vec<Request>, Vec<Option<Pending>>) = chunk.into_iter().unzip();
                    let id = self.inner.rr.send_request(&peer, Request::Batch(requests));
                    self.pending.insert(id, Sent::Batch(pendings));
                }
            }
        }
        shrink_if_sparse(&mut self.outbox);
        true
    }

    /// Measures the round trip to the host of every replica of `resource` (`n`
    /// replicas, default the configured n) along the path a REQUEST takes, redirects
    /// included, without protocol work. The result comes as [`Event::Probed`].
    pub fn probe(&mut self, resource: &str, n: Option<usize>) -> Result<ProbeId, AcquireError> {
        self.survey(resource, n, |n| ProbeKind::Ping(vec![None; n]))
    }

    /// Asks the host of every replica of `resource` (`n` replicas, default the
    /// configured n) for the replica's state: owner, lease, queue. Changes nothing. The
    /// result comes as [`Event::Inspected`].
    pub fn inspect(&mut self, resource: &str, n: Option<usize>) -> Result<ProbeId, AcquireError> {
        let local = self.local;
        self.survey(resource, n, |n| ProbeKind::Inspect(vec![ReplicaAnswer::NoAnswer { host: local }; n]))
    }

    fn survey(
        &mut self,
        resource: &str,
        n: Option<usize>,
        kind: impl FnOnce(usize) -> ProbeKind,
    ) -> Result<ProbeId, AcquireError> {
        wire::validate_resource(resource).map_err(|_| AcquireError::BadName)?;
        let n = n.unwrap_or(self.config.proto.n());
        let n16 = u16::try_from(n).ok().filter(|x| (1..=proto::MAX_REPLICAS).contains(&usize::from(*x)));
        let n16 = n16.ok_or(proto::ConfigError::TooManyReplicas(n))?;
        let id = ProbeId(self.next_id);
        self.next_id += 1;
        self.probes.insert(id, Probe { started: Instant::now(), kind: kind(n), outstanding: n });
        for index in 0..n16 {
            self.send_survey(resource.to_owned(), n16, index, id, 0);
        }
        self.wake();
        Ok(id)
    }

    /// Sends one question to `peer`: a [`Request::Holding`] or [`Request::Revoke`] (an
    /// operator's tools). Asked of this peer, it is answered here at once. The answer
    /// comes as [`Event::Answered`].
    pub fn ask(&mut self, peer: PeerId, request: Request) -> ProbeId {
        let id = ProbeId(self.next_id);
        self.next_id += 1;
        if peer == self.local {
            let reply = self.answer_operator(self.local, request);
            self.events.push_back(Event::Answered { id, reply: Some(reply) });
        } else {
            self.probes.insert(id, Probe { started: Instant::now(), kind: ProbeKind::Ask, outstanding: 1 });
            self.used(peer);
            self.counters.requests_out += 1;
            let out = self.inner.rr.send_request(&peer, request);
            let pending =
                Pending { peer, resource: String::new(), index: 0, n: 0, msg: None, probe: Some(id), hops: 0 };
            self.pending.insert(out, Sent::One(pending));
        }
        self.wake();
        id
    }

    /// Revokes the local acquisition that holds `resource` under `token`, as ordered
    /// by `by` (this peer, or an admin peer): the application gets [`Event::Revoked`]
    /// and the lock is released. Returns whether such an acquisition was held here.
    pub fn revoke(&mut self, resource: &str, token: u64, by: PeerId) -> bool {
        let found = self
            .acquisitions
            .iter()
            .find(|(_, a)| a.resource == resource && a.client.phase() == Phase::Holding && a.client.token() == token);
        let Some((&id, _)) = found else { return false };
        tracing::warn!(%resource, token, %by, "lock revoked by an operator");
        self.counters.revoked += 1;
        self.events.push_back(Event::Revoked { id, resource: resource.to_owned(), token, by });
        self.release(id);
        true
    }

    fn send_survey(&mut self, resource: String, n: u16, index: u16, probe: ProbeId, hops: u8) {
        let mut host = self.host(&resource, index);
        if host == self.local {
            if let Some(closer) = self.closer_live_peer(&resource, index) {
                self.cache_host(&resource, index, closer);
                host = closer;
            }
        }
        let inspect = matches!(self.probes.get(&probe).map(|p| &p.kind), Some(ProbeKind::Inspect(_)));
        if host == self.local {
            let reply = if inspect { Reply::Replica(self.replica_state(&resource, index)) } else { Reply::Ack };
            self.probe_answered(probe, index, host, Some(reply));
            return;
        }
        let request = if inspect {
            Request::Inspect { resource: resource.clone(), index, n }
        } else {
            Request::Ping { resource: resource.clone(), index, n }
        };
        let pending = Pending { peer: host, resource, index, n, msg: None, probe: Some(probe), hops };
        self.enqueue(host, request, Some(pending));
    }

    /// Records the answer of `host` (`None`: no answer) for replica `index`.
    fn probe_answered(&mut self, id: ProbeId, index: u16, host: PeerId, reply: Option<Reply>) {
        let Some(p) = self.probes.get_mut(&id) else { return };
        let i = usize::from(index);
        match &mut p.kind {
            ProbeKind::Ping(rtts) => {
                if let (Some(slot), Some(Reply::Ack)) = (rtts.get_mut(i), &reply) {
                    *slot = Some(p.started.elapsed());
                }
            }
            ProbeKind::Inspect(answers) => {
                if let Some(slot) = answers.get_mut(i) {
                    *slot = match reply {
                        Some(Reply::Replica(state)) => ReplicaAnswer::State { host, state },
                        Some(Reply::Rejected(reason)) => ReplicaAnswer::Refused { host, reason },
                        _ => ReplicaAnswer::NoAnswer { host },
                    };
                }
            }
            ProbeKind::Ask => {
                self.probes.remove(&id);
                self.events.push_back(Event::Answered { id, reply });
                return;
            }
        }
        p.outstanding = p.outstanding.saturating_sub(1);
        if p.outstanding == 0 {
            if let Some(p) = self.probes.remove(&id) {
                self.events.push_back(match p.kind {
                    ProbeKind::Ping(rtts) => Event::Probed { id, rtts },
                    ProbeKind::Inspect(replicas) => Event::Inspected { id, replicas },
                    // Answered above, when its one reply came.
                    ProbeKind::Ask => Event::Answered { id, reply: None },
                });
            }
        }
    }

    /// Hands a RESPONSE to the local acquisition it is for. A grant to an acquisition
    /// that is already finished is given back at once.
    fn deliver(&mut self, voter: PeerId, resource: &str, index: u16, resp: Response<PeerId>) {
        let now = self.clock.now();
        // Lamport's receive rule, within the clock-offset bound (a value near u64::MAX
        // would pin the clock there and give later acquisitions equal timestamps).
        let bound =
            proto::clock::micros(now).saturating_add(proto::clock::micros(self.config.proto.max_clock_offset()));
        if resp.owner.counter <= bound {
            self.lamport.observe(resp.owner.counter);
        }
        let Some(id) = self.by_ts.get(&resp.ts).copied() else {
            if resp.owner == resp.ts {
                if let Some((_, n)) = self.finished.get(&resp.ts) {
                    // With the acquisition's own n: a host refuses any other replica
                    // count (`Rejection::QuorumMismatch`), and a refused hand-back would
                    // leave the vote with nobody until its lease ran out.
                    let n = *n;
                    let msg = ToReplica::Release { ts: resp.ts, token: 0 };
                    self.send_to_replica(resource.to_owned(), n, index, msg, 0);
                }
            }
            return;
        };
        if let Some(a) = self.acquisitions.get_mut(&id) {
            if a.resource == resource {
                if let Err(e) = a.client.handle_response_from(now, usize::from(index), voter, resp) {
                    let reason = match e {
                        proto::ClientError::Stale => "stale",
                        proto::ClientError::Ahead { .. } => "ahead",
                        proto::ClientError::WrongAcquisition => "wrong_acquisition",
                        proto::ClientError::ReplicaOutOfRange { .. } => "replica_out_of_range",
                    };
                    Counters::bump(&mut self.counters.responses_refused, reason);
                }
            }
        }
        self.drain_acquisition(id);
    }

    /// Moves an acquisition's outputs to the network and its events to the application.
    fn drain_acquisition(&mut self, id: AcquisitionId) {
        self.drain_acquisition_outputs(id);
        self.reindex_acquisition(id);
    }

    fn drain_acquisition_outputs(&mut self, id: AcquisitionId) {
        loop {
            let Some(a) = self.acquisitions.get_mut(&id) else { return };
            if let Some(event) = a.client.poll_event() {
                let event = match event {
                    proto::Event::Acquired { token, votes, valid_until } => {
                        self.counters.acquired += 1;
                        let resource = a.resource.clone();
                        let peers: HashSet<PeerId> = a
                            .client
                            .views()
                            .iter()
                            .filter(|v| v.owner.as_ref() == Some(a.client.ts()))
                            .filter_map(|v| v.voter)
                            .collect();
                        Event::Acquired {
                            id,
                            resource,
                            token,
                            valid_until: self.clock.instant(valid_until),
                            votes,
                            distinct_peers: peers.len(),
                        }
                    }
                    proto::Event::Lost(reason) => {
                        self.counters.lost += 1;
                        Event::Lost { id, reason }
                    }
                };
                self.events.push_back(event);
                continue;
            }
            if let Some((index, msg)) = a.client.poll_transmit() {
                if a.deferred.is_some() {
                    continue; // nothing was sent: nothing to send now
                }
                let (resource, n) = (a.resource.clone(), a.n);
                let index = u16::try_from(index).unwrap_or(u16::MAX);
                self.send_to_replica(resource, n, index, msg, 0);
                continue;
            }
            if a.client.phase() == Phase::Released {
                if a.client.token() > 0 {
                    let st = a.client.stats();
                    self.counters.completed += 1;
                    self.counters.completed_messages += st.requests + st.yields + st.releases + st.responses + st.stale;
                }
                let ts = *a.client.ts();
                let (resource, n) = (a.resource.clone(), a.n);
                self.acquisitions.remove(&id);
                // The lock's host cache expires a while after its last local
                // acquisition: the next one of a busy lock needs no redirects.
                let last = match self.live_locks.get_mut(&resource) {
                    Some(c) if *c > 1 => {
                        *c -= 1;
                        false
                    }
                    _ => true,
                };
                if last {
                    self.live_locks.remove(&resource);
                    let until = self.clock.now() + self.config.idle_hosts_ttl;
                    for index in 0..n {
                        let key = (resource.clone(), index);
                        if self.hosts.contains_key(&key) {
                            self.idle_hosts.set(&key, Some(until));
                        }
                    }
                    while self.idle_hosts.len() > MAX_IDLE_HOSTS {
                        let Some(key) = self.idle_hosts.first_key() else { break };
                        self.idle_hosts.set(&key, None);
                        self.hosts.remove(&key);
                    }
                }
                self.by_ts.remove(&ts);
                shrink_if_sparse(&mut self.acquisitions);
                shrink_if_sparse(&mut self.by_ts);
                shrink_if_sparse(&mut self.live_locks);
                shrink_if_sparse(&mut self.hosts);
                self.finished.insert(ts, (resource, n));
                self.finished_order.push_back(ts);
                while self.finished_order.len() > self.config.finished_memory {
                    if let Some(old) = self.finished_order.pop_front() {
                        self.finished.remove(&old);
                    }
                }
            }
            return;
        }
    }

    fn on_reply(&mut self, peer: PeerId, id: OutboundRequestId, reply: Reply) {
        match self.pending.remove(&id) {
            None => {}
            Some(Sent::One(p)) => self.on_item_reply(peer, p, reply),
            Some(Sent::Batch(items)) => {
                let replies = match reply {
                    Reply::Batch(replies) if replies.len() == items.len() => replies,
                    reply => {
                        // A refused batch (or a reply of the wrong shape): as if each
                        // item were refused; the core retries on its timers.
                        Counters::bump(&mut self.counters.responses_refused, "batch_reply");
                        tracing::debug!(%peer, ?reply, "a batch was not answered item by item");
                        let refused = match reply {
                            Reply::Rejected(r) => r,
                            _ => Rejection::BadBatch,
                        };
                        vec![Reply::Rejected(refused); items.len()]
                    }
                };
                for (p, reply) in items.into_iter().zip(replies) {
                    if let Some(p) = p {
                        self.on_item_reply(peer, p, reply);
                    }
                }
            }
        }
    }

    /// The reply to one message sent alone or in a batch.
    fn on_item_reply(&mut self, peer: PeerId, p: Pending, reply: Reply) {
        if let Some(probe) = p.probe {
            match reply {
                Reply::Redirect { peer: closer, addrs } if p.hops < self.config.max_redirects && closer != peer => {
                    for a in addrs.into_iter().take(wire::MAX_REDIRECT_ADDRS) {
                        self.add_address(&closer, a);
                    }
                    self.cache_host(&p.resource, p.index, closer);
                    self.send_survey(p.resource, p.n, p.index, probe, p.hops + 1);
                }
                Reply::Redirect { .. } => self.probe_answered(probe, p.index, peer, None),
                reply => self.probe_answered(probe, p.index, peer, Some(reply)),
            }
            return;
        }
        let Some(msg) = p.msg else { return };
        match reply {
            Reply::Responses(responses) => {
                for r in responses {
                    if r.ts.client == self.local {
                        self.deliver(peer, &p.resource, p.index, r);
                    }
                }
            }
            Reply::Redirect { peer: closer, addrs } => {
                self.counters.redirects_followed += 1;
                for a in addrs.into_iter().take(wire::MAX_REDIRECT_ADDRS) {
                    self.add_address(&closer, a);
                }
                self.cache_host(&p.resource, p.index, closer);
                if p.hops < self.config.max_redirects && closer != peer {
                    Counters::bump(&mut self.counters.messages_out, "redirected");
                    self.send_to_replica(p.resource, p.n, p.index, msg, p.hops + 1);
                } else {
                    self.lookup(&p.resource, p.index);
                }
            }
            Reply::Rejected(r) => {
                tracing::debug!(%peer, reason = r.as_str(), "sigma request rejected by peer");
            }
            Reply::Ack | Reply::Replica(_) | Reply::Holding(_) | Reply::Batch(_) => {}
        }
    }

    fn on_outbound_failure(&mut self, id: OutboundRequestId, error: &request_response::OutboundFailure) {
        use request_response::OutboundFailure as F;
        let kind = match error {
            F::DialFailure => "dial_failure",
            F::Timeout => "timeout",
            F::ConnectionClosed => "connection_closed",
            F::UnsupportedProtocols => "unsupported_protocols",
            F::Io(_) => "io",
        };
        Counters::bump(&mut self.counters.outbound_failures, kind);
        match self.pending.remove(&id) {
            None => {}
            Some(Sent::One(p)) => self.on_item_failure(p, error),
            Some(Sent::Batch(items)) => items.into_iter().flatten().for_each(|p| self.on_item_failure(p, error)),
        }
    }

    /// A message sent alone or in a batch got no answer.
    fn on_item_failure(&mut self, p: Pending, error: &request_response::OutboundFailure) {
        use request_response::OutboundFailure as F;
        if let Some(probe) = p.probe {
            self.probe_answered(probe, p.index, p.peer, None);
        }
        // Timeout and ConnectionClosed mean "maybe delivered": the core's timers retry,
        // and every handler is idempotent. A host that cannot be reached is looked up
        // (a question to one peer, `ask`, names no replica).
        if matches!(error, F::DialFailure | F::UnsupportedProtocols) && !p.resource.is_empty() {
            let key = (p.resource.clone(), p.index);
            self.idle_hosts.set(&key, None);
            self.hosts.remove(&key);
            self.routable.remove(&p.peer);
            self.lookup(&p.resource, p.index);
        }
    }

    fn on_inner(&mut self, event: InnerEvent) {
        match &event {
            InnerEvent::Rr(request_response::Event::Message { peer, .. })
            | InnerEvent::Gossip(request_response::Event::Message { peer, .. }) => self.used(*peer),
            _ => {}
        }
        match event {
            InnerEvent::Rr(request_response::Event::Message { peer, message, .. }) => match message {
                request_response::Message::Request { request, channel, .. } => self.on_request(peer, request, channel),
                request_response::Message::Response { request_id, response } => {
                    self.on_reply(peer, request_id, response)
                }
            },
            InnerEvent::Rr(request_response::Event::OutboundFailure { request_id, error, .. }) => {
                self.on_outbound_failure(request_id, &error)
            }
            InnerEvent::Rr(request_response::Event::InboundFailure { peer, error, .. }) => {
                use request_response::InboundFailure as F;
                let kind = match &error {
                    F::Timeout => "timeout",
                    F::ConnectionClosed => "connection_closed",
                    F::UnsupportedProtocols => "unsupported_protocols",
                    F::ResponseOmission => "response_omission",
                    F::Io(_) => "io",
                };
                Counters::bump(&mut self.counters.inbound_failures, kind);
                tracing::debug!(%peer, %error, "inbound sigma request failed");
            }
            InnerEvent::Rr(request_response::Event::ResponseSent { .. }) => {}
            InnerEvent::Kad(kad::Event::RoutablePeer { peer, address }) => self.add_address(&peer, address),
            InnerEvent::Kad(kad::Event::RoutingUpdated { peer, .. }) => {
                if self.routable.insert(peer) {
                    self.hand_over(peer);
                }
            }
            InnerEvent::Kad(kad::Event::OutboundQueryProgressed {
                id,
                result: kad::QueryResult::GetClosestPeers(result),
                step,
                ..
            }) => {
                if !step.last {
                    return;
                }
                let complete = result.is_ok();
                let peers = match result {
                    Ok(ok) => ok.peers,
                    Err(kad::GetClosestPeersError::Timeout { peers, .. }) => peers,
                };
                if self.neighbourhood_query == Some(id) {
                    self.neighbourhood_query = None;
                    // Only a lookup that finished counts (a timed-out one may have
                    // missed closer peers).
                    if complete {
                        let peers: Vec<KBucketKey<PeerId>> = peers
                            .iter()
                            .filter(|i| i.peer_id != self.local)
                            .map(|i| KBucketKey::from(i.peer_id))
                            .collect();
                        let radius = (peers.len() >= kad::K_VALUE.get())
                            .then(|| peers.iter().map(|p| p.distance(&self.local_key)).max())
                            .flatten();
                        self.neighbourhood = Some(Neighbourhood { peers, radius, at: self.clock.now() });
                    }
                }
                for info in &peers {
                    for a in &info.addrs {
                        self.add_address(&info.peer_id, a.clone());
                    }
                }
                if let Some(key) = self.checks.remove(&id) {
                    shrink_if_sparse(&mut self.checks);
                    self.ownership_checked(key, &peers);
                    return;
                }
                let Some((resource, index)) = self.lookups.remove(&id) else { return };
                let key = Self::key(&resource, index);
                let best = peers
                    .iter()
                    .map(|i| i.peer_id)
                    .chain(self.dialable().then_some(self.local))
                    .map(|p| (KBucketKey::from(p).distance(&key), p))
                    .min()
                    .map_or(self.local, |(_, p)| p);
                self.cache_host(&resource, index, best);
            }
            // The first step of a bootstrap to succeed (its self-lookup, usually) joins:
            // this peer's neighbourhood knows it and it knows its neighbourhood. The
            // refresh of farther buckets that follows is not waited for (it may take
            // long in a busy swarm, and a step that times out fails the whole bootstrap).
            InnerEvent::Kad(kad::Event::OutboundQueryProgressed {
                result: kad::QueryResult::Bootstrap(Ok(_)), ..
            }) => {
                let was_ready = self.membership.ready();
                self.membership.bootstrapped();
                if !was_ready && self.membership.ready() {
                    tracing::info!("joined the swarm: ready");
                    let now = self.clock.now();
                    self.housekeeping(now);
                }
            }
            InnerEvent::Kad(_) => {}
            InnerEvent::Gossip(request_response::Event::Message { peer, message, .. }) => match message {
                request_response::Message::Request { request, channel, .. } => {
                    if !self.take_token(peer) {
                        Counters::bump(&mut self.counters.rejected, Rejection::RateLimited.as_str());
                        return;
                    }
                    self.merge_gossip(peer, request);
                    let now = self.clock.now();
                    let table = self.gossip_table(now);
                    let _ = self.inner.gossip.send_response(channel, table);
                }
                request_response::Message::Response { response, .. } => self.merge_gossip(peer, response),
            },
            InnerEvent::Gossip(request_response::Event::InboundFailure { .. }) => {
                Counters::bump(&mut self.counters.inbound_failures, "gossip");
            }
            InnerEvent::Gossip(request_response::Event::OutboundFailure { .. }) => {
                Counters::bump(&mut self.counters.outbound_failures, "gossip");
            }
            InnerEvent::Gossip(request_response::Event::ResponseSent { .. }) => {}
            // A peer that does not speak ping (a light client, a probe) is not judged.
            InnerEvent::Ping(ping::Event { result: Err(ping::Failure::Unsupported), .. }) => {}
            InnerEvent::Ping(ping::Event { peer, connection, result: Err(error) }) => {
                tracing::debug!(%peer, %error, "liveness ping failed: closing the connection");
                self.counters.ping_failures += 1;
                self.to_close.push_back((peer, connection));
            }
            InnerEvent::Ping(_) => {}
        }
    }

    /// Runs the core's due timers, and drops replicas that have become disposable.
    fn handle_timeouts(&mut self, now: Time) {
        // Collected first: a replica re-filed at `now` waits for the next pass.
        for key in self.replica_due.due(now) {
            let mut outputs = Vec::new();
            if let Some(r) = self.replicas.get_mut(&key) {
                r.handle_timeout(now);
                while let Some(out) = r.poll_transmit() {
                    outputs.push(out);
                }
            }
            self.reindex_replica(&key, now);
            for (to, resp) in outputs {
                self.notify(to, &key.0, key.1, resp);
            }
        }
        for id in self.acquisition_due.due(now) {
            if let Some(a) = self.acquisitions.get_mut(&id) {
                a.client.handle_timeout(now);
            }
            self.drain_acquisition(id);
        }
        for key in self.ownership_due.due(now) {
            self.ownership_due(key, now);
        }
        for key in self.idle_hosts.due(now) {
            self.idle_hosts.set(&key, None);
            self.hosts.remove(&key);
        }
        if now >= self.next_gossip {
            self.next_gossip = now + self.config.gossip_interval;
            self.gossip_round(now);
        }
    }

    /// One gossip round: this peer's heartbeat advances and its table goes to a few
    /// random alive members, connected ones first (gossip opens no connection while
    /// enough are open, and keeps busy those it uses); every [`GOSSIP_MIXING`] rounds
    /// one target is an alive member in the routing table that is not connected, so
    /// that the gossip graph is Kademlia's (connected) one and not only the set of
    /// connections of the moment. (A member known only by gossip may have no address
    /// here: it is never a target.)
    fn gossip_round(&mut self, now: Time) {
        use rand::seq::{IteratorRandom, SliceRandom};
        if !self.dialable() {
            return; // not a member anywhere: no peer would take its table
        }
        self.membership.beat();
        self.gossip_rounds += 1;
        let fanout = self.config.gossip_fanout;
        let (connected, routable) = (&self.connected, &self.routable);
        let (mut near, far): (Vec<PeerId>, Vec<PeerId>) = self
            .membership
            .alive()
            .filter(|p| connected.contains_key(*p) || routable.contains(*p))
            .copied()
            .partition(|p| connected.contains_key(p));
        let mix = usize::from(self.gossip_rounds.is_multiple_of(GOSSIP_MIXING) || near.len() < fanout);
        let mut targets = far.into_iter().choose_multiple(&mut self.rng, mix.max(fanout.saturating_sub(near.len())));
        targets.truncate(fanout);
        let rest = fanout - targets.len();
        near.shuffle(&mut self.rng);
        targets.extend(near.into_iter().take(rest));
        if targets.is_empty() {
            return;
        }
        let table = self.gossip_table(now);
        for peer in targets {
            self.used(peer);
            self.inner.gossip.send_request(&peer, table.clone());
        }
    }

    /// An external address was confirmed or expired: serving follows (a peer that
    /// became dialable serves under the takeover delay, one that no longer is drops its
    /// replicas).
    fn reachability_changed(&mut self) {
        let dialable = self.dialable();
        self.membership.set_dialable(dialable);
        tracing::info!(dialable, externals = ?self.externals, "external addresses changed");
        let now = self.clock.now();
        self.housekeeping(now);
        self.wake();
    }

    /// `peer`'s connection was just used (not trimmed for a while).
    fn used(&mut self, peer: PeerId) {
        if let Some(t) = self.last_used.get_mut(&peer) {
            *t = self.clock.now();
        }
    }

    /// Past the high watermark, the least recently used peers not used within
    /// [`TRIM_GRACE`] are disconnected down to the low one (looked at on every event: a
    /// few dozen connections cost little to sort, and a dial refused at the limit costs
    /// a retry).
    fn trim_connections(&mut self, now: Time) {
        let Some((high, low)) = self.config.connection_watermarks else { return };
        let open = self.connected.len().saturating_sub(self.trimming.len());
        self.trim_active = (self.trim_active || open > high) && open > low;
        if !self.trim_active {
            return;
        }
        let mut idle: Vec<(Time, PeerId)> = self
            .last_used
            .iter()
            .filter(|(p, t)| now.saturating_sub(**t) >= TRIM_GRACE && !self.trimming.contains(*p))
            .map(|(p, t)| (*t, *p))
            .collect();
        idle.sort_unstable();
        let excess = self.connected.len().saturating_sub(low + self.trimming.len());
        for (_, peer) in idle.into_iter().take(excess) {
            self.counters.connections_trimmed += 1;
            self.trimming.insert(peer);
            self.to_trim.push_back(peer);
        }
        if !self.to_trim.is_empty() {
            self.wake();
        }
    }

    /// This peer's heartbeat and those of the members alive here.
    fn gossip_table(&self, now: Time) -> wire::Gossip {
        let own = self.membership.own_beat();
        let beats = std::iter::once((self.local, own, Duration::ZERO))
            .chain(self.membership.beats(now))
            .take(wire::MAX_GOSSIP_BEATS)
            .map(|(peer, (incarnation, counter), age)| wire::Beat {
                peer,
                incarnation,
                counter,
                age_ms: u32::try_from(age.as_millis()).unwrap_or(u32::MAX),
            })
            .collect();
        wire::Gossip { beats }
    }

    /// Merges a gossip table from `peer`, a sigma peer (in the routing table, or an
    /// alive member): members that became alive take over the keys they are closer to.
    fn merge_gossip(&mut self, peer: PeerId, gossip: wire::Gossip) {
        if !gossip.is_valid() {
            Counters::bump(&mut self.counters.inbound_failures, "gossip_oversized");
            return;
        }
        if !self.routable.contains(&peer) && !self.membership.is_alive(&peer) {
            Counters::bump(&mut self.counters.inbound_failures, "gossip_not_member");
            return;
        }
        let now = self.clock.now();
        let mut woke = Vec::new();
        for b in gossip.beats {
            if b.peer == self.local {
                continue;
            }
            let age = Duration::from_millis(u64::from(b.age_ms));
            if self.membership.heard(b.peer, (b.incarnation, b.counter), age, now) {
                woke.push(b.peer);
            }
        }
        for p in woke {
            self.hand_over_to(p);
        }
        self.housekeeping(now);
    }

    fn next_deadline(&self) -> Option<Time> {
        [
            self.replica_due.first(),
            self.acquisition_due.first(),
            self.ownership_due.first(),
            self.idle_hosts.first(),
            Some(self.next_gossip),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Files an acquisition under its next deadline (none while deferred or gone).
    fn reindex_acquisition(&mut self, id: AcquisitionId) {
        let at = self.acquisitions.get(&id).filter(|a| a.deferred.is_none()).and_then(|a| a.client.poll_timeout());
        self.acquisition_due.set(&id, at);
    }
}

/// The Kademlia protocol of sigma's DHT for the default n = 32.
pub const KAD_PROTOCOL: libp2p::StreamProtocol = libp2p::StreamProtocol::new("/sigma/kad/1.0.0");

/// The Kademlia protocol of a swarm whose locks have `n` replicas. Peers configured
/// with another n speak another protocol, so they never join the swarm's DHT nor host
/// its replicas: two clients of one lock always share one replica set.
pub fn kad_protocol(n: usize) -> libp2p::StreamProtocol {
    if n == 32 {
        return KAD_PROTOCOL;
    }
    libp2p::StreamProtocol::try_from_owned(format!("/sigma/kad/1.0.0/n{n}")).unwrap_or(KAD_PROTOCOL)
}

impl NetworkBehaviour for Behaviour {
    type ConnectionHandler = <Inner as NetworkBehaviour>::ConnectionHandler;
    type ToSwarm = Event;

    fn handle_pending_inbound_connection(
        &mut self,
        connection_id: ConnectionId,
        local_addr: &Multiaddr,
        remote_addr: &Multiaddr,
    ) -> Result<(), ConnectionDenied> {
        self.inner.handle_pending_inbound_connection(connection_id, local_addr, remote_addr)
    }

    fn handle_established_inbound_connection(
        &mut self,
        connection_id: ConnectionId,
        peer: PeerId,
        local_addr: &Multiaddr,
        remote_addr: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        self.inner.handle_established_inbound_connection(connection_id, peer, local_addr, remote_addr)
    }

    fn handle_pending_outbound_connection(
        &mut self,
        connection_id: ConnectionId,
        maybe_peer: Option<PeerId>,
        addresses: &[Multiaddr],
        effective_role: Endpoint,
    ) -> Result<Vec<Multiaddr>, ConnectionDenied> {
        let mut addrs =
            self.inner.handle_pending_outbound_connection(connection_id, maybe_peer, addresses, effective_role)?;
        if let Some(extra) = maybe_peer.and_then(|p| self.extra_addrs.get(&p)) {
            let new: Vec<Multiaddr> =
                extra.iter().filter(|a| !addresses.contains(a) && !addrs.contains(a)).cloned().collect();
            addrs.extend(new);
        }
        Ok(addrs)
    }

    fn handle_established_outbound_connection(
        &mut self,
        connection_id: ConnectionId,
        peer: PeerId,
        addr: &Multiaddr,
        role_override: Endpoint,
        port_use: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        self.inner.handle_established_outbound_connection(connection_id, peer, addr, role_override, port_use)
    }

    fn on_swarm_event(&mut self, event: FromSwarm) {
        match &event {
            FromSwarm::ConnectionEstablished(e) => {
                *self.connected.entry(e.peer_id).or_default() += 1;
                self.last_used.insert(e.peer_id, self.clock.now());
                self.hand_over(e.peer_id);
            }
            FromSwarm::ExternalAddrConfirmed(e) => {
                if !self.externals.contains(e.addr) && self.externals.len() < MAX_EXTERNALS {
                    self.externals.push(e.addr.clone());
                    self.reachability_changed();
                }
            }
            FromSwarm::ExternalAddrExpired(e) => {
                if let Some(i) = self.externals.iter().position(|a| a == e.addr) {
                    self.externals.remove(i);
                    self.reachability_changed();
                }
            }
            FromSwarm::ConnectionClosed(e) => {
                if let Some(c) = self.connected.get_mut(&e.peer_id) {
                    *c = c.saturating_sub(1);
                    if *c == 0 {
                        self.connected.remove(&e.peer_id);
                        self.last_used.remove(&e.peer_id);
                        self.trimming.remove(&e.peer_id);
                        self.buckets.remove(&e.peer_id);
                        let now = self.clock.now();
                        self.membership.disconnected(e.peer_id, now);
                        self.housekeeping(now);
                    }
                }
            }
            _ => {}
        }
        self.inner.on_swarm_event(event);
    }

    fn on_connection_handler_event(
        &mut self,
        peer_id: PeerId,
        connection_id: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        self.inner.on_connection_handler_event(peer_id, connection_id, event)
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        let now = self.clock.now();
        self.housekeeping(now);
        loop {
            if let Some(e) = self.events.pop_front() {
                return Poll::Ready(ToSwarm::GenerateEvent(e));
            }
            if let Some((peer_id, id)) = self.to_close.pop_front() {
                return Poll::Ready(ToSwarm::CloseConnection { peer_id, connection: CloseConnection::One(id) });
            }
            if let Some(peer_id) = self.to_trim.pop_front() {
                return Poll::Ready(ToSwarm::CloseConnection { peer_id, connection: CloseConnection::All });
            }
            if let Some(peer) = self.to_dial.pop_front() {
                let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer)
                    .condition(libp2p::swarm::dial_opts::PeerCondition::DisconnectedAndNotDialing)
                    .build();
                return Poll::Ready(ToSwarm::Dial { opts });
            }
            match self.inner.poll(cx) {
                Poll::Ready(ToSwarm::GenerateEvent(e)) => {
                    self.on_inner(e);
                    continue;
                }
                Poll::Ready(other) => {
                    return Poll::Ready(other.map_out(|_: InnerEvent| unreachable!("GenerateEvent is handled above")))
                }
                Poll::Pending => {}
            }
            // What the events handled so far queued for other peers goes now, a
            // transport request per peer; request-response picks it up on the next pass.
            if self.flush_outbox() {
                continue;
            }
            // One timer, reset only when the core's next deadline comes before it; at
            // most MAX_TIMER away (see there; the membership housekeeping also needs a
            // wake-up at least that often). Waking early is harmless.
            let cap = self.clock.now() + MAX_TIMER;
            let at = self.next_deadline().map_or(cap, |at| at.min(cap));
            if self.timer.as_ref().is_none_or(|(t, _)| *t > at) {
                let deadline = tokio::time::Instant::from_std(self.clock.instant(at));
                self.timer = Some((at, Box::pin(tokio::time::sleep_until(deadline))));
            }
            if let Some((_, sleep)) = self.timer.as_mut() {
                if sleep.as_mut().poll(cx).is_ready() {
                    self.timer = None;
                    let now = self.clock.now();
                    self.housekeeping(now);
                    self.handle_timeouts(now);
                    continue;
                }
            }
            self.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
    }
}
