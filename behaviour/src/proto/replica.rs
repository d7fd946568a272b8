//! One logical replica of a resource (paper Fig. 6, §4).
//!
//! ```text
//!             REQUEST (free)                    RELEASE / lease expiry (queue empty)
//!   ┌──────┐ ───────────────▶ ┌───────────────┐ ──────────────────────────────────▶ ┌──────┐
//!   │ free │                  │ owned by C    │                                      │ free │
//!   └──────┘                  │ queue: Q (ts) │ ◀──┐ REQUEST (busy): insert by ts    └──────┘
//!                             └───────────────┘ ───┘ and answer "owner is C"
//!                                │        ▲
//!       RELEASE by C, lease      │        │  RespQueue: pop the earliest waiter,
//!       expiry, or YIELD by C    └────────┘  grant it, send it an unsolicited RESPONSE
//!       (YIELD re-inserts C under its original timestamp first)
//! ```
//!
//! Invariants (checked by the property tests): at most one owner; the queue is sorted
//! by timestamp and holds no acquisition twice nor the owner; a non-empty queue implies
//! an owner; the queue and the tombstones stay within their configured bounds.
//!
//! Beyond Fig. 6, from §4's failure handling:
//! - the owner holds the vote for a lease, renewed by its REQUESTs; on expiry the vote
//!   goes to the queue head (failure 3);
//! - every RESPONSE carries informed-backoff advice `T_w = T_cs · (P + 1/2)`, with
//!   `T_cs` the mean interval between consecutive releases while busy;
//! - a waiter not heard of for twice its advised wait plus a grace is dropped, so a dead
//!   waiter costs nothing; a live one re-sends its REQUEST at `T_w` and is queued again
//!   under its original timestamp, in its original place;
//! - a released acquisition leaves a tombstone, so a REQUEST overtaken by its own
//!   RELEASE (no FIFO between peers) does not resurrect it;
//! - [`Replica::new`] after a crash is the paper's "random reset": all memory gone.
//!
//! Beyond the paper, the takeover delay ([`Replica::hold_grants_until`]): a replica
//! started by a host that takes over a key whose previous host may have granted it
//! queues REQUESTs by timestamp but grants nothing until every vote the previous host
//! can have given has run out; then the earliest waiter gets the vote. A reset then
//! costs availability, not exclusion (ARCHITECTURE.md, "Split brain").

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use super::clock::{micros, Timestamp};
use super::config::{Config, Mutant};
use super::error::ReplicaError;
use super::message::{Response, ToReplica, RELAY_DEPTH};
use super::Time;

/// Counters a replica keeps about itself (metrics and the simulator's reports).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaStats {
    /// INQUIREs sent to an owner later than a waiter ([`Recovery::Inquire`](super::config::Recovery::Inquire)).
    pub inquiries: u64,
    /// REQUESTs solicited on a RELAY ([`Recovery::Relay`](super::config::Recovery::Relay)).
    pub solicits: u64,
    /// Votes granted (direct grants and promotions).
    pub grants: u64,
    /// RELEASEs applied (owner or waiter).
    pub releases: u64,
    /// YIELDs applied.
    pub yields: u64,
    /// Owner leases that ran out.
    pub lease_expiries: u64,
    /// Waiters dropped because their client went silent.
    pub waiter_expiries: u64,
    /// Messages rejected with an error.
    pub rejected: u64,
}

#[derive(Clone, Debug)]
struct Owner<C> {
    ts: Timestamp<C>,
    /// Grant stamp: `max(now µs, last stamp + 1, floors seen + 1)`.
    stamp: u64,
    /// The vote returns to the queue at this time unless renewed.
    lease_until: Time,
    /// When the vote was granted: start of a T_cs sample.
    granted_at: Time,
    /// `sent` of the client's last processed REQUEST (echoed in responses).
    echo: u64,
    /// When that REQUEST arrived: the client learns how long after it the current
    /// lease started (`Response::grant_delay`), so it can bound the lease without
    /// assuming anything about how long the response spends in flight.
    heard_at: Time,
    /// An INQUIRE was sent for this grant (once per grant: [`Recovery::Inquire`](super::config::Recovery::Inquire)).
    inquired: bool,
}

#[derive(Clone, Debug)]
struct Waiter<C> {
    ts: Timestamp<C>,
    /// Dropped at this time unless its client is heard of again.
    expires: Time,
    echo: u64,
    heard_at: Time,
}

