//! The discrete-event engine: virtual time, a seeded ChaCha RNG, Poisson arrivals of
//! an infinite client pool, per-message latency, loss and duplication, replica resets
//! with exponentially distributed lifetimes, and a global mutual-exclusion check after
//! every event.
//!
//! One run is one [`SimConfig`] and one [`Protocol`]; it returns a [`Report`]. Runs are
//! deterministic: the same seed and configuration give the same report.
//!
//! Closed-system protocols ([`Protocol::LOCAL_CLIENTS`]) run their acquisitions on one
//! of the `n` processes (the "replicas"), chosen uniformly at arrival: client ↔ process
//! messages are local (no latency, never lost, not counted), a process's messages to
//! itself too, and a reset of a process kills the acquisitions it hosts.
//! [`Protocol::FIFO`] makes every process → process channel deliver in order.

use std::cmp::Ordering;
use std::collections::{BTreeSet, BinaryHeap};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp};
use serde::Serialize;
use sigma_behaviour::proto::{client::Phase, Event, LamportClock, Time};

use super::latency::Latency;
use super::protocol::{ClientId, Counters, Protocol};

/// Workload, network and failure model of one run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Poisson arrival rate of new acquisitions, per second.
    pub lambda: f64,
    /// Time a winner spends in the critical section (0: exit at once, as in §5).
    pub cs: Duration,
    /// One-way latency of every message, drawn per message.
    pub latency: Latency,
    /// Probability that a message is lost.
    pub loss: f64,
    /// Probability that a message is delivered twice.
    pub duplicate: f64,
    /// Mean replica lifetime (exponential); `None`: no resets.
    pub mean_lifetime: Option<Duration>,
    /// Warm-up, not measured.
    pub warmup: Duration,
    /// Measured window after the warm-up.
    pub measure: Duration,
    /// RNG seed.
    pub seed: u64,
    /// Stop early when more clients than this wait at once (a collapsed protocol
    /// whose backlog only grows); throughput is then measured over the last
    /// `measure` seconds before the stop.
    pub max_backlog: Option<usize>,
    /// No arrivals after this time (a drain period checks that every waiter is served).
    pub arrivals_until: Option<Duration>,
    /// Time run after the measured window with no new arrivals, for waiters to be
    /// served; who still waits at the end is stuck.
    pub drain: Duration,
}

impl SimConfig {
    /// The paper's §5 set-up: 5 min warm-up, 10 min measured, CS time 0, no loss.
    pub fn paper(lambda: f64, latency: Latency, seed: u64) -> Self {
        SimConfig {
            lambda,
            cs: Duration::ZERO,
            latency,
            loss: 0.0,
            duplicate: 0.0,
            mean_lifetime: None,
            warmup: Duration::from_secs(300),
            measure: Duration::from_secs(600),
            seed,
            max_backlog: None,
            arrivals_until: None,
            drain: Duration::ZERO,
        }
    }
}

/// Two clients in the critical section at once.
#[derive(Clone, Debug, Serialize)]
pub struct Violation {
    /// Virtual time (s) of the second entry.
    pub at: f64,
    /// Client already inside.
    pub holder: ClientId,
    /// Client that entered.
    pub newcomer: ClientId,
    /// Replicas voting for the holder that were reset since it entered.
    pub holder_voters_reset: usize,
    /// Replicas voting for both.
    pub shared_voters: usize,
    /// Replicas voting for both that were reset since the earlier of the two arrived.
    pub shared_voters_reset: usize,
    /// Votes the holder had when it entered.
    pub holder_votes: usize,
}

