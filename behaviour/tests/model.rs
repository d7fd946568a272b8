//! A model checker over the real Sigma core (`proto::Client`, `proto::Replica`).
//!
//! Breadth-first search from one initial state over every sequence of the actions
//! below, up to a depth bound, with states deduplicated by a fingerprint. Every state
//! reached is checked against the invariant; the first violation is printed as the
//! shortest sequence of actions that reaches it (BFS: shortest in the chosen model), with
//! the final views, and the test panics. The exploration order is fixed and nothing is
//! random, so a configuration always explores the same number of states: the tests pin
//! those numbers, so that a change of the core or of the checker shows up.
//!
//! # The model
//!
//! One resource, `n` replicas, 2–3 clients `A`, `B`, `C` (ids 0, 1, 2), each making one
//! acquisition whose timestamp comes from a fresh `LamportClock` when it starts (all at
//! time 0 unless `explored_starts`). The configuration is the style of `properties.rs`
//! (lease 3 s, renewals every second) with coarser retries (see `checker::config`), so
//! that leases, renewals, retries and waiter expiries happen within a few dozen steps.
//! One virtual clock, starting at 0; messages take no time unless the model delays them.
//!
//! Two networks (`checker::Network`):
//!
//! - **Exhaustive**: any message in flight may be delivered next (unbounded reordering,
//!   no delivery deadline: a message may arrive after its sender's request timeout, after
//!   leases lapsed, after a reset); a message may be delivered *and* copied (at most one
//!   copy per message, within a budget) or lost (budget, 0 by default: for safety a lost
//!   message is one never delivered, which the search covers already). Timers
//!   (`checker::Timers`): `Prompt` moves the clock to the earliest deadline among all actors and
//!   fires one actor due then (several due at once fire in any order, deliveries in
//!   between); `Lazy` lets the clock jump to any actor's future deadline and any overdue
//!   actor fire now, later or never (a slow process: sound, as a client whose own
//!   deadline passed unnoticed counts for nothing in the invariant). Every interleaving is
//!   explored, so the state space grows six- to eightfold per step: depth 6–8.
//! - **Scheduled**: the network is FIFO and instant and timers fire on time, in deadline
//!   order: the default run is deterministic (the `Step` action). Branching comes only
//!   from budgeted choices of an adversary and of the applications: at *quiescent*
//!   points (nothing deliverable) cut the link between a client and a replica (its
//!   messages, in flight and later, are held, in order), heal it (they follow, oldest
//!   first), pause (the clock moves by one lease, timers then fire late), reset a
//!   replica, release a lock, start a client; and at any delivery copy or lose the
//!   message. This is a delay-bounded search in the manner of CHESS: every schedule
//!   within the budgets, to depths of 40–100 steps, where leases lapse, votes move and
//!   notices arrive late. Replica indices matter to the default order, so no symmetry.
//!
//! Common to both: **pause** (budget), **release** by a client that holds or has lost
//! the lock (budget), **reset** of one replica (budget; the same replica may be reset
//! again): it is replaced by
//! `Replica::new(config)`, the paper's random reset, and messages in flight reach the new
//! incarnation. Responses a client will discard whenever they arrive (an older grant
//! stamp than it knows, or a released acquisition) are dropped from the network: that
//! changes nothing but counters, and merges states.
//!
//! # The invariant
//!
//! Checked in every state: every replica's `check_invariants()`, a win only with m
//! votes, well-formed messages never rejected, and the safety bound of the paper (§4).
//! For two acquisitions both `Holding` with `valid_until() > now` (their own view), let
//! S be the replicas where both count a **live** vote (a view naming their own
//! timestamp, with `vote_until > now`: a lapsed view is no vote). A replica changes sides
//! only through a reset, so at least `2m − n` of S must have **switched sides through a
//! reset**: the two grants there come from different incarnations of the replica, so the
//! earlier one was wiped by a reset that came between them. Two grants of one
//! incarnation (the replica expired one vote and granted the other, then was reset) are
//! a double grant, whatever came after. The model records, at a reset of replica i,
//! every grant `(i, owner, stamp)` still referred to (by a client's view, a message in
//! flight or the replica itself) with the reset's ordinal; a grant not recorded is the
//! current incarnation's, and two grants come from different incarnations exactly when
//! their records differ (a grant that a later incarnation issued again, identical, is of
//! unknown incarnation and never counts). With one reset at n=4, m=3 (2m − n = 2) two valid holders are
//! always a bug; at n=3, m=2 and at n=5, m=3 they need a shared live vote that switched
//! sides. Each run counts the states where two valid holders are excused, by the number
//! of resets made (`Report::excused_after_resets`), and keeps the trace to the first
//! (`Report::first_excused`; printed by `explore_from_env`): evidence that the reset
//! budget is exercised, not vacuous.
//!
//! # Mutants
//!
//! An oracle that never fails proves nothing. `Bounds::mutant` plants a fault of the core
//! (`sigma_behaviour::proto::Mutant`, a test-only switch of `Config`; without it the core
//! runs as specified) in one replica and all its incarnations; the tests require the
//! invariant to catch it. `GrantOverLiveVote`: the replica grants a REQUEST while its
//! owner's vote is live. `SIGMA_MODEL="... mutant=1"` plants it in replica 1.
//! `CountLapsedVote` (a client: lapsed votes count toward m) and `DisposalForgetsFloor`
//! (a replica disposed of with its floor ahead of its clock): `mutant=<name>:<index|all>`.
//!
//! # Beyond resets
//!
//! Resets may carry the takeover delay (`Bounds::delayed_resets`; the oracle then excuses
//! nothing), idle replicas may be disposed of (`Action::Dispose`, when `is_disposable` by
//! the replica's clock; no reset, no excusal), and replica clocks may run ahead by a fixed
//! offset (`Bounds::offsets`) and at their own rates (`Bounds::rates`, parts per
//! million fast of the clients'; timers fire when their own clock reaches them). At every win the fencing-token order is checked
//! (`State::check_token_order`; docs/design/model-checker.md, "Fencing-token order").
//!
//! # The fingerprint
//!
//! The core types derive `Debug` but not `Hash`/`Eq`. A replica's or client's fingerprint
//! is a 128-bit hash of its `Debug` output with `config` (constant) and `stats` (counters
//! that only grow and change nothing) cut out. A state's fingerprint combines the clock,
//! the budgets used, the replicas, the clients, the messages in flight (a multiset; in
//! the scheduled network the queue in order and the held messages as a multiset), the
//! cut links and the wiped grants. Component hashes are cached and recomputed only for
//! the actor an action touched. In the exhaustive network replicas are interchangeable (a
//! client treats its n views alike), so the fingerprint is the least over all
//! permutations of the replica indices (6 at n=3, 24 at n=4).
//!
//! Time is not normalised: the fingerprint holds absolute times (timestamps, grant
//! stamps and echoes are microseconds of the clock); the depth bound keeps the search
//! finite. States of a level are kept as (parent, action) until their level is
//! expanded, so about one level of states is in memory at a time (~6 KB a state).
//!
//! # Running
//!
//! ```text
//! cargo test -p sigma-behaviour --test model                      # CI: ~1.5 min, 1.6 GB
//! cargo test -p sigma-behaviour --release --test model -- --ignored --nocapture --test-threads 1
//! SIGMA_MODEL_DEPTH=200 cargo test -p sigma-behaviour --release --test model \
//!     long_scheduled_4_3_lapsed_votes -- --ignored --nocapture
//! SIGMA_MODEL="n=4 m=3 clients=2 network=scheduled cuts=2 resets=1 releases=0 depth=120" \
//!     cargo test -p sigma-behaviour --release --test model explore_from_env -- --ignored --nocapture
//! ```
//!
//! The second line runs the long configurations (`#[ignore]`: about half an hour on two
//! busy cores, 20 minutes and 8 GB of it `long_scheduled_5_3_two_cuts_two_resets`, up to
//! 7.5 GB for `long_scheduled_3_2_late_notices`); `SIGMA_MODEL_DEPTH`
//! overrides their depth (memory grows with the widest level, ~6 KB a state),
//! `SIGMA_MODEL` runs any configuration (keys of `Bounds::parse`). Every run prints,
//! per level, the new states, the states and transitions so far, how far the clock got
//! and the time taken (`--nocapture` to see them), then the totals.

