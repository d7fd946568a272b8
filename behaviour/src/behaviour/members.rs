//! The other members, as the behaviour drives [`crate::membership`]: readiness, the
//! housekeeping (replicas dropped when serving stops, departed members redialled,
//! deferred acquisitions started once ready), the heartbeat gossip, and connection
//! trimming past the watermarks (the least recently used first, never one used within
//! [`TRIM_GRACE`]).

use std::collections::HashMap;
use std::time::Duration;

use libp2p::PeerId;

use super::{AcquisitionId, Behaviour, Counters, TRIM_GRACE};
use crate::membership::Readiness;
use crate::proto::{client::Phase, Client, Time};
use crate::wire;

#[cfg(doc)]
use crate::membership::Membership;

/// Every this many gossip rounds, one target is a member that is not connected.
const GOSSIP_MIXING: u64 = 4;

/// How often a peer that does not serve dials departed members again, and how many at
/// a time (picked at random): a healed partition reconnects without waiting for
/// traffic (the side that does not serve dials the other), and a peer under churn, where
/// most departed members are dead for good, spends at most two dials a second on them.
const REDIAL_INTERVAL: Duration = Duration::from_secs(2);
const REDIAL_BATCH: usize = 4;

impl Behaviour {
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
    pub(super) fn housekeeping(&mut self, now: Time) {
        self.trim_connections(now);
        self.relax_diversity(now);
        // Only while not serving: a serving peer hears of its departed members again by
        // the gossip, and in a large swarm on a loaded machine, where members look
        // departed whenever the gossip runs late, every serving peer redialling them made
        // hundreds of dials a second, which made the gossip later still.
        if now >= self.next_redial && !self.membership.serving() {
            use rand::seq::IteratorRandom;
            self.next_redial = now + REDIAL_INTERVAL;
            let departed = self.membership.departed().copied().choose_multiple(&mut self.rng, REDIAL_BATCH);
            self.to_dial.extend(departed);
        }
        let restarted = self.membership.tick(now);
        // A member departed for the whole window leaves the routing table too: Kademlia
        // itself never takes a peer out (a failed dial keeps its last address), and
        // lookups would go on trying it.
        for peer in self.membership.take_forgotten() {
            if !self.connected.contains_key(&peer) {
                self.leave_routing_table(peer);
                self.counters.departed_forgotten += 1;
            }
        }
        if restarted && !self.replicas.is_empty() {
            self.counters.replicas_dropped_not_serving += self.replicas.len() as u64;
            tracing::info!(dropped = self.replicas.len(), readiness = %self.membership.readiness(), "not serving: replicas dropped");
            let owned: Vec<(String, u16)> = self.replicas.keys().cloned().collect();
            for key in &owned {
                self.forget_ownership(key);
            }
            self.replicas = HashMap::new();
            self.replica_due.clear();
            self.created_by = HashMap::new();
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

    /// One gossip round: this peer's heartbeat advances and its table goes to a few
    /// random alive members, connected ones first (gossip opens no connection while
    /// enough are open, and keeps busy those it uses); every [`GOSSIP_MIXING`] rounds
    /// one target is an alive member in the routing table that is not connected, so
    /// that the gossip graph is Kademlia's (connected) one and not only the set of
    /// connections of the moment. (A member known only by gossip may have no address
    /// here: it is never a target.)
    pub(super) fn gossip_round(&mut self, now: Time) {
        use rand::seq::{IteratorRandom, SliceRandom};
        if !self.dialable() && !self.membership.needs_voucher() {
            // Not a member anywhere: no peer would take its table. Until it has heard a
            // serving peer, it still asks: the answer says whether that peer serves.
            return;
        }
        self.membership.beat();
        self.gossip_rounds += 1;
        let fanout = self.config.gossip_fanout;
        let (connected, routable) = (&self.connected, &self.routable);
        let (mut near, far): (Vec<PeerId>, Vec<PeerId>) = self
            .membership
            .alive()
            .filter(|p| connected.contains_key(*p) || routable.contains_key(*p))
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
        let table = self.gossip_table(now, None);
        for peer in targets {
            self.used(peer);
            self.inner.gossip.send_request(&peer, table.clone());
        }
    }

    /// An external address was confirmed or expired: serving follows (a peer that
    /// became dialable serves under the takeover delay, one that no longer is drops its
    /// replicas).
    pub(super) fn reachability_changed(&mut self) {
        let dialable = self.dialable();
        self.membership.set_dialable(dialable);
        tracing::info!(dialable, externals = ?self.externals, "external addresses changed");
        let now = self.clock.now();
        self.housekeeping(now);
        self.wake();
    }

    /// `peer`'s connection was just used (not trimmed for a while).
    pub(super) fn used(&mut self, peer: PeerId) {
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

    /// This peer's heartbeat and those of the members alive here; in the reply to
    /// gossip request `reply_to`, only those newer than the request's
    /// ([`Membership::beats`](crate::membership::Membership::beats)).
    pub(super) fn gossip_table(&self, now: Time, reply_to: Option<u64>) -> wire::Gossip {
        let own = self.membership.own_beat();
        let beats = std::iter::once((self.local, own, Duration::ZERO, Some(self.membership.own_delay())))
            .chain(self.membership.beats(now, reply_to))
            .take(wire::MAX_GOSSIP_BEATS)
            .map(|(peer, (incarnation, counter), age, delay)| wire::Beat {
                peer,
                incarnation,
                counter,
                age_ms: u32::try_from(age.as_millis()).unwrap_or(u32::MAX),
                delay_ms: delay.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            })
            .collect();
        let delay_ms = u64::try_from(self.membership.members_delay().as_millis()).unwrap_or(u64::MAX);
        wire::Gossip { beats, serving: self.membership.serving(), delay_ms: Some(delay_ms) }
    }

    /// Merges a gossip table from `peer`, a sigma peer (in the routing table, or an
    /// alive member): members that became alive take over the keys they are closer to;
    /// a joining peer joins through `peer` if it serves ([`Membership::joined_through`]).
    /// `echo`: the exchange number of a request (its reply is then
    /// `gossip_table(now, echo)`), none for a reply.
    pub(super) fn merge_gossip(&mut self, peer: PeerId, gossip: wire::Gossip, echo: Option<u64>) {
        if !gossip.is_valid() {
            Counters::bump(&mut self.counters.inbound_failures, "gossip_oversized");
            return;
        }
        if !self.routable.contains_key(&peer) && !self.membership.is_alive(&peer) {
            Counters::bump(&mut self.counters.inbound_failures, "gossip_not_member");
            return;
        }
        let now = self.clock.now();
        let mut woke = Vec::new();
        for b in &gossip.beats {
            if b.peer == self.local {
                continue;
            }
            let age = Duration::from_millis(u64::from(b.age_ms));
            let beat = (b.incarnation, b.counter);
            if self.membership.heard(b.peer, beat, age, now, echo) {
                woke.push(b.peer);
            }
            if let Some(ms) = b.delay_ms {
                self.membership.heard_delay(&b.peer, beat, Duration::from_millis(ms));
            }
        }
        for p in woke {
            self.hand_over_to(p);
        }
        if gossip.serving && self.membership.needs_voucher() {
            let was_ready = self.membership.ready();
            let named = gossip.beats.iter().map(|b| b.peer).filter(|p| *p != self.local);
            let delay = gossip.delay_ms.map(Duration::from_millis);
            self.membership.joined_through(peer, named, delay, now);
            if !was_ready && self.membership.ready() {
                tracing::info!(through = %peer, "joined the swarm: ready");
            }
        }
        self.housekeeping(now);
    }
}
