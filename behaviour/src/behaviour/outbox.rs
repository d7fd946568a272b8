//! The outbox: what this peer's roles send, on its way out. Messages for other peers are
//! queued per peer and sent once per poll step, a transport request per peer (alone,
//! or batches of up to [`wire::MAX_BATCH`]), each remembered until its reply
//! ([`Pending`]); this peer's client's messages to the replicas it hosts wait in a local
//! inbox until the step's frames for the others have left; a message refused for the
//! request budget goes again after a backoff; and the test-only message delay
//! ([`Config::with_message_delay`]) holds every protocol message for a drawn latency.
//!
//! The delay: every protocol message this peer sends (a client's message to a replica,
//! a replica's RESPONSE, the reply to a remote request) is held for a latency drawn from
//! a distribution, each on its own, as the simulator delays its messages, so that a run
//! on real nodes reproduces a simulated setting (the paper's Fig. 7). Messages to and
//! from replicas hosted here are held as well; transport requests are not batched while
//! it is on. Off by default.
//!
//! Plain state: [`Outbox`] takes `now` and the transport it hands requests to, and
//! gives back what is due; the behaviour decides where each message goes.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use libp2p::PeerId;

use super::key::ReplicaKey;
use super::link::{self, RequestId, ResponseChannel};
use super::types::{Counters, ProbeId};
use crate::latency::Latency;
use crate::proto::{Response, Time, ToReplica};
use crate::wire::{self, Reply, Request};

#[cfg(doc)]
use super::config::Config;

/// Times a refused message is sent again, the first after [`RESEND_FIRST`], each wait
/// twice the last, at most [`RESEND_MAX_WAIT`] (about 12 s in all; a RELEASE never sent
/// leaves its votes with the acquisition until their leases run out).
const RESEND_ATTEMPTS: u8 = 10;
const RESEND_FIRST: Duration = Duration::from_millis(10);
const RESEND_MAX_WAIT: Duration = Duration::from_secs(2);
/// Messages waiting to be sent again at most; past it the one due first is dropped (a
/// RELEASE's votes lapse with their leases; the core retries the others).
pub(super) const MAX_RESENDS: usize = 4096;

/// Messages held by the delay past this many go at once (a bound, not a setting: a test
/// run never holds as many).
const MAX_HELD: usize = 100_000;

/// What a transport request carried: one message, or a batch (an entry per item;
/// `None` for a notice, which expects nothing but an acknowledgement).
#[derive(Debug)]
pub(super) enum Sent {
    One(Pending),
    Batch(Vec<Option<Pending>>),
}

/// An outbound message, kept for its reply: redirects and failures.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) peer: PeerId,
    /// The replica it is for; `None` for a question to one peer (`Behaviour::ask`).
    pub(super) key: Option<ReplicaKey>,
    pub(super) n: u16,
    /// The client message, or `None` for a probe.
    pub(super) msg: Option<ToReplica<PeerId>>,
    pub(super) probe: Option<ProbeId>,
    pub(super) hops: u8,
    /// Times this message was sent again after a refusal for the request budget.
    pub(super) resent: u8,
}

impl Pending {
    /// The index of the replica it is for (0 for a question to one peer).
    pub(super) fn index(&self) -> u16 {
        self.key.as_ref().map_or(0, ReplicaKey::index)
    }
}

/// A client message on its way to the host of a replica: held by the test-only delay,
/// queued for a replica this peer hosts, or waiting to go again after a refusal for the
/// request budget.
#[derive(Debug)]
pub(super) struct Outgoing {
    pub(super) key: ReplicaKey,
    pub(super) n: u16,
    pub(super) msg: ToReplica<PeerId>,
    /// Redirects followed so far.
    pub(super) hops: u8,
    /// Times it has been sent again after a refusal for the request budget.
    pub(super) resent: u8,
}

/// Where the answer to a remote peer's message goes.
#[derive(Debug)]
pub(super) enum ReplyTo {
    /// A local acquisition's message: no answer (the core retries on its timers).
    Local,
    /// A request that came alone.
    Channel(ResponseChannel),
    /// Item `slot` of inbound batch `batch` (the host's batches awaiting answers).
    Slot { batch: u64, slot: usize },
}

/// A message held by the delay.
// Only ever held under the test-only delay: boxing the larger variants buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(super) enum Held {
    /// A local acquisition's message to the host of a replica.
    ToReplica(Outgoing),
    /// A hosted replica's RESPONSE to a client (this peer's or a remote one).
    Response { to: PeerId, key: ReplicaKey, resp: Response<PeerId> },
    /// The reply to a remote peer's request.
    Reply { to: ReplyTo, reply: Reply },
}

/// Everything on its way out (see the module's doc).
#[derive(Debug)]
pub(super) struct Outbox {
    /// Transport requests awaiting their reply.
    pending: HashMap<RequestId, Sent>,
    /// Messages for other peers from the current step, sent (one transport request per
    /// peer, batched) before the behaviour next waits: drained on every poll.
    queued: HashMap<PeerId, Vec<(Request, Option<Pending>)>>,
    order: Vec<PeerId>,
    /// This peer's client's messages to the replicas it hosts, served after the step's
    /// messages for other peers have left (drained on every poll).
    local: VecDeque<Outgoing>,
    /// Client messages refused for the request budget, by when they go again (at most
    /// [`MAX_RESENDS`]).
    resends: BTreeMap<(Time, u64), Outgoing>,
    next_resend: u64,
    /// The outbox was flushed since the poll last yielded: local messages wait one
    /// yield, so the connections write first.
    pub(super) flushed: bool,
    /// The test-only delay's distribution, and the messages it holds by due time (and
    /// arrival order among equal times).
    delay: Option<Latency>,
    held: BTreeMap<(Time, u64), Held>,
    next_held: u64,
}

