//! `sigma-testnet sim membership`: the membership of a swarm in virtual time.
//!
//! Every simulated peer runs the node's own sans-IO membership
//! ([`sigma_behaviour::membership::Membership`]: liveness windows, counting, serving,
//! joint quorums, leaves) and exchanges the node's own gossip tables with it
//! ([`Membership::table`], [`Membership::merge`]), each heartbeat proven by the node's
//! hash chain ([`sigma_behaviour::liveness::Chain`], checked on every merge). What the
//! simulator adds is only what the behaviour does around them: a round every gossip
//! interval to `fanout` members alive in the peer's view, one of them a member a
//! pending joint quorum waits on if any, the others random (the node prefers connected
//! ones; here every peer is one message away), the reply to each request,
//! the housekeeping tick, and a joining peer's connections to its bootstrap peers.
//!
//! The network delivers each message after a latency drawn per message, or loses it;
//! peers join, crash, leave gracefully and stall (a stalled peer's event loop handles
//! nothing: its rounds are skipped and what arrives waits for it). Time is virtual and
//! every draw comes from one seeded RNG (the peers' keys and the member tables' hash
//! keys too), so one seed gives one run: [`Report::digest`].
//!
//! What it measures, for the goals of docs/benchmarks.md ("Membership in virtual time"):
//! bytes sent per peer and second (the CBOR payload of every table, as the wire encodes
//! it; the transport's framing is not counted), how long after a crash each peer's view
//! drops the crashed peer, false removals (a peer that is up, stalled or not, dropped
//! from a view), and formation (every peer serving and counting every peer).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

use libp2p::identity::Keypair;
use libp2p::kad::KBucketKey;
use libp2p::PeerId;
use rand::seq::{IteratorRandom, SliceRandom};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use sigma_behaviour::latency::Latency;
use sigma_behaviour::liveness::Chain;
use sigma_behaviour::membership::{Arrival, Membership};
use sigma_behaviour::proto::Time;
use sigma_behaviour::wire;

/// The wall clock of the simulated swarm at virtual time zero (ms since the Unix epoch:
/// incarnations are start times, and proofs are checked against the wall clock).
const WALL_EPOCH_MS: u64 = 1_800_000_000_000;

/// How often a peer's housekeeping runs when nothing else happens (the node's timer
/// fires at least once a second; the membership ages its views once a second).
const TICK: Duration = Duration::from_millis(250);

/// How often formation is checked.
const CHECK: Duration = Duration::from_millis(100);

/// Graceful leaves are sent to this many members alive in the leaving peer's view (the
/// node sends them to its connections).
const LEAVE_FANOUT: usize = 8;

/// One run's swarm, network and faults.
#[derive(Clone, Debug)]
pub struct Config {
    /// Peers at the start.
    pub peers: usize,
    /// RNG seed.
    pub seed: u64,
    /// Peers started per second while the swarm forms, each connected to
    /// `bootstrap_peers` random peers started before it (the first starts alone and
    /// serves at once), as `sigma-testnet swarm` starts its peers.
    pub join_rate: f64,
    /// Peers a newcomer connects to first.
    pub bootstrap_peers: usize,
    /// Longest time allowed to form; the measured window starts at formation, or
    /// here if the swarm has not formed.
    pub max_formation: Duration,
    /// Measured window after formation.
    pub measure: Duration,
    /// One-way latency of every message.
    pub latency: Latency,
    /// Probability that a message is lost.
    pub loss: f64,
    /// Share of the peers that stall `stall` once every `stall_every`, at a random
    /// phase (in the measured window).
    pub stall_share: f64,
    /// How long a stall lasts.
    pub stall: Duration,
    /// How often a stalling peer stalls.
    pub stall_every: Duration,
    /// Departures per second in the measured window, each followed by a newcomer
    /// (the swarm keeps its size): a uniformly drawn peer, so sessions are exponential
    /// with mean `peers / churn` seconds.
    pub churn: f64,
    /// Session times instead of a rate: from the measured window on, every peer stays
    /// up for a draw of a Weibull distribution of shape 0.5 with this median (measured
    /// DHT sessions are heavy-tailed: half of the new peers gone within about two hours,
    /// a few staying for days), then departs and a newcomer takes its place with a
    /// session of its own. A peer up at the start of the window draws its remaining
    /// time from the same distribution.
    pub session_median: Option<Duration>,
    /// Share of the departures that are graceful leaves (the rest crash).
    pub leave_share: f64,
    /// Crashes in the measured window, evenly spread, not replaced (on top of churn).
    pub crashes: usize,
    /// Prefix groups: with b bits, a peer's membership is the peers whose Kademlia key
    /// starts with the same b bits (docs/design/membership-at-scale.md); 0: one swarm.
    /// A group's first peer starts it (serves at once), the others join through up
    /// peers of their group.
    pub group_bits: u32,
    /// Prefix groups split as the node's membership decides them
    /// (`Membership::with_groups`): the swarm starts as one group, and a group splits
    /// once each half counts this many members. A newcomer joins through the peers
    /// closest to its own key (a Kademlia lookup's answer). None: no splits.
    pub split_at: Option<usize>,
    /// Each round, also ask up to this many members a pending joint quorum waits on for
    /// their acknowledgements alone (`Membership::ack_request`), on top of the round's
    /// targets. The node does not yet (0).
    pub ack_requests: usize,
    /// Gossip interval (the node's default: 500 ms).
    pub gossip_interval: Duration,
    /// Gossip fanout (the node's default: 2).
    pub gossip_fanout: usize,
    /// How long a relayed heartbeat keeps its member alive (the node's default: 5 s).
    pub gossip_liveness: Duration,
}

