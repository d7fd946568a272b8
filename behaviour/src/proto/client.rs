//! One acquisition by a Sigma client (paper Fig. 5, §4).
//!
//! ```text
//!  new() ─▶ Waiting ──(≥ m votes: case 1)──▶ Holding ──release()──▶ Released
//!            │   ▲                              │
//!            │   │ case 3, gated: YIELD every   │ votes < m, or the
//!            └───┘ held vote, forget it         ▼ lease deadline passes
//!                                              Lost ──release()──▶ Released
//! ```
//!
//! The client keeps `resp[i]` (here [`View`]) per replica: the owner named by the newest
//! RESPONSE from replica i. A RESPONSE naming a different owner *replaces* the entry
//! (never adds to it); responses older than the one applied (lower grant stamp) are
//! discarded, since the network does not keep order.
//!
//! Decisions where Fig. 5 is silent (see ARCHITECTURE.md):
//! - "enough responses": the outcome is evaluated on every response. Case 1 is taken at
//!   once. Case 3 (`j_same + n − j < m`) is *gated*: right after a handoff the table
//!   still shows votes for the previous owner, and yielding on that stale view is the
//!   spurious-yield trap. The client yields only when case 3 has held with no progress
//!   (no new vote for itself) for one smoothed round trip.
//! - responses arriving after the win are applied (they may add votes); the win is undone
//!   as soon as fewer than m votes remain ([`Event::Lost`]): the safety argument (two
//!   quorums share 2m − n replicas, each of which must reset to vote twice) needs the
//!   holder to keep m votes, not merely more than n − m.
//! - informed backoff: a waiter re-sends its REQUEST to replica i when replica i's
//!   advice `T_w` runs out; a replica that never answered gets the REQUEST again after
//!   the request timeout; a vote held while waiting is renewed every renew interval.
//! - leases: the client's view of a vote's lease is conservative and needs no bound on
//!   transit times: the `sent` time of the REQUEST the replica echoes, plus how long
//!   after receiving it the replica started the lease (`grant_delay`), plus the lease,
//!   shortened by the clock-drift bound. A promotion notice that arrives late therefore
//!   counts for what is left of its lease, not for a fresh one. The lock is guaranteed
//!   exclusive while m votes are live ([`Client::valid_until`]).
//! - quorum diversity: the win needs the m live votes to come from at least D distinct
//!   voters (`Config::min_voters`), the peers hosting the replicas as the driver names
//!   them in [`Client::handle_response_from`]; a one-peer island of a larger swarm,
//!   hosting every replica it can see, cannot win alone.
//! - remote values (grant stamps, owner timestamps) further ahead of the client's clock
//!   than `max_clock_offset` are refused ([`ClientError::Ahead`]).

use std::collections::VecDeque;
use std::time::Duration;

use super::clock::{micros, Timestamp};
use super::config::{Config, Mutant};
use super::error::ClientError;
use super::message::{Response, ToReplica, RELAY_DEPTH};
use super::Time;

/// Phase of an acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Collecting votes.
    Waiting,
    /// Won: in the critical section.
    Holding,
    /// Was holding, exclusion no longer guaranteed; the application must stop and release.
    Lost,
    /// Released (or abandoned); nothing more will be sent.
    Released,
}

/// Why a held lock was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// Renewals were not acknowledged in time: too many leases may have lapsed.
    LeaseExpired,
    /// Replicas report other owners: fewer than m votes remain.
    VotesTaken,
}

/// Outputs for the application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Case 1 of Fig. 5: the client holds at least m votes.
    Acquired {
        /// Fencing token: the largest grant stamp among the votes held.
        token: u64,
        /// Votes held at the win.
        votes: usize,
        /// Exclusion is guaranteed until this time unless renewals extend it.
        valid_until: Time,
    },
    /// Exclusion is no longer guaranteed.
    Lost(LostReason),
}

