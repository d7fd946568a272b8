//! A model checker of membership: a swarm of 3 to 5 peers over the real serving rule
//! (`sigma_behaviour::membership::Membership`, with the real heartbeat records and
//! their proofs for a joining peer's first table) and the real core (`proto::Client`,
//! `proto::Replica`), with partitions, heals, kills, joins and restarts.
//!
//! Breadth-first search as `tests/model.rs` (fingerprints, one level of states in
//! memory, the shortest counterexample printed step by step with every peer's
//! readiness, members and hosted replicas); nothing is random, so each configuration
//! explores a fixed number of states, pinned below.
//!
//! # The model (`model/membership.rs`)
//!
//! Peers P0..P4 (deterministic Ed25519 ids); P0, P1, P2 start meshed and serving, and
//! have served for longer than the takeover delay when the model begins (t = 10 s).
//! One lock, n = 3 replicas, m = 2, its keys `"R:1"`..`"R:3"` placed by the real
//! Kademlia distance of the real key hashes (closest first): `R:1` P4 < P2 < P0 < P3 <
//! P1, `R:2` P0 < P2 < P3 < P1 < P4, `R:3` P4 < P3 < P2 < P0 < P1. Two clients, A
//! through P0 and B through P1, each acquiring once at the start (A wins, B waits),
//! and once more after its acquisition is over when the budget allows.
//!
//! - **Liveness is a connection.** A peer calls `Membership::connected` when it meets a
//!   peer and `disconnected` when it notices it lost it. A peer that can no longer reach
//!   one it met (a cut, a kill) notices within the liveness timeout (1 s): at the
//!   instant of the loss or at the deadline, the adversary choosing per peer. Two peers
//!   that can reach each other meet within the liveness timeout (a connection, or a
//!   heartbeat relayed through the gossip): at the instant or at the deadline. A cut is
//!   a partition into two sides (relayed heartbeats do not cross it, so a connection
//!   stands for every path), healed whole.
//! - **Joining** (rule 2): a peer starts with `joining` set and a bootstrap peer; it
//!   meets that peer at once (if reachable) and completes its bootstrap; each time it
//!   is connected to a serving peer it takes that peer's gossip table: the heartbeat
//!   records of the members alive there, with their owners' proofs
//!   (`Membership::heard_record`), then `joined_through` with that peer's pending
//!   changes (`Membership::joint_newcomers`). A kill drops a peer's state; a restart is
//!   a join of a killed peer (a new incarnation, empty replicas).
//! - **Tables** (the joint quorum, `Bounds::joint`): p hears q's own table, the members
//!   alive at q that q counts (`Membership::counted_by`), at the latest one liveness
//!   timeout after it holds something that ends a joint quorum of p's, or earlier within
//!   the `hears` budget. The initial peers start with every table heard.
//! - **Hosting**, as the behaviour's `handle_replica`: a peer hosts a key while it serves
//!   and knows no alive member closer (`Membership::closest_alive`); a replica it starts
//!   is held until `Membership::hold_until` (its serving began, or a closer member
//!   departed, within the takeover delay: lease + drift + liveness timeout + 1 s =
//!   5.003 s); it drops every replica when `tick` says serving stopped, and hands a key
//!   over when a closer peer becomes alive. An idle replica is disposed of when
//!   `is_disposable`.
//! - **Routing**: a client's message for replica i goes to the host its peer believes
//!   (the closest of itself and its alive members); a host that does not host the key
//!   drops it (the behaviour redirects or refuses; the client retries on its timer); a
//!   notice is taken only from the host the client's peer sends that replica to; a
//!   message between the two sides of a cut is lost.
//! - **Time and schedule**: the scheduled network of `tests/model.rs` made coarser: a
//!   `Step` reaches the earliest deadline (a client's or replica's timer, a notice or a
//!   meeting due), fires it and delivers every message, in order and instantly. The
//!   adversary (cut, heal, kill, join) acts at the first quiescent point of each slot
//!   (1 or 2 s) before a horizon; the applications (a new acquisition) and heals at
//!   every slot.
//!
//! # The invariant
//!
//! Every hosted replica's `check_invariants()`, a win only with m votes, and: two
//! acquisitions that both hold with future validity deadlines share live votes at
//! 2m − n replicas that *switched* for them. ARCHITECTURE.md lets a host overlap count as
//! a reset ("a peer that became closer to it before the old host heard of it, or two
//! hosts unknown to each other": two peers of one side hosting a key at once, the later
//! one created while the other hosted it) and nothing else: a takeover after a cut, a
//! departure or a restart carries the takeover delay and costs availability, not
//! exclusion. So a shared vote counts as switched only if the two grants came from two
//! hosts and one of them was created as such an overlap (ghost state: the host of every
//! grant a client or replica still refers to).
//!
//! # What the model leaves out, and why it is sound for this invariant
//!
//! Relayed heartbeats and their timing (a connection stands for them: with two-sided
//! cuts no relay crosses a cut, and the bounds on noticing and meeting are the liveness
//! timeout's), Kademlia lookups and the neighbourhood rule (they only make a peer host
//! less), redirects (a refused message is lost; the client retries), quorum diversity
//! (it only withholds wins), stalls and pauses (no event loop stalls; the model's
//! membership window and stall threshold are an hour), clock offsets and drift, message
//! delay, loss and duplication beyond the cut (the core's own model checker and property
//! tests cover them), leaves and forgets, allow-lists, differing settings.
//!
//! # Running
//!
//! ```text
//! cargo test -p sigma-behaviour --test model_membership            # 15-35 s
//! cargo test -p sigma-behaviour --release --test model_membership -- --ignored --nocapture long_
//! SIGMA_MODEL="depth=50 cuts=1 joins=2 again=1 cut_sets=00001,11001 slot_ms=1000 until_ms=13000" \
//!     cargo test -p sigma-behaviour --test model_membership explore_from_env -- --ignored --nocapture
//! SIGMA_SCRIPT="join:3:0 join:4:0 cut:11001 step*26 again:0 step*30" SIGMA_MODEL="gap=1 again=1" \
//!     cargo test -p sigma-behaviour --test model_membership script_from_env -- --ignored --nocapture
//! ```

