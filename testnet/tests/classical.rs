//! Seeded simulator runs of the lecture's closed-system algorithms, each under its own
//! failure model (none: reliable FIFO channels, no crash), what a process reset does
//! to them, and `sim compare --quick` end to end. A failing run names its seed.

use std::time::Duration;

use sigma_behaviour::proto::Config;
use sigma_testnet::sim::compare::{self, is_closed, CompareOptions, ProtocolParams, PROTOCOLS};
use sigma_testnet::sim::engine::{Report, SimConfig};
use sigma_testnet::sim::latency::Latency;

const CLOSED: [&str; 6] = ["central", "lamport", "ricart-agrawala", "majority", "maekawa", "token-ring"];

fn run(protocol: &str, processes: usize, cfg: SimConfig) -> Report {
    let params = ProtocolParams {
        config: Config::default().with_quorum(processes, processes / 2 + 1),
        backoff: Duration::from_secs(1),
    };
    compare::run_protocol(protocol, &params, cfg).expect("known protocol")
}

fn cfg(lambda: f64, latency: Latency, seed: u64) -> SimConfig {
    SimConfig {
        warmup: Duration::from_secs(10),
        measure: Duration::from_secs(90),
        drain: Duration::from_secs(60),
        cs: Duration::from_millis(20),
        ..SimConfig::paper(lambda, latency, seed)
    }
}

fn u0200() -> Latency {
    Latency::Uniform { lo: Duration::ZERO, hi: Duration::from_millis(200) }
}

#[test]
fn the_registry_knows_every_closed_system() {
    for p in CLOSED {
        assert!(PROTOCOLS.contains(&p) && is_closed(p), "{p}");
    }
    assert_eq!(PROTOCOLS.iter().filter(|p| is_closed(p)).count(), CLOSED.len());
}

// Lecture: each algorithm guarantees exclusion, progress and bounded wait when no
// process fails and every message arrives in order. Below saturation, with latency
// variance, on 9 and 32 processes: no violation, nothing rejected, nobody waiting long,
// and every waiter served after the drain.
#[test]
fn every_closed_algorithm_is_exclusive_and_live_without_failures() {
    for (k, protocol) in CLOSED.iter().enumerate() {
        for (processes, lambda) in [(9, 3.0), (32, 3.0), (32, 0.5)] {
            let seed = 100 + k as u64 * 10 + processes as u64 + lambda as u64;
            // Measured from time 0: a slow start (say, a token not yet in the ring) counts.
            let r = run(protocol, processes, SimConfig { warmup: Duration::ZERO, ..cfg(lambda, u0200(), seed) });
            assert!(
                r.violations.is_empty(),
                "{protocol}, seed {seed}: {} violations, first {:?}",
                r.violations.len(),
                r.violations.first()
            );
            assert_eq!(r.rejected, 0, "{protocol}, seed {seed}: rejected messages without any failure");
            assert_eq!(r.waiting_at_end, 0, "{protocol}, seed {seed}: waiters never served");
            // Bounded wait, in virtual time: below saturation nobody waits for long.
            assert!(r.acquire_max < 30.0, "{protocol}, seed {seed}: a waiter waited {:.1} s", r.acquire_max);
            assert!(r.entries > 30, "{protocol}, seed {seed}: only {} entries", r.entries);
        }
    }
}

// Lecture: 3 messages per entry (central), 3(N−1) (Lamport), 2(N−1) (Ricart–Agrawala),
// 3(N−1) for majority voting and 3(2√N−1) for Maekawa without contention. At a low
// load the measured cost is that (central: the coordinator's own entries are free;
// Maekawa on 36 processes: districts of 11).
#[test]
fn message_costs_without_contention_are_the_lectures() {
    let n = 36.0_f64;
    for (protocol, expected) in [
        ("central", 3.0 * (n - 1.0) / n),
        ("lamport", 3.0 * (n - 1.0)),
        ("ricart-agrawala", 2.0 * (n - 1.0)),
        ("majority", 3.0 * (n - 1.0)),
        ("maekawa", 3.0 * 10.0),
    ] {
        let seed = 300;
        let r = run(protocol, 36, SimConfig { measure: Duration::from_secs(600), ..cfg(0.2, u0200(), seed) });
        let per = r.window_messages_per_entry;
        assert!(
            (per - expected).abs() <= 0.06 * expected,
            "{protocol}, seed {seed}: {per:.2} messages per entry, lecture {expected:.2}"
        );
    }
}

// The token circulates when idle: under full contention each hop is an entry, at a low
// load most hops carry nobody.
#[test]
fn token_ring_costs_one_message_per_entry_only_under_contention() {
    let busy = run("token-ring", 8, cfg(20.0, u0200(), 401));
    let idle = run("token-ring", 8, cfg(0.2, u0200(), 402));
    assert!(busy.window_messages_per_entry < 1.2, "seed 401: {:.2} per entry", busy.window_messages_per_entry);
    assert!(idle.window_messages_per_entry > 10.0, "seed 402: {:.2} per entry", idle.window_messages_per_entry);
}

