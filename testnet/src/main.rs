//! `sigma-testnet`: the simulator (and, later, the local multi-process testnet).

use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use sigma_behaviour::proto::{backoff::Backoff, Config};
use sigma_testnet::sim::engine::{self, SimConfig};
use sigma_testnet::sim::latency::Latency;
use sigma_testnet::sim::paper;
use sigma_testnet::sim::protocol::{Sigma, Strawman};

#[derive(Parser)]
#[command(name = "sigma-testnet", version, about = "Local testnet and simulator for sigma")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmark real nodes on loopback (latency floor, lock/release, handoffs, messages).
    Bench(BenchArgs),
    /// Discrete-event simulator running the protocol core in virtual time.
    #[command(subcommand)]
    Sim(SimCommand),
}

#[derive(Args)]
struct BenchArgs {
    /// Nodes.
    #[arg(long, default_value_t = 8)]
    nodes: usize,
    /// Replicas per lock.
    #[arg(long, default_value_t = 32)]
    n: usize,
    /// Quorum.
    #[arg(long, default_value_t = 24)]
    m: usize,
    /// Uncontended lock+release rounds.
    #[arg(long, default_value_t = 200)]
    rounds: usize,
    /// Contending tasks on one lock.
    #[arg(long, default_value_t = 16)]
    waiters: usize,
    /// Seconds of contention.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Print the figures as JSON too.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum SimCommand {
    /// One simulation run, printed as a table row (or JSON).
    Run(RunArgs),
    /// Regenerate the paper's figures (Fig. 2, 3, 7, 8, message cost).
    Paper(PaperArgs),
}

#[derive(Args)]
struct PaperArgs {
    /// Output directory for CSV, SVG and summary.txt.
    #[arg(long, default_value = "results/paper")]
    out: std::path::PathBuf,
    /// Short windows and fewer points (about 30 s).
    #[arg(long)]
    quick: bool,
    /// Base seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Worker threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Exit non-zero when a target is missed.
    #[arg(long)]
    strict: bool,
}

#[derive(Args)]
struct RunArgs {
    /// Protocol: sigma, strawman (constant backoff window) or strawman-exp.
    #[arg(long, default_value = "sigma")]
    protocol: String,
    /// Arrival rate of acquisitions per second (Poisson).
    #[arg(long, default_value_t = 2.0)]
    lambda: f64,
    /// One-way latency: u:LO,HI | const:MS | exp:MEAN (milliseconds).
    #[arg(long, default_value = "u:0,200")]
    latency: Latency,
    /// Replicas.
    #[arg(long, default_value_t = 32)]
    n: usize,
    /// Quorum.
    #[arg(long, default_value_t = 24)]
    m: usize,
    /// Seconds in the critical section.
    #[arg(long, default_value_t = 0.0)]
    cs: f64,
    /// Mean replica lifetime in seconds (exponential resets); none if absent.
    #[arg(long)]
    lifetime: Option<f64>,
    /// Message loss probability.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Message duplication probability.
    #[arg(long, default_value_t = 0.0)]
    duplicate: f64,
    /// Warm-up seconds.
    #[arg(long, default_value_t = 300.0)]
    warmup: f64,
    /// Measured seconds.
    #[arg(long, default_value_t = 600.0)]
    measure: f64,
    /// Strawman backoff window (constant) or base (exponential), seconds.
    #[arg(long, default_value_t = 1.0)]
    backoff: f64,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Informed-backoff slack in percent of T_w (Sigma).
    #[arg(long, default_value_t = 25)]
    slack: u32,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Bench(a) => {
            let opts = sigma_testnet::bench::BenchOptions {
                nodes: a.nodes,
                n: a.n,
                m: a.m,
                rounds: a.rounds,
                waiters: a.waiters,
                contended: Duration::from_secs_f64(a.seconds),
            };
            let runtime = tokio::runtime::Runtime::new()?;
            let (report, summary) = runtime.block_on(sigma_testnet::bench::run(&opts))?;
            print!("{summary}");
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            }
        }
        Command::Sim(SimCommand::Paper(a)) => {
            let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
            let opts = paper::PaperOptions { out: a.out, quick: a.quick, seed: a.seed, threads };
            let result = paper::run(&opts)?;
            print!("{}", result.summary);
            let failed = result.targets.iter().filter(|t| !t.pass).count();
            if failed > 0 && a.strict {
                anyhow::bail!("{failed} target(s) missed (seed {})", opts.seed);
            }
        }
        Command::Sim(SimCommand::Run(a)) => {
            let config = Config::default().with_quorum(a.n, a.m).with_retry_slack_percent(a.slack);
            config.validate()?;
            let cfg = SimConfig {
                lambda: a.lambda,
                cs: Duration::from_secs_f64(a.cs),
                latency: a.latency,
                loss: a.loss,
                duplicate: a.duplicate,
                mean_lifetime: a.lifetime.map(Duration::from_secs_f64),
                warmup: Duration::from_secs_f64(a.warmup),
                measure: Duration::from_secs_f64(a.measure),
                seed: a.seed,
                max_backlog: None,
                arrivals_until: None,
            };
            let window = Duration::from_secs_f64(a.backoff);
            let report = match a.protocol.as_str() {
                "sigma" => engine::run(&Sigma(config), cfg),
                "strawman" => engine::run(&Strawman(config, Backoff::Constant { window }), cfg),
                "strawman-exp" => {
                    engine::run(&Strawman(config, Backoff::Exponential { base: window, cap: window * 64 }), cfg)
                }
                other => anyhow::bail!("unknown protocol {other:?} (sigma, strawman, strawman-exp)"),
            };
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                let mut r = report.clone();
                r.violations.truncate(3);
                println!("{r:#?}");
                println!("events/s: {:.0}", report.events_per_s());
            }
            if !report.violations.is_empty() {
                eprintln!("mutual exclusion violated {} times (seed {})", report.violations.len(), report.seed);
            }
        }
    }
    Ok(())
}
