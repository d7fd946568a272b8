//! The membership figures of `sigma-testnet sim membership`, measured on the in-process
//! swarm: traffic per peer and second, connections opened per peer and minute, how long
//! a departed (crashed) peer stays alive in the live peers' views, false removals, each
//! against the goal of issue 37 as the simulator prints it.
//!
//! A run has phases: forming, churn (the workload, with or without churn), settling (the
//! workload without churn), then the end (not measured). Each peer keeps a [`Ledger`]: at
//! every sample it files the time since the last one, and what its membership sent and
//! received meanwhile ([`sigma_behaviour::Traffic`]), under the phase in force at the
//! last sample (a phase's bounds are known to within one sample period). The rates are
//! totals over peer-time ([`rates`]), so a peer that came or went within a phase counts
//! for the time it was up; the 99th percentile is over the peers up for the whole phase.
//!
//! Departures are read from each peer's own view ([`DepartureCursor`]): a departure of a
//! peer the harness killed is a detection (its time from the kill); one of a peer up
//! then is a false removal.

use std::collections::HashMap;
use std::time::Duration;

use libp2p::PeerId;
use serde::Serialize;
use sigma_behaviour::Traffic;

use super::measure::quantile;

/// The measured phases: forming, churn, settling.
pub const PHASES: usize = 3;
/// The phase after them (the end of the run: lookups, routing tables, stopping).
pub const END: usize = PHASES;
/// Phase names, for the report.
pub const PHASE_NAMES: [&str; PHASES] = ["forming", "churn", "settling"];

/// Kills remembered for detection (past it, a kill is not measured).
pub const MAX_KILLS: usize = 100_000;
/// Detection samples (one per view and kill) kept (past it, they are counted only).
pub const MAX_DETECTIONS: usize = 1_000_000;

/// `a - b`, field by field (counters only grow; saturating all the same).
fn minus(a: Traffic, b: Traffic) -> Traffic {
    Traffic {
        gossip_out: a.gossip_out.saturating_sub(b.gossip_out),
        gossip_in: a.gossip_in.saturating_sub(b.gossip_in),
        gossip_bytes_out: a.gossip_bytes_out.saturating_sub(b.gossip_bytes_out),
        gossip_bytes_in: a.gossip_bytes_in.saturating_sub(b.gossip_bytes_in),
        pings: a.pings.saturating_sub(b.pings),
    }
}

fn plus(a: Traffic, b: Traffic) -> Traffic {
    Traffic {
        gossip_out: a.gossip_out + b.gossip_out,
        gossip_in: a.gossip_in + b.gossip_in,
        gossip_bytes_out: a.gossip_bytes_out + b.gossip_bytes_out,
        gossip_bytes_in: a.gossip_bytes_in + b.gossip_bytes_in,
        pings: a.pings + b.pings,
    }
}

/// One peer's time up and membership traffic by phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ledger {
    /// Time up in each phase.
    pub up: [Duration; PHASES],
    /// What its membership sent and received in each phase.
    pub traffic: [Traffic; PHASES],
    /// The phase at the first sample, and at the last.
    first: Option<usize>,
    last: usize,
    /// The totals at the last sample.
    at_last: Traffic,
}

impl Ledger {
    /// A sample: `phase` is in force now, `elapsed` has passed since the last sample,
    /// and `total` is what the peer's membership has sent and received since it
    /// started. The interval goes to the phase of the last sample (the first sample
    /// only opens the ledger).
    pub fn sample(&mut self, phase: usize, elapsed: Duration, total: Traffic) {
        match self.first {
            None => self.first = Some(phase),
            Some(_) if self.last < PHASES => {
                self.up[self.last] += elapsed;
                self.traffic[self.last] = plus(self.traffic[self.last], minus(total, self.at_last));
            }
            Some(_) => {}
        }
        self.last = self.last.max(phase);
        self.at_last = total;
    }

    /// Whether the peer was up for the whole of `phase`: it was sampled before it and
    /// after it.
    pub fn whole(&self, phase: usize) -> bool {
        self.first.is_some_and(|f| f < phase) && self.last > phase
    }
}

/// The membership's cost in one phase, per peer.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Rates {
    /// Peer-seconds up in the phase (the denominator of the rates).
    pub peer_s: f64,
    /// Gossip bytes sent and received a peer a second (mean over peer-time).
    pub bytes_out_per_s: f64,
    pub bytes_in_per_s: f64,
    /// Bytes sent a peer a second: the 99th percentile over the peers up for the whole
    /// phase (none: no such peer), and how many there were.
    pub bytes_out_per_s_p99: Option<f64>,
    pub whole_peers: usize,
    /// Gossip tables sent a peer a second (requests and replies).
    pub tables_out_per_s: f64,
    /// This peer's liveness pings answered, a peer a second.
    pub pings_per_s: f64,
    /// Connections a peer opened (dialled and established) a minute.
    pub opened_per_min: f64,
}

