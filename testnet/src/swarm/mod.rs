//! `sigma-testnet swarm`: a large swarm in one process, for the scale no machine here can
//! host as processes.
//!
//! Every peer is a `libp2p::Swarm` over the memory transport (plaintext, yamux) with the
//! real `sigma::Behaviour`, connection limits and identify, driven by its own tokio task
//! ([`peer`]). Peers join one after the other through a few random earlier peers
//! (addresses + Kademlia bootstrap, never a full mesh). Then, for `--duration`, peers
//! leave and join at `--churn` per second (a random peer's swarm is dropped and a new
//! peer, with a new key, joins through bootstrap) while client tasks on random peers
//! acquire random locks, hold them briefly and release; churn stops, the clients go on
//! for a settle time, and the swarm is measured ([`measure`]):
//!
//! - Kademlia lookups through the behaviours' own Kademlia (time, requests), and the
//!   hop count of lookups replayed on the routing tables the peers have at the end;
//! - host agreement: of the replica keys hosted, the share hosted by exactly one peer,
//!   the live peer XOR-closest to the key;
//! - keys with two hosts at once during churn and after, and for how long (from each
//!   peer's hosted keys, sampled every [`peer::SAMPLE_EVERY`]);
//! - acquire latency, messages per CS entry (the behaviours' counters), and exclusion
//!   violations (two holders whose validity overlaps: the testnet's checker);
//! - the membership figures of `sim membership` ([`membership`]): gossip bytes a peer a
//!   second and connections opened a peer a minute, forming, under churn and settling;
//!   how long a churned-out peer stays alive in the views; false removals; each against
//!   its goal.
//!
//! Randomness (keys, bootstrap peers, churn victims, clients' choices) comes from ChaCha8
//! seeded by `--seed`; the tokio scheduling is not deterministic, so a seed reproduces
//! the schedule, not every interleaving.

pub mod cli;
pub mod measure;
pub mod membership;
pub mod peer;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libp2p::identity::Keypair;
use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use sigma_behaviour::{proto, Config, Counters, Readiness};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use self::measure::{quantile, Agreement, DoubleHosts};
use self::membership::{Goal, Rates, Spread, END, MAX_KILLS, PHASES, PHASE_NAMES};
use self::peer::{Command, Final, LookupStats, Outcome, PeerSpec, Span};
use crate::testnet::check::{self, Cs};

/// Kademlia's k (libp2p's default replication factor) and α (parallelism).
const K: usize = 20;
const ALPHA: usize = 3;
/// Peers a newcomer is given to bootstrap from.
const BOOTSTRAP_PEERS: usize = 3;
/// A measured lookup that takes longer is left out (Kademlia's own timeout is 60 s).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Lookups replayed on the routing tables at the end.
const REPLAYS: usize = 1000;

/// The name of resource `r`.
pub fn resource_name(r: usize) -> String {
    format!("swarm-r{r}")
}

/// The index of a resource named by [`resource_name`].
pub fn resource_index(name: &str) -> Option<usize> {
    name.strip_prefix("swarm-r")?.parse().ok()
}

/// Memory-transport ports: process-wide, so that two runs in one process (tests) never
/// collide.
static NEXT_PORT: AtomicU64 = AtomicU64::new(1 << 40);

/// What a run does.
#[derive(Clone, Debug)]
pub struct SwarmOptions {
    /// Peers (kept constant: every departure comes with a join).
    pub peers: usize,
    /// Churn and workload.
    pub duration: Duration,
    /// Replacements per second (a peer leaves and a new one joins).
    pub churn: f64,
    /// Client tasks.
    pub clients: usize,
    /// Locks (`swarm-r0`, `swarm-r1`, …).
    pub resources: usize,
    /// Seed of every random choice.
    pub seed: u64,
    /// Replicas per lock and votes to win.
    pub n: usize,
    pub m: usize,
    /// Time in the critical section.
    pub hold: Duration,
    /// A client waits up to twice this between two acquisitions (uniform).
    pub think: Duration,
    /// An acquisition not won within this is abandoned.
    pub acquire_timeout: Duration,
    /// Established connections per peer at most.
    pub max_connections: u32,
    /// Peers started per second while the swarm forms.
    pub join_rate: f64,
    /// The swarm must serve (every peer) within this, or the run goes on and says so.
    pub form_timeout: Duration,
    /// Lookups through Kademlia after convergence.
    pub lookups: usize,
    /// The clocks of the behaviour.
    pub timing: Timing,
}

/// The timing in force, chosen for the swarm's size and the 2 cores it runs on.
#[derive(Clone, Debug, Serialize)]
pub struct Timing {
    /// Lease of a vote.
    pub lease: Duration,
    /// Membership gossip: round interval and liveness (fanout 2).
    pub gossip: Duration,
    pub liveness: Duration,
    /// Liveness pings: interval, timeout.
    pub ping: Duration,
    pub ping_timeout: Duration,
    /// How often a hosted key's ownership is looked up again.
    pub ownership_ttl: Duration,
    /// Idle connections close after this.
    pub idle: Duration,
    /// Clients go on after churn stops, before the swarm is measured.
    pub settle: Duration,
}

impl Timing {
    /// The node's defaults where a thousand peers on two cores can afford them; slower
    /// gossip and pings beyond a few hundred peers: every gossip message carries the
    /// whole table (≈ 80 bytes per member), and every connection is pinged.
    pub fn for_peers(peers: usize, lease: Duration) -> Timing {
        let (gossip, liveness, ping, ping_timeout) = if peers <= 150 {
            (Duration::from_millis(500), Duration::from_secs(5), Duration::from_secs(1), Duration::from_secs(3))
        } else {
            let gossip = Duration::from_millis(500).mul_f64((peers as f64 / 150.0).min(6.0));
            (gossip, gossip * 10, Duration::from_secs(5), Duration::from_secs(10))
        };
        let ownership_ttl = Duration::from_secs(30);
        let mut t = Timing {
            lease,
            gossip,
            liveness,
            ping,
            ping_timeout,
            ownership_ttl,
            idle: Duration::from_secs(10),
            settle: Duration::ZERO,
        };
        t.settle = t.default_settle();
        t
    }

