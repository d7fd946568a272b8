//! Obeidat, Gubarev and Al-yousef (2008), "Decentralized and fair mutual exclusion
//! protocol in peer-to-peer systems", as a sans-IO baseline.
//!
//! §4.1/§4.3: a client sends REQUEST to every replica. Only the coordinator answers:
//! RESPONSE carries the status of the resource and the complete FCFS queue; the
//! coordinator sends ADDREQUEST for the new entry to the other replicas and to every
//! client in the queue. A client enters at once if the resource was free (Lemma 1a) or
//! when the token reaches it: on leaving, the owner sends RELEASE to every replica and
//! to the clients queued behind it, and the first of the queue becomes the owner
//! (Lemma 1b). §4.4.1: the owner holds a lease; when it expires the next one in the
//! queue gets the permission. §4.1: a coordinator failure is answered by an election
//! (IAMCOORDINATOR, highest Lamport stamp wins) and a replica that lost its memory
//! sends RECOVER and is rebuilt by the coordinator's UPDATE.
//!
//! Decisions where the paper is silent:
//! - **Failure model** = §3's: replicas are always reachable but may lose their memory
//!   (crash-recovery with the same id). A coordinator failure is detected when the
//!   coordinator itself sends RECOVER: every replica that receives it starts an
//!   election (the paper's PING/ACK is not modelled; channels are assumed reliable).
//! - **FCFS order = the coordinator's order of arrival**: each entry gets a position
//!   `(coordinator stamp, sequence)`. Ordering by request timestamp instead would let a
//!   late REQUEST slot in ahead of clients that already hold a snapshot without it.
//! - **Entering by the token** (Lemma 1b) needs the RESPONSE snapshot and a RELEASE of
//!   every entry ahead of the client in it, so RELEASEs may arrive in any order. The
//!   coordinator also sends GRANT to a new head when it passes the token or a lease
//!   expires: a releaser that had not yet heard of the next client cannot strand it.
//! - **Non-coordinators ignore REQUEST** instead of forwarding it: the client sent it to
//!   the coordinator too.
//! - **Leases** are absolute times on the coordinator's (or releaser's) clock: RESPONSE
//!   and GRANT carry the lease end, a client RELEASE its send time. This assumes
//!   synchronised clocks (exact in the simulator). There are no renewals: the holder
//!   must be done within one lease. Every replica tracks the head's lease itself.
//! - **Election**: the new coordinator stays quiet for one lease (answers no REQUEST,
//!   grants nothing) so that ADDREQUESTs of the failed coordinator still in flight and
//!   the lease of an owner it may not know have run out. Clients re-send REQUEST after
//!   `request_timeout` until answered, and every lease while queued.
//! - A released acquisition is remembered (bounded, `Config::max_tombstones`) so a
//!   late ADDREQUEST does not resurrect it.

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use sigma_behaviour::proto::client::{Event, LostReason, Phase};
use sigma_behaviour::proto::clock::Timestamp;
use sigma_behaviour::proto::config::Config;
use sigma_behaviour::proto::error::{ClientError, ReplicaError};
use sigma_behaviour::proto::Time;

/// A coordinator's identity: `(Lamport counter, replica index)`, compared in that order.
pub type CoordStamp = (u64, usize);

/// A queued acquisition and its FCFS position.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry<C> {
    /// Position: `(term of the coordinator that queued it, sequence)`.
    pub pos: (u64, u64),
    /// The acquisition.
    pub ts: Timestamp<C>,
}

/// Messages to a replica, from a client or from another replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToReplica<C> {
    /// Client: asks for the resource (re-sent while unanswered).
    Request {
        /// The acquisition.
        ts: Timestamp<C>,
    },
    /// Client: leaves the CS or abandons the wait.
    Release {
        /// The acquisition.
        ts: Timestamp<C>,
    },
    /// Coordinator: a new entry of the queue.
    AddRequest {
        /// The entry.
        entry: Entry<C>,
    },
    /// A replica claims the coordinator role.
    IAmCoordinator {
        /// Its stamp; the highest wins.
        stamp: CoordStamp,
    },
    /// A replica with fresh memory asks for the state.
    Recover,
    /// Coordinator: the state, to a recovering replica.
    Update {
        /// The coordinator's stamp.
        stamp: CoordStamp,
        /// The queue, head (= owner) first.
        queue: Vec<Entry<C>>,
        /// Next sequence number.
        seq: u64,
    },
}

