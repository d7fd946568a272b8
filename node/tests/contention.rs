//! 8 nodes in one swarm, 16 tasks contending for one lock, 20 critical sections each:
//! never two holders at once, every acquisition completes, fencing tokens increase.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{critical_section, Checker};
use sigma_node::NodeHandle;
use tokio::task::JoinSet;

const NODES: usize = 8;
const TASKS: usize = 16;
const ROUNDS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_on_eight_nodes_take_turns() {
    common::init_tracing();
    let nodes = common::swarm(NODES, &common::config(16, 12, Duration::from_secs(2))).await;
    let handles: Vec<NodeHandle> = nodes.iter().map(|n| n.handle()).collect();
    let formed = common::wait_mesh(&handles, NODES - 1).await;
    eprintln!("swarm of {NODES} formed in {formed:?}");

    let checker = Arc::new(Checker::default());
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for t in 0..TASKS {
        let handle = handles[t % NODES].clone();
        let checker = checker.clone();
        tasks.spawn(async move {
            for _ in 0..ROUNDS {
                critical_section(&handle, "contended", &checker, Duration::from_secs(30)).await?;
            }
            Ok::<(), String>(())
        });
    }
    let all = tokio::time::timeout(Duration::from_secs(90), async {
        while let Some(r) = tasks.join_next().await {
            r.expect("task panicked").expect("critical section failed");
        }
    })
    .await;
    let elapsed = start.elapsed();
    eprintln!("{} in {elapsed:?}", checker.summary());
    assert!(all.is_ok(), "not finished after 90 s: {}", checker.summary());
    assert_eq!(checker.entries(), (TASKS * ROUNDS) as u64, "{}", checker.summary());
    assert!(checker.overlaps().is_empty(), "{}", checker.summary());
    assert!(checker.regressions().is_empty(), "{}", checker.summary());
    assert_eq!(checker.lost.load(std::sync::atomic::Ordering::SeqCst), 0, "{}", checker.summary());

    // Nothing is left held or waiting, and every node served some replicas.
    let mut hosted = 0;
    for h in &handles {
        let s = h.status().await.unwrap();
        assert!(s.locks_held.is_empty() && s.locks_waiting.is_empty(), "{s:?}");
        assert_eq!(s.token_regressions, 0);
        hosted += h.hosted_replicas("contended").await.unwrap().len();
    }
    assert_eq!(hosted, 16, "each of the 16 replicas hosted exactly once");
    for node in nodes {
        node.shutdown().await.unwrap();
    }
}