/// Released acquisitions, in burial order (one TTL for all: also expiry order). Few, the
/// common case (an idle replica keeps one), are looked up in that order itself; past
/// [`TOMBSTONE_INDEX_FROM`] an ordered index is kept beside it. A `BTreeMap` alone would
/// cost an idle replica a whole node (~1.2 KB) for its one tombstone.
#[derive(Clone, Debug)]
struct Tombstones<C> {
    order: VecDeque<(Time, Timestamp<C>)>,
    index: Option<BTreeSet<Timestamp<C>>>,
}

/// Tombstones searched linearly up to this many; an index beyond (dropped again below
/// half of it).
const TOMBSTONE_INDEX_FROM: usize = 16;

/// Solicited acquisitions remembered (a RELAY names at most [`RELAY_DEPTH`]).
const SOLICITED_KEPT: usize = 8;

impl<C: Clone + Ord> Tombstones<C> {
    fn new() -> Self {
        Tombstones { order: VecDeque::new(), index: None }
    }

    fn len(&self) -> usize {
        self.order.len()
    }

    fn contains(&self, ts: &Timestamp<C>) -> bool {
        match &self.index {
            Some(index) => index.contains(ts),
            None => self.order.iter().any(|(_, t)| t == ts),
        }
    }

    /// Buries `ts` until `until`, unless it is buried already (its first burial stands).
    fn insert(&mut self, ts: Timestamp<C>, until: Time) {
        if self.contains(&ts) {
            return;
        }
        if let Some(index) = &mut self.index {
            index.insert(ts.clone());
        }
        self.order.push_back((until, ts));
        if self.index.is_none() && self.order.len() > TOMBSTONE_INDEX_FROM {
            self.index = Some(self.order.iter().map(|(_, t)| t.clone()).collect());
        }
    }

    /// Forgets the oldest.
    fn pop_front(&mut self) -> Option<(Time, Timestamp<C>)> {
        let (until, ts) = self.order.pop_front()?;
        if let Some(index) = &mut self.index {
            index.remove(&ts);
            if self.order.len() <= TOMBSTONE_INDEX_FROM / 2 {
                self.index = None;
            }
        }
        Some((until, ts))
    }

    fn first_until(&self) -> Option<Time> {
        self.order.front().map(|(until, _)| *until)
    }

    fn last_until(&self) -> Option<Time> {
        self.order.back().map(|(until, _)| *until)
    }

    /// Gives back memory when the burial order uses under a quarter of its allocation
    /// (keeping twice what it holds), and all but what it holds when that is one or two
    /// (an idle replica, the common case, keeps its one tombstone in a buffer of one). A
    /// hot lock's replica, compacted at every release, would otherwise reallocate and
    /// copy all its tombstones each time (grown by one burial, shrunk again): O(tombstones)
    /// per release instead of amortised O(1).
    fn shrink(&mut self) {
        let len = self.order.len();
        if len <= 2 {
            self.order.shrink_to_fit();
        } else if self.order.capacity() > 4 * len {
            self.order.shrink_to(2 * len);
        }
    }

    fn check(&self) -> Result<(), String> {
        if let Some(index) = &self.index {
            if index.len() != self.order.len() || self.order.iter().any(|(_, t)| !index.contains(t)) {
                return Err("tombstone index out of step with the burial order".into());
            }
        }
        Ok(())
    }
}

/// One logical replica: owner, queue, lease, informed backoff.
#[derive(Clone, Debug)]
pub struct Replica<C> {
    config: Config,
    owner: Option<Owner<C>>,
    /// Waiters sorted by timestamp (new arrivals land near the back, promotions pop
    /// the front: both cheap on a `VecDeque`).
    queue: VecDeque<Waiter<C>>,
    /// `(expires, ts)` of every waiter: the next waiter to drop in O(log n).
    expiries: BTreeSet<(Time, Timestamp<C>)>,
    /// Released acquisitions and when they may be forgotten.
    tombstones: Tombstones<C>,
    /// Last grant stamp issued or floor observed.
    last_stamp: u64,
    /// T_cs estimate (EWMA, 1/8) of the interval between consecutive releases.
    tcs: Duration,
    /// Time of the last RELEASE by an owner.
    last_release: Option<Time>,
    /// Takeover delay: no vote is granted before this time.
    hold_until: Option<Time>,
    /// Acquisitions solicited on a RELAY, the latest [`SOLICITED_KEPT`]: each is asked
    /// once.
    solicited: VecDeque<Timestamp<C>>,
    outbox: VecDeque<(C, Response<C>)>,
    stats: ReplicaStats,
}

