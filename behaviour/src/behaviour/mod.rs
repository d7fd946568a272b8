//! `sigma::Behaviour`: the Sigma protocol inside a Kademlia DHT.
//!
//! Thin glue around the sans-IO core ([`crate::proto`]): it composes
//! `kad::Behaviour` (replica placement) with [`link::Behaviour`] (the wire,
//! [`crate::wire`], on one long-lived stream per connection and direction), maps libp2p
//! ids and events to core inputs, drives one timer from the core's next deadline, and
//! turns core outputs into requests and replies.
//!
//! Replica `i` of resource `R` is named `"R:{i+1}"` and hosted by the peer XOR-closest to
//! the SHA-256 of that name (`kad::KBucketKey`). A peer serves a replica only while no
//! *connected* peer is closer to its key (otherwise it answers with a redirect), and
//! only after a Kademlia lookup of the key found no closer peer either, looked up again
//! every [`DEFAULT_OWNERSHIP_TTL`] while it hosts the key: two peers that do not know
//! each other do not both serve one key. A peer that becomes closest starts with empty
//! state for the key — the paper's replica reset, arising from churn by itself — and
//! informed backoff rebuilds the queue.
//!
//! Clients resolve a replica's host from their routing table (self included), cache
//! it, and correct it on a redirect or, after a failed dial, with a Kademlia
//! `get_closest_peers` lookup. Replicas hosted by the local peer take no network hop.
//!
//! Each role owns its state in a struct of its own, whose methods take `now` and give
//! back what is due (rust-libp2p's kad and quinn-proto's `Connection` have this shape):
//! - `hosting.rs`: `Hosting`, the hosted replicas, their quotas and request budgets;
//! - `acquiring.rs`: `Acquiring`, this peer's acquisitions and their locks' hosts;
//! - `outbox.rs`: `Outbox`, what goes out (batches, replies awaited, resends, the
//!   test-only delay);
//! - `ownership.rs`: `Ownerships`, ownership verdicts, their lookups, parked requests;
//! - `routing.rs`: `Routing`, the routing table, addresses, bootstraps, the neighbourhood;
//! - `connections.rs`: `Connections`, open connections, ping round trips, trimming;
//! - `gossip.rs`: `Gossip`, the gossip's bookkeeping and the redials;
//! - `key.rs`: `ReplicaKey`, a replica's name, index and Kademlia key, built once.
//!
//! The roles meet in `impl Behaviour` blocks, one file per side: `host.rs` (inbound
//! requests), `client.rs` (acquire, release, replies), `probe.rs` (probe, inspect, ask),
//! `placement.rs` (the host of a key, hand-over, ownership decisions), `routing.rs`
//! (driving Kademlia), `members.rs` (housekeeping, the gossip rounds). Beside them:
//! `config.rs` ([`Config`], [`Admin`], [`BootClock`], the defaults), `types.rs` (the
//! public ids, events, errors and metrics), `inner.rs` (the composed [`Inner`]),
//! `util.rs` (the clock, the deadline index), [`link`] (the transport). Here:
//! [`Behaviour`] and its constructor, the `NetworkBehaviour` impl that dispatches each
//! inner event to its role, the poll, and the one timer.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use libp2p::core::transport::PortUse;
use libp2p::core::Endpoint;
use libp2p::kad::{self, store::MemoryStore, KBucketKey};
use libp2p::ping;
use libp2p::request_response;
use libp2p::swarm::{
    CloseConnection, ConnectionDenied, ConnectionId, FromSwarm, NetworkBehaviour, THandler, THandlerInEvent,
    THandlerOutEvent, ToSwarm,
};
use libp2p::{Multiaddr, PeerId};
use tokio::time::Sleep;

use crate::membership::Membership;
use crate::proto::{LamportClock, Time};
use crate::wire;

mod acquiring;
mod client;
mod config;
mod connections;
mod gossip;
mod host;
mod hosting;
mod inner;
mod key;
pub mod link;
mod members;
mod outbox;
mod ownership;
mod placement;
mod probe;
mod routing;
mod traffic;
mod types;
mod util;

pub use config::{
    Admin, BootClock, Config, DEFAULT_GOSSIP_FANOUT, DEFAULT_GOSSIP_INTERVAL, DEFAULT_GOSSIP_LIVENESS,
    DEFAULT_IDLE_HOSTS_TTL, DEFAULT_MAX_CONCURRENT_STREAMS, DEFAULT_MAX_ENTRIES, DEFAULT_MAX_ENTRIES_PER_PEER,
    DEFAULT_MEMBERSHIP_WINDOW, DEFAULT_PING_INTERVAL, DEFAULT_PING_TIMEOUT,
};
pub use inner::{kad_protocol, Inner, InnerEvent, KAD_PROTOCOL};
pub use traffic::GossipCodec;
pub use types::{
    AcquireError, AcquisitionId, AcquisitionInfo, Counters, Event, ProbeId, ReplicaAnswer, ReplicaInfo, ReplicaTotals,
    StateSizes, Traffic,
};

