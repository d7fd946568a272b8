//! [`Node`] (owns the event loop) and [`NodeHandle`] (the cloneable embedded API).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use libp2p::identity::Keypair;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::SwarmEvent;
use libp2p::{Multiaddr, PeerId};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::admission::Admission;
use crate::command::Command;
pub use crate::command::{Status, WaitingLock};
use crate::error::{LockError, NodeError, RevokeError};
use crate::event_loop::EventLoop;
use crate::guard::LockGuard;
use crate::inspect::{self, Inspection, Revoked};
use crate::listing::{self, SwarmLocks};
use crate::watch::{self, Observe, Watch};
use crate::{identity, swarm};
use sigma_behaviour::addr::Scope;
use sigma_behaviour::wire::{LockEntry, Reply, Request};

/// Capacity of the command queue between handles and the event loop.
const COMMAND_QUEUE: usize = 1024;
/// How long an unused connection stays open: with the gossip's 4 exchanges a second
/// with random routing-table peers, a node keeps about 4 × this many connections in a
/// large swarm (a few dozen), and every peer in a small one.
pub const DEFAULT_IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`Node::start`] waits for its listeners to come up.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(10);

/// Configuration of a [`Node`]. Public fields; [`Default`] gives a node listening on
/// all interfaces (TCP and QUIC, ports chosen by the system) with a random identity and
/// the paper's quorum (n = 32, m = 24).
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Addresses to listen on, e.g. `/ip4/0.0.0.0/tcp/7590`, `/ip4/0.0.0.0/udp/7590/quic-v1`.
    pub listen: Vec<Multiaddr>,
    /// Peers to join through; each address ends with `/p2p/<peer id>`. An entry naming
    /// this node itself is skipped (one list can serve every node).
    pub bootstrap: Vec<Multiaddr>,
    /// Addresses other peers can dial this node at (a public IP, a port forwarded by a
    /// NAT, a DNS name), announced to them. Besides these, a listen address counts as
    /// external when it is at least as wide as the widest bootstrap address (loopback
    /// in a testnet on one machine, a LAN address in a swarm on one LAN; any listen
    /// address of a node without bootstrap peers), and AutoNAT confirms the addresses
    /// other peers observe when they are public. A node with no external address hosts
    /// no replica ([`sigma_behaviour::Readiness::Unreachable`]); its locks are served by
    /// the others.
    pub external_addresses: Vec<Multiaddr>,
    /// Persistent identity (created on first start); `None` for a random one.
    pub key_file: Option<PathBuf>,
    /// Protocol and behaviour parameters (quorum, lease, timeouts).
    pub behaviour: sigma_behaviour::Config,
    /// How long [`NodeHandle::try_lock`] tries.
    pub try_lock_timeout: Duration,
    /// A connection no protocol uses is closed after this long (membership and
    /// placement do not need connections: the membership gossip tells which peers are
    /// alive).
    pub idle_connection_timeout: Duration,
    /// Bounds on connections (counts, and memory).
    pub bounds: swarm::ConnectionBounds,
    /// On [`Node::shutdown`], how long the node keeps running after releasing its
    /// locks so that the RELEASE messages reach the replicas.
    pub shutdown_grace: Duration,
    /// On [`Node::shutdown`], the guards still held are marked lost first
    /// ([`LockGuard::lost`] fires) and their holders get this long to stop their work
    /// and release (or drop) them, before the node releases what remains.
    pub release_grace: Duration,
    /// libp2p's metrics (connections, identify, …), recorded from the swarm's events
    /// into the registry they were created in; `None`: not recorded.
    pub libp2p_metrics: Option<Libp2pMetrics>,
    /// Who may connect (an allow-list, a swarm key); default: anyone. With a swarm key,
    /// `listen` must hold TCP addresses only (the default's QUIC one is refused).
    pub admission: Admission,
    /// A short label for people, shown by the other peers next to this node's id
    /// (`sigma run --name`): 1 to 32 characters of `[A-Za-z0-9._-]`
    /// ([`crate::names::validate_name`]). Not an identity: any peer may take any name.
    pub name: Option<String>,
}

/// libp2p's metrics, shared with the registry that serves them.
#[derive(Clone)]
pub struct Libp2pMetrics(pub std::sync::Arc<libp2p::metrics::Metrics>);

