//! The simulator's view of a protocol: the sans-IO client and replica of
//! `sigma_behaviour::proto`, behind one trait so the same engine, workload, latency,
//! loss and reset models and exclusion checker drive each of them.

use std::collections::VecDeque;

use crate::baselines::backoff::Backoff;
use crate::baselines::classical::Process;
use crate::baselines::{cmr, obeidat, strawman};
use rand::RngCore;
use sigma_behaviour::proto::{self, client::Phase, Config, Event, Replica, Response, Time, Timestamp, ToReplica};

/// Per-acquisition message counters a protocol reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// YIELD messages sent.
    pub yields: u64,
    /// Re-sent REQUESTs (informed backoff, retransmission), or lost rounds.
    pub retries: u64,
    /// Lease renewals.
    pub renewals: u64,
}

/// Client ids in the simulator: one per arrival.
pub type ClientId = u32;

/// A protocol the simulator can run: a client state machine per acquisition and a
/// replica state machine per logical replica, with messages in both directions.
pub trait Protocol {
    /// Replica state machine.
    type Replica;
    /// Client (one acquisition) state machine.
    type Client;
    /// Client → replica message.
    type Up: Clone;
    /// Replica → client message.
    type Down: Clone;

    /// Short name for reports.
    fn name(&self) -> String;
    /// Shared protocol parameters.
    fn config(&self) -> &Config;

    /// A replica with empty memory (also what a reset leaves).
    fn new_replica(&self) -> Self::Replica;
    /// Handles a message; `false` if the replica rejected it.
    fn replica_handle(&self, r: &mut Self::Replica, now: Time, from: ClientId, msg: Self::Up) -> bool;
    /// Replica timers.
    fn replica_timeout(&self, r: &mut Self::Replica, now: Time);
    /// Next replica timer.
    fn replica_poll_timeout(&self, r: &Self::Replica) -> Option<Time>;
    /// Next outgoing replica message.
    fn replica_transmit(&self, r: &mut Self::Replica) -> Option<(ClientId, Self::Down)>;

    /// Starts an acquisition.
    fn new_client(&self, ts: Timestamp<ClientId>, now: Time) -> Self::Client;
    /// Handles a message from replica `from`; `false` if the client rejected it.
    fn client_handle(
        &self,
        c: &mut Self::Client,
        now: Time,
        from: usize,
        msg: Self::Down,
        rng: &mut dyn RngCore,
    ) -> bool;
    /// Client timers.
    fn client_timeout(&self, c: &mut Self::Client, now: Time, rng: &mut dyn RngCore);
    /// Next client timer.
    fn client_poll_timeout(&self, c: &Self::Client) -> Option<Time>;
    /// Next outgoing client message, with its replica index.
    fn client_transmit(&self, c: &mut Self::Client) -> Option<(usize, Self::Up)>;
    /// Next application event.
    fn client_event(&self, c: &mut Self::Client) -> Option<Event>;
    /// Leaves the CS / gives up.
    fn client_release(&self, c: &mut Self::Client, now: Time);
    /// Phase of the acquisition.
    fn client_phase(&self, c: &Self::Client) -> Phase;
    /// Replicas voting for the client, as it knows them (for the violation analysis).
    fn voters(&self, c: &Self::Client) -> Vec<usize>;
    /// Whether a client that won, has not left and has not been told it lost still
    /// counts its lock valid at `now` by its own clock: the exclusion check counts it
    /// as a holder only then. Default: always (from the win to the exit or the loss).
    fn holds(&self, _c: &Self::Client, _now: Time) -> bool {
        true
    }
    /// Message counters of the acquisition so far (reports; 0 where n/a).
    fn client_counters(&self, c: &Self::Client) -> Counters;

    /// Acquisition a client → replica message belongs to.
    fn up_owner(msg: &Self::Up) -> ClientId;

