//! Seeded simulator runs of the protocol core: exclusion, liveness and the paper's
//! qualitative results, in virtual time. A failing run names its seed.

use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sigma_behaviour::proto::{backoff::Backoff, Config};
use sigma_testnet::sim::analysis::saturated_handoff;
use sigma_testnet::sim::engine::{run, Report, SimConfig};
use sigma_testnet::sim::latency::Latency;
use sigma_testnet::sim::protocol::{Sigma, Strawman};

fn u0200() -> Latency {
    Latency::Uniform { lo: Duration::ZERO, hi: Duration::from_millis(200) }
}

fn short(lambda: f64, seed: u64) -> SimConfig {
    SimConfig {
        warmup: Duration::from_secs(30),
        measure: Duration::from_secs(120),
        ..SimConfig::paper(lambda, u0200(), seed)
    }
}

fn assert_exclusive(r: &Report) {
    assert!(
        r.violations.is_empty(),
        "seed {}: {} exclusion violations, first {:?}",
        r.seed,
        r.violations.len(),
        r.violations.first()
    );
}

// Reference: §5, Fig. 7: saturated Sigma runs at the rate of its handoff model.
#[test]
fn sigma_saturates_at_the_theoretical_rate() {
    let theory = saturated_handoff(32, 24, &u0200(), 50_000, &mut ChaCha8Rng::seed_from_u64(7)).throughput_per_s;
    for seed in [11, 12] {
        let r = run(&Sigma(Config::default()), short(10.0, seed));
        assert_exclusive(&r);
        assert!(r.throughput >= 0.95 * theory, "seed {seed}: {:.3} CS/s vs theory {theory:.3}", r.throughput);
        assert!(r.messages_per_entry <= 4.0 * 32.0 + 0.5, "seed {seed}: {:.1} messages per CS", r.messages_per_entry);
    }
}

// Reference: §3, Fig. 3: the strawman collapses under contention and latency variance.
#[test]
fn strawman_collapses_where_sigma_does_not() {
    let cfg = SimConfig { max_backlog: Some(300), ..short(6.0, 21) };
    let straw = run(&Strawman(Config::default(), Backoff::Constant { window: Duration::from_secs(1) }), cfg.clone());
    let sigma = run(&Sigma(Config::default()), cfg);
    assert!(straw.throughput < 0.5, "seed 21: strawman {:.3} CS/s at λ = 6", straw.throughput);
    assert!(sigma.throughput > 3.5, "seed 21: sigma {:.3} CS/s at λ = 6", sigma.throughput);
}

// Reference: §2 system model, §4 failure 4: lost and duplicated messages cost time,
// never exclusion; below capacity every waiter is still served. (A lost RELEASE holds
// its replica until the lease runs out, so heavy loss costs a lot of throughput: the
// node acknowledges and retries RELEASE at the transport level.)
#[test]
fn sigma_survives_loss_and_duplication() {
    for seed in [31, 32, 33] {
        let base = short(1.0, seed);
        let drain = Some(base.warmup + base.measure - Duration::from_secs(60));
        let cfg =
            SimConfig { loss: 0.02, duplicate: 0.05, cs: Duration::from_millis(100), arrivals_until: drain, ..base };
        let r = run(&Sigma(Config::default()), cfg);
        assert_exclusive(&r);
        assert!(r.entries > 40, "seed {seed}: only {} CS entries with 2% loss at λ = 1", r.entries);
        assert_eq!(r.waiting_at_end, 0, "seed {seed}: clients never served after a 60 s drain");
    }
}

// Reference: §3 safety analysis: exclusion breaks only when at least 2m − n replicas of
// a quorum reset; every violation the simulator sees must show that.
#[test]
fn violations_need_two_m_minus_n_resets() {
    let config = Config::default().with_quorum(5, 4);
    let cfg = SimConfig {
        cs: Duration::from_secs(1),
        mean_lifetime: Some(Duration::from_secs(3)),
        warmup: Duration::from_secs(10),
        measure: Duration::from_secs(3_000),
        ..SimConfig::paper(3.0, u0200(), 41)
    };
    let r = run(&Sigma(config), cfg);
    assert!(r.resets > 1_000, "seed 41: only {} resets", r.resets);
    assert!(r.exposures > 0, "seed 41: no exposure to check");
    for v in &r.violations {
        assert!(
            v.shared_voters_reset >= 3,
            "seed 41: violation with {} reset shared voters: {v:?}",
            v.shared_voters_reset
        );
    }
}

#[test]
fn runs_are_deterministic() {
    let a = run(&Sigma(Config::default()), short(3.0, 51));
    let b = run(&Sigma(Config::default()), short(3.0, 51));
    let c = run(&Sigma(Config::default()), short(3.0, 52));
    assert_eq!((a.entries, a.events, a.messages_per_entry), (b.entries, b.events, b.messages_per_entry));
    assert_ne!((a.entries, a.events), (c.entries, c.events), "different seeds gave identical runs");
}

// Reference: §4, Fig. 8: with long replica lifetimes resets cost little throughput.
#[test]
fn rare_resets_cost_little() {
    let base = run(&Sigma(Config::default()), short(10.0, 61));
    let cfg = SimConfig { mean_lifetime: Some(Duration::from_secs(10_000)), ..short(10.0, 61) };
    let churn = run(&Sigma(Config::default()), cfg);
    assert_exclusive(&churn);
    assert!(
        churn.throughput >= 0.9 * base.throughput,
        "seed 61: {:.3} vs {:.3} CS/s",
        churn.throughput,
        base.throughput
    );
}