// Outside their failure model: a process that loses its memory strands waiters (a
// forgotten queue, a forgotten deferred reply, a vote never returned). Sigma, under the
// same resets, serves everyone. The token ring regenerates its token and stays live.
#[test]
fn resets_strand_the_classical_waiters_but_not_sigma_nor_the_regenerating_ring() {
    let resets = |seed| SimConfig {
        mean_lifetime: Some(Duration::from_secs(30)),
        cs: compare::FAULT_CS,
        ..cfg(3.0, u0200(), seed)
    };
    for (protocol, seed) in [("central", 501), ("lamport", 502), ("majority", 503), ("maekawa", 504)] {
        let r = run(protocol, 32, resets(seed));
        assert!(r.resets > 100, "{protocol}, seed {seed}: only {} resets", r.resets);
        assert!(r.waiting_at_end > 0, "{protocol}, seed {seed}: nobody stranded after {} resets", r.resets);
    }
    let ring = run("token-ring", 32, resets(505));
    assert_eq!(ring.waiting_at_end, 0, "token-ring, seed 505: stranded waiters");
    let sigma = run("sigma", 32, resets(506));
    assert!(sigma.violations.is_empty() && sigma.waiting_at_end == 0, "sigma, seed 506: {sigma:?}");
}

// The exclusion checker sees a closed system break too: a coordinator that loses its
// memory while someone holds the lock grants it again (the lecture's "the coordinator
// dies... then what?"). Long critical sections and frequent resets make it likely.
#[test]
fn a_coordinator_reset_can_put_two_in_the_critical_section() {
    let seed = 1;
    let cfg = SimConfig {
        cs: Duration::from_millis(500),
        mean_lifetime: Some(Duration::from_secs(20)),
        warmup: Duration::from_secs(10),
        measure: Duration::from_secs(300),
        ..SimConfig::paper(1.0, u0200(), seed)
    };
    let r = run("central", 32, cfg);
    assert!(!r.violations.is_empty(), "seed {seed}: no violation after {} resets", r.resets);
}

// The fairness figure tells FCFS protocols from the others: the ring serves in ring
// order, the coordinator in the order requests reach it (arrival order but for the
// latency variance).
#[test]
fn out_of_order_grants_separate_the_ring_from_the_queue() {
    let central = run("central", 32, cfg(2.0, u0200(), 601));
    let ring = run("token-ring", 32, cfg(2.0, u0200(), 602));
    assert!(central.out_of_order < 0.2, "seed 601: central {:.3}", central.out_of_order);
    assert!(ring.out_of_order > 0.4, "seed 602: ring {:.3}", ring.out_of_order);
}

#[test]
fn quick_compare_writes_the_table_csv_and_plots() {
    let out = std::env::temp_dir().join(format!("sigma-compare-test-{}", std::process::id()));
    let opts = CompareOptions { out: out.clone(), quick: true, seed: 1, threads: 2, protocols: Vec::new() };
    let result = compare::run(&opts).expect("compare run");
    assert_eq!(result.rows.len(), PROTOCOLS.len());
    for file in [
        "runs.csv",
        "compare.csv",
        "summary.txt",
        "throughput-open-U0200ms.svg",
        "throughput-closed-U100100ms.png",
        "messages-open.svg",
        "messages-closed.png",
    ] {
        let len = std::fs::metadata(out.join(file)).map(|m| m.len()).unwrap_or(0);
        assert!(len > 0, "seed 1: {file} missing or empty in {}", out.display());
    }
    for p in PROTOCOLS {
        assert!(result.summary.contains(p), "seed 1: {p} missing from\n{}", result.summary);
    }
    let table = std::fs::read_to_string(out.join("compare.csv")).unwrap_or_default();
    assert_eq!(table.lines().count(), PROTOCOLS.len() + 1, "seed 1: compare.csv\n{table}");
    let row = |p: &str| result.rows.iter().find(|r| r.protocol == p).expect("row");
    // Sigma: no violation anywhere, nobody stuck after resets.
    for r in &row("sigma").resets {
        assert!(r.violations.is_empty() && r.waiting_at_end == 0, "seed 1: sigma under resets {r:?}");
    }
    let lossy = &row("sigma").lossy;
    assert!(lossy.violations.is_empty() && lossy.waiting_at_end == 0, "seed 1: sigma under loss {lossy:?}");
    assert!(row("sigma").peak[0] > 10.0 * row("strawman").peak[0], "seed 1:\n{}", result.summary);
    // A subset runs with the same seeds: the same row.
    let subset = CompareOptions { protocols: vec!["central".into()], out: out.join("subset"), ..opts };
    let alone = compare::run(&subset).expect("subset run");
    let (a, b) = (&alone.rows[0], row("central"));
    assert_eq!(
        (a.moderate.entries, a.moderate.seed, a.lossy.waiting_at_end),
        (b.moderate.entries, b.moderate.seed, b.lossy.waiting_at_end),
        "seed 1: central alone differs from central in the full comparison"
    );
    std::fs::remove_dir_all(&out).ok();
}