impl Config {
    /// The node's default gossip, `peers` peers joining 50 a second, 60 s measured,
    /// latency uniform on 5–50 ms, no faults.
    pub fn new(peers: usize, seed: u64) -> Self {
        Config {
            peers,
            seed,
            join_rate: 50.0,
            bootstrap_peers: 3,
            max_formation: Duration::from_secs(300),
            measure: Duration::from_secs(60),
            latency: Latency::Uniform { lo: Duration::from_millis(5), hi: Duration::from_millis(50) },
            loss: 0.0,
            stall_share: 0.0,
            stall: Duration::from_secs(1),
            stall_every: Duration::from_secs(60),
            churn: 0.0,
            session_median: None,
            leave_share: 0.0,
            crashes: 0,
            group_bits: 0,
            split_at: None,
            ack_requests: 0,
            gossip_interval: Duration::from_millis(500),
            gossip_fanout: 2,
            gossip_liveness: Duration::from_secs(5),
        }
    }

    /// The node's liveness timeout for these gossip settings (a silence this long is a
    /// stall): the gossip liveness plus a second of housekeeping, at least the ping
    /// interval plus timeout (1 s + 3 s).
    fn liveness_timeout(&self) -> Duration {
        (self.gossip_liveness + Duration::from_secs(1)).max(Duration::from_secs(4))
    }
}

/// Percentiles of a set of durations, in seconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Spread {
    /// Samples.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    fn of(mut xs: Vec<Duration>) -> Self {
        if xs.is_empty() {
            return Spread::default();
        }
        xs.sort_unstable();
        let at = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize].as_secs_f64();
        Spread { n: xs.len(), p50: at(0.5), p99: at(0.99), max: at(1.0) }
    }
}

/// What one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Peers at the start.
    pub peers: usize,
    /// RNG seed.
    pub seed: u64,
    /// When every peer first served (as `sigma-testnet swarm` measures formation), in
    /// seconds of virtual time (none: not within `max_formation`).
    pub serving_s: Option<f64>,
    /// When every peer served and counted every peer, and no joint quorum was pending
    /// anywhere (none: not within `max_formation`).
    pub formed_s: Option<f64>,
    /// Measured window, seconds.
    pub measured_s: f64,
    /// Bytes sent per peer and second in the measured window (mean over peers).
    pub bytes_per_peer_s: f64,
    /// The same, 99th percentile over the peers up for the whole window.
    pub bytes_per_peer_s_p99: f64,
    /// Gossip messages sent per peer and second.
    pub messages_per_peer_s: f64,
    /// Per crash and peer that had the crashed peer alive: time until its view
    /// dropped it.
    pub detection: Spread,
    /// Per crash: time until every such peer had dropped it (the crashed peer is then
    /// replaced in every client's view).
    pub detection_everywhere: Spread,
    /// Views that still held a crashed peer alive at the end (at least 30 s after the
    /// crash).
    pub undetected: usize,
    /// Peers dropped from a view while they were up (stalled or not).
    pub false_removals: u64,
    /// Peer-hours of up peers in the measured window.
    pub peer_hours: f64,
    /// False removals per 10,000 peer-hours.
    pub false_removals_per_10k_peer_hours: f64,
    /// Share of peer-time spent serving in the measured window.
    pub serving_share: f64,
    /// Records refused on merge, by reason.
    pub refused: BTreeMap<&'static str, u64>,
    /// The groups of the up peers at the end (by their own membership's group, the
    /// parent's while a split is pending there): how many, their sizes, and the peers
    /// with a split pending.
    pub groups: usize,
    /// Smallest, median and largest group at the end.
    pub group_sizes: (usize, usize, usize),
    /// Up peers with a split pending at the end.
    pub splitting: usize,
    /// The up peers' readiness at the end, by kind.
    pub readiness: BTreeMap<&'static str, usize>,
    /// Crashes, leaves and joins in the measured window.
    pub crashes: usize,
    /// Graceful leaves.
    pub leaves: usize,
    /// Newcomers.
    pub joins: usize,
    /// Events handled.
    pub events: u64,
    /// Wall-clock seconds the run took.
    pub wall_s: f64,
    /// A digest of everything above but the wall time: one seed, one digest.
    pub digest: String,
}

enum Ev {
    Round(usize),
    Tick(usize),
    Deliver(Box<Msg>),
    Join { peer: usize },
    Crash(usize),
    Disconnect { peer: usize, from: usize },
    Churn,
    SessionEnd(usize),
    StallStart(usize),
    StallEnd(usize),
    Check,
}

struct Msg {
    to: usize,
    from: usize,
    table: Rc<wire::Gossip>,
    /// Sent at, for a reply's round trip; none for a request.
    reply_to_sent: Option<Time>,
}

