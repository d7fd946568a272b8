//! `sigma-testnet run`: up, a workload, faults, the checker, down; a live view on
//! stderr (hidden when stderr is not a terminal), a summary table on stdout, the same
//! figures as JSON on request, PASS or FAIL.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use tokio::sync::watch;

use super::api::{self, Completed};
use super::chaos::{say, ChaosOptions, Crash, Fault, FaultEvent, Supervisor};
use super::check::{self, Findings};
use super::cluster::{Cluster, State, UpOptions};
use super::holders::{HolderOptions, HolderReport, Holders};
use super::observers::{ObserverReport, Observers};
use super::workload::{resource_name, NodeState, Slot, Workload, WorkloadOptions, World};

/// Parameters of a run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The testnet.
    pub up: UpOptions,
    /// Resources (locks).
    pub resources: usize,
    /// Clients.
    pub clients: usize,
    /// Length of the workload.
    pub duration: Duration,
    /// Time in the critical section.
    pub hold: Duration,
    /// `timeout_ms` of each acquire.
    pub acquire_timeout_ms: u64,
    /// Faults.
    pub chaos: ChaosOptions,
    /// `sigma lock` command holders beside the HTTP clients (0: none).
    pub holders: usize,
    /// How long each holder's command runs unless stopped.
    pub holder_hold: Duration,
    /// Election observers of the first lock (0: none; see [`super::observers`]).
    pub observers: usize,
    /// Each resource is a semaphore of this many slots; `None`: locks.
    pub slots: Option<u16>,
}

/// Latency figures, ms.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    /// Successful acquires measured.
    pub count: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Maximum.
    pub max_ms: f64,
}

/// One resource's figures.
#[derive(Clone, Debug, Serialize)]
pub struct ResourceFigures {
    /// Lock name.
    pub name: String,
    /// Critical sections entered.
    pub entries: usize,
    /// Entries per second of workload.
    pub cs_per_s: f64,
    /// Clients bound to it.
    pub clients: usize,
    /// Of those, clients that entered at least once.
    pub clients_served: usize,
}

/// A PASS/FAIL line.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    /// What is checked.
    pub name: String,
    /// Whether it holds.
    pub pass: bool,
    /// The figure behind it.
    pub detail: String,
}

/// Acquire and release outcomes.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Attempts {
    /// Acquires answered 423 `not_won`.
    pub timeouts: u64,
    /// Acquires that failed otherwise (node down or paused, 503, …).
    pub errors: u64,
    /// Attempts through another node than the client's own.
    pub failovers: u64,
    /// Releases answered 404: the lock had been lost while held.
    pub releases_lost: u64,
    /// Releases that failed (node gone).
    pub releases_failed: u64,
    /// Holders that held on while their node was paused.
    pub paused_holders: u64,
    /// The first few acquire errors.
    pub sample_errors: Vec<String>,
}

/// Everything a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// Nodes started by `up`.
    pub nodes: usize,
    /// Resources.
    pub resources: usize,
    /// Clients.
    pub clients: usize,
    /// Requested workload length, s.
    pub duration_s: f64,
    /// Measured workload length, s.
    pub elapsed_s: f64,
    /// Hold time, ms.
    pub hold_ms: f64,
    /// Replicas per lock (None: the daemon's default).
    pub n: Option<usize>,
    /// Quorum (None: the daemon's default).
    pub m: Option<usize>,
    /// Lease, ms (None: the daemon's default).
    pub lease_ms: Option<u64>,
    /// Chaos seed.
    pub seed: u64,
    /// Enabled fault kinds.
    pub chaos: Vec<Fault>,
    /// Mean seconds between faults.
    pub chaos_interval_s: f64,
    /// Stopped early by Ctrl-C.
    pub interrupted: bool,
    /// Seconds the swarm took to form.
    pub formed_in_s: f64,
    /// The testnet directory (logs).
    pub dir: String,
    /// Critical sections entered.
    pub entries: usize,
    /// Entries per second.
    pub cs_per_s: f64,
    /// Per resource.
    pub per_resource: Vec<ResourceFigures>,
    /// Acquire latency of the successful acquires.
    pub acquire_latency: Latency,
    /// Other outcomes.
    pub attempts: Attempts,
    /// Σ sigma_completed_total over the nodes (killed incarnations scraped before the kill).
    pub completed: u64,
    /// Σ sigma_completed_messages_total.
    pub completed_messages: u64,
    /// Their ratio: protocol messages per CS entry.
    pub messages_per_entry: f64,
    /// Σ sigma_requests_out_total: transport requests (a batch to one peer counts one).
    pub requests: u64,
    /// Transport requests per CS entry (every request of the run, retries, redirects and
    /// probes included).
    pub requests_per_entry: f64,
    /// Σ requests refused for another replica count (peers of one swarm share n, so
    /// any is a bug: a refused RELEASE leaves a vote with nobody until its lease ends).
    pub quorum_mismatch: u64,
    /// Faults that took effect, by kind.
    pub faults_fired: BTreeMap<String, usize>,
    /// Every fault, in order.
    pub fault_events: Vec<FaultEvent>,
    /// Per fault that took effect: the longest time one lock saw no critical section
    /// between the fault and the next one (or the end of the run).
    pub unavailability: Vec<Unavailability>,
    /// Nodes that died on their own.
    pub crashes: Vec<Crash>,
    /// Σ token_regressions reported by the nodes themselves (GET /v1/status).
    pub node_token_regressions: u64,
    /// Exclusion violations.
    pub violations: usize,
    /// Overlaps after the earlier holder's lease had expired, later token larger.
    pub overlaps_after_expiry: usize,
    /// Fencing-token regressions between successive holders.
    pub token_regressions: usize,
    /// Clients never served.
    pub never_served: Vec<usize>,
    /// The first few of each finding.
    pub findings: Findings,
    /// Connections per node: the largest count each node reported, sampled every 2 s
    /// while the workload ran (by node index; 0 for a node never sampled).
    pub connection_peaks: Vec<u32>,
    /// The bound every node was started with (`--max-connections`).
    pub connection_bound: u32,
    /// The membership's cost per node over the workload (none: not scraped).
    pub membership: Option<super::membership::Figures>,
    /// Nodes that went down (killed, crashed) followed out of the live nodes' views
    /// (none: a run without faults).
    pub detection: Option<super::membership::Detection>,
    /// The `sigma lock` command holders, if any ran.
    pub holders: Option<HolderReport>,
    /// The election observers, if any ran.
    pub observers: Option<ObserverReport>,
    /// Slots of each semaphore (`--slots`); `None`: the resources are locks.
    pub slots: Option<u16>,
    /// The semaphore check (the first few stretches over capacity).
    pub semaphore: Option<check::Capacity>,
    /// PASS/FAIL lines.
    pub targets: Vec<Target>,
    /// All targets hold.
    pub pass: bool,
    /// Every critical section (not in the JSON: see [`records_csv`]).
    #[serde(skip)]
    pub records: Vec<check::Cs>,
}

