//! The model checker itself: state, actions, fingerprint, invariant, BFS, traces.
//! See the module doc of `tests/model.rs` for the model.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Write as _;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, Instant};

use crate::clock::{clock_at, real_at};
use sigma_behaviour::proto::client::View;
use sigma_behaviour::proto::{
    Client, ClientError, Config, Event, LamportClock, Mutant, Phase, Replica, ReplicaError, Response, Time, Timestamp,
    ToReplica,
};

type Id = u32;
type Ts = Timestamp<Id>;

/// Lease granted by a replica: short, so that it lapses within a few steps.
pub const LEASE: Duration = Duration::from_secs(3);
const REQUEST_TIMEOUT: Duration = Duration::from_millis(500);

/// The record of a wiped grant issued again by a later incarnation (see `State::wiped`).
const REISSUED: u8 = u8::MAX;

/// The style of `properties.rs` (lease 3 s, renewals every second), with coarser
/// retries so that a lease spans few timer events: a REQUEST is re-sent after 500 ms,
/// and `T_cs` = 1 s makes the first waiter retry every ~0.7 s (advice 0.5 s, 25%
/// slack, two round trips) and keeps its place for 2 s (twice the advice plus 1 s).
fn config(n: usize, m: usize) -> Config {
    Config::default()
        .with_quorum(n, m)
        .with_lease(LEASE)
        .with_request_timeout(REQUEST_TIMEOUT)
        .with_initial_rtt(Duration::from_millis(50))
        .with_initial_tcs(Duration::from_secs(1))
        .with_advice_bounds(Duration::from_millis(20), Duration::from_secs(2))
        .with_queue_grace(Duration::from_secs(1))
        .with_tombstone_ttl(Duration::from_secs(30))
        .with_idle_ttl(IDLE_TTL)
        .with_state_bounds(64, 256)
}

/// An idle replica is disposable this long after its last RELEASE (the default is 5 s):
/// short, so that a disposal comes within a few steps of a release.
pub const IDLE_TTL: Duration = Duration::from_secs(1);

/// Every replica or every client, as the place of a mutant (`Bounds::mutant`).
pub const EVERY: usize = usize::MAX;

/// Whether `mutant` is a fault of the client (planted in clients) or of the replica.
fn client_mutant(mutant: Mutant) -> bool {
    matches!(mutant, Mutant::CountLapsedVote)
}

/// The takeover delay a reset replica waits out when resets carry it: one lease and the
/// drift bound, every vote its previous life can have granted (the behaviour's
/// `Config::takeover_delay` adds the liveness timeout and a timer's slack to that, for a
/// host to notice a cut; the core needs only this much).
fn takeover_delay(cfg: &Config) -> Duration {
    LEASE + LEASE.mul_f64(f64::from(cfg.max_drift_ppm()) / 1e6)
}

/// How timers fire (see the module doc of `tests/model.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timers {
    /// The clock jumps to the earliest deadline and an actor due then fires; overdue
    /// timers (after a pause) fire before the clock moves on.
    Prompt,
    /// The clock jumps to any actor's future deadline; overdue timers fire whenever, or
    /// never.
    Lazy,
}

/// How the network schedules messages (see the module doc of `tests/model.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    /// Any message in flight may be delivered next, at any time.
    Exhaustive,
    /// FIFO and instant by default, timers on time; the adversary's budgeted choices
    /// (cut and heal links, pause, reset, copy, lose) and the clients' releases are the
    /// only branching.
    Scheduled,
}

/// What the search explores.
#[derive(Clone, Debug)]
pub struct Bounds {
    pub n: usize,
    pub m: usize,
    pub clients: usize,
    pub network: Network,
    /// Actions from the initial state.
    pub depth: usize,
    /// (Scheduled) links cut in all; a cut link holds its messages until healed.
    pub cuts: u8,
    /// Replica resets in all (any replica, the same one again included).
    pub resets: u8,
    /// Duplicated messages in all (each message is copied at most once).
    pub copies: u8,
    /// Lost messages in all.
    pub losses: u8,
    /// Clock advances by one lease.
    pub pauses: u8,
    pub timers: Timers,
    /// Clients start one by one at explored times; otherwise all at time 0.
    pub explored_starts: bool,
    /// Releases in all, by clients that hold (or lost) the lock.
    pub releases: u8,
    /// (Scheduled) heals of cut links in all.
    pub heals: u8,
    /// Fingerprints are taken up to a permutation of the replicas.
    pub symmetry: bool,
    /// A fault planted in one replica (every incarnation of it) or one client, to show
    /// that the invariant catches it: `(mutant, replica or client)`, [`EVERY`] for all.
    pub mutant: Option<(Mutant, usize)>,
    /// Every reset carries the takeover delay (`Replica::hold_grants_until`): the new
    /// incarnation grants nothing for one lease and the drift bound. A reset then
    /// excuses nothing: two valid holders are a violation, whatever the resets.
    pub delayed_resets: bool,
    /// Idle-replica disposals in all: a replica that is `is_disposable` (by its clock)
    /// is dropped and a new one takes the next message, as the behaviour does. Not a
    /// reset: it excuses nothing.
    pub disposals: u8,
    /// How far each replica's clock runs ahead of the clients' (index = replica; missing
    /// = 0). Offsets within `max_clock_offset`.
    pub offsets: Vec<Duration>,
    /// How many parts per million each replica's clock runs fast (negative: slow) of the
    /// clients' (index = replica; missing = 0): the guarantee assumes any two clocks
    /// within `max_drift_ppm` of each other.
    pub rates: Vec<i64>,
}

impl Bounds {
    /// n replicas, quorum m, `clients` clients; everything else at its default.
    pub fn new(n: usize, m: usize, clients: usize) -> Self {
        Bounds {
            n,
            m,
            clients,
            network: Network::Exhaustive,
            depth: 10,
            cuts: 0,
            resets: 1,
            copies: 1,
            losses: 0,
            pauses: 0,
            timers: Timers::Prompt,
            explored_starts: false,
            releases: clients as u8,
            heals: 0,
            symmetry: true,
            mutant: None,
            delayed_resets: false,
            disposals: 0,
            offsets: Vec::new(),
            rates: Vec::new(),
        }
    }

