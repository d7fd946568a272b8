//! The membership figures of `sigma-testnet run`, as `sim membership` and `swarm` print
//! them: gossip bytes a node a second, pings, and connections a node opened a minute,
//! over the workload (from right after formation to its end), from each node's
//! `/metrics` scraped at both ends of that window ([`scrape`]); a node killed or
//! restarted in between (another process) is left out.
//!
//! With `kill` faults, [`detect`] follows each killed node out of the live nodes' views:
//! every [`POLL`] it asks each node alive at the kill (seen down within [`WATCH`]) for its status (`member_peers`,
//! alive or not) until none holds the killed peer alive ([`Kills`]).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use libp2p::PeerId;
use serde::Serialize;
use tokio::sync::watch;

use super::workload::{NodeState, World};
use crate::swarm::measure::quantile;
use crate::swarm::membership::{Goal, Spread};

/// How often the views of the nodes alive at a kill are read.
pub const POLL: Duration = Duration::from_millis(500);
/// How often the nodes' states are looked at for a kill (the kill's time is the first
/// look that saw the node down: at most this late, plus a round of reads).
pub const WATCH: Duration = Duration::from_millis(50);
/// A killed node still held alive by a view this long after its kill is given up on
/// (that view counts as never dropping it).
pub const GIVE_UP: Duration = Duration::from_secs(60);
/// Kills followed at once (past it, a kill is not measured).
const MAX_FOLLOWED: usize = 64;

/// What one node's membership had cost when scraped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// `sigma_gossip_bytes_total{direction="out"}` and `"in"`.
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// `sigma_gossip_messages_total{direction="out"}`.
    pub tables_out: u64,
    /// `sigma_pings_total`.
    pub pings: u64,
    /// `libp2p_swarm_connections_established_total{role="Dialer",…}`, summed over its
    /// address labels: connections this node opened.
    pub opened: u64,
}

/// One scrape: the node, its process, when, what.
#[derive(Clone, Copy, Debug)]
pub struct Scrape {
    pub node: usize,
    pub pid: u32,
    pub at: Instant,
    pub totals: Totals,
}

/// The sum of the samples of `name` whose labels contain `labels` (OpenMetrics text).
pub fn metric_sum(text: &str, name: &str, labels: &str) -> Option<u64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else { continue };
        let (set, value) = match rest.strip_prefix('{') {
            Some(r) => match r.split_once("} ") {
                Some((set, value)) => (set, value),
                None => continue,
            },
            None => match rest.strip_prefix(' ') {
                Some(value) => ("", value),
                None => continue,
            },
        };
        if !set.contains(labels) {
            continue;
        }
        let Ok(v) = value.split_whitespace().next().unwrap_or("").parse::<f64>() else { continue };
        *found.get_or_insert(0) += v as u64;
    }
    found
}

/// The figures of one `/metrics` text (none: a daemon without the gossip counters).
pub fn totals(text: &str) -> Option<Totals> {
    Some(Totals {
        bytes_out: metric_sum(text, "sigma_gossip_bytes_total", "direction=\"out\"")?,
        bytes_in: metric_sum(text, "sigma_gossip_bytes_total", "direction=\"in\"")?,
        tables_out: metric_sum(text, "sigma_gossip_messages_total", "direction=\"out\"").unwrap_or(0),
        pings: metric_sum(text, "sigma_pings_total", "").unwrap_or(0),
        opened: metric_sum(text, "libp2p_swarm_connections_established_total", "role=\"Dialer\"").unwrap_or(0),
    })
}

/// Scrapes node `node` (process `pid`, API `api`).
pub async fn scrape(
    client: &reqwest::Client,
    node: usize,
    pid: u32,
    api: SocketAddr,
    timeout: Duration,
) -> Result<Scrape> {
    let text = sigma_daemon::client::Client::with_http(api, client.clone()).with_timeout(timeout).metrics().await?;
    let totals = totals(&text).context("sigma_gossip_bytes_total missing from /metrics (an older daemon?)")?;
    Ok(Scrape { node, pid, at: Instant::now(), totals })
}

/// The membership's cost per node over the window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Figures {
    /// Nodes measured (scraped at both ends, one process throughout), of those scraped
    /// at the start.
    pub nodes: usize,
    pub scraped: usize,
    /// Mean window, seconds.
    pub window_s: f64,
    /// Gossip bytes sent a node a second: mean, 99th percentile over the nodes; bytes
    /// received: mean.
    pub bytes_out_per_s: f64,
    pub bytes_out_per_s_p99: f64,
    pub bytes_in_per_s: f64,
    /// Gossip tables sent a node a second.
    pub tables_out_per_s: f64,
    /// Pings of a node answered a second.
    pub pings_per_s: f64,
    /// Connections a node opened a minute: mean and most.
    pub opened_per_min: f64,
    pub opened_per_min_max: f64,
}