    /// Whether a replica → client message is about the replica's vote (the client's
    /// view of it may change); a request for the client's REQUEST (Sigma's
    /// solicitation) is not. The budget check counts the incarnation each client last
    /// heard about a vote from.
    fn down_is_about_the_vote(_msg: &Self::Down) -> bool {
        true
    }

    /// A closed system: each acquisition runs on one of the `n` processes (the
    /// replicas), which it talks to locally; see [`Protocol::new_client_at`].
    const LOCAL_CLIENTS: bool = false;
    /// Replica → replica channels deliver in order (the classical algorithms assume it).
    const FIFO: bool = false;
    /// Starts an acquisition hosted by process `home` (closed systems).
    fn new_client_at(&self, ts: Timestamp<ClientId>, now: Time, _home: usize) -> Self::Client {
        self.new_client(ts, now)
    }

    /// Replica `index` with empty memory; `recovering` after a reset (a protocol with a
    /// recovery procedure starts it here). Default: [`Protocol::new_replica`].
    fn new_replica_at(&self, _index: usize, _recovering: bool, _now: Time) -> Self::Replica {
        self.new_replica()
    }
    /// The takeover delay: a fresh replica grants nothing until `until` (default: the
    /// protocol has none).
    fn hold_grants_until(&self, _r: &mut Self::Replica, _until: Time) {}
    /// Next replica → replica message, with the target index (default: none).
    fn replica_transmit_peer(&self, _r: &mut Self::Replica) -> Option<(usize, Self::Up)> {
        None
    }
    /// Handles a message from replica `from`; `false` if rejected.
    fn replica_handle_peer(&self, _r: &mut Self::Replica, _now: Time, _from: usize, _msg: Self::Up) -> bool {
        false
    }
    /// Next client → client message, with the target client (default: none).
    fn client_transmit_peer(&self, _c: &mut Self::Client) -> Option<(ClientId, Self::Down)> {
        None
    }
    /// Handles a message from client `from`; `false` if rejected.
    fn client_handle_peer(&self, _c: &mut Self::Client, _now: Time, _from: ClientId, _msg: Self::Down) -> bool {
        false
    }
}

/// The methods every core state machine exposes under the same names (`poll_*`,
/// `handle_timeout`, `release`, `phase`), written once for all protocols.
macro_rules! delegate_uniform {
    () => {
        fn replica_timeout(&self, r: &mut Self::Replica, now: Time) {
            r.handle_timeout(now)
        }
        fn replica_poll_timeout(&self, r: &Self::Replica) -> Option<Time> {
            r.poll_timeout()
        }
        fn replica_transmit(&self, r: &mut Self::Replica) -> Option<(ClientId, Self::Down)> {
            r.poll_transmit()
        }
        fn client_poll_timeout(&self, c: &Self::Client) -> Option<Time> {
            c.poll_timeout()
        }
        fn client_transmit(&self, c: &mut Self::Client) -> Option<(usize, Self::Up)> {
            c.poll_transmit()
        }
        fn client_event(&self, c: &mut Self::Client) -> Option<Event> {
            c.poll_event()
        }
        fn client_release(&self, c: &mut Self::Client, now: Time) {
            c.release(now)
        }
        fn client_phase(&self, c: &Self::Client) -> Phase {
            c.phase()
        }
    };
}

/// Sigma (Fig. 5, Fig. 6, §4).
#[derive(Clone, Debug)]
pub struct Sigma(pub Config);

impl Protocol for Sigma {
    type Replica = Replica<ClientId>;
    type Client = proto::Client<ClientId>;
    type Up = ToReplica<ClientId>;
    type Down = Response<ClientId>;

