//! shared-counter: workers on different nodes increment one counter under a sigma lock,
//! and the counter's store fences stale writers with the lock's fencing token.
//!
//! A lock service cannot stop a holder that was paused past its lease (GC, SIGSTOP, a
//! slow disk) from writing when it wakes up. The protected resource can: it remembers
//! the highest token it has seen and refuses writes carrying a lower one. `--pause-holder`
//! shows exactly that.
//!
//! Run: `cargo run -p sigma-examples --bin shared-counter -- --nodes 4 --increments 10`

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use clap::Parser;
use sigma_node::libp2p::multiaddr::{Multiaddr, Protocol};
use sigma_node::{LockGuard, Node, NodeConfig};
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

/// The lock every worker takes before touching the counter.
const LOCK: &str = "examples/shared-counter";

/// Workers on different nodes increment one counter under a sigma lock; the counter's
/// store refuses writes whose fencing token is older than one it has seen.
#[derive(Parser, Debug)]
struct Args {
    /// Nodes in the local swarm; one worker runs on each.
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Increments per worker.
    #[arg(long, default_value_t = 10)]
    increments: u64,
    /// Time between reading and writing the counter, in ms (the critical section).
    #[arg(long, default_value_t = 5)]
    work_ms: u64,
    /// Lease of the lock, in ms (renewed in the background while held).
    #[arg(long, default_value_t = 1000)]
    lease_ms: u64,
    /// Worker 0 freezes past its lease between its first read and write, to show the
    /// store refusing its stale write.
    #[arg(long)]
    pause_holder: bool,
    /// Give up (exit non-zero) after this many seconds.
    #[arg(long, default_value_t = 60)]
    timeout_s: u64,
}

// ---------------------------------------------------------------------------------------
// The protected resource.
// ---------------------------------------------------------------------------------------

/// A counter store that takes a fencing token with every write. A real store (a
/// database row, an object store) keeps `highest_token` next to the data and checks it
/// in the same transaction as the write.
struct Storage {
    state: watch::Sender<Counter>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counter {
    value: u64,
    highest_token: u64,
    rejected: u64,
}

/// A write refused because a newer lock holder has written already.
#[derive(Debug)]
struct StaleWrite {
    highest_token: u64,
}

impl Storage {
    fn new() -> Self {
        Storage { state: watch::Sender::new(Counter::default()) }
    }

    fn read(&self) -> u64 {
        self.state.borrow().value
    }

    /// Writes `value` unless a write with a higher token has been accepted before. An
    /// equal token is the same holder writing again: sigma never gives two holders the
    /// same token while its guarantee holds (ARCHITECTURE.md, "The guarantee"; the
    /// testnet checker counts an equal token of a different holder as a regression).
    fn write(&self, value: u64, token: u64) -> Result<(), StaleWrite> {
        let mut result = Ok(());
        self.state.send_modify(|c| {
            if token < c.highest_token {
                c.rejected += 1;
                result = Err(StaleWrite { highest_token: c.highest_token });
            } else {
                c.value = value;
                c.highest_token = token;
            }
        });
        result
    }

    /// Resolves once a write with a token above `token` has been accepted.
    async fn written_after(&self, token: u64) {
        let _ = self.state.subscribe().wait_for(|c| c.highest_token > token).await;
    }

    fn snapshot(&self) -> Counter {
        *self.state.borrow()
    }
}

// ---------------------------------------------------------------------------------------
// The swarm and the workers.
// ---------------------------------------------------------------------------------------

fn node_config(lease: Duration, bootstrap: Vec<Multiaddr>) -> NodeConfig {
    let protocol = sigma_node::sigma_behaviour::proto::Config::default().with_lease(lease);
    NodeConfig {
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().expect("valid multiaddr")],
        bootstrap,
        // Loopback: a stopped node is noticed within 1.5 s (pings, membership gossip),
        // which keeps the takeover delay short.
        behaviour: sigma_node::sigma_behaviour::Config::default()
            .with_protocol(protocol)
            .with_ping(Duration::from_millis(200), Duration::from_millis(500))
            .with_gossip(Duration::from_millis(100), 2, Duration::from_millis(500)),
        ..NodeConfig::default()
    }
}

