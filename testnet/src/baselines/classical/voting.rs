//! Voting (the lecture's "Mutual Exclusion: Voting" and "Voting Districts"): every
//! process has one vote; a candidate asks its quorum for votes and enters the critical
//! section once it holds enough of them. Two quorum systems share one state machine,
//! chosen by [`Params::quorums`]:
//!
//! - [`Quorums::Majority`]: a REQUEST goes to all `n` processes (the candidate itself
//!   included) and a strict majority, `n / 2 + 1` votes, wins. Two majorities share a
//!   voter, and a voter has one vote.
//! - [`Quorums::Grid`] (Maekawa 1985): the processes are laid out row-major in a grid of
//!   `cols = ⌈√n⌉` columns and `rows = ⌈n / cols⌉` rows (only the last row may be
//!   incomplete). The district of `p` is its row plus its column, `p` included, about
//!   `2√n − 1` processes, and a candidate needs the vote of its *whole* district. Two
//!   districts always intersect: for `a` at `(ra, ca)` and `b` at `(rb, cb)`, cell
//!   `(rb, ca)` is in both (`a`'s column, `b`'s row); if it falls beyond the incomplete
//!   last row then `rb` is the last row and `ca` a column that row lacks, so `a` is in an
//!   earlier row and cell `(ra, cb)` exists (a full row) and is in both. Membership is
//!   symmetric (same row or same column), which lets a voter reject a REQUEST from
//!   outside its own district.
//!
//! Messages, each naming the Lamport timestamp of the request it is about, so that a
//! message about a finished request is recognised: REQUEST (candidate → quorum), VOTE
//! (the lecture's OK/YES), RELEASE (candidate → quorum, on exit), INQUIRE (voter →
//! the candidate it voted for: "will you give my vote back?") and RELINQUISH (the
//! answer: "here it is").
//!
//! Each process plays two independent roles:
//!
//! - **Voter.** `voted_for`, a priority queue of waiting requests ordered by timestamp
//!   and an `inquired` flag. On REQUEST: vote if the vote is free, else queue the
//!   request and, if it is older than the request voted for and no INQUIRE is out for
//!   this vote yet, INQUIRE the candidate voted for (one INQUIRE per vote at most). On
//!   RELINQUISH: the candidate goes back into the queue and the vote goes to the oldest
//!   queued request (the older one that caused the INQUIRE, unless it was released in
//!   the meantime). On RELEASE of the request voted for: vote for the oldest queued
//!   request, if any; on RELEASE of a queued request (one that won without this vote,
//!   majority only): drop it from the queue.
//! - **Candidate.** [`Process::request`] stamps a fresh timestamp and sends REQUEST to
//!   its quorum; votes for that timestamp are counted; the candidate enters when it has
//!   `n / 2 + 1` (majority) or its whole district (grid). On INQUIRE for its current
//!   request: if it is in the critical section the INQUIRE is ignored (the voter waits
//!   for the RELEASE); otherwise it forgets that vote and RELINQUISHes it, as the lecture
//!   says ("If this node hasn't won the election, it forgets about our vote and sends us
//!   a RELINQUISH"). A candidate only ever "has won" by being in the critical section:
//!   it enters on the vote that completes its quorum.
//!
//! Decisions where the notes are silent:
//!
//! - **Self-voting is a message to oneself.** The candidate sends REQUEST (and RELEASE,
//!   RELINQUISH) to itself like to anyone else and its voter role answers with a VOTE
//!   (or INQUIRE) to itself; the driver delivers these locally and does not count them.
//!   The two roles never look at each other's state.
//! - **Plain Lamport clocks**, the lecture's: a request is stamped with the counter
//!   alone (`stamp(Duration::ZERO, me)`, ties broken by process id) and every received
//!   message's counter is observed. A process with a low clock may overtake older
//!   waiters, but only finitely often: each of its requests advances its clock by one.
//! - **When to relinquish.** Always, if not in the critical section. Maekawa's original
//!   also has FAILED messages and relinquishes only when it knows it cannot win; the
//!   lecture's variant gives a vote back that might have been enough, for fewer message
//!   types. It is still live: a voter moves its vote away from a candidate only to an
//!   older request (or when the candidate is done), so the oldest outstanding request
//!   eventually collects its quorum unless somebody else is in the critical section.
//! - **RELEASE goes to every process asked**, not only those that voted (the lecture
//!   says "to those participants that voted for it"). With a majority the losers of a
//!   race still have the winner's request queued; without the RELEASE they would vote
//!   for it later, for nothing, and keep it forever. The cost is the same `n − 1`
//!   messages as in the no-contention case, where everyone votes anyway.
//! - **Stale messages are normal and accepted (`Ok`, ignored)**: a VOTE for a request
//!   that has already left the critical section (a voter freed by a RELINQUISH voted
//!   for it again, or a majority voter voted after the win; the RELEASE reaches that
//!   voter after the vote was sent, FIFO, and frees it), an INQUIRE about a finished
//!   request (the RELEASE crosses it) or about the request in the critical section. A
//!   message that cannot happen on reliable FIFO channels is rejected with
//!   [`ProcessError`] and changes nothing (not even the clock): an unknown sender, a
//!   process outside the district, a timestamp naming another process, a VOTE for a
//!   request never made, a second VOTE from a voter already counted, an INQUIRE about a
//!   vote not held, a second REQUEST from a process whose previous request is still
//!   voted for or queued, a RELEASE of a request neither voted for nor queued, a
//!   RELINQUISH of a vote not given or never inquired about.
//! - **Why this is exclusive.** A voter's vote is counted by at most one candidate at a
//!   time: the candidate counts it from the VOTE until it sends RELINQUISH or RELEASE,
//!   the voter reassigns it only after receiving one of those. Two winning quorums
//!   intersect, so two candidates in the critical section would share a vote. The races
//!   this needs: an INQUIRE crossing the vote that completes the quorum arrives in the
//!   critical section and is ignored; an INQUIRE cannot reach a candidate that already
//!   relinquished that vote (one INQUIRE per vote, and a new vote precedes its own
//!   INQUIRE on the FIFO channel); a candidate that relinquished may receive a fresh
//!   VOTE from the same voter for the same request, which counts again.
//!
//! Cost with no contention: REQUEST, VOTE and RELEASE with every other member of the
//! quorum, `3 (n − 1)` network messages per entry for a majority and `3 (|district| − 1)`
//! for the grid. [`Process::retries`] counts the network messages beyond those caused by
//! contention for this process's requests: INQUIREs received, RELINQUISHes sent and
//! repeated VOTEs (a voter voting again after a RELINQUISH); messages to oneself are not
//! counted.
//!
//! Memory loss (`recovering`) is not handled: a restarted process starts empty. A voter
//! that forgets its vote can vote again for someone else while the first candidate is
//! in the critical section (two in it); it also rejects the RELEASE and RELINQUISH of
//! what it forgot, and the requests it had queued are never voted for by it (a grid
//! candidate needing that vote waits forever). A candidate that forgets its request
//! never RELEASEs the votes it held, which are lost for good.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Outbox, Pid, Process, ProcessError};
use sigma_behaviour::proto::clock::{LamportClock, Timestamp};
use sigma_behaviour::proto::Time;

