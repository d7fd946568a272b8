//! Chockler, Malkhi and Reiter (2001), "Backoff protocols for distributed mutual
//! exclusion and ordering", §3 (the mutual-exclusion protocol) and §4 (the "delayed
//! reply list" optimisation), as a sans-IO baseline.
//!
//! §3: a client `try`s a quorum; a server answers *free* unless it answered *free* less
//! than Δ ago, in which case it answers *locked*. The client succeeds iff every
//! response of its quorum is *free*; it then owns the critical section for Δ (the fixed
//! exclusion period) and must be done by then. Otherwise it backs off for a random
//! delay whose window grows exponentially with the number of failed tries
//! ([`Backoff::Exponential`]) and tries again.
//!
//! Here the quorum system is the majority one: the client sends to all n replicas and
//! succeeds with m *free* answers (m answers of a quorum, none naming a conflicting
//! holder). A *free* answer is a grant: a lease of length Δ (`Config::lease`) started
//! at the replica when it answered.
//!
//! §4, delayed reply list (option, [`Replica::new`]'s `delayed`): a locked replica does
//! not answer *locked*; it records the requester and, as soon as it is free again,
//! answers *free* to the requester with the lowest id (the acquisition's timestamp) and
//! *locked* to the others.
//!
//! Decisions where the paper is silent:
//! - **RELEASE** (not in the paper, whose grants simply expire after Δ): a client gives
//!   back the grants of a failed try and, when done, of a successful one, so a replica
//!   is free before Δ is over. It also withdraws a try still waiting in a delayed list.
//! - A **duplicate** `try` of the holder's own round is answered *free* again without
//!   extending the period: Δ is fixed, there are no renewals.
//! - The client's view of Δ is conservative: `send time of the try + Δ`, since every
//!   grant started at or after it. A win whose period has already run out is a failure.
//! - **Round timeout**: `Config::request_timeout`; silent replicas count as *locked*. A
//!   *free* answer of an abandoned round is given back on arrival.
//! - Delayed list bounded by `Config::max_queue`; beyond it the replica answers
//!   *locked* at once.

use std::collections::{BTreeMap, VecDeque};
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
    /// §3 `try`: round `round` of acquisition `ts`.
    Try {
        /// The acquisition (its id; "lowest id" in the delayed list).
        ts: Timestamp<C>,
        /// The attempt.
        round: u32,
    },
    /// Give back the grant of round `round`, or withdraw it from the delayed list.
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
            ToReplica::Try { ts, .. } | ToReplica::Release { ts, .. } => ts,
        }
    }
}

/// Replica to client: *free* (a grant for Δ) or *locked*.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply<C> {
    /// The acquisition addressed.
    pub ts: Timestamp<C>,
    /// The round answered.
    pub round: u32,
    /// *free*: the replica is now held by this round for Δ.
    pub free: bool,
}

/// A CMR server: who it answered *free* to, until when, and (option) the delayed list.
#[derive(Clone, Debug)]
pub struct Replica<C> {
    delta: Duration,
    delayed: bool,
    max_delayed: usize,
    holder: Option<(Timestamp<C>, u32, Time)>,
    /// Delayed reply list: requester → its latest round.
    list: BTreeMap<Timestamp<C>, u32>,
    outbox: VecDeque<(C, Reply<C>)>,
}

impl<C: Clone + Ord> Replica<C> {
    /// A server with empty memory; `delayed` enables the delayed reply list.
    pub fn new(config: &Config, delayed: bool) -> Self {
        Replica {
            delta: config.lease(),
            delayed,
            max_delayed: config.max_queue(),
            holder: None,
            list: BTreeMap::new(),
            outbox: VecDeque::new(),
        }
    }

    /// Current holder and round.
    pub fn holder(&self) -> Option<(&Timestamp<C>, u32)> {
        self.holder.as_ref().map(|(ts, round, _)| (ts, *round))
    }

    /// Requesters in the delayed reply list, lowest id first.
    pub fn delayed(&self) -> Vec<Timestamp<C>> {
        self.list.keys().cloned().collect()
    }

    /// Handles a message from the authenticated sender `from`.
    pub fn handle(&mut self, now: Time, from: &C, msg: ToReplica<C>) -> Result<(), ReplicaError> {
        if &msg.ts().client != from {
            return Err(ReplicaError::ForeignAcquisition);
        }
        self.handle_timeout(now);
        match msg {
            ToReplica::Try { ts, round } => {
                match &self.holder {
                    None => {
                        self.holder = Some((ts.clone(), round, now + self.delta));
                        self.reply(ts, round, true);
                    }
                    Some((h, r, _)) if *h == ts && *r == round => self.reply(ts, round, true),
                    Some(_) if self.delayed && (self.list.contains_key(&ts) || self.list.len() < self.max_delayed) => {
                        let r = self.list.entry(ts).or_insert(round);
                        *r = (*r).max(round);
                    }
                    Some(_) => self.reply(ts, round, false),
                }
                Ok(())
            }
            ToReplica::Release { ts, round } => {
                if self.holder.as_ref().is_some_and(|(h, r, _)| *h == ts && *r == round) {
                    self.holder = None;
                    self.serve_list(now);
                    Ok(())
                } else if self.list.get(&ts) == Some(&round) {
                    self.list.remove(&ts);
                    Ok(())
                } else {
                    Err(ReplicaError::NotHolder)
                }
            }
        }
    }

    fn reply(&mut self, ts: Timestamp<C>, round: u32, free: bool) {
        self.outbox.push_back((ts.client.clone(), Reply { ts, round, free }));
    }

