//! Faults at seeded random moments, and the supervisor that owns the nodes during a
//! `run`: it notices nodes that die on their own (a crash, reported with its log) and,
//! with `--chaos`, fires faults at exponentially distributed intervals:
//!
//! - `kill`: SIGKILL a node other than node 0 (the bootstrap stays reachable), at most
//!   a third of the nodes down at once;
//! - `restart`: bring a killed node back with the same key file and the same ports:
//!   same place in the DHT, empty memory (the paper's replica reset);
//! - `join`: start a fresh node (new identity) that takes over the keys it is closest to;
//! - `pause`: SIGSTOP a node through which a client currently holds a lock, for longer
//!   than the lease, then SIGCONT. That client goes on "holding" while its node is
//!   paused, so the checker sees what fencing tokens are for;
//! - `partition`: cut the running nodes into a majority and a minority (each side's
//!   nodes block the other side's through the loopback admin control, so the traffic
//!   really stops), then heal;
//! - `split`: the same, 50/50 (as even as the count allows);
//! - `isolate`: one node cut from every other, then healed;
//! - `clock-step`: set a node's wall clock (not node 0's) to a new offset from the real
//!   one, up to [`MAX_CLOCK_STEP`] either way, as an NTP step or `date -s` would: the
//!   nodes read their wall clocks through libfaketime ([`proc::Params::clock_steps`]),
//!   and their monotonic clocks, which the leases use, do not move.
//!
//! With `join` or `restart` among the faults, every cut also starts one node *inside*
//! it, at a random moment between a tenth and seven tenths of the cut: a new peer, or a
//! killed one again, bootstrapping to one side only and cut from the other (blocked
//! both ways before it starts: its key file is made first), as autoscaling or a
//! restart script would during a partition. Its event's detail starts "inside a cut",
//! and the report counts them apart (`join inside a cut`, `restart inside a cut`).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use rand::seq::SliceRandom as _;
use rand::{Rng as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use tokio::sync::watch;

use super::api::{self, Completed};
use super::cluster::{start_member, Cluster, Member, State};
use super::proc;
use super::workload::{world, NodeState, Phase, Shared, Slot};

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// SIGKILL a node.
    Kill,
    /// Restart a killed node, same key and ports.
    Restart,
    /// SIGTERM a node, wait for it to stop, start it again (same key and ports), as
    /// `systemctl restart` does: its holders are told it stops and release first.
    RestartGraceful,
    /// Start a new node.
    Join,
    /// SIGSTOP a node longer than the lease, then SIGCONT.
    Pause,
    /// Majority/minority split, healed after a while.
    Partition,
    /// 50/50 split, healed after a while.
    Split,
    /// One node cut from every other, healed after a while.
    Isolate,
    /// A node's wall clock steps to a new offset.
    ClockStep,
}

