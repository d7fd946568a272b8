//! The strawman protocol of §3: ALOHA-like majority voting.
//!
//! A client sends REQUEST to all n replicas. A replica grants its vote (for a lease) if
//! it is free and otherwise rejects, naming its owner. A client with m grants wins;
//! once it cannot reach m it releases what it got, backs off for a random period
//! ([`Backoff`]) and tries again in a new round. There is no queue and no cooperation:
//! under latency variance the replicas see competing requests in different orders and
//! nobody wins — the collapse of Fig. 3.
//!
//! Same shape as the Sigma core: `handle_*` inputs, `poll_*` outputs, `now` and the RNG
//! as arguments. The acquisition is identified by a [`Timestamp`] (used only as an id;
//! the strawman has no order) and each attempt by its round number.

use std::collections::VecDeque;
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::backoff::Backoff;
use super::client::{Event, LostReason, Phase};
use super::clock::Timestamp;
use super::config::Config;
use super::error::{ClientError, ReplicaError};
use super::Time;

/// Client to replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToReplica<C> {
    /// Ask for the vote in round `round` (also renews it for its holder).
    Request {
        /// The acquisition.
        ts: Timestamp<C>,
        /// The attempt.
        round: u32,
    },
    /// Give the vote of round `round` back.
    Release {
        /// The acquisition.
        ts: Timestamp<C>,
        /// The attempt.
        round: u32,
    },
}

impl<C> ToReplica<C> {
    /// The acquisition this message is about.
    pub fn ts(&self) -> &Timestamp<C> {
        match self {
            ToReplica::Request { ts, .. } | ToReplica::Release { ts, .. } => ts,
        }
    }
}

/// Replica to client: the answer to a REQUEST.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply<C> {
    /// The acquisition addressed.
    pub ts: Timestamp<C>,
    /// The round answered.
    pub round: u32,
    /// Whether the vote was granted.
    pub granted: bool,
    /// The current owner.
    pub owner: Timestamp<C>,
}

/// A strawman replica: one owner with a lease, no queue.
#[derive(Clone, Debug)]
pub struct Replica<C> {
    lease: Duration,
    owner: Option<(Timestamp<C>, u32, Time)>,
    outbox: VecDeque<(C, Reply<C>)>,
}

impl<C: Clone + Ord> Replica<C> {
    /// A replica with empty memory.
    pub fn new(config: &Config) -> Self {
        Replica { lease: config.lease, owner: None, outbox: VecDeque::new() }
    }

    /// Current owner and round.
    pub fn owner(&self) -> Option<(&Timestamp<C>, u32)> {
        self.owner.as_ref().map(|(ts, round, _)| (ts, *round))
    }

    /// Handles a message from the authenticated sender `from`.
    pub fn handle(&mut self, now: Time, from: &C, msg: ToReplica<C>) -> Result<(), ReplicaError> {
        if &msg.ts().client != from {
            return Err(ReplicaError::ForeignAcquisition);
        }
        self.handle_timeout(now);
        match msg {
            ToReplica::Request { ts, round } => {
                let granted = match &mut self.owner {
                    None => {
                        self.owner = Some((ts.clone(), round, now + self.lease));
                        true
                    }
                    Some((o, r, until)) if *o == ts && *r == round => {
                        *until = now + self.lease;
                        true
                    }
                    Some(_) => false,
                };
                let owner = self.owner.as_ref().map(|(o, _, _)| o.clone()).expect("owner set above");
                self.outbox.push_back((ts.client.clone(), Reply { ts, round, granted, owner }));
                Ok(())
            }
            ToReplica::Release { ts, round } => match &self.owner {
                Some((o, r, _)) if *o == ts && *r == round => {
                    self.owner = None;
                    Ok(())
                }
                _ => Err(ReplicaError::NotHolder),
            },
        }
    }

    /// Lease expiry. Spurious calls are harmless.
    pub fn handle_timeout(&mut self, now: Time) {
        if self.owner.as_ref().is_some_and(|(_, _, until)| *until <= now) {
            self.owner = None;
        }
    }

    /// When the owner's lease runs out.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.owner.as_ref().map(|(_, _, until)| *until)
    }

    /// Next reply to send.
    pub fn poll_transmit(&mut self) -> Option<(C, Reply<C>)> {
        self.outbox.pop_front()
    }
}

/// A strawman acquisition: rounds of REQUEST-to-all with random backoff in between.
#[derive(Clone, Debug)]
pub struct Client<C> {
    config: Config,
    backoff: Backoff,
    ts: Timestamp<C>,
    phase: Phase,
    round: u32,
    /// Per replica, this round: `None` unanswered, `Some(granted)`.
    answers: Vec<Option<bool>>,
    grants: usize,
    /// Round timeout while collecting; next attempt while backing off; renewal while
    /// holding.
    timer: Option<Time>,
    backing_off: bool,
    /// Conservative lease end per granted vote (request send time + lease).
    sent_at: Time,
    valid_until: Time,
    outbox: VecDeque<(usize, ToReplica<C>)>,
    events: VecDeque<Event>,
    /// Rounds lost so far.
    pub collisions: u32,
}

impl<C: Clone + Ord> Client<C> {
    /// Starts an acquisition: round 1, REQUEST to all n.
    pub fn new(config: Config, backoff: Backoff, ts: Timestamp<C>, now: Time) -> Self {
        let n = config.n;
        let mut c = Client {
            config,
            backoff,
            ts,
            phase: Phase::Waiting,
            round: 0,
            answers: vec![None; n],
            grants: 0,
            timer: None,
            backing_off: false,
            sent_at: now,
            valid_until: now,
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            collisions: 0,
        };
        c.start_round(now);
        c
    }

