//! Semaphores: at most K holders of a name at once, built from K ordinary locks.
//!
//! Slot `i` of semaphore `NAME` is the lock [`slot_lock_name`]`(NAME, i)` =
//! `NAME/.slot/i`. A caller asks for all K slot locks at once and keeps the first it
//! wins; the other attempts are dropped, which abandons a wait and releases a lock won
//! meanwhile (a won lock whose caller has gone is released by the event loop). So:
//!
//! ```text
//!   acquire_slot(NAME, K)
//!     ├─ lock NAME/.slot/0 ─┐
//!     ├─ lock NAME/.slot/1 ─┼─ first win ──▶ Keep (SlotGuard: slot i, its token)
//!     └─ lock NAME/.slot/… ─┘  later wins ─▶ Release; the waits still open ─▶ abandoned
//! ```
//!
//! At most K holders follows from each slot lock's exclusion (the lock's own guarantee,
//! model-checked in sigma-behaviour) and from each holder keeping exactly one slot
//! ([`Picker`], whose every interleaving with abstract exclusive slots is explored by
//! `node/tests/semaphore_model.rs`). A holder's fencing token is its slot lock's: it
//! orders the holders of one slot, not those of different slots.
//!
//! Callers of one name that pass different K share slots by index: holders never exceed
//! the largest K in use. Names with a `.slot` segment are reserved for the slot locks:
//! [`crate::NodeHandle::lock_with`] refuses them ([`LockError::ReservedName`]), so a
//! plain lock never takes a semaphore's slot by accident (an operator may still inspect
//! or break a slot lock by its name). The design note is docs/design/semaphores.md.
//!
//! ```no_run
//! # async fn demo(handle: sigma_node::NodeHandle) -> Result<(), sigma_node::LockError> {
//! use sigma_node::LockOptions;
//!
//! // At most 2 builds at once.
//! let slot = handle.acquire_slot("builds/pool", 2, LockOptions::default()).await?;
//! println!("slot {} of {}: lock {}, token {}", slot.slot(), slot.name(), slot.lock_name(), slot.token());
//! // ... work until slot.lost() resolves, passing the token to the protected store ...
//! slot.release().await?;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::time::Instant;

use futures::stream::{FuturesUnordered, StreamExt};

use crate::error::LockError;
use crate::guard::LockGuard;
use crate::node::{LockOptions, NodeHandle};

/// Most slots of a semaphore: one acquire asks for every slot lock at once, K times
/// the messages of a lock acquire while it waits.
pub const MAX_SLOTS: u16 = 64;
/// The path segment that marks a slot lock, reserved in lock names.
pub const SLOT_SEGMENT: &str = ".slot";
/// Longest semaphore name: its slot locks' names (`/.slot/63` more) stay within the
/// lock name's bound.
pub const MAX_SEMAPHORE_NAME_LEN: usize = sigma_behaviour::wire::MAX_RESOURCE_LEN - SLOT_SEGMENT.len() - 4;

/// The lock that is slot `slot` of semaphore `name`: `name/.slot/slot`.
pub fn slot_lock_name(name: &str, slot: u16) -> String {
    format!("{name}/{SLOT_SEGMENT}/{slot}")
}

/// The semaphore and slot of a slot lock's name (`NAME/.slot/i` → `(NAME, i)`).
pub fn parse_slot_lock_name(lock: &str) -> Option<(&str, u16)> {
    let (rest, slot) = lock.rsplit_once('/')?;
    let name = rest.strip_suffix(SLOT_SEGMENT)?.strip_suffix('/')?;
    let slot: u16 = slot.parse().ok().filter(|s| *s < MAX_SLOTS)?;
    (slot_lock_name(name, slot) == lock).then_some((name, slot))
}

/// Whether `name` has a segment reserved for slot locks (`.slot`).
pub fn is_reserved(name: &str) -> bool {
    name.split('/').any(|segment| segment == SLOT_SEGMENT)
}

/// Refuses a lock name reserved for slot locks.
pub(crate) fn refuse_reserved(name: &str) -> Result<(), LockError> {
    if is_reserved(name) {
        Err(LockError::ReservedName(name.to_owned()))
    } else {
        Ok(())
    }
}

/// Checks a semaphore's name and slot count.
pub fn check(name: &str, slots: u16) -> Result<(), LockError> {
    if !(1..=MAX_SLOTS).contains(&slots) {
        return Err(LockError::BadSlots(format!("slots must be between 1 and {MAX_SLOTS}, not {slots}")));
    }
    sigma_behaviour::wire::validate_resource(name).map_err(|_| LockError::BadName)?;
    if name.len() > MAX_SEMAPHORE_NAME_LEN {
        return Err(LockError::BadSlots(format!(
            "a semaphore's name is at most {MAX_SEMAPHORE_NAME_LEN} bytes (its slot locks' names add /{SLOT_SEGMENT}/N)"
        )));
    }
    refuse_reserved(name)
}

