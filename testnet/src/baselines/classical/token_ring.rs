//! Token ring: a single TOKEN travels from each process to its successor `(i + 1) % n`;
//! a process that wants the critical section waits for it, enters, and passes it on
//! when it leaves. Under full contention every hop is an entry (one message per CS);
//! with nobody asking the token still circulates, so messages per entry grow without
//! bound as the load falls.
//!
//! The lecture's fault tolerance, as an option ([`Params::regenerate_after`]): the
//! origin (process 0) regenerates the token when it has not seen it for that long. A
//! regenerated token carries a higher epoch and a process drops tokens of an epoch
//! below the highest it has seen, so a stale token dies at the first process that saw
//! the new one. A process in the CS with a stale token is not told: a regeneration
//! while the old token is alive (a slow holder) puts two processes in the CS, the
//! danger the lecture warns of.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Outbox, Pid, Process, ProcessError};
use sigma_behaviour::proto::Time;

/// Parameters.
#[derive(Clone, Debug, Default)]
pub struct Params {
    /// The origin regenerates the token after not seeing it for this long (`None`: a
    /// lost token is lost for good).
    pub regenerate_after: Option<Duration>,
}

/// The one message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    /// Incremented by each regeneration.
    pub epoch: u64,
}

/// One process of the ring.
#[derive(Debug)]
pub struct TokenRing {
    me: Pid,
    n: usize,
    regenerate_after: Option<Duration>,
    wanting: bool,
    /// Epoch of the token held (in the CS, or for a single process ring, idle).
    token: Option<u64>,
    holding: bool,
    /// Highest epoch seen.
    epoch: u64,
    /// Origin: when the token last passed (or was regenerated).
    last_seen: Time,
    regenerated: u64,
    out: Outbox<Token>,
}

impl TokenRing {
    fn successor(&self) -> Pid {
        (self.me + 1) % self.n
    }

    /// The token arrived (or was created): enter if wanted, else pass it on.
    fn take(&mut self, now: Time, epoch: u64) {
        self.epoch = epoch;
        if self.me == 0 {
            self.last_seen = now;
        }
        if self.wanting {
            self.wanting = false;
            self.holding = true;
            self.out.grant();
            self.token = Some(epoch);
        } else {
            self.pass(epoch);
        }
    }

    fn pass(&mut self, epoch: u64) {
        if self.n == 1 {
            self.token = Some(epoch); // nobody to pass it to: keep it
        } else {
            self.token = None;
            self.out.send(self.successor(), Token { epoch });
        }
    }
}

impl Process for TokenRing {
    type Msg = Token;
    type Params = Params;

    fn new(params: &Params, me: Pid, n: usize, recovering: bool, now: Time) -> Self {
        let mut p = TokenRing {
            me,
            n: n.max(1),
            regenerate_after: params.regenerate_after,
            wanting: false,
            token: None,
            holding: false,
            epoch: 0,
            last_seen: now,
            regenerated: 0,
            out: Outbox::default(),
        };
        if me == 0 && !recovering {
            p.take(now, 0);
        }
        p
    }

    fn request(&mut self, now: Time) {
        if self.wanting || self.holding {
            return;
        }
        self.wanting = true;
        if let Some(epoch) = self.token.take() {
            self.take(now, epoch); // a single-process ring keeps the token
        }
    }

    fn release(&mut self, now: Time) {
        if !self.holding {
            return;
        }
        self.holding = false;
        if self.me == 0 {
            self.last_seen = now; // the timeout counts from when the token left
        }
        let epoch = self.token.take().unwrap_or(self.epoch);
        self.pass(epoch);
    }

    fn handle(&mut self, now: Time, from: Pid, msg: Token) -> Result<(), ProcessError> {
        if from >= self.n {
            return Err(ProcessError::UnknownProcess(from));
        }
        if msg.epoch < self.epoch {
            return Err(ProcessError::Unexpected("token of an old epoch"));
        }
        if self.token.is_some() || self.holding {
            // A second live token of the current epoch cannot exist; drop it.
            return Err(ProcessError::Unexpected("token while holding one"));
        }
        self.take(now, msg.epoch);
        Ok(())
    }

