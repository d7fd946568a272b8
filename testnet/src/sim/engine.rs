//! The discrete-event engine: virtual time, a seeded ChaCha RNG, Poisson arrivals of
//! an infinite client pool, per-message latency, loss and duplication, replica resets
//! with exponentially distributed lifetimes, and a global mutual-exclusion check after
//! every event.
//!
//! One run is one [`SimConfig`] and one [`Protocol`]; it returns a [`Report`]. Runs are
//! deterministic: the same seed and configuration give the same report.
//!
//! Adversarial knobs, all off by default (a run with them off is the run it always was:
//! the draws they need come from their own seeded streams, never from the main one):
//! critical sections of random length ([`SimConfig::cs_spread`], e.g. longer than the
//! lease, so that holders depend on renewals, which are lost like any other message),
//! per-node clock offsets and rate errors ([`SimConfig::clock_skew`],
//! [`SimConfig::drift_ppm`]), and late delivery ([`SimConfig::late`]).
//!
//! The exclusion check runs at every entry, against every other client that is inside
//! the critical section *and* counts its lock valid by its own clock
//! ([`Protocol::holds`]). Each [`Violation`] also says how many of the replicas both
//! clients count switched sides through a reset (their two grants came from different
//! incarnations); one with fewer than 2m − n such replicas broke the protocol's own
//! guarantee, not the paper's probabilistic bound: [`Report::budget_violations`].
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
    /// Each critical section lasts `cs` plus a uniform draw in `[0, cs_spread]`
    /// (0: every one lasts `cs`). With `cs` above the lease a holder depends on its
    /// renewals, which are lost, duplicated and delayed like every other message.
    pub cs_spread: Duration,
    /// Every node's clock (replica, client; a closed system's acquisition uses its
    /// process's) is offset by a fixed amount drawn uniformly in `±clock_skew` (with a
    /// `drift_ppm`, an offset that wanders within that bound). The core is driven with
    /// the node's reading: the true time, shifted by an epoch large enough that no
    /// reading is negative (an hour plus the skew), plus the offset. A replica keeps its
    /// clock across resets.
    pub clock_skew: Duration,
    /// Clock-rate error, parts per million. With a `clock_skew`, every node's offset
    /// wanders up and down within `±clock_skew` (a triangle wave with a random phase: a
    /// clock kept in sync by slewing) at a rate drawn uniformly in
    /// `[drift_ppm / 2, drift_ppm]`, so two clocks measure a duration differently by up
    /// to `2 · drift_ppm`; without one, every clock runs fast or slow by a fixed rate
    /// drawn in `±drift_ppm` and its offset grows without bound (short runs only).
    pub drift_ppm: f64,
    /// Probability that a delivered message (each copy) arrives late: it takes
    /// `late_delay` on top of its latency.
    pub late: f64,
    /// Extra delay of a late message (say one or two leases: far beyond the request
    /// timeout, so that the receiver has moved on).
    pub late_delay: Latency,
    /// The takeover delay on every reset: the new incarnation grants nothing for one
    /// lease stretched by the drift bound, by its own clock (the node's rule for a
    /// replica whose previous host may have granted it; ARCHITECTURE.md, "Split brain").
    pub takeover_delay: bool,
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
            cs_spread: Duration::ZERO,
            clock_skew: Duration::ZERO,
            drift_ppm: 0.0,
            late: 0.0,
            late_delay: Latency::Constant(Duration::ZERO),
            takeover_delay: false,
        }
    }
}

/// A node's clock: the true (virtual) time plus a shift (the run's epoch and the node's
/// offset) and, with a rate error, an offset that changes at that rate: without bound
/// (a free-running clock), or as a triangle wave within `±amplitude` (a clock slewed
/// back and forth within a synchronisation bound, as NTP does). The identity (no
/// offset, no drift) maps every time to itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Clock {
    /// Reading at true time 0 without the wave, in ns (≥ 0).
    shift_ns: i128,
    /// Rate error in parts per billion: signed for a free-running clock, the slope of
    /// the wave (> 0) for a slewed one. |ppb| ≤ 10⁸.
    ppb: i64,
    /// Half the range of the wave, in ns (0: free-running).
    amplitude_ns: i128,
    /// Where in the wave the clock is at true time 0, in ns.
    phase_ns: i128,
}