    /// Long enough for a churned-in peer to be alive everywhere and for every hosted
    /// key's ownership to be looked up again: the ownership TTL plus the liveness timeout
    /// plus 2 s.
    pub fn default_settle(&self) -> Duration {
        self.ownership_ttl + self.liveness_timeout() + Duration::from_secs(2)
    }

    /// The behaviour's configuration for a peer that bootstraps (`joining`) or not.
    pub fn config(&self, n: usize, m: usize, joining: bool) -> Config {
        Config::default()
            .with_protocol(proto::Config::default().with_quorum(n, m).with_lease(self.lease))
            .with_joining(joining)
            .with_ping(self.ping, self.ping_timeout)
            .with_gossip(self.gossip, sigma_behaviour::DEFAULT_GOSSIP_FANOUT, self.liveness)
            .with_ownership(self.ownership_ttl, Duration::from_secs(2))
    }

    /// The behaviour's liveness timeout under this timing.
    pub fn liveness_timeout(&self) -> Duration {
        self.config(3, 2, false).liveness_timeout()
    }

    /// The behaviour's takeover delay under this timing.
    pub fn takeover_delay(&self) -> Duration {
        self.config(3, 2, false).takeover_delay()
    }
}

/// What the peers record, shared by their tasks.
pub struct Shared {
    /// The run's start: every recorded time is since then.
    pub start: Instant,
    /// Critical sections (enter at the win, exit at release, loss or departure).
    pub records: Mutex<Vec<Cs>>,
    /// Acquire latencies (acquire called → `Event::Acquired`).
    pub latencies: Mutex<Vec<Duration>>,
    /// Closed hosting spans.
    pub spans: Mutex<Vec<Span>>,
    /// Keys each live peer hosted at its last sample.
    pub hosted: Mutex<HashMap<usize, Vec<(usize, u16)>>>,
    /// Counters of every stopped peer.
    pub finals: Mutex<Vec<Final>>,
    /// Locks lost while held (`Event::Lost`).
    pub lost: AtomicU64,
    /// Connections established, denied by the limits, failed to dial otherwise.
    pub connections: ConnectionCounts,
    /// The peers alive, for the clients.
    live: Mutex<Vec<LivePeer>>,
    /// The phase in force: forming, churn, settling ([`membership::PHASES`]), then
    /// [`membership::END`].
    pub phase: AtomicUsize,
    /// Peers killed by churn, with when (since the start); at most [`MAX_KILLS`].
    pub kills: Mutex<HashMap<PeerId, Duration>>,
    /// Per view that dropped a killed peer: the peer, the time since its kill (at most
    /// [`membership::MAX_DETECTIONS`]).
    pub detections: Mutex<Vec<(PeerId, Duration)>>,
    /// Peers up dropped from a view after formation.
    pub false_removals: AtomicU64,
    /// Views that still held a killed peer alive at the end.
    pub undetected: AtomicU64,
}

/// Connection events of all peers.
#[derive(Debug, Default)]
pub struct ConnectionCounts {
    pub established: AtomicU64,
    pub denied: AtomicU64,
    pub dial_errors: AtomicU64,
    /// Connections closed: idle (keep-alive timeout), on an I/O error, or closed here
    /// (trimmed, a duplicate dropped, the peer leaving); each side counts its own.
    pub closed_idle: AtomicU64,
    pub closed_error: AtomicU64,
    pub closed_local: AtomicU64,
    /// Connections dialled and established, by the phase in force.
    pub opened: [AtomicU64; PHASES + 1],
}

/// A live peer as the clients see it.
#[derive(Clone)]
struct LivePeer {
    index: usize,
    peer: PeerId,
    addr: Multiaddr,
    commands: mpsc::Sender<Command>,
    serving: Arc<AtomicBool>,
}

/// What the orchestrator keeps of a live peer.
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// The swarm: starts and stops peers.
struct Net {
    opts: SwarmOptions,
    shared: Arc<Shared>,
    running: HashMap<usize, Running>,
    stopped: Vec<JoinHandle<()>>,
    next_index: usize,
    joined: usize,
    left: usize,
}

impl Net {
    fn live(&self) -> Vec<LivePeer> {
        self.shared.live.lock().expect("live").clone()
    }

    /// Starts a peer with a new key, bootstrapping from a few random live peers (none
    /// for the first).
    fn spawn(&mut self, rng: &mut ChaCha8Rng) -> anyhow::Result<()> {
        let live = self.live();
        let mut bootstrap = Vec::new();
        for _ in 0..BOOTSTRAP_PEERS.min(live.len()) {
            let p = &live[rng.gen_range(0..live.len())];
            if !bootstrap.iter().any(|(q, _)| *q == p.peer) {
                bootstrap.push((p.peer, p.addr.clone()));
            }
        }
        let index = self.next_index;
        self.next_index += 1;
        let keypair = Keypair::ed25519_from_bytes(rng.gen::<[u8; 32]>())?;
        let port = NEXT_PORT.fetch_add(1, Ordering::Relaxed);
        let addr = Multiaddr::empty().with(Protocol::Memory(port));
        let t = &self.opts.timing;
        let spec = PeerSpec {
            index,
            keypair,
            addr: addr.clone(),
            config: t.config(self.opts.n, self.opts.m, !bootstrap.is_empty()),
            bootstrap,
            max_connections: self.opts.max_connections,
            idle_timeout: t.idle,
        };
        let swarm = peer::build(&spec)?;
        let peer = *swarm.local_peer_id();
        let (commands, rx) = mpsc::channel(peer::COMMAND_QUEUE);
        let (stop, stop_rx) = oneshot::channel();
        let serving = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(peer::run(spec, swarm, rx, stop_rx, serving.clone(), self.shared.clone()));
        self.shared.live.lock().expect("live").push(LivePeer { index, peer, addr, commands, serving });
        self.running.insert(index, Running { stop, task });
        Ok(())
    }

