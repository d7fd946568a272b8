//! One peer of the in-process swarm: a `libp2p::Swarm` over the memory transport
//! (plaintext, yamux) carrying the real `sigma::Behaviour`, bounded connections and
//! identify, driven by its own tokio task.
//!
//! The task owns the swarm (the file-sharing example's event-loop shape): commands come
//! in on a bounded channel, and what the measurements need is recorded here, where the
//! events happen, so that a busy runtime delays the record no more than the event:
//! the critical sections (enter at `Event::Acquired`, exit at `release`, `Event::Lost`
//! or the peer's departure), the acquire latencies, the hosted replica keys (sampled
//! every [`SAMPLE_EVERY`]), its membership's traffic by phase ([`Ledger`]), the
//! departures its view records (detections of killed peers, false removals), and the
//! peer's counters when it stops.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use libp2p::connection_limits::{self, ConnectionLimits};
use libp2p::core::transport::MemoryTransport;
use libp2p::core::upgrade::Version;
use libp2p::identity::Keypair;
use libp2p::kad;
use libp2p::swarm::{DialError, ListenError, NetworkBehaviour, SwarmEvent};
use libp2p::{identify, yamux, Multiaddr, PeerId, Swarm, Transport};
use sigma_behaviour::{AcquisitionId, Behaviour, Config, Counters, Event, Readiness};
use tokio::sync::{mpsc, oneshot};

use super::membership::{DepartureCursor, Ledger, END, MAX_DETECTIONS};
use super::Shared;
use crate::testnet::check::Cs;

/// How often a peer samples which replica keys it hosts (the resolution of "two hosts
/// at once") and publishes whether it serves.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// How often a running lookup is looked at (the resolution of its time).
const LOOKUP_POLL: Duration = Duration::from_millis(5);
/// Commands queued per peer.
pub const COMMAND_QUEUE: usize = 64;
/// The node's extra Kademlia bootstraps (ARCHITECTURE.md, "The node"): 1, 2, 4 … s after
/// the start, the gap capped here.
const BOOTSTRAP_FIRST: Duration = Duration::from_secs(1);
const BOOTSTRAP_MAX: Duration = Duration::from_secs(300);
const JOINING_RETRY: Duration = Duration::from_secs(4);
/// Identify's `protocol_version` (the node's).
const IDENTIFY_PROTOCOL: &str = "/sigma/id/1.0.0";

/// The behaviour of one peer: the node's (`sigma_node::NodeBehaviour`) without the
/// block list, with connection limits in front.
#[derive(NetworkBehaviour)]
pub struct PeerBehaviour {
    /// First: a denied connection never reaches the other behaviours.
    limits: connection_limits::Behaviour,
    /// The real sigma behaviour.
    pub sigma: Behaviour,
    /// Listen addresses of the peers connected to (Kademlia needs them: an inbound
    /// connection does not tell where its peer listens).
    identify: identify::Behaviour,
}

/// How a peer is built and connected.
#[derive(Clone, Debug)]
pub struct PeerSpec {
    /// Index of this incarnation in the run (peers that join later get new indices).
    pub index: usize,
    /// Its identity (seeded).
    pub keypair: Keypair,
    /// Where it listens (`/memory/P`).
    pub addr: Multiaddr,
    /// Peers it bootstraps from (none: the first peer, a one-node swarm).
    pub bootstrap: Vec<(PeerId, Multiaddr)>,
    /// The behaviour's configuration.
    pub config: Config,
    /// Established connections at most (all peers together).
    pub max_connections: u32,
    /// Idle connections are closed after this long.
    pub idle_timeout: Duration,
}

/// A request to a peer's task.
pub enum Command {
    /// Acquire `resource` for `client`; the answer comes by `reply` when the lock is won,
    /// refused, or not won by `deadline` (then abandoned).
    Acquire { client: usize, resource: usize, deadline: Instant, reply: oneshot::Sender<Outcome> },
    /// Release a won acquisition (the critical section ends now).
    Release { id: AcquisitionId },
    /// A Kademlia `get_closest_peers` lookup of `key` through the behaviour's own Kademlia.
    Lookup { key: Vec<u8>, reply: oneshot::Sender<LookupStats> },
    /// This peer's routing table.
    RoutingTable { reply: oneshot::Sender<Vec<PeerId>> },
    /// Whether it serves, and why not.
    Readiness { reply: oneshot::Sender<Readiness> },
}