// A test crate's root resolves `mod x;` next to itself (tests/x.rs, which cargo would
// build as a test of its own): the checker lives in tests/model/.
#[path = "model/checker.rs"]
mod checker;
#[path = "support/clock.rs"]
mod clock;

use checker::{run, Bounds, Network, Timers, EVERY, LEASE};
use sigma_behaviour::proto::Mutant;
use std::time::Duration;

/// Runs `b`, requires the invariant to hold and exactly `states` distinct states.
fn pinned(b: Bounds, states: usize) -> checker::Report {
    let r = run(&b);
    r.assert_holds();
    assert_eq!(r.states, states, "distinct states explored changed: the core or the checker changed");
    r
}

/// Depth of a long configuration: `SIGMA_MODEL_DEPTH` or the given default.
fn long(mut b: Bounds, depth: usize) -> Bounds {
    b.depth = std::env::var("SIGMA_MODEL_DEPTH").ok().and_then(|s| s.parse().ok()).unwrap_or(depth);
    b
}

/// A long configuration at `depth`, its state count pinned (`.ci/deep` runs them; the
/// counts and costs are in docs/design/model-checker.md); at another depth
/// (`SIGMA_MODEL_DEPTH`) only the invariant is checked.
fn pinned_long(b: Bounds, depth: usize, states: usize) -> checker::Report {
    let b = long(b, depth);
    if b.depth == depth {
        pinned(b, states)
    } else {
        let r = run(&b);
        r.assert_holds();
        r
    }
}

