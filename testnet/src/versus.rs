//! `sigma-testnet bench --vs etcd`: sigma daemons (`sigma run`, HTTP API) against a
//! 3-member etcd (v3 JSON gateway), both on 127.0.0.1, measured in one run through the
//! same HTTP client (one `reqwest` client, keep-alive connections):
//! - uncontended lock+unlock: `rounds` rounds of one lock by one client, round k through
//!   endpoint k mod N (a sigma daemon's API, an etcd member's client URL), p50 and p99;
//! - contended handoffs per second: `workers` clients (worker w through endpoint w mod N)
//!   locking and unlocking one lock with nothing in between, for `contended`.
//!
//! Both systems are checked, not only timed: every worker records its hold intervals
//! (from the lock's answer to the unlock's request, inside the real hold) and the bench
//! counts the intervals that overlap another worker's ([`count_overlaps`], must be 0)
//! and the fencing tokens that do not grow from one hold to the next
//! ([`count_regressions`]; sigma: the acquire's token, etcd: the revision of the lock's
//! answer, at least the lock key's create revision and above the previous holder's
//! delete); at the end the lock must be free (sigma: no daemon holds or waits for it and its
//! replicas name no holder; etcd: no key left under its prefix).
//!
//! Without etcd (not on `PATH`, or `--etcd-bin` missing) the summary says how to get it
//! and sigma runs alone. The latency goals are printed, not asserted: uncontended
//! p50 ≤ 0.5× etcd's, contended handoffs ≥ 3× etcd's.
//!
//! Beside the times, the CPU time the system's server processes used (user + system,
//! every thread of every member or daemon, from `/proc/PID/stat` before and after each
//! phase) per uncontended round and per contended entry: on a loaded 2-core machine a
//! latency ratio moves with the load, the CPU cost much less. The driver's own CPU is
//! not counted (the same client code drives both).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde::Serialize;

use crate::etcd::{self, EtcdCluster};
use crate::testnet::api::{self, Acquire, Release};
use crate::testnet::cluster::{Cluster, UpOptions};
use crate::testnet::proc::{self, Params};

/// Parameters of a run.
#[derive(Clone, Debug)]
pub struct VersusOptions {
    /// Swarm sizes to measure sigma at (one row each).
    pub daemons: Vec<usize>,
    /// Uncontended lock+unlock rounds.
    pub rounds: usize,
    /// Contending workers on one lock.
    pub workers: usize,
    /// Length of the contended phase.
    pub contended: Duration,
    /// The `sigma` binary.
    pub sigma_bin: PathBuf,
    /// The etcd binary, or why there is none (and how to get it).
    pub etcd_bin: Result<PathBuf, String>,
    /// Lease of a vote for the daemons (None: the daemon's default).
    pub lease_ms: Option<u64>,
    /// Where the daemons' and members' files go (removed at the end).
    pub dir: PathBuf,
}

/// One hold of the lock by one worker, in time since the phase began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold {
    /// The worker.
    pub worker: usize,
    /// The lock's answer arrived.
    pub enter: Duration,
    /// The unlock is about to be sent.
    pub exit: Duration,
    /// Its fencing token.
    pub token: u64,
}

/// Holds that began before another worker's hold ended: 0 under mutual exclusion.
/// Each recorded hold lies inside the real one (granted before its answer, released
/// after its unlock was sent), so a counted overlap is a real one.
pub fn count_overlaps(holds: &[Hold]) -> u64 {
    let mut sorted = holds.to_vec();
    sorted.sort_by_key(|h| (h.enter, h.exit));
    let mut overlaps = 0;
    // The hold reaching furthest so far.
    let mut reach: Option<Hold> = None;
    for h in sorted {
        match reach {
            Some(r) if h.enter < r.exit && r.worker != h.worker => overlaps += 1,
            _ => {}
        }
        if reach.is_none_or(|r| h.exit > r.exit) {
            reach = Some(h);
        }
    }
    overlaps
}

