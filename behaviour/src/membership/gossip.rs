//! What this peer hears of the others: connections, heartbeats relayed by the
//! gossip (each checked against its owner's proof), the joins they vouch for, and
//! this peer's own heartbeat.

use std::time::Duration;

use libp2p::kad::KBucketKey;
use libp2p::PeerId;

// `Membership`'s own methods, kept in a file of their own: the type and its fields
// are the parent module's.
use super::{Beat, Member, Membership, MAX_MEMBERS, MAX_NEW_PER_TABLE, MAX_TAKEOVER_DELAY};
use crate::liveness::{self, Proof, Refused};
use crate::proto::Time;

/// A member's heartbeat as a gossip table carries it (see [`Membership::heard_record`]).
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    /// The member.
    pub peer: PeerId,
    /// Its heartbeat.
    pub beat: Beat,
    /// How long ago it was first observed along the gossip path.
    pub age: Duration,
    /// The member's own takeover delay in ms, as it signed it.
    pub delay_ms: Option<u64>,
    /// The proof that the member made this beat.
    pub proof: Option<&'a Proof>,
}

impl Membership {
    /// `peer` is a live sigma peer: connected, and in the routing table. Idempotent.
    /// A peer of another group ([`Membership::with_groups`]) is not a member here.
    pub fn connected(&mut self, peer: PeerId, now: Time) {
        if !self.members.contains_key(&peer) && !self.may_be_member(&KBucketKey::from(peer)) {
            return;
        }
        if !self.members.contains_key(&peer) && self.members.len() >= MAX_MEMBERS {
            self.forget_one(now);
        }
        let m = self.members.entry(peer).or_insert_with(|| Member::new(peer, now, (0, 0)));
        m.up = true;
        m.left_at = now;
        self.recount(peer, now);
    }

    /// The last connection to `peer` closed. It stays alive while its heartbeat is fresh:
    /// a connection closed as idle (or refused by a limit) looks, from this side, like
    /// one whose peer died, and only the heartbeat tells them apart; a killed peer is
    /// dead here once its last heartbeat is older than the gossip liveness. Idempotent.
    pub fn disconnected(&mut self, peer: PeerId, now: Time) {
        let Some(m) = self.members.get_mut(&peer) else { return };
        m.up = false;
        self.recount(peer, now);
    }

    /// A heartbeat record from the gossip table of `from` (see [`crate::liveness`]),
    /// at wall-clock time `wall_ms`: taken only if it is newer than the one known and
    /// proven (a record of `from` itself may come without a proof: the connection
    /// authenticates it, and a peer from before signed heartbeats sends none; such a
    /// record is not relayed), its peer is on the member list if there is one, and it
    /// does not introduce a member past [`MAX_NEW_PER_TABLE`] (`introduced`: how many
    /// this table introduced so far, counted here). Answers whether the member became
    /// alive, or why the record was refused. `echo` as in [`Membership::heard`].
    pub fn heard_record(
        &mut self,
        record: Record<'_>,
        from: &PeerId,
        now: Time,
        wall_ms: u64,
        echo: Option<u64>,
        introduced: &mut usize,
    ) -> Result<bool, Refused> {
        let Record { peer, beat, age, delay_ms, proof } = record;
        if self.fixed.as_ref().is_some_and(|l| !l.contains(&peer)) {
            return Err(Refused::NotListed);
        }
        let known = self.members.get(&peer);
        if known.is_some_and(|m| beat <= m.beat) {
            // Nothing new: only the echo bookkeeping.
            return Ok(self.heard(peer, beat, age, now, echo));
        }
        if known.is_none() {
            if !self.may_be_member(&KBucketKey::from(peer)) {
                return Err(Refused::OtherGroup);
            }
            if *introduced >= MAX_NEW_PER_TABLE {
                return Err(Refused::TooManyNew);
            }
            *introduced += 1;
        }
        match proof {
            Some(proof) => {
                let last = known.filter(|m| m.beat.0 == beat.0).and_then(|m| m.proof.as_ref().map(|p| (m.beat.1, p)));
                liveness::verify(&peer, beat, delay_ms, proof, last, wall_ms)?;
            }
            None if peer == *from => {
                if !liveness::in_range(beat, wall_ms) {
                    return Err(Refused::OutOfRange);
                }
            }
            None => return Err(Refused::Unproven),
        }
        let woke = self.heard(peer, beat, age, now, echo);
        if let Some(m) = self.members.get_mut(&peer) {
            if m.beat == beat {
                m.proof = proof.cloned();
            }
        }
        if let Some(ms) = delay_ms {
            self.heard_delay(&peer, beat, Duration::from_millis(ms));
        }
        Ok(woke)
    }