impl<C: Clone + Ord> Replica<C> {
    /// A replica with empty memory: the state of a fresh peer, or of one after a reset.
    pub fn new(config: Config) -> Self {
        let tcs = config.initial_tcs;
        Replica {
            config,
            owner: None,
            queue: VecDeque::new(),
            expiries: BTreeSet::new(),
            tombstones: Tombstones::new(),
            last_stamp: 0,
            tcs,
            last_release: None,
            hold_until: None,
            solicited: VecDeque::new(),
            outbox: VecDeque::new(),
            stats: ReplicaStats::default(),
        }
    }

    /// The current owner and its grant stamp.
    pub fn owner(&self) -> Option<(&Timestamp<C>, u64)> {
        self.owner.as_ref().map(|o| (&o.ts, o.stamp))
    }

    /// Lease deadline of the current owner.
    pub fn lease_until(&self) -> Option<Time> {
        self.owner.as_ref().map(|o| o.lease_until)
    }

    /// Waiters in service order.
    pub fn queue(&self) -> impl Iterator<Item = &Timestamp<C>> {
        self.queue.iter().map(|w| &w.ts)
    }

    /// Number of waiters.
    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    /// Gives back the memory the replica's empty collections still hold (a `VecDeque`
    /// or a `BTreeSet` keeps its allocation when emptied): an idle replica is kept until
    /// its tombstones expire, and a stream of lock names keeps many (call it when the
    /// replica has just become idle, after draining `poll_transmit`). Changes nothing
    /// observable.
    pub fn compact(&mut self) {
        if self.queue.is_empty() {
            self.queue = VecDeque::new();
        }
        if self.outbox.is_empty() {
            self.outbox = VecDeque::new();
        }
        if self.expiries.is_empty() {
            self.expiries = BTreeSet::new();
        }
        self.tombstones.shrink();
    }

    /// Whether acquisition `ts` owns this replica or waits in its queue (O(log n)).
    pub fn has(&self, ts: &Timestamp<C>) -> bool {
        self.owner.as_ref().is_some_and(|o| o.ts == *ts) || self.position(ts).is_ok()
    }

    /// Number of tombstones held.
    pub fn tombstones(&self) -> usize {
        self.tombstones.len()
    }

    /// Current T_cs estimate.
    pub fn tcs(&self) -> Duration {
        self.tcs
    }

    /// Counters.
    pub fn stats(&self) -> &ReplicaStats {
        &self.stats
    }

    /// The takeover delay: until `until`, REQUESTs are queued by timestamp and nothing
    /// is granted (no RESPONSE names an owner, since there is none); at `until` the
    /// earliest live waiter is granted the vote and told so. Only ever extends.
    pub fn hold_grants_until(&mut self, until: Time) {
        if self.owner.is_none() {
            self.hold_until = Some(self.hold_until.map_or(until, |t| t.max(until)));
        }
    }

    /// The end of the takeover delay, while it lasts.
    pub fn holding_grants_until(&self) -> Option<Time> {
        self.hold_until
    }

    /// True when the replica holds no state worth keeping (no owner, no waiter).
    pub fn is_idle(&self) -> bool {
        self.owner.is_none() && self.queue.is_empty()
    }

    /// True when dropping this replica and starting a new one on the next message
    /// changes nothing exclusion depends on: no owner, no waiter, no takeover delay,
    /// `now` past the last grant stamp (a new replica's first stamp, `now` in µs, is then
    /// above every stamp this one issued), and its tombstones expired or the idle TTL
    /// ([`Config::idle_ttl`]) past since the last was buried. Dropping it is not a
    /// reset: a replica with no owner grants the next REQUEST at once either way. What
    /// the dropped tombstones would have stopped (a REQUEST overtaken by its own RELEASE
    /// by more than the idle TTL) is a grant to a finished acquisition, which its client
    /// hands back: a round trip of one vote, not a second holder.
    pub fn is_disposable(&self, now: Time) -> bool {
        self.disposable_at().is_some_and(|t| t <= now)
    }

