//! Seeded simulator runs of the two baselines: exclusion without resets and progress at
//! moderate load, each under its own failure model. A failing run names its seed.

use std::time::Duration;

use sigma_behaviour::proto::Config;
use sigma_testnet::baselines::backoff::Backoff;
use sigma_testnet::sim::engine::{run, Report, SimConfig};
use sigma_testnet::sim::latency::Latency;
use sigma_testnet::sim::protocol::{Cmr, Obeidat};

fn short(lambda: f64, seed: u64) -> SimConfig {
    let latency = Latency::Uniform { lo: Duration::ZERO, hi: Duration::from_millis(200) };
    SimConfig {
        warmup: Duration::from_secs(30),
        measure: Duration::from_secs(120),
        ..SimConfig::paper(lambda, latency, seed)
    }
}

fn assert_exclusive_and_live(r: &Report, min_entries: u64) {
    assert!(
        r.violations.is_empty(),
        "seed {}: {} violations, first {:?}",
        r.seed,
        r.violations.len(),
        r.violations.first()
    );
    assert!(r.entries >= min_entries, "seed {}: only {} entries", r.seed, r.entries);
}

fn cmr(delayed: bool) -> Cmr {
    let backoff = Backoff::Exponential { base: Duration::from_millis(200), cap: Duration::from_secs(10) };
    Cmr { config: Config::default().with_quorum(5, 3), backoff, delayed }
}

// CMR §3 (and §4 delayed replies): failure model = crashed clients and late or lost
// messages, grants expire after Δ; here loss and duplication, no resets.
#[test]
fn cmr_is_exclusive_and_live_with_loss() {
    for (seed, delayed) in [(71, false), (72, true)] {
        let cfg = SimConfig { loss: 0.01, duplicate: 0.02, cs: Duration::from_millis(50), ..short(1.0, seed) };
        let r = run(&cmr(delayed), cfg);
        assert_exclusive_and_live(&r, 30);
    }
}

// Obeidat §3/§4.1: failure model = replicas reset (crash-recovery, same id) and are
// rebuilt by RECOVER/UPDATE; the coordinator's reset triggers an election.
#[test]
fn obeidat_is_exclusive_without_resets_and_live_with_them() {
    let config = Config::default().with_quorum(5, 3);
    let calm = run(&Obeidat(config.clone()), SimConfig { cs: Duration::from_millis(50), ..short(2.0, 81) });
    assert_exclusive_and_live(&calm, 200);
    let churn =
        SimConfig { mean_lifetime: Some(Duration::from_secs(100)), cs: Duration::from_millis(50), ..short(2.0, 82) };
    let r = run(&Obeidat(config), churn);
    assert!(r.resets > 0, "seed 82: no reset");
    assert!(r.entries > 100, "seed 82: only {} entries with resets", r.entries);
    assert!(r.violations.is_empty(), "seed 82: {} violations, first {:?}", r.violations.len(), r.violations.first());
}