    /// `key=value` pairs separated by spaces over [`Bounds::new`]'s defaults (n, m and
    /// clients first); see `explore_from_env` in `tests/model.rs`.
    pub fn parse(spec: &str) -> Self {
        let get =
            |key: &str| spec.split_whitespace().find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')));
        let num = |key: &str, default: usize| get(key).map_or(default, |v| v.parse().expect("a number"));
        let mut b = Bounds::new(num("n", 3), num("m", 2), num("clients", 2));
        b.depth = num("depth", b.depth);
        b.cuts = num("cuts", b.cuts.into()) as u8;
        match get("network") {
            Some("exhaustive") => b.network = Network::Exhaustive,
            Some("scheduled") => {
                b.network = Network::Scheduled;
                b.symmetry = false;
            }
            None => {}
            Some(t) => panic!("network={t}: exhaustive or scheduled"),
        }
        b.resets = num("resets", b.resets.into()) as u8;
        b.copies = num("copies", b.copies.into()) as u8;
        b.losses = num("losses", b.losses.into()) as u8;
        b.pauses = num("pauses", b.pauses.into()) as u8;
        b.releases = num("releases", b.releases.into()) as u8;
        b.heals = num("heals", b.heals.into()) as u8;
        b.symmetry = num("symmetry", b.symmetry.into()) != 0;
        if let Some(v) = get("mutant") {
            // `mutant=<index>` (a double grant) or `mutant=<name>:<index or all>`.
            let (kind, at) = v.split_once(':').unwrap_or(("grant-over-live-vote", v));
            let kind = match kind {
                "grant-over-live-vote" => Mutant::GrantOverLiveVote,
                "count-lapsed-vote" => Mutant::CountLapsedVote,
                "disposal-forgets-floor" => Mutant::DisposalForgetsFloor,
                k => panic!("mutant={k}: grant-over-live-vote, count-lapsed-vote or disposal-forgets-floor"),
            };
            let at = if at == "all" { EVERY } else { at.parse().expect("mutant=<name>:<index>") };
            b.mutant = Some((kind, at));
        }
        b.delayed_resets = num("delayed", 0) != 0;
        b.disposals = num("disposals", 0) as u8;
        if let Some(v) = get("rates") {
            // Parts per million each replica's clock runs fast, comma-separated.
            b.rates = v.split(',').map(|ppm| ppm.parse().expect("rates=<ppm>,...")).collect();
        }
        if let Some(v) = get("offsets") {
            // Milliseconds each replica's clock runs ahead, comma-separated.
            b.offsets = v.split(',').map(|ms| Duration::from_millis(ms.parse().expect("offsets=<ms>,..."))).collect();
        }
        match get("timers") {
            Some("lazy") => b.timers = Timers::Lazy,
            Some("prompt") => b.timers = Timers::Prompt,
            None => {}
            Some(t) => panic!("timers={t}: lazy or prompt"),
        }
        match get("starts") {
            Some("explored") => b.explored_starts = true,
            Some("fixed") => b.explored_starts = false,
            None => {}
            Some(s) => panic!("starts={s}: fixed or explored"),
        }
        b
    }
}

/// One actor with a timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Actor {
    Replica(u8),
    Client(u8),
}

/// One step of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    /// The next client starts its acquisition.
    Start(u8),
    /// Deliver the message at this index of `flight`.
    Deliver(u16),
    /// Deliver it and leave a copy in flight (the network duplicated it).
    DeliverKeepCopy(u16),
    /// The network loses it.
    Lose(u16),
    /// Move the clock to the actor's deadline if it is ahead, then fire its timer.
    Fire(Actor),
    /// (Lazy timers) move the clock to the actor's future deadline, fire nothing.
    Advance(Actor),
    /// Move the clock by one lease, fire nothing.
    Pause,
    /// The client releases its acquisition.
    Release(u8),
    /// The replica loses its memory.
    Reset(u8),
    /// The idle replica is dropped (disposal; a new one takes the next message).
    Dispose(u8),
    /// (Scheduled) the default: deliver the oldest message not held, or else fire the
    /// earliest timer (moving the clock to it).
    Step,
    /// (Scheduled) the link between client and replica goes down: its messages, in
    /// flight and later, are held.
    Cut(u8, u8),
    /// (Scheduled) the link comes back: its held messages join the queue, oldest first.
    Heal(u8, u8),
}

#[derive(Clone, Debug)]
enum Msg {
    Up { from: Id, to: usize, msg: ToReplica<Id> },
    Down { from: usize, to: Id, r: Response<Id> },
}

impl Msg {
    /// The replica end of the message.
    fn replica(&self) -> usize {
        match self {
            Msg::Up { to, .. } => *to,
            Msg::Down { from, .. } => *from,
        }
    }
}

#[derive(Clone)]
struct Flight {
    msg: Msg,
    /// The network may still duplicate it.
    copyable: bool,
    /// (Scheduled) held on a cut link.
    held: bool,
    /// Fingerprint of the message and the flag, without its replica index (which the
    /// symmetry reduction permutes).
    fp: u128,
}

impl Flight {
    fn new(msg: Msg, copyable: bool) -> Self {
        let text = match &msg {
            Msg::Up { from, msg, .. } => format!("up {from} {msg:?} {copyable}"),
            Msg::Down { to, r, .. } => format!("down {to} {r:?} {copyable}"),
        };
        Flight { fp: h128(text.as_bytes()), msg, copyable, held: false }
    }

    /// The link it travels: (client, replica).
    fn link(&self) -> (usize, usize) {
        match &self.msg {
            Msg::Up { from, to, .. } => (*from as usize, *to),
            Msg::Down { from, to, .. } => (*to as usize, *from),
        }
    }
}

/// Budgets spent so far.
#[derive(Clone, Copy, Debug, Default, Hash)]
struct Used {
    resets: u8,
    copies: u8,
    losses: u8,
    pauses: u8,
    cuts: u8,
    heals: u8,
    releases: u8,
    started: u8,
    disposals: u8,
}

#[derive(Clone)]
struct State {
    now: Time,
    replicas: Vec<Replica<Id>>,
    /// Client `c` (id `c`); `None` until it starts.
    clients: Vec<Option<Client<Id>>>,
    flight: Vec<Flight>,
    used: Used,
    /// Grants `(replica, owner, stamp)` made before a reset of that replica and still
    /// referenced somewhere, each with the ordinal of the reset that wiped it (0 for
    /// the first reset of the run, 1 for the second, ...): ghost state for the
    /// invariant. A grant not in it was made by its replica's current incarnation, so
    /// two grants of one replica come from different incarnations (a reset came between
    /// them) exactly when their entries here differ. [`REISSUED`] marks a grant that a
    /// later incarnation issued again, identical (same owner and stamp, possible when
    /// the reset and both grants fall on one instant): its incarnation is unknown.
    wiped: BTreeMap<(usize, Ts, u64), u8>,
    /// The first delivery of a fencing token to a replica: `(replica, holder)` → the
    /// grant the replica's owner had then (ghost state for the token order). A RELEASE or
    /// a renewal carries the holder's token and moves the replica's stamps past it; a
    /// grant made after it is above the token. Forgotten at a reset of the replica (the
    /// promise does not survive one), kept across a disposal (which is no reset).
    floors: BTreeMap<(usize, Id), Option<(Ts, u64)>>,
    /// How far each replica's clock runs ahead (`Bounds::offsets`, constant).
    offsets: Vec<Duration>,
    /// How fast each replica's clock runs (`Bounds::rates`, constant).
    rates: Vec<i64>,
    /// (Scheduled) cut links, bit `client * n + replica`.
    cut: u64,
    /// The actor the last action changed (whose fingerprint to refresh).
    touched: Option<Actor>,
    /// Cached component fingerprints.
    fp_replicas: Vec<u128>,
    /// Per client: the fingerprint without the views, and one per view.
    fp_clients: Vec<(u128, Vec<u128>)>,
}

/// Two SipHash-1-3 hashes with different prefixes: 128 bits, so that collisions among
/// hundreds of millions of states are out of the question.
fn h128(bytes: &[u8]) -> u128 {
    let mut a = DefaultHasher::new();
    bytes.hash(&mut a);
    let mut b = DefaultHasher::new();
    0x5a_u8.hash(&mut b);
    bytes.hash(&mut b);
    (u128::from(a.finish()) << 64) | u128::from(b.finish())
}

/// A cheap 128-bit combiner of words that are hashes already (two multiply-rotate lanes,
/// each a bijection of its state for a given word, then a final avalanche).
struct Mix(u64, u64);

