//! The client side: this peer's acquisitions (a sans-IO [`Client`] each) and its probes.
//! Client messages go to each replica's host, queued per peer and sent once per step
//! (the outbox, `outbox.rs`); replies, redirects and failures come back here. Every
//! change to an acquisition ends in [`Behaviour::drain_acquisition`], which hands its
//! outputs on and files its next deadline; a finished one is remembered a while, so
//! that a late grant to it is handed back.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::link::{OutboundFailure, RequestId};
use libp2p::kad::KBucketKey;
use libp2p::PeerId;

use super::acquiring::Acquisition;
use super::key::ReplicaKey;
use super::outbox::{Held, Outgoing, Pending, ReplyTo, Sent};
use super::ownership::Parked;
use super::types::{AcquireError, AcquisitionId, AcquisitionInfo, Counters, Event};
// Up to the parent for `Behaviour` alone: this file is one of its `impl` blocks (the
// methods of one role, which coordinate that role's state with the others').
use super::Behaviour;
use crate::proto::{self, client::Phase, Client, Response, Time, ToReplica};
use crate::wire::{self, Rejection, Reply, Request};

#[cfg(doc)]
use super::config::Config;

/// How often waiters short of distinct voters are looked at ([`Behaviour::relax_diversity`]).
const RELAX_INTERVAL: Duration = Duration::from_secs(1);

impl Behaviour {
    /// Starts acquiring `resource` with the configured quorum, or `(n, m)`: n must be
    /// the swarm's (replicas are shared by every client of a lock, so a client on fewer
    /// replicas could win beside one on more) and m at least the swarm's.
    pub fn acquire(&mut self, resource: &str, quorum: Option<(usize, usize)>) -> Result<AcquisitionId, AcquireError> {
        self.acquire_with(resource, quorum, None)
    }

    /// [`Behaviour::acquire`] with a per-lock quorum diversity: the win needs votes
    /// hosted by at least `min_peers` distinct peers (default: the node's, see
    /// [`Config::with_min_voters`]). While this peer is joining its swarm the acquisition
    /// waits, sending nothing.
    pub fn acquire_with(
        &mut self,
        resource: &str,
        quorum: Option<(usize, usize)>,
        min_peers: Option<usize>,
    ) -> Result<AcquisitionId, AcquireError> {
        wire::validate_resource(resource).map_err(|_| AcquireError::BadName)?;
        let mut config = self.config.proto.clone();
        if let Some((n, m)) = quorum {
            let (swarm_n, swarm_m) = (config.n(), config.m());
            if n != swarm_n || m < swarm_m || m > n {
                return Err(AcquireError::SwarmQuorum { n, m, swarm_n, swarm_m });
            }
            config = config.with_quorum(n, m);
        }
        let m = config.m();
        let keys = ReplicaKey::all(resource, u16::try_from(config.n()).unwrap_or(u16::MAX));
        let explicit = min_peers.or(self.config.min_voters);
        let d = match explicit {
            Some(d) if d == 0 || d > m => return Err(AcquireError::MinPeers { d, m }),
            Some(d) => d,
            None => self.default_min_voters(&keys).min(m),
        };
        let config = config.with_min_voters(d);
        config.validate()?;
        let n = u16::try_from(config.n()).map_err(|_| proto::ConfigError::TooManyReplicas(config.n()))?;
        let now = self.clock.now();
        let ts = self.lamport.stamp(now, self.local);
        let id = AcquisitionId(self.next_id);
        self.next_id += 1;
        self.counters.acquisitions += 1;
        let deferred = (!self.membership.ready()).then(|| config.clone());
        let mut client = Client::new(config, ts, now);
        if deferred.is_some() {
            while client.poll_transmit().is_some() {}
        }
        let acquisition = Acquisition {
            resource: resource.to_owned(),
            n,
            keys,
            client,
            deferred,
            default_d: explicit.is_none(),
            value: None,
        };
        self.acquiring.start(id, acquisition);
        self.drain_acquisition(id);
        self.wake();
        Ok(id)
    }

