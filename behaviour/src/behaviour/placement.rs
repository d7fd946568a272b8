//! Where each replica lives. The routing table and other peers' addresses; the host of
//! a replica key as a client sees it (cached, found by a Kademlia lookup, corrected by
//! redirects); and ownership on the host side: a key is served only while
//! [`Ownership::Owned`] (a lookup, or the last self-lookup's neighbourhood, found no
//! closer peer), and requests for a key being checked are parked, boundedly, until then.

use libp2p::kad::{self, KBucketKey};
use libp2p::{Multiaddr, PeerId};

use super::config::MAX_IDLE_HOSTS;
use super::key::ReplicaKey;
use super::outbox::ReplyTo;
use super::{kad_protocol, shrink_if_sparse, Behaviour, Counters, KAD_REFRESH};
use crate::addr::Scope;
use crate::proto::{Time, ToReplica};
use crate::wire::{self, Rejection, Reply};

#[cfg(doc)]
use super::Config;

/// Peers outside the routing table whose addresses are kept for dialling.
pub const MAX_EXTRA_ADDRESSES: usize = 4096;

/// Ownership lookups running at once; past it a request for a key not yet checked is
/// refused (`RateLimited`: retry later).
pub const MAX_OWNERSHIP_CHECKS: usize = 1024;
/// Requests that may wait for one key's ownership lookup.
pub const MAX_PARKED_PER_KEY: usize = 64;
/// Peers an ownership lookup looks for: enough that one unreachable neighbour of the
/// key does not decide it.
const OWNERSHIP_LOOKUP_PEERS: std::num::NonZeroUsize = std::num::NonZeroUsize::new(3).expect("non-zero");

/// Whether this peer may serve a key it would host (see [`Config::with_ownership`]).
pub(super) enum Ownership {
    /// A lookup runs; the key's requests wait for its answer.
    Checking { query: kad::QueryId, parked: Vec<Parked> },
    /// The last lookup found no closer peer; `recheck` runs while the replica is served.
    Owned { recheck: Option<kad::QueryId> },
}

/// A client message waiting for its key's ownership lookup: a remote peer's (answered
/// on `channel`) or a local acquisition's (`channel` none).
pub(super) struct Parked {
    pub(super) from: PeerId,
    /// When the message reached this peer: the replica's grant delay counts from then.
    pub(super) heard: Time,
    pub(super) n: u16,
    pub(super) msg: ToReplica<PeerId>,
    pub(super) hops: u8,
    pub(super) reply_to: ReplyTo,
}

/// This peer's Kademlia neighbourhood, as a self-lookup found it.
#[derive(Debug)]
pub(super) struct Neighbourhood {
    /// The closest peers that answered (up to k).
    pub(super) peers: Vec<KBucketKey<PeerId>>,
    /// The distance to the farthest of them when the lookup found k (else every peer
    /// there is was found: no bound).
    pub(super) radius: Option<kad::KBucketDistance>,
    /// When the lookup finished.
    pub(super) at: Time,
}

/// Peers whose failed dial a running self-lookup remembers ([`found_every_peer`]).
const MAX_UNREACHED: usize = 64;

/// Whether a finished self-lookup found every peer near this one, so that its answer
/// bounds nothing when it found fewer than k (see [`Behaviour::provably_mine`]). Kademlia
/// ends a lookup `Ok` when no peer is left to ask, a peer whose request failed counted
/// as done, and what that peer knew is never learned: a request on a connection that
/// closed as it idled, in an 80-peer swarm, left a lookup with 4 of its 21 peers. So it
/// must have found k peers, or each failure must be a dial that failed to a peer not
/// alive here (`departed_unreached`: departed, or never alive). Those are not missed:
/// a per-key ownership lookup ignores them too, and their keys went to the next
/// closest alive peer. Without that exception a swarm smaller than k + 1 had no
/// neighbourhood while a killed peer stayed in the routing tables (the membership
/// window, 10 minutes), and every fresh lock name waited for lookups (4 daemons, one
/// killed: fresh-name acquire p50 0.60 ms → 3.3 ms).
pub(super) fn found_every_peer(found: usize, failures: u32, departed_unreached: usize) -> bool {
    found >= kad::K_VALUE.get() || usize::try_from(failures).is_ok_and(|f| f <= departed_unreached)
}

