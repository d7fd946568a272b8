//! `sigma-testnet sim compare`: every protocol of the reference papers side by side in
//! the simulator, under the same workload, latency and reset models, as CSV, plots and
//! a printed table.
//!
//! For each protocol: throughput against the arrival rate λ at latency U(0,200) and
//! U(100,100); at a moderate load (λ = [`MODERATE`], U(0,200)) the messages per
//! critical-section entry, the acquire latency p50/p99 and the FCFS fairness (the
//! fraction of entries granted while an earlier arrival still waited); and under resets
//! of replicas or processes (mean lifetime [`LIFETIMES`]) and under message loss
//! ([`LOSS`]) the throughput, exclusion violations and waiters stuck after a drain
//! period.
//!
//! The quorum protocols run `n` = 32 replicas, m = 24 (the paper's set-up); the
//! classical algorithms run closed systems of 32 processes (see
//! [`super::protocol::Closed`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::baselines::backoff::Backoff;
use crate::baselines::classical::{central, lamport, ricart_agrawala, token_ring, voting};
use anyhow::{bail, Result};
use sigma_behaviour::proto::Config;

use super::engine::{self, Report, SimConfig};
use super::latency::Latency;
use super::paper::{run_jobs, write_figure, write_runs_csv, STRAWMAN_MAX_BACKLOG};
use super::protocol::{Closed, Cmr, Obeidat, Sigma, Strawman};
use crate::plot::{write_csv, Chart, Series, SeriesStyle};

/// Every protocol, in table order: the quorum protocols of the open system (Sigma and
/// its baselines), then the lecture's closed-system algorithms.
pub const PROTOCOLS: [&str; 11] = [
    "sigma",
    "strawman",
    "cmr",
    "cmr-delayed",
    "obeidat",
    "central",
    "lamport",
    "ricart-agrawala",
    "majority",
    "maekawa",
    "token-ring",
];

/// Protocols whose backlog grows without bound once they collapse: their runs stop at
/// [`STRAWMAN_MAX_BACKLOG`] waiters.
const COLLAPSING: [&str; 2] = ["strawman", "cmr"];

/// The load at which latency, messages and fairness are compared (below every
/// protocol's saturation except the collapsing ones).
pub const MODERATE: f64 = 2.0;

/// Mean lifetimes (s) of a replica or process in the reset runs.
pub const LIFETIMES: [f64; 2] = [100.0, 1_000.0];

/// Message loss probability of the lossy run.
pub const LOSS: f64 = 0.01;

/// Time in the critical section in the runs with faults (resets, loss; elsewhere 0, as
/// in the paper's §5): with a CS of zero length two holders can never overlap, whatever
/// a fault breaks.
pub const FAULT_CS: Duration = Duration::from_millis(100);

/// The token ring's origin regenerates a token it has not seen for this long: twice
/// the slowest rotation of 32 hops at 200 ms.
pub const TOKEN_TIMEOUT: Duration = Duration::from_millis(12_800);

/// Parameters of one protocol run beyond the simulation's.
#[derive(Clone, Debug)]
pub struct ProtocolParams {
    /// Replicas and quorum (Sigma, strawman, CMR, Obeidat); `n` is also the number of
    /// processes of the closed systems.
    pub config: Config,
    /// Strawman backoff window; CMR's exponential backoff base (cap: 64×).
    pub backoff: Duration,
}