/// Every interleaving of the first 7 actions at n=3, m=2, two clients: deliveries in any
/// order, one copy, one reset, releases, timers on time.
#[test]
fn exhaustive_3_2() {
    pinned(Bounds { depth: 7, resets: 1, copies: 1, ..Bounds::new(3, 2, 2) }, 931_071);
}

/// Every interleaving of the first 6 actions at n=4, m=3, two clients, with late timers
/// and a pause of one lease, one copy, one reset.
#[test]
fn exhaustive_4_3_lazy_timers() {
    let b = Bounds { depth: 6, resets: 1, copies: 1, pauses: 1, timers: Timers::Lazy, ..Bounds::new(4, 3, 2) };
    pinned(b, 284_266);
}

/// Scheduled, n=3, m=2, three clients, no reset: two links cut and healed, one pause,
/// any release. The neighbourhood of late promotion notices (on the core of commit
/// db47a62 this finds two valid holders at depth 41: a notice delayed past its lease
/// counted as a fresh vote).
#[test]
fn scheduled_3_2_late_notices() {
    let b = Bounds {
        network: Network::Scheduled,
        depth: 42,
        cuts: 2,
        heals: 2,
        pauses: 1,
        resets: 0,
        copies: 0,
        ..Bounds::new(3, 2, 3)
    };
    pinned(b, 490_176);
}

/// Scheduled, n=4, m=3, two clients, one reset: two links cut for good, the holder never
/// releases. Its votes behind the cut links lapse and go to the waiter (on the core of
/// commit db47a62 this finds two valid holders at depth 80: a holder valid on n − m + 1
/// votes).
#[test]
fn scheduled_4_3_lapsed_votes() {
    let b = Bounds {
        network: Network::Scheduled,
        depth: 90,
        cuts: 2,
        heals: 0,
        releases: 0,
        resets: 1,
        copies: 0,
        ..Bounds::new(4, 3, 2)
    };
    pinned(b, 320_558);
}