impl Behaviour {
    /// Adds a known address of a peer (bootstrap, identify, a connected Kademlia peer).
    /// A peer new to a full k-bucket is left out: the bucket keeps its old peers.
    /// Only addresses at least as wide as this peer's own external ones are kept
    /// ([`crate::addr`]): a public peer forgets the loopback and LAN addresses others
    /// report, and never hands them on.
    pub fn add_address(&mut self, peer: &PeerId, addr: Multiaddr) {
        if *peer == self.local {
            return;
        }
        if !Scope::keeps(self.reach(), &addr) {
            self.counters.addresses_ignored += 1;
            return;
        }
        let full =
            self.inner.kad.kbucket(*peer).is_some_and(|b| {
                b.num_entries() >= kad::K_VALUE.get() && !b.iter().any(|e| e.node.key.preimage() == peer)
            });
        if full && !self.make_room_for(*peer) {
            self.remember_address(*peer, addr);
            return;
        }
        if !matches!(self.inner.kad.add_address(peer, addr), kad::RoutingUpdate::Failed) && self.route(*peer) {
            self.hand_over(*peer);
        }
    }

    /// Kademlia's rule for a full k-bucket: its peers stay, except one that departed (a
    /// member alive here once, neither connected nor alive now), which yields its place
    /// to a connected `peer`. A peer only heard of stays: in a forming swarm most entries
    /// are not yet alive here, and are not dead. Answers whether there is room now.
    fn make_room_for(&mut self, peer: PeerId) -> bool {
        if !self.connected.contains_key(&peer) {
            return false;
        }
        let (connected, membership) = (&self.connected, &self.membership);
        let departed = self.inner.kad.kbucket(peer).and_then(|b| {
            b.iter().map(|e| *e.node.key.preimage()).find(|p| !connected.contains_key(p) && membership.is_departed(p))
        });
        let Some(gone) = departed else { return false };
        self.leave_routing_table(gone);
        self.counters.departed_replaced += 1;
        tracing::debug!(%gone, %peer, "a departed peer left a full k-bucket for a connected one");
        true
    }

    /// Takes `peer` out of the routing table. Its addresses are kept among the extra
    /// ones, so a redial (of a departed member, say) can still find it.
    pub(super) fn leave_routing_table(&mut self, peer: PeerId) {
        if let Some(entry) = self.inner.kad.remove_peer(&peer) {
            for addr in entry.node.value.iter() {
                self.remember_address(peer, addr.clone());
            }
        }
        self.routable.remove(&peer);
    }

    /// What identify told of `peer`: the protocols it speaks and its addresses. A sigma
    /// peer whose Kademlia serves (it has an external address) is a host candidate: its
    /// addresses go to the routing table. One that speaks sigma without serving
    /// Kademlia is a client only (no peer can dial it): it leaves the routing table,
    /// and so the membership, if it was there.
    pub fn identified(&mut self, peer: &PeerId, protocols: &[libp2p::StreamProtocol], addrs: Vec<Multiaddr>) {
        if !protocols.contains(&wire::PROTOCOL) {
            return;
        }
        let kad = kad_protocol(self.config.proto.n());
        if protocols.contains(&kad) {
            for addr in addrs {
                self.add_address(peer, addr);
            }
        } else if self.routable.remove(peer).is_some() {
            self.inner.kad.remove_peer(peer);
            tracing::debug!(%peer, "a sigma peer without an external address: not a host");
        }
    }