use acquiring::Acquiring;
#[cfg(doc)]
use config::DEFAULT_OWNERSHIP_TTL;
use config::MAX_TIMER;
use connections::Connections;
use gossip::Gossip;
use hosting::{Filed, Hosting};
use key::ReplicaKey;
use outbox::{Held, Outbox};
use ownership::Ownerships;
use probe::Probe;
use routing::Routing;
use util::Clock;

/// The Sigma network behaviour.
pub struct Behaviour {
    inner: Inner,
    local: PeerId,
    local_key: KBucketKey<PeerId>,
    config: Config,
    clock: Clock,
    lamport: LamportClock,
    /// Open connections, and the ones to close.
    connections: Connections,
    /// The routing table as seen here, addresses, bootstraps, the neighbourhood.
    routing: Routing,
    /// The hosted replicas and what remote peers may cost.
    hosting: Hosting,
    /// This peer's acquisitions, the finished ones and the cached hosts of their locks.
    acquiring: Acquiring,
    /// What this peer sends, on its way out (with the test-only delay).
    outbox: Outbox,
    /// The Kademlia lookups of replica hosts in flight (a client's, after a failure).
    lookups: HashMap<kad::QueryId, ReplicaKey>,
    /// Whether this peer may serve each key it would host, and the lookups deciding it.
    ownerships: Ownerships,
    probes: HashMap<ProbeId, Probe>,
    events: VecDeque<Event>,
    timer: Option<(Time, Pin<Box<Sleep>>)>,
    waker: Option<Waker>,
    counters: Counters,
    membership: Membership,
    /// The gossip's bookkeeping: heartbeat proofs, requests in flight, rounds, redials.
    gossip: Gossip,
    next_relax: Time,
    /// Picks gossip targets (seeded from the peer id and the start time).
    rng: rand_chacha::ChaCha8Rng,
    /// Frames the codec refused (shared with every connection's codec).
    codec_stats: Arc<wire::CodecStats>,
    /// The gossip's tables and bytes, both ways (shared with its codec).
    gossip_traffic: Arc<traffic::GossipTraffic>,
    next_id: u64,
}

impl Behaviour {
    /// A behaviour for the peer with key `key` (the swarm's own: it signs this peer's
    /// heartbeats), with Kademlia in server mode (set explicitly: on loopback there is
    /// no confirmed external address, and in client mode the routing tables of a local
    /// swarm stay empty).
    pub fn new(key: &libp2p::identity::Keypair, config: Config) -> Self {
        let local = key.public().to_peer_id();
        let codec_stats = Arc::new(wire::CodecStats::default());
        let gossip_traffic = Arc::new(traffic::GossipTraffic::default());
        let inner = Inner::new(local, &config, codec_stats.clone(), gossip_traffic.clone());
        // A stall is what other peers may take for death: the shorter of the two ways.
        let stall = (config.ping_interval + config.ping_timeout).min(config.gossip_liveness);
        // The incarnation: a restarted peer's heartbeats must rank above its old ones.
        let incarnation = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_millis() as u64).max(1);
        let own_delay_ms = u64::try_from(config.takeover_delay().as_millis()).unwrap_or(u64::MAX);
        let chain = crate::liveness::Chain::new(key.clone(), incarnation, Some(own_delay_ms));
        let mut membership = Membership::new(config.joining, config.membership_window, config.takeover_delay(), stall)
            .with_gossip(config.gossip_liveness, incarnation);
        if let Some(list) = &config.members {
            membership = membership.with_members(list.iter().copied(), local);
        }
        membership.set_dialable(!config.external_address_required);
        let clock = Clock::new(config.boot_clock.clone());
        let hosting_limits = hosting::Limits {
            proto: config.proto.clone(),
            max_replicas: config.max_replicas,
            max_replicas_per_peer: config.max_replicas_per_peer,
            max_entries: config.max_entries,
            max_entries_per_peer: config.max_entries_per_peer,
            peer_rate: config.peer_rate,
        };
        let outbox = Outbox::new(config.message_delay);
        let acquiring = Acquiring::new(config.finished_memory, config.idle_hosts_ttl);
        Behaviour {
            inner,
            local,
            local_key: KBucketKey::from(local),
            config,
            clock,
            lamport: LamportClock::new(),
            connections: Connections::default(),
            routing: Routing::default(),
            hosting: Hosting::new(local, hosting_limits),
            acquiring,
            outbox,
            lookups: HashMap::new(),
            ownerships: Ownerships::default(),
            probes: HashMap::new(),
            events: VecDeque::new(),
            timer: None,
            waker: None,
            counters: Counters::default(),
            membership,
            gossip: Gossip::new(chain),
            next_relax: Duration::ZERO,
            rng: {
                use rand::SeedableRng;
                let mut seed = [0u8; 32];
                for (i, b) in local.to_bytes().iter().rev().chain(incarnation.to_le_bytes().iter()).enumerate() {
                    seed[i % 32] ^= *b;
                }
                rand_chacha::ChaCha8Rng::from_seed(seed)
            },
            codec_stats,
            gossip_traffic,
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
        c.joint = matches!(self.membership.readiness(), crate::membership::Readiness::Joint { .. });
        c.joints_pending = self.membership.joints_pending();
        (c.reachable_members, c.members) = self.members();
        let t = self.traffic();
        (c.gossip_bytes_out, c.gossip_bytes_in, c.gossip_out, c.gossip_in) =
            (t.gossip_bytes_out, t.gossip_bytes_in, t.gossip_out, t.gossip_in);
        for (kind, n) in [("malformed", &self.codec_stats.malformed), ("oversized", &self.codec_stats.oversized)] {
            let n = n.load(Ordering::Relaxed);
            if n > 0 {
                *c.inbound_failures.entry(kind).or_default() += n;
            }
        }
        c
    }