#[path = "model/membership.rs"]
mod membership;

use membership::{run, Bounds, Fault, Report};
use std::time::Duration;

/// Joins during a split, the cases rules 1 and 2 close: P0 cut off alone, or with the
/// two peer slots that may join ({P0, P3, P4} | {P1, P2}); two joins with any
/// bootstrap peer once every peer noticed the cut (a new peer on either side, through
/// a serving or a minority peer); A may acquire again. The adversary acts every 2 s
/// until t = 14 s; peers notice a loss at once or at the liveness timeout, and meet at
/// the liveness timeout (the latest).
fn joins_during_a_split() -> Bounds {
    Bounds {
        depth: 45,
        cuts: 1,
        cut_sets: vec![0b00001, 0b11001],
        joins: 2,
        again: 1,
        slot: Duration::from_secs(2),
        until: Duration::from_secs(14),
        ..Bounds::new(3, 2, 3, 5)
    }
}

/// Runs `b`, requires the invariant to hold and exactly `states` distinct states.
fn pinned(b: Bounds, states: usize) -> Report {
    let r = run(&b);
    r.assert_holds();
    assert_eq!(r.states, states, "distinct states explored changed: the model, the rules or the core changed");
    r
}

/// The first counterexample of `b`: its text, and where it was found (depth, states).
fn caught(b: &Bounds) -> (String, usize, usize) {
    let r = run(b);
    let v = r.violation.expect("a violation is found");
    (v, r.depth, r.states)
}