struct Item {
    at: Time,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Item {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Item {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not started yet.
    Idle,
    Up,
    Stalled,
    Down,
}

struct Peer {
    id: PeerId,
    /// Its prefix group ([`Config::group_bits`]).
    group: u32,
    m: Membership,
    chain: Chain,
    state: State,
    /// What arrived while stalled, handled when the stall ends.
    backlog: Vec<Msg>,
    /// Departures in this peer's view already read: up to this time, and how many at
    /// exactly that time.
    read_until: (Time, usize),
    sent_bytes: u64,
    sent_messages: u64,
    /// When it came up, and (if it did) went down.
    up_at: Time,
    down_at: Option<Time>,
    /// Time spent serving in the measured window, and since when it serves.
    serving_for: Duration,
    serving_since: Option<Time>,
}

/// A crash being detected: when, and the views still holding the peer alive.
struct Crash {
    at: Time,
    waiting: usize,
    /// When the last view so far dropped it.
    last: Time,
}

struct Sim {
    cfg: Config,
    rng: ChaCha8Rng,
    queue: BinaryHeap<Reverse<Item>>,
    seq: u64,
    now: Time,
    peers: Vec<Peer>,
    index: HashMap<PeerId, usize>,
    /// Up peers, for uniform draws.
    up: Vec<usize>,
    /// The groups started.
    founded: std::collections::HashSet<u32>,
    /// Open connections (a joining peer's to its bootstrap peers).
    links: Vec<(usize, usize)>,
    crashes: HashMap<usize, Crash>,
    detection: Vec<Duration>,
    detection_everywhere: Vec<Duration>,
    false_removals: u64,
    refused: BTreeMap<&'static str, u64>,
    formed: Option<Time>,
    serving: Option<Time>,
    /// Start and end of the measured window.
    window: (Time, Time),
    counts: (usize, usize, usize),
    events: u64,
}

/// Runs one simulation.
pub fn run(cfg: &Config) -> Report {
    let started = Instant::now();
    let mut sim = Sim::new(cfg.clone());
    sim.main_loop();
    sim.report(started.elapsed())
}

impl Sim {
    fn new(cfg: Config) -> Self {
        let rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        let far = cfg.max_formation + cfg.measure;
        let mut sim = Sim {
            cfg,
            rng,
            queue: BinaryHeap::new(),
            seq: 0,
            now: Duration::ZERO,
            peers: Vec::new(),
            index: HashMap::new(),
            up: Vec::new(),
            founded: std::collections::HashSet::new(),
            links: Vec::new(),
            crashes: HashMap::new(),
            detection: Vec::new(),
            detection_everywhere: Vec::new(),
            false_removals: 0,
            refused: BTreeMap::new(),
            formed: None,
            serving: None,
            window: (far, far),
            counts: (0, 0, 0),
            events: 0,
        };
        for i in 0..sim.cfg.peers {
            let at = Duration::from_secs_f64(i as f64 / sim.cfg.join_rate.max(0.01));
            let peer = sim.new_peer();
            sim.at(at, Ev::Join { peer });
        }
        sim.at(CHECK, Ev::Check);
        sim
    }

    /// A new peer (not started): it joins through its group's peers, or starts the
    /// group if it is the first of it.
    fn new_peer(&mut self) -> usize {
        let mut secret = [0u8; 32];
        self.rng.fill_bytes(&mut secret);
        let key = Keypair::ed25519_from_bytes(secret).expect("32 bytes are an Ed25519 secret key");
        let id = key.public().to_peer_id();
        let group = group_of(&id, self.cfg.group_bits);
        let joining = !self.founded.insert(group);
        let cfg = &self.cfg;
        // The node's takeover delay with the default lease (10 s), drift (5%: 0.5 s)
        // and these liveness settings (docs/design/membership.md).
        let delay = Duration::from_millis(10_500) + cfg.liveness_timeout() + Duration::from_secs(1);
        let incarnation = WALL_EPOCH_MS + ms(self.now);
        let m = Membership::new(joining, Duration::from_secs(600), delay, cfg.liveness_timeout())
            .with_gossip(cfg.gossip_liveness, incarnation)
            .with_hash_keys(self.rng.next_u64(), self.rng.next_u64());
        let m = match cfg.split_at {
            Some(n) => m.with_groups(id, 0, Some(n)),
            None => m,
        };
        let chain = Chain::new(key, incarnation, Some(ms(delay)));
        self.index.insert(id, self.peers.len());
        self.peers.push(Peer {
            id,
            group,
            m,
            chain,
            state: State::Idle,
            backlog: Vec::new(),
            read_until: (Duration::ZERO, 0),
            sent_bytes: 0,
            sent_messages: 0,
            up_at: Duration::ZERO,
            down_at: None,
            serving_for: Duration::ZERO,
            serving_since: None,
        });
        self.peers.len() - 1
    }

    fn at(&mut self, at: Time, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Item { at, seq: self.seq, ev }));
    }

    fn after(&mut self, d: Duration, ev: Ev) {
        self.at(self.now + d, ev);
    }

    fn main_loop(&mut self) {
        while let Some(Reverse(item)) = self.queue.pop() {
            if item.at > self.window.1 {
                break;
            }
            self.now = item.at;
            self.events += 1;
            match item.ev {
                Ev::Join { peer } => self.join(peer),
                Ev::Round(p) => self.round(p),
                Ev::Tick(p) => match self.peers[p].state {
                    State::Up => {
                        self.tick(p);
                        self.after(TICK, Ev::Tick(p));
                    }
                    // Its timer fires once it resumes.
                    State::Stalled => self.after(TICK, Ev::Tick(p)),
                    State::Idle | State::Down => {}
                },
                Ev::Deliver(msg) => self.deliver(*msg),
                Ev::Crash(p) => self.crash(p),
                Ev::Disconnect { peer, from } => self.disconnect(peer, from),
                Ev::Churn => self.churn(),
                Ev::SessionEnd(p) => self.session_end(p),
                Ev::StallStart(p) => self.stall(p),
                Ev::StallEnd(p) => self.unstall(p),
                Ev::Check => self.check(),
            }
        }
        let end = self.window.1;
        for p in &mut self.peers {
            if let Some(since) = p.serving_since.take() {
                p.serving_for += end.saturating_sub(since.max(self.window.0));
            }
        }
    }

