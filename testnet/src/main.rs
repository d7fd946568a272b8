//! `sigma-testnet`: the local multi-process testnet (`up`, `status`, `down`, `run`),
//! the benchmark (`bench`), the simulator (`sim`) and the in-process swarm (`swarm`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use sigma_behaviour::proto::{Config, Recovery};
use sigma_testnet::sim::compare::{self, ProtocolParams};
use sigma_testnet::sim::engine::SimConfig;
use sigma_testnet::sim::latency::Latency;
use sigma_testnet::sim::paper;
use sigma_testnet::testnet::chaos::{ChaosOptions, Fault};
use sigma_testnet::testnet::cluster::{self, Cluster, UpOptions};
use sigma_testnet::testnet::proc::{self, locate_sigma, Params};
use sigma_testnet::testnet::run::{self as net_run, RunOptions};

/// jemalloc, as the daemon (`daemon/src/heap.rs`): in a 1,000-peer in-process swarm
/// glibc's malloc and free took about a fifth of the samples of a profile.
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Default testnet directory. Not `./testnet`: from the workspace root (where the README
/// runs `cargo run -p sigma-testnet`) that is this crate's own source directory.
const DEFAULT_DIR: &str = "testnet-data";

#[derive(Parser)]
#[command(name = "sigma-testnet", version, about = "Local testnet and simulator for sigma")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a local testnet of `sigma run` processes on 127.0.0.1 and leave it running.
    ///
    /// Node 0 starts first, then 15 nodes through it, then the rest in waves through
    /// three nodes already up; `up` returns once every node serves and sees every node
    /// alive (connected, or through the membership gossip: not a full mesh), and writes
    /// DIR/manifest.json. Each
    /// node has its own key file (DIR/node-I.key), log (DIR/node-I.log, its stderr) and
    /// HTTP API. Ports: with --base-port P, node I listens on TCP P+I and serves its API
    /// on P+1000+I; without it, ephemeral ports (see the manifest or `status`).
    Up(UpArgs),
    /// One line per node of the testnet in DIR: process alive and API answering, peers,
    /// replicas hosted, locks held and waited for (past 24 nodes: figures over all nodes,
    /// and rows for the nodes not serving). Exits 1 if a node that should run does not.
    Status(DirArgs),
    /// Stop the testnet in DIR: the processes listed in the manifest, by pid (SIGTERM,
    /// then SIGKILL after --grace), and nothing else. Keeps every file; marks the nodes
    /// stopped in the manifest.
    Down(DownArgs),
    /// Up, a workload, faults, a checker, down: try, measure and break sigma locally.
    ///
    /// Clients (tokio tasks here) are bound to a node (client k → node k mod N) and a
    /// resource (k mod R) and loop: acquire over HTTP, hold, release. A live view goes to
    /// stderr when it is a terminal; the summary to stdout: CS entries, CS/s per resource,
    /// acquire latency, protocol messages per CS entry, exclusion violations, overlaps
    /// after lease expiry, fencing-token regressions, waiters never served, faults fired.
    /// Exit status: 0 PASS, 1 FAIL, 2 error (e.g. the nodes did not start), 130 interrupted.
    Run(NetRunArgs),
    /// Benchmark real nodes on loopback (latency floor, lock/release, handoffs, messages);
    /// with --vs etcd: `sigma run` daemons against a 3-member etcd, side by side. Goals
    /// are printed; exit status 1 if two holds overlapped.
    Bench(BenchArgs),
    /// Does a swarm give its memory back? A stream of distinct lock names (each locked and
    /// released once) through `sigma run` processes, optionally with a hostile peer
    /// flooding made-up names, then an idle wait; prints per node over time RSS, hosted
    /// replicas, live acquisitions, and lock+release latency, and the targets (RSS back
    /// within 20 MB, replicas back to ~0, latency within 10%).
    Soak(SoakArgs),
    /// Discrete-event simulator running the protocol core in virtual time.
    #[command(subcommand)]
    Sim(SimCommand),
    /// A large swarm in one process: peers over the memory transport with the real
    /// behaviour, churn and contending clients; prints lookup hops and time, host
    /// agreement, keys with two hosts, acquire latency, messages per CS entry and
    /// exclusion violations (exit 1 if any).
    Swarm(sigma_testnet::swarm::cli::SwarmArgs),
}