#[test]
fn joins_during_a_split_grow_no_minority() {
    let r = pinned(joins_during_a_split(), 289_647);
    assert_eq!(r.excused, 0);
}

/// Restarts and heals: P0 cut off alone, one kill (P2, or a peer that joined), one join
/// (a restart of the killed peer, or a new one) once the cut and the kill are noticed,
/// a heal at any slot, A may acquire again.
#[test]
#[ignore = "long (35 s in the test profile, 21 s in release): cargo test --release -- --ignored"]
fn restarts_and_heals_during_a_split() {
    let b = Bounds {
        depth: 40,
        cuts: 1,
        cut_sets: vec![0b00001],
        heals: 1,
        kills: 1,
        joins: 1,
        again: 1,
        slot: Duration::from_secs(2),
        until: Duration::from_secs(14),
        ..Bounds::new(3, 2, 3, 5)
    };
    let r = pinned(b, 376_035);
    assert_eq!(r.excused, 0);
}

/// Rule 1 broken (`Membership::with_fault_counting_every_newcomer`: a peer counts every
/// newcomer, majority or not): `joins_during_a_split_grow_no_minority` must catch it.
/// P0, cut off with the slots of P3 and P4, notices; P3 and P4 join through it; P0
/// counts them (3 of 5) and serves, and so do they; both sides take the keys over.
#[test]
fn a_minority_that_counts_newcomers_is_caught() {
    let b = Bounds { fault: Some(Fault::CountNewcomersWithoutMajority), joint: false, ..joins_during_a_split() };
    let (v, depth, states) = caught(&b);
    assert!(v.contains("two valid holders"), "{v}");
    assert_eq!((depth, states), (37, 34_846), "where the first counterexample is found");
}

/// Rule 2 broken in the model's glue (a joining peer joins through a peer that does
/// not serve): caught the same way.
#[test]
fn a_peer_that_joins_through_a_minority_is_caught() {
    let b = Bounds { fault: Some(Fault::JoinThroughAnyPeer), joint: false, ..joins_during_a_split() };
    let (v, depth, states) = caught(&b);
    assert!(v.contains("two valid holders"), "{v}");
    assert_eq!((depth, states), (34, 28_245), "where the first counterexample is found");
}

/// Joins before a cut is noticed (docs/design/membership.md, "Joins before a cut: a
/// joint quorum"): `joins_during_a_split` with the joins and cuts the guarantee used to
/// assume away allowed (`Bounds::gap`): a join while a peer has not yet noticed the cut,
/// a cut while a joined peer is not yet met by every peer it can reach. Without the
/// joint quorum (rules 1 and 2 alone) the checker finds two holders: the rule is needed.
#[test]
fn without_the_joint_quorum_joins_before_the_cut_grow_a_minority() {
    let b = Bounds { gap: true, joint: false, ..joins_during_a_split() };
    let (v, depth, states) = caught(&b);
    assert!(v.contains("two valid holders"), "{v}");
    assert_eq!((depth, states), (40, 166_830), "where the first counterexample is found");
}

/// The same with the joint quorum, as built: holds.
#[test]
#[ignore = "long (74 s in release): cargo test --release -- --ignored"]
fn joins_before_the_cut_is_noticed_grow_no_minority() {
    let r = pinned(Bounds { gap: true, ..joins_during_a_split() }, 734_490);
    assert_eq!(r.excused, 0);
}

/// The same with one-second slots to t = 13 s, depth 50 (the joins before the cut, not
/// only after it): holds.
#[test]
#[ignore = "long (426 s in release, 3 million states): cargo test --release -- --ignored"]
fn joins_before_the_cut_is_noticed_grow_no_minority_fine_slots() {
    let b = Bounds {
        depth: 50,
        gap: true,
        slot: Duration::from_secs(1),
        until: Duration::from_secs(13),
        ..joins_during_a_split()
    };
    let r = pinned(b, 2_970_832);
    assert_eq!(r.excused, 0);
}

