//! Where each replica lives. The host of a replica key as a client sees it (cached,
//! found by a Kademlia lookup, corrected by redirects); hand-over to a closer peer that
//! became live; and ownership on the host side, as the behaviour drives it: the lookups
//! that decide it, the requests served or redirected on a verdict, the replica handed
//! over when a closer peer is found. The verdicts are [`Ownerships`]' (`ownership.rs`);
//! the routing table and the neighbourhood they decide by are `routing.rs`'s.

#[cfg(doc)]
use super::ownership::Ownerships;

use libp2p::kad::{self, KBucketKey};
use libp2p::{Multiaddr, PeerId};

use super::key::ReplicaKey;
use super::outbox::ReplyTo;
use super::ownership::{Ownership, Parked};
use super::routing::{found_every_peer, Neighbourhood};
use super::types::Counters;
// Up to the parent for `Behaviour` alone: this file is one of its `impl` blocks (the
// methods of one role, which coordinate that role's state with the others').
use super::Behaviour;
use crate::proto::Time;
use crate::wire::{self, Rejection, Reply};

/// Peers an ownership lookup looks for: enough that one unreachable neighbour of the
/// key does not decide it.
const OWNERSHIP_LOOKUP_PEERS: std::num::NonZeroUsize = std::num::NonZeroUsize::new(3).expect("non-zero");

impl Behaviour {
    /// The live sigma peer closest to the replica's key, if closer than this peer. Live:
    /// an alive member (connected, or its heartbeat fresh through gossip); members are
    /// sigma peers (one that merely connects, such as a light client or another
    /// protocol's peer, hosts nothing).
    pub(super) fn closer_live_peer(&self, key: &ReplicaKey) -> Option<PeerId> {
        self.membership.closest_alive(key.kad(), &self.local_key)
    }

    /// Drops the hosted replicas that `peer` is closer to, once it is a live sigma peer
    /// (connected and in the routing table): it hosts them now. A copy kept here would
    /// go on expiring leases and promoting waiters that have moved to the new host,
    /// granting those votes a second time; if `peer` leaves, this peer starts them again
    /// with empty memory (a reset).
    pub(super) fn hand_over(&mut self, peer: PeerId) {
        if !self.connections.is_connected(&peer) || !self.routing.is_routable(&peer) {
            return;
        }
        let now = self.clock.now();
        self.membership.connected(peer, now);
        self.hand_over_to(peer);
    }

    /// Drops the hosted replicas whose key `peer`, alive now, is closer to.
    pub(super) fn hand_over_to(&mut self, peer: PeerId) {
        let theirs = KBucketKey::from(peer);
        let local_key = &self.local_key;
        let gone = self.hosting.closer_to(&theirs, local_key);
        for key in &gone {
            self.drop_replica(key);
        }
        let dropped = gone.len();
        if dropped > 0 {
            self.counters.replicas_handed_over += dropped as u64;
            tracing::debug!(%peer, dropped, "replicas handed over to a closer peer");
        }
    }

    /// The host of a replica: cached, else the closest of this peer and its routing table.
    pub(super) fn host(&mut self, key: &ReplicaKey) -> PeerId {
        if let Some(p) = self.acquiring.cached_host(key.resource(), key.index()) {
            return p;
        }
        let best = self
            .routing
            .keys()
            .chain(self.dialable().then_some(&self.local_key))
            .map(|p| (p.distance(key.kad()), *p.preimage()))
            .min()
            .map_or(self.local, |(_, p)| p);
        self.acquiring.cache_host(key, best);
        best
    }

    pub(super) fn lookup(&mut self, key: &ReplicaKey) {
        if self.lookups.values().any(|k| k == key) {
            return;
        }
        // The host is the closest peer: a lookup of the few closest (as an ownership
        // check) ends after about two rounds of α = 3 requests, where one of the k = 20
        // closest asks about 45 peers. The host checks its ownership itself, and a
        // wrong guess is redirected.
        let q = self.inner.kad.get_n_closest_peers(key.name(), OWNERSHIP_LOOKUP_PEERS);
        self.counters.lookups += 1;
        self.lookups.insert(q, key.clone());
    }

