//! `sigma-testnet soak`: does a swarm give its memory back? Real `sigma run` processes
//! get a stream of distinct lock names (`soak-K`, each locked and released once, by
//! `--clients` HTTP clients spread over the nodes), optionally while a hostile peer
//! floods them with REQUESTs for made-up names ([`super::flood`]); then nothing, for the
//! idle expiry. Every `--sample` seconds it prints, per node: RSS, hosted replicas, live
//! acquisitions and cached hosts, and the lock+release latency of the interval. A probe
//! of lock+release rounds before the stream and after the idle wait gives the latency
//! ratio. The figures to reach are printed as targets, never asserted on time.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use tokio::sync::watch;

use super::api::{self, Acquire, Release};
use super::cluster::{Cluster, UpOptions};
use super::flood::{self, FloodReport};

/// Options of a soak run.
#[derive(Clone, Debug)]
pub struct SoakOptions {
    /// The testnet.
    pub up: UpOptions,
    /// Distinct lock names, each locked and released once.
    pub names: u64,
    /// Concurrent HTTP clients (client k uses node k mod N).
    pub clients: usize,
    /// Sample interval.
    pub sample: Duration,
    /// How long to watch the idle swarm after the stream.
    pub idle: Duration,
    /// REQUESTs for made-up names from one hostile peer (0: no flood).
    pub flood: u64,
    /// Lock+release rounds of each latency probe.
    pub probe_rounds: u64,
}

/// One node at one moment.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct NodeSample {
    /// Resident memory, KiB (0 if unreadable).
    pub rss_kib: u64,
    /// Hosted replicas.
    pub replicas: usize,
    /// Live acquisitions.
    pub acquisitions: usize,
    /// Cached replica hosts.
    pub hosts: usize,
}

/// The swarm at one moment.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Sample {
    /// Seconds since the stream started (negative: before it).
    pub at_s: f64,
    /// What was going on: `start`, `stream`, `idle`.
    pub phase: &'static str,
    /// Names locked and released so far.
    pub names_done: u64,
    /// Lock+release rounds per second in the interval.
    pub ops_per_s: f64,
    /// Lock+release latency in the interval, ms (NaN without rounds).
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Per node.
    pub nodes: Vec<NodeSample>,
}

/// A latency probe: lock+release rounds on fresh names (one client, one at a time; the
/// warm-up runs on every client).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Probe {
    /// Rounds.
    pub rounds: u64,
    /// Median, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
}

/// Everything a soak run measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SoakReport {
    /// Samples in order.
    pub samples: Vec<Sample>,
    /// Every node when the swarm had just formed, before the warm-up.
    pub formed: Vec<NodeSample>,
    /// Warm-up probe on the swarm that just formed (not counted).
    pub warm_up: Probe,
    /// Latency probe before the stream.
    pub probe_before: Probe,
    /// Latency probe after the idle wait.
    pub probe_after: Probe,
    /// Names locked and released.
    pub names_done: u64,
    /// Acquires or releases that failed (timeouts included).
    pub failures: u64,
    /// Failures by reason.
    pub failure_reasons: std::collections::BTreeMap<String, u64>,
    /// Seconds the stream took.
    pub stream_s: f64,
    /// The flood, if any.
    pub flood: Option<FloodReport>,
    /// Targets: (what, figures, met).
    pub targets: Vec<(String, String, bool)>,
}

/// Resident set size of `pid` in KiB, from `/proc/PID/status`.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse().ok()))
        .unwrap_or(0)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// One lock+release of `name` through `api`: its latency in ms, or why it failed.
async fn round(http: &reqwest::Client, api: SocketAddr, name: &str) -> Result<f64, String> {
    let t = Instant::now();
    let g = match api::acquire(http, api, name, 30_000).await {
        Acquire::Granted(g) => g,
        Acquire::TimedOut => return Err("acquire timed out (30 s)".into()),
        Acquire::Failed(e) => return Err(format!("acquire: {}", e.chars().take(120).collect::<String>())),
    };
    match api::release(http, api, name, g.token, &g.lease).await {
        Release::Released => Ok(t.elapsed().as_secs_f64() * 1e3),
        other => Err(format!("release: {other:?}")),
    }
}

