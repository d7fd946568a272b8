//! The host side: serving the replicas this peer hosts. Inbound requests (alone or in a
//! batch, answered item by item), the replicas' outputs, and what a remote peer may cost
//! (replica and queue-entry quotas, a token bucket per peer). A hosted replica that
//! changed is filed again with [`Behaviour::reindex_replica`] (its deadline, its entry
//! counts, its eviction once disposable) and removed with [`Behaviour::drop_replica`]
//! (all at once when serving stops): the counts behind the quotas stay exact.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use libp2p::kad::KBucketKey;
use libp2p::PeerId;

use super::key::ReplicaKey;
use super::link::ResponseChannel;
use super::outbox::{Held, ReplyTo};
use super::placement::Parked;
use super::{shrink_if_sparse, Behaviour, Counters, ReplicaInfo, ReplicaTotals};
use crate::proto::{client::Phase, Replica, ReplicaError, Response, Time, Timestamp, ToReplica};
use crate::wire::{self, Rejection, Reply, Request};

/// An inbound [`Request::Batch`] whose items are not all answered yet (some wait for
/// their key's ownership lookup).
#[derive(Debug)]
pub(super) struct InboundBatch {
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
pub(super) struct Hosted {
    pub(super) replica: Replica<PeerId>,
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

impl Behaviour {
    /// Recounts the remote peers' queue entries from the hosted replicas and compares
    /// with the running counts behind the entry quotas (tests; O(hosted state)).
    pub fn audit_entries(&self) -> Result<(), String> {
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
    pub fn replica_totals(&self) -> ReplicaTotals {
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
    pub fn replicas(&self, resource: Option<&str>) -> Vec<ReplicaInfo> {
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

    /// A local acquisition's message to a replica hosted here, its key's ownership
    /// checked.
    pub(super) fn serve_local(&mut self, key: &ReplicaKey, msg: ToReplica<PeerId>, heard: Time) {
        let local = self.local;
        match self.handle_replica(local, key, msg, heard) {
            // To this peer's own client: delivered at once, or after the test-only delay.
            Ok(responses) => responses.into_iter().for_each(|r| self.notify(local, key, r)),
            Err(r) => {
                // Counted like a remote peer's (a full replica table refuses this
                // peer's own clients too); the core retries on its timers.
                Counters::bump(&mut self.counters.rejected, r.as_str());
                let (resource, index) = (key.resource(), key.index());
                tracing::debug!(%resource, index, reason = r.as_str(), "a local replica refused a local request");
            }
        }
    }

    /// Sends the answer to a remote peer's message: alone, or into its batch's reply
    /// (which goes once every item is answered); after the test-only delay if it is on.
    pub(super) fn respond(&mut self, to: ReplyTo, reply: Reply) {
        if self.outbox.delaying() && !matches!(to, ReplyTo::Local) {
            return self.send_or_hold(Held::Reply { to, reply });
        }
        self.respond_now(to, reply);
    }

    /// [`Behaviour::respond`] at once.
    pub(super) fn respond_now(&mut self, to: ReplyTo, reply: Reply) {
        match to {
            ReplyTo::Local => {}
            ReplyTo::Channel(channel) => {
                self.inner.link.send_response(channel, reply);
            }
            ReplyTo::Slot { batch, slot } => {
                let Some(b) = self.inbound_batches.get_mut(&batch) else { return };
                if let Some(r @ None) = b.replies.get_mut(slot) {
                    *r = Some(reply);
                    b.missing -= 1;
                }
                if b.missing == 0 {
                    if let Some(b) = self.inbound_batches.remove(&batch) {
                        let replies =
                            b.replies.into_iter().map(|r| r.unwrap_or(Reply::Rejected(Rejection::NotServing)));
                        self.inner.link.send_response(b.channel, Reply::Batch(replies.collect()));
                    }
                    shrink_if_sparse(&mut self.inbound_batches);
                }
            }
        }
    }

    /// The state of replica `index` of `resource` here (idle if not hosted).
    pub(super) fn replica_state(&self, key: &ReplicaKey) -> wire::ReplicaState {
        let Some(Hosted { replica: r, .. }) = self.replicas.get(key) else {
            return wire::ReplicaState::default();
        };
        let now = self.clock.now();
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let left = |t: Option<Time>| t.map_or(0, |t| ms(t.saturating_sub(now)));
        wire::ReplicaState {
            owner: r.owner().map(|(ts, stamp)| (*ts, stamp, left(r.lease_until()))),
            queue: r.queue().take(wire::MAX_INSPECT_QUEUE).copied().collect(),
            queue_len: u32::try_from(r.queue_len()).unwrap_or(u32::MAX),
            held_back_ms: left(r.holding_grants_until()),
        }
    }

    /// Answers a [`Request::Holding`] or [`Request::Revoke`] from `peer` (this peer for
    /// the local application).
    pub(super) fn answer_operator(&mut self, peer: PeerId, request: Request) -> Reply {
        if let Err(r) = request.validate() {
            return Reply::Rejected(r);
        }
        match request {
            Request::Holding { resource, counter } => {
                let ts = Timestamp::new(counter, self.local);
                let info = self.by_ts.get(&ts).and_then(|id| self.acquisition(*id)).filter(|a| a.resource == resource);
                Reply::Holding(info.map(|a| wire::HoldingState {
                    held: a.phase == Phase::Holding,
                    token: a.token,
                    valid_for_ms: a.valid_until.map_or(0, |t| {
                        u64::try_from(t.saturating_duration_since(Instant::now()).as_millis()).unwrap_or(u64::MAX)
                    }),
                    votes: u16::try_from(a.votes).unwrap_or(u16::MAX),
                }))
            }
            Request::Revoke { resource, token } => {
                if peer != self.local && !self.config.admin.allows(&peer) {
                    Reply::Rejected(Rejection::NotAllowed)
                } else if self.revoke(&resource, token, peer) {
                    Reply::Ack
                } else {
                    Reply::Rejected(Rejection::NotHolder)
                }
            }
            _ => Reply::Rejected(Rejection::BadIndex),
        }
    }

    /// Applies a client message to a hosted replica (creating it with empty memory if
    /// this peer is the closest live peer); returns the responses for the sender and
    /// dispatches the others.
    pub(super) fn handle_replica(
        &mut self,
        from: PeerId,
        key: &ReplicaKey,
        msg: ToReplica<PeerId>,
        heard: Time,
    ) -> Result<Vec<Response<PeerId>>, Rejection> {
        let now = self.clock.now();
        let hosted = self.replicas.contains_key(key);
        // A REQUEST that would add a remote peer's entry past its quota, or past the cap
        // for all, is refused before anything is created; an acquisition already here
        // is always served (renewals, retries).
        if let ToReplica::Request { ts, .. } = &msg {
            let over = self.entries_by.get(&from).is_some_and(|n| *n >= self.config.max_entries_per_peer)
                || self.entries_total >= self.config.max_entries;
            if from != self.local && over && !self.replicas.get(key).is_some_and(|h| h.replica.has(ts)) {
                return Err(Rejection::QueueQuota);
            }
        }
        let (mut held, mut creator) = (None, None);
        if !hosted {
            if self.replicas.len() >= self.config.max_replicas {
                return Err(Rejection::TooManyReplicas);
            }
            if from != self.local {
                let count = self.created_by.entry(from).or_default();
                if *count >= self.config.max_replicas_per_peer {
                    return Err(Rejection::PeerQuota);
                }
                *count += 1;
                creator = Some(from);
            }
            // The takeover delay: its previous host may have granted it.
            let k = key.kad();
            let mine = self.local_key.distance(k);
            held = self.membership.hold_until(now, |p| KBucketKey::from(*p).distance(k) < mine);
        }
        let replica = match self.replicas.entry(key.clone()) {
            std::collections::hash_map::Entry::Occupied(e) => &mut e.into_mut().replica,
            std::collections::hash_map::Entry::Vacant(e) => {
                self.counters.replicas_created += 1;
                let mut replica = Replica::new(self.config.proto.clone());
                if let Some(until) = held {
                    self.counters.replicas_held += 1;
                    replica.hold_grants_until(until);
                }
                &mut e.insert(Hosted { replica, creator, shape: (0, None), counted: Vec::new() }).replica
            }
        };
        let result = replica.handle_heard(now, heard, &from, msg);
        let mut outputs = Vec::new();
        while let Some(out) = replica.poll_transmit() {
            outputs.push(out);
        }
        self.reindex_replica(key, now);
        if let Err(e) = result {
            return Err(match e {
                ReplicaError::ForeignAcquisition => Rejection::ForeignAcquisition,
                ReplicaError::NotHolder => Rejection::NotHolder,
                ReplicaError::Finished => Rejection::Finished,
                ReplicaError::QueueFull(_) => Rejection::QueueFull,
                ReplicaError::Ahead { .. } => Rejection::Ahead,
            });
        }
        let mut mine = Vec::new();
        for (to, resp) in outputs {
            if to == from {
                mine.push(resp);
            } else {
                self.notify(to, key, resp);
            }
        }
        Ok(mine)
    }

    /// Sends an unsolicited RESPONSE from a hosted replica to its client (after the
    /// test-only delay if it is on).
    pub(super) fn notify(&mut self, to: PeerId, key: &ReplicaKey, resp: Response<PeerId>) {
        if self.outbox.delaying() {
            return self.send_or_hold(Held::Response { to, key: key.clone(), resp });
        }
        self.notify_now(to, key, resp);
    }

    /// [`Behaviour::notify`] at once.
    pub(super) fn notify_now(&mut self, to: PeerId, key: &ReplicaKey, resp: Response<PeerId>) {
        if to == self.local {
            self.deliver(self.local, key.resource(), key.index(), resp);
            return;
        }
        Counters::bump(&mut self.counters.messages_out, "notify");
        let request = Request::Notify { resource: key.resource().to_owned(), index: key.index(), resp };
        self.enqueue(to, request, None);
    }

    pub(super) fn on_request(&mut self, peer: PeerId, request: Request, channel: ResponseChannel) {
        self.counters.requests_in += 1;
        if !matches!(request, Request::Batch(_)) {
            if let Some((to, reply)) = self.answer(peer, request, ReplyTo::Channel(channel)) {
                self.respond(to, reply);
            }
            return;
        }
        Counters::bump(&mut self.counters.messages_in, request.kind());
        if let Err(r) = request.validate() {
            Counters::bump(&mut self.counters.rejected, r.as_str());
            tracing::debug!(%peer, reason = r.as_str(), "rejected a sigma batch");
            self.inner.link.send_response(channel, Reply::Rejected(r));
            return;
        }
        let Request::Batch(items) = request else { return };
        let batch = self.next_batch;
        self.next_batch += 1;
        let missing = items.len();
        self.inbound_batches.insert(batch, InboundBatch { channel, replies: vec![None; missing], missing });
        for (slot, item) in items.into_iter().enumerate() {
            if let Some((to, reply)) = self.answer(peer, item, ReplyTo::Slot { batch, slot }) {
                self.respond(to, reply);
            }
        }
    }

    /// Answers one message from `peer` (alone or an item of a batch): the reply, or
    /// `None` when it waits for its key's ownership lookup (answered then, to `to`).
    fn answer(&mut self, peer: PeerId, request: Request, to: ReplyTo) -> Option<(ReplyTo, Reply)> {
        Counters::bump(&mut self.counters.messages_in, request.kind());
        let now = self.clock.now();
        let reply = match request.validate() {
            Err(r) => Reply::Rejected(r),
            Ok(()) => match request {
                Request::Replica { msg, .. } if msg.ts().client != peer => {
                    Reply::Rejected(Rejection::ForeignAcquisition)
                }
                Request::Replica { n, .. } if usize::from(n) != self.config.proto.n() => {
                    Reply::Rejected(Rejection::QuorumMismatch)
                }
                Request::Replica { .. } if !self.membership.serving() => Reply::Rejected(Rejection::NotServing),
                Request::Replica { .. } if !self.take_token(peer) => Reply::Rejected(Rejection::RateLimited),
                Request::Replica { resource, index, msg, n } => {
                    let key = ReplicaKey::new(&resource, index);
                    match self.closer_live_peer(&key) {
                        Some(closer) => self.redirect(closer),
                        None if self.owns(&key) => match self.handle_replica(peer, &key, msg, now) {
                            Ok(responses) => Reply::Responses(responses),
                            Err(r) => Reply::Rejected(r),
                        },
                        None => match self.room_to_check(peer, &key) {
                            Ok(()) => {
                                let parked = Parked { from: peer, heard: now, n, msg, hops: 0, reply_to: to };
                                self.park(&key, parked);
                                return None;
                            }
                            Err(r) => Reply::Rejected(r),
                        },
                    }
                }
                Request::Inspect { .. } | Request::Holding { .. } | Request::Revoke { .. }
                    if !self.take_token(peer) =>
                {
                    Reply::Rejected(Rejection::RateLimited)
                }
                Request::Inspect { resource, index, .. } => {
                    let key = ReplicaKey::new(&resource, index);
                    match self.closer_live_peer(&key) {
                        Some(closer) => self.redirect(closer),
                        None => Reply::Replica(self.replica_state(&key)),
                    }
                }
                request @ (Request::Holding { .. } | Request::Revoke { .. }) => self.answer_operator(peer, request),
                Request::Ping { resource, index, .. } => {
                    match self.closer_live_peer(&ReplicaKey::new(&resource, index)) {
                        Some(closer) => {
                            self.counters.redirects_sent += 1;
                            Reply::Redirect { peer: closer, addrs: Vec::new() }
                        }
                        None => Reply::Ack,
                    }
                }
                Request::Batch(_) => Reply::Rejected(Rejection::BadBatch),
                Request::Notify { resource, index, resp } => {
                    if resp.ts.client != self.local {
                        Reply::Rejected(Rejection::NotForMe)
                    } else if !self.finished.contains_key(&resp.ts) && self.cached_host(&resource, index) != Some(peer)
                    {
                        // Only the peer this node sends that replica's messages to may
                        // speak for it: any other could forge m promotions. (A notice for
                        // a finished acquisition is only ever handed back.)
                        Reply::Rejected(Rejection::NotHost)
                    } else {
                        self.deliver(peer, &resource, index, resp);
                        Reply::Ack
                    }
                }
            },
        };
        if let Reply::Rejected(r) = &reply {
            Counters::bump(&mut self.counters.rejected, r.as_str());
            tracing::debug!(%peer, reason = r.as_str(), "rejected a sigma request");
        }
        Some((to, reply))
    }

    /// Files a hosted replica under its next deadline, or drops it if it is disposable
    /// (idle, nothing to remember: see [`Replica::is_disposable`]).
    pub(super) fn reindex_replica(&mut self, key: &ReplicaKey, now: Time) {
        let Some(h) = self.replicas.get_mut(key) else {
            self.replica_due.set(key, None);
            return;
        };
        h.recount(self.local, &mut self.entries_by, &mut self.entries_total);
        let r = &mut h.replica;
        if r.is_idle() {
            // Kept until its tombstones expire: give back what its emptied queues hold.
            r.compact();
        }
        if r.is_disposable(now) {
            self.drop_replica(key);
            self.counters.replicas_evicted += 1;
            return;
        }
        let at = [r.poll_timeout(), r.disposable_at()].into_iter().flatten().min();
        self.replica_due.set(key, at);
    }

    /// Takes one request from `peer`'s budget (token bucket); false when it is spent.
    pub(super) fn take_token(&mut self, peer: PeerId) -> bool {
        let now = self.clock.now();
        let (rate, burst) = (f64::from(self.config.peer_rate.0), f64::from(self.config.peer_rate.1));
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

    /// Removes a hosted replica with its index entry and its creator's count.
    pub(super) fn drop_replica(&mut self, key: &ReplicaKey) {
        let hosted = self.replicas.remove(key);
        self.forget_ownership(key);
        shrink_if_sparse(&mut self.replicas);
        self.replica_due.set(key, None);
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
}
