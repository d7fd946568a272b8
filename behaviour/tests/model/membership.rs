//! The membership model: a swarm of peers over the real serving rule
//! (`sigma_behaviour::membership::Membership`) and the real core (`proto::Client`,
//! `proto::Replica`). See the module doc of `tests/model_membership.rs` for the model.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Write as _;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, Instant};

use libp2p::identity::Keypair;
use libp2p::kad::KBucketKey;
use libp2p::PeerId;
use sigma_behaviour::liveness::{Chain, Proof};
use sigma_behaviour::membership::{Membership, Readiness, Record};
use sigma_behaviour::proto::client::View;
use sigma_behaviour::proto::{
    Client, ClientError, Config, Event, LamportClock, Phase, Replica, ReplicaError, Response, Time, Timestamp,
    ToReplica,
};
use sigma_behaviour::wire;

type Id = u32;
type Ts = Timestamp<Id>;

/// Lease granted by a replica (as in `tests/model/checker.rs`).
pub const LEASE: Duration = Duration::from_secs(3);
const REQUEST_TIMEOUT: Duration = Duration::from_millis(500);

/// The liveness timeout: a peer notices a lost peer (a cut, a kill) within it, and
/// meets a peer it can reach (a join, a heal: a connection, or its heartbeat relayed)
/// within it.
pub const LIVENESS: Duration = Duration::from_secs(1);

/// The behaviour's timer slack (`MAX_TIMER`), part of the takeover delay's margin.
const MAX_TIMER: Duration = Duration::from_secs(1);

/// When the model begins: the initial peers have served since time 0, so the
/// takeover delay of their start is over.
pub const START: Duration = Duration::from_secs(10);

/// Longer than any run: nobody is forgotten, no event loop stalls.
const HOUR: Duration = Duration::from_secs(3600);

/// Heartbeat incarnations are milliseconds of a wall clock; the model's begin here.
const WALL_MS: u64 = 1_700_000_000_000;

/// The lock whose replica keys `"R:1"`, `"R:2"`, ... the model places.
pub const LOCK: &str = "R";

/// Most peers (bits of a `u8`).
pub const MAX_PEERS: usize = 5;
/// Most incarnations of one peer (its first start and its restarts).
const MAX_INCARNATIONS: usize = 4;

/// The core's configuration (as `tests/model/checker.rs`: lease 3 s, renewals every
/// second, coarse retries).
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
        .with_idle_ttl(Duration::from_secs(1))
        .with_state_bounds(64, 256)
}

/// The behaviour's default formula (`Config::takeover_delay`): the lease stretched by
/// the drift bound, the liveness timeout, the timer's slack.
pub fn takeover_delay(cfg: &Config) -> Duration {
    LEASE + LEASE.mul_f64(f64::from(cfg.max_drift_ppm()) / 1e6) + LIVENESS + MAX_TIMER
}

/// A planted fault of membership, to show that the invariant catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Rule 1 broken: a peer counts every newcomer, majority or not
    /// (`Membership::with_fault_counting_every_newcomer`).
    CountNewcomersWithoutMajority,
    /// Rule 2 broken (in the model's glue): a joining peer joins through a connected
    /// peer that does not serve.
    JoinThroughAnyPeer,
    /// Rule 4 broken (`Bounds::acks`): one ack of the view a newcomer joined is enough.
    OneAck,
}

/// What the search explores.
#[derive(Clone, Debug)]
pub struct Bounds {
    /// Replicas of the lock and its quorum.
    pub n: usize,
    pub m: usize,
    /// Peers started, meshed and serving at the beginning (0, 1, ...).
    pub initial: usize,
    /// Peer slots in all (initial + those that may join later), at most [`MAX_PEERS`].
    pub peers: usize,
    /// Client c acquires through peer `homes[c]` (never killed).
    pub homes: Vec<u8>,
    /// Actions from the initial state.
    pub depth: usize,
    /// Partitions in all (a cut separates a set of peer slots from the others).
    pub cuts: u8,
    /// The sets a cut may isolate (bit i: slot i; all when empty).
    pub cut_sets: Vec<u8>,
    pub heals: u8,
    /// Kills in all (a killed peer's state is gone; it may join again: a restart).
    pub kills: u8,
    /// Joins in all: a new peer, or a killed one restarting, with a bootstrap peer.
    pub joins: u8,
    /// Early meetings in all (a reachable peer met before the liveness timeout).
    pub meets: u8,
    pub releases: u8,
    /// New acquisitions in all, by a client whose last one is over (lost or released).
    pub again: u8,
    /// Allow what ARCHITECTURE.md's guarantee assumes away: a join while a peer has
    /// not yet noticed a cut (or a kill), and a cut while a joined peer is not yet met
    /// by every peer it can reach (joins in the liveness timeout before the cut is
    /// noticed).
    pub gap: bool,
    /// Candidate rule 4, in the model only: a newcomer counts (at every peer, and for
    /// itself) only once members forming a strict majority of the view it joined (the
    /// serving peer it first joined through and that peer's members) have listed it in
    /// a table sent while they served. Until then a peer lists it (met) but does not
    /// tell its `Membership` (not alive, counted by nobody), and the newcomer does not
    /// take a table (stays joining). Acks travel in tables: a peer hears the ack sets
    /// of a peer it met and reaches within the liveness timeout (`hears` early).
    pub acks: bool,
    /// Early table deliveries in all (a peer hears another's table before the liveness
    /// timeout: what it counts, for the joint quorum, and with rule 4 its acks).
    pub hears: u8,
    /// The joint quorum, as `Membership` builds it (on unless turned off with
    /// `Membership::without_joint_quorum`): a peer that counts a newcomer x by rule 1
    /// serves only while it also reaches a strict majority of the members it counted
    /// just before x, until each of them is known, from a table heard from that peer
    /// itself (`Hear`, through `Membership::counted_by`), to count x.
    pub joint: bool,
    pub fault: Option<Fault>,
    /// The adversary (cuts, heals, kills, joins) and the applications (releases) act
    /// at the first quiescent point of each slot of this length.
    pub slot: Duration,
    /// The adversary acts (cuts, heals, kills, joins) only before this time; the
    /// applications (releases, new acquisitions) at any slot.
    pub until: Duration,
    /// The peers a join may name as its bootstrap peer (bit per slot; 0: any).
    pub boots: u8,
}