    /// What the membership has cost on the wire so far (cheap: a few atomic reads, for
    /// a caller that samples it often; [`Behaviour::counters`] has the same figures).
    pub fn traffic(&self) -> Traffic {
        let (gossip_bytes_out, gossip_bytes_in, gossip_out, gossip_in) = self.gossip_traffic.read();
        Traffic { gossip_bytes_out, gossip_bytes_in, gossip_out, gossip_in, pings: self.counters.pings }
    }

    /// Sizes of the per-lock and per-peer state.
    pub fn state_sizes(&self) -> StateSizes {
        StateSizes {
            replicas: self.hosting.len(),
            acquisitions: self.acquiring.len(),
            hosts: self.acquiring.hosts_len(),
            finished: self.acquiring.finished_len(),
            pending: self.outbox.pending_len(),
            lookups: self.lookups.len(),
            entries: self.hosting.entries(),
            ownership: self.ownerships.len(),
        }
    }

    fn wake(&mut self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    fn on_inner(&mut self, event: InnerEvent) {
        match &event {
            InnerEvent::Link(link::Event::Message { peer, .. })
            | InnerEvent::Gossip(request_response::Event::Message { peer, .. }) => self.used(*peer),
            _ => {}
        }
        match event {
            InnerEvent::Link(link::Event::Message { peer, message, .. }) => match message {
                link::Message::Request { request, channel } => self.on_request(peer, request, channel),
                link::Message::Response { request_id, response } => self.on_reply(peer, request_id, response),
            },
            InnerEvent::Link(link::Event::OutboundFailure { request_id, error, .. }) => {
                self.on_outbound_failure(request_id, &error)
            }
            InnerEvent::Link(link::Event::InboundFailure { peer, error, .. }) => {
                Counters::bump(&mut self.counters.inbound_failures, error.as_str());
                tracing::debug!(%peer, kind = error.as_str(), "inbound sigma request failed");
            }
            InnerEvent::Kad(kad::Event::RoutablePeer { peer, address }) => self.add_address(&peer, address),
            InnerEvent::Kad(kad::Event::RoutingUpdated { peer, old_peer, .. }) => {
                // Kademlia evicts only for a connected peer it inserts itself, which
                // `BucketInserts::Manual` never does; an eviction still leaves here.
                if let Some(old) = old_peer {
                    self.routing.unroute(&old);
                }
                if self.routing.route(peer) {
                    self.hand_over(peer);
                }
            }
            InnerEvent::Kad(kad::Event::OutboundQueryProgressed {
                id,
                result: kad::QueryResult::GetClosestPeers(result),
                step,
                stats,
            }) => self.on_closest_peers(id, result, step, stats),
            InnerEvent::Kad(kad::Event::OutboundQueryProgressed {
                id,
                result: kad::QueryResult::Bootstrap(result),
                step,
                stats,
            }) => self.on_bootstrap(id, result.is_ok(), step, stats),
            InnerEvent::Kad(_) => {}
            InnerEvent::Gossip(event) => self.on_gossip(event),
            // A peer that does not speak ping (a light client, a probe) is not judged.
            InnerEvent::Ping(ping::Event { result: Err(ping::Failure::Unsupported), .. }) => {}
            InnerEvent::Ping(ping::Event { peer, connection, result: Err(error) }) => {
                tracing::debug!(%peer, %error, "liveness ping failed: closing the connection");
                self.counters.ping_failures += 1;
                self.connections.ping_failed(peer, connection);
            }
            InnerEvent::Ping(ping::Event { peer, result: Ok(rtt), .. }) => {
                self.counters.pings += 1;
                self.connections.ping_rtt(peer, rtt);
            }
        }
    }

    /// Runs the core's due timers, and drops replicas that have become disposable.
    fn handle_timeouts(&mut self, now: Time) {
        self.release_held(now);
        self.resend_due(now);
        // Collected first: a replica re-filed at `now` waits for the next pass.
        for key in self.hosting.due(now) {
            let (outputs, filed) = self.hosting.timeout(&key, now, &mut self.counters);
            if filed == Filed::Evicted {
                self.forget_ownership(&key);
            }
            for (to, resp) in outputs {
                self.notify(to, &key, resp);
            }
        }
        for id in self.acquiring.due(now) {
            if let Some(a) = self.acquiring.get_mut(&id) {
                a.client.handle_timeout(now);
            }
            self.drain_acquisition(id);
        }
        for key in self.ownerships.due(now) {
            self.ownership_due(key, now);
        }
        self.acquiring.expire_idle_hosts(now);
        if self.gossip.round_due(now, self.config.gossip_interval) {
            self.gossip_round(now);
        }
    }

    /// Holds `message` under the test-only delay, or sends it now when the delay is off.
    fn send_or_hold(&mut self, message: Held) {
        match self.outbox.hold(self.clock.now(), &mut self.rng, message) {
            None => self.wake(),
            Some(message) => self.dispatch(message),
        }
    }

    /// Sends a message the delay held (or did not hold) to where it goes.
    fn dispatch(&mut self, message: Held) {
        match message {
            Held::ToReplica(out) => self.send_to_replica_now(out),
            Held::Response { to, key, resp } => self.notify_now(to, &key, resp),
            Held::Reply { to, reply } => self.respond_now(to, reply),
        }
    }

    /// Sends the held messages that are due.
    fn release_held(&mut self, now: Time) {
        while let Some(message) = self.outbox.held_due(now) {
            self.dispatch(message);
        }
    }

    fn next_deadline(&self) -> Option<Time> {
        [
            self.hosting.next_due(),
            self.acquiring.next_due(),
            self.ownerships.next_due(),
            self.outbox.next_due(),
            Some(self.gossip.next_round()),
        ]
        .into_iter()
        .flatten()
        .min()
    }
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
        if let Some(extra) = maybe_peer.and_then(|p| self.routing.extra_addrs(&p)) {
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
                self.connections.established(e.peer_id, self.clock.now());
                self.hand_over(e.peer_id);
            }
            FromSwarm::ExternalAddrConfirmed(e) => {
                let new = self.routing.confirm_external(e.addr);
                if new {
                    self.reachability_changed();
                }
            }
            FromSwarm::ExternalAddrExpired(e) => {
                let kept = self.routing.expire_external(e.addr);
                if kept {
                    self.reachability_changed();
                }
            }
            FromSwarm::DialFailure(e) => {
                if let Some(peer) = e.peer_id {
                    self.unreached_while_looking(peer);
                }
            }
            FromSwarm::ConnectionClosed(e) => {
                let last = self.connections.closed(&e.peer_id);
                if last {
                    self.hosting.disconnected(&e.peer_id);
                    let now = self.clock.now();
                    self.membership.disconnected(e.peer_id, now);
                    self.housekeeping(now);
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
        self.cut_kads_bootstrap();
        loop {
            if let Some(e) = self.events.pop_front() {
                return Poll::Ready(ToSwarm::GenerateEvent(e));
            }
            if let Some((peer_id, id)) = self.connections.pop_close() {
                return Poll::Ready(ToSwarm::CloseConnection { peer_id, connection: CloseConnection::One(id) });
            }
            if let Some(peer_id) = self.connections.pop_trim() {
                return Poll::Ready(ToSwarm::CloseConnection { peer_id, connection: CloseConnection::All });
            }
            if let Some(peer) = self.gossip.pop_dial() {
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
            // transport request per peer; the transport picks it up on the next pass.
            if self.outbox.flush(&mut self.inner.link, &mut self.counters) {
                self.outbox.flushed = true;
                continue;
            }
            // This peer's own replicas after the frames for the others: yield once (the
            // connection tasks woken by the flush run first), then serve them.
            if self.outbox.has_local() {
                if std::mem::take(&mut self.outbox.flushed) {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                self.serve_local_inbox();
                continue;
            }
            self.outbox.flushed = false;
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
