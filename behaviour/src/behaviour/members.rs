//! The other members, as the behaviour drives [`crate::membership`]: readiness, the
//! housekeeping (replicas dropped when serving stops, departed members redialled,
//! deferred acquisitions started once ready), the heartbeat gossip, and connection
//! trimming past the watermarks (the least recently used first, never one used within
//! [`TRIM_GRACE`]).

use std::time::Duration;

use libp2p::{request_response, PeerId};

use super::gossip::REDIAL_BATCH;
use super::types::Counters;
// Up to the parent for `Behaviour` alone: this file is one of its `impl` blocks (the
// methods of one role, which coordinate that role's state with the others').
use super::Behaviour;
use crate::membership::Readiness;
use crate::proto::{client::Phase, Client, Time};
use crate::wire::{self, Rejection};

#[cfg(doc)]
use super::config::TRIM_GRACE;
#[cfg(doc)]
use crate::membership::Membership;

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

    /// Up to `most` departed members (not alive here, not left), in id order: what an
    /// operator may forget ([`Behaviour::forget`]).
    pub fn departed_members(&self, most: usize) -> Vec<PeerId> {
        let mut departed: Vec<PeerId> = self.membership.departed().copied().collect();
        departed.sort_unstable();
        departed.truncate(most);
        departed
    }

    /// Up to `most` members other than this peer (present or departed), in id order,
    /// each with whether it is alive here now.
    pub fn member_list(&self, most: usize) -> Vec<(PeerId, bool)> {
        let mut members: Vec<PeerId> = self.membership.peers().copied().collect();
        members.sort_unstable();
        members.truncate(most);
        members.into_iter().map(|p| (p, self.membership.is_alive(&p))).collect()
    }

    /// Whether `peer` is alive in this peer's view now.
    pub fn is_alive(&self, peer: &PeerId) -> bool {
        self.membership.is_alive(peer)
    }

    /// The behaviour's clock now, and the members this peer's view dropped within the
    /// takeover delay, in the order it dropped them, each with when (on that clock): for
    /// a harness that measures detection and false removals, reading them more often
    /// than the delay (the list is cleared past the membership's bound on members).
    pub fn recent_departures(&self) -> (Time, &[(PeerId, Time)]) {
        (self.clock.now(), self.membership.recent_departures())
    }

    /// Whether `peer` is a member here (alive, or departed within the window).
    pub fn is_member(&self, peer: &PeerId) -> bool {
        self.membership.is_alive(peer) || self.membership.is_departed(peer)
    }

    /// How long a replica started now would still grant nothing because serving began
    /// (the takeover delay after a start, a rejoin or a stall), if at all: new locks
    /// wait that long here. Zero when none is held back.
    pub fn held_back(&self) -> Duration {
        let now = self.clock.now();
        self.membership.hold_until(now, |_| false).map_or(Duration::ZERO, |t| t.saturating_sub(now))
    }

    /// Joint quorums pending here: newcomers this peer counts that not every member it
    /// counted before them is known to count yet (docs/design/membership.md, "Joins
    /// before a cut: a joint quorum"). While one is pending, this peer serves only if
    /// it also reaches a strict majority of those members ([`Readiness::Joint`]).
    pub fn joints_pending(&self) -> usize {
        self.membership.joints_pending()
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
        if !self.membership.serving() && self.gossip.redial_due(now) {
            use rand::seq::IteratorRandom;
            let departed = self.membership.departed().copied().choose_multiple(&mut self.rng, REDIAL_BATCH);
            self.gossip.dial(departed);
        }
        let restarted = self.membership.tick(now);
        // A member departed for the whole window leaves the routing table too: Kademlia
        // itself never takes a peer out (a failed dial keeps its last address), and
        // lookups would go on trying it.
        for peer in self.membership.take_forgotten() {
            if !self.connections.is_connected(&peer) {
                self.leave_routing_table(peer);
                self.counters.departed_forgotten += 1;
            }
        }
        if restarted && !self.hosting.is_empty() {
            self.counters.replicas_dropped_not_serving += self.hosting.len() as u64;
            tracing::info!(dropped = self.hosting.len(), readiness = %self.membership.readiness(), "not serving: replicas dropped");
            for key in self.hosting.clear() {
                self.forget_ownership(&key);
            }
        }
        if self.membership.ready() {
            for id in self.acquiring.take_deferred() {
                if let Some(a) = self.acquiring.get_mut(&id) {
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
    /// enough are open, and keeps busy those it uses); every few rounds (`Gossip::start_round`)
    /// one target is an alive member in the routing table that is not connected, so
    /// that the gossip graph is Kademlia's (connected) one and not only the set of
    /// connections of the moment. While a joint quorum is pending here, one target is a
    /// member it waits on ([`Membership::awaited`]): its reply ends the joint quorum in
    /// about as many rounds as the view has members, where random targets take a
    /// coupon collector's N ln N / fanout. (A member known only by gossip may have no
    /// address here: it is never a target.)
    pub(super) fn gossip_round(&mut self, now: Time) {
        use rand::seq::{IteratorRandom, SliceRandom};
        if self.membership.readiness() == Readiness::Leaving {
            return;
        }
        if !self.dialable() && !self.membership.needs_voucher() {
            // Not a member anywhere: no peer would take its table. Until it has heard a
            // serving peer, it still asks: the answer says whether that peer serves.
            return;
        }
        self.membership.beat();
        let mixing = self.gossip.start_round();
        let fanout = self.config.gossip_fanout;
        let (connections, routing) = (&self.connections, &self.routing);
        let reachable = |p: &&PeerId| connections.is_connected(p) || routing.is_routable(p);
        let awaited = self.membership.awaited().filter(reachable).copied().choose(&mut self.rng);
        let (mut near, far): (Vec<PeerId>, Vec<PeerId>) = self
            .membership
            .alive()
            .filter(reachable)
            .filter(|p| Some(**p) != awaited)
            .copied()
            .partition(|p| connections.is_connected(p));
        let fanout = fanout - usize::from(awaited.is_some());
        let mix = usize::from(mixing || near.len() < fanout);
        let mut targets = far.into_iter().choose_multiple(&mut self.rng, mix.max(fanout.saturating_sub(near.len())));
        targets.truncate(fanout);
        let rest = fanout - targets.len();
        near.shuffle(&mut self.rng);
        targets.extend(near.into_iter().take(rest));
        targets.extend(awaited);
        if targets.is_empty() {
            return;
        }
        let table = self.gossip_table(now);
        for peer in targets {
            self.used(peer);
            let id = self.inner.gossip.send_request(&peer, table.clone());
            self.gossip.sent(id, now);
        }
    }

    /// Leaves the swarm (a graceful stop; call once every lock held through this peer is
    /// released or abandoned): stops serving and drops every hosted replica, then sends
    /// this peer's signed leave to every connected member, which removes it from their
    /// counts at once and relays it (docs/design/membership.md, "Leaving and
    /// forgetting"). Answers to how many members it was sent; drive the swarm a moment
    /// longer for the messages to go out. Nothing is served after it: the owner stops.
    pub fn leave(&mut self) -> usize {
        self.membership.leave();
        let now = self.clock.now();
        self.housekeeping(now);
        let Some(leave) = self.gossip.chain.leave() else { return 0 };
        let table = wire::Gossip::leave_only(leave);
        let targets: Vec<PeerId> = self
            .connections
            .peers()
            .filter(|p| self.membership.is_alive(p) || self.routing.is_routable(p))
            .copied()
            .collect();
        for peer in &targets {
            self.inner.gossip.send_request(peer, table.clone());
        }
        tracing::info!(told = targets.len(), "leaving the swarm");
        self.wake();
        targets.len()
    }

    /// An operator's word that `peers` are gone for good (`sigma admin forget`): each
    /// is removed from this peer's counts at once (see
    /// [`Membership::forget`](crate::membership::Membership::forget)); answers each
    /// peer's outcome. Only this peer forgets: run it on every survivor.
    pub fn forget(&mut self, peers: &[PeerId]) -> Vec<(PeerId, Result<(), crate::membership::ForgetError>)> {
        let now = self.clock.now();
        let outcomes: Vec<_> = peers.iter().map(|p| (*p, self.membership.forget(p, now))).collect();
        for (p, outcome) in &outcomes {
            match outcome {
                Ok(()) => {
                    self.counters.members_forgotten_by_operator += 1;
                    tracing::warn!(peer = %p, "member forgotten by the operator");
                }
                Err(why) => tracing::info!(peer = %p, %why, "not forgotten"),
            }
        }
        self.housekeeping(now);
        self.wake();
        outcomes
    }

    /// An external address was confirmed or expired: serving follows (a peer that
    /// became dialable serves under the takeover delay, one that no longer is drops its
    /// replicas).
    pub(super) fn reachability_changed(&mut self) {
        let dialable = self.dialable();
        self.membership.set_dialable(dialable);
        tracing::info!(dialable, externals = ?self.routing.externals(), "external addresses changed");
        let now = self.clock.now();
        self.housekeeping(now);
        self.wake();
    }

    /// `peer`'s connection was just used (not trimmed for a while).
    pub(super) fn used(&mut self, peer: PeerId) {
        let now = self.clock.now();
        self.connections.used(peer, now);
    }

    /// Past the high watermark, the least recently used peers not used within
    /// [`TRIM_GRACE`] are disconnected down to the low one (looked at on every event: a
    /// few dozen connections cost little to sort, and a dial refused at the limit costs
    /// a retry).
    fn trim_connections(&mut self, now: Time) {
        if let Some(queued) = self.connections.trim(now, self.config.connection_watermarks) {
            self.counters.connections_trimmed += queued as u64;
            if self.connections.trims_waiting() {
                self.wake();
            }
        }
    }

    /// This peer's heartbeat and those of the members alive here, for a round.
    pub(super) fn gossip_table(&mut self, now: Time) -> wire::Gossip {
        let own_proof = self.gossip.chain.proof(self.membership.own_beat().1);
        self.membership.table(self.local, own_proof, now, None, &[])
    }

    /// Merges a gossip table from `peer`, a sigma peer (in the routing table, or an
    /// alive member): members that became alive take over the keys they are closer to;
    /// a joining peer joins through `peer` if it serves ([`Membership::joined_through`]).
    /// `echo`: the exchange number of a request (its reply is then
    /// [`Membership::reply`]), none for a reply. `transit`: how long the table may
    /// have been on its way (a reply: the round trip of its request; a request: the
    /// connection's last ping round trip), added to every age in it, so that a relayed
    /// beat is never taken as fresher than it is by the time spent between peers.
    pub(super) fn merge_gossip(&mut self, peer: PeerId, gossip: &wire::Gossip, echo: Option<u64>, transit: Duration) {
        if !gossip.is_valid() {
            Counters::bump(&mut self.counters.inbound_failures, "gossip_oversized");
            return;
        }
        if !self.routing.is_routable(&peer) && !self.membership.is_alive(&peer) {
            Counters::bump(&mut self.counters.inbound_failures, "gossip_not_member");
            return;
        }
        let now = self.clock.now();
        let arrival = crate::membership::Arrival { transit, echo };
        let merged = self.membership.merge(&self.local, peer, gossip, arrival, now, crate::liveness::wall_ms());
        for why in &merged.refused {
            Counters::bump(&mut self.counters.inbound_failures, why.as_str());
        }
        for left in &merged.left {
            self.counters.members_left += 1;
            tracing::info!(peer = %left, via = %peer, "member left the swarm");
        }
        for p in merged.woke {
            self.hand_over_to(p);
        }
        if merged.joined {
            tracing::info!(through = %peer, "joined the swarm: ready");
        }
        self.housekeeping(now);
    }

    /// An event of the gossip's request-response: a table to merge and answer, the
    /// answer to ours, a failure.
    pub(super) fn on_gossip(&mut self, event: request_response::Event<wire::Gossip, wire::Gossip>) {
        match event {
            request_response::Event::Message { peer, message, .. } => match message {
                request_response::Message::Request { request, channel, .. } => {
                    if !self.take_token(peer) {
                        Counters::bump(&mut self.counters.rejected, Rejection::RateLimited.as_str());
                        return;
                    }
                    let exchange = self.membership.next_exchange();
                    // Its transit is not known here: the connection's last ping round
                    // trip stands for it (the liveness ping timeout if none yet).
                    let transit = self.connections.rtt(&peer).unwrap_or(self.config.ping_timeout);
                    self.merge_gossip(peer, &request, Some(exchange), transit);
                    let now = self.clock.now();
                    let own_proof = self.gossip.chain.proof(self.membership.own_beat().1);
                    let table = self.membership.reply(self.local, own_proof, now, &request, exchange);
                    let _ = self.inner.gossip.send_response(channel, table);
                }
                request_response::Message::Response { request_id, response } => {
                    // The round trip bounds the reply's transit and the wait before it.
                    let transit = match self.gossip.answered(&request_id) {
                        Some(sent) => self.clock.now().saturating_sub(sent),
                        None => self.connections.rtt(&peer).unwrap_or(self.config.ping_timeout),
                    };
                    self.merge_gossip(peer, &response, None, transit);
                }
            },
            request_response::Event::InboundFailure { .. } => {
                Counters::bump(&mut self.counters.inbound_failures, "gossip");
            }
            request_response::Event::OutboundFailure { request_id, .. } => {
                self.gossip.answered(&request_id);
                Counters::bump(&mut self.counters.outbound_failures, "gossip");
            }
            request_response::Event::ResponseSent { .. } => {}
        }
    }
}
