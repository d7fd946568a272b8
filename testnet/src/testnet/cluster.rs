//! `up`, `status`, `down` and the manifest.
//!
//! `up` starts node 0, then the others bootstrapping to it, waits until every node is
//! connected to and routes to all the others, and writes `DIR/manifest.json`. The
//! nodes run in their own sessions, so they outlive the `up` process. `down` stops the
//! processes listed in the manifest by pid (SIGTERM, SIGKILL after a grace), checking
//! first that each pid still is that node (`sigma run … --key-file <its key>`).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

use super::api;
use super::proc::{self, Params, Spec};

/// Name of the manifest in the testnet directory.
pub const MANIFEST: &str = "manifest.json";

/// How long a node may take to print `SIGMA_READY`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Nodes started through node 0 alone; the rest start in waves of [`WAVE`], each
/// through three nodes already up.
const FIRST_WAVE: usize = 15;
const WAVE: usize = 50;

/// Options of `up` (and of the testnet under `run`).
#[derive(Clone, Debug)]
pub struct UpOptions {
    /// Nodes.
    pub nodes: usize,
    /// Node i: TCP port base + i, API port base + 1000 + i; None: ephemeral ports.
    pub base_port: Option<u16>,
    /// Directory for keys, logs and the manifest.
    pub dir: PathBuf,
    /// Protocol parameters for every node.
    pub params: Params,
    /// The `sigma` binary.
    pub sigma_bin: PathBuf,
    /// How long the swarm may take to form.
    pub form_timeout: Duration,
}

/// What the manifest says about a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Started and not stopped.
    Running,
    /// Paused (SIGSTOP) by the chaos of `run`.
    Paused,
    /// Killed by the chaos of `run` (may be restarted).
    Killed,
    /// Died on its own.
    Crashed,
    /// Stopped by `down` (or at the end of `run`).
    Stopped,
}

/// One node in the manifest.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Index (names its files).
    pub index: usize,
    /// Peer id.
    pub peer_id: String,
    /// Listen addresses, each ending with /p2p/ID.
    pub listen: Vec<String>,
    /// TCP port for peers (kept across restarts).
    pub tcp_port: u16,
    /// HTTP control API.
    pub api: SocketAddr,
    /// Process id of the current incarnation.
    pub pid: u32,
    /// Identity.
    pub key_file: PathBuf,
    /// stderr of the node.
    pub log_file: PathBuf,
    /// stdout of the node.
    pub stdout_file: PathBuf,
    /// State as last known by the testnet.
    pub state: State,
    /// Started by a `join` fault rather than by `up`.
    #[serde(default)]
    pub joined: bool,
}

/// `DIR/manifest.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    /// The testnet directory.
    pub dir: PathBuf,
    /// The `sigma` binary used.
    pub sigma_bin: PathBuf,
    /// Protocol parameters.
    pub params: Params,
    /// `--base-port`, if given.
    pub base_port: Option<u16>,
    /// Milliseconds since the epoch when the testnet was started.
    pub started_unix_ms: u64,
    /// The nodes.
    pub nodes: Vec<NodeRecord>,
}

impl Manifest {
    /// Path of the manifest of `dir`.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(MANIFEST)
    }

    /// Reads `dir/manifest.json`.
    pub fn load(dir: &Path) -> Result<Manifest> {
        let p = Manifest::path(dir);
        let text = std::fs::read_to_string(&p)
            .with_context(|| format!("reading {} (is a testnet up there? start one with `up`)", p.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))
    }

    /// Writes it atomically (temporary file, then rename).
    pub fn save(&self) -> Result<()> {
        let p = Manifest::path(&self.dir);
        let tmp = p.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(self)? + "\n")
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &p).with_context(|| format!("writing {}", p.display()))?;
        Ok(())
    }
}

/// A node started by this process: its record and, while it runs, its process.
#[derive(Debug)]
pub struct Member {
    /// What goes into the manifest.
    pub record: NodeRecord,
    /// The process (None once reaped).
    pub child: Option<Child>,
}

