//! Churn while tasks contend for one lock: a replica host shuts down and comes back
//! with the same identity and empty memory (the paper's replica reset), a fresh node
//! joins, another replica host crashes and comes back. Locks keep being granted after
//! every fault, and never to two holders at once.

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{critical_section, Checker};
use sigma_node::libp2p::kad::KBucketKey;
use sigma_node::libp2p::multiaddr::Protocol;
use sigma_node::libp2p::{Multiaddr, PeerId};
use sigma_node::sigma_behaviour::wire;
use sigma_node::{Node, NodeConfig, NodeHandle};
use tokio::task::JoinSet;

const NODES: usize = 6;
const N: usize = 16;
const M: usize = 12;
const LEASE: Duration = Duration::from_secs(2);
/// Critical sections that must complete after each fault.
const PROGRESS: u64 = 20;

/// How many of the lock's replicas each peer is closest to.
fn placement(name: &str, peers: &[PeerId]) -> Vec<usize> {
    let mut hosted = vec![0; peers.len()];
    for i in 0..N {
        let key = KBucketKey::new(wire::replica_name(name, i as u16).into_bytes());
        let closest = (0..peers.len()).min_by_key(|&p| KBucketKey::from(peers[p]).distance(&key)).unwrap();
        hosted[closest] += 1;
    }
    hosted
}

