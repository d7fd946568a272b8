//! `sigma-testnet bench`: real nodes (TCP + noise on 127.0.0.1) in one process, measured
//! in one run against a baseline taken in the same run:
//! - the round trip to the m-th fastest replica host (a probe along the REQUEST path,
//!   no protocol work) — the floor of an uncontended acquire;
//! - uncontended lock and release latency p50/p99, and the acquire/floor ratio;
//! - contended handoffs per second on one lock with W waiters spread over the nodes,
//!   with an exclusion check;
//! - protocol messages per CS entry (REQUEST, YIELD, RELEASE, RESPONSE), against 4n.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use sigma_behaviour::proto;
use sigma_node::{Node, NodeConfig, NodeHandle};

/// Parameters of a benchmark run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Nodes in the swarm.
    pub nodes: usize,
    /// Replicas per lock.
    pub n: usize,
    /// Quorum.
    pub m: usize,
    /// Uncontended lock+release rounds.
    pub rounds: usize,
    /// Contending tasks.
    pub waiters: usize,
    /// Length of the contended phase.
    pub contended: Duration,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions { nodes: 8, n: 32, m: 24, rounds: 200, waiters: 16, contended: Duration::from_secs(10) }
    }
}

/// Figures of a benchmark run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchReport {
    /// The first lock after the swarm formed (s): it waits out the takeover delay every
    /// peer holds its new replicas for after it began serving.
    pub first_lock_s: f64,
    /// Contended acquisitions, from call to grant (ms): p50, p99, longest.
    pub contended_wait_p50_ms: f64,
    pub contended_wait_p99_ms: f64,
    pub contended_wait_max_ms: f64,
    /// Round trip to the m-th fastest replica host, p50 (ms).
    pub floor_p50_ms: f64,
    /// Uncontended acquire p50 (ms).
    pub acquire_p50_ms: f64,
    /// Uncontended acquire p99 (ms).
    pub acquire_p99_ms: f64,
    /// Uncontended release p50 (ms).
    pub release_p50_ms: f64,
    /// Uncontended release p99 (ms).
    pub release_p99_ms: f64,
    /// Median of acquire / floor over the rounds.
    pub acquire_over_floor: f64,
    /// The embedded API's round trip around a probe (command in, answer out), p50 (ms):
    /// the part of an acquire's latency outside the node's task.
    pub api_p50_ms: f64,
    /// Contended CS entries per second.
    pub handoffs_per_s: f64,
    /// Contended entries.
    pub contended_entries: u64,
    /// Overlapping critical sections seen (must be 0).
    pub overlaps: u64,
    /// Protocol messages per CS entry over the whole run.
    pub messages_per_entry: f64,
    /// 4n.
    pub four_n: usize,
    /// Transport requests per CS entry in the contended phase (a batch of messages to
    /// one peer counts one; every node's, probes and retries included).
    pub requests_per_entry: f64,
    /// Distinct peers hosting the contended lock's replicas.
    pub hosts: usize,
}

