//! Probes: questions this peer asks without protocol work. A probe measures the round
//! trip to the host of each replica of a lock, an inspection asks each host for its
//! replica's state, along the path a REQUEST takes (redirects included); a question to
//! one peer (`ask`) carries an operator's `Holding` or `Revoke`. Answers come back as
//! [`Event::Probed`], [`Event::Inspected`] and [`Event::Answered`].

use std::time::{Duration, Instant};

use libp2p::PeerId;

use super::key::ReplicaKey;
use super::outbox::{Pending, Sent};
use super::types::{AcquireError, Counters, Event, ProbeId, ReplicaAnswer};
// Up to the parent for `Behaviour` alone: this file is one of its `impl` blocks (the
// methods of one role, which coordinate that role's state with the others').
use super::Behaviour;
use crate::proto;
use crate::wire::{self, Reply, Request};

/// A fan-out to the hosts of a lock's replicas, or one question to one peer.
pub(super) struct Probe {
    started: Instant,
    kind: ProbeKind,
    outstanding: usize,
}

enum ProbeKind {
    /// Round trips, by replica index.
    Ping(Vec<Option<Duration>>),
    /// Replica states, by replica index.
    Inspect(Vec<ReplicaAnswer>),
    /// One request to one peer.
    Ask,
}

impl Behaviour {
    /// Measures the round trip to the host of every replica of `resource` (`n`
    /// replicas, default the configured n) along the path a REQUEST takes, redirects
    /// included, without protocol work. The result comes as [`Event::Probed`].
    pub fn probe(&mut self, resource: &str, n: Option<usize>) -> Result<ProbeId, AcquireError> {
        self.survey(resource, n, |n| ProbeKind::Ping(vec![None; n]))
    }

    /// Asks the host of every replica of `resource` (`n` replicas, default the
    /// configured n) for the replica's state: owner, lease, queue. Changes nothing. The
    /// result comes as [`Event::Inspected`].
    pub fn inspect(&mut self, resource: &str, n: Option<usize>) -> Result<ProbeId, AcquireError> {
        let local = self.local;
        self.survey(resource, n, |n| ProbeKind::Inspect(vec![ReplicaAnswer::NoAnswer { host: local }; n]))
    }

    fn survey(
        &mut self,
        resource: &str,
        n: Option<usize>,
        kind: impl FnOnce(usize) -> ProbeKind,
    ) -> Result<ProbeId, AcquireError> {
        wire::validate_resource(resource).map_err(|_| AcquireError::BadName)?;
        let n = n.unwrap_or(self.config.proto.n());
        let n16 = u16::try_from(n).ok().filter(|x| (1..=proto::MAX_REPLICAS).contains(&usize::from(*x)));
        let n16 = n16.ok_or(proto::ConfigError::TooManyReplicas(n))?;
        let id = ProbeId(self.next_id);
        self.next_id += 1;
        self.probes.insert(id, Probe { started: Instant::now(), kind: kind(n), outstanding: n });
        for key in ReplicaKey::all(resource, n16) {
            self.send_survey(key, n16, id, 0);
        }
        self.wake();
        Ok(id)
    }

    /// Sends one question to `peer`: a [`Request::Holding`], [`Request::Revoke`] or
    /// [`Request::Locks`] (an operator's tools). Asked of this peer, it is answered
    /// here at once. The answer comes as [`Event::Answered`]; a remote answer out of
    /// bounds ([`wire::LockList::is_valid`], [`wire::HoldingState::is_valid`]) comes as
    /// none (counted
    /// `outbound_failures{bad_reply}`).
    pub fn ask(&mut self, peer: PeerId, request: Request) -> ProbeId {
        let id = ProbeId(self.next_id);
        self.next_id += 1;
        if peer == self.local {
            let reply = self.answer_operator(self.local, request);
            self.events.push_back(Event::Answered { id, reply: Some(reply) });
        } else {
            self.probes.insert(id, Probe { started: Instant::now(), kind: ProbeKind::Ask, outstanding: 1 });
            self.used(peer);
            self.counters.requests_out += 1;
            let out = self.inner.link.send_request(&peer, request);
            let pending = Pending { peer, key: None, n: 0, msg: None, probe: Some(id), hops: 0, resent: 0 };
            self.outbox.sent(out, Sent::One(pending));
        }
        self.wake();
        id
    }

