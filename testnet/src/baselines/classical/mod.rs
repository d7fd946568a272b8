//! The classical mutual-exclusion algorithms of the lecture notes ("Logical clocks and
//! mutual exclusion"), as sans-IO baselines: closed systems of `n` processes that all
//! know each other, over reliable FIFO channels.
//!
//! - [`central`]: a central coordinator (process 0) queues and grants requests.
//! - [`lamport`]: Lamport's timestamp algorithm, a replicated priority queue
//!   (REQUEST, REPLY, RELEASE to everyone).
//! - [`ricart_agrawala`]: REPLY deferred until the CS is left, no RELEASE.
//! - [`voting`]: majority voting and Maekawa's grid districts, one vote per process,
//!   with INQUIRE/RELINQUISH to break split votes.
//! - [`token_ring`]: a token circulates along the ring; its holder may enter.
//!
//! Every algorithm is a [`Process`]: one per participant, driven like the Sigma core
//! (`handle`, `poll_transmit`, `poll_timeout`). The local application asks for the
//! critical section with [`Process::request`], learns that it entered from
//! [`Process::poll_granted`] and leaves with [`Process::release`]; a process serves one
//! request of its application at a time. Messages to itself are allowed (a driver
//! delivers them locally). Timestamps are plain Lamport clocks with ties broken by
//! process id, as in the lecture.
//!
//! The output side is common to every algorithm: a process queues its messages and
//! signals its grants in an [`Outbox`], which it exposes through [`Process::outbox`];
//! the trait's provided [`Process::poll_transmit`] and [`Process::poll_granted`] read
//! it, so an algorithm implements only its state machine.
//!
//! Failure model: none. The lecture's algorithms assume that no process crashes and
//! that every message arrives, in order; the simulator measures what happens when a
//! process loses its memory anyway (its own application dies with it).

use std::collections::VecDeque;
use std::fmt::Debug;

use thiserror::Error;

use sigma_behaviour::proto::Time;

pub mod central;
pub mod lamport;
pub mod ricart_agrawala;
pub mod token_ring;
pub mod voting;

/// A process id: `0..n`.
pub type Pid = usize;

/// Every process of `0..n` but `me`, in increasing order.
pub fn others(me: Pid, n: usize) -> impl Iterator<Item = Pid> {
    (0..n).filter(move |&p| p != me)
}

/// What a [`Process`] has for its driver: the messages it sent, oldest first, and
/// whether its outstanding request entered the critical section since the last poll.
#[derive(Debug)]
pub struct Outbox<M> {
    queue: VecDeque<(Pid, M)>,
    granted: bool,
}

impl<M> Default for Outbox<M> {
    fn default() -> Self {
        Outbox { queue: VecDeque::new(), granted: false }
    }
}

impl<M> Outbox<M> {
    /// Queues `msg` for process `to` (possibly the sender itself).
    pub fn send(&mut self, to: Pid, msg: M) {
        self.queue.push_back((to, msg));
    }

    /// Queues a copy of `msg` for each of `targets`, in their order.
    pub fn send_all(&mut self, targets: impl IntoIterator<Item = Pid>, msg: M)
    where
        M: Clone,
    {
        for to in targets {
            self.send(to, msg.clone());
        }
    }

    /// The outstanding request entered the critical section: the next
    /// [`take_granted`](Self::take_granted) says so.
    pub fn grant(&mut self) {
        self.granted = true;
    }

    /// The oldest message not yet taken, with its destination.
    pub fn pop(&mut self) -> Option<(Pid, M)> {
        self.queue.pop_front()
    }

    /// `true` once per [`grant`](Self::grant).
    pub fn take_granted(&mut self) -> bool {
        std::mem::take(&mut self.granted)
    }

    /// No message waiting.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// Why a process rejected a message. Nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ProcessError {
    /// The sender is not one of the `n` processes.
    #[error("unknown process {0}")]
    UnknownProcess(Pid),
    /// A message that makes no sense in the receiver's state (a RELEASE from a process
    /// that does not hold, a vote for a request already finished...).
    #[error("unexpected {0}")]
    Unexpected(&'static str),
}

/// One participant of a closed-system mutual-exclusion algorithm.
pub trait Process: Sized {
    /// Process → process message.
    type Msg: Clone + Debug;
    /// Algorithm parameters (shared by every process).
    type Params: Clone + Debug;