impl Bounds {
    /// n replicas, quorum m, `initial` peers of `peers` slots, two clients at peers 0
    /// and 1; no adversary.
    pub fn new(n: usize, m: usize, initial: usize, peers: usize) -> Self {
        Bounds {
            n,
            m,
            initial,
            peers,
            homes: vec![0, 1],
            depth: 60,
            cuts: 0,
            cut_sets: Vec::new(),
            heals: 0,
            kills: 0,
            joins: 0,
            meets: 0,
            releases: 0,
            again: 0,
            gap: false,
            acks: false,
            hears: 0,
            joint: true,
            fault: None,
            slot: Duration::from_millis(500),
            boots: 0,
            until: HOUR,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    /// Deterministic: the earliest deadline (a client's or a replica's timer, a notice
    /// or a meeting due) is reached, then every message is delivered.
    Step,
    /// The slots of the mask are cut off from the others.
    Cut(u8),
    Heal,
    /// A peer notices every peer it lost, before its deadline.
    Notice(u8),
    /// Two reachable peers meet, before their deadline.
    Meet(u8, u8),
    Kill(u8),
    /// A peer (new, or killed before) starts with this bootstrap peer.
    Join(u8, u8),
    Release(u8),
    /// Rule 4: the first peer hears the second's table (its acks), before its deadline.
    Hear(u8, u8),
    /// The client starts a new acquisition (its last one is over).
    Again(u8),
}

/// A replica hosted by a peer.
#[derive(Clone)]
struct Hosted {
    replica: Replica<Id>,
    /// Created while another peer on this side hosted the key: a host overlap.
    overlap: bool,
}

#[derive(Clone)]
struct Peer {
    up: bool,
    /// Starts so far (0: never started).
    incarnation: u8,
    membership: Membership,
    /// Peers this one has met and not noticed lost (bit per slot).
    conn: u8,
    replicas: BTreeMap<u8, Hosted>,
    /// Rule 4: `acks[x]`, the peers known here to have listed newcomer x while serving.
    acks: [u8; MAX_PEERS],
    /// Rule 4: met peers this one's `Membership` was told of (`connected`).
    told: u8,
}

/// Where a grant came from (ghost state for the oracle).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Origin {
    Host {
        peer: u8,
        overlap: bool,
    },
    /// Two hosts issued the same grant (same owner, same stamp): unknown.
    Ambiguous,
}

#[derive(Clone, Copy, Debug, Default, Hash)]
struct Used {
    cuts: u8,
    heals: u8,
    kills: u8,
    joins: u8,
    meets: u8,
    releases: u8,
    again: u8,
    hears: u8,
}

enum Msg {
    Up { client: u8, key: u8, host: u8, msg: ToReplica<Id> },
    Down { host: u8, key: u8, client: u8, r: Response<Id>, notice: bool },
}

#[derive(Clone)]
struct State {
    now: Time,
    peers: Vec<Peer>,
    clients: Vec<Client<Id>>,
    /// The isolated slots (0: no cut).
    cut: u8,
    /// `(p, q)` → when p must have noticed that it lost q.
    lost: BTreeMap<(u8, u8), Time>,
    /// `{p, q}` (p < q) → when they meet at the latest, and whether a join made them
    /// reachable.
    meet: BTreeMap<(u8, u8), (Time, bool)>,
    grants: BTreeMap<(u8, Ts, u64), Origin>,
    /// Rule 4: the view each newcomer joined (bit per slot; 0: not yet).
    views: [u8; MAX_PEERS],
    /// Rule 4: `(p, q)` → when p hears q's table (with acks p lacks) at the latest.
    gossip: BTreeMap<(u8, u8), Time>,
    used: Used,
    /// The instant the adversary may act at (the first quiescent point of a slot).
    adversary_at: Option<Time>,
    /// Per peer, the fingerprints of its membership and of its replicas (refreshed
    /// for the peers an action touched).
    fp_peers: Vec<(u128, u128)>,
    /// Peers whose replicas the action changed.
    touched: u8,
    /// Peers whose membership the action changed (their housekeeping runs).
    touched_m: u8,
}

/// The checker's fixed inputs.
struct Model {
    b: Bounds,
    cfg: Config,
    delay: Duration,
    ids: Vec<PeerId>,
    keys: Vec<KBucketKey<PeerId>>,
    replica_keys: Vec<KBucketKey<Vec<u8>>>,
    /// `rank[k][p]`: peer p's place by distance to key k (0 closest).
    rank: Vec<Vec<u8>>,
    /// `proofs[p][i]`: the proof of beat 1 of peer p's incarnation i + 1.
    proofs: Vec<Vec<Proof>>,
}

fn incarnation_ms(i: u8) -> u64 {
    WALL_MS + 1000 * u64::from(i)
}

impl Model {
    fn new(b: &Bounds) -> Self {
        assert!(b.peers <= MAX_PEERS && b.initial <= b.peers && b.homes.iter().all(|&h| (h as usize) < b.initial));
        let cfg = config(b.n, b.m);
        cfg.validate().expect("model configuration is valid");
        let keys_pairs: Vec<Keypair> =
            (0..b.peers).map(|i| Keypair::ed25519_from_bytes([i as u8 + 1; 32]).expect("32 bytes")).collect();
        let ids: Vec<PeerId> = keys_pairs.iter().map(|k| k.public().to_peer_id()).collect();
        let keys: Vec<KBucketKey<PeerId>> = ids.iter().map(|p| KBucketKey::from(*p)).collect();
        let replica_keys: Vec<KBucketKey<Vec<u8>>> =
            (0..b.n).map(|i| KBucketKey::new(wire::replica_name(LOCK, i as u16).into_bytes())).collect();
        let rank = replica_keys
            .iter()
            .map(|k| {
                let mut order: Vec<usize> = (0..b.peers).collect();
                order.sort_by_key(|&p| keys[p].distance(k));
                let mut rank = vec![0u8; b.peers];
                for (r, p) in order.into_iter().enumerate() {
                    rank[p] = r as u8;
                }
                rank
            })
            .collect();
        let proofs = keys_pairs
            .iter()
            .map(|k| {
                (1..=MAX_INCARNATIONS as u8)
                    .map(|i| Chain::new(k.clone(), incarnation_ms(i), None).proof(1).expect("a proof"))
                    .collect()
            })
            .collect();
        Model { b: b.clone(), delay: takeover_delay(&cfg), cfg, ids, keys, replica_keys, rank, proofs }
    }

    fn slot(&self, id: &PeerId) -> u8 {
        self.ids.iter().position(|p| p == id).expect("a model peer") as u8
    }

    fn fresh(&self, joining: bool, incarnation: u8) -> Membership {
        let m =
            Membership::new(joining, HOUR, self.delay, HOUR).with_gossip(Duration::ZERO, incarnation_ms(incarnation));
        let m = if self.b.joint { m } else { m.without_joint_quorum() };
        match self.b.fault {
            Some(Fault::CountNewcomersWithoutMajority) => m.with_fault_counting_every_newcomer(),
            _ => m,
        }
    }

    /// Key k's placement, closest first (for traces).
    fn placement(&self, k: usize) -> String {
        let mut order: Vec<usize> = (0..self.b.peers).collect();
        order.sort_by_key(|&p| self.rank[k][p]);
        order.iter().map(|p| format!("P{p}")).collect::<Vec<_>>().join(" < ")
    }
}

fn h128(bytes: &[u8]) -> u128 {
    let mut a = DefaultHasher::new();
    bytes.hash(&mut a);
    let mut b = DefaultHasher::new();
    0x5a_u8.hash(&mut b);
    bytes.hash(&mut b);
    (u128::from(a.finish()) << 64) | u128::from(b.finish())
}

/// The extent of the bracketed value after `"{name}: "` in a `Debug` rendering:
/// (start of the opening bracket, end after the closing one).
fn bracketed(s: &str, name: &str) -> Option<(usize, usize)> {
    let key = format!("{name}: ");
    let start = s.find(&key)? + key.len();
    let bytes = s.as_bytes();
    if !matches!(bytes.get(start), Some(b'{' | b'[' | b'(')) {
        return None;
    }
    let mut depth = 0i32;
    let mut in_str = false;
    for (k, &ch) in bytes.iter().enumerate().skip(start) {
        match ch {
            b'"' => in_str = !in_str,
            _ if in_str => {}
            b'{' | b'[' | b'(' => depth += 1,
            b'}' | b']' | b')' => {
                depth -= 1;
                if depth == 0 {
                    return Some((start, k + 1));
                }
            }
            _ => {}
        }
    }
    None
}

/// Splits the inside of a bracketed value at its top-level commas.
fn entries(inner: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut in_str, mut from) = (0i32, false, 0);
    for (k, ch) in inner.char_indices() {
        match ch {
            '"' => in_str = !in_str,
            _ if in_str => {}
            '{' | '[' | '(' => depth += 1,
            '}' | ']' | ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(inner[from..k].trim());
                from = k + 1;
            }
            _ => {}
        }
    }
    let last = inner[from..].trim();
    if !last.is_empty() {
        out.push(last);
    }
    out
}