    /// The default quorum diversity: 2, unless every replica of the lock falls on one
    /// peer even when every member this peer knows (present or departed) is counted —
    /// a one-node swarm, or a lock whose n keys all land on one peer of a small swarm —
    /// where 2 could never be met. An island still needs 2: its departed members host
    /// some of the keys. This peer counts as a possible host only when others can dial
    /// it: an unreachable one hosts nothing.
    fn default_min_voters(&self, keys: &[ReplicaKey]) -> usize {
        if Self::one_host(keys, self.membership.peer_keys().chain(self.self_as_host_key())) {
            1
        } else {
            2
        }
    }

    /// Whether all of a lock's `keys` fall on one of `peers` (the closest to each).
    fn one_host<'a>(keys: &[ReplicaKey], peers: impl Iterator<Item = &'a KBucketKey<PeerId>> + Clone) -> bool {
        let mut first: Option<PeerId> = None;
        for key in keys {
            let host = peers.clone().map(|p| (p.distance(key.kad()), *p.preimage())).min().map(|(_, p)| p);
            match (first, host) {
                (None, h) => first = h,
                (Some(a), Some(b)) if a != b => return false,
                _ => {}
            }
        }
        true
    }

    /// A default D = 2 set while the lock's keys fell on several peers must not outlive
    /// them: once members departed and every key falls on one *alive* peer (this one
    /// included when others can dial it), a waiter holding m live votes from that one
    /// peer could never win until a departed member returned (up to the membership
    /// window). While this peer reaches a majority of its members (no island; serving
    /// or not, an unreachable peer's locks are served by the others), such a waiter's D is
    /// lowered to 1; the majority rule and the takeover delay still stand. Only waiters
    /// that are short of voters alone are looked at, once a second.
    pub(super) fn relax_diversity(&mut self, now: Time) {
        if now < self.next_relax || !self.membership.majority() {
            return;
        }
        self.next_relax = now + RELAX_INTERVAL;
        let short: Vec<AcquisitionId> = self
            .acquiring
            .iter()
            .filter(|(_, a)| a.default_d && a.deferred.is_none() && a.client.short_of_voters(now))
            .map(|(id, _)| *id)
            .collect();
        for id in short {
            let Some(a) = self.acquiring.get(&id) else { continue };
            let alive = self.membership.alive_keys().chain(self.self_as_host_key());
            if Self::one_host(&a.keys, alive) {
                tracing::info!(resource = %a.resource, "every key on one alive peer: quorum diversity lowered to 1");
                if let Some(a) = self.acquiring.get_mut(&id) {
                    a.client.lower_min_voters(now, 1);
                }
                self.drain_acquisition(id);
            }
        }
    }

    /// Releases (or abandons) an acquisition. Unknown ids are ignored.
    pub fn release(&mut self, id: AcquisitionId) {
        let now = self.clock.now();
        if let Some(a) = self.acquiring.get_mut(&id) {
            a.client.release(now);
            self.drain_acquisition(id);
            self.wake();
        }
    }

    /// Attaches `value` to an acquisition (waiting or holding), replacing the one before:
    /// its peer tells it, with the fencing token, to whoever asks about the holder
    /// (`sigma inspect`, watchers). Answers the value's version (1 for the first), or
    /// `Ok(None)` if the acquisition no longer exists.
    pub fn set_value(&mut self, id: AcquisitionId, value: Vec<u8>) -> Result<Option<u32>, AcquireError> {
        if value.len() > wire::MAX_VALUE_LEN {
            return Err(AcquireError::ValueTooLarge { len: value.len() });
        }
        let Some(a) = self.acquiring.get_mut(&id) else {
            return Ok(None);
        };
        let version = a.value.as_ref().map_or(1, |(_, v)| v.saturating_add(1));
        a.value = Some((value, version));
        Ok(Some(version))
    }

    /// The state of an acquisition, while it exists.
    pub fn acquisition(&self, id: AcquisitionId) -> Option<AcquisitionInfo> {
        let a = self.acquiring.get(&id)?;
        let holding = a.client.phase() == Phase::Holding;
        Some(AcquisitionInfo {
            resource: a.resource.clone(),
            phase: a.client.phase(),
            token: a.client.token(),
            votes: a.client.votes(),
            position: a.client.position(),
            valid_until: a.client.valid_until().filter(|_| holding).map(|t| self.clock.instant(t)),
        })
    }

    /// A page of this peer's acquisitions that hold or wait, for [`Request::Locks`]: at
    /// most [`wire::MAX_LISTED_LOCKS`] in (lock name, counter) order, from the first
    /// after `after`. O(live acquisitions).
    pub(super) fn lock_list(&self, after: Option<&(String, u64)>) -> wire::LockList {
        let now = Instant::now();
        let mut locks: Vec<wire::LockEntry> = self
            .acquiring
            .iter()
            .filter_map(|(id, a)| {
                let counter = a.client.ts().counter;
                if after.is_some_and(|(name, c)| (a.resource.as_str(), counter) <= (name.as_str(), *c)) {
                    return None;
                }
                let info = self.acquisition(*id)?;
                let held = match info.phase {
                    Phase::Holding => true,
                    Phase::Waiting => false,
                    Phase::Lost | Phase::Released => return None,
                };
                let valid_for = info.valid_until.map_or(0, |t| t.saturating_duration_since(now).as_millis());
                Some(wire::LockEntry {
                    resource: info.resource,
                    counter,
                    held,
                    token: info.token,
                    valid_for_ms: u64::try_from(valid_for).unwrap_or(u64::MAX),
                    votes: u16::try_from(info.votes).unwrap_or(u16::MAX),
                    position: info.position.filter(|_| !held),
                })
            })
            .collect();
        locks.sort_by(|a, b| (&a.resource, a.counter).cmp(&(&b.resource, b.counter)));
        let more = locks.len().saturating_sub(wire::MAX_LISTED_LOCKS);
        locks.truncate(wire::MAX_LISTED_LOCKS);
        wire::LockList { locks, more: u32::try_from(more).unwrap_or(u32::MAX) }
    }

    /// Acquisitions in progress or held: (id, lock name, phase).
    pub fn acquisitions(&self) -> Vec<(AcquisitionId, String, Phase)> {
        let mut v: Vec<_> = self.acquiring.iter().map(|(id, a)| (*id, a.resource.clone(), a.client.phase())).collect();
        v.sort_by_key(|(id, _, _)| *id);
        v
    }

    /// Sends a client message to the host of replica `index` (locally if that is us),
    /// after the test-only delay if it is on.
    pub(super) fn send_to_replica(&mut self, key: ReplicaKey, n: u16, msg: ToReplica<PeerId>, hops: u8) {
        self.send_or_hold(Held::ToReplica(Outgoing { key, n, msg, hops, resent: 0 }));
    }

    /// [`Behaviour::send_to_replica`] at once.
    pub(super) fn send_to_replica_now(&mut self, out: Outgoing) {
        let mut host = self.host(&out.key);
        if host == self.local {
            // The local estimate may predate a closer peer's connection.
            if let Some(closer) = self.closer_live_peer(&out.key) {
                self.acquiring.cache_host(&out.key, closer);
                host = closer;
            }
        }
        Counters::bump(&mut self.counters.messages_out, out.msg.kind());
        if host == self.local {
            self.outbox.push_local(out);
            self.wake();
            return;
        }
        let Outgoing { key, n, msg, hops, resent } = out;
        let request = Request::Replica { resource: key.resource().to_owned(), index: key.index(), n, msg: msg.clone() };
        let pending = Pending { peer: host, key: Some(key), n, msg: Some(msg), probe: None, hops, resent };
        self.enqueue(host, request, Some(pending));
    }

    /// Serves the messages of this peer's client to the replicas it hosts, in the order
    /// they were sent. The poll defers them until the same step's messages for other
    /// peers have been handed to their connections: a replica created or a grant taken
    /// here (tens of microseconds each) no longer delays the first frame out.
    pub(super) fn serve_local_inbox(&mut self) {
        while let Some(Outgoing { key, n, msg, hops, .. }) = self.outbox.pop_local() {
            // A local refusal (a duplicate RELEASE, say) needs no answer: the core retries
            // on its timers like for a lost message.
            if !self.membership.serving() {
                continue; // not serving: as if lost; the core retries
            }
            if self.owns(&key) {
                let now = self.clock.now();
                self.serve_local(&key, msg, now);
            } else if self.room_to_check(self.local, &key).is_ok() {
                let parked =
                    Parked { from: self.local, heard: self.clock.now(), n, msg, hops, reply_to: ReplyTo::Local };
                self.park(&key, parked);
            }
        }
    }

    /// Queues a message for `peer`: everything queued for one peer in one step goes as
    /// one transport request (`Outbox::flush`, on the next poll).
    pub(super) fn enqueue(&mut self, peer: PeerId, request: Request, pending: Option<Pending>) {
        self.used(peer);
        self.outbox.enqueue(peer, request, pending);
        self.wake();
    }

    /// Revokes the local acquisition that holds `resource` under `token`, as ordered
    /// by `by` (this peer, or an admin peer): the application gets [`Event::Revoked`]
    /// and the lock is released. Returns whether such an acquisition was held here.
    pub fn revoke(&mut self, resource: &str, token: u64, by: PeerId) -> bool {
        let found = self
            .acquiring
            .iter()
            .find(|(_, a)| a.resource == resource && a.client.phase() == Phase::Holding && a.client.token() == token);
        let Some((&id, _)) = found else { return false };
        tracing::warn!(%resource, token, %by, "lock revoked by an operator");
        self.counters.revoked += 1;
        self.events.push_back(Event::Revoked { id, resource: resource.to_owned(), token, by });
        self.release(id);
        true
    }

    /// Hands a RESPONSE to the local acquisition it is for. A grant to an acquisition
    /// that is already finished is given back at once.
    pub(super) fn deliver(&mut self, voter: PeerId, resource: &str, index: u16, resp: Response<PeerId>) {
        let now = self.clock.now();
        // Lamport's receive rule, within the clock-offset bound (a value near u64::MAX
        // would pin the clock there and give later acquisitions equal timestamps).
        let bound =
            proto::clock::micros(now).saturating_add(proto::clock::micros(self.config.proto.max_clock_offset()));
        if resp.owner.counter <= bound {
            self.lamport.observe(resp.owner.counter);
        }
        let Some(id) = self.acquiring.id_of(&resp.ts) else {
            if resp.owner == resp.ts {
                if let Some(n) = self.acquiring.finished_n(&resp.ts) {
                    // With the acquisition's own n: a host refuses any other replica
                    // count (`Rejection::QuorumMismatch`), and a refused hand-back would
                    // leave the vote with nobody until its lease ran out.
                    let msg = ToReplica::Release { ts: resp.ts, token: 0, next: Vec::new() };
                    self.send_to_replica(ReplicaKey::new(resource, index), n, msg, 0);
                }
            }
            return;
        };
        if let Some(a) = self.acquiring.get_mut(&id) {
            if a.resource == resource {
                if let Err(e) = a.client.handle_response_from(now, usize::from(index), voter, resp) {
                    let reason = match e {
                        proto::ClientError::Stale => "stale",
                        proto::ClientError::Ahead { .. } => "ahead",
                        proto::ClientError::WrongAcquisition => "wrong_acquisition",
                        proto::ClientError::ReplicaOutOfRange { .. } => "replica_out_of_range",
                    };
                    Counters::bump(&mut self.counters.responses_refused, reason);
                }
            }
        }
        self.drain_acquisition(id);
    }

    /// Moves an acquisition's outputs to the network and its events to the application.
    pub(super) fn drain_acquisition(&mut self, id: AcquisitionId) {
        self.drain_acquisition_outputs(id);
        self.reindex_acquisition(id);
    }

    fn drain_acquisition_outputs(&mut self, id: AcquisitionId) {
        loop {
            let Some(a) = self.acquiring.get_mut(&id) else { return };
            if let Some(event) = a.client.poll_event() {
                let event = match event {
                    proto::Event::Acquired { token, votes, valid_until } => {
                        self.counters.acquired += 1;
                        let resource = a.resource.clone();
                        let peers: HashSet<PeerId> = a
                            .client
                            .views()
                            .iter()
                            .filter(|v| v.owner.as_ref() == Some(a.client.ts()))
                            .filter_map(|v| v.voter)
                            .collect();
                        Event::Acquired {
                            id,
                            resource,
                            token,
                            valid_until: self.clock.instant(valid_until),
                            votes,
                            distinct_peers: peers.len(),
                        }
                    }
                    proto::Event::Lost(reason) => {
                        self.counters.lost += 1;
                        Event::Lost { id, reason }
                    }
                };
                self.events.push_back(event);
                continue;
            }
            if let Some((index, msg)) = a.client.poll_transmit() {
                if a.deferred.is_some() {
                    continue; // nothing was sent: nothing to send now
                }
                let key = a.keys.get(index).cloned();
                let key = key.unwrap_or_else(|| ReplicaKey::new(&a.resource, u16::try_from(index).unwrap_or(u16::MAX)));
                let n = a.n;
                self.send_to_replica(key, n, msg, 0);
                continue;
            }
            if a.client.phase() == Phase::Released {
                if a.client.token() > 0 {
                    let st = a.client.stats();
                    self.counters.completed += 1;
                    self.counters.completed_messages += st.requests + st.yields + st.releases + st.responses + st.stale;
                }
                let now = self.clock.now();
                self.acquiring.finish(id, now);
            }
            return;
        }
    }

    pub(super) fn on_reply(&mut self, peer: PeerId, id: RequestId, reply: Reply) {
        match self.outbox.answered(id) {
            None => {}
            Some(Sent::One(p)) => self.on_item_reply(peer, p, reply),
            Some(Sent::Batch(items)) => {
                let replies = match reply {
                    Reply::Batch(replies) if replies.len() == items.len() => replies,
                    reply => {
                        // A refused batch (or a reply of the wrong shape): as if each
                        // item were refused; the core retries on its timers.
                        Counters::bump(&mut self.counters.responses_refused, "batch_reply");
                        tracing::debug!(%peer, ?reply, "a batch was not answered item by item");
                        let refused = match reply {
                            Reply::Rejected(r) => r,
                            _ => Rejection::BadBatch,
                        };
                        vec![Reply::Rejected(refused); items.len()]
                    }
                };
                for (p, reply) in items.into_iter().zip(replies) {
                    if let Some(p) = p {
                        self.on_item_reply(peer, p, reply);
                    }
                }
            }
        }
    }

    /// The reply to one message sent alone or in a batch.
    fn on_item_reply(&mut self, peer: PeerId, p: Pending, reply: Reply) {
        let index = p.index();
        if let Some(probe) = p.probe {
            match (reply, p.key) {
                (Reply::Redirect { peer: closer, addrs }, Some(key))
                    if p.hops < self.config.max_redirects && closer != peer =>
                {
                    for a in addrs.into_iter().take(wire::MAX_REDIRECT_ADDRS) {
                        self.add_address(&closer, a);
                    }
                    self.acquiring.cache_host(&key, closer);
                    self.send_survey(key, p.n, probe, p.hops + 1);
                }
                (Reply::Redirect { .. }, _) => self.probe_answered(probe, index, peer, None),
                (reply, _) => self.probe_answered(probe, index, peer, Some(reply)),
            }
            return;
        }
        let (Some(msg), Some(key)) = (p.msg, p.key) else { return };
        match reply {
            Reply::Responses(responses) => {
                for r in responses {
                    if r.ts.client == self.local {
                        self.deliver(peer, key.resource(), key.index(), r);
                    }
                }
            }
            Reply::Redirect { peer: closer, addrs } => {
                self.counters.redirects_followed += 1;
                for a in addrs.into_iter().take(wire::MAX_REDIRECT_ADDRS) {
                    self.add_address(&closer, a);
                }
                self.acquiring.cache_host(&key, closer);
                if p.hops < self.config.max_redirects && closer != peer {
                    Counters::bump(&mut self.counters.messages_out, "redirected");
                    self.send_to_replica(key, p.n, msg, p.hops + 1);
                } else {
                    self.lookup(&key);
                }
            }
            // A message refused for the budget goes again once it has refilled: nothing
            // else retries a RELEASE (the acquisition is over), and the core retries the
            // others only on its timers (about a second, with every waiter standing
            // still). Other refusals are left to the core.
            Reply::Rejected(Rejection::RateLimited) => {
                self.resend_later(Outgoing { key, n: p.n, msg, hops: 0, resent: p.resent });
            }
            Reply::Rejected(r) => {
                tracing::debug!(%peer, reason = r.as_str(), "sigma request rejected by peer");
            }
            Reply::Ack | Reply::Replica(_) | Reply::Holding(_) | Reply::Locks(_) | Reply::Batch(_) => {}
        }
    }

    /// Files a refused message to go again after a backoff (see the outbox), if it is
    /// worth it.
    fn resend_later(&mut self, r: Outgoing) {
        if self.worth_resending(&r.msg) && self.outbox.resend_later(self.clock.now(), r, &mut self.counters) {
            self.wake();
        }
    }

    /// Sends the refused messages whose backoff is over.
    pub(super) fn resend_due(&mut self, now: Time) {
        while let Some(mut out) = self.outbox.resend_due(now) {
            if self.worth_resending(&out.msg) {
                self.counters.resent += 1;
                out.resent += 1;
                self.send_to_replica_now(out);
            }
        }
    }

    /// A RELEASE always is; another message while its acquisition lives here (a stale
    /// REQUEST reaching a replica that has forgotten the acquisition would queue it
    /// again, with nobody left to release it).
    fn worth_resending(&self, msg: &ToReplica<PeerId>) -> bool {
        matches!(msg, ToReplica::Release { .. }) || self.acquiring.id_of(msg.ts()).is_some()
    }

    pub(super) fn on_outbound_failure(&mut self, id: RequestId, error: &OutboundFailure) {
        Counters::bump(&mut self.counters.outbound_failures, error.as_str());
        match self.outbox.answered(id) {
            None => {}
            Some(Sent::One(p)) => self.on_item_failure(p, error),
            Some(Sent::Batch(items)) => items.into_iter().flatten().for_each(|p| self.on_item_failure(p, error)),
        }
    }

    /// A message sent alone or in a batch got no answer.
    fn on_item_failure(&mut self, p: Pending, error: &OutboundFailure) {
        use OutboundFailure as F;
        if let Some(probe) = p.probe {
            self.probe_answered(probe, p.index(), p.peer, None);
        }
        // Timeout and ConnectionClosed mean "maybe delivered": the core's timers retry,
        // and every handler is idempotent. A host that cannot be reached is looked up
        // (a question to one peer, `ask`, names no replica). A dial this peer's own
        // connection limit refused (DialDenied) says nothing of the host: the core's
        // timers retry it, by when trimming has made room.
        if let Some(key) = p.key.filter(|_| matches!(error, F::DialFailure | F::UnsupportedProtocols)) {
            self.acquiring.forget_host(&key);
            self.routing.unroute(&p.peer);
            self.lookup(&key);
        }
    }

    /// Files an acquisition under its next deadline (none while deferred or gone).
    fn reindex_acquisition(&mut self, id: AcquisitionId) {
        self.acquiring.reindex(id);
    }
}