impl std::fmt::Debug for Libp2pMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Libp2pMetrics")
    }
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            listen: vec![
                "/ip4/0.0.0.0/tcp/0".parse().expect("valid multiaddr"),
                "/ip4/0.0.0.0/udp/0/quic-v1".parse().expect("valid multiaddr"),
            ],
            bootstrap: Vec::new(),
            external_addresses: Vec::new(),
            key_file: None,
            behaviour: sigma_behaviour::Config::default(),
            try_lock_timeout: Duration::from_secs(1),
            idle_connection_timeout: DEFAULT_IDLE_CONNECTION_TIMEOUT,
            bounds: swarm::ConnectionBounds::default(),
            shutdown_grace: Duration::from_millis(500),
            release_grace: Duration::from_secs(1),
            libp2p_metrics: None,
            admission: Admission::default(),
            name: None,
        }
    }
}

/// Options of [`NodeHandle::lock_with`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockOptions {
    /// `(n, m)`: replicas and votes needed; `None` for the node's configured quorum. n
    /// must be the swarm's (every client of a lock shares one replica set) and m at
    /// least the swarm's; anything else is refused with [`crate::LockError::SwarmQuorum`].
    pub quorum: Option<(usize, usize)>,
    /// Give up (and abandon the attempt) after this long; `None` waits indefinitely.
    pub timeout: Option<Duration>,
    /// Quorum diversity D for this lock: the win needs votes hosted by at least this
    /// many distinct peers; `None` for the node's (see
    /// [`sigma_behaviour::Config::with_min_voters`]).
    pub min_peers: Option<usize>,
    /// A value to attach to the lock once held (at most
    /// [`sigma_behaviour::wire::MAX_VALUE_LEN`] bytes: a leader's address, say): whoever
    /// inspects or watches the lock reads it, with the holder's token;
    /// [`LockGuard::set_value`] replaces it.
    pub value: Option<Vec<u8>>,
}

/// A running sigma peer: the swarm and its event loop (a tokio task). Dropping the
/// `Node` aborts the loop at once (locks are not released: they run out with their
/// lease); [`Node::shutdown`] stops it cleanly.
#[derive(Debug)]
pub struct Node {
    handle: NodeHandle,
    listen_addrs: Vec<Multiaddr>,
    task: Option<JoinHandle<()>>,
}

