//! Small helpers every role uses: [`Clock`], the core's time (wall-aligned, counting
//! through suspends); [`DeadlineIndex`], keys filed by their next deadline so that a
//! timer costs O(log n), not a walk over all state; and [`shrink_if_sparse`], which gives
//! a map's memory back after a burst.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::config::BootClock;
use crate::proto::Time;

#[cfg(doc)]
use super::config::MAX_TIMER;

/// The core's `Time`: the wall clock at start (so hybrid timestamps and grant stamps
/// are wall-aligned µs), advanced by a clock that keeps counting while the machine is
/// suspended (`CLOCK_BOOTTIME` on Linux). `Instant` (`CLOCK_MONOTONIC`) stops during a
/// suspend: a laptop suspended for a minute while holding a 10 s lease would resume
/// still "valid" beside the next holder.
#[derive(Clone, Debug)]
pub(super) struct Clock {
    source: BootClock,
    boot: Duration,
    wall: Duration,
}

impl Clock {
    pub(super) fn new(source: BootClock) -> Self {
        let boot = source.read();
        Clock { source, boot, wall: SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default() }
    }
    pub(super) fn now(&self) -> Time {
        self.wall + self.source.read().saturating_sub(self.boot)
    }
    /// The `Instant` at which `now()` will read `t`, as far as the monotonic clock can
    /// tell (a suspend in between makes it later; see [`MAX_TIMER`]).
    pub(super) fn instant(&self, t: Time) -> Instant {
        let (now, instant) = (self.now(), Instant::now());
        if t >= now {
            instant + (t - now)
        } else {
            instant.checked_sub(now - t).unwrap_or(instant)
        }
    }
}

/// Keys filed under their next deadline, in time order, each at most once.
#[derive(Debug)]
pub(super) struct DeadlineIndex<K> {
    by_time: BTreeSet<(Time, K)>,
    at: HashMap<K, Time>,
}

impl<K> Default for DeadlineIndex<K> {
    fn default() -> Self {
        DeadlineIndex { by_time: BTreeSet::new(), at: HashMap::new() }
    }
}

impl<K: Clone + Ord + std::hash::Hash> DeadlineIndex<K> {
    /// Files `key` under `at`, or takes it out (`None`). Called after every message a
    /// replica or an acquisition handles, mostly with the deadline it had: then it does
    /// nothing, and a moved deadline re-files the key it takes out (one clone in all).
    pub(super) fn set(&mut self, key: &K, at: Option<Time>) {
        match (self.at.get_mut(key), at) {
            (Some(old), Some(at)) if *old == at => {}
            (Some(old), Some(at)) => {
                let filed = self.by_time.take(&(*old, key.clone()));
                *old = at;
                self.by_time.insert((at, filed.map_or_else(|| key.clone(), |(_, k)| k)));
            }
            (Some(old), None) => {
                self.by_time.remove(&(*old, key.clone()));
                self.at.remove(key);
                shrink_if_sparse(&mut self.at);
            }
            (None, Some(at)) => {
                self.by_time.insert((at, key.clone()));
                self.at.insert(key.clone(), at);
            }
            (None, None) => {}
        }
    }

    /// The keys due at `now` (collected: handling one may re-file it).
    pub(super) fn due(&self, now: Time) -> Vec<K> {
        self.by_time.iter().take_while(|(at, _)| *at <= now).map(|(_, k)| k.clone()).collect()
    }

    /// The earliest deadline.
    pub(super) fn first(&self) -> Option<Time> {
        self.by_time.first().map(|(t, _)| *t)
    }

    /// The key filed under the earliest deadline.
    pub(super) fn first_key(&self) -> Option<K> {
        self.by_time.first().map(|(_, k)| k.clone())
    }

    /// Whether `key` is filed.
    pub(super) fn is_filed<Q>(&self, key: &Q) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.at.contains_key(key)
    }

    pub(super) fn clear(&mut self) {
        *self = DeadlineIndex::default();
    }
}

/// Gives a map's memory back once it holds less than a quarter of its capacity: a
/// `HashMap` never shrinks by itself, so a burst of lock names would keep its table for
/// good. Amortised O(1) per removal (the next shrink needs the length to halve again).
pub(super) fn shrink_if_sparse<K: Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() * 4 < map.capacity() {
        map.shrink_to(map.len() * 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_emptied_after_a_burst_gives_its_table_back() {
        let mut map: HashMap<u64, [u8; 256]> = HashMap::new();
        for k in 0..100_000 {
            map.insert(k, [0; 256]);
        }
        let burst = map.capacity();
        for k in 0..99_990 {
            map.remove(&k);
            shrink_if_sparse(&mut map);
        }
        assert_eq!(map.len(), 10);
        assert!(map.capacity() <= 64, "capacity {} after the burst (was {burst})", map.capacity());
    }

    #[test]
    fn a_deadline_index_files_each_key_once_under_its_latest_deadline() {
        let mut index = DeadlineIndex::default();
        let at = Time::from_micros;
        index.set(&"a", Some(at(5)));
        index.set(&"b", Some(at(3)));
        index.set(&"a", Some(at(5))); // unchanged
        assert_eq!((index.at.len(), index.first(), index.first_key()), (2, Some(at(3)), Some("b")));
        index.set(&"b", Some(at(9))); // later
        assert_eq!((index.first(), index.first_key()), (Some(at(5)), Some("a")));
        index.set(&"a", Some(at(1))); // earlier
        assert_eq!(index.due(at(5)), vec!["a"]);
        assert_eq!(index.due(at(9)), vec!["a", "b"]);
        index.set(&"a", None);
        index.set(&"c", None); // never filed
        assert_eq!((index.at.len(), index.due(at(100))), (1, vec!["b"]));
        assert_eq!(index.by_time.len(), 1, "one entry per key in the time order");
    }

    #[test]
    fn a_deadline_index_shrinks_with_its_keys() {
        let mut index = DeadlineIndex::default();
        for k in 0..10_000u64 {
            index.set(&k, Some(Time::from_micros(k)));
        }
        for k in 0..10_000u64 {
            index.set(&k, None);
        }
        assert_eq!(index.first(), None);
        assert!(index.at.capacity() <= 64, "capacity {}", index.at.capacity());
    }
}