impl Mix {
    fn new() -> Self {
        Mix(0x243f_6a88_85a3_08d3, 0x1319_8a2e_0370_7344)
    }
    fn word(&mut self, w: u64) {
        self.0 = (self.0 ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
        self.1 = (self.1 ^ w).wrapping_mul(0xc2b2_ae3d_27d4_eb4f).rotate_left(31);
    }
    fn wide(&mut self, w: u128) {
        self.word(w as u64);
        self.word((w >> 64) as u64);
    }
    fn finish(&self) -> u128 {
        fn fmix(mut h: u64) -> u64 {
            h ^= h >> 33;
            h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
            h ^= h >> 33;
            h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
            h ^ (h >> 33)
        }
        (u128::from(fmix(self.0 ^ self.1.rotate_left(17))) << 64) | u128::from(fmix(self.1 ^ self.0.rotate_left(41)))
    }
}

/// Cuts `name: value` (and its separating comma) out of a `Debug` rendering for each
/// of `names`, where the value may nest `{}`, `[]` and `()`. Used to leave out `config`
/// and `stats`. Structural characters are ASCII, so bytes are scanned.
fn cut_fields(s: &str, names: &[&str]) -> String {
    let mut s = s.to_string();
    for name in names {
        let key = format!("{name}: ");
        let Some(start) = s.find(&key) else { continue };
        let bytes = s.as_bytes();
        let mut depth = 0i32;
        let mut end = s.len();
        for (k, &ch) in bytes.iter().enumerate().skip(start + key.len()) {
            match ch {
                b'{' | b'[' | b'(' => depth += 1,
                b'}' | b']' | b')' if depth == 0 => {
                    end = k;
                    break;
                }
                b'}' | b']' | b')' => depth -= 1,
                b',' if depth == 0 => {
                    end = k + 1; // with its comma
                    break;
                }
                _ => {}
            }
        }
        while end < s.len() && s.as_bytes()[end] == b' ' {
            end += 1;
        }
        s.replace_range(start..end, "");
    }
    s
}

fn replica_fp(r: &Replica<Id>) -> u128 {
    let text = cut_fields(&format!("{r:?}"), &["config", "stats"]);
    h128(text.as_bytes())
}

fn client_fp(c: &Option<Client<Id>>) -> (u128, Vec<u128>) {
    match c {
        None => (0, Vec::new()),
        Some(c) => {
            let text = cut_fields(&format!("{c:?}"), &["config", "views", "stats"]);
            let views = c.views().iter().map(|v| h128(format!("{v:?}").as_bytes())).collect();
            (h128(text.as_bytes()), views)
        }
    }
}

/// Every permutation of `0..n` (Heap's algorithm), identity first.
fn permutations(n: usize) -> Vec<Vec<usize>> {
    fn heap(k: usize, a: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if k <= 1 {
            out.push(a.clone());
            return;
        }
        for i in 0..k {
            heap(k - 1, a, out);
            let j = if k.is_multiple_of(2) { i } else { 0 };
            if i + 1 < k {
                a.swap(j, k - 1);
            }
        }
    }
    let mut out = Vec::new();
    heap(n, &mut (0..n).collect(), &mut out);
    out
}

/// The checker's fixed inputs.
struct Model {
    b: Bounds,
    cfg: Config,
    /// Permutations used by the fingerprint (only the identity without symmetry).
    perms: Vec<Vec<usize>>,
}

impl Model {
    /// Replica `i`'s configuration: the mutant's, if it is planted there.
    fn replica_config(&self, i: usize) -> Config {
        match self.b.mutant {
            Some((mutant, at)) if !client_mutant(mutant) && (at == i || at == EVERY) => {
                self.cfg.clone().with_mutant(mutant)
            }
            _ => self.cfg.clone(),
        }
    }

    /// Client `c`'s configuration: the mutant's, if it is planted there.
    fn client_config(&self, c: usize) -> Config {
        match self.b.mutant {
            Some((mutant, at)) if client_mutant(mutant) && (at == c || at == EVERY) => {
                self.cfg.clone().with_mutant(mutant)
            }
            _ => self.cfg.clone(),
        }
    }

    /// Whether the replicas' clocks are within one lease of each other: the fencing
    /// promise (b) of ARCHITECTURE.md. Clocks that run at rates beyond the drift bound
    /// promise nothing.
    fn clocks_within_a_lease(&self) -> bool {
        let bound = i64::from(self.cfg.max_drift_ppm());
        if self.b.rates.iter().any(|r| r.abs() > bound) {
            return false;
        }
        let max = self.b.offsets.iter().max().copied().unwrap_or_default();
        let min =
            if self.b.offsets.len() < self.b.n { Duration::ZERO } else { *self.b.offsets.iter().min().expect("n > 0") };
        max - min <= LEASE
    }
}

fn name(id: Id) -> char {
    (b'A' + id as u8) as char
}

fn secs(t: Time) -> String {
    let s = format!("{:.6}", t.as_secs_f64());
    let s = s.trim_end_matches('0');
    format!("{}s", s.strip_suffix('.').map_or(s.to_string(), |s| format!("{s}.0")))
}

fn micros_as_time(us: u64) -> String {
    secs(Duration::from_micros(us))
}

fn show_msg(msg: &Msg) -> String {
    match msg {
        Msg::Up { from, to, msg } => {
            let body = match msg {
                ToReplica::Request { sent, floor, .. } => {
                    format!("REQUEST(sent {}, floor {floor})", micros_as_time(*sent))
                }
                ToReplica::Release { token, .. } => format!("RELEASE(token {token})"),
                ToReplica::Yield { stamp, .. } => format!("YIELD(stamp {stamp})"),
                ToReplica::Relay { next, .. } => format!("RELAY({} next)", next.len()),
            };
            format!("{} -> replica {to}: {body}", name(*from))
        }
        Msg::Down { from, to, r } => format!(
            "replica {from} -> {}: RESPONSE(owner {}, stamp {}, position {}, echo {}, advice {:?}{})",
            name(*to),
            name(r.owner.client),
            r.stamp,
            r.position,
            micros_as_time(r.echo),
            r.advice,
            if r.promoted { ", promoted" } else { "" }
        ),
    }
}

impl State {
    fn initial(model: &Model) -> Self {
        let b = &model.b;
        let mut s = State {
            now: Duration::ZERO,
            replicas: (0..b.n).map(|i| Replica::new(model.replica_config(i))).collect(),
            clients: (0..b.clients).map(|_| None).collect(),
            flight: Vec::new(),
            used: Used::default(),
            wiped: BTreeMap::new(),
            floors: BTreeMap::new(),
            offsets: b.offsets.clone(),
            rates: b.rates.clone(),
            cut: 0,
            touched: None,
            fp_replicas: Vec::new(),
            fp_clients: Vec::new(),
        };
        if !b.explored_starts {
            for c in 0..b.clients {
                s.start(model, c);
                s.drain_client(model, c).expect("a client that just started");
            }
        }
        s.fp_replicas = s.replicas.iter().map(replica_fp).collect();
        s.fp_clients = s.clients.iter().map(client_fp).collect();
        s
    }

    fn start(&mut self, model: &Model, c: usize) {
        let id = c as Id;
        let ts = LamportClock::new().stamp(self.now, id);
        self.clients[c] = Some(Client::new(model.client_config(c), ts, self.now));
        self.used.started += 1;
    }

    /// Replica `i`'s clock.
    fn replica_now(&self, i: usize) -> Time {
        clock_at(
            self.now,
            Duration::ZERO,
            self.offsets.get(i).copied().unwrap_or_default(),
            self.rates.get(i).copied().unwrap_or(0),
        )
    }