/// Starts `k` nodes on 127.0.0.1, each joining through the ones started before it, and
/// waits until every node is connected to all the others. Returns the nodes and their
/// `/p2p/` addresses.
async fn start_swarm(k: usize, lease: Duration) -> anyhow::Result<(Vec<Node>, Vec<Multiaddr>)> {
    let mut nodes: Vec<Node> = Vec::new();
    let mut addrs: Vec<Multiaddr> = Vec::new();
    for _ in 0..k {
        let node = Node::start(node_config(lease, addrs.clone())).await?;
        let addr = node.listen_addrs().first().context("node has no listen address")?.clone();
        addrs.push(addr.with(Protocol::P2p(node.peer_id())));
        nodes.push(node);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for node in &nodes {
        loop {
            let status = node.handle().status().await?;
            if status.connected_peers.len() + 1 >= k && status.routable_peers + 1 >= k {
                break;
            }
            ensure!(Instant::now() < deadline, "the swarm did not form: {status:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok((nodes, addrs))
}

/// Increments the counter `args.increments` times, each under the lock: read, work,
/// write with the fencing token. A refused write is redone under a new lock.
async fn worker(
    w: usize,
    mut node: Node,
    args: Arc<Args>,
    storage: Arc<Storage>,
    addrs: Vec<Multiaddr>,
) -> anyhow::Result<Node> {
    let mut pause = args.pause_holder && w == 0;
    let mut done = 0;
    while done < args.increments {
        let guard = node.handle().lock(LOCK).await?;
        let token = guard.token();
        let value = storage.read();
        tokio::time::sleep(Duration::from_millis(args.work_ms)).await;

        if pause {
            pause = false;
            let written;
            (node, written) = freeze_then_write(w, node, guard, value, &storage, &args, addrs.clone()).await?;
            done += u64::from(written);
            continue;
        }

        match storage.write(value + 1, token) {
            Ok(()) => done += 1,
            Err(stale) => println!(
                "worker {w}: write with token {token} rejected (storage has seen {}); redoing it",
                stale.highest_token
            ),
        }
        if let Err(e) = guard.release().await {
            eprintln!("worker {w}: release: {e}");
        }
    }
    println!("worker {w}: {done} increments");
    Ok(node)
}

/// `--pause-holder`: the holder freezes between its read and its write, as in a GC pause
/// or a SIGSTOP. In-process, freezing means stopping its node at once: no lease renewals,
/// no RELEASE (seen from the other peers, a frozen node and a crashed one look alike).
/// The lease runs out, the lock moves on, a newer holder writes; then the frozen holder
/// wakes up and writes with its old token. Returns a fresh node and whether the write
/// was accepted.
async fn freeze_then_write(
    w: usize,
    node: Node,
    guard: LockGuard,
    value: u64,
    storage: &Storage,
    args: &Args,
    addrs: Vec<Multiaddr>,
) -> anyhow::Result<(Node, bool)> {
    let token = guard.token();
    let lease = Duration::from_millis(args.lease_ms);
    println!("worker {w}: holding token {token}, read {value}; freezing past the lease ({} ms)", args.lease_ms);
    let frozen = Instant::now();
    drop(node);
    tokio::time::sleep_until(guard.valid_until().into()).await;
    // Stay frozen until a newer holder has written (bounded: past it, the write would
    // simply be accepted and nothing shown).
    let _ = tokio::time::timeout(lease * 10, storage.written_after(token)).await;
    drop(guard);
    let ms = frozen.elapsed().as_millis();
    println!("worker {w}: wakes up after {ms} ms and writes {} with token {token}", value + 1);
    let written = match storage.write(value + 1, token) {
        Ok(()) => {
            println!("worker {w}: stale write accepted (nobody else wrote meanwhile)");
            true
        }
        Err(stale) => {
            println!(
                "worker {w}: stale write rejected by the storage: token {token} < {} (a newer holder's); \
                 redoing the increment under a new lock",
                stale.highest_token
            );
            false
        }
    };
    // Its old node is gone: start a new one, as a restarted process would.
    Ok((Node::start(node_config(lease, addrs)).await?, written))
}

async fn run(args: Arc<Args>) -> anyhow::Result<()> {
    let started = Instant::now();
    let lease = Duration::from_millis(args.lease_ms);
    let (nodes, addrs) = start_swarm(args.nodes, lease).await?;
    println!("swarm: {} nodes on 127.0.0.1, connected in {} ms", nodes.len(), started.elapsed().as_millis());

    let storage = Arc::new(Storage::new());
    let workers: Vec<_> = nodes
        .into_iter()
        .enumerate()
        .map(|(w, node)| tokio::spawn(worker(w, node, args.clone(), storage.clone(), addrs.clone())))
        .collect();
    let mut nodes = Vec::new();
    for w in workers {
        nodes.push(w.await??);
    }
    for node in nodes {
        node.shutdown().await?;
    }

    let counter = storage.snapshot();
    let expected = args.nodes as u64 * args.increments;
    println!("final counter: {} (expected {expected})", counter.value);
    println!("stale writes rejected: {}", counter.rejected);
    println!("elapsed: {} ms", started.elapsed().as_millis());
    ensure!(counter.value == expected, "the counter is wrong: {} instead of {expected}", counter.value);
    ensure!(!args.pause_holder || counter.rejected > 0, "--pause-holder: no stale write was rejected");
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .init();
    let args = Arc::new(Args::parse());
    ensure!(args.nodes >= 1, "--nodes must be at least 1");
    let limit = Duration::from_secs(args.timeout_s);
    tokio::time::timeout(limit, run(args)).await.context("timed out")?
}