/// The quorum system: whose votes a candidate asks for and how many it needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Quorums {
    /// Ask all `n` processes, win with `n / 2 + 1` votes.
    #[default]
    Majority,
    /// Maekawa's grid: ask the candidate's row and column, win with all of them.
    Grid,
}

impl Quorums {
    /// The processes `me` sends its REQUESTs (and RELEASEs) to, in increasing order,
    /// `me` included: everyone for a majority, `me`'s row and column for the grid.
    pub fn district(self, me: Pid, n: usize) -> Vec<Pid> {
        match self {
            Quorums::Majority => (0..n).collect(),
            Quorums::Grid => {
                let (_, cols) = grid(n);
                let (row, col) = (me / cols, me % cols);
                (0..n).filter(|q| q / cols == row || q % cols == col).collect()
            }
        }
    }

    /// Votes needed out of a district of `district` processes among `n`.
    pub fn needed(self, n: usize, district: usize) -> usize {
        match self {
            Quorums::Majority => n / 2 + 1,
            Quorums::Grid => district,
        }
    }
}

/// The grid of `n` processes: `(rows, cols)` with `cols = ⌈√n⌉` and `rows = ⌈n / cols⌉`;
/// process `p` sits at row `p / cols`, column `p % cols`. `(0, 0)` for `n = 0`.
pub fn grid(n: usize) -> (usize, usize) {
    let mut cols = 0;
    while cols * cols < n {
        cols += 1;
    }
    if cols == 0 {
        return (0, 0);
    }
    (n.div_ceil(cols), cols)
}

/// Parameters.
#[derive(Clone, Debug, Default)]
pub struct Params {
    /// The quorum system.
    pub quorums: Quorums,
}

/// Messages; each names the request (its timestamp) it is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Msg {
    /// Candidate → its quorum: vote for my request.
    Request(Timestamp<Pid>),
    /// Voter → candidate: my vote is yours (the lecture's OK / YES).
    Vote(Timestamp<Pid>),
    /// Candidate → its quorum: I left the critical section (or won without you).
    Release(Timestamp<Pid>),
    /// Voter → the candidate it voted for: an older request is waiting; give my vote
    /// back if you have not entered.
    Inquire(Timestamp<Pid>),
    /// Candidate → voter: your vote back, I have not entered.
    Relinquish(Timestamp<Pid>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Idle,
    Wanting,
    Holding,
}

/// One process: a candidate for its own application and a voter for everyone.
#[derive(Debug)]
pub struct Voting {
    me: Pid,
    n: usize,
    /// The processes asked for votes (sorted, `me` included).
    district: Vec<Pid>,
    /// Votes that win.
    needed: usize,
    clock: LamportClock,
    // Candidate role.
    state: State,
    /// The latest request stamped: the current one unless idle.
    last: Option<Timestamp<Pid>>,
    /// Voters whose vote for the current request is held.
    votes: BTreeSet<Pid>,
    /// Voters that have voted for the current request at least once.
    voted_once: BTreeSet<Pid>,
    retries: u64,
    // Voter role.
    /// The request this process's vote is given to.
    voted_for: Option<Timestamp<Pid>>,
    /// An INQUIRE was sent about the current vote.
    inquired: bool,
    /// Requests waiting for this vote, oldest first.
    queue: BTreeSet<Timestamp<Pid>>,
    out: Outbox<Msg>,
}