impl BenchReport {
    /// No two critical sections overlapped (the goals are only printed).
    pub fn pass(&self) -> bool {
        self.overlaps == 0
    }
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

async fn start(opts: &BenchOptions) -> Result<Vec<Node>> {
    let behaviour = sigma_behaviour::Config::default()
        .with_protocol(proto::Config::default().with_quorum(opts.n, opts.m).with_lease(Duration::from_secs(4)));
    let config = |bootstrap| NodeConfig {
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().expect("valid multiaddr")],
        bootstrap,
        behaviour: behaviour.clone(),
        ..NodeConfig::default()
    };
    let first = Node::start(config(Vec::new())).await.context("starting node 0")?;
    let mut addr = first.listen_addrs().first().context("node 0 is not listening")?.clone();
    addr.push(libp2p::multiaddr::Protocol::P2p(first.peer_id()));
    let mut nodes = vec![first];
    for k in 1..opts.nodes {
        nodes.push(Node::start(config(vec![addr.clone()])).await.with_context(|| format!("starting node {k}"))?);
    }
    // Every node serving and seeing every other alive (connected or through the gossip).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut ready = true;
        for n in &nodes {
            let s = n.handle().status().await?;
            ready &= s.ready && s.reachable_members >= opts.nodes && s.routable_peers + 1 >= opts.nodes;
        }
        if ready {
            return Ok(nodes);
        }
        if Instant::now() > deadline {
            bail!("the swarm did not form within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Σ over the nodes of three of their counters, picked by `pick`.
async fn sum_counters(
    handles: &[NodeHandle],
    pick: impl Fn(&sigma_behaviour::Counters) -> [u64; 3],
) -> Result<[u64; 3]> {
    let mut sum = [0; 3];
    for h in handles {
        let c = h.counters().await?.counters;
        for (s, v) in sum.iter_mut().zip(pick(&c)) {
            *s += v;
        }
    }
    Ok(sum)
}

/// Σ over the nodes: (protocol messages of finished acquisitions, finished acquisitions,
/// transport requests sent).
async fn messages(handles: &[NodeHandle]) -> Result<[u64; 3]> {
    sum_counters(handles, |c| [c.completed_messages, c.completed, c.requests_out]).await
}

/// Σ over the nodes: (keys found the host's own by its neighbourhood, ownership
/// lookups, Kademlia requests).
async fn ownership(handles: &[NodeHandle]) -> Result<[u64; 3]> {
    sum_counters(handles, |c| [c.ownership_by_neighbourhood, c.ownership_checks, c.kad_requests.values().sum()]).await
}

/// The distinct peers among `peers` closest to the keys of `name`'s n replicas.
fn hosts_of(name: &str, n: usize, peers: &[libp2p::PeerId]) -> usize {
    use libp2p::kad::KBucketKey;
    let hosts: std::collections::HashSet<libp2p::PeerId> = (0..n)
        .filter_map(|i| {
            let key = KBucketKey::new(sigma_behaviour::wire::replica_name(name, u16::try_from(i).ok()?).into_bytes());
            peers.iter().min_by_key(|p| KBucketKey::from(**p).distance(&key)).copied()
        })
        .collect();
    hosts.len()
}

/// Runs the benchmark and returns its figures and a printable summary.
pub async fn run(opts: &BenchOptions) -> Result<(BenchReport, String)> {
    let started = Instant::now();
    let nodes = start(opts).await?;
    let handles: Vec<NodeHandle> = nodes.iter().map(Node::handle).collect();
    let formed = started.elapsed();
    // Every peer holds the replicas it starts for the takeover delay after it began
    // serving: the first lock waits that out, and is reported apart from the rounds.
    let t = Instant::now();
    handles[0].lock("bench-first").await?.release().await?;
    let first_lock = t.elapsed();

    // Uncontended: a fresh lock per round, probed first so the floor and the acquire
    // travel to the same hosts from the same node.
    let (mut floor, mut acquire, mut release, mut ratio) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut api = Vec::new();
    let ownership_before = ownership(&handles).await?;
    for k in 0..opts.rounds {
        let h = &handles[k % handles.len()];
        let name = format!("bench-u-{k}");
        // The first probe warms the path (host lookup, streams); the second is the floor.
        h.probe(&name, Some(opts.n)).await?;
        let t = Instant::now();
        let mut rtts: Vec<Duration> = h.probe(&name, Some(opts.n)).await?.into_iter().flatten().collect();
        let probe_ms = t.elapsed().as_secs_f64() * 1e3;
        if rtts.len() < opts.m {
            bail!("probe of {name}: only {} of {} replica hosts answered", rtts.len(), opts.n);
        }
        rtts.sort();
        let f = rtts[opts.m - 1].as_secs_f64() * 1e3;
        // The probe ends with its last answer: what the caller waited beyond it is the
        // embedded API's round trip (command to the node's task, answer back), which
        // the acquire pays too. Known only when every host answered.
        if rtts.len() == opts.n {
            let last = rtts[opts.n - 1].as_secs_f64() * 1e3;
            api.push((probe_ms - last).max(0.0));
        }
        let t0 = Instant::now();
        let guard = h.lock(&name).await?;
        let a = t0.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        guard.release().await?;
        release.push(t1.elapsed().as_secs_f64() * 1e3);
        floor.push(f);
        acquire.push(a);
        ratio.push(a / f.max(1e-3));
    }

    let ownership_after = ownership(&handles).await?;
    let uncontended_ownership: Vec<u64> = ownership_after.iter().zip(ownership_before).map(|(a, b)| a - b).collect();
    // Contended: W tasks over the nodes on one lock.
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let entries = Arc::new(AtomicU64::new(0));
    let waits = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = Instant::now() + opts.contended;
    let mut tasks = Vec::new();
    for w in 0..opts.waiters {
        let h = handles[w % handles.len()].clone();
        let (inside, overlaps, entries, waits) = (inside.clone(), overlaps.clone(), entries.clone(), waits.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let t = Instant::now();
                let Ok(guard) = h.lock_timeout("bench-contended", Duration::from_secs(30)).await else { continue };
                waits.lock().expect("waits").push(t.elapsed().as_secs_f64() * 1e3);
                if inside.swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                entries.fetch_add(1, Ordering::SeqCst);
                inside.store(false, Ordering::SeqCst);
                let _ = guard.release().await;
            }
        }));
    }
    let [_, done_before, requests_before] = messages(&handles).await?;
    let contended_started = Instant::now();
    for t in tasks {
        t.await?;
    }
    let contended_time = contended_started.elapsed().as_secs_f64();
    let [msgs, done, requests] = messages(&handles).await?;
    let peers: Vec<libp2p::PeerId> = nodes.iter().map(Node::peer_id).collect();
    for n in nodes {
        n.shutdown().await.ok();
    }