    fn name(&self) -> String {
        "sigma".into()
    }
    fn config(&self) -> &Config {
        &self.0
    }
    fn new_replica(&self) -> Self::Replica {
        Replica::new(self.0.clone())
    }
    fn hold_grants_until(&self, r: &mut Self::Replica, until: Time) {
        r.hold_grants_until(until);
    }
    fn replica_handle(&self, r: &mut Self::Replica, now: Time, from: ClientId, msg: Self::Up) -> bool {
        r.handle(now, &from, msg).is_ok()
    }
    fn new_client(&self, ts: Timestamp<ClientId>, now: Time) -> Self::Client {
        proto::Client::new(self.0.clone(), ts, now)
    }
    fn client_handle(
        &self,
        c: &mut Self::Client,
        now: Time,
        from: usize,
        msg: Self::Down,
        _: &mut dyn RngCore,
    ) -> bool {
        c.handle_response(now, from, msg).is_ok()
    }
    fn client_timeout(&self, c: &mut Self::Client, now: Time, _: &mut dyn RngCore) {
        c.handle_timeout(now)
    }
    fn voters(&self, c: &Self::Client) -> Vec<usize> {
        let me = c.ts();
        c.views().iter().enumerate().filter(|(_, v)| v.owner.as_ref() == Some(me)).map(|(i, _)| i).collect()
    }
    /// The client's own account: holding, and before [`proto::Client::valid_until`]
    /// (what a `LockGuard` watches); past it the application must have stopped.
    fn holds(&self, c: &Self::Client, now: Time) -> bool {
        c.phase() == Phase::Holding && c.valid_until().is_some_and(|t| t > now)
    }
    fn client_counters(&self, c: &Self::Client) -> Counters {
        let s = c.stats();
        Counters { yields: s.yields, retries: s.retries, renewals: s.renewals }
    }
    fn up_owner(msg: &Self::Up) -> ClientId {
        msg.ts().client
    }
    fn down_is_about_the_vote(msg: &Self::Down) -> bool {
        !msg.solicit
    }
    delegate_uniform!();
}

/// The strawman of §3 with a backoff policy.
#[derive(Clone, Debug)]
pub struct Strawman(pub Config, pub Backoff);

impl Protocol for Strawman {
    type Replica = strawman::Replica<ClientId>;
    type Client = strawman::Client<ClientId>;
    type Up = strawman::ToReplica<ClientId>;
    type Down = strawman::Reply<ClientId>;

    fn name(&self) -> String {
        "strawman".into()
    }
    fn config(&self) -> &Config {
        &self.0
    }
    fn new_replica(&self) -> Self::Replica {
        strawman::Replica::new(&self.0)
    }
    fn replica_handle(&self, r: &mut Self::Replica, now: Time, from: ClientId, msg: Self::Up) -> bool {
        r.handle(now, &from, msg).is_ok()
    }
    fn new_client(&self, ts: Timestamp<ClientId>, now: Time) -> Self::Client {
        strawman::Client::new(self.0.clone(), self.1, ts, now)
    }
    fn client_handle(
        &self,
        c: &mut Self::Client,
        now: Time,
        from: usize,
        msg: Self::Down,
        rng: &mut dyn RngCore,
    ) -> bool {
        c.handle_reply(now, from, msg, rng).is_ok()
    }
    fn client_timeout(&self, c: &mut Self::Client, now: Time, rng: &mut dyn RngCore) {
        c.handle_timeout(now, rng)
    }
    fn voters(&self, c: &Self::Client) -> Vec<usize> {
        c.granted()
    }
    fn client_counters(&self, c: &Self::Client) -> Counters {
        Counters { yields: 0, retries: u64::from(c.collisions), renewals: 0 }
    }
    fn up_owner(msg: &Self::Up) -> ClientId {
        msg.ts().client
    }
    delegate_uniform!();
}

/// Chockler–Malkhi–Reiter (2001): majority `try` with exponential backoff, a fixed
/// exclusion period Δ (`Config::lease`), and optionally §4's delayed reply list.
#[derive(Clone, Debug)]
pub struct Cmr {
    /// Shared parameters (Δ = `lease`, round timeout = `request_timeout`).
    pub config: Config,
    /// Backoff policy (the paper's: exponential).
    pub backoff: Backoff,
    /// §4 delayed reply list.
    pub delayed: bool,
}