/// Counters of one acquisition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// REQUEST messages sent, first round included.
    pub requests: u64,
    /// Of which re-sent on informed backoff or request timeout.
    pub retries: u64,
    /// Of which renewals of a held vote.
    pub renewals: u64,
    /// YIELD messages sent.
    pub yields: u64,
    /// Times case 3 fired (each sends one YIELD per held vote).
    pub yield_rounds: u64,
    /// RELEASE messages sent.
    pub releases: u64,
    /// Responses applied.
    pub responses: u64,
    /// Responses discarded as older than the state already known.
    pub stale: u64,
    /// Votes yielded on an INQUIRE ([`Recovery::Inquire`](crate::proto::Recovery::Inquire)).
    pub inquired: u64,
    /// Re-ask rounds: promoted somewhere, not won two round trips later
    /// ([`Recovery::Reask`](crate::proto::Recovery::Reask)); each re-sends the REQUEST to the replicas it lacks.
    pub reasks: u64,
    /// RELAY messages sent ([`Recovery::Relay`](crate::proto::Recovery::Relay)).
    pub relays: u64,
    /// REQUESTs re-sent on a replica's solicitation.
    pub solicited: u64,
}

/// What the client knows of one replica (`resp[i]` in Fig. 5).
#[derive(Clone, Debug)]
pub struct View<C> {
    /// Owner named by the newest response; `None` before any, or after a YIELD.
    pub owner: Option<Timestamp<C>>,
    /// Grant stamp of that owner; kept across a YIELD so older responses stay discarded.
    pub stamp: u64,
    /// Our place there (0 = owner).
    pub position: u32,
    /// Conservative end of our lease there, when we are the owner.
    pub vote_until: Option<Time>,
    /// When to contact this replica next (retry, renewal), if at all.
    pub next_contact: Option<Time>,
    /// Stamp of the grant this acquisition yielded here, until a newer response comes:
    /// a response still naming us under that grant was sent before the replica applied
    /// the YIELD (or the YIELD was lost), so it is no vote.
    pub yielded: Option<u64>,
    /// Who voted, as the driver named it (the peer hosting the replica); `None` counts
    /// as a voter of its own.
    pub voter: Option<C>,
    /// `sent` of the last REQUEST not yet answered: the first reply echoing it is a
    /// round-trip sample (one sample per request, as in Karn's algorithm; replies to a
    /// YIELD echo an older REQUEST and must not count).
    pub rtt_probe: Option<u64>,
    /// While we own this replica: the first waiters of its queue, as it last said
    /// ([`Recovery::Relay`](crate::proto::Recovery::Relay)).
    pub next: Vec<Timestamp<C>>,
    /// The successors last relayed to this replica (each relayed once).
    pub relayed: Vec<Timestamp<C>>,
}

/// One acquisition: a sans-IO state machine. Feed it responses and timeouts, drain
/// `poll_transmit` and `poll_event`.
#[derive(Clone, Debug)]
pub struct Client<C> {
    config: Config,
    ts: Timestamp<C>,
    phase: Phase,
    views: Vec<View<C>>,
    /// Number of views naming this acquisition as owner.
    votes: usize,
    /// Fencing token fixed at the win.
    token: u64,
    /// Smoothed round-trip time (replies only, not promotions): gates YIELD.
    srtt: Duration,
    /// Case 3 observed and not yet acted on: yield at this time unless progress.
    yield_at: Option<Time>,
    /// Promoted somewhere while waiting: re-ask the replicas whose vote is lacking at
    /// this time unless won by then ([`Recovery`]).
    reask_at: Option<Time>,
    outbox: VecDeque<(usize, ToReplica<C>)>,
    events: VecDeque<Event>,
    stats: ClientStats,
}