/// Joins before the cut at t = 10 s only, through P0 and isolating P0, P3 and
/// P4, with two early meetings and two early tables (a peer hears another's table, and
/// so what it counts, before the liveness timeout): the orders of meetings and tables
/// that a search with every one at the deadline does not reach.
fn early(joint: bool) -> Bounds {
    Bounds {
        depth: 55,
        cut_sets: vec![0b11001],
        boots: 0b00001,
        until: Duration::from_secs(11),
        meets: 2,
        hears: 2,
        gap: true,
        joint,
        ..joins_during_a_split()
    }
}

/// With the joint quorum: holds.
#[test]
#[ignore = "long (115 s in release, 1.9 million states): cargo test --release -- --ignored"]
fn joins_before_the_cut_with_early_meetings_and_tables_grow_no_minority() {
    let r = pinned(early(true), 1_904_329);
    assert_eq!(r.excused, 0);
}

/// Without it: two holders (P3 and P4 join through P0 at 10 s, the cut, P0 counts them
/// and serves with 3 of 5).
#[test]
fn without_the_joint_quorum_early_meetings_and_tables_are_caught() {
    let (v, depth, states) = caught(&early(false));
    assert!(v.contains("two valid holders"), "{v}");
    assert_eq!((depth, states), (37, 30_527), "where the first counterexample is found");
}

/// Candidate rule 4 (docs/notes/2026-11-28-joins-before-a-cut.md), in the model only
/// (`Bounds::acks`): a newcomer counts only once a strict majority of the view it
/// joined listed it in a table sent while serving. Joins before a cut is noticed.
fn rule_4(joint: bool) -> Bounds {
    Bounds { gap: true, acks: true, joint, ..joins_during_a_split() }
}

/// The case rule 4 alone leaves open, as a script: P3 and P4 join through P0; P1 meets
/// them and lists them while serving (its ack); P0 hears P1's table (acks {P0, P1}, a
/// majority of {P0, P1, P2}: P0 counts them) and the cut {P0, P3, P4} | {P1, P2}
/// comes before P1 hears P0's. P1 and P2 know one ack and count 3; P0 counts 5 and
/// reaches 3 of them. Knowing that a change is acked does not make the other side know.
const ACKED_ON_ONE_SIDE: &str = "join:3:0 join:4:0 meet:1:3 meet:1:4 hear:0:1 cut:11001 step*45 again:0 step*30";

fn scripted_rule_4(joint: bool) -> String {
    let b = Bounds { meets: 2, hears: 2, ..rule_4(joint) };
    membership::scripted(&b, ACKED_ON_ONE_SIDE)
}

#[test]
fn rule_4_alone_lets_a_change_acked_on_one_side_grow_a_minority() {
    let t = scripted_rule_4(false);
    assert!(!t.contains("NOT ENABLED"), "{t}");
    assert!(t.contains("VIOLATION: two valid holders"), "{t}");
}

/// With the joint quorum as built, the same script: P0 stops (its view before P3 was
/// P0, P1, P2, of which it reaches itself), P3 and P4 stay joining, B alone holds.
#[test]
fn rule_4_with_the_joint_quorum_closes_a_change_acked_on_one_side() {
    // The steps fall at other instants here, so A's new acquisition is applied off a
    // slot's start (marked not enabled; applied all the same, a stronger adversary).
    let t = scripted_rule_4(true);
    assert!(!t.contains("VIOLATION"), "{t}");
    assert!(t.contains("P0: joint 1/3"), "P0 held back by the joint quorum: {t}");
}

/// Rule 4 alone, the known gap's configuration (meetings and tables at the deadline):
/// holds. Only the script above, with early ones, finds the case it leaves open.
#[test]
#[ignore = "long (42 s): cargo test --release -- --ignored"]
fn rule_4_alone_on_the_known_gap() {
    pinned(rule_4(false), 553_102);
}