    /// Whether this peer may serve the key now: its last ownership lookup found no
    /// closer peer. A peer that knows no other sigma peer (a one-node swarm) owns every
    /// key without asking.
    pub(super) fn owns(&mut self, key: &ReplicaKey) -> bool {
        match self.ownerships.get(key) {
            Some(Ownership::Owned { .. }) => true,
            Some(Ownership::Checking { .. }) => false,
            None if self.routing.is_empty() => {
                let at = self.clock.now() + self.config.ownership_ttl;
                self.ownerships.owned(key, at);
                true
            }
            None => match self.provably_mine(key) {
                Some(until) => {
                    self.counters.ownership_by_neighbourhood += 1;
                    self.ownerships.owned(key, until);
                    true
                }
                None => false,
            },
        }
    }

    /// Whether the key is this peer's by its neighbourhood alone, and until when: the
    /// last self-lookup is younger than the ownership TTL, neither a peer it found nor a
    /// peer in the routing table nor a live member is closer to the key, and the key is
    /// within half the distance to the farthest of the k peers it found. Then no peer
    /// outside them can be closer (XOR distances obey the triangle inequality:
    /// d(p, key) ≥ d(p, self) − d(self, key) ≥ radius − d(self, key) > d(self, key)), and
    /// a lookup of the key's own would find what the self-lookup found. The verdict
    /// expires with the self-lookup (its time plus the TTL), so a second host unknown to
    /// this one serves no longer than with a lookup per key.
    fn provably_mine(&mut self, key: &ReplicaKey) -> Option<Time> {
        let now = self.clock.now();
        let until = self.routing.neighbourhood()?.at + self.config.ownership_ttl;
        if now >= until {
            return None;
        }
        let key = key.kad();
        let nb = self.routing.neighbourhood()?;
        let mine = self.local_key.distance(key);
        let inside = match (mine.ilog2(), nb.radius.and_then(|r| r.ilog2())) {
            (None, _) => true, // the key is this peer's id
            (Some(_), None) => nb.radius.is_none(),
            // mine < 2^(a+1) ≤ 2^(b-1) ≤ radius / 2
            (Some(a), Some(b)) => a + 2 <= b,
        };
        let closer = |p: &KBucketKey<PeerId>| p.distance(key) < mine;
        if !inside
            || nb.peers.iter().any(closer)
            || self.routing.keys().any(closer)
            || self.membership.closest_alive(key, &self.local_key).is_some()
        {
            return None;
        }
        if now.saturating_sub(nb.at) >= self.config.ownership_ttl / 2 {
            self.refresh_neighbourhood();
        }
        Some(until)
    }

    /// Starts a self-lookup ([`Behaviour::lookup_self`]: one at a time) when the
    /// neighbourhood is older than half the ownership TTL: keys that come next are
    /// decided without lookups of their own.
    fn refresh_neighbourhood(&mut self) {
        let _ = self.self_lookup("neighbourhood");
    }

    /// Whether a request from `from` may wait for the key's ownership lookup: the
    /// lookups and the requests waiting are bounded, and a remote peer's request that
    /// would create a replica past the caps is refused before any lookup.
    pub(super) fn room_to_check(&self, from: PeerId, key: &ReplicaKey) -> Result<(), Rejection> {
        self.ownerships.room(key)?;
        self.hosting.room_for(from, key)
    }

    /// Holds a client message until the key's ownership lookup answers (starting one).
    pub(super) fn park(&mut self, key: &ReplicaKey, parked: Parked) {
        if let Some(parked) = self.ownerships.park(key, parked) {
            let query = self.check_ownership(key);
            self.ownerships.checking(key, query, parked);
        }
    }