impl<C> ToReplica<C> {
    /// The acquisition a client message is about.
    pub fn ts(&self) -> Option<&Timestamp<C>> {
        match self {
            ToReplica::Request { ts } | ToReplica::Release { ts } => Some(ts),
            ToReplica::AddRequest { entry } => Some(&entry.ts),
            _ => None,
        }
    }
}

/// Messages to a client, from a replica or from another client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToClient<C> {
    /// Coordinator: status of the resource and the queue up to the requester.
    Response {
        /// The requester.
        ts: Timestamp<C>,
        /// The resource is the requester's.
        granted: bool,
        /// End of the requester's lease if granted.
        until: Time,
        /// The queue from the owner up to and including the requester.
        queue: Vec<Entry<C>>,
    },
    /// Coordinator: a new entry behind the addressee.
    AddRequest {
        /// The addressee.
        ts: Timestamp<C>,
        /// The new entry.
        entry: Entry<C>,
    },
    /// Coordinator: the token reached the addressee (pass or lease expiry).
    Grant {
        /// The addressee.
        ts: Timestamp<C>,
        /// End of its lease.
        until: Time,
    },
    /// Client: `released` left the CS (or the queue) at `at`.
    Release {
        /// The addressee.
        ts: Timestamp<C>,
        /// The releasing acquisition.
        released: Timestamp<C>,
        /// When it released.
        at: Time,
    },
}

impl<C> ToClient<C> {
    /// The addressee.
    pub fn ts(&self) -> &Timestamp<C> {
        match self {
            ToClient::Response { ts, .. }
            | ToClient::AddRequest { ts, .. }
            | ToClient::Grant { ts, .. }
            | ToClient::Release { ts, .. } => ts,
        }
    }
}

/// One replica of the resource.
#[derive(Clone, Debug)]
pub struct Replica<C> {
    index: usize,
    n: usize,
    lease: Duration,
    retry: Duration,
    max_tombstones: usize,
    counter: u64,
    /// Current coordinator; `None` while recovering.
    coordinator: Option<CoordStamp>,
    recovering: bool,
    recover_at: Option<Time>,
    quiet_until: Time,
    queue: Vec<Entry<C>>,
    head_until: Option<Time>,
    seq: u64,
    tombstones: VecDeque<Timestamp<C>>,
    to_clients: VecDeque<(C, ToClient<C>)>,
    to_replicas: VecDeque<(usize, ToReplica<C>)>,
    /// Elections this replica started.
    pub elections: u64,
}

impl<C: Clone + Ord> Replica<C> {
    /// Replica `index` of `config.n()`. Initially replica 0 is the coordinator (§4.1:
    /// "the first created replica"). A `recovering` replica has lost its memory: it
    /// sends RECOVER to all and serves nothing until an UPDATE arrives.
    pub fn new(config: &Config, index: usize, recovering: bool, now: Time) -> Self {
        let mut r = Replica {
            index,
            n: config.n(),
            lease: config.lease(),
            retry: config.request_timeout(),
            max_tombstones: config.max_tombstones(),
            counter: 0,
            coordinator: (!recovering).then_some((0, 0)),
            recovering,
            recover_at: None,
            quiet_until: Time::ZERO,
            queue: Vec::new(),
            head_until: None,
            seq: 0,
            tombstones: VecDeque::new(),
            to_clients: VecDeque::new(),
            to_replicas: VecDeque::new(),
            elections: 0,
        };
        if recovering {
            r.send_recover(now);
        }
        r
    }

