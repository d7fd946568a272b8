//! The event loop: owns the swarm, serves the commands of [`crate::NodeHandle`] and
//! [`crate::LockGuard`], and turns the behaviour's events into replies.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use futures::StreamExt;
use libp2p::allow_block_list::NotAllowed;
use libp2p::swarm::{ListenError, SwarmEvent};
use libp2p::{identify, Swarm};
use sigma_behaviour::wire::Reply;
use sigma_behaviour::{AcquisitionId, Event};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};

use crate::command::{Command, MemberPeer, ProbeReply, Status, SurveyReply, WaitingLock};
use crate::error::LockError;
use crate::guard::{GuardMsg, GuardState, LockGuard, Release};
use crate::names::PeerNames;
use crate::swarm::{NodeBehaviour, NodeBehaviourEvent};

/// Capacity of the guards' release channel (a full one makes a dropped guard hand its
/// release to a task).
const RELEASE_QUEUE: usize = 1024;
/// Lock names whose last token this node remembers (to count regressions).
const TOKEN_MEMORY: usize = 4096;
/// First delay between the node's own Kademlia bootstraps (self-lookups once joined);
/// doubles up to [`BOOTSTRAP_MAX_INTERVAL`]. Peers that joined through the same
/// bootstrap node at about the same time learn of each other at the next round
/// (Kademlia's own automatic bootstrap only runs while its routing table has fewer than
/// 20 peers, and then every 5 minutes).
const BOOTSTRAP_FIRST_INTERVAL: Duration = Duration::from_secs(1);
/// Longest delay between the node's own bootstraps.
const BOOTSTRAP_MAX_INTERVAL: Duration = Duration::from_secs(300);
/// Longest delay between attempts to reach the bootstrap peers while joining.
const JOINING_RETRY: Duration = Duration::from_secs(4);

/// A caller waiting for a lock.
struct Waiter {
    name: String,
    reply: oneshot::Sender<Result<LockGuard, LockError>>,
    deadline: Option<Instant>,
}

/// A lock held through this node (by a guard, or detached).
struct Held {
    name: String,
    token: u64,
    state: watch::Sender<GuardState>,
}

pub(crate) struct EventLoop {
    /// libp2p's metrics, recorded from every swarm event.
    pub(crate) metrics: Option<std::sync::Arc<libp2p::metrics::Metrics>>,
    swarm: Swarm<NodeBehaviour>,
    commands: mpsc::Receiver<Command>,
    /// Guards' releases, taken before commands.
    releases: mpsc::Receiver<GuardMsg>,
    /// Given to guards, so that they can release.
    release_sender: mpsc::Sender<GuardMsg>,
    waiting: HashMap<AcquisitionId, Waiter>,
    /// Round-trip probes in flight.
    probes: HashMap<sigma_behaviour::ProbeId, ProbeReply>,
    /// Inspections in flight.
    surveys: HashMap<sigma_behaviour::ProbeId, SurveyReply>,
    /// Operator's questions in flight.
    asks: HashMap<sigma_behaviour::ProbeId, oneshot::Sender<Option<Reply>>>,
    deadlines: BTreeSet<(Instant, AcquisitionId)>,
    /// Inspections to end at a deadline (a watch's); an entry whose inspection ended
    /// first is dropped when it comes due.
    survey_deadlines: BTreeSet<(Instant, sigma_behaviour::ProbeId)>,
    held: HashMap<AcquisitionId, Held>,
    last_tokens: HashMap<String, u64>,
    token_regressions: u64,
    refresh: Duration,
    /// On shutdown: the holders' time to release after their guards were marked lost.
    release_grace: Duration,
    shutdown_grace: Duration,
    next_bootstrap: Instant,
    bootstrap_interval: Duration,
    /// The peers given to join through: redialled while the node is still joining.
    pub(crate) bootstrap_peers: Vec<(libp2p::PeerId, libp2p::Multiaddr)>,
    /// Listen addresses at least this wide count as external ([`crate::NodeConfig::external_addresses`]).
    pub(crate) listen_floor: Option<sigma_behaviour::addr::Scope>,
    /// This node's name ([`crate::NodeConfig::name`]).
    pub(crate) name: Option<String>,
    /// The other peers' names, as their identify announced them.
    names: PeerNames,
}