/// A `Debug` rendering of `Membership` with its hash map's entries (and its list of
/// departures, a set in effect) in a canonical order: the map's iteration order
/// depends on its hasher's random keys.
fn canonical(s: &str) -> String {
    let mut s = s.to_string();
    for name in ["members", "departures"] {
        if let Some((a, z)) = bracketed(&s, name) {
            let mut items = entries(&s[a + 1..z - 1]);
            items.sort_unstable();
            let sorted = format!("{}{}{}", &s[a..a + 1], items.join(", "), &s[z - 1..z]);
            s.replace_range(a..z, &sorted);
        }
    }
    s
}

/// Cuts `name: value` out of a `Debug` rendering (config and stats of the core types).
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
                    end = k + 1;
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

fn membership_fp(p: &Peer) -> u128 {
    let mut text = format!("{} {} {} ", p.up, p.incarnation, p.conn);
    if p.acks != [0; MAX_PEERS] || p.told != p.conn {
        let _ = write!(text, "{:?} {} ", p.acks, p.told);
    }
    if p.up {
        text.push_str(&canonical(&format!("{:?}", p.membership)));
    }
    h128(text.as_bytes())
}

fn replicas_fp(p: &Peer) -> u128 {
    let mut text = String::new();
    if p.up {
        for (k, h) in &p.replicas {
            let _ =
                write!(text, " [{k} {} {}]", h.overlap, cut_fields(&format!("{:?}", h.replica), &["config", "stats"]));
        }
    }
    h128(text.as_bytes())
}

fn name(c: Id) -> char {
    (b'A' + c as u8) as char
}

fn secs(t: Time) -> String {
    let s = format!("{:.6}", t.as_secs_f64());
    let s = s.trim_end_matches('0');
    format!("{}s", s.strip_suffix('.').map_or(s.to_string(), |s| format!("{s}.0")))
}

fn bits(mask: u8) -> String {
    let v: Vec<String> = (0..8).filter(|i| mask & (1 << i) != 0).map(|i| format!("P{i}")).collect();
    format!("{{{}}}", v.join(", "))
}

impl State {
    fn initial(model: &Model) -> Self {
        let b = &model.b;
        let mut peers: Vec<Peer> = (0..b.peers)
            .map(|_| Peer {
                up: false,
                incarnation: 0,
                membership: model.fresh(false, 0),
                conn: 0,
                replicas: BTreeMap::new(),
                acks: [0; MAX_PEERS],
                told: 0,
            })
            .collect();
        // A meshed swarm that has served since time 0.
        let zero = Duration::ZERO;
        for (p, peer) in peers.iter_mut().enumerate().take(b.initial) {
            peer.up = true;
            peer.incarnation = 1;
            peer.membership = model.fresh(false, 1);
            for q in (0..b.initial).filter(|&q| q != p) {
                peer.membership.connected(model.ids[q], zero);
                peer.conn |= 1 << q;
                peer.told |= 1 << q;
            }
            peer.membership.tick(zero);
            assert!(peer.membership.serving());
        }
        // Every table heard: the joint quorums of their first meetings are over.
        for (p, peer) in peers.iter_mut().enumerate().take(b.initial) {
            for q in (0..b.initial).filter(|&q| q != p) {
                let counted: Vec<PeerId> = (0..b.initial).filter(|&x| x != q).map(|x| model.ids[x]).collect();
                peer.membership.counted_by(&model.ids[q], counted, true);
            }
            assert_eq!(peer.membership.joints_pending(), 0);
        }
        let clients = (0..b.homes.len())
            .map(|c| Client::new(model.cfg.clone(), LamportClock::new().stamp(START, c as Id), START))
            .collect();
        let mut s = State {
            now: START,
            peers,
            clients,
            cut: 0,
            lost: BTreeMap::new(),
            meet: BTreeMap::new(),
            grants: BTreeMap::new(),
            views: [0; MAX_PEERS],
            gossip: BTreeMap::new(),
            used: Used::default(),
            adversary_at: Some(START),
            fp_peers: Vec::new(),
            touched: 0,
            touched_m: 0,
        };
        for p in 0..b.peers {
            s.peers[p].membership.tick(START);
        }
        let mut out = Vec::new();
        for c in 0..s.clients.len() {
            s.drain_client(model, c, &mut out).expect("a client that starts");
        }
        s.deliver_all(model, out).expect("the first round");
        s.fp_peers = s.peers.iter().map(|p| (membership_fp(p), replicas_fp(p))).collect();
        s
    }

    /// Whether p and q can reach each other (both up, on one side of the cut).
    fn link(&self, p: usize, q: usize) -> bool {
        self.peers[p].up && self.peers[q].up && ((self.cut >> p) & 1 == (self.cut >> q) & 1)
    }

    /// The host of key k as peer p sees it: the closest of itself and its alive members.
    fn route(&self, model: &Model, p: usize, k: usize) -> usize {
        let m = &self.peers[p].membership;
        let mut best = p;
        for id in m.alive() {
            let q = model.slot(id) as usize;
            if model.rank[k][q] < model.rank[k][best] {
                best = q;
            }
        }
        best
    }

    /// Whether p hosts key k now: it serves and knows no alive peer closer.
    fn hosts(&self, model: &Model, p: usize, k: usize) -> bool {
        let m = &self.peers[p].membership;
        self.peers[p].up && m.serving() && m.closest_alive(&model.replica_keys[k], &model.keys[p]).is_none()
    }

    /// The next deadline: (time, what), ties in a fixed order.
    fn next_deadline(&self) -> Option<(Time, Due)> {
        let mut best: Option<(Time, Due)> = None;
        let mut consider = |t: Time, d: Due| {
            if best.is_none_or(|(bt, _)| t < bt) {
                best = Some((t, d));
            }
        };
        for (&(p, _), &t) in &self.lost {
            consider(t, Due::Notice(p));
        }
        for (&(p, q), &(t, _)) in &self.meet {
            consider(t, Due::Meet(p, q));
        }
        for (&(p, q), &t) in &self.gossip {
            consider(t, Due::Hear(p, q));
        }
        for (p, peer) in self.peers.iter().enumerate() {
            for (&k, h) in &peer.replicas {
                if let Some(t) = h.replica.poll_timeout() {
                    consider(t, Due::Replica(p as u8, k));
                }
            }
        }
        for (c, client) in self.clients.iter().enumerate() {
            if let Some(t) = client.poll_timeout() {
                consider(t, Due::Client(c as u8));
            }
        }
        best
    }

