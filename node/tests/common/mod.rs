//! Helpers shared by the node tests: real TCP + noise swarms on 127.0.0.1.
#![allow(dead_code)] // each test binary uses a different subset

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sigma_node::libp2p::multiaddr::Protocol;
use sigma_node::libp2p::Multiaddr;
use sigma_node::sigma_behaviour::{proto, Config};
use sigma_node::{Node, NodeConfig, NodeHandle};

/// Logs to the test output when `RUST_LOG` is set.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A node on 127.0.0.1 (random TCP port) with quorum (n, m) and the given lease.
///
/// The core's request timeout is kept well below the lease: the client assumes an
/// unsolicited grant spent up to one request timeout in flight, so with
/// `request_timeout >= lease` (the default request timeout is 2 s) a vote handed on by a
/// replica would count as already lapsed (see the node's report on this).
pub fn config(n: usize, m: usize, lease: Duration) -> NodeConfig {
    let protocol = proto::Config::default().with_quorum(n, m).with_lease(lease).with_request_timeout(lease / 4);
    NodeConfig {
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()],
        // Fast liveness pings and gossip: the takeover delay (lease + liveness timeout +
        // 1 s) stays short.
        behaviour: Config::default()
            .with_protocol(protocol)
            .with_ping(Duration::from_millis(200), Duration::from_millis(500))
            .with_gossip(Duration::from_millis(100), 2, Duration::from_millis(500)),
        ..NodeConfig::default()
    }
}

/// The node's first listen address with `/p2p/<peer id>` appended.
pub fn dial_addr(node: &Node) -> Multiaddr {
    let mut addr = node.listen_addrs().first().expect("listening").clone();
    addr.push(Protocol::P2p(node.peer_id()));
    addr
}

/// Starts `count` nodes; all bootstrap from the first.
pub async fn swarm(count: usize, base: &NodeConfig) -> Vec<Node> {
    let first = Node::start(base.clone()).await.expect("first node starts");
    let boot = dial_addr(&first);
    let mut nodes = vec![first];
    for _ in 1..count {
        let node =
            Node::start(NodeConfig { bootstrap: vec![boot.clone()], ..base.clone() }).await.expect("node starts");
        nodes.push(node);
    }
    nodes
}

/// Polls `check` every 20 ms until it returns true; panics after `timeout`.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every handle is connected to, and routes to, at least `peers` others.
pub async fn wait_mesh(handles: &[NodeHandle], peers: usize) -> Duration {
    wait_for("the swarm to form", Duration::from_secs(20), || async {
        for h in handles {
            let s = h.status().await.expect("node running");
            if s.connected_peers.len() < peers || s.routable_peers < peers {
                return false;
            }
        }
        true
    })
    .await
}

/// The mutual-exclusion checker: who is inside, how often, with which tokens.
#[derive(Default)]
pub struct Checker {
    inside: AtomicUsize,
    pub entries: AtomicU64,
    pub overlaps: AtomicU64,
    pub regressions: AtomicU64,
    pub lost: AtomicU64,
    last_token: Mutex<u64>,
}

impl Checker {
    /// Called right after a lock is won.
    pub fn enter(&self, token: u64) {
        if self.inside.fetch_add(1, Ordering::SeqCst) > 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let mut last = self.last_token.lock().unwrap();
        if token <= *last {
            self.regressions.fetch_add(1, Ordering::SeqCst);
        }
        *last = token.max(*last);
        self.entries.fetch_add(1, Ordering::SeqCst);
    }

    /// Called right before the lock is released.
    pub fn exit(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    pub fn entries(&self) -> u64 {
        self.entries.load(Ordering::SeqCst)
    }

    pub fn summary(&self) -> String {
        format!(
            "entries {}, overlaps {}, token regressions {}, lost {}",
            self.entries.load(Ordering::SeqCst),
            self.overlaps.load(Ordering::SeqCst),
            self.regressions.load(Ordering::SeqCst),
            self.lost.load(Ordering::SeqCst)
        )
    }
}

/// One critical section: lock, check in, hold briefly, check out, release.
pub async fn critical_section(
    handle: &NodeHandle,
    name: &str,
    checker: &Checker,
    wait: Duration,
) -> Result<(), String> {
    let guard = handle.lock_timeout(name, wait).await.map_err(|e| format!("lock on {}: {e}", handle.peer_id()))?;
    checker.enter(guard.token());
    // Hold for a moment so that an overlapping holder would be seen.
    tokio::time::sleep(Duration::from_millis(2)).await;
    checker.exit();
    match guard.release().await {
        Ok(()) => Ok(()),
        Err(sigma_node::LockError::Lost) => {
            checker.lost.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        Err(e) => Err(format!("release: {e}")),
    }
}
