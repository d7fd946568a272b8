//! [`Gossip`]: the behaviour's side of the membership gossip, as plain state. This
//! peer's heartbeat proofs ([`crate::liveness`]), when each request in flight was sent
//! (its round trip bounds the transit of the ages in the reply), the rounds (every few,
//! one target is a member not connected), and the departed members to dial again while
//! this peer does not serve. The rules of membership are [`crate::membership`]'s; the
//! rounds and merges are the behaviour's (`members.rs`).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use libp2p::request_response::OutboundRequestId;
use libp2p::PeerId;

use crate::liveness::Chain;
use crate::proto::Time;

/// Most gossip requests whose send time is kept (past it, a reply's transit is taken
/// from the ping round trip instead).
pub(super) const MAX_GOSSIP_IN_FLIGHT: usize = 4096;

/// Every this many gossip rounds, one target is a member that is not connected.
const GOSSIP_MIXING: u64 = 4;

/// How often a peer that does not serve dials departed members again, and how many at
/// a time (picked at random): a healed partition reconnects without waiting for
/// traffic (the side that does not serve dials the other), and a peer under churn, where
/// most departed members are dead for good, spends at most two dials a second on them.
const REDIAL_INTERVAL: Duration = Duration::from_secs(2);
pub(super) const REDIAL_BATCH: usize = 4;

/// The gossip's bookkeeping (see the module's doc).
pub(super) struct Gossip {
    /// This peer's own heartbeat proofs.
    pub(super) chain: Chain,
    /// When each gossip request in flight was sent (at most [`MAX_GOSSIP_IN_FLIGHT`];
    /// removed on its reply or failure).
    sent: HashMap<OutboundRequestId, Time>,
    /// Gossip rounds so far.
    rounds: u64,
    /// When the next round is due.
    next_round: Time,
    /// Departed members to dial again (a healed partition reconnects by itself), and
    /// when they are next picked.
    to_dial: VecDeque<PeerId>,
    next_redial: Time,
}

impl Gossip {
    pub(super) fn new(chain: Chain) -> Self {
        Gossip {
            chain,
            sent: HashMap::new(),
            rounds: 0,
            next_round: Duration::ZERO,
            to_dial: VecDeque::new(),
            next_redial: Duration::ZERO,
        }
    }

    /// Whether a round is due at `now` (the next is then filed `interval` later).
    pub(super) fn round_due(&mut self, now: Time, interval: Duration) -> bool {
        if now < self.next_round {
            return false;
        }
        self.next_round = now + interval;
        true
    }

    /// When the next round is due.
    pub(super) fn next_round(&self) -> Time {
        self.next_round
    }

    /// A round starts; answers whether it is a mixing one (a target not connected).
    pub(super) fn start_round(&mut self) -> bool {
        self.rounds += 1;
        self.rounds.is_multiple_of(GOSSIP_MIXING)
    }

    /// Request `id` went at `now`.
    pub(super) fn sent(&mut self, id: OutboundRequestId, now: Time) {
        if self.sent.len() < MAX_GOSSIP_IN_FLIGHT {
            self.sent.insert(id, now);
        }
    }

    /// Request `id` was answered or failed: when it was sent, if kept.
    pub(super) fn answered(&mut self, id: &OutboundRequestId) -> Option<Time> {
        self.sent.remove(id)
    }

    /// Whether departed members are due to be picked for a redial at `now` (the next
    /// pick is then filed).
    pub(super) fn redial_due(&mut self, now: Time) -> bool {
        if now < self.next_redial {
            return false;
        }
        self.next_redial = now + REDIAL_INTERVAL;
        true
    }

    /// Queues departed members to dial.
    pub(super) fn dial(&mut self, peers: impl IntoIterator<Item = PeerId>) {
        self.to_dial.extend(peers);
    }

    /// The next departed member to dial.
    pub(super) fn pop_dial(&mut self) -> Option<PeerId> {
        self.to_dial.pop_front()
    }
}
