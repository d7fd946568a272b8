//! The types the application sees: acquisition and probe ids, [`Event`],
//! [`AcquireError`], what can be asked of an acquisition or a hosted replica, and the
//! metrics ([`Counters`], [`StateSizes`], [`ReplicaTotals`]). Plain data: the
//! behaviour fills them, nothing here reads its state.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use libp2p::PeerId;

use crate::proto::{self, client::Phase};
use crate::wire::{self, Rejection, Reply};

// Up to the parent for documentation links only.
#[cfg(doc)]
use super::Behaviour;
#[cfg(doc)]
use crate::{proto::Client, wire::Request};

/// Identifies one acquisition started with [`Behaviour::acquire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AcquisitionId(pub(super) u64);

impl std::fmt::Display for AcquisitionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Why [`Behaviour::acquire`] refused to start.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AcquireError {
    /// The lock name is not valid on the wire.
    #[error("invalid lock name (1 to {max} bytes of [A-Za-z0-9._/-])", max = wire::MAX_RESOURCE_LEN)]
    BadName,
    /// The quorum is not a strict majority, or n is too large.
    #[error(transparent)]
    Quorum(#[from] proto::ConfigError),
    /// Quorum diversity out of range.
    #[error("min distinct peers {d} must be between 1 and m = {m}")]
    MinPeers {
        /// Asked for.
        d: usize,
        /// Quorum.
        m: usize,
    },
    /// A per-lock quorum must keep the swarm's n (the replica set every client of the
    /// lock uses) and ask for at least the swarm's m.
    #[error("per-lock quorum n = {n}, m = {m} refused: this swarm uses n = {swarm_n}, m ≥ {swarm_m}")]
    SwarmQuorum {
        /// Replicas asked for.
        n: usize,
        /// Votes asked for.
        m: usize,
        /// The swarm's replica count.
        swarm_n: usize,
        /// The swarm's quorum.
        swarm_m: usize,
    },
    /// A value larger than [`wire::MAX_VALUE_LEN`].
    #[error("value of {len} bytes refused: at most {max} bytes", max = wire::MAX_VALUE_LEN)]
    ValueTooLarge {
        /// Its length.
        len: usize,
    },
}

/// Events for the application.
#[derive(Clone, Debug)]
pub enum Event {
    /// The acquisition holds the lock.
    Acquired {
        /// The acquisition.
        id: AcquisitionId,
        /// Lock name.
        resource: String,
        /// Fencing token.
        token: u64,
        /// Exclusion is guaranteed until then (extended by renewals).
        valid_until: Instant,
        /// Votes held.
        votes: usize,
        /// Distinct peers hosting those votes (the safety bound assumes independent
        /// replicas; in a small swarm several replicas share a peer).
        distinct_peers: usize,
    },
    /// The lock is no longer guaranteed exclusive; release it.
    Lost {
        /// The acquisition.
        id: AcquisitionId,
        /// Why.
        reason: proto::LostReason,
    },
    /// An acquisition that held the lock was revoked: by an operator through a
    /// [`wire::Request::Revoke`] from `by`, or locally (`by` is this peer). The lock has
    /// been released; whoever used it must stop.
    Revoked {
        /// The acquisition.
        id: AcquisitionId,
        /// Lock name.
        resource: String,
        /// Its fencing token.
        token: u64,
        /// Who revoked it.
        by: PeerId,
    },
    /// A [`Behaviour::inspect`] finished.
    Inspected {
        /// The inspection.
        id: ProbeId,
        /// What the host of each replica answered, by replica index.
        replicas: Vec<ReplicaAnswer>,
    },
    /// A [`Behaviour::ask`] was answered (or failed: `None`).
    Answered {
        /// The question.
        id: ProbeId,
        /// The peer's reply.
        reply: Option<Reply>,
    },
    /// A [`Behaviour::probe`] finished.
    Probed {
        /// The probe.
        id: ProbeId,
        /// Round trip to each replica's host, by replica index (`None`: no answer).
        /// Replicas hosted locally answer in zero time.
        rtts: Vec<Option<Duration>>,
    },
}

/// Identifies a [`Behaviour::probe`], [`Behaviour::inspect`] or [`Behaviour::ask`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProbeId(pub(super) u64);

/// What the host of one replica answered a [`Behaviour::inspect`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicaAnswer {
    /// The replica's state (hosted here when `host` is this peer).
    State {
        /// The host that answered.
        host: PeerId,
        /// Its replica.
        state: wire::ReplicaState,
    },
    /// The host refused (e.g. `NotServing`: it is joining or in a minority).
    Refused {
        /// The host.
        host: PeerId,
        /// Why.
        reason: Rejection,
    },
    /// No answer (unreachable, timed out, or redirected too often).
    NoAnswer {
        /// The last host tried.
        host: PeerId,
    },
}