const NS_PER_S: i128 = 1_000_000_000;

impl Clock {
    /// A clock reading `shift + offset` at true time 0 and running `ppb` parts per billion
    /// fast (negative: slow) forever. `shift + offset` is clamped to ≥ 0, `ppb` to ±10⁸.
    pub fn new(shift: Duration, offset_ns: i64, ppb: i64) -> Self {
        Clock {
            shift_ns: (shift.as_nanos() as i128 + i128::from(offset_ns)).max(0),
            ppb: ppb.clamp(-100_000_000, 100_000_000),
            amplitude_ns: 0,
            phase_ns: 0,
        }
    }

    /// A clock whose offset from `shift` runs up and down between `−amplitude` and
    /// `+amplitude` at `ppb` parts per billion (a triangle wave), starting `phase` into
    /// its period (`4 · amplitude / rate`). `shift` must be at least `amplitude`.
    pub fn slewed(shift: Duration, amplitude: Duration, ppb: i64, phase: Duration) -> Self {
        let ppb = ppb.clamp(1, 100_000_000);
        Clock {
            shift_ns: shift.as_nanos() as i128,
            ppb,
            amplitude_ns: amplitude.as_nanos() as i128,
            phase_ns: phase.as_nanos() as i128,
        }
    }

    /// Period of the wave in ns (0 for a free-running clock).
    fn period_ns(&self) -> i128 {
        if self.amplitude_ns == 0 {
            return 0;
        }
        2 * (2 * self.amplitude_ns * NS_PER_S).div_euclid(i128::from(self.ppb))
    }

    fn read_ns(&self, t_ns: i128) -> i128 {
        let period = self.period_ns();
        if period == 0 {
            return t_ns + self.shift_ns + (t_ns * i128::from(self.ppb)).div_euclid(NS_PER_S);
        }
        let (half, p) = (period / 2, (t_ns + self.phase_ns).rem_euclid(period));
        let rate = |d: i128| (d * i128::from(self.ppb)).div_euclid(NS_PER_S);
        let wave = if p < half { rate(p) - self.amplitude_ns } else { self.amplitude_ns - rate(p - half) };
        t_ns + self.shift_ns + wave
    }

    /// The clock's reading at true time `t`.
    pub fn local(&self, t: Time) -> Time {
        if *self == Clock::default() {
            return t;
        }
        from_ns(self.read_ns(t.as_nanos() as i128))
    }

    /// The earliest true time at which the clock reads at least `reading` (0 if it
    /// always does): where a timer the node set for `reading` fires. (Readings never
    /// decrease with true time; the rate error is at most 10%.)
    pub fn global(&self, reading: Time) -> Time {
        if *self == Clock::default() {
            return reading;
        }
        let target = reading.as_nanos() as i128;
        let mut t = (target - self.shift_ns).max(0);
        for _ in 0..64 {
            let error = target - self.read_ns(t);
            if error == 0 || (error > 0 && error < 4) || (t == 0 && error < 0) {
                break;
            }
            t = (t + error).max(0);
        }
        while self.read_ns(t) < target {
            t += 1;
        }
        while t > 0 && self.read_ns(t - 1) >= target {
            t -= 1;
        }
        from_ns(t)
    }
}

