//! Lamport's timestamp algorithm: every process keeps a copy of one global priority
//! queue of requests, ordered by Lamport timestamp (ties broken by process id). A
//! process that wants the critical section stamps a request, queues it and sends
//! REQUEST to every other process; each receiver queues it and answers REPLY. The
//! requester enters once its own request heads its own queue and a REPLY came back from
//! every other process. On exit it unqueues its request and sends RELEASE to every
//! other process; each receiver unqueues that request and "peeks" at its queue.
//! REQUEST, REPLY, RELEASE: `3 (n - 1)` messages per entry, none for `n = 1`.
//!
//! Where the notes are silent: nothing is sent to oneself (one's own request is queued
//! locally); clocks are pure Lamport counters (a request is stamped `last + 1`, every
//! received message's counter is observed first), so a request stamped after seeing
//! another is ordered after it. Every message names the request it is about: REPLY
//! carries the request's timestamp (and the replier's counter), RELEASE the released
//! one. That makes the "all replies" condition exact (over FIFO channels a process
//! that requested earlier sent its REQUEST before its REPLY, so an earlier request is
//! always queued by the time the last REPLY arrives) and lets bogus input be refused:
//! a message from an unknown process or from oneself, a REQUEST whose timestamp is not
//! the sender's or from a process that already has one queued (a process has at most
//! one outstanding), a REPLY to anything but the outstanding request or a second one
//! from the same process, a RELEASE of a request that is not queued.
//!
//! Memory loss (not in the lecture's failure model; `recovering` is ignored): a reset
//! process starts with an empty queue and a counter at zero. Its next request is then
//! at the head of its own queue, so once everyone replied (they always do) it enters
//! even while a request it forgot is in the critical section: two in the CS. If it
//! held or wanted the CS when it lost its memory, its old request stays queued
//! everywhere and is never released (and its new REQUEST is refused as a second one),
//! so every process blocks behind it; REPLYs it owed when it reset are never sent and
//! their requesters wait forever.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{others, Outbox, Pid, Process, ProcessError};
use sigma_behaviour::proto::clock::{LamportClock, Timestamp};
use sigma_behaviour::proto::Time;

/// Parameters (none).
#[derive(Clone, Debug, Default)]
pub struct Params;

/// Messages.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Msg {
    /// To every other process: queue my request, stamped `ts`.
    Request {
        /// The request's timestamp (its identity); `ts.client` is the sender.
        ts: Timestamp<Pid>,
    },
    /// To the requester: your request `ts` is in my queue.
    Reply {
        /// The request answered.
        ts: Timestamp<Pid>,
        /// The replier's Lamport counter.
        counter: u64,
    },
    /// To every other process: I left the critical section, unqueue my request `ts`.
    Release {
        /// The request released.
        ts: Timestamp<Pid>,
    },
}

/// One process, with its copy of the queue.
#[derive(Debug)]
pub struct Lamport {
    me: Pid,
    n: usize,
    clock: LamportClock,
    /// Every request known and not yet released, own included, earliest first.
    queue: BTreeSet<Timestamp<Pid>>,
    /// The own request, outstanding or in the critical section.
    own: Option<Timestamp<Pid>>,
    /// Processes that replied to the own request.
    replies: BTreeSet<Pid>,
    holding: bool,
    out: Outbox<Msg>,
}

impl Lamport {
    /// Sends `msg` to every other process.
    fn broadcast(&mut self, msg: Msg) {
        self.out.send_all(others(self.me, self.n), msg);
    }

    /// Enters if the own request heads the queue and every other process replied.
    fn peek(&mut self) {
        if let Some(ts) = self.own {
            if !self.holding && self.replies.len() + 1 >= self.n && self.queue.first() == Some(&ts) {
                self.holding = true;
                self.out.grant();
            }
        }
    }
}

impl Process for Lamport {
    type Msg = Msg;
    type Params = Params;

    fn new(_params: &Params, me: Pid, n: usize, _recovering: bool, _now: Time) -> Self {
        Lamport {
            me,
            n: n.max(1),
            clock: LamportClock::new(),
            queue: BTreeSet::new(),
            own: None,
            replies: BTreeSet::new(),
            holding: false,
            out: Outbox::default(),
        }
    }