    /// Peer `p` starts: a joining peer connects to a few random up peers of its group
    /// (with splits: to the up peers closest to its key).
    fn join(&mut self, p: usize) {
        let group = self.peers[p].group;
        let peers = &self.peers;
        let k = self.cfg.bootstrap_peers.max(1);
        let bootstrap: Vec<usize> = if self.cfg.split_at.is_some() {
            let key = KBucketKey::from(peers[p].id);
            let mut by_distance: Vec<_> =
                self.up.iter().map(|q| (key.distance(&KBucketKey::from(peers[*q].id)), *q)).collect();
            by_distance.sort_unstable();
            by_distance.into_iter().take(k).map(|(_, q)| q).collect()
        } else {
            self.up.iter().copied().filter(|q| peers[*q].group == group).choose_multiple(&mut self.rng, k)
        };
        let peer = &mut self.peers[p];
        peer.state = State::Up;
        peer.up_at = self.now;
        if !peer.m.ready() {
            for b in bootstrap {
                self.connect(p, b);
            }
            self.peers[p].m.bootstrapped();
        }
        self.up.push(p);
        self.tick(p);
        let phase = self.cfg.gossip_interval.mul_f64(self.rng.gen_range(0.0..1.0));
        self.after(phase, Ev::Round(p));
        let phase = TICK.mul_f64(self.rng.gen_range(0.0..1.0));
        self.after(phase, Ev::Tick(p));
        if self.window.0 <= self.now {
            self.maybe_stalling(p);
        }
    }

    /// Peer `p` is one of the stalling share, or not (drawn once, when the window
    /// begins or it joins during it): it then stalls once every `stall_every`.
    fn maybe_stalling(&mut self, p: usize) {
        if self.cfg.stall_share > 0.0 && self.rng.gen_bool(self.cfg.stall_share) {
            let phase = self.cfg.stall_every.mul_f64(self.rng.gen_range(0.0..1.0));
            self.after(phase, Ev::StallStart(p));
        }
    }

    fn round(&mut self, p: usize) {
        match self.peers[p].state {
            State::Up => {}
            // A stalled peer's timer fires late: the next round is due once it resumes.
            State::Stalled => return,
            State::Idle | State::Down => return,
        }
        self.after(self.cfg.gossip_interval, Ev::Round(p));
        let fanout = self.cfg.gossip_fanout;
        let now = self.now;
        let peer = &mut self.peers[p];
        // As the node: one target a member a pending joint quorum waits on, if any.
        let awaited = peer.m.awaited().copied().choose(&mut self.rng);
        let rest = fanout - usize::from(awaited.is_some());
        let mut targets: Vec<PeerId> =
            peer.m.alive().filter(|q| Some(**q) != awaited).copied().choose_multiple(&mut self.rng, rest);
        targets.extend(awaited);
        if targets.is_empty() {
            return;
        }
        let peer = &mut self.peers[p];
        let (_, counter) = peer.m.beat();
        let proof = peer.chain.proof(counter);
        let table = Rc::new(peer.m.table(peer.id, proof.clone(), now, None, &[]));
        let asked: Vec<PeerId> = match self.cfg.ack_requests {
            0 => Vec::new(),
            k => peer.m.awaited().filter(|q| !targets.contains(q)).copied().choose_multiple(&mut self.rng, k),
        };
        // Written only when someone is asked.
        let ask = (!asked.is_empty()).then(|| Rc::new(peer.m.ack_request(peer.id, proof)));
        for t in targets {
            let to = self.index[&t];
            self.send(p, to, table.clone(), None);
        }
        for (t, ask) in asked.into_iter().zip(ask.into_iter().cycle()) {
            let to = self.index[&t];
            self.send(p, to, ask, None);
        }
    }

    fn send(&mut self, from: usize, to: usize, table: Rc<wire::Gossip>, reply_to_sent: Option<Time>) {
        let bytes = cbor_len(&table);
        let in_window = self.in_window();
        let peer = &mut self.peers[from];
        if in_window {
            peer.sent_bytes += bytes;
            peer.sent_messages += 1;
        }
        if self.rng.gen_bool(self.cfg.loss) {
            return;
        }
        let latency = self.cfg.latency.sample(&mut self.rng);
        self.after(latency, Ev::Deliver(Box::new(Msg { to, from, table, reply_to_sent })));
    }

    fn deliver(&mut self, msg: Msg) {
        let to = msg.to;
        match self.peers[to].state {
            State::Up => {}
            State::Stalled => {
                self.peers[to].backlog.push(msg);
                return;
            }
            State::Idle | State::Down => return,
        }
        let now = self.now;
        let wall = WALL_EPOCH_MS + ms(now);
        let from_id = self.peers[msg.from].id;
        // A request's transit is not known to its receiver: the node takes the
        // connection's last ping round trip; here, twice the mean latency.
        let (transit, echo) = match msg.reply_to_sent {
            Some(sent) => (now.saturating_sub(sent), None),
            None => (2 * self.cfg.latency.mean(), Some(self.peers[to].m.next_exchange())),
        };
        let peer = &mut self.peers[to];
        let local = peer.id;
        let merged = peer.m.merge(&local, from_id, &msg.table, Arrival { transit, echo }, now, wall);
        for why in &merged.refused {
            *self.refused.entry(why.as_str()).or_default() += 1;
        }
        self.tick(to);
        if let Some(exchange) = echo {
            let peer = &mut self.peers[to];
            let proof = peer.chain.proof(peer.m.own_beat().1);
            let table = Rc::new(peer.m.reply(peer.id, proof, now, &msg.table, exchange));
            self.send(to, msg.from, table, Some(now));
        }
    }

    /// The housekeeping tick of peer `p`, then the departures it recorded.
    fn tick(&mut self, p: usize) {
        let now = self.now;
        let peer = &mut self.peers[p];
        peer.m.tick(now);
        match (peer.serving_since, peer.m.serving()) {
            (None, true) => peer.serving_since = Some(now),
            (Some(since), false) => {
                peer.serving_for += now.saturating_sub(since.max(self.window.0));
                peer.serving_since = None;
            }
            _ => {}
        }
        let (until, seen) = peer.read_until;
        let departures = peer.m.recent_departures();
        let mut fresh = Vec::new();
        let mut at_until = 0;
        for (who, t) in departures {
            if *t < until {
                continue;
            }
            if *t == until {
                at_until += 1;
                if at_until <= seen {
                    continue;
                }
            }
            fresh.push((*who, *t));
        }
        if let Some((_, last)) = fresh.last() {
            let n = departures.iter().filter(|(_, t)| t == last).count();
            peer.read_until = (*last, n);
        }
        for (who, t) in fresh {
            self.departed(who, t);
        }
    }