/// The figures of the nodes scraped at both ends of the window with one process.
pub fn figures(start: &[Scrape], end: &[Scrape]) -> Figures {
    let mut rows = Vec::new();
    for a in start {
        let Some(b) = end.iter().find(|b| b.node == a.node && b.pid == a.pid) else { continue };
        let dt = b.at.saturating_duration_since(a.at).as_secs_f64();
        if dt <= 0.0 {
            continue;
        }
        let rate = |x: u64, y: u64| y.saturating_sub(x) as f64 / dt;
        let (x, y) = (a.totals, b.totals);
        rows.push([
            dt,
            rate(x.bytes_out, y.bytes_out),
            rate(x.bytes_in, y.bytes_in),
            rate(x.tables_out, y.tables_out),
            rate(x.pings, y.pings),
            rate(x.opened, y.opened) * 60.0,
        ]);
    }
    // Per node: window, bytes out, bytes in, tables out, pings (a second), opened (a minute).
    let n = rows.len();
    let mean = |i: usize| if n == 0 { f64::NAN } else { rows.iter().map(|r| r[i]).sum::<f64>() / n as f64 };
    let mut out: Vec<f64> = rows.iter().map(|r| r[1]).collect();
    out.sort_by(f64::total_cmp);
    Figures {
        nodes: n,
        scraped: start.len(),
        window_s: mean(0),
        bytes_out_per_s: mean(1),
        bytes_out_per_s_p99: quantile(&out, 0.99),
        bytes_in_per_s: mean(2),
        tables_out_per_s: mean(3),
        pings_per_s: mean(4),
        opened_per_min: mean(5),
        opened_per_min_max: rows.iter().map(|r| r[5]).fold(f64::NAN, f64::max),
    }
}

/// The figures against the goals of issue 37 (`faults`: whether the run had any; the
/// connection goal is then the one under churn).
pub fn goals(f: &Figures, nodes: usize, faults: bool) -> Vec<Goal> {
    let (bound, goal) = if nodes <= 1_000 {
        (1_000.0, "≤ 1 KB/s a peer at 1,000 peers")
    } else {
        (1_500.0, "≤ 1.5 KB/s a peer at 10,000 peers")
    };
    let (what, cgoal, cbound) = if faults {
        ("connections opened (with faults)", "≤ 10 a peer a minute, churn 1/s at 1,000", 10.0)
    } else {
        ("connections opened (no faults)", "≤ 1 a peer a minute", 1.0)
    };
    vec![
        Goal {
            what: "membership traffic (workload)".into(),
            figure: format!(
                "{:.1} KB/s a node sent (p99 {:.1}), {:.1} received",
                f.bytes_out_per_s / 1e3,
                f.bytes_out_per_s_p99 / 1e3,
                f.bytes_in_per_s / 1e3
            ),
            goal,
            met: f.bytes_out_per_s <= bound,
        },
        Goal {
            what: what.into(),
            figure: format!("{:.1} a node a minute (most {:.0})", f.opened_per_min, f.opened_per_min_max),
            goal: cgoal,
            met: f.opened_per_min <= cbound,
        },
    ]
}

/// A kill being followed: the killed peer, when, the nodes whose view may still hold
/// it alive, and when the last view so far dropped it.
#[derive(Clone, Debug)]
struct Followed {
    peer: PeerId,
    at: Instant,
    waiting: Vec<usize>,
    last: Duration,
}

/// Kills followed out of the views, and what they measured.
#[derive(Clone, Debug, Default)]
pub struct Kills {
    followed: Vec<Followed>,
    /// Per view that dropped a killed peer: the time from the kill.
    pub per_view: Vec<Duration>,
    /// Per kill dropped by every view: until the last one did.
    pub everywhere: Vec<Duration>,
    /// Views that still held a killed peer alive when given up on (or at the end).
    pub never: usize,
    /// Kills not followed: more than [`MAX_FOLLOWED`] at once, or the node came back
    /// (restarted, the same peer) before every view dropped it.
    pub not_followed: usize,
}

impl Kills {
    /// `peer` was killed at `at`; `live`: the nodes up then (their views are followed).
    pub fn killed(&mut self, peer: PeerId, at: Instant, live: Vec<usize>) {
        if self.followed.len() >= MAX_FOLLOWED {
            self.not_followed += 1;
            return;
        }
        self.followed.push(Followed { peer, at, waiting: live, last: Duration::ZERO });
    }