    /// Starts an ownership lookup for `key`: the few peers closest to it.
    fn check_ownership(&mut self, key: &ReplicaKey) -> kad::QueryId {
        let query = self.inner.kad.get_n_closest_peers(key.name(), OWNERSHIP_LOOKUP_PEERS);
        self.counters.ownership_checks += 1;
        self.refresh_neighbourhood();
        let at = self.clock.now() + self.config.ownership_timeout;
        self.ownerships.check_started(key, query, at);
        query
    }

    /// An ownership lookup answered with `peers` (those it heard from): the key is this
    /// peer's if none of them, nor any live peer it knows, is closer. Waiting requests
    /// are served, or sent to the closer peer; a hosted replica goes to it.
    pub(super) fn ownership_checked(&mut self, key: ReplicaKey, peers: &[kad::PeerInfo]) {
        let mine = self.local_key.distance(key.kad());
        let closer = peers
            .iter()
            .map(|i| (KBucketKey::from(i.peer_id).distance(key.kad()), i.peer_id))
            .filter(|(d, p)| *d < mine && *p != self.local)
            .min()
            .map(|(_, p)| p)
            .or_else(|| self.closer_live_peer(&key));
        let now = self.clock.now();
        let parked = self.ownerships.take_parked(&key);
        match closer {
            None => {
                self.ownerships.owned(&key, now + self.config.ownership_ttl);
                for p in parked {
                    self.serve_parked(&key, p);
                }
            }
            Some(peer) => {
                self.counters.ownership_lost += 1;
                self.ownerships.lost(&key);
                if self.hosting.contains(&key) {
                    self.drop_replica(&key);
                    self.counters.replicas_handed_over += 1;
                }
                tracing::debug!(resource = %key.resource(), index = key.index(), %peer, "ownership lookup: a closer peer hosts the key");
                for p in parked {
                    match p.reply_to {
                        to @ (ReplyTo::Channel(_) | ReplyTo::Slot { .. }) => {
                            let reply = self.redirect(peer);
                            self.respond(to, reply);
                        }
                        ReplyTo::Local => {
                            self.acquiring.cache_host(&key, peer);
                            if p.hops < self.config.max_redirects {
                                Counters::bump(&mut self.counters.messages_out, "redirected");
                                self.send_to_replica(key.clone(), p.n, p.msg, p.hops + 1);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Serves a message that waited for its key's ownership lookup, which found the
    /// key this peer's.
    fn serve_parked(&mut self, key: &ReplicaKey, p: Parked) {
        if let ReplyTo::Local = p.reply_to {
            if self.membership.serving() {
                self.serve_local(key, p.msg, p.heard);
            }
            return;
        }
        let reply = if !self.membership.serving() {
            Reply::Rejected(Rejection::NotServing)
        } else {
            match self.handle_replica(p.from, key, p.msg, p.heard) {
                Ok(responses) => Reply::Responses(responses),
                Err(r) => Reply::Rejected(r),
            }
        };
        if let Reply::Rejected(r) = &reply {
            Counters::bump(&mut self.counters.rejected, r.as_str());
        }
        self.respond(p.reply_to, reply);
    }

    /// An ownership entry is due: a lookup that ran too long is decided on what it has
    /// heard (finished now, its answer comes as an event); a hosted key is looked up
    /// again; an entry whose replica has gone is forgotten.
    pub(super) fn ownership_due(&mut self, key: ReplicaKey, now: Time) {
        let Some(running) = self.ownerships.running(&key) else {
            self.ownerships.set_due(&key, None);
            return;
        };
        if let Some(query) = running {
            match self.inner.kad.query_mut(&query) {
                Some(mut q) => {
                    q.finish();
                    self.ownerships.set_due(&key, Some(now + self.config.ownership_timeout));
                }
                None => {
                    // Already finished; its answer was lost: decide on nothing heard.
                    self.ownerships.cancel_check(&query);
                    self.ownership_checked(key, &[]);
                }
            }
        } else if self.hosting.contains(&key) && !self.routing.is_empty() {
            if let Some(until) = self.provably_mine(&key) {
                self.counters.ownership_by_neighbourhood += 1;
                self.ownerships.set_due(&key, Some(until));
                return;
            }
            let query = self.check_ownership(&key);
            self.ownerships.rechecking(key, query);
        } else if self.hosting.contains(&key) {
            self.ownerships.set_due(&key, Some(now + self.config.ownership_ttl));
        } else {
            self.ownerships.remove(&key);
        }
    }

    /// A redirect to `closer`, with the addresses this peer knows for it.
    pub(super) fn redirect(&mut self, closer: PeerId) -> Reply {
        self.counters.redirects_sent += 1;
        let mut addrs: Vec<Multiaddr> = Vec::new();
        for b in self.inner.kad.kbuckets() {
            for e in b.iter() {
                if *e.node.key.preimage() == closer {
                    addrs.extend(e.node.value.iter().cloned());
                }
            }
        }
        addrs.truncate(wire::MAX_REDIRECT_ADDRS);
        Reply::Redirect { peer: closer, addrs }
    }

    /// Forgets a key's ownership verdict (its replica has gone); a running check stays:
    /// requests wait for it.
    pub(super) fn forget_ownership(&mut self, key: &ReplicaKey) {
        self.ownerships.forget(key);
    }

    /// A `get_closest_peers` query progressed: its requests are counted by purpose; when
    /// it ends, its answer is this peer's neighbourhood (a self-lookup), an ownership
    /// verdict (a check) or the host of a key (a client's lookup). The peers it found
    /// are candidates for the routing table.
    pub(super) fn on_closest_peers(
        &mut self,
        id: kad::QueryId,
        result: kad::GetClosestPeersResult,
        step: kad::ProgressStep,
        stats: kad::QueryStats,
    ) {
        let purpose = if let Some(purpose) = self.routing.self_lookup_purpose(id) {
            purpose
        } else if self.ownerships.is_check(&id) {
            "ownership"
        } else if self.lookups.contains_key(&id) {
            "host"
        } else {
            "other"
        };
        *self.counters.kad_requests.entry(purpose).or_default() += u64::from(stats.num_requests());
        if !step.last {
            return;
        }
        let complete = result.is_ok();
        let peers = match result {
            Ok(ok) => ok.peers,
            Err(kad::GetClosestPeersError::Timeout { peers, .. }) => peers,
        };
        if let Some(unreached) = self.routing.self_lookup_ended(id) {
            // Only a lookup that finished counts (a timed-out one may have
            // missed closer peers), and one that found fewer than k peers only
            // if every peer it asked answered but departed ones
            // (`found_every_peer`).
            let found: Vec<KBucketKey<PeerId>> =
                peers.iter().filter(|i| i.peer_id != self.local).map(|i| KBucketKey::from(i.peer_id)).collect();
            let departed = unreached.iter().filter(|p| !self.membership.is_alive(p)).count();
            if complete && found_every_peer(found.len(), stats.num_failures(), departed) {
                let radius = (found.len() >= kad::K_VALUE.get())
                    .then(|| found.iter().map(|p| p.distance(&self.local_key)).max())
                    .flatten();
                self.routing.found_neighbourhood(Neighbourhood { peers: found, radius, at: self.clock.now() });
            } else {
                self.counters.self_lookups_incomplete += 1;
            }
        }
        for info in &peers {
            for a in &info.addrs {
                self.add_address(&info.peer_id, a.clone());
            }
        }
        if let Some(key) = self.ownerships.check_answered(&id) {
            self.ownership_checked(key, &peers);
            return;
        }
        let Some(key) = self.lookups.remove(&id) else { return };
        let best = peers
            .iter()
            .map(|i| i.peer_id)
            .chain(self.dialable().then_some(self.local))
            .map(|p| (KBucketKey::from(p).distance(key.kad()), p))
            .min()
            .map_or(self.local, |(_, p)| p);
        self.acquiring.cache_host(&key, best);
    }
}