    /// The acquisition's id.
    pub fn ts(&self) -> &Timestamp<C> {
        &self.ts
    }
    /// Current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }
    /// Current round (1-based).
    pub fn round(&self) -> u32 {
        self.round
    }
    /// Replicas that granted their vote in the current round.
    pub fn granted(&self) -> Vec<usize> {
        self.answers.iter().enumerate().filter(|(_, a)| **a == Some(true)).map(|(i, _)| i).collect()
    }

    fn start_round(&mut self, now: Time) {
        self.round += 1;
        self.backing_off = false;
        self.grants = 0;
        self.answers.iter_mut().for_each(|a| *a = None);
        self.sent_at = now;
        self.timer = Some(now + self.config.request_timeout);
        for i in 0..self.answers.len() {
            self.outbox.push_back((i, ToReplica::Request { ts: self.ts.clone(), round: self.round }));
        }
    }

    /// Applies a reply from replica `from`.
    pub fn handle_reply<R: Rng + ?Sized>(
        &mut self,
        now: Time,
        from: usize,
        reply: Reply<C>,
        rng: &mut R,
    ) -> Result<(), ClientError> {
        let n = self.answers.len();
        if from >= n {
            return Err(ClientError::ReplicaOutOfRange { index: from, n });
        }
        if reply.ts != self.ts {
            return Err(ClientError::WrongAcquisition);
        }
        let current = reply.round == self.round && self.phase != Phase::Released;
        if !current || (self.phase == Phase::Waiting && self.backing_off) {
            // A grant from an abandoned round (or after release) is given back at once.
            if reply.granted {
                self.outbox.push_back((from, ToReplica::Release { ts: self.ts.clone(), round: reply.round }));
            }
            return if current || reply.round < self.round { Ok(()) } else { Err(ClientError::Stale) };
        }
        match self.phase {
            Phase::Waiting => {
                if self.answers[from].is_none() {
                    self.answers[from] = Some(reply.granted);
                    if reply.granted {
                        self.grants += 1;
                    }
                }
                let answered = self.answers.iter().filter(|a| a.is_some()).count();
                if self.grants >= self.config.m {
                    self.phase = Phase::Holding;
                    self.valid_until = self.sent_at + self.config.lease;
                    self.timer = Some(self.sent_at + self.config.renew_interval);
                    let votes = self.grants;
                    self.events.push_back(Event::Acquired { token: 0, votes, valid_until: self.valid_until });
                } else if self.grants + (n - answered) < self.config.m {
                    self.lose_round(now, rng);
                }
            }
            Phase::Holding if reply.granted => {
                self.valid_until = self.valid_until.max(self.sent_at + self.config.lease);
            }
            Phase::Holding => {
                self.phase = Phase::Lost;
                self.timer = None;
                self.events.push_back(Event::Lost(LostReason::VotesTaken));
            }
            _ => {}
        }
        Ok(())
    }

    /// Releases the granted votes of this round and schedules the next one.
    fn lose_round<R: Rng + ?Sized>(&mut self, now: Time, rng: &mut R) {
        self.collisions += 1;
        for (i, a) in self.answers.iter().enumerate() {
            if *a == Some(true) {
                self.outbox.push_back((i, ToReplica::Release { ts: self.ts.clone(), round: self.round }));
            }
        }
        self.backing_off = true;
        self.timer = Some(now + self.backoff.delay(self.collisions, rng));
    }

    /// Round timeout (unanswered replicas count as rejections), end of backoff, renewal.
    pub fn handle_timeout<R: Rng + ?Sized>(&mut self, now: Time, rng: &mut R) {
        let lapsed = self.phase == Phase::Holding && self.valid_until <= now;
        if !lapsed && self.timer.is_none_or(|t| t > now) {
            return;
        }
        match self.phase {
            Phase::Waiting if self.backing_off => self.start_round(now),
            Phase::Waiting => self.lose_round(now, rng),
            Phase::Holding => {
                if self.valid_until <= now {
                    self.phase = Phase::Lost;
                    self.timer = None;
                    self.events.push_back(Event::Lost(LostReason::LeaseExpired));
                    return;
                }
                self.sent_at = now;
                self.timer = Some(now + self.config.renew_interval);
                for i in 0..self.answers.len() {
                    if self.answers[i] == Some(true) {
                        self.outbox.push_back((i, ToReplica::Request { ts: self.ts.clone(), round: self.round }));
                    }
                }
            }
            Phase::Lost | Phase::Released => self.timer = None,
        }
    }

    /// Next timer.
    ///
    /// While holding, this includes the lease deadline: a holder whose renewals go
    /// unanswered learns of the loss when its lease lapses, not at the next renewal.
    pub fn poll_timeout(&self) -> Option<Time> {
        let deadline = (self.phase == Phase::Holding).then_some(self.valid_until);
        self.timer.into_iter().chain(deadline).min()
    }

    /// RELEASE to every replica that granted this round; a grant still in flight is
    /// given back when it arrives. Abandons a wait. Idempotent.
    pub fn release(&mut self, _now: Time) {
        if self.phase == Phase::Released {
            return;
        }
        let backing_off = self.backing_off;
        self.phase = Phase::Released;
        self.timer = None;
        for i in 0..self.answers.len() {
            if self.answers[i] == Some(true) && !backing_off {
                self.outbox.push_back((i, ToReplica::Release { ts: self.ts.clone(), round: self.round }));
            }
        }
    }

    /// Next message.
    pub fn poll_transmit(&mut self) -> Option<(usize, ToReplica<C>)> {
        self.outbox.pop_front()
    }

    /// Next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
}