/// How an acquire ended.
#[derive(Debug)]
pub enum Outcome {
    /// Won: release it with [`Command::Release`].
    Acquired(AcquisitionId),
    /// Not won before the deadline (abandoned).
    TimedOut,
    /// Refused by the behaviour.
    Refused(String),
}

/// What one lookup cost, from `kad::QueryStats` (its last reading before it finished).
#[derive(Clone, Copy, Debug, Default)]
pub struct LookupStats {
    /// Requests sent.
    pub requests: u32,
    /// Of which answered.
    pub successes: u32,
    /// Start to finish, to within [`LOOKUP_POLL`].
    pub time: Duration,
}

/// A replica key this peer hosted, from the first to the last sample that saw it.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    /// (resource, replica index).
    pub key: (usize, u16),
    /// The peer (incarnation index).
    pub peer: usize,
    /// First and last sample that saw the key hosted, since the run's start.
    pub first: Duration,
    pub last: Duration,
}

/// What a stopped peer leaves behind.
#[derive(Clone, Debug)]
pub struct Final {
    /// The peer (incarnation index).
    pub index: usize,
    /// Its counters.
    pub counters: Counters,
    /// Whether it served at the end.
    pub serving: bool,
    /// Most connections it had established at once (as sampled).
    pub max_established: u32,
    /// Its time up and membership traffic by phase.
    pub ledger: Ledger,
}

/// A client's acquisition in progress or held, as this peer's task sees it.
struct Held {
    client: usize,
    resource: usize,
    started: Instant,
    deadline: Instant,
    reply: Option<oneshot::Sender<Outcome>>,
    /// Once won: enter time, token, validity (refreshed while held).
    entered: Option<(Instant, u64, Instant)>,
}

/// The memory transport, plaintext (no crypto: a thousand handshakes cost nothing) and
/// yamux, as libp2p-swarm-test builds it.
pub fn build(spec: &PeerSpec) -> anyhow::Result<Swarm<PeerBehaviour>> {
    let local = spec.keypair.public().to_peer_id();
    let transport = MemoryTransport::default()
        .upgrade(Version::V1)
        .authenticate(libp2p_plaintext::Config::new(&spec.keypair))
        .multiplex(yamux::Config::default())
        .timeout(Duration::from_secs(20))
        .boxed();
    let limits = ConnectionLimits::default()
        .with_max_established(Some(spec.max_connections))
        .with_max_established_per_peer(Some(2));
    let identify = identify::Behaviour::new(
        identify::Config::new(IDENTIFY_PROTOCOL.to_owned(), spec.keypair.public())
            .with_interval(Duration::from_secs(300))
            .with_cache_size(0),
    );
    // The node's watermarks (`sigma_node::ConnectionBounds::watermarks`).
    let max = spec.max_connections as usize;
    let config = spec.config.clone().with_connection_watermarks(max * 3 / 4, max / 2);
    let behaviour = PeerBehaviour {
        limits: connection_limits::Behaviour::new(limits),
        sigma: Behaviour::new(&spec.keypair, config),
        identify,
    };
    let config = libp2p::swarm::Config::with_tokio_executor().with_idle_connection_timeout(spec.idle_timeout);
    let mut swarm = Swarm::new(transport, behaviour, local, config);
    swarm.listen_on(spec.addr.clone())?;
    Ok(swarm)
}

