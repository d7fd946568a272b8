//! The routing table and what feeds it: other peers' addresses (kept by scope, the
//! ones a full k-bucket has no room for kept aside for dialling), what identify tells,
//! Kademlia bootstraps (cut to their self-lookup while the buckets are fresh), and the
//! self-lookups whose answer is this peer's neighbourhood, which ownership decides by
//! (`placement.rs`).

use std::collections::{HashMap, HashSet, VecDeque};

use libp2p::kad::{self, KBucketKey};
use libp2p::{Multiaddr, PeerId};

use super::config::KAD_REFRESH;
use super::inner::kad_protocol;
// Up to the parent for `Behaviour` alone: this file is one of its `impl` blocks (the
// methods of one role, which coordinate that role's state with the others').
use super::Behaviour;
use crate::addr::Scope;
use crate::proto::Time;
use crate::wire;

#[cfg(doc)]
use super::config::Config;

/// Peers outside the routing table whose addresses are kept for dialling.
pub const MAX_EXTRA_ADDRESSES: usize = 4096;

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

/// Confirmed external addresses tracked at most.
const MAX_EXTERNALS: usize = 32;

/// The routing table as this behaviour sees it, the addresses kept beside it, the
/// bootstraps, and the self-lookups with the neighbourhood they found. Plain state:
/// Kademlia itself is driven by the behaviour (below).
#[derive(Debug, Default)]
pub(super) struct Routing {
    /// Peers Kademlia put in its routing table (client-side host estimates), with
    /// their Kademlia keys (the SHA-256 of the id, compared with every key placed).
    routable: HashMap<PeerId, KBucketKey<PeerId>>,
    /// The swarm's confirmed external addresses (at most [`MAX_EXTERNALS`]).
    externals: Vec<Multiaddr>,
    /// Addresses of peers left out of a full k-bucket, oldest first (at most
    /// [`MAX_EXTRA_ADDRESSES`] peers).
    extra_addrs: HashMap<PeerId, Vec<Multiaddr>>,
    extra_order: VecDeque<PeerId>,
    /// The last bootstrap started through [`Behaviour::bootstrap`].
    bootstrap_query: Option<kad::QueryId>,
    /// When Kademlia's buckets were last refreshed (a bootstrap let run past its
    /// self-lookup), or this peer joined; and the bootstraps being cut to their
    /// self-lookup ([`Behaviour::cut_bootstrap`]).
    buckets_refreshed: Option<Time>,
    cut_bootstraps: HashSet<kad::QueryId>,
    /// The peers closest to this one as the last self-lookup found them: a key much
    /// closer to this peer than they are needs no lookup of its own.
    neighbourhood: Option<Neighbourhood>,
    /// The self-lookup running for it, and what for (its requests are counted so).
    self_lookup: Option<(kad::QueryId, &'static str)>,
    /// Peers whose dial failed while the self-lookup ran (at most [`MAX_UNREACHED`]):
    /// its failures that a departed peer explains.
    unreached: Vec<PeerId>,
}

impl Routing {
    /// Files `peer` among the routing table's peers with its Kademlia key (hashed once,
    /// when it is new); answers whether it is new.
    pub(super) fn route(&mut self, peer: PeerId) -> bool {
        match self.routable.entry(peer) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(KBucketKey::from(peer));
                true
            }
        }
    }

    /// Takes `peer` out of the routing table's peers; answers whether it was there.
    pub(super) fn unroute(&mut self, peer: &PeerId) -> bool {
        self.routable.remove(peer).is_some()
    }

    pub(super) fn is_routable(&self, peer: &PeerId) -> bool {
        self.routable.contains_key(peer)
    }

    /// Peers in the routing table.
    pub(super) fn len(&self) -> usize {
        self.routable.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.routable.is_empty()
    }

    /// The routing table's peers' Kademlia keys.
    pub(super) fn keys(&self) -> impl Iterator<Item = &KBucketKey<PeerId>> + Clone {
        self.routable.values()
    }

    /// Keeps an address of a peer that the routing table has no room for (a host found
    /// by a lookup or named by a redirect), so that a dial to it can still be made.
    /// Bounded: past [`MAX_EXTRA_ADDRESSES`] peers the longest-known is forgotten.
    pub(super) fn remember_address(&mut self, peer: PeerId, addr: Multiaddr) {
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

    /// The addresses kept aside for `peer`.
    pub(super) fn extra_addrs(&self, peer: &PeerId) -> Option<&Vec<Multiaddr>> {
        self.extra_addrs.get(peer)
    }

    /// An external address was confirmed; answers whether it is new here.
    pub(super) fn confirm_external(&mut self, addr: &Multiaddr) -> bool {
        if self.externals.contains(addr) || self.externals.len() >= MAX_EXTERNALS {
            return false;
        }
        self.externals.push(addr.clone());
        true
    }

    /// An external address expired; answers whether it was kept here.
    pub(super) fn expire_external(&mut self, addr: &Multiaddr) -> bool {
        let Some(i) = self.externals.iter().position(|a| a == addr) else { return false };
        self.externals.remove(i);
        true
    }

    /// The swarm's confirmed external addresses.
    pub(super) fn externals(&self) -> &[Multiaddr] {
        &self.externals
    }

    /// Whether the buckets were refreshed (or this peer joined) less than half
    /// [`KAD_REFRESH`] ago: a bootstrap now is cut to its self-lookup.
    fn refreshed_lately(&self, now: Time) -> bool {
        self.buckets_refreshed.is_some_and(|t| now.saturating_sub(t) < KAD_REFRESH / 2)
    }

    /// Files bootstraps being cut; those no longer `running` are dropped first (the
    /// bound of `cut_bootstraps`).
    fn remember_cut(&mut self, ids: impl IntoIterator<Item = kad::QueryId>, running: impl Fn(&kad::QueryId) -> bool) {
        self.cut_bootstraps.retain(|q| running(q));
        self.cut_bootstraps.extend(ids);
    }

    /// The neighbourhood the last complete self-lookup found.
    pub(super) fn neighbourhood(&self) -> Option<&Neighbourhood> {
        self.neighbourhood.as_ref()
    }

    /// What the running query `id` is for, if it is the self-lookup.
    pub(super) fn self_lookup_purpose(&self, id: kad::QueryId) -> Option<&'static str> {
        self.self_lookup.filter(|(q, _)| *q == id).map(|(_, purpose)| purpose)
    }

    /// Query `id` ended: if it was the self-lookup, the peers whose dial failed while
    /// it ran.
    pub(super) fn self_lookup_ended(&mut self, id: kad::QueryId) -> Option<Vec<PeerId>> {
        if !self.self_lookup.is_some_and(|(q, _)| q == id) {
            return None;
        }
        self.self_lookup = None;
        Some(std::mem::take(&mut self.unreached))
    }

    /// The neighbourhood a self-lookup found.
    pub(super) fn found_neighbourhood(&mut self, nb: Neighbourhood) {
        self.neighbourhood = Some(nb);
    }
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
            self.routing.remember_address(*peer, addr);
            return;
        }
        if !matches!(self.inner.kad.add_address(peer, addr), kad::RoutingUpdate::Failed) && self.routing.route(*peer) {
            self.hand_over(*peer);
        }
    }

    /// Kademlia's rule for a full k-bucket: its peers stay, except one that departed (a
    /// member alive here once, neither connected nor alive now), which yields its place
    /// to a connected `peer`. A peer only heard of stays: in a forming swarm most entries
    /// are not yet alive here, and are not dead. Answers whether there is room now.
    fn make_room_for(&mut self, peer: PeerId) -> bool {
        if !self.connections.is_connected(&peer) {
            return false;
        }
        let (connections, membership) = (&self.connections, &self.membership);
        let departed = self.inner.kad.kbucket(peer).and_then(|b| {
            b.iter().map(|e| *e.node.key.preimage()).find(|p| !connections.is_connected(p) && membership.is_departed(p))
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
                self.routing.remember_address(peer, addr.clone());
            }
        }
        self.routing.unroute(&peer);
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
        } else if self.routing.unroute(peer) {
            self.inner.kad.remove_peer(peer);
            tracing::debug!(%peer, "a sigma peer without an external address: not a host");
        }
    }

    /// A Kademlia bootstrap, unless the last one started here is still running (then
    /// its id): a peer that retries while joining does not pile bootstraps (each one a
    /// lookup per bucket) onto a busy swarm.
    pub fn bootstrap(&mut self) -> Result<kad::QueryId, kad::NoKnownPeers> {
        if let Some(q) = self.routing.bootstrap_query.filter(|q| self.inner.kad.query(q).is_some()) {
            return Ok(q);
        }
        let q = self.inner.kad.bootstrap()?;
        self.routing.bootstrap_query = Some(q);
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
            if !was_ready || self.routing.refreshed_lately(now) {
                self.routing.buckets_refreshed.get_or_insert(now);
                let kad = &self.inner.kad;
                self.routing.remember_cut([id], |q| kad.query(q).is_some());
                self.counters.bootstraps_cut += 1;
            } else {
                self.routing.buckets_refreshed = Some(now);
            }
        }
        if step.last {
            self.routing.cut_bootstraps.remove(&id);
        } else if self.routing.cut_bootstraps.contains(&id) {
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
        if !self.routing.refreshed_lately(self.clock.now()) || !self.membership.ready() {
            return;
        }
        let ours = self.routing.bootstrap_query;
        let mut cut = Vec::new();
        for mut q in self.inner.kad.iter_queries_mut() {
            let id = q.id();
            if matches!(q.info(), kad::QueryInfo::Bootstrap { .. })
                && Some(id) != ours
                && !self.routing.cut_bootstraps.contains(&id)
            {
                q.finish();
                cut.push(id);
            }
        }
        if !cut.is_empty() {
            let kad = &self.inner.kad;
            self.routing.remember_cut(cut, |q| kad.query(q).is_some());
        }
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
    pub(super) fn self_lookup(&mut self, purpose: &'static str) -> Result<Option<kad::QueryId>, kad::NoKnownPeers> {
        if self.inner.kad.kbuckets().all(|b| b.num_entries() == 0) {
            return Err(kad::NoKnownPeers());
        }
        if let Some((q, _)) = self.routing.self_lookup.filter(|(q, _)| self.inner.kad.query(q).is_some()) {
            return Ok(Some(q));
        }
        let now = self.clock.now();
        if self.routing.neighbourhood.as_ref().is_some_and(|nb| {
            now.saturating_sub(nb.at) < self.config.ownership_ttl / 2 && !self.neighbourhood_misses_members(nb)
        }) {
            return Ok(None);
        }
        let q = self.inner.kad.get_closest_peers(self.local);
        self.routing.self_lookup = Some((q, purpose));
        self.routing.unreached.clear();
        Ok(Some(q))
    }

    /// Notes a peer whose dial failed while a self-lookup runs: if it is not alive
    /// here, the lookup's failed request to it is no peer missed (below).
    pub(super) fn unreached_while_looking(&mut self, peer: PeerId) {
        let unreached = &mut self.routing.unreached;
        if self.routing.self_lookup.is_some() && unreached.len() < MAX_UNREACHED && !unreached.contains(&peer) {
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
        self.routing.neighbourhood.as_ref().is_some_and(|nb| now < nb.at + self.config.ownership_ttl)
    }

    /// The widest scope of this peer's confirmed external addresses (`None`: none yet).
    pub fn reach(&self) -> Option<Scope> {
        Scope::widest(&self.routing.externals)
    }

    /// The swarm's confirmed external addresses, as this behaviour was told of them.
    pub fn external_addresses(&self) -> &[Multiaddr] {
        &self.routing.externals
    }

    /// Whether other peers can dial this one: an external address is confirmed, or none
    /// is required ([`Config::with_external_address_required`]). A peer that cannot
    /// hosts nothing and never counts itself as a host.
    pub(super) fn dialable(&self) -> bool {
        !self.config.external_address_required || !self.routing.externals.is_empty()
    }

    /// This peer's Kademlia key among the candidate hosts of a key, when others can
    /// dial it.
    pub(super) fn self_as_host_key(&self) -> Option<&KBucketKey<PeerId>> {
        self.dialable().then_some(&self.local_key)
    }

    /// Peers in the routing table as seen by this behaviour.
    pub fn routable_peers(&self) -> usize {
        self.routing.len()
    }

    /// Peers with an open connection.
    pub fn connected_peers(&self) -> impl Iterator<Item = &PeerId> {
        self.connections.peers()
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
