//! `sigma-testnet bench` end to end on a small swarm: every phase runs and the figures
//! are sane (no timing is asserted).

use std::time::Duration;

use sigma_testnet::bench::{run, BenchOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_benchmark_runs_every_phase() {
    let opts = BenchOptions { nodes: 4, n: 8, m: 6, rounds: 10, waiters: 4, contended: Duration::from_secs(2) };
    let (r, summary) = run(&opts).await.expect("benchmark");
    assert_eq!(r.overlaps, 0, "{summary}");
    assert!(r.pass() && summary.contains("[PASS] no overlapping critical sections: 0"), "{summary}");
    assert!(summary.contains("uncontended acquire <= 1.2x the floor"), "{summary}");
    assert!(r.contended_entries > 0, "{summary}");
    assert!(r.floor_p50_ms.is_finite() && r.acquire_p50_ms > 0.0, "{summary}");
    // Every CS entry costs at least a REQUEST and a RESPONSE per vote and a RELEASE to all.
    assert!(r.messages_per_entry >= (2 * opts.m + opts.n) as f64, "{summary}");
}