    /// When this replica becomes disposable ([`Replica::is_disposable`]) if nothing
    /// arrives meanwhile; `None` while it has an owner, a waiter or a takeover delay.
    pub fn disposable_at(&self) -> Option<Time> {
        if !self.is_idle() || self.hold_until.is_some() {
            return None;
        }
        // Tombstones are kept in insertion order with one TTL: the last goes last, and it
        // was buried at its expiry less the TTL.
        let tombstones = self.tombstones.last_until().map_or(Duration::ZERO, |until| {
            until.min(until.saturating_sub(self.config.tombstone_ttl).saturating_add(self.config.idle_ttl))
        });
        let stamp = Duration::from_micros(self.last_stamp.saturating_add(1));
        if self.config.mutant == Some(Mutant::DisposalForgetsFloor) {
            // The planted fault (test-only): the floor is not waited out.
            return Some(tombstones);
        }
        Some(tombstones.max(stamp))
    }

    /// Handles a message from `from`, the authenticated sender.
    ///
    /// On error nothing changed and nothing is sent.
    pub fn handle(&mut self, now: Time, from: &C, msg: ToReplica<C>) -> Result<(), ReplicaError> {
        self.handle_heard(now, now, from, msg)
    }

    /// [`Replica::handle`] for a message that reached this host at `heard` (≤ `now`)
    /// and was held by the driver until `now` (e.g. while it checked that it hosts the
    /// key): a REQUEST's `Response::grant_delay` counts from `heard`, so the client's
    /// lease bound, which starts at its send time, does not lose the time held. Safe:
    /// the lease the client counts still ends before the one this replica runs.
    pub fn handle_heard(&mut self, now: Time, heard: Time, from: &C, msg: ToReplica<C>) -> Result<(), ReplicaError> {
        let heard = heard.min(now);
        self.forget_tombstones(now);
        let result = if &msg.ts().client != from {
            Err(ReplicaError::ForeignAcquisition)
        } else if let Some(value) = self.ahead(now, &msg) {
            Err(ReplicaError::Ahead { value })
        } else {
            match msg {
                ToReplica::Request { ts, sent, floor } => self.on_request(now, heard, ts, sent, floor),
                ToReplica::Release { ts, token, next } => self.on_release(now, ts, token, next),
                ToReplica::Yield { ts, stamp } => self.on_yield(now, ts, stamp),
                ToReplica::Relay { ts, next } => self.on_relay(ts, next),
            }
        };
        if result.is_err() {
            self.stats.rejected += 1;
        }
        result
    }

    /// The first value of `msg` further ahead of `now` than the configured clock offset
    /// (timestamps, floors and tokens are hybrid clock readings).
    fn ahead(&self, now: Time, msg: &ToReplica<C>) -> Option<u64> {
        let bound = micros(now).saturating_add(micros(self.config.max_clock_offset));
        let values = match msg {
            ToReplica::Request { ts, floor, .. } => [ts.counter, *floor],
            // The names a RELEASE carries are hints: one ahead is skipped, not the release.
            ToReplica::Release { ts, token, .. } => [ts.counter, *token],
            ToReplica::Yield { ts, .. } => [ts.counter, 0],
            ToReplica::Relay { ts, next } => {
                [ts.counter, next.iter().take(RELAY_DEPTH).map(|t| t.counter).max().unwrap_or(0)]
            }
        };
        values.into_iter().find(|v| *v > bound)
    }