/// What the application can ask about one acquisition.
#[derive(Clone, Debug)]
pub struct AcquisitionInfo {
    /// Lock name.
    pub resource: String,
    /// Phase.
    pub phase: Phase,
    /// Fencing token (0 before the win).
    pub token: u64,
    /// Votes held.
    pub votes: usize,
    /// Place in line ([`Client::position`]): 0 when holding, k when it would win at
    /// the k-th turn; `None` until m replicas have answered.
    pub position: Option<u32>,
    /// Exclusion guaranteed until then, when holding.
    pub valid_until: Option<Instant>,
}

/// One replica hosted by this peer.
#[derive(Clone, Debug)]
pub struct ReplicaInfo {
    /// Lock name.
    pub resource: String,
    /// Replica index (0-based; the DHT name uses index + 1).
    pub index: u16,
    /// Current owner (peer, Lamport counter) and its grant stamp.
    pub owner: Option<(PeerId, u64, u64)>,
    /// Waiters in service order (peer, counter).
    pub queue: Vec<(PeerId, u64)>,
}

/// Sizes of the behaviour's per-lock and per-peer state (metrics, soak tests). Each has
/// a bound or an expiry: see ARCHITECTURE.md, "Bounded state".
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StateSizes {
    /// Hosted replicas (idle ones are dropped once they have nothing to remember).
    pub replicas: usize,
    /// Acquisitions in progress or held.
    pub acquisitions: usize,
    /// Cached replica hosts.
    pub hosts: usize,
    /// Finished acquisitions remembered (late grants are handed back).
    pub finished: usize,
    /// Outbound requests awaiting a reply.
    pub pending: usize,
    /// Kademlia lookups in flight.
    pub lookups: usize,
    /// Queue entries (owners and waiters) of remote peers' acquisitions in the hosted
    /// replicas.
    #[serde(default)]
    pub entries: usize,
    /// Keys with an ownership verdict or lookup (hosted replicas plus running checks).
    #[serde(default)]
    pub ownership: usize,
}