    /// Whether this replica believes it is the coordinator.
    pub fn is_coordinator(&self) -> bool {
        !self.recovering && self.coordinator.is_some_and(|(_, i)| i == self.index)
    }
    /// The coordinator this replica follows.
    pub fn coordinator(&self) -> Option<CoordStamp> {
        self.coordinator
    }
    /// Waiting for an UPDATE.
    pub fn recovering(&self) -> bool {
        self.recovering
    }
    /// The queue, owner first.
    pub fn queue(&self) -> Vec<Timestamp<C>> {
        self.queue.iter().map(|e| e.ts.clone()).collect()
    }
    /// The owner (head of the queue) and its lease end.
    pub fn owner(&self) -> Option<(&Timestamp<C>, Time)> {
        self.queue.first().zip(self.head_until).map(|(e, t)| (&e.ts, t))
    }

    fn send_recover(&mut self, now: Time) {
        for i in (0..self.n).filter(|i| *i != self.index) {
            self.to_replicas.push_back((i, ToReplica::Recover));
        }
        self.recover_at = Some(now + self.retry);
    }

    fn quiet(&self, now: Time) -> bool {
        now < self.quiet_until
    }

    fn tombstone(&mut self, ts: Timestamp<C>) {
        if self.tombstones.len() >= self.max_tombstones {
            self.tombstones.pop_front();
        }
        self.tombstones.push_back(ts);
    }

    /// The head changed: start its lease; the coordinator passes the token (GRANT).
    fn new_head(&mut self, now: Time) {
        self.head_until = self.queue.first().map(|_| now + self.lease);
        if let (Some(head), Some(until)) = (self.queue.first(), self.head_until) {
            if self.is_coordinator() && !self.quiet(now) {
                let ts = head.ts.clone();
                self.to_clients.push_back((ts.client.clone(), ToClient::Grant { ts, until }));
            }
        }
    }

    fn remove(&mut self, now: Time, ts: &Timestamp<C>) -> bool {
        let Some(at) = self.queue.iter().position(|e| &e.ts == ts) else { return false };
        self.queue.remove(at);
        self.tombstone(ts.clone());
        if at == 0 {
            self.new_head(now);
        }
        true
    }

    fn response(&mut self, ts: &Timestamp<C>) {
        let Some(at) = self.queue.iter().position(|e| &e.ts == ts) else { return };
        let granted = at == 0;
        let until = if granted { self.head_until.unwrap_or_default() } else { Time::ZERO };
        let queue = self.queue[..=at].to_vec();
        self.to_clients.push_back((ts.client.clone(), ToClient::Response { ts: ts.clone(), granted, until, queue }));
    }

    /// A message from client `from` (authenticated by the driver).
    pub fn handle_client(&mut self, now: Time, from: &C, msg: ToReplica<C>) -> Result<(), ReplicaError> {
        let ts = match &msg {
            ToReplica::Request { ts } | ToReplica::Release { ts } => ts.clone(),
            _ => return Err(ReplicaError::NotHolder),
        };
        if &ts.client != from {
            return Err(ReplicaError::ForeignAcquisition);
        }
        self.handle_timeout(now);
        if self.recovering {
            return Ok(()); // no state yet: the client will re-send
        }
        match msg {
            ToReplica::Request { ts } => {
                if !self.is_coordinator() || self.quiet(now) {
                    return Ok(());
                }
                if self.tombstones.contains(&ts) {
                    return Err(ReplicaError::Finished);
                }
                if !self.queue.iter().any(|e| e.ts == ts) {
                    let (term, _) = self.coordinator.unwrap_or_default();
                    let entry = Entry { pos: (term, self.seq), ts: ts.clone() };
                    self.seq += 1;
                    self.queue.push(entry.clone());
                    if self.queue.len() == 1 {
                        self.head_until = Some(now + self.lease);
                    }
                    for i in (0..self.n).filter(|i| *i != self.index) {
                        self.to_replicas.push_back((i, ToReplica::AddRequest { entry: entry.clone() }));
                    }
                    for e in self.queue.iter().filter(|e| e.ts != ts) {
                        let to = e.ts.clone();
                        self.to_clients
                            .push_back((to.client.clone(), ToClient::AddRequest { ts: to, entry: entry.clone() }));
                    }
                }
                self.response(&ts);
                Ok(())
            }
            ToReplica::Release { ts } => {
                if self.remove(now, &ts) {
                    Ok(())
                } else {
                    self.tombstone(ts);
                    Err(ReplicaError::NotHolder)
                }
            }
            _ => Ok(()),
        }
    }

