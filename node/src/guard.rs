//! [`LockGuard`]: a held lock.

use std::fmt;
use std::time::Instant;

use sigma_behaviour::AcquisitionId;
use tokio::sync::{mpsc, oneshot, watch};

use crate::error::LockError;

/// What the event loop publishes about a held lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GuardState {
    /// Exclusion guaranteed until then (moves forward as the core renews the lease).
    pub(crate) valid_until: Instant,
    /// The core reported the lock lost (or the node released it at shutdown).
    pub(crate) lost: bool,
}

/// What a guard asks of the event loop, on its own channel (the guard knows nothing of
/// the node's other commands). The event loop takes these before commands, so a release
/// sent before a new `lock` call is applied first, and in order, so a value set before a
/// release is set first.
pub(crate) enum GuardMsg {
    Release(Release),
    /// Replace the acquisition's value; answers its version (`None`: no longer held).
    SetValue {
        id: AcquisitionId,
        value: Vec<u8>,
        reply: oneshot::Sender<Result<Option<u32>, LockError>>,
    },
}

/// A guard's release.
pub(crate) struct Release {
    /// The acquisition to release.
    pub(crate) id: AcquisitionId,
    /// Answered once the release is in hand (`LockGuard::release`); `None` from `Drop`.
    pub(crate) reply: Option<oneshot::Sender<()>>,
}

/// A held lock.
///
/// The lease is renewed in the background by the node while the guard exists. The lock
/// is released by [`LockGuard::release`] or, without waiting, when the guard is dropped.
/// Exclusion is guaranteed until [`LockGuard::valid_until`]; [`LockGuard::lost`]
/// resolves when it no longer is (the lock was lost, its lease ran out, or the node
/// stopped). Work protected by the lock should stop then, and writes to external
/// systems should carry the [`LockGuard::token`].
///
/// # Fencing token
///
/// The token is the largest grant stamp among the replica votes held at the win. Grant
/// stamps are hybrid logical clocks: `max(wall clock in µs, last stamp + 1, any token
/// the replica was told about)`, and the holder tells its replicas its token with every
/// renewal and with its RELEASE. Guarantee as built: a later holder of the same lock
/// gets a larger token than an earlier one, unless all of the replicas the two quorums
/// share (at least 2m − n) lost their memory in between (the same event that can break
/// exclusion), and even then as long as the peers' clocks differ by less than the time
/// between the two acquisitions. Tokens are not consecutive, and tokens of different
/// locks are unrelated. A protected resource should remember the largest token it has
/// seen per lock and refuse writes carrying a smaller one.
#[must_use = "dropping a LockGuard releases the lock at once"]
pub struct LockGuard {
    name: String,
    token: u64,
    id: AcquisitionId,
    releases: mpsc::Sender<GuardMsg>,
    state: watch::Receiver<GuardState>,
    /// Release already sent (or detached): nothing to do on drop.
    done: bool,
    /// Distinct peers hosting the votes at the win.
    distinct_peers: usize,
}

impl LockGuard {
    pub(crate) fn new(
        name: String,
        token: u64,
        id: AcquisitionId,
        releases: mpsc::Sender<GuardMsg>,
        state: watch::Receiver<GuardState>,
        distinct_peers: usize,
    ) -> Self {
        LockGuard { name, token, id, releases, state, done: false, distinct_peers }
    }

