//! [`Hosting`]: the replicas this peer hosts and what a remote peer may cost. Each
//! hosted replica with its deadline, its creator and its entries (the replica and
//! queue-entry quotas, kept exact as replicas change and go), a token bucket per peer,
//! and the inbound batches whose items are not all answered yet. Plain state: every
//! method takes `now` and gives back what the replicas sent; where those go (this
//! peer's own client, a remote one, the test-only delay) is the behaviour's
//! (`host.rs`).

use std::collections::HashMap;
use std::time::Duration;

use libp2p::kad::KBucketKey;
use libp2p::PeerId;

use super::key::ReplicaKey;
use super::link::ResponseChannel;
use super::types::{Counters, ReplicaInfo, ReplicaTotals};
use super::util::{shrink_if_sparse, DeadlineIndex};
use crate::proto::{self, Replica, ReplicaError, Response, Time, ToReplica};
use crate::wire::{self, Rejection, Reply};

/// What a hosted replica sent: (client, RESPONSE).
pub(super) type Sends = Vec<(PeerId, Response<PeerId>)>;

/// The limits [`Hosting`] enforces (from the behaviour's `Config`).
#[derive(Clone, Debug)]
pub(super) struct Limits {
    pub(super) proto: proto::Config,
    pub(super) max_replicas: usize,
    pub(super) max_replicas_per_peer: usize,
    pub(super) max_entries: usize,
    pub(super) max_entries_per_peer: usize,
    /// Requests per second and burst, per peer.
    pub(super) peer_rate: (u32, u32),
}

/// The hosted replicas and their accounting (see the module's doc).
#[derive(Debug)]
pub(super) struct Hosting {
    local: PeerId,
    limits: Limits,
    /// The hosted replicas, each with its creator and entry counts.
    replicas: HashMap<ReplicaKey, Hosted>,
    /// When each hosted replica next has work (a timer, or becoming disposable): an
    /// event costs O(log n), not a walk over every replica.
    due: DeadlineIndex<ReplicaKey>,
    /// How many hosted replicas each remote peer's request created (each replica
    /// names its creator).
    created_by: HashMap<PeerId, usize>,
    /// The remote peers' entries (owner or waiter) in all hosted replicas, as each
    /// replica last counted them: the queue-entry quotas.
    entries_by: HashMap<PeerId, usize>,
    entries_total: usize,
    /// Request budget per connected peer: (tokens, last refill).
    buckets: HashMap<PeerId, (f64, Time)>,
    /// Inbound batches waiting for some items' ownership lookups: bounded by the
    /// lookups and the requests each may park.
    batches: HashMap<u64, InboundBatch>,
    next_batch: u64,
}

/// An inbound [`wire::Request::Batch`] whose items are not all answered yet (some wait
/// for their key's ownership lookup).
#[derive(Debug)]
struct InboundBatch {
    channel: ResponseChannel,
    replies: Vec<Option<Reply>>,
    missing: usize,
}

/// A replica's number of entries (owner and waiters) and its first one: when neither
/// changed, nor did who is in it (see [`Hosted::recount`]).
type EntryShape = (usize, Option<PeerId>);

/// A replica this peer hosts, with what the host counts of it: one map entry per
/// hosted key, so a message looks its key up once for all of it.
#[derive(Debug)]
struct Hosted {
    replica: Replica<PeerId>,
    /// The remote peer whose request created it (its replica quota); `None`: this peer.
    creator: Option<PeerId>,
    /// Its entries' shape and the remote peers in them (owner, waiters, with
    /// multiplicity) as last counted: the queue-entry quotas.
    shape: EntryShape,
    counted: Vec<PeerId>,
}

impl Hosted {
    /// Counts the remote peers' entries again when they may have changed: O(queue)
    /// then, nothing otherwise. One event adds, removes, promotes or re-queues one
    /// acquisition: the same number of entries with the same first one means the same
    /// peers.
    fn recount(&mut self, local: PeerId, by: &mut HashMap<PeerId, usize>, total: &mut usize) {
        let r = &self.replica;
        let first = r.owner().map(|(ts, _)| ts.client).or_else(|| r.queue().next().map(|ts| ts.client));
        let shape = (r.queue_len() + usize::from(r.owner().is_some()), first);
        if shape == self.shape {
            return;
        }
        let all = r.owner().map(|(ts, _)| ts.client).into_iter().chain(r.queue().map(|ts| ts.client));
        let now: Vec<PeerId> = all.filter(|p| *p != local).collect();
        uncount(&self.counted, by, total);
        for p in &now {
            *total += 1;
            *by.entry(*p).or_default() += 1;
        }
        self.shape = shape;
        self.counted = now;
    }
}