impl Member {
    /// Whether the process has exited (reaps it).
    pub fn exited(&mut self) -> bool {
        match &mut self.child {
            Some(c) => match c.try_wait() {
                Ok(Some(_)) | Err(_) => {
                    self.child = None;
                    true
                }
                Ok(None) => false,
            },
            None => !proc::is_our_node(self.record.pid, &self.record.key_file),
        }
    }

    /// The exit status if it has exited (reaps it), as text.
    pub fn exit_status(&mut self) -> Option<String> {
        let c = self.child.as_mut()?;
        match c.try_wait() {
            Ok(Some(st)) => {
                self.child = None;
                Some(st.to_string())
            }
            _ => None,
        }
    }

    /// SIGTERM, SIGKILL after `grace`; marks it stopped.
    pub fn stop(&mut self, grace: Duration) {
        let pid = self.record.pid;
        proc::terminate(pid, grace, || self.exited());
        self.record.state = State::Stopped;
    }
}

/// A testnet started by this process.
#[derive(Debug)]
pub struct Cluster {
    /// Options it was started with.
    pub opts: UpOptions,
    /// The nodes, by index (joined nodes appended).
    pub members: Vec<Member>,
    /// When `up` started.
    pub started_unix_ms: u64,
    /// How long the swarm took to form.
    pub formed_in: Duration,
    /// Leave the nodes running when dropped (`up`); otherwise nodes still running
    /// are killed on drop, so a driver that fails halfway leaves nothing behind.
    pub keep_running: bool,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.keep_running {
            return;
        }
        for m in &mut self.members {
            if matches!(m.record.state, State::Running | State::Paused) && !m.exited() {
                proc::signal(m.record.pid, nix::sys::signal::Signal::SIGKILL);
                proc::signal(m.record.pid, nix::sys::signal::Signal::SIGCONT);
                if let Some(mut c) = m.child.take() {
                    let _ = c.wait();
                }
                m.record.state = State::Stopped;
            }
        }
    }
}

/// Fails if `dir` has a manifest with a node still running.
fn refuse_if_running(dir: &Path) -> Result<()> {
    if let Ok(m) = Manifest::load(dir) {
        let running: Vec<String> = m
            .nodes
            .iter()
            .filter(|n| proc::is_our_node(n.pid, &n.key_file))
            .map(|n| format!("node {} (pid {})", n.index, n.pid))
            .collect();
        if !running.is_empty() {
            bail!(
                "a testnet is already running in {}: {}; stop it with `sigma-testnet down --dir {}`",
                dir.display(),
                running.join(", "),
                dir.display()
            );
        }
    }
    Ok(())
}

impl Cluster {
    /// The spec of node `index` (ports from `--base-port` if given).
    pub fn spec(opts: &UpOptions, index: usize) -> Result<Spec> {
        let mut spec = Spec::new(&opts.dir, index, opts.params.clone());
        if let Some(base) = opts.base_port {
            let port = |off: usize| -> Result<u16> {
                u16::try_from(usize::from(base) + off).ok().filter(|p| *p != 0).with_context(|| {
                    format!("--base-port {base}: port {} for node {index} is out of range", usize::from(base) + off)
                })
            };
            spec.tcp_port = port(index)?;
            spec.api_port = port(1000 + index)?;
        }
        Ok(spec)
    }

    /// Starts the testnet and waits until the swarm has formed. On failure every node
    /// started so far is stopped again.
    pub async fn up(opts: UpOptions) -> Result<Cluster> {
        if opts.nodes == 0 {
            bail!("--nodes must be at least 1");
        }
        std::fs::create_dir_all(&opts.dir).with_context(|| format!("creating {}", opts.dir.display()))?;
        refuse_if_running(&opts.dir)?;
        let started_unix_ms = unix_ms();
        let t0 = Instant::now();
        let mut cluster = Cluster {
            opts: opts.clone(),
            members: Vec::new(),
            started_unix_ms,
            formed_in: Duration::ZERO,
            keep_running: false,
        };
        match cluster.start_all().await {
            Ok(()) => {
                cluster.formed_in = t0.elapsed();
                Ok(cluster)
            }
            Err(e) => {
                cluster.down(Duration::from_secs(2)).await;
                let _ = cluster.manifest().save();
                Err(e)
            }
        }
    }