    /// A view dropped `who` at `t`.
    fn departed(&mut self, who: PeerId, t: Time) {
        let Some(&x) = self.index.get(&who) else { return };
        match self.peers[x].state {
            State::Up | State::Stalled => {
                if self.in_window() {
                    self.false_removals += 1;
                }
            }
            State::Down | State::Idle => {
                if let Some(c) = self.crashes.get_mut(&x) {
                    self.detection.push(t.saturating_sub(c.at));
                    c.last = t;
                    if c.waiting == 1 {
                        self.detection_everywhere.push(t.saturating_sub(c.at));
                    }
                    c.waiting = c.waiting.saturating_sub(1);
                }
            }
        }
    }

    fn go_down(&mut self, p: usize) {
        let now = self.now;
        // Crashes this peer's view still held alive: one view fewer to wait for.
        for (x, c) in self.crashes.iter_mut() {
            if c.waiting > 0 && self.peers[p].m.is_alive(&self.peers[*x].id) {
                c.waiting -= 1;
                if c.waiting == 0 {
                    self.detection_everywhere.push(c.last.saturating_sub(c.at));
                }
            }
        }
        let peer = &mut self.peers[p];
        peer.state = State::Down;
        peer.down_at = Some(now);
        peer.backlog.clear();
        if let Some(since) = peer.serving_since.take() {
            peer.serving_for += now.saturating_sub(since.max(self.window.0));
        }
        self.up.retain(|q| *q != p);
    }

    fn crash(&mut self, p: usize) {
        if !matches!(self.peers[p].state, State::Up | State::Stalled) {
            return;
        }
        self.go_down(p);
        self.counts.0 += 1;
        let id = self.peers[p].id;
        let waiting = self.up.iter().filter(|q| self.peers[**q].m.is_alive(&id)).count();
        self.crashes.insert(p, Crash { at: self.now, waiting, last: self.now });
        // Its connections die when their pings time out (the node's 1 s interval and
        // 3 s timeout).
        for q in self.links_of(p) {
            let after = Duration::from_millis(self.rng.gen_range(3_000..=4_000));
            self.after(after, Ev::Disconnect { peer: q, from: p });
        }
    }

    /// Peers `a` and `b` connect (a joining peer to a bootstrap peer): each is alive
    /// to the other while connected, as in the node.
    fn connect(&mut self, a: usize, b: usize) {
        let now = self.now;
        let (ia, ib) = (self.peers[a].id, self.peers[b].id);
        self.peers[a].m.connected(ib, now);
        self.peers[b].m.connected(ia, now);
        self.links.push((a, b));
    }

    /// The peers connected to `p`.
    fn links_of(&self, p: usize) -> Vec<usize> {
        self.links
            .iter()
            .filter_map(|&(a, b)| {
                if a == p {
                    Some(b)
                } else if b == p {
                    Some(a)
                } else {
                    None
                }
            })
            .collect()
    }

    /// `peer`'s connection to `from` closed.
    fn disconnect(&mut self, peer: usize, from: usize) {
        self.links.retain(|&(a, b)| (a, b) != (peer, from) && (a, b) != (from, peer));
        let (now, id) = (self.now, self.peers[from].id);
        if matches!(self.peers[peer].state, State::Up | State::Stalled) {
            self.peers[peer].m.disconnected(id, now);
            self.tick(peer);
        }
    }

    fn leave(&mut self, p: usize) {
        if self.peers[p].state != State::Up {
            return;
        }
        let now = self.now;
        let peer = &mut self.peers[p];
        peer.m.leave();
        peer.m.tick(now);
        let targets: Vec<PeerId> = peer.m.alive().copied().choose_multiple(&mut self.rng, LEAVE_FANOUT);
        if let Some(leave) = self.peers[p].chain.leave() {
            let table = Rc::new(wire::Gossip::leave_only(leave));
            for t in targets {
                let to = self.index[&t];
                self.send(p, to, table.clone(), Some(now));
            }
        }
        self.go_down(p);
        for q in self.links_of(p) {
            self.disconnect(q, p);
        }
        self.counts.1 += 1;
    }

    fn churn(&mut self) {
        if let Some(&victim) = self.up.choose(&mut self.rng) {
            self.depart(victim);
        }
        self.newcomer();
        let gap = exp(&mut self.rng, 1.0 / self.cfg.churn);
        self.after(gap, Ev::Churn);
    }

    /// Peer `p` departs: a graceful leave for `leave_share` of the departures, else a
    /// crash.
    fn depart(&mut self, p: usize) {
        if self.rng.gen_bool(self.cfg.leave_share) {
            self.leave(p);
        } else {
            self.crash(p);
        }
    }

    /// A new peer joins (churn), with a session of its own if sessions are drawn.
    fn newcomer(&mut self) {
        let peer = self.new_peer();
        self.counts.2 += 1;
        self.join(peer);
        self.draw_session(peer);
    }

    fn draw_session(&mut self, p: usize) {
        if let Some(median) = self.cfg.session_median {
            // Weibull, shape k = 1/2: scale = median / ln(2)^(1/k).
            let scale = median.as_secs_f64() / std::f64::consts::LN_2.powi(2);
            let u: f64 = self.rng.gen_range(f64::EPSILON..1.0);
            self.after(Duration::from_secs_f64(scale * (-u.ln()).powi(2)), Ev::SessionEnd(p));
        }
    }