    /// A heartbeat of `peer` relayed by gossip, first observed `age` ago (already
    /// checked: [`Membership::heard_record`]). A newer one
    /// than known keeps (or makes) it alive until the gossip liveness window after that
    /// first observation; the first one heard of a peer only records it (it is not
    /// alive before it advances).
    /// Answers whether `peer` became alive. `echo`: the exchange number of the gossip
    /// request that carried the beat ([`Membership::next_exchange`]), if it came in one:
    /// when ours is no newer than the request's, the reply leaves the member out.
    pub(super) fn heard(&mut self, peer: PeerId, beat: Beat, age: Duration, now: Time, echo: Option<u64>) -> bool {
        let at = now.saturating_sub(age);
        match self.members.get_mut(&peer) {
            Some(m) if beat > m.beat && m.left.as_ref().is_none_or(|l| beat.0 > l.incarnation) => {
                // A later incarnation of a member that left is a newcomer.
                m.left = None;
                let restarted = m.beat != (0, 0) && beat.0 > m.beat.0 && m.counts != 0;
                if beat.0 > m.beat.0 {
                    // What it said of a split, it said in an earlier life.
                    m.word = false;
                }
                let first = m.beat == (0, 0) && !m.up && !m.seen;
                let was = m.alive;
                m.beat = beat;
                m.beat_at = at;
                if let Some(x) = echo {
                    m.echoed = x;
                }
                if !first {
                    m.fresh_until = Some(at + self.gossip_liveness);
                }
                if restarted {
                    self.joint_restarted(&peer);
                }
                self.recount(peer, now);
                !was && self.is_alive(&peer)
            }
            Some(m) => {
                if let Some(x) = echo.filter(|_| m.beat == beat) {
                    m.echoed = x;
                }
                false
            }
            None => {
                if self.members.len() < MAX_MEMBERS {
                    // Heard of only: not worth forgetting a member for when full.
                    let mut m = Member::new(peer, now, beat);
                    m.beat_at = at;
                    self.members.insert(peer, m);
                }
                false
            }
        }
    }

    /// Brings `peer`'s alive flag and the counts up to date; a member that was alive
    /// and is not any more departs now. A peer alive for the first time is counted only
    /// while this peer reaches a majority (and is on the list, if there is one).
    pub(super) fn recount(&mut self, peer: PeerId, now: Time) {
        let admits = self.admits(&peer);
        let Some(m) = self.members.get_mut(&peer) else { return };
        let alive = m.alive_at(now);
        if alive == m.alive {
            if alive {
                m.left_at = now;
            }
            return;
        }
        m.alive = alive;
        m.left_at = now;
        let (counted, views) = (m.counted, m.views);
        if alive {
            m.seen = true;
            if let Some(d) = m.delay {
                self.members_delay = self.members_delay.max(d);
            }
            if counted {
                self.up += 1;
                self.joint_reach(views, true);
            } else {
                self.pending += 1;
                if admits {
                    self.admit(&peer);
                }
            }
        } else {
            if counted {
                self.up -= 1;
                self.joint_reach(views, false);
            } else {
                self.pending -= 1;
            }
            if self.departures.len() >= MAX_MEMBERS {
                // Too many to tell apart: every key counts as recently departed.
                self.departures.clear();
                self.overflow_until = Some(now);
            }
            self.departures.push((peer, now));
        }
    }

    /// Whether `peer`, alive and not counted, may be counted now: this peer has joined
    /// and reaches a strict majority of the members it counts (counting one more alive
    /// peer then keeps a majority, where it could make one of a minority), and `peer`
    /// is on the list if there is one.
    pub(super) fn admits(&self, peer: &PeerId) -> bool {
        match &self.fixed {
            Some(list) => list.contains(peer),
            None => self.count_every_newcomer || self.majority(),
        }
    }

    /// Counts newcomer `peer` by this peer's own rule (rule 1: alive here while this
    /// peer has a majority), after recording its joint quorum. Answers false, counting
    /// nothing, when no joint quorum can be recorded now (every slot taken).
    pub(super) fn admit(&mut self, peer: &PeerId) -> bool {
        if self.members.get(peer).is_none_or(|m| m.counted) {
            return true;
        }
        if !self.start_joint(peer) {
            return false;
        }
        self.count(peer);
        true
    }

    /// Counts `peer` toward the majority (it is known here).
    pub(super) fn count(&mut self, peer: &PeerId) {
        let Some(m) = self.members.get_mut(peer) else { return };
        if m.counted || self.fixed.as_ref().is_some_and(|l| !l.contains(peer)) {
            return;
        }
        m.counted = true;
        self.counted += 1;
        if let Some(d) = m.delay {
            self.members_delay = self.members_delay.max(d);
        }
        if m.alive {
            self.pending -= 1;
            self.up += 1;
        }
    }