    /// An actor's next deadline, on the global clock.
    fn deadline(&self, x: Actor) -> Option<Time> {
        match x {
            Actor::Replica(i) => {
                let i = i as usize;
                let (off, ppm) =
                    (self.offsets.get(i).copied().unwrap_or_default(), self.rates.get(i).copied().unwrap_or(0));
                self.replicas[i].poll_timeout().map(|t| real_at(t, Duration::ZERO, off, ppm))
            }
            Actor::Client(c) => self.clients[c as usize].as_ref().and_then(|c| c.poll_timeout()),
        }
    }

    fn actors(&self) -> impl Iterator<Item = Actor> + '_ {
        let replicas = (0..self.replicas.len()).map(|i| Actor::Replica(i as u8));
        replicas.chain((0..self.clients.len()).map(|c| Actor::Client(c as u8)))
    }

    /// Every action enabled in this state, in a fixed order.
    fn actions(&self, model: &Model) -> Vec<Action> {
        match model.b.network {
            Network::Exhaustive => self.exhaustive_actions(model),
            Network::Scheduled => self.scheduled_actions(model),
        }
    }

    fn exhaustive_actions(&self, model: &Model) -> Vec<Action> {
        let b = &model.b;
        let mut out = Vec::new();
        if b.explored_starts && (self.used.started as usize) < b.clients {
            out.push(Action::Start(self.used.started));
        }
        // Copies of one message (same content, same flag) lead to the same state.
        let mut seen = HashSet::new();
        for (k, f) in self.flight.iter().enumerate() {
            if !seen.insert((f.fp, f.msg.replica())) {
                continue;
            }
            let k = k as u16;
            out.push(Action::Deliver(k));
            if f.copyable && self.used.copies < b.copies {
                out.push(Action::DeliverKeepCopy(k));
            }
            if self.used.losses < b.losses {
                out.push(Action::Lose(k));
            }
        }
        let deadlines: Vec<(Actor, Time)> = self.actors().filter_map(|x| self.deadline(x).map(|t| (x, t))).collect();
        match b.timers {
            Timers::Prompt => {
                let overdue = deadlines.iter().any(|&(_, t)| t <= self.now);
                let earliest = deadlines.iter().map(|&(_, t)| t).min();
                for &(x, t) in &deadlines {
                    if (overdue && t <= self.now) || (!overdue && Some(t) == earliest) {
                        out.push(Action::Fire(x));
                    }
                }
            }
            Timers::Lazy => {
                for &(x, t) in &deadlines {
                    if t <= self.now {
                        out.push(Action::Fire(x));
                    }
                }
                let mut times = BTreeSet::new();
                for &(x, t) in &deadlines {
                    if t > self.now && times.insert(t) {
                        out.push(Action::Advance(x));
                    }
                }
            }
        }
        self.decisions(model, &mut out);
        out
    }

    /// The choices of the application and of the adversary that do not concern one
    /// message: pause, release, reset.
    fn decisions(&self, model: &Model, out: &mut Vec<Action>) {
        let b = &model.b;
        if self.used.pauses < b.pauses {
            out.push(Action::Pause);
        }
        if self.used.releases < b.releases {
            for (c, client) in self.clients.iter().enumerate() {
                if client.as_ref().is_some_and(|c| matches!(c.phase(), Phase::Holding | Phase::Lost)) {
                    out.push(Action::Release(c as u8));
                }
            }
        }
        if self.used.resets < b.resets {
            out.extend((0..b.n).map(|i| Action::Reset(i as u8)));
        }
        if self.used.disposals < b.disposals {
            for i in 0..b.n {
                if self.replicas[i].is_disposable(self.replica_now(i)) {
                    out.push(Action::Dispose(i as u8));
                }
            }
        }
    }

    /// Index of the oldest message not held (the scheduled network's next delivery).
    fn front(&self) -> Option<usize> {
        self.flight.iter().position(|f| !f.held)
    }

    /// The timer the scheduled default fires next: the earliest, the first actor on ties.
    fn next_timer(&self) -> Option<Actor> {
        let mut best: Option<(Time, Actor)> = None;
        for x in self.actors() {
            if let Some(t) = self.deadline(x) {
                if best.is_none_or(|(bt, _)| t < bt) {
                    best = Some((t, x));
                }
            }
        }
        best.map(|(_, x)| x)
    }

    fn scheduled_actions(&self, model: &Model) -> Vec<Action> {
        let b = &model.b;
        let mut out = Vec::new();
        match self.front() {
            Some(k) => {
                out.push(Action::Step);
                let k = k as u16;
                if self.flight[k as usize].copyable && self.used.copies < b.copies {
                    out.push(Action::DeliverKeepCopy(k));
                }
                if self.used.losses < b.losses {
                    out.push(Action::Lose(k));
                }
            }
            None => {
                // Quiescent: nothing deliverable now. The adversary and the
                // applications act here, between two instants of the clock.
                if self.next_timer().is_some() {
                    out.push(Action::Step);
                }
                if b.explored_starts && (self.used.started as usize) < b.clients {
                    out.push(Action::Start(self.used.started));
                }
                for c in 0..b.clients {
                    for i in 0..b.n {
                        let bit = 1u64 << (c * b.n + i);
                        if self.cut & bit != 0 {
                            if self.used.heals < b.heals {
                                out.push(Action::Heal(c as u8, i as u8));
                            }
                        } else if self.used.cuts < b.cuts {
                            out.push(Action::Cut(c as u8, i as u8));
                        }
                    }
                }
                self.decisions(model, &mut out);
            }
        }
        out
    }

    fn describe(&self, a: Action) -> String {
        match a {
            Action::Start(c) => format!("{} starts", name(c.into())),
            Action::Deliver(k) => format!("deliver {}", show_msg(&self.flight[k as usize].msg)),
            Action::DeliverKeepCopy(k) => {
                format!("deliver (a copy stays in flight) {}", show_msg(&self.flight[k as usize].msg))
            }
            Action::Lose(k) => format!("lose {}", show_msg(&self.flight[k as usize].msg)),
            Action::Fire(x) => {
                let t = self.deadline(x).expect("enabled");
                let late = if t < self.now { format!(" (due at {}, late)", secs(t)) } else { String::new() };
                format!("timer of {}{late}", self.actor_name(x))
            }
            Action::Advance(x) => {
                format!(
                    "clock advances to {} (deadline of {})",
                    secs(self.deadline(x).expect("enabled")),
                    self.actor_name(x)
                )
            }
            Action::Pause => format!("clock advances by one lease ({LEASE:?}), timers unfired"),
            Action::Release(c) => format!("{} releases", name(c.into())),
            Action::Reset(i) => format!("replica {i} is RESET (memory wiped)"),
            Action::Dispose(i) => format!("replica {i} is idle and DISPOSED of"),
            Action::Step => match self.front() {
                Some(k) => format!("deliver {}", show_msg(&self.flight[k].msg)),
                None => self.describe(Action::Fire(self.next_timer().expect("enabled"))),
            },
            Action::Cut(c, i) => format!("link {} -- replica {i} is CUT (its messages are held)", name(c.into())),
            Action::Heal(c, i) => format!("link {} -- replica {i} is HEALED (held messages follow)", name(c.into())),
        }
    }

    fn actor_name(&self, x: Actor) -> String {
        match x {
            Actor::Replica(i) => format!("replica {i}"),
            Actor::Client(c) => format!("client {}", name(c.into())),
        }
    }