    /// Fig. 6 `OnRequest`, plus renewal by the owner and refresh of a waiter.
    fn on_request(
        &mut self,
        now: Time,
        heard: Time,
        ts: Timestamp<C>,
        sent: u64,
        floor: u64,
    ) -> Result<(), ReplicaError> {
        if self.tombstones.contains(&ts) {
            return Err(ReplicaError::Finished);
        }
        // A takeover delay that ran out before its timer was handled: the earliest
        // waiter is served first, not this request.
        if self.hold_until.is_some_and(|t| t <= now) {
            self.hold_until = None;
            if self.owner.is_none() {
                self.promote(now);
            }
        }
        if let Some(owner) = self.owner.as_mut().filter(|o| o.ts == ts) {
            owner.lease_until = now + self.config.lease;
            owner.echo = sent;
            owner.heard_at = heard;
            // A holder's renewal carries its fencing token: the next grant goes above it
            // even if the holder never sends its RELEASE.
            self.last_stamp = self.last_stamp.max(floor);
        } else if self.config.mutant == Some(Mutant::GrantOverLiveVote) && self.hold_until.is_none() {
            // The planted fault (test-only): the vote goes to the requester at once,
            // whether or not the owner's lease still runs.
            if let Ok(i) = self.position(&ts) {
                self.remove_waiter(i);
            }
            if let Some(owner) = self.owner.take() {
                self.enqueue(now, owner.ts, owner.echo, owner.heard_at);
            }
            self.last_stamp = self.last_stamp.max(floor);
            self.grant(now, ts.clone(), sent, heard);
        } else if let Ok(i) = self.position(&ts) {
            self.last_stamp = self.last_stamp.max(floor);
            let expires = now + self.waiter_ttl(i);
            let w = &mut self.queue[i];
            self.expiries.remove(&(w.expires, ts.clone()));
            w.expires = expires;
            w.echo = sent;
            w.heard_at = heard;
            self.expiries.insert((expires, ts.clone()));
        } else if self.owner.is_none() && self.hold_until.is_none() {
            self.last_stamp = self.last_stamp.max(floor);
            self.grant(now, ts.clone(), sent, heard);
        } else {
            if self.queue.len() >= self.config.max_queue {
                return Err(ReplicaError::QueueFull(self.queue.len()));
            }
            self.last_stamp = self.last_stamp.max(floor);
            self.enqueue(now, ts.clone(), sent, heard);
        }
        let inquire = self.config.recovery.inquires() && self.owner.as_ref().is_some_and(|o| o.ts > ts && !o.inquired);
        self.respond(ts, false);
        if inquire {
            // Maekawa's INQUIRE: an older acquisition waits here behind a later owner
            // (this replica lost the line in a reset, or the older REQUEST came late).
            // The owner yields the vote if it has not won; the yield re-decides by
            // timestamp. Once per grant, so a line of older waiters costs one message.
            let owner = self.owner.as_mut().expect("checked above");
            owner.inquired = true;
            let to = owner.ts.clone();
            self.stats.inquiries += 1;
            self.respond_with(to, false, true);
        }
        Ok(())
    }

    /// Fig. 6 `OnRelease`, and the RELEASE's `next` ([`Recovery::Relay`](super::config::Recovery::Relay)): the waiters
    /// after the releaser elsewhere that this replica does not know are asked for their
    /// REQUESTs (before the vote moves on), whether or not it knew the releaser: a
    /// replica reset since the releaser's REQUEST is the one that needs them.
    fn on_release(
        &mut self,
        now: Time,
        ts: Timestamp<C>,
        token: u64,
        next: Vec<Timestamp<C>>,
    ) -> Result<(), ReplicaError> {
        let repeated = self.tombstones.contains(&ts) && !self.has(&ts);
        if !repeated && self.config.recovery.relays() {
            let bound = micros(now).saturating_add(micros(self.config.max_clock_offset));
            self.solicit(&ts, next.into_iter().filter(|t| t.counter <= bound).collect());
        }
        self.release(now, ts, token)
    }

    /// Fig. 6 `OnRelease` proper.
    fn release(&mut self, now: Time, ts: Timestamp<C>, token: u64) -> Result<(), ReplicaError> {
        // Whoever releases, the next grant goes above its fencing token: a holder whose
        // vote here lapsed (and went to someone else) still moves the stamps past it.
        self.last_stamp = self.last_stamp.max(token);
        if self.owner.as_ref().is_some_and(|o| o.ts == ts) {
            let owner = self.owner.take().expect("checked above");
            let since = self.last_release.map_or(owner.granted_at, |r| r.max(owner.granted_at));
            let sample = now.saturating_sub(since);
            self.tcs = (self.tcs * 7 + sample) / 8;
            self.last_release = Some(now);
            self.promote(now);
        } else if let Ok(i) = self.position(&ts) {
            self.remove_waiter(i);
        } else if self.tombstones.contains(&ts) {
            return Err(ReplicaError::Finished);
        } else {
            // Owner and queue stay as they are; the sender's own acquisition is
            // tombstoned so that its REQUEST, if this RELEASE overtook it, cannot
            // resurrect it (no FIFO between peers).
            self.bury(now, ts);
            return Err(ReplicaError::NotHolder);
        }
        self.stats.releases += 1;
        self.bury(now, ts);
        Ok(())
    }