/// Takes `peers`' entries out of the running counts.
fn uncount(peers: &[PeerId], by: &mut HashMap<PeerId, usize>, total: &mut usize) {
    for p in peers {
        *total = total.saturating_sub(1);
        if let Some(c) = by.get_mut(p) {
            *c = c.saturating_sub(1);
            if *c == 0 {
                by.remove(p);
            }
        }
    }
}

/// What [`Hosting::reindex`] did with a replica.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Filed {
    /// Filed under its next deadline (or not hosted).
    Kept,
    /// Dropped: idle, with nothing left to remember (its ownership verdict is the
    /// caller's to forget).
    Evicted,
}

impl Hosting {
    pub(super) fn new(local: PeerId, limits: Limits) -> Self {
        Hosting {
            local,
            limits,
            replicas: HashMap::new(),
            due: DeadlineIndex::default(),
            created_by: HashMap::new(),
            entries_by: HashMap::new(),
            entries_total: 0,
            buckets: HashMap::new(),
            batches: HashMap::new(),
            next_batch: 0,
        }
    }

    /// Replicas hosted.
    pub(super) fn len(&self) -> usize {
        self.replicas.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.replicas.is_empty()
    }

    pub(super) fn contains(&self, key: &ReplicaKey) -> bool {
        self.replicas.contains_key(key)
    }

    /// Queue entries of remote peers' acquisitions in the hosted replicas.
    pub(super) fn entries(&self) -> usize {
        self.entries_total
    }

    /// The hosted keys that `peer` is closer to than `local` (it hosts them now).
    pub(super) fn closer_to(&self, peer: &KBucketKey<PeerId>, local: &KBucketKey<PeerId>) -> Vec<ReplicaKey> {
        self.replicas.keys().filter(|key| local.distance(key.kad()) >= peer.distance(key.kad())).cloned().collect()
    }

    /// Recounts the remote peers' queue entries from the hosted replicas and compares
    /// with the running counts behind the entry quotas (tests; O(hosted state)).
    pub(super) fn audit_entries(&self) -> Result<(), String> {
        let mut by: HashMap<PeerId, usize> = HashMap::new();
        for r in self.replicas.values().map(|h| &h.replica) {
            let all = r.owner().map(|(ts, _)| ts.client).into_iter().chain(r.queue().map(|ts| ts.client));
            for p in all.filter(|p| *p != self.local) {
                *by.entry(p).or_default() += 1;
            }
        }
        let total: usize = by.values().sum();
        if total != self.entries_total || by != self.entries_by {
            return Err(format!(
                "entries: counted {total} {by:?}, running {} {:?}",
                self.entries_total, self.entries_by
            ));
        }
        Ok(())
    }

    /// Sums of the hosted replicas' counters.
    pub(super) fn totals(&self) -> ReplicaTotals {
        let mut t = ReplicaTotals { hosted: self.replicas.len(), ..ReplicaTotals::default() };
        for r in self.replicas.values().map(|h| &h.replica) {
            let s = r.stats();
            t.grants += s.grants;
            t.releases += s.releases;
            t.yields += s.yields;
            t.lease_expiries += s.lease_expiries;
        }
        t
    }

    /// Replicas hosted here, of one resource or of all.
    pub(super) fn infos(&self, resource: Option<&str>) -> Vec<ReplicaInfo> {
        let mut v: Vec<ReplicaInfo> = self
            .replicas
            .iter()
            .filter(|(key, _)| resource.is_none_or(|x| x == key.resource()))
            .map(|(key, Hosted { replica: rep, .. })| ReplicaInfo {
                resource: key.resource().to_owned(),
                index: key.index(),
                owner: rep.owner().map(|(ts, stamp)| (ts.client, ts.counter, stamp)),
                queue: rep.queue().map(|ts| (ts.client, ts.counter)).collect(),
            })
            .collect();
        v.sort_by(|a, b| (&a.resource, a.index).cmp(&(&b.resource, b.index)));
        v
    }