    fn actions(&self, model: &Model) -> Vec<Action> {
        let b = &model.b;
        let mut out = Vec::new();
        if self.next_deadline().is_some() {
            out.push(Action::Step);
        }
        // Prompt notices and meetings: at the instant the loss or the reach began.
        let noticing: BTreeSet<u8> =
            self.lost.iter().filter(|(_, &t)| t == self.now + LIVENESS).map(|(&(p, _), _)| p).collect();
        out.extend(noticing.iter().map(|&p| Action::Notice(p)));
        if self.used.meets < b.meets {
            out.extend(
                self.meet.iter().filter(|(_, &(t, _))| t == self.now + LIVENESS).map(|(&(p, q), _)| Action::Meet(p, q)),
            );
        }
        if self.used.hears < b.hears {
            out.extend(
                self.gossip.iter().filter(|(_, &t)| t == self.now + LIVENESS).map(|(&(p, q), _)| Action::Hear(p, q)),
            );
        }
        if self.adversary_at != Some(self.now) {
            return out;
        }
        self.applications(b, &mut out);
        if self.cut != 0 && self.used.heals < b.heals {
            out.push(Action::Heal);
        }
        if self.now >= b.until {
            return out;
        }
        let up = |p: usize| self.peers[p].up;
        let joined_pending = self.meet.values().any(|&(_, join)| join);
        if self.cut == 0 && self.used.cuts < b.cuts && (b.gap || !joined_pending) {
            let all = (1u16 << b.peers) as u8 - 1;
            for mask in 1..all {
                // A cut and its complement are the same: slot 0 is on the cut-off side.
                if mask & 1 == 0 || (!b.cut_sets.is_empty() && !b.cut_sets.contains(&mask)) {
                    continue;
                }
                out.push(Action::Cut(mask));
            }
        }
        if self.used.kills < b.kills {
            for p in 0..b.peers {
                if up(p) && !b.homes.contains(&(p as u8)) {
                    out.push(Action::Kill(p as u8));
                }
            }
        }
        if self.used.joins < b.joins && (b.gap || self.lost.is_empty()) {
            for p in 0..b.peers {
                if !up(p) && (self.peers[p].incarnation as usize) < MAX_INCARNATIONS {
                    for boot in 0..b.peers {
                        if up(boot) && (b.boots == 0 || b.boots & (1 << boot) != 0) {
                            out.push(Action::Join(p as u8, boot as u8));
                        }
                    }
                }
            }
        }
        out
    }

    /// The applications' choices: release, acquire again.
    fn applications(&self, b: &Bounds, out: &mut Vec<Action>) {
        if self.used.releases < b.releases {
            for (c, client) in self.clients.iter().enumerate() {
                if matches!(client.phase(), Phase::Holding | Phase::Lost) {
                    out.push(Action::Release(c as u8));
                }
            }
        }
        if self.used.again < b.again {
            for (c, client) in self.clients.iter().enumerate() {
                if matches!(client.phase(), Phase::Released | Phase::Lost) {
                    out.push(Action::Again(c as u8));
                }
            }
        }
    }

    /// Peer p's replicas changed.
    fn touch(&mut self, p: usize) {
        self.touched |= 1 << p;
    }

    /// Peer p's membership changed (and perhaps its replicas).
    fn touch_m(&mut self, p: usize) {
        self.touched |= 1 << p;
        self.touched_m |= 1 << p;
    }

    /// Applies `a`; `Err` when the core broke one of its own rules.
    fn apply(&mut self, model: &Model, a: Action) -> Result<(), String> {
        self.touched = 0;
        self.touched_m = 0;
        let mut out = Vec::new();
        let mut join_peer = None;
        let result = match a {
            Action::Step => {
                let (t, due) = self.next_deadline().expect("enabled");
                let slot = |t: Time| t.as_nanos() / model.b.slot.as_nanos();
                if t > self.now && slot(t) > slot(self.now) {
                    self.adversary_at = Some(t);
                }
                self.now = self.now.max(t);
                match due {
                    Due::Notice(p) => {
                        self.notice(model, p as usize);
                        Ok(())
                    }
                    Due::Meet(p, q) => {
                        self.meet_now(model, p as usize, q as usize);
                        Ok(())
                    }
                    Due::Hear(p, q) => {
                        self.hear(model, p as usize, q as usize);
                        Ok(())
                    }
                    Due::Replica(p, k) => {
                        let now = self.now;
                        let h = self.peers[p as usize].replicas.get_mut(&k).expect("due");
                        h.replica.handle_timeout(now);
                        self.drain_replica(model, p as usize, k, None, &mut out);
                        self.touch(p as usize);
                        Ok(())
                    }
                    Due::Client(c) => {
                        self.clients[c as usize].handle_timeout(self.now);
                        self.drain_client(model, c as usize, &mut out)
                    }
                }
            }
            Action::Cut(mask) => {
                self.cut = mask;
                self.used.cuts += 1;
                Ok(())
            }
            Action::Heal => {
                self.cut = 0;
                self.used.heals += 1;
                Ok(())
            }
            Action::Notice(p) => {
                self.notice(model, p as usize);
                Ok(())
            }
            Action::Meet(p, q) => {
                self.used.meets += 1;
                self.meet_now(model, p as usize, q as usize);
                Ok(())
            }
            Action::Hear(p, q) => {
                self.used.hears += 1;
                self.hear(model, p as usize, q as usize);
                Ok(())
            }
            Action::Kill(p) => {
                let peer = &mut self.peers[p as usize];
                peer.up = false;
                peer.conn = 0;
                peer.told = 0;
                peer.acks = [0; MAX_PEERS];
                peer.replicas.clear();
                self.used.kills += 1;
                self.touch_m(p as usize);
                Ok(())
            }
            Action::Join(p, boot) => {
                let (p, boot) = (p as usize, boot as usize);
                self.used.joins += 1;
                let inc = self.peers[p].incarnation + 1;
                self.peers[p] = Peer {
                    up: true,
                    incarnation: inc,
                    membership: model.fresh(true, inc),
                    conn: 0,
                    replicas: BTreeMap::new(),
                    acks: [0; MAX_PEERS],
                    told: 0,
                };
                // Rule 4: a new incarnation is a newcomer, acked afresh.
                self.views[p] = 0;
                for peer in &mut self.peers {
                    peer.acks[p] = 0;
                }
                self.gossip.retain(|&(a, b), _| a as usize != p && b as usize != p);
                self.touch_m(p);
                join_peer = Some(p as u8);
                if self.link(p, boot) {
                    self.connect(model, p, boot);
                    self.connect(model, boot, p);
                    if model.b.acks {
                        // The bootstrap peer's table: the acks it knows.
                        self.hear(model, p, boot);
                        self.admit(model, p);
                    }
                    self.peers[p].membership.bootstrapped();
                }
                Ok(())
            }
            Action::Release(c) => {
                self.used.releases += 1;
                self.clients[c as usize].release(self.now);
                self.drain_client(model, c as usize, &mut out)
            }
            Action::Again(c) => {
                self.used.again += 1;
                let ts = LamportClock::new().stamp(self.now, Id::from(c));
                self.clients[c as usize] = Client::new(model.cfg.clone(), ts, self.now);
                self.drain_client(model, c as usize, &mut out)
            }
        };
        self.settle(model);
        self.reconcile(model, join_peer);
        let result = result.and_then(|()| self.deliver_all(model, out));
        self.forget_unreferenced_grants();
        for p in 0..self.peers.len() {
            if self.touched_m & (1 << p) != 0 {
                self.fp_peers[p].0 = membership_fp(&self.peers[p]);
            }
            if self.touched & (1 << p) != 0 {
                self.fp_peers[p].1 = replicas_fp(&self.peers[p]);
            }
        }
        result
    }