/// Rule 4 alone, searched with early meetings and tables: two holders at depth 50
/// (the script's case: P1 meets P3 and P4 and acks, P0 hears P1's table, the cut).
#[test]
#[ignore = "long (220 s, 2.5 million states): cargo test --release -- --ignored"]
fn rule_4_alone_is_caught_with_early_meetings_and_tables() {
    let b = Bounds { acks: true, ..early(false) };
    let (v, depth, states) = caught(&b);
    assert!(v.contains("two valid holders"), "{v}");
    assert_eq!((depth, states), (50, 2_536_077), "where the first counterexample is found");
}

/// Both default configurations in one, with a join, a kill and a heal: 820,134 states,
/// 36 s and 1.2 GB in release. (With two joins, as before the joint quorum, the search
/// outgrew 23 GB at depth 30, 3.2 million states.)
#[test]
#[ignore = "long: cargo test --release -- --ignored"]
fn long_joins_restarts_and_heals_during_a_split() {
    let b = Bounds { heals: 1, kills: 1, joins: 1, ..joins_during_a_split() };
    let r = pinned(b, 820_134);
    assert_eq!(r.excused, 0);
}

/// One-second slots to t = 13 s, depth 50: 1,351,110 states, 96 s and 2.3 GB in release.
#[test]
#[ignore = "long: cargo test --release -- --ignored"]
fn long_joins_during_a_split_fine_slots() {
    let b =
        Bounds { depth: 50, slot: Duration::from_secs(1), until: Duration::from_secs(13), ..joins_during_a_split() };
    pinned(b, 1_351_110);
}

fn parse(spec: &str) -> Bounds {
    let get = |key: &str| spec.split_whitespace().find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')));
    let num = |key: &str, default: usize| get(key).map_or(default, |v| v.parse().expect("a number"));
    let mut b = Bounds::new(num("n", 3), num("m", 2), num("initial", 3), num("peers", 5));
    b.depth = num("depth", b.depth);
    b.cuts = num("cuts", 0) as u8;
    b.heals = num("heals", 0) as u8;
    b.kills = num("kills", 0) as u8;
    b.joins = num("joins", 0) as u8;
    b.meets = num("meets", 0) as u8;
    b.releases = num("releases", 0) as u8;
    b.again = num("again", 0) as u8;
    b.gap = num("gap", 0) != 0;
    b.acks = num("acks", 0) != 0;
    b.hears = num("hears", 0) as u8;
    b.joint = num("joint", 1) != 0;
    b.slot = std::time::Duration::from_millis(num("slot_ms", 500) as u64);
    b.until = std::time::Duration::from_millis(num("until_ms", 3_600_000) as u64);
    b.boots = get("boots").map_or(0, |v| u8::from_str_radix(v, 2).expect("binary mask"));
    if let Some(v) = get("cut_sets") {
        b.cut_sets = v.split(',').map(|m| u8::from_str_radix(m, 2).expect("binary mask")).collect();
    }
    b.fault = match get("fault") {
        None => None,
        Some("count-newcomers") => Some(Fault::CountNewcomersWithoutMajority),
        Some("join-through-any") => Some(Fault::JoinThroughAnyPeer),
        Some("one-ack") => Some(Fault::OneAck),
        Some(f) => panic!("fault={f}"),
    };
    b
}

#[test]
#[ignore = "configured by SIGMA_MODEL"]
fn explore_from_env() {
    let spec = std::env::var("SIGMA_MODEL").expect("set SIGMA_MODEL");
    run(&parse(&spec)).assert_holds();
}

#[test]
#[ignore = "configured by SIGMA_MODEL and SIGMA_SCRIPT"]
fn script_from_env() {
    let spec = std::env::var("SIGMA_MODEL").unwrap_or_default();
    let script = std::env::var("SIGMA_SCRIPT").expect("set SIGMA_SCRIPT");
    println!("{}", membership::scripted(&parse(&spec), &script));
}