    pub(super) fn send_survey(&mut self, key: ReplicaKey, n: u16, probe: ProbeId, hops: u8) {
        let mut host = self.host(&key);
        if host == self.local {
            if let Some(closer) = self.closer_live_peer(&key) {
                self.acquiring.cache_host(&key, closer);
                host = closer;
            }
        }
        let inspect = matches!(self.probes.get(&probe).map(|p| &p.kind), Some(ProbeKind::Inspect(_)));
        let (resource, index) = (key.resource().to_owned(), key.index());
        if host == self.local {
            let reply = if inspect { Reply::Replica(self.replica_state(&key)) } else { Reply::Ack };
            self.probe_answered(probe, index, host, Some(reply));
            return;
        }
        let request =
            if inspect { Request::Inspect { resource, index, n } } else { Request::Ping { resource, index, n } };
        let pending = Pending { peer: host, key: Some(key), n, msg: None, probe: Some(probe), hops, resent: 0 };
        self.enqueue(host, request, Some(pending));
    }

    /// Ends a probe or an inspection now, with the answers it has (the others count as
    /// no answer): its event comes as if every answer were in. `false` if it had ended.
    /// For a caller with a deadline shorter than the request timeout (a watch).
    pub fn finish_probe(&mut self, id: ProbeId) -> bool {
        let Some(p) = self.probes.remove(&id) else { return false };
        self.events.push_back(match p.kind {
            ProbeKind::Ping(rtts) => Event::Probed { id, rtts },
            ProbeKind::Inspect(replicas) => Event::Inspected { id, replicas },
            ProbeKind::Ask => Event::Answered { id, reply: None },
        });
        self.wake();
        true
    }

    /// Records the answer of `host` (`None`: no answer) for replica `index`.
    pub(super) fn probe_answered(&mut self, id: ProbeId, index: u16, host: PeerId, reply: Option<Reply>) {
        let Some(p) = self.probes.get_mut(&id) else { return };
        let i = usize::from(index);
        match &mut p.kind {
            ProbeKind::Ping(rtts) => {
                if let (Some(slot), Some(Reply::Ack)) = (rtts.get_mut(i), &reply) {
                    *slot = Some(p.started.elapsed());
                }
            }
            ProbeKind::Inspect(answers) => {
                if let Some(slot) = answers.get_mut(i) {
                    *slot = match reply {
                        Some(Reply::Replica(state)) => ReplicaAnswer::State { host, state },
                        Some(Reply::Rejected(reason)) => ReplicaAnswer::Refused { host, reason },
                        _ => ReplicaAnswer::NoAnswer { host },
                    };
                }
            }
            ProbeKind::Ask => {
                self.probes.remove(&id);
                let reply = match reply {
                    Some(Reply::Locks(list)) if !list.is_valid() => {
                        Counters::bump(&mut self.counters.outbound_failures, "bad_reply");
                        tracing::debug!(%host, "a peer's list of locks is out of bounds: dropped");
                        None
                    }
                    Some(Reply::Holding(Some(h))) if !h.is_valid() => {
                        Counters::bump(&mut self.counters.outbound_failures, "bad_reply");
                        tracing::debug!(%host, "a holder's answer is out of bounds (its value): dropped");
                        None
                    }
                    reply => reply,
                };
                self.events.push_back(Event::Answered { id, reply });
                return;
            }
        }
        p.outstanding = p.outstanding.saturating_sub(1);
        if p.outstanding == 0 {
            if let Some(p) = self.probes.remove(&id) {
                self.events.push_back(match p.kind {
                    ProbeKind::Ping(rtts) => Event::Probed { id, rtts },
                    ProbeKind::Inspect(replicas) => Event::Inspected { id, replicas },
                    // Answered above, when its one reply came.
                    ProbeKind::Ask => Event::Answered { id, reply: None },
                });
            }
        }
    }
}