/// Scheduled, n=3, m=2, two clients, one reset, two links cut for good: the holder's
/// votes behind them lapse at different times, and with the reset a waiter can hold
/// the lock beside it, their one shared live vote at the reset replica, granted to each
/// by a different incarnation. Such states exist (the reset budget is exercised) and are
/// excused, as the paper's bound allows.
#[test]
fn scheduled_3_2_reset_excuses_two_holders() {
    let b = scheduled_3_2();
    let r = pinned(b, 146_957);
    assert_eq!(r.excused, 829, "states with two valid holders excused by the reset");
}

/// Scheduled, n=5, m=3 (2m − n = 1), two clients, two resets, one link cut for good,
/// the holder never releases. With one cut the holder keeps four live votes and the
/// waiter gets at most one by a lapse: it needs two more, each from a replica that
/// switched sides through a reset. So no state is excused after one reset, and some are
/// after two (with two cuts one reset suffices: `long_scheduled_5_3_two_cuts_two_resets`).
#[test]
fn scheduled_5_3_two_resets() {
    let b = scheduled_5_3();
    let r = pinned(b, 1_054_387);
    assert_eq!(r.excused_after_resets, [0, 0, 452], "states with two valid holders excused, by resets made");
}

/// `scheduled_5_3_two_resets` with the fault of
/// `scheduled_3_2_a_replica_that_grants_over_a_live_vote_is_caught` planted in replica 1:
/// caught, with two resets to hide it behind.
#[test]
fn scheduled_5_3_a_replica_that_grants_over_a_live_vote_is_caught() {
    let b = Bounds { mutant: Some((Mutant::GrantOverLiveVote, 1)), ..scheduled_5_3() };
    assert_caught(&b, (39, 13_142));
}

/// `scheduled_3_2_reset_excuses_two_holders` with a fault planted in replica 1: it
/// grants a REQUEST while its owner's vote is live (`Mutant::GrantOverLiveVote`). The
/// invariant must catch it; with one reset, a double grant at a replica that was never
/// reset is excused only while the holders also share a live vote that switched sides
/// through the reset (2m − n = 1), never by a lapsed view or by a reset that came after
/// both grants.
#[test]
fn scheduled_3_2_a_replica_that_grants_over_a_live_vote_is_caught() {
    let b = Bounds { mutant: Some((Mutant::GrantOverLiveVote, 1)), ..scheduled_3_2() };
    assert_caught(&b, (21, 925));
}

/// `scheduled_3_2_reset_excuses_two_holders` with a faulty client A
/// (`Mutant::CountLapsedVote`): it stays valid on the latest of its m leases instead of
/// the m-th latest. Its votes behind the two cut links lapse and go to B, who wins; A
/// still counts itself valid on its one live vote. Caught with no reset to hide behind
/// (no live vote in common).
#[test]
fn scheduled_3_2_a_client_that_counts_a_lapsed_vote_is_caught() {
    let b = Bounds { mutant: Some((Mutant::CountLapsedVote, 0)), ..scheduled_3_2() };
    assert_caught(&b, (57, 46_569));
}

/// `scheduled_3_2_reset_excuses_two_holders` with the takeover delay on every reset
/// (`Bounds::delayed_resets`: the new incarnation grants nothing for one lease and the
/// drift bound, as a host that takes a key over). Without the delay this configuration
/// has 829 states with two valid holders that the reset excuses; with it a reset
/// excuses nothing (the oracle's excusal is off) and there are none.
#[test]
fn scheduled_3_2_delayed_resets_need_no_excuse() {
    let b = Bounds { delayed_resets: true, ..scheduled_3_2() };
    let r = pinned(b, 435_198);
    assert_eq!(r.excused, 0);
}