    fn session_end(&mut self, p: usize) {
        if matches!(self.peers[p].state, State::Up | State::Stalled) {
            self.depart(p);
            self.newcomer();
        }
    }

    fn stall(&mut self, p: usize) {
        if self.peers[p].state != State::Up {
            return;
        }
        self.peers[p].state = State::Stalled;
        self.after(self.cfg.stall, Ev::StallEnd(p));
    }

    fn unstall(&mut self, p: usize) {
        if self.peers[p].state != State::Stalled {
            return;
        }
        self.peers[p].state = State::Up;
        for msg in std::mem::take(&mut self.peers[p].backlog) {
            self.deliver(msg);
        }
        self.tick(p);
        self.after(Duration::ZERO, Ev::Round(p));
        let next = self.cfg.stall_every.saturating_sub(self.cfg.stall);
        self.after(next, Ev::StallStart(p));
    }

    /// Peer `p`'s group: its membership's (the parent's while a split is pending
    /// there), as (depth, prefix); or the fixed one of [`Config::group_bits`].
    fn group_key(&self, p: usize) -> (u8, u32) {
        let peer = &self.peers[p];
        match peer.m.group() {
            Some(g) => {
                let depth = g.depth - u8::from(g.splitting);
                (depth, group_of(&peer.id, u32::from(depth)))
            }
            None => (self.cfg.group_bits as u8, peer.group),
        }
    }

    /// Up peers per group ([`Sim::group_key`]).
    fn group_sizes(&self) -> HashMap<(u8, u32), usize> {
        let mut sizes = HashMap::new();
        for p in &self.up {
            *sizes.entry(self.group_key(*p)).or_default() += 1;
        }
        sizes
    }

    fn in_window(&self) -> bool {
        self.window.0 <= self.now && self.now < self.window.1
    }

    /// Until formation: whether every started peer serves and counts every peer; at
    /// formation (or when it is given up), the measured window begins.
    fn check(&mut self) {
        if self.formed.is_some() || self.window.0 <= self.now {
            return;
        }
        let n = self.cfg.peers;
        let all_up = self.up.len() == n;
        if self.serving.is_none() && all_up && self.up.iter().all(|p| self.peers[*p].m.serving()) {
            self.serving = Some(self.now);
        }
        let sizes = self.group_sizes();
        let formed = self.serving.is_some()
            && self.up.iter().all(|p| {
                let (m, size) = (&self.peers[*p].m, sizes[&self.group_key(*p)]);
                m.serving()
                    && m.members() == size
                    && m.reachable() + 1 == size
                    && m.joints_pending() == 0
                    && m.group().is_none_or(|g| !g.splitting)
            });
        if formed {
            self.formed = Some(self.now);
        }
        if formed || self.now >= self.cfg.max_formation {
            self.begin_window();
        } else {
            self.after(CHECK, Ev::Check);
        }
    }

    fn begin_window(&mut self) {
        let now = self.now;
        self.window = (now, now + self.cfg.measure);
        for p in self.up.clone() {
            let peer = &mut self.peers[p];
            if peer.serving_since.is_some() {
                peer.serving_since = Some(now);
            }
            self.maybe_stalling(p);
        }
        if self.cfg.churn > 0.0 {
            let gap = exp(&mut self.rng, 1.0 / self.cfg.churn);
            self.after(gap, Ev::Churn);
        }
        for p in self.up.clone() {
            self.draw_session(p);
        }
        let victims: Vec<usize> = self.up.choose_multiple(&mut self.rng, self.cfg.crashes).copied().collect();
        let k = victims.len() as f64;
        for (i, victim) in victims.into_iter().enumerate() {
            let at = self.cfg.measure.mul_f64((i as f64 + 0.5) / (k + 1.0));
            self.after(at, Ev::Crash(victim));
        }
    }

    fn report(self, wall: Duration) -> Report {
        let (start, end) = self.window;
        let measured = end.saturating_sub(start);
        let secs = measured.as_secs_f64().max(1e-9);
        let mut rates = Vec::new();
        let (mut bytes, mut messages, mut peer_time, mut serving) = (0u64, 0u64, Duration::ZERO, Duration::ZERO);
        for p in &self.peers {
            bytes += p.sent_bytes;
            messages += p.sent_messages;
            serving += p.serving_for;
            let from = p.up_at.max(start);
            let to = p.down_at.unwrap_or(end).min(end);
            if p.state != State::Idle && to > from {
                peer_time += to - from;
            }
            if p.up_at <= start && p.down_at.is_none() {
                rates.push(p.sent_bytes as f64 / secs);
            }
        }
        rates.sort_by(f64::total_cmp);
        let p99 = rates.get(((rates.len().max(1) - 1) as f64 * 0.99).round() as usize).copied().unwrap_or(0.0);
        let per_peer_s = |x: u64| x as f64 / peer_time.as_secs_f64().max(1e-9);
        let peer_hours = peer_time.as_secs_f64() / 3600.0;
        let undetected = self
            .crashes
            .values()
            .filter(|c| end.saturating_sub(c.at) >= Duration::from_secs(30))
            .map(|c| c.waiting)
            .sum();
        let mut sizes: Vec<usize> = self.group_sizes().into_values().collect();
        sizes.sort_unstable();
        let group_sizes = match (sizes.first(), sizes.last()) {
            (Some(lo), Some(hi)) => (*lo, sizes[sizes.len() / 2], *hi),
            _ => (0, 0, 0),
        };
        let splitting = self.up.iter().filter(|p| self.peers[**p].m.group().is_some_and(|g| g.splitting)).count();
        let mut report = Report {
            peers: self.cfg.peers,
            seed: self.cfg.seed,
            serving_s: self.serving.map(|t| t.as_secs_f64()),
            formed_s: self.formed.map(|t| t.as_secs_f64()),
            measured_s: measured.as_secs_f64(),
            bytes_per_peer_s: per_peer_s(bytes),
            bytes_per_peer_s_p99: p99,
            messages_per_peer_s: per_peer_s(messages),
            detection: Spread::of(self.detection),
            detection_everywhere: Spread::of(self.detection_everywhere),
            undetected,
            false_removals: self.false_removals,
            peer_hours,
            false_removals_per_10k_peer_hours: self.false_removals as f64 / peer_hours.max(1e-9) * 1e4,
            serving_share: serving.as_secs_f64() / peer_time.as_secs_f64().max(1e-9),
            refused: self.refused.clone(),
            groups: sizes.len(),
            group_sizes,
            splitting,
            readiness: self.up.iter().fold(BTreeMap::new(), |mut map, p| {
                *map.entry(self.peers[*p].m.readiness().as_str()).or_default() += 1;
                map
            }),
            crashes: self.counts.0,
            leaves: self.counts.1,
            joins: self.counts.2,
            events: self.events,
            wall_s: 0.0,
            digest: String::new(),
        };
        let json = serde_json::to_string(&report).unwrap_or_default();
        report.digest = format!("{:016x}", fnv1a(json.as_bytes()));
        report.wall_s = wall.as_secs_f64();
        report
    }
}