impl<C: Clone + Ord> Client<C> {
    /// Starts an acquisition under timestamp `ts` (Fig. 5 `Request`): REQUEST to all n.
    ///
    /// `config` should have passed [`Config::validate`]; an invalid quorum makes the
    /// acquisition unwinnable, never a panic.
    pub fn new(config: Config, ts: Timestamp<C>, now: Time) -> Self {
        let n = config.n;
        let mut client = Client {
            srtt: config.initial_rtt,
            config,
            ts,
            phase: Phase::Waiting,
            views: vec![
                View {
                    owner: None,
                    stamp: 0,
                    position: 0,
                    vote_until: None,
                    next_contact: None,
                    yielded: None,
                    voter: None,
                    rtt_probe: None,
                    next: Vec::new(),
                    relayed: Vec::new(),
                };
                n
            ],
            votes: 0,
            token: 0,
            yield_at: None,
            reask_at: None,
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            stats: ClientStats::default(),
        };
        for i in 0..n {
            client.send_request(now, i);
        }
        client
    }

    /// The acquisition's timestamp (its identity).
    pub fn ts(&self) -> &Timestamp<C> {
        &self.ts
    }
    /// Current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }
    /// Votes currently held according to the newest responses.
    pub fn votes(&self) -> usize {
        self.votes
    }
    /// Fencing token (0 before the win).
    pub fn token(&self) -> u64 {
        self.token
    }
    /// Per-replica view (`resp[]`).
    pub fn views(&self) -> &[View<C>] {
        &self.views
    }
    /// Place in line: the m-th best of this acquisition's positions at the replicas
    /// that answered (0 = owner, k = k-th waiter), i.e. the turn at which m replicas
    /// would be serving it; `None` until m replicas have answered.
    pub fn position(&self) -> Option<u32> {
        let mut known: Vec<u32> = self.views.iter().filter(|v| v.owner.is_some()).map(|v| v.position).collect();
        known.sort_unstable();
        known.get(self.config.m.checked_sub(1)?).copied()
    }
    /// Counters.
    pub fn stats(&self) -> &ClientStats {
        &self.stats
    }
    /// Smoothed round-trip estimate.
    pub fn srtt(&self) -> Duration {
        self.srtt
    }

    /// Until when exclusion is guaranteed: the time after which fewer than m of the held
    /// votes are live (the m-th latest vote lease). `None` when fewer than m votes are
    /// held.
    pub fn valid_until(&self) -> Option<Time> {
        let k = self.config.m.max(1);
        let mut leases: Vec<Time> = self.views.iter().filter_map(|v| v.vote_until.filter(|_| self.owns(v))).collect();
        if leases.len() < k {
            return None;
        }
        leases.sort_unstable_by(|a, b| b.cmp(a));
        if self.config.mutant == Some(Mutant::CountLapsedVote) {
            // The planted fault (test-only): m views count, lapsed or not.
            return Some(leases[0]);
        }
        Some(leases[k - 1])
    }

    /// Applies a RESPONSE from replica `from` (Fig. 5 `OnResponse`).
    ///
    /// On error nothing changed.
    pub fn handle_response(&mut self, now: Time, from: usize, r: Response<C>) -> Result<(), ClientError> {
        self.apply_response(now, from, None, r)
    }

    /// [`Client::handle_response`] with the voter named: the peer that hosts replica
    /// `from` and sent the response (quorum diversity counts distinct voters).
    pub fn handle_response_from(
        &mut self,
        now: Time,
        from: usize,
        voter: C,
        r: Response<C>,
    ) -> Result<(), ClientError> {
        self.apply_response(now, from, Some(voter), r)
    }