    /// Fig. 6 `OnYield`: the owner goes back into the queue under its original
    /// timestamp and the earliest waiter gets the vote. A yielder that does not end up
    /// owner is told who is (the plain-text Fig. 6 places this `SendResponse` after
    /// the owner branch, evaluated on the new owner).
    ///
    /// Only the grant named by `stamp` is handed back. A YIELD of an earlier grant to the
    /// same acquisition (a duplicate, or one overtaken by the re-grant it caused) is not
    /// applied: the client may already count the newer grant, and taking it back would
    /// leave it counting a vote that is someone else's. It is answered with the
    /// current grant instead.
    fn on_yield(&mut self, now: Time, ts: Timestamp<C>, stamp: u64) -> Result<(), ReplicaError> {
        if self.owner.as_ref().is_some_and(|o| o.ts == ts && o.stamp == stamp) {
            let owner = self.owner.take().expect("checked above");
            self.enqueue(now, owner.ts, owner.echo, owner.heard_at);
            self.promote(now);
        } else if self.owner.as_ref().is_some_and(|o| o.ts == ts) {
            self.respond(ts, false);
            return Ok(());
        } else if self.position(&ts).is_err() {
            return Err(if self.tombstones.contains(&ts) { ReplicaError::Finished } else { ReplicaError::NotHolder });
        }
        self.stats.yields += 1;
        if self.owner.as_ref().is_some_and(|o| o.ts != ts) {
            self.respond(ts, false);
        }
        Ok(())
    }

    /// RELAY ([`Recovery::Relay`](super::config::Recovery::Relay)): `ts` (owner or waiter here, or just released) names
    /// the acquisitions that come after it elsewhere; each one later than `ts` that this
    /// replica does not know (not owner, waiting, or released) is asked for its REQUEST,
    /// once. Nothing else changes: a vote is only ever granted on a REQUEST.
    fn on_relay(&mut self, ts: Timestamp<C>, next: Vec<Timestamp<C>>) -> Result<(), ReplicaError> {
        if !self.has(&ts) && !self.tombstones.contains(&ts) {
            return Err(ReplicaError::NotHolder);
        }
        if !self.config.recovery.relays() {
            return Ok(());
        }
        self.solicit(&ts, next);
        Ok(())
    }

    /// Asks each acquisition of `next` later than `after` that this replica does not know
    /// (not owner, waiting, released, or asked already) for its REQUEST: a RESPONSE with
    /// `solicit`, naming the current owner (or, with none, the addressee itself under
    /// the last stamp issued: the client reads nothing but the flag).
    fn solicit(&mut self, after: &Timestamp<C>, next: Vec<Timestamp<C>>) {
        for t in next.into_iter().take(RELAY_DEPTH) {
            if t <= *after || self.has(&t) || self.tombstones.contains(&t) || self.solicited.contains(&t) {
                continue;
            }
            if self.solicited.len() >= SOLICITED_KEPT {
                self.solicited.pop_front();
            }
            self.solicited.push_back(t.clone());
            self.stats.solicits += 1;
            let (owner, stamp) = match self.owner.as_ref() {
                Some(o) => (o.ts.clone(), o.stamp),
                None => (t.clone(), self.last_stamp),
            };
            let response = Response {
                ts: t.clone(),
                owner,
                stamp,
                position: 0,
                advice: Duration::ZERO,
                lease: self.config.lease,
                echo: 0,
                grant_delay: Duration::ZERO,
                promoted: false,
                inquire: false,
                next: Vec::new(),
                solicit: true,
            };
            self.outbox.push_back((t.client, response));
        }
    }

    /// Lease expiry (§4 failure 3) and silent waiters. Spurious calls are harmless.
    pub fn handle_timeout(&mut self, now: Time) {
        self.forget_tombstones(now);
        if self.hold_until.is_some_and(|t| t <= now) {
            self.hold_until = None;
            if self.owner.is_none() {
                self.promote(now);
            }
        }
        while let Some((expires, ts)) = self.expiries.first().cloned() {
            if expires > now {
                break;
            }
            if let Ok(i) = self.position(&ts) {
                self.remove_waiter(i);
                self.stats.waiter_expiries += 1;
            } else {
                self.expiries.remove(&(expires, ts));
            }
        }
        if self.owner.as_ref().is_some_and(|o| o.lease_until <= now) {
            self.owner = None;
            self.stats.lease_expiries += 1;
            self.promote(now);
        }
    }

