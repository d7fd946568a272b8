//! Virtual clocks for the checkers: a process's clock reads real (virtual) time plus a
//! fixed offset, running `ppm` parts per million fast (negative: slow) since `start`.
//! Shared by `properties.rs` and the model checker (`model/checker.rs`).

use std::time::Duration;

use sigma_behaviour::proto::Time;

/// What a clock `offset` ahead and `ppm` fast since `start` reads at real time `now`.
pub fn clock_at(now: Time, start: Time, offset: Duration, ppm: i64) -> Time {
    let elapsed = now.saturating_sub(start).as_nanos() as i128;
    let drift = elapsed * i128::from(ppm) / 1_000_000;
    let ns = (now.as_nanos() as i128 + offset.as_nanos() as i128 + drift).max(0);
    Duration::from_nanos(u64::try_from(ns).expect("virtual time fits in u64 ns"))
}

/// The earliest real time (not before `start`) at which that clock reads `local` or
/// later: when a timer set for `local` fires. It may be past, for a timer overdue; with
/// no drift it is `local - offset`.
pub fn real_at(local: Time, start: Time, offset: Duration, ppm: i64) -> Time {
    let ahead = local.as_nanos() as i128 - start.as_nanos() as i128 - offset.as_nanos() as i128;
    let elapsed = (ahead * 1_000_000).div_euclid(1_000_000 + i128::from(ppm)).max(0);
    let mut t = start + Duration::from_nanos(u64::try_from(elapsed).expect("virtual time fits in u64 ns"));
    while clock_at(t, start, offset, ppm) < local {
        t += Duration::from_nanos(1);
    }
    t
}