/// Figures of one run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Protocol name.
    pub protocol: String,
    /// Seed of the run (printed with every failure).
    pub seed: u64,
    /// Arrival rate.
    pub lambda: f64,
    /// Latency model.
    pub latency: String,
    /// Mean replica lifetime (s), if resets.
    pub lifetime_s: Option<f64>,
    /// CS entries in the measured window.
    pub entries: u64,
    /// CS entries per second in the window.
    pub throughput: f64,
    /// Acquire latency percentiles (s), entries in the window.
    pub acquire_p50: f64,
    /// 99th percentile.
    pub acquire_p99: f64,
    /// Maximum.
    pub acquire_max: f64,
    /// Protocol messages attributable to the acquisitions that entered in the window,
    /// per entry (each message counted once, both directions).
    pub messages_per_entry: f64,
    /// All protocol messages sent in the window divided by entries in the window.
    pub window_messages_per_entry: f64,
    /// Mutual-exclusion violations (anywhere in the run).
    pub violations: Vec<Violation>,
    /// Entries whose voters suffered enough resets during their CS that another client
    /// could have assembled a quorum (n − votes + resets ≥ m).
    pub exposures: u64,
    /// Entries that completed their CS (trials for the exposure rate).
    pub completed: u64,
    /// Replica resets.
    pub resets: u64,
    /// Lock losses reported by clients.
    pub lost: u64,
    /// YIELD messages of the entries in the window, per entry.
    pub yields_per_entry: f64,
    /// Retries (informed backoff, retransmission) or collisions, per entry.
    pub retries_per_entry: f64,
    /// Lease renewals per entry.
    pub renewals_per_entry: f64,
    /// Messages rejected by a state machine.
    pub rejected: u64,
    /// Clients still waiting at the end (after the drain, if any).
    pub waiting_at_end: u64,
    /// Entries in the window granted while an acquisition that arrived earlier still
    /// waited, as a fraction of the window's entries (0: first come, first served).
    pub out_of_order: f64,
    /// Acquisitions killed with the process hosting them (closed systems).
    pub crashed: u64,
    /// Virtual time (s) at which the run stopped early on `max_backlog`, if it did.
    pub truncated_at: Option<f64>,
    /// Completed entries by the number of votes they held (index = votes).
    pub votes_histogram: Vec<u64>,
    /// Events processed.
    pub events: u64,
    /// Wall-clock seconds taken.
    pub wall_s: f64,
}

impl Report {
    /// Simulated events per wall-clock second.
    pub fn events_per_s(&self) -> f64 {
        self.events as f64 / self.wall_s.max(1e-9)
    }
}

enum Kind<U, D> {
    Arrival,
    Up {
        replica: usize,
        from: ClientId,
        msg: U,
    },
    Down {
        client: ClientId,
        replica: usize,
        msg: D,
    },
    /// Replica → replica (protocols with peer messages).
    PeerUp {
        replica: usize,
        from: usize,
        msg: U,
    },
    /// Client → client (protocols with peer messages).
    PeerDown {
        client: ClientId,
        from: ClientId,
        msg: D,
    },
    ClientTimer {
        client: ClientId,
    },
    ReplicaTimer {
        replica: usize,
    },
    Reset {
        replica: usize,
    },
    CsExit {
        client: ClientId,
    },
}

struct Scheduled<U, D> {
    at: Time,
    seq: u64,
    kind: Kind<U, D>,
}