    /// The state of a replica here (idle if not hosted).
    pub(super) fn state(&self, key: &ReplicaKey, now: Time) -> wire::ReplicaState {
        let Some(Hosted { replica: r, .. }) = self.replicas.get(key) else {
            return wire::ReplicaState::default();
        };
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let left = |t: Option<Time>| t.map_or(0, |t| ms(t.saturating_sub(now)));
        wire::ReplicaState {
            owner: r.owner().map(|(ts, stamp)| (*ts, stamp, left(r.lease_until()))),
            queue: r.queue().take(wire::MAX_INSPECT_QUEUE).copied().collect(),
            queue_len: u32::try_from(r.queue_len()).unwrap_or(u32::MAX),
            held_back_ms: left(r.holding_grants_until()),
        }
    }

    /// Whether a request from `from` could create the replica of `key` (if it is not
    /// hosted): the caps on replicas, for all and per remote peer.
    pub(super) fn room_for(&self, from: PeerId, key: &ReplicaKey) -> Result<(), Rejection> {
        if from != self.local && !self.replicas.contains_key(key) {
            if self.replicas.len() >= self.limits.max_replicas {
                return Err(Rejection::TooManyReplicas);
            }
            if self.created_by.get(&from).is_some_and(|c| *c >= self.limits.max_replicas_per_peer) {
                return Err(Rejection::PeerQuota);
            }
        }
        Ok(())
    }

