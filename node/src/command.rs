//! The node's command protocol: what [`crate::NodeHandle`] asks of the event loop, each
//! command with the channel for its answer, and the answers' types. The layers read
//! top-down: `node` (the handle) and `event_loop` depend on this module and on
//! `guard`; `guard` depends on neither (its releases travel on their own channel,
//! [`crate::guard::Release`]).

use std::time::Duration;

use libp2p::{Multiaddr, PeerId};
use serde::{Deserialize, Serialize};
use sigma_behaviour::wire::{Reply, Request};
use sigma_behaviour::{ReplicaAnswer, ReplicaInfo};
use tokio::sync::oneshot;

use crate::error::LockError;
use crate::guard::LockGuard;

/// Where a probe's round trips go (by replica index; `None`: no answer).
pub(crate) type ProbeReply = oneshot::Sender<Result<Vec<Option<Duration>>, LockError>>;
/// Where an inspection's answers go (by replica index).
pub(crate) type SurveyReply = oneshot::Sender<Result<Vec<ReplicaAnswer>, LockError>>;

/// A request to the event loop, with the channel for its answer.
pub(crate) enum Command {
    Lock {
        name: String,
        quorum: Option<(usize, usize)>,
        min_peers: Option<usize>,
        timeout: Option<Duration>,
        /// The value attached from the start.
        value: Option<Vec<u8>>,
        reply: oneshot::Sender<Result<LockGuard, LockError>>,
    },
    ReleaseByToken {
        name: String,
        token: u64,
        reply: oneshot::Sender<bool>,
    },
    Status {
        reply: oneshot::Sender<Status>,
    },
    Inspect {
        name: String,
        reply: oneshot::Sender<Vec<ReplicaInfo>>,
    },
    Counters {
        reply: oneshot::Sender<crate::metrics::Snapshot>,
    },
    Probe {
        name: String,
        n: Option<usize>,
        reply: ProbeReply,
    },
    /// Asks the hosts of all of a lock's replicas for their state.
    Survey {
        name: String,
        /// Answer with what came within this long (the rest as no answer); `None`: wait
        /// for every answer or its request timeout.
        deadline: Option<Duration>,
        reply: SurveyReply,
    },
    /// This node's readiness (serving, joining, a minority…).
    Readiness {
        reply: oneshot::Sender<sigma_behaviour::Readiness>,
    },
    /// Sends one operator's request (holding, revoke) to one peer, this one included.
    Ask {
        peer: libp2p::PeerId,
        request: Box<Request>,
        reply: oneshot::Sender<Option<Reply>>,
    },
    Shutdown {
        reply: oneshot::Sender<()>,
    },
    /// Blocks (or unblocks) peers; answers the peers blocked afterwards.
    Block {
        peers: Vec<libp2p::PeerId>,
        block: bool,
        reply: oneshot::Sender<Vec<libp2p::PeerId>>,
    },
    /// The names of these peers that have one (by peer id).
    Names {
        peers: Vec<libp2p::PeerId>,
        reply: oneshot::Sender<std::collections::BTreeMap<String, String>>,
    },
    /// The operator's word that peers are gone for good; answers each one's outcome.
    Forget {
        peers: Vec<libp2p::PeerId>,
        reply: oneshot::Sender<Vec<(libp2p::PeerId, Result<(), sigma_behaviour::ForgetError>)>>,
    },
}

/// A lock waited for through this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WaitingLock {
    /// Lock name.
    pub name: String,
    /// Place in line: the turn at which m replicas would serve this waiter (1 = next);
    /// `None` until m replicas have answered.
    pub position: Option<u32>,
    /// Votes it holds already.
    pub votes: usize,
}

/// A member of the swarm as this node sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemberPeer {
    /// Its peer id.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub peer: PeerId,
    /// Alive here now (connected, or its heartbeat fresh); else departed.
    pub alive: bool,
}

/// A snapshot of the node (`GET /v1/status`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Status {
    /// This node.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub peer_id: PeerId,
    /// This node's name (`sigma run --name`), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Addresses it listens on.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub listen_addrs: Vec<Multiaddr>,
    /// Addresses other peers can dial it at (given, listen addresses as wide as the
    /// bootstrap peers', or confirmed by AutoNAT); none: it hosts no replica.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub external_addrs: Vec<Multiaddr>,
    /// Peers with an open connection.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub connected_peers: Vec<PeerId>,
    /// Open connections (bounded: `--max-connections`).
    pub connections: u32,
    /// Peers known to the Sigma behaviour's routing view.
    pub routable_peers: usize,
    /// Logical replicas hosted here (all locks).
    pub replicas_hosted: usize,
    /// Locks held through this node: (name, fencing token).
    pub locks_held: Vec<(String, u64)>,
    /// Locks being waited for through this node (one entry per waiting caller).
    pub locks_waiting: Vec<String>,
    /// The same waits with their places in line.
    pub waiting: Vec<WaitingLock>,
    /// Acquisitions through this node whose fencing token was not above the previous
    /// token this node saw for the same lock (should stay 0; see [`LockGuard::token`]).
    pub token_regressions: u64,
    /// True while the node serves: it has joined its swarm and reaches a strict
    /// majority of the peers it knows. Locks are won only through serving nodes.
    pub ready: bool,
    /// `serving`, `joining`, `unreachable` (no external address: hosts no replica, its
    /// locks are served by the others), `leaving`, `minority` or `joint` (a majority of
    /// its members, not of those it knew before a recent join).
    pub readiness: String,
    /// Why, in words.
    pub readiness_detail: String,
    /// Known sigma peers (present, or departed within the membership window), this
    /// node included.
    pub members: usize,
    /// Of which alive now (connected, or heartbeat fresh through the membership
    /// gossip), this node included.
    pub reachable_members: usize,
    /// The takeover delay: a replica this node takes over grants nothing for this long.
    pub takeover_delay_ms: u64,
    /// How long replicas started now would still grant nothing because serving began
    /// (the takeover delay after a start or a rejoin): a new lock waits that long. 0
    /// when nothing is held back.
    #[serde(default)]
    pub held_back_ms: u64,
    /// Members that departed (not alive here, still counted: what `sigma admin forget`
    /// takes out of the counts), the first 256 in id order.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub departed_members: Vec<libp2p::PeerId>,
    /// The other members (present or departed), the first 256 in id order.
    #[serde(default)]
    pub member_peers: Vec<MemberPeer>,
    /// The names the peers listed here announced (by peer id; a peer without a name,
    /// or not yet identified, is not listed). Labels for people, not identities.
    #[serde(default)]
    pub peer_names: std::collections::BTreeMap<String, String>,
    /// Sizes of the per-lock and per-peer state (each bounded: ARCHITECTURE.md,
    /// "Bounded state").
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub state: sigma_behaviour::StateSizes,
}
