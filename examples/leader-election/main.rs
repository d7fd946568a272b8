//! leader-election: nodes campaign for the lock "leader" with their name as the lock's
//! value; the holder leads until its lock is lost, then steps down and campaigns again.
//! One more node campaigns not and observes (`NodeHandle::observe`): it prints each
//! leader's value as it changes. The demo kills the leader's node (once the observer has
//! seen it lead) and watches another node take over once the dead leader's lease has run
//! out; the observer must have seen every leader, in order.
//!
//! Run: `cargo run -p sigma-examples --bin leader-election -- --nodes 4`

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use clap::Parser;
use sigma_node::libp2p::multiaddr::{Multiaddr, Protocol};
use sigma_node::{LockError, LockOptions, Node, NodeConfig, NodeHandle};
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

/// The lock whose holder is the leader.
const LOCK: &str = "examples/leader";

/// Leader election with a sigma lock: kill the leader, watch another node take over.
#[derive(Parser, Debug)]
struct Args {
    /// Nodes in the local swarm; every one campaigns.
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Lease of the lock, in ms: how long a dead leader keeps the lock.
    #[arg(long, default_value_t = 2000)]
    lease_ms: u64,
    /// How long each leader leads before the demo kills its node, in ms.
    #[arg(long, default_value_t = 3000)]
    kill_after_ms: u64,
    /// Leaders to kill, one after the other (fewer than --nodes).
    #[arg(long, default_value_t = 1)]
    kills: usize,
    /// Interval of the leader's heartbeat, in ms.
    #[arg(long, default_value_t = 500)]
    heartbeat_ms: u64,
    /// Fail if no new leader is in office this long after a kill, in ms (default: 3
    /// leases plus the liveness timeout and the takeover delay: the dead leader's node
    /// is noticed gone, the replicas it hosted move to other nodes, which grant them only
    /// after every vote it gave has run out).
    #[arg(long)]
    takeover_bound_ms: Option<u64>,
}

// ---------------------------------------------------------------------------------------
// Who leads: a shared record, which is how the demo checks that two leaders never overlap.
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Term {
    node: usize,
    token: u64,
    since: Instant,
    until: Option<Instant>,
}

struct Office {
    start: Instant,
    /// The leader in office, if any.
    current: watch::Sender<Option<Term>>,
    /// Every term, in order.
    terms: Mutex<Vec<(Term, &'static str)>>,
    overlaps: Mutex<Vec<String>>,
    /// The leaders' tokens the observer saw, in the order it saw them.
    observed: watch::Sender<Vec<u64>>,
}

impl Office {
    fn new() -> Self {
        Office {
            start: Instant::now(),
            current: watch::Sender::new(None),
            terms: Mutex::new(Vec::new()),
            overlaps: Mutex::new(Vec::new()),
            observed: watch::Sender::new(Vec::new()),
        }
    }

    fn ms(&self, t: Instant) -> u128 {
        t.duration_since(self.start).as_millis()
    }

    fn log(&self, line: &str) {
        println!("[{:>6} ms] {line}", self.ms(Instant::now()));
    }

    fn take_office(&self, node: usize, token: u64) {
        self.log(&format!("node {node}: leader (token {token})"));
        let term = Term { node, token, since: Instant::now(), until: None };
        self.current.send_modify(|current| {
            if let Some(other) = current {
                let msg = format!("node {node} became leader while node {} still was", other.node);
                self.log(&format!("OVERLAP: {msg}"));
                self.overlaps.lock().unwrap().push(msg);
            }
            *current = Some(term);
        });
    }

    /// Ends `node`'s term, if it is in office.
    fn leave_office(&self, node: usize, why: &'static str) {
        let mut ended = None;
        self.current.send_if_modified(|current| match current {
            Some(t) if t.node == node => {
                ended = current.take();
                true
            }
            _ => false,
        });
        if let Some(mut term) = ended {
            term.until = Some(Instant::now());
            self.terms.lock().unwrap().push((term, why));
            self.log(&format!("node {node}: out of office ({why})"));
        }
    }

    /// The leader's periodic work; nothing once out of office.
    fn heartbeat(&self, node: usize, beats: u64) {
        if self.current.borrow().is_some_and(|t| t.node == node) {
            self.log(&format!("node {node}: leader heartbeat {beats}"));
        }
    }

    /// Waits until the observer has seen the leader in office (up to `bound`), whoever it
    /// is by then; true if nobody is in office.
    async fn observed_current(&self, bound: Duration) -> bool {
        let (mut current, mut seen) = (self.current.subscribe(), self.observed.subscribe());
        let wait = async {
            loop {
                let Some(term) = *current.borrow_and_update() else { return };
                if seen.borrow_and_update().contains(&term.token) {
                    return;
                }
                tokio::select! {
                    _ = current.changed() => {}
                    _ = seen.changed() => {}
                }
            }
        };
        tokio::time::timeout(bound, wait).await.is_ok()
    }