/// Counters exported as metrics.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// Requests received by kind (request, release, yield, notify).
    pub messages_in: BTreeMap<&'static str, u64>,
    /// Requests sent by kind.
    pub messages_out: BTreeMap<&'static str, u64>,
    /// Inbound requests refused, by reason.
    pub rejected: BTreeMap<&'static str, u64>,
    /// Inbound requests that failed: malformed (not a valid CBOR request, unknown kind),
    /// oversized, timeouts, closed connections.
    pub inbound_failures: BTreeMap<&'static str, u64>,
    /// Outbound requests that failed, by kind of failure.
    pub outbound_failures: BTreeMap<&'static str, u64>,
    /// Redirects sent (not the closest live peer for a key).
    pub redirects_sent: u64,
    /// Redirects followed.
    pub redirects_followed: u64,
    /// Kademlia lookups started to find a replica's host.
    pub lookups: u64,
    /// Ownership lookups started (a key about to be hosted, or hosted for a while).
    pub ownership_checks: u64,
    /// Ownership lookups that found a closer peer: the key's requests went there.
    pub ownership_lost: u64,
    /// Keys found this peer's from its neighbourhood (the last self-lookup), without a
    /// lookup of their own ([`Behaviour::provably_mine`]).
    pub ownership_by_neighbourhood: u64,
    /// Self-lookups whose answer was not taken as the neighbourhood: timed out, or
    /// fewer than k peers found while some peer asked did not answer (not every peer
    /// there is).
    pub self_lookups_incomplete: u64,
    /// Kademlia bootstraps cut to their self-lookup: a join, or a refresh of every
    /// bucket sooner than half [`KAD_REFRESH`](super::config::KAD_REFRESH) after the last.
    pub bootstraps_cut: u64,
    /// Kademlia requests sent, by what their query was for: `bootstrap` (joining, or
    /// refreshing the buckets), `self` (a driver's self-lookup), `neighbourhood` (a
    /// host's self-lookup, for the neighbourhood ownership decides by; both answers
    /// are the neighbourhood), `host` (a replica's host),
    /// `ownership` (a key's ownership check), `other` (lookups asked from outside).
    pub kad_requests: BTreeMap<&'static str, u64>,
    /// Replicas this peer started hosting with empty memory (resets seen from inside).
    pub replicas_created: u64,
    /// Replicas dropped because a closer peer became live (it hosts them now).
    pub replicas_handed_over: u64,
    /// Replicas dropped because this peer stopped serving (minority, stall).
    pub replicas_dropped_not_serving: u64,
    /// Replicas started under the takeover delay.
    pub replicas_held: u64,
    /// Idle replicas dropped (nothing left to remember; not a reset).
    pub replicas_evicted: u64,
    /// Addresses of other peers not kept: narrower than this peer's own reach, or not
    /// dialable ([`crate::addr`]).
    pub addresses_ignored: u64,
    /// Client messages sent again after a host refused them for the request budget.
    pub resent: u64,
    /// Refused messages given up (sent again 10 times, or past the bound of those
    /// waiting): a RELEASE's votes lapse with their leases, the core retries the others.
    pub resends_abandoned: u64,
    /// Departed peers that left a full k-bucket for a connected newcomer.
    pub departed_replaced: u64,
    /// Departed members forgotten (past the membership window) that left the routing
    /// table.
    pub departed_forgotten: u64,
    /// Members removed from the counts by their own signed leave (a graceful stop).
    pub members_left: u64,
    /// Members forgotten by the operator (`sigma admin forget`).
    pub members_forgotten_by_operator: u64,
    /// Connections closed because a liveness ping failed.
    pub ping_failures: u64,
    /// Liveness pings of this peer answered (round trips of libp2p's ping: 32 bytes each
    /// way; the pings this peer answers are its peers' count).
    pub pings: u64,
    /// Membership gossip tables (requests and replies) sent and received, and their
    /// bytes: the CBOR the gossip protocol writes on its stream ([`GossipCodec`](super::GossipCodec);
    /// the multiplexer's and the encryption's framing not counted).
    pub gossip_out: u64,
    pub gossip_in: u64,
    pub gossip_bytes_out: u64,
    pub gossip_bytes_in: u64,
    /// Peers disconnected to stay under the connection watermarks (least recently used).
    pub connections_trimmed: u64,
    /// Times the event loop was found stalled past the liveness timeout.
    pub stalls: u64,
    /// Gauge: serving now (joined, majority reachable).
    pub serving: bool,
    /// Gauge: still joining the swarm.
    pub joining: bool,
    /// Gauge: not serving for want of a majority of the members counted before a
    /// recent join ([`Readiness::Joint`](crate::Readiness::Joint)).
    pub joint: bool,
    /// Gauge: joint quorums pending (newcomers counted here that not every earlier
    /// member is known to count yet).
    pub joints_pending: usize,
    /// Gauge: known sigma peers, this one included.
    pub members: usize,
    /// Gauge: of which connected, this one included.
    pub reachable_members: usize,
    /// Responses refused by a local acquisition (stale, too far ahead, …), by reason.
    pub responses_refused: BTreeMap<&'static str, u64>,
    /// Acquisitions started, won, lost.
    pub acquisitions: u64,
    /// Acquisitions that won.
    pub acquired: u64,
    /// Acquisitions that lost the lock while holding it.
    pub lost: u64,
    /// Held locks revoked by an operator ([`Behaviour::revoke`], [`Request::Revoke`]).
    pub revoked: u64,
    /// Acquisitions finished (released or abandoned) that had won.
    pub completed: u64,
    /// Protocol messages of those acquisitions, in the paper's sense (REQUEST, YIELD,
    /// RELEASE sent and RESPONSEs received, wherever the replica was): the numerator of
    /// "messages per CS entry".
    pub completed_messages: u64,
    /// Transport requests sent on the sigma protocol: a message sent alone or a batch
    /// of them ([`Request::Batch`]) counts one. Against [`Counters::completed`]:
    /// transport requests per CS entry.
    pub requests_out: u64,
    /// Of which batches.
    pub batches_out: u64,
    /// Transport requests received (a batch counts one).
    pub requests_in: u64,
}

impl Counters {
    pub(super) fn bump(map: &mut BTreeMap<&'static str, u64>, key: &'static str) {
        *map.entry(key).or_default() += 1;
    }
}

/// What the membership has cost on the wire so far ([`Behaviour::traffic`](super::Behaviour::traffic)):
/// the fields of [`Counters`] of the same names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Gossip tables sent and received (requests and replies).
    pub gossip_out: u64,
    pub gossip_in: u64,
    /// Their bytes, sent and received.
    pub gossip_bytes_out: u64,
    pub gossip_bytes_in: u64,
    /// Liveness pings of this peer answered.
    pub pings: u64,
}

/// Totals of the hosted replicas' own counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaTotals {
    /// Replicas hosted.
    pub hosted: usize,
    /// Votes granted.
    pub grants: u64,
    /// RELEASEs applied.
    pub releases: u64,
    /// YIELDs applied.
    pub yields: u64,
    /// Owner leases that ran out.
    pub lease_expiries: u64,
}
