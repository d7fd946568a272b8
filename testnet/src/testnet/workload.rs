//! The workload: clients as tokio tasks in the driver, each bound to a node (client k →
//! node k mod N) and a resource (k mod R), looping acquire (HTTP, with a timeout) →
//! record enter → hold → record exit → release. A client whose node is down or paused
//! fails over to the next node that is up; acquire errors are counted, never fatal.
//!
//! The [`World`] is what clients and the chaos supervisor share: the nodes' API
//! addresses and states, and each client's phase (so a pause can pick a node whose
//! client holds a lock, and that client goes on holding while its node is paused, like
//! an application sharing a host with its node).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::api::{self, Acquire, Release};
use super::check::Cs;

/// A node as the clients see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeState {
    /// Serving.
    Up,
    /// Stopped with SIGSTOP.
    Paused,
    /// Killed, crashed or (re)starting.
    Down,
}

/// A node's API and state.
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    /// HTTP control API.
    pub api: SocketAddr,
    /// State.
    pub state: NodeState,
}

/// What a client is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Between attempts.
    Idle,
    /// Waiting for an acquire through a node.
    Waiting(usize),
    /// Holding a lock taken through a node.
    Holding(usize),
}

/// Shared state of the nodes and clients.
#[derive(Debug)]
pub struct World {
    /// Nodes by index (joined nodes appended).
    pub nodes: Vec<Slot>,
    /// Client phases by client id.
    pub phases: Vec<Phase>,
}

impl World {
    /// Node `home` if it is up, else the next one that is (by index, wrapping).
    pub fn up_from(&self, home: usize) -> Option<(usize, SocketAddr)> {
        let n = self.nodes.len();
        (0..n).map(|d| (home + d) % n).find(|i| self.nodes[*i].state == NodeState::Up).map(|i| (i, self.nodes[i].api))
    }
}

/// The world behind a mutex (held only for short, non-async sections).
pub type Shared = Arc<Mutex<World>>;

/// Locks the world (a panicked holder does not poison it for the others).
pub fn world(w: &Shared) -> MutexGuard<'_, World> {
    w.lock().unwrap_or_else(|e| e.into_inner())
}

/// Live counters (for the view and the summary).
#[derive(Debug, Default)]
pub struct Counters {
    /// Critical sections entered.
    pub entries: AtomicU64,
    /// Clients waiting for an acquire answer.
    pub waiting: AtomicU64,
    /// Clients holding.
    pub holding: AtomicU64,
    /// Acquires answered 423 `not_won`.
    pub timeouts: AtomicU64,
    /// Acquires failed otherwise (node down, 503, …).
    pub errors: AtomicU64,
    /// Attempts made through another node than the client's own.
    pub failovers: AtomicU64,
    /// Releases answered 404: the lock had been lost while held.
    pub releases_lost: AtomicU64,
    /// Releases that failed (node gone).
    pub releases_failed: AtomicU64,
    /// Holders that went on holding because their node was paused.
    pub paused_holders: AtomicU64,
}

/// What the clients record.
#[derive(Debug, Default)]
pub struct Records {
    /// Every critical section.
    pub entries: Vec<Cs>,
    /// Latency of every successful acquire, ms.
    pub acquire_ms: Vec<f64>,
    /// A few acquire error messages (the first ones).
    pub sample_errors: Vec<String>,
}

/// Parameters of the workload.
#[derive(Clone, Debug)]
pub struct WorkloadOptions {
    /// Clients.
    pub clients: usize,
    /// Resources.
    pub resources: usize,
    /// Nodes clients are bound to (the initial ones).
    pub nodes: usize,
    /// Time inside the critical section.
    pub hold: Duration,
    /// `timeout_ms` of each acquire.
    pub acquire_timeout_ms: u64,
    /// The first lock is an election: its clients campaign with their id as the value.
    pub election: bool,
    /// Each resource is a semaphore of this many slots (the sections' `resource` is then
    /// `resource * slots + slot`: each slot a lock); `None`: locks.
    pub slots: Option<u16>,
}

/// The name of resource `r`.
pub fn resource_name(r: usize) -> String {
    format!("testnet-r{r}")
}

