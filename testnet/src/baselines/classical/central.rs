//! The central coordinator (the lecture's "base case"): one process queues requests
//! and grants the critical section to one at a time. REQUEST, GRANT, RELEASE: three
//! messages per entry (none cross the network when the coordinator itself asks).
//!
//! The coordinator is appointed ([`Params::coordinator`]); it is not elected. If it
//! loses its memory the queue and the holder are gone: the holder's RELEASE is then
//! rejected, the next REQUEST is granted at once (two in the CS) and the forgotten
//! waiters wait forever. The lecture's "the coordinator dies... then what?".

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::{Outbox, Pid, Process, ProcessError};
use sigma_behaviour::proto::Time;

/// Parameters.
#[derive(Clone, Debug, Default)]
pub struct Params {
    /// The coordinator's id.
    pub coordinator: Pid,
}

/// Messages.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Msg {
    /// To the coordinator: I want the critical section.
    Request,
    /// From the coordinator: it is yours.
    Grant,
    /// To the coordinator: I left it.
    Release,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Idle,
    Wanting,
    Holding,
}

/// One process; the coordinator's queue lives in the coordinator's.
#[derive(Debug)]
pub struct Central {
    me: Pid,
    n: usize,
    coordinator: Pid,
    state: State,
    /// Coordinator: the process in the critical section.
    busy: Option<Pid>,
    /// Coordinator: waiting processes, first come first served.
    queue: VecDeque<Pid>,
    out: Outbox<Msg>,
}

impl Process for Central {
    type Msg = Msg;
    type Params = Params;

    fn new(params: &Params, me: Pid, n: usize, _recovering: bool, _now: Time) -> Self {
        Central {
            me,
            n,
            coordinator: params.coordinator,
            state: State::Idle,
            busy: None,
            queue: VecDeque::new(),
            out: Outbox::default(),
        }
    }

    fn request(&mut self, _now: Time) {
        if self.state == State::Idle {
            self.state = State::Wanting;
            self.out.send(self.coordinator, Msg::Request);
        }
    }

    fn release(&mut self, _now: Time) {
        if self.state == State::Holding {
            self.state = State::Idle;
            self.out.send(self.coordinator, Msg::Release);
        }
    }

    fn handle(&mut self, _now: Time, from: Pid, msg: Msg) -> Result<(), ProcessError> {
        if from >= self.n {
            return Err(ProcessError::UnknownProcess(from));
        }
        match msg {
            Msg::Grant => {
                if from != self.coordinator || self.state != State::Wanting {
                    return Err(ProcessError::Unexpected("grant without a request"));
                }
                self.state = State::Holding;
                self.out.grant();
            }
            Msg::Request | Msg::Release if self.me != self.coordinator => {
                return Err(ProcessError::Unexpected("coordinator message to another process"));
            }
            Msg::Request => {
                if self.busy == Some(from) || self.queue.contains(&from) {
                    return Err(ProcessError::Unexpected("duplicate request"));
                }
                if self.busy.is_none() {
                    self.busy = Some(from);
                    self.out.send(from, Msg::Grant);
                } else {
                    self.queue.push_back(from);
                }
            }
            Msg::Release => {
                if self.busy != Some(from) {
                    return Err(ProcessError::Unexpected("release from a process that does not hold"));
                }
                self.busy = self.queue.pop_front();
                if let Some(next) = self.busy {
                    self.out.send(next, Msg::Grant);
                }
            }
        }
        Ok(())
    }

    fn outbox(&mut self) -> &mut Outbox<Msg> {
        &mut self.out
    }

    fn holding(&self) -> bool {
        self.state == State::Holding
    }

    fn voters(&self) -> Vec<Pid> {
        if self.holding() {
            vec![self.coordinator]
        } else {
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baselines::classical::harness::{self, T};

    #[test]
    fn exclusive_and_live_on_seeded_interleavings() {
        harness::assert_exclusive_and_live::<Central>(&Params::default(), 5, 4, 0..200);
    }

    #[test]
    fn three_messages_per_entry_away_from_the_coordinator() {
        let out = harness::run::<Central>(&Params { coordinator: 0 }, 4, 10, 7);
        // Processes 1..4 cost 3 messages per entry, the coordinator's own entries none.
        let remote = out.order.iter().filter(|p| **p != 0).count();
        assert_eq!(out.messages, 3 * remote);
        // Alone, the coordinator asks itself: nothing crosses the network.
        harness::assert_single_process_needs_no_messages::<Central>(&Params::default());
    }

    #[test]
    fn grants_in_arrival_order() {
        let mut c = Central::new(&Params::default(), 0, 3, false, T);
        for p in [2, 1] {
            c.handle(T, p, Msg::Request).unwrap();
        }
        c.request(T);
        assert_eq!(c.poll_transmit(), Some((2, Msg::Grant)));
        assert_eq!(c.poll_transmit(), Some((0, Msg::Request)), "own request goes through the queue too");
        c.handle(T, 0, Msg::Request).unwrap();
        c.handle(T, 2, Msg::Release).unwrap();
        assert_eq!(c.poll_transmit(), Some((1, Msg::Grant)));
        c.handle(T, 1, Msg::Release).unwrap();
        assert_eq!(c.poll_transmit(), Some((0, Msg::Grant)));
        c.handle(T, 0, Msg::Grant).unwrap();
        assert!(c.poll_granted() && c.holding());
    }

    #[test]
    fn bogus_messages_are_rejected_and_change_nothing() {
        let mut c = Central::new(&Params::default(), 0, 3, false, T);
        c.handle(T, 1, Msg::Request).unwrap();
        assert_eq!(c.poll_transmit(), Some((1, Msg::Grant)));
        assert!(c.handle(T, 2, Msg::Release).is_err(), "release by a non-holder");
        assert!(c.handle(T, 1, Msg::Request).is_err(), "duplicate");
        assert!(c.handle(T, 9, Msg::Request).is_err(), "unknown process");
        assert!(c.handle(T, 1, Msg::Grant).is_err(), "grant without request");
        let mut p = Central::new(&Params::default(), 1, 3, false, T);
        assert!(p.handle(T, 2, Msg::Request).is_err(), "not the coordinator");
        c.handle(T, 2, Msg::Request).unwrap();
        c.handle(T, 1, Msg::Release).unwrap();
        assert_eq!(c.poll_transmit(), Some((2, Msg::Grant)));
    }
}
