//! Lamport timestamps (paper §4: "We use Lamport's logical clock to generate timestamp").
//!
//! A [`Timestamp`] is `(counter, client)`: ties between equal counters are broken by the
//! client id, which makes the order total. The timestamp of an acquisition is also its
//! identity on the wire: a replica queues, grants and tombstones `Timestamp`s, so two
//! concurrent acquisitions by the same client are two distinct entries.
//!
//! The clock is hybrid: [`LamportClock::stamp`] takes `max(last + 1, now in µs)`. With
//! a counter starting at zero a fresh client would stamp `(1, id)` and overtake every
//! waiter already queued; floored on the driver's clock the order is close to arrival
//! order (exact in the simulator, within clock skew on a real network), while
//! [`LamportClock::observe`] keeps the Lamport guarantee for causally related events.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A totally ordered Lamport timestamp: `(counter, client)`, compared in that order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Timestamp<C> {
    /// Logical counter (hybrid: never below the stamping client's clock in µs).
    pub counter: u64,
    /// The client that took the timestamp; breaks ties.
    pub client: C,
}

impl<C> Timestamp<C> {
    /// A timestamp from its parts.
    pub fn new(counter: u64, client: C) -> Self {
        Timestamp { counter, client }
    }
}

impl<C: fmt::Display> fmt::Display for Timestamp<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {})", self.counter, self.client)
    }
}

/// A Lamport clock floored on the driver's clock.
#[derive(Clone, Debug, Default)]
pub struct LamportClock {
    /// Last counter handed out or observed.
    last: u64,
}

impl LamportClock {
    /// A clock at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// The last counter handed out or observed.
    pub fn current(&self) -> u64 {
        self.last
    }

    /// Advances past a counter seen in a message (Lamport's receive rule).
    pub fn observe(&mut self, counter: u64) {
        self.last = self.last.max(counter);
    }

    /// A fresh timestamp for `client`, strictly above everything handed out or observed.
    pub fn stamp<C>(&mut self, now: Duration, client: C) -> Timestamp<C> {
        self.last = self.last.saturating_add(1).max(micros(now));
        Timestamp::new(self.last, client)
    }
}

/// A `Duration` in whole microseconds, saturating.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_counter_then_client() {
        assert!(Timestamp::new(1, 9) < Timestamp::new(2, 0));
        assert!(Timestamp::new(2, 1) < Timestamp::new(2, 2));
        assert_eq!(Timestamp::new(2, 2), Timestamp::new(2, 2));
    }

    #[test]
    fn stamps_strictly_increase_even_when_time_stands_still() {
        let mut c = LamportClock::new();
        let a = c.stamp(Duration::from_micros(10), 1u8);
        let b = c.stamp(Duration::from_micros(10), 1u8);
        assert!(a < b);
        assert_eq!(a.counter, 10);
        assert_eq!(b.counter, 11);
    }

    #[test]
    fn observe_moves_past_remote_counters() {
        let mut c = LamportClock::new();
        c.observe(1_000);
        let t = c.stamp(Duration::from_micros(5), 0u8);
        assert_eq!(t.counter, 1_001);
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        let mut c = LamportClock::new();
        c.observe(u64::MAX);
        let t = c.stamp(Duration::ZERO, 0u8);
        assert_eq!(t.counter, u64::MAX);
    }
}