/// Scheduled, n=3, m=2, two clients starting at explored times, no reset: releases, a
/// pause of one lease, one link cut, and two idle-replica disposals (`Action::Dispose`,
/// when `Replica::is_disposable` by the replica's clock, as the behaviour drops it).
/// Replica 0's clock runs 4 s ahead (more than a lease), so a token can stand above the
/// clock of a replica it reaches. With no reset nothing is excused: disposals must act
/// as no reset for exclusion, and the token order (promise (a): a RELEASE or renewal
/// reached a replica of the next quorum, no reset since) must survive them.
#[test]
fn scheduled_3_2_disposals() {
    let r = pinned(disposals(), 299_776);
    assert_eq!(r.after_disposal, 208_300, "states reached after a disposal");
}

fn disposals() -> Bounds {
    Bounds {
        network: Network::Scheduled,
        explored_starts: true,
        depth: 40,
        cuts: 1,
        heals: 0,
        releases: 2,
        pauses: 1,
        resets: 0,
        copies: 0,
        disposals: 2,
        offsets: vec![Duration::from_secs(4)],
        ..Bounds::new(3, 2, 2)
    }
}

/// `scheduled_3_2_disposals` with a disposal that forgets the floor
/// (`Mutant::DisposalForgetsFloor` in every replica): A wins on replica 0's stamp (4 s
/// ahead) and releases; replicas 1 and 2 are dropped once their tombstones allow,
/// though their floor (A's token) is ahead of their clocks, and B, cut from replica 0,
/// wins on their fresh stamps: below A's token.
#[test]
fn scheduled_3_2_a_disposal_that_forgets_the_floor_is_caught() {
    let b = Bounds { mutant: Some((Mutant::DisposalForgetsFloor, EVERY)), ..disposals() };
    let r = run(&b);
    let v = r.violation.expect("the planted disposal is caught");
    assert!(v.contains("fencing token went back"), "{v}");
    assert_eq!((r.depth, r.states), (20, 9_256), "where the first counterexample is found");
    assert!(b.offsets[0] > LEASE, "beyond promise (b): only the floor keeps the order");
}

/// Replica clocks at the drift bound, in the dangerous direction: every replica's
/// clock runs `max_drift_ppm` (1,000 ppm) fast of the clients', so a vote's lease ends,
/// in real time, before the holder's view of it. `scheduled_3_2` with a pause and no
/// reset: the client's drift margin absorbs it, no two valid holders.
#[test]
fn scheduled_3_2_replica_clocks_at_the_drift_bound() {
    pinned(drifting(1_000), 144_019);
}

/// The same with the replicas' clocks twice the bound fast: the assumption is real. A
/// holds on votes whose leases the replicas let lapse 3 ms before A's view does, and B
/// wins on them: "two valid holders: A (valid until 2.997s) and B (valid until
/// 5.991591s) at 2.994012s".
#[test]
fn scheduled_3_2_replica_clocks_beyond_the_drift_bound_are_caught() {
    let r = run(&drifting(2_000));
    let v = r.violation.expect("clocks beyond the drift bound break exclusion");
    assert!(v.contains("two valid holders"), "{v}");
    assert_eq!((r.depth, r.states), (57, 43_481), "where the first counterexample is found");
}

/// `scheduled_3_2` without a reset, with a pause, every replica's clock `ppm` fast.
fn drifting(ppm: i64) -> Bounds {
    Bounds { resets: 0, pauses: 1, rates: vec![ppm; 3], ..scheduled_3_2() }
}

/// The planted double grant of `b` is caught, first at `(depth, states)`.
fn assert_caught(b: &Bounds, first: (usize, usize)) {
    let r = run(b);
    let v = r.violation.expect("the planted double grant is caught");
    assert!(v.contains("two valid holders"), "{v}");
    assert_eq!((r.depth, r.states), first, "where the first counterexample is found");
}