impl Protocol for Cmr {
    type Replica = cmr::Replica<ClientId>;
    type Client = cmr::Client<ClientId>;
    type Up = cmr::ToReplica<ClientId>;
    type Down = cmr::Reply<ClientId>;

    fn name(&self) -> String {
        if self.delayed { "cmr-delayed" } else { "cmr" }.into()
    }
    fn config(&self) -> &Config {
        &self.config
    }
    fn new_replica(&self) -> Self::Replica {
        cmr::Replica::new(&self.config, self.delayed)
    }
    fn replica_handle(&self, r: &mut Self::Replica, now: Time, from: ClientId, msg: Self::Up) -> bool {
        r.handle(now, &from, msg).is_ok()
    }
    fn new_client(&self, ts: Timestamp<ClientId>, now: Time) -> Self::Client {
        cmr::Client::new(self.config.clone(), self.backoff, self.delayed, ts, now)
    }
    fn client_handle(
        &self,
        c: &mut Self::Client,
        now: Time,
        from: usize,
        msg: Self::Down,
        rng: &mut dyn RngCore,
    ) -> bool {
        c.handle_reply(now, from, msg, rng).is_ok()
    }
    fn client_timeout(&self, c: &mut Self::Client, now: Time, rng: &mut dyn RngCore) {
        c.handle_timeout(now, rng)
    }
    fn voters(&self, c: &Self::Client) -> Vec<usize> {
        c.granted()
    }
    fn client_counters(&self, c: &Self::Client) -> Counters {
        Counters { yields: 0, retries: u64::from(c.retries), renewals: 0 }
    }
    fn up_owner(msg: &Self::Up) -> ClientId {
        msg.ts().client
    }
    delegate_uniform!();
}

/// Obeidat et al. (2008): coordinator, complete FCFS queue, token passing, election,
/// recovery. Replica → replica and client → client messages use the peer hooks.
#[derive(Clone, Debug)]
pub struct Obeidat(pub Config);

impl Protocol for Obeidat {
    type Replica = obeidat::Replica<ClientId>;
    type Client = obeidat::Client<ClientId>;
    type Up = obeidat::ToReplica<ClientId>;
    type Down = obeidat::ToClient<ClientId>;

    fn name(&self) -> String {
        "obeidat".into()
    }
    fn config(&self) -> &Config {
        &self.0
    }
    fn new_replica(&self) -> Self::Replica {
        obeidat::Replica::new(&self.0, 0, false, Time::ZERO)
    }
    fn new_replica_at(&self, index: usize, recovering: bool, now: Time) -> Self::Replica {
        obeidat::Replica::new(&self.0, index, recovering, now)
    }
    fn replica_handle(&self, r: &mut Self::Replica, now: Time, from: ClientId, msg: Self::Up) -> bool {
        r.handle_client(now, &from, msg).is_ok()
    }
    fn replica_handle_peer(&self, r: &mut Self::Replica, now: Time, from: usize, msg: Self::Up) -> bool {
        r.handle_replica(now, from, msg).is_ok()
    }
    fn replica_transmit_peer(&self, r: &mut Self::Replica) -> Option<(usize, Self::Up)> {
        r.poll_transmit_replica()
    }
    fn new_client(&self, ts: Timestamp<ClientId>, now: Time) -> Self::Client {
        obeidat::Client::new(self.0.clone(), ts, now)
    }
    fn client_handle(
        &self,
        c: &mut Self::Client,
        now: Time,
        from: usize,
        msg: Self::Down,
        _: &mut dyn RngCore,
    ) -> bool {
        c.handle_replica(now, from, msg).is_ok()
    }
    fn client_handle_peer(&self, c: &mut Self::Client, now: Time, from: ClientId, msg: Self::Down) -> bool {
        c.handle_client(now, &from, msg).is_ok()
    }
    fn client_timeout(&self, c: &mut Self::Client, now: Time, _: &mut dyn RngCore) {
        c.handle_timeout(now)
    }
    fn client_transmit_peer(&self, c: &mut Self::Client) -> Option<(ClientId, Self::Down)> {
        c.poll_transmit_client()
    }
    fn voters(&self, c: &Self::Client) -> Vec<usize> {
        c.granted_by().into_iter().collect()
    }
    fn client_counters(&self, c: &Self::Client) -> Counters {
        Counters { yields: 0, retries: u64::from(c.retries), renewals: 0 }
    }
    fn up_owner(msg: &Self::Up) -> ClientId {
        msg.ts().map_or(ClientId::MAX, |ts| ts.client)
    }
    delegate_uniform!();
}