    /// Applies `a`; `Err` when the core broke one of its own rules on the way.
    fn apply(&mut self, model: &Model, a: Action) -> Result<(), String> {
        self.touched = None;
        let result = match a {
            Action::Start(c) => {
                self.start(model, c as usize);
                self.touched = Some(Actor::Client(c));
                self.drain_client(model, c as usize)
            }
            Action::Deliver(k) => {
                let f = self.flight.remove(k as usize);
                self.deliver(model, f.msg)
            }
            Action::DeliverKeepCopy(k) => {
                let f = self.flight.remove(k as usize);
                // The copy travels on its own and arrives later (it is not copied again).
                self.used.copies += 1;
                self.send(model, Flight::new(f.msg.clone(), false));
                self.deliver(model, f.msg)
            }
            Action::Lose(k) => {
                self.flight.remove(k as usize);
                self.used.losses += 1;
                Ok(())
            }
            Action::Step => match self.front() {
                Some(k) => self.apply(model, Action::Deliver(k as u16)),
                None => self.apply(model, Action::Fire(self.next_timer().expect("enabled"))),
            },
            Action::Fire(x) => {
                let t = self.deadline(x).expect("enabled");
                self.now = self.now.max(t);
                let now = self.now;
                self.touched = Some(x);
                match x {
                    Actor::Replica(i) => {
                        let now = self.replica_now(i as usize);
                        self.replicas[i as usize].handle_timeout(now);
                        self.drain_replica(model, i as usize);
                        Ok(())
                    }
                    Actor::Client(c) => {
                        self.clients[c as usize].as_mut().expect("started").handle_timeout(now);
                        self.drain_client(model, c as usize)
                    }
                }
            }
            Action::Advance(x) => {
                self.now = self.deadline(x).expect("enabled");
                Ok(())
            }
            Action::Pause => {
                self.now += LEASE;
                self.used.pauses += 1;
                Ok(())
            }
            Action::Release(c) => {
                self.used.releases += 1;
                self.clients[c as usize].as_mut().expect("started").release(self.now);
                self.touched = Some(Actor::Client(c));
                self.drain_client(model, c as usize)
            }
            Action::Reset(i) => {
                self.reset(model, i as usize);
                Ok(())
            }
            Action::Dispose(i) => {
                // What `Behaviour::reindex_replica` does: the entry goes, and the next
                // message for the key creates a replica with empty memory. No grant is
                // wiped (it had no owner, and its stamps are behind its clock).
                self.replicas[i as usize] = Replica::new(model.replica_config(i as usize));
                self.used.disposals += 1;
                self.touched = Some(Actor::Replica(i));
                Ok(())
            }
            Action::Cut(c, i) => {
                self.cut |= 1 << (c as usize * model.b.n + i as usize);
                for f in &mut self.flight {
                    if f.link() == (c as usize, i as usize) {
                        f.held = true;
                    }
                }
                self.used.cuts += 1;
                Ok(())
            }
            Action::Heal(c, i) => {
                self.cut &= !(1 << (c as usize * model.b.n + i as usize));
                let (mut healed, rest): (Vec<Flight>, Vec<Flight>) =
                    std::mem::take(&mut self.flight).into_iter().partition(|f| f.link() == (c as usize, i as usize));
                self.flight = rest;
                for f in &mut healed {
                    f.held = false;
                }
                self.flight.extend(healed);
                self.used.heals += 1;
                Ok(())
            }
        };
        if matches!(a, Action::Step) {
            return result; // done by the action it stood for
        }
        self.forget_dead_messages();
        self.note_reissued_grants();
        self.forget_unreferenced_grants();
        self.refresh_fingerprints();
        result
    }

    /// Replica `i` loses its memory.
    fn reset(&mut self, model: &Model, i: usize) {
        // Every grant of this replica that anything still refers to was made before
        // the reset.
        let mut grants: Vec<(Ts, u64)> = self.replicas[i].owner().map(|(ts, s)| (*ts, s)).into_iter().collect();
        for c in self.clients.iter().flatten() {
            let v = &c.views()[i];
            if let Some(o) = v.owner {
                grants.push((o, v.stamp));
            }
        }
        for f in &self.flight {
            if let Msg::Down { from, r, .. } = &f.msg {
                if *from == i {
                    grants.push((r.owner, r.stamp));
                }
            }
        }
        for (ts, s) in grants {
            // A grant wiped by an earlier reset keeps that reset's ordinal.
            self.wiped.entry((i, ts, s)).or_insert(self.used.resets);
        }
        self.replicas[i] = Replica::new(model.replica_config(i));
        if model.b.delayed_resets {
            let until = self.replica_now(i) + takeover_delay(&model.cfg);
            self.replicas[i].hold_grants_until(until);
        }
        // The token floors it had seen are gone with it.
        self.floors.retain(|&(j, _), _| j != i);
        self.used.resets += 1;
        self.touched = Some(Actor::Replica(i as u8));
    }

    /// Puts a message on the network (held if its link is cut).
    fn send(&mut self, model: &Model, mut f: Flight) {
        let (c, i) = f.link();
        f.held = self.cut & (1 << (c * model.b.n + i)) != 0;
        self.flight.push(f);
    }

    /// Drops responses their client will discard whenever they arrive: older than the
    /// grant it already knows (its stamps only grow), or addressed to a released
    /// acquisition; a solicitation (whose stamp the client does not read: a reset
    /// replica's is below what the client saw before) once its client no longer waits,
    /// which it never does again. Delivering them changes nothing but counters, so this
    /// only merges states.
    fn forget_dead_messages(&mut self) {
        let clients = &self.clients;
        self.flight.retain(|f| match &f.msg {
            Msg::Down { to, r, .. } if r.solicit => {
                clients[*to as usize].as_ref().is_none_or(|c| c.phase() == Phase::Waiting)
            }
            Msg::Down { from, to, r } => match &clients[*to as usize] {
                Some(c) => c.phase() != Phase::Released && r.stamp >= c.views()[*from].stamp,
                None => true,
            },
            Msg::Up { .. } => true,
        });
    }

    fn deliver(&mut self, model: &Model, msg: Msg) -> Result<(), String> {
        let now = self.now;
        match msg {
            Msg::Up { from, to, msg } => {
                self.touched = Some(Actor::Replica(to as u8));
                // A RELEASE or a renewal carrying its sender's fencing token.
                let carried = match &msg {
                    ToReplica::Request { floor, .. } => *floor,
                    ToReplica::Release { token, .. } => *token,
                    _ => 0,
                };
                let token = self.clients[from as usize].as_ref().map_or(0, |c| c.token());
                if token > 0 && carried >= token && !self.floors.contains_key(&(to, from)) {
                    let owner = self.replicas[to].owner().map(|(ts, s)| (*ts, s));
                    self.floors.insert((to, from), owner);
                }
                let now = self.replica_now(to);
                match self.replicas[to].handle(now, &from, msg) {
                    Ok(()) | Err(ReplicaError::NotHolder) | Err(ReplicaError::Finished) => {}
                    Err(e) => return Err(format!("replica {to} rejected a well-formed message: {e}")),
                }
                self.drain_replica(model, to);
            }
            Msg::Down { from, to, r } => {
                let c = to as usize;
                self.touched = Some(Actor::Client(to as u8));
                let client = self.clients[c].as_mut().expect("a response goes to a started client");
                match client.handle_response(now, from, r) {
                    Ok(()) | Err(ClientError::Stale) => {}
                    Err(e) => return Err(format!("client {} rejected a well-formed response: {e}", name(to))),
                }
                self.drain_client(model, c)?;
            }
        }
        Ok(())
    }