impl Node {
    /// Builds the swarm, binds the listeners, dials the bootstrap peers and starts a
    /// Kademlia bootstrap. Returns once every listener is up (joining the swarm goes on
    /// in the background: poll [`NodeHandle::status`] to see it).
    pub async fn start(config: NodeConfig) -> Result<Node, NodeError> {
        if let Some(name) = &config.name {
            crate::names::validate_name(name)?;
        }
        let keypair = match &config.key_file {
            Some(path) => identity::load_or_create(path)?,
            None => Keypair::generate_ed25519(),
        };
        let local = keypair.public().to_peer_id();
        let bootstrap = parse_bootstrap(&config.bootstrap)?;
        // Given peers to join (other than itself), the node serves nothing until it has
        // joined them; without, it is a one-node swarm until others join it.
        let joining = bootstrap.iter().any(|(peer, _)| *peer != local);
        if !joining {
            tracing::info!("no bootstrap peers: a one-node swarm until others join");
        }
        let mut behaviour = config.behaviour.clone().with_joining(joining).with_external_address_required(true);
        // An allow-list is the membership: a majority is one of the listed peers.
        if let Some(peers) = &config.admission.allowed_peers {
            behaviour = behaviour.with_members(Some(peers.clone()));
        }
        // Listen addresses at least this wide count as external (see `external_addresses`).
        let listen_floor = Scope::widest(bootstrap.iter().filter(|(peer, _)| *peer != local).map(|(_, a)| a));
        if behaviour.connection_watermarks().is_none() {
            let (high, low) = config.bounds.watermarks();
            behaviour = behaviour.with_connection_watermarks(high, low);
        }
        let admission = &config.admission;
        for addr in &config.listen {
            admission.check_listen(addr).map_err(|reason| NodeError::Listen { addr: addr.clone(), reason })?;
        }
        admission.log();
        let autonat = swarm::runs_autonat(config.listen.iter().chain(&config.external_addresses));
        let mut swarm = swarm::build(
            keypair,
            behaviour,
            &config.bounds,
            config.idle_connection_timeout,
            admission,
            autonat,
            config.name.as_deref(),
        )?;

        let mut listeners = HashMap::new();
        for addr in &config.listen {
            let id = swarm
                .listen_on(addr.clone())
                .map_err(|e| NodeError::Listen { addr: addr.clone(), reason: e.to_string() })?;
            listeners.insert(id, addr.clone());
        }
        let mut up = HashSet::new();
        let mut listen_addrs = Vec::new();
        let wait = async {
            while up.len() < listeners.len() {
                match futures::StreamExt::select_next_some(&mut swarm).await {
                    SwarmEvent::NewListenAddr { listener_id, address } => {
                        tracing::info!(%address, "listening");
                        swarm::listen_address_up(&mut swarm, &address, listen_floor);
                        up.insert(listener_id);
                        listen_addrs.push(address);
                    }
                    SwarmEvent::ListenerClosed { listener_id, reason, .. } => {
                        let addr = listeners.get(&listener_id).cloned().unwrap_or_else(Multiaddr::empty);
                        let reason = match reason {
                            Ok(()) => "listener closed".to_owned(),
                            Err(e) => e.to_string(),
                        };
                        return Err(NodeError::Listen { addr, reason });
                    }
                    SwarmEvent::ListenerError { listener_id, error } => {
                        let addr = listeners.get(&listener_id).cloned().unwrap_or_else(Multiaddr::empty);
                        return Err(NodeError::Listen { addr, reason: error.to_string() });
                    }
                    other => tracing::trace!(event = ?other, "swarm event while starting"),
                }
            }
            Ok(())
        };
        match tokio::time::timeout(LISTEN_TIMEOUT, wait).await {
            Ok(result) => result?,
            Err(_) => {
                let pending = listeners.iter().find(|(id, _)| !up.contains(*id)).map(|(_, a)| a.clone());
                return Err(NodeError::Listen {
                    addr: pending.unwrap_or_else(Multiaddr::empty),
                    reason: "no listen address reported in time".to_owned(),
                });
            }
        }

        for addr in &config.external_addresses {
            tracing::info!(%addr, "external address (given)");
            swarm.add_external_address(addr.clone());
        }
        let mut joined = 0;
        let bootstrap_peers: Vec<(PeerId, Multiaddr)> =
            bootstrap.iter().filter(|(peer, _)| *peer != local).cloned().collect();
        for (peer, addr) in bootstrap {
            if peer == local {
                tracing::debug!(%addr, "skipping a bootstrap address naming this node");
                continue;
            }
            if !config.admission.allows(&peer) {
                tracing::warn!(%addr, "bootstrap peer is not on the allow-list: it will be refused");
            }
            let mut plain = addr.clone();
            plain.pop();
            swarm.behaviour_mut().sigma.add_address(&peer, plain);
            match swarm.dial(addr.clone()) {
                Ok(()) => joined += 1,
                Err(e) => tracing::warn!(%addr, error = %e, "cannot dial a bootstrap peer"),
            }
        }
        if joined > 0 {
            if let Err(e) = swarm.behaviour_mut().sigma.bootstrap() {
                tracing::warn!(error = %e, "Kademlia bootstrap not started");
            }
        }

        let (commands, receiver) = mpsc::channel(COMMAND_QUEUE);
        let refresh =
            (config.behaviour.protocol().lease() / 10).clamp(Duration::from_millis(10), Duration::from_millis(200));
        let mut event_loop = EventLoop::new(swarm, receiver, refresh, (config.release_grace, config.shutdown_grace));
        event_loop.metrics = config.libp2p_metrics.clone().map(|m| m.0);
        event_loop.bootstrap_peers = bootstrap_peers;
        event_loop.listen_floor = listen_floor;
        event_loop.name = config.name.clone();
        let task = tokio::spawn(event_loop.run());
        tracing::info!(peer = %local, "sigma node started");
        let quorum = (config.behaviour.protocol().n(), config.behaviour.protocol().m());
        let watches = std::sync::Arc::new(tokio::sync::Semaphore::new(crate::watch::MAX_WATCHES));
        let handle =
            NodeHandle { commands, peer_id: local, try_lock_timeout: config.try_lock_timeout, quorum, watches };
        Ok(Node { handle, listen_addrs, task: Some(task) })
    }

    /// A handle to the node's API (cheap to clone).
    pub fn handle(&self) -> NodeHandle {
        self.handle.clone()
    }