/// Runs one peer until `stop` fires (or its sender is dropped): then closes its open
/// critical sections and hosted spans, and leaves its counters in `shared`.
pub async fn run(
    spec: PeerSpec,
    mut swarm: Swarm<PeerBehaviour>,
    mut commands: mpsc::Receiver<Command>,
    mut stop: oneshot::Receiver<()>,
    serving: Arc<AtomicBool>,
    shared: Arc<Shared>,
) {
    let index = spec.index;
    for (peer, addr) in &spec.bootstrap {
        swarm.behaviour_mut().sigma.add_address(peer, addr.clone());
        let _ = swarm.dial(addr.clone());
    }
    let _ = swarm.behaviour_mut().sigma.bootstrap();
    let mut next_bootstrap = Instant::now() + BOOTSTRAP_FIRST;
    let mut bootstrap_gap = BOOTSTRAP_FIRST;

    let mut held: HashMap<AcquisitionId, Held> = HashMap::new();
    let mut lookups: Vec<(kad::QueryId, Instant, LookupStats, oneshot::Sender<LookupStats>)> = Vec::new();
    let mut hosted: HashMap<(usize, u16), (Duration, Duration)> = HashMap::new();
    let mut max_established = 0u32;
    let mut ledger = Ledger::default();
    let mut departures = DepartureCursor::default();
    let mut last_sample = Instant::now();
    let mut sample = tokio::time::interval(SAMPLE_EVERY);
    sample.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        tokio::select! {
            _ = &mut stop => break,
            event = swarm.select_next_some() => on_event(&mut swarm, event, &mut held, &shared, index),
            command = commands.recv() => match command {
                None => break,
                Some(c) => on_command(&mut swarm, c, &mut held, &mut lookups, &shared, index),
            },
            _ = sample.tick() => {
                let now = Instant::now();
                max_established = max_established.max(swarm.network_info().connection_counters().num_established());
                let sigma = &mut swarm.behaviour_mut().sigma;
                let phase = shared.phase.load(Ordering::Relaxed);
                ledger.sample(phase, now - last_sample, sigma.traffic());
                last_sample = now;
                read_departures(sigma, &mut departures, &shared, phase);
                serving.store(sigma.readiness() == Readiness::Serving, Ordering::Relaxed);
                sample_hosted(sigma, &mut hosted, &shared, index);
                expire(sigma, &mut held, now);
                if now >= next_bootstrap {
                    let joining = sigma.readiness() == Readiness::Joining;
                    if joining {
                        for (_, addr) in &spec.bootstrap {
                            let _ = swarm.dial(addr.clone());
                        }
                    }
                    // As the node: a bootstrap while joining, a self-lookup after.
                    let sigma = &mut swarm.behaviour_mut().sigma;
                    let _ = if joining { sigma.bootstrap().map(Some) } else { sigma.lookup_self() };
                    // As the node: while joining, the bootstrap peers are tried again
                    // at least every JOINING_RETRY.
                    bootstrap_gap = (bootstrap_gap * 2).min(if joining { JOINING_RETRY } else { BOOTSTRAP_MAX });
                    next_bootstrap = now + bootstrap_gap;
                }
            }
            _ = tokio::time::sleep(LOOKUP_POLL), if !lookups.is_empty() => {}
        }
        if !lookups.is_empty() {
            poll_lookups(&mut swarm, &mut lookups);
        }
    }

    // Departure: what was held ends now; what was hosted was last seen at the last sample.
    let now = Instant::now();
    let sigma = &swarm.behaviour().sigma;
    let mut records = Vec::new();
    for (_, h) in held.drain() {
        if let Some((enter, token, valid)) = h.entered {
            records.push(record(&shared, &h, index, enter, now, token, valid));
        }
    }
    shared.records.lock().expect("records").extend(records);
    let spans = hosted.into_iter().map(|(key, (first, last))| Span { key, peer: index, first, last });
    shared.spans.lock().expect("spans").extend(spans);
    shared.hosted.lock().expect("hosted").remove(&index);
    let serves = sigma.readiness() == Readiness::Serving;
    let phase = shared.phase.load(Ordering::Relaxed);
    ledger.sample(phase, now - last_sample, sigma.traffic());
    if phase == END {
        // The views that still hold a killed peer alive at the end.
        let kills = shared.kills.lock().expect("kills");
        let held = kills.keys().filter(|p| sigma.is_alive(p)).count();
        shared.undetected.fetch_add(held as u64, Ordering::Relaxed);
    }
    let last = Final { index, counters: sigma.counters(), serving: serves, max_established, ledger };
    shared.finals.lock().expect("finals").push(last);
    serving.store(false, Ordering::Relaxed);
}