    /// The nodes whose views are to be read now.
    pub fn to_read(&self) -> Vec<usize> {
        let mut nodes: Vec<usize> = self.followed.iter().flat_map(|f| f.waiting.iter().copied()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }

    /// Node `node`'s view read at `now`: `alive(peer)` tells whether it holds `peer`
    /// alive; `None`: the node is down (its view no longer counts).
    pub fn read(&mut self, node: usize, now: Instant, alive: Option<&dyn Fn(&PeerId) -> bool>) {
        for f in &mut self.followed {
            let Some(i) = f.waiting.iter().position(|n| *n == node) else { continue };
            match alive {
                None => {
                    f.waiting.swap_remove(i);
                }
                Some(alive) if !alive(&f.peer) => {
                    f.waiting.swap_remove(i);
                    let d = now.saturating_duration_since(f.at);
                    self.per_view.push(d);
                    f.last = f.last.max(d);
                }
                Some(_) => {}
            }
        }
        self.settle(now);
    }

    /// The kills of `peer` are over: it came back before every view dropped it.
    pub fn back(&mut self, peer: &PeerId) {
        let before = self.followed.len();
        self.followed.retain(|f| f.peer != *peer);
        self.not_followed += before - self.followed.len();
    }

    /// Kills every view dropped are done; those past [`GIVE_UP`] too, their remaining
    /// views counted as never.
    pub fn settle(&mut self, now: Instant) {
        let (mut everywhere, mut never) = (Vec::new(), 0);
        self.followed.retain(|f| {
            if f.waiting.is_empty() {
                everywhere.push(f.last);
                return false;
            }
            if now.saturating_duration_since(f.at) >= GIVE_UP {
                never += f.waiting.len();
                return false;
            }
            true
        });
        self.everywhere.extend(everywhere);
        self.never += never;
    }

    /// The end of the run: every kill still followed counts its views left as never.
    pub fn finish(&mut self) {
        self.never += self.followed.drain(..).map(|f| f.waiting.len()).sum::<usize>();
    }
}

/// Detection of killed nodes, as the report shows it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Detection {
    pub per_view: Spread,
    pub everywhere: Spread,
    pub never: usize,
    pub not_followed: usize,
}

