//! What the in-process swarm reports, computed from what the peers recorded: host
//! agreement, keys with two hosts at once, Kademlia lookup hops on the real routing
//! tables, percentiles.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use libp2p::kad::KBucketKey;
use libp2p::PeerId;
use serde::Serialize;
use sigma_behaviour::wire;

use super::peer::Span;

/// The Kademlia key of replica `index` of resource `resource` (as the behaviour keys it).
pub fn replica_key(resource: usize, index: u16) -> KBucketKey<Vec<u8>> {
    KBucketKey::new(wire::replica_name(&super::resource_name(resource), index).into_bytes())
}

/// The live peer XOR-closest to `key`.
pub fn closest(live: &[PeerId], key: &KBucketKey<Vec<u8>>) -> Option<PeerId> {
    live.iter().map(|p| (KBucketKey::from(*p).distance(key), *p)).min().map(|(_, p)| p)
}

/// Who hosts the lock's replica keys, against who should: the live peer closest to each.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Agreement {
    /// Replica keys of the run's resources (resources × n).
    pub keys: usize,
    /// Keys hosted by at least one peer.
    pub hosted: usize,
    /// Hosted by exactly one peer, the closest live one: the goal for every hosted key.
    pub agree: usize,
    /// Hosted by one peer that is not the closest live one.
    pub misplaced: usize,
    /// Hosted by two peers or more.
    pub several: usize,
    /// A few of the keys that did not agree, for the report.
    pub examples: Vec<String>,
}

impl Agreement {
    /// Share of the hosted keys that agree, in percent.
    pub fn percent(&self) -> f64 {
        if self.hosted == 0 {
            return 0.0;
        }
        100.0 * self.agree as f64 / self.hosted as f64
    }
}

/// Host agreement over every replica key of `resources` resources with `n` replicas,
/// from the keys each peer (`hosted`: incarnation index → keys) hosts and the peers
/// alive (`live`: incarnation index → peer id).
pub fn agreement(
    hosted: &HashMap<usize, Vec<(usize, u16)>>,
    live: &HashMap<usize, PeerId>,
    resources: usize,
    n: usize,
) -> Agreement {
    let mut hosts: HashMap<(usize, u16), Vec<usize>> = HashMap::new();
    for (peer, keys) in hosted {
        if live.contains_key(peer) {
            for key in keys {
                hosts.entry(*key).or_default().push(*peer);
            }
        }
    }
    let peers: Vec<PeerId> = live.values().copied().collect();
    let mut a = Agreement { keys: resources * n, ..Agreement::default() };
    for r in 0..resources {
        for i in 0..n {
            let i = u16::try_from(i).unwrap_or(u16::MAX);
            let Some(h) = hosts.get(&(r, i)) else { continue };
            a.hosted += 1;
            let best = closest(&peers, &replica_key(r, i));
            let name = wire::replica_name(&super::resource_name(r), i);
            match h.as_slice() {
                [one] if best == live.get(one).copied() => a.agree += 1,
                [one] => {
                    a.misplaced += 1;
                    if a.examples.len() < 5 {
                        a.examples.push(format!("{name}: hosted by peer {one}, not the closest"));
                    }
                }
                many => {
                    a.several += 1;
                    if a.examples.len() < 5 {
                        a.examples.push(format!("{name}: hosted by peers {many:?}"));
                    }
                }
            }
        }
    }
    a
}

/// Keys that had two hosts at once in a window of the run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DoubleHosts {
    /// Keys with at least one episode.
    pub keys: usize,
    /// Episodes (a maximal time during which a key had two hosts or more).
    pub episodes: usize,
    /// Their durations, in ms, sorted.
    #[serde(skip)]
    pub durations_ms: Vec<f64>,
    /// Sum of the durations.
    pub total_ms: f64,
}

impl DoubleHosts {
    /// The longest episode, in ms.
    pub fn longest_ms(&self) -> f64 {
        self.durations_ms.last().copied().unwrap_or(0.0)
    }
}

/// Episodes of two hosts at once within `[from, to)`, from the sampled hosting spans.
/// A span runs from the first to the last sample that saw the key hosted, so it lies
/// within the true hosting time: two spans of different peers that overlap are two
/// hosts for certain (an overlap shorter than a sampling period may go unseen).
pub fn double_hosts(spans: &[Span], from: Duration, to: Duration) -> DoubleHosts {
    let mut by_key: BTreeMap<(usize, u16), Vec<&Span>> = BTreeMap::new();
    for s in spans {
        by_key.entry(s.key).or_default().push(s);
    }
    let mut d = DoubleHosts::default();
    for list in by_key.values() {
        let mut overlaps: Vec<(Duration, Duration)> = Vec::new();
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if a.peer == b.peer {
                    continue;
                }
                let (start, end) = (a.first.max(b.first).max(from), a.last.min(b.last).min(to));
                if start < end {
                    overlaps.push((start, end));
                }
            }
        }
        if overlaps.is_empty() {
            continue;
        }
        overlaps.sort();
        let mut merged: Vec<(Duration, Duration)> = Vec::new();
        for (s, e) in overlaps {
            match merged.last_mut() {
                Some((_, last)) if s <= *last => *last = (*last).max(e),
                _ => merged.push((s, e)),
            }
        }
        d.keys += 1;
        d.episodes += merged.len();
        for (s, e) in merged {
            let ms = (e - s).as_secs_f64() * 1e3;
            d.total_ms += ms;
            d.durations_ms.push(ms);
        }
    }
    d.durations_ms.sort_by(f64::total_cmp);
    d
}