/// A classical closed-system algorithm (`crate::baselines::classical`): the `n` replicas of the
/// engine are its processes, and each acquisition is an application on one of them
/// ([`Protocol::LOCAL_CLIENTS`]). A process serves its applications one at a time, in
/// arrival order; channels between processes are FIFO, as the algorithms assume.
#[derive(Clone, Debug)]
pub struct Closed<P: Process> {
    name: String,
    params: P::Params,
    config: Config,
}

impl<P: Process> Closed<P> {
    /// `n` processes running algorithm `P` with `params`, reported as `name`.
    pub fn new(name: &str, n: usize, params: P::Params) -> Self {
        Closed { name: name.into(), params, config: Config::default().with_quorum(n, n / 2 + 1) }
    }
}

/// Application → its process (local), or process → process.
#[derive(Clone, Debug)]
pub enum ClosedUp<M> {
    /// The application wants the critical section.
    Want(ClientId),
    /// The application left it.
    Done(ClientId),
    /// A message of the algorithm.
    Peer(M),
}

/// Process → its application (local): the critical section is yours.
#[derive(Clone, Debug)]
pub struct Granted {
    /// Processes whose permission it rests on.
    pub voters: Vec<usize>,
}

/// A process and the queue of its local applications.
#[derive(Debug)]
pub struct ClosedProcess<P> {
    process: P,
    local: VecDeque<ClientId>,
    /// The application whose request is outstanding or in the CS.
    current: Option<ClientId>,
    down: VecDeque<(ClientId, Granted)>,
}

impl<P: Process> ClosedProcess<P> {
    /// Requests for the next local application once the previous one is done, and
    /// hands a grant to the application it is for.
    fn sync(&mut self, now: Time) {
        if self.current.is_none() {
            if let Some(next) = self.local.pop_front() {
                self.current = Some(next);
                self.process.request(now);
            }
        }
        if self.process.poll_granted() {
            if let Some(c) = self.current {
                self.down.push_back((c, Granted { voters: self.process.voters() }));
            }
        }
    }
}

/// One application's acquisition, on its home process.
#[derive(Debug)]
pub struct ClosedClient<M> {
    id: ClientId,
    home: usize,
    phase: Phase,
    voters: Vec<usize>,
    out: VecDeque<(usize, ClosedUp<M>)>,
    events: VecDeque<Event>,
}

impl<P: Process> Protocol for Closed<P> {
    type Replica = ClosedProcess<P>;
    type Client = ClosedClient<P::Msg>;
    type Up = ClosedUp<P::Msg>;
    type Down = Granted;

    const LOCAL_CLIENTS: bool = true;
    const FIFO: bool = true;