fn on_event(
    swarm: &mut Swarm<PeerBehaviour>,
    event: SwarmEvent<PeerBehaviourEvent>,
    held: &mut HashMap<AcquisitionId, Held>,
    shared: &Shared,
    index: usize,
) {
    match event {
        SwarmEvent::Behaviour(PeerBehaviourEvent::Identify(identify::Event::Received { peer_id, info, .. })) => {
            swarm.behaviour_mut().sigma.identified(&peer_id, &info.protocols, info.listen_addrs);
        }
        SwarmEvent::ConnectionEstablished { endpoint, .. } => {
            shared.connections.established.fetch_add(1, Ordering::Relaxed);
            if endpoint.is_dialer() {
                let phase = shared.phase.load(Ordering::Relaxed).min(END);
                shared.connections.opened[phase].fetch_add(1, Ordering::Relaxed);
            }
        }
        SwarmEvent::ConnectionClosed { cause, .. } => {
            let c = &shared.connections;
            let counter = match cause {
                Some(libp2p::swarm::ConnectionError::KeepAliveTimeout) => &c.closed_idle,
                Some(libp2p::swarm::ConnectionError::IO(_)) => &c.closed_error,
                None => &c.closed_local,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        SwarmEvent::OutgoingConnectionError { error: DialError::Denied { .. }, .. }
        | SwarmEvent::IncomingConnectionError { error: ListenError::Denied { .. }, .. } => {
            shared.connections.denied.fetch_add(1, Ordering::Relaxed);
        }
        SwarmEvent::OutgoingConnectionError { .. } => {
            shared.connections.dial_errors.fetch_add(1, Ordering::Relaxed);
        }
        SwarmEvent::Behaviour(PeerBehaviourEvent::Sigma(event)) => {
            let now = Instant::now();
            match event {
                Event::Acquired { id, token, valid_until, .. } => {
                    let Some(h) = held.get_mut(&id) else { return };
                    h.entered = Some((now, token, valid_until));
                    shared.latencies.lock().expect("latencies").push(now - h.started);
                    if let Some(reply) = h.reply.take() {
                        if reply.send(Outcome::Acquired(id)).is_err() {
                            // The client has gone: the critical section is over at once.
                            finish(swarm, held, shared, index, id, now);
                        }
                    }
                }
                Event::Lost { id, .. } => {
                    shared.lost.fetch_add(1, Ordering::Relaxed);
                    finish(swarm, held, shared, index, id, now);
                }
                _ => {}
            }
        }
        _ => {}
    }
}

fn on_command(
    swarm: &mut Swarm<PeerBehaviour>,
    command: Command,
    held: &mut HashMap<AcquisitionId, Held>,
    lookups: &mut Vec<(kad::QueryId, Instant, LookupStats, oneshot::Sender<LookupStats>)>,
    shared: &Shared,
    index: usize,
) {
    let sigma = &mut swarm.behaviour_mut().sigma;
    match command {
        Command::Acquire { client, resource, deadline, reply } => {
            match sigma.acquire(&super::resource_name(resource), None) {
                Ok(id) => {
                    let h =
                        Held { client, resource, started: Instant::now(), deadline, reply: Some(reply), entered: None };
                    held.insert(id, h);
                }
                Err(e) => {
                    let _ = reply.send(Outcome::Refused(e.to_string()));
                }
            }
        }
        Command::Release { id } => finish(swarm, held, shared, index, id, Instant::now()),
        Command::Lookup { key, reply } => {
            let query = sigma.kad_mut().get_closest_peers(key);
            lookups.push((query, Instant::now(), LookupStats::default(), reply));
        }
        Command::Readiness { reply } => {
            let _ = reply.send(sigma.readiness());
        }
        Command::RoutingTable { reply } => {
            let mut table = Vec::new();
            for bucket in sigma.kad_mut().kbuckets() {
                table.extend(bucket.iter().map(|e| *e.node.key.preimage()));
            }
            let _ = reply.send(table);
        }
    }
}

/// Ends an acquisition: a critical section that was entered is recorded (its validity
/// as last known: renewals only extend it), and the lock is released.
fn finish(
    swarm: &mut Swarm<PeerBehaviour>,
    held: &mut HashMap<AcquisitionId, Held>,
    shared: &Shared,
    index: usize,
    id: AcquisitionId,
    now: Instant,
) {
    let sigma = &mut swarm.behaviour_mut().sigma;
    let Some(h) = held.remove(&id) else { return };
    if let Some((enter, token, valid)) = h.entered {
        let valid = sigma.acquisition(id).and_then(|a| a.valid_until).map_or(valid, |v| v.max(valid));
        let cs = record(shared, &h, index, enter, now, token, valid);
        shared.records.lock().expect("records").push(cs);
    }
    sigma.release(id);
}

fn record(shared: &Shared, h: &Held, node: usize, enter: Instant, exit: Instant, token: u64, valid: Instant) -> Cs {
    let since = |t: Instant| t.saturating_duration_since(shared.start);
    Cs {
        client: h.client,
        resource: h.resource,
        node,
        token,
        enter: since(enter),
        exit: since(exit),
        valid_until: since(valid),
    }
}

/// Abandons acquisitions past their deadline; refreshes the validity of held ones.
fn expire(sigma: &mut Behaviour, held: &mut HashMap<AcquisitionId, Held>, now: Instant) {
    let mut gone = Vec::new();
    for (id, h) in held.iter_mut() {
        match &mut h.entered {
            Some((_, _, valid)) => {
                if let Some(v) = sigma.acquisition(*id).and_then(|a| a.valid_until) {
                    *valid = (*valid).max(v);
                }
            }
            // Past its deadline, or its client has gone (the run is ending).
            None if now >= h.deadline || h.reply.as_ref().is_some_and(|r| r.is_closed()) => gone.push(*id),
            None => {}
        }
    }
    for id in gone {
        if let Some(mut h) = held.remove(&id) {
            if let Some(reply) = h.reply.take() {
                let _ = reply.send(Outcome::TimedOut);
            }
            sigma.release(id);
        }
    }
}

/// Samples the replica keys hosted here: keys new since the last sample open a span,
/// keys gone close theirs.
fn sample_hosted(
    sigma: &Behaviour,
    hosted: &mut HashMap<(usize, u16), (Duration, Duration)>,
    shared: &Shared,
    index: usize,
) {
    let now = shared.start.elapsed();
    let keys: Vec<(usize, u16)> =
        sigma.replicas(None).iter().filter_map(|r| Some((super::resource_index(&r.resource)?, r.index))).collect();
    let mut closed = Vec::new();
    hosted.retain(|key, (first, last)| {
        let still = keys.contains(key);
        if !still {
            closed.push(Span { key: *key, peer: index, first: *first, last: *last });
        }
        still
    });
    for key in &keys {
        hosted.entry(*key).and_modify(|(_, last)| *last = now).or_insert((now, now));
    }
    if !closed.is_empty() {
        shared.spans.lock().expect("spans").extend(closed);
    }
    let mut map = shared.hosted.lock().expect("hosted");
    if keys.is_empty() {
        map.remove(&index);
    } else {
        map.insert(index, keys);
    }
}

/// A departure this close before its peer's kill was recorded is the kill's (the
/// behaviour's clock and the harness's are read a moment apart).
const KILL_SLACK: Duration = Duration::from_millis(200);

/// Reads the departures this peer's view recorded since the last sample: a killed peer
/// dropped is a detection (the time since its kill), a peer up dropped after formation
/// is a false removal.
fn read_departures(sigma: &Behaviour, cursor: &mut DepartureCursor, shared: &Shared, phase: usize) {
    let (now, list) = sigma.recent_departures();
    let fresh = cursor.fresh(list);
    if fresh.is_empty() {
        return;
    }
    let elapsed = shared.start.elapsed();
    let mut detected = Vec::new();
    let mut false_removals = 0;
    {
        let kills = shared.kills.lock().expect("kills");
        for (who, t) in fresh {
            // When the view dropped it, since the run's start.
            let at = elapsed.saturating_sub(now.saturating_sub(t));
            match kills.get(&who) {
                Some(&killed) if at + KILL_SLACK >= killed => detected.push((who, at.saturating_sub(killed))),
                _ if (1..END).contains(&phase) => false_removals += 1,
                _ => {}
            }
        }
    }
    if false_removals > 0 {
        shared.false_removals.fetch_add(false_removals, Ordering::Relaxed);
    }
    if !detected.is_empty() {
        let mut d = shared.detections.lock().expect("detections");
        let room = MAX_DETECTIONS.saturating_sub(d.len());
        d.extend(detected.into_iter().take(room));
    }
}

/// Reads the running lookups' statistics; a lookup no longer known to Kademlia has
/// finished, and is answered with its last reading and the time until now.
fn poll_lookups(
    swarm: &mut Swarm<PeerBehaviour>,
    lookups: &mut Vec<(kad::QueryId, Instant, LookupStats, oneshot::Sender<LookupStats>)>,
) {
    let kad = swarm.behaviour_mut().sigma.kad_mut();
    let mut i = 0;
    while i < lookups.len() {
        let (query, started, stats, _) = &mut lookups[i];
        match kad.query(query) {
            Some(q) => {
                let s = q.stats();
                *stats =
                    LookupStats { requests: s.num_requests(), successes: s.num_successes(), time: started.elapsed() };
                i += 1;
            }
            None => {
                let (_, started, mut stats, reply) = lookups.swap_remove(i);
                stats.time = started.elapsed();
                let _ = reply.send(stats);
            }
        }
    }
}