    /// A message from replica `from`.
    pub fn handle_replica(&mut self, now: Time, from: usize, msg: ToReplica<C>) -> Result<(), ReplicaError> {
        if from >= self.n || from == self.index {
            return Err(ReplicaError::NotHolder);
        }
        self.handle_timeout(now);
        match msg {
            ToReplica::AddRequest { entry } => {
                if self.recovering || self.coordinator.map(|(_, i)| i) != Some(from) {
                    return Err(ReplicaError::NotHolder);
                }
                if self.tombstones.contains(&entry.ts) || self.queue.iter().any(|e| e.ts == entry.ts) {
                    return Ok(());
                }
                self.seq = self.seq.max(entry.pos.1.saturating_add(1));
                let at = self.queue.partition_point(|e| e.pos < entry.pos);
                self.queue.insert(at, entry);
                if at == 0 {
                    self.new_head(now);
                }
                Ok(())
            }
            ToReplica::IAmCoordinator { stamp } => {
                self.counter = self.counter.max(stamp.0);
                if stamp.1 == from && self.coordinator.is_none_or(|c| stamp > c) {
                    self.coordinator = Some(stamp);
                }
                Ok(())
            }
            ToReplica::Recover => {
                if self.recovering {
                    return Ok(());
                }
                if self.coordinator.map(|(_, i)| i) == Some(from) {
                    // §4.1: our coordinator lost its memory: election.
                    self.elect(now);
                }
                if self.is_coordinator() {
                    let stamp = self.coordinator.unwrap_or_default();
                    let update = ToReplica::Update { stamp, queue: self.queue.clone(), seq: self.seq };
                    self.to_replicas.push_back((from, update));
                }
                Ok(())
            }
            ToReplica::Update { stamp, queue, seq } => {
                if stamp.1 != from || !(self.recovering || self.coordinator.is_none_or(|c| stamp >= c)) {
                    return Err(ReplicaError::NotHolder);
                }
                self.counter = self.counter.max(stamp.0);
                self.coordinator = Some(stamp);
                if self.recovering {
                    self.recovering = false;
                    self.recover_at = None;
                    self.queue = queue.into_iter().filter(|e| !self.tombstones.contains(&e.ts)).collect();
                    self.queue.sort_by_key(|e| e.pos);
                    self.seq = seq;
                    // Conservative: the owner's lease counted from now.
                    self.head_until = self.queue.first().map(|_| now + self.lease);
                }
                Ok(())
            }
            ToReplica::Request { .. } | ToReplica::Release { .. } => Err(ReplicaError::NotHolder),
        }
    }

    /// IAMCOORDINATOR with a new Lamport stamp; quiet for one lease.
    fn elect(&mut self, now: Time) {
        self.elections += 1;
        self.counter = self.counter.max(self.coordinator.map_or(0, |c| c.0)) + 1;
        let stamp = (self.counter, self.index);
        self.coordinator = Some(stamp);
        self.quiet_until = now + self.lease;
        for i in (0..self.n).filter(|i| *i != self.index) {
            self.to_replicas.push_back((i, ToReplica::IAmCoordinator { stamp }));
        }
    }

    /// Lease expiry of the owner, end of an election's quiet period, RECOVER retries.
    pub fn handle_timeout(&mut self, now: Time) {
        if self.recover_at.is_some_and(|t| t <= now) {
            self.send_recover(now);
        }
        if self.recovering {
            return;
        }
        if self.head_until.is_some_and(|t| t <= now) {
            let head = self.queue.remove(0);
            self.tombstone(head.ts);
            self.new_head(now);
        }
        if self.quiet_until != Time::ZERO && self.quiet_until <= now {
            self.quiet_until = Time::ZERO;
            // Quiet period over: the head gets a fresh lease and the token.
            if !self.queue.is_empty() {
                self.new_head(now);
            }
        }
    }