/// The running clients.
pub struct Workload {
    /// Shared with the clients.
    pub counters: Arc<Counters>,
    /// Shared with the clients.
    pub records: Arc<Mutex<Records>>,
    /// When the workload started (the zero of the recorded times).
    pub start: Instant,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Workload {
    /// Starts the clients.
    pub fn start(opts: &WorkloadOptions, shared: &Shared, client: &reqwest::Client) -> Workload {
        let counters = Arc::new(Counters::default());
        let records = Arc::new(Mutex::new(Records::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        world(shared).phases = vec![Phase::Idle; opts.clients];
        let tasks = (0..opts.clients)
            .map(|k| {
                let c = Client {
                    id: k,
                    home: k % opts.nodes.max(1),
                    resource: k % opts.resources.max(1),
                    opts: opts.clone(),
                    shared: shared.clone(),
                    http: client.clone(),
                    counters: counters.clone(),
                    records: records.clone(),
                    stop: stop.clone(),
                    start,
                };
                tokio::spawn(c.run())
            })
            .collect();
        Workload { counters, records, start, stop, tasks }
    }

    /// Stops the clients: no new acquire; those in flight get `grace` to finish (their
    /// critical section is recorded), then the rest are aborted.
    pub async fn stop(self, grace: Duration) -> (Arc<Counters>, Records) {
        self.stop.store(true, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + grace;
        for mut t in self.tasks {
            if tokio::time::timeout_at(deadline, &mut t).await.is_err() {
                t.abort();
            }
        }
        let records = std::mem::take(&mut *self.records.lock().unwrap_or_else(|e| e.into_inner()));
        (self.counters, records)
    }
}

struct Client {
    id: usize,
    home: usize,
    resource: usize,
    opts: WorkloadOptions,
    shared: Shared,
    http: reqwest::Client,
    counters: Arc<Counters>,
    records: Arc<Mutex<Records>>,
    stop: Arc<AtomicBool>,
    start: Instant,
}

impl Client {
    /// The client's own node if up, else the next one that is.
    fn pick(&self) -> Option<(usize, SocketAddr)> {
        world(&self.shared).up_from(self.home)
    }

    fn set_phase(&self, p: Phase) {
        world(&self.shared).phases[self.id] = p;
    }

    fn records(&self) -> MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn run(self) {
        let name = resource_name(self.resource);
        let c = &self.counters;
        while !self.stop.load(Ordering::SeqCst) {
            let Some((node, addr)) = self.pick() else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            if node != self.home {
                c.failovers.fetch_add(1, Ordering::Relaxed);
            }
            self.set_phase(Phase::Waiting(node));
            c.waiting.fetch_add(1, Ordering::Relaxed);
            let t0 = Instant::now();
            let value = (self.opts.election && self.resource == 0).then(|| format!("client-{}", self.id));
            let (timeout_ms, slots) = (self.opts.acquire_timeout_ms, self.opts.slots);
            let outcome = api::acquire_with(&self.http, addr, &name, timeout_ms, slots, value).await;
            c.waiting.fetch_sub(1, Ordering::Relaxed);
            let (granted, resource) = match outcome {
                Acquire::Granted(g) => match (self.opts.slots, g.slot) {
                    (None, _) => (g, self.resource),
                    (Some(k), Some(slot)) if slot < k => (g, self.resource * usize::from(k) + usize::from(slot)),
                    (Some(_), slot) => {
                        c.errors.fetch_add(1, Ordering::Relaxed);
                        self.records()
                            .sample_errors
                            .push(format!("client {}: a semaphore answer with slot {slot:?}", self.id));
                        self.set_phase(Phase::Idle);
                        continue;
                    }
                },
                Acquire::TimedOut => {
                    c.timeouts.fetch_add(1, Ordering::Relaxed);
                    self.set_phase(Phase::Idle);
                    continue;
                }
                Acquire::Failed(e) => {
                    c.errors.fetch_add(1, Ordering::Relaxed);
                    {
                        let mut r = self.records();
                        if r.sample_errors.len() < 5 {
                            r.sample_errors.push(format!("client {} via node {node}: {e}", self.id));
                        }
                    }
                    self.set_phase(Phase::Idle);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let entered = Instant::now();
            self.set_phase(Phase::Holding(node));
            c.holding.fetch_add(1, Ordering::Relaxed);
            c.entries.fetch_add(1, Ordering::Relaxed);
            let valid_until = entered + Duration::from_millis(granted.valid_for_ms);
            tokio::time::sleep(self.opts.hold).await;
            // Hold on while the node is paused (the chaos supervisor marks the node
            // paused under the same lock in which it sees this client holding).
            let mut extended = false;
            loop {
                {
                    let mut w = world(&self.shared);
                    if w.nodes[node].state != NodeState::Paused {
                        w.phases[self.id] = Phase::Idle;
                        break;
                    }
                }
                extended = true;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if extended {
                c.paused_holders.fetch_add(1, Ordering::Relaxed);
            }
            let exited = Instant::now();
            c.holding.fetch_sub(1, Ordering::Relaxed);
            {
                let mut r = self.records();
                r.entries.push(Cs {
                    client: self.id,
                    resource,
                    node,
                    token: granted.token,
                    enter: entered - self.start,
                    exit: exited - self.start,
                    valid_until: valid_until - self.start,
                });
                r.acquire_ms.push((entered - t0).as_secs_f64() * 1e3);
            }
            match api::release(&self.http, addr, &name, granted.token, &granted.lease).await {
                Release::Released => {}
                Release::NotHeld => {
                    c.releases_lost.fetch_add(1, Ordering::Relaxed);
                }
                Release::Failed(_) => {
                    c.releases_failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.set_phase(Phase::Idle);
    }
}