#[derive(Args, Clone)]
struct NetArgs {
    /// Directory for the manifest, key files and logs.
    #[arg(long, default_value = DEFAULT_DIR)]
    dir: PathBuf,
    /// Node I listens on TCP port P+I and serves its API on P+1000+I (default: ephemeral ports).
    #[arg(long, value_name = "P")]
    base_port: Option<u16>,
    /// Logical replicas per lock for every node (with --m; default: the daemon's, 32).
    #[arg(long, requires = "m")]
    n: Option<usize>,
    /// Votes needed to win, a strict majority of n (with --n; default: the daemon's, 24).
    #[arg(long, requires = "n")]
    m: Option<usize>,
    /// The `sigma` binary [default: $SIGMA_BIN, else `sigma` next to this executable].
    #[arg(long, value_name = "PATH")]
    sigma_bin: Option<PathBuf>,
    /// Seconds the swarm may take to form before giving up [default: 60, or 2 per node
    /// past 30 nodes: a 200-process swarm formed in 229 s on a 2-core machine].
    #[arg(long, value_name = "SECONDS")]
    form_timeout: Option<f64>,
    /// Bound on each node's established connections (`sigma run --max-connections`;
    /// incoming: three quarters of it).
    #[arg(long, default_value_t = 64, value_name = "N")]
    max_connections: u32,
    /// Test only: every node holds each protocol message it sends for a one-way latency
    /// drawn from u:LO,HI | const:MS | exp:MEAN (milliseconds), as the simulator does
    /// (`sigma run --test-message-delay`); `run` then prints the simulator's throughput for
    /// the same setting beside its own (the paper's Fig. 7 on real nodes).
    #[arg(long, value_name = "DIST")]
    message_delay: Option<Latency>,
    /// Test only: every node but node 0 runs with a clock PPM parts per million fast
    /// (negative: slow), under libfaketime (Debian: apt-get install faketime). The
    /// daemons' drift bound is 1,000 ppm: within it the checker must see no overlap;
    /// beyond it, what breaks is the assumption's price (docs/testnet.md).
    #[arg(long, value_name = "PPM", allow_hyphen_values = true)]
    clock_drift: Option<i64>,
    /// Test only: every node runs a planted fault of the protocol core
    /// (grant-over-live-vote, count-lapsed-vote, disposal-forgets-floor: `sigma run
    /// --test-mutant`), so that the run shows its checker catches it.
    #[arg(long, value_name = "FAULT")]
    test_mutant: Option<String>,
}

#[derive(Args)]
struct UpArgs {
    /// Nodes.
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    #[command(flatten)]
    net: NetArgs,
    /// Lease of a vote in milliseconds (default: the daemon's, 10000).
    #[arg(long, value_name = "MS")]
    lease_ms: Option<u64>,
}

#[derive(Args)]
struct NetRunArgs {
    /// Nodes.
    #[arg(long, default_value_t = 8)]
    nodes: usize,
    /// Resources (locks named testnet-r0, testnet-r1, …).
    #[arg(long, default_value_t = 4)]
    resources: usize,
    /// Clients.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Seconds of workload.
    #[arg(long, default_value_t = 45.0, value_name = "SECONDS")]
    duration: f64,
    /// Milliseconds in the critical section.
    #[arg(long, default_value_t = 20, value_name = "MS")]
    hold_ms: u64,
    /// timeout_ms of each acquire (a 423 `not_won` is counted, and the client tries again).
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    acquire_timeout_ms: u64,
    /// Lease of a vote in milliseconds (a pause lasts longer than this).
    #[arg(long, default_value_t = 3000, value_name = "MS")]
    lease_ms: u64,
    /// Faults to fire, any of kill,restart,restart-graceful,join,pause,partition,split,
    /// isolate,clock-step (comma-separated; restart brings killed nodes back, so it comes
    /// with kill; restart-graceful is SIGTERM then a start, as `systemctl restart`;
    /// clock-step runs the nodes but node 0 under libfaketime and steps their wall clocks).
    #[arg(long, value_delimiter = ',', value_name = "FAULTS")]
    chaos: Vec<Fault>,
    /// Mean seconds between faults (exponentially distributed).
    #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
    chaos_interval: f64,
    /// Also run this many `sigma lock NAME -- CMD` holders in a loop (locks
    /// testnet-cmd0…, one per resource), each command recording its own start and stop;
    /// any two commands of one lock that ran at once fail the run.
    #[arg(long, default_value_t = 0, value_name = "N")]
    holders: usize,
    /// How long each holder's command runs unless `sigma lock` stops it.
    #[arg(long, default_value_t = 1.0, value_name = "SECONDS")]
    holder_hold: f64,
    /// Make the first lock (testnet-r0) an election: its clients campaign with their
    /// id as the value, and this many observers follow it (`GET /v1/watch`, observer j
    /// through node j). The run fails if an observer sees leaders out of token order,
    /// or misses a leader that held for at least 2.6 s while it could tell (its stream
    /// up and no `unknown` state in the term). Give leaders time: e.g. --hold-ms 3000.
    #[arg(long, default_value_t = 0, value_name = "K", conflicts_with = "slots")]
    observers: usize,
    /// Each resource is a semaphore of K slots (`slots=K` on every acquire): the run
    /// fails on any moment with more than K holders of one, from the holders' own
    /// intervals, and checks each slot as a lock.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u16).range(1..=64))]
    slots: Option<u16>,
    /// Seconds a pause lasts [default: lease + max(1 s, lease / 2)].
    #[arg(long, value_name = "SECONDS")]
    pause: Option<f64>,
    /// Pause only node N (when a client holds a lock through it): with --clock-drift,
    /// `--pause-node 0` pauses the one node whose clock runs at another rate than the
    /// replica hosts'.
    #[arg(long, value_name = "N")]
    pause_node: Option<usize>,
    /// Seconds a partition, split or isolation lasts before it heals [default: 3 leases].
    #[arg(long, value_name = "SECONDS")]
    cut: Option<f64>,
    /// Seed of the fault schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the figures as JSON to this file.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Write every critical section (client, resource, node, token, enter, exit,
    /// valid_until) as CSV to this file.
    #[arg(long, value_name = "PATH")]
    records: Option<PathBuf>,
    #[command(flatten)]
    net: NetArgs,
}