/// Every critical section as CSV: client, resource, node, token, enter_ms, exit_ms,
/// valid_until_ms (ms since the workload started), sorted by resource and enter time.
pub fn records_csv(r: &RunReport) -> String {
    let mut rows = r.records.clone();
    rows.sort_by_key(|e| (e.resource, e.enter));
    let mut s = String::from("client,resource,node,token,enter_ms,exit_ms,valid_until_ms\n");
    for e in rows {
        let _ = writeln!(
            s,
            "{},{},{},{},{:.3},{:.3},{:.3}",
            e.client,
            lock_name(e.resource, r.slots),
            e.node,
            e.token,
            e.enter.as_secs_f64() * 1e3,
            e.exit.as_secs_f64() * 1e3,
            e.valid_until.as_secs_f64() * 1e3
        );
    }
    s
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

fn view(len: Duration) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(len.as_secs().max(1)), ProgressDrawTarget::stderr_with_hz(4));
    pb.set_style(
        ProgressStyle::with_template("{spinner} [{bar:20}] {pos:>3}/{len}s {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb
}

/// Runs the whole job. Errors are set-up failures (the nodes did not start or the swarm
/// did not form); a run that completes returns its report, PASS or FAIL.
pub async fn run(opts: &RunOptions) -> Result<(RunReport, String)> {
    let wopts = WorkloadOptions {
        clients: opts.clients,
        resources: opts.resources,
        nodes: opts.up.nodes,
        hold: opts.hold,
        acquire_timeout_ms: opts.acquire_timeout_ms,
        election: opts.observers > 0,
        slots: opts.slots,
    };
    anyhow::ensure!(opts.clients > 0 && opts.resources > 0, "--clients and --resources must be at least 1");
    eprintln!(
        "sigma-testnet run: starting {} nodes in {} ({})",
        opts.up.nodes,
        opts.up.dir.display(),
        opts.up.sigma_bin.display()
    );
    let cluster = Cluster::up(opts.up.clone()).await?;
    cluster.manifest().save()?;
    let formed_in = cluster.formed_in;
    eprintln!(
        "sigma-testnet run: swarm formed in {:.1} s; workload for {:.0} s",
        formed_in.as_secs_f64(),
        opts.duration.as_secs_f64()
    );

    let shared = Arc::new(Mutex::new(World {
        nodes: cluster.members.iter().map(|m| Slot { api: m.record.api, state: NodeState::Up }).collect(),
        phases: Vec::new(),
    }));
    let http = api::client()?;
    // The membership's counters at the start of the measured window.
    let scrapes_at_start = scrape_all(&cluster, &http).await;
    let pb = view(opts.duration);
    let fired = Arc::new(AtomicU64::new(0));
    let peaks = Arc::new(Mutex::new(Vec::new()));
    let sampler = tokio::spawn(sample_connections(shared.clone(), http.clone(), peaks.clone()));
    let workload = Workload::start(&wopts, &shared, &http);
    let start = workload.start;
    let hopts = HolderOptions {
        holders: opts.holders,
        locks: opts.resources,
        hold: opts.holder_hold,
        sigma_bin: opts.up.sigma_bin.clone(),
        dir: opts.up.dir.join("holders"),
        seed: opts.chaos.seed,
    };
    let holders = Holders::start(&hopts, &shared).context("starting the command holders")?;
    // The peer id of each node index, for following killed nodes out of the views.
    let peer_ids: Vec<libp2p::PeerId> = cluster.members.iter().filter_map(|m| m.record.peer_id.parse().ok()).collect();
    let observers = Observers::start(opts.observers, &resource_name(0), &shared, &http, start);
    let supervisor = Supervisor::new(cluster, shared.clone(), opts.chaos.clone(), start, pb.clone(), fired.clone())?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let detector = (!opts.chaos.faults.is_empty() && peer_ids.len() == opts.up.nodes)
        .then(|| tokio::spawn(super::membership::detect(shared.clone(), http.clone(), peer_ids, stop_rx.clone())));
    let supervisor = tokio::spawn(supervisor.run(stop_rx));

    // The live view.
    let counters = workload.counters.clone();
    let view_task = {
        let pb = pb.clone();
        let fired = fired.clone();
        tokio::spawn(async move {
            let mut last = (Instant::now(), 0u64);
            let mut rate = 0.0;
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let entries = counters.entries.load(Ordering::Relaxed);
                let now = Instant::now();
                let dt = (now - last.0).as_secs_f64();
                if dt >= 1.0 {
                    rate = (entries - last.1) as f64 / dt;
                    last = (now, entries);
                }
                pb.set_position(start.elapsed().as_secs());
                pb.set_message(format!(
                    "CS {entries} ({rate:.0}/s)  waiting {}  holding {}  errors {}  faults {}",
                    counters.waiting.load(Ordering::Relaxed),
                    counters.holding.load(Ordering::Relaxed),
                    counters.errors.load(Ordering::Relaxed) + counters.timeouts.load(Ordering::Relaxed),
                    fired.load(Ordering::Relaxed),
                ));
            }
        })
    };

    let interrupted = tokio::select! {
        _ = tokio::time::sleep(opts.duration) => false,
        _ = tokio::signal::ctrl_c() => {
            say(&pb, "interrupted: stopping the workload and the testnet");
            true
        }
    };
    // Faults first (a paused node is resumed, its holder lets go), then the clients.
    let _ = stop_tx.send(true);
    let outcome = supervisor.await.context("the chaos supervisor panicked")?;
    let detection = match detector {
        Some(d) => Some(d.await.context("the kill detector panicked")?),
        None => None,
    };
    let (counters, records) = workload.stop(Duration::from_secs(2)).await;
    // A command running now ends after its hold; a `sigma lock` still waiting is dropped
    // (and its command with it) a few seconds later.
    let holder_report = holders.stop(opts.holder_hold + Duration::from_secs(5)).await;
    let terms: Vec<check::Cs> = records.entries.iter().filter(|c| c.resource == 0).copied().collect();
    let observer_report = observers.stop(&terms).await;
    let elapsed = start.elapsed().min(opts.duration.max(Duration::from_millis(1)));
    view_task.abort();
    sampler.abort();
    pb.finish_and_clear();

    // Counters of the live nodes, then down.
    let mut cluster = outcome.cluster;
    let scrapes_at_end = scrape_all(&cluster, &http).await;
    let membership = (!scrapes_at_start.is_empty())
        .then(|| super::membership::figures(&scrapes_at_start, &scrapes_at_end))
        .filter(|f| f.nodes > 0);
    let mut completed = outcome.retired;
    let mut node_regressions = 0;
    for m in &cluster.members {
        if m.record.state != State::Running {
            continue;
        }
        match api::completed(&http, m.record.api, Duration::from_secs(3)).await {
            Ok(c) => completed = completed + c,
            Err(e) => eprintln!("sigma-testnet: node {}: metrics unavailable: {e:#}", m.record.index),
        }
        if let Ok(st) = api::status(&http, m.record.api, Duration::from_secs(3)).await {
            node_regressions += st.token_regressions;
        }
    }
    cluster.down(Duration::from_secs(5)).await;
    cluster.manifest().save()?;

    // With semaphores, each slot is a lock of its own to the lock checker.
    let locks = opts.resources * usize::from(opts.slots.unwrap_or(1));
    let findings = check::check(&records.entries, locks, opts.clients);
    let mut report = build_report(
        opts,
        &cluster,
        formed_in,
        elapsed,
        interrupted,
        &counters,
        records,
        completed,
        node_regressions,
        outcome.events,
        outcome.crashes,
        findings,
    );
    let peaks = std::mem::take(&mut *peaks.lock().expect("not poisoned"));
    report.add_connections(peaks, opts.up.params.max_connections.unwrap_or(DAEMON_MAX_CONNECTIONS));
    report.membership = membership;
    report.detection = detection;
    if opts.holders > 0 {
        report.add_holders(holder_report);
    }
    if opts.observers > 0 {
        report.add_observers(observer_report);
    }
    let summary = render(&report);
    Ok((report, summary))
}