    /// Drops the swarm of a random live peer.
    fn kill(&mut self, rng: &mut ChaCha8Rng) {
        let victim = {
            let mut live = self.shared.live.lock().expect("live");
            if live.len() <= BOOTSTRAP_PEERS {
                return;
            }
            let at = rng.gen_range(0..live.len());
            let victim = live.swap_remove(at);
            let mut kills = self.shared.kills.lock().expect("kills");
            if kills.len() < MAX_KILLS {
                kills.insert(victim.peer, self.shared.start.elapsed());
            }
            victim.index
        };
        if let Some(r) = self.running.remove(&victim) {
            let _ = r.stop.send(());
            self.stopped.push(r.task);
            self.left += 1;
        }
    }

    /// Why the live peers that do not serve do not: (joining, in a minority). Every
    /// peer is asked at once (one after the other, a busy 1,000-peer swarm took minutes
    /// to answer).
    async fn not_serving(&self) -> (usize, usize) {
        let asks = self.live().into_iter().map(|p| async move {
            let (reply, answer) = oneshot::channel();
            p.commands.send(Command::Readiness { reply }).await.ok()?;
            answer.await.ok()
        });
        let mut why = (0, 0);
        for readiness in futures::future::join_all(asks).await {
            match readiness {
                Some(Readiness::Joining) => why.0 += 1,
                // Short of a joint quorum: a majority of its members, not of its view
                // before a recent join; counted with the minority.
                Some(Readiness::Minority { .. } | Readiness::Joint { .. } | Readiness::Half { .. }) => why.1 += 1,
                _ => {}
            }
        }
        why
    }

    /// Share of the live peers that serve.
    fn serving(&self) -> (usize, usize) {
        let live = self.shared.live.lock().expect("live");
        (live.iter().filter(|p| p.serving.load(Ordering::Relaxed)).count(), live.len())
    }

    /// Stops every peer and waits for their tasks.
    async fn stop_all(&mut self) {
        self.shared.live.lock().expect("live").clear();
        for (_, r) in self.running.drain() {
            let _ = r.stop.send(());
            self.stopped.push(r.task);
        }
        for t in self.stopped.drain(..) {
            let _ = t.await;
        }
    }
}

/// Sums counters by reason over the peers.
fn by_reason(finals: &[Final], f: impl Fn(&Counters) -> &BTreeMap<&'static str, u64>) -> BTreeMap<String, u64> {
    let mut all = BTreeMap::new();
    for x in finals {
        for (k, v) in f(&x.counters) {
            *all.entry((*k).to_owned()).or_default() += v;
        }
    }
    all
}

/// How often the formation's progress is printed (stderr).
const FORM_PROGRESS: Duration = Duration::from_secs(10);

/// Picks a random live peer that serves.
fn pick(shared: &Shared, rng: &mut ChaCha8Rng) -> Option<LivePeer> {
    let live = shared.live.lock().expect("live");
    let serving: Vec<&LivePeer> = live.iter().filter(|p| p.serving.load(Ordering::Relaxed)).collect();
    (!serving.is_empty()).then(|| serving[rng.gen_range(0..serving.len())].clone())
}

/// What a client saw.
#[derive(Clone, Copy, Debug, Default)]
struct ClientStats {
    entries: u64,
    timed_out: u64,
    refused: u64,
    peer_gone: u64,
}