#[derive(Args)]
struct DirArgs {
    /// The testnet directory (holds manifest.json).
    #[arg(long, default_value = DEFAULT_DIR)]
    dir: PathBuf,
    /// Print the statuses as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct DownArgs {
    /// The testnet directory (holds manifest.json).
    #[arg(long, default_value = DEFAULT_DIR)]
    dir: PathBuf,
    /// Seconds between SIGTERM and SIGKILL.
    #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
    grace: f64,
}

#[derive(Args)]
struct SoakArgs {
    /// Nodes.
    #[arg(long, default_value_t = 5)]
    nodes: usize,
    /// Distinct lock names, each locked and released once.
    #[arg(long, default_value_t = 100_000)]
    names: u64,
    /// Concurrent HTTP clients (client k uses node k mod N).
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Seconds between samples.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    sample: f64,
    /// Seconds to watch the idle swarm after the stream (idle replicas go 5 s after their last
    /// release, cached hosts after 30 s); the warm-up before the start is followed by the
    /// same wait.
    #[arg(long, default_value_t = 90.0, value_name = "SECONDS")]
    idle: f64,
    /// REQUESTs for made-up names sent by one hostile peer during the stream (0: none).
    #[arg(long, default_value_t = 0)]
    flood: u64,
    /// Lock+release rounds of the latency probes before and after (one client on node 0,
    /// one round at a time: the cost of an operation, not queueing); the warm-up before
    /// them runs as many on every client.
    #[arg(long, default_value_t = 500)]
    probe_rounds: u64,
    /// Lease of a vote in milliseconds (default: the daemon's, 10000).
    #[arg(long, value_name = "MS")]
    lease_ms: Option<u64>,
    /// Write the report (every sample) as JSON to this file.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    #[command(flatten)]
    net: NetArgs,
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
    /// Uncontended lock+release rounds [default: 200; 300 with --vs].
    #[arg(long)]
    rounds: Option<usize>,
    /// Contending tasks on one lock [default: 16; 8 with --vs].
    #[arg(long)]
    waiters: Option<usize>,
    /// Seconds of contention.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Print the figures as JSON too.
    #[arg(long)]
    json: bool,
    /// Measure `sigma run` daemons against another system in the same run, through the
    /// same HTTP client: etcd (3 members on 127.0.0.1, started and removed by the bench;
    /// without etcd, says how to get it and measures sigma alone). Exit status 1 if a
    /// system let two holders overlap, a fencing token not grow, or a lock not free.
    #[arg(long, value_name = "SYSTEM", conflicts_with_all = ["nodes", "n", "m"])]
    vs: Option<Versus>,
    /// With --vs: the sigma swarm sizes, one row each.
    #[arg(long, value_delimiter = ',', default_value = "3,8", value_name = "N,…", requires = "vs")]
    daemons: Vec<usize>,
    /// With --vs: the etcd binary [default: `etcd` on PATH].
    #[arg(long, value_name = "PATH", requires = "vs")]
    etcd_bin: Option<PathBuf>,
    /// With --vs: the `sigma` binary [default: $SIGMA_BIN, else `sigma` next to this executable].
    #[arg(long, value_name = "PATH", requires = "vs")]
    sigma_bin: Option<PathBuf>,
    /// With --vs: lease of a vote for the daemons, ms (default: the daemon's, 10000; a
    /// new swarm waits about a lease before its first grant).
    #[arg(long, value_name = "MS", requires = "vs")]
    lease_ms: Option<u64>,
}