    fn apply_response(&mut self, now: Time, from: usize, voter: Option<C>, r: Response<C>) -> Result<(), ClientError> {
        let n = self.config.n;
        let view = self.views.get(from).ok_or(ClientError::ReplicaOutOfRange { index: from, n })?;
        if r.ts != self.ts {
            return Err(ClientError::WrongAcquisition);
        }
        let bound = micros(now).saturating_add(micros(self.config.max_clock_offset));
        if let Some(value) = [r.stamp, r.owner.counter].into_iter().find(|v| *v > bound) {
            return Err(ClientError::Ahead { value });
        }
        if r.solicit {
            // Not about our place there (its owner and stamp are not read): the replica
            // asks for our REQUEST.
            if self.phase == Phase::Waiting && !self.owns(&self.views[from]) && self.config.recovery.relays() {
                self.stats.solicited += 1;
                self.stats.retries += 1;
                self.send_request(now, from);
            }
            return Ok(());
        }
        if r.stamp < view.stamp || (r.owner == self.ts && view.yielded.is_some_and(|s| r.stamp <= s)) {
            self.stats.stale += 1;
            return Err(ClientError::Stale);
        }
        if self.phase == Phase::Released {
            return Ok(());
        }
        self.stats.responses += 1;
        let echo = Duration::from_micros(r.echo);
        if !r.promoted && self.views[from].rtt_probe == Some(r.echo) && echo <= now {
            self.views[from].rtt_probe = None;
            self.srtt = (self.srtt * 7 + (now - echo)) / 8;
        }
        let was_ours = self.owns(&self.views[from]);
        let ours = r.owner == self.ts;
        let (inquire, promoted) = (r.inquire, r.promoted);
        let me = self.ts.clone();
        let next: Vec<Timestamp<C>> = if ours {
            r.next.iter().take(RELAY_DEPTH).filter(|t| **t > me && t.counter <= bound).cloned().collect()
        } else {
            Vec::new()
        };
        let lease = r.lease.min(self.config.lease);
        let holding = matches!(self.phase, Phase::Holding | Phase::Lost);
        let view = &mut self.views[from];
        view.owner = Some(r.owner);
        view.stamp = r.stamp;
        view.position = r.position;
        view.yielded = None;
        view.voter = voter;
        view.next = next;
        if ours {
            // The replica received the echoed REQUEST after we sent it, and started the
            // lease `grant_delay` after that, by its clock: shortened by the drift bound.
            let held = r.grant_delay.saturating_add(lease);
            let drift = held.mul_f64(f64::from(self.config.max_drift_ppm) / 1e6);
            // Started before this response left the replica: it ends by `now + lease`.
            let until = echo.saturating_add(held.saturating_sub(drift)).min(now + lease);
            view.vote_until = Some(view.vote_until.filter(|_| was_ours).map_or(until, |u| u.max(until)));
            view.next_contact = match self.phase {
                Phase::Holding => Some(until.saturating_sub(lease.saturating_sub(self.config.renew_interval)).max(now)),
                Phase::Waiting => Some(now + self.config.renew_interval),
                Phase::Lost | Phase::Released => None,
            };
        } else {
            view.vote_until = None;
            let (lo, hi) = (self.config.min_advice, self.config.max_advice);
            let wait = r.advice.clamp(lo, hi);
            let wait = wait + wait * self.config.retry_slack_percent / 100 + self.srtt * 2;
            view.next_contact = (!holding).then(|| now + wait);
        }
        match (was_ours, ours) {
            (false, true) => self.votes += 1,
            (true, false) => self.votes -= 1,
            _ => {}
        }
        self.evaluate(now, !was_ours && ours);
        if ours && self.phase == Phase::Waiting {
            self.recover(now, from, inquire, promoted);
        }
        if ours {
            self.relay(now);
        }
        Ok(())
    }

    /// Reset recovery ([`Recovery`]), on a response naming this waiting acquisition as
    /// the owner of replica `from`.
    fn recover(&mut self, now: Time, from: usize, inquire: bool, promoted: bool) {
        let recovery = self.config.recovery;
        if inquire && recovery.inquires() && self.owns(&self.views[from]) {
            // An older acquisition waits there: it gets the vote (we have not won).
            self.stats.inquired += 1;
            self.yield_vote(now, from);
        } else if promoted && recovery.reasks() && self.reask_at.is_none() {
            // The line has come to us. Without resets every other replica promotes us
            // within about one round trip of this one, and we win before the timer.
            self.reask_at = Some(now + self.srtt * 2);
        }
    }