    /// Next timer.
    pub fn poll_timeout(&self) -> Option<Time> {
        let quiet = (self.quiet_until != Time::ZERO).then_some(self.quiet_until);
        [self.recover_at, self.head_until.filter(|_| !self.recovering), quiet].into_iter().flatten().min()
    }

    /// Next message to a client.
    pub fn poll_transmit(&mut self) -> Option<(C, ToClient<C>)> {
        self.to_clients.pop_front()
    }

    /// Next message to another replica.
    pub fn poll_transmit_replica(&mut self) -> Option<(usize, ToReplica<C>)> {
        self.to_replicas.pop_front()
    }
}

/// One acquisition.
#[derive(Clone, Debug)]
pub struct Client<C> {
    config: Config,
    ts: Timestamp<C>,
    phase: Phase,
    /// The queue as known: `None` until the first RESPONSE.
    snapshot: Option<Vec<Entry<C>>>,
    /// Entries heard of by ADDREQUEST (all, before and after the RESPONSE).
    behind: Vec<Entry<C>>,
    released: BTreeSet<Timestamp<C>>,
    /// Latest release time among those ahead.
    last_release: Time,
    sent_at: Time,
    timer: Option<Time>,
    valid_until: Time,
    granted_by: Option<usize>,
    to_replicas: VecDeque<(usize, ToReplica<C>)>,
    to_clients: VecDeque<(C, ToClient<C>)>,
    events: VecDeque<Event>,
    /// REQUESTs re-sent.
    pub retries: u32,
}

impl<C: Clone + Ord> Client<C> {
    /// Starts an acquisition: REQUEST to every replica.
    pub fn new(config: Config, ts: Timestamp<C>, now: Time) -> Self {
        let mut c = Client {
            config,
            ts,
            phase: Phase::Waiting,
            snapshot: None,
            behind: Vec::new(),
            released: BTreeSet::new(),
            last_release: Time::ZERO,
            sent_at: now,
            timer: None,
            valid_until: now,
            granted_by: None,
            to_replicas: VecDeque::new(),
            to_clients: VecDeque::new(),
            events: VecDeque::new(),
            retries: 0,
        };
        c.request(now);
        c
    }

    fn request(&mut self, now: Time) {
        self.sent_at = now;
        for i in 0..self.config.n() {
            self.to_replicas.push_back((i, ToReplica::Request { ts: self.ts.clone() }));
        }
        let wait = if self.snapshot.is_some() { self.config.lease() } else { self.config.request_timeout() };
        self.timer = Some(now + wait);
    }

    /// The acquisition's id.
    pub fn ts(&self) -> &Timestamp<C> {
        &self.ts
    }
    /// Current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }
    /// End of the lease while holding.
    pub fn valid_until(&self) -> Time {
        self.valid_until
    }
    /// The replica that answered (the coordinator as the client knows it).
    pub fn granted_by(&self) -> Option<usize> {
        self.granted_by
    }
    /// Acquisitions known to be queued, in FCFS order (the snapshot, then ADDREQUESTs).
    pub fn queue(&self) -> Vec<Timestamp<C>> {
        let mut all: Vec<&Entry<C>> = self.snapshot.iter().flatten().chain(&self.behind).collect();
        all.sort_by_key(|e| e.pos);
        all.dedup_by(|a, b| a.ts == b.ts);
        all.into_iter().map(|e| e.ts.clone()).collect()
    }

    fn enter(&mut self, until: Time) {
        if self.phase != Phase::Waiting {
            return;
        }
        self.phase = Phase::Holding;
        self.valid_until = until;
        self.timer = Some(until);
        self.events.push_back(Event::Acquired { token: 0, votes: 1, valid_until: until });
    }

    /// Lemma 1b: every entry ahead of us in the snapshot has released.
    fn check_token(&mut self, now: Time) {
        let Some(snap) = &self.snapshot else { return };
        let ahead = snap.iter().filter(|e| e.ts != self.ts);
        if snap.iter().any(|e| e.ts == self.ts) && ahead.clone().all(|e| self.released.contains(&e.ts)) {
            let until = self.last_release.min(now) + self.config.lease();
            if until > now {
                self.enter(until);
            }
        }
    }