    let contended_entries = entries.load(Ordering::SeqCst);
    let mut waits = std::mem::take(&mut *waits.lock().expect("waits"));
    let report = BenchReport {
        first_lock_s: first_lock.as_secs_f64(),
        contended_wait_p50_ms: pct(&mut waits, 0.5),
        contended_wait_p99_ms: pct(&mut waits, 0.99),
        contended_wait_max_ms: waits.last().copied().unwrap_or(f64::NAN),
        floor_p50_ms: pct(&mut floor.clone(), 0.5),
        acquire_p50_ms: pct(&mut acquire.clone(), 0.5),
        acquire_p99_ms: pct(&mut acquire, 0.99),
        release_p50_ms: pct(&mut release.clone(), 0.5),
        release_p99_ms: pct(&mut release, 0.99),
        acquire_over_floor: pct(&mut ratio, 0.5),
        api_p50_ms: pct(&mut api, 0.5),
        handoffs_per_s: contended_entries as f64 / contended_time,
        contended_entries,
        overlaps: overlaps.load(Ordering::SeqCst),
        messages_per_entry: msgs as f64 / done.max(1) as f64,
        four_n: 4 * opts.n,
        requests_per_entry: (requests - requests_before) as f64 / (done - done_before).max(1) as f64,
        hosts: hosts_of("bench-contended", opts.n, &peers),
    };
    let r = &report;
    let mut s = String::new();
    writeln!(
        s,
        "sigma-testnet bench: {} nodes on 127.0.0.1 (TCP + noise + yamux), n={}, m={}; swarm formed in {:.2} s",
        opts.nodes,
        opts.n,
        opts.m,
        formed.as_secs_f64()
    )?;
    writeln!(
        s,
        "  first lock after the swarm formed: {:.2} s (a peer holds the replicas it starts for the takeover delay after it began serving)",
        r.first_lock_s
    )?;
    writeln!(s, "  floor (round trip to the m-th fastest replica host, same run): p50 {:.2} ms", r.floor_p50_ms)?;
    writeln!(
        s,
        "  uncontended lock ({} rounds): p50 {:.2} ms, p99 {:.2} ms; release p50 {:.2} ms, p99 {:.2} ms",
        opts.rounds, r.acquire_p50_ms, r.acquire_p99_ms, r.release_p50_ms, r.release_p99_ms
    )?;
    writeln!(s, "  acquire / floor: {:.2}x (median over rounds)", r.acquire_over_floor)?;
    writeln!(
        s,
        "  hosts' ownership of the uncontended locks' keys: {} by their neighbourhood, {} by a lookup ({} Kademlia requests)",
        uncontended_ownership[0], uncontended_ownership[1], uncontended_ownership[2]
    )?;
    writeln!(
        s,
        "  embedded API round trip around a probe (command in, answer out; in the acquire, not in the floor): p50 {:.3} ms",
        r.api_p50_ms
    )?;
    writeln!(
        s,
        "  contended: {} waiters on one lock for {:.1} s: {} entries, {:.1} handoffs/s, {} overlaps",
        opts.waiters, contended_time, r.contended_entries, r.handoffs_per_s, r.overlaps
    )?;
    writeln!(
        s,
        "  contended wait for the lock: p50 {:.2} ms, p99 {:.2} ms, longest {:.1} ms",
        r.contended_wait_p50_ms, r.contended_wait_p99_ms, r.contended_wait_max_ms
    )?;
    writeln!(s, "  protocol messages per CS entry: {:.1} (4n = {})", r.messages_per_entry, r.four_n)?;
    writeln!(
        s,
        "  transport requests per CS entry (contended; a batch to one peer counts one): {:.1}; the lock's replicas on {} peers",
        r.requests_per_entry, r.hosts
    )?;
    // Goals are printed; the safety check decides the exit status (`BenchReport::pass`).
    let goal = |ok: bool| if ok { "goal met" } else { "goal missed" };
    writeln!(
        s,
        "[{}] uncontended acquire <= 1.2x the floor: {:.2}x",
        goal(r.acquire_over_floor <= 1.2),
        r.acquire_over_floor
    )?;
    writeln!(
        s,
        "[{}] messages per CS entry <= 4n: {:.1} vs {}",
        goal(r.messages_per_entry <= r.four_n as f64),
        r.messages_per_entry,
        r.four_n
    )?;
    writeln!(
        s,
        "[{}] transport requests per CS entry <= 4 x hosts: {:.1} vs {}",
        goal(r.requests_per_entry <= 4.0 * r.hosts as f64),
        r.requests_per_entry,
        4 * r.hosts
    )?;
    let check = if r.pass() { "PASS" } else { "FAIL" };
    writeln!(s, "[{check}] no overlapping critical sections: {}", r.overlaps)?;
    Ok((report, s))
}
