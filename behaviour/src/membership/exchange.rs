//! The gossip table as the membership writes and reads it: [`Membership::table`] builds
//! this peer's, [`Membership::merge`] takes another's. Sans-IO like the rest of the
//! module: the behaviour sends and receives the tables (`behaviour/members.rs`), and the
//! membership simulator (`sigma-testnet sim membership`) drives the same two functions
//! in virtual time.

use std::time::Duration;

use libp2p::PeerId;

// `Membership`'s own methods, kept in a file of their own: the type and its fields
// are the parent module's.
use super::{Beat, Membership, Record};
use crate::liveness::{Proof, Refused};
use crate::proto::Time;
use crate::wire;

/// How a table arrived: how long it may have been on its way (added to every age in
/// it), and, for a request, its exchange number ([`Membership::next_exchange`]).
#[derive(Clone, Copy, Debug)]
pub struct Arrival {
    /// A reply: its request's round trip; a request: the connection's last ping round
    /// trip (its transit is not known to its receiver).
    pub transit: Duration,
    /// The request's exchange number; none for a reply.
    pub echo: Option<u64>,
}

/// What merging a table changed, for the owner to act on and count.
#[derive(Debug, Default)]
pub struct Merged {
    /// Members that became alive here (they take over the keys they are closer to).
    pub woke: Vec<PeerId>,
    /// Members whose signed leave was taken.
    pub left: Vec<PeerId>,
    /// Records refused, and why (one entry per record).
    pub refused: Vec<Refused>,
    /// This peer joined the swarm through the sender ([`Membership::joined_through`]).
    pub joined: bool,
}

impl Membership {
    /// This peer's gossip table: its own heartbeat (`own_proof` proves it, age 0) and
    /// those of the members alive here ([`Membership::beats`]; in the reply to gossip
    /// request `reply_to`, only those newer than the request's and those of `keep`, the
    /// request's `joints`), the signed leaves it relays, whether it serves, the pending
    /// changes of its view and its takeover delay.
    pub fn table(
        &self,
        local: PeerId,
        own_proof: Option<Proof>,
        now: Time,
        reply_to: Option<u64>,
        keep: &[PeerId],
    ) -> wire::Gossip {
        self.written(local, own_proof, self.beats(now, reply_to, keep), true)
    }

    /// A table of this peer's own beat and the records `others` ([`Membership::beats`]),
    /// with the signed leaves it relays if `leaves`.
    fn written<'a>(
        &self,
        local: PeerId,
        own_proof: Option<Proof>,
        others: impl Iterator<Item = (PeerId, Beat, Duration, Option<Duration>, Option<&'a Proof>, bool)>,
        leaves: bool,
    ) -> wire::Gossip {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let (incarnation, counter) = self.own_beat();
        let own = wire::Beat {
            peer: local,
            incarnation,
            counter,
            age_ms: 0,
            delay_ms: Some(ms(self.own_delay())),
            proof: own_proof,
            counted: false,
        };
        let others = others.map(|(peer, (incarnation, counter), age, delay, proof, counted)| wire::Beat {
            peer,
            incarnation,
            counter,
            age_ms: u32::try_from(age.as_millis()).unwrap_or(u32::MAX),
            delay_ms: delay.map(ms),
            proof: proof.cloned(),
            counted,
        });
        let leaves = if leaves { self.leaves().take(wire::MAX_GOSSIP_LEAVES).cloned().collect() } else { Vec::new() };
        wire::Gossip {
            beats: std::iter::once(own).chain(others).take(wire::MAX_GOSSIP_BEATS).collect(),
            serving: self.serving(),
            joints: self.joint_newcomers().map(|p| p.copied().unwrap_or(local)).collect(),
            delay_ms: Some(ms(self.members_delay())),
            leaves,
            group: self.group(),
            acks: false,
        }
    }