    fn drain_replica(&mut self, model: &Model, i: usize) {
        while let Some((to, r)) = self.replicas[i].poll_transmit() {
            self.send(model, Flight::new(Msg::Down { from: i, to, r }, true));
        }
    }

    fn drain_client(&mut self, model: &Model, c: usize) -> Result<(), String> {
        let client = self.clients[c].as_mut().expect("started");
        let from = client.ts().client;
        let mut out = Vec::new();
        while let Some((to, msg)) = client.poll_transmit() {
            out.push(Flight::new(Msg::Up { from, to, msg }, true));
        }
        let mut result = Ok(());
        let mut won = false;
        while let Some(event) = client.poll_event() {
            if let Event::Acquired { votes, .. } = event {
                won = true;
                if votes < model.b.m || client.votes() < model.b.m {
                    result = Err(format!("{} won with {votes} votes, m = {}", name(from), model.b.m));
                }
            }
        }
        for f in out {
            self.send(model, f);
        }
        if won && result.is_ok() {
            result = self.check_token_order(model, c);
        }
        result
    }

    /// The fencing-token order (ARCHITECTURE.md, "Fencing tokens"), when client `c` has
    /// just won: its token is above that of every earlier holder P whose holding is over
    /// (not a valid holder now: two valid holders are the exclusion check's) when
    /// (a) P's RELEASE or a renewal carrying P's token reached a replica of `c`'s quorum
    /// before that replica granted `c` its vote there, and the replica was not reset
    /// since; or (b) the replicas' clocks are within one lease of each other and no reset
    /// came yet (with a reset, (b) promises nothing: a waiter granted by a reset replica
    /// before P's win can win after it on older stamps).
    fn check_token_order(&self, model: &Model, c: usize) -> Result<(), String> {
        let now = self.now;
        let n = self.clients[c].as_ref().expect("won");
        let quorum: Vec<(usize, u64)> = (0..model.b.n)
            .filter(|&i| n.views()[i].owner.as_ref() == Some(n.ts()))
            .map(|i| (i, n.views()[i].stamp))
            .collect();
        let b = model.clocks_within_a_lease() && self.used.resets == 0;
        for (p, holder) in self.clients.iter().enumerate() {
            let Some(holder) = holder.as_ref().filter(|h| p != c && h.token() > 0) else { continue };
            if holder.phase() == Phase::Holding && holder.valid_until().is_some_and(|t| t > now) {
                continue;
            }
            let a = quorum.iter().find(|&&(i, stamp)| {
                self.floors.get(&(i, p as Id)).is_some_and(|owner| *owner != Some((*n.ts(), stamp)))
            });
            if (a.is_some() || b) && n.token() <= holder.token() {
                let why = match a {
                    Some((i, _)) => {
                        format!("{}'s token reached replica {i} before its grant to {}", name(p as Id), name(c as Id))
                    }
                    None => "the replicas' clocks are within one lease, no reset".to_string(),
                };
                return Err(format!(
                    "fencing token went back: {} won with token {} after {} held with token {} ({why})",
                    name(c as Id),
                    n.token(),
                    name(p as Id),
                    holder.token()
                ));
            }
        }
        Ok(())
    }

    /// Marks a wiped grant that its replica's current incarnation has issued again.
    fn note_reissued_grants(&mut self) {
        if self.wiped.is_empty() {
            return;
        }
        for (i, r) in self.replicas.iter().enumerate() {
            if let Some((ts, s)) = r.owner() {
                if let Some(k) = self.wiped.get_mut(&(i, *ts, s)) {
                    *k = REISSUED;
                }
            }
        }
    }

    /// Drops wiped grants nothing refers to any more: they cannot come back.
    fn forget_unreferenced_grants(&mut self) {
        if self.wiped.is_empty() {
            return;
        }
        let mut live = BTreeSet::new();
        for c in self.clients.iter().flatten() {
            for (i, v) in c.views().iter().enumerate() {
                if let Some(o) = v.owner {
                    live.insert((i, o, v.stamp));
                }
            }
        }
        for f in &self.flight {
            if let Msg::Down { from, r, .. } = &f.msg {
                live.insert((*from, r.owner, r.stamp));
            }
        }
        for (i, r) in self.replicas.iter().enumerate() {
            if let Some((ts, s)) = r.owner() {
                live.insert((i, *ts, s));
            }
        }
        self.wiped.retain(|g, _| live.contains(g));
    }

    fn refresh_fingerprints(&mut self) {
        // Only the actor the action touched changed; messages carry their own.
        match self.touched {
            Some(Actor::Replica(i)) => self.fp_replicas[i as usize] = replica_fp(&self.replicas[i as usize]),
            Some(Actor::Client(c)) => self.fp_clients[c as usize] = client_fp(&self.clients[c as usize]),
            None => {}
        }
    }