/// Follows every node that goes down (a `kill` fault, a crash) out of the views of the
/// nodes up at that moment, until `stop`. `peers`: the peer id of each node index (nodes
/// joined later are not followed).
pub async fn detect(
    world: Arc<Mutex<World>>,
    http: reqwest::Client,
    peers: Vec<PeerId>,
    mut stop: watch::Receiver<bool>,
) -> Detection {
    let mut kills = Kills::default();
    let mut was: Vec<NodeState> = Vec::new();
    let mut next_read = Instant::now();
    loop {
        let nodes: Vec<(NodeState, SocketAddr)> =
            world.lock().expect("not poisoned").nodes.iter().map(|s| (s.state, s.api)).collect();
        let now = Instant::now();
        let up: Vec<usize> = (0..nodes.len()).filter(|i| nodes[*i].0 == NodeState::Up).collect();
        for (i, (state, _)) in nodes.iter().enumerate() {
            let before = was.get(i).copied();
            match (before, state) {
                (Some(NodeState::Up), NodeState::Down) if i < peers.len() => {
                    kills.killed(peers[i], now, up.clone());
                }
                (Some(NodeState::Down), NodeState::Up) if i < peers.len() => kills.back(&peers[i]),
                _ => {}
            }
        }
        was = nodes.iter().map(|n| n.0).collect();
        let to_read = if now >= next_read { kills.to_read() } else { Vec::new() };
        if !to_read.is_empty() {
            next_read = now + POLL;
        }
        let reads = to_read.into_iter().map(|i| {
            let (state, api) = nodes.get(i).copied().unwrap_or((NodeState::Down, ([127, 0, 0, 1], 0).into()));
            let http = http.clone();
            async move {
                if state == NodeState::Down {
                    return (i, None);
                }
                (i, super::api::status(&http, api, POLL * 2).await.ok())
            }
        });
        for (i, status) in futures::future::join_all(reads).await {
            let read = Instant::now();
            match status {
                Some(st) => {
                    let alive = |p: &PeerId| st.member_peers.iter().any(|m| m.peer == *p && m.alive);
                    kills.read(i, read, Some(&alive));
                }
                // Down now: its view no longer counts. A paused or slow node is read
                // again at the next poll.
                None if nodes.get(i).is_none_or(|n| n.0 == NodeState::Down) => kills.read(i, read, None),
                None => {}
            }
        }
        kills.settle(Instant::now());
        tokio::select! {
            _ = tokio::time::sleep(WATCH) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    kills.finish();
    Detection {
        per_view: Spread::of(&kills.per_view),
        everywhere: Spread::of(&kills.everywhere),
        never: kills.never,
        not_followed: kills.not_followed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kill is followed until every view alive at it dropped it; a view whose node
    /// goes down no longer counts; one that holds on past GIVE_UP counts as never.
    #[test]
    fn a_kill_is_followed_out_of_every_view() {
        let t0 = Instant::now();
        let s = |x: u64| t0 + Duration::from_secs(x);
        let (a, b) = (PeerId::random(), PeerId::random());
        let mut k = Kills::default();
        k.killed(a, s(0), vec![1, 2, 3]);
        k.killed(b, s(1), vec![1, 2]);
        assert_eq!(k.to_read(), vec![1, 2, 3]);
        let holds = |p: &PeerId| *p == a;
        k.read(1, s(2), Some(&|_: &PeerId| true));
        k.read(2, s(2), Some(&holds)); // dropped b after 1 s, still holds a
        k.read(3, s(3), None); // node 3 went down
        k.read(1, s(4), Some(&holds)); // b dropped everywhere at 3 s
        assert_eq!(k.everywhere, vec![Duration::from_secs(3)]);
        k.read(2, s(5), Some(&|_: &PeerId| false));
        assert_eq!(k.to_read(), vec![1]);
        k.settle(s(61));
        assert_eq!(k.never, 1, "node 1 held a past the give-up");
        assert_eq!(k.per_view, vec![Duration::from_secs(1), Duration::from_secs(3), Duration::from_secs(5)]);
        assert!(k.to_read().is_empty());
        // A peer back before every view dropped it is not measured.
        k.killed(a, s(70), vec![1]);
        k.back(&a);
        k.finish();
        assert_eq!((k.never, k.not_followed, k.everywhere.len()), (1, 1, 1));
    }

    const TEXT: &str = "# TYPE sigma_gossip_bytes counter\n\
        sigma_gossip_bytes_total{direction=\"out\"} 5000\n\
        sigma_gossip_bytes_total{direction=\"in\"} 7000\n\
        sigma_gossip_messages_total{direction=\"out\"} 40\n\
        sigma_pings_total 12\n\
        sigma_pings_totally_other 99\n\
        libp2p_swarm_connections_established_total{role=\"Dialer\",protocols=\"/ip4/tcp\"} 3\n\
        libp2p_swarm_connections_established_total{role=\"Dialer\",protocols=\"/ip4/udp/quic-v1\"} 2\n\
        libp2p_swarm_connections_established_total{role=\"Listener\",protocols=\"/ip4/tcp\"} 30\n\
        # EOF\n";

    #[test]
    fn metrics_are_summed_over_the_matching_labels() {
        let t = totals(TEXT).unwrap();
        assert_eq!(t, Totals { bytes_out: 5000, bytes_in: 7000, tables_out: 40, pings: 12, opened: 5 });
        assert_eq!(totals("sigma_pings_total 1\n"), None);
        assert_eq!(metric_sum(TEXT, "sigma_pings", ""), None);
    }

    /// Rates over each node's own window; a node restarted (another pid) or not scraped
    /// at the end is left out.
    #[test]
    fn each_node_is_measured_over_its_own_window() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let tot =
            |b: u64, o: u64| Totals { bytes_out: b, bytes_in: 2 * b, tables_out: b / 100, pings: b / 1000, opened: o };
        let start = [
            Scrape { node: 0, pid: 10, at: at(0), totals: tot(1_000, 4) },
            Scrape { node: 1, pid: 11, at: at(1), totals: tot(0, 0) },
            Scrape { node: 2, pid: 12, at: at(0), totals: tot(0, 0) },
            Scrape { node: 3, pid: 13, at: at(0), totals: tot(0, 0) },
        ];
        let end = [
            Scrape { node: 0, pid: 10, at: at(10), totals: tot(11_000, 5) }, // 1,000 B/s, 6 a minute
            Scrape { node: 1, pid: 11, at: at(31), totals: tot(90_000, 1) }, // 3,000 B/s, 2 a minute
            Scrape { node: 2, pid: 99, at: at(10), totals: tot(5, 0) },      // restarted: out
        ];
        let f = figures(&start, &end);
        assert_eq!((f.nodes, f.scraped), (2, 4));
        assert_eq!(f.window_s, 20.0);
        assert_eq!(f.bytes_out_per_s, 2_000.0);
        assert_eq!(f.bytes_out_per_s_p99, 3_000.0);
        assert_eq!(f.bytes_in_per_s, 4_000.0);
        assert_eq!(f.opened_per_min, 4.0);
        assert_eq!(f.opened_per_min_max, 6.0);
        let g = goals(&f, 20, false);
        assert!(!g[0].met && !g[1].met, "{g:?}");
        assert!(goals(&f, 20, true)[1].met);
        assert_eq!(figures(&start, &[]).nodes, 0);
    }
}