impl Voting {
    /// The processes this one asks for votes (`me` included).
    pub fn district(&self) -> &[Pid] {
        &self.district
    }

    /// Votes needed to enter.
    pub fn needed(&self) -> usize {
        self.needed
    }

    /// The request this process's vote is currently given to (voter role).
    pub fn voted_for(&self) -> Option<Timestamp<Pid>> {
        self.voted_for
    }

    /// Requests waiting for this process's vote, oldest first (voter role).
    pub fn queued(&self) -> Vec<Timestamp<Pid>> {
        self.queue.iter().copied().collect()
    }

    /// The request outstanding or in the critical section (candidate role).
    pub fn current(&self) -> Option<Timestamp<Pid>> {
        if self.state == State::Idle {
            None
        } else {
            self.last
        }
    }

    fn in_district(&self, p: Pid) -> Result<(), ProcessError> {
        if self.district.binary_search(&p).is_ok() {
            Ok(())
        } else {
            Err(ProcessError::Unexpected("message from outside the district"))
        }
    }

    /// A message about a request of the sender's (REQUEST, RELEASE, RELINQUISH).
    fn senders(from: Pid, ts: Timestamp<Pid>) -> Result<(), ProcessError> {
        if ts.client == from {
            Ok(())
        } else {
            Err(ProcessError::Unexpected("timestamp of another process"))
        }
    }

    /// A message about a request of mine (VOTE, INQUIRE): `Ok(true)` if it is about the
    /// current request, `Ok(false)` if about an earlier one.
    fn mine(&self, ts: Timestamp<Pid>) -> Result<bool, ProcessError> {
        if ts.client != self.me {
            return Err(ProcessError::Unexpected("timestamp of another process"));
        }
        match self.last {
            Some(last) if ts <= last => Ok(ts == last && self.state != State::Idle),
            _ => Err(ProcessError::Unexpected("message about a request never made")),
        }
    }

    /// Voter: give the vote to `ts`.
    fn vote(&mut self, ts: Timestamp<Pid>) {
        self.voted_for = Some(ts);
        self.inquired = false;
        self.out.send(ts.client, Msg::Vote(ts));
    }

    /// Voter: the vote is free again; give it to the oldest waiting request.
    fn vote_next(&mut self) {
        self.voted_for = None;
        self.inquired = false;
        if let Some(ts) = self.queue.pop_first() {
            self.vote(ts);
        }
    }

    fn on_request(&mut self, from: Pid, ts: Timestamp<Pid>) -> Result<(), ProcessError> {
        Self::senders(from, ts)?;
        self.in_district(from)?;
        if self.voted_for.is_some_and(|v| v.client == from) || self.queue.iter().any(|q| q.client == from) {
            return Err(ProcessError::Unexpected("duplicate request"));
        }
        self.clock.observe(ts.counter);
        match self.voted_for {
            None => self.vote(ts),
            Some(v) => {
                self.queue.insert(ts);
                if ts < v && !self.inquired {
                    self.inquired = true;
                    self.out.send(v.client, Msg::Inquire(v));
                }
            }
        }
        Ok(())
    }

    fn on_release(&mut self, from: Pid, ts: Timestamp<Pid>) -> Result<(), ProcessError> {
        Self::senders(from, ts)?;
        if self.voted_for == Some(ts) {
            self.clock.observe(ts.counter);
            self.vote_next();
        } else if self.queue.remove(&ts) {
            // The request won without this vote (majority): forget it.
            self.clock.observe(ts.counter);
        } else {
            return Err(ProcessError::Unexpected("release of a request neither voted for nor queued"));
        }
        Ok(())
    }

    fn on_relinquish(&mut self, from: Pid, ts: Timestamp<Pid>) -> Result<(), ProcessError> {
        Self::senders(from, ts)?;
        if self.voted_for != Some(ts) {
            return Err(ProcessError::Unexpected("relinquish of a vote not given"));
        }
        if !self.inquired {
            return Err(ProcessError::Unexpected("relinquish without an inquire"));
        }
        self.clock.observe(ts.counter);
        self.queue.insert(ts);
        self.vote_next();
        Ok(())
    }

    fn on_vote(&mut self, from: Pid, ts: Timestamp<Pid>) -> Result<(), ProcessError> {
        self.in_district(from)?;
        if !self.mine(ts)? {
            // Voted for a request that has left the CS; the RELEASE frees the voter.
            self.clock.observe(ts.counter);
            return Ok(());
        }
        if self.votes.contains(&from) {
            return Err(ProcessError::Unexpected("duplicate vote"));
        }
        self.clock.observe(ts.counter);
        if !self.voted_once.insert(from) && from != self.me {
            self.retries += 1; // a vote given again after a RELINQUISH
        }
        self.votes.insert(from);
        if self.state == State::Wanting && self.votes.len() >= self.needed {
            self.state = State::Holding;
            self.out.grant();
        }
        Ok(())
    }