    async fn start_all(&mut self) -> Result<()> {
        let first = start_member(&self.opts.sigma_bin, Cluster::spec(&self.opts, 0)?, false).await?;
        let boot = first.record.listen.first().cloned().context("node 0 has no listen address")?;
        self.members.push(first);
        // A first wave through node 0, then the rest, in waves, each node through three
        // nodes already up: no node takes every newcomer's first connection (a bound
        // refuses past it), and a newcomer learns the swarm from several places.
        let nodes = self.opts.nodes;
        let first_wave = (nodes - 1).min(FIRST_WAVE);
        self.start_wave(1..1 + first_wave, |_| vec![boot.clone()]).await?;
        let mut next = 1 + first_wave;
        while next < nodes {
            let up: Vec<String> = self.members.iter().filter_map(|m| m.record.listen.first().cloned()).collect();
            let end = (next + WAVE).min(nodes);
            self.start_wave(next..end, |i| (0..3).map(|k| up[(i * 7 + k * 13) % up.len()].clone()).collect()).await?;
            next = end;
        }
        self.wait_formed().await
    }

    /// Starts nodes `range` in parallel, each bootstrapping through `bootstrap(i)`.
    async fn start_wave(
        &mut self,
        range: std::ops::Range<usize>,
        bootstrap: impl Fn(usize) -> Vec<String>,
    ) -> Result<()> {
        let mut pending = Vec::new();
        for i in range {
            let mut spec = Cluster::spec(&self.opts, i)?;
            spec.bootstrap = bootstrap(i);
            pending.push(start_member(&self.opts.sigma_bin, spec, false));
        }
        let mut first_err = None;
        for r in futures::future::join_all(pending).await {
            match r {
                Ok(m) => self.members.push(m),
                Err(e) => first_err = first_err.or(Some(e)),
            }
        }
        self.manifest().save()?;
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Waits until every running node serves (`ready`: its Kademlia bootstrap done, a
    /// majority reached) and counts every running node as an alive member (connected,
    /// or heard through the membership gossip: not a full mesh), then for the takeover
    /// delay a new swarm holds its first grants for.
    pub async fn wait_formed(&mut self) -> Result<()> {
        let client = api::client()?;
        let deadline = Instant::now() + self.opts.form_timeout;
        loop {
            for m in &mut self.members {
                if let Some(st) = m.exit_status() {
                    m.record.state = State::Crashed;
                    bail!(proc::with_log(
                        &format!("node {} exited while the swarm formed ({st})", m.record.index),
                        &m.record.log_file
                    ));
                }
            }
            let want = self.members.len();
            let polls = self.members.iter().map(|m| api::status(&client, m.record.api, Duration::from_secs(2)));
            let statuses = futures::future::join_all(polls).await;
            let lagging: Vec<String> = statuses
                .iter()
                .zip(&self.members)
                .filter_map(|(s, m)| match s {
                    Ok(s) if s.members >= want && s.reachable_members >= want && s.ready => None,
                    Ok(s) => Some(format!(
                        "node {}: {} of {} members alive, {} connections, {} routable, {}",
                        m.record.index,
                        s.reachable_members,
                        s.members,
                        s.connections,
                        s.routable_peers,
                        if s.ready { "serving" } else { "not serving" }
                    )),
                    Err(e) => Some(format!("node {}: API {} unreachable: {e}", m.record.index, m.record.api)),
                })
                .collect();
            if lagging.is_empty() {
                let delay = statuses.iter().flatten().map(|s| s.takeover_delay_ms).max().unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(delay)).await;
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the swarm did not form within {:.0} s (every node must serve and see {want} members alive): \
                     {} of {want} nodes not yet: {}{}",
                    self.opts.form_timeout.as_secs_f64(),
                    lagging.len(),
                    lagging.iter().take(8).cloned().collect::<Vec<_>>().join("; "),
                    if lagging.len() > 8 { "; …" } else { "" }
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The manifest of the current state.
    pub fn manifest(&self) -> Manifest {
        Manifest {
            dir: self.opts.dir.clone(),
            sigma_bin: self.opts.sigma_bin.clone(),
            params: self.opts.params.clone(),
            base_port: self.opts.base_port,
            started_unix_ms: self.started_unix_ms,
            nodes: self.members.iter().map(|m| m.record.clone()).collect(),
        }
    }

    /// Stops every node still running (all at once), marks them stopped.
    pub async fn down(&mut self, grace: Duration) {
        let members = std::mem::take(&mut self.members);
        let stops = members.into_iter().map(|mut m| {
            tokio::task::spawn_blocking(move || {
                if matches!(m.record.state, State::Running | State::Paused) {
                    m.stop(grace);
                } else {
                    // Killed or crashed: reap it if it is still our child.
                    let _ = m.exited();
                }
                m
            })
        });
        for r in futures::future::join_all(stops).await {
            match r {
                Ok(m) => self.members.push(m),
                Err(e) => tracing_free_warn(&format!("stopping a node: {e}")),
            }
        }
        self.members.sort_by_key(|m| m.record.index);
    }
}

fn tracing_free_warn(msg: &str) {
    eprintln!("sigma-testnet: warning: {msg}");
}

/// Milliseconds since the epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Starts one node (blocking work on the blocking pool).
pub async fn start_member(bin: &Path, spec: Spec, joined: bool) -> Result<Member> {
    let bin = bin.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let s = proc::start(&bin, &spec, READY_TIMEOUT)?;
        let record = NodeRecord {
            index: spec.index,
            peer_id: s.peer_id,
            listen: s.listen,
            tcp_port: s.tcp_port,
            api: s.api,
            pid: s.pid,
            key_file: spec.key_file,
            log_file: spec.log_file,
            stdout_file: spec.stdout_file,
            state: State::Running,
            joined,
        };
        Ok(Member { record, child: Some(s.child) })
    })
    .await
    .context("the start-up task panicked")?
}

/// The table printed by `up`.
pub fn render_up(c: &Cluster) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "sigma-testnet up: {} nodes on 127.0.0.1, swarm formed in {:.1} s; manifest {}",
        c.members.len(),
        c.formed_in.as_secs_f64(),
        Manifest::path(&c.opts.dir).display()
    );
    let w = c.members.iter().filter_map(|m| m.record.listen.first()).map(String::len).max().unwrap_or(0).max(12);
    let _ = writeln!(s, "{:>4}  {:>8}  {:<21}  {:<w$}  log", "node", "pid", "api", "peer address");
    for m in &c.members {
        let r = &m.record;
        let addr = r.listen.first().map_or("-", String::as_str);
        let _ = writeln!(s, "{:>4}  {:>8}  {:<21}  {:<w$}  {}", r.index, r.pid, r.api, addr, r.log_file.display());
    }
    let _ = writeln!(
        s,
        "try: sigma lock demo --api {} -- echo hello; stop with: sigma-testnet down --dir {}",
        c.members[0].record.api,
        c.opts.dir.display()
    );
    s
}