    /// Keeps an address of a peer that the routing table has no room for (a host found
    /// by a lookup or named by a redirect), so that a dial to it can still be made.
    /// Bounded: past [`MAX_EXTRA_ADDRESSES`] peers the longest-known is forgotten.
    fn remember_address(&mut self, peer: PeerId, addr: Multiaddr) {
        if let Some(addrs) = self.extra_addrs.get_mut(&peer) {
            if !addrs.contains(&addr) {
                if addrs.len() >= wire::MAX_REDIRECT_ADDRS {
                    addrs.remove(0);
                }
                addrs.push(addr);
            }
            return;
        }
        if self.extra_addrs.len() >= MAX_EXTRA_ADDRESSES {
            if let Some(old) = self.extra_order.pop_front() {
                self.extra_addrs.remove(&old);
            }
        }
        self.extra_addrs.insert(peer, vec![addr]);
        self.extra_order.push_back(peer);
    }

    /// A Kademlia bootstrap, unless the last one started here is still running (then
    /// its id): a peer that retries while joining does not pile bootstraps (each one a
    /// lookup per bucket) onto a busy swarm.
    pub fn bootstrap(&mut self) -> Result<kad::QueryId, kad::NoKnownPeers> {
        if let Some(q) = self.bootstrap_query.filter(|q| self.inner.kad.query(q).is_some()) {
            return Ok(q);
        }
        let q = self.inner.kad.bootstrap()?;
        self.bootstrap_query = Some(q);
        Ok(q)
    }

    /// Cuts a bootstrap to its first step, the lookup of this peer's own id, when it
    /// joins this peer (`was_ready` false) or comes sooner than half [`KAD_REFRESH`]
    /// after the last refresh of the buckets: Kademlia's refresh of every bucket
    /// farther than the closest peer is a lookup per bucket (~10 at 1,000 peers, each
    /// asking ~30 peers, most of them not connected), and kad starts one of its own
    /// whenever a peer enters a table of fewer than k peers, so a joining peer paid two
    /// such refreshes (hundreds of connections) in a busy swarm. The far buckets fill
    /// from the lookups that reach this peer, and kad's periodic bootstrap refreshes
    /// them all every [`KAD_REFRESH`]. A cut step finishes before it sends anything.
    pub(super) fn cut_bootstrap(&mut self, id: kad::QueryId, step: kad::ProgressStep, was_ready: bool) {
        if step.count.get() == 1 && !step.last {
            let now = self.clock.now();
            if !was_ready || self.buckets_refreshed_lately(now) {
                self.buckets_refreshed.get_or_insert(now);
                self.remember_cut([id]);
                self.counters.bootstraps_cut += 1;
            } else {
                self.buckets_refreshed = Some(now);
            }
        }
        if step.last {
            self.cut_bootstraps.remove(&id);
        } else if self.cut_bootstraps.contains(&id) {
            if let Some(mut query) = self.inner.kad.query_mut(&id) {
                query.finish();
            }
        }
    }

    /// Finishes, before it asks more than a peer or two, a bootstrap that Kademlia
    /// started on its own while this peer is joined and its buckets were refreshed less
    /// than half [`KAD_REFRESH`] ago: kad starts one 500 ms after a peer enters a table
    /// of fewer than k peers, so every join was followed by a second self-lookup (~58
    /// requests at 500 peers, most to peers not connected). kad's periodic refresh
    /// comes later than that and runs whole; this peer's own bootstraps are
    /// [`Behaviour::cut_bootstrap`]'s. Looked at on every poll: a peer runs a handful of
    /// queries at a time.
    pub(super) fn cut_kads_bootstrap(&mut self) {
        if !self.buckets_refreshed_lately(self.clock.now()) || !self.membership.ready() {
            return;
        }
        let ours = self.bootstrap_query;
        let mut cut = Vec::new();
        for mut q in self.inner.kad.iter_queries_mut() {
            let id = q.id();
            if matches!(q.info(), kad::QueryInfo::Bootstrap { .. })
                && Some(id) != ours
                && !self.cut_bootstraps.contains(&id)
            {
                q.finish();
                cut.push(id);
            }
        }
        if !cut.is_empty() {
            self.remember_cut(cut);
        }
    }

