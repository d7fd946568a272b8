//! Messages between a Sigma client and one logical replica (paper Fig. 5 and Fig. 6).
//!
//! Addressing (which resource, which replica index) is the driver's business: the core
//! sees one replica at a time. Every message names the acquisition it is about by its
//! [`Timestamp`], which is how duplicates and reordered messages are recognised.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::clock::Timestamp;

/// Client to replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToReplica<C> {
    /// REQUEST (Fig. 5 `Request`): asks for the replica's vote. Re-sent with the same
    /// timestamp on informed backoff (§4) and, by the owner, as a lease renewal.
    Request {
        /// The acquisition; its client must be the authenticated sender.
        ts: Timestamp<C>,
        /// The client's clock (µs) when it sent this; echoed in the answer so the client
        /// knows which request a response answers (lease accounting, round-trip time).
        sent: u64,
        /// A stamp the replica must move past before its next grant: the largest grant
        /// stamp this client has seen from the replica, or its fencing token once it
        /// holds the lock.
        floor: u64,
    },
    /// RELEASE (Fig. 5 `Release`): leave the critical section, or give up waiting.
    Release {
        /// The acquisition being released.
        ts: Timestamp<C>,
        /// The client's fencing token (0 if it never won), so the next grant is above it.
        token: u64,
        /// With [`super::config::Recovery::Relay`]: the acquisitions that come next at the
        /// replicas the sender owned (at most [`RELAY_DEPTH`], earliest first). A replica
        /// that does not know one asks it for its REQUEST, as on a RELAY: a replica that
        /// lost the line in a reset gets it back at the next handoff, for no message.
        #[serde(default = "Vec::new")]
        next: Vec<Timestamp<C>>,
    },
    /// YIELD (Fig. 5, case 3): "RELEASE + REQUEST": hand the vote back and wait in the
    /// queue under the original timestamp.
    Yield {
        /// The acquisition yielding its vote.
        ts: Timestamp<C>,
        /// The grant handed back: the stamp of the response that made this acquisition
        /// owner. A replica applies the YIELD to that grant only, which makes a
        /// duplicated or re-sent YIELD harmless.
        stamp: u64,
    },
    /// RELAY (beyond the paper, [`super::config::Recovery::Relay`]): the owner `ts` tells
    /// a replica whose queue lacks them the acquisitions that come next at the other
    /// replicas (at most [`RELAY_DEPTH`]); the replica asks each one it does not know
    /// for its REQUEST (a RESPONSE with `solicit`). Hints only: nothing is granted on
    /// them.
    Relay {
        /// The sender's acquisition: owner or waiter here (or just released).
        ts: Timestamp<C>,
        /// The next waiters elsewhere, earliest first.
        next: Vec<Timestamp<C>>,
    },
}

/// Most acquisitions named by a RELAY, a RELEASE or a RESPONSE's `next`: the line is
/// relayed two handoffs ahead of its head. (With two, a reset replica asked for the next
/// head's REQUEST at the handoff before its turn often had it too late: the request and
/// the REQUEST take two one-way delays, a handoff about one and a half.)
pub const RELAY_DEPTH: usize = 3;

impl<C> ToReplica<C> {
    /// The acquisition this message is about.
    pub fn ts(&self) -> &Timestamp<C> {
        match self {
            ToReplica::Request { ts, .. }
            | ToReplica::Release { ts, .. }
            | ToReplica::Yield { ts, .. }
            | ToReplica::Relay { ts, .. } => ts,
        }
    }

    /// Short name of the message kind (metrics, logs).
    pub fn kind(&self) -> &'static str {
        match self {
            ToReplica::Request { .. } => "request",
            ToReplica::Release { .. } => "release",
            ToReplica::Yield { .. } => "yield",
            ToReplica::Relay { .. } => "relay",
        }
    }
}

/// RESPONSE (Fig. 6 `SendResponse`): the replica's current owner, sent to a client.
///
/// Sent as the answer to a REQUEST or YIELD, and unsolicited to a queue head that has
/// just been promoted to owner (Fig. 6 `RespQueue`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response<C> {
    /// The acquisition this response is addressed to.
    pub ts: Timestamp<C>,
    /// The replica's current owner (`C_owner`, `T_owner`). A replica that answers
    /// always has an owner: it has just granted, or queued behind someone.
    pub owner: Timestamp<C>,
    /// The grant stamp of the current owner: strictly increasing per replica (hybrid
    /// logical clock), so a client discards responses older than one it already has,
    /// and the basis of fencing tokens.
    pub stamp: u64,
    /// The addressee's place: 0 when it is the owner, `k` when it is the k-th waiter
    /// (k − 1 waiters ahead of it).
    pub position: u32,
    /// Informed backoff (§4): `T_w = T_cs · (P + 1/2)`, the time after which a waiter
    /// that has not been served should re-send its REQUEST.
    pub advice: Duration,
    /// The lease the replica grants its owner.
    pub lease: Duration,
    /// The `sent` field of the last REQUEST from the addressee this replica processed.
    pub echo: u64,
    /// For the owner: how long after receiving that REQUEST its current lease started
    /// (0 for an immediate grant or a renewal; the time spent queued for a promotion).
    /// The lease at the replica ends after `echo` + `grant_delay` + `lease` however
    /// long this response spent in flight, which is what the client counts.
    pub grant_delay: Duration,
    /// True when this is the unsolicited notice to a promoted queue head.
    pub promoted: bool,
    /// INQUIRE (Maekawa), to the owner: an older acquisition has asked for this vote.
    /// An owner that has not won yields it ([`super::config::Recovery::Inquire`]); a
    /// holder ignores it. Absent (false) in messages of peers that never send it.
    #[serde(default)]
    pub inquire: bool,
    /// To the owner, with [`super::config::Recovery::Relay`]: the first waiters of this
    /// replica's queue (at most [`RELAY_DEPTH`]), so that the owner can tell a replica
    /// that lacks them (RELAY). Empty otherwise.
    #[serde(default = "Vec::new")]
    pub next: Vec<Timestamp<C>>,
    /// "Send me your REQUEST": an acquisition ahead of the addressee relayed that it
    /// comes next, and this replica does not know it. `owner` and `stamp` are the
    /// replica's current ones (with no owner, the addressee and the last stamp issued);
    /// nothing else in this response is about the addressee, and the client reads
    /// nothing but this flag.
    #[serde(default)]
    pub solicit: bool,
}