    /// The quorum diversity D this client wins with (see [`Config::min_voters`]).
    pub fn min_voters(&self) -> usize {
        self.config.min_voters
    }

    /// Whether this waiting client holds m live votes from fewer than D distinct voters:
    /// only diversity stands between it and the win.
    pub fn short_of_voters(&self, now: Time) -> bool {
        self.phase == Phase::Waiting
            && self.live_votes(now) >= self.config.m
            && self.live_voters(now) < self.config.min_voters
    }

    /// Lowers D while waiting, to no less than 1 (the driver found that the lock's keys
    /// have come to fall on fewer distinct hosts than D, e.g. after members departed);
    /// wins at once if the votes held now suffice. Ignored unless lower.
    pub fn lower_min_voters(&mut self, now: Time, d: usize) {
        if self.phase == Phase::Waiting && d >= 1 && d < self.config.min_voters {
            self.config.min_voters = d;
            self.evaluate(now, false);
        }
    }

    /// Timers: informed-backoff retries, retransmissions, renewals, the gated YIELD,
    /// the lease deadline. Spurious calls are harmless.
    pub fn handle_timeout(&mut self, now: Time) {
        if self.phase == Phase::Released {
            return;
        }
        for i in 0..self.views.len() {
            if self.views[i].next_contact.is_none_or(|t| t > now) {
                continue;
            }
            match (self.owns(&self.views[i]), self.phase) {
                // A vote held while still waiting, with an earlier acquisition in
                // sight (owning another replica), is renewed by YIELD: the replica
                // re-decides by timestamp, so a vote grabbed by a late client right
                // after a replica reset goes back to the earliest waiter. With none in
                // sight it is renewed like a holder's: a yielded vote is away for a
                // round trip, and at round trips near the renewal interval the votes
                // of a lone waiter were seldom all in hand at once.
                (true, Phase::Waiting) if self.earlier_in_sight() => self.yield_vote(now, i),
                (true, Phase::Waiting) => {
                    self.stats.renewals += 1;
                    self.send_request(now, i);
                }
                (true, _) => {
                    self.stats.renewals += 1;
                    self.send_request(now, i);
                }
                (false, _) => {
                    if let Some(stamp) = self.views[i].yielded {
                        // Neither the YIELD nor its answer arrived: send it again (a
                        // replica applies it to that grant only, so a copy is harmless).
                        self.outbox.push_back((i, ToReplica::Yield { ts: self.ts.clone(), stamp }));
                        self.stats.yields += 1;
                    }
                    self.stats.retries += 1;
                    self.send_request(now, i);
                }
            }
        }
        if self.phase == Phase::Waiting && self.reask_at.is_some_and(|t| t <= now) {
            self.reask_at = None;
            self.reask(now);
        }
        if self.phase == Phase::Waiting && self.yield_at.is_some_and(|t| t <= now) {
            self.yield_at = None;
            if self.nobody_can_win() {
                self.yield_votes(now);
            }
        }
        if self.phase == Phase::Holding && self.valid_until().is_none_or(|t| t <= now) {
            self.lose(LostReason::LeaseExpired);
        }
    }

    /// The next time [`Client::handle_timeout`] has work to do.
    pub fn poll_timeout(&self) -> Option<Time> {
        if self.phase == Phase::Released {
            return None;
        }
        let contacts = self.views.iter().filter_map(|v| v.next_contact);
        let deadline = (self.phase == Phase::Holding).then(|| self.valid_until()).flatten();
        let reask = self.reask_at.filter(|_| self.phase == Phase::Waiting);
        contacts.chain(self.yield_at).chain(reask).chain(deadline).min()
    }