/// Runs protocol `name` (one of [`PROTOCOLS`], or `strawman-exp`: the strawman with
/// exponential backoff).
pub fn run_protocol(name: &str, p: &ProtocolParams, cfg: SimConfig) -> Result<Report> {
    let config = p.config.clone();
    let n = config.n();
    let exponential = Backoff::Exponential { base: p.backoff, cap: p.backoff * 64 };
    Ok(match name {
        "sigma" => engine::run(&Sigma(config), cfg),
        "strawman" => engine::run(&Strawman(config, Backoff::Constant { window: p.backoff }), cfg),
        "strawman-exp" => engine::run(&Strawman(config, exponential), cfg),
        "cmr" | "cmr-delayed" => {
            engine::run(&Cmr { config, backoff: exponential, delayed: name == "cmr-delayed" }, cfg)
        }
        "obeidat" => engine::run(&Obeidat(config), cfg),
        "central" => engine::run(&Closed::<central::Central>::new(name, n, central::Params::default()), cfg),
        "lamport" => engine::run(&Closed::<lamport::Lamport>::new(name, n, lamport::Params), cfg),
        "ricart-agrawala" => {
            engine::run(&Closed::<ricart_agrawala::RicartAgrawala>::new(name, n, ricart_agrawala::Params), cfg)
        }
        "majority" | "maekawa" => {
            let quorums = if name == "majority" { voting::Quorums::Majority } else { voting::Quorums::Grid };
            engine::run(&Closed::<voting::Voting>::new(name, n, voting::Params { quorums }), cfg)
        }
        "token-ring" => {
            let params = token_ring::Params { regenerate_after: Some(TOKEN_TIMEOUT) };
            engine::run(&Closed::<token_ring::TokenRing>::new(name, n, params), cfg)
        }
        other => bail!("unknown protocol {other:?} ({}, strawman-exp)", PROTOCOLS.join(", ")),
    })
}

/// Options of a comparison.
#[derive(Clone, Debug)]
pub struct CompareOptions {
    /// Output directory (CSV, SVG/PNG, summary.txt).
    pub out: PathBuf,
    /// Short windows and fewer points (tests, CI).
    pub quick: bool,
    /// Base seed; each run adds a number of its own (protocol and scenario).
    pub seed: u64,
    /// Worker threads.
    pub threads: usize,
    /// Protocols to run (default: all of [`PROTOCOLS`]).
    pub protocols: Vec<String>,
}

/// One protocol's line of the table.
#[derive(Clone, Debug)]
pub struct Row {
    /// Protocol.
    pub protocol: String,
    /// Highest throughput over λ at U(0,200) and at U(100,100).
    pub peak: [f64; 2],
    /// At λ = [`MODERATE`], U(0,200): the run.
    pub moderate: Report,
    /// Under resets, one run per lifetime of [`LIFETIMES`].
    pub resets: Vec<Report>,
    /// Under message loss ([`LOSS`]).
    pub lossy: Report,
}

/// What a comparison produced.
#[derive(Debug)]
pub struct CompareResult {
    /// One row per protocol.
    pub rows: Vec<Row>,
    /// The printed table and notes.
    pub summary: String,
}

/// What a run is for.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
    /// Throughput against λ at `latencies()[i]`, no fault.
    Sweep(usize),
    /// Resets with this mean lifetime (s), λ = MODERATE.
    Resets(f64),
    /// Message loss, λ = MODERATE.
    Loss,
}

#[derive(Clone, Debug)]
struct Job {
    protocol: String,
    scenario: Scenario,
    lambda: f64,
    seed: u64,
}

fn latencies() -> [Latency; 2] {
    let ms = Duration::from_millis;
    [Latency::Uniform { lo: ms(0), hi: ms(200) }, Latency::Uniform { lo: ms(100), hi: ms(100) }]
}

