//! The checker: from the critical sections recorded by the clients, exclusion
//! violations, overlaps after lease expiry, fencing-token regressions, and clients that
//! were never served.
//!
//! Intervals are the clients' own view: enter = the acquire answer arrived, exit = just
//! before the release was sent. Two intervals of different clients on the same resource
//! that overlap are a violation, except when the earlier holder kept going past its
//! lease (its exit is after its `valid_until`), the later one entered only after that
//! `valid_until`, and the later token is larger: that is the case fencing tokens are
//! for (a paused holder), and a resource that checks tokens rejects the stale one.
//! `valid_until` is taken as the arrival of the acquire answer plus `valid_for_ms`, an
//! upper bound of the node's own deadline, so the exception never excuses more than
//! the node promised.

use std::time::Duration;

use serde::Serialize;

/// One critical section as a client saw it (times since the start of the workload).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Cs {
    /// Client.
    pub client: usize,
    /// Resource index.
    pub resource: usize,
    /// Node the lock was taken through.
    pub node: usize,
    /// Fencing token.
    pub token: u64,
    /// Acquire answer received.
    #[serde(serialize_with = "ms")]
    pub enter: Duration,
    /// Release about to be sent.
    #[serde(serialize_with = "ms")]
    pub exit: Duration,
    /// End of the guaranteed lease as of the acquire answer.
    #[serde(serialize_with = "ms")]
    pub valid_until: Duration,
}

fn ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

/// Two critical sections of different clients on the same resource that overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Overlap {
    /// The one that entered first.
    pub earlier: Cs,
    /// The one that entered while the first was still inside.
    pub later: Cs,
}

/// Successive holders (by enter time) whose tokens did not increase. Distinct holders
/// never share a token while sigma's guarantee holds, so an equal token is a regression
/// here, while a fencing store accepts it (for it, an equal token is the same holder
/// writing again; see the shared-counter example).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Regression {
    /// The earlier holder.
    pub previous: Cs,
    /// The next holder, with a token not above the previous one.
    pub next: Cs,
}

/// What the checker found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Findings {
    /// Real exclusion violations.
    pub violations: Vec<Overlap>,
    /// Overlaps after the earlier holder's lease had expired, later token larger.
    pub expired_overlaps: Vec<Overlap>,
    /// Fencing-token regressions between successive holders.
    pub token_regressions: Vec<Regression>,
    /// Clients that never entered.
    pub never_served: Vec<usize>,
    /// Critical sections that went on past their lease (a paused holder).
    pub held_past_lease: usize,
}

/// Whether an overlap is the expired-lease case (see the module doc).
fn after_expiry(a: &Cs, b: &Cs) -> bool {
    a.exit > a.valid_until && b.enter >= a.valid_until && b.token > a.token
}

/// Checks the intervals of `clients` clients (ids `0..clients`) on `resources` resources.
pub fn check(entries: &[Cs], resources: usize, clients: usize) -> Findings {
    let mut f = Findings::default();
    let mut served = vec![false; clients];
    for e in entries {
        if let Some(s) = served.get_mut(e.client) {
            *s = true;
        }
    }
    f.held_past_lease = entries.iter().filter(|e| e.exit > e.valid_until).count();
    f.never_served = served.iter().enumerate().filter(|(_, s)| !**s).map(|(c, _)| c).collect();

    for r in 0..resources {
        let mut list: Vec<Cs> = entries.iter().filter(|e| e.resource == r).copied().collect();
        list.sort_by_key(|e| (e.enter, e.exit, e.client));
        // Intervals that may still be open at the current enter time.
        let mut open: Vec<Cs> = Vec::new();
        for b in &list {
            open.retain(|a| a.exit > b.enter);
            for a in &open {
                if a.client == b.client {
                    continue;
                }
                let o = Overlap { earlier: *a, later: *b };
                if after_expiry(a, b) {
                    f.expired_overlaps.push(o);
                } else {
                    f.violations.push(o);
                }
            }
            open.push(*b);
        }
        for w in list.windows(2) {
            if w[1].token <= w[0].token {
                f.token_regressions.push(Regression { previous: w[0], next: w[1] });
            }
        }
    }
    f
}

/// A stretch of time in which a semaphore had more holders than slots.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OverCapacity {
    /// Semaphore (resource) index.
    pub semaphore: usize,
    /// From (since the start of the workload).
    #[serde(serialize_with = "ms")]
    pub from: Duration,
    /// To.
    #[serde(serialize_with = "ms")]
    pub to: Duration,
    /// The most holders at once in it.
    pub holders: usize,
}

/// What the semaphore check found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Capacity {
    /// Slots of each semaphore.
    pub slots: u16,
    /// Every stretch with more holders than slots.
    pub over: Vec<OverCapacity>,
    /// The most holders of one semaphore at one moment.
    pub most_at_once: usize,
}