    fn on_inquire(&mut self, from: Pid, ts: Timestamp<Pid>) -> Result<(), ProcessError> {
        self.in_district(from)?;
        let current = self.mine(ts)?;
        if current && self.state == State::Wanting && !self.votes.contains(&from) {
            return Err(ProcessError::Unexpected("inquire about a vote not held"));
        }
        self.clock.observe(ts.counter);
        if from != self.me {
            self.retries += 1;
        }
        if current && self.state == State::Wanting {
            self.votes.remove(&from);
            self.out.send(from, Msg::Relinquish(ts));
            if from != self.me {
                self.retries += 1;
            }
        }
        // Otherwise: in the CS (the RELEASE will free the voter) or about a finished
        // request (its RELEASE is on the way): ignored.
        Ok(())
    }
}

impl Process for Voting {
    type Msg = Msg;
    type Params = Params;

    fn new(params: &Params, me: Pid, n: usize, _recovering: bool, _now: Time) -> Self {
        let n = n.max(1);
        let district = params.quorums.district(me, n);
        Voting {
            me,
            n,
            needed: params.quorums.needed(n, district.len()),
            district,
            clock: LamportClock::new(),
            state: State::Idle,
            last: None,
            votes: BTreeSet::new(),
            voted_once: BTreeSet::new(),
            retries: 0,
            voted_for: None,
            inquired: false,
            queue: BTreeSet::new(),
            out: Outbox::default(),
        }
    }

    fn request(&mut self, _now: Time) {
        if self.state != State::Idle {
            return;
        }
        let ts = self.clock.stamp(Duration::ZERO, self.me);
        self.last = Some(ts);
        self.state = State::Wanting;
        self.votes.clear();
        self.voted_once.clear();
        self.out.send_all(self.district.iter().copied(), Msg::Request(ts));
    }

    fn release(&mut self, _now: Time) {
        if self.state != State::Holding {
            return;
        }
        self.state = State::Idle;
        self.votes.clear();
        if let Some(ts) = self.last {
            self.out.send_all(self.district.iter().copied(), Msg::Release(ts));
        }
    }

    fn handle(&mut self, _now: Time, from: Pid, msg: Msg) -> Result<(), ProcessError> {
        if from >= self.n {
            return Err(ProcessError::UnknownProcess(from));
        }
        match msg {
            Msg::Request(ts) => self.on_request(from, ts),
            Msg::Vote(ts) => self.on_vote(from, ts),
            Msg::Release(ts) => self.on_release(from, ts),
            Msg::Inquire(ts) => self.on_inquire(from, ts),
            Msg::Relinquish(ts) => self.on_relinquish(from, ts),
        }
    }

    fn outbox(&mut self) -> &mut Outbox<Msg> {
        &mut self.out
    }

    fn holding(&self) -> bool {
        self.state == State::Holding
    }

    fn voters(&self) -> Vec<Pid> {
        if self.holding() {
            self.votes.iter().copied().collect()
        } else {
            Vec::new()
        }
    }

    fn retries(&self) -> u64 {
        self.retries
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::baselines::classical::harness::{self, drain, ts, T};
    const MAJORITY: Params = Params { quorums: Quorums::Majority };
    const GRID: Params = Params { quorums: Quorums::Grid };

    fn procs(params: &Params, n: usize) -> Vec<Voting> {
        harness::procs(params, n)
    }

    /// Delivers everything in flight (one global FIFO, so every channel is FIFO) until
    /// quiet; returns the network messages (self-messages excluded).
    fn settle(procs: &mut [Voting]) -> usize {
        let mut flight: VecDeque<(Pid, Pid, Msg)> = VecDeque::new();
        let mut messages = 0;
        loop {
            for (from, p) in procs.iter_mut().enumerate() {
                for (to, msg) in drain(p) {
                    if to != from {
                        messages += 1;
                    }
                    flight.push_back((from, to, msg));
                }
            }
            let Some((from, to, msg)) = flight.pop_front() else { return messages };
            procs[to].handle(T, from, msg).unwrap();
        }
    }

    /// A random FIFO driver like the harness that also checks the safety lemma after
    /// every step: each vote a candidate counts is the vote its voter has given to that
    /// candidate's current request. Returns the retries of all processes.
    fn checked_run(params: &Params, n: usize, rounds: usize, seed: u64) -> u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut ps = procs(params, n);
        let mut channels: Vec<VecDeque<Msg>> = vec![VecDeque::new(); n * n];
        let mut left = vec![rounds; n];
        let mut entries = 0;
        while entries < n * rounds || ps.iter().any(Voting::holding) {
            for (from, p) in ps.iter_mut().enumerate() {
                for (to, msg) in drain(p) {
                    channels[from * n + to].push_back(msg);
                }
                if p.poll_granted() {
                    entries += 1;
                }
            }
            assert!(ps.iter().filter(|p| p.holding()).count() <= 1, "seed {seed}: two in the CS");
            for c in &ps {
                for &v in &c.votes {
                    assert_eq!(ps[v].voted_for(), c.current(), "seed {seed}: {v}'s vote counted by {}", c.me);
                }
            }
            let busy: Vec<usize> = (0..n * n).filter(|&c| !channels[c].is_empty()).collect();
            let idle: Vec<Pid> = (0..n).filter(|&p| ps[p].state == State::Idle && left[p] > 0).collect();
            let holder = ps.iter().position(Voting::holding);
            match rng.gen_range(0..4u8) {
                0 if !idle.is_empty() => {
                    let p = idle[rng.gen_range(0..idle.len())];
                    left[p] -= 1;
                    ps[p].request(T);
                }
                1 if holder.is_some() => ps[holder.unwrap_or_default()].release(T),
                _ if !busy.is_empty() => {
                    let c = busy[rng.gen_range(0..busy.len())];
                    let msg = channels[c].pop_front().unwrap_or_else(|| unreachable!());
                    ps[c % n].handle(T, c / n, msg).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                }
                _ => match (holder, idle.first()) {
                    (Some(h), _) => ps[h].release(T),
                    (None, Some(&p)) => {
                        left[p] -= 1;
                        ps[p].request(T);
                    }
                    (None, None) => panic!("seed {seed}: stuck with {entries} entries"),
                },
            }
        }
        ps.iter().map(Voting::retries).sum()
    }