    fn outbox(&mut self) -> &mut Outbox<Token> {
        &mut self.out
    }

    fn holding(&self) -> bool {
        self.holding
    }

    fn voters(&self) -> Vec<Pid> {
        if self.holding {
            vec![self.me]
        } else {
            Vec::new()
        }
    }

    fn poll_timeout(&self) -> Option<Time> {
        match self.regenerate_after {
            Some(after) if self.me == 0 && !self.holding => Some(self.last_seen + after),
            _ => None,
        }
    }

    fn handle_timeout(&mut self, now: Time) {
        if self.poll_timeout().is_some_and(|t| t <= now) {
            self.regenerated += 1;
            self.take(now, self.epoch + 1);
        }
    }

    fn retries(&self) -> u64 {
        self.regenerated
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baselines::classical::harness::{self, procs, T};

    #[test]
    fn exclusive_and_live_on_seeded_interleavings() {
        harness::assert_exclusive_and_live::<TokenRing>(&Params::default(), 5, 4, 0..200);
    }

    #[test]
    fn a_single_process_ring_keeps_its_token() {
        // The holder's own token is the only permission.
        harness::assert_single_process_enters_at_once::<TokenRing>(&Params::default(), &[0]);
    }

    #[test]
    fn the_token_goes_round_and_serves_the_waiter() {
        let mut ring: Vec<TokenRing> = procs(&Params::default(), 3);
        ring[2].request(T);
        assert_eq!(ring[0].poll_transmit(), Some((1, Token { epoch: 0 })));
        ring[1].handle(T, 0, Token { epoch: 0 }).unwrap();
        assert_eq!(ring[1].poll_transmit(), Some((2, Token { epoch: 0 })));
        ring[2].handle(T, 1, Token { epoch: 0 }).unwrap();
        assert!(ring[2].poll_granted() && ring[2].holding());
        assert_eq!(ring[2].poll_transmit(), None, "held in the CS");
        ring[2].release(T);
        assert_eq!(ring[2].poll_transmit(), Some((0, Token { epoch: 0 })));
    }

    #[test]
    fn origin_regenerates_a_lost_token_and_old_epochs_die() {
        let params = Params { regenerate_after: Some(Duration::from_secs(5)) };
        let mut origin = TokenRing::new(&params, 0, 3, false, T);
        assert_eq!(origin.poll_transmit(), Some((1, Token { epoch: 0 })));
        // The token is lost at process 1 (its memory reset); nothing for 5 s.
        assert_eq!(origin.poll_timeout(), Some(Duration::from_secs(5)));
        origin.handle_timeout(Duration::from_secs(5));
        assert_eq!(origin.poll_transmit(), Some((1, Token { epoch: 1 })));
        assert_eq!(origin.retries(), 1);
        assert_eq!(
            origin.handle(Duration::from_secs(6), 2, Token { epoch: 0 }),
            Err(ProcessError::Unexpected("token of an old epoch"))
        );
        origin.handle(Duration::from_secs(6), 2, Token { epoch: 1 }).unwrap();
        assert_eq!(origin.poll_timeout(), Some(Duration::from_secs(11)));
    }

    #[test]
    fn the_origin_times_out_from_when_the_token_left_it() {
        let params = Params { regenerate_after: Some(Duration::from_secs(5)) };
        let mut origin = TokenRing::new(&params, 0, 2, false, T);
        assert_eq!(origin.poll_transmit(), Some((1, Token { epoch: 0 })));
        origin.request(T);
        origin.handle(Duration::from_secs(1), 1, Token { epoch: 0 }).unwrap();
        assert!(origin.poll_granted());
        assert_eq!(origin.poll_timeout(), None, "no regeneration while in the CS");
        origin.release(Duration::from_secs(20));
        assert_eq!(origin.poll_timeout(), Some(Duration::from_secs(25)));
    }

    #[test]
    fn a_recovering_origin_does_not_mint_a_second_token() {
        let p = TokenRing::new(&Params::default(), 0, 3, true, T);
        assert!(p.token.is_none());
        let mut p = p;
        assert_eq!(p.poll_transmit(), None);
    }
}