/// The rates of `phase` over the peers' ledgers; `opened`: connections dialled and
/// established in the phase by all peers.
pub fn rates(ledgers: &[Ledger], phase: usize, opened: u64) -> Rates {
    let peer_s: f64 = ledgers.iter().map(|l| l.up[phase].as_secs_f64()).sum();
    let sum = ledgers.iter().fold(Traffic::default(), |a, l| plus(a, l.traffic[phase]));
    let per = |x: u64| if peer_s > 0.0 { x as f64 / peer_s } else { f64::NAN };
    let mut whole: Vec<f64> = ledgers
        .iter()
        .filter(|l| l.whole(phase) && !l.up[phase].is_zero())
        .map(|l| l.traffic[phase].gossip_bytes_out as f64 / l.up[phase].as_secs_f64())
        .collect();
    whole.sort_by(f64::total_cmp);
    Rates {
        peer_s,
        bytes_out_per_s: per(sum.gossip_bytes_out),
        bytes_in_per_s: per(sum.gossip_bytes_in),
        bytes_out_per_s_p99: (!whole.is_empty()).then(|| quantile(&whole, 0.99)),
        whole_peers: whole.len(),
        tables_out_per_s: per(sum.gossip_out),
        pings_per_s: per(sum.pings),
        opened_per_min: per(opened) * 60.0,
    }
}

/// Reads a peer's recent departures ([`sigma_behaviour::Behaviour::recent_departures`]):
/// a list in time order that grows at its end and loses entries from its front (aged
/// out) or all at once (past its bound), read more often than it ages. Remembers the
/// last time read and how many departures it had at exactly that time.
#[derive(Clone, Copy, Debug, Default)]
pub struct DepartureCursor {
    until: Duration,
    seen: usize,
}

impl DepartureCursor {
    /// The departures of `list` not read before (the departures of one time age out
    /// together: the membership drops those past an age).
    pub fn fresh<T: Copy>(&mut self, list: &[(T, Duration)]) -> Vec<(T, Duration)> {
        let mut fresh = Vec::new();
        let mut at_until = 0;
        for &(who, t) in list {
            if t < self.until {
                continue;
            }
            if t == self.until {
                at_until += 1;
                if at_until <= self.seen {
                    continue;
                }
            }
            fresh.push((who, t));
        }
        if let Some(&(_, last)) = fresh.last() {
            self.seen = list.iter().filter(|(_, t)| *t == last).count();
            self.until = last;
        }
        fresh
    }
}