    /// Whether this joining peer still waits for a serving peer to join through (see
    /// [`Membership::joined_through`]).
    pub fn needs_voucher(&self) -> bool {
        self.joining && !self.vouched
    }

    /// `peer`, which serves (its gossip says so), sent a table naming `members` (the
    /// members alive there, which it counts), of which `pending` are changes not yet
    /// known there to every member (newcomers with a joint quorum pending there, and
    /// `peer` itself if its own join is: [`Membership::joint_newcomers`]). A joining peer
    /// joins through it: it counts `peer` and those members, heard of or alive, so that
    /// its first majority is one of a serving peer's members and not of whoever it
    /// happens to reach; it is ready once a bootstrap has completed too. It takes over
    /// the pending changes as joint quorums of its own, and one for its own join: the
    /// members of `peer`'s view not pending ([`Membership::inherit_joints`]). It keeps
    /// `peer`'s takeover delay (`delay`, [`Membership::members_delay`] there) for one
    /// membership window. A peer not joining ignores it; so does one that could not
    /// record the joint quorums (more pending than [`MAX_JOINTS`](super::MAX_JOINTS), or
    /// every member named pending): it waits for another table. With prefix groups,
    /// it takes `peer`'s `group` ([`Membership::with_groups`]), and ignores a peer of
    /// another group.
    pub fn joined_through(
        &mut self,
        peer: PeerId,
        members: impl IntoIterator<Item = PeerId>,
        pending: &[PeerId],
        delay: Option<Duration>,
        group: Option<crate::wire::Group>,
        now: Time,
    ) {
        if !self.needs_voucher() || !self.may_vouch(&peer, group) {
            return;
        }
        let members: Vec<PeerId> = members.into_iter().collect();
        let tracked = !self.joint_off && self.fixed.is_none();
        if tracked
            && (pending.len() >= super::MAX_JOINTS
                || std::iter::once(&peer).chain(&members).all(|p| pending.contains(p)))
        {
            // Too many changes to record, or no member the view had before them.
            return;
        }
        self.vouched = true;
        self.join_group(group);
        if let Some(d) = delay {
            self.inherited = Some((d.min(MAX_TAKEOVER_DELAY), now + self.window));
        }
        if !self.members.contains_key(&peer) {
            if self.members.len() >= MAX_MEMBERS {
                self.forget_one(now);
            }
            self.members.insert(peer, Member::new(peer, now, (0, 0)));
        }
        self.count(&peer);
        for p in members {
            self.count(&p);
        }
        self.inherit_joints(pending);
        self.join_if_done();
    }

    pub(super) fn join_if_done(&mut self) {
        if self.joining && self.bootstrapped && self.vouched {
            self.joining = false;
        }
    }

    /// Advances this peer's heartbeat; answers its new value.
    pub fn beat(&mut self) -> Beat {
        self.beat.1 += 1;
        self.beat
    }

    /// The heartbeats to gossip, with their ages, their members' own takeover delays,
    /// their proofs and whether this peer counts them: those of the members alive here
    /// whose beat is proven
    /// (this peer's own is [`Membership::own_beat`], age 0). In the reply to gossip
    /// request `reply_to` ([`Membership::next_exchange`]), only those the request did not
    /// already hold as new: the requester ends up with the same table as if it had been
    /// sent ours whole (merging a beat no newer than its own changes nothing), for
    /// about half the beats. Members in `keep` are in the reply all the same: the
    /// changes the requester's joint quorums wait on (its table's `joints`), whose
    /// records say, in this peer's own words, whether it counts them.
    pub fn beats<'a>(
        &'a self,
        now: Time,
        reply_to: Option<u64>,
        keep: &'a [PeerId],
    ) -> impl Iterator<Item = (PeerId, Beat, Duration, Option<Duration>, Option<&'a Proof>, bool)> + 'a {
        self.members
            .iter()
            .filter(move |(p, m)| {
                m.alive
                    && m.beat != (0, 0)
                    && m.proof.is_some()
                    && reply_to.is_none_or(|x| m.echoed != x || keep.contains(p))
            })
            .map(move |(p, m)| (*p, m.beat, now.saturating_sub(m.beat_at), m.delay, m.proof.as_ref(), m.counted))
    }

    /// Numbers a gossip request about to be merged (see [`Membership::heard`]).
    pub fn next_exchange(&mut self) -> u64 {
        self.exchange += 1;
        self.exchange
    }

    /// This peer's heartbeat.
    pub fn own_beat(&self) -> Beat {
        self.beat
    }
}