    /// p meets q (once): p lists q, and calls `connected` for it if it is admitted.
    fn connect(&mut self, model: &Model, p: usize, q: usize) {
        if self.peers[p].conn & (1 << q) == 0 {
            self.peers[p].conn |= 1 << q;
            if self.admitted(model, p, q) {
                self.peers[p].told |= 1 << q;
                self.peers[p].membership.connected(model.ids[q], self.now);
            }
            self.touch_m(p);
        }
    }

    /// Rule 4: whether slot x is a newcomer (a peer not of the initial swarm, or a
    /// restart), which counts only once acked.
    fn newcomer(&self, model: &Model, x: usize) -> bool {
        x >= model.b.initial || self.peers[x].incarnation > 1
    }

    /// Rule 4: whether p knows a strict majority of the view x joined acked x.
    fn committed(&self, model: &Model, p: usize, x: usize) -> bool {
        let v = self.views[x];
        !self.newcomer(model, x)
            || (v != 0 && model.b.fault == Some(Fault::OneAck) && self.peers[p].acks[x] & v != 0)
            || (v != 0 && 2 * (self.peers[p].acks[x] & v).count_ones() > v.count_ones())
    }

    /// Rule 4: whether p's `Membership` may be told of x (off: always).
    fn admitted(&self, model: &Model, p: usize, x: usize) -> bool {
        !model.b.acks || self.committed(model, p, x) || self.peers[p].membership.peers().any(|id| *id == model.ids[x])
    }

    /// Rule 4: p tells its `Membership` of the met peers now admitted. Whether any.
    fn admit(&mut self, model: &Model, p: usize) -> bool {
        let mut any = false;
        for x in 0..self.peers.len() {
            let bit = 1 << x;
            if self.peers[p].conn & bit != 0 && self.peers[p].told & bit == 0 && self.admitted(model, p, x) {
                self.peers[p].told |= bit;
                self.peers[p].membership.connected(model.ids[x], self.now);
                self.touch_m(p);
                any = true;
            }
        }
        any
    }

    /// p hears q's own table: the members alive at q that q counts
    /// (`Membership::counted_by`, for the joint quorum), and with rule 4 the acks q knows.
    fn hear(&mut self, model: &Model, p: usize, q: usize) {
        for x in 0..self.peers.len() {
            let a = self.peers[q].acks[x];
            self.peers[p].acks[x] |= a;
        }
        let m = &self.peers[q].membership;
        let counted: Vec<PeerId> = m.alive().filter(|id| m.is_counted(id)).copied().collect();
        let me = counted.contains(&model.ids[p]);
        self.peers[p].membership.counted_by(&model.ids[q], counted, me);
        self.gossip.remove(&(p as u8, q as u8));
        self.touch_m(p);
    }

    /// Whether q's table would tell p something: acks p lacks (rule 4), or that q counts
    /// a newcomer whose joint quorum at p waits for q (p itself, for its own join).
    fn news(&self, model: &Model, p: usize, q: usize) -> bool {
        let n = self.peers.len();
        let (mp, mq) = (&self.peers[p].membership, &self.peers[q].membership);
        let me = &model.ids[p];
        (0..n).any(|x| self.peers[q].acks[x] & !self.peers[p].acks[x] != 0)
            || mq.alive().any(|x| mq.is_counted(x) && mp.awaits(&model.ids[q], Some(x)))
            || (mq.is_alive(me) && mq.is_counted(me) && mp.awaits(&model.ids[q], None))
    }

    fn meet_now(&mut self, model: &Model, p: usize, q: usize) {
        self.connect(model, p, q);
        self.connect(model, q, p);
        self.meet.remove(&(p.min(q) as u8, p.max(q) as u8));
    }

    /// p notices every peer it lost.
    fn notice(&mut self, model: &Model, p: usize) {
        for q in 0..self.peers.len() {
            if self.peers[p].conn & (1 << q) != 0 && !self.link(p, q) {
                self.peers[p].conn &= !(1 << q);
                if self.peers[p].told & (1 << q) != 0 {
                    self.peers[p].told &= !(1 << q);
                    self.peers[p].membership.disconnected(model.ids[q], self.now);
                }
                self.lost.remove(&(p as u8, q as u8));
                self.touch_m(p);
            }
        }
    }

    /// Brings the pending notices and meetings up to date with the links.
    fn reconcile(&mut self, model: &Model, join_peer: Option<u8>) {
        let n = self.peers.len();
        let now = self.now;
        for p in 0..n {
            for q in 0..n {
                if p == q {
                    continue;
                }
                let key = (p as u8, q as u8);
                let lost = self.peers[p].up && self.peers[p].conn & (1 << q) != 0 && !self.link(p, q);
                if lost {
                    self.lost.entry(key).or_insert(now + LIVENESS);
                } else {
                    self.lost.remove(&key);
                }
                if p < q {
                    let met = self.peers[p].conn & (1 << q) != 0 && self.peers[q].conn & (1 << p) != 0;
                    if self.link(p, q) && !met {
                        let join = join_peer.is_some_and(|j| j == p as u8 || j == q as u8);
                        self.meet.entry(key).or_insert((now + LIVENESS, join));
                    } else {
                        self.meet.remove(&key);
                    }
                }
                // p hears the table of a peer it met and reaches within the liveness
                // timeout (a later table only keeps a joint quorum longer).
                let both = self.peers[p].conn & (1 << q) != 0 && self.peers[q].conn & (1 << p) != 0;
                if self.link(p, q) && both && self.news(model, p, q) {
                    self.gossip.entry(key).or_insert(now + LIVENESS);
                } else {
                    self.gossip.remove(&key);
                }
            }
        }
    }