    #[test]
    fn votes_are_never_counted_twice_and_inquiries_happen() {
        for params in [MAJORITY, GRID] {
            for n in [3, 4, 5, 7, 9] {
                let retries: u64 = (0..300).map(|seed| checked_run(&params, n, 3, seed)).sum();
                assert!(retries > 0, "{params:?} n {n}: no INQUIRE in 300 runs");
            }
        }
    }

    #[test]
    fn majority_exclusive_and_live_on_seeded_interleavings() {
        for n in [3, 4, 5, 7, 9] {
            harness::assert_exclusive_and_live::<Voting>(&MAJORITY, n, 3, 0..500);
        }
    }

    #[test]
    fn grid_exclusive_and_live_on_seeded_interleavings() {
        for n in [3, 4, 5, 7, 9] {
            harness::assert_exclusive_and_live::<Voting>(&GRID, n, 3, 0..500);
        }
    }

    #[test]
    fn every_small_size_and_a_larger_grid_work() {
        for params in [MAJORITY, GRID] {
            for n in 1..=12 {
                harness::assert_exclusive_and_live::<Voting>(&params, n, 4, 0..40);
            }
            harness::assert_exclusive_and_live::<Voting>(&params, 16, 2, 0..20);
        }
    }

    #[test]
    fn grid_layout_and_district_sizes() {
        assert_eq!(grid(0), (0, 0));
        assert_eq!(grid(1), (1, 1));
        assert_eq!(grid(3), (2, 2));
        assert_eq!(grid(10), (3, 4));
        assert_eq!(grid(16), (4, 4));
        assert_eq!(grid(32), (6, 6));
        assert_eq!(Quorums::Grid.district(0, 1), vec![0]);
        assert_eq!(Quorums::Grid.district(5, 9), vec![2, 3, 4, 5, 8]);
        for p in 0..16 {
            assert_eq!(Quorums::Grid.district(p, 16).len(), 7, "2√16 − 1");
        }
        let sizes: Vec<usize> = (0..32).map(|p| Quorums::Grid.district(p, 32).len()).collect();
        assert_eq!(sizes.iter().max(), Some(&11));
        assert_eq!(sizes[30], 7, "last row holds 30, 31: 2 + 6 − 1");
        assert_eq!(Quorums::Majority.district(2, 5), vec![0, 1, 2, 3, 4]);
        assert_eq!(Quorums::Majority.needed(4, 4), 3);
        assert_eq!(Quorums::Majority.needed(5, 5), 3);
        assert_eq!(Quorums::Grid.needed(16, 7), 7);
    }

    #[test]
    fn any_two_districts_intersect_and_membership_is_symmetric() {
        for n in 1..=64usize {
            let (rows, cols) = grid(n);
            assert!(rows * cols >= n && (rows - 1) * cols < n, "n {n}: only the last row may be incomplete");
            let districts: Vec<Vec<Pid>> = (0..n).map(|p| Quorums::Grid.district(p, n)).collect();
            for a in 0..n {
                assert!(districts[a].contains(&a));
                assert!(districts[a].len() < 2 * cols, "n {n}: at most 2 ⌈√n⌉ − 1");
                for b in 0..n {
                    assert!(districts[a].iter().any(|q| districts[b].contains(q)), "n {n}: {a} and {b} disjoint");
                    assert_eq!(districts[a].contains(&b), districts[b].contains(&a), "n {n}: {a}, {b}");
                }
            }
        }
    }

    #[test]
    fn no_contention_costs_three_messages_per_other_quorum_member() {
        for (params, n, per_entry) in [(MAJORITY, 5, 3 * 4), (MAJORITY, 9, 3 * 8), (GRID, 9, 3 * 4), (GRID, 16, 3 * 6)]
        {
            let mut ps = procs(&params, n);
            let mut total = 0;
            for p in 0..n {
                ps[p].request(T);
                total += settle(&mut ps);
                assert!(ps[p].poll_granted() && ps[p].holding(), "{params:?} {p}");
                assert_eq!(ps[p].voters(), ps[p].district().to_vec(), "everyone voted");
                ps[p].release(T);
                total += settle(&mut ps);
                assert!(ps.iter().all(|q| q.voted_for().is_none() && q.queued().is_empty()));
            }
            assert_eq!(total, per_entry * n, "{params:?} n {n}");
            assert!(ps.iter().all(|q| q.retries() == 0));
        }
    }

