//! Exhaustive check of one split of a prefix group into its two halves
//! (docs/design/membership-at-scale.md, "Where groups come from"), before it is built:
//! an abstract model of the split rule v1, not the crate's code.
//!
//! # What is modelled
//!
//! A group of counted members M (fixed: no newcomers in v1), each with a 1-bit prefix,
//! half 0 or half 1 (H_x = the members with bit x): 5 peers split 3/2 or 4/1, 6 split
//! 3/3. Two keys, k0 and k1. Each peer knows the split or not, has the set `heard` of
//! the members it heard *directly* say that they know it (itself included once it
//! knows), and may be joining (restarted). The network is a cut: every peer on side A or
//! B, "healed" when all are on one side; peers on one side reach each other, nothing
//! crosses. The rule, at p, with reach(p) the members on p's side (p included, joining
//! or not):
//!
//! - joining: p serves nothing;
//! - not knowing the split: p serves k0 and k1 iff it reaches a strict majority of M
//!   (today's rule);
//! - knowing it: p serves only the key of its own bit x, iff it reaches a strict majority
//!   of H_x *and* (`heard` ⊇ M, or it reaches a strict majority of M): a joint quorum of
//!   the half and the parent until every member has said that it knows the split.
//!
//! Steps, in every interleaving: a cut change (to any assignment, the heal included); a
//! peer that reaches a majority of M decides the split (any number of them, each on its
//! own); p hears q on its side (q's own word only: if q knows, p learns the split and
//! puts q in `heard`); a restart (the peer loses everything and is joining; every other
//! peer drops it from `heard`, a new incarnation having said nothing yet); a joining p
//! joins through a q on its side that serves a key, taking q's `knows`. A peer that
//! knows the split hears the others that do at once ([`Hearing::Eager`], an exact
//! reduction for safety; one pair at a time is [`Hearing::EachPair`], cross-checked by an
//! ignored test).
//!
//! # What is checked
//!
//! - Safety, in every state: no key is served on both sides of the cut (two servers on one
//!   side are resolved by the closest-peer rule, and are not checked here).
//! - Non-vacuity: a state is reached where every member knows the split and has heard
//!   every member say so, and under the cut H_0 | H_1 each half serves its own key: what
//!   the split is for.
//! - Planted bugs are caught: serving a half without the joint quorum (`NoJoint`); a
//!   restart whose old word stays in the others' `heard` (`RestartStaysHeard`). A third,
//!   `RelayedHeard`, is *not* caught, and cannot be here (see [`Fault`]).
//! - The rule leans on a restart being forgotten everywhere at once: forgotten only on
//!   its side of the cut, two sides serve a key; keeping `knows` across a restart mends
//!   it (see [`Restart`]).
//!
//! # What is left out
//!
//! Time (a peer here notices a cut at once: the liveness window is today's rule's
//! business), heartbeats and forgery (every word is its speaker's own), newcomers, leaves
//! and forgetting, a second split, and which peer of a side hosts a key. A joining peer
//! hears nobody (its join sets what it knows). The runs are bounded by [`BOUNDS`]: at
//! most 3 cut changes and 1 restart.
//!
//! Peers that share a half are interchangeable (and so are the halves, keys with them,
//! when they are of one size): states are deduplicated up to that symmetry, and the counts
//! pinned below are of symmetry classes. A trace is of concrete states.

use std::collections::{HashSet, VecDeque};
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hasher};

/// A set of peers, bit i for peer i.
type Set = u8;

const MAX_PEERS: usize = 6;

#[derive(Clone, Copy, Debug)]
struct Bounds {
    /// Cut changes per run, a heal included.
    cuts: u8,
    restarts: u8,
}

/// The runs' bounds. Every counterexample found needs at most 2 cut changes (apart for a
/// restart, then the halves apart) and 1 restart; a third cut change covers a cut, a
/// heal and a cut again. 2 restarts change no verdict and take 4 times as long.
const BOUNDS: Bounds = Bounds { cuts: 3, restarts: 1 };