    /// Waits until a node other than `not` leads (up to `bound`).
    async fn next_leader(&self, not: Option<usize>, bound: Duration) -> Option<Term> {
        let mut rx = self.current.subscribe();
        let leader = rx.wait_for(|c| c.is_some_and(|t| Some(t.node) != not));
        let term = *tokio::time::timeout(bound, leader).await.ok()?.ok()?;
        term
    }
}

// ---------------------------------------------------------------------------------------
// The campaign each node runs.
// ---------------------------------------------------------------------------------------

/// Campaigns until `stop`: take the lock, lead (heartbeats) until the lock is lost,
/// step down, campaign again.
async fn campaign(
    node: usize,
    handle: NodeHandle,
    office: Arc<Office>,
    heartbeat: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let guard = tokio::select! {
            result = handle.lock_with(LOCK, campaign_with(node)) => match result {
                Ok(guard) => guard,
                Err(LockError::NodeStopped) => return, // our node is gone
                Err(e) => {
                    eprintln!("node {node}: campaign failed: {e}");
                    continue;
                }
            },
            _ = stop.wait_for(|s| *s) => return,
        };
        office.take_office(node, guard.token());

        let mut beat = tokio::time::interval(heartbeat);
        let mut beats = 0;
        let why = loop {
            tokio::select! {
                () = guard.lost() => break "lock lost",
                _ = stop.wait_for(|s| *s) => break "demo over",
                _ = beat.tick() => {
                    beats += 1;
                    office.heartbeat(node, beats);
                }
            }
        };
        office.leave_office(node, why);
        let _ = guard.release().await;
        if *stop.borrow() {
            return;
        }
    }
}

/// A candidate's campaign: the lock, with its name as the value observers read.
fn campaign_with(node: usize) -> LockOptions {
    LockOptions { value: Some(format!("node {node}").into_bytes()), ..LockOptions::default() }
}

/// Follows the election from a node that does not campaign: each leader's value, once
/// and in token order, as it changes.
async fn observe(handle: NodeHandle, office: Arc<Office>) {
    let Ok(mut leaders) = handle.observe(LOCK, Some(Duration::from_millis(100))) else { return };
    while let Some(Ok(leader)) = leaders.next().await {
        let (value, token) = (leader.value.unwrap_or_default(), leader.token.unwrap_or(0));
        office.log(&format!("observer: the leader is {value} (token {token})"));
        office.observed.send_modify(|seen| seen.push(token));
    }
}

// ---------------------------------------------------------------------------------------
// The demo.
// ---------------------------------------------------------------------------------------

