//! The in-process swarm, small enough for CI: 50 peers over the memory transport with
//! the real behaviour, a few seconds of churn with clients contending for locks. After
//! convergence every hosted replica key has exactly one host, the live peer closest to
//! it, and no two holders of a lock ever overlapped. `SIGMA_SWARM_SEED` picks another
//! seed.

use std::time::Duration;

use sigma_testnet::swarm::{self, SwarmOptions, Timing};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_peers_under_churn_agree_on_one_host_per_key_and_keep_exclusion() {
    let seed = std::env::var("SIGMA_SWARM_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(7);
    // Shorter leases and ownership re-lookups than the command's defaults, so that the
    // run fits in seconds: 2 s leases, gossip every 500 ms (liveness 5 s), pings 2 s / 4 s,
    // ownership looked up again every 3 s; the takeover delay follows (≈ 9 s).
    let mut timing = Timing::for_peers(50, Duration::from_secs(2));
    timing.ping = Duration::from_secs(2);
    timing.ping_timeout = Duration::from_secs(4);
    timing.ownership_ttl = Duration::from_secs(3);
    timing.settle = timing.default_settle();
    let opts = SwarmOptions {
        peers: 50,
        duration: Duration::from_secs(6),
        churn: 0.5,
        clients: 8,
        resources: 4,
        seed,
        n: 32,
        m: 24,
        hold: Duration::from_millis(30),
        think: Duration::from_millis(100),
        acquire_timeout: Duration::from_secs(15),
        max_connections: 64,
        join_rate: 100.0,
        form_timeout: Duration::from_secs(20),
        lookups: 10,
        timing,
    };
    let report = swarm::run(&opts).await.expect("the swarm runs");
    let summary = swarm::render(&report);
    println!("{summary}");
    // A peer serves once a Kademlia bootstrap has completed; on a loaded machine a few
    // are still joining when the workload starts.
    assert!(report.serving_end * 10 >= report.live_end * 9, "peers serve at the end (seed {seed})\n{summary}");
    assert!(report.left >= 2 && report.joined == report.left, "churn happened (seed {seed})\n{summary}");
    assert!(report.entries > 0, "clients entered critical sections (seed {seed})\n{summary}");
    assert_eq!(report.violations, 0, "exclusion held (seed {seed})\n{summary}");
    let a = &report.agreement;
    assert!(a.hosted > 0, "keys are hosted after convergence (seed {seed})\n{summary}");
    assert_eq!(a.agree, a.hosted, "one host per key, the closest live peer (seed {seed})\n{summary}");
    assert!(report.replay_reached_pct >= 99.0, "lookups reach the closest peer (seed {seed})\n{summary}");
    // The membership's figures are measured: traffic in every phase, every kill
    // followed, and each killed peer either dropped by some view or still held by one.
    assert!(report.membership.iter().all(|m| m.peer_s > 0.0 && m.bytes_out_per_s > 0.0), "{summary}");
    assert!(report.membership[2].bytes_in_per_s > 0.0 && report.membership[2].pings_per_s > 0.0, "{summary}");
    assert_eq!(report.kills, report.left, "{summary}");
    assert!(report.detection.n as u64 + report.undetected > 0, "{summary}");
}
