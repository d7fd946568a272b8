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
use super::rounds::{Rounds, Tally};
use sigma_behaviour::proto::client::{Event, LostReason, Phase};
use sigma_behaviour::proto::clock::Timestamp;
use sigma_behaviour::proto::config::Config;
use sigma_behaviour::proto::error::{ClientError, ReplicaError};
use sigma_behaviour::proto::Time;

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
        Replica { lease: config.lease(), owner: None, outbox: VecDeque::new() }
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
    ts: Timestamp<C>,
    phase: Phase,
    /// This round's answers and send time (a granted vote's lease ends, conservatively,
    /// at request send time + lease); the backoff between rounds.
    rounds: Rounds,
    /// Round timeout while collecting; next attempt while backing off; renewal while
    /// holding.
    timer: Option<Time>,
    valid_until: Time,
    outbox: VecDeque<(usize, ToReplica<C>)>,
    events: VecDeque<Event>,
    /// Rounds lost so far.
    pub collisions: u32,
}

impl<C: Clone + Ord> Client<C> {
    /// Starts an acquisition: round 1, REQUEST to all n.
    pub fn new(config: Config, backoff: Backoff, ts: Timestamp<C>, now: Time) -> Self {
        let rounds = Rounds::new(config.n(), config.m(), backoff, false, now);
        let mut c = Client {
            config,
            ts,
            phase: Phase::Waiting,
            rounds,
            timer: None,
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
        self.rounds.round()
    }
    /// Replicas that granted their vote in the current round.
    pub fn granted(&self) -> Vec<usize> {
        self.rounds.granted().collect()
    }

    fn start_round(&mut self, now: Time) {
        let request = |round| ToReplica::Request { ts: self.ts.clone(), round };
        self.timer = Some(self.rounds.start(now, self.config.request_timeout(), &mut self.outbox, request));
    }

    /// Applies a reply from replica `from`.
    pub fn handle_reply<R: Rng + ?Sized>(
        &mut self,
        now: Time,
        from: usize,
        reply: Reply<C>,
        rng: &mut R,
    ) -> Result<(), ClientError> {
        let n = self.rounds.n();
        if from >= n {
            return Err(ClientError::ReplicaOutOfRange { index: from, n });
        }
        if reply.ts != self.ts {
            return Err(ClientError::WrongAcquisition);
        }
        let round = self.rounds.round();
        let current = reply.round == round && self.phase != Phase::Released;
        if !current || (self.phase == Phase::Waiting && self.rounds.backing_off()) {
            // A grant from an abandoned round (or after release) is given back at once.
            if reply.granted {
                self.outbox.push_back((from, ToReplica::Release { ts: self.ts.clone(), round: reply.round }));
            }
            return if current || reply.round < round { Ok(()) } else { Err(ClientError::Stale) };
        }
        match self.phase {
            Phase::Waiting => match self.rounds.record(from, reply.granted) {
                Tally::Won => {
                    self.phase = Phase::Holding;
                    self.valid_until = self.rounds.sent_at() + self.config.lease();
                    self.timer = Some(self.rounds.sent_at() + self.config.renew_interval());
                    let votes = self.rounds.grants();
                    self.events.push_back(Event::Acquired { token: 0, votes, valid_until: self.valid_until });
                }
                Tally::Lost => self.lose_round(now, rng),
                Tally::Open => {}
            },
            Phase::Holding if reply.granted => {
                self.valid_until = self.valid_until.max(self.rounds.sent_at() + self.config.lease());
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
        let release = |round| ToReplica::Release { ts: self.ts.clone(), round };
        self.timer = Some(self.rounds.lose(now, self.collisions, &mut self.outbox, release, rng));
    }

    /// Round timeout (unanswered replicas count as rejections), end of backoff, renewal.
    pub fn handle_timeout<R: Rng + ?Sized>(&mut self, now: Time, rng: &mut R) {
        let lapsed = self.phase == Phase::Holding && self.valid_until <= now;
        if !lapsed && self.timer.is_none_or(|t| t > now) {
            return;
        }
        match self.phase {
            Phase::Waiting if self.rounds.backing_off() => self.start_round(now),
            Phase::Waiting => self.lose_round(now, rng),
            Phase::Holding => {
                if self.valid_until <= now {
                    self.phase = Phase::Lost;
                    self.timer = None;
                    self.events.push_back(Event::Lost(LostReason::LeaseExpired));
                    return;
                }
                self.rounds.restamp(now);
                self.timer = Some(now + self.config.renew_interval());
                let round = self.rounds.round();
                for i in self.rounds.granted() {
                    self.outbox.push_back((i, ToReplica::Request { ts: self.ts.clone(), round }));
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
        self.phase = Phase::Released;
        self.timer = None;
        if !self.rounds.backing_off() {
            self.rounds.release(&mut self.outbox, |round| ToReplica::Release { ts: self.ts.clone(), round });
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
