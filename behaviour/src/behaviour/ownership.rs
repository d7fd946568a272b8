//! [`Ownerships`]: whether this peer may serve each key it would host. A key is served
//! only while [`Ownership::Owned`]: a Kademlia lookup of it, or the last self-lookup's
//! neighbourhood, found no closer peer; it is looked up again every ownership TTL while
//! its replica is hosted. While a lookup runs, the key's requests are parked, boundedly
//! ([`MAX_OWNERSHIP_CHECKS`] lookups, [`MAX_PARKED_PER_KEY`] requests each). Plain
//! state: the lookups themselves and what a verdict does (serve, redirect, hand over)
//! are the behaviour's (`placement.rs`).

use std::collections::HashMap;

use libp2p::kad;
use libp2p::PeerId;

use super::key::ReplicaKey;
use super::outbox::ReplyTo;
use super::util::{shrink_if_sparse, DeadlineIndex};
use crate::proto::{Time, ToReplica};
use crate::wire::Rejection;

#[cfg(doc)]
use super::config::Config;

/// Ownership lookups running at once; past it a request for a key not yet checked is
/// refused (`RateLimited`: retry later).
pub const MAX_OWNERSHIP_CHECKS: usize = 1024;
/// Requests that may wait for one key's ownership lookup.
pub const MAX_PARKED_PER_KEY: usize = 64;

/// Whether this peer may serve a key it would host (see [`Config::with_ownership`]).
pub(super) enum Ownership {
    /// A lookup runs; the key's requests wait for its answer.
    Checking { query: kad::QueryId, parked: Vec<Parked> },
    /// The last lookup found no closer peer; `recheck` runs while the replica is served.
    Owned { recheck: Option<kad::QueryId> },
}

/// A client message waiting for its key's ownership lookup: a remote peer's (answered
/// on `channel`) or a local acquisition's (`channel` none).
pub(super) struct Parked {
    pub(super) from: PeerId,
    /// When the message reached this peer: the replica's grant delay counts from then.
    pub(super) heard: Time,
    pub(super) n: u16,
    pub(super) msg: ToReplica<PeerId>,
    pub(super) hops: u8,
    pub(super) reply_to: ReplyTo,
}

/// The ownership verdicts and lookups (see the module's doc).
#[derive(Default)]
pub(super) struct Ownerships {
    /// Keys this peer would host, checked (or being checked) with a Kademlia lookup;
    /// bounded by the hosted replicas plus [`MAX_OWNERSHIP_CHECKS`].
    verdicts: HashMap<ReplicaKey, Ownership>,
    /// When each entry next needs work: a running lookup's deadline, a recheck.
    due: DeadlineIndex<ReplicaKey>,
    /// The ownership lookups in flight.
    checks: HashMap<kad::QueryId, ReplicaKey>,
}

impl Ownerships {
    pub(super) fn get(&self, key: &ReplicaKey) -> Option<&Ownership> {
        self.verdicts.get(key)
    }

    /// Keys with a verdict or a lookup.
    pub(super) fn len(&self) -> usize {
        self.verdicts.len()
    }

    /// The key is this peer's until `until` (then looked at again).
    pub(super) fn owned(&mut self, key: &ReplicaKey, until: Time) {
        self.verdicts.insert(key.clone(), Ownership::Owned { recheck: None });
        self.due.set(key, Some(until));
    }

    /// Whether a request may wait for the key's lookup: the lookups and the requests
    /// waiting on one are bounded.
    pub(super) fn room(&self, key: &ReplicaKey) -> Result<(), Rejection> {
        match self.verdicts.get(key) {
            Some(Ownership::Checking { parked, .. }) if parked.len() >= MAX_PARKED_PER_KEY => {
                Err(Rejection::RateLimited)
            }
            Some(Ownership::Checking { .. }) => Ok(()),
            _ if self.checks.len() >= MAX_OWNERSHIP_CHECKS => Err(Rejection::RateLimited),
            _ => Ok(()),
        }
    }