/// One lookup replayed on the routing tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replay {
    /// The round in which the key's closest live peer was asked (1: it was in the
    /// initiator's own table and among the first asked); `None`: never asked.
    pub hops: Option<usize>,
    /// Rounds until the lookup ended.
    pub rounds: usize,
}

/// Replays an iterative Kademlia lookup of `key` from `initiator` on the routing tables
/// the peers had (`tables`), in synchronous rounds: each round asks the `alpha` closest
/// peers not yet asked among the `k` closest known; a live peer answers with the `k`
/// closest of its table, a departed one not at all. It ends when the `k` closest known
/// have all been asked, as libp2p's `ClosestPeersIter` does. The hop count of a lookup
/// is the round in which the closest live peer was asked.
pub fn replay_lookup(
    tables: &HashMap<PeerId, Vec<PeerId>>,
    live: &HashSet<PeerId>,
    initiator: PeerId,
    key: &KBucketKey<Vec<u8>>,
    k: usize,
    alpha: usize,
) -> Replay {
    let target = live.iter().map(|p| (KBucketKey::from(*p).distance(key), *p)).min().map(|(_, p)| p);
    let closest_of = |table: &[PeerId]| -> Vec<PeerId> {
        let mut v: Vec<_> = table.iter().map(|p| (KBucketKey::from(*p).distance(key), *p)).collect();
        v.sort();
        v.into_iter().take(k).map(|(_, p)| p).collect()
    };
    let mut known: BTreeMap<libp2p::kad::KBucketDistance, PeerId> = BTreeMap::new();
    let mut asked: HashSet<PeerId> = HashSet::new();
    let mut failed: HashSet<PeerId> = HashSet::new();
    let learn = |known: &mut BTreeMap<_, _>, failed: &HashSet<PeerId>, peers: Vec<PeerId>| {
        for p in peers {
            if p != initiator && !failed.contains(&p) {
                known.insert(KBucketKey::from(p).distance(key), p);
            }
        }
    };
    learn(&mut known, &failed, closest_of(tables.get(&initiator).map_or(&[], |t| t.as_slice())));
    if target == Some(initiator) {
        return Replay { hops: Some(0), rounds: 0 };
    }
    let mut replay = Replay { hops: None, rounds: 0 };
    loop {
        let next: Vec<PeerId> = known.values().take(k).filter(|p| !asked.contains(*p)).take(alpha).copied().collect();
        if next.is_empty() || replay.rounds > 64 {
            return replay;
        }
        replay.rounds += 1;
        let mut answers = Vec::new();
        for p in next {
            asked.insert(p);
            if !live.contains(&p) {
                // No answer: Kademlia drops it from the candidates.
                known.retain(|_, q| *q != p);
                failed.insert(p);
                continue;
            }
            if Some(p) == target && replay.hops.is_none() {
                replay.hops = Some(replay.rounds);
            }
            answers.extend(closest_of(tables.get(&p).map_or(&[], |t| t.as_slice())));
        }
        learn(&mut known, &failed, answers);
    }
}

/// The q-th quantile (0..=1) of sorted values (nearest rank).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(key: u16, peer: usize, first: u64, last: u64) -> Span {
        Span { key: (0, key), peer, first: Duration::from_millis(first), last: Duration::from_millis(last) }
    }

    #[test]
    fn overlapping_spans_of_two_peers_are_one_episode_and_a_hand_over_none() {
        let spans = [
            span(0, 1, 0, 1000),
            span(0, 2, 800, 2000), // two hosts 800..1000
            span(0, 3, 900, 950),  // a third inside the same episode
            span(1, 1, 0, 500),
            span(1, 2, 600, 900), // handed over: no overlap
            span(2, 4, 0, 300),
            span(2, 4, 200, 400), // one peer twice: not two hosts
        ];
        let d = double_hosts(&spans, Duration::ZERO, Duration::from_secs(10));
        assert_eq!((d.keys, d.episodes), (1, 1));
        assert_eq!(d.longest_ms(), 200.0);
        let clipped = double_hosts(&spans, Duration::from_millis(900), Duration::from_secs(10));
        assert_eq!(clipped.longest_ms(), 100.0);
    }

    #[test]
    fn a_lookup_on_full_tables_reaches_the_closest_peer_in_one_round() {
        let peers: Vec<PeerId> = (0..30).map(|_| PeerId::random()).collect();
        let tables: HashMap<PeerId, Vec<PeerId>> =
            peers.iter().map(|p| (*p, peers.iter().filter(|q| *q != p).copied().collect())).collect();
        let live: HashSet<PeerId> = peers.iter().copied().collect();
        let key = replica_key(0, 0);
        let r = replay_lookup(&tables, &live, peers[0], &key, 20, 3);
        let target = closest(&peers, &key).expect("peers");
        assert_eq!(r.hops, Some(usize::from(target != peers[0])));
    }

    #[test]
    fn a_lookup_follows_referrals_along_a_chain() {
        // Each peer knows only the next one: the closest peer is reached hop by hop.
        let mut peers: Vec<PeerId> = (0..6).map(|_| PeerId::random()).collect();
        let key = replica_key(0, 0);
        peers.sort_by_key(|p| std::cmp::Reverse(KBucketKey::from(*p).distance(&key)));
        let tables: HashMap<PeerId, Vec<PeerId>> = peers.windows(2).map(|w| (w[0], vec![w[1]])).collect();
        let live: HashSet<PeerId> = peers.iter().copied().collect();
        let r = replay_lookup(&tables, &live, peers[0], &key, 20, 3);
        assert_eq!(r.hops, Some(5), "{r:?}");
    }

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.5), 2.0);
        assert_eq!(quantile(&v, 0.99), 4.0);
        assert!(quantile(&[], 0.5).is_nan());
    }
}
