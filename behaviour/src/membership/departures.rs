//! How members leave the counts: this peer's own graceful leave, another's signed
//! leave relayed by the gossip, an operator's word that a peer is gone for good, and
//! the oldest departed member forgotten when the table is full.

use libp2p::PeerId;

// `Membership`'s own methods, kept in a file of their own: the type and its fields
// are the parent module's.
use super::{ForgetError, Membership, MAX_MEMBERS};
use crate::liveness::{self, Leave, Refused};
use crate::proto::Time;

impl Membership {
    /// This peer leaves the swarm (a graceful stop): it stops serving at the next
    /// [`Membership::tick`] (whose answer tells the owner to drop its replicas) and
    /// for good; the owner sends its signed leave to the members.
    pub fn leave(&mut self) {
        self.leaving = true;
    }

    /// A member's signed leave, heard at wall-clock time `wall_ms`: the member is
    /// removed from every count at once (members and reachable), and counts as a
    /// departure now (its keys are held one takeover delay where they are taken over:
    /// its votes may still be valid). Answers whether it changed anything; a leave of
    /// a peer not known here, or of an incarnation older than the newest heard, changes
    /// nothing. Safe without agreement: a peer that left serves nowhere, and members
    /// that disagree on who left cannot both reach a majority of what they count (see
    /// docs/design/membership.md).
    pub fn heard_leave(&mut self, leave: &Leave, wall_ms: u64, now: Time) -> Result<bool, Refused> {
        if self.fixed.is_some() {
            // The members are the list: a listed peer that stops is a departed member.
            return Ok(false);
        }
        let Some(m) = self.members.get(&leave.peer) else { return Ok(false) };
        if m.beat.0 > leave.incarnation || m.left.as_ref().is_some_and(|l| l.incarnation >= leave.incarnation) {
            return Ok(false);
        }
        liveness::verify_leave(leave, wall_ms)?;
        self.remove_from_counts(&leave.peer, now);
        if let Some(m) = self.members.get_mut(&leave.peer) {
            m.left = Some(leave.clone());
            m.left_at = now;
        }
        Ok(true)
    }

    /// The leaves to relay: those of members that left and are not yet forgotten.
    pub fn leaves(&self) -> impl Iterator<Item = &Leave> {
        self.members.values().filter_map(|m| m.left.as_ref())
    }

    /// An operator's word that `peer` is gone for good (`sigma admin forget`): it is
    /// removed from every count at once, as a departure now. Refused for a member alive
    /// here (it is not gone) and for one on the fixed member list (the list is the
    /// membership: change the list instead). A forgotten peer heard again is a
    /// newcomer. Unsafe if the peer is in fact alive on the other side of a partition:
    /// the operator vouches that it is not.
    pub fn forget(&mut self, peer: &PeerId, now: Time) -> Result<(), ForgetError> {
        let Some(m) = self.members.get(peer) else { return Err(ForgetError::Unknown) };
        if m.alive {
            return Err(ForgetError::Alive);
        }
        if self.fixed.as_ref().is_some_and(|l| l.contains(peer)) {
            return Err(ForgetError::Listed);
        }
        self.remove_from_counts(peer, now);
        if self.members.remove(peer).is_some() {
            self.forgotten.push(*peer);
        }
        Ok(())
    }

    /// Takes `peer` out of the counts (alive and counted), as a departure now.
    pub(super) fn remove_from_counts(&mut self, peer: &PeerId, now: Time) {
        self.joint_gone(peer);
        let Some(m) = self.members.get_mut(peer) else { return };
        if m.alive {
            m.alive = false;
            if m.counted {
                self.up -= 1;
            } else {
                self.pending -= 1;
            }
        }
        if m.counted {
            m.counted = false;
            self.counted -= 1;
        }
        m.up = false;
        m.fresh_until = None;
        self.members_delay_stale = true;
        if self.departures.len() >= MAX_MEMBERS {
            self.departures.clear();
            self.overflow_until = Some(now);
        }
        self.departures.push((*peer, now));
    }

    pub(super) fn forget_one(&mut self, now: Time) {
        let fixed = &self.fixed;
        let oldest = self
            .members
            .iter()
            .filter(|(p, m)| !m.alive && !fixed.as_ref().is_some_and(|l| l.contains(*p)))
            .min_by_key(|(_, m)| (m.counted, m.left_at));
        if let Some((&peer, _)) = oldest {
            self.joint_gone(&peer);
            self.members_delay_stale = true;
            if self.members.remove(&peer).is_some_and(|m| m.counted) {
                self.counted -= 1;
                self.overflow_until = Some(now);
                self.forgotten.push(peer);
            }
        }
    }
}