    /// This node's peer id.
    pub fn peer_id(&self) -> PeerId {
        self.handle.peer_id
    }

    /// The addresses the listeners reported at start (more may come later, see
    /// [`Status::listen_addrs`]).
    pub fn listen_addrs(&self) -> &[Multiaddr] {
        &self.listen_addrs
    }

    /// Resolves if the event loop ends without [`Node::shutdown`] (a panic in it): a
    /// daemon should then exit rather than serve its API over a dead node. Pending
    /// forever otherwise.
    pub async fn failed(&mut self) -> String {
        match self.task.as_mut() {
            Some(task) => {
                let why = match task.await {
                    Ok(()) => "the node's event loop ended".to_owned(),
                    Err(e) => format!("the node's event loop failed: {e}"),
                };
                self.task = None;
                why
            }
            None => std::future::pending().await,
        }
    }

    /// Stops the node: marks the guards still held lost and gives their holders
    /// [`NodeConfig::release_grace`] to stop and release them, then releases what
    /// remains and abandons the waits (waiting callers get [`LockError::NodeStopped`]),
    /// keeps the swarm running for [`NodeConfig::shutdown_grace`] so the releases go out,
    /// then stops the event loop and waits for it.
    pub async fn shutdown(mut self) -> Result<(), NodeError> {
        let Some(task) = self.task.take() else { return Err(NodeError::Stopped) };
        let (tx, rx) = oneshot::channel();
        if self.handle.commands.send(Command::Shutdown { reply: tx }).await.is_err() {
            return Err(NodeError::Stopped);
        }
        let _ = rx.await;
        task.await.map_err(|_| NodeError::Stopped)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

fn parse_bootstrap(addrs: &[Multiaddr]) -> Result<Vec<(PeerId, Multiaddr)>, NodeError> {
    addrs
        .iter()
        .map(|addr| match addr.iter().last() {
            Some(Protocol::P2p(peer)) if addr.len() > 1 => Ok((peer, addr.clone())),
            _ => Err(NodeError::Bootstrap {
                addr: addr.clone(),
                reason: "expected a transport address ending with /p2p/<peer id>".to_owned(),
            }),
        })
        .collect()
}

/// The node's API; cheap to clone, usable from any task. Every call is a command to the
/// node's event loop, answered on a oneshot channel.
#[derive(Clone, Debug)]
pub struct NodeHandle {
    commands: mpsc::Sender<Command>,
    peer_id: PeerId,
    try_lock_timeout: Duration,
    /// The swarm's replica count and quorum (n, m).
    quorum: (usize, usize),
    /// Permits for the watches open at once ([`crate::watch::MAX_WATCHES`]).
    watches: std::sync::Arc<tokio::sync::Semaphore>,
}

impl NodeHandle {
    /// The node's peer id.
    pub fn peer_id(&self) -> PeerId {
        self.peer_id
    }

    /// Waits until the lock is held. Cancel-safe: dropping the future abandons the
    /// attempt (and releases the lock if it was won meanwhile).
    pub async fn lock(&self, name: &str) -> Result<LockGuard, LockError> {
        self.lock_with(name, LockOptions::default()).await
    }

    /// Tries for [`NodeConfig::try_lock_timeout`]; `Ok(None)` if the lock was not won
    /// by then (the attempt is abandoned).
    pub async fn try_lock(&self, name: &str) -> Result<Option<LockGuard>, LockError> {
        match self.lock_timeout(name, self.try_lock_timeout).await {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Timeout) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Waits at most `timeout`; `Err(LockError::Timeout)` then (the attempt is abandoned).
    pub async fn lock_timeout(&self, name: &str, timeout: Duration) -> Result<LockGuard, LockError> {
        self.lock_with(name, LockOptions { timeout: Some(timeout), ..LockOptions::default() }).await
    }

    /// Acquires with options (quorum, timeout). Names with a `.slot` segment are
    /// reserved for semaphores ([`LockError::ReservedName`]; see [`crate::semaphore`]).
    pub async fn lock_with(&self, name: &str, options: LockOptions) -> Result<LockGuard, LockError> {
        crate::semaphore::refuse_reserved(name)?;
        self.lock_unchecked(name, options).await
    }

    /// [`NodeHandle::lock_with`] without the reserved names' check: a semaphore's slots.
    pub(crate) async fn lock_unchecked(&self, name: &str, options: LockOptions) -> Result<LockGuard, LockError> {
        let (reply, rx) = oneshot::channel();
        let command = Command::Lock {
            name: name.to_owned(),
            quorum: options.quorum,
            min_peers: options.min_peers,
            timeout: options.timeout,
            value: options.value,
            reply,
        };
        self.commands.send(command).await.map_err(|_| LockError::NodeStopped)?;
        rx.await.map_err(|_| LockError::NodeStopped)?
    }

    /// A snapshot of the node.
    pub async fn status(&self) -> Result<Status, NodeError> {
        self.ask(|reply| Command::Status { reply }).await
    }

    /// Blocks (`block`) or unblocks `peers`: a blocked peer's connections are closed and
    /// new ones refused, both ways. Answers the peers blocked afterwards. (The local
    /// testnet's partitions; an operator's quarantine.)
    pub async fn block_peers(&self, peers: Vec<PeerId>, block: bool) -> Result<Vec<PeerId>, NodeError> {
        self.ask(|reply| Command::Block { peers, block, reply }).await
    }

    /// The operator's word that `peers` are gone for good (`sigma admin forget`): each
    /// is removed from this node's membership counts at once, unless it is alive here
    /// or on the member list ([`sigma_behaviour::ForgetError`]). Only this node
    /// forgets: a swarm that lost more than half its members without a graceful stop
    /// serves again once every survivor has forgotten the dead.
    pub async fn forget_peers(
        &self,
        peers: Vec<PeerId>,
    ) -> Result<Vec<(PeerId, Result<(), sigma_behaviour::ForgetError>)>, NodeError> {
        self.ask(|reply| Command::Forget { peers, reply }).await
    }

    /// The replicas of lock `name` hosted by this node.
    pub async fn hosted_replicas(&self, name: &str) -> Result<Vec<sigma_behaviour::ReplicaInfo>, NodeError> {
        let name = name.to_owned();
        self.ask(|reply| Command::Inspect { name, reply }).await
    }

    /// The names `peers` announced (by peer id), for those that have one.
    pub async fn peer_names(
        &self,
        peers: Vec<PeerId>,
    ) -> Result<std::collections::BTreeMap<String, String>, NodeError> {
        self.ask(|reply| Command::Names { peers, reply }).await
    }

    /// The behaviour's counters, the totals of the hosted replicas' counters and this
    /// node's own (what `/metrics` serves).
    pub async fn counters(&self) -> Result<crate::metrics::Snapshot, NodeError> {
        self.ask(|reply| Command::Counters { reply }).await
    }

    /// The lock as the whole swarm sees it: the state of each of its replicas at its
    /// host, the holder (the acquisition owning m replicas) with its own answer (fencing
    /// token, validity), and the waiters with their places in line. Changes nothing.
    pub async fn inspect(&self, name: &str) -> Result<Inspection, LockError> {
        let mut inspection = self.inspect_unnamed(name, None).await?;
        let peers = inspection.peers().iter().filter_map(|p| p.parse().ok()).collect();
        inspection.names = self.peer_names(peers).await.map_err(|_| LockError::NodeStopped)?;
        Ok(inspection)
    }

    /// [`NodeHandle::inspect`] without the peers' names; with a `deadline`, each
    /// question gets that long (a host or holder silent by then counts as no answer).
    async fn inspect_unnamed(&self, name: &str, deadline: Option<Duration>) -> Result<Inspection, LockError> {
        let (reply, rx) = oneshot::channel();
        self.commands
            .send(Command::Survey { name: name.to_owned(), deadline, reply })
            .await
            .map_err(|_| LockError::NodeStopped)?;
        let answers = rx.await.map_err(|_| LockError::NodeStopped)??;
        let inspection = inspect::gather(name, self.quorum.1, &answers);
        let Some(holder) = &inspection.holder else { return Ok(inspection) };
        let Ok(peer) = holder.acquisition.peer.parse::<PeerId>() else { return Ok(inspection) };
        let request = Request::Holding { resource: name.to_owned(), counter: holder.acquisition.counter };
        let asked = self.ask_peer(peer, request);
        let answer = match deadline {
            // Past the deadline the holder counts as silent (its question runs out alone).
            Some(d) => tokio::time::timeout(d, asked).await.unwrap_or(Ok(None))?,
            None => asked.await?,
        };
        let holding = match answer {
            Some(Reply::Holding(h)) => h,
            _ => None,
        };
        Ok(inspection.with_holding(holding.as_ref()))
    }

    /// Follows lock `name`: a [`Watch`] delivers its state (held, free or unknown; the
    /// holder with its token and value; the waiters) each time it changes, as seen by
    /// an inspection every `interval` (default [`watch::DEFAULT_WATCH_INTERVAL`],
    /// clamped to [`watch::MIN_WATCH_INTERVAL`]..=[`watch::MAX_WATCH_INTERVAL`]). The
    /// first state comes after the first inspection. What a watcher is promised: the
    /// [`watch`] module. At most [`watch::MAX_WATCHES`] watches at once per node
    /// ([`LockError::TooManyWatches`]).
    pub fn watch(&self, name: &str, interval: Option<Duration>) -> Result<Watch, LockError> {
        sigma_behaviour::wire::validate_resource(name).map_err(|_| LockError::BadName)?;
        let permit = self.watches.clone().try_acquire_owned().map_err(|_| LockError::TooManyWatches)?;
        let interval = interval
            .unwrap_or(watch::DEFAULT_WATCH_INTERVAL)
            .clamp(watch::MIN_WATCH_INTERVAL, watch::MAX_WATCH_INTERVAL);
        let (tx, rx) = mpsc::channel(16);
        let handle = self.clone();
        let name = name.to_owned();
        tokio::spawn(async move {
            let mut follow = watch::Follow::default();
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = tx.closed() => return,
                }
                let inspected = handle.inspect_unnamed(&name, Some(watch::QUESTION_DEADLINE)).await;
                // A node that does not serve (a minority, joining) sees hosts of its own
                // side, which may know nothing of the holder: it cannot tell.
                let (tx_ready, rx_ready) = oneshot::channel();
                let _ = handle.commands.send(Command::Readiness { reply: tx_ready }).await;
                let tells = rx_ready.await.is_ok_and(|r| {
                    matches!(r, sigma_behaviour::Readiness::Serving | sigma_behaviour::Readiness::Unreachable)
                });
                let state = match inspected {
                    Ok(inspection) => match follow.next(inspection, tells) {
                        Some(state) => Ok(state),
                        None => continue,
                    },
                    Err(e) => Err(e),
                };
                let stop = state.is_err();
                if tx.send(state).await.is_err() || stop {
                    return;
                }
            }
        });
        Ok(Watch::new(rx, permit))
    }

    /// Follows the leader of lock `name` (its holder, as in an election where each
    /// candidate campaigns with [`LockOptions::value`] and proclaims with
    /// [`LockGuard::set_value`]): each new holder, and each new value of a holder,
    /// once and in token order. A [`NodeHandle::watch`] underneath, with its promises.
    pub fn observe(&self, name: &str, interval: Option<Duration>) -> Result<Observe, LockError> {
        self.watch(name, interval).map(Observe::new)
    }

    /// An operator's break-lock: makes the holder of lock `name` under fencing `token`
    /// give it up, wherever it is. Held through this node, it is revoked here; else the
    /// peers that own its replicas are asked, and the holder revokes it if it takes
    /// such orders from this node (`sigma run --admin-peer`). The holder's application
    /// learns the lock was lost; the next waiter gets it.
    pub async fn revoke(&self, name: &str, token: u64) -> Result<Revoked, RevokeError> {
        sigma_behaviour::wire::validate_resource(name).map_err(|_| RevokeError::Lock(LockError::BadName))?;
        let request = Request::Revoke { resource: name.to_owned(), token };
        if let Some(Reply::Ack) = self.ask_peer(self.peer_id, request.clone()).await? {
            return Ok(Revoked { name: name.to_owned(), token, holder: self.peer_id.to_string() });
        }
        let inspection = self.inspect(name).await?;
        let mut owners: Vec<&str> =
            inspection.replicas.iter().filter_map(|r| r.owner.as_ref()).map(|o| o.peer.as_str()).collect();
        owners.sort_unstable();
        owners.dedup();
        let (mut refused, mut unanswered) = (Vec::new(), Vec::new());
        for owner in owners {
            let Ok(peer) = owner.parse::<PeerId>() else { continue };
            if peer == self.peer_id {
                continue;
            }
            match self.ask_peer(peer, request.clone()).await? {
                Some(Reply::Ack) => return Ok(Revoked { name: name.to_owned(), token, holder: owner.to_owned() }),
                Some(Reply::Rejected(sigma_behaviour::wire::Rejection::NotHolder)) => {}
                Some(Reply::Rejected(r)) => refused.push(format!("{owner}: {}", r.as_str())),
                _ => unanswered.push(owner.to_owned()),
            }
        }
        let (name, token) = (name.to_owned(), token);
        Err(if !refused.is_empty() {
            RevokeError::Refused { name, token, refused }
        } else if !unanswered.is_empty() {
            RevokeError::Unanswered { name, token, peers: unanswered }
        } else {
            RevokeError::NotFound { name, token }
        })
    }

    /// The locks held and waited for across the swarm: every alive member (at most
    /// [`listing::MAX_ASKED`], this node included) is asked for its acquisitions, and
    /// the answers are put together by lock name. A snapshot: see [`crate::listing`].
    pub async fn swarm_locks(&self) -> Result<SwarmLocks, NodeError> {
        let status = self.status().await?;
        let alive = status.member_peers.iter().filter(|m| m.alive).map(|m| m.peer);
        let mut peers: Vec<PeerId> = std::iter::once(self.peer_id).chain(alive).collect();
        peers.truncate(listing::MAX_ASKED);
        let asks = peers.into_iter().map(|peer| async move { (peer, self.locks_of(peer).await) });
        let mut locks = listing::gather(futures::future::join_all(asks).await);
        let listed = locks.peers().iter().filter_map(|p| p.parse().ok()).collect();
        locks.names = self.peer_names(listed).await?;
        Ok(locks)
    }

    /// What `peer` holds and waits for, at most [`listing::MAX_PAGES`] pages, with how
    /// many were left out; `None` if it did not answer (or answered out of bounds).
    async fn locks_of(&self, peer: PeerId) -> Option<(Vec<LockEntry>, u32)> {
        let (mut entries, mut more, mut after) = (Vec::new(), 0, None);
        for page in 0..listing::MAX_PAGES {
            match self.ask_peer(peer, Request::Locks { after: after.take() }).await {
                Ok(Some(Reply::Locks(list))) => {
                    more = list.more;
                    after = list.locks.last().map(|e| (e.resource.clone(), e.counter));
                    entries.extend(list.locks);
                    if more == 0 || after.is_none() {
                        return Some((entries, 0));
                    }
                }
                // A later page lost: what came, and how many were said to follow.
                _ if page > 0 => break,
                _ => return None,
            }
        }
        Some((entries, more))
    }

    async fn ask_peer(&self, peer: PeerId, request: Request) -> Result<Option<Reply>, LockError> {
        let (reply, rx) = oneshot::channel();
        self.commands
            .send(Command::Ask { peer, request: Box::new(request), reply })
            .await
            .map_err(|_| LockError::NodeStopped)?;
        rx.await.map_err(|_| LockError::NodeStopped)
    }

    /// Releases a lock held through this node, named by lock name and fencing token
    /// (for callers that keep no [`LockGuard`], see [`LockGuard::into_detached`]).
    /// `Ok(false)` if no such lock is held (already released, or lost).
    pub async fn release_by_token(&self, name: &str, token: u64) -> Result<bool, NodeError> {
        let name = name.to_owned();
        self.ask(|reply| Command::ReleaseByToken { name, token, reply }).await
    }

    /// Round trip from this node to the host of each replica of lock `name` (`n`
    /// replicas, default the configured n), along the path a REQUEST takes but without
    /// protocol work: the baseline for acquire latency. By replica index; `None` for a
    /// host that did not answer; zero for replicas hosted here.
    pub async fn probe(&self, name: &str, n: Option<usize>) -> Result<Vec<Option<Duration>>, LockError> {
        let (reply, rx) = oneshot::channel();
        let command = Command::Probe { name: name.to_owned(), n, reply };
        self.commands.send(command).await.map_err(|_| LockError::NodeStopped)?;
        rx.await.map_err(|_| LockError::NodeStopped)?
    }

    async fn ask<T>(&self, command: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, NodeError> {
        let (tx, rx) = oneshot::channel();
        self.commands.send(command(tx)).await.map_err(|_| NodeError::Stopped)?;
        rx.await.map_err(|_| NodeError::Stopped)
    }
}