    /// The state's fingerprint: the least over the replica permutations.
    fn fingerprint(&self, model: &Model) -> u128 {
        let n = self.replicas.len();
        let mut best = u128::MAX;
        let mut msgs: Vec<u128> = Vec::with_capacity(self.flight.len());
        let mut wiped: Vec<(usize, Ts, u64, u8)> = Vec::with_capacity(self.wiped.len());
        let mut floors: Vec<(usize, Id, Option<(Ts, u64)>)> = Vec::with_capacity(self.floors.len());
        let mut inv = vec![0; n];
        for p in &model.perms {
            // p[i] is the new index of replica i; inv[j] the old index at j.
            for (i, &j) in p.iter().enumerate() {
                inv[j] = i;
            }
            let mut h = Mix::new();
            h.word(self.now.as_nanos() as u64);
            let mut u = DefaultHasher::new();
            self.used.hash(&mut u);
            h.word(u.finish());
            for &i in &inv {
                h.wide(self.fp_replicas[i]);
            }
            for (core, views) in &self.fp_clients {
                h.wide(*core);
                if !views.is_empty() {
                    for &i in &inv {
                        h.wide(views[i]);
                    }
                }
            }
            // Exhaustive: the messages in flight are a multiset. Scheduled: those not
            // held are a queue (order matters), the held ones a multiset.
            let ordered = model.b.network == Network::Scheduled;
            let key = |f: &Flight| {
                let j = p[f.msg.replica()] as u128 + 1;
                f.fp ^ j.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)
            };
            if ordered {
                for f in self.flight.iter().filter(|f| !f.held) {
                    h.wide(key(f));
                }
                h.word(u64::MAX);
            }
            msgs.clear();
            msgs.extend(self.flight.iter().filter(|f| !ordered || f.held).map(key));
            msgs.sort_unstable();
            h.word(msgs.len() as u64);
            for &m in &msgs {
                h.wide(m);
            }
            h.word(self.cut);
            wiped.clear();
            wiped.extend(self.wiped.iter().map(|(&(i, ts, s), &k)| (p[i], ts, s, k)));
            wiped.sort_unstable();
            for (i, ts, s, k) in &wiped {
                h.word(*i as u64);
                h.word(ts.counter);
                h.word(u64::from(ts.client));
                h.word(*s);
                h.word(u64::from(*k));
            }
            floors.clear();
            floors.extend(self.floors.iter().map(|(&(i, holder), o)| (p[i], holder, *o)));
            floors.sort_unstable();
            h.word(floors.len() as u64);
            for (i, holder, owner) in &floors {
                h.word(*i as u64);
                h.word(u64::from(*holder));
                let (ts, s) = owner.map_or((0, 0), |(ts, s)| (ts.counter ^ (u64::from(ts.client) << 56), s + 1));
                h.word(ts);
                h.word(s);
            }
            best = best.min(h.finish());
        }
        best
    }

    /// The invariant (see the module doc of `tests/model.rs`).
    /// `Ok(true)` when two valid holders coexist, excused by resets.
    fn check(&self, model: &Model) -> Result<bool, String> {
        for (i, r) in self.replicas.iter().enumerate() {
            r.check_invariants().map_err(|e| format!("replica {i}: {e}"))?;
        }
        let now = self.now;
        let holders: Vec<&Client<Id>> = self
            .clients
            .iter()
            .flatten()
            .filter(|c| c.phase() == Phase::Holding && c.valid_until().is_some_and(|t| t > now))
            .collect();
        let need = 2 * model.b.m - model.b.n;
        let mut excused = false;
        for (k, a) in holders.iter().enumerate() {
            for b in &holders[k + 1..] {
                let mut shared = Vec::new();
                let mut switched = Vec::new();
                for i in 0..model.b.n {
                    let (va, vb) = (&a.views()[i], &b.views()[i]);
                    // A live vote for each, by its own view: a lapsed view is no vote.
                    let live = |v: &View<Id>, c: &Client<Id>| {
                        v.owner.as_ref() == Some(c.ts()) && v.vote_until.is_some_and(|t| t > now)
                    };
                    if !(live(va, a) && live(vb, b)) {
                        continue;
                    }
                    shared.push(i);
                    // The replica switched sides through a reset only if the two grants
                    // come from different incarnations: the earlier one was wiped by a
                    // reset between them. Two grants of one incarnation (the replica
                    // switched before a reset) are a double grant, whatever came after.
                    let incarnation = |c: &Client<Id>, stamp| self.wiped.get(&(i, *c.ts(), stamp));
                    let (ka, kb) = (incarnation(a, va.stamp), incarnation(b, vb.stamp));
                    // A reset that carries the takeover delay switches nothing: its new
                    // incarnation grants only once every vote of the old one has run out.
                    if ka != kb && ka != Some(&REISSUED) && kb != Some(&REISSUED) && !model.b.delayed_resets {
                        switched.push(i);
                    }
                }
                if switched.len() < need {
                    return Err(format!(
                        "two valid holders: {} (valid until {}) and {} (valid until {}) at {}; live votes for both \
                         at {shared:?}, of which {switched:?} switched sides through a reset, 2m - n = {need}",
                        name(a.ts().client),
                        secs(a.valid_until().expect("holder")),
                        name(b.ts().client),
                        secs(b.valid_until().expect("holder")),
                        secs(now),
                    ));
                }
                excused = true;
            }
        }
        Ok(excused)
    }

    /// Everything an engineer needs to read a trace's last state.
    fn show(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "  time {}", secs(self.now));
        for (i, r) in self.replicas.iter().enumerate() {
            let owner = match r.owner() {
                Some((ts, s)) => format!(
                    "owner {} (stamp {s}, lease until {})",
                    name(ts.client),
                    secs(r.lease_until().expect("owner"))
                ),
                None => "free".to_string(),
            };
            let queue: Vec<char> = r.queue().map(|ts| name(ts.client)).collect();
            let _ = writeln!(out, "  replica {i}: {owner}, queue {queue:?}");
        }
        for c in self.clients.iter().flatten() {
            let valid = c.valid_until().map_or("-".to_string(), secs);
            let _ = writeln!(
                out,
                "  client {} ts ({}, {}): {:?}, {} votes, valid_until {valid}, token {}",
                name(c.ts().client),
                c.ts().counter,
                c.ts().client,
                c.phase(),
                c.votes(),
                c.token()
            );
            for (i, v) in c.views().iter().enumerate() {
                let owner = v.owner.map_or("-".to_string(), |o| name(o.client).to_string());
                let until = v.vote_until.map_or("-".to_string(), secs);
                let _ = writeln!(
                    out,
                    "      view of replica {i}: owner {owner}, stamp {}, vote_until {until}{}",
                    v.stamp,
                    v.yielded.map_or(String::new(), |s| format!(", yielded {s}"))
                );
            }
        }
        for f in &self.flight {
            let _ = writeln!(out, "  in flight: {}", show_msg(&f.msg));
        }
        for ((i, ts, s), k) in &self.wiped {
            let _ =
                writeln!(out, "  grant wiped by reset #{}: replica {i}, owner {}, stamp {s}", k + 1, name(ts.client));
        }
        out
    }

    /// What changed between `self` (before) and `after`, for a trace.
    fn effects(&self, after: &State) -> String {
        let mut out = String::new();
        for (i, (r0, r1)) in self.replicas.iter().zip(&after.replicas).enumerate() {
            let o0 = r0.owner().map(|(ts, s)| (*ts, s));
            let o1 = r1.owner().map(|(ts, s)| (*ts, s));
            let q0: Vec<char> = r0.queue().map(|ts| name(ts.client)).collect();
            let q1: Vec<char> = r1.queue().map(|ts| name(ts.client)).collect();
            if o0 != o1 || q0 != q1 {
                let owner = match o1 {
                    Some((ts, s)) => format!(
                        "owner {} (stamp {s}, lease until {})",
                        name(ts.client),
                        secs(r1.lease_until().expect("owner"))
                    ),
                    None => "free".into(),
                };
                let _ = writeln!(out, "        replica {i}: {owner}, queue {q1:?}");
            }
        }
        for (c0, c1) in self.clients.iter().zip(&after.clients) {
            let Some(c1) = c1 else { continue };
            let changed = c0.as_ref().is_none_or(|c0| c0.phase() != c1.phase() || c0.votes() != c1.votes());
            if changed {
                let valid = c1.valid_until().map_or("-".to_string(), secs);
                let _ = writeln!(
                    out,
                    "        {}: {:?}, {} votes, valid_until {valid}",
                    name(c1.ts().client),
                    c1.phase(),
                    c1.votes()
                );
            }
        }
        let before: Vec<String> = self.flight.iter().map(|f| show_msg(&f.msg)).collect();
        let mut before_left = before.clone();
        for f in &after.flight {
            let s = show_msg(&f.msg);
            if let Some(k) = before_left.iter().position(|b| *b == s) {
                before_left.swap_remove(k);
            } else {
                let _ = writeln!(out, "        sends {s}");
            }
        }
        out
    }
}

/// The outcome of one search.
pub struct Report {
    /// Distinct states (fingerprints) reached, the initial state included.
    pub states: usize,
    /// Of which with two valid holders that the resets excuse (2m − n shared voters
    /// reset): shows that the reset budget is exercised.
    pub excused: usize,
    /// The excused states by the number of resets the run had made when it reached them
    /// (index 0 for none, which must stay 0).
    pub excused_after_resets: Vec<usize>,
    /// The trace to the first of them.
    pub first_excused: Option<String>,
    /// States reached after at least one idle-replica disposal.
    pub after_disposal: usize,
    /// The latest clock reading of any state.
    pub clock: Time,
    /// Transitions taken (actions applied).
    pub transitions: usize,
    /// Deepest level that produced a new state.
    pub depth: usize,
    pub elapsed: Duration,
    /// The counterexample, printed, if the invariant failed.
    pub violation: Option<String>,
}