/// Shared by the clients and the sampler.
#[derive(Default)]
struct Stream {
    next: AtomicU64,
    done: AtomicU64,
    failures: AtomicU64,
    latencies: Mutex<Vec<f64>>,
    /// Failures by reason (the first 20 reasons).
    reasons: Mutex<std::collections::BTreeMap<String, u64>>,
}

/// Runs `clients` tasks over `apis` until `names` names (prefix `prefix`) are done.
fn start_stream(
    http: &reqwest::Client,
    apis: &[SocketAddr],
    clients: usize,
    names: u64,
    prefix: &'static str,
    stream: &Arc<Stream>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..clients)
        .map(|c| {
            let (http, api, stream) = (http.clone(), apis[c % apis.len()], stream.clone());
            tokio::spawn(async move {
                loop {
                    let k = stream.next.fetch_add(1, Ordering::Relaxed);
                    if k >= names {
                        return;
                    }
                    match round(&http, api, &format!("{prefix}-{k}")).await {
                        Ok(ms) => {
                            stream.done.fetch_add(1, Ordering::Relaxed);
                            stream.latencies.lock().unwrap_or_else(|e| e.into_inner()).push(ms);
                        }
                        Err(why) => {
                            stream.failures.fetch_add(1, Ordering::Relaxed);
                            let mut reasons = stream.reasons.lock().unwrap_or_else(|e| e.into_inner());
                            if reasons.len() < 20 || reasons.contains_key(&why) {
                                *reasons.entry(why).or_default() += 1;
                            }
                        }
                    }
                }
            })
        })
        .collect()
}

async fn probe(
    http: &reqwest::Client,
    apis: &[SocketAddr],
    clients: usize,
    rounds: u64,
    prefix: &'static str,
) -> Probe {
    let stream = Arc::new(Stream::default());
    for task in start_stream(http, apis, clients, rounds, prefix, &stream) {
        let _ = task.await;
    }
    let mut l = std::mem::take(&mut *stream.latencies.lock().unwrap_or_else(|e| e.into_inner()));
    l.sort_by(f64::total_cmp);
    Probe { rounds: l.len() as u64, p50_ms: percentile(&l, 0.5), p99_ms: percentile(&l, 0.99) }
}

async fn sample_nodes(http: &reqwest::Client, cluster: &Cluster) -> Vec<NodeSample> {
    let mut out = Vec::new();
    for m in &cluster.members {
        let state = api::status(http, m.record.api, Duration::from_secs(10)).await.map(|s| s.state).unwrap_or_default();
        out.push(NodeSample {
            rss_kib: rss_kib(m.record.pid),
            replicas: state.replicas,
            acquisitions: state.acquisitions,
            hosts: state.hosts,
        });
    }
    out
}

fn row(s: &Sample) -> String {
    let mb = |n: &NodeSample| format!("{:.1}", n.rss_kib as f64 / 1024.0);
    let list = |f: &dyn Fn(&NodeSample) -> String| s.nodes.iter().map(f).collect::<Vec<_>>().join("/");
    format!(
        "{:>7.0} {:<6} {:>10} {:>8.0} {:>8.1} {:>8.1}  {:<34} {:<34} {}",
        s.at_s,
        s.phase,
        s.names_done,
        s.ops_per_s,
        s.p50_ms,
        s.p99_ms,
        list(&mb),
        list(&|n| n.replicas.to_string()),
        list(&|n| format!("{}+{}", n.acquisitions, n.hosts)),
    )
}

fn header() -> String {
    format!(
        "{:>7} {:<6} {:>10} {:>8} {:>8} {:>8}  {:<34} {:<34} {}",
        "t (s)", "phase", "names", "ops/s", "p50 ms", "p99 ms", "RSS MB per node", "replicas per node", "acq+hosts"
    )
}