    fn request(&mut self, _now: Time) {
        if self.own.is_some() {
            return; // wanting or holding
        }
        let ts = self.clock.stamp(Duration::ZERO, self.me);
        self.own = Some(ts);
        self.replies.clear();
        self.queue.insert(ts);
        self.broadcast(Msg::Request { ts });
        self.peek(); // a single process enters at once
    }

    fn release(&mut self, _now: Time) {
        if !self.holding {
            return;
        }
        self.holding = false;
        self.replies.clear();
        if let Some(ts) = self.own.take() {
            self.queue.remove(&ts);
            self.broadcast(Msg::Release { ts });
        }
    }

    fn handle(&mut self, _now: Time, from: Pid, msg: Msg) -> Result<(), ProcessError> {
        if from >= self.n {
            return Err(ProcessError::UnknownProcess(from));
        }
        if from == self.me {
            return Err(ProcessError::Unexpected("message from itself"));
        }
        match msg {
            Msg::Request { ts } => {
                if ts.client != from {
                    return Err(ProcessError::Unexpected("request stamped by another process"));
                }
                if self.queue.iter().any(|q| q.client == from) {
                    return Err(ProcessError::Unexpected("request from a process already queued"));
                }
                self.clock.observe(ts.counter);
                self.queue.insert(ts);
                self.out.send(from, Msg::Reply { ts, counter: self.clock.current() });
            }
            Msg::Reply { ts, counter } => {
                if self.own != Some(ts) || self.holding {
                    return Err(ProcessError::Unexpected("reply to no outstanding request"));
                }
                if self.replies.contains(&from) {
                    return Err(ProcessError::Unexpected("duplicate reply"));
                }
                self.clock.observe(counter);
                self.replies.insert(from);
                self.peek();
            }
            Msg::Release { ts } => {
                if ts.client != from || !self.queue.contains(&ts) {
                    return Err(ProcessError::Unexpected("release of a request not queued"));
                }
                self.clock.observe(ts.counter);
                self.queue.remove(&ts);
                self.peek();
            }
        }
        Ok(())
    }

    fn outbox(&mut self) -> &mut Outbox<Msg> {
        &mut self.out
    }

    fn holding(&self) -> bool {
        self.holding
    }

