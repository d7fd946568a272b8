//! The test-only message delay ([`Config::with_message_delay`]): every protocol message
//! this peer sends (a client's message to a replica, a replica's RESPONSE, the reply to
//! a remote request) is held for a latency drawn from a distribution, each on its own,
//! as the simulator delays its messages, so that a run on real nodes reproduces a
//! simulated setting (the paper's Fig. 7). Messages to and from replicas hosted here are
//! held as well; transport requests are not batched while it is on. Off by default.

use std::collections::BTreeMap;

use libp2p::PeerId;

use super::client::Outgoing;
use super::config::Config;
use super::key::ReplicaKey;
use super::placement::ReplyTo;
use super::Behaviour;
use crate::proto::{Response, Time};
use crate::wire::Reply;

/// Messages held past this many go at once (a bound, not a setting: a test run never
/// holds as many).
const MAX_HELD: usize = 100_000;

/// A message held by the delay.
// Only ever held under the test-only delay: boxing the larger variants buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(super) enum Held {
    /// A local acquisition's message to the host of a replica.
    ToReplica(Outgoing),
    /// A hosted replica's RESPONSE to a client (this peer's or a remote one).
    Response { to: PeerId, key: ReplicaKey, resp: Response<PeerId> },
    /// The reply to a remote peer's request.
    Reply { to: ReplyTo, reply: Reply },
}

/// Held messages by due time (and arrival order among equal times).
#[derive(Debug, Default)]
pub(super) struct DelayQueue {
    held: BTreeMap<(Time, u64), Held>,
    next: u64,
}

impl DelayQueue {
    /// The earliest due time.
    pub(super) fn first(&self) -> Option<Time> {
        self.held.keys().next().map(|(t, _)| *t)
    }
}

impl Behaviour {
    /// Whether messages are held (the test-only delay is on).
    pub(super) fn delaying(&self) -> bool {
        self.config.message_delay.is_some()
    }

    /// Holds `message` for a drawn latency, or sends it now when the delay is off (or
    /// the queue is full).
    pub(super) fn send_or_hold(&mut self, message: Held) {
        match self.config.message_delay {
            Some(latency) if self.delayed.held.len() < MAX_HELD => {
                let due = self.clock.now() + latency.sample(&mut self.rng);
                let seq = self.delayed.next;
                self.delayed.next += 1;
                self.delayed.held.insert((due, seq), message);
                self.wake();
            }
            _ => self.dispatch(message),
        }
    }

    fn dispatch(&mut self, message: Held) {
        match message {
            Held::ToReplica(out) => self.send_to_replica_now(out),
            Held::Response { to, key, resp } => self.notify_now(to, &key, resp),
            Held::Reply { to, reply } => self.respond_now(to, reply),
        }
    }

    /// Sends the held messages that are due.
    pub(super) fn release_held(&mut self, now: Time) {
        while let Some(entry) = self.delayed.held.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let message = entry.remove();
            self.dispatch(message);
        }
    }
}

impl Config {
    /// Test only: holds every protocol message this peer sends for a latency drawn
    /// from `latency` (see the module's doc); `None` (the default) sends at once.
    pub fn with_message_delay(mut self, latency: Option<crate::latency::Latency>) -> Self {
        self.message_delay = latency;
        self
    }
}