/// Holds whose token is not above the token of the hold entered before them: 0 when
/// the tokens fence (a later holder always carries a larger token).
pub fn count_regressions(holds: &[Hold]) -> u64 {
    let mut sorted = holds.to_vec();
    sorted.sort_by_key(|h| (h.enter, h.exit));
    sorted.windows(2).filter(|w| w[1].token <= w[0].token).count() as u64
}

/// One system under test: where its clients connect.
#[derive(Clone, Debug)]
enum System {
    /// Daemons' HTTP APIs.
    Sigma(Vec<SocketAddr>),
    /// Members' client URLs.
    Etcd(Vec<SocketAddr>),
}

/// A client of one system through one endpoint (for etcd, with its session lease).
struct Session {
    http: reqwest::Client,
    endpoint: SocketAddr,
    /// etcd: the session lease; sigma: none (the daemon keeps the client's lease).
    lease: Option<i64>,
}

/// A held lock, to unlock.
enum Held {
    /// Token and lease id.
    Sigma(u64, String),
    Etcd(etcd::Held),
}

impl Held {
    fn token(&self) -> u64 {
        match self {
            Held::Sigma(t, _) => *t,
            Held::Etcd(h) => u64::try_from(h.revision).unwrap_or(0),
        }
    }
}

impl System {
    fn endpoints(&self) -> &[SocketAddr] {
        match self {
            System::Sigma(e) | System::Etcd(e) => e,
        }
    }

    async fn session(&self, http: &reqwest::Client, k: usize) -> Result<Session> {
        let endpoint = self.endpoints()[k % self.endpoints().len()];
        let lease = match self {
            System::Sigma(_) => None,
            System::Etcd(_) => Some(etcd::grant(http, endpoint).await?),
        };
        Ok(Session { http: http.clone(), endpoint, lease })
    }

    async fn lock(&self, s: &Session, name: &str) -> Result<Held> {
        match (self, s.lease) {
            (System::Sigma(_), _) => match api::acquire(&s.http, s.endpoint, name, 60_000).await {
                Acquire::Granted(a) => Ok(Held::Sigma(a.token, a.lease)),
                Acquire::TimedOut => bail!("sigma: acquire of {name} via {} timed out (60 s)", s.endpoint),
                Acquire::Failed(e) => bail!("sigma: acquire of {name} via {}: {e}", s.endpoint),
            },
            (System::Etcd(_), Some(lease)) => Ok(Held::Etcd(etcd::lock(&s.http, s.endpoint, name, lease).await?)),
            (System::Etcd(_), None) => bail!("an etcd session without a lease"),
        }
    }

    async fn unlock(&self, s: &Session, name: &str, held: Held) -> Result<()> {
        match held {
            Held::Sigma(token, lease) => match api::release(&s.http, s.endpoint, name, token, &lease).await {
                Release::Released => Ok(()),
                other => bail!("sigma: release of {name} (token {token}) via {}: {other:?}", s.endpoint),
            },
            Held::Etcd(h) => etcd::unlock(&s.http, s.endpoint, &h).await,
        }
    }

    async fn close(&self, s: Session) -> Result<()> {
        match s.lease {
            Some(lease) => etcd::revoke(&s.http, s.endpoint, lease).await,
            None => Ok(()),
        }
    }