/// Runs every protocol and writes `opts.out`.
pub fn run(opts: &CompareOptions) -> Result<CompareResult> {
    let started = Instant::now();
    std::fs::create_dir_all(&opts.out)?;
    let protocols: Vec<String> =
        if opts.protocols.is_empty() { PROTOCOLS.map(String::from).to_vec() } else { opts.protocols.clone() };
    for p in &protocols {
        if !PROTOCOLS.contains(&p.as_str()) {
            bail!("unknown protocol {p:?} ({})", PROTOCOLS.join(", "));
        }
    }
    let (warmup, measure, drain) = if opts.quick {
        (Duration::from_secs(20), Duration::from_secs(60), Duration::from_secs(60))
    } else {
        (Duration::from_secs(60), Duration::from_secs(300), Duration::from_secs(120))
    };
    let lambdas: Vec<f64> = if opts.quick {
        vec![1.0, MODERATE, 4.0, 16.0]
    } else {
        vec![0.5, 1.0, MODERATE, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0]
    };
    let params = ProtocolParams { config: Config::default(), backoff: Duration::from_secs(1) };
    let (n, m) = (params.config.n(), params.config.m());

    // A run's seed depends on what it is (protocol, scenario), not on which other runs
    // were asked for: `--protocols sigma` reproduces sigma's row of the full comparison.
    let mut jobs = Vec::new();
    for protocol in &protocols {
        let base = 1000 * PROTOCOLS.iter().position(|p| p == protocol).unwrap_or_default() as u64;
        let mut job = |number: u64, scenario, lambda| {
            let protocol = protocol.clone();
            jobs.push(Job { protocol, scenario, lambda, seed: opts.seed + base + number });
        };
        for i in 0..latencies().len() {
            for (j, &lambda) in lambdas.iter().enumerate() {
                job(100 * i as u64 + j as u64, Scenario::Sweep(i), lambda);
            }
        }
        for (i, life) in LIFETIMES.into_iter().enumerate() {
            job(900 + i as u64, Scenario::Resets(life), MODERATE);
        }
        job(950, Scenario::Loss, MODERATE);
    }
    let reports = run_jobs(&jobs, opts.threads, |_, job| {
        let latency = match job.scenario {
            Scenario::Sweep(i) => latencies()[i],
            Scenario::Resets(_) | Scenario::Loss => latencies()[0],
        };
        let base = SimConfig {
            warmup,
            measure,
            // Every run drains, so that "still waiting" means stuck, not just late.
            drain,
            max_backlog: COLLAPSING.contains(&job.protocol.as_str()).then_some(STRAWMAN_MAX_BACKLOG),
            ..SimConfig::paper(job.lambda, latency, job.seed)
        };
        let life = |s| Some(Duration::from_secs_f64(s));
        let cfg = match job.scenario {
            Scenario::Sweep(_) => base,
            Scenario::Resets(s) => SimConfig { cs: FAULT_CS, mean_lifetime: life(s), ..base },
            Scenario::Loss => SimConfig { cs: FAULT_CS, loss: LOSS, ..base },
        };
        // The names were checked above: run_protocol cannot fail here.
        run_protocol(&job.protocol, &params, cfg).unwrap_or_default()
    });
    write_runs_csv(&opts.out.join("runs.csv"), &reports)?;

    let runs: Vec<(&Job, &Report)> = jobs.iter().zip(&reports).collect();
    let pick = |proto: &str, scenario: Scenario| -> Vec<&Report> {
        runs.iter().filter(|(j, _)| j.protocol == proto && j.scenario == scenario).map(|(_, r)| *r).collect()
    };
    let first =
        |proto: &str, scenario: Scenario| pick(proto, scenario).first().map(|r| (*r).clone()).unwrap_or_default();
    let curve = |rs: &[&Report], f: fn(&Report) -> f64| rs.iter().map(|r| (r.lambda, f(r))).collect::<Vec<_>>();

    // Plots: throughput and messages per entry against λ, open-system protocols and
    // closed systems apart (Sigma on both for reference).
    let groups: [(&str, &str, Vec<&String>); 2] = [
        ("open", "quorum protocols, n=32", protocols.iter().filter(|p| !is_closed(p)).collect()),
        ("closed", "32 processes (+ sigma)", protocols.iter().filter(|p| is_closed(p) || *p == "sigma").collect()),
    ];
    for (tag, what, members) in &groups {
        if members.is_empty() {
            continue;
        }
        for (i, latency) in latencies().into_iter().enumerate() {
            let series = members
                .iter()
                .map(|p| Series {
                    name: (*p).clone(),
                    points: curve(&pick(p, Scenario::Sweep(i)), |r| r.throughput),
                    style: SeriesStyle::Line,
                })
                .collect();
            let slug = latency.to_string().replace(['(', ')', ' ', ','], "");
            write_figure(
                &Chart {
                    title: format!("Throughput, {latency}: {what}"),
                    x_label: "request rate λ (1/s)".into(),
                    y_label: "throughput (CS/s)".into(),
                    log_y: false,
                    series,
                },
                &opts.out,
                &format!("throughput-{tag}-{slug}"),
            )?;
        }
        let series = members
            .iter()
            .map(|p| Series {
                name: (*p).clone(),
                points: curve(&pick(p, Scenario::Sweep(0)), |r| r.window_messages_per_entry),
                style: SeriesStyle::Line,
            })
            .collect();
        write_figure(
            &Chart {
                title: format!("Messages in the window per entry, {}: {what}", latencies()[0]),
                x_label: "request rate λ (1/s)".into(),
                y_label: "messages per entry".into(),
                log_y: true,
                series,
            },
            &opts.out,
            &format!("messages-{tag}"),
        )?;
    }

    let rows: Vec<Row> = protocols
        .iter()
        .map(|p| {
            let peak = [0, 1].map(|i| pick(p, Scenario::Sweep(i)).iter().map(|r| r.throughput).fold(0.0, f64::max));
            let moderate =
                pick(p, Scenario::Sweep(0)).into_iter().find(|r| r.lambda == MODERATE).cloned().unwrap_or_default();
            let resets = LIFETIMES.map(|life| first(p, Scenario::Resets(life))).to_vec();
            Row { protocol: p.clone(), peak, moderate, resets, lossy: first(p, Scenario::Loss) }
        })
        .collect();
    write_table_csv(&opts.out.join("compare.csv"), &rows)?;

    let mut s = String::new();
    let _ = writeln!(
        s,
        "sim compare: {} protocols, {} runs, {:.0} s wall; quorum protocols n={n}, m={m}; closed systems of {n} processes",
        protocols.len(),
        reports.len(),
        started.elapsed().as_secs_f64()
    );
    let _ = writeln!(
        s,
        "windows: {} s warm-up, {} s measured, {} s drain; CS time 0; λ in {:?}",
        warmup.as_secs(),
        measure.as_secs(),
        drain.as_secs(),
        lambdas
    );
    s.push('\n');
    s.push_str("Without faults (CS time 0):\n\n");
    s.push_str(&table(&rows));
    s.push_str(
        "\npeak: highest CS/s over λ, at latency U(0,200) and U(100,100) ms. At λ = 2, U(0,200):\n\
         msgs = all protocol messages in the window per entry, p50/p99 = acquire latency,\n\
         late = fraction of entries granted while an earlier arrival still waited (0 = FCFS).\n\
         -: no entry at that load (collapsed).\n",
    );
    let _ = writeln!(s, "\nWith faults (λ = 2, U(0,200), CS {} ms):\n", FAULT_CS.as_millis());
    s.push_str(&fault_table(&rows));
    s.push_str(
        "\nresets: every replica (process) loses its memory after an exponential lifetime of mean T.\n\
         viol = exclusion violations; stuck = still waiting after the drain; crash = acquisitions that\n\
         died with their process (closed systems only); *: the run stopped at 400 waiters (collapse),\n\
         stuck is then the backlog at the stop.\n",
    );
    let _ = writeln!(s, "\nwritten to {}", opts.out.display());
    std::fs::write(opts.out.join("summary.txt"), &s)?;
    Ok(CompareResult { rows, summary: s })
}