async fn progress(checker: &Checker, what: &str, handles: &[NodeHandle], name: &str) -> Duration {
    let from = checker.entries();
    let start = Instant::now();
    while checker.entries() < from + PROGRESS {
        // A fault costs about one takeover delay (≈ 4.5 s here); the rest is slack for a
        // loaded 2-core machine.
        if start.elapsed() > Duration::from_secs(30) {
            dump(handles, name).await;
            panic!("no progress within 30 s after: {what} ({})", checker.summary());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = start.elapsed();
    eprintln!("{what}: {PROGRESS} critical sections in {took:?} ({})", checker.summary());
    took
}

/// Prints every reachable node's view of the lock (for a failed run).
async fn dump(handles: &[NodeHandle], name: &str) {
    for h in handles {
        let Ok(status) = h.status().await else { continue };
        eprintln!(
            "node {}: connected {}, routable {}, waiting {:?}",
            h.peer_id(),
            status.connected_peers.len(),
            status.routable_peers,
            status.locks_waiting
        );
        for r in h.hosted_replicas(name).await.unwrap_or_default() {
            eprintln!("  replica {}: owner {:?} queue {:?}", r.index, r.owner, r.queue);
        }
        if let Ok(s) = h.counters().await {
            eprintln!("  {:?}\n  {:?}", s.counters, s.replicas);
        }
    }
}

fn all_handles(nodes: &[Option<Node>]) -> Vec<NodeHandle> {
    nodes.iter().flatten().map(|n| n.handle()).collect()
}

fn plain(addr: &Multiaddr) -> Multiaddr {
    addr.iter().filter(|p| !matches!(p, Protocol::P2p(_))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_keep_being_granted_through_churn() {
    common::init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let key = |i: usize| -> PathBuf { dir.path().join(format!("node-{i}/key")) };
    let base = common::config(N, M, LEASE);
    let config = |i: usize| NodeConfig { key_file: Some(key(i)), ..base.clone() };

    let first = Node::start(config(0)).await.unwrap();
    let boot = common::dial_addr(&first);
    let mut nodes: Vec<Option<Node>> = vec![Some(first)];
    for i in 1..NODES {
        nodes.push(Some(Node::start(NodeConfig { bootstrap: vec![boot.clone()], ..config(i) }).await.unwrap()));
    }
    let handles: Vec<NodeHandle> = nodes.iter().flatten().map(|n| n.handle()).collect();
    common::wait_mesh(&handles, NODES - 1).await;

    // Clients run on nodes 0..4; nodes 4 and 5 are the victims. Pick a lock name that
    // each victim hosts more than n − m replicas of: while a victim is down, no quorum
    // exists unless its replicas move to the next closest peers (empty: a reset), and
    // fewer than 2m − n, so that those resets alone cannot break exclusion.
    let peers: Vec<PeerId> = handles.iter().map(|h| h.peer_id()).collect();
    let name = (0..)
        .map(|k| format!("churn/{k}"))
        .find(|name| {
            let p = placement(name, &peers);
            (N - M + 1..2 * M - N).contains(&p[4]) && (N - M + 1..2 * M - N).contains(&p[5])
        })
        .unwrap();
    eprintln!("lock {name}: replicas per node {:?}", placement(&name, &peers));

    let checker = Arc::new(Checker::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = JoinSet::new();
    for t in 0..8 {
        let (handle, checker, stop, name) = (handles[t % 4].clone(), checker.clone(), stop.clone(), name.clone());
        tasks.spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                critical_section(&handle, &name, &checker, Duration::from_secs(30)).await?;
            }
            Ok::<(), String>(())
        });
    }
    let started = Instant::now();
    progress(&checker, "before any fault", &all_handles(&nodes), &name).await;
    let hosted = handles[4].hosted_replicas(&name).await.unwrap().len();
    assert!(hosted > N - M, "victim hosts {hosted} replicas");

    // Fault 1: a replica host shuts down.
    let victim = nodes[4].take().unwrap();
    let victim_peer = victim.peer_id();
    let victim_addr = plain(&victim.listen_addrs()[0]);
    victim.shutdown().await.unwrap();
    progress(&checker, "replica host down", &all_handles(&nodes), &name).await;

    // Fault 2: it comes back with the same identity (same key file, same address) and
    // empty memory.
    let back = Node::start(NodeConfig { listen: vec![victim_addr], bootstrap: vec![boot.clone()], ..config(4) })
        .await
        .unwrap();
    assert_eq!(back.peer_id(), victim_peer, "same identity after restart");
    let back_handle = back.handle();
    nodes[4] = Some(back);
    progress(&checker, "replica host restarted", &all_handles(&nodes), &name).await;
    common::wait_for("the restarted node to host its replicas again", Duration::from_secs(20), || async {
        back_handle.hosted_replicas(&name).await.unwrap().len() > N - M
    })
    .await;
    let counters = back_handle.counters().await.unwrap().counters;
    assert!(counters.replicas_created > (N - M) as u64, "restarted with empty memory: {counters:?}");

    // Fault 3: a fresh node (new identity) joins.
    let fresh = Node::start(NodeConfig { bootstrap: vec![boot.clone()], ..base.clone() }).await.unwrap();
    let fresh_handle = fresh.handle();
    common::wait_for("the fresh node to join", Duration::from_secs(20), || async {
        fresh_handle.status().await.unwrap().connected_peers.len() >= NODES - 1
    })
    .await;
    nodes.push(Some(fresh));
    progress(&checker, "fresh node joined", &all_handles(&nodes), &name).await;

    // Fault 4: another replica host crashes (no shutdown: its event loop is aborted)
    // and comes back with the same identity.
    let crashed = nodes[5].take().unwrap();
    let crashed_addr = plain(&crashed.listen_addrs()[0]);
    drop(crashed);
    progress(&checker, "replica host crashed", &all_handles(&nodes), &name).await;
    let back = Node::start(NodeConfig { listen: vec![crashed_addr], bootstrap: vec![boot.clone()], ..config(5) })
        .await
        .unwrap();
    nodes[5] = Some(back);
    progress(&checker, "crashed host restarted", &all_handles(&nodes), &name).await;

    stop.store(true, Ordering::SeqCst);
    let finished = tokio::time::timeout(Duration::from_secs(60), async {
        let mut errors = Vec::new();
        while let Some(r) = tasks.join_next().await {
            if let Err(e) = r.expect("task panicked") {
                errors.push(e);
            }
        }
        errors
    })
    .await
    .expect("clients finish");
    eprintln!("churn: {} in {:?}", checker.summary(), started.elapsed());
    assert!(finished.is_empty(), "clients failed: {finished:?}");
    assert!(checker.overlaps().is_empty(), "{}", checker.summary());
    assert!(checker.regressions().is_empty(), "{}", checker.summary());
    for node in nodes.into_iter().flatten() {
        node.shutdown().await.unwrap();
    }
}