    /// Whether the buckets were refreshed (or this peer joined) less than half
    /// [`KAD_REFRESH`] ago: a bootstrap now is cut to its self-lookup.
    fn buckets_refreshed_lately(&self, now: Time) -> bool {
        self.buckets_refreshed.is_some_and(|t| now.saturating_sub(t) < KAD_REFRESH / 2)
    }

    /// Files bootstraps being cut; the ids of queries kad no longer knows are dropped
    /// first (the bound of `cut_bootstraps`).
    fn remember_cut(&mut self, ids: impl IntoIterator<Item = kad::QueryId>) {
        let kad = &self.inner.kad;
        self.cut_bootstraps.retain(|q| kad.query(q).is_some());
        self.cut_bootstraps.extend(ids);
    }

    /// A Kademlia lookup of this peer's own id: cheaper than a bootstrap (one query, not
    /// one per bucket), and what makes peers that joined at about the same time learn
    /// of each other. One at a time, and none while the neighbourhood the last one found
    /// is younger than half the ownership TTL (`Ok(None)`): its answer is the
    /// neighbourhood ownership decides by ([`Behaviour::has_neighbourhood`]), which hosts
    /// refresh that often anyway, and each lookup asks about 45 peers, most of them not
    /// connected in a swarm larger than the connection bound. Fails only with an empty
    /// routing table.
    pub fn lookup_self(&mut self) -> Result<Option<kad::QueryId>, kad::NoKnownPeers> {
        self.self_lookup("self")
    }

    /// [`Behaviour::lookup_self`], its Kademlia requests counted under `purpose`.
    fn self_lookup(&mut self, purpose: &'static str) -> Result<Option<kad::QueryId>, kad::NoKnownPeers> {
        if self.inner.kad.kbuckets().all(|b| b.num_entries() == 0) {
            return Err(kad::NoKnownPeers());
        }
        if let Some((q, _)) = self.neighbourhood_query.filter(|(q, _)| self.inner.kad.query(q).is_some()) {
            return Ok(Some(q));
        }
        let now = self.clock.now();
        if self.neighbourhood.as_ref().is_some_and(|nb| {
            now.saturating_sub(nb.at) < self.config.ownership_ttl / 2 && !self.neighbourhood_misses_members(nb)
        }) {
            return Ok(None);
        }
        let q = self.inner.kad.get_closest_peers(self.local);
        self.neighbourhood_query = Some((q, purpose));
        self.neighbourhood_unreached.clear();
        Ok(Some(q))
    }

    /// Notes a peer whose dial failed while a self-lookup runs: if it is not alive
    /// here, the lookup's failed request to it is no peer missed (below).
    pub(super) fn unreached_while_looking(&mut self, peer: PeerId) {
        let unreached = &mut self.neighbourhood_unreached;
        if self.neighbourhood_query.is_some() && unreached.len() < MAX_UNREACHED && !unreached.contains(&peer) {
            unreached.push(peer);
        }
    }

    /// Whether a neighbourhood that found every peer there was (fewer than k) lacks an
    /// alive member: a peer that joined after it, which a fresh self-lookup would reach
    /// (a small swarm's peers find each other this way; without it a third peer could
    /// stay unknown to the second for half the ownership TTL).
    fn neighbourhood_misses_members(&self, nb: &Neighbourhood) -> bool {
        nb.radius.is_none() && self.membership.alive().any(|p| !nb.peers.iter().any(|k| k.preimage() == p))
    }

    /// Whether a self-lookup has found this peer's neighbourhood, younger than the
    /// ownership TTL (keys near this peer are then decided without lookups).
    pub fn has_neighbourhood(&self) -> bool {
        let now = self.clock.now();
        self.neighbourhood.as_ref().is_some_and(|nb| now < nb.at + self.config.ownership_ttl)
    }

    /// The widest scope of this peer's confirmed external addresses (`None`: none yet).
    pub fn reach(&self) -> Option<Scope> {
        Scope::widest(&self.externals)
    }