impl<U, D> PartialEq for Scheduled<U, D> {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl<U, D> Eq for Scheduled<U, D> {}
impl<U, D> PartialOrd for Scheduled<U, D> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<U, D> Ord for Scheduled<U, D> {
    // Reversed: BinaryHeap is a max-heap, the earliest event must come out first.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

struct Slot<C> {
    client: Option<C>,
    /// Hosting process (closed systems).
    home: Option<usize>,
    arrived: Time,
    entered: Option<Time>,
    voters: Vec<usize>,
    timer: Option<Time>,
    messages: u32,
    counters: Counters,
}

struct ReplicaSlot<R> {
    replica: R,
    timer: Option<Time>,
    last_reset: Option<Time>,
}

/// One simulation run in progress.
pub struct Sim<'p, P: Protocol> {
    proto: &'p P,
    cfg: SimConfig,
    rng: ChaCha8Rng,
    now: Time,
    end: Time,
    /// End of the run: `end` plus the drain.
    stop: Time,
    seq: u64,
    queue: BinaryHeap<Scheduled<P::Up, P::Down>>,
    replicas: Vec<ReplicaSlot<P::Replica>>,
    clients: Vec<Slot<P::Client>>,
    holders: Vec<ClientId>,
    report: Report,
    window_messages: u64,
    /// Clients that arrived and have not entered yet.
    backlog: usize,
    /// Start of the measured window (moves when the run stops early).
    window_start: Time,
    /// Acquisitions that arrived and have not entered (ids grow with arrival time).
    waiting: BTreeSet<ClientId>,
    /// Entries of the window that overtook an earlier arrival.
    out_of_order: u64,
    /// Per process → process channel, the latest delivery scheduled (FIFO protocols).
    channel_floor: Vec<Time>,
}

/// Runs `proto` under `cfg` and reports.
pub fn run<P: Protocol>(proto: &P, cfg: SimConfig) -> Report {
    Sim::new(proto, cfg).run()
}

impl<'p, P: Protocol> Sim<'p, P> {
    /// A run ready to start.
    pub fn new(proto: &'p P, cfg: SimConfig) -> Self {
        let n = proto.config().n();
        let cfg_warmup = cfg.warmup;
        let report = Report {
            protocol: proto.name(),
            seed: cfg.seed,
            lambda: cfg.lambda,
            latency: cfg.latency.to_string(),
            lifetime_s: cfg.mean_lifetime.map(|d| d.as_secs_f64()),
            ..Report::default()
        };
        Sim {
            proto,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            now: Time::ZERO,
            end: cfg.warmup + cfg.measure,
            stop: cfg.warmup + cfg.measure + cfg.drain,
            cfg,
            seq: 0,
            queue: BinaryHeap::new(),
            replicas: (0..n)
                .map(|i| ReplicaSlot {
                    replica: proto.new_replica_at(i, false, Time::ZERO),
                    timer: None,
                    last_reset: None,
                })
                .collect(),
            clients: Vec::new(),
            holders: Vec::new(),
            report,
            window_messages: 0,
            backlog: 0,
            window_start: cfg_warmup,
            waiting: BTreeSet::new(),
            out_of_order: 0,
            channel_floor: if P::FIFO { vec![Time::ZERO; n * n] } else { Vec::new() },
        }
    }

    fn schedule(&mut self, at: Time, kind: Kind<P::Up, P::Down>) {
        self.seq += 1;
        self.queue.push(Scheduled { at, seq: self.seq, kind });
    }

    fn in_window(&self, t: Time) -> bool {
        t >= self.window_start && t < self.end
    }

    fn exp(&mut self, mean_s: f64) -> Duration {
        let d = Exp::new(1.0 / mean_s).map(|e| e.sample(&mut self.rng)).unwrap_or(f64::INFINITY);
        Duration::try_from_secs_f64(d).unwrap_or(Duration::MAX / 4)
    }

    /// Runs to the end of the measured window and the drain after it.
    pub fn run(mut self) -> Report {
        let started = Instant::now();
        // A protocol may start with messages or timers (a token ring's first token).
        for replica in 0..self.replicas.len() {
            self.after_replica(replica);
        }
        if self.cfg.lambda > 0.0 {
            let first = self.exp(1.0 / self.cfg.lambda);
            self.schedule(first, Kind::Arrival);
        }
        if let Some(life) = self.cfg.mean_lifetime {
            for replica in 0..self.replicas.len() {
                let at = self.exp(life.as_secs_f64());
                self.schedule(at, Kind::Reset { replica });
            }
        }
        while let Some(ev) = self.queue.pop() {
            if ev.at >= self.stop {
                break;
            }
            self.now = ev.at;
            self.report.events += 1;
            self.step(ev.kind);
            if self.cfg.max_backlog.is_some_and(|cap| self.backlog > cap) {
                self.report.truncated_at = Some(self.now.as_secs_f64());
                self.end = self.now;
                self.stop = self.now;
                self.window_start = self.now.saturating_sub(self.cfg.measure);
                break;
            }
        }
        self.finish(started.elapsed())
    }