impl Fault {
    /// Every kind, in display order.
    pub const ALL: [Fault; 9] = [
        Fault::Kill,
        Fault::Restart,
        Fault::RestartGraceful,
        Fault::Join,
        Fault::Pause,
        Fault::Partition,
        Fault::Split,
        Fault::Isolate,
        Fault::ClockStep,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Restart => "restart",
            Fault::RestartGraceful => "restart-graceful",
            Fault::Join => "join",
            Fault::Pause => "pause",
            Fault::Partition => "partition",
            Fault::Split => "split",
            Fault::Isolate => "isolate",
            Fault::ClockStep => "clock-step",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Fault {
    type Err = String;
    fn from_str(s: &str) -> Result<Fault, String> {
        Fault::ALL.into_iter().find(|f| f.name() == s.trim()).ok_or_else(|| {
            let names: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
            format!("unknown fault {s:?} ({})", names.join(", "))
        })
    }
}

/// Chaos parameters.
#[derive(Clone, Debug, Default)]
pub struct ChaosOptions {
    /// Enabled kinds (empty: no chaos).
    pub faults: Vec<Fault>,
    /// Mean time between faults (exponential).
    pub mean_interval: Duration,
    /// RNG seed.
    pub seed: u64,
    /// How long a pause lasts (longer than the lease).
    pub pause_for: Duration,
    /// Pause only nodes through this one (None: any node through which a client holds).
    pub pause_node: Option<usize>,
    /// How long a partition, split or isolation lasts before it heals.
    pub cut_for: Duration,
}

/// A fault that fired (or failed to).
#[derive(Clone, Debug, Serialize)]
pub struct FaultEvent {
    /// Seconds since the workload started.
    pub at_s: f64,
    /// Kind.
    pub kind: Fault,
    /// Node it hit.
    pub node: usize,
    /// Whether it took effect.
    pub ok: bool,
    /// What happened.
    pub detail: String,
}

/// A node that died without being killed.
#[derive(Clone, Debug, Serialize)]
pub struct Crash {
    /// Node.
    pub node: usize,
    /// Seconds since the workload started.
    pub at_s: f64,
    /// Exit status.
    pub status: String,
    /// Last lines of its log.
    pub log_tail: String,
}

/// What the supervisor hands back.
pub struct Outcome {
    /// The nodes (to scrape and stop).
    pub cluster: Cluster,
    /// Faults, in order.
    pub events: Vec<FaultEvent>,
    /// Crashes.
    pub crashes: Vec<Crash>,
    /// Completed-acquisition counters of incarnations killed since (scraped just before).
    pub retired: Completed,
}

impl Outcome {
    /// How many faults of `kind` took effect.
    pub fn fired(&self, kind: Fault) -> usize {
        self.events.iter().filter(|e| e.kind == kind && e.ok).count()
    }
}

/// Owns the cluster during a run.
pub struct Supervisor {
    cluster: Cluster,
    shared: Shared,
    opts: ChaosOptions,
    rng: ChaCha8Rng,
    http: reqwest::Client,
    start: Instant,
    pb: ProgressBar,
    events: Vec<FaultEvent>,
    crashes: Vec<Crash>,
    retired: Completed,
    joins: usize,
    fired: Arc<std::sync::atomic::AtomicU64>,
    /// Each node's wall-clock offset from the real clock, seconds (`clock-step`).
    clock_offsets: std::collections::BTreeMap<usize, i64>,
}

/// How long a daemon's admin API may take to block or unblock peers: a cut's edges are
/// set through it, and on two cores shared with compiles a loaded daemon took over 2 s
/// to answer (a restart inside a cut then failed its blocks).
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest wall-clock offset `clock-step` sets, either way: half of
/// `liveness::MAX_INCARNATION_AHEAD` (10 min), so that no two nodes' clocks are further
/// apart than a restarted node's incarnation may be ahead of its receivers'.
pub const MAX_CLOCK_STEP: Duration = Duration::from_secs(300);

/// Prints a line above the live view, or on stderr when the view is hidden.
pub fn say(pb: &ProgressBar, msg: &str) {
    if pb.is_hidden() {
        eprintln!("{msg}");
    } else {
        pb.println(msg);
    }
}

impl Supervisor {
    /// A supervisor over `cluster`; `start` is the zero of the workload's times;
    /// `fired` counts faults that took effect (for the live view).
    pub fn new(
        cluster: Cluster,
        shared: Shared,
        opts: ChaosOptions,
        start: Instant,
        pb: ProgressBar,
        fired: Arc<std::sync::atomic::AtomicU64>,
    ) -> anyhow::Result<Supervisor> {
        let rng = ChaCha8Rng::seed_from_u64(opts.seed);
        Ok(Supervisor {
            cluster,
            shared,
            opts,
            rng,
            http: api::client()?,
            start,
            pb,
            events: Vec::new(),
            crashes: Vec::new(),
            retired: Completed::default(),
            joins: 0,
            fired,
            clock_offsets: Default::default(),
        })
    }

    fn now_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn next_gap(&mut self) -> Duration {
        let mean = self.opts.mean_interval.as_secs_f64().max(0.01);
        let u: f64 = self.rng.gen_range(f64::MIN_POSITIVE..1.0);
        Duration::from_secs_f64(-mean * u.ln())
    }

    /// Runs until `stop` turns true; resumes a paused node before returning.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) -> Outcome {
        let chaos = !self.opts.faults.is_empty();
        let mut next = Instant::now() + self.next_gap();
        loop {
            let wait = if chaos { next.saturating_duration_since(Instant::now()) } else { Duration::from_secs(1) };
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                _ = tokio::time::sleep(wait.min(Duration::from_millis(250))) => {}
            }
            self.check_crashes();
            if chaos && Instant::now() >= next {
                self.fire(&mut stop).await;
                next = Instant::now() + self.next_gap();
            }
        }
        self.check_crashes();
        Outcome { cluster: self.cluster, events: self.events, crashes: self.crashes, retired: self.retired }
    }