/// Any configuration, from `SIGMA_MODEL`, e.g.
/// `SIGMA_MODEL="n=3 m=2 clients=3 network=scheduled depth=50 cuts=2 heals=2 pauses=1 resets=0"`
/// (see `Bounds::parse`; unnamed keys keep the defaults of `Bounds::new`).
#[test]
#[ignore = "configured by SIGMA_MODEL"]
fn explore_from_env() {
    let spec = std::env::var("SIGMA_MODEL").expect("set SIGMA_MODEL");
    let r = run(&Bounds::parse(&spec));
    if let Some(t) = &r.first_excused {
        println!("{t}");
    }
    r.assert_holds();
}

#[test]
#[ignore = "long: cargo test --release -- --ignored"]
fn long_exhaustive_3_2() {
    pinned_long(Bounds { resets: 1, copies: 1, ..Bounds::new(3, 2, 2) }, 8, 6_367_609);
}

#[test]
#[ignore = "long: cargo test --release -- --ignored"]
fn long_exhaustive_4_3_lazy_timers() {
    let b = Bounds { resets: 1, copies: 1, pauses: 1, timers: Timers::Lazy, ..Bounds::new(4, 3, 2) };
    pinned_long(b, 7, 2_497_789);
}

/// `scheduled_3_2_late_notices`, ten steps deeper.
#[test]
#[ignore = "long: cargo test --release -- --ignored"]
fn long_scheduled_3_2_late_notices() {
    let b = Bounds {
        network: Network::Scheduled,
        cuts: 2,
        heals: 2,
        pauses: 1,
        resets: 0,
        copies: 0,
        ..Bounds::new(3, 2, 3)
    };
    pinned_long(b, 52, 6_208_274);
}

/// `scheduled_5_3_two_resets` with two links cut: one reset can excuse two holders
/// (the holder keeps exactly m live votes, the waiter has two by lapses and needs one
/// more). At depth 120: 17,023,991 states, 27,875 excused (by resets made: 0, 364,
/// 27,511); 20 minutes and 8 GB in the test profile on two busy cores:
/// `cargo test -p sigma-behaviour --release --test model long_scheduled_5_3_two_cuts_two_resets -- --ignored --nocapture`
#[test]
#[ignore = "long: cargo test --release -- --ignored"]
fn long_scheduled_5_3_two_cuts_two_resets() {
    let b = Bounds {
        network: Network::Scheduled,
        cuts: 2,
        heals: 0,
        releases: 0,
        resets: 2,
        copies: 0,
        ..Bounds::new(5, 3, 2)
    };
    let r = pinned_long(b, 120, 17_023_991);
    println!("excused by resets made: {:?}", r.excused_after_resets);
}

/// `scheduled_4_3_lapsed_votes`, sixty steps deeper (about two leases more).
#[test]
#[ignore = "long: cargo test --release -- --ignored"]
fn long_scheduled_4_3_lapsed_votes() {
    let b = Bounds {
        network: Network::Scheduled,
        cuts: 2,
        heals: 0,
        releases: 0,
        resets: 1,
        copies: 0,
        ..Bounds::new(4, 3, 2)
    };
    pinned_long(b, 150, 2_577_007);
}

/// The configuration of `scheduled_3_2_reset_excuses_two_holders`, which the mutant and
/// adversary tests beside it vary: (3, 2), the scheduled network to depth 75, two cuts,
/// one reset.
fn scheduled_3_2() -> Bounds {
    Bounds {
        network: Network::Scheduled,
        depth: 75,
        cuts: 2,
        heals: 0,
        releases: 0,
        resets: 1,
        copies: 0,
        ..Bounds::new(3, 2, 2)
    }
}

/// The configuration of `scheduled_5_3_two_resets`, which the mutant test beside it
/// varies: (5, 3), the scheduled network to depth 120, one cut, two resets.
fn scheduled_5_3() -> Bounds {
    Bounds {
        network: Network::Scheduled,
        depth: 120,
        cuts: 1,
        heals: 0,
        releases: 0,
        resets: 2,
        copies: 0,
        ..Bounds::new(5, 3, 2)
    }
}