    fn name(&self) -> String {
        self.name.clone()
    }
    fn config(&self) -> &Config {
        &self.config
    }
    fn new_replica(&self) -> Self::Replica {
        self.new_replica_at(0, false, Time::ZERO)
    }
    fn new_replica_at(&self, index: usize, recovering: bool, now: Time) -> Self::Replica {
        ClosedProcess {
            process: P::new(&self.params, index, self.config.n(), recovering, now),
            local: VecDeque::new(),
            current: None,
            down: VecDeque::new(),
        }
    }
    fn replica_handle(&self, r: &mut Self::Replica, now: Time, from: ClientId, msg: Self::Up) -> bool {
        let ok = match msg {
            ClosedUp::Want(c) if c == from => {
                r.local.push_back(c);
                true
            }
            ClosedUp::Done(c) if c == from && r.current == Some(c) && r.process.holding() => {
                r.process.release(now);
                r.current = None;
                true
            }
            _ => false,
        };
        r.sync(now);
        ok
    }
    fn replica_handle_peer(&self, r: &mut Self::Replica, now: Time, from: usize, msg: Self::Up) -> bool {
        let ok = match msg {
            ClosedUp::Peer(m) => r.process.handle(now, from, m).is_ok(),
            _ => false,
        };
        r.sync(now);
        ok
    }
    fn replica_timeout(&self, r: &mut Self::Replica, now: Time) {
        r.process.handle_timeout(now);
        r.sync(now);
    }
    fn replica_poll_timeout(&self, r: &Self::Replica) -> Option<Time> {
        r.process.poll_timeout()
    }
    fn replica_transmit(&self, r: &mut Self::Replica) -> Option<(ClientId, Self::Down)> {
        r.down.pop_front()
    }
    fn replica_transmit_peer(&self, r: &mut Self::Replica) -> Option<(usize, Self::Up)> {
        r.process.poll_transmit().map(|(to, m)| (to, ClosedUp::Peer(m)))
    }

    fn new_client(&self, ts: Timestamp<ClientId>, now: Time) -> Self::Client {
        self.new_client_at(ts, now, 0)
    }
    fn new_client_at(&self, ts: Timestamp<ClientId>, _now: Time, home: usize) -> Self::Client {
        let id = ts.client;
        ClosedClient {
            id,
            home,
            phase: Phase::Waiting,
            voters: Vec::new(),
            out: VecDeque::from([(home, ClosedUp::Want(id))]),
            events: VecDeque::new(),
        }
    }
    fn client_handle(
        &self,
        c: &mut Self::Client,
        _now: Time,
        from: usize,
        msg: Self::Down,
        _: &mut dyn RngCore,
    ) -> bool {
        if from != c.home || c.phase != Phase::Waiting {
            return false;
        }
        c.phase = Phase::Holding;
        c.events.push_back(Event::Acquired { token: 0, votes: msg.voters.len(), valid_until: Time::MAX });
        c.voters = msg.voters;
        true
    }
    fn client_timeout(&self, _: &mut Self::Client, _: Time, _: &mut dyn RngCore) {}
    fn client_poll_timeout(&self, _: &Self::Client) -> Option<Time> {
        None
    }
    fn client_transmit(&self, c: &mut Self::Client) -> Option<(usize, Self::Up)> {
        c.out.pop_front()
    }
    fn client_event(&self, c: &mut Self::Client) -> Option<Event> {
        c.events.pop_front()
    }
    fn client_release(&self, c: &mut Self::Client, _now: Time) {
        if c.phase == Phase::Holding {
            c.out.push_back((c.home, ClosedUp::Done(c.id)));
        }
        c.phase = Phase::Released;
    }
    fn client_phase(&self, c: &Self::Client) -> Phase {
        c.phase
    }
    fn voters(&self, c: &Self::Client) -> Vec<usize> {
        c.voters.clone()
    }
    fn client_counters(&self, _: &Self::Client) -> Counters {
        Counters::default()
    }
    fn up_owner(msg: &Self::Up) -> ClientId {
        match msg {
            ClosedUp::Want(c) | ClosedUp::Done(c) => *c,
            ClosedUp::Peer(_) => ClientId::MAX,
        }
    }
}