    fn set_slot(&self, node: usize, state: NodeState) {
        world(&self.shared).nodes[node].state = state;
    }

    fn check_crashes(&mut self) {
        let at_s = self.now_s();
        let mut crashed = Vec::new();
        for m in &mut self.cluster.members {
            if !matches!(m.record.state, State::Running | State::Paused) {
                continue;
            }
            if let Some(status) = m.exit_status() {
                m.record.state = State::Crashed;
                crashed.push(Crash {
                    node: m.record.index,
                    at_s,
                    status,
                    log_tail: proc::tail(&m.record.log_file, proc::LOG_TAIL),
                });
            }
        }
        for c in crashed {
            self.set_slot(c.node, NodeState::Down);
            let log = self.cluster.members[c.node].record.log_file.clone();
            say(&self.pb, &proc::with_log(&format!("[{:6.1}s] node {} CRASHED ({})", c.at_s, c.node, c.status), &log));
            self.crashes.push(c);
        }
        let _ = self.cluster.manifest().save();
    }

    fn record(&mut self, kind: Fault, node: usize, ok: bool, detail: String) {
        let at_s = self.now_s();
        let mark = if ok { "" } else { " FAILED" };
        say(&self.pb, &format!("[{at_s:6.1}s] fault {kind}{mark}: node {node}: {detail}"));
        if ok {
            self.fired.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.events.push(FaultEvent { at_s, kind, node, ok, detail });
        let _ = self.cluster.manifest().save();
    }

    fn initial(&self) -> usize {
        self.cluster.opts.nodes
    }

    fn killable(&self) -> Vec<usize> {
        let down = self.cluster.members.iter().filter(|m| m.record.state == State::Killed).count();
        let max_down = (self.initial().saturating_sub(1) / 3).max(1);
        if down >= max_down {
            return Vec::new();
        }
        self.cluster
            .members
            .iter()
            .filter(|m| m.record.index != 0 && m.record.state == State::Running)
            .map(|m| m.record.index)
            .collect()
    }

    fn applicable(&self, kind: Fault) -> bool {
        let members = &self.cluster.members;
        match kind {
            Fault::Kill | Fault::RestartGraceful => !self.killable().is_empty(),
            Fault::Restart => members.iter().any(|m| m.record.state == State::Killed),
            Fault::Join => self.joins < (self.initial() / 2).max(1),
            Fault::Pause => members.iter().filter(|m| m.record.state == State::Running).count() >= 2,
            Fault::Partition | Fault::Split | Fault::Isolate => {
                members.iter().filter(|m| m.record.state == State::Running).count() >= 2
            }
            Fault::ClockStep => members.iter().any(|m| m.record.index != 0 && m.record.state == State::Running),
        }
    }

    async fn fire(&mut self, stop: &mut watch::Receiver<bool>) {
        let kinds: Vec<Fault> = self.opts.faults.iter().copied().filter(|k| self.applicable(*k)).collect();
        let Some(kind) = kinds.choose(&mut self.rng).copied() else { return };
        match kind {
            Fault::Kill => self.kill().await,
            Fault::Restart => self.restart().await,
            Fault::RestartGraceful => self.restart_graceful().await,
            Fault::Join => self.join().await,
            Fault::Pause => self.pause(stop).await,
            Fault::Partition | Fault::Split | Fault::Isolate => self.cut(kind, stop).await,
            Fault::ClockStep => self.clock_step(),
        }
    }

    /// Moves a running node's wall clock (never node 0's) to a new offset from the
    /// real clock, up to [`MAX_CLOCK_STEP`] either way.
    fn clock_step(&mut self) {
        let mut nodes: Vec<usize> = self
            .cluster
            .members
            .iter()
            .filter(|m| m.record.index != 0 && m.record.state == State::Running)
            .map(|m| m.record.index)
            .collect();
        nodes.sort_unstable();
        let Some(&node) = nodes.choose(&mut self.rng) else { return };
        let max = MAX_CLOCK_STEP.as_secs() as i64;
        let offset = self.rng.gen_range(-max..=max);
        let before = self.clock_offsets.get(&node).copied().unwrap_or(0);
        let file = proc::clock_file(&self.cluster.members[node].record.key_file);
        match std::fs::write(&file, proc::clock_offset(offset)) {
            Ok(()) => {
                self.clock_offsets.insert(node, offset);
                let step = offset - before;
                self.record(
                    Fault::ClockStep,
                    node,
                    true,
                    format!("wall clock stepped {step:+} s (now {offset:+} s off the real clock; monotonic clocks untouched)"),
                );
            }
            Err(e) => self.record(Fault::ClockStep, node, false, format!("writing {}: {e}", file.display())),
        }
    }

    /// Cuts the running nodes in two (by `kind`), waits `cut_for`, heals. Each side's
    /// nodes block the other side's peers, so connections close and stay refused.
    async fn cut(&mut self, kind: Fault, stop: &mut watch::Receiver<bool>) {
        let mut running: Vec<usize> =
            self.cluster.members.iter().filter(|m| m.record.state == State::Running).map(|m| m.record.index).collect();
        running.shuffle(&mut self.rng);
        let small = match kind {
            Fault::Isolate => 1,
            Fault::Split => running.len() / 2,
            _ => (running.len() - 1) / 2, // a strict minority
        }
        .max(1);
        let (a, b) = running.split_at(small);
        let (mut a, mut b) = (a.to_vec(), b.to_vec());
        a.sort_unstable();
        b.sort_unstable();
        let peers = |side: &[usize]| -> Vec<String> {
            side.iter().map(|i| self.cluster.members[*i].record.peer_id.clone()).collect()
        };
        let (pa, pb) = (peers(&a), peers(&b));
        let mut failed = Vec::new();
        for (side, other) in [(&a, &pb), (&b, &pa)] {
            for &i in side.iter() {
                let api = self.cluster.members[i].record.api;
                let blocked = match api::admin_token(&self.cluster.opts.dir) {
                    Ok(admin) => api::admin_block(&self.http, api, &admin, other, true, ADMIN_TIMEOUT).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = blocked {
                    failed.push(format!("node {i}: {e:#}"));
                }
            }
        }
        let node = a[0];
        let detail = format!("nodes {a:?} cut from {b:?} for {:.1} s", self.opts.cut_for.as_secs_f64());
        if failed.is_empty() {
            self.record(kind, node, true, detail);
        } else {
            self.record(kind, node, false, format!("{detail}: {}", failed.join("; ")));
        }
        let cut_at = Instant::now();
        let inside = self.opts.cut_for.mul_f64(self.rng.gen_range(0.1..0.7));
        tokio::select! {
            _ = stop.wait_for(|s| *s) => {}
            _ = tokio::time::sleep(inside) => {}
        }
        let mut started = Vec::new();
        if !*stop.borrow() {
            let (side, other) = if self.rng.gen_bool(0.5) { (a.clone(), pb.clone()) } else { (b.clone(), pa.clone()) };
            started.extend(self.start_inside_cut(&side, &other, cut_at).await);
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => {}
            _ = tokio::time::sleep(self.opts.cut_for.saturating_sub(cut_at.elapsed())) => {}
        }
        let all: Vec<String> = pa.iter().chain(&pb).chain(&started).cloned().collect();
        let running: Vec<usize> =
            self.cluster.members.iter().filter(|m| m.record.state == State::Running).map(|m| m.record.index).collect();
        for i in &running {
            let api = self.cluster.members[*i].record.api;
            if let Ok(admin) = api::admin_token(&self.cluster.opts.dir) {
                let _ = api::admin_block(&self.http, api, &admin, &all, false, ADMIN_TIMEOUT).await;
            }
        }
        say(&self.pb, &format!("[{:6.1}s] {kind} healed: nodes {a:?} and {b:?} unblocked", self.now_s()));
    }

    /// Inside a cut of `side` from the peers `other`: starts a new node (`join`) or a
    /// killed one again (`restart`), whichever of the run's faults applies (picked at
    /// random), bootstrapping to `side` only and blocked from `other` both ways before
    /// it starts. Answers the peer id started, if any.
    async fn start_inside_cut(&mut self, side: &[usize], other: &[String], cut_at: Instant) -> Option<String> {
        let kinds: Vec<Fault> = [Fault::Join, Fault::Restart]
            .into_iter()
            .filter(|k| self.opts.faults.contains(k) && self.applicable(*k))
            .collect();
        let kind = *kinds.choose(&mut self.rng)?;
        let (index, mut spec, same_ports) = match kind {
            Fault::Join => {
                let index = self.cluster.members.len();
                match Cluster::spec(&self.cluster.opts, index) {
                    Ok(spec) => {
                        let _ = std::fs::remove_file(&spec.key_file);
                        (index, spec, None)
                    }
                    Err(e) => {
                        self.record(kind, index, false, format!("inside a cut: {e:#}"));
                        return None;
                    }
                }
            }
            _ => {
                let killed: Vec<usize> = self
                    .cluster
                    .members
                    .iter()
                    .filter(|m| m.record.state == State::Killed)
                    .map(|m| m.record.index)
                    .collect();
                let index = *killed.choose(&mut self.rng)?;
                let old = self.cluster.members[index].record.clone();
                let mut spec = proc::Spec::new(&self.cluster.opts.dir, index, self.cluster.opts.params.clone());
                spec.append_log = true;
                (index, spec, Some((old.tcp_port, old.api.port(), old.joined)))
            }
        };
        if let Some((tcp, api, _)) = same_ports {
            spec.tcp_port = tcp;
            spec.api_port = api;
        }
        // Its identity first, so that the other side refuses it before it dials anyone.
        let peer = match sigma_node::identity::load_or_create(&spec.key_file) {
            Ok(key) => key.public().to_peer_id().to_string(),
            Err(e) => {
                self.record(kind, index, false, format!("inside a cut: key file: {e:#}"));
                return None;
            }
        };
        let admin = api::admin_token(&self.cluster.opts.dir).ok();
        let mut failed = Vec::new();
        let others: Vec<usize> = self
            .cluster
            .members
            .iter()
            .filter(|m| m.record.state == State::Running && other.contains(&m.record.peer_id))
            .map(|m| m.record.index)
            .collect();
        for i in others {
            let api = self.cluster.members[i].record.api;
            if let Some(admin) = &admin {
                if let Err(e) =
                    api::admin_block(&self.http, api, admin, std::slice::from_ref(&peer), true, ADMIN_TIMEOUT).await
                {
                    failed.push(format!("node {i}: {e:#}"));
                }
            }
        }
        spec.bootstrap = side
            .iter()
            .filter_map(|i| self.cluster.members.get(*i))
            .filter(|m| m.record.state == State::Running)
            .take(3)
            .filter_map(|m| m.record.listen.first().cloned())
            .collect();
        let joined = same_ports.is_none_or(|(_, _, joined)| joined);
        let member = match start_member(&self.cluster.opts.sigma_bin, spec, joined).await {
            Ok(m) => m,
            Err(e) => {
                self.record(kind, index, false, format!("inside a cut: {e:#}"));
                return Some(peer);
            }
        };
        if let Some(admin) = &admin {
            if let Err(e) = api::admin_block(&self.http, member.record.api, admin, other, true, ADMIN_TIMEOUT).await {
                failed.push(format!("the new node: {e:#}"));
            }
        }
        let (pid, api) = (member.record.pid, member.record.api);
        if same_ports.is_some() {
            self.cluster.members[index] = member;
            self.set_slot(index, NodeState::Up);
        } else {
            self.cluster.members.push(member);
            world(&self.shared).nodes.push(Slot { api, state: NodeState::Up });
            self.joins += 1;
        }
        let detail = format!(
            "inside a cut ({:.1} s into it), on the side of nodes {side:?}: pid {pid}, peer {peer}{}",
            cut_at.elapsed().as_secs_f64(),
            if failed.is_empty() { String::new() } else { format!("; blocks failed: {}", failed.join("; ")) }
        );
        self.record(kind, index, failed.is_empty(), detail);
        Some(peer)
    }

    /// A node that may go down now (none if enough are down already): its message
    /// counters kept (they die with it), its slot marked down for the clients.
    async fn take_down(&mut self) -> Option<usize> {
        let victims = self.killable();
        let &node = victims.choose(&mut self.rng)?;
        let api = self.cluster.members[node].record.api;
        if let Ok(c) = api::completed(&self.http, api, Duration::from_secs(1)).await {
            self.retired = self.retired + c;
        }
        self.set_slot(node, NodeState::Down);
        Some(node)
    }

    async fn kill(&mut self) {
        let Some(node) = self.take_down().await else { return };
        let m = &mut self.cluster.members[node];
        let pid = m.record.pid;
        proc::signal(pid, nix::sys::signal::Signal::SIGKILL);
        if let Some(mut child) = m.child.take() {
            let _ = tokio::task::spawn_blocking(move || child.wait()).await;
        }
        m.record.state = State::Killed;
        self.record(Fault::Kill, node, true, format!("kill -9 {pid}"));
    }

    /// Bootstrap addresses: node 0 first, then up to two other running nodes.
    fn bootstrap(&self, except: usize) -> Vec<String> {
        let mut running: Vec<&Member> = self
            .cluster
            .members
            .iter()
            .filter(|m| m.record.index != except && m.record.state == State::Running)
            .collect();
        running.sort_by_key(|m| m.record.index);
        running.iter().take(3).filter_map(|m| m.record.listen.first().cloned()).collect()
    }

    /// SIGTERM (the daemon's graceful stop: its HTTP holders are told, and it waits for
    /// their releases up to its --stop-timeout), then a restart with the same identity.
    async fn restart_graceful(&mut self) {
        let Some(node) = self.take_down().await else { return };
        let m = &mut self.cluster.members[node];
        let pid = m.record.pid;
        let stopped = match m.child.take() {
            Some(mut child) => {
                // The daemon's own stop timeout is 30 s; past a minute it is hung.
                tokio::task::spawn_blocking(move || {
                    proc::terminate(pid, Duration::from_secs(60), || child.try_wait().ok().flatten().is_some())
                })
                .await
                .map_or("the stop was not awaited".to_owned(), |killed| {
                    if killed {
                        "did not stop within 60 s of SIGTERM: killed".to_owned()
                    } else {
                        format!("SIGTERM {pid}, stopped")
                    }
                })
            }
            None => "not a child of this run".to_owned(),
        };
        m.record.state = State::Killed;
        self.restart_node(node, Fault::RestartGraceful, &stopped).await;
    }

    async fn restart(&mut self) {
        let killed: Vec<usize> =
            self.cluster.members.iter().filter(|m| m.record.state == State::Killed).map(|m| m.record.index).collect();
        let Some(&node) = killed.choose(&mut self.rng) else { return };
        self.restart_node(node, Fault::Restart, "").await;
    }

    /// Starts `node` again with its identity and ports; `before` prefixes the record.
    async fn restart_node(&mut self, node: usize, kind: Fault, before: &str) {
        let before = if before.is_empty() { String::new() } else { format!("{before}; ") };
        let old = self.cluster.members[node].record.clone();
        let mut spec = proc::Spec::new(&self.cluster.opts.dir, node, self.cluster.opts.params.clone());
        spec.tcp_port = old.tcp_port;
        spec.api_port = old.api.port();
        spec.append_log = true;
        spec.bootstrap = self.bootstrap(node);
        // The ports were just released by the killed process; give the kernel a moment
        // if they are not free yet.
        let mut last_err = String::new();
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            match start_member(&self.cluster.opts.sigma_bin, spec.clone(), old.joined).await {
                Ok(m) => {
                    let same = m.record.peer_id == old.peer_id;
                    let pid = m.record.pid;
                    self.cluster.members[node] = m;
                    self.set_slot(node, NodeState::Up);
                    let detail = if same {
                        format!("{before}pid {pid}, same identity and ports, empty memory")
                    } else {
                        format!(
                            "pid {pid}, but a DIFFERENT peer id {} (key file not reused?)",
                            self.cluster.members[node].record.peer_id
                        )
                    };
                    self.record(kind, node, same, detail);
                    return;
                }
                Err(e) => last_err = format!("{before}{e:#}"),
            }
        }
        self.record(kind, node, false, last_err);
    }

    async fn join(&mut self) {
        let index = self.cluster.members.len();
        let mut spec = match Cluster::spec(&self.cluster.opts, index) {
            Ok(s) => s,
            Err(e) => return self.record(Fault::Join, index, false, format!("{e:#}")),
        };
        // A fresh identity.
        let _ = std::fs::remove_file(&spec.key_file);
        spec.bootstrap = self.bootstrap(index);
        match start_member(&self.cluster.opts.sigma_bin, spec, true).await {
            Ok(m) => {
                let (pid, api, peer) = (m.record.pid, m.record.api, m.record.peer_id.clone());
                self.cluster.members.push(m);
                world(&self.shared).nodes.push(Slot { api, state: NodeState::Up });
                self.joins += 1;
                self.record(Fault::Join, index, true, format!("pid {pid}, new peer {peer}"));
            }
            Err(e) => self.record(Fault::Join, index, false, format!("{e:#}")),
        }
    }

    async fn pause(&mut self, stop: &mut watch::Receiver<bool>) {
        // Find a node through which a client holds a lock right now, and mark it paused
        // under the same lock: that client then holds on until the node is resumed.
        let deadline = Instant::now() + Duration::from_secs(2);
        let found = loop {
            {
                let mut w = world(&self.shared);
                let mut holders: Vec<(usize, usize)> = w
                    .phases
                    .iter()
                    .enumerate()
                    .filter_map(|(c, p)| match p {
                        Phase::Holding(n) => Some((c, *n)),
                        _ => None,
                    })
                    .filter(|(_, n)| {
                        self.opts.pause_node.is_none_or(|only| only == *n)
                            && w.nodes[*n].state == NodeState::Up
                            && self.cluster.members.get(*n).is_some_and(|m| m.record.state == State::Running)
                    })
                    .collect();
                holders.sort_unstable();
                if let Some(&(client, node)) = holders.choose(&mut self.rng) {
                    w.nodes[node].state = NodeState::Paused;
                    break Some((client, node));
                }
            }
            if Instant::now() > deadline || *stop.borrow() {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let Some((client, node)) = found else { return };
        let pid = self.cluster.members[node].record.pid;
        proc::signal(pid, nix::sys::signal::Signal::SIGSTOP);
        self.cluster.members[node].record.state = State::Paused;
        let planned = self.opts.pause_for.as_secs_f64();
        self.record(
            Fault::Pause,
            node,
            true,
            format!("SIGSTOP {pid} for {planned:.1} s while client {client} holds a lock through it"),
        );
        let paused_at = Instant::now();
        tokio::select! {
            _ = stop.wait_for(|s| *s) => {}
            _ = tokio::time::sleep(self.opts.pause_for) => {}
        }
        proc::signal(pid, nix::sys::signal::Signal::SIGCONT);
        self.cluster.members[node].record.state = State::Running;
        self.set_slot(node, NodeState::Up);
        let _ = self.cluster.manifest().save();
        let secs = paused_at.elapsed().as_secs_f64();
        say(&self.pb, &format!("[{:6.1}s] node {node} resumed (SIGCONT) after {secs:.1} s", self.now_s()));
    }
}