/// The first `bits` bits of `peer`'s Kademlia key.
pub fn group_of(peer: &PeerId, bits: u32) -> u32 {
    if bits == 0 {
        return 0;
    }
    let key = libp2p::kad::KBucketKey::from(*peer);
    let top = u32::from_be_bytes(key.hashed_bytes()[..4].try_into().expect("a SHA-256 digest has 4 bytes"));
    top >> (32 - bits.min(32))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn exp(rng: &mut ChaCha8Rng, mean_s: f64) -> Duration {
    let u: f64 = rng.gen_range(f64::EPSILON..1.0);
    Duration::from_secs_f64(-u.ln() * mean_s)
}

fn cbor_len(table: &wire::Gossip) -> u64 {
    cbor4ii::serde::to_vec(Vec::new(), table).map_or(0, |v| v.len() as u64)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// One goal of the membership at scale: what it measures, the figure, the bound, met.
#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    /// What is measured.
    pub what: &'static str,
    /// The figure printed.
    pub figure: String,
    /// The goal, as docs/benchmarks.md states it.
    pub goal: &'static str,
    /// Whether the figure meets it.
    pub met: bool,
}

/// The report's figures against the goals (docs/benchmarks.md, "Membership in virtual time").
pub fn goals(r: &Report) -> Vec<Goal> {
    let (bound, goal) = if r.peers <= 1_000 {
        (1_000.0, "≤ 1 KB/s a peer at 1,000 peers")
    } else {
        (1_500.0, "≤ 1.5 KB/s a peer at 10,000 peers")
    };
    let d = &r.detection_everywhere;
    vec![
        Goal {
            what: "membership traffic",
            figure: format!("{:.1} KB/s a peer (p99 {:.1})", r.bytes_per_peer_s / 1e3, r.bytes_per_peer_s_p99 / 1e3),
            goal,
            met: r.bytes_per_peer_s <= bound,
        },
        Goal {
            what: "crashed peer out of every view",
            figure: if d.n == 0 {
                "no crash".into()
            } else {
                format!("p50 {:.1} s, p99 {:.1} s ({} crashes, {} views never)", d.p50, d.p99, d.n, r.undetected)
            },
            goal: "p50 ≤ 2 s, p99 ≤ 5 s",
            met: d.n > 0 && d.p50 <= 2.0 && d.p99 <= 5.0 && r.undetected == 0,
        },
        Goal {
            what: "false removals",
            figure: format!(
                "{} in {:.1} peer-hours (≤ {:.1} per 10,000 at 95%)",
                r.false_removals,
                r.peer_hours,
                poisson_upper_95(r.false_removals) / r.peer_hours.max(1e-9) * 1e4
            ),
            goal: "≤ 1 per 10,000 peer-hours",
            // Shown only when the run is long enough to bound the rate: none seen in
            // fewer than 30,000 peer-hours proves nothing.
            met: poisson_upper_95(r.false_removals) / r.peer_hours.max(1e-9) * 1e4 <= 1.0,
        },
        Goal {
            what: "formation (every peer serving)",
            figure: match (r.serving_s, r.formed_s) {
                (None, _) => "not formed".into(),
                (Some(s), None) => format!("{s:.1} s (views not all complete)"),
                (Some(s), Some(f)) => format!("{s:.1} s (every view complete {f:.1} s)"),
            },
            goal: "≤ 60 s at 10,000 peers",
            met: r.serving_s.is_some_and(|s| s <= 60.0),
        },
    ]
}

/// The one-sided 95% upper bound of a Poisson mean after `k` events (Wilson and
/// Hilferty's approximation; 3.0 for none).
fn poisson_upper_95(k: u64) -> f64 {
    let n = k as f64 + 1.0;
    n * (1.0 - 1.0 / (9.0 * n) + 1.645 / (3.0 * n.sqrt())).powi(3)
}

/// The report as the command prints it.
pub fn summary(r: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "membership: {} peers, seed {}, {:.0} s measured; {} crashes, {} leaves, {} joins; serving {:.1}% of \
         peer-time; {:.1} messages a peer a second; refused {:?}; at the end {:?}",
        r.peers,
        r.seed,
        r.measured_s,
        r.crashes,
        r.leaves,
        r.joins,
        100.0 * r.serving_share,
        r.messages_per_peer_s,
        r.refused,
        r.readiness
    );
    let _ = writeln!(
        out,
        "groups at the end: {} (sizes min {}, p50 {}, max {}), {} peers with a split pending",
        r.groups, r.group_sizes.0, r.group_sizes.1, r.group_sizes.2, r.splitting
    );
    let _ = writeln!(
        out,
        "detection per view: p50 {:.1} s, p99 {:.1} s, max {:.1} s ({} samples)",
        r.detection.p50, r.detection.p99, r.detection.max, r.detection.n
    );
    for g in goals(r) {
        let _ = writeln!(
            out,
            "{:<32} {:<56} goal {:<36} {}",
            g.what,
            g.figure,
            g.goal,
            if g.met { "met" } else { "MISSED" }
        );
    }
    let _ = writeln!(out, "digest {} ({} events, {:.1} s of wall time)", r.digest, r.events, r.wall_s);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(seed: u64) -> Config {
        let mut cfg = Config::new(24, seed);
        cfg.measure = Duration::from_secs(30);
        cfg.max_formation = Duration::from_secs(120);
        cfg.crashes = 3;
        cfg
    }

    #[test]
    fn one_seed_gives_one_digest() {
        let (a, b, c) = (run(&small(7)), run(&small(7)), run(&small(8)));
        assert_eq!(a.digest, b.digest, "seed 7 twice: {a:?} / {b:?}");
        assert_ne!(a.digest, c.digest, "seeds 7 and 8 gave the same run");
    }

    /// The node's rules in the simulator: every peer serves, a crashed peer leaves
    /// every view within the gossip liveness plus the once-a-second aging (and the
    /// ages' transit), and no live peer is dropped, with 1% loss and stalls of a
    /// second, well inside the liveness window.
    #[test]
    fn crashes_leave_every_view_and_no_live_peer_is_dropped() {
        for seed in 1..=2 {
            let mut cfg = small(seed);
            cfg.loss = 0.01;
            cfg.stall_share = 0.5;
            cfg.stall_every = Duration::from_secs(10);
            let r = run(&cfg);
            assert!(r.serving_s.is_some(), "seed {seed}: never formed: {r:?}");
            assert_eq!(r.crashes, 3, "seed {seed}");
            assert_eq!(r.detection_everywhere.n, 3, "seed {seed}: {r:?}");
            assert_eq!(r.undetected, 0, "seed {seed}");
            let bound = (cfg.gossip_liveness + Duration::from_secs(2)).as_secs_f64();
            assert!(r.detection_everywhere.max <= bound, "seed {seed}: {:?} past {bound} s", r.detection_everywhere);
            assert!(r.detection.p50 >= cfg.gossip_liveness.as_secs_f64() - 1.0, "seed {seed}: faster than the window");
            assert_eq!(r.false_removals, 0, "seed {seed}");
            assert!(r.refused.keys().all(|k| *k == "beat_out_of_range"), "seed {seed}: {:?}", r.refused);
            assert!(r.bytes_per_peer_s > 0.0);
        }
    }

    /// Sessions end, each departure replaced by a newcomer that joins; half the
    /// departures are graceful leaves, and a leave is no false removal. (With a
    /// departure a second in 24 peers, a peer may be between joint quorums at the end.)
    #[test]
    fn sessions_end_and_newcomers_take_their_place() {
        let mut cfg = small(4);
        cfg.crashes = 0;
        cfg.session_median = Some(Duration::from_secs(30));
        cfg.leave_share = 0.5;
        let r = run(&cfg);
        assert!(r.crashes > 0 && r.leaves > 0, "{r:?}");
        assert_eq!(r.joins, r.crashes + r.leaves, "{r:?}");
        assert_eq!(r.false_removals, 0, "{r:?}");
        assert!(!r.readiness.contains_key("joining"), "every newcomer joined: {r:?}");
        assert!(r.serving_share > 0.9, "{r:?}");
    }

    /// The membership's own splits: a swarm started as one group ends in several, every
    /// split ended, every view complete (its group's size), crashes detected, and no live
    /// peer dropped; the same seed replays.
    #[test]
    fn groups_split_by_the_membership_form_and_detect_crashes() {
        let mut cfg = small(5);
        cfg.peers = 48;
        cfg.split_at = Some(6);
        cfg.max_formation = Duration::from_secs(300);
        let r = run(&cfg);
        assert!(r.groups >= 2, "no split: {r:?}");
        // Each half held 6 counted members when it split; 3 crashes since.
        assert!(r.group_sizes.0 >= 6 - 3, "a group below the split threshold: {r:?}");
        assert_eq!(r.splitting, 0, "{r:?}");
        assert!(r.formed_s.is_some(), "views never complete: {r:?}");
        assert_eq!(r.detection_everywhere.n, 3, "{r:?}");
        assert_eq!(r.undetected, 0, "{r:?}");
        assert_eq!(r.false_removals, 0, "{r:?}");
        assert_eq!(run(&cfg).digest, r.digest);
    }

    #[test]
    fn a_rate_is_bounded_only_by_enough_hours() {
        assert!((poisson_upper_95(0) - 3.0).abs() < 0.05, "{}", poisson_upper_95(0));
        assert!((poisson_upper_95(10) - 16.96).abs() < 0.1, "{}", poisson_upper_95(10));
    }

    /// Stalls longer than the liveness window do drop the stalled peer (the check
    /// above can fail).
    #[test]
    fn stalls_past_the_window_are_removals() {
        let mut cfg = small(3);
        cfg.crashes = 0;
        cfg.stall_share = 0.3;
        cfg.stall = Duration::from_secs(8);
        cfg.stall_every = Duration::from_secs(15);
        let r = run(&cfg);
        assert!(r.false_removals > 0, "{r:?}");
    }
}