    /// After a membership change: every peer's housekeeping (`tick`: serving stops or
    /// starts), hand-over of keys to closer alive peers, joining peers joining through
    /// a serving peer they are connected to (its gossip table: its alive members'
    /// heartbeats, then `joined_through`); until nothing changes.
    fn settle(&mut self, model: &Model) {
        let now = self.now;
        loop {
            let mut changed = false;
            for p in 0..self.peers.len() {
                if !self.peers[p].up || self.touched_m & (1 << p) == 0 {
                    continue;
                }
                let peer = &mut self.peers[p];
                if peer.membership.tick(now) {
                    peer.replicas.clear();
                }
                let m = &peer.membership;
                peer.replicas
                    .retain(|&k, _| m.closest_alive(&model.replica_keys[k as usize], &model.keys[p]).is_none());
            }
            if model.b.acks {
                // Rule 4: a serving peer acks every newcomer it lists (met) that has a view.
                for r in 0..self.peers.len() {
                    if !self.peers[r].up || !self.peers[r].membership.serving() {
                        continue;
                    }
                    for x in 0..self.peers.len() {
                        let listed = self.peers[r].conn & (1 << x) != 0;
                        if listed
                            && self.newcomer(model, x)
                            && self.views[x] != 0
                            && self.peers[r].acks[x] & (1 << r) == 0
                        {
                            self.peers[r].acks[x] |= 1 << r;
                            self.touch_m(r);
                            changed = true;
                        }
                    }
                }
                for p in 0..self.peers.len() {
                    if self.peers[p].up && self.admit(model, p) {
                        changed = true;
                    }
                }
            }
            for p in 0..self.peers.len() {
                if !self.peers[p].up || !self.peers[p].membership.needs_voucher() {
                    continue;
                }
                let through = (0..self.peers.len()).find(|&q| {
                    self.peers[p].conn & (1 << q) != 0
                        && self.link(p, q)
                        && (self.peers[q].membership.serving() || model.b.fault == Some(Fault::JoinThroughAnyPeer))
                });
                let Some(q) = through else { continue };
                if model.b.acks {
                    if self.views[p] == 0 {
                        // The view it joined: the serving peer and its members.
                        let mut v = 1u8 << q;
                        for id in self.peers[q].membership.peers() {
                            v |= 1 << model.slot(id);
                        }
                        self.views[p] = v;
                        changed = true;
                    }
                    if !self.committed(model, p, p) {
                        continue;
                    }
                }
                let named: Vec<PeerId> =
                    self.peers[q].membership.alive().copied().filter(|id| *id != model.ids[p]).collect();
                let delay = self.peers[q].membership.members_delay();
                let from = model.ids[q];
                let pending: Vec<PeerId> =
                    self.peers[q].membership.joint_newcomers().map(|x| *x.unwrap_or(&from)).collect();
                let wall = WALL_MS + now.as_millis() as u64;
                let mut introduced = 0;
                for id in &named {
                    let x = model.slot(id) as usize;
                    let inc = self.peers[x].incarnation.max(1);
                    let proof = &model.proofs[x][inc as usize - 1];
                    let record = Record {
                        peer: *id,
                        beat: (incarnation_ms(inc), 1),
                        age: Duration::ZERO,
                        delay_ms: None,
                        proof: Some(proof),
                    };
                    let m = &mut self.peers[p].membership;
                    m.heard_record(record, &from, now, wall, None, &mut introduced).expect("a proven beat");
                }
                self.peers[p].membership.joined_through(from, named, &pending, Some(delay), None, now);
                self.touch_m(p);
                changed = true;
            }
            if !changed {
                break;
            }
        }
    }

    fn drain_client(&mut self, model: &Model, c: usize, out: &mut Vec<Msg>) -> Result<(), String> {
        let home = model.b.homes[c] as usize;
        let mut sends = Vec::new();
        while let Some((k, msg)) = self.clients[c].poll_transmit() {
            sends.push((k, msg));
        }
        for (k, msg) in sends {
            let host = self.route(model, home, k);
            if self.link(home, host) {
                out.push(Msg::Up { client: c as u8, key: k as u8, host: host as u8, msg });
            }
        }
        while let Some(event) = self.clients[c].poll_event() {
            if let Event::Acquired { votes, .. } = event {
                if votes < model.b.m || self.clients[c].votes() < model.b.m {
                    return Err(format!("{} won with {votes} votes, m = {}", name(c as Id), model.b.m));
                }
            }
        }
        Ok(())
    }

    /// Replica k at peer p sends what it has; `to` is the client it answers, if any.
    fn drain_replica(&mut self, model: &Model, p: usize, k: u8, to: Option<u8>, out: &mut Vec<Msg>) {
        let h = self.peers[p].replicas.get_mut(&k).expect("hosted");
        let overlap = h.overlap;
        let mut sends = Vec::new();
        while let Some((client, r)) = h.replica.poll_transmit() {
            sends.push((client, r));
        }
        if h.replica.is_disposable(self.now) {
            self.peers[p].replicas.remove(&k);
        }
        for (client, r) in sends {
            let origin = Origin::Host { peer: p as u8, overlap };
            let e = self.grants.entry((k, r.owner, r.stamp)).or_insert(origin);
            if *e != origin && matches!(e, Origin::Host { peer, .. } if *peer != p as u8) {
                *e = Origin::Ambiguous;
            }
            let home = model.b.homes[client as usize] as usize;
            if self.link(p, home) {
                out.push(Msg::Down {
                    host: p as u8,
                    key: k,
                    client: client as u8,
                    r,
                    notice: to != Some(client as u8),
                });
            }
        }
    }

    /// Delivers every message, and what they cause, in order.
    fn deliver_all(&mut self, model: &Model, mut queue: Vec<Msg>) -> Result<(), String> {
        let mut at = 0;
        while at < queue.len() {
            let msg = std::mem::replace(&mut queue[at], Msg::Up { client: 0, key: 0, host: 0, msg: dummy() });
            at += 1;
            let mut out = Vec::new();
            match msg {
                Msg::Up { client, key, host, msg } => {
                    let (p, k) = (host as usize, key as usize);
                    if !self.hosts(model, p, k) {
                        continue; // refused or redirected: the client retries
                    }
                    let now = self.now;
                    if !self.peers[p].replicas.contains_key(&key) {
                        let mine = model.rank[k][p];
                        let m = &self.peers[p].membership;
                        let held = m.hold_until(now, |id| model.rank[k][model.slot(id) as usize] < mine);
                        let mut replica = Replica::new(model.cfg.clone());
                        if let Some(t) = held {
                            replica.hold_grants_until(t);
                        }
                        let overlap = (0..self.peers.len())
                            .any(|q| q != p && self.link(p, q) && self.peers[q].replicas.contains_key(&key));
                        self.peers[p].replicas.insert(key, Hosted { replica, overlap });
                    }
                    let h = self.peers[p].replicas.get_mut(&key).expect("hosted");
                    match h.replica.handle(now, &(client as Id), msg) {
                        Ok(()) | Err(ReplicaError::NotHolder) | Err(ReplicaError::Finished) => {}
                        Err(e) => return Err(format!("P{p} replica {k} rejected a well-formed message: {e}")),
                    }
                    self.touch(p);
                    self.drain_replica(model, p, key, Some(client), &mut out);
                }
                Msg::Down { host, key, client, r, notice } => {
                    let c = client as usize;
                    let home = model.b.homes[c] as usize;
                    if r.ts != *self.clients[c].ts() {
                        continue; // for an acquisition that is over: handed back, ignored
                    }
                    if notice && self.route(model, home, key as usize) != host as usize {
                        continue; // only the host it sends to may speak for a replica
                    }
                    match self.clients[c].handle_response(self.now, key as usize, r) {
                        Ok(()) | Err(ClientError::Stale) => {}
                        Err(e) => return Err(format!("client {} rejected a well-formed response: {e}", name(c as Id))),
                    }
                    self.drain_client(model, c, &mut out)?;
                }
            }
            queue.extend(out);
        }
        Ok(())
    }

