//! Random backoff policies for protocols that retry after a collision (the strawman of
//! §3, and Chockler–Malkhi–Reiter's exponential variant).

use std::time::Duration;

use rand::Rng;

/// How long a loser waits before its next attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backoff {
    /// Uniform in `[0, window)` whatever the attempt: the paper's "random period".
    Constant {
        /// Upper end of the uniform delay.
        window: Duration,
    },
    /// Uniform in `[0, min(cap, base · 2^attempt))`: binary exponential backoff, as in
    /// Chockler, Malkhi and Reiter (2001).
    Exponential {
        /// Window of the first retry.
        base: Duration,
        /// Largest window.
        cap: Duration,
    },
}

impl Backoff {
    /// The delay before attempt `attempt + 1`, after `attempt` failed ones (≥ 1).
    pub fn delay<R: Rng + ?Sized>(&self, attempt: u32, rng: &mut R) -> Duration {
        let window = match *self {
            Backoff::Constant { window } => window,
            Backoff::Exponential { base, cap } => {
                let shift = attempt.saturating_sub(1).min(32);
                base.saturating_mul(1u32 << shift.min(31)).min(cap)
            }
        };
        if window.is_zero() {
            return Duration::ZERO;
        }
        Duration::from_nanos(rng.gen_range(0..u64::try_from(window.as_nanos()).unwrap_or(u64::MAX)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn constant_stays_in_its_window() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let b = Backoff::Constant { window: Duration::from_millis(100) };
        for attempt in 1..50 {
            assert!(b.delay(attempt, &mut rng) < Duration::from_millis(100));
        }
    }

    #[test]
    fn exponential_doubles_up_to_its_cap() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let b = Backoff::Exponential { base: Duration::from_millis(10), cap: Duration::from_secs(1) };
        let max_of = |attempt, rng: &mut ChaCha8Rng| (0..2000).map(|_| b.delay(attempt, rng)).max().unwrap();
        assert!(max_of(1, &mut rng) < Duration::from_millis(10));
        let third = max_of(3, &mut rng);
        assert!(third >= Duration::from_millis(30) && third < Duration::from_millis(40), "{third:?}");
        let capped = max_of(40, &mut rng);
        assert!(capped >= Duration::from_millis(990) && capped < Duration::from_secs(1), "{capped:?}");
    }

    #[test]
    fn zero_window_means_no_delay() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        assert_eq!(Backoff::Constant { window: Duration::ZERO }.delay(1, &mut rng), Duration::ZERO);
    }
}