    fn step(&mut self, kind: Kind<P::Up, P::Down>) {
        let now = self.now;
        match kind {
            Kind::Arrival => {
                let id = ClientId::try_from(self.clients.len()).unwrap_or(ClientId::MAX);
                let ts = LamportClock::new().stamp(now, id);
                let home = P::LOCAL_CLIENTS.then(|| self.rng.gen_range(0..self.replicas.len()));
                let client = match home {
                    Some(home) => self.proto.new_client_at(ts, now, home),
                    None => self.proto.new_client(ts, now),
                };
                self.clients.push(Slot {
                    client: Some(client),
                    home,
                    arrived: now,
                    entered: None,
                    voters: Vec::new(),
                    timer: None,
                    messages: 0,
                    counters: Counters::default(),
                });
                self.backlog += 1;
                self.waiting.insert(id);
                self.after_client(id);
                let next = now + self.exp(1.0 / self.cfg.lambda);
                let until =
                    self.cfg.arrivals_until.into_iter().chain((!self.cfg.drain.is_zero()).then_some(self.end)).min();
                if until.is_none_or(|t| next < t) {
                    self.schedule(next, Kind::Arrival);
                }
            }
            Kind::Up { replica, from, msg } => {
                let slot = &mut self.replicas[replica];
                if !self.proto.replica_handle(&mut slot.replica, now, from, msg) {
                    self.report.rejected += 1;
                }
                self.after_replica(replica);
            }
            Kind::PeerUp { replica, from, msg } => {
                let slot = &mut self.replicas[replica];
                if !self.proto.replica_handle_peer(&mut slot.replica, now, from, msg) {
                    self.report.rejected += 1;
                }
                self.after_replica(replica);
            }
            Kind::PeerDown { client, from, msg } => {
                let Some(c) = self.clients.get_mut(client as usize).and_then(|s| s.client.as_mut()) else { return };
                if !self.proto.client_handle_peer(c, now, from, msg) {
                    self.report.rejected += 1;
                }
                self.after_client(client);
            }
            Kind::Down { client, replica, msg } => {
                let Some(c) = self.clients[client as usize].client.as_mut() else { return };
                if !self.proto.client_handle(c, now, replica, msg, &mut self.rng) {
                    self.report.rejected += 1;
                }
                self.after_client(client);
            }
            Kind::ClientTimer { client } => {
                let slot = &mut self.clients[client as usize];
                if slot.timer != Some(now) {
                    return; // superseded
                }
                slot.timer = None;
                if let Some(c) = slot.client.as_mut() {
                    self.proto.client_timeout(c, now, &mut self.rng);
                }
                self.after_client(client);
            }
            Kind::ReplicaTimer { replica } => {
                let slot = &mut self.replicas[replica];
                if slot.timer != Some(now) {
                    return;
                }
                slot.timer = None;
                self.proto.replica_timeout(&mut slot.replica, now);
                self.after_replica(replica);
            }
            Kind::Reset { replica } => {
                // §2: the peer hosting the replica crashed; a neighbour with empty
                // memory takes over. Messages in flight reach the new incarnation.
                let slot = &mut self.replicas[replica];
                slot.replica = self.proto.new_replica_at(replica, true, now);
                slot.timer = None;
                slot.last_reset = Some(now);
                self.report.resets += 1;
                if P::LOCAL_CLIENTS {
                    self.crash_clients_of(replica);
                }
                if let Some(life) = self.cfg.mean_lifetime {
                    let at = now + self.exp(life.as_secs_f64());
                    self.schedule(at, Kind::Reset { replica });
                }
                self.after_replica(replica);
            }
            Kind::CsExit { client } => self.exit(client),
        }
    }

    /// A process of a closed system lost its memory: the acquisitions it hosts die with
    /// it, inside the critical section or waiting.
    fn crash_clients_of(&mut self, replica: usize) {
        let hosted: Vec<ClientId> = self
            .clients
            .iter()
            .enumerate()
            .filter(|(_, s)| s.home == Some(replica) && s.client.is_some())
            .map(|(i, _)| ClientId::try_from(i).unwrap_or(ClientId::MAX))
            .collect();
        for id in hosted {
            self.holders.retain(|h| *h != id);
            let slot = &mut self.clients[id as usize];
            slot.client = None;
            slot.timer = None;
            if slot.entered.is_none() {
                self.backlog -= 1;
                self.waiting.remove(&id);
            }
            self.report.crashed += 1;
        }
    }

