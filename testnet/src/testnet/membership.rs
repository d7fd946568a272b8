//! The membership figures of `sigma-testnet run`, as `sim membership` and `swarm` print
//! them: gossip bytes a node a second, pings, and connections a node opened a minute,
//! over the workload (from right after formation to its end), from each node's
//! `/metrics` scraped at both ends of that window ([`scrape`]); a node killed or
//! restarted in between (another process) is left out.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use serde::Serialize;

use crate::swarm::measure::quantile;
use crate::swarm::membership::Goal;

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

#[cfg(test)]
mod tests {
    use super::*;

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
