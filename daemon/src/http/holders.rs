//! The locks the daemon holds for HTTP clients, each under a client lease kept by one
//! task ([`hold`]), and the count of acquires waiting per lock name.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sigma_node::metrics::Metrics;
use sigma_node::{LockError, LockGuard};
use tokio::sync::{mpsc, oneshot};

use super::*;

/// `(valid_until_ms since the epoch, valid_for_ms from now)` of a deadline.
pub(super) fn deadline_ms(at: Instant) -> (u64, u64) {
    let left = at.saturating_duration_since(Instant::now());
    let abs = SystemTime::now() + left;
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    (ms(abs.duration_since(UNIX_EPOCH).unwrap_or_default()), ms(left))
}

/// A holder's proof of ownership: 128 random bits from the OS, answered once by the
/// acquire and required by keep-alive and release. Never shown by status, locks,
/// inspect, metrics or logs (its `Debug` hides it); the fencing token is public.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct LeaseId(u128);

impl LeaseId {
    pub(super) fn new() -> Result<LeaseId, rand::Error> {
        use rand::RngCore as _;
        let mut bytes = [0u8; 16];
        rand::rngs::OsRng.try_fill_bytes(&mut bytes)?;
        Ok(LeaseId(u128::from_be_bytes(bytes)))
    }

    /// 32 hexadecimal digits, as [`LeaseId::to_hex`] writes them (either case).
    pub(super) fn parse(s: &str) -> Option<LeaseId> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u128::from_str_radix(s, 16).ok().map(LeaseId)
    }

    pub(super) fn to_hex(self) -> String {
        format!("{:032x}", self.0)
    }
}

impl std::fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseId(..)")
    }
}

pub(super) enum HolderCmd {
    /// Answers the deadline told to the client (see [`Acquired::valid_until_ms`]).
    Info(oneshot::Sender<Instant>),
    /// Renews the client lease; answers the new deadline and the lease length, or `None`
    /// while the daemon stops (the lease is not renewed then).
    KeepAlive(oneshot::Sender<Option<(Instant, Duration)>>),
    Release(oneshot::Sender<Result<(), LockError>>),
    /// Replaces the lock's value; answers its version.
    SetValue(Vec<u8>, oneshot::Sender<Result<u32, LockError>>),
}

/// A lock held for an HTTP client, keyed in the [`Table`] by its lease id.
pub(super) struct Entry {
    pub(super) name: String,
    pub(super) token: u64,
    pub(super) tx: mpsc::Sender<HolderCmd>,
}

/// The locks held for HTTP clients, by lease id; `changed` wakes a stop that waits for
/// the table to empty.
#[derive(Clone, Default)]
pub(super) struct Table {
    pub(super) entries: Arc<Mutex<HashMap<LeaseId, Entry>>>,
    pub(super) changed: Arc<tokio::sync::Notify>,
}

impl Table {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseId, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    /// The holder task of `lease`, if it holds `name` (or a slot of semaphore `name`)
    /// under `token`.
    pub(super) fn holder(&self, name: &str, token: u64, lease: LeaseId) -> Option<mpsc::Sender<HolderCmd>> {
        let named = |e: &Entry| {
            e.name == name || sigma_node::semaphore::parse_slot_lock_name(&e.name).is_some_and(|(s, _)| s == name)
        };
        self.lock().get(&lease).filter(|e| named(e) && e.token == token).map(|e| e.tx.clone())
    }

    pub(super) fn remove(&self, lease: LeaseId, metrics: &Metrics) {
        let mut t = self.lock();
        t.remove(&lease);
        metrics.set_http_locks_held(t.len());
        drop(t);
        self.changed.notify_waiters();
    }
}

/// The earlier of the lock's validity and the end of the client lease: the one deadline
/// a holder is told, before which the daemon never lets the lock go.
pub(super) fn deadline(guard: &LockGuard, lease_end: tokio::time::Instant) -> Instant {
    guard.valid_until().min(lease_end.into_std())
}

/// Holds `guard` for an HTTP client until it releases, its lease of `ttl` runs out
/// without a keep-alive, or the lock is lost: one task per held lock owns the guard,
/// answers queries, renews the lease (not while the daemon stops), releases on command
/// and drops the entry when the lock is lost. Answers the deadline told at acquire.
pub(super) fn hold(s: &AppState, lease: LeaseId, guard: LockGuard, ttl: Duration) -> Instant {
    let (name, token) = (guard.name().to_owned(), guard.token());
    let (tx, mut rx) = mpsc::channel(8);
    {
        let mut t = s.held.lock();
        t.insert(lease, Entry { name: name.clone(), token, tx });
        s.metrics.set_http_locks_held(t.len());
    }
    let mut expires = tokio::time::Instant::now() + ttl;
    let told = deadline(&guard, expires);
    let (table, metrics, stopping) = (s.held.clone(), s.metrics.clone(), s.stopping.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(expires) => {
                    table.remove(lease, &metrics);
                    metrics.client_lease_expired();
                    tracing::warn!(%name, token, ?ttl, "HTTP client stopped renewing its lease: lock released");
                    let _ = guard.release().await;
                    return;
                }
                () = guard.lost() => {
                    table.remove(lease, &metrics);
                    tracing::warn!(%name, token, "a lock held for an HTTP client was lost");
                    return;
                }
                cmd = rx.recv() => match cmd {
                    Some(HolderCmd::Info(reply)) => {
                        let _ = reply.send(deadline(&guard, expires));
                    }
                    Some(HolderCmd::KeepAlive(reply)) => {
                        if *stopping.borrow() {
                            let _ = reply.send(None);
                        } else {
                            expires = tokio::time::Instant::now() + ttl;
                            let _ = reply.send(Some((deadline(&guard, expires), ttl)));
                        }
                    }
                    Some(HolderCmd::SetValue(value, reply)) => {
                        let _ = reply.send(guard.set_value(value).await);
                    }
                    Some(HolderCmd::Release(reply)) => {
                        table.remove(lease, &metrics);
                        let _ = reply.send(guard.release().await);
                        return;
                    }
                    // Unreachable while the entry is in the table, which holds the sender.
                    None => {
                        table.remove(lease, &metrics);
                        let _ = guard.release().await;
                        return;
                    }
                }
            }
        }
    });
    told
}

/// Counts the acquires waiting for each lock name on this daemon; an entry lives while
/// one does, so the map holds at most as many names as acquires in flight.
#[derive(Clone, Default)]
pub(super) struct Waiters(Arc<Mutex<HashMap<String, usize>>>);

/// One waiting acquire, counted until dropped (answered, or its client went away).
pub(super) struct Waiting {
    pub(super) waiters: Waiters,
    pub(super) name: String,
}

impl Waiters {
    pub(super) fn enter(&self, name: &str, max: usize) -> Option<Waiting> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // `max` is at least 1, so a name refused here already has a waiting acquire.
        let n = map.entry(name.to_owned()).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Waiting { waiters: self.clone(), name: name.to_owned() })
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut map = self.waiters.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn deadlines_in_the_past_are_zero_from_now() {
        let (abs, left) = deadline_ms(Instant::now() - Duration::from_secs(1));
        assert_eq!(left, 0);
        assert!(abs > 1_600_000_000_000);
        let (_, left) = deadline_ms(Instant::now() + Duration::from_secs(10));
        assert!((9_000..=10_000).contains(&left), "{left}");
    }
}