/// Whether `protocol` is a closed system of processes.
pub fn is_closed(protocol: &str) -> bool {
    matches!(protocol, "central" | "lamport" | "ricart-agrawala" | "majority" | "maekawa" | "token-ring")
}

fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<16} {:>10} {:>9} {:>8} {:>8} {:>8} {:>6}",
        "protocol", "peak 0-200", "peak 100", "msgs", "p50 s", "p99 s", "late"
    );
    for r in rows {
        let m = &r.moderate;
        let _ = write!(s, "{:<16} {:>10.2} {:>9.2}", r.protocol, r.peak[0], r.peak[1]);
        if m.entries == 0 {
            let _ = writeln!(s, " {:>8} {:>8} {:>8} {:>6}", "-", "-", "-", "-");
        } else {
            let msgs = m.window_messages_per_entry;
            let msgs = if msgs < 1e5 { format!("{msgs:.1}") } else { format!("{msgs:.1e}") };
            let _ = writeln!(s, " {msgs:>8} {:>8.3} {:>8.3} {:>6.3}", m.acquire_p50, m.acquire_p99, m.out_of_order);
        }
    }
    s
}

fn fault_table(rows: &[Row]) -> String {
    let mut s = format!("{:<16}", "protocol");
    for life in LIFETIMES {
        let _ = write!(s, " | {:<23}", format!("resets, T = {life} s"));
    }
    let _ = writeln!(s, " | loss {}%", LOSS * 100.0);
    let _ = write!(s, "{:<16}", "");
    for _ in LIFETIMES {
        let _ = write!(s, " | {:>5} {:>4} {:>5} {:>5}", "CS/s", "viol", "stuck", "crash");
    }
    let _ = writeln!(s, " | {:>5} {:>4} {:>5}", "CS/s", "viol", "stuck");
    let cells = |r: &Report| {
        let stuck = format!("{}{}", r.waiting_at_end, if r.truncated_at.is_some() { "*" } else { "" });
        format!("{:>5.2} {:>4} {:>5}", r.throughput, r.violations.len(), stuck)
    };
    for r in rows {
        let _ = write!(s, "{:<16}", r.protocol);
        for x in &r.resets {
            let _ = write!(s, " | {} {:>5}", cells(x), x.crashed);
        }
        let _ = writeln!(s, " | {}", cells(&r.lossy));
    }
    s
}