/// What a caller does with a slot lock it won.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Won {
    /// The first win: keep it; the caller holds this slot, and abandons the others.
    Keep,
    /// A slot is kept already: release this one.
    Release,
}

/// The construction's decisions for one caller, apart from any I/O (the async driver is
/// [`NodeHandle::acquire_slot`]; `node/tests/semaphore_model.rs` drives it over every
/// interleaving). Told of each attempt's outcome, it keeps the first win and releases
/// any later one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Picker {
    slots: u16,
    kept: Option<u16>,
    /// Slots whose attempt ended, without a win or with a win released (a bit each:
    /// `slots` ≤ 64).
    ended: u64,
}

impl Picker {
    /// A caller about to ask for slots `0..slots`.
    pub fn new(slots: u16) -> Picker {
        debug_assert!((1..=MAX_SLOTS).contains(&slots));
        Picker { slots, kept: None, ended: 0 }
    }

    /// Slot `slot`'s lock was won.
    pub fn won(&mut self, slot: u16) -> Won {
        if self.kept.is_some() {
            self.ended |= 1u64 << slot;
            return Won::Release;
        }
        self.kept = Some(slot);
        Won::Keep
    }

    /// Slot `slot`'s attempt ended without a win. True when the whole acquire has
    /// failed: nothing kept, and the error is `hard` (the same for every slot: a bad
    /// name or quorum, a stopped node) or every slot's attempt has ended.
    pub fn failed(&mut self, slot: u16, hard: bool) -> bool {
        self.ended |= 1u64 << slot;
        self.kept.is_none() && (hard || self.ended.count_ones() == u32::from(self.slots))
    }

    /// The slot kept, once one is.
    pub fn kept(&self) -> Option<u16> {
        self.kept
    }

    /// The slots still to abandon once one is kept: every other one whose attempt has
    /// not ended (waiting, or won and not yet told).
    pub fn to_abandon(&self) -> impl Iterator<Item = u16> + '_ {
        (0..self.slots).filter(move |s| Some(*s) != self.kept && self.ended & (1u64 << s) == 0)
    }
}

/// An error that every slot's attempt would give alike: no use waiting for the others.
fn is_hard(e: &LockError) -> bool {
    !matches!(e, LockError::Timeout | LockError::NotReady(_) | LockError::Lost)
}

/// A held slot of a semaphore: a [`LockGuard`] on the slot's lock, and which slot it is.
/// Released by [`SlotGuard::release`] or when dropped, as a lock guard.
#[must_use = "dropping a SlotGuard releases the slot at once"]
pub struct SlotGuard {
    name: String,
    slot: u16,
    slots: u16,
    guard: LockGuard,
}

impl SlotGuard {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The slot held, in `0..slots()`.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The slot count this holder asked for (`slot + 1` from [`NodeHandle::lock_slot`]).
    pub fn slots(&self) -> u16 {
        self.slots
    }

    /// The slot's lock name ([`slot_lock_name`]): what `inspect` and a break-lock name.
    pub fn lock_name(&self) -> &str {
        self.guard.name()
    }

    /// The slot lock's fencing token: larger for each later holder of *this slot*
    /// (see [`LockGuard`]); tokens of different slots are unrelated.
    pub fn token(&self) -> u64 {
        self.guard.token()
    }

    /// The slot is held for sure until then (see [`LockGuard::valid_until`]).
    pub fn valid_until(&self) -> Instant {
        self.guard.valid_until()
    }

    /// See [`LockGuard::is_lost`].
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Resolves when the slot is no longer held for sure (see [`LockGuard::lost`]).
    pub async fn lost(&self) {
        self.guard.lost().await
    }

    /// Distinct peers whose replicas voted for this holder at the win.
    pub fn distinct_peers(&self) -> usize {
        self.guard.distinct_peers()
    }

    /// Releases the slot (see [`LockGuard::release`]).
    pub async fn release(self) -> Result<(), LockError> {
        self.guard.release().await
    }

    /// The slot lock's guard (for code that keeps lock guards, e.g. the HTTP holders).
    pub fn into_lock_guard(self) -> LockGuard {
        self.guard
    }
}

impl fmt::Debug for SlotGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotGuard")
            .field("name", &self.name)
            .field("slot", &self.slot)
            .field("slots", &self.slots)
            .field("lock", &self.guard)
            .finish()
    }
}