/// A node's clock under `cfg` (see [`SimConfig::clock_skew`], [`SimConfig::drift_ppm`]):
/// the identity with ideal clocks, and then no draw.
fn draw_clock(cfg: &SimConfig, epoch: Duration, rng: &mut ChaCha8Rng) -> Clock {
    if cfg.clock_skew.is_zero() && cfg.drift_ppm == 0.0 {
        return Clock::default();
    }
    let skew = i64::try_from(cfg.clock_skew.as_nanos()).unwrap_or(i64::MAX / 2);
    let ppb = (cfg.drift_ppm.abs() * 1_000.0).min(1e8) as i64;
    if ppb == 0 {
        return Clock::new(epoch, rng.gen_range(-skew..=skew), 0);
    }
    if skew == 0 {
        return Clock::new(epoch, 0, rng.gen_range(-ppb..=ppb));
    }
    let rate = rng.gen_range((ppb + 1) / 2..=ppb);
    let clock = Clock::slewed(epoch, cfg.clock_skew, rate, Duration::ZERO);
    let phase = rng.gen_range(0..u64::try_from(clock.period_ns()).unwrap_or(u64::MAX).max(1));
    Clock::slewed(epoch, cfg.clock_skew, rate, Duration::from_nanos(phase))
}

fn from_ns(ns: i128) -> Time {
    let ns = ns.max(0);
    let secs = u64::try_from(ns / NS_PER_S).unwrap_or(u64::MAX);
    Duration::new(secs, (ns % NS_PER_S) as u32)
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
    /// Replicas the holder counts as its voters now (its current view).
    pub holder_votes_now: usize,
    /// Replicas both count now (the holder's current view, the newcomer's at its win).
    pub shared_now: usize,
    /// Of those, replicas whose two grants came from different incarnations: they
    /// switched sides through a reset after the earlier grant. Fewer than 2m − n is a
    /// budget violation: the protocol's own guarantee broke, no reset explains it.
    pub shared_switched: usize,
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
    /// Violations in which fewer than 2m − n of the replicas both clients count were
    /// reset between their two grants ([`Violation::shared_switched`]): exclusion broke
    /// where the protocol guarantees it, whatever the reset rate. Must be 0.
    pub budget_violations: u64,
    /// Message copies delivered late ([`SimConfig::late`]).
    pub late_deliveries: u64,
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
        /// Incarnation of the replica when it sent the message.
        incarnation: u32,
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
    clock: Clock,
    /// Per replica, the incarnation of the last message about its vote the client
    /// applied from it (empty until the first): where the grant it counts came from.
    heard: Vec<u32>,
}