    /// Distinct peers whose replicas voted for this holder at the win (at least the
    /// quorum diversity D asked for).
    pub fn distinct_peers(&self) -> usize {
        self.distinct_peers
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fencing token (see the type's documentation for the guarantee).
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Exclusion is guaranteed until then. Moves forward as the lease is renewed
    /// (refreshed by the node at least every 200 ms).
    pub fn valid_until(&self) -> Instant {
        self.state.borrow().valid_until
    }

    /// True once exclusion is no longer guaranteed: the lock was lost, its lease ran
    /// out, or the node stopped.
    pub fn is_lost(&self) -> bool {
        let s = *self.state.borrow();
        s.lost || Instant::now() >= s.valid_until || self.state.has_changed().is_err()
    }

    /// Resolves when exclusion is no longer guaranteed (see [`LockGuard::is_lost`]).
    /// Cancel-safe; may be awaited from several places through `&self`.
    pub async fn lost(&self) {
        let mut state = self.state.clone();
        loop {
            let s = *state.borrow_and_update();
            if s.lost {
                return;
            }
            let until = tokio::time::Instant::from_std(s.valid_until);
            tokio::select! {
                changed = state.changed() => {
                    if changed.is_err() {
                        return; // the node stopped
                    }
                }
                () = tokio::time::sleep_until(until) => {
                    // Renewals may have published a later deadline in the meantime.
                    if state.borrow().valid_until <= s.valid_until {
                        return;
                    }
                }
            }
        }
    }

    /// Releases the lock and waits until the node has taken the release in hand (the
    /// RELEASE messages are then on their way to the replicas).
    ///
    /// Returns `Err(LockError::Lost)` if the lock had been lost before (exclusion was
    /// not guaranteed for the whole time it was held; whatever was left of it has been
    /// released), `Err(LockError::NodeStopped)` if the node is gone.
    pub async fn release(mut self) -> Result<(), LockError> {
        let was_lost = self.is_lost();
        let (tx, rx) = oneshot::channel();
        let release = GuardMsg::Release(Release { id: self.id, reply: Some(tx) });
        self.releases.send(release).await.map_err(|_| LockError::NodeStopped)?;
        self.done = true;
        rx.await.map_err(|_| LockError::NodeStopped)?;
        if was_lost {
            Err(LockError::Lost)
        } else {
            Ok(())
        }
    }

    /// Attaches `value` (at most [`sigma_behaviour::wire::MAX_VALUE_LEN`] bytes) to the
    /// held lock, replacing the one before (a leader proclaiming a new address). Whoever
    /// inspects or watches the lock reads it from this node, with the token; answers
    /// the value's version (1 for a value given at acquire, then one more each time).
    /// `Err(LockError::Lost)` once the lock is lost.
    pub async fn set_value(&self, value: impl Into<Vec<u8>>) -> Result<u32, LockError> {
        let value = value.into();
        if value.len() > sigma_behaviour::wire::MAX_VALUE_LEN {
            return Err(LockError::ValueTooLarge(value.len()));
        }
        if self.is_lost() {
            return Err(LockError::Lost);
        }
        let (tx, rx) = oneshot::channel();
        let msg = GuardMsg::SetValue { id: self.id, value, reply: tx };
        self.releases.send(msg).await.map_err(|_| LockError::NodeStopped)?;
        rx.await.map_err(|_| LockError::NodeStopped)??.ok_or(LockError::Lost)
    }

    /// Forgets the guard without releasing the lock: the node keeps renewing it until
    /// [`crate::NodeHandle::release_by_token`] is called with the returned name and
    /// token (or the node stops). Returns `(name, token)`.
    pub fn into_detached(mut self) -> (String, u64) {
        self.done = true;
        (std::mem::take(&mut self.name), self.token)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let release = GuardMsg::Release(Release { id: self.id, reply: None });
        match self.releases.try_send(release) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Closed(_)) => {} // the node is gone, and the lock with it
            Err(mpsc::error::TrySendError::Full(release)) => {
                let releases = self.releases.clone();
                match tokio::runtime::Handle::try_current() {
                    Ok(runtime) => {
                        runtime.spawn(async move {
                            let _ = releases.send(release).await;
                        });
                    }
                    // Outside a runtime: a thread may block until there is room.
                    Err(_) => {
                        let _ = std::thread::Builder::new()
                            .name("sigma-release".into())
                            .spawn(move || releases.blocking_send(release));
                    }
                }
            }
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.name)
            .field("token", &self.token)
            .field("id", &self.id)
            .field("valid_until", &self.valid_until())
            .field("lost", &self.is_lost())
            .finish()
    }
}