impl NodeHandle {
    /// Takes one of the `slots` slots of semaphore `name` (at most `slots` holders at
    /// once; see [`crate::semaphore`]). Asks for every slot lock at once with `options`
    /// (quorum, timeout: [`LockError::Timeout`] when none was won in time) and keeps the
    /// first won. Cancel-safe: dropping the future abandons every attempt.
    pub async fn acquire_slot(&self, name: &str, slots: u16, options: LockOptions) -> Result<SlotGuard, LockError> {
        check(name, slots)?;
        let mut attempts: FuturesUnordered<_> = (0..slots)
            .map(|slot| {
                let (lock, options) = (slot_lock_name(name, slot), options.clone());
                async move { (slot, self.lock_unchecked(&lock, options).await) }
            })
            .collect();
        let mut picker = Picker::new(slots);
        while let Some((slot, result)) = attempts.next().await {
            match result {
                Ok(guard) => match picker.won(slot) {
                    Won::Keep => {
                        tracing::debug!(semaphore = %name, slot, token = guard.token(), "slot acquired");
                        // Dropping the other attempts abandons their waits; a win
                        // already in one's answer is released as its guard drops.
                        return Ok(SlotGuard { name: name.to_owned(), slot, slots, guard });
                    }
                    Won::Release => drop(guard),
                },
                Err(e) => {
                    if picker.failed(slot, is_hard(&e)) {
                        return Err(e);
                    }
                }
            }
        }
        // Every attempt ended, none won (`failed` answered true for the last one).
        Err(LockError::Timeout)
    }
}

impl NodeHandle {
    /// Takes slot `slot` of semaphore `name` itself (a writer of a read-write lock built
    /// on the semaphore takes every slot this way, in index order; see
    /// docs/design/semaphores.md). Waits as [`NodeHandle::lock_with`] does.
    pub async fn lock_slot(&self, name: &str, slot: u16, options: LockOptions) -> Result<SlotGuard, LockError> {
        check(name, slot.saturating_add(1))?;
        let guard = self.lock_unchecked(&slot_lock_name(name, slot), options).await?;
        Ok(SlotGuard { name: name.to_owned(), slot, slots: slot + 1, guard })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_round_trip_and_are_reserved() {
        assert_eq!(slot_lock_name("jobs/build", 3), "jobs/build/.slot/3");
        assert_eq!(parse_slot_lock_name("jobs/build/.slot/3"), Some(("jobs/build", 3)));
        assert_eq!(parse_slot_lock_name("jobs/build/.slot/03"), None);
        assert_eq!(parse_slot_lock_name("jobs/build/.slot/64"), None);
        assert_eq!(parse_slot_lock_name("jobs/.slots/1"), None);
        assert_eq!(parse_slot_lock_name(".slot/1"), None);
        assert!(is_reserved("a/.slot/1") && is_reserved(".slot") && is_reserved("a/.slot"));
        assert!(!is_reserved("a/.slots/1") && !is_reserved("a.slot") && !is_reserved("x/slot/1"));
        let longest = "x".repeat(MAX_SEMAPHORE_NAME_LEN);
        assert_eq!(MAX_SEMAPHORE_NAME_LEN, 191);
        assert!(sigma_behaviour::wire::validate_resource(&slot_lock_name(&longest, MAX_SLOTS - 1)).is_ok());
    }

    #[test]
    fn bad_semaphores_are_refused_clearly() {
        assert!(matches!(check("a", 0), Err(LockError::BadSlots(m)) if m.contains("between 1 and 64")));
        assert!(matches!(check("a", 65), Err(LockError::BadSlots(_))));
        assert!(check("a", 1).is_ok() && check("a", 64).is_ok());
        assert_eq!(check("a b", 2), Err(LockError::BadName));
        assert!(matches!(check(&"x".repeat(MAX_SEMAPHORE_NAME_LEN + 1), 2), Err(LockError::BadSlots(_))));
        assert_eq!(check("a/.slot", 2), Err(LockError::ReservedName("a/.slot".into())));
    }

    #[test]
    fn the_picker_keeps_the_first_win_only() {
        let mut p = Picker::new(3);
        assert!(!p.failed(1, false));
        assert_eq!(p.won(2), Won::Keep);
        assert_eq!(p.to_abandon().collect::<Vec<_>>(), vec![0]);
        assert_eq!(p.won(0), Won::Release);
        assert_eq!(p.kept(), Some(2));
        assert_eq!(p.to_abandon().count(), 0);
        let mut p = Picker::new(2);
        assert!(!p.failed(0, false) && p.failed(1, false));
        assert!(Picker::new(4).failed(3, true));
    }
}