    /// Process `me` of `n`. `recovering`: a restart with empty memory (a token ring's
    /// process 0 does not create a second token, for instance).
    fn new(params: &Self::Params, me: Pid, n: usize, recovering: bool, now: Time) -> Self;
    /// The local application wants the critical section. Ignored while a request is
    /// outstanding or held.
    fn request(&mut self, now: Time);
    /// The local application left the critical section. Ignored when not holding.
    fn release(&mut self, now: Time);
    /// A message from process `from`.
    fn handle(&mut self, now: Time, from: Pid, msg: Self::Msg) -> Result<(), ProcessError>;
    /// The process's outgoing messages and grant flag, read by `poll_transmit` and
    /// `poll_granted`.
    fn outbox(&mut self) -> &mut Outbox<Self::Msg>;
    /// Next outgoing message and its destination.
    fn poll_transmit(&mut self) -> Option<(Pid, Self::Msg)> {
        self.outbox().pop()
    }
    /// `true` once when the outstanding request entered the critical section.
    fn poll_granted(&mut self) -> bool {
        self.outbox().take_granted()
    }
    /// Whether the process is in the critical section.
    fn holding(&self) -> bool;
    /// Processes whose permission the current critical section rests on.
    fn voters(&self) -> Vec<Pid>;
    /// Timers (none by default).
    fn handle_timeout(&mut self, _now: Time) {}
    /// Next timer.
    fn poll_timeout(&self) -> Option<Time> {
        None
    }
    /// Extra messages of this process's requests so far beyond the algorithm's nominal
    /// ones (INQUIRE/RELINQUISH rounds, regenerated tokens), for reports.
    fn retries(&self) -> u64 {
        0
    }
}

/// Test support. `run` is a seeded driver: `n` processes, reliable FIFO
/// channels delivered in random interleavings, each application requesting `rounds`
/// times; it checks exclusion after every step and that every request is served. The
/// `assert_*` checks are the tests every algorithm shares (exclusion and liveness over
/// many seeds, messages per entry, a single process, calls out of turn); the small
/// helpers drive processes by hand.
#[cfg(test)]
pub(crate) mod harness {
    use std::collections::VecDeque;
    use std::ops::Range;
    use std::time::Duration;

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::{Pid, Process, ProcessError, Time};
    use sigma_behaviour::proto::clock::Timestamp;

    /// The time for tests that drive processes by hand (none of them reads it).
    pub const T: Time = Time::ZERO;

    /// The timestamp `(counter, client)`.
    pub fn ts(counter: u64, client: Pid) -> Timestamp<Pid> {
        Timestamp::new(counter, client)
    }

    /// Whether `handle` rejected a message as [`ProcessError::Unexpected`].
    pub fn unexpected(result: Result<(), ProcessError>) -> bool {
        matches!(result, Err(ProcessError::Unexpected(_)))
    }

    /// Processes `0..n` of algorithm `P`, fresh.
    pub fn procs<P: Process>(params: &P::Params, n: usize) -> Vec<P> {
        (0..n).map(|i| P::new(params, i, n, false, T)).collect()
    }

    /// Everything `p` has to send, oldest first.
    pub fn drain<P: Process>(p: &mut P) -> Vec<(Pid, P::Msg)> {
        std::iter::from_fn(|| p.poll_transmit()).collect()
    }

    /// Delivers everything process `from` has to send to its destinations; panics if one
    /// rejects it.
    pub fn deliver<P: Process>(ps: &mut [P], from: Pid) {
        for (to, msg) in drain(&mut ps[from]) {
            if let Err(e) = ps[to].handle(T, from, msg) {
                panic!("process {to} rejected a message from {from}: {e}");
            }
        }
    }

    /// [`run`] under every seed of `seeds`: exclusive, and every request is served.
    pub fn assert_exclusive_and_live<P: Process>(params: &P::Params, n: usize, rounds: usize, seeds: Range<u64>) {
        for seed in seeds {
            let out = run::<P>(params, n, rounds, seed);
            assert_eq!(out.entries, n * rounds, "{params:?} n {n} seed {seed}");
        }
    }

    /// For each `(n, seed)` of `cases`, a [`run`] of `rounds` requests per process costs
    /// exactly `per_entry(n)` network messages per entry.
    pub fn assert_messages_per_entry<P: Process>(
        params: &P::Params,
        rounds: usize,
        cases: &[(usize, u64)],
        per_entry: impl Fn(usize) -> usize,
    ) {
        for &(n, seed) in cases {
            let out = run::<P>(params, n, rounds, seed);
            assert_eq!(out.entries, rounds * n, "n = {n}");
            assert_eq!(out.messages, per_entry(n) * out.entries, "n = {n}");
        }
    }

    /// A system of one process serves its requests without network messages (messages
    /// to itself aside).
    pub fn assert_single_process_needs_no_messages<P: Process>(params: &P::Params) {
        for seed in 0..4 {
            let out = run::<P>(params, 1, 5, seed);
            assert_eq!((out.entries, out.messages), (5, 0), "seed {seed}");
        }
    }

    /// A process alone enters at once on every request, resting on `voters`, and sends
    /// nothing, not even to itself; and [`assert_single_process_needs_no_messages`].
    pub fn assert_single_process_enters_at_once<P: Process>(params: &P::Params, voters: &[Pid]) {
        let mut p = P::new(params, 0, 1, false, T);
        assert!(p.poll_transmit().is_none(), "nothing to send at the start");
        for round in 0..2 {
            p.request(T);
            assert!(p.poll_granted() && p.holding(), "round {round}: entered at once");
            assert_eq!(p.voters(), voters, "round {round}");
            p.release(T);
            assert!(!p.holding(), "round {round}: left");
            assert!(p.poll_transmit().is_none(), "round {round}: nothing sent");
        }
        assert_single_process_needs_no_messages::<P>(params);
    }