/// The semaphore check: with `slots` slots per semaphore, the critical sections' resource
/// is `semaphore * slots + slot` (each slot is a lock, which [`check`] checks as such),
/// and this counts the moments a semaphore had more than `slots` holders, from the
/// holders' own intervals. A holder counts from its entry to its exit or its lease's
/// end, whichever comes first: past that it holds nothing by the holder's contract
/// ([`Findings::held_past_lease`] counts those, and the slot's fencing token orders them).
pub fn capacity(entries: &[Cs], semaphores: usize, slots: u16) -> Capacity {
    let k = usize::from(slots.max(1));
    let mut c = Capacity { slots, ..Capacity::default() };
    for sem in 0..semaphores {
        // Exits sort before entries at the same instant (-1 < +1).
        let mut edges: Vec<(Duration, i32)> = entries
            .iter()
            .filter(|e| e.resource / k == sem)
            .flat_map(|e| [(e.enter, 1), (e.exit.min(e.valid_until).max(e.enter), -1)])
            .collect();
        edges.sort();
        let mut now = 0i32;
        let mut open: Option<OverCapacity> = None;
        for (t, d) in edges {
            now += d;
            let holders = usize::try_from(now).unwrap_or(0);
            c.most_at_once = c.most_at_once.max(holders);
            match (&mut open, holders > k) {
                (None, true) => open = Some(OverCapacity { semaphore: sem, from: t, to: t, holders }),
                (Some(o), true) => o.holders = o.holders.max(holders),
                (Some(_), false) => {
                    let mut o = open.take().expect("open");
                    o.to = t;
                    c.over.push(o);
                }
                (None, false) => {}
            }
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cs(client: usize, token: u64, enter: u64, exit: u64, valid_until: u64) -> Cs {
        Cs {
            client,
            resource: 0,
            node: 0,
            token,
            enter: Duration::from_millis(enter),
            exit: Duration::from_millis(exit),
            valid_until: Duration::from_millis(valid_until),
        }
    }

    #[test]
    fn disjoint_intervals_with_increasing_tokens_are_clean() {
        let e = [cs(0, 1, 0, 10, 3000), cs(1, 2, 10, 20, 3010), cs(0, 3, 25, 30, 3025)];
        let f = check(&e, 1, 2);
        assert!(f.violations.is_empty() && f.expired_overlaps.is_empty() && f.token_regressions.is_empty());
        assert!(f.never_served.is_empty());
    }

    #[test]
    fn overlap_within_the_lease_is_a_violation() {
        let e = [cs(0, 1, 0, 100, 3000), cs(1, 2, 50, 60, 3050)];
        let f = check(&e, 1, 2);
        assert_eq!(f.violations.len(), 1);
        assert_eq!(f.violations[0].earlier.client, 0);
        assert!(f.expired_overlaps.is_empty());
    }

    #[test]
    fn paused_holder_past_its_lease_is_separated() {
        // Client 0 holds past valid_until 3000; client 1 enters at 3500 with a larger token.
        let e = [cs(0, 1, 0, 5000, 3000), cs(1, 2, 3500, 3600, 6500)];
        let f = check(&e, 1, 3);
        assert!(f.violations.is_empty(), "{f:?}");
        assert_eq!(f.expired_overlaps.len(), 1);
        assert_eq!(f.held_past_lease, 1);
        assert_eq!(f.never_served, vec![2]);
        // Entering before the lease ran out is a violation all the same.
        let f = check(&[cs(0, 1, 0, 5000, 3000), cs(1, 2, 2500, 2600, 5500)], 1, 2);
        assert_eq!(f.violations.len(), 1);
        // So is a later holder with a smaller token (fencing would not help), which is
        // also a regression.
        let f = check(&[cs(0, 5, 0, 5000, 3000), cs(1, 2, 3500, 3600, 6500)], 1, 2);
        assert_eq!(f.violations.len(), 1);
        assert_eq!(f.token_regressions.len(), 1);
    }

    #[test]
    fn regressions_and_resources_are_separate() {
        let mut other = cs(2, 1, 5, 6, 3000);
        other.resource = 1;
        let e = [cs(0, 5, 0, 1, 3000), cs(1, 4, 2, 3, 3000), other];
        let f = check(&e, 2, 3);
        assert_eq!(f.token_regressions.len(), 1);
        assert_eq!(f.token_regressions[0].next.token, 4);
        assert!(f.violations.is_empty());
    }

    #[test]
    fn a_third_holder_of_two_slots_is_counted_once_per_stretch() {
        // Semaphore 0 with 2 slots: resources 0 and 1 are its slots (2 and 3 semaphore 1's).
        let on = |client, slot, enter, exit| {
            let mut c = cs(client, 1, enter, exit, 3000);
            c.resource = slot;
            c
        };
        let two = vec![on(0, 0, 0, 100), on(1, 1, 10, 50), on(2, 0, 100, 200), on(3, 1, 50, 80)];
        let c = capacity(&two, 1, 2);
        assert!(c.over.is_empty(), "{c:?}");
        assert_eq!(c.most_at_once, 2);
        // A third at once (a holder that kept two slots' worth, or a slot granted twice,
        // shows so): one stretch, from its entry to the first exit after it.
        let mut three = two.clone();
        three.push(on(4, 1, 20, 30));
        let c = capacity(&three, 1, 2);
        assert_eq!(c.over.len(), 1, "{c:?}");
        let o = &c.over[0];
        assert_eq!((o.from, o.to, o.holders), (Duration::from_millis(20), Duration::from_millis(30), 3));
        // A holder past its lease counts until its lease's end only.
        let mut paused = two.clone();
        let mut late = on(5, 1, 10, 500);
        late.valid_until = Duration::from_millis(5);
        paused.push(late);
        assert!(capacity(&paused, 1, 2).over.is_empty());
        // Another semaphore's holders do not count.
        let mut other = two.clone();
        other.push(on(6, 2, 20, 30));
        assert!(capacity(&other, 2, 2).over.is_empty());
    }

    #[test]
    fn an_interval_overlapping_several_counts_each_pair() {
        let e = [cs(0, 1, 0, 100, 3000), cs(1, 2, 10, 20, 3000), cs(2, 3, 30, 40, 3000)];
        let f = check(&e, 1, 3);
        assert_eq!(f.violations.len(), 2);
    }
}