/// Runs a soak: up, probe, stream (and flood), idle, probe, down. Rows are printed to
/// stdout as they come; returns the report and the summary.
pub async fn run(opts: &SoakOptions) -> Result<(SoakReport, String)> {
    anyhow::ensure!(opts.clients > 0 && opts.names > 0, "--clients and --names must be at least 1");
    eprintln!("sigma-testnet soak: starting {} nodes in {}", opts.up.nodes, opts.up.dir.display());
    let mut cluster = Cluster::up(opts.up.clone()).await?;
    cluster.manifest().save()?;
    let http = api::client()?;
    let apis: Vec<SocketAddr> = cluster.members.iter().map(|m| m.record.api).collect();
    let n = u16::try_from(opts.up.params.n.unwrap_or(32)).context("n")?;

    // The swarm just formed, before any lock.
    let formed = sample_nodes(&http, &cluster).await;
    // A swarm that just formed still looks up its neighbourhoods (the first locks wait
    // for ownership lookups), and a node's buffers, tables and allocator arenas grow to
    // their working size with its first locks: a warm-up, not counted, then the same
    // idle wait as after the stream, so that the start, like the end, is a node that
    // has served locks, holds none, and has been idle as long (idle connections close,
    // self-lookups age: the first probe after an idle minute is ~15% slower than one
    // right after traffic, whatever came before).
    let warm_up = probe(&http, &apis, opts.clients, opts.probe_rounds, "warm-up").await;
    tokio::time::sleep(opts.idle).await;
    let start_nodes = sample_nodes(&http, &cluster).await;
    let probe_before = probe(&http, &apis, 1, opts.probe_rounds, "probe-before").await;
    let mut samples = Vec::new();
    let first = Sample {
        at_s: 0.0,
        phase: "start",
        names_done: 0,
        ops_per_s: 0.0,
        p50_ms: probe_before.p50_ms,
        p99_ms: probe_before.p99_ms,
        nodes: start_nodes,
    };
    println!(
        "soak: {} nodes, {} names, {} clients{}; warm-up: {} rounds, p50 {:.2} ms, p99 {:.2} ms (not counted); probe before: {} rounds, p50 {:.2} ms, p99 {:.2} ms",
        apis.len(),
        opts.names,
        opts.clients,
        if opts.flood > 0 {
            format!(", flood of {} made-up REQUESTs from one peer", opts.flood)
        } else {
            String::new()
        },
        warm_up.rounds,
        warm_up.p50_ms,
        warm_up.p99_ms,
        probe_before.rounds,
        probe_before.p50_ms,
        probe_before.p99_ms
    );
    println!("{}", header());
    println!("{}", row(&first));
    samples.push(first);

    let (stop_tx, stop_rx) = watch::channel(false);
    let flood_task = (opts.flood > 0).then(|| {
        let targets =
            cluster.members.iter().filter_map(|m| m.record.listen.first().and_then(|a| a.parse().ok())).collect();
        tokio::spawn(flood::run(targets, n, opts.flood, 256, stop_rx.clone()))
    });

    let stream = Arc::new(Stream::default());
    let start = Instant::now();
    let clients = start_stream(&http, &apis, opts.clients, opts.names, "soak", &stream);
    let mut last = (Instant::now(), 0u64);
    let mut stream_s = None;
    let mut idle_since: Option<Instant> = None;
    let mut interrupted = false;
    loop {
        tokio::select! {
            () = tokio::time::sleep(opts.sample) => {}
            _ = tokio::signal::ctrl_c() => { interrupted = true; }
        }
        let streaming = clients.iter().any(|c| !c.is_finished());
        let mut l = std::mem::take(&mut *stream.latencies.lock().unwrap_or_else(|e| e.into_inner()));
        l.sort_by(f64::total_cmp);
        let done = stream.done.load(Ordering::Relaxed);
        let now = Instant::now();
        let s = Sample {
            at_s: start.elapsed().as_secs_f64(),
            phase: if streaming { "stream" } else { "idle" },
            names_done: done,
            ops_per_s: (done - last.1) as f64 / (now - last.0).as_secs_f64(),
            p50_ms: percentile(&l, 0.5),
            p99_ms: percentile(&l, 0.99),
            nodes: sample_nodes(&http, &cluster).await,
        };
        last = (now, done);
        println!("{}", row(&s));
        samples.push(s);
        if !streaming && stream_s.is_none() {
            stream_s = Some(start.elapsed().as_secs_f64());
            idle_since = Some(Instant::now());
        }
        if interrupted || idle_since.is_some_and(|t| t.elapsed() >= opts.idle) {
            break;
        }
    }
    let _ = stop_tx.send(true);
    for c in &clients {
        c.abort();
    }
    let flood = match flood_task {
        Some(t) => Some(t.await.context("the flooder panicked")??),
        None => None,
    };
    let probe_after =
        if interrupted { Probe::default() } else { probe(&http, &apis, 1, opts.probe_rounds, "probe-after").await };
    cluster.down(Duration::from_secs(5)).await;

    let report = SoakReport {
        targets: targets(&samples, &probe_before, &probe_after),
        samples,
        formed,
        warm_up,
        probe_before,
        probe_after,
        names_done: stream.done.load(Ordering::Relaxed),
        failures: stream.failures.load(Ordering::Relaxed),
        failure_reasons: std::mem::take(&mut *stream.reasons.lock().unwrap_or_else(|e| e.into_inner())),
        stream_s: stream_s.unwrap_or_else(|| start.elapsed().as_secs_f64()),
        flood,
    };
    Ok((report.clone(), summary(&report)))
}