    /// Drops ghost grants nothing refers to any more.
    fn forget_unreferenced_grants(&mut self) {
        let mut live = BTreeSet::new();
        for c in &self.clients {
            for (i, v) in c.views().iter().enumerate() {
                if let Some(o) = v.owner {
                    live.insert((i as u8, o, v.stamp));
                }
            }
        }
        for peer in &self.peers {
            for (&k, h) in &peer.replicas {
                if let Some((ts, s)) = h.replica.owner() {
                    live.insert((k, *ts, s));
                }
            }
        }
        self.grants.retain(|g, _| live.contains(g));
    }

    fn fingerprint(&self) -> u128 {
        let mut text = format!(
            "{:?} {:?} {} {:?} {:?} {} ",
            self.now,
            self.used,
            self.cut,
            self.lost,
            self.meet,
            self.adversary_at == Some(self.now)
        );
        if !self.gossip.is_empty() || self.views != [0; MAX_PEERS] {
            let _ = write!(text, "{:?} {:?} ", self.gossip, self.views);
        }
        for (m, r) in &self.fp_peers {
            let _ = write!(text, "{m:x} {r:x} ");
        }
        for c in &self.clients {
            text.push_str(&cut_fields(&format!("{c:?}"), &["config", "stats"]));
        }
        let _ = write!(text, "{:?}", self.grants);
        h128(text.as_bytes())
    }