    /// Fig. 5 `Release`: RELEASE to every replica (owner or waiter there, or neither:
    /// a replica that never heard of us tombstones the acquisition). Also abandons a
    /// wait. Idempotent.
    pub fn release(&mut self, now: Time) {
        if self.phase == Phase::Released {
            return;
        }
        // The line behind us rides on the RELEASE to every replica: one that lost it in a
        // reset asks for the REQUESTs it lacks before they are needed. (A lost lock too:
        // a reset that took its votes is what the line needs repaired.)
        let next = self.successors(now);
        self.phase = Phase::Released;
        self.yield_at = None;
        self.reask_at = None;
        for i in 0..self.views.len() {
            self.views[i].next_contact = None;
            self.outbox
                .push_back((i, ToReplica::Release { ts: self.ts.clone(), token: self.token, next: next.clone() }));
            self.stats.releases += 1;
        }
    }

    /// Next message to send, with the replica index it is for.
    pub fn poll_transmit(&mut self) -> Option<(usize, ToReplica<C>)> {
        self.outbox.pop_front()
    }

    /// Next event for the application.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn owns(&self, v: &View<C>) -> bool {
        v.owner.as_ref() == Some(&self.ts)
    }

    fn send_request(&mut self, now: Time, i: usize) {
        let floor = if self.phase == Phase::Waiting { self.views[i].stamp } else { self.token };
        self.views[i].next_contact = Some(now + self.config.request_timeout);
        self.views[i].rtt_probe = Some(micros(now));
        self.outbox.push_back((i, ToReplica::Request { ts: self.ts.clone(), sent: micros(now), floor }));
        self.stats.requests += 1;
    }

    /// `ComputeWinner` and the three outcomes of Fig. 5.
    fn evaluate(&mut self, now: Time, progress: bool) {
        match self.phase {
            Phase::Waiting
                if self.live_votes(now) >= self.config.m && self.live_voters(now) >= self.config.min_voters =>
            {
                self.win(now)
            }
            // Case 3, gated: act only after one round trip without progress.
            Phase::Waiting if self.nobody_can_win() && (progress || self.yield_at.is_none()) => {
                self.yield_at = Some(now + self.srtt);
            }
            Phase::Waiting if self.nobody_can_win() => {}
            Phase::Waiting => self.yield_at = None, // case 2: wait to be notified
            Phase::Holding if self.votes < self.config.m => self.lose(LostReason::VotesTaken),
            _ => {}
        }
    }

    /// Votes whose lease has not lapsed by the client's own (conservative) account:
    /// only those win, since a replica may have handed a lapsed vote to someone else.
    fn live_votes(&self, now: Time) -> usize {
        self.views.iter().filter(|v| self.owns(v) && v.vote_until.is_some_and(|t| t > now)).count()
    }

    /// Distinct voters among the live votes (an unnamed voter counts as its own).
    fn live_voters(&self, now: Time) -> usize {
        let live = self.views.iter().filter(|v| self.owns(v) && v.vote_until.is_some_and(|t| t > now));
        let mut named: Vec<&C> = Vec::new();
        let mut unnamed = 0;
        for v in live {
            match &v.voter {
                Some(c) => named.push(c),
                None => unnamed += 1,
            }
        }
        named.sort_unstable();
        named.dedup();
        named.len() + unnamed
    }

    /// `j_same + n − j < m`: with j responses and at most j_same of them naming one
    /// owner, no client can reach m votes.
    fn nobody_can_win(&self) -> bool {
        let mut owners: Vec<&Timestamp<C>> = self.views.iter().filter_map(|v| v.owner.as_ref()).collect();
        let j = owners.len();
        owners.sort_unstable();
        let mut j_same = 0;
        let mut run = 0;
        for (k, o) in owners.iter().enumerate() {
            run = if k > 0 && owners[k - 1] == *o { run + 1 } else { 1 };
            j_same = j_same.max(run);
        }
        j_same + self.config.n - j < self.config.m
    }

    fn win(&mut self, now: Time) {
        self.phase = Phase::Holding;
        self.yield_at = None;
        self.reask_at = None;
        let mut token = 0;
        for i in 0..self.views.len() {
            let lease = self.config.lease;
            let renew = self.config.renew_interval;
            let ours = self.owns(&self.views[i]);
            let v = &mut self.views[i];
            if ours {
                token = token.max(v.stamp);
                let until = v.vote_until.unwrap_or(now);
                v.next_contact = Some(until.saturating_sub(lease.saturating_sub(renew)).max(now));
            } else {
                v.next_contact = None;
            }
        }
        self.token = token;
        let valid_until = self.valid_until().unwrap_or(now);
        self.events.push_back(Event::Acquired { token, votes: self.votes, valid_until });
    }

    /// Case 3: YIELD every held vote and forget those responses.
    fn yield_votes(&mut self, now: Time) {
        if self.votes > 0 {
            self.stats.yield_rounds += 1;
        }
        for i in 0..self.views.len() {
            if self.owns(&self.views[i]) {
                self.yield_vote(now, i);
            }
        }
    }

    /// RELAY ([`Recovery::Relay`](crate::proto::Recovery::Relay)): the earliest waiters that come after us at the
    /// replicas we own (and have waited longer than the request timeout: their
    /// REQUESTs reached every replica that did not lose them) are named to each owned
    /// replica whose queue lacks them, once.
    fn relay(&mut self, now: Time) {
        if !matches!(self.phase, Phase::Waiting | Phase::Holding) {
            return;
        }
        let successors = self.successors(now);
        if successors.is_empty() {
            return;
        }
        for i in 0..self.views.len() {
            let v = &self.views[i];
            if !self.owns(v) || successors.iter().all(|s| v.next.contains(s)) || v.relayed == successors {
                continue;
            }
            self.views[i].relayed = successors.clone();
            self.outbox.push_back((i, ToReplica::Relay { ts: self.ts.clone(), next: successors.clone() }));
            self.stats.relays += 1;
        }
    }

    /// The earliest waiters after us at the replicas we own that have waited longer than
    /// the request timeout (at most [`RELAY_DEPTH`]; none without
    /// [`Recovery::Relay`](crate::proto::Recovery::Relay)).
    fn successors(&self, now: Time) -> Vec<Timestamp<C>> {
        if !self.config.recovery.relays() {
            return Vec::new();
        }
        let old = micros(now).saturating_sub(micros(self.config.request_timeout));
        let mut successors: Vec<Timestamp<C>> = Vec::new();
        for v in self.views.iter().filter(|v| self.owns(v)) {
            successors.extend(v.next.iter().filter(|t| t.counter <= old).cloned());
        }
        successors.sort_unstable();
        successors.dedup();
        successors.truncate(RELAY_DEPTH);
        successors
    }

    /// Re-sends the REQUEST to every replica whose vote this waiter lacks (and has not
    /// just yielded): a replica that lost it in a reset queues it again by timestamp.
    fn reask(&mut self, now: Time) {
        self.stats.reasks += 1;
        for i in 0..self.views.len() {
            if !self.owns(&self.views[i]) && self.views[i].yielded.is_none() {
                self.stats.retries += 1;
                self.send_request(now, i);
            }
        }
    }

    /// Whether some replica's vote is owned by an acquisition earlier than this one.
    fn earlier_in_sight(&self) -> bool {
        self.views.iter().any(|v| v.owner.as_ref().is_some_and(|o| *o < self.ts))
    }

    /// YIELD the vote of replica `i` and forget its response (`Clear(resp[i])`).
    fn yield_vote(&mut self, now: Time, i: usize) {
        let v = &mut self.views[i];
        v.owner = None;
        v.vote_until = None;
        v.next_contact = Some(now + self.config.request_timeout);
        v.yielded = Some(v.stamp);
        self.votes -= 1;
        self.outbox.push_back((i, ToReplica::Yield { ts: self.ts.clone(), stamp: v.stamp }));
        self.stats.yields += 1;
    }

    fn lose(&mut self, reason: LostReason) {
        self.phase = Phase::Lost;
        for v in &mut self.views {
            v.next_contact = None;
        }
        self.events.push_back(Event::Lost(reason));
    }
}