    /// Drains a replica's outputs and re-arms its timer.
    fn after_replica(&mut self, replica: usize) {
        while let Some((client, msg)) = self.proto.replica_transmit(&mut self.replicas[replica].replica) {
            if P::LOCAL_CLIENTS {
                self.schedule(self.now, Kind::Down { client, replica, msg });
                continue;
            }
            self.count_message(client);
            for at in self.deliveries() {
                self.schedule(at, Kind::Down { client, replica, msg: msg.clone() });
            }
        }
        while let Some((to, msg)) = self.proto.replica_transmit_peer(&mut self.replicas[replica].replica) {
            if to == replica {
                self.schedule(self.now, Kind::PeerUp { replica: to, from: replica, msg });
                continue;
            }
            self.count_message(P::up_owner(&msg));
            let mut times = self.deliveries();
            if let Some(floor) = self.channel_floor.get_mut(replica * self.replicas.len() + to) {
                for at in &mut times {
                    *at = (*at).max(*floor);
                    *floor = *at;
                }
            }
            for at in times {
                self.schedule(at, Kind::PeerUp { replica: to, from: replica, msg: msg.clone() });
            }
        }
        let slot = &mut self.replicas[replica];
        let next = self.proto.replica_poll_timeout(&slot.replica).map(|t| t.max(self.now));
        if next != slot.timer {
            slot.timer = next;
            if let Some(at) = next {
                self.schedule(at, Kind::ReplicaTimer { replica });
            }
        }
    }

    /// Drains a client's outputs and events and re-arms its timer.
    fn after_client(&mut self, id: ClientId) {
        loop {
            let Some(c) = self.clients[id as usize].client.as_mut() else { return };
            if let Some(event) = self.proto.client_event(c) {
                self.on_event(id, event);
                continue;
            }
            if let Some((to, msg)) = self.proto.client_transmit_peer(c) {
                self.count_message(id);
                for at in self.deliveries() {
                    self.schedule(at, Kind::PeerDown { client: to, from: id, msg: msg.clone() });
                }
                continue;
            }
            let Some((replica, msg)) = self.proto.client_transmit(c) else { break };
            if P::LOCAL_CLIENTS {
                self.schedule(self.now, Kind::Up { replica, from: id, msg });
                continue;
            }
            self.count_message(P::up_owner(&msg));
            for at in self.deliveries() {
                self.schedule(at, Kind::Up { replica, from: id, msg: msg.clone() });
            }
        }
        let now = self.now;
        let slot = &mut self.clients[id as usize];
        let Some(c) = slot.client.as_ref() else { return };
        let next = self.proto.client_poll_timeout(c).map(|t| t.max(now));
        if next.is_none() && self.proto.client_phase(c) == Phase::Released {
            slot.counters = self.proto.client_counters(c);
            slot.client = None; // done: free its memory, keep its figures
            return;
        }
        if next != slot.timer {
            slot.timer = next;
            if let Some(at) = next {
                self.schedule(at, Kind::ClientTimer { client: id });
            }
        }
    }

    fn on_event(&mut self, id: ClientId, event: Event) {
        let now = self.now;
        match event {
            Event::Acquired { .. } => {
                let voters =
                    self.clients[id as usize].client.as_ref().map(|c| self.proto.voters(c)).unwrap_or_default();
                let arrived = self.clients[id as usize].arrived;
                for &holder in &self.holders {
                    let h = &self.clients[holder as usize];
                    let entered = h.entered.unwrap_or(now);
                    let reset_since = |v: &usize, t: Time| self.replicas[*v].last_reset.is_some_and(|r| r >= t);
                    // A replica voting for both switched sides: only a reset (or an
                    // expired lease) can do that, at some time after the earlier arrival.
                    let since = h.arrived.min(arrived);
                    self.report.violations.push(Violation {
                        at: now.as_secs_f64(),
                        holder,
                        newcomer: id,
                        holder_voters_reset: h.voters.iter().filter(|v| reset_since(v, entered)).count(),
                        shared_voters: h.voters.iter().filter(|v| voters.contains(v)).count(),
                        shared_voters_reset: h
                            .voters
                            .iter()
                            .filter(|v| voters.contains(v) && reset_since(v, since))
                            .count(),
                        holder_votes: h.voters.len(),
                    });
                }
                if self.clients[id as usize].entered.is_none() {
                    self.backlog -= 1;
                    self.waiting.remove(&id);
                    if self.in_window(now) && self.waiting.first().is_some_and(|first| *first < id) {
                        self.out_of_order += 1;
                    }
                }
                let slot = &mut self.clients[id as usize];
                slot.entered = Some(now);
                slot.voters = voters;
                self.holders.push(id);
                if self.cfg.cs.is_zero() {
                    self.exit(id);
                } else {
                    let at = now + self.cfg.cs;
                    self.schedule(at, Kind::CsExit { client: id });
                }
            }
            Event::Lost(_) => {
                self.report.lost += 1;
                self.exit(id);
            }
        }
    }