/// Starts `k` nodes on 127.0.0.1, each joining through the ones started before it, and
/// waits until every node is connected to all the others.
async fn start_swarm(k: usize, lease: Duration) -> anyhow::Result<Vec<Node>> {
    let mut nodes: Vec<Node> = Vec::new();
    let mut addrs: Vec<Multiaddr> = Vec::new();
    for _ in 0..k {
        let node = Node::start(NodeConfig {
            listen: vec!["/ip4/127.0.0.1/tcp/0".parse()?],
            bootstrap: addrs.clone(),
            behaviour: behaviour_config(lease),
            ..NodeConfig::default()
        })
        .await?;
        let addr = node.listen_addrs().first().context("node has no listen address")?.clone();
        addrs.push(addr.with(Protocol::P2p(node.peer_id())));
        nodes.push(node);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for node in &nodes {
        loop {
            let status = node.handle().status().await?;
            if status.ready && status.connected_peers.len() + 1 >= k && status.routable_peers + 1 >= k {
                break;
            }
            ensure!(Instant::now() < deadline, "the swarm did not form: {status:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(nodes)
}

/// The nodes' configuration. Loopback: a killed node is noticed within 1.5 s (pings,
/// membership gossip), which keeps the takeover delay short.
fn behaviour_config(lease: Duration) -> sigma_node::sigma_behaviour::Config {
    sigma_node::sigma_behaviour::Config::default()
        .with_protocol(sigma_node::sigma_behaviour::proto::Config::default().with_lease(lease))
        .with_ping(Duration::from_millis(200), Duration::from_millis(500))
        .with_gossip(Duration::from_millis(100), 2, Duration::from_millis(500))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let lease = Duration::from_millis(args.lease_ms);
    let config = behaviour_config(lease);
    // Noticing the death, then the takeover delay, then the election itself.
    let bound = args
        .takeover_bound_ms
        .map_or(3 * lease + config.liveness_timeout() + config.takeover_delay(), Duration::from_millis);
    let heartbeat = Duration::from_millis(args.heartbeat_ms);
    // The candidates, and one more node that observes.
    let mut nodes: Vec<Option<Node>> = start_swarm(args.nodes + 1, lease).await?.into_iter().map(Some).collect();
    let observer = nodes.pop().flatten().context("the observer's node")?;
    let office = Arc::new(Office::new());
    office.log(&format!(
        "{} nodes on 127.0.0.1 campaign for {LOCK:?} (lease {} ms), one more observes",
        args.nodes, args.lease_ms
    ));
    let observing = tokio::spawn(observe(observer.handle(), office.clone()));

    let (stop, stopped) = watch::channel(false);
    let mut campaigns: Vec<_> = nodes
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, node)| Some(tokio::spawn(campaign(i, node.handle(), office.clone(), heartbeat, stopped.clone()))))
        .collect();

    ensure!(office.next_leader(None, bound).await.is_some(), "nobody was elected within {bound:?}");
    let mut takeovers = Vec::new();
    for _ in 0..args.kills {
        tokio::time::sleep(Duration::from_millis(args.kill_after_ms)).await;
        // Once the observer has seen the leader in office, kill it.
        ensure!(office.observed_current(bound).await, "the observer did not see the leader in office");
        let Some(leader) = office.next_leader(None, bound).await else { bail!("no leader within {bound:?}") };
        // Kill the leader as a crash would: its campaign and its node stop at once, no
        // release is sent, and its lock runs out with the lease.
        let killed = leader.node;
        office.leave_office(killed, "node killed");
        let killed_at = Instant::now();
        if let Some(task) = campaigns[killed].take() {
            task.abort();
        }
        drop(nodes[killed].take());

        let Some(next) = office.next_leader(Some(killed), bound).await else {
            bail!("no takeover within {} ms of killing node {killed}", bound.as_millis())
        };
        let after = next.since.duration_since(killed_at).as_millis();
        office.log(&format!("takeover: node {} leads {after} ms after node {killed} was killed", next.node));
        takeovers.push((killed, next.node, after, next.token > leader.token));
    }
    // Let the last leader lead a little, and the observer see it, then end the demo.
    tokio::time::sleep(heartbeat * 2).await;
    ensure!(office.observed_current(bound).await, "the observer did not see the last leader");
    let _ = stop.send(true);
    for c in campaigns.into_iter().flatten() {
        c.await?;
    }
    observing.abort();
    for node in nodes.into_iter().flatten().chain([observer]) {
        node.shutdown().await?;
    }

    println!("leadership timeline:");
    for (term, why) in office.terms.lock().unwrap().iter() {
        let until = term.until.map_or(0, |t| office.ms(t));
        println!(
            "  node {}: {:>6} ms .. {:>6} ms, token {} ({why})",
            term.node,
            office.ms(term.since),
            until,
            term.token
        );
    }
    for (killed, next, after, increasing) in &takeovers {
        println!(
            "takeover: node {killed} -> node {next} in {after} ms (lease {} ms, bound {} ms), token {}",
            args.lease_ms,
            bound.as_millis(),
            if *increasing { "increased" } else { "DID NOT INCREASE" }
        );
    }
    // The demo waited for the observer to see each leader it killed, and the last one; a
    // leader that lost its lock on its own (a starved machine) may have led too briefly
    // to be seen (a watch's delay bound: docs/operating.md, "Watch").
    let leaders: Vec<u64> = office.terms.lock().unwrap().iter().map(|(t, _)| t.token).collect();
    let observed = office.observed.borrow().clone();
    let in_order = observed.windows(2).all(|w| w[0] < w[1]);
    let unknown: Vec<u64> = observed.iter().filter(|t| !leaders.contains(t)).copied().collect();
    println!(
        "observer: saw {} of {} leaders, in token order: {in_order}, none that did not lead: {}",
        observed.len(),
        leaders.len(),
        unknown.is_empty()
    );
    ensure!(in_order && unknown.is_empty(), "the observer saw {observed:?} of leaders {leaders:?}");
    let overlaps = office.overlaps.lock().unwrap().clone();
    println!("overlapping leaders: {}", overlaps.len());
    ensure!(overlaps.is_empty(), "two leaders at once: {overlaps:?}");
    ensure!(takeovers.iter().all(|t| t.3), "a new leader's fencing token did not increase");
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    ensure!(args.kills < args.nodes, "--kills must be below --nodes (someone has to take over)");
    run(args).await
}
