//! The daemon's heap policy: one glibc arena, and a burst's freed memory handed back to
//! the system once, not at every tick.
//!
//! glibc's malloc keeps freed memory in its arena: after a burst of lock names the
//! daemon's RSS would stay at its peak although the idle replicas are gone (dropped 5 s
//! after their last release). `malloc_trim` gives the free pages back, but each later
//! allocation that lands on such a page faults it in again: trimming every tick made the
//! locks after a burst slower (3 nodes, 5,000 names: lock+release p50 +19.9%), because a
//! steady load frees and reallocates its chunks between two ticks, on pages scattered by
//! the burst. So the trimmer looks every `--heap-trim-interval` at the allocator's free
//! bytes (`mallinfo2`) and trims only when they rose by [`TRIM_STEP`] since their lowest
//! point after the last trim: a burst that was freed is given back within one interval; a
//! steady load is left alone.

use std::time::Duration;

/// How much the allocator's free bytes must grow before a trim: about 1,000 idle
/// replicas (3–4 KB each).
pub const TRIM_STEP: usize = 4 << 20;

/// When to trim, from the allocator's free bytes seen at each tick.
#[derive(Debug)]
pub struct TrimPolicy {
    step: usize,
    /// The fewest free bytes seen since the last trim (or the first tick).
    low: Option<usize>,
}

impl TrimPolicy {
    pub fn new(step: usize) -> Self {
        Self { step, low: None }
    }

    /// Whether to trim now, `free` being the allocator's free bytes. Trims when they
    /// rose by `step` above their low since the last trim; that low then starts again
    /// from `free`.
    pub fn tick(&mut self, free: usize) -> bool {
        let low = self.low.map_or(free, |low| low.min(free));
        if free - low >= self.step {
            self.low = Some(free);
            true
        } else {
            self.low = Some(low);
            false
        }
    }
}

/// One glibc heap arena for the daemon, set before any thread starts (unless
/// `MALLOC_ARENA_MAX` says otherwise): with one arena per thread, each keeps its own
/// fragments of a burst of replicas and `malloc_trim` gives back little. Measured with
/// `sigma-testnet soak` (5 nodes, 3,000 names, peaks of 12,700–51,000 replicas): RSS
/// 60 s after the burst +16 to +25 MB above the start with the default arenas, +7.5 to
/// +8.9 MB with one. The daemon's hot path is one event-loop task, so one arena costs
/// little contention.
pub fn one_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt takes two integers and changes an allocator setting; called
        // before the runtime's threads exist.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}

/// Every `interval` (zero: never) reads the allocator's free bytes and trims when
/// [`TrimPolicy`] says so, off the runtime's threads. Returns at once; the task runs
/// until the runtime stops.
pub fn spawn_trimmer(interval: Duration) {
    if interval.is_zero() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut policy = TrimPolicy::new(TRIM_STEP);
        loop {
            tick.tick().await;
            let trimmed = tokio::task::spawn_blocking(move || {
                // SAFETY: mallinfo2 takes no argument and returns the allocator's
                // statistics by value.
                let free = unsafe { libc::mallinfo2() }.fordblks;
                let trim = policy.tick(free);
                if trim {
                    // SAFETY: malloc_trim takes no pointer; it only returns the
                    // allocator's free pages to the system.
                    unsafe { libc::malloc_trim(0) };
                }
                (policy, trim.then_some(free))
            })
            .await;
            match trimmed {
                Ok((p, free)) => {
                    policy = p;
                    if let Some(free) = free {
                        tracing::debug!(free_bytes = free, "heap trimmed");
                    }
                }
                Err(_) => return,
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: usize = 1 << 20;

    #[test]
    fn a_steady_load_is_never_trimmed_but_a_freed_burst_is_once() {
        let mut p = TrimPolicy::new(4 * MB);
        // A steady load: free bytes wander by less than the step.
        for free in [10, 12, 9, 11, 12, 10, 12].map(|m| m * MB) {
            assert!(!p.tick(free), "trimmed a steady load at {free} free bytes");
        }
        // A burst allocates (free falls), then its replicas go (free rises by 60 MB).
        assert!(!p.tick(2 * MB));
        assert!(p.tick(62 * MB), "a freed burst was not trimmed");
        // Trimmed pages stay free chunks to malloc: the same figure does not trim again.
        for _ in 0..5 {
            assert!(!p.tick(62 * MB), "trimmed again without new free memory");
        }
        // A burst freed in several ticks is trimmed as it goes.
        assert!(!p.tick(60 * MB));
        assert!(p.tick(65 * MB));
        assert!(!p.tick(67 * MB));
        assert!(p.tick(70 * MB));
    }

    #[test]
    fn the_first_tick_only_sets_the_low_mark() {
        let mut p = TrimPolicy::new(4 * MB);
        assert!(!p.tick(500 * MB), "the first tick has nothing to compare with");
        assert!(p.tick(504 * MB));
    }
}