fn targets(samples: &[Sample], before: &Probe, after: &Probe) -> Vec<(String, String, bool)> {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else { return Vec::new() };
    let mut t = Vec::new();
    let growth: Vec<f64> =
        first.nodes.iter().zip(&last.nodes).map(|(a, b)| (b.rss_kib as f64 - a.rss_kib as f64) / 1024.0).collect();
    let worst = growth.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    t.push((
        "RSS at the end within 20 MB of the warmed-up start, every node".to_owned(),
        format!("growth {} MB", growth.iter().map(|g| format!("{g:+.1}")).collect::<Vec<_>>().join(" / ")),
        worst <= 20.0,
    ));
    let peak = samples.iter().flat_map(|s| s.nodes.iter().map(|n| n.replicas)).max().unwrap_or(0);
    let end: usize = last.nodes.iter().map(|n| n.replicas).sum();
    t.push((
        "replicas hosted back to ~0 after the idle expiry (≤ 1% of the peak per node)".to_owned(),
        format!("{end} in all at the end; peak {peak} on one node"),
        last.nodes.iter().all(|n| n.replicas * 100 <= peak.max(100)),
    ));
    let ratio = after.p50_ms / before.p50_ms;
    t.push((
        "lock+release p50 at the end within 10% of the start".to_owned(),
        format!("{:.2} ms → {:.2} ms ({:+.1}%)", before.p50_ms, after.p50_ms, 100.0 * (ratio - 1.0)),
        ratio <= 1.10,
    ));
    t
}

fn summary(r: &SoakReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "stream: {} names locked and released in {:.0} s ({:.0}/s), {} failures",
        r.names_done,
        r.stream_s,
        r.names_done as f64 / r.stream_s.max(1e-9),
        r.failures
    );
    for (why, count) in &r.failure_reasons {
        let _ = writeln!(s, "  failed {count}×: {why}");
    }
    if let (Some(first), Some(last)) = (r.samples.first(), r.samples.last()) {
        for (i, (a, b)) in first.nodes.iter().zip(&last.nodes).enumerate() {
            let peak = r.samples.iter().filter_map(|s| s.nodes.get(i)).map(|n| n.rss_kib).max().unwrap_or(0);
            let peak_replicas = r.samples.iter().filter_map(|s| s.nodes.get(i)).map(|n| n.replicas).max().unwrap_or(0);
            let _ = writeln!(
                s,
                "node {i}: RSS {:.1} formed, {:.1} warmed up → peak {:.1} → end {:.1} MB; replicas peak {peak_replicas}, end {}",
                r.formed.get(i).map_or(0.0, |f| f.rss_kib as f64 / 1024.0),
                a.rss_kib as f64 / 1024.0,
                peak as f64 / 1024.0,
                b.rss_kib as f64 / 1024.0,
                b.replicas
            );
        }
    }
    let _ = writeln!(
        s,
        "latency probe ({} rounds each): before p50 {:.2} ms p99 {:.2} ms; after p50 {:.2} ms p99 {:.2} ms",
        r.probe_before.rounds, r.probe_before.p50_ms, r.probe_before.p99_ms, r.probe_after.p50_ms, r.probe_after.p99_ms
    );
    if let Some(f) = &r.flood {
        let answers: Vec<String> = f.answers.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(
            s,
            "flood: {} made-up REQUESTs in {:.0} s ({:.0}/s); answers: {}",
            f.sent,
            f.seconds,
            f.sent as f64 / f.seconds.max(1e-9),
            answers.join(", ")
        );
    }
    let _ = writeln!(s);
    for (name, detail, pass) in &r.targets {
        let _ = writeln!(s, "[{}] {name}: {detail}", if *pass { "PASS" } else { "FAIL" });
    }
    s
}