/// Percentiles of durations, in seconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Spread {
    pub n: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(xs: &[Duration]) -> Self {
        let mut v: Vec<f64> = xs.iter().map(Duration::as_secs_f64).collect();
        v.sort_by(f64::total_cmp);
        Spread {
            n: v.len(),
            p50: quantile(&v, 0.5),
            p99: quantile(&v, 0.99),
            max: v.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// Detection of the killed peers: per view that dropped one, the time from its kill;
/// per killed peer, the time until the last view that dropped it did.
pub fn detection(samples: &[(PeerId, Duration)]) -> (Spread, Spread) {
    let mut last: HashMap<PeerId, Duration> = HashMap::new();
    for (who, d) in samples {
        let e = last.entry(*who).or_default();
        *e = (*e).max(*d);
    }
    let per_view: Vec<Duration> = samples.iter().map(|(_, d)| *d).collect();
    let everywhere: Vec<Duration> = last.into_values().collect();
    (Spread::of(&per_view), Spread::of(&everywhere))
}

/// The one-sided 95% upper bound of a Poisson mean after `k` events (as the simulator
/// bounds its false removals).
pub fn poisson_upper_95(k: u64) -> f64 {
    let n = k as f64 + 1.0;
    n * (1.0 - 1.0 / (9.0 * n) + 1.645 / (3.0 * n.sqrt())).powi(3)
}

/// One figure against its goal (as `sim membership` prints them).
#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    pub what: String,
    pub figure: String,
    pub goal: &'static str,
    pub met: bool,
}

impl Goal {
    /// The line printed: what, figure, goal, met or MISSED.
    pub fn line(&self) -> String {
        format!(
            "{:<40} {:<60} goal {:<40} {}",
            self.what,
            self.figure,
            self.goal,
            if self.met { "met" } else { "MISSED" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(bytes_out: u64, pings: u64) -> Traffic {
        Traffic {
            gossip_bytes_out: bytes_out,
            gossip_bytes_in: 2 * bytes_out,
            gossip_out: bytes_out / 100,
            pings,
            ..Traffic::default()
        }
    }
    const S: Duration = Duration::from_secs(1);

    /// Each interval goes to the phase of the sample that opened it; a peer is whole in
    /// a phase only if sampled before and after it.
    #[test]
    fn intervals_go_to_the_phase_in_force_at_their_start() {
        let mut l = Ledger::default();
        l.sample(0, Duration::ZERO, t(500, 0)); // opens: what came before is not filed
        l.sample(0, S, t(700, 1)); // forming: 1 s, 200 bytes
        l.sample(1, S, t(1_000, 2)); // still forming: the phase changed within this interval
        l.sample(1, 2 * S, t(1_400, 4)); // churn: 2 s, 400 bytes
        l.sample(2, S, t(1_500, 5)); // churn
        l.sample(2, 3 * S, t(1_800, 6)); // settling: 3 s
        l.sample(END, S, t(1_900, 7)); // settling
        l.sample(END, 5 * S, t(9_000, 9)); // the end: not filed
        assert_eq!(l.up, [2 * S, 3 * S, 4 * S]);
        assert_eq!(l.traffic[0].gossip_bytes_out, 500);
        assert_eq!(l.traffic[1].gossip_bytes_out, 500);
        assert_eq!(l.traffic[2].gossip_bytes_out, 400);
        assert_eq!(l.traffic[2].gossip_bytes_in, 800);
        assert_eq!(l.traffic[1].pings, 3);
        assert!(!l.whole(0) && l.whole(1) && l.whole(2));
        // A peer that came during churn and was gone before settling was whole in none.
        let mut late = Ledger::default();
        late.sample(1, Duration::ZERO, t(0, 0));
        late.sample(1, 4 * S, t(4_000, 0));
        assert!(!late.whole(1) && !late.whole(2));
        assert_eq!(late.up, [Duration::ZERO, 4 * S, Duration::ZERO]);
    }

    /// Rates are totals over peer-time; the percentile is over whole peers only.
    #[test]
    fn rates_are_over_peer_time() {
        let mut a = Ledger::default();
        a.sample(0, Duration::ZERO, t(0, 0));
        a.sample(1, S, t(0, 0));
        a.sample(1, 10 * S, t(10_000, 20));
        a.sample(2, Duration::ZERO, t(10_000, 20));
        let mut b = Ledger::default(); // came within churn, 2 s up, busier
        b.sample(1, Duration::ZERO, t(0, 0));
        b.sample(1, 2 * S, t(8_000, 0));
        let r = rates(&[a, b], 1, 6);
        assert_eq!(r.peer_s, 12.0);
        assert_eq!(r.bytes_out_per_s, 18_000.0 / 12.0);
        assert_eq!(r.bytes_in_per_s, 36_000.0 / 12.0);
        assert_eq!(r.whole_peers, 1);
        assert_eq!(r.bytes_out_per_s_p99, Some(1_000.0));
        assert_eq!(r.opened_per_min, 30.0);
        assert_eq!(r.pings_per_s, 20.0 / 12.0);
        let none = rates(&[b], 2, 0);
        assert!(none.bytes_out_per_s.is_nan() && none.bytes_out_per_s_p99.is_none());
    }

    #[test]
    fn departures_are_read_once_through_ageing_and_clearing() {
        let ms = Duration::from_millis;
        let mut c = DepartureCursor::default();
        assert_eq!(c.fresh(&[("a", ms(10)), ("b", ms(10))]), vec![("a", ms(10)), ("b", ms(10))]);
        assert_eq!(c.fresh(&[("a", ms(10)), ("b", ms(10))]), vec![]);
        // A third at the same time, then one later.
        let list = [("a", ms(10)), ("b", ms(10)), ("c", ms(10)), ("d", ms(30))];
        assert_eq!(c.fresh(&list), vec![("c", ms(10)), ("d", ms(30))]);
        // Those of one time age out together.
        assert_eq!(c.fresh(&[("d", ms(30))]), vec![]);
        // Cleared past its bound, then a new one.
        assert_eq!(c.fresh::<&str>(&[]), vec![]);
        assert_eq!(c.fresh(&[("e", ms(40))]), vec![("e", ms(40))]);
    }

    #[test]
    fn detection_everywhere_is_the_last_view_per_kill() {
        let (a, b) = (PeerId::random(), PeerId::random());
        let samples = [(a, S), (a, 3 * S), (b, 2 * S), (a, 2 * S)];
        let (per_view, everywhere) = detection(&samples);
        assert_eq!((per_view.n, per_view.max), (4, 3.0));
        assert_eq!(per_view.p50, 2.0);
        assert_eq!(everywhere.n, 2);
        assert_eq!((everywhere.p50, everywhere.max), (2.0, 3.0));
    }
}