/// One node's line of `status`.
#[derive(Clone, Debug, Serialize)]
pub struct NodeStatus {
    /// Index.
    pub index: usize,
    /// Pid from the manifest.
    pub pid: u32,
    /// State in the manifest.
    pub state: State,
    /// The process exists (and is that node).
    pub process: bool,
    /// The API answered.
    pub answering: bool,
    /// The answer.
    pub status: Option<api::Status>,
}

/// `status`: every node of the manifest, its process and its API; returns the table
/// and whether every node the manifest calls running is alive and answering.
pub async fn status(dir: &Path) -> Result<(String, bool, Vec<NodeStatus>)> {
    let m = Manifest::load(dir)?;
    let client = api::client()?;
    let polls = m.nodes.iter().map(|n| {
        let client = client.clone();
        async move {
            let process = proc::is_our_node(n.pid, &n.key_file);
            let st = if process { api::status(&client, n.api, Duration::from_secs(3)).await.ok() } else { None };
            NodeStatus { index: n.index, pid: n.pid, state: n.state, process, answering: st.is_some(), status: st }
        }
    });
    let rows = futures::future::join_all(polls).await;
    let mut s = String::new();
    let large = rows.len() > STATUS_ROWS;
    if large {
        let _ = writeln!(s, "{}", collapsed(&rows));
        let _ = writeln!(s, "nodes not up and serving:");
    }
    let _ = writeln!(
        s,
        "{:>4}  {:>8}  {:<8}  {:<21}  {:>5}  {:>8}  {:>8}  {:>4}  {:>7}  peer id",
        "node", "pid", "alive", "api", "peers", "routable", "replicas", "held", "waiting"
    );
    let mut healthy = true;
    for (row, n) in rows.iter().zip(&m.nodes) {
        let alive = match (row.process, row.answering) {
            (true, true) => "up",
            (true, false) => "no-api",
            (false, _) if n.state == State::Stopped => "stopped",
            (false, _) => "dead",
        };
        if n.state != State::Stopped && !(row.process && row.answering) {
            healthy = false;
        }
        if large && row.status.as_ref().is_some_and(|st| st.ready) {
            continue;
        }
        let (peers, routable, replicas, held, waiting) = match &row.status {
            Some(st) => (
                st.connected_peers.len().to_string(),
                st.routable_peers.to_string(),
                st.replicas_hosted.to_string(),
                st.locks_held.len().to_string(),
                st.locks_waiting.len().to_string(),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into(), "-".into()),
        };
        let _ = writeln!(
            s,
            "{:>4}  {:>8}  {:<8}  {:<21}  {:>5}  {:>8}  {:>8}  {:>4}  {:>7}  {}",
            n.index, n.pid, alive, n.api, peers, routable, replicas, held, waiting, n.peer_id
        );
    }
    Ok((s, healthy, rows))
}