    /// A message from replica `from`.
    pub fn handle_replica(&mut self, now: Time, from: usize, msg: ToClient<C>) -> Result<(), ClientError> {
        if from >= self.config.n() {
            return Err(ClientError::ReplicaOutOfRange { index: from, n: self.config.n() });
        }
        if msg.ts() != &self.ts {
            return Err(ClientError::WrongAcquisition);
        }
        if self.phase == Phase::Released {
            return Ok(());
        }
        match msg {
            ToClient::Response { granted, until, queue, .. } => {
                if queue.last().is_none_or(|e| e.ts != self.ts) {
                    return Err(ClientError::Stale);
                }
                self.granted_by = Some(from);
                if self.snapshot.is_none() && self.phase == Phase::Waiting {
                    self.timer = Some(self.sent_at + self.config.lease());
                }
                self.snapshot = Some(queue);
                if granted {
                    let until = until.min(self.sent_at + self.config.lease());
                    if until > now {
                        self.enter(until);
                    }
                } else {
                    self.check_token(now);
                }
            }
            ToClient::AddRequest { entry, .. } => {
                if !self.behind.iter().any(|e| e.ts == entry.ts) {
                    self.behind.push(entry);
                }
            }
            ToClient::Grant { until, .. } => {
                self.granted_by = Some(from);
                if until > now {
                    self.enter(until);
                }
            }
            ToClient::Release { .. } => return Err(ClientError::WrongAcquisition),
        }
        Ok(())
    }

    /// A RELEASE from client `from` (authenticated by the driver).
    pub fn handle_client(&mut self, now: Time, from: &C, msg: ToClient<C>) -> Result<(), ClientError> {
        let ToClient::Release { ts, released, at } = msg else { return Err(ClientError::WrongAcquisition) };
        if ts != self.ts {
            return Err(ClientError::WrongAcquisition);
        }
        if &released.client != from {
            return Err(ClientError::WrongAcquisition);
        }
        if self.phase != Phase::Waiting {
            return Ok(());
        }
        self.released.insert(released);
        self.last_release = self.last_release.max(at.min(now));
        self.check_token(now);
        Ok(())
    }

    /// Re-sends REQUEST; the end of the lease.
    pub fn handle_timeout(&mut self, now: Time) {
        if self.timer.is_none_or(|t| t > now) {
            return;
        }
        match self.phase {
            Phase::Waiting => {
                self.retries += 1;
                self.request(now);
            }
            Phase::Holding => {
                self.phase = Phase::Lost;
                self.timer = None;
                self.events.push_back(Event::Lost(LostReason::LeaseExpired));
            }
            Phase::Lost | Phase::Released => self.timer = None,
        }
    }

    /// Next timer.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.timer
    }

    /// RELEASE to every replica and to every client known to be queued behind us
    /// (Fig. 1 "releasing"). Also abandons a wait. Idempotent.
    pub fn release(&mut self, now: Time) {
        if self.phase == Phase::Released {
            return;
        }
        self.phase = Phase::Released;
        self.timer = None;
        for i in 0..self.config.n() {
            self.to_replicas.push_back((i, ToReplica::Release { ts: self.ts.clone() }));
        }
        let mine = self.snapshot.as_ref().and_then(|s| s.iter().find(|e| e.ts == self.ts)).map(|e| e.pos);
        let mut behind: Vec<Timestamp<C>> = self
            .behind
            .iter()
            .filter(|e| e.ts != self.ts && mine.is_none_or(|p| e.pos > p))
            .map(|e| e.ts.clone())
            .collect();
        behind.sort();
        behind.dedup();
        for to in behind {
            let msg = ToClient::Release { ts: to.clone(), released: self.ts.clone(), at: now };
            self.to_clients.push_back((to.client.clone(), msg));
        }
    }

    /// Next message to a replica.
    pub fn poll_transmit(&mut self) -> Option<(usize, ToReplica<C>)> {
        self.to_replicas.pop_front()
    }

    /// Next message to another client.
    pub fn poll_transmit_client(&mut self) -> Option<(C, ToClient<C>)> {
        self.to_clients.pop_front()
    }

    /// Next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
}
