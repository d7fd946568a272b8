//! The host side, as the behaviour drives it: inbound requests (alone or in a batch,
//! answered item by item), validated and checked for ownership before a replica is
//! touched; the replicas' outputs sent on (to this peer's own client, a remote one, or
//! through the test-only delay); and the operator's requests. The replicas themselves,
//! their deadlines and what a remote peer may cost (replica and queue-entry quotas, a
//! token bucket per peer) are [`Hosting`]'s (`hosting.rs`); a replica it evicts or that
//! is handed over takes its ownership verdict with it ([`Behaviour::drop_replica`]).

use std::time::Instant;

use libp2p::kad::KBucketKey;
use libp2p::PeerId;

use super::hosting::Filed;
#[cfg(doc)]
use super::hosting::Hosting;
use super::key::ReplicaKey;
use super::link::ResponseChannel;
use super::outbox::{Held, ReplyTo};
use super::ownership::Parked;
use super::types::{Counters, ReplicaInfo, ReplicaTotals};
// Up to the parent for `Behaviour` alone: this file is one of its `impl` blocks (the
// methods of one role, which coordinate that role's state with the others').
use super::Behaviour;
use crate::proto::{client::Phase, Response, Time, Timestamp, ToReplica};
use crate::wire::{self, Rejection, Reply, Request};

impl Behaviour {
    /// Recounts the remote peers' queue entries from the hosted replicas and compares
    /// with the running counts behind the entry quotas (tests; O(hosted state)).
    pub fn audit_entries(&self) -> Result<(), String> {
        self.hosting.audit_entries()
    }

    /// Sums of the hosted replicas' counters.
    pub fn replica_totals(&self) -> ReplicaTotals {
        self.hosting.totals()
    }

    /// Replicas hosted here, of one resource or of all.
    pub fn replicas(&self, resource: Option<&str>) -> Vec<ReplicaInfo> {
        self.hosting.infos(resource)
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
                if let Some((channel, reply)) = self.hosting.answer_slot(batch, slot, reply) {
                    self.inner.link.send_response(channel, reply);
                }
            }
        }
    }

    /// The state of replica `index` of `resource` here (idle if not hosted, held back as
    /// long as a replica created now would be: it would know nothing of earlier votes).
    pub(super) fn replica_state(&self, key: &ReplicaKey) -> wire::ReplicaState {
        let mut state = self.hosting.state(key, self.clock.now());
        if !self.hosting.contains(key) {
            state.held_back_ms = u64::try_from(self.held_back().as_millis()).unwrap_or(u64::MAX);
        }
        state
    }

    /// Answers a [`Request::Holding`], [`Request::Revoke`] or [`Request::Locks`] from
    /// `peer` (this peer for the local application).
    pub(super) fn answer_operator(&mut self, peer: PeerId, request: Request) -> Reply {
        if let Err(r) = request.validate() {
            return Reply::Rejected(r);
        }
        match request {
            Request::Holding { resource, counter } => {
                let ts = Timestamp::new(counter, self.local);
                let id = self.acquiring.id_of(&ts);
                let info = id.and_then(|id| self.acquisition(id)).filter(|a| a.resource == resource);
                let value = id.and_then(|id| self.acquiring.get(&id)).and_then(|a| a.value.clone());
                Reply::Holding(info.map(|a| wire::HoldingState {
                    held: a.phase == Phase::Holding,
                    token: a.token,
                    valid_for_ms: a.valid_until.map_or(0, |t| {
                        u64::try_from(t.saturating_duration_since(Instant::now()).as_millis()).unwrap_or(u64::MAX)
                    }),
                    votes: u16::try_from(a.votes).unwrap_or(u16::MAX),
                    value_version: value.as_ref().map_or(0, |(_, v)| *v),
                    value: value.map(|(bytes, _)| serde_bytes::ByteBuf::from(bytes)),
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
            Request::Locks { after } => Reply::Locks(self.lock_list(after.as_ref())),
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
        let (local_key, membership) = (&self.local_key, &self.membership);
        // The takeover delay of a replica created now: its previous host may have
        // granted it.
        let held_until = || {
            let k = key.kad();
            let mine = local_key.distance(k);
            membership.hold_until(now, |p| KBucketKey::from(*p).distance(k) < mine)
        };
        let (result, filed) = self.hosting.apply(now, from, key, msg, heard, held_until, &mut self.counters);
        if filed == Filed::Evicted {
            self.forget_ownership(key);
        }
        let mut mine = Vec::new();
        for (to, resp) in result? {
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
        let batch = self.hosting.open_batch(channel, items.len());
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
                Request::Inspect { .. } | Request::Holding { .. } | Request::Revoke { .. } | Request::Locks { .. }
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
                request @ (Request::Holding { .. } | Request::Revoke { .. } | Request::Locks { .. }) => {
                    self.answer_operator(peer, request)
                }
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
                    } else if self.acquiring.finished_n(&resp.ts).is_none()
                        && self.acquiring.cached_host(&resource, index) != Some(peer)
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

    /// Takes one request from `peer`'s budget (token bucket); false when it is spent.
    pub(super) fn take_token(&mut self, peer: PeerId) -> bool {
        let now = self.clock.now();
        self.hosting.take_token(peer, now)
    }

    /// Removes a hosted replica (its counts with it) and its ownership verdict.
    pub(super) fn drop_replica(&mut self, key: &ReplicaKey) {
        self.hosting.remove(key);
        self.forget_ownership(key);
    }
}