impl Report {
    /// Panics with the counterexample if there is one.
    pub fn assert_holds(&self) {
        if let Some(v) = &self.violation {
            panic!("invariant violated:\n{v}");
        }
    }
}

/// Breadth-first search of `b`; stops at the first violation.
pub fn run(b: &Bounds) -> Report {
    let cfg = config(b.n, b.m);
    cfg.validate().expect("model configuration is valid");
    // The scheduled network's default order depends on the replica indices (FIFO from
    // the initial REQUESTs to replica 0, 1, ...; timer ties): no symmetry there, nor
    // with a mutant planted in one replica.
    // Nor with replica clocks that differ.
    let symmetry = b.symmetry
        && b.network == Network::Exhaustive
        && b.mutant.is_none()
        && b.offsets.is_empty()
        && b.rates.is_empty();
    let b = &Bounds { symmetry, ..b.clone() };
    let perms = if symmetry { permutations(b.n) } else { vec![(0..b.n).collect()] };
    assert!(b.clients * b.n <= 64, "cut links are bits of a u64");
    let model = Model { b: b.clone(), cfg, perms };
    let started = Instant::now();
    println!("model: {b:?}");

    let init = State::initial(&model);
    // Per state found: its parent and the action that led to it (for the trace).
    let mut parents: Vec<(u32, Action)> = vec![(u32::MAX, Action::Pause)];
    let mut seen: HashSet<u128> = HashSet::new();
    seen.insert(init.fingerprint(&model));
    let mut report = Report {
        states: 1,
        excused: 0,
        excused_after_resets: vec![0; usize::from(b.resets) + 1],
        first_excused: None,
        after_disposal: 0,
        clock: Duration::ZERO,
        transitions: 0,
        depth: 0,
        elapsed: Duration::ZERO,
        violation: None,
    };
    if let Err(e) = init.check(&model) {
        report.violation = Some(format!("{e}\ninitial state:\n{}", init.show()));
        return report;
    }
    // The states of one level, expanded into the next. States of the next level are
    // first kept as (parent, action) only and rebuilt when their level is expanded, so
    // that at most one level of states is in memory (and the last level never is).
    let mut frontier: Vec<(u32, State)> = vec![(0, init)];
    for depth in 1..=b.depth {
        let first_new = parents.len();
        for (id, s) in &frontier {
            for a in s.actions(&model) {
                let mut t = s.clone();
                report.transitions += 1;
                let result = t.apply(&model, a);
                let new = seen.insert(t.fingerprint(&model));
                let result = result.and_then(|()| if new { t.check(&model) } else { Ok(false) });
                if result == Ok(true) {
                    report.excused += 1;
                    report.excused_after_resets[usize::from(t.used.resets)] += 1;
                    if report.first_excused.is_none() {
                        report.states = seen.len();
                        report.elapsed = started.elapsed();
                        let path = path_to(&parents, *id, a);
                        let heading = "EXCUSED (not a violation): two valid holders, the shared voters were reset";
                        report.first_excused = Some(trace(&model, &path, heading, &report));
                    }
                }
                if new {
                    report.clock = report.clock.max(t.now);
                    report.after_disposal += usize::from(t.used.disposals > 0);
                }
                if let Err(e) = result {
                    report.depth = depth;
                    report.states = seen.len();
                    report.elapsed = started.elapsed();
                    let path = path_to(&parents, *id, a);
                    report.violation = Some(trace(&model, &path, &format!("COUNTEREXAMPLE: {e}"), &report));
                    println!("{}", report.violation.as_ref().expect("set"));
                    return report;
                }
                if new {
                    parents.push((*id, a));
                }
            }
        }
        let found = parents.len() - first_new;
        if found == 0 {
            break;
        }
        report.depth = depth;
        println!(
            "  depth {depth:>3}: {found:>10} new states, {:>11} in all, {:>12} transitions, clock up to {}, {:.1?}",
            seen.len(),
            report.transitions,
            secs(report.clock),
            started.elapsed()
        );
        if depth == b.depth {
            break;
        }
        // Rebuild the new level from its parents (in id order, as they were found).
        let mut next = Vec::with_capacity(found);
        let mut parents_left = frontier.into_iter().peekable();
        for (id, &(p, a)) in parents.iter().enumerate().skip(first_new) {
            while parents_left.peek().is_some_and(|(pid, _)| *pid != p) {
                parents_left.next(); // every child of this parent is rebuilt: drop it
            }
            let (_, parent) = parents_left.peek().expect("parents come in id order");
            let mut t = parent.clone();
            t.apply(&model, a).expect("replays as before");
            next.push((id as u32, t));
        }
        frontier = next;
    }
    report.states = seen.len();
    report.elapsed = started.elapsed();
    println!(
        "model: {} states ({} with two valid holders excused by resets; by resets made: {:?}; {} after a \
         disposal), {} transitions, depth {} reached, clock up to {}, {:.1?}: invariant holds",
        report.states,
        report.excused,
        report.excused_after_resets,
        report.after_disposal,
        report.transitions,
        report.depth,
        secs(report.clock),
        report.elapsed
    );
    report
}

/// The actions from the initial state to state `id`, then `last`.
fn path_to(parents: &[(u32, Action)], id: u32, last: Action) -> Vec<Action> {
    let mut path = vec![last];
    let mut at = id;
    while at != 0 {
        let (p, a) = parents[at as usize];
        path.push(a);
        at = p;
    }
    path.reverse();
    path
}

/// Replays `path` from the initial state and prints every step and the final views.
fn trace(model: &Model, path: &[Action], heading: &str, report: &Report) -> String {
    let b = &model.b;
    let mut out = String::new();
    let _ = writeln!(out, "{heading}");
    let _ = writeln!(
        out,
        "configuration: lease {LEASE:?}, request timeout {REQUEST_TIMEOUT:?}, renew every {:?}; {b:?}",
        model.cfg.renew_interval()
    );
    let _ = writeln!(
        out,
        "found at depth {} after {} states, {} transitions, {:.1?}:",
        path.len(),
        report.states,
        report.transitions,
        report.elapsed,
    );
    let mut s = State::initial(model);
    if !b.explored_starts {
        let _ = writeln!(out, "   0. t=0s: every client starts and sends REQUEST to every replica");
    }
    for (k, &a) in path.iter().enumerate() {
        let what = s.describe(a);
        let before = s.clone();
        let result = s.apply(model, a);
        let _ = writeln!(out, "  {:>2}. t={}: {what}", k + 1, secs(s.now));
        out.push_str(&before.effects(&s));
        if let Err(e) = result {
            let _ = writeln!(out, "        ERROR: {e}");
        }
    }
    let _ = writeln!(out, "final state:");
    out.push_str(&s.show());
    out
}

#[test]
fn fingerprints_leave_out_config_and_stats() {
    let s = "Outer { config: Config { n: 3, lease: 3s }, a: [1, (2, 3)], stats: Stats { x: 1 } }";
    assert_eq!(cut_fields(s, &["config", "stats"]), "Outer { a: [1, (2, 3)], }");
    // A rejected message changes a replica's counters only.
    let fresh = Replica::<Id>::new(config(3, 2));
    let mut rejected = fresh.clone();
    let foreign = ToReplica::Release { ts: Timestamp::new(1, 0), token: 0, next: vec![] };
    assert!(rejected.handle(Duration::ZERO, &1, foreign).is_err());
    assert_ne!(format!("{fresh:?}"), format!("{rejected:?}"));
    assert_eq!(replica_fp(&fresh), replica_fp(&rejected));
}