    /// The invariant. `Ok(true)` when two valid holders are excused by host overlaps.
    fn check(&self, model: &Model) -> Result<bool, String> {
        for (p, peer) in self.peers.iter().enumerate() {
            for (k, h) in &peer.replicas {
                h.replica.check_invariants().map_err(|e| format!("P{p} replica {k}: {e}"))?;
            }
        }
        let now = self.now;
        let holders: Vec<&Client<Id>> = self
            .clients
            .iter()
            .filter(|c| c.phase() == Phase::Holding && c.valid_until().is_some_and(|t| t > now))
            .collect();
        let need = 2 * model.b.m - model.b.n;
        let mut excused = false;
        for (i, a) in holders.iter().enumerate() {
            for b in &holders[i + 1..] {
                let mut shared = Vec::new();
                let mut switched = Vec::new();
                for k in 0..model.b.n {
                    let (va, vb) = (&a.views()[k], &b.views()[k]);
                    let live = |v: &View<Id>, c: &Client<Id>| {
                        v.owner.as_ref() == Some(c.ts()) && v.vote_until.is_some_and(|t| t > now)
                    };
                    if !(live(va, a) && live(vb, b)) {
                        continue;
                    }
                    shared.push(k);
                    let origin = |c: &Client<Id>, stamp| self.grants.get(&(k as u8, *c.ts(), stamp)).copied();
                    // Excused only as a host overlap (ARCHITECTURE.md, "Host overlaps
                    // act as resets"): two hosts of one side, one created while the
                    // other hosted the key. A takeover, a restart and a split carry the
                    // takeover delay and excuse nothing.
                    if let (
                        Some(Origin::Host { peer: pa, overlap: oa }),
                        Some(Origin::Host { peer: pb, overlap: ob }),
                    ) = (origin(a, va.stamp), origin(b, vb.stamp))
                    {
                        if pa != pb && (oa || ob) {
                            switched.push(k);
                        }
                    }
                }
                if switched.len() < need {
                    return Err(format!(
                        "two valid holders: {} (valid until {}) and {} (valid until {}) at {}; live votes for both \
                         at {shared:?}, of which {switched:?} are host overlaps, 2m - n = {need}",
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

    fn describe(&self, model: &Model, a: Action) -> String {
        match a {
            Action::Step => match self.next_deadline() {
                Some((t, Due::Notice(p))) => format!("t={}: P{p} notices the peers it lost (deadline)", secs(t)),
                Some((t, Due::Meet(p, q))) => format!("t={}: P{p} and P{q} meet (deadline)", secs(t)),
                Some((t, Due::Hear(p, q))) => format!("t={}: P{p} hears P{q}'s table (deadline)", secs(t)),
                Some((t, Due::Replica(p, k))) => format!("t={}: timer of replica {k} at P{p}", secs(t)),
                Some((t, Due::Client(c))) => format!("t={}: timer of client {}", secs(t), name(c.into())),
                None => "nothing due".into(),
            },
            Action::Cut(mask) => {
                let all = (1u16 << model.b.peers) as u8 - 1;
                format!("CUT {} | {}", bits(mask), bits(all & !mask))
            }
            Action::Heal => "HEAL".into(),
            Action::Notice(p) => format!("P{p} notices the peers it lost (early)"),
            Action::Meet(p, q) => format!("P{p} and P{q} meet (early)"),
            Action::Hear(p, q) => format!("P{p} hears P{q}'s table (early)"),
            Action::Kill(p) => format!("P{p} is KILLED"),
            Action::Join(p, boot) => {
                let what = if self.peers[p as usize].incarnation == 0 { "JOINS" } else { "RESTARTS" };
                format!("P{p} {what} with bootstrap P{boot}")
            }
            Action::Release(c) => format!("{} releases", name(c.into())),
            Action::Again(c) => format!("{} acquires again", name(c.into())),
        }
    }

    /// One line per peer and client: what a trace shows after each step.
    fn summary(&self, model: &Model) -> String {
        let mut out = String::new();
        for (p, peer) in self.peers.iter().enumerate() {
            if !peer.up {
                if peer.incarnation > 0 {
                    let _ = writeln!(out, "        P{p}: down");
                }
                continue;
            }
            let m = &peer.membership;
            let r = match m.readiness() {
                Readiness::Serving => "serving".to_string(),
                Readiness::Minority { reachable, members } => format!("minority {reachable}/{members}"),
                Readiness::Joint { reachable, of } => format!("joint {reachable}/{of}"),
                Readiness::Half { reachable, members } => format!("half {reachable}/{members}"),
                Readiness::Counting => "counting".to_string(),
                other => other.as_str().to_string(),
            };
            let hosts: Vec<String> = peer
                .replicas
                .iter()
                .map(|(k, h)| {
                    let owner = h.replica.owner().map_or("-".to_string(), |(ts, _)| name(ts.client).to_string());
                    let held =
                        h.replica.holding_grants_until().map_or(String::new(), |t| format!(" held to {}", secs(t)));
                    format!("{k}:{owner}{held}")
                })
                .collect();
            let _ = writeln!(
                out,
                "        P{p}: {r} (members {}, reachable {}, uncounted {}, joint quorums {}), met {}, hosts [{}]{}",
                m.members(),
                m.reachable() + 1,
                m.uncounted(),
                m.joints_pending(),
                bits(peer.conn),
                hosts.join(", "),
                if model.b.acks {
                    let acks: Vec<String> = (0..self.peers.len())
                        .filter(|&x| self.views[x] != 0)
                        .map(|x| format!("P{x} view {} acked {}", bits(self.views[x]), bits(peer.acks[x])))
                        .collect();
                    format!(", told {}, acks [{}]", bits(peer.told), acks.join("; "))
                } else {
                    String::new()
                }
            );
        }
        for (c, client) in self.clients.iter().enumerate() {
            let valid = client.valid_until().map_or("-".to_string(), secs);
            let _ = writeln!(
                out,
                "        client {} at P{}: {:?}, {} votes, valid until {valid}",
                name(c as Id),
                model.b.homes[c],
                client.phase(),
                client.votes()
            );
        }
        out
    }
}

fn dummy() -> ToReplica<Id> {
    ToReplica::Release { ts: Timestamp::new(0, 0), token: 0, next: Vec::new() }
}

#[derive(Clone, Copy, Debug)]
enum Due {
    Notice(u8),
    Meet(u8, u8),
    Hear(u8, u8),
    Replica(u8, u8),
    Client(u8),
}

/// The outcome of one search.
pub struct Report {
    pub states: usize,
    /// States with two valid holders excused by host overlaps.
    pub excused: usize,
    pub transitions: usize,
    pub depth: usize,
    pub clock: Time,
    pub elapsed: Duration,
    pub violation: Option<String>,
}

impl Report {
    pub fn assert_holds(&self) {
        if let Some(v) = &self.violation {
            panic!("invariant violated:\n{v}");
        }
    }
}

/// Breadth-first search of `b`; stops at the first violation.
pub fn run(b: &Bounds) -> Report {
    let model = Model::new(b);
    let started = Instant::now();
    println!("membership model: {b:?}");
    println!("takeover delay {:?}, liveness timeout {LIVENESS:?}, lease {LEASE:?}", model.delay);
    for k in 0..b.n {
        println!("  key {LOCK}:{}: {}", k + 1, model.placement(k));
    }
    let init = State::initial(&model);
    let mut parents: Vec<(u32, Action)> = vec![(u32::MAX, Action::Step)];
    let mut seen: HashSet<u128> = HashSet::new();
    seen.insert(init.fingerprint());
    let mut report = Report {
        states: 1,
        excused: 0,
        transitions: 0,
        depth: 0,
        clock: init.now,
        elapsed: Duration::ZERO,
        violation: None,
    };
    if let Err(e) = init.check(&model) {
        report.violation = Some(e);
        return report;
    }
    let mut frontier: Vec<(u32, State)> = vec![(0, init)];
    for depth in 1..=b.depth {
        let first_new = parents.len();
        for (id, s) in &frontier {
            for a in s.actions(&model) {
                let mut t = s.clone();
                report.transitions += 1;
                let result = t.apply(&model, a);
                let new = seen.insert(t.fingerprint());
                let result = result.and_then(|()| if new { t.check(&model) } else { Ok(false) });
                if result == Ok(true) {
                    report.excused += 1;
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
                    report.clock = report.clock.max(t.now);
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
            "  depth {depth:>3}: {found:>9} new states, {:>10} in all, {:>11} transitions, clock up to {}, {:.1?}",
            seen.len(),
            report.transitions,
            secs(report.clock),
            started.elapsed()
        );
        if depth == b.depth {
            break;
        }
        let mut next = Vec::with_capacity(found);
        let mut parents_left = frontier.into_iter().peekable();
        for (id, &(p, a)) in parents.iter().enumerate().skip(first_new) {
            while parents_left.peek().is_some_and(|(pid, _)| *pid != p) {
                parents_left.next();
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
        "membership model: {} states ({} excused by host overlaps), {} transitions, depth {}, clock up to {}, \
         {:.1?}: invariant holds",
        report.states,
        report.excused,
        report.transitions,
        report.depth,
        secs(report.clock),
        report.elapsed
    );
    report
}

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

/// Replays `path` and prints every step with the peers' and clients' state after it.
fn trace(model: &Model, path: &[Action], heading: &str, report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{heading}");
    let _ = writeln!(
        out,
        "found at depth {} after {} states, {} transitions, {:.1?}; takeover delay {:?}, liveness timeout {:?}",
        path.len(),
        report.states,
        report.transitions,
        report.elapsed,
        model.delay,
        LIVENESS
    );
    for k in 0..model.b.n {
        let _ = writeln!(out, "  key {LOCK}:{} (replica {k}): {}", k + 1, model.placement(k));
    }
    let mut s = State::initial(model);
    let _ = writeln!(
        out,
        "   0. t={}: P0..P{} meshed and serving; every client sends its REQUESTs",
        secs(s.now),
        model.b.initial - 1
    );
    out.push_str(&s.summary(model));
    for (i, &a) in path.iter().enumerate() {
        let what = s.describe(model, a);
        let result = s.apply(model, a);
        let _ = writeln!(out, "  {:>2}. {what} (now {})", i + 1, secs(s.now));
        out.push_str(&s.summary(model));
        if let Err(e) = result {
            let _ = writeln!(out, "        ERROR: {e}");
        }
    }
    out
}

#[test]
fn canonical_sorts_the_members_map() {
    let a = "M { members: {PeerId(\"b\"): X { v: [1, 2] }, PeerId(\"a\"): X { v: [] }}, departures: [(PeerId(\"z\"), 1s), (PeerId(\"y\"), 2s)], up: 1 }";
    let b = "M { members: {PeerId(\"a\"): X { v: [] }, PeerId(\"b\"): X { v: [1, 2] }}, departures: [(PeerId(\"y\"), 2s), (PeerId(\"z\"), 1s)], up: 1 }";
    assert_eq!(canonical(a), canonical(b));
    assert_ne!(canonical(a), canonical(&a.replace("up: 1", "up: 2")));
}

/// Replays a script of actions (`step`, `step*N`, `cut:<mask>`, `heal`, `notice:<p>`,
/// `meet:<p>:<q>`, `kill:<p>`, `join:<p>:<boot>`, `release:<c>`), printing the trace
/// and the invariant's verdict after each step; for exploring by hand.
pub fn scripted(b: &Bounds, script: &str) -> String {
    let model = Model::new(b);
    let mut path = Vec::new();
    for tok in script.split_whitespace() {
        let parts: Vec<&str> = tok.split([':', '*']).collect();
        let num = |i: usize| parts[i].parse::<u8>().expect("a number");
        match parts[0] {
            "step" if parts.len() == 2 => path.extend(std::iter::repeat_n(Action::Step, num(1) as usize)),
            "step" => path.push(Action::Step),
            "cut" => path.push(Action::Cut(u8::from_str_radix(parts[1], 2).expect("mask"))),
            "heal" => path.push(Action::Heal),
            "notice" => path.push(Action::Notice(num(1))),
            "meet" => path.push(Action::Meet(num(1), num(2))),
            "hear" => path.push(Action::Hear(num(1), num(2))),
            "kill" => path.push(Action::Kill(num(1))),
            "join" => path.push(Action::Join(num(1), num(2))),
            "release" => path.push(Action::Release(num(1))),
            "again" => path.push(Action::Again(num(1))),
            t => panic!("unknown action {t}"),
        }
    }
    let mut out = String::new();
    let mut s = State::initial(&model);
    out.push_str(&s.summary(&model));
    for (i, &a) in path.iter().enumerate() {
        let what = s.describe(&model, a);
        let enabled = s.actions(&model).contains(&a);
        let result = s.apply(&model, a).and_then(|()| s.check(&model));
        let _ = writeln!(
            out,
            "  {:>2}. {what} (now {}){}",
            i + 1,
            secs(s.now),
            if enabled { "" } else { " [NOT ENABLED]" }
        );
        out.push_str(&s.summary(&model));
        if let Err(e) = result {
            let _ = writeln!(out, "        VIOLATION: {e}");
            break;
        }
    }
    out
}