/// Scrapes the membership's counters of every running node at once (a node that does
/// not answer within 3 s is left out).
async fn scrape_all(cluster: &Cluster, http: &reqwest::Client) -> Vec<super::membership::Scrape> {
    let asks = cluster.members.iter().filter(|m| m.record.state == State::Running).map(|m| {
        let r = &m.record;
        super::membership::scrape(http, r.index, r.pid, r.api, Duration::from_secs(3))
    });
    let mut scrapes = Vec::new();
    for s in futures::future::join_all(asks).await {
        match s {
            Ok(s) => scrapes.push(s),
            Err(e) => eprintln!("sigma-testnet: membership counters unavailable: {e:#}"),
        }
    }
    scrapes
}

#[allow(clippy::too_many_arguments)]
fn build_report(
    opts: &RunOptions,
    cluster: &Cluster,
    formed_in: Duration,
    elapsed: Duration,
    interrupted: bool,
    counters: &super::workload::Counters,
    records: super::workload::Records,
    completed: Completed,
    node_token_regressions: u64,
    fault_events: Vec<FaultEvent>,
    crashes: Vec<Crash>,
    mut findings: Findings,
) -> RunReport {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let all = records.entries.clone();
    let mut lat = records.acquire_ms.clone();
    lat.sort_by(f64::total_cmp);
    let acquire_latency = Latency {
        count: lat.len(),
        p50_ms: pct(&lat, 0.5),
        p99_ms: pct(&lat, 0.99),
        max_ms: lat.last().copied().unwrap_or(0.0),
    };
    let slots = usize::from(opts.slots.unwrap_or(1));
    let semaphore = opts.slots.map(|k| check::capacity(&records.entries, opts.resources, k));
    let per_resource = (0..opts.resources)
        .map(|r| {
            let entries = records.entries.iter().filter(|e| e.resource / slots == r).count();
            let clients: Vec<usize> = (0..opts.clients).filter(|k| k % opts.resources == r).collect();
            let served = clients.iter().filter(|k| !findings.never_served.contains(k)).count();
            ResourceFigures {
                name: resource_name(r),
                entries,
                cs_per_s: entries as f64 / secs,
                clients: clients.len(),
                clients_served: served,
            }
        })
        .collect();
    let mut faults_fired = BTreeMap::new();
    for k in &opts.chaos.faults {
        faults_fired.insert(k.name().to_owned(), fault_events.iter().filter(|e| e.kind == *k && e.ok).count());
    }
    let fired_total: usize = faults_fired.values().sum();
    for k in [Fault::Join, Fault::Restart].into_iter().filter(|k| opts.chaos.faults.contains(k)) {
        let inside =
            fault_events.iter().filter(|e| e.kind == k && e.ok && e.detail.starts_with("inside a cut")).count();
        faults_fired.insert(format!("{} inside a cut", k.name()), inside);
    }
    let unavailability = unavailability(&fault_events, &records.entries, opts.resources * slots, secs);
    let failed_faults: Vec<&FaultEvent> = fault_events.iter().filter(|e| !e.ok).collect();
    let entries = records.entries.len();
    let (violations, overlaps_after_expiry, token_regressions) =
        (findings.violations.len(), findings.expired_overlaps.len(), findings.token_regressions.len());
    let never_served = findings.never_served.clone();

    let mut targets = vec![
        Target { name: "critical sections entered".into(), pass: entries > 0, detail: entries.to_string() },
        Target { name: "exclusion violations".into(), pass: violations == 0, detail: violations.to_string() },
        Target {
            name: "fencing tokens increase across successive holders".into(),
            pass: token_regressions == 0,
            detail: format!("{token_regressions} regressions"),
        },
        Target {
            name: "waiters never served".into(),
            pass: never_served.is_empty(),
            detail: if never_served.is_empty() {
                "0".into()
            } else {
                format!("{} (clients {:?})", never_served.len(), never_served)
            },
        },
        Target {
            name: "requests refused for another replica count".into(),
            pass: completed.quorum_mismatch == 0,
            detail: completed.quorum_mismatch.to_string(),
        },
        Target {
            name: "nodes crashed".into(),
            pass: crashes.is_empty(),
            detail: if crashes.is_empty() {
                "0".into()
            } else {
                crashes.iter().map(|c| format!("node {} ({})", c.node, c.status)).collect::<Vec<_>>().join(", ")
            },
        },
    ];
    if let Some(c) = &semaphore {
        targets.insert(
            2,
            Target {
                name: format!("moments with more than {} holders of a semaphore", c.slots),
                pass: c.over.is_empty(),
                detail: format!("{} (most at once: {})", c.over.len(), c.most_at_once),
            },
        );
    }
    if !opts.chaos.faults.is_empty() {
        targets.push(Target { name: "faults fired".into(), pass: fired_total > 0, detail: fired_total.to_string() });
        targets.push(Target {
            name: "faults that failed to take effect".into(),
            pass: failed_faults.is_empty(),
            detail: if failed_faults.is_empty() {
                "0".into()
            } else {
                failed_faults.iter().map(|e| format!("{} node {}", e.kind, e.node)).collect::<Vec<_>>().join(", ")
            },
        });
    }
    let pass = targets.iter().all(|t| t.pass);
    findings.violations.truncate(20);
    findings.expired_overlaps.truncate(20);
    findings.token_regressions.truncate(20);

    RunReport {
        nodes: opts.up.nodes,
        resources: opts.resources,
        clients: opts.clients,
        duration_s: opts.duration.as_secs_f64(),
        elapsed_s: secs,
        hold_ms: opts.hold.as_secs_f64() * 1e3,
        n: opts.up.params.n,
        m: opts.up.params.m,
        lease_ms: opts.up.params.lease_ms,
        seed: opts.chaos.seed,
        chaos: opts.chaos.faults.clone(),
        chaos_interval_s: opts.chaos.mean_interval.as_secs_f64(),
        interrupted,
        formed_in_s: formed_in.as_secs_f64(),
        dir: cluster.opts.dir.display().to_string(),
        entries,
        cs_per_s: entries as f64 / secs,
        per_resource,
        acquire_latency,
        attempts: Attempts {
            timeouts: counters.timeouts.load(Ordering::Relaxed),
            errors: counters.errors.load(Ordering::Relaxed),
            failovers: counters.failovers.load(Ordering::Relaxed),
            releases_lost: counters.releases_lost.load(Ordering::Relaxed),
            releases_failed: counters.releases_failed.load(Ordering::Relaxed),
            paused_holders: counters.paused_holders.load(Ordering::Relaxed),
            sample_errors: records.sample_errors,
        },
        completed: completed.completed,
        completed_messages: completed.messages,
        quorum_mismatch: completed.quorum_mismatch,
        messages_per_entry: if completed.completed > 0 {
            completed.messages as f64 / completed.completed as f64
        } else {
            0.0
        },
        requests: completed.requests,
        requests_per_entry: if completed.completed > 0 {
            completed.requests as f64 / completed.completed as f64
        } else {
            0.0
        },
        faults_fired,
        fault_events,
        unavailability,
        crashes,
        node_token_regressions,
        violations,
        overlaps_after_expiry,
        token_regressions,
        never_served,
        findings,
        connection_peaks: Vec::new(),
        connection_bound: 0,
        membership: None,
        detection: None,
        holders: None,
        observers: None,
        slots: opts.slots,
        semaphore: semaphore.map(|mut c| {
            c.over.truncate(20);
            c
        }),
        targets,
        pass,
        records: all,
    }
}

