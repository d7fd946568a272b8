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
//! Failure model: none. The lecture's algorithms assume that no process crashes and
//! that every message arrives, in order; the simulator measures what happens when a
//! process loses its memory anyway (its own application dies with it).

use std::fmt::Debug;

use thiserror::Error;

use super::Time;

pub mod central;
pub mod lamport;
pub mod ricart_agrawala;
pub mod token_ring;
pub mod voting;

/// A process id: `0..n`.
pub type Pid = usize;

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
    /// Next outgoing message and its destination.
    fn poll_transmit(&mut self) -> Option<(Pid, Self::Msg)>;
    /// `true` once when the outstanding request entered the critical section.
    fn poll_granted(&mut self) -> bool;
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

/// A seeded driver for tests: `n` processes, reliable FIFO channels delivered in random
/// interleavings, each application requesting `rounds` times. Checks exclusion after
/// every step and that every request is served.
#[cfg(test)]
pub(crate) mod harness {
    use std::collections::VecDeque;
    use std::time::Duration;

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::{Pid, Process};

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