fn write_table_csv(path: &Path, rows: &[Row]) -> Result<()> {
    let mut header = vec![
        "protocol".to_string(),
        "peak_cs_per_s_u0_200".into(),
        "peak_cs_per_s_u100_100".into(),
        "messages_per_entry".into(),
        "acquire_p50_s".into(),
        "acquire_p99_s".into(),
        "out_of_order".into(),
    ];
    for life in LIFETIMES {
        for f in ["throughput", "violations", "stuck", "crashed"] {
            header.push(format!("reset_{life}s_{f}"));
        }
    }
    for f in ["throughput", "violations", "stuck"] {
        header.push(format!("loss_{f}"));
    }
    let lines: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let m = &r.moderate;
            let mut v = vec![
                r.protocol.clone(),
                format!("{:.4}", r.peak[0]),
                format!("{:.4}", r.peak[1]),
                format!("{:.2}", m.window_messages_per_entry),
                format!("{:.4}", m.acquire_p50),
                format!("{:.4}", m.acquire_p99),
                format!("{:.4}", m.out_of_order),
            ];
            for x in &r.resets {
                v.extend([
                    format!("{:.4}", x.throughput),
                    x.violations.len().to_string(),
                    x.waiting_at_end.to_string(),
                    x.crashed.to_string(),
                ]);
            }
            v.resize(header.len() - 3, String::new());
            let l = &r.lossy;
            v.extend([format!("{:.4}", l.throughput), l.violations.len().to_string(), l.waiting_at_end.to_string()]);
            v
        })
        .collect();
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    write_csv(path, &header, &lines)
}