/// The lock a section's resource index names: a resource, or with `slots` a slot of a
/// semaphore (`testnet-rR/.slot/S`).
fn lock_name(resource: usize, slots: Option<u16>) -> String {
    match slots.map(usize::from) {
        Some(k) => sigma_node::semaphore::slot_lock_name(&resource_name(resource / k), (resource % k) as u16),
        None => resource_name(resource),
    }
}

/// `sigma run`'s default `--max-connections`.
const DAEMON_MAX_CONNECTIONS: u32 = 256;

impl RunReport {
    /// Records the connection peaks and checks them against the bound.
    fn add_holders(&mut self, h: HolderReport) {
        self.targets.push(Target {
            name: "`sigma lock` commands of one lock never ran at once".into(),
            pass: h.overlaps.is_empty() && h.commands > 0,
            detail: format!("{} overlaps in {} commands", h.overlaps.len(), h.commands),
        });
        self.pass = self.targets.iter().all(|t| t.pass);
        self.holders = Some(h);
    }

    fn add_observers(&mut self, o: ObserverReport) {
        self.targets.push(Target {
            name: "election observers saw leaders in token order".into(),
            pass: o.out_of_order == 0 && o.states > 0,
            detail: format!("{} states in {} streams, {} out of order", o.states, o.streams, o.out_of_order),
        });
        self.targets.push(Target {
            name: "election observers saw every leader while they could tell".into(),
            pass: o.missed.is_empty() && o.long_terms > 0,
            detail: format!(
                "{} leaders held ≥ {:.1} s; seen by each observer: {:?}; {} misses while cut off or told unknown, {} \
                 while told otherwise",
                o.long_terms,
                super::observers::SEEN_WITHIN.as_secs_f64(),
                o.seen,
                o.excused,
                o.missed.len()
            ),
        });
        self.pass = self.targets.iter().all(|t| t.pass);
        self.observers = Some(o);
    }