    /// §4: free again: *free* to the lowest id in the list, *locked* to the others.
    fn serve_list(&mut self, now: Time) {
        let mut list = std::mem::take(&mut self.list).into_iter();
        if let Some((ts, round)) = list.next() {
            self.holder = Some((ts.clone(), round, now + self.delta));
            self.reply(ts, round, true);
        }
        for (ts, round) in list {
            self.reply(ts, round, false);
        }
    }

    /// End of the exclusion period Δ. Spurious calls are harmless.
    pub fn handle_timeout(&mut self, now: Time) {
        if self.holder.as_ref().is_some_and(|(_, _, until)| *until <= now) {
            self.holder = None;
            self.serve_list(now);
        }
    }

    /// When the holder's Δ runs out.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.holder.as_ref().map(|(_, _, until)| *until)
    }

    /// Next reply to send.
    pub fn poll_transmit(&mut self) -> Option<(C, Reply<C>)> {
        self.outbox.pop_front()
    }
}

/// One `contend` operation: tries with exponential backoff in between.
#[derive(Clone, Debug)]
pub struct Client<C> {
    config: Config,
    ts: Timestamp<C>,
    phase: Phase,
    /// This try's answers (*free* counts as a grant); the backoff between tries. With
    /// delayed reply lists, a failed or abandoned try is withdrawn where unanswered.
    rounds: Rounds,
    /// Round timeout while trying; next try while backing off; end of Δ while holding.
    timer: Option<Time>,
    valid_until: Time,
    outbox: VecDeque<(usize, ToReplica<C>)>,
    events: VecDeque<Event>,
    /// Failed tries so far (the `retry` of §3).
    pub retries: u32,
}

impl<C: Clone + Ord> Client<C> {
    /// Starts `contend`: round 1, `try` to all n. `delayed`: the replicas keep delayed
    /// reply lists (a failed or abandoned try is then withdrawn where unanswered).
    pub fn new(config: Config, backoff: Backoff, delayed: bool, ts: Timestamp<C>, now: Time) -> Self {
        let rounds = Rounds::new(config.n(), config.m(), backoff, delayed, now);
        let mut c = Client {
            config,
            ts,
            phase: Phase::Waiting,
            rounds,
            timer: None,
            valid_until: now,
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            retries: 0,
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
    /// Whether the client is waiting out a backoff delay.
    pub fn backing_off(&self) -> bool {
        self.rounds.backing_off()
    }
    /// End of the exclusion period as the client conservatively sees it.
    pub fn valid_until(&self) -> Time {
        self.valid_until
    }
    /// Replicas that answered *free* in the current round.
    pub fn granted(&self) -> Vec<usize> {
        self.rounds.granted().collect()
    }

    fn start_round(&mut self, now: Time) {
        let try_ = |round| ToReplica::Try { ts: self.ts.clone(), round };
        self.timer = Some(self.rounds.start(now, self.config.request_timeout(), &mut self.outbox, try_));
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
        if reply.round > round {
            return Err(ClientError::Stale);
        }
        let current = reply.round == round && self.phase == Phase::Waiting && !self.rounds.backing_off();
        if !current {
            // A grant of an abandoned round, or after the CS: given back at once. A
            // duplicate grant of the winning round is already ours.
            let ours = reply.round == round && self.rounds.answer(from) == Some(true);
            if reply.free && !(ours && self.phase == Phase::Holding) && !(ours && self.phase == Phase::Lost) {
                self.outbox.push_back((from, ToReplica::Release { ts: self.ts.clone(), round: reply.round }));
            }
            return Ok(());
        }
        match self.rounds.record(from, reply.free) {
            Tally::Won => {
                self.valid_until = self.rounds.sent_at() + self.config.lease();
                if self.valid_until <= now {
                    self.lose_round(now, rng);
                    return Ok(());
                }
                self.phase = Phase::Holding;
                self.timer = Some(self.valid_until);
                let votes = self.rounds.grants();
                self.events.push_back(Event::Acquired { token: 0, votes, valid_until: self.valid_until });
            }
            Tally::Lost => self.lose_round(now, rng),
            Tally::Open => {}
        }
        Ok(())
    }

    /// §3: some answer was *locked*: give back the grants (and withdraw the try where it
    /// is still unanswered), back off for `rand[0, base · 2^retry)`.
    fn lose_round<R: Rng + ?Sized>(&mut self, now: Time, rng: &mut R) {
        self.retries += 1;
        let release = |round| ToReplica::Release { ts: self.ts.clone(), round };
        self.timer = Some(self.rounds.lose(now, self.retries, &mut self.outbox, release, rng));
    }

    /// Round timeout (silent replicas count as *locked*), end of backoff, end of Δ.
    pub fn handle_timeout<R: Rng + ?Sized>(&mut self, now: Time, rng: &mut R) {
        if self.timer.is_none_or(|t| t > now) {
            return;
        }
        match self.phase {
            Phase::Waiting if self.rounds.backing_off() => self.start_round(now),
            Phase::Waiting => self.lose_round(now, rng),
            Phase::Holding => {
                self.phase = Phase::Lost;
                self.timer = None;
                self.events.push_back(Event::Lost(LostReason::LeaseExpired));
            }
            Phase::Lost | Phase::Released => self.timer = None,
        }
    }

    /// Next timer.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.timer
    }

    /// Leaves the CS (or abandons `contend`): RELEASE to every replica that may hold a
    /// grant or a delayed entry of the current round. Idempotent.
    pub fn release(&mut self, _now: Time) {
        if self.phase == Phase::Released {
            return;
        }
        let backing_off = self.rounds.backing_off() && self.phase == Phase::Waiting;
        self.phase = Phase::Released;
        self.timer = None;
        if backing_off {
            return;
        }
        self.rounds.release(&mut self.outbox, |round| ToReplica::Release { ts: self.ts.clone(), round });
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