    /// The swarm's confirmed external addresses, as this behaviour was told of them.
    pub fn external_addresses(&self) -> &[Multiaddr] {
        &self.externals
    }

    /// Whether other peers can dial this one: an external address is confirmed, or none
    /// is required ([`Config::with_external_address_required`]). A peer that cannot
    /// hosts nothing and never counts itself as a host.
    pub(super) fn dialable(&self) -> bool {
        !self.config.external_address_required || !self.externals.is_empty()
    }

    /// This peer's Kademlia key among the candidate hosts of a key, when others can
    /// dial it.
    pub(super) fn self_as_host_key(&self) -> Option<&KBucketKey<PeerId>> {
        self.dialable().then_some(&self.local_key)
    }

    /// Peers in the routing table as seen by this behaviour.
    pub fn routable_peers(&self) -> usize {
        self.routable.len()
    }

    /// Peers with an open connection.
    pub fn connected_peers(&self) -> impl Iterator<Item = &PeerId> {
        self.connected.keys()
    }

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
        if !self.connected.contains_key(&peer) || !self.routable.contains_key(&peer) {
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
        if let Some(p) = self.cached_host(key.resource(), key.index()) {
            return p;
        }
        let best = self
            .routable
            .values()
            .chain(self.dialable().then_some(&self.local_key))
            .map(|p| (p.distance(key.kad()), *p.preimage()))
            .min()
            .map_or(self.local, |(_, p)| p);
        self.cache_host(key, best);
        best
    }

    /// Caches the host of a replica of a lock with a live local acquisition (a slot per
    /// replica index this peer sent to: at most n per such lock); other locks' hosts are
    /// computed per message.
    pub(super) fn cache_host(&mut self, key: &ReplicaKey, peer: PeerId) {
        let (resource, index) = (key.resource(), key.index());
        if !self.live_locks.contains_key(resource) {
            return;
        }
        if !self.hosts.contains_key(resource) {
            self.hosts.insert(resource.to_owned(), Vec::new());
        }
        if let Some(slots) = self.hosts.get_mut(resource) {
            let i = usize::from(index);
            if slots.len() <= i {
                slots.resize(i + 1, None);
            }
            slots[i] = Some(peer);
        }
    }

