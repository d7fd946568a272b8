//! Bounded connections: a dial storm against a node with small bounds leaves it at or
//! under them, and it keeps serving.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use libp2p::swarm::{dummy, SwarmEvent};
use libp2p::{noise, tcp, yamux, Swarm, SwarmBuilder};
use sigma_node::{ConnectionBounds, Node, NodeConfig};

mod common;

const STORM: usize = 40;

/// A peer that only connects (and keeps its connection for a minute).
fn stormer() -> Swarm<dummy::Behaviour> {
    SwarmBuilder::with_new_identity()
        .with_tokio()
        .with_tcp(tcp::Config::default().nodelay(true), noise::Config::new, yamux::Config::default)
        .expect("tcp transport")
        .with_behaviour(|_| dummy::Behaviour)
        .expect("behaviour")
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(60)))
        .build()
}

/// Drives a stormer until `stop`, counting its open connections in `connected`; the
/// first outcome of its dials (a connection, a close or a failed dial) bumps `settled`.
async fn drive(
    mut s: Swarm<dummy::Behaviour>,
    stop: Arc<AtomicBool>,
    connected: Arc<AtomicUsize>,
    settled: Option<Arc<AtomicUsize>>,
) {
    let mut first = true;
    while !stop.load(Ordering::Relaxed) {
        let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(50), s.next()).await else { continue };
        match event {
            SwarmEvent::ConnectionEstablished { .. } => {
                connected.fetch_add(1, Ordering::SeqCst);
            }
            SwarmEvent::ConnectionClosed { .. } => {
                connected.fetch_sub(1, Ordering::SeqCst);
            }
            SwarmEvent::OutgoingConnectionError { .. } => {}
            _ => continue,
        }
        if let Some(settled) = settled.as_ref().filter(|_| std::mem::take(&mut first)) {
            settled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dial_storm_stays_within_the_connection_bounds() {
    common::init_tracing();
    let bounds = ConnectionBounds {
        max_established: 8,
        max_established_incoming: 6,
        max_established_per_peer: 1,
        max_pending_incoming: 4,
        ..ConnectionBounds::default()
    };
    let node = Node::start(NodeConfig { bounds, ..common::config(5, 3, Duration::from_secs(2)) }).await.unwrap();
    let h = node.handle();
    let addr = common::dial_addr(&node);

    // Every stormer dials twice at once and reports its first outcome; then it keeps
    // its connection (if any) until the end.
    let (settled, connected, stop) =
        (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let mut tasks = Vec::new();
    for _ in 0..STORM {
        let (addr, settled, connected, stop) = (addr.clone(), settled.clone(), connected.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut s = stormer();
            s.dial(addr.clone()).expect("dial");
            s.dial(addr).expect("dial");
            drive(s, stop, connected, Some(settled)).await;
        }));
    }
    // The node's count, sampled throughout the storm.
    let peak = Arc::new(AtomicU32::new(0));
    let sampler = {
        let (h, peak, stop) = (h.clone(), peak.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(h.status().await.unwrap().connections, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        })
    };
    common::wait_for("every stormer to hear back", Duration::from_secs(30), || {
        let settled = settled.clone();
        async move { settled.load(Ordering::SeqCst) == STORM }
    })
    .await;
    // Connections the node denied after the handshake close on the stormer's side a
    // moment later: wait until both sides agree.
    let agreed = common::wait_for("both sides to count the same connections", Duration::from_secs(10), || {
        let (h, connected) = (h.clone(), connected.clone());
        async move { h.status().await.unwrap().connections as usize == connected.load(Ordering::SeqCst) }
    })
    .await;
    let kept = connected.load(Ordering::SeqCst);
    let peak = peak.load(Ordering::SeqCst);
    eprintln!(
        "storm of {STORM} peers × 2 dials: peak {peak} connections at the node, {kept} kept (agreed after {agreed:?})"
    );
    assert!(peak <= 8, "peak {peak} connections: over the bound of 8");
    assert!(kept <= 6, "{kept} incoming connections kept: over the bound of 6");
    assert!(kept >= 1, "the node accepted nobody");

    // It still serves its own locks (a one-node swarm).
    let g = tokio::time::timeout(Duration::from_secs(20), h.lock("after-the-storm")).await.expect("in time").unwrap();
    g.release().await.unwrap();
    stop.store(true, Ordering::Relaxed);
    sampler.await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    node.shutdown().await.unwrap();
}

/// Connection trimming: a node bounded to 8 connections (watermarks 6 and 4) whose peers
/// all connect and then stay idle (idle timeout a minute on both sides) closes the least
/// recently used down to 4 within seconds, so a newcomer finds room; without trimming
/// all 8 stay until the idle timeout and the newcomer is refused, and with trimming that
/// stops at the high watermark 6 stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_peers_past_the_high_watermark_are_trimmed_and_a_newcomer_finds_room() {
    common::init_tracing();
    let bounds = ConnectionBounds {
        max_established: 8,
        max_established_incoming: 8,
        max_established_per_peer: 1,
        ..ConnectionBounds::default()
    };
    assert_eq!(bounds.watermarks(), (6, 4));
    let config = NodeConfig {
        bounds,
        idle_connection_timeout: Duration::from_secs(60),
        ..common::config(5, 3, Duration::from_secs(2))
    };
    let node = Node::start(config).await.unwrap();
    let h = node.handle();
    let addr = common::dial_addr(&node);

    let stop = Arc::new(AtomicBool::new(false));
    let connect = |stop: Arc<AtomicBool>, connected: Arc<AtomicUsize>| {
        let addr = addr.clone();
        tokio::spawn(async move {
            let mut s = stormer();
            s.dial(addr).expect("dial");
            drive(s, stop, connected, None).await;
        })
    };
    // Two peers first and six a second later: the first pass past the high watermark
    // finds only the two idle for its grace, and trimming must go on to the low one as
    // the others go idle (it once stopped at the high watermark).
    let first = Arc::new(AtomicUsize::new(0));
    let mut tasks: Vec<_> = (0..2).map(|_| connect(stop.clone(), first.clone())).collect();
    common::wait_for("2 peers connected", Duration::from_secs(20), || {
        let first = first.clone();
        async move { first.load(Ordering::SeqCst) == 2 }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    tasks.extend((0..6).map(|_| connect(stop.clone(), first.clone())));
    common::wait_for("8 peers connected", Duration::from_secs(20), || {
        let first = first.clone();
        async move { first.load(Ordering::SeqCst) == 8 }
    })
    .await;
    let trimmed = common::wait_for("the node to trim down to the low watermark", Duration::from_secs(20), || {
        let h = h.clone();
        async move { h.status().await.unwrap().connections <= 4 }
    })
    .await;
    eprintln!("8 idle peers: trimmed to ≤ 4 connections after {trimmed:?}");
    // The peers learn of a close a moment after the node (seen once in CI under load:
    // still 5 on their side when the node said 4).
    common::wait_for("the peers to see their connections closed", Duration::from_secs(10), || {
        let first = first.clone();
        async move { first.load(Ordering::SeqCst) <= 4 }
    })
    .await;

    let newcomer = Arc::new(AtomicUsize::new(0));
    tasks.push(connect(stop.clone(), newcomer.clone()));
    common::wait_for("the newcomer to connect", Duration::from_secs(20), || {
        let newcomer = newcomer.clone();
        async move { newcomer.load(Ordering::SeqCst) == 1 }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    node.shutdown().await.unwrap();
}
