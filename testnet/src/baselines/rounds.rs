//! The round bookkeeping of the retrying majority clients, the [`strawman`] and
//! [`cmr`]: a round asks every replica at once, counts the answers, and is won with m
//! grants or lost once m is out of reach; a lost round gives its grants back and waits
//! out a [`Backoff`] delay before the next.
//!
//! [`Rounds`] holds the state of the current round and does these mechanics; the clients
//! keep their phases, timers and failure counters, build the messages (passed in as
//! closures of the round number) and decide what a late, stale or repeated answer means.
//!
//! [`strawman`]: super::strawman
//! [`cmr`]: super::cmr

use std::collections::VecDeque;
use std::time::Duration;

use rand::Rng;

use super::backoff::Backoff;
use sigma_behaviour::proto::Time;

/// Where a round stands after an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tally {
    /// m grants or more.
    Won,
    /// m is out of reach, even if every unanswered replica granted.
    Lost,
    /// Neither yet.
    Open,
}

/// One acquisition's rounds against n replicas, m of them needed.
#[derive(Clone, Debug)]
pub(crate) struct Rounds {
    m: usize,
    backoff: Backoff,
    /// A lost or given-up round is also withdrawn where unanswered (CMR's delayed reply
    /// lists keep unanswered tries).
    withdraw: bool,
    /// The current round, 1-based (0 before the first).
    round: u32,
    /// Per replica, this round: `None` unanswered, `Some(granted)`.
    answers: Vec<Option<bool>>,
    grants: usize,
    /// Waiting out the backoff delay after a lost round.
    backing_off: bool,
    /// When the current round's requests (or the last renewals) went out.
    sent_at: Time,
}

impl Rounds {
    /// Before round 1; `withdraw`: see the field.
    pub(crate) fn new(n: usize, m: usize, backoff: Backoff, withdraw: bool, now: Time) -> Self {
        Rounds { m, backoff, withdraw, round: 0, answers: vec![None; n], grants: 0, backing_off: false, sent_at: now }
    }

    /// Number of replicas.
    pub(crate) fn n(&self) -> usize {
        self.answers.len()
    }
    /// Current round (1-based).
    pub(crate) fn round(&self) -> u32 {
        self.round
    }
    /// Replica `i`'s answer this round.
    pub(crate) fn answer(&self, i: usize) -> Option<bool> {
        self.answers[i]
    }
    /// Grants counted this round.
    pub(crate) fn grants(&self) -> usize {
        self.grants
    }
    /// Whether the last round was lost and the next has not started.
    pub(crate) fn backing_off(&self) -> bool {
        self.backing_off
    }
    /// Send time of the current round's requests (see [`Rounds::restamp`]).
    pub(crate) fn sent_at(&self) -> Time {
        self.sent_at
    }
    /// Records `now` as the send time of requests sent again in this round.
    pub(crate) fn restamp(&mut self, now: Time) {
        self.sent_at = now;
    }

    /// Replicas that granted in the current round, in increasing order.
    pub(crate) fn granted(&self) -> impl Iterator<Item = usize> + '_ {
        self.answers.iter().enumerate().filter(|(_, a)| **a == Some(true)).map(|(i, _)| i)
    }

    /// Starts the next round at `now`: forgets the answers and queues `request(round)` to
    /// every replica, in order. Returns the round's deadline, `now + timeout`.
    pub(crate) fn start<M>(
        &mut self,
        now: Time,
        timeout: Duration,
        outbox: &mut VecDeque<(usize, M)>,
        request: impl Fn(u32) -> M,
    ) -> Time {
        self.round += 1;
        self.backing_off = false;
        self.grants = 0;
        self.answers.iter_mut().for_each(|a| *a = None);
        self.sent_at = now;
        for i in 0..self.answers.len() {
            outbox.push_back((i, request(self.round)));
        }
        now + timeout
    }

    /// Counts replica `from`'s answer to the current round (only its first: a repeat
    /// changes nothing) and tallies the round.
    pub(crate) fn record(&mut self, from: usize, granted: bool) -> Tally {
        if self.answers[from].is_none() {
            self.answers[from] = Some(granted);
            if granted {
                self.grants += 1;
            }
        }
        let answered = self.answers.iter().filter(|a| a.is_some()).count();
        if self.grants >= self.m {
            Tally::Won
        } else if self.grants + (self.answers.len() - answered) < self.m {
            Tally::Lost
        } else {
            Tally::Open
        }
    }

    /// Queues `release(round)` to every replica that may hold something of the current
    /// round, in order: those that granted and, if withdrawing, those that have not
    /// answered.
    pub(crate) fn release<M>(&self, outbox: &mut VecDeque<(usize, M)>, release: impl Fn(u32) -> M) {
        for (i, a) in self.answers.iter().enumerate() {
            if *a == Some(true) || (self.withdraw && a.is_none()) {
                outbox.push_back((i, release(self.round)));
            }
        }
    }

    /// Ends the current round as lost, the `failures`-th so far: [`Rounds::release`],
    /// then backs off. Returns when the next round is due (one draw from `rng`).
    pub(crate) fn lose<M, R: Rng + ?Sized>(
        &mut self,
        now: Time,
        failures: u32,
        outbox: &mut VecDeque<(usize, M)>,
        release: impl Fn(u32) -> M,
        rng: &mut R,
    ) -> Time {
        self.release(outbox, release);
        self.backing_off = true;
        now + self.backoff.delay(failures, rng)
    }
}