    /// Process 0 of `n` (`n` > 1) ignores a release while idle, sends `requests` messages
    /// for a request, then ignores a second request and a release while wanting. Returns
    /// it, still wanting.
    pub fn assert_out_of_turn_calls_are_ignored<P: Process>(params: &P::Params, n: usize, requests: usize) -> P {
        let mut p = P::new(params, 0, n, false, T);
        p.release(T);
        assert!(drain(&mut p).is_empty(), "release ignored while idle");
        p.request(T);
        assert_eq!(drain(&mut p).len(), requests, "the request");
        p.request(T);
        assert!(drain(&mut p).is_empty(), "second request ignored while wanting");
        p.release(T);
        assert!(drain(&mut p).is_empty(), "release ignored while wanting");
        assert!(!p.holding(), "still wanting");
        p
    }

    /// What a run did.
    #[derive(Debug, Default)]
    pub struct Outcome {
        /// Critical sections entered.
        pub entries: usize,
        /// Process → process messages (self-messages excluded).
        pub messages: usize,
        /// Order of entries (process ids).
        pub order: Vec<Pid>,
    }

    /// Runs `n` processes with `rounds` requests each under seed `seed`. Panics (with the
    /// seed) on two processes in the CS at once, a grant without a request, or a request
    /// never served.
    pub fn run<P: Process>(params: &P::Params, n: usize, rounds: usize, seed: u64) -> Outcome {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut now = Duration::ZERO;
        let mut procs: Vec<P> = (0..n).map(|i| P::new(params, i, n, false, now)).collect();
        // channels[from * n + to]: FIFO queue of messages in flight.
        let mut channels: Vec<VecDeque<P::Msg>> = vec![VecDeque::new(); n * n];
        let mut left = vec![rounds; n];
        let mut wanting = vec![false; n];
        let mut in_cs: Option<Pid> = None;
        let mut out = Outcome::default();
        for step in 0..10_000_000u64 {
            now += Duration::from_millis(1);
            // Drain outputs.
            for p in 0..n {
                while let Some((to, msg)) = procs[p].poll_transmit() {
                    assert!(to < n, "seed {seed}: process {p} sent to {to}");
                    if to != p {
                        out.messages += 1;
                    }
                    channels[p * n + to].push_back(msg);
                }
                if procs[p].poll_granted() {
                    assert!(wanting[p], "seed {seed}: process {p} granted without a request");
                    assert!(in_cs.is_none(), "seed {seed}: {p} entered while {in_cs:?} holds (step {step})");
                    assert!(procs[p].holding(), "seed {seed}: {p} granted but not holding");
                    in_cs = Some(p);
                    wanting[p] = false;
                    out.entries += 1;
                    out.order.push(p);
                }
            }
            // Done when every request was served (a token may still circulate).
            if out.entries == n * rounds && in_cs.is_none() {
                return out;
            }
            // Pick an action: a delivery, a new request, a release or a timer.
            let busy: Vec<usize> = (0..n * n).filter(|&c| !channels[c].is_empty()).collect();
            let idle: Vec<Pid> = (0..n).filter(|&p| !wanting[p] && in_cs != Some(p) && left[p] > 0).collect();
            let choice = rng.gen_range(0..4u8);
            if choice == 0 && !idle.is_empty() {
                let p = idle[rng.gen_range(0..idle.len())];
                left[p] -= 1;
                wanting[p] = true;
                procs[p].request(now);
            } else if choice == 1 && in_cs.is_some() {
                let p = in_cs.take().unwrap_or_default();
                procs[p].release(now);
            } else if !busy.is_empty() {
                let c = busy[rng.gen_range(0..busy.len())];
                let msg = channels[c].pop_front().unwrap_or_else(|| unreachable!());
                let (from, to) = (c / n, c % n);
                if let Err(e) = procs[to].handle(now, from, msg) {
                    panic!("seed {seed}: process {to} rejected a message from {from}: {e}");
                }
            } else if let Some(p) = in_cs.take() {
                procs[p].release(now);
            } else if let Some(p) = idle.first().copied() {
                left[p] -= 1;
                wanting[p] = true;
                procs[p].request(now);
            } else {
                // Nothing in flight, nobody in the CS: only timers can move.
                let next = procs.iter().filter_map(Process::poll_timeout).min();
                match next {
                    Some(t) => {
                        now = now.max(t);
                        for p in procs.iter_mut() {
                            if p.poll_timeout().is_some_and(|d| d <= now) {
                                p.handle_timeout(now);
                            }
                        }
                    }
                    None => panic!("seed {seed}: stuck with {:?} still wanting", wanting),
                }
            }
        }
        panic!("seed {seed}: no end after 10M steps ({} entries)", out.entries);
    }
}