impl Outbox {
    pub(super) fn new(delay: Option<Latency>) -> Self {
        Outbox {
            pending: HashMap::new(),
            queued: HashMap::new(),
            order: Vec::new(),
            local: VecDeque::new(),
            resends: BTreeMap::new(),
            next_resend: 0,
            flushed: false,
            delay,
            held: BTreeMap::new(),
            next_held: 0,
        }
    }

    /// Whether messages are held (the test-only delay is on).
    pub(super) fn delaying(&self) -> bool {
        self.delay.is_some()
    }

    /// Holds `message` for a latency drawn with `rng`; gives it back when it is to go
    /// now (the delay is off, or the queue is full).
    pub(super) fn hold(&mut self, now: Time, rng: &mut impl rand::Rng, message: Held) -> Option<Held> {
        match self.delay {
            Some(latency) if self.held.len() < MAX_HELD => {
                let due = now + latency.sample(rng);
                let seq = self.next_held;
                self.next_held += 1;
                self.held.insert((due, seq), message);
                None
            }
            _ => Some(message),
        }
    }

    /// The next held message that is due at `now`.
    pub(super) fn held_due(&mut self, now: Time) -> Option<Held> {
        let entry = self.held.first_entry()?;
        (entry.key().0 <= now).then(|| entry.remove())
    }

    /// Queues a message for `peer`: everything queued for one peer in one step goes as
    /// one transport request ([`Outbox::flush`]).
    pub(super) fn enqueue(&mut self, peer: PeerId, request: Request, pending: Option<Pending>) {
        match self.queued.get_mut(&peer) {
            Some(items) => items.push((request, pending)),
            None => {
                self.queued.insert(peer, vec![(request, pending)]);
                self.order.push(peer);
            }
        }
    }

    /// Sends what the current step queued on `link`: per peer, a message alone or
    /// batches of up to [`wire::MAX_BATCH`]. Answers whether anything was sent.
    pub(super) fn flush(&mut self, link: &mut link::Behaviour, counters: &mut Counters) -> bool {
        if self.order.is_empty() {
            return false;
        }
        for peer in std::mem::take(&mut self.order) {
            let Some(mut items) = self.queued.remove(&peer) else { continue };
            while !items.is_empty() {
                // The test-only delay draws each message's latency on its own: no batches.
                let most = if self.delaying() { 1 } else { wire::MAX_BATCH };
                let rest = items.split_off(items.len().min(most));
                let chunk = std::mem::replace(&mut items, rest);
                counters.requests_out += 1;
                if chunk.len() == 1 {
                    let Some((request, pending)) = chunk.into_iter().next() else { break };
                    let id = link.send_request(&peer, request);
                    if let Some(p) = pending {
                        self.pending.insert(id, Sent::One(p));
                    }
                } else {
                    counters.batches_out += 1;
                    let (requests, pendings): (Vec<Request>, Vec<Option<Pending>>) = chunk.into_iter().unzip();
                    let id = link.send_request(&peer, Request::Batch(requests));
                    self.pending.insert(id, Sent::Batch(pendings));
                }
            }
        }
        super::util::shrink_if_sparse(&mut self.queued);
        true
    }

    /// Remembers a request sent outside the step's queue until its reply.
    pub(super) fn sent(&mut self, id: RequestId, sent: Sent) {
        self.pending.insert(id, sent);
    }

    /// What request `id` carried, now that its reply or failure came.
    pub(super) fn answered(&mut self, id: RequestId) -> Option<Sent> {
        self.pending.remove(&id)
    }

    /// Transport requests awaiting their reply.
    pub(super) fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Queues a message for a replica this peer hosts.
    pub(super) fn push_local(&mut self, out: Outgoing) {
        self.local.push_back(out);
    }

    /// The next message for a replica this peer hosts, in the order they were sent.
    pub(super) fn pop_local(&mut self) -> Option<Outgoing> {
        self.local.pop_front()
    }

    /// Whether messages for this peer's own replicas wait.
    pub(super) fn has_local(&self) -> bool {
        !self.local.is_empty()
    }

    /// Files a refused message to go again after a backoff, unless it has gone
    /// [`RESEND_ATTEMPTS`] times already (counted as abandoned, as is the one dropped
    /// past [`MAX_RESENDS`]). Answers whether it was filed.
    pub(super) fn resend_later(&mut self, now: Time, r: Outgoing, counters: &mut Counters) -> bool {
        if r.resent >= RESEND_ATTEMPTS {
            counters.resends_abandoned += 1;
            return false;
        }
        if self.resends.len() >= MAX_RESENDS {
            self.resends.pop_first();
            counters.resends_abandoned += 1;
        }
        let wait = RESEND_FIRST.saturating_mul(1 << r.resent.min(16)).min(RESEND_MAX_WAIT);
        let seq = self.next_resend;
        self.next_resend += 1;
        self.resends.insert((now + wait, seq), r);
        true
    }

    /// The next refused message whose backoff is over at `now`.
    pub(super) fn resend_due(&mut self, now: Time) -> Option<Outgoing> {
        let entry = self.resends.first_entry()?;
        (entry.key().0 <= now).then(|| entry.remove())
    }

    /// When the next held or refused message is due.
    pub(super) fn next_due(&self) -> Option<Time> {
        let held = self.held.keys().next().map(|(t, _)| *t);
        let resend = self.resends.keys().next().map(|(t, _)| *t);
        [held, resend].into_iter().flatten().min()
    }
}