    /// Applies a client message from `from` to the replica of `key`, creating it with
    /// empty memory if it is not hosted (then granting nothing before `held_until()`,
    /// the takeover delay). Answers what the replica sent, and what filing it again did
    /// ([`Hosting::reindex`]).
    // Each argument is one input of the step (as in the core's `handle_heard`, plus
    // the takeover delay and the counters): bundling them would only hide that.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn apply(
        &mut self,
        now: Time,
        from: PeerId,
        key: &ReplicaKey,
        msg: ToReplica<PeerId>,
        heard: Time,
        held_until: impl FnOnce() -> Option<Time>,
        counters: &mut Counters,
    ) -> (Result<Sends, Rejection>, Filed) {
        let hosted = self.replicas.contains_key(key);
        // A REQUEST that would add a remote peer's entry past its quota, or past the cap
        // for all, is refused before anything is created; an acquisition already here
        // is always served (renewals, retries).
        if let ToReplica::Request { ts, .. } = &msg {
            let over = self.entries_by.get(&from).is_some_and(|n| *n >= self.limits.max_entries_per_peer)
                || self.entries_total >= self.limits.max_entries;
            if from != self.local && over && !self.replicas.get(key).is_some_and(|h| h.replica.has(ts)) {
                return (Err(Rejection::QueueQuota), Filed::Kept);
            }
        }
        let (mut held, mut creator) = (None, None);
        if !hosted {
            if self.replicas.len() >= self.limits.max_replicas {
                return (Err(Rejection::TooManyReplicas), Filed::Kept);
            }
            if from != self.local {
                let count = self.created_by.entry(from).or_default();
                if *count >= self.limits.max_replicas_per_peer {
                    return (Err(Rejection::PeerQuota), Filed::Kept);
                }
                *count += 1;
                creator = Some(from);
            }
            // The takeover delay: its previous host may have granted it.
            held = held_until();
        }
        let replica = match self.replicas.entry(key.clone()) {
            std::collections::hash_map::Entry::Occupied(e) => &mut e.into_mut().replica,
            std::collections::hash_map::Entry::Vacant(e) => {
                counters.replicas_created += 1;
                let mut replica = Replica::new(self.limits.proto.clone());
                if let Some(until) = held {
                    counters.replicas_held += 1;
                    replica.hold_grants_until(until);
                }
                &mut e.insert(Hosted { replica, creator, shape: (0, None), counted: Vec::new() }).replica
            }
        };
        let result = replica.handle_heard(now, heard, &from, msg);
        let mut sends = Vec::new();
        while let Some(out) = replica.poll_transmit() {
            sends.push(out);
        }
        let filed = self.reindex(key, now, counters);
        let result = result.map(|()| sends).map_err(|e| match e {
            ReplicaError::ForeignAcquisition => Rejection::ForeignAcquisition,
            ReplicaError::NotHolder => Rejection::NotHolder,
            ReplicaError::Finished => Rejection::Finished,
            ReplicaError::QueueFull(_) => Rejection::QueueFull,
            ReplicaError::Ahead { .. } => Rejection::Ahead,
        });
        (result, filed)
    }

    /// Runs a due replica's timers: what it sent, and what filing it again did.
    pub(super) fn timeout(&mut self, key: &ReplicaKey, now: Time, counters: &mut Counters) -> (Sends, Filed) {
        let mut sends = Vec::new();
        if let Some(r) = self.replicas.get_mut(key).map(|h| &mut h.replica) {
            r.handle_timeout(now);
            while let Some(out) = r.poll_transmit() {
                sends.push(out);
            }
        }
        (sends, self.reindex(key, now, counters))
    }

    /// The replicas due at `now` (collected: handling one may re-file it).
    pub(super) fn due(&self, now: Time) -> Vec<ReplicaKey> {
        self.due.due(now)
    }

    /// The earliest deadline of a hosted replica.
    pub(super) fn next_due(&self) -> Option<Time> {
        self.due.first()
    }

    /// Files a hosted replica under its next deadline, or drops it if it is disposable
    /// (idle, nothing to remember: see [`Replica::is_disposable`]).
    fn reindex(&mut self, key: &ReplicaKey, now: Time, counters: &mut Counters) -> Filed {
        let Some(h) = self.replicas.get_mut(key) else {
            self.due.set(key, None);
            return Filed::Kept;
        };
        h.recount(self.local, &mut self.entries_by, &mut self.entries_total);
        let r = &mut h.replica;
        if r.is_idle() {
            // Kept until its tombstones expire: give back what its emptied queues hold.
            r.compact();
        }
        if r.is_disposable(now) {
            self.remove(key);
            counters.replicas_evicted += 1;
            return Filed::Evicted;
        }
        let at = [r.poll_timeout(), r.disposable_at()].into_iter().flatten().min();
        self.due.set(key, at);
        Filed::Kept
    }

    /// Removes a hosted replica with its index entry and its creator's count.
    pub(super) fn remove(&mut self, key: &ReplicaKey) {
        let hosted = self.replicas.remove(key);
        shrink_if_sparse(&mut self.replicas);
        self.due.set(key, None);
        let Some(h) = hosted else { return };
        uncount(&h.counted, &mut self.entries_by, &mut self.entries_total);
        if let Some(peer) = h.creator {
            if let Some(c) = self.created_by.get_mut(&peer) {
                *c = c.saturating_sub(1);
                if *c == 0 {
                    self.created_by.remove(&peer);
                }
            }
        }
    }

    /// Drops every hosted replica (serving stopped); answers their keys.
    pub(super) fn clear(&mut self) -> Vec<ReplicaKey> {
        let keys = self.replicas.keys().cloned().collect();
        self.replicas = HashMap::new();
        self.due.clear();
        self.created_by = HashMap::new();
        self.entries_by = HashMap::new();
        self.entries_total = 0;
        keys
    }

    /// Takes one request from `peer`'s budget (token bucket); false when it is spent.
    pub(super) fn take_token(&mut self, peer: PeerId, now: Time) -> bool {
        let (rate, burst) = (f64::from(self.limits.peer_rate.0), f64::from(self.limits.peer_rate.1));
        let (tokens, last) = self.buckets.entry(peer).or_insert((burst, now));
        *tokens = (*tokens + now.saturating_sub(*last).as_secs_f64() * rate).min(burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// `peer`'s last connection closed: its request budget starts afresh.
    pub(super) fn disconnected(&mut self, peer: &PeerId) {
        self.buckets.remove(peer);
    }

    /// Opens an inbound batch of `len` items, answered on `channel` once every item is.
    pub(super) fn open_batch(&mut self, channel: ResponseChannel, len: usize) -> u64 {
        let batch = self.next_batch;
        self.next_batch += 1;
        self.batches.insert(batch, InboundBatch { channel, replies: vec![None; len], missing: len });
        batch
    }

    /// Item `slot` of `batch` is answered: the batch's whole reply when it was the last.
    pub(super) fn answer_slot(&mut self, batch: u64, slot: usize, reply: Reply) -> Option<(ResponseChannel, Reply)> {
        let b = self.batches.get_mut(&batch)?;
        if let Some(r @ None) = b.replies.get_mut(slot) {
            *r = Some(reply);
            b.missing -= 1;
        }
        if b.missing != 0 {
            return None;
        }
        let done = self.batches.remove(&batch);
        shrink_if_sparse(&mut self.batches);
        let b = done?;
        let replies = b.replies.into_iter().map(|r| r.unwrap_or(Reply::Rejected(Rejection::NotServing)));
        Some((b.channel, Reply::Batch(replies.collect())))
    }
}