    /// The next time [`Replica::handle_timeout`] has work to do.
    pub fn poll_timeout(&self) -> Option<Time> {
        let lease = self.owner.as_ref().map(|o| o.lease_until);
        let waiter = self.expiries.first().map(|(t, _)| *t);
        [lease, waiter, self.hold_until].into_iter().flatten().min()
    }

    /// Next RESPONSE to send, with its addressee.
    pub fn poll_transmit(&mut self) -> Option<(C, Response<C>)> {
        self.outbox.pop_front()
    }

    /// Index of `ts` in the queue (`Ok`) or where it would be inserted (`Err`).
    fn position(&self, ts: &Timestamp<C>) -> Result<usize, usize> {
        self.queue.binary_search_by(|w| w.ts.cmp(ts))
    }

    /// Informed backoff: `T_w = T_cs · (P + 1/2)` for a waiter with `p` ahead of it.
    fn advice(&self, p: usize) -> Duration {
        let halves = u32::try_from(2 * p + 1).unwrap_or(u32::MAX);
        (self.tcs * halves / 2).clamp(self.config.min_advice, self.config.max_advice)
    }

    /// How long a waiter with `p` ahead of it is kept without news of its client: twice
    /// the advice (clients retry with some slack after it) plus the grace.
    fn waiter_ttl(&self, p: usize) -> Duration {
        self.advice(p) * 2 + self.config.queue_grace
    }

    fn next_stamp(&mut self, now: Time) -> u64 {
        self.last_stamp = self.last_stamp.saturating_add(1).max(micros(now));
        self.last_stamp
    }

    fn grant(&mut self, now: Time, ts: Timestamp<C>, echo: u64, heard_at: Time) {
        let stamp = self.next_stamp(now);
        let lease_until = now + self.config.lease;
        self.owner = Some(Owner { ts, stamp, lease_until, granted_at: now, echo, heard_at, inquired: false });
        self.stats.grants += 1;
    }

    fn enqueue(&mut self, now: Time, ts: Timestamp<C>, echo: u64, heard_at: Time) {
        let i = match self.position(&ts) {
            Ok(i) => i,
            Err(i) => {
                self.queue.insert(i, Waiter { ts: ts.clone(), expires: now, echo, heard_at });
                i
            }
        };
        let expires = now + self.waiter_ttl(i);
        let w = &mut self.queue[i];
        self.expiries.remove(&(w.expires, ts.clone()));
        w.expires = expires;
        w.echo = echo;
        w.heard_at = heard_at;
        self.expiries.insert((expires, ts));
    }

    fn remove_waiter(&mut self, i: usize) -> Option<Waiter<C>> {
        let w = self.queue.remove(i)?;
        self.expiries.remove(&(w.expires, w.ts.clone()));
        Some(w)
    }

    /// Fig. 6 `RespQueue`: the earliest live waiter becomes owner and is told so.
    fn promote(&mut self, now: Time) {
        debug_assert!(self.owner.is_none());
        while let Some(w) = self.remove_waiter(0) {
            if w.expires <= now {
                self.stats.waiter_expiries += 1;
                continue;
            }
            let ts = w.ts.clone();
            self.grant(now, w.ts, w.echo, w.heard_at);
            self.respond(ts, true);
            return;
        }
    }

    /// Queues a RESPONSE to `ts` naming the current owner.
    fn respond(&mut self, ts: Timestamp<C>, promoted: bool) {
        self.respond_with(ts, promoted, false);
    }