    /// Leaves the critical section (or stops after a loss) and releases.
    fn exit(&mut self, id: ClientId) {
        let Some(pos) = self.holders.iter().position(|h| *h == id) else { return };
        self.holders.swap_remove(pos);
        let now = self.now;
        let (n, m) = (self.proto.config().n(), self.proto.config().m());
        let slot = &self.clients[id as usize];
        let since = slot.entered.unwrap_or(now);
        let reset = slot.voters.iter().filter(|v| self.replicas[**v].last_reset.is_some_and(|t| t >= since)).count();
        self.report.completed += 1;
        let votes = slot.voters.len();
        if self.report.votes_histogram.len() <= votes {
            self.report.votes_histogram.resize(votes + 1, 0);
        }
        self.report.votes_histogram[votes] += 1;
        if n - votes + reset >= m {
            self.report.exposures += 1;
        }
        if let Some(c) = self.clients[id as usize].client.as_mut() {
            self.proto.client_release(c, now);
        }
        self.after_client(id);
    }

    /// Delivery times of one message: none if lost, two if duplicated.
    fn deliveries(&mut self) -> Vec<Time> {
        if self.cfg.loss > 0.0 && self.rng.gen_bool(self.cfg.loss.min(1.0)) {
            return Vec::new();
        }
        let copies = if self.cfg.duplicate > 0.0 && self.rng.gen_bool(self.cfg.duplicate.min(1.0)) { 2 } else { 1 };
        (0..copies).map(|_| self.now + self.cfg.latency.sample(&mut self.rng)).collect()
    }

    fn count_message(&mut self, owner: ClientId) {
        if let Some(slot) = self.clients.get_mut(owner as usize) {
            slot.messages = slot.messages.saturating_add(1);
        }
        if self.in_window(self.now) {
            self.window_messages += 1;
        }
    }

    fn finish(mut self, wall: Duration) -> Report {
        let mut latencies = Vec::new();
        let (mut messages, mut yields, mut retries, mut renewals) = (0u64, 0u64, 0u64, 0u64);
        for slot in &self.clients {
            let Some(entered) = slot.entered.filter(|t| self.in_window(*t)) else { continue };
            latencies.push((entered - slot.arrived).as_secs_f64());
            messages += u64::from(slot.messages);
            let c = slot.client.as_ref().map_or(slot.counters, |c| self.proto.client_counters(c));
            yields += c.yields;
            retries += c.retries;
            renewals += c.renewals;
        }
        let r = &mut self.report;
        r.entries = latencies.len() as u64;
        r.throughput = r.entries as f64 / (self.end - self.window_start).as_secs_f64().max(1e-9);
        latencies.sort_by(f64::total_cmp);
        let pct = |q: f64| latencies.get(((latencies.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
        r.acquire_p50 = pct(0.5);
        r.acquire_p99 = pct(0.99);
        r.acquire_max = latencies.last().copied().unwrap_or(0.0);
        let per = |x: u64| if r.entries == 0 { 0.0 } else { x as f64 / r.entries as f64 };
        r.messages_per_entry = per(messages);
        r.window_messages_per_entry = per(self.window_messages);
        r.yields_per_entry = per(yields);
        r.retries_per_entry = per(retries);
        r.renewals_per_entry = per(renewals);
        r.out_of_order = per(self.out_of_order);
        r.waiting_at_end = self.clients.iter().filter(|s| s.entered.is_none() && s.client.is_some()).count() as u64;
        r.wall_s = wall.as_secs_f64();
        self.report
    }
}