/// Past this many nodes `status` prints figures over all nodes, and rows only for
/// the nodes that are not up and serving.
const STATUS_ROWS: usize = 24;

/// One paragraph of figures over every node: min / median / max.
fn collapsed(rows: &[NodeStatus]) -> String {
    let up: Vec<&api::Status> = rows.iter().filter_map(|r| r.status.as_ref()).collect();
    let spread = |f: &dyn Fn(&api::Status) -> usize| -> String {
        let mut v: Vec<usize> = up.iter().map(|s| f(s)).collect();
        v.sort_unstable();
        match v.as_slice() {
            [] => "-".into(),
            v => format!("{} / {} / {}", v[0], v[v.len() / 2], v[v.len() - 1]),
        }
    };
    format!(
        "{} nodes: {} answering, {} serving\n\
         per node (min / median / max):  connections {}  alive members {}  routable {}  replicas {}\n\
         locks held {}, waited for {}",
        rows.len(),
        up.len(),
        up.iter().filter(|s| s.ready).count(),
        spread(&|s| s.connections as usize),
        spread(&|s| s.reachable_members),
        spread(&|s| s.routable_peers),
        spread(&|s| s.replicas_hosted),
        up.iter().map(|s| s.locks_held.len()).sum::<usize>(),
        up.iter().map(|s| s.locks_waiting.len()).sum::<usize>(),
    )
}

/// `down`: stops the nodes of the manifest by pid (only processes that still are those
/// nodes), marks them stopped, removes nothing. Returns one line per node.
pub async fn down(dir: &Path, grace: Duration) -> Result<String> {
    let mut m = Manifest::load(dir)?;
    let nodes = std::mem::take(&mut m.nodes);
    let stops = nodes.into_iter().map(|mut n| {
        tokio::task::spawn_blocking(move || {
            let line = if proc::is_our_node(n.pid, &n.key_file) {
                let key = n.key_file.clone();
                let killed = proc::terminate(n.pid, grace, || !proc::is_our_node(n.pid, &key));
                if killed {
                    format!("node {} (pid {}): killed after {:.0} s grace", n.index, n.pid, grace.as_secs_f64())
                } else {
                    format!("node {} (pid {}): stopped", n.index, n.pid)
                }
            } else {
                format!("node {} (pid {}): not running", n.index, n.pid)
            };
            n.state = State::Stopped;
            (n, line)
        })
    });
    let mut lines = Vec::new();
    for r in futures::future::join_all(stops).await {
        let (n, line) = r.context("a stop task panicked")?;
        m.nodes.push(n);
        lines.push(line);
    }
    m.nodes.sort_by_key(|n| n.index);
    m.save()?;
    Ok(lines.join("\n") + "\n")
}