    #[test]
    fn a_single_process_votes_for_itself_through_messages() {
        for params in [MAJORITY, GRID] {
            let mut p = Voting::new(&params, 0, 1, false, T);
            p.request(T);
            assert_eq!(drain(&mut p), vec![(0, Msg::Request(ts(1, 0)))]);
            p.handle(T, 0, Msg::Request(ts(1, 0))).unwrap();
            assert_eq!(drain(&mut p), vec![(0, Msg::Vote(ts(1, 0)))]);
            p.handle(T, 0, Msg::Vote(ts(1, 0))).unwrap();
            assert!(p.poll_granted() && p.holding());
            assert_eq!(p.voters(), vec![0]);
            p.release(T);
            assert_eq!(drain(&mut p), vec![(0, Msg::Release(ts(1, 0)))]);
            p.handle(T, 0, Msg::Release(ts(1, 0))).unwrap();
            assert_eq!(p.voted_for(), None);
            harness::assert_single_process_needs_no_messages::<Voting>(&params);
        }
    }

    #[test]
    fn request_and_release_are_ignored_out_of_turn() {
        let mut p = harness::assert_out_of_turn_calls_are_ignored::<Voting>(&MAJORITY, 3, 3);
        p.handle(T, 0, Msg::Vote(ts(1, 0))).unwrap();
        p.handle(T, 1, Msg::Vote(ts(1, 0))).unwrap();
        assert!(p.poll_granted() && p.holding());
        assert!(!p.poll_granted(), "once");
        p.request(T);
        assert!(drain(&mut p).is_empty(), "request while holding");
        assert_eq!(p.current(), Some(ts(1, 0)));
    }

    /// Grid of 4 (2 × 2): districts {0, 1, 2} and {1, 2, 3} share 1 and 2. Candidates 0
    /// (older) and 3 split them: 1 votes for 3, 2 votes for 0. Then 1 learns of the older
    /// request, INQUIREs 3, which gives the vote back; 0 enters, then 3.
    #[test]
    fn inquire_and_relinquish_break_a_split_vote() {
        let mut ps = procs(&GRID, 4);
        let (a, b) = (ts(1, 0), ts(1, 3));
        ps[0].request(T);
        ps[3].request(T);
        assert_eq!(drain(&mut ps[0]), vec![(0, Msg::Request(a)), (1, Msg::Request(a)), (2, Msg::Request(a))]);
        assert_eq!(drain(&mut ps[3]), vec![(1, Msg::Request(b)), (2, Msg::Request(b)), (3, Msg::Request(b))]);
        for (voter, cand, t) in [(0, 0, a), (3, 3, b), (1, 3, b), (2, 0, a)] {
            ps[voter].handle(T, cand, Msg::Request(t)).unwrap();
            assert_eq!(drain(&mut ps[voter]), vec![(cand, Msg::Vote(t))]);
            ps[cand].handle(T, voter, Msg::Vote(t)).unwrap();
        }
        assert!(!ps[0].holding() && !ps[3].holding(), "split: 0 lacks 1, 3 lacks 2");
        // 2 hears of the younger request: queued, no INQUIRE.
        ps[2].handle(T, 3, Msg::Request(b)).unwrap();
        assert!(drain(&mut ps[2]).is_empty());
        // 1 hears of the older one: INQUIRE the candidate it voted for.
        ps[1].handle(T, 0, Msg::Request(a)).unwrap();
        assert_eq!(drain(&mut ps[1]), vec![(3, Msg::Inquire(b))]);
        ps[3].handle(T, 1, Msg::Inquire(b)).unwrap();
        assert_eq!(drain(&mut ps[3]), vec![(1, Msg::Relinquish(b))]);
        ps[1].handle(T, 3, Msg::Relinquish(b)).unwrap();
        assert_eq!(drain(&mut ps[1]), vec![(0, Msg::Vote(a))]);
        assert_eq!(ps[1].queued(), vec![b]);
        ps[0].handle(T, 1, Msg::Vote(a)).unwrap();
        assert!(ps[0].poll_granted());
        assert_eq!(ps[0].voters(), vec![0, 1, 2]);
        ps[0].release(T);
        let releases = drain(&mut ps[0]);
        assert_eq!(releases.len(), 3);
        for (voter, msg) in releases {
            ps[voter].handle(T, 0, msg).unwrap();
        }
        for voter in [1, 2] {
            assert_eq!(drain(&mut ps[voter]), vec![(3, Msg::Vote(b))], "voter {voter}");
            ps[3].handle(T, voter, Msg::Vote(b)).unwrap();
        }
        assert!(ps[3].poll_granted());
        assert_eq!(ps[3].voters(), vec![1, 2, 3]);
        assert_eq!(ps[3].retries(), 3, "INQUIRE received, RELINQUISH sent, vote of 1 again");
        assert_eq!(ps[0].retries(), 0);
    }