    /// Why the lock `name` is not free at the end, if it is not.
    async fn leftover(&self, http: &reqwest::Client, name: &str) -> Result<Option<String>> {
        match self {
            System::Etcd(e) => {
                let keys = etcd::keys_under(http, e[0], name).await?;
                Ok((!keys.is_empty()).then(|| format!("keys left under {name}/: {}", keys.join(", "))))
            }
            System::Sigma(apis) => {
                for &a in apis {
                    let view = sigma_daemon::client::Client::with_http(a, http.clone()).lock(name).await?;
                    if !view.held.is_empty() || view.held_by_this_node || view.waiting_on_this_node {
                        return Ok(Some(format!("daemon {a} still holds or waits for {name}")));
                    }
                }
                // The replicas drop the holder when the RELEASEs arrive, just after the
                // release answered: wait for it, within a bound.
                let inspector = sigma_daemon::client::Client::with_http(apis[0], http.clone());
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    let i = inspector.inspect(name).await?;
                    match i.holder {
                        None if i.waiters.is_empty() => return Ok(None),
                        _ if Instant::now() > deadline => {
                            return Ok(Some(format!(
                                "its replicas still name a holder ({:?}) or waiters ({}) 10 s after the last release",
                                i.holder.map(|h| h.token),
                                i.waiters.len()
                            )))
                        }
                        _ => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
            }
        }
    }
}

/// The figures of one system.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// "etcd, 3 members", "sigma, 8 daemons".
    pub label: String,
    /// Uncontended lock+unlock p50 (ms).
    pub lock_unlock_p50_ms: f64,
    /// Uncontended lock+unlock p99 (ms).
    pub lock_unlock_p99_ms: f64,
    /// Uncontended lock alone, p50 (ms).
    pub lock_p50_ms: f64,
    /// Contended handoffs (CS entries) per second.
    pub handoffs_per_s: f64,
    /// Contended entries.
    pub entries: u64,
    /// CPU time of all the system's server processes per uncontended lock+unlock (ms).
    pub cpu_ms_per_round: f64,
    /// CPU time of all the system's server processes per contended handoff (ms).
    pub cpu_ms_per_handoff: f64,
    /// Hold intervals overlapping another worker's (must be 0).
    pub overlaps: u64,
    /// Holds whose fencing token is not above the previous hold's (must be 0).
    pub token_regressions: u64,
    /// Why the lock was not free at the end (None: it was).
    pub leftover: Option<String>,
}

/// Figures of a run.
#[derive(Clone, Debug, Serialize)]
pub struct VersusReport {
    /// etcd's row, if etcd ran.
    pub etcd: Option<Row>,
    /// One row per sigma swarm size.
    pub sigma: Vec<Row>,
    /// Why etcd did not run.
    pub etcd_missing: Option<String>,
}