/// A client: on a random serving peer, a random lock each time; acquire, hold, release, think.
async fn client(
    id: usize,
    seed: u64,
    opts: SwarmOptions,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> ClientStats {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (id as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut stats = ClientStats::default();
    let pause = |d: Duration, stop: &mut watch::Receiver<bool>| {
        let mut stop = stop.clone();
        async move {
            tokio::select! {
                _ = tokio::time::sleep(d) => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        }
    };
    // A client stays on its peer (an application beside its node) until the peer leaves
    // or stops serving: hosts then see a bounded set of client peers, not every peer.
    let mut on: Option<LivePeer> = None;
    while !*stop.borrow() {
        if on.as_ref().is_none_or(|p| p.commands.is_closed() || !p.serving.load(Ordering::Relaxed)) {
            on = pick(&shared, &mut rng);
        }
        let Some(peer) = on.clone() else {
            pause(Duration::from_millis(100), &mut stop).await;
            continue;
        };
        let resource = rng.gen_range(0..opts.resources);
        let (reply, answer) = oneshot::channel();
        let deadline = Instant::now() + opts.acquire_timeout;
        if peer.commands.send(Command::Acquire { client: id, resource, deadline, reply }).await.is_err() {
            continue;
        }
        let outcome = tokio::select! {
            o = answer => o,
            _ = stop.wait_for(|s| *s) => break, // the peer abandons it once it sees the reply gone
        };
        match outcome {
            Ok(Outcome::Acquired(id)) => {
                stats.entries += 1;
                tokio::time::sleep(opts.hold).await;
                let _ = peer.commands.send(Command::Release { id }).await;
            }
            Ok(Outcome::TimedOut) => stats.timed_out += 1,
            Ok(Outcome::Refused(_)) => {
                stats.refused += 1;
                pause(Duration::from_millis(100), &mut stop).await;
            }
            Err(_) => stats.peer_gone += 1,
        }
        if !opts.think.is_zero() {
            let think = opts.think.mul_f64(rng.gen_range(0.0..2.0));
            pause(think, &mut stop).await;
        }
    }
    stats
}

/// One lookup through a random serving peer's Kademlia.
async fn lookup(shared: &Shared, rng: &mut ChaCha8Rng, i: usize) -> Option<LookupStats> {
    let peer = pick(shared, rng)?;
    let (reply, answer) = oneshot::channel();
    let key = format!("lookup-{i}-{}", rng.gen::<u64>()).into_bytes();
    peer.commands.send(Command::Lookup { key, reply }).await.ok()?;
    tokio::time::timeout(LOOKUP_TIMEOUT, answer).await.ok()?.ok()
}

/// The report of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub seed: u64,
    pub peers: usize,
    pub n: usize,
    pub m: usize,
    pub churn_per_s: f64,
    pub duration_s: f64,
    pub clients: usize,
    pub resources: usize,
    pub max_connections: u32,
    pub timing: Timing,
    pub takeover_delay_s: f64,
    /// Seconds until every peer served (or the form timeout), and how many did.
    pub formed_s: f64,
    pub formed_serving: usize,
    pub left: usize,
    pub joined: usize,
    /// Serving share of the live peers, sampled every second during churn: lowest, mean.
    pub serving_min_pct: f64,
    pub serving_mean_pct: f64,
    /// Serving at the end, of the live peers.
    pub serving_end: usize,
    pub live_end: usize,
    /// Of the live peers that did not serve at the end: still joining, in a minority
    /// (or short of a joint quorum).
    pub joining_end: usize,
    pub minority_end: usize,
    /// Each peer's view at the end: members, and of them alive (this peer included).
    pub members_p50: f64,
    pub members_min: f64,
    pub alive_p50: f64,
    pub alive_min: f64,
    /// Kademlia lookups after convergence: count, time p50/p99 (ms), requests per lookup.
    pub lookups: usize,
    pub lookup_ms_p50: f64,
    pub lookup_ms_p99: f64,
    pub lookup_requests_mean: f64,
    /// Lookups replayed on the final routing tables: hops p50, mean, max; share that
    /// reached the closest live peer; routing table size p50.
    pub replay_hops_p50: f64,
    pub replay_hops_mean: f64,
    pub replay_hops_max: f64,
    pub replay_reached_pct: f64,
    pub routing_table_p50: f64,
    /// Share of the live peers' routing-table entries that name a departed peer.
    pub routing_table_departed_pct: f64,
    /// log₂(N / k) + 1.
    pub hops_estimate: f64,
    pub agreement: Agreement,
    pub two_hosts_churn: DoubleHosts,
    pub two_hosts_settle: DoubleHosts,
    pub entries: usize,
    pub timed_out: u64,
    pub refused: u64,
    pub lost: u64,
    pub acquire_ms_p50: f64,
    pub acquire_ms_p99: f64,
    pub messages_per_entry: f64,
    /// Transport requests per CS entry (a batch to one peer counts one; gossip and
    /// Kademlia not included).
    pub requests_per_entry: f64,
    pub violations: usize,
    pub expired_overlaps: usize,
    pub token_regressions: usize,
    pub stalls: u64,
    pub ping_failures: u64,
    pub dropped_not_serving: u64,
    pub ownership_checks: u64,
    pub ownership_lost: u64,
    /// Kademlia bootstraps cut to their self-lookup (joins, and refreshes too soon).
    pub bootstraps_cut: u64,
    /// Kademlia requests sent, by the purpose of their query.
    pub kad_requests: BTreeMap<String, u64>,
    pub handed_over: u64,
    pub replicas_held: u64,
    pub gossip_failures: u64,
    /// Requests refused by hosts, responses refused by clients, outbound request
    /// failures: by reason, over all peers.
    pub rejected: BTreeMap<String, u64>,
    pub responses_refused: BTreeMap<String, u64>,
    pub failures: BTreeMap<String, u64>,
    /// Redirects followed and host lookups started by clients.
    pub redirects: u64,
    pub host_lookups: u64,
    /// Connections established, denied by the limits, other dial failures (all peers);
    /// most established at once on one peer: p50 and max over the peers.
    pub connections: u64,
    /// Peers disconnected by the connection watermarks (all peers).
    pub trimmed: u64,
    pub denied: u64,
    pub dial_errors: u64,
    /// Connections closed (each side counts its own): idle, on an error, closed here.
    pub closed: [u64; 3],
    pub max_established_p50: f64,
    pub max_established: f64,
    /// Seconds of each phase: forming, churn, settling.
    pub phase_s: [f64; PHASES],
    /// The membership's cost per peer in each phase.
    pub membership: Vec<Rates>,
    /// Peers killed by churn (at most [`MAX_KILLS`] followed).
    pub kills: usize,
    /// Per view that had a killed peer and dropped it: the time from the kill; per
    /// killed peer: until the last view that dropped it did.
    pub detection: Spread,
    pub detection_everywhere: Spread,
    /// Views that still held a killed peer alive at the end.
    pub undetected: u64,
    /// Peers up dropped from a view after formation (churn and settling).
    pub false_removals: u64,
    pub wall_s: f64,
}

impl Report {
    /// Peer-hours after formation (churn and settling): the false removals' exposure.
    pub fn peer_hours(&self) -> f64 {
        self.membership.iter().skip(1).map(|r| r.peer_s).sum::<f64>() / 3600.0
    }

    /// The membership's figures against the goals of issue 37, as `sim membership`
    /// prints them: traffic and connections once settled (no churn), connections under
    /// churn, a killed peer out of every view, false removals, formation.
    pub fn goals(&self) -> Vec<Goal> {
        let settled = &self.membership[2];
        let (bound, goal) = if self.peers <= 1_000 {
            (1_000.0, "≤ 1 KB/s a peer at 1,000 peers")
        } else {
            (1_500.0, "≤ 1.5 KB/s a peer at 10,000 peers")
        };
        let mut goals = vec![
            Goal {
                what: "membership traffic (settling, no churn)".into(),
                figure: format!(
                    "{:.1} KB/s a peer sent (p99 {}), {:.1} received",
                    settled.bytes_out_per_s / 1e3,
                    settled.bytes_out_per_s_p99.map_or("-".into(), |p| format!("{:.1}", p / 1e3)),
                    settled.bytes_in_per_s / 1e3
                ),
                goal,
                met: settled.bytes_out_per_s <= bound,
            },
            Goal {
                what: "connections opened (settling, no churn)".into(),
                figure: format!("{:.1} a peer a minute", settled.opened_per_min),
                goal: "≤ 1 a peer a minute",
                met: settled.opened_per_min <= 1.0,
            },
        ];
        if self.churn_per_s > 0.0 {
            goals.push(Goal {
                what: format!("connections opened (churn {}/s)", self.churn_per_s),
                figure: format!("{:.1} a peer a minute", self.membership[1].opened_per_min),
                goal: "≤ 10 a peer a minute, churn 1/s at 1,000",
                met: self.membership[1].opened_per_min <= 10.0,
            });
        }
        let d = &self.detection_everywhere;
        goals.push(Goal {
            what: "killed peer out of every view".into(),
            figure: if d.n == 0 {
                "no peer killed".into()
            } else {
                format!("p50 {:.1} s, p99 {:.1} s ({} kills, {} views never)", d.p50, d.p99, d.n, self.undetected)
            },
            goal: "p50 ≤ 2 s, p99 ≤ 5 s",
            met: d.n > 0 && d.p50 <= 2.0 && d.p99 <= 5.0 && self.undetected == 0,
        });
        let hours = self.peer_hours();
        let upper = membership::poisson_upper_95(self.false_removals) / hours.max(1e-9) * 1e4;
        goals.push(Goal {
            what: "false removals (after formation)".into(),
            figure: format!("{} in {:.2} peer-hours (≤ {:.0} per 10,000 at 95%)", self.false_removals, hours, upper),
            goal: "≤ 1 per 10,000 peer-hours",
            met: upper <= 1.0,
        });
        goals.push(Goal {
            what: "formation (every peer serving)".into(),
            figure: if self.formed_serving >= self.peers {
                format!("{:.1} s", self.formed_s)
            } else {
                format!("{}/{} serving after {:.1} s", self.formed_serving, self.peers, self.formed_s)
            },
            goal: "≤ 20 s at 1,000 in-process peers",
            met: self.formed_serving >= self.peers && self.formed_s <= 20.0,
        });
        goals
    }
}

/// Runs the swarm and measures it.
pub async fn run(opts: &SwarmOptions) -> anyhow::Result<Report> {
    anyhow::ensure!(opts.peers > BOOTSTRAP_PEERS, "at least {} peers", BOOTSTRAP_PEERS + 1);
    anyhow::ensure!(opts.resources > 0 && opts.clients > 0, "at least one resource and one client");
    proto::Config::default().with_quorum(opts.n, opts.m).validate()?;
    let shared = Arc::new(Shared {
        start: Instant::now(),
        records: Mutex::new(Vec::new()),
        latencies: Mutex::new(Vec::new()),
        spans: Mutex::new(Vec::new()),
        hosted: Mutex::new(HashMap::new()),
        finals: Mutex::new(Vec::new()),
        lost: AtomicU64::new(0),
        connections: ConnectionCounts::default(),
        live: Mutex::new(Vec::new()),
        phase: AtomicUsize::new(0),
        kills: Mutex::new(HashMap::new()),
        detections: Mutex::new(Vec::new()),
        false_removals: AtomicU64::new(0),
        undetected: AtomicU64::new(0),
    });
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let mut net = Net {
        opts: opts.clone(),
        shared: shared.clone(),
        running: HashMap::new(),
        stopped: Vec::new(),
        next_index: 0,
        joined: 0,
        left: 0,
    };

    // Formation: one peer after the other, each through a few earlier ones.
    let gap = Duration::from_secs_f64(1.0 / opts.join_rate.max(0.1));
    let begin = Instant::now();
    for i in 0..opts.peers {
        net.spawn(&mut rng)?;
        tokio::time::sleep_until((begin + gap * (i as u32 + 1)).into()).await;
    }
    let form_deadline = begin + opts.form_timeout;
    let mut next_progress = Instant::now() + FORM_PROGRESS;
    loop {
        let (serving, live) = net.serving();
        if serving == live || Instant::now() >= form_deadline {
            break;
        }
        if Instant::now() >= next_progress {
            next_progress += FORM_PROGRESS;
            let why = match tokio::time::timeout(FORM_PROGRESS, net.not_serving()).await {
                Ok((joining, minority)) => format!("{joining} joining, {minority} in a minority"),
                Err(_) => format!("no answer on readiness within {FORM_PROGRESS:?}"),
            };
            eprintln!("  forming: {serving}/{live} peers serving after {:.0} s ({why})", begin.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let formed_s = begin.elapsed().as_secs_f64();
    let formed_serving = net.serving().0;

    // Churn and clients.
    shared.phase.store(1, Ordering::Relaxed);
    let (stop_clients, stop_rx) = watch::channel(false);
    let clients: Vec<JoinHandle<ClientStats>> = (0..opts.clients)
        .map(|c| tokio::spawn(client(c, opts.seed, opts.clone(), shared.clone(), stop_rx.clone())))
        .collect();
    let churn_start = shared.start.elapsed();
    let churn_end_at = Instant::now() + opts.duration;
    let churn_gap = (opts.churn > 0.0).then(|| Duration::from_secs_f64(1.0 / opts.churn));
    let mut next_churn = churn_gap.map(|g| Instant::now() + g);
    let mut next_sample = Instant::now() + Duration::from_secs(1);
    let mut shares = Vec::new();
    loop {
        let now = Instant::now();
        if now >= churn_end_at {
            break;
        }
        if next_churn.is_some_and(|t| now >= t) {
            net.kill(&mut rng);
            net.spawn(&mut rng)?;
            net.joined += 1;
            next_churn = next_churn.zip(churn_gap).map(|(t, g)| t + g);
        }
        if now >= next_sample {
            let (serving, live) = net.serving();
            shares.push(100.0 * serving as f64 / live.max(1) as f64);
            next_sample += Duration::from_secs(1);
        }
        let wake = [Some(next_sample), next_churn, Some(churn_end_at)].into_iter().flatten().min();
        tokio::time::sleep_until(wake.unwrap_or(churn_end_at).into()).await;
    }
    let churn_end = shared.start.elapsed();

    // Settle: the clients go on without churn, then stop.
    shared.phase.store(2, Ordering::Relaxed);
    tokio::time::sleep(opts.timing.settle).await;
    let settle_end = shared.start.elapsed();
    shared.phase.store(END, Ordering::Relaxed);
    let _ = stop_clients.send(true);
    let mut cstats = ClientStats::default();
    for c in clients {
        let s = c.await.unwrap_or_default();
        cstats.entries += s.entries;
        cstats.timed_out += s.timed_out;
        cstats.refused += s.refused;
        cstats.peer_gone += s.peer_gone;
    }
    // Every peer samples its hosted keys again.
    tokio::time::sleep(peer::SAMPLE_EVERY * 2).await;

    // Host agreement.
    let live = net.live();
    let live_ids: HashMap<usize, PeerId> = live.iter().map(|p| (p.index, p.peer)).collect();
    let agreement = {
        let hosted = shared.hosted.lock().expect("hosted");
        measure::agreement(&hosted, &live_ids, opts.resources, opts.n)
    };
    let (serving_end, live_end) = net.serving();
    let (joining_end, minority_end) = net.not_serving().await;

    // Lookups through Kademlia, a few at a time.
    let mut lookups: Vec<LookupStats> = Vec::new();
    for batch in (0..opts.lookups).collect::<Vec<_>>().chunks(8) {
        let mut tasks = Vec::new();
        for &i in batch {
            let (shared, mut r) = (shared.clone(), ChaCha8Rng::seed_from_u64(rng.gen()));
            tasks.push(tokio::spawn(async move { lookup(&shared, &mut r, i).await }));
        }
        for t in tasks {
            if let Ok(Some(s)) = t.await {
                lookups.push(s);
            }
        }
    }

    // Routing tables, and lookups replayed on them.
    let mut tables: HashMap<PeerId, Vec<PeerId>> = HashMap::new();
    for p in &live {
        let (reply, answer) = oneshot::channel();
        if p.commands.send(Command::RoutingTable { reply }).await.is_ok() {
            if let Ok(t) = answer.await {
                tables.insert(p.peer, t);
            }
        }
    }
    let alive: HashSet<PeerId> = live.iter().map(|p| p.peer).collect();
    let peers: Vec<PeerId> = live.iter().map(|p| p.peer).collect();
    let mut hops = Vec::new();
    let mut reached = 0usize;
    for i in 0..REPLAYS {
        let from = peers[rng.gen_range(0..peers.len())];
        let key = libp2p::kad::KBucketKey::new(format!("replay-{i}-{}", rng.gen::<u64>()).into_bytes());
        let r = measure::replay_lookup(&tables, &alive, from, &key, K, ALPHA);
        if let Some(h) = r.hops {
            reached += 1;
            hops.push(h as f64);
        }
    }
    hops.sort_by(f64::total_cmp);
    let mut table_sizes: Vec<f64> = tables.values().map(|t| t.len() as f64).collect();
    table_sizes.sort_by(f64::total_cmp);
    let entries: usize = tables.values().map(Vec::len).sum();
    let departed_entries = tables.values().flatten().filter(|p| !alive.contains(*p)).count();

    net.stop_all().await;

    // Figures.
    let records = shared.records.lock().expect("records").clone();
    let findings = check::check(&records, opts.resources, opts.clients);
    let mut latencies: Vec<f64> =
        shared.latencies.lock().expect("latencies").iter().map(|d| d.as_secs_f64() * 1e3).collect();
    latencies.sort_by(f64::total_cmp);
    let spans = shared.spans.lock().expect("spans").clone();
    let finals = shared.finals.lock().expect("finals").clone();
    let sum = |f: &dyn Fn(&Counters) -> u64| finals.iter().map(|x| f(&x.counters)).sum::<u64>();
    let completed = sum(&|c| c.completed);
    let messages = sum(&|c| c.completed_messages);
    // The views of the peers alive at the end.
    let ends: Vec<&Final> = finals.iter().filter(|f| live_ids.contains_key(&f.index)).collect();
    let view = |f: &dyn Fn(&Counters) -> usize| {
        let mut v: Vec<f64> = ends.iter().map(|x| f(&x.counters) as f64).collect();
        v.sort_by(f64::total_cmp);
        (quantile(&v, 0.5), v.first().copied().unwrap_or(f64::NAN))
    };
    let (members_p50, members_min) = view(&|c| c.members);
    let (alive_p50, alive_min) = view(&|c| c.reachable_members);
    let mut conns: Vec<f64> = finals.iter().map(|f| f64::from(f.max_established)).collect();
    conns.sort_by(f64::total_cmp);
    let mut lookup_ms: Vec<f64> = lookups.iter().map(|l| l.time.as_secs_f64() * 1e3).collect();
    lookup_ms.sort_by(f64::total_cmp);
    let mean = |v: &[f64]| if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 };
    let ledgers: Vec<membership::Ledger> = finals.iter().map(|f| f.ledger).collect();
    let membership: Vec<Rates> = (0..PHASES)
        .map(|p| membership::rates(&ledgers, p, shared.connections.opened[p].load(Ordering::Relaxed)))
        .collect();
    let (detection, detection_everywhere) = membership::detection(&shared.detections.lock().expect("detections"));
    let kills = shared.kills.lock().expect("kills").len();

    Ok(Report {
        seed: opts.seed,
        peers: opts.peers,
        n: opts.n,
        m: opts.m,
        churn_per_s: opts.churn,
        duration_s: opts.duration.as_secs_f64(),
        clients: opts.clients,
        resources: opts.resources,
        max_connections: opts.max_connections,
        timing: opts.timing.clone(),
        takeover_delay_s: opts.timing.takeover_delay().as_secs_f64(),
        formed_s,
        formed_serving,
        left: net.left,
        joined: net.joined,
        serving_min_pct: shares.iter().copied().fold(f64::NAN, f64::min),
        serving_mean_pct: mean(&shares),
        serving_end,
        live_end,
        joining_end,
        minority_end,
        members_p50,
        members_min,
        alive_p50,
        alive_min,
        lookups: lookups.len(),
        lookup_ms_p50: quantile(&lookup_ms, 0.5),
        lookup_ms_p99: quantile(&lookup_ms, 0.99),
        lookup_requests_mean: mean(&lookups.iter().map(|l| f64::from(l.requests)).collect::<Vec<_>>()),
        replay_hops_p50: quantile(&hops, 0.5),
        replay_hops_mean: mean(&hops),
        replay_hops_max: hops.last().copied().unwrap_or(f64::NAN),
        replay_reached_pct: 100.0 * reached as f64 / REPLAYS as f64,
        routing_table_p50: quantile(&table_sizes, 0.5),
        routing_table_departed_pct: 100.0 * departed_entries as f64 / entries.max(1) as f64,
        hops_estimate: (opts.peers as f64 / K as f64).log2() + 1.0,
        agreement,
        two_hosts_churn: measure::double_hosts(&spans, churn_start, churn_end),
        two_hosts_settle: measure::double_hosts(&spans, churn_end, settle_end),
        entries: records.len(),
        timed_out: cstats.timed_out,
        refused: cstats.refused,
        lost: shared.lost.load(Ordering::Relaxed),
        acquire_ms_p50: quantile(&latencies, 0.5),
        acquire_ms_p99: quantile(&latencies, 0.99),
        messages_per_entry: messages as f64 / completed.max(1) as f64,
        requests_per_entry: sum(&|c| c.requests_out) as f64 / completed.max(1) as f64,
        violations: findings.violations.len(),
        expired_overlaps: findings.expired_overlaps.len(),
        token_regressions: findings.token_regressions.len(),
        stalls: sum(&|c| c.stalls),
        ping_failures: sum(&|c| c.ping_failures),
        trimmed: sum(&|c| c.connections_trimmed),
        dropped_not_serving: sum(&|c| c.replicas_dropped_not_serving),
        ownership_checks: sum(&|c| c.ownership_checks),
        ownership_lost: sum(&|c| c.ownership_lost),
        bootstraps_cut: sum(&|c| c.bootstraps_cut),
        kad_requests: by_reason(&finals, |c| &c.kad_requests),
        handed_over: sum(&|c| c.replicas_handed_over),
        replicas_held: sum(&|c| c.replicas_held),
        gossip_failures: sum(&|c| c.outbound_failures.get("gossip").copied().unwrap_or(0)),
        rejected: by_reason(&finals, |c| &c.rejected),
        responses_refused: by_reason(&finals, |c| &c.responses_refused),
        failures: by_reason(&finals, |c| &c.outbound_failures),
        redirects: sum(&|c| c.redirects_followed),
        host_lookups: sum(&|c| c.lookups),
        connections: shared.connections.established.load(Ordering::Relaxed),
        denied: shared.connections.denied.load(Ordering::Relaxed),
        dial_errors: shared.connections.dial_errors.load(Ordering::Relaxed),
        closed: [
            shared.connections.closed_idle.load(Ordering::Relaxed),
            shared.connections.closed_error.load(Ordering::Relaxed),
            shared.connections.closed_local.load(Ordering::Relaxed),
        ],
        max_established_p50: quantile(&conns, 0.5),
        max_established: conns.last().copied().unwrap_or(f64::NAN),
        phase_s: [formed_s, (churn_end - churn_start).as_secs_f64(), (settle_end - churn_end).as_secs_f64()],
        membership,
        kills,
        detection,
        detection_everywhere,
        undetected: shared.undetected.load(Ordering::Relaxed),
        false_removals: shared.false_removals.load(Ordering::Relaxed),
        wall_s: shared.start.elapsed().as_secs_f64(),
    })
}

fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s} s")
    } else {
        format!("{:.0} ms", s * 1e3)
    }
}

/// The summary printed by `sigma-testnet swarm`.
pub fn render(r: &Report) -> String {
    let t = &r.timing;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "sigma-testnet swarm: {} peers in one process (memory transport, plaintext, yamux), n={} m={}, seed {}",
        r.peers, r.n, r.m, r.seed
    );
    let _ = writeln!(
        s,
        "  timing: lease {}, gossip every {} (fanout 2, liveness {}), pings {}/{}, ownership re-lookup {}, takeover \
         delay {:.1} s, idle connections closed after {}; chosen for {} peers on 2 cores",
        secs(t.lease),
        secs(t.gossip),
        secs(t.liveness),
        secs(t.ping),
        secs(t.ping_timeout),
        secs(t.ownership_ttl),
        r.takeover_delay_s,
        secs(t.idle),
        r.peers
    );
    let _ = writeln!(s, "  formed: {}/{} peers serving after {:.1} s", r.formed_serving, r.peers, r.formed_s);
    let _ = writeln!(
        s,
        "  churn: {:.0} s at {}/s ({} left, {} joined), {} clients on {} locks; serving: lowest {:.1}%, mean {:.1}% of \
         the live peers (sampled every second); at the end {}/{} ({} joining, {} in a minority)",
        r.duration_s,
        r.churn_per_s,
        r.left,
        r.joined,
        r.clients,
        r.resources,
        r.serving_min_pct,
        r.serving_mean_pct,
        r.serving_end,
        r.live_end,
        r.joining_end,
        r.minority_end
    );
    let _ = writeln!(
        s,
        "  membership views at the end: members p50 {:.0} (min {:.0}), alive p50 {:.0} (min {:.0})",
        r.members_p50, r.members_min, r.alive_p50, r.alive_min
    );
    let _ = writeln!(
        s,
        "  Kademlia lookups ({} get_closest_peers after convergence): p50 {:.1} ms, p99 {:.1} ms, {:.1} requests each",
        r.lookups, r.lookup_ms_p50, r.lookup_ms_p99, r.lookup_requests_mean
    );
    let _ = writeln!(
        s,
        "  lookup hops ({REPLAYS} lookups replayed on the final routing tables, k={K}, α={ALPHA}; tables p50 {:.0} \
         peers, {:.1}% of their entries departed peers): p50 {:.0}, mean {:.2}, max {:.0}; closest peer reached {:.1}%; log2(N/k)+1 = {:.2}",
        r.routing_table_p50,
        r.routing_table_departed_pct,
        r.replay_hops_p50,
        r.replay_hops_mean,
        r.replay_hops_max,
        r.replay_reached_pct,
        r.hops_estimate
    );
    let a = &r.agreement;
    let _ = writeln!(
        s,
        "  host agreement after {} of settling: {:.1}% ({} of {} hosted keys have one host, the closest live peer; {} \
         with two or more, {} on another peer; {} of {} keys hosted)",
        secs(t.settle),
        a.percent(),
        a.agree,
        a.hosted,
        a.several,
        a.misplaced,
        a.hosted,
        a.keys
    );
    for e in &a.examples {
        let _ = writeln!(s, "    {e}");
    }
    for (phase, d) in [("during churn", &r.two_hosts_churn), ("while settling", &r.two_hosts_settle)] {
        let _ = writeln!(
            s,
            "  two hosts at once {phase}: {} keys, {} episodes, p50 {:.0} ms, longest {:.0} ms, total {:.1} s (sampled \
             every {} ms)",
            d.keys,
            d.episodes,
            quantile(&d.durations_ms, 0.5),
            d.longest_ms(),
            d.total_ms / 1e3,
            peer::SAMPLE_EVERY.as_millis()
        );
    }
    let _ = writeln!(
        s,
        "  critical sections: {} entries; acquire p50 {:.1} ms, p99 {:.1} ms; {} timed out, {} refused, {} lost while \
         held",
        r.entries, r.acquire_ms_p50, r.acquire_ms_p99, r.timed_out, r.refused, r.lost
    );
    let _ = writeln!(
        s,
        "  messages per CS entry: {:.1} (4n = {}); transport requests per CS entry: {:.1} (a batch to one peer counts one)",
        r.messages_per_entry,
        4 * r.n,
        r.requests_per_entry
    );
    let _ = writeln!(
        s,
        "  exclusion violations: {} (overlaps after lease expiry {}, token regressions {})",
        r.violations, r.expired_overlaps, r.token_regressions
    );
    let _ = writeln!(
        s,
        "  peers (all incarnations): stalls {}, ping failures {}, replicas dropped when not serving {}, ownership \
         lookups {} (closer peer found {}), Kademlia bootstraps cut to their self-lookup {}, hand-overs {}, \
         replicas held by the takeover delay {}, gossip failures {}",
        r.stalls,
        r.ping_failures,
        r.dropped_not_serving,
        r.ownership_checks,
        r.ownership_lost,
        r.bootstraps_cut,
        r.handed_over,
        r.replicas_held,
        r.gossip_failures
    );
    let _ = writeln!(
        s,
        "  requests: {} redirects followed, {} host lookups; refused by hosts {:?}; responses refused by clients {:?}; \
         failed {:?}",
        r.redirects, r.host_lookups, r.rejected, r.responses_refused, r.failures
    );
    let _ = writeln!(s, "  Kademlia requests sent, by what their query was for: {:?}", r.kad_requests);
    let _ = writeln!(
        s,
        "  connections: {} established, {} denied by the limit ({} per peer), {} other dial failures, {} trimmed \
         (least recently used, past {} per peer); closed {} idle, {} on an error, {} here (each side counts); \
         most at once per peer p50 {:.0}, max {:.0}",
        r.connections,
        r.denied,
        r.max_connections,
        r.dial_errors,
        r.trimmed,
        r.max_connections * 3 / 4,
        r.closed[0],
        r.closed[1],
        r.closed[2],
        r.max_established_p50,
        r.max_established
    );
    let _ = writeln!(
        s,
        "  membership traffic a peer (gossip tables, requests and replies, as their protocol writes them; \
         liveness pings apart: 32 bytes each way, each peer answering about as many as it sends, so ≈ 64 B each way a ping):"
    );
    for (p, m) in r.membership.iter().enumerate() {
        let name = match p {
            1 if r.churn_per_s > 0.0 => format!("churn {}/s", r.churn_per_s),
            1 => "no churn".into(),
            2 => "settling, no churn".into(),
            _ => PHASE_NAMES[p].into(),
        };
        let _ = writeln!(
            s,
            "    {name} ({:.0} s, {:.0} peer-s): sent {:.0} B/s (p99 {} over {} peers up throughout), received {:.0} \
             B/s, {:.1} tables/s sent; {:.1} pings/s (≈ {:.0} B/s each way); connections opened {:.1} a peer a minute",
            r.phase_s[p],
            m.peer_s,
            m.bytes_out_per_s,
            m.bytes_out_per_s_p99.map_or("-".into(), |x| format!("{x:.0}")),
            m.whole_peers,
            m.bytes_in_per_s,
            m.tables_out_per_s,
            m.pings_per_s,
            m.pings_per_s * 64.0,
            m.opened_per_min
        );
    }
    let (d, e) = (&r.detection, &r.detection_everywhere);
    let _ = writeln!(
        s,
        "  killed peers out of the views ({} killed by churn): per view p50 {:.1} s, p99 {:.1} s, max {:.1} s ({} \
         views); out of every view p50 {:.1} s, p99 {:.1} s, max {:.1} s ({} kills); {} views still held one at the end",
        r.kills, d.p50, d.p99, d.max, d.n, e.p50, e.p99, e.max, e.n, r.undetected
    );
    let _ = writeln!(
        s,
        "  false removals (a peer up dropped from a view after formation): {} in {:.2} peer-hours ({} stalls seen)",
        r.false_removals,
        r.peer_hours(),
        r.stalls
    );
    let _ = writeln!(s, "  wall time {:.0} s", r.wall_s);
    for g in r.goals() {
        let _ = writeln!(s, "{}", g.line());
    }
    let mark = |ok: bool| if ok { "[PASS]" } else { "[FAIL]" };
    let _ = writeln!(s, "{} exclusion violations: {}", mark(r.violations == 0), r.violations);
    let _ = writeln!(
        s,
        "{} host agreement after convergence: {:.1}% of {} hosted keys",
        mark(a.hosted > 0 && a.agree == a.hosted),
        a.percent(),
        a.hosted
    );
    let _ = writeln!(
        s,
        "{} lookup hops p50 {:.0} ≤ log2(N/k)+1 = {:.2}",
        mark(r.replay_hops_p50 <= r.hops_estimate.ceil()),
        r.replay_hops_p50,
        r.hops_estimate
    );
    s
}
