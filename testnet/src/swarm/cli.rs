//! The `sigma-testnet swarm` command line.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::{render, run, SwarmOptions, Timing};

/// `sigma-testnet swarm`: the in-process swarm.
#[derive(Args, Clone, Debug)]
pub struct SwarmArgs {
    /// Peers, kept constant under churn.
    #[arg(long, default_value_t = 1000)]
    pub peers: usize,
    /// Seconds of churn and workload.
    #[arg(long, default_value_t = 60.0, value_name = "SECONDS")]
    pub duration: f64,
    /// Peers replaced per second (one leaves: its swarm is dropped; a new one, with a new
    /// key, joins through bootstrap).
    #[arg(long, default_value_t = 1.0, value_name = "R")]
    pub churn: f64,
    /// Client tasks, each on a random serving peer (another one when it leaves).
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Locks (swarm-r0, swarm-r1, …).
    #[arg(long, default_value_t = 8)]
    pub resources: usize,
    /// Seed of every random choice (keys, bootstrap peers, churn, clients).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Replicas per lock.
    #[arg(long, default_value_t = 32)]
    pub n: usize,
    /// Votes to win, a strict majority of n.
    #[arg(long, default_value_t = 24)]
    pub m: usize,
    /// Lease of a vote in milliseconds.
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    pub lease_ms: u64,
    /// Milliseconds in the critical section.
    #[arg(long, default_value_t = 50, value_name = "MS")]
    pub hold_ms: u64,
    /// Mean milliseconds a client waits between acquisitions (uniform in [0, 2×]).
    #[arg(long, default_value_t = 200, value_name = "MS")]
    pub think_ms: u64,
    /// Seconds before an acquisition is abandoned.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub acquire_timeout: f64,
    /// Established connections per peer at most.
    #[arg(long, default_value_t = 64)]
    pub max_connections: u32,
    /// Seconds before an idle connection is closed.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub idle: f64,
    /// Peers started per second while the swarm forms.
    #[arg(long, default_value_t = 50.0)]
    pub join_rate: f64,
    /// Seconds the swarm may take to form (every peer serving); the run goes on after it
    /// and reports how many did.
    #[arg(long, default_value_t = 120.0, value_name = "SECONDS")]
    pub form_timeout: f64,
    /// Kademlia lookups measured after convergence.
    #[arg(long, default_value_t = 200)]
    pub lookups: usize,
    /// Membership gossip interval in ms [default: 500, slower beyond 150 peers].
    #[arg(long, value_name = "MS")]
    pub gossip_ms: Option<u64>,
    /// Gossip liveness in ms [default: 10 gossip intervals].
    #[arg(long, value_name = "MS")]
    pub liveness_ms: Option<u64>,
    /// Liveness ping interval in ms [default: 1000, 5000 beyond 150 peers].
    #[arg(long, value_name = "MS")]
    pub ping_ms: Option<u64>,
    /// Seconds between ownership re-lookups of a hosted key [default: 30].
    #[arg(long, value_name = "SECONDS")]
    pub ownership_ttl: Option<f64>,
    /// Seconds the clients go on after churn stops, before the swarm is measured
    /// [default: ownership TTL + liveness timeout + 2 s].
    #[arg(long, value_name = "SECONDS")]
    pub settle: Option<f64>,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<std::path::PathBuf>,
}

impl SwarmArgs {
    /// The run these arguments describe.
    pub fn options(&self) -> anyhow::Result<SwarmOptions> {
        let mut timing = Timing::for_peers(self.peers, Duration::from_millis(self.lease_ms));
        if let Some(ms) = self.gossip_ms {
            timing.gossip = Duration::from_millis(ms);
            timing.liveness = timing.gossip * 10;
        }
        if let Some(ms) = self.liveness_ms {
            timing.liveness = Duration::from_millis(ms);
        }
        if let Some(ms) = self.ping_ms {
            timing.ping = Duration::from_millis(ms);
            timing.ping_timeout = timing.ping * 2;
        }
        if let Some(s) = self.ownership_ttl {
            timing.ownership_ttl = Duration::try_from_secs_f64(s)?;
        }
        timing.idle = Duration::try_from_secs_f64(self.idle)?;
        timing.settle = match self.settle {
            Some(s) => Duration::try_from_secs_f64(s)?,
            None => timing.default_settle(),
        };
        Ok(SwarmOptions {
            peers: self.peers,
            duration: Duration::try_from_secs_f64(self.duration)?,
            churn: self.churn,
            clients: self.clients,
            resources: self.resources,
            seed: self.seed,
            n: self.n,
            m: self.m,
            hold: Duration::from_millis(self.hold_ms),
            think: Duration::from_millis(self.think_ms),
            acquire_timeout: Duration::try_from_secs_f64(self.acquire_timeout)?,
            max_connections: self.max_connections,
            join_rate: self.join_rate,
            form_timeout: Duration::try_from_secs_f64(self.form_timeout)?,
            lookups: self.lookups,
            timing,
        })
    }
}

/// Runs `sigma-testnet swarm`: prints the summary; exit status 1 if exclusion was
/// violated.
pub fn main(args: &SwarmArgs) -> anyhow::Result<ExitCode> {
    let opts = args.options()?;
    // The behaviours' logs, on demand (a thousand peers log a lot).
    if std::env::var_os("RUST_LOG").is_some() {
        let filter = tracing_subscriber::EnvFilter::from_default_env();
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    }
    let runtime = tokio::runtime::Runtime::new()?;
    let report = runtime.block_on(run(&opts))?;
    print!("{}", render(&report));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")?;
    }
    if report.violations > 0 {
        eprintln!("exclusion violated {} times (seed {})", report.violations, report.seed);
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