struct ReplicaSlot<R> {
    replica: R,
    timer: Option<Time>,
    last_reset: Option<Time>,
    /// Resets so far: a reset replica is a new incarnation.
    incarnation: u32,
    clock: Clock,
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
    /// Clock readings at true time 0 before the node's offset (0 with ideal clocks).
    epoch: Duration,
    /// Separate seeded streams for the optional knobs, so that the main stream's draws
    /// (and with every knob off the whole run) stay what they were without them.
    clock_rng: ChaCha8Rng,
    late_rng: ChaCha8Rng,
    cs_rng: ChaCha8Rng,
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
        let seed = cfg.seed;
        let stream = move |k: u64| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            rng.set_stream(k);
            rng
        };
        let ideal = cfg.clock_skew.is_zero() && cfg.drift_ppm == 0.0;
        // Readings start an hour (plus the skew) after true time 0: no offset makes one
        // negative, and no node's clock starts near 0.
        let epoch = if ideal { Duration::ZERO } else { cfg.clock_skew + Duration::from_secs(3_600) };
        let mut clock_rng = stream(1);
        let replicas = (0..n)
            .map(|i| {
                let clock = draw_clock(&cfg, epoch, &mut clock_rng);
                ReplicaSlot {
                    replica: proto.new_replica_at(i, false, clock.local(Time::ZERO)),
                    timer: None,
                    last_reset: None,
                    incarnation: 0,
                    clock,
                }
            })
            .collect();
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
            replicas,
            clients: Vec::new(),
            holders: Vec::new(),
            report,
            window_messages: 0,
            backlog: 0,
            window_start: cfg_warmup,
            waiting: BTreeSet::new(),
            out_of_order: 0,
            channel_floor: if P::FIFO { vec![Time::ZERO; n * n] } else { Vec::new() },
            epoch,
            clock_rng,
            late_rng: stream(2),
            cs_rng: stream(3),
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
                let home = P::LOCAL_CLIENTS.then(|| self.rng.gen_range(0..self.replicas.len()));
                // An acquisition of a closed system runs on its process, by its clock.
                let clock = match home {
                    Some(home) => self.replicas[home].clock,
                    None => draw_clock(&self.cfg, self.epoch, &mut self.clock_rng),
                };
                let local = clock.local(now);
                let ts = LamportClock::new().stamp(local, id);
                let client = match home {
                    Some(home) => self.proto.new_client_at(ts, local, home),
                    None => self.proto.new_client(ts, local),
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
                    clock,
                    heard: Vec::new(),
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
                if !self.proto.replica_handle(&mut slot.replica, slot.clock.local(now), from, msg) {
                    self.report.rejected += 1;
                }
                self.after_replica(replica);
            }
            Kind::PeerUp { replica, from, msg } => {
                let slot = &mut self.replicas[replica];
                if !self.proto.replica_handle_peer(&mut slot.replica, slot.clock.local(now), from, msg) {
                    self.report.rejected += 1;
                }
                self.after_replica(replica);
            }
            Kind::PeerDown { client, from, msg } => {
                let Some(slot) = self.clients.get_mut(client as usize) else { return };
                let local = slot.clock.local(now);
                let Some(c) = slot.client.as_mut() else { return };
                if !self.proto.client_handle_peer(c, local, from, msg) {
                    self.report.rejected += 1;
                }
                self.after_client(client);
            }
            Kind::Down { client, replica, msg, incarnation } => {
                let slot = &mut self.clients[client as usize];
                let local = slot.clock.local(now);
                let Some(c) = slot.client.as_mut() else { return };
                let about_the_vote = P::down_is_about_the_vote(&msg);
                if !self.proto.client_handle(c, local, replica, msg, &mut self.rng) {
                    self.report.rejected += 1;
                } else if about_the_vote {
                    if slot.heard.len() != self.replicas.len() {
                        slot.heard = vec![0; self.replicas.len()];
                    }
                    slot.heard[replica] = incarnation;
                }
                self.after_client(client);
            }
            Kind::ClientTimer { client } => {
                let slot = &mut self.clients[client as usize];
                if slot.timer != Some(now) {
                    return; // superseded
                }
                slot.timer = None;
                let local = slot.clock.local(now);
                if let Some(c) = slot.client.as_mut() {
                    self.proto.client_timeout(c, local, &mut self.rng);
                }
                self.after_client(client);
            }
            Kind::ReplicaTimer { replica } => {
                let slot = &mut self.replicas[replica];
                if slot.timer != Some(now) {
                    return;
                }
                slot.timer = None;
                self.proto.replica_timeout(&mut slot.replica, slot.clock.local(now));
                self.after_replica(replica);
            }
            Kind::Reset { replica } => {
                // §2: the peer hosting the replica crashed; a neighbour with empty
                // memory takes over. Messages in flight reach the new incarnation.
                let slot = &mut self.replicas[replica];
                slot.replica = self.proto.new_replica_at(replica, true, slot.clock.local(now));
                if self.cfg.takeover_delay {
                    let lease = self.proto.config().lease();
                    let drift = lease.mul_f64(f64::from(self.proto.config().max_drift_ppm()) / 1e6);
                    self.proto.hold_grants_until(&mut slot.replica, slot.clock.local(now) + lease + drift);
                }
                slot.timer = None;
                slot.last_reset = Some(now);
                slot.incarnation = slot.incarnation.wrapping_add(1);
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
            slot.heard = Vec::new();
            if slot.entered.is_none() {
                self.backlog -= 1;
                self.waiting.remove(&id);
            }
            self.report.crashed += 1;
        }
    }

    /// Drains a replica's outputs and re-arms its timer.
    fn after_replica(&mut self, replica: usize) {
        let incarnation = self.replicas[replica].incarnation;
        while let Some((client, msg)) = self.proto.replica_transmit(&mut self.replicas[replica].replica) {
            if P::LOCAL_CLIENTS {
                self.schedule(self.now, Kind::Down { client, replica, msg, incarnation });
                continue;
            }
            self.count_message(client);
            for at in self.deliveries() {
                self.schedule(at, Kind::Down { client, replica, msg: msg.clone(), incarnation });
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
        let next = self.proto.replica_poll_timeout(&slot.replica).map(|t| slot.clock.global(t).max(self.now));
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
        let next = self.proto.client_poll_timeout(c).map(|t| slot.clock.global(t).max(now));
        if next.is_none() && self.proto.client_phase(c) == Phase::Released {
            slot.counters = self.proto.client_counters(c);
            slot.client = None; // done: free its memory, keep its figures
            slot.heard = Vec::new();
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
                let (n, m) = (self.proto.config().n(), self.proto.config().m());
                let budget = (2 * m).saturating_sub(n);
                let newcomer = &self.clients[id as usize];
                for &holder in &self.holders {
                    let h = &self.clients[holder as usize];
                    // Inside by the engine's account (won, CS not over, not told `Lost`)
                    // and by its own: it still counts its lock valid on its clock.
                    let Some(hc) = h.client.as_ref().filter(|c| self.proto.holds(c, h.clock.local(now))) else {
                        continue;
                    };
                    let entered = h.entered.unwrap_or(now);
                    let reset_since = |v: &usize, t: Time| self.replicas[*v].last_reset.is_some_and(|r| r >= t);
                    // A replica voting for both switched sides: only a reset (or an
                    // expired lease) can do that, at some time after the earlier arrival.
                    let since = h.arrived.min(newcomer.arrived);
                    // The guarantee: a replica whose two grants came from one incarnation
                    // voted for both without a reset.
                    let heard = |s: &Slot<P::Client>, v: usize| s.heard.get(v).copied().unwrap_or(0);
                    let now_voters = self.proto.voters(hc);
                    let shared_now: Vec<usize> = now_voters.iter().copied().filter(|v| voters.contains(v)).collect();
                    let switched = shared_now.iter().filter(|v| heard(h, **v) != heard(newcomer, **v)).count();
                    if switched < budget {
                        self.report.budget_violations += 1;
                    }
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
                        holder_votes_now: now_voters.len(),
                        shared_now: shared_now.len(),
                        shared_switched: switched,
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
                let mut cs = self.cfg.cs;
                if !self.cfg.cs_spread.is_zero() {
                    cs += Latency::Uniform { lo: Duration::ZERO, hi: self.cfg.cs_spread }.sample(&mut self.cs_rng);
                }
                if cs.is_zero() {
                    self.exit(id);
                } else {
                    self.schedule(now + cs, Kind::CsExit { client: id });
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
        let slot = &mut self.clients[id as usize];
        let local = slot.clock.local(now);
        if let Some(c) = slot.client.as_mut() {
            self.proto.client_release(c, local);
        }
        self.after_client(id);
    }

    /// Delivery times of one message: none if lost, two if duplicated.
    fn deliveries(&mut self) -> Vec<Time> {
        if self.cfg.loss > 0.0 && self.rng.gen_bool(self.cfg.loss.min(1.0)) {
            return Vec::new();
        }
        let copies = if self.cfg.duplicate > 0.0 && self.rng.gen_bool(self.cfg.duplicate.min(1.0)) { 2 } else { 1 };
        let mut times: Vec<Time> = (0..copies).map(|_| self.now + self.cfg.latency.sample(&mut self.rng)).collect();
        if self.cfg.late > 0.0 {
            for at in &mut times {
                if self.late_rng.gen_bool(self.cfg.late.min(1.0)) {
                    *at += self.cfg.late_delay.sample(&mut self.late_rng);
                    self.report.late_deliveries += 1;
                }
            }
        }
        times
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