    /// The INQUIRE crosses the vote that completes the quorum: it arrives in the CS and
    /// is ignored; the voter is freed by the RELEASE.
    #[test]
    fn an_inquire_reaching_the_critical_section_is_ignored() {
        let mut ps = procs(&GRID, 4);
        let b = ts(1, 3);
        ps[3].request(T);
        drain(&mut ps[3]);
        for voter in [1, 3] {
            ps[voter].handle(T, 3, Msg::Request(b)).unwrap();
            drain(&mut ps[voter]);
            ps[3].handle(T, voter, Msg::Vote(b)).unwrap();
        }
        // 0 asks with an older stamp; 1 inquires while 2's vote is on its way to 3.
        ps[0].request(T);
        let a = ts(1, 0);
        drain(&mut ps[0]);
        ps[1].handle(T, 0, Msg::Request(a)).unwrap();
        assert_eq!(drain(&mut ps[1]), vec![(3, Msg::Inquire(b))]);
        ps[2].handle(T, 3, Msg::Request(b)).unwrap();
        drain(&mut ps[2]);
        ps[3].handle(T, 2, Msg::Vote(b)).unwrap();
        assert!(ps[3].poll_granted());
        ps[3].handle(T, 1, Msg::Inquire(b)).unwrap();
        assert!(drain(&mut ps[3]).is_empty(), "no RELINQUISH from the CS");
        assert_eq!(ps[3].voters(), vec![1, 2, 3]);
        ps[3].release(T);
        drain(&mut ps[3]);
        ps[1].handle(T, 3, Msg::Release(b)).unwrap();
        assert_eq!(drain(&mut ps[1]), vec![(0, Msg::Vote(a))]);
        // The INQUIRE about a finished request is ignored too.
        ps[3].handle(T, 2, Msg::Inquire(b)).unwrap();
        assert!(drain(&mut ps[3]).is_empty());
    }

    /// Majority of 3: 0 wins with its own vote and 1's; 2's vote arrives after the exit
    /// and is ignored, and 2 is freed by the RELEASE behind it. A request that won
    /// elsewhere leaves the queues of voters that never voted for it.
    #[test]
    fn late_votes_are_ignored_and_release_clears_queues() {
        let mut ps = procs(&MAJORITY, 3);
        let a = ts(1, 0);
        ps[0].request(T);
        drain(&mut ps[0]);
        for voter in [0, 1] {
            ps[voter].handle(T, 0, Msg::Request(a)).unwrap();
            drain(&mut ps[voter]);
            ps[0].handle(T, voter, Msg::Vote(a)).unwrap();
        }
        assert!(ps[0].poll_granted());
        assert_eq!(ps[0].voters(), vec![0, 1]);
        ps[2].handle(T, 0, Msg::Request(a)).unwrap();
        assert_eq!(drain(&mut ps[2]), vec![(0, Msg::Vote(a))]);
        ps[0].release(T);
        drain(&mut ps[0]);
        ps[0].handle(T, 2, Msg::Vote(a)).unwrap();
        assert!(!ps[0].holding() && !ps[0].poll_granted());
        ps[2].handle(T, 0, Msg::Release(a)).unwrap();
        assert_eq!(ps[2].voted_for(), None);

        // 1 votes for 2 first and queues 0's older request (INQUIRE to 2); 0 wins with
        // its own vote and 2's. Its RELEASE takes it out of 1's queue.
        let mut ps = procs(&MAJORITY, 3);
        ps[2].request(T);
        ps[0].request(T);
        drain(&mut ps[2]);
        drain(&mut ps[0]);
        let (c, a) = (ts(1, 2), ts(1, 0));
        ps[1].handle(T, 2, Msg::Request(c)).unwrap();
        assert_eq!(drain(&mut ps[1]), vec![(2, Msg::Vote(c))]);
        ps[1].handle(T, 0, Msg::Request(a)).unwrap();
        assert_eq!(drain(&mut ps[1]), vec![(2, Msg::Inquire(c))], "a is older than c");
        for voter in [0, 2] {
            ps[voter].handle(T, 0, Msg::Request(a)).unwrap();
            assert_eq!(drain(&mut ps[voter]), vec![(0, Msg::Vote(a))]);
            ps[0].handle(T, voter, Msg::Vote(a)).unwrap();
        }
        assert!(ps[0].poll_granted());
        ps[0].release(T);
        ps[1].handle(T, 0, Msg::Release(a)).unwrap();
        assert_eq!(ps[1].queued(), Vec::<Timestamp<Pid>>::new());
        assert_eq!(ps[1].voted_for(), Some(c));
    }