    /// Parks `parked` behind the key's running lookup; gives it back when none runs.
    pub(super) fn park(&mut self, key: &ReplicaKey, parked: Parked) -> Option<Parked> {
        match self.verdicts.get_mut(key) {
            Some(Ownership::Checking { parked: waiting, .. }) => {
                waiting.push(parked);
                None
            }
            _ => Some(parked),
        }
    }

    /// A lookup `query` of the key started, due by `at`.
    pub(super) fn check_started(&mut self, key: &ReplicaKey, query: kad::QueryId, at: Time) {
        self.checks.insert(query, key.clone());
        self.due.set(key, Some(at));
    }

    /// The key's first lookup runs, with `parked` waiting for it.
    pub(super) fn checking(&mut self, key: &ReplicaKey, query: kad::QueryId, parked: Parked) {
        self.verdicts.insert(key.clone(), Ownership::Checking { query, parked: vec![parked] });
    }

    /// A hosted key's lookup `query` runs again; it stays owned meanwhile.
    pub(super) fn rechecking(&mut self, key: ReplicaKey, query: kad::QueryId) {
        self.verdicts.insert(key, Ownership::Owned { recheck: Some(query) });
    }

    /// Whether `query` is an ownership lookup.
    pub(super) fn is_check(&self, query: &kad::QueryId) -> bool {
        self.checks.contains_key(query)
    }

    /// Lookup `query` ended: the key it was for.
    pub(super) fn check_answered(&mut self, query: &kad::QueryId) -> Option<ReplicaKey> {
        let key = self.checks.remove(query);
        if key.is_some() {
            shrink_if_sparse(&mut self.checks);
        }
        key
    }

    /// Forgets lookup `query` (finished without an answer).
    pub(super) fn cancel_check(&mut self, query: &kad::QueryId) {
        self.checks.remove(query);
    }

    /// Takes the key's entry out for its verdict: the requests that waited for it.
    pub(super) fn take_parked(&mut self, key: &ReplicaKey) -> Vec<Parked> {
        match self.verdicts.remove(key) {
            Some(Ownership::Checking { parked, .. }) => parked,
            _ => Vec::new(),
        }
    }

    /// The key is another peer's: nothing more is due for it.
    pub(super) fn lost(&mut self, key: &ReplicaKey) {
        self.due.set(key, None);
        shrink_if_sparse(&mut self.verdicts);
    }

    /// The running lookup of the key (`Some(None)`: owned, none running); `None`
    /// without an entry.
    pub(super) fn running(&self, key: &ReplicaKey) -> Option<Option<kad::QueryId>> {
        match self.verdicts.get(key)? {
            Ownership::Checking { query, .. } | Ownership::Owned { recheck: Some(query) } => Some(Some(*query)),
            Ownership::Owned { recheck: None } => Some(None),
        }
    }

    /// Files the key's entry under `at` (or nothing).
    pub(super) fn set_due(&mut self, key: &ReplicaKey, at: Option<Time>) {
        self.due.set(key, at);
    }

    /// Drops the key's entry, whatever it was.
    pub(super) fn remove(&mut self, key: &ReplicaKey) {
        self.verdicts.remove(key);
        self.due.set(key, None);
        shrink_if_sparse(&mut self.verdicts);
    }

    /// Forgets a key's verdict (its replica has gone); a running check stays: requests
    /// wait for it.
    pub(super) fn forget(&mut self, key: &ReplicaKey) {
        if let Some(Ownership::Owned { recheck }) = self.verdicts.get(key) {
            if let Some(q) = recheck {
                self.checks.remove(q);
            }
            self.remove(key);
        }
    }

    /// The keys due at `now` (collected: handling one may re-file it).
    pub(super) fn due(&self, now: Time) -> Vec<ReplicaKey> {
        self.due.due(now)
    }

    pub(super) fn next_due(&self) -> Option<Time> {
        self.due.first()
    }
}