    fn voters(&self) -> Vec<Pid> {
        if self.holding {
            others(self.me, self.n).collect()
        } else {
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baselines::classical::harness::{self, deliver, drain, procs, ts, unexpected, T};

    #[test]
    fn exclusive_and_live_on_seeded_interleavings() {
        harness::assert_exclusive_and_live::<Lamport>(&Params, 5, 4, 0..200);
    }

    #[test]
    fn three_n_minus_one_messages_per_entry() {
        harness::assert_messages_per_entry::<Lamport>(&Params, 6, &[(2, 1), (3, 2), (5, 3), (7, 4)], |n| 3 * (n - 1));
    }

    #[test]
    fn a_single_process_enters_at_once_without_messages() {
        harness::assert_single_process_enters_at_once::<Lamport>(&Params, &[]);
    }

    #[test]
    fn enters_after_all_replies_and_the_earlier_release() {
        let mut a = Lamport::new(&Params, 0, 3, false, T);
        let mut b = Lamport::new(&Params, 1, 3, false, T);
        b.request(T);
        assert_eq!(drain(&mut b), vec![(0, Msg::Request { ts: ts(1, 1) }), (2, Msg::Request { ts: ts(1, 1) })]);
        a.handle(T, 1, Msg::Request { ts: ts(1, 1) }).unwrap();
        assert_eq!(drain(&mut a), vec![(1, Msg::Reply { ts: ts(1, 1), counter: 1 })]);
        // The clock moved past b's request: a's request is ordered after it.
        a.request(T);
        assert_eq!(drain(&mut a), vec![(1, Msg::Request { ts: ts(2, 0) }), (2, Msg::Request { ts: ts(2, 0) })]);
        a.handle(T, 1, Msg::Reply { ts: ts(2, 0), counter: 2 }).unwrap();
        a.handle(T, 2, Msg::Reply { ts: ts(2, 0), counter: 2 }).unwrap();
        assert!(!a.poll_granted(), "all replies in, but b's request heads the queue");
        b.handle(T, 0, Msg::Reply { ts: ts(1, 1), counter: 1 }).unwrap();
        assert!(!b.poll_granted(), "process 2 has not replied");
        b.handle(T, 0, Msg::Request { ts: ts(2, 0) }).unwrap();
        b.handle(T, 2, Msg::Reply { ts: ts(1, 1), counter: 1 }).unwrap();
        assert!(b.poll_granted() && b.holding());
        assert_eq!(b.voters(), vec![0, 2]);
        drain(&mut b);
        b.release(T);
        assert_eq!(drain(&mut b), vec![(0, Msg::Release { ts: ts(1, 1) }), (2, Msg::Release { ts: ts(1, 1) })]);
        assert!(b.voters().is_empty());
        a.handle(T, 1, Msg::Release { ts: ts(1, 1) }).unwrap();
        assert!(a.poll_granted() && a.holding());
    }

    #[test]
    fn request_and_release_are_ignored_out_of_turn() {
        harness::assert_out_of_turn_calls_are_ignored::<Lamport>(&Params, 2, 1);
    }

    #[test]
    fn a_reset_forgets_the_queue_and_can_put_two_in_the_cs() {
        // As documented: outside the failure model, shown here so the claim is checked.
        let mut ps: Vec<Lamport> = procs(&Params, 3);
        ps[1].request(T); // (1, 1)
        deliver(&mut ps, 1); // REQUEST to 0 and 2
        deliver(&mut ps, 0); // their REPLYs to 1
        deliver(&mut ps, 2);
        assert!(ps[1].poll_granted(), "w is in the CS");
        ps[0] = Lamport::new(&Params, 0, 3, true, T); // memory lost: w's request forgotten
        ps[0].request(T);
        deliver(&mut ps, 0);
        deliver(&mut ps, 1); // REPLYs to 0
        deliver(&mut ps, 2);
        assert!(ps[0].holding() && ps[1].holding());
    }

    #[test]
    fn bogus_messages_are_rejected_and_change_nothing() {
        let mut p = Lamport::new(&Params, 0, 3, false, T);
        assert_eq!(p.handle(T, 3, Msg::Request { ts: ts(1, 3) }), Err(ProcessError::UnknownProcess(3)));
        assert!(unexpected(p.handle(T, 0, Msg::Request { ts: ts(1, 0) })), "from itself");
        assert!(unexpected(p.handle(T, 1, Msg::Request { ts: ts(1, 2) })), "stamped by another");
        assert!(unexpected(p.handle(T, 1, Msg::Reply { ts: ts(1, 0), counter: 9 })), "not waiting");
        assert!(unexpected(p.handle(T, 1, Msg::Release { ts: ts(1, 1) })), "not queued");
        assert_eq!(p.clock.current(), 0);
        assert!(p.queue.is_empty() && p.out.is_empty());

        p.handle(T, 1, Msg::Request { ts: ts(5, 1) }).unwrap();
        drain(&mut p);
        assert!(unexpected(p.handle(T, 1, Msg::Request { ts: ts(5, 1) })), "duplicate");
        assert!(unexpected(p.handle(T, 1, Msg::Request { ts: ts(7, 1) })), "second outstanding");
        assert!(unexpected(p.handle(T, 2, Msg::Release { ts: ts(5, 1) })), "released by another");
        assert!(unexpected(p.handle(T, 1, Msg::Release { ts: ts(4, 1) })), "other request");
        assert_eq!(p.queue.len(), 1);
        assert_eq!(p.clock.current(), 5);

        p.request(T);
        drain(&mut p);
        let own = ts(6, 0);
        assert!(unexpected(p.handle(T, 1, Msg::Reply { ts: ts(5, 0), counter: 9 })), "stale request");
        p.handle(T, 1, Msg::Reply { ts: own, counter: 6 }).unwrap();
        assert!(unexpected(p.handle(T, 1, Msg::Reply { ts: own, counter: 6 })), "duplicate reply");
        assert_eq!(p.replies.len(), 1);
        p.handle(T, 1, Msg::Release { ts: ts(5, 1) }).unwrap();
        p.handle(T, 2, Msg::Reply { ts: own, counter: 6 }).unwrap();
        assert!(p.poll_granted());
        assert!(unexpected(p.handle(T, 2, Msg::Reply { ts: own, counter: 6 })), "while holding");
        assert!(p.out.is_empty());
    }
}