/// The rule, or a planted bug in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    /// A peer that knows the split serves its half on a majority of the half alone.
    NoJoint,
    /// Hear(p, q) also copies q's `heard` into p's. Harmless here: every entry of every
    /// `heard` is true (that member knows the split now: knowing is lost only by a
    /// restart, which takes the member out of every `heard`), and copying true entries
    /// keeps them true. It would matter with a relay that can lie (forgery, left out), or
    /// with restarts not forgotten everywhere; the rule takes each member's own word.
    RelayedHeard,
    /// A restart leaves the old incarnation's word in the others' `heard`.
    RestartStaysHeard,
}

/// What a restart does to the split's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Restart {
    /// v1 as specified: every other peer drops the restarted one from `heard` at once,
    /// even across the cut.
    ForgottenEverywhere,
    /// Only the peers on the restarted peer's side drop it. A real peer notices a restart
    /// by hearing of the later incarnation, which does not cross a cut; here nothing tells
    /// it later either (in the counterexample it never meets the restarted peer again, but
    /// it does hear the restarted peer's voucher, whose table would name the new
    /// incarnation: relayed news of restarts may close it, and is not modelled).
    ForgottenOnItsSide,
    /// Candidate fix: `knows` is kept across a restart (stored), and a join keeps it (the
    /// peer's or its voucher's). Nothing needs forgetting: a member heard to know the split
    /// knows it for good. Only the restarted peer's own `heard` is lost.
    KnowsKept,
}