    /// This peer's reply to gossip `request`, merged as exchange `exchange`: the table
    /// without what the request held as new, but with the changes the request's joint
    /// quorums wait on ([`Membership::table`]). Whole to a peer that does not serve: a
    /// joining peer counts the members a serving peer's table names
    /// ([`Membership::joined_through`]), and must not miss those it already held.
    pub fn reply(
        &self,
        local: PeerId,
        own_proof: Option<Proof>,
        now: Time,
        request: &wire::Gossip,
        exchange: u64,
    ) -> wire::Gossip {
        if !request.serving {
            return self.table(local, own_proof, now, None, &[]);
        }
        let keep = &request.joints[..request.joints.len().min(super::MAX_JOINTS)];
        if request.acks {
            let kept = self.beats(now, Some(exchange), keep).filter(|(p, ..)| keep.contains(p));
            return self.written(local, own_proof, kept, false);
        }
        self.table(local, own_proof, now, Some(exchange), keep)
    }

    /// A request for acknowledgements only ([`wire::Gossip::acks`]), for a member a
    /// joint quorum pending here waits on ([`Membership::awaited`]): this peer's own
    /// beat and the changes pending here, without the other members' records. The
    /// member's reply says, in its own words, which of them it counts; it costs a few
    /// hundred bytes where a round's table costs one record per member.
    pub fn ack_request(&self, local: PeerId, own_proof: Option<Proof>) -> wire::Gossip {
        wire::Gossip { acks: true, ..self.written(local, own_proof, std::iter::empty(), false) }
    }

    /// Merges `from`'s table (already checked within its bounds, [`wire::Gossip::is_valid`]),
    /// at `now` and wall-clock time `wall_ms`: every heartbeat ([`Membership::heard_record`],
    /// each age plus the arrival's transit), every leave ([`Membership::heard_leave`]),
    /// what `from` counts in its own words ([`Membership::counted_by`]: the table came
    /// over `from`'s own connection), and, for a joining peer, its join through `from`
    /// if `from` serves ([`Membership::joined_through`]). A request's reply is then
    /// [`Membership::reply`] with the arrival's exchange number. The owner calls
    /// [`Membership::tick`] after it.
    pub fn merge(
        &mut self,
        local: &PeerId,
        from: PeerId,
        gossip: &wire::Gossip,
        Arrival { transit, echo }: Arrival,
        now: Time,
        wall_ms: u64,
    ) -> Merged {
        let mut merged = Merged::default();
        let mut introduced = 0;
        for b in gossip.beats.iter().filter(|b| b.peer != *local) {
            let record = Record {
                peer: b.peer,
                beat: (b.incarnation, b.counter),
                age: Duration::from_millis(u64::from(b.age_ms)) + transit,
                delay_ms: b.delay_ms,
                proof: b.proof.as_ref(),
            };
            match self.heard_record(record, &from, now, wall_ms, echo, &mut introduced) {
                Ok(true) => merged.woke.push(b.peer),
                Ok(false) => {}
                Err(why) => merged.refused.push(why),
            }
        }
        for leave in &gossip.leaves {
            match self.heard_leave(leave, wall_ms, now) {
                Ok(true) => merged.left.push(leave.peer),
                Ok(false) => {}
                Err(why) => merged.refused.push(why),
            }
        }
        let me = gossip.beats.iter().any(|b| b.counted && b.peer == *local);
        let counted = gossip.beats.iter().filter(|b| b.counted && b.peer != from && b.peer != *local).map(|b| b.peer);
        self.counted_by(&from, counted, me);
        self.heard_group(&from, gossip.group);
        if gossip.serving && self.needs_voucher() {
            let was_ready = self.ready();
            let named = gossip.beats.iter().map(|b| b.peer).filter(|p| p != local);
            let delay = gossip.delay_ms.map(Duration::from_millis);
            self.joined_through(from, named, &gossip.joints, delay, gossip.group, now);
            merged.joined = !was_ready && self.ready();
        }
        merged
    }
}