/// What `bench --vs` measures sigma against.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Versus {
    /// etcd 3.4+, its v3 JSON gateway and its lock service.
    Etcd,
}

#[derive(Subcommand)]
enum SimCommand {
    /// One simulation run, printed as a table row (or JSON).
    Run(RunArgs),
    /// Regenerate the paper's figures (Fig. 2, 3, 7, 8, message cost).
    Paper(PaperArgs),
    /// Every protocol side by side: throughput vs λ at U(0,200) and U(100,100), messages
    /// per entry, acquire latency, FCFS fairness, behaviour under resets and message loss.
    ///
    /// Writes DIR/runs.csv (one line per run), DIR/compare.csv (the tables),
    /// throughput and message plots (SVG and PNG) and DIR/summary.txt, and prints the
    /// table. Protocols: sigma, strawman, cmr, cmr-delayed, obeidat (n=32 replicas,
    /// m=24) and the closed systems central, lamport, ricart-agrawala, majority,
    /// maekawa, token-ring (32 processes).
    Compare(CompareArgs),
    /// The membership of a swarm in virtual time: the node's own membership and gossip
    /// tables for every peer, with loss, stalls, crashes and churn. Prints the bytes
    /// per peer and second, crash detection, false removals and formation against the
    /// goals of docs/benchmarks.md ("Membership in virtual time").
    Membership(MembershipArgs),
}