/// How a peer that knows the split hears the others that know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hearing {
    /// At once: after every step, a peer that knows the split has heard every peer on its
    /// side that knows it. Learning the split stays a step of its own (Hear(p, q) with p
    /// not knowing). An exact reduction for safety: serving, vouching and every step's
    /// effect are monotone in `heard` (a larger `heard` serves and vouches at least as
    /// much, and stays larger after any step), so each state of `EachPair` is matched by
    /// one here with the same sides, `knows` and `joining` and a larger `heard`, which
    /// serves at least as much; and each state here is one of `EachPair`, reached by the
    /// hears left out. Only the traces are shorter, and the space hundreds of times
    /// smaller.
    Eager,
    /// One Hear(p, q) step at a time, in every order: the rule as stated.
    EachPair,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Cut(Set),
    Decide(u8),
    Hear(u8, u8),
    Restart(u8),
    Join(u8, u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct State {
    /// The peers on side B. Peer 0 is always on A: a cut and its mirror are one cut.
    side_b: Set,
    knows: Set,
    joining: Set,
    /// `heard[p]`: the members p heard directly say that they know the split.
    heard: [Set; MAX_PEERS],
    cuts_left: u8,
    restarts_left: u8,
}

struct Model {
    n: usize,
    /// H_1 (H_0 is the rest of M).
    half1: Set,
    fault: Fault,
    restart: Restart,
    hearing: Hearing,
    bounds: Bounds,
    /// The permutations of the peers that keep the rule (within each half; across the
    /// halves when they are of one size), each as its table from a set to its image.
    symmetries: Vec<[Set; 1 << MAX_PEERS]>,
}

fn count(s: Set) -> usize {
    s.count_ones() as usize
}

fn has(s: Set, p: usize) -> bool {
    s & (1 << p) != 0
}

fn majority(reached: Set, of: Set) -> bool {
    2 * count(reached & of) > count(of)
}

/// What a run found: the number of states, and whether the split's point was reached.
type Outcome = Result<(usize, bool), Violation>;

#[derive(Debug)]
struct Violation {
    steps: usize,
    trace: String,
}

impl Model {
    fn new(config: Config, fault: Fault, restart: Restart, hearing: Hearing, bounds: Bounds) -> Self {
        let half1 = config.half1.iter().fold(0, |s, &p| s | 1 << p);
        let mut model = Model { n: config.peers, half1, fault, restart, hearing, bounds, symmetries: Vec::new() };
        let mut perm: Vec<usize> = (0..model.n).collect();
        model.permutations(0, &mut perm);
        model
    }

    /// Collects every permutation that maps each half onto one half (all permutations, by
    /// swapping each position with each later one, filtered).
    fn permutations(&mut self, i: usize, perm: &mut Vec<usize>) {
        if i == self.n {
            let bit = |p: usize| has(self.half1, p);
            let within = (0..self.n).all(|p| bit(p) == bit(perm[p]));
            let across = (0..self.n).all(|p| bit(p) != bit(perm[p]));
            if within || across {
                let mut table = [0; 1 << MAX_PEERS];
                for (s, image) in table.iter_mut().enumerate() {
                    *image = (0..self.n).filter(|&p| has(s as Set, p)).fold(0, |t, p| t | 1 << perm[p]);
                }
                self.symmetries.push(table);
            }
            return;
        }
        for j in i..self.n {
            perm.swap(i, j);
            self.permutations(i + 1, perm);
            perm.swap(i, j);
        }
    }

    fn all(&self) -> Set {
        ((1u16 << self.n) - 1) as Set
    }

    fn bit(&self, p: usize) -> usize {
        usize::from(has(self.half1, p))
    }

    fn half(&self, x: usize) -> Set {
        if x == 1 {
            self.half1
        } else {
            self.all() & !self.half1
        }
    }

    /// The members on p's side, p included.
    fn reach(&self, st: &State, p: usize) -> Set {
        if has(st.side_b, p) {
            st.side_b
        } else {
            self.all() & !st.side_b
        }
    }

    fn serves(&self, st: &State, p: usize, x: usize) -> bool {
        let reach = self.reach(st, p);
        if has(st.joining, p) {
            false
        } else if !has(st.knows, p) {
            majority(reach, self.all())
        } else {
            // Until every member is known to know the split, a member that does not may
            // still serve both keys on a majority of M: only a majority of M here too
            // keeps the two apart.
            let joint = self.fault == Fault::NoJoint || st.heard[p] == self.all() || majority(reach, self.all());
            x == self.bit(p) && majority(reach, self.half(x)) && joint
        }
    }

    fn servers(&self, st: &State, x: usize) -> Set {
        (0..self.n).filter(|&p| self.serves(st, p, x)).fold(0, |s, p| s | 1 << p)
    }

    fn init(&self) -> State {
        let Bounds { cuts, restarts } = self.bounds;
        assert!(cuts < 4 && restarts < 4, "the packing holds budgets of 2 bits");
        State { side_b: 0, knows: 0, joining: 0, heard: [0; MAX_PEERS], cuts_left: cuts, restarts_left: restarts }
    }

    /// Every state one step from `st`, with its step.
    fn next(&self, st: &State) -> Vec<(Step, State)> {
        let mut out = Vec::new();
        if st.cuts_left > 0 {
            // Every assignment with peer 0 on side A, other than this one; 0 is the heal.
            for side_b in (0..self.all()).step_by(2).filter(|&s| s != st.side_b) {
                out.push((Step::Cut(side_b), State { side_b, cuts_left: st.cuts_left - 1, ..*st }));
            }
        }
        let serving = self.servers(st, 0) | self.servers(st, 1);
        for p in 0..self.n {
            let p_bit = 1 << p;
            let (joining, knows) = (has(st.joining, p), has(st.knows, p));
            if !joining && !knows && majority(self.reach(st, p), self.all()) {
                let mut n = *st;
                n.knows |= p_bit;
                n.heard[p] |= p_bit;
                out.push((Step::Decide(p as u8), n));
            }
            for q in (0..self.n).filter(|&q| q != p && has(self.reach(st, p), q)) {
                let speaks = !has(st.joining, q) && has(st.knows, q);
                if !joining && speaks {
                    let mut n = *st;
                    n.knows |= p_bit;
                    n.heard[p] |= p_bit | 1 << q;
                    if self.fault == Fault::RelayedHeard {
                        n.heard[p] |= st.heard[q];
                    }
                    if n != *st {
                        out.push((Step::Hear(p as u8, q as u8), n));
                    }
                }
                // A joining peer takes its voucher's word on the split: that is how a
                // restarted peer that knew it can come back not knowing it.
                if joining && has(serving, q) {
                    let mut n = *st;
                    n.joining &= !p_bit;
                    let knows = has(st.knows, q) || (self.restart == Restart::KnowsKept && knows);
                    n.knows = if knows { n.knows | p_bit } else { n.knows & !p_bit };
                    n.heard[p] = if knows { p_bit } else { 0 };
                    out.push((Step::Join(p as u8, q as u8), n));
                }
            }
            if !joining && st.restarts_left > 0 {
                let mut n = *st;
                n.restarts_left -= 1;
                n.joining |= p_bit;
                n.heard[p] = 0;
                if self.restart != Restart::KnowsKept {
                    n.knows &= !p_bit;
                    // Who drops the old incarnation's word (p itself has lost everything).
                    let forgetting = match (self.fault, self.restart) {
                        (Fault::RestartStaysHeard, _) => 0,
                        (_, Restart::ForgottenOnItsSide) => self.reach(st, p),
                        _ => self.all(),
                    };
                    for r in (0..self.n).filter(|&r| has(forgetting, r)) {
                        n.heard[r] &= !p_bit;
                    }
                }
                out.push((Step::Restart(p as u8), n));
            }
        }
        if self.hearing == Hearing::Eager {
            out.retain_mut(|(_, n)| {
                self.hear_all(n);
                n != st
            });
        }
        out
    }

    /// Every peer that knows the split hears every other that does on its side (and, with
    /// `RelayedHeard`, what they heard, to a fixpoint).
    fn hear_all(&self, st: &mut State) {
        let speakers = st.knows & !st.joining;
        loop {
            let before = st.heard;
            for p in (0..self.n).filter(|&p| has(speakers, p)) {
                let heard_here = speakers & self.reach(st, p);
                st.heard[p] |= heard_here;
                if self.fault == Fault::RelayedHeard {
                    for q in (0..self.n).filter(|&q| has(heard_here, q)) {
                        st.heard[p] |= st.heard[q];
                    }
                }
            }
            if st.heard == before {
                return;
            }
        }
    }

    /// Safety: no key served on both sides.
    fn check(&self, st: &State) -> Result<(), String> {
        for x in 0..2 {
            let servers = self.servers(st, x);
            let (on_a, on_b) = (servers & !st.side_b, servers & st.side_b);
            if on_a != 0 && on_b != 0 {
                return Err(format!("k{x} is served on both sides, by {} and by {}", names(on_a), names(on_b)));
            }
        }
        Ok(())
    }

    /// The split done, and each half serving its own key while cut from the other.
    fn split_serves(&self, st: &State) -> bool {
        let m = self.all();
        let halves_apart = st.side_b == self.half(0) || st.side_b == self.half(1);
        halves_apart
            && st.knows == m
            && st.joining == 0
            && st.heard[..self.n].iter().all(|&h| h == m)
            && (0..2).all(|x| self.servers(st, x) & self.half(x) != 0)
    }

    /// The symmetry class of a state: the least packing of its images.
    fn canonical(&self, st: &State) -> u64 {
        let mut best = u64::MAX;
        for map in &self.symmetries {
            let image = |s: Set| map[s as usize];
            let mut side_b = image(st.side_b);
            if has(side_b, 0) {
                side_b = self.all() & !side_b;
            }
            let mut heard = [0; MAX_PEERS];
            for p in 0..self.n {
                heard[image(1 << p).trailing_zeros() as usize] = image(st.heard[p]);
            }
            let mut packed = heard[..self.n].iter().fold(0u64, |acc, &h| acc << MAX_PEERS | u64::from(h));
            for set in [side_b, image(st.knows), image(st.joining)] {
                packed = packed << MAX_PEERS | u64::from(set);
            }
            // 6 sets of 6 bits, 3 more, and two budgets of 2 bits: 58 bits.
            packed = (packed << 2 | u64::from(st.cuts_left)) << 2 | u64::from(st.restarts_left);
            best = best.min(packed);
        }
        best
    }

    /// Breadth first over every reachable symmetry class: the number of classes and
    /// whether the split's point was reached, or the first violation (so a shortest one)
    /// with its trace.
    fn explore(&self) -> Outcome {
        let init = self.init();
        let mut seen: HashSet<u64, BuildHasherDefault<Mix>> = HashSet::default();
        seen.insert(self.canonical(&init));
        // Each state reached (concrete, as first reached), its parent and step.
        let mut states: Vec<(State, u32, Option<Step>)> = vec![(init, 0, None)];
        let mut queue = VecDeque::from([0u32]);
        let mut split_serves = false;
        while let Some(i) = queue.pop_front() {
            let st = states[i as usize].0;
            if let Err(e) = self.check(&st) {
                return Err(self.trace(&states, i, e));
            }
            split_serves |= self.split_serves(&st);
            for (step, n) in self.next(&st) {
                if seen.insert(self.canonical(&n)) {
                    states.push((n, i, Some(step)));
                    queue.push_back(states.len() as u32 - 1);
                }
            }
        }
        Ok((states.len(), split_serves))
    }

    /// The steps to state `i`, each with the state after it.
    fn trace(&self, states: &[(State, u32, Option<Step>)], mut i: u32, e: String) -> Violation {
        let mut path = Vec::new();
        while let (st, parent, Some(step)) = states[i as usize] {
            path.push((step, st));
            i = parent;
        }
        path.reverse();
        let mut trace = format!("{e}, after {} steps (H1 = {}):\n", path.len(), names(self.half1));
        let _ = writeln!(trace, "   0. start: {}", self.show(&states[0].0));
        for (k, (step, st)) in path.iter().enumerate() {
            let _ = writeln!(trace, "  {:>2}. {}: {}", k + 1, self.show_step(step), self.show(st));
        }
        Violation { steps: path.len(), trace }
    }

    fn show_step(&self, step: &Step) -> String {
        match *step {
            Step::Cut(0) => "heal".into(),
            Step::Cut(b) => format!("cut {} | {}", names(self.all() & !b), names(b)),
            Step::Decide(p) => format!("P{p} decides the split"),
            Step::Hear(p, q) => format!("P{p} hears P{q}"),
            Step::Restart(p) => format!("P{p} restarts"),
            Step::Join(p, q) => format!("P{p} joins through P{q}"),
        }
    }

    fn show(&self, st: &State) -> String {
        let sides = match st.side_b {
            0 => "healed".to_string(),
            b => format!("{} | {}", names(self.all() & !b), names(b)),
        };
        let heard: Vec<String> =
            (0..self.n).filter(|&p| st.heard[p] != 0).map(|p| format!("P{p}:{}", names(st.heard[p]))).collect();
        format!(
            "[{sides}] knows {} joining {} heard {} | k0 served by {}, k1 by {}",
            names(st.knows),
            names(st.joining),
            if heard.is_empty() { "-".to_string() } else { heard.join(" ") },
            names(self.servers(st, 0)),
            names(self.servers(st, 1)),
        )
    }
}

fn names(s: Set) -> String {
    let peers: Vec<String> = (0..MAX_PEERS).filter(|&p| has(s, p)).map(|p| p.to_string()).collect();
    format!("{{{}}}", peers.join(","))
}

/// A multiply-xorshift hash of the packed states (std's SipHash costs more than the
/// model's own steps).
#[derive(Default)]
struct Mix(u64);

impl Hasher for Mix {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        let x = (self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ x >> 29;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

#[derive(Clone, Copy)]
struct Config {
    name: &'static str,
    peers: usize,
    /// The members of H_1.
    half1: &'static [usize],
}

const CONFIGS: [Config; 3] = [
    Config { name: "5 peers, 3/2", peers: 5, half1: &[3, 4] },
    Config { name: "5 peers, 4/1", peers: 5, half1: &[4] },
    Config { name: "6 peers, 3/3", peers: 6, half1: &[3, 4, 5] },
];

fn explore_with(config: Config, fault: Fault, restart: Restart, hearing: Hearing, bounds: Bounds) -> Outcome {
    Model::new(config, fault, restart, hearing, bounds).explore()
}

fn explore(config: Config, fault: Fault, restart: Restart) -> Outcome {
    explore_with(config, fault, restart, Hearing::Eager, BOUNDS)
}

/// Explores a configuration that must hold, and reach the split's point; its count.
fn holds(config: Config, fault: Fault, restart: Restart) -> usize {
    let name = config.name;
    let (states, split_serves) =
        explore(config, fault, restart).unwrap_or_else(|v| panic!("{name}, {fault:?}, {restart:?}: {}", v.trace));
    eprintln!("{name}, {fault:?}, {restart:?}: holds, {states} states");
    assert!(split_serves, "{name}: the halves never serve their keys apart");
    states
}

/// Explores a configuration that must be caught; the length of the shortest trace.
fn caught(config: Config, fault: Fault, restart: Restart) -> usize {
    let name = config.name;
    let v = explore(config, fault, restart).expect_err(&format!("{name}: {fault:?}, {restart:?} not caught"));
    eprintln!("{name}, {fault:?}, {restart:?}: caught, {}", v.trace);
    v.steps
}

#[test]
fn the_split_rule_holds_and_splits() {
    let counts = CONFIGS.map(|config| holds(config, Fault::None, Restart::ForgottenEverywhere));
    assert_eq!(counts, PINNED, "the state space changed: pin the new counts if that is meant");
}

#[test]
fn planted_bugs_are_caught() {
    let steps = [Fault::NoJoint, Fault::RestartStaysHeard]
        .map(|fault| CONFIGS.map(|config| caught(config, fault, Restart::ForgottenEverywhere)));
    assert_eq!(steps, PINNED_STEPS, "the shortest counterexamples changed");
}

/// Relaying `heard` is caught by nothing here: every entry relayed is true (see
/// [`Fault::RelayedHeard`]). Kept so that a change that makes it unsafe shows.
#[test]
fn relayed_heard_is_not_caught() {
    let counts = CONFIGS.map(|config| holds(config, Fault::RelayedHeard, Restart::ForgottenEverywhere));
    assert_eq!(counts, PINNED_RELAYED);
}

/// The rule holds only because a restart is forgotten across the cut as well; with
/// `knows` kept across a restart nothing needs forgetting.
#[test]
fn a_restart_forgotten_on_its_side_only_breaks_the_rule_and_keeping_knows_mends_it() {
    let steps = CONFIGS.map(|config| caught(config, Fault::None, Restart::ForgottenOnItsSide));
    let counts = CONFIGS.map(|config| holds(config, Fault::None, Restart::KnowsKept));
    assert_eq!((steps, counts), PINNED_RESTARTS);
}

/// Hearing one pair at a time gives the same verdicts as hearing at once, over the 5-peer
/// configurations with 2 cut changes: 30 million states in all, two minutes. Last run:
/// the rule holds in 5,864,246 states (3/2) and 2,957,238 (4/1); shortest traces of 2
/// steps (`NoJoint`), 11 (`RestartStaysHeard`) and 12 (forgotten on its side).
#[test]
#[ignore = "30 million states, two minutes: run with --ignored"]
fn each_pair_hearing_agrees() {
    let bounds = Bounds { cuts: 2, restarts: 1 };
    for config in &CONFIGS[..2] {
        for (fault, restart) in [
            (Fault::None, Restart::ForgottenEverywhere),
            (Fault::NoJoint, Restart::ForgottenEverywhere),
            (Fault::RelayedHeard, Restart::ForgottenEverywhere),
            (Fault::RestartStaysHeard, Restart::ForgottenEverywhere),
            (Fault::None, Restart::ForgottenOnItsSide),
            (Fault::None, Restart::KnowsKept),
        ] {
            let each = explore_with(*config, fault, restart, Hearing::EachPair, bounds);
            let eager = explore_with(*config, fault, restart, Hearing::Eager, bounds);
            let verdict = |o: &Outcome| o.as_ref().map(|&(_, split)| split).map_err(|_| ());
            eprintln!("{}, {fault:?}, {restart:?}: each pair {:?}", config.name, each.as_ref().map_err(|v| v.steps));
            assert_eq!(verdict(&each), verdict(&eager), "{}, {fault:?}, {restart:?}", config.name);
        }
    }
}

/// State counts (symmetry classes) and shortest counterexamples (steps), pinned so that a
/// change to the rule or the model shows.
const PINNED: [usize; 3] = [2_857, 1_754, 5_214];
const PINNED_STEPS: [[usize; 3]; 2] = [[2, 2, 2], [8, 8, 9]];
const PINNED_RELAYED: [usize; 3] = [3_527, 2_165, 5_336];
const PINNED_RESTARTS: ([usize; 3], [usize; 3]) = ([9, 9, 10], [11_685, 6_596, 30_919]);