impl VersusReport {
    /// No overlap and every lock free at the end.
    pub fn pass(&self) -> bool {
        self.etcd.iter().chain(&self.sigma).all(|r| r.overlaps == 0 && r.token_regressions == 0 && r.leftover.is_none())
    }
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

/// Both phases against one system whose server processes are `pids` (their CPU time is
/// read before and after each phase).
async fn measure(
    system: &System,
    pids: &[u32],
    label: String,
    opts: &VersusOptions,
    http: &reqwest::Client,
) -> Result<Row> {
    let tag = if matches!(system, System::Etcd(_)) { "etcd" } else { "sigma" };
    // Uncontended: one lock, one client, round k through endpoint k mod N; a first
    // round per endpoint warms the connections and is not counted.
    let name = format!("bench-{tag}-uncontended");
    let n = system.endpoints().len();
    let mut sessions = Vec::new();
    for k in 0..n {
        sessions.push(system.session(http, k).await?);
    }
    for s in &sessions {
        let held = system.lock(s, &name).await?;
        system.unlock(s, &name, held).await?;
    }
    let (mut both, mut lock) = (Vec::new(), Vec::new());
    let cpu0 = proc::total_cpu_time(pids);
    for k in 0..opts.rounds {
        let s = &sessions[k % n];
        let t0 = Instant::now();
        let held = system.lock(s, &name).await?;
        lock.push(t0.elapsed().as_secs_f64() * 1e3);
        system.unlock(s, &name, held).await?;
        both.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let cpu_round = proc::total_cpu_time(pids).saturating_sub(cpu0);
    let mut leftover = system.leftover(http, &name).await?;
    for s in sessions {
        system.close(s).await?;
    }

    // Contended: every worker its own session; each records its holds.
    let name = format!("bench-{tag}-contended");
    let mut sessions = Vec::new();
    for w in 0..opts.workers {
        sessions.push(system.session(http, w).await?);
    }
    let cpu0 = proc::total_cpu_time(pids);
    let t0 = Instant::now();
    let stop = t0 + opts.contended;
    let mut tasks = Vec::new();
    for (w, s) in sessions.into_iter().enumerate() {
        let (system, name) = (system.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            let mut holds = Vec::new();
            while Instant::now() < stop {
                let held = system.lock(&s, &name).await?;
                let enter = t0.elapsed();
                let exit = t0.elapsed();
                holds.push(Hold { worker: w, enter, exit, token: held.token() });
                system.unlock(&s, &name, held).await?;
            }
            anyhow::Ok((s, holds))
        }));
    }
    let mut holds = Vec::new();
    let mut sessions = Vec::new();
    let mut failure = None;
    for t in tasks {
        match t.await.context("a worker panicked")? {
            Ok((s, h)) => {
                sessions.push(s);
                holds.extend(h);
            }
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu_contended = proc::total_cpu_time(pids).saturating_sub(cpu0);
    if let Some(e) = failure {
        return Err(e.context(format!("{label}: a contending worker failed")));
    }
    // The state before the sessions end: revoking an etcd lease would delete a key left over.
    let contended_leftover = system.leftover(http, &name).await?;
    for s in sessions {
        system.close(s).await?;
    }
    leftover = match (leftover, contended_leftover) {
        (None, None) => None,
        (a, b) => Some(a.into_iter().chain(b).collect::<Vec<_>>().join("; ")),
    };
    Ok(Row {
        label,
        lock_unlock_p50_ms: pct(&mut both.clone(), 0.5),
        lock_unlock_p99_ms: pct(&mut both, 0.99),
        lock_p50_ms: pct(&mut lock, 0.5),
        handoffs_per_s: holds.len() as f64 / elapsed,
        entries: holds.len() as u64,
        cpu_ms_per_round: cpu_round.as_secs_f64() * 1e3 / opts.rounds as f64,
        cpu_ms_per_handoff: cpu_contended.as_secs_f64() * 1e3 / holds.len().max(1) as f64,
        overlaps: count_overlaps(&holds),
        token_regressions: count_regressions(&holds),
        leftover,
    })
}

/// Runs etcd (if there is one) and then each sigma swarm; returns the figures and the
/// printable summary. The clusters are stopped and their files removed when this
/// returns, fails or is dropped (Ctrl-C).
pub async fn run(opts: &VersusOptions) -> Result<(VersusReport, String)> {
    if opts.daemons.is_empty() || opts.daemons.contains(&0) {
        bail!("--daemons needs one or more swarm sizes of at least 1 (e.g. 3,8)");
    }
    if opts.workers == 0 || opts.rounds == 0 {
        bail!("--waiters and --rounds must be at least 1");
    }
    let http = api::client()?;
    let _dir = RemoveOnDrop(opts.dir.clone());
    let mut head = String::new();
    let etcd = match &opts.etcd_bin {
        Ok(bin) => {
            let cluster = EtcdCluster::start(bin, &opts.dir.join("etcd"), &http).await?;
            writeln!(
                head,
                "  etcd: {} ({}), {} members on 127.0.0.1, v3 JSON gateway: one lease per client, \
                 /v3/lock/lock, /v3/lock/unlock",
                bin.display(),
                etcd::version(bin),
                etcd::MEMBERS
            )?;
            let system = System::Etcd(cluster.endpoints());
            let row =
                measure(&system, &cluster.pids(), format!("etcd, {} members", etcd::MEMBERS), opts, &http).await?;
            drop(cluster);
            Some(row)
        }
        Err(why) => {
            writeln!(head, "  etcd: not run: {why}; sigma runs alone")?;
            None
        }
    };
    writeln!(
        head,
        "  sigma: {}, `sigma run` daemons on 127.0.0.1 (the daemon's n and m), HTTP API: acquire, release",
        opts.sigma_bin.display()
    )?;
    let mut sigma = Vec::new();
    for &nodes in &opts.daemons {
        let up = UpOptions {
            nodes,
            base_port: None,
            dir: opts.dir.join(format!("sigma-{nodes}")),
            params: Params {
                n: None,
                m: None,
                lease_ms: opts.lease_ms,
                max_connections: Some(64),
                swarm_size: nodes,
                message_delay: None,
                clock_drift_ppm: None,
                clock_steps: false,
                mutant: None,
            },
            sigma_bin: opts.sigma_bin.clone(),
            form_timeout: Duration::from_secs(60.max(2 * nodes as u64)),
        };
        let mut cluster = Cluster::up(up).await?;
        let apis = cluster.members.iter().map(|m| m.record.api).collect();
        let pids: Vec<u32> = cluster.members.iter().map(|m| m.record.pid).collect();
        let row = measure(&System::Sigma(apis), &pids, format!("sigma, {nodes} daemons"), opts, &http).await;
        cluster.down(Duration::from_secs(5)).await;
        sigma.push(row?);
    }
    let report = VersusReport { etcd_missing: opts.etcd_bin.as_ref().err().cloned(), etcd, sigma };
    let summary = render(opts, &report, &head)?;
    Ok((report, summary))
}

/// Removes a directory when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn render(opts: &VersusOptions, r: &VersusReport, head: &str) -> Result<String> {
    let mut s = String::new();
    writeln!(
        s,
        "sigma-testnet bench --vs etcd: one HTTP client (keep-alive) on 127.0.0.1; {} uncontended lock+unlock \
         rounds of one lock (round k through endpoint k mod N); {} workers on one lock for {:.1} s",
        opts.rounds,
        opts.workers,
        opts.contended.as_secs_f64()
    )?;
    s.push_str(head);
    writeln!(s)?;
    let w = r.etcd.iter().chain(&r.sigma).map(|row| row.label.len() + " / etcd".len()).max().unwrap_or(0);
    writeln!(
        s,
        "| {:<w$} | {:>19} | {:>9} | {:>9} | {:>12} | {:>7} | {:>15} | {:>13} | {:>8} | lock free at the end |",
        "", "lock+unlock p50", "p99", "lock p50", "handoffs/s", "entries", "CPU per round", "CPU per entry", "overlaps"
    )?;
    writeln!(s, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")?;
    for row in r.etcd.iter().chain(&r.sigma) {
        writeln!(
            s,
            "| {:<w$} | {:>16.2} ms | {:>6.2} ms | {:>6.2} ms | {:>12.1} | {:>7} | {:>12.2} ms | {:>10.2} ms | {:>8} | {} |",
            row.label,
            row.lock_unlock_p50_ms,
            row.lock_unlock_p99_ms,
            row.lock_p50_ms,
            row.handoffs_per_s,
            row.entries,
            row.cpu_ms_per_round,
            row.cpu_ms_per_handoff,
            row.overlaps,
            row.leftover.as_deref().unwrap_or("yes"),
        )?;
    }
    let faster =
        |x: f64| if x <= 1.0 { format!("{:.2}x ({:.2}x faster)", x, 1.0 / x) } else { format!("{x:.2}x (slower)") };
    if let Some(e) = &r.etcd {
        for row in &r.sigma {
            let u = row.lock_unlock_p50_ms / e.lock_unlock_p50_ms;
            let h = row.handoffs_per_s / e.handoffs_per_s;
            writeln!(
                s,
                "| {:<w$} | {:>19} | {:>9} | {:>9} | {:>12} | {:>7} | {:>15} | {:>13} | {:>8} | |",
                format!("{} / etcd", row.label),
                faster(u),
                "",
                "",
                format!("{h:.2}x"),
                "",
                format!("{:.2}x", row.cpu_ms_per_round / e.cpu_ms_per_round),
                format!("{:.2}x", row.cpu_ms_per_handoff / e.cpu_ms_per_handoff),
                ""
            )?;
        }
        writeln!(s)?;
        let goal = |ok: bool| if ok { "met" } else { "missed" };
        for row in &r.sigma {
            let u = row.lock_unlock_p50_ms / e.lock_unlock_p50_ms;
            writeln!(
                s,
                "[goal {}] {}: uncontended lock+unlock p50 <= 0.5x etcd's: {u:.2}x",
                goal(u <= 0.5),
                row.label
            )?;
        }
        for row in &r.sigma {
            let h = row.handoffs_per_s / e.handoffs_per_s;
            writeln!(s, "[goal {}] {}: contended handoffs >= 3x etcd's: {h:.2}x", goal(h >= 3.0), row.label)?;
        }
    } else {
        writeln!(s)?;
        writeln!(s, "no ratios: etcd did not run ({})", r.etcd_missing.as_deref().unwrap_or("?"))?;
    }
    let check = |ok: bool| if ok { "PASS" } else { "FAIL" };
    let rows: Vec<&Row> = r.etcd.iter().chain(&r.sigma).collect();
    let overlaps: u64 = rows.iter().map(|r| r.overlaps).sum();
    writeln!(s, "[{}] no overlapping holds (every system): {overlaps}", check(overlaps == 0))?;
    let regressions: u64 = rows.iter().map(|r| r.token_regressions).sum();
    writeln!(s, "[{}] fencing tokens grow from hold to hold: {regressions} regressions", check(regressions == 0))?;
    let left: Vec<String> =
        rows.iter().filter_map(|r| r.leftover.as_ref().map(|l| format!("{}: {l}", r.label))).collect();
    writeln!(
        s,
        "[{}] every lock free at the end{}",
        check(left.is_empty()),
        if left.is_empty() { String::new() } else { format!(": {}", left.join("; ")) }
    )?;
    Ok(s)
}

/// A directory for one run's files under the system's temporary directory.
pub fn run_dir() -> PathBuf {
    std::env::temp_dir().join(format!("sigma-bench-vs-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(worker: usize, enter_ms: u64, exit_ms: u64) -> Hold {
        Hold { worker, enter: Duration::from_millis(enter_ms), exit: Duration::from_millis(exit_ms), token: enter_ms }
    }

    #[test]
    fn disjoint_holds_do_not_overlap() {
        let holds = [hold(0, 0, 10), hold(1, 10, 20), hold(0, 25, 30), hold(2, 31, 31), hold(1, 31, 40)];
        assert_eq!(count_overlaps(&holds), 0);
        assert_eq!(count_overlaps(&[]), 0);
    }

    #[test]
    fn overlapping_holds_are_counted() {
        // Worker 1 enters while worker 0 holds; worker 2 enters inside worker 0's long
        // hold after worker 1 left: two overlaps, in any order of the records.
        let holds = [hold(2, 30, 35), hold(0, 0, 50), hold(1, 10, 20), hold(1, 60, 70)];
        assert_eq!(count_overlaps(&holds), 2);
        // A hold that starts exactly when the other ends does not overlap it.
        assert_eq!(count_overlaps(&[hold(0, 0, 10), hold(1, 10, 20)]), 0);
        assert_eq!(count_overlaps(&[hold(0, 0, 10), hold(1, 9, 20)]), 1);
    }

    #[test]
    fn tokens_that_do_not_grow_are_counted() {
        let mut holds = vec![hold(0, 0, 1), hold(1, 2, 3), hold(2, 4, 5)];
        assert_eq!(count_regressions(&holds), 0);
        holds[2].token = 2; // the same token as the hold before it
        holds.push(Hold { token: 1, ..hold(0, 6, 7) });
        assert_eq!(count_regressions(&holds), 2);
    }
}
