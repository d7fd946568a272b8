//! Helpers shared by the node tests: real TCP + noise swarms on 127.0.0.1.
#![allow(dead_code)] // each test binary uses a different subset

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sigma_node::libp2p::multiaddr::Protocol;
use sigma_node::libp2p::{Multiaddr, PeerId};
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

/// Starts `count` nodes ([`swarm`]) with tracing on, and waits until each is meshed with
/// all the others ([`wait_mesh`]): the nodes and their handles.
pub async fn meshed(count: usize, base: &NodeConfig) -> (Vec<Node>, Vec<NodeHandle>) {
    init_tracing();
    let nodes = swarm(count, base).await;
    let handles: Vec<NodeHandle> = nodes.iter().map(|n| n.handle()).collect();
    wait_mesh(&handles, count - 1).await;
    (nodes, handles)
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

/// One critical section as its holder saw it: entered when the lock was handed over,
/// left just before the release was sent. `valid_until` is the guard's deadline as it
/// was left (the holder's contract: exclusion is guaranteed until then, unless released).
#[derive(Clone, Copy, Debug)]
pub struct Cs {
    /// The node the lock was taken through.
    pub peer: PeerId,
    pub token: u64,
    pub enter: Instant,
    pub exit: Instant,
    pub valid_until: Instant,
}

/// The mutual-exclusion checker of one lock, over intervals (the idea of sigma-testnet's
/// `testnet::check`): every critical section is recorded, and any two that overlap are
/// a violation, unless the earlier one went on past its `valid_until` and the later one
/// entered only after that deadline with a larger token (what fencing tokens are for).
/// Tokens must grow from one section to the next, in order of entry.
///
/// Each section holds the lock for a time drawn from the checker's seed, 1 to 12 ms
/// (about one handoff here), so that the sections cover much of the run: a second
/// holder granted while the first still holds, by a mechanism acting on that time scale
/// (a vote let go too early, say), falls inside an interval.
pub struct Checker {
    start: Instant,
    seed: u64,
    draws: AtomicU64,
    sections: Mutex<Vec<Cs>>,
    pub lost: AtomicU64,
}

impl Default for Checker {
    fn default() -> Self {
        Checker::with_seed(1)
    }
}

/// splitmix64: a seeded sequence with no dependency.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Checker {
    pub fn with_seed(seed: u64) -> Self {
        Checker {
            start: Instant::now(),
            seed,
            draws: AtomicU64::new(0),
            sections: Mutex::new(Vec::new()),
            lost: AtomicU64::new(0),
        }
    }

    /// How long the next critical section holds the lock: 1 to 12 ms.
    pub fn next_hold(&self) -> Duration {
        let k = self.draws.fetch_add(1, Ordering::SeqCst);
        Duration::from_millis(1 + splitmix64(self.seed ^ k.wrapping_mul(0x2545_f491_4f6c_dd1d)) % 12)
    }

    /// Records a critical section (called right before its release).
    pub fn record(&self, cs: Cs) {
        self.sections.lock().unwrap().push(cs);
    }

    /// Critical sections recorded so far.
    pub fn entries(&self) -> u64 {
        self.sections.lock().unwrap().len() as u64
    }

    /// The sections in order of entry.
    fn sorted(&self) -> Vec<Cs> {
        let mut v = self.sections.lock().unwrap().clone();
        v.sort_by_key(|c| (c.enter, c.exit));
        v
    }

    /// Pairs of overlapping sections (earlier, later) that are violations.
    pub fn overlaps(&self) -> Vec<(Cs, Cs)> {
        let after_expiry = |a: &Cs, b: &Cs| a.exit > a.valid_until && b.enter >= a.valid_until && b.token > a.token;
        let mut found = Vec::new();
        let mut open: Vec<Cs> = Vec::new();
        for b in self.sorted() {
            open.retain(|a| a.exit > b.enter);
            found.extend(open.iter().filter(|a| !after_expiry(a, &b)).map(|a| (*a, b)));
            open.push(b);
        }
        found
    }

    /// Successive sections (by entry) whose tokens did not increase.
    pub fn regressions(&self) -> Vec<(Cs, Cs)> {
        self.sorted().windows(2).filter(|w| w[1].token <= w[0].token).map(|w| (w[0], w[1])).collect()
    }

    fn show(&self, c: &Cs) -> String {
        let ms = |t: Instant| t.saturating_duration_since(self.start).as_secs_f64() * 1e3;
        format!(
            "[{:.1}, {:.1}] ms token {} via {} (valid until {:.1})",
            ms(c.enter),
            ms(c.exit),
            c.token,
            c.peer,
            ms(c.valid_until)
        )
    }

    pub fn summary(&self) -> String {
        let (overlaps, regressions) = (self.overlaps(), self.regressions());
        let first = |v: &[(Cs, Cs)]| {
            v.first().map_or(String::new(), |(a, b)| format!(" (first: {} and {})", self.show(a), self.show(b)))
        };
        format!(
            "entries {}, overlaps {}{}, token regressions {}{}, lost {}",
            self.entries(),
            overlaps.len(),
            first(&overlaps),
            regressions.len(),
            first(&regressions),
            self.lost.load(Ordering::SeqCst)
        )
    }
}

/// One critical section: lock, hold for a drawn time, record, release.
pub async fn critical_section(
    handle: &NodeHandle,
    name: &str,
    checker: &Checker,
    wait: Duration,
) -> Result<(), String> {
    let guard = handle.lock_timeout(name, wait).await.map_err(|e| format!("lock on {}: {e}", handle.peer_id()))?;
    let enter = Instant::now();
    tokio::time::sleep(checker.next_hold()).await;
    let cs = Cs {
        peer: handle.peer_id(),
        token: guard.token(),
        enter,
        exit: Instant::now(),
        valid_until: guard.valid_until(),
    };
    checker.record(cs);
    match guard.release().await {
        Ok(()) => Ok(()),
        Err(sigma_node::LockError::Lost) => {
            checker.lost.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        Err(e) => Err(format!("release: {e}")),
    }
}