impl EventLoop {
    pub(crate) fn new(
        swarm: Swarm<NodeBehaviour>,
        commands: mpsc::Receiver<Command>,
        refresh: Duration,
        (release_grace, shutdown_grace): (Duration, Duration),
    ) -> Self {
        let (release_sender, releases) = mpsc::channel(RELEASE_QUEUE);
        EventLoop {
            swarm,
            commands,
            releases,
            release_sender,
            waiting: HashMap::new(),
            probes: HashMap::new(),
            surveys: HashMap::new(),
            asks: HashMap::new(),
            deadlines: BTreeSet::new(),
            survey_deadlines: BTreeSet::new(),
            held: HashMap::new(),
            last_tokens: HashMap::new(),
            token_regressions: 0,
            refresh,
            release_grace,
            shutdown_grace,
            next_bootstrap: Instant::now() + BOOTSTRAP_FIRST_INTERVAL,
            bootstrap_interval: BOOTSTRAP_FIRST_INTERVAL,
            bootstrap_peers: Vec::new(),
            listen_floor: None,
            metrics: None,
            name: None,
            names: PeerNames::default(),
        }
    }

    pub(crate) async fn run(mut self) {
        let mut tick = tokio::time::interval(self.refresh);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let next_deadline =
                [self.deadlines.first().map(|(t, _)| *t), self.survey_deadlines.first().map(|(t, _)| *t)]
                    .into_iter()
                    .flatten()
                    .min();
            tokio::select! {
                // Releases first: a guard released (or dropped) before its task asks
                // for the lock again must not find its own old hold in the way.
                biased;
                Some(release) = self.releases.recv() => {
                    if self.on_release(release) {
                        // The caller's answer goes before the RELEASE messages: the
                        // first of them wakes a replica host, which on a busy machine
                        // takes this thread's CPU before the answer is written.
                        tokio::task::yield_now().await;
                    }
                }
                command = self.commands.recv() => match command {
                    Some(Command::Shutdown { reply }) => {
                        self.shutdown().await;
                        let _ = reply.send(());
                        return;
                    }
                    Some(command) => self.on_command(command),
                    None => return,
                },
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
                _ = tick.tick() => self.on_tick(),
                () = tokio::time::sleep_until(next_deadline.unwrap_or_else(Instant::now)), if next_deadline.is_some() => {
                    self.on_deadlines()
                }
            }
        }
    }

    fn sigma(&mut self) -> &mut sigma_behaviour::Behaviour {
        &mut self.swarm.behaviour_mut().sigma
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Lock { name, quorum, min_peers, timeout, value, reply } => {
                let acquired = self.sigma().acquire_with(&name, quorum, min_peers).and_then(|id| match value {
                    Some(value) => {
                        self.sigma().set_value(id, value).map(|_| id).inspect_err(|_| self.sigma().release(id))
                    }
                    None => Ok(id),
                });
                match acquired {
                    Err(e) => {
                        let _ = reply.send(Err(e.into()));
                    }
                    Ok(id) => {
                        tracing::debug!(lock = %name, %id, "acquiring");
                        let deadline = timeout.and_then(|d| Instant::now().checked_add(d)); // too far: none
                        if let Some(at) = deadline {
                            self.deadlines.insert((at, id));
                        }
                        self.waiting.insert(id, Waiter { name, reply, deadline });
                    }
                }
            }
            Command::ReleaseByToken { name, token, reply } => {
                let id = self.held.iter().find(|(_, h)| h.name == name && h.token == token).map(|(id, _)| *id);
                if let Some(id) = id {
                    self.release(id);
                }
                let _ = reply.send(id.is_some());
            }
            Command::Status { reply } => {
                let _ = reply.send(self.status());
            }
            Command::Inspect { name, reply } => {
                let _ = reply.send(self.sigma().replicas(Some(&name)));
            }
            Command::Counters { reply } => {
                let sigma = &self.swarm.behaviour().sigma;
                let _ = reply.send(crate::metrics::Snapshot {
                    counters: sigma.counters().clone(),
                    replicas: sigma.replica_totals(),
                    token_regressions: self.token_regressions,
                });
            }
            Command::Probe { name, n, reply } => match self.sigma().probe(&name, n) {
                Ok(id) => {
                    self.probes.insert(id, reply);
                }
                Err(e) => {
                    let _ = reply.send(Err(e.into()));
                }
            },
            Command::Survey { name, deadline, reply } => match self.sigma().inspect(&name, None) {
                Ok(id) => {
                    self.surveys.insert(id, reply);
                    if let Some(at) = deadline.and_then(|d| Instant::now().checked_add(d)) {
                        self.survey_deadlines.insert((at, id));
                    }
                }
                Err(e) => {
                    let _ = reply.send(Err(e.into()));
                }
            },
            Command::Readiness { reply } => {
                let _ = reply.send(self.sigma().readiness());
            }
            Command::Ask { peer, request, reply } => {
                let id = self.sigma().ask(peer, *request);
                self.asks.insert(id, reply);
            }
            Command::Shutdown { reply } => {
                // Handled in `run`.
                let _ = reply.send(());
            }
            Command::Names { peers, reply } => {
                let mut names = self.names.of(&peers);
                let local = *self.swarm.local_peer_id();
                if let (Some(name), true) = (&self.name, peers.contains(&local)) {
                    names.insert(local.to_string(), name.clone());
                }
                let _ = reply.send(names);
            }
            Command::Forget { peers, reply } => {
                let _ = reply.send(self.sigma().forget(&peers));
            }
            Command::Block { peers, block, reply } => {
                let list = &mut self.swarm.behaviour_mut().block;
                for p in peers {
                    if block {
                        list.block_peer(p);
                    } else {
                        list.unblock_peer(p);
                    }
                }
                let mut blocked: Vec<libp2p::PeerId> = list.blocked_peers().iter().copied().collect();
                blocked.sort();
                let _ = reply.send(blocked);
            }
        }
    }

    /// Applies a guard's message: a release (or abandon; unknown ids are ignored), its
    /// caller answered if one waits (`true` then), or a new value.
    fn on_release(&mut self, msg: GuardMsg) -> bool {
        match msg {
            GuardMsg::Release(Release { id, reply }) => {
                self.release(id);
                reply.map(|r| r.send(())).is_some()
            }
            GuardMsg::SetValue { id, value, reply } => {
                let set = if self.held.contains_key(&id) {
                    self.sigma().set_value(id, value).map_err(LockError::from)
                } else {
                    Ok(None)
                };
                let _ = reply.send(set);
                false
            }
        }
    }

    fn release(&mut self, id: AcquisitionId) {
        if let Some(h) = self.held.remove(&id) {
            tracing::debug!(lock = %h.name, token = h.token, %id, "releasing");
        }
        if let Some(w) = self.waiting.remove(&id) {
            if let Some(at) = w.deadline {
                self.deadlines.remove(&(at, id));
            }
        }
        self.sigma().release(id);
    }

    fn status(&self) -> Status {
        let sigma = &self.swarm.behaviour().sigma;
        let mut locks_held: Vec<(String, u64)> = self.held.values().map(|h| (h.name.clone(), h.token)).collect();
        locks_held.sort();
        let mut locks_waiting: Vec<String> = self.waiting.values().map(|w| w.name.clone()).collect();
        locks_waiting.sort();
        let mut waiting: Vec<WaitingLock> = self
            .waiting
            .iter()
            .map(|(id, w)| {
                let info = sigma.acquisition(*id);
                WaitingLock {
                    name: w.name.clone(),
                    position: info.as_ref().and_then(|a| a.position),
                    votes: info.map_or(0, |a| a.votes),
                }
            })
            .collect();
        waiting.sort_by(|a, b| (&a.name, a.position).cmp(&(&b.name, b.position)));
        let mut connected_peers: Vec<_> = self.swarm.connected_peers().copied().collect();
        connected_peers.sort();
        let readiness = sigma.readiness();
        let (reachable_members, members) = sigma.members();
        let sizes = sigma.state_sizes();
        let departed_members = sigma.departed_members(256);
        let member_peers: Vec<MemberPeer> =
            sigma.member_list(256).into_iter().map(|(peer, alive)| MemberPeer { peer, alive }).collect();
        let listed = connected_peers.iter().chain(&departed_members).chain(member_peers.iter().map(|m| &m.peer));
        let peer_names = self.names.of(listed);
        Status {
            peer_id: *self.swarm.local_peer_id(),
            name: self.name.clone(),
            member_peers,
            peer_names,
            listen_addrs: self.swarm.listeners().cloned().collect(),
            connected_peers,
            connections: self.swarm.network_info().connection_counters().num_established(),
            routable_peers: sigma.routable_peers(),
            replicas_hosted: sizes.replicas,
            state: sizes,
            locks_held,
            locks_waiting,
            waiting,
            token_regressions: self.token_regressions,
            external_addrs: self.swarm.external_addresses().cloned().collect(),
            ready: readiness == sigma_behaviour::Readiness::Serving,
            readiness: readiness.as_str().to_owned(),
            readiness_detail: readiness.to_string(),
            members,
            reachable_members,
            takeover_delay_ms: u64::try_from(sigma.takeover_delay().as_millis()).unwrap_or(u64::MAX),
            departed_members,
            held_back_ms: u64::try_from(sigma.held_back().as_millis()).unwrap_or(u64::MAX),
        }
    }

    fn on_swarm_event(&mut self, event: SwarmEvent<NodeBehaviourEvent>) {
        if let Some(m) = &self.metrics {
            use libp2p::metrics::Recorder;
            m.record(&event);
            if let SwarmEvent::Behaviour(NodeBehaviourEvent::Identify(e)) = &event {
                m.record(e);
            }
        }
        match event {
            SwarmEvent::Behaviour(NodeBehaviourEvent::Sigma(event)) => self.on_sigma_event(event),
            SwarmEvent::Behaviour(NodeBehaviourEvent::Identify(identify::Event::Received {
                peer_id, info, ..
            })) => {
                if info.protocols.contains(&sigma_behaviour::wire::PROTOCOL) {
                    tracing::debug!(peer = %peer_id, addrs = ?info.listen_addrs, agent = %info.agent_version, "identified a sigma peer");
                    // Room for a newcomer's name is made from peers neither connected nor members.
                    let (swarm, names) = (&self.swarm, &mut self.names);
                    let sigma = &swarm.behaviour().sigma;
                    names.heard(peer_id, &info.agent_version, |p| swarm.is_connected(p) || sigma.is_member(p));
                    self.sigma().identified(&peer_id, &info.protocols, info.listen_addrs);
                } else {
                    tracing::debug!(peer = %peer_id, agent = %info.agent_version, "peer does not speak sigma");
                }
            }
            SwarmEvent::Behaviour(NodeBehaviourEvent::Identify(_)) => {}
            SwarmEvent::ConnectionEstablished { peer_id, endpoint, num_established, .. } => {
                tracing::debug!(peer = %peer_id, addr = %endpoint.get_remote_address(), num_established, "connected");
            }
            SwarmEvent::ConnectionClosed { peer_id, num_established, cause, .. } => {
                tracing::debug!(peer = %peer_id, num_established, cause = ?cause, "connection closed");
            }
            SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => {
                tracing::debug!(peer = ?peer_id, %error, "dial failed");
            }
            SwarmEvent::IncomingConnectionError { peer_id, send_back_addr, error, .. } => {
                // Counted by libp2p's metrics (`libp2p_swarm_connections_incoming_error_total`).
                let outcome = match &error {
                    ListenError::Denied { cause } if cause.downcast_ref::<NotAllowed>().is_some() => {
                        "not on the allow-list"
                    }
                    ListenError::Denied { .. } => "denied",
                    // A peer without the swarm key ends here (its handshake is noise to us).
                    _ => "failed",
                };
                tracing::debug!(peer = ?peer_id, addr = %send_back_addr, %error, outcome, "incoming connection not established");
            }
            SwarmEvent::NewListenAddr { address, .. } => {
                tracing::info!(%address, "listening");
                crate::swarm::listen_address_up(&mut self.swarm, &address, self.listen_floor);
            }
            SwarmEvent::ExpiredListenAddr { address, .. } => {
                tracing::info!(%address, "no longer listening");
                self.swarm.remove_external_address(&address);
            }
            SwarmEvent::ExternalAddrConfirmed { address } => tracing::info!(%address, "external address confirmed"),
            SwarmEvent::ExternalAddrExpired { address } => tracing::info!(%address, "external address expired"),
            SwarmEvent::ListenerError { error, .. } => tracing::warn!(%error, "listener error"),
            _ => {}
        }
    }

    fn on_sigma_event(&mut self, event: Event) {
        match event {
            Event::Acquired { id, resource, token, valid_until, votes, distinct_peers } => {
                let Some(waiter) = self.waiting.remove(&id) else {
                    // Abandoned (timeout, caller gone) after the win was decided.
                    self.sigma().release(id);
                    return;
                };
                if let Some(at) = waiter.deadline {
                    self.deadlines.remove(&(at, id));
                }
                self.check_token(&resource, token);
                let (state, rx) = watch::channel(GuardState { valid_until, lost: false });
                let guard =
                    LockGuard::new(resource.clone(), token, id, self.release_sender.clone(), rx, distinct_peers);
                self.held.insert(id, Held { name: resource.clone(), token, state });
                match waiter.reply.send(Ok(guard)) {
                    Ok(()) => tracing::debug!(lock = %resource, token, votes, distinct_peers, %id, "lock acquired"),
                    Err(unsent) => {
                        tracing::debug!(lock = %resource, %id, "lock won for a caller that has gone: releasing");
                        if let Ok(guard) = unsent {
                            let _ = guard.into_detached();
                        }
                        self.release(id);
                    }
                }
            }
            Event::Probed { id, rtts } => {
                if let Some(reply) = self.probes.remove(&id) {
                    let _ = reply.send(Ok(rtts));
                }
            }
            Event::Inspected { id, replicas } => {
                if let Some(reply) = self.surveys.remove(&id) {
                    let _ = reply.send(Ok(replicas));
                }
            }
            Event::Answered { id, reply } => {
                if let Some(tx) = self.asks.remove(&id) {
                    let _ = tx.send(reply);
                }
            }
            Event::Revoked { id, resource, token, by } => {
                if let Some(h) = self.held.get(&id) {
                    tracing::warn!(lock = %resource, token, %by, %id, "lock revoked by an operator");
                    h.state.send_modify(|s| s.lost = true);
                }
                self.release(id);
            }
            Event::Lost { id, reason } => {
                if let Some(h) = self.held.get(&id) {
                    tracing::warn!(lock = %h.name, token = h.token, %id, ?reason, "lock lost");
                    h.state.send_modify(|s| s.lost = true);
                }
                // Whatever is left of it is released at once: it no longer protects
                // anything, and its votes are better spent on the next holder.
                self.release(id);
            }
        }
    }

    /// Counts a token that is not above the last one this node saw for the lock.
    fn check_token(&mut self, name: &str, token: u64) {
        if let Some(last) = self.last_tokens.get(name) {
            if token <= *last {
                self.token_regressions += 1;
                tracing::warn!(lock = %name, token, last = *last, "fencing token did not increase");
            }
        }
        if self.last_tokens.len() >= TOKEN_MEMORY && !self.last_tokens.contains_key(name) {
            self.last_tokens.clear();
        }
        let last = self.last_tokens.entry(name.to_owned()).or_default();
        *last = token.max(*last);
    }

    /// Publishes renewed deadlines; abandons waits whose caller has gone; bootstraps
    /// Kademlia on its schedule.
    fn on_tick(&mut self) {
        let now = Instant::now();
        if now >= self.next_bootstrap {
            let joining = self.sigma().readiness() == sigma_behaviour::Readiness::Joining;
            // Still joining: keep trying the bootstrap peers (Kademlia forgets the
            // address of a peer it could not dial), at least every JOINING_RETRY.
            let cap = if joining { JOINING_RETRY } else { BOOTSTRAP_MAX_INTERVAL };
            self.bootstrap_interval = (self.bootstrap_interval * 2).min(cap);
            self.next_bootstrap = now + self.bootstrap_interval;
            if joining {
                for (peer, addr) in self.bootstrap_peers.clone() {
                    if !self.swarm.is_connected(&peer) {
                        let mut plain = addr.clone();
                        plain.pop();
                        self.sigma().add_address(&peer, plain);
                        if let Err(e) = self.swarm.dial(addr.clone()) {
                            tracing::debug!(%addr, error = %e, "cannot dial a bootstrap peer");
                        }
                    }
                }
            }
            // A bootstrap while joining (its success joins; the behaviour cuts it to
            // its self-lookup); once joined a lookup of this node's own id, one query
            // instead of one per bucket (Kademlia's own periodic bootstrap refreshes
            // the buckets every `KAD_REFRESH`), skipped while the last one is fresh.
            // Fails only with an empty routing table: nothing to do then.
            let query = if joining { self.sigma().bootstrap().map(Some) } else { self.sigma().lookup_self() };
            if let Ok(Some(query)) = query {
                tracing::debug!(?query, joining, next_in = ?self.bootstrap_interval, "Kademlia bootstrap or self-lookup");
            }
        }
        let sigma = &self.swarm.behaviour().sigma;
        for (id, h) in &self.held {
            if let Some(until) = sigma.acquisition(*id).and_then(|a| a.valid_until) {
                h.state.send_if_modified(|s| {
                    let changed = s.valid_until != until;
                    s.valid_until = until;
                    changed
                });
            }
        }
        let gone: Vec<AcquisitionId> =
            self.waiting.iter().filter(|(_, w)| w.reply.is_closed()).map(|(id, _)| *id).collect();
        for id in gone {
            tracing::debug!(%id, "caller stopped waiting: abandoning the acquisition");
            self.release(id);
        }
    }

    fn on_deadlines(&mut self) {
        let now = Instant::now();
        while let Some(&(at, id)) = self.survey_deadlines.first() {
            if at > now {
                break;
            }
            self.survey_deadlines.remove(&(at, id));
            self.sigma().finish_probe(id);
        }
        while let Some(&(at, id)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.remove(&(at, id));
            if let Some(w) = self.waiting.remove(&id) {
                tracing::debug!(lock = %w.name, %id, "timed out waiting for the lock");
                self.sigma().release(id);
                // A node that does not serve says why rather than "timed out".
                let readiness = self.sigma().readiness();
                let error = match readiness {
                    // A node no peer can dial serves no replica by design: its locks are
                    // the others' to serve, and a wait that ends is a timeout.
                    sigma_behaviour::Readiness::Serving | sigma_behaviour::Readiness::Unreachable => LockError::Timeout,
                    r => LockError::NotReady(r.to_string()),
                };
                let _ = w.reply.send(Err(error));
            }
        }
    }

    /// Tells the holders their locks are lost, gives them `release_grace` to release,
    /// releases everything left, leaves the swarm (its signed leave to every connected
    /// member), lets the RELEASE and leave messages go out, returns.
    async fn shutdown(&mut self) {
        let held = !self.held.is_empty();
        for h in self.held.values() {
            h.state.send_modify(|s| s.lost = true);
        }
        let deadline = Instant::now() + self.release_grace;
        while !self.held.is_empty() {
            tokio::select! {
                biased;
                Some(release) = self.releases.recv() => {
                    self.on_release(release);
                }
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        let ids: Vec<AcquisitionId> = self.held.keys().chain(self.waiting.keys()).copied().collect();
        for id in ids {
            self.release(id);
        }
        tracing::info!(released_locks = held, "shutting down");
        // The members stop counting this peer at once (a graceful leave), rather than
        // after the liveness timeout, and for good rather than as a departure that
        // would leave them a minority if more than half stop.
        let told = self.sigma().leave();
        if held || told > 0 {
            let deadline = Instant::now() + self.shutdown_grace;
            while self.swarm.connected_peers().next().is_some() {
                tokio::select! {
                    event = self.swarm.select_next_some() => self.on_swarm_event(event),
                    () = tokio::time::sleep_until(deadline) => break,
                }
            }
        }
    }
}