#[derive(Args)]
struct MembershipArgs {
    /// Peers.
    #[arg(long, default_value_t = 100)]
    peers: usize,
    /// RNG seed (one seed, one run: the digest printed).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seconds measured after formation.
    #[arg(long, default_value_t = 60.0)]
    measure: f64,
    /// Peers started per second while the swarm forms (as `swarm`'s default).
    #[arg(long, default_value_t = 50.0)]
    join_rate: f64,
    /// Give up forming after this many seconds (the window is measured anyway).
    #[arg(long, default_value_t = 300.0)]
    max_formation: f64,
    /// One-way latency: u:LO,HI | const:MS | exp:MEAN (milliseconds).
    #[arg(long, default_value = "u:5,50")]
    latency: Latency,
    /// Probability that a message is lost.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Share of the peers that stall --stall-ms once a minute.
    #[arg(long, default_value_t = 0.0)]
    stall_share: f64,
    /// How long a stall lasts, ms.
    #[arg(long, default_value_t = 1000)]
    stall_ms: u64,
    /// Departures per second in the measured window, each replaced by a newcomer.
    #[arg(long, default_value_t = 0.0)]
    churn: f64,
    /// Sessions drawn from a Weibull distribution of shape 0.5 with this median, in
    /// seconds (measured DHT sessions: half of new peers gone within about 2 h, 7200),
    /// each departure replaced by a newcomer; instead of, or on top of, --churn.
    #[arg(long)]
    session_median: Option<f64>,
    /// Share of the departures that are graceful leaves (the rest crash).
    #[arg(long, default_value_t = 0.0)]
    leave_share: f64,
    /// Crashes spread over the measured window, not replaced.
    #[arg(long, default_value_t = 10)]
    crashes: usize,
    /// Gossip interval, ms (the node's default).
    #[arg(long, default_value_t = 500)]
    gossip_interval_ms: u64,
    /// Gossip fanout (the node's default).
    #[arg(long, default_value_t = 2)]
    gossip_fanout: usize,
    /// Prefix groups of this many bits of the Kademlia key (0: one swarm); see
    /// docs/design/membership-at-scale.md.
    #[arg(long, default_value_t = 0)]
    group_bits: u32,
    /// Groups split as the node's membership decides them: the swarm starts as one
    /// group, and a group splits once each half counts this many members (instead of
    /// --group-bits).
    #[arg(long, conflicts_with = "group_bits")]
    split_at: Option<usize>,
    /// Each round, also ask up to this many members that a pending joint quorum waits
    /// on for their acknowledgements alone (the node does not yet).
    #[arg(long, default_value_t = 0)]
    ack_requests: usize,
    /// How long a relayed heartbeat keeps its member alive, ms (the node's default).
    #[arg(long, default_value_t = 5000)]
    gossip_liveness_ms: u64,
    /// Write the report as JSON here too.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// Options of the commands that run many simulations.
#[derive(Args)]
struct BatchArgs {
    /// Short windows and fewer points (seconds instead of a minute or two).
    #[arg(long)]
    quick: bool,
    /// Base seed; each run derives its own from it (a failing run prints its seed).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Worker threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
}

impl BatchArgs {
    fn threads(&self) -> usize {
        self.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
    }
}

#[derive(Args)]
struct CompareArgs {
    /// Output directory.
    #[arg(long, default_value = "results/compare")]
    out: std::path::PathBuf,
    #[command(flatten)]
    batch: BatchArgs,
    /// Only these protocols (comma-separated; default: all). Seeds depend on the
    /// protocol and scenario, so a subset reproduces its rows of the full comparison.
    #[arg(long, value_delimiter = ',')]
    protocols: Vec<String>,
}

#[derive(Args)]
struct PaperArgs {
    /// Output directory for CSV, SVG and summary.txt.
    #[arg(long, default_value = "results/paper")]
    out: std::path::PathBuf,
    #[command(flatten)]
    batch: BatchArgs,
    /// Exit non-zero when a target is missed.
    #[arg(long)]
    strict: bool,
}

#[derive(Args)]
struct RunArgs {
    /// Protocol: sigma, strawman (constant backoff window), strawman-exp, cmr, cmr-delayed
    /// (exponential backoff, Δ = lease), obeidat, or a closed system of n processes:
    /// central, lamport, ricart-agrawala, majority, maekawa, token-ring.
    #[arg(long, default_value = "sigma")]
    protocol: String,
    /// Arrival rate of acquisitions per second (Poisson).
    #[arg(long, default_value_t = 2.0)]
    lambda: f64,
    /// One-way latency: u:LO,HI | const:MS | exp:MEAN (milliseconds).
    #[arg(long, default_value = "u:0,200")]
    latency: Latency,
    /// Replicas (processes, for a closed system).
    #[arg(long, default_value_t = 32)]
    n: usize,
    /// Quorum (ignored by closed systems).
    #[arg(long, default_value_t = 24)]
    m: usize,
    /// Seconds in the critical section.
    #[arg(long, default_value_t = 0.0)]
    cs: f64,
    /// Each critical section lasts --cs plus a uniform draw in [0, SECONDS].
    #[arg(long, default_value_t = 0.0, value_name = "SECONDS")]
    cs_spread: f64,
    /// Lease of a vote in seconds (renewal interval a third of it, request timeout at
    /// most a quarter); default: the core's, 10.
    #[arg(long, value_name = "SECONDS")]
    lease: Option<f64>,
    /// Renewal interval of a held vote in seconds (below the lease); default: a third
    /// of the lease.
    #[arg(long, value_name = "SECONDS")]
    renew: Option<f64>,
    /// Every node's clock is offset by a fixed amount drawn uniformly in ±MS.
    #[arg(long, default_value_t = 0.0, value_name = "MS")]
    skew_ms: f64,
    /// Clock-rate error: with --skew-ms every node's offset wanders within ±skew at a
    /// rate drawn in [PPM/2, PPM] (two clocks differ by up to 2·PPM); without, every
    /// clock runs fast or slow by a fixed rate drawn in ±PPM.
    #[arg(long, default_value_t = 0.0, value_name = "PPM")]
    drift_ppm: f64,
    /// Probability that a message copy is delivered late (by --late-delay on top of
    /// its latency).
    #[arg(long, default_value_t = 0.0)]
    late: f64,
    /// Extra delay of a late message: u:LO,HI | const:MS | exp:MEAN (milliseconds); the
    /// default is ⅕ to 2 default leases.
    #[arg(long, default_value = "u:2000,20000")]
    late_delay: Latency,
    /// A reset replica grants nothing for one lease (plus the drift bound): the
    /// takeover delay of the node's split-brain rules.
    #[arg(long)]
    takeover_delay: bool,
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
    /// Strawman backoff window (constant) or base (exponential: strawman-exp, cmr), seconds.
    #[arg(long, default_value_t = 1.0)]
    backoff: f64,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Informed-backoff slack in percent of T_w (Sigma); default: the core's.
    #[arg(long)]
    slack: Option<u32>,
    /// Reset recovery (Sigma): none, reask, inquire, relay (ARCHITECTURE.md, "Reset
    /// recovery"); default: the core's.
    #[arg(long, value_parser = parse_recovery)]
    recovery: Option<Recovery>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_recovery(s: &str) -> Result<Recovery, String> {
    match s {
        "none" => Ok(Recovery::None),
        "reask" => Ok(Recovery::Reask),
        "inquire" => Ok(Recovery::Inquire),
        "relay" => Ok(Recovery::Relay),
        _ => Err(format!("unknown recovery rule {s:?}: none, reask, inquire or relay")),
    }
}

/// Seconds a swarm of `nodes` processes may take to form, by default.
fn default_form_timeout(nodes: usize) -> f64 {
    (2.0 * nodes as f64).max(60.0)
}

fn up_options(nodes: usize, net: &NetArgs, lease_ms: Option<u64>) -> Result<UpOptions> {
    Ok(UpOptions {
        nodes,
        base_port: net.base_port,
        dir: net.dir.clone(),
        params: Params {
            n: net.n,
            m: net.m,
            lease_ms,
            max_connections: Some(net.max_connections),
            swarm_size: nodes,
            message_delay: net.message_delay.map(|l| l.to_string()),
            clock_drift_ppm: net.clock_drift,
            clock_steps: false,
            mutant: net.test_mutant.clone(),
        },
        sigma_bin: locate_sigma(net.sigma_bin.as_deref())?,
        form_timeout: Duration::try_from_secs_f64(net.form_timeout.unwrap_or(default_form_timeout(nodes)))?,
    })
}

/// The simulator's saturated throughput (λ = 10/s, the paper's highest rate) for the
/// setting of a `run` with `--message-delay`: Sigma, the same n, m, lease and CS time.
fn simulated_throughput(n: usize, m: usize, latency: Latency, lease: Duration, cs: Duration, seed: u64) -> Result<f64> {
    let config = Config::default().with_quorum(n, m).with_lease(lease);
    config.validate()?;
    let cfg = SimConfig { cs, ..SimConfig::paper(10.0, latency, seed) };
    let params = ProtocolParams { config, backoff: Duration::from_secs(1) };
    Ok(compare::run_protocol("sigma", &params, cfg)?.throughput)
}

fn main() -> ExitCode {
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sigma-testnet: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn real_main() -> Result<ExitCode> {
    match Cli::parse().command {
        Command::Up(a) => {
            let opts = up_options(a.nodes, &a.net, a.lease_ms)?;
            let runtime = tokio::runtime::Runtime::new()?;
            let mut cluster = runtime.block_on(Cluster::up(opts))?;
            cluster.manifest().save()?;
            cluster.keep_running = true;
            print!("{}", cluster::render_up(&cluster));
            // The nodes run in their own sessions; dropping their handles leaves them running.
            drop(cluster);
        }
        Command::Run(a) => {
            let lease = Duration::from_millis(a.lease_ms);
            let pause_for = match a.pause {
                Some(s) => Duration::try_from_secs_f64(s)?,
                None => lease + (lease / 2).max(Duration::from_secs(1)),
            };
            let mut faults = a.chaos.clone();
            faults.sort();
            faults.dedup();
            if faults.contains(&Fault::Restart) && !faults.contains(&Fault::Kill) {
                anyhow::bail!(
                    "--chaos restart brings killed nodes back: give it with kill (e.g. --chaos kill,restart)"
                );
            }
            if faults.contains(&Fault::ClockStep) && a.net.clock_drift.is_some() {
                anyhow::bail!(
                    "--chaos clock-step steps the wall clock only and leaves the monotonic clocks real, which \
                     --clock-drift scales: give one or the other"
                );
            }
            let mut up = up_options(a.nodes, &a.net, Some(a.lease_ms))?;
            up.params.clock_steps = faults.contains(&Fault::ClockStep);
            if up.params.clock_steps {
                proc::faketime_lib()?;
            }
            let opts = RunOptions {
                up,
                resources: a.resources,
                clients: a.clients,
                duration: Duration::try_from_secs_f64(a.duration)?,
                hold: Duration::from_millis(a.hold_ms),
                acquire_timeout_ms: a.acquire_timeout_ms,
                chaos: ChaosOptions {
                    faults,
                    mean_interval: Duration::try_from_secs_f64(a.chaos_interval)?,
                    seed: a.seed,
                    pause_for,
                    pause_node: a.pause_node,
                    cut_for: match a.cut {
                        Some(s) => Duration::try_from_secs_f64(s)?,
                        None => lease * 3,
                    },
                },
                holders: a.holders,
                holder_hold: Duration::try_from_secs_f64(a.holder_hold)?,
                observers: a.observers,
                slots: a.slots,
            };
            let runtime = tokio::runtime::Runtime::new()?;
            let (report, summary) = runtime.block_on(net_run::run(&opts))?;
            print!("{summary}");
            if let Some(latency) = a.net.message_delay {
                let (n, m) = (a.net.n.unwrap_or(32), a.net.m.unwrap_or(24));
                let simulated = simulated_throughput(n, m, latency, lease, opts.hold, a.seed)?;
                let measured = report.cs_per_s / a.resources.max(1) as f64;
                println!(
                    "message delay {latency}: {measured:.2} CS/s per lock here; the simulator, same setting (n = {n}, \
                     m = {m}, CS {} ms, λ = 10/s, saturated; 600 s): {simulated:.2} CS/s ({:+.1}%)",
                    opts.hold.as_millis(),
                    100.0 * (measured / simulated - 1.0)
                );
            }
            if let Some(path) = &a.json {
                std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")?;
            }
            if let Some(path) = &a.records {
                std::fs::write(path, net_run::records_csv(&report))?;
            }
            if report.interrupted {
                return Ok(ExitCode::from(130));
            }
            if !report.pass {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Status(a) => {
            let runtime = tokio::runtime::Runtime::new()?;
            let (table, healthy, rows) = runtime.block_on(cluster::status(&a.dir))?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print!("{table}");
            }
            if !healthy {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Down(a) => {
            let runtime = tokio::runtime::Runtime::new()?;
            let grace = Duration::try_from_secs_f64(a.grace)?;
            print!("{}", runtime.block_on(cluster::down(&a.dir, grace))?);
        }
        Command::Bench(a) if a.vs.is_some() => {
            let opts = sigma_testnet::versus::VersusOptions {
                daemons: a.daemons.clone(),
                rounds: a.rounds.unwrap_or(300),
                workers: a.waiters.unwrap_or(8),
                contended: Duration::try_from_secs_f64(a.seconds)?,
                sigma_bin: locate_sigma(a.sigma_bin.as_deref())?,
                etcd_bin: sigma_testnet::etcd::locate(a.etcd_bin.as_deref()),
                lease_ms: a.lease_ms,
                dir: sigma_testnet::versus::run_dir(),
            };
            if let Err(why) = &opts.etcd_bin {
                eprintln!("sigma-testnet: {why}; measuring sigma alone");
            }
            let runtime = tokio::runtime::Runtime::new()?;
            // Ctrl-C drops the run, whose guards stop etcd and the daemons and remove
            // their files.
            let outcome = runtime.block_on(async {
                tokio::select! {
                    r = sigma_testnet::versus::run(&opts) => Some(r),
                    _ = tokio::signal::ctrl_c() => None,
                }
            });
            let Some(outcome) = outcome else {
                eprintln!("sigma-testnet: interrupted: etcd and the daemons stopped");
                return Ok(ExitCode::from(130));
            };
            let (report, summary) = outcome?;
            print!("{summary}");
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            }
            if !report.pass() {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Bench(a) => {
            let opts = sigma_testnet::bench::BenchOptions {
                nodes: a.nodes,
                n: a.n,
                m: a.m,
                rounds: a.rounds.unwrap_or(200),
                waiters: a.waiters.unwrap_or(16),
                contended: Duration::try_from_secs_f64(a.seconds)?,
            };
            let runtime = tokio::runtime::Runtime::new()?;
            let (report, summary) = runtime.block_on(sigma_testnet::bench::run(&opts))?;
            print!("{summary}");
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            }
            if !report.pass() {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Soak(a) => {
            let opts = sigma_testnet::testnet::soak::SoakOptions {
                up: up_options(a.nodes, &a.net, a.lease_ms)?,
                names: a.names,
                clients: a.clients,
                sample: Duration::try_from_secs_f64(a.sample)?,
                idle: Duration::try_from_secs_f64(a.idle)?,
                flood: a.flood,
                probe_rounds: a.probe_rounds,
            };
            let runtime = tokio::runtime::Runtime::new()?;
            let (report, summary) = runtime.block_on(sigma_testnet::testnet::soak::run(&opts))?;
            print!("{summary}");
            if let Some(path) = &a.json {
                std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")?;
            }
        }
        Command::Swarm(a) => return sigma_testnet::swarm::cli::main(&a),
        Command::Sim(SimCommand::Paper(a)) => {
            let (quick, seed, threads) = (a.batch.quick, a.batch.seed, a.batch.threads());
            let opts = paper::PaperOptions { out: a.out, quick, seed, threads };
            let result = paper::run(&opts)?;
            print!("{}", result.summary);
            let failed = result.targets.iter().filter(|t| !t.pass).count();
            if failed > 0 && a.strict {
                anyhow::bail!("{failed} target(s) missed (seed {})", opts.seed);
            }
        }
        Command::Sim(SimCommand::Compare(a)) => {
            let (quick, seed, threads) = (a.batch.quick, a.batch.seed, a.batch.threads());
            let opts = compare::CompareOptions { out: a.out, quick, seed, threads, protocols: a.protocols };
            print!("{}", compare::run(&opts)?.summary);
        }
        Command::Sim(SimCommand::Membership(a)) => {
            use sigma_testnet::sim::membership;
            let mut cfg = membership::Config::new(a.peers, a.seed);
            cfg.measure = Duration::try_from_secs_f64(a.measure)?;
            cfg.join_rate = a.join_rate;
            cfg.max_formation = Duration::try_from_secs_f64(a.max_formation)?;
            cfg.latency = a.latency;
            cfg.loss = a.loss;
            cfg.stall_share = a.stall_share;
            cfg.stall = Duration::from_millis(a.stall_ms);
            cfg.churn = a.churn;
            cfg.leave_share = a.leave_share;
            cfg.session_median = a.session_median.map(Duration::try_from_secs_f64).transpose()?;
            cfg.crashes = a.crashes;
            cfg.gossip_interval = Duration::from_millis(a.gossip_interval_ms.max(10));
            cfg.gossip_fanout = a.gossip_fanout.max(1);
            cfg.group_bits = a.group_bits.min(16);
            cfg.split_at = a.split_at.map(|n| n.max(1));
            cfg.ack_requests = a.ack_requests.min(64);
            cfg.gossip_liveness = Duration::from_millis(a.gossip_liveness_ms).max(cfg.gossip_interval);
            let report = membership::run(&cfg);
            print!("{}", membership::summary(&report));
            if let Some(path) = &a.json {
                std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")?;
            }
        }
        Command::Sim(SimCommand::Run(a)) => {
            // A closed system has n processes and no quorum parameter.
            let m = if compare::is_closed(&a.protocol) { a.n / 2 + 1 } else { a.m };
            let mut config = Config::default().with_quorum(a.n, m);
            if let Some(slack) = a.slack {
                config = config.with_retry_slack_percent(slack);
            }
            if let Some(recovery) = a.recovery {
                config = config.with_recovery(recovery);
            }
            if let Some(lease) = a.lease {
                config = config.with_lease(Duration::try_from_secs_f64(lease)?);
            }
            if let Some(renew) = a.renew {
                config = config.with_renew_interval(Duration::try_from_secs_f64(renew)?);
            }
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
                drain: Duration::ZERO,
                cs_spread: Duration::try_from_secs_f64(a.cs_spread)?,
                clock_skew: Duration::try_from_secs_f64(a.skew_ms / 1e3)?,
                drift_ppm: a.drift_ppm,
                late: a.late,
                late_delay: a.late_delay,
                takeover_delay: a.takeover_delay,
            };
            let params = ProtocolParams { config, backoff: Duration::from_secs_f64(a.backoff) };
            let report = compare::run_protocol(&a.protocol, &params, cfg)?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                let mut r = report.clone();
                r.violations.truncate(3);
                println!("{r:#?}");
                println!("events/s: {:.0}", report.events_per_s());
            }
            if !report.violations.is_empty() {
                eprintln!(
                    "mutual exclusion violated {} times, {} of them budget violations (fewer than 2m − n shared \
                     voters reset between the grants) (seed {})",
                    report.violations.len(),
                    report.budget_violations,
                    report.seed
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