    /// [`Replica::respond`], with the INQUIRE flag for the owner.
    fn respond_with(&mut self, ts: Timestamp<C>, promoted: bool, inquire: bool) {
        let Some(owner) = self.owner.as_ref() else {
            return;
        };
        let next = if owner.ts == ts && self.config.recovery.relays() {
            self.queue.iter().take(RELAY_DEPTH).map(|w| w.ts.clone()).collect()
        } else {
            Vec::new()
        };
        let (position, advice, echo, grant_delay) = if owner.ts == ts {
            let lease_from = owner.lease_until.saturating_sub(self.config.lease);
            (0, Duration::ZERO, owner.echo, lease_from.saturating_sub(owner.heard_at))
        } else {
            match self.position(&ts) {
                Ok(i) => (i + 1, self.advice(i), self.queue[i].echo, Duration::ZERO),
                Err(_) => (0, Duration::ZERO, 0, Duration::ZERO),
            }
        };
        let response = Response {
            ts: ts.clone(),
            owner: owner.ts.clone(),
            stamp: owner.stamp,
            position: u32::try_from(position).unwrap_or(u32::MAX),
            advice,
            lease: self.config.lease,
            echo,
            grant_delay,
            promoted,
            inquire,
            next,
            solicit: false,
        };
        self.outbox.push_back((ts.client, response));
    }

    fn bury(&mut self, now: Time, ts: Timestamp<C>) {
        let until = now + self.config.tombstone_ttl;
        self.tombstones.insert(ts, until);
        while self.tombstones.len() > self.config.max_tombstones {
            if self.tombstones.pop_front().is_none() {
                break;
            }
        }
    }

    fn forget_tombstones(&mut self, now: Time) {
        while self.tombstones.first_until().is_some_and(|until| until <= now) {
            self.tombstones.pop_front();
        }
    }

    /// Checks the replica's invariants; `Err` names the first one broken. Used by the
    /// property tests and the simulator's debug mode.
    pub fn check_invariants(&self) -> Result<(), String> {
        if !self.queue.is_empty() && self.owner.is_none() && self.hold_until.is_none() {
            return Err("waiters but no owner".into());
        }
        for pair in self.queue.iter().collect::<Vec<_>>().windows(2) {
            if pair[0].ts >= pair[1].ts {
                return Err("queue not strictly sorted by timestamp".into());
            }
        }
        if let Some(o) = &self.owner {
            if self.position(&o.ts).is_ok() {
                return Err("owner also queued".into());
            }
        }
        if self.expiries.len() != self.queue.len() {
            return Err("expiry index out of step with the queue".into());
        }
        if self.queue.len() > self.config.max_queue || self.tombstones.len() > self.config.max_tombstones {
            return Err("state bound exceeded".into());
        }
        self.tombstones.check()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tombstones_are_found_with_or_without_their_index() {
        let mut t: Tombstones<u8> = Tombstones::new();
        let ts = |k: u64| Timestamp::new(k, 1u8);
        let at = Duration::from_secs;
        for k in 0..40 {
            t.insert(ts(k), at(k));
            t.insert(ts(k), at(k + 100)); // buried already: the first burial stands
            assert!(t.contains(&ts(k)));
            assert!(t.check().is_ok());
        }
        assert_eq!(t.len(), 40);
        assert!(t.index.is_some(), "indexed past {TOMBSTONE_INDEX_FROM}");
        assert_eq!((t.first_until(), t.last_until()), (Some(at(0)), Some(at(39))));
        for k in 0..35 {
            assert_eq!(t.pop_front(), Some((at(k), ts(k))));
            assert!(!t.contains(&ts(k)));
            assert!(t.check().is_ok());
        }
        assert!(t.index.is_none(), "dropped below half");
        assert!((35..40).all(|k| t.contains(&ts(k))));
        assert!(!t.contains(&ts(40)));
    }

    /// A hot lock buries one acquisition per release and its replica is compacted each
    /// time it turns idle: the burial order must not be reallocated (and copied whole)
    /// every time, only when it grew or shrank by a factor.
    #[test]
    fn compacting_after_every_burial_reallocates_the_tombstones_a_logarithmic_number_of_times() {
        let mut t: Tombstones<u8> = Tombstones::new();
        let ts = |k: u64| Timestamp::new(k, 1u8);
        let (mut capacity, mut changes) = (t.order.capacity(), 0);
        for k in 0..4096 {
            t.insert(ts(k), Duration::from_secs(k));
            t.shrink();
            if t.order.capacity() != capacity {
                (capacity, changes) = (t.order.capacity(), changes + 1);
            }
        }
        assert!(changes <= 2 * 13, "{changes} reallocations for 4096 burials");
        // Emptied, it gives its memory back.
        while t.pop_front().is_some() {
            t.shrink();
        }
        assert!(t.order.capacity() <= 8, "capacity {} left when empty", t.order.capacity());
    }
}