    fn add_connections(&mut self, peaks: Vec<u32>, bound: u32) {
        let max = peaks.iter().copied().max().unwrap_or(0);
        let over: Vec<usize> = peaks.iter().enumerate().filter(|(_, c)| **c > bound).map(|(i, _)| i).collect();
        self.targets.push(Target {
            name: "every node at or under its connection bound".into(),
            pass: over.is_empty() && !peaks.is_empty(),
            detail: if peaks.is_empty() {
                "never sampled".into()
            } else if over.is_empty() {
                format!("largest {max} ≤ {bound}")
            } else {
                format!("nodes {over:?} over {bound} (largest {max})")
            },
        });
        self.pass = self.targets.iter().all(|t| t.pass);
        self.connection_peaks = peaks;
        self.connection_bound = bound;
    }
}

/// Samples every running node's connection count every 2 s, keeping each node's peak.
async fn sample_connections(shared: Arc<Mutex<World>>, http: reqwest::Client, peaks: Arc<Mutex<Vec<u32>>>) {
    loop {
        let apis: Vec<(usize, std::net::SocketAddr)> = {
            let w = shared.lock().expect("not poisoned");
            w.nodes.iter().enumerate().filter(|(_, s)| s.state == NodeState::Up).map(|(i, s)| (i, s.api)).collect()
        };
        let polls = apis.into_iter().map(|(i, a)| {
            let http = http.clone();
            async move { (i, api::status(&http, a, Duration::from_secs(2)).await) }
        });
        for (i, st) in futures::future::join_all(polls).await {
            let Ok(st) = st else { continue };
            let mut p = peaks.lock().expect("not poisoned");
            if p.len() <= i {
                p.resize(i + 1, 0);
            }
            p[i] = p[i].max(st.connections);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// How long the locks were unavailable around one fault.
#[derive(Clone, Debug, Serialize)]
pub struct Unavailability {
    /// When the fault fired (seconds since the workload started).
    pub at_s: f64,
    /// Which fault.
    pub kind: Fault,
    /// The longest interval within [fault, next fault or end of run] in which one lock
    /// saw no critical section entered.
    pub longest_gap_s: f64,
}

fn unavailability(events: &[FaultEvent], entries: &[check::Cs], resources: usize, end_s: f64) -> Vec<Unavailability> {
    let fired: Vec<&FaultEvent> = events.iter().filter(|e| e.ok).collect();
    let mut out = Vec::new();
    for (k, e) in fired.iter().enumerate() {
        let to = fired.get(k + 1).map_or(end_s, |n| n.at_s).max(e.at_s);
        let mut worst: f64 = 0.0;
        for r in 0..resources {
            let mut times: Vec<f64> = entries
                .iter()
                .filter(|c| c.resource == r)
                .map(|c| c.enter.as_secs_f64())
                .filter(|t| *t >= e.at_s && *t <= to)
                .collect();
            times.sort_by(f64::total_cmp);
            let mut last = e.at_s;
            for t in times.iter().copied().chain(std::iter::once(to)) {
                worst = worst.max(t - last);
                last = t;
            }
        }
        out.push(Unavailability { at_s: e.at_s, kind: e.kind, longest_gap_s: worst });
    }
    out
}

fn opt<T: std::fmt::Display>(v: Option<T>, default: &str) -> String {
    v.map_or_else(|| default.to_owned(), |v| v.to_string())
}

/// The summary table.
pub fn render(r: &RunReport) -> String {
    let mut s = String::new();
    let chaos = if r.chaos.is_empty() {
        "none".to_owned()
    } else {
        format!(
            "{} (mean interval {:.1} s)",
            r.chaos.iter().map(|f| f.name()).collect::<Vec<_>>().join(","),
            r.chaos_interval_s
        )
    };
    let _ = writeln!(
        s,
        "sigma-testnet run: {} nodes, {} resources, {} clients, {:.1} s, hold {:.0} ms; n={} m={} lease {} ms; chaos: {chaos}; seed {}",
        r.nodes,
        r.resources,
        r.clients,
        r.elapsed_s,
        r.hold_ms,
        opt(r.n, "32"),
        opt(r.m, "24"),
        opt(r.lease_ms, "10000"),
        r.seed
    );
    if r.interrupted {
        let _ = writeln!(s, "  INTERRUPTED after {:.1} s of {:.0} s", r.elapsed_s, r.duration_s);
    }
    let _ = writeln!(s, "  swarm formed in {:.1} s; logs and manifest in {}", r.formed_in_s, r.dir);
    let _ = writeln!(s);
    let _ = writeln!(s, "{:<16} {:>10} {:>10} {:>16}", "resource", "CS entries", "CS/s", "clients served");
    for p in &r.per_resource {
        let _ = writeln!(
            s,
            "{:<16} {:>10} {:>10.1} {:>16}",
            p.name,
            p.entries,
            p.cs_per_s,
            format!("{}/{}", p.clients_served, p.clients)
        );
    }
    let served: usize = r.per_resource.iter().map(|p| p.clients_served).sum();
    let _ =
        writeln!(s, "{:<16} {:>10} {:>10.1} {:>16}", "total", r.entries, r.cs_per_s, format!("{served}/{}", r.clients));
    let _ = writeln!(s);
    let l = &r.acquire_latency;
    let _ = writeln!(
        s,
        "acquire latency:         p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} acquires)",
        l.p50_ms, l.p99_ms, l.max_ms, l.count
    );
    let a = &r.attempts;
    let _ = writeln!(
        s,
        "acquire outcomes:        {} not won in time (423), {} errors, {} through another node (failover)",
        a.timeouts, a.errors, a.failovers
    );
    let _ = writeln!(
        s,
        "releases:                {} refused (lock lost while held), {} failed (node gone)",
        a.releases_lost, a.releases_failed
    );
    let four_n = r.n.unwrap_or(32) * 4;
    let _ = writeln!(
        s,
        "protocol messages / CS:  {:.1} (Σ sigma_completed_messages_total {} / Σ sigma_completed_total {}; 4n = {four_n})",
        r.messages_per_entry, r.completed_messages, r.completed
    );
    let _ = writeln!(
        s,
        "transport requests / CS: {:.1} (Σ sigma_requests_out_total {}: a batch of messages to one peer counts one)",
        r.requests_per_entry, r.requests
    );
    let faults = if r.faults_fired.is_empty() {
        "none (no --chaos)".to_owned()
    } else {
        r.faults_fired.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
    };
    let _ = writeln!(s, "faults fired:            {faults}");
    if !r.connection_peaks.is_empty() {
        let mut sorted = r.connection_peaks.clone();
        sorted.sort_unstable();
        let _ = writeln!(
            s,
            "connections per node:    peak median {}, max {} (bound {}; sampled every 2 s)",
            sorted[sorted.len() / 2],
            sorted[sorted.len() - 1],
            r.connection_bound
        );
    }
    if let Some(m) = &r.membership {
        let _ = writeln!(
            s,
            "membership per node:     gossip sent {:.0} B/s (p99 {:.0}), received {:.0} B/s, {:.1} tables/s; {:.1} \
             pings/s (≈ {:.0} B/s each way); connections opened {:.1} a minute (most {:.0}); over the workload ({:.1} s, \
             {} of {} nodes: one process throughout)",
            m.bytes_out_per_s,
            m.bytes_out_per_s_p99,
            m.bytes_in_per_s,
            m.tables_out_per_s,
            m.pings_per_s,
            m.pings_per_s * 64.0,
            m.opened_per_min,
            m.opened_per_min_max,
            m.window_s,
            m.nodes,
            m.scraped
        );
    }
    if !r.unavailability.is_empty() {
        let _ = writeln!(
            s,
            "unavailability per fault (longest time one lock saw no critical section, until the next fault):"
        );
        for u in &r.unavailability {
            let _ = writeln!(s, "    [{:6.1}s] {:<10} {:6.1} s", u.at_s, u.kind.name(), u.longest_gap_s);
        }
    }
    if let Some(c) = &r.semaphore {
        let _ = writeln!(
            s,
            "semaphores:              {} slots each; {} stretches with more holders, most at once {}",
            c.slots,
            c.over.len(),
            c.most_at_once
        );
        for o in c.over.iter().take(5) {
            let _ = writeln!(
                s,
                "    {}: {} holders in [{:.1}, {:.1}] ms",
                resource_name(o.semaphore),
                o.holders,
                o.from.as_secs_f64() * 1e3,
                o.to.as_secs_f64() * 1e3
            );
        }
    }
    let _ = writeln!(s, "exclusion violations:    {}", r.violations);
    for v in r.findings.violations.iter().take(5) {
        let _ = writeln!(
            s,
            "    {}: client {} (node {}, token {}) in [{:.1}, {:.1}] ms (lease to {:.1}), client {} (node {}, token {}) entered at {:.1} ms",
            lock_name(v.earlier.resource, r.slots),
            v.earlier.client,
            v.earlier.node,
            v.earlier.token,
            v.earlier.enter.as_secs_f64() * 1e3,
            v.earlier.exit.as_secs_f64() * 1e3,
            v.earlier.valid_until.as_secs_f64() * 1e3,
            v.later.client,
            v.later.node,
            v.later.token,
            v.later.enter.as_secs_f64() * 1e3
        );
    }
    let _ = writeln!(s, "overlaps after lease expiry (what fencing tokens are for): {}", r.overlaps_after_expiry);
    if r.overlaps_after_expiry > 0 || a.paused_holders > 0 {
        let _ = writeln!(
            s,
            "    pairs of overlapping critical sections, the later token larger in each; \
             critical sections past their lease: {}; holders kept holding through a pause: {}",
            r.findings.held_past_lease, a.paused_holders
        );
    }
    let _ = writeln!(s, "fencing token regressions: {}", r.token_regressions);
    for g in r.findings.token_regressions.iter().take(5) {
        let _ = writeln!(
            s,
            "    {}: client {} token {} at {:.1} ms, then client {} token {} at {:.1} ms",
            lock_name(g.previous.resource, r.slots),
            g.previous.client,
            g.previous.token,
            g.previous.enter.as_secs_f64() * 1e3,
            g.next.client,
            g.next.token,
            g.next.enter.as_secs_f64() * 1e3
        );
    }
    let _ = writeln!(s, "waiters never served:    {}", r.never_served.len());
    if let Some(h) = &r.holders {
        let _ = writeln!(
            s,
            "sigma lock commands:     {} ran ({} stopped as lost), {} runs not acquired; {} overlaps between commands",
            h.commands,
            h.lost,
            h.not_acquired,
            h.overlaps.len()
        );
        for o in h.overlaps.iter().take(10) {
            let _ = writeln!(
                s,
                "    lock {}: token {} (holder {}) and token {} (holder {}) ran together {:.1} ms",
                super::holders::lock_name(o.lock),
                o.first.0,
                o.first.1,
                o.second.0,
                o.second.1,
                o.ms
            );
        }
    }
    if let Some(o) = &r.observers {
        let _ = writeln!(
            s,
            "election observers:      {} observers, {} states in {} streams; {} leaders held ≥ {:.1} s, seen by each: \
             {:?}; misses: {} while cut off or told unknown, {} while told otherwise; {} out of token order",
            o.observers,
            o.states,
            o.streams,
            o.long_terms,
            super::observers::SEEN_WITHIN.as_secs_f64(),
            o.seen,
            o.excused,
            o.missed.len(),
            o.out_of_order
        );
        for m in o.missed.iter().take(10) {
            let _ = writeln!(
                s,
                "    observer {} missed token {} (leader from {:.0} ms to {:.0} ms); told: {}",
                m.observer,
                m.token,
                m.enter_ms,
                m.exit_ms,
                m.told.join(", ")
            );
        }
    }
    if r.node_token_regressions > 0 {
        let _ = writeln!(s, "token regressions reported by the nodes (status): {}", r.node_token_regressions);
    }
    for c in &r.crashes {
        let _ = writeln!(s, "node {} crashed at {:.1} s ({}); last lines of its log:", c.node, c.at_s, c.status);
        for l in c.log_tail.lines() {
            let _ = writeln!(s, "    | {l}");
        }
    }
    for e in r.fault_events.iter().filter(|e| !e.ok) {
        let _ = writeln!(s, "fault {} on node {} at {:.1} s failed: {}", e.kind, e.node, e.at_s, e.detail);
    }
    if !a.sample_errors.is_empty() && (r.entries == 0 || r.chaos.is_empty()) {
        let _ = writeln!(s, "first acquire errors:");
        for e in &a.sample_errors {
            let _ = writeln!(s, "    {e}");
        }
    }
    if let Some(d) = &r.detection {
        let _ = writeln!(
            s,
            "killed nodes out of the views: per view p50 {:.1} s, p99 {:.1} s, max {:.1} s ({} views); out of every \
             view p50 {:.1} s, p99 {:.1} s, max {:.1} s ({} nodes down); {} views held one past {} s or to the end, {} \
             not followed (back first); views read every {} ms, kills seen within {} ms",
            d.per_view.p50,
            d.per_view.p99,
            d.per_view.max,
            d.per_view.n,
            d.everywhere.p50,
            d.everywhere.p99,
            d.everywhere.max,
            d.everywhere.n,
            d.never,
            super::membership::GIVE_UP.as_secs(),
            d.not_followed,
            super::membership::POLL.as_millis(),
            super::membership::WATCH.as_millis()
        );
    }
    if let Some(m) = &r.membership {
        let _ =
            writeln!(s, "membership against the goals of issue 37 (as `sim membership` prints them; not PASS/FAIL):");
        for g in super::membership::goals(m, r.nodes, !r.chaos.is_empty()) {
            let _ = writeln!(s, "    {}", g.line());
        }
        if let Some(d) = &r.detection {
            let e = &d.everywhere;
            let g = crate::swarm::membership::Goal {
                what: "killed node out of every view".into(),
                figure: if e.n == 0 {
                    "no node down".into()
                } else {
                    format!("p50 {:.1} s, p99 {:.1} s ({} nodes, {} views never)", e.p50, e.p99, e.n, d.never)
                },
                goal: "p50 ≤ 2 s, p99 ≤ 5 s",
                met: e.n > 0 && e.p50 <= 2.0 && e.p99 <= 5.0 && d.never == 0,
            };
            let _ = writeln!(s, "    {}", g.line());
        }
    }
    let _ = writeln!(s);
    for t in &r.targets {
        let _ = writeln!(s, "[{}] {}: {}", if t.pass { "PASS" } else { "FAIL" }, t.name, t.detail);
    }
    let _ = writeln!(s, "{}", if r.pass { "PASS" } else { "FAIL" });
    s
}