    /// Files `peer` among the routing table's peers with its Kademlia key (hashed once,
    /// when it is new); answers whether it is new. Its addresses are updated often.
    pub(super) fn route(&mut self, peer: PeerId) -> bool {
        match self.routable.entry(peer) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(KBucketKey::from(peer));
                true
            }
        }
    }

    /// The cached host of a replica.
    pub(super) fn cached_host(&self, resource: &str, index: u16) -> Option<PeerId> {
        self.hosts.get(resource)?.get(usize::from(index)).copied().flatten()
    }

    /// Forgets the cached host of one replica (it could not be reached).
    pub(super) fn forget_host(&mut self, key: &ReplicaKey) {
        let slots = self.hosts.get_mut(key.resource());
        if let Some(slot) = slots.and_then(|slots| slots.get_mut(usize::from(key.index()))) {
            *slot = None;
        }
    }

    /// A lock's last local acquisition ended: its cached hosts stay for the idle TTL,
    /// the oldest idle lock's dropped while the idle slots are over [`MAX_IDLE_HOSTS`].
    pub(super) fn hosts_idle(&mut self, resource: &str) {
        if let Some(slots) = self.hosts.get(resource) {
            self.idle_slots += slots.len();
            let until = self.clock.now() + self.config.idle_hosts_ttl;
            self.idle_hosts.set(&resource.to_owned(), Some(until));
        }
        while self.idle_slots > MAX_IDLE_HOSTS {
            let Some(lock) = self.idle_hosts.first_key() else { break };
            self.forget_idle_hosts(lock);
        }
    }

    /// A lock without a live local acquisition gets one: its cached hosts, if idle, are
    /// in use again.
    pub(super) fn hosts_in_use(&mut self, resource: &str) {
        if self.idle_hosts.is_filed(resource) {
            self.idle_hosts.set(&resource.to_owned(), None);
            self.idle_slots = self.idle_slots.saturating_sub(self.hosts.get(resource).map_or(0, Vec::len));
        }
    }

    /// Drops an idle lock's cached hosts.
    pub(super) fn forget_idle_hosts(&mut self, lock: String) {
        self.idle_hosts.set(&lock, None);
        let slots = self.hosts.remove(&lock).map_or(0, |slots| slots.len());
        self.idle_slots = self.idle_slots.saturating_sub(slots);
        shrink_if_sparse(&mut self.hosts);
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
        match self.ownership.get(key) {
            Some(Ownership::Owned { .. }) => true,
            Some(Ownership::Checking { .. }) => false,
            None if self.routable.is_empty() => {
                let at = self.clock.now() + self.config.ownership_ttl;
                self.ownership.insert(key.clone(), Ownership::Owned { recheck: None });
                self.ownership_due.set(key, Some(at));
                true
            }
            None => match self.provably_mine(key) {
                Some(until) => {
                    self.counters.ownership_by_neighbourhood += 1;
                    self.ownership.insert(key.clone(), Ownership::Owned { recheck: None });
                    self.ownership_due.set(key, Some(until));
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
        let until = self.neighbourhood.as_ref()?.at + self.config.ownership_ttl;
        if now >= until {
            return None;
        }
        let key = key.kad();
        let nb = self.neighbourhood.as_ref()?;
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
            || self.routable.values().any(closer)
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
        match self.ownership.get(key) {
            Some(Ownership::Checking { parked, .. }) if parked.len() >= MAX_PARKED_PER_KEY => {
                return Err(Rejection::RateLimited)
            }
            Some(Ownership::Checking { .. }) => {}
            _ if self.checks.len() >= MAX_OWNERSHIP_CHECKS => return Err(Rejection::RateLimited),
            _ => {}
        }
        self.hosting.room_for(from, key)
    }

    /// Holds a client message until the key's ownership lookup answers (starting one).
    pub(super) fn park(&mut self, key: &ReplicaKey, parked: Parked) {
        if let Some(Ownership::Checking { parked: waiting, .. }) = self.ownership.get_mut(key) {
            waiting.push(parked);
            return;
        }
        let query = self.check_ownership(key);
        self.ownership.insert(key.clone(), Ownership::Checking { query, parked: vec![parked] });
    }

    /// Starts an ownership lookup for `key`: the few peers closest to it.
    fn check_ownership(&mut self, key: &ReplicaKey) -> kad::QueryId {
        let query = self.inner.kad.get_n_closest_peers(key.name(), OWNERSHIP_LOOKUP_PEERS);
        self.counters.ownership_checks += 1;
        self.refresh_neighbourhood();
        self.checks.insert(query, key.clone());
        let at = self.clock.now() + self.config.ownership_timeout;
        self.ownership_due.set(key, Some(at));
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
        let parked = match self.ownership.remove(&key) {
            Some(Ownership::Checking { parked, .. }) => parked,
            _ => Vec::new(),
        };
        match closer {
            None => {
                self.ownership.insert(key.clone(), Ownership::Owned { recheck: None });
                self.ownership_due.set(&key, Some(now + self.config.ownership_ttl));
                for p in parked {
                    self.serve_parked(&key, p);
                }
            }
            Some(peer) => {
                self.counters.ownership_lost += 1;
                self.ownership_due.set(&key, None);
                shrink_if_sparse(&mut self.ownership);
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
                            self.cache_host(&key, peer);
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
        let running = match self.ownership.get(&key) {
            Some(Ownership::Checking { query, .. }) | Some(Ownership::Owned { recheck: Some(query) }) => Some(*query),
            Some(Ownership::Owned { recheck: None }) => None,
            None => {
                self.ownership_due.set(&key, None);
                return;
            }
        };
        if let Some(query) = running {
            match self.inner.kad.query_mut(&query) {
                Some(mut q) => {
                    q.finish();
                    self.ownership_due.set(&key, Some(now + self.config.ownership_timeout));
                }
                None => {
                    // Already finished; its answer was lost: decide on nothing heard.
                    self.checks.remove(&query);
                    self.ownership_checked(key, &[]);
                }
            }
        } else if self.hosting.contains(&key) && !self.routable.is_empty() {
            if let Some(until) = self.provably_mine(&key) {
                self.counters.ownership_by_neighbourhood += 1;
                self.ownership_due.set(&key, Some(until));
                return;
            }
            let query = self.check_ownership(&key);
            self.ownership.insert(key, Ownership::Owned { recheck: Some(query) });
        } else if self.hosting.contains(&key) {
            self.ownership_due.set(&key, Some(now + self.config.ownership_ttl));
        } else {
            self.ownership.remove(&key);
            self.ownership_due.set(&key, None);
            shrink_if_sparse(&mut self.ownership);
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
        if let Some(Ownership::Owned { recheck }) = self.ownership.get(key) {
            if let Some(q) = recheck {
                self.checks.remove(q);
            }
            self.ownership.remove(key);
            self.ownership_due.set(key, None);
            shrink_if_sparse(&mut self.ownership);
        }
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
        let purpose = if let Some((_, purpose)) = self.neighbourhood_query.filter(|(q, _)| *q == id) {
            purpose
        } else if self.checks.contains_key(&id) {
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
        if self.neighbourhood_query.is_some_and(|(q, _)| q == id) {
            self.neighbourhood_query = None;
            // Only a lookup that finished counts (a timed-out one may have
            // missed closer peers), and one that found fewer than k peers only
            // if every peer it asked answered but departed ones
            // (`found_every_peer`).
            let found: Vec<KBucketKey<PeerId>> =
                peers.iter().filter(|i| i.peer_id != self.local).map(|i| KBucketKey::from(i.peer_id)).collect();
            let unreached = std::mem::take(&mut self.neighbourhood_unreached);
            let departed = unreached.iter().filter(|p| !self.membership.is_alive(p)).count();
            if complete && found_every_peer(found.len(), stats.num_failures(), departed) {
                let radius = (found.len() >= kad::K_VALUE.get())
                    .then(|| found.iter().map(|p| p.distance(&self.local_key)).max())
                    .flatten();
                self.neighbourhood = Some(Neighbourhood { peers: found, radius, at: self.clock.now() });
            } else {
                self.counters.self_lookups_incomplete += 1;
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
        let Some(key) = self.lookups.remove(&id) else { return };
        let best = peers
            .iter()
            .map(|i| i.peer_id)
            .chain(self.dialable().then_some(self.local))
            .map(|p| (KBucketKey::from(p).distance(key.kad()), p))
            .min()
            .map_or(self.local, |(_, p)| p);
        self.cache_host(&key, best);
    }

    /// A bootstrap step ended (`ok`: it succeeded). The first step of a bootstrap to
    /// succeed (its self-lookup, usually) joins: this peer's neighbourhood knows it and it
    /// knows its neighbourhood. The refresh of farther buckets that follows is not waited
    /// for (it may take long in a busy swarm, and a step that times out fails the whole
    /// bootstrap).
    pub(super) fn on_bootstrap(&mut self, id: kad::QueryId, ok: bool, step: kad::ProgressStep, stats: kad::QueryStats) {
        *self.counters.kad_requests.entry("bootstrap").or_default() += u64::from(stats.num_requests());
        let was_ready = self.membership.ready();
        if ok {
            self.membership.bootstrapped();
            let now = self.clock.now();
            if !was_ready && self.membership.ready() {
                tracing::info!("joined the swarm: ready");
                self.housekeeping(now);
            } else if self.membership.needs_voucher() {
                // Joined through a serving peer only: ask the peers just met now
                // (their answers say whether they serve) rather than a round later.
                self.gossip_round(now);
            }
        }
        self.cut_bootstrap(id, step, was_ready);
    }
}