    #[test]
    fn a_relinquishing_candidate_counts_a_fresh_vote_from_the_same_voter() {
        // Majority of 3: 1 votes for 2, inquires for 0's older request, but 0 wins and
        // leaves before the RELINQUISH arrives; 1 then votes for 2 again.
        let mut ps = procs(&MAJORITY, 3);
        let (c, a) = (ts(1, 2), ts(1, 0));
        ps[2].request(T);
        ps[0].request(T);
        ps[1].handle(T, 2, Msg::Request(c)).unwrap();
        drain(&mut ps[1]);
        ps[2].handle(T, 1, Msg::Vote(c)).unwrap();
        ps[1].handle(T, 0, Msg::Request(a)).unwrap();
        assert_eq!(drain(&mut ps[1]), vec![(2, Msg::Inquire(c))]);
        ps[2].handle(T, 1, Msg::Inquire(c)).unwrap();
        assert_eq!(drain(&mut ps[2]).last(), Some(&(1, Msg::Relinquish(c))));
        // 0's RELEASE reaches 1 before 2's RELINQUISH.
        ps[1].handle(T, 0, Msg::Release(a)).unwrap();
        ps[1].handle(T, 2, Msg::Relinquish(c)).unwrap();
        assert_eq!(drain(&mut ps[1]), vec![(2, Msg::Vote(c))], "the only request left");
        ps[2].handle(T, 2, Msg::Request(c)).unwrap();
        assert_eq!(drain(&mut ps[2]), vec![(2, Msg::Vote(c))]);
        ps[2].handle(T, 2, Msg::Vote(c)).unwrap();
        ps[2].handle(T, 1, Msg::Vote(c)).unwrap();
        assert!(ps[2].poll_granted());
        assert_eq!(ps[2].voters(), vec![1, 2]);
        assert_eq!(ps[2].retries(), 3);
    }

    #[test]
    fn bogus_messages_are_rejected_and_change_nothing() {
        let mut p = Voting::new(&GRID, 0, 9, false, T); // district {0, 1, 2, 3, 6}
        p.handle(T, 3, Msg::Request(ts(4, 3))).unwrap();
        assert_eq!(drain(&mut p), vec![(3, Msg::Vote(ts(4, 3)))]);
        p.handle(T, 1, Msg::Request(ts(6, 1))).unwrap();
        p.request(T);
        let mine = p.current().unwrap();
        assert_eq!(mine, ts(7, 0));
        drain(&mut p);
        let snapshot = format!("{p:?}");
        let bad: Vec<(Pid, Msg, ProcessError)> = vec![
            (9, Msg::Request(ts(1, 9)), ProcessError::UnknownProcess(9)),
            (4, Msg::Request(ts(1, 4)), ProcessError::Unexpected("message from outside the district")),
            (2, Msg::Request(ts(1, 1)), ProcessError::Unexpected("timestamp of another process")),
            (3, Msg::Request(ts(9, 3)), ProcessError::Unexpected("duplicate request")),
            (1, Msg::Request(ts(6, 1)), ProcessError::Unexpected("duplicate request")),
            (2, Msg::Release(ts(5, 2)), ProcessError::Unexpected("release of a request neither voted for nor queued")),
            (3, Msg::Release(ts(3, 3)), ProcessError::Unexpected("release of a request neither voted for nor queued")),
            (2, Msg::Relinquish(ts(5, 2)), ProcessError::Unexpected("relinquish of a vote not given")),
            (3, Msg::Relinquish(ts(4, 3)), ProcessError::Unexpected("relinquish without an inquire")),
            (1, Msg::Vote(ts(7, 1)), ProcessError::Unexpected("timestamp of another process")),
            (1, Msg::Vote(ts(8, 0)), ProcessError::Unexpected("message about a request never made")),
            (5, Msg::Vote(mine), ProcessError::Unexpected("message from outside the district")),
            (1, Msg::Inquire(mine), ProcessError::Unexpected("inquire about a vote not held")),
        ];
        for (from, msg, err) in bad {
            assert_eq!(p.handle(T, from, msg.clone()), Err(err), "{msg:?} from {from}");
            assert_eq!(format!("{p:?}"), snapshot, "{msg:?} from {from} changed the state");
        }
        p.handle(T, 1, Msg::Vote(mine)).unwrap();
        assert_eq!(p.handle(T, 1, Msg::Vote(mine)), Err(ProcessError::Unexpected("duplicate vote")));
        // The good path still works: 3 releases, the vote goes to 1.
        p.handle(T, 3, Msg::Release(ts(4, 3))).unwrap();
        assert_eq!(drain(&mut p), vec![(1, Msg::Vote(ts(6, 1)))]);
    }

    /// What the module doc says about memory loss: a voter that restarts empty votes a
    /// second time and two candidates enter.
    #[test]
    fn a_voter_that_loses_its_memory_votes_twice() {
        let mut ps = procs(&MAJORITY, 3);
        let (b, c) = (ts(1, 1), ts(1, 2));
        ps[1].request(T);
        ps[2].request(T);
        for (voter, cand, t) in [(0, 1, b), (1, 1, b), (2, 2, c)] {
            ps[voter].handle(T, cand, Msg::Request(t)).unwrap();
            drain(&mut ps[voter]);
            ps[cand].handle(T, voter, Msg::Vote(t)).unwrap();
        }
        assert!(ps[1].holding());
        ps[0] = Voting::new(&MAJORITY, 0, 3, true, T);
        ps[0].handle(T, 2, Msg::Request(c)).unwrap();
        assert_eq!(drain(&mut ps[0]), vec![(2, Msg::Vote(c))]);
        ps[2].handle(T, 0, Msg::Vote(c)).unwrap();
        assert!(ps[1].holding() && ps[2].holding(), "two in the critical section");
        assert!(ps[0].handle(T, 1, Msg::Release(b)).is_err(), "the forgotten vote's RELEASE");
    }
}
