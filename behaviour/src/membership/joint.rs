//! The joint quorum of a newcomer: a peer that counts a newcomer x by its own rule
//! (alive here while it had a majority) also needs a strict majority of the members it
//! counted just before x, V(x), until every other member of V(x) is known, from its own
//! gossip table, to count x (docs/design/membership.md, "Joins before a cut: a joint
//! quorum"). As Raft's joint consensus decides by both the old and the new set: a side
//! that serves on V(x) alone and a side that serves on V(x) and x cannot both have
//! their majorities.
//!
//! Each pending joint quorum has a slot (at most [`MAX_JOINTS`]); a member's part in
//! them is two bit sets of 64 bits: of which views it is a member, and which newcomers
//! it is known to count. So the state is bounded by the members bound, and readiness
//! stays a comparison per slot.

use libp2p::PeerId;

// `Membership`'s own methods, kept in a file of their own: the type and its fields
// are the parent module's.
use super::Membership;

/// Most joint quorums pending at once (one per newcomer counted and not yet counted by
/// all of its view). A newcomer that would need one more is not counted until one
/// ends: it stays alive and uncounted, as a newcomer to a minority does (refused, not
/// coalesced: a joint quorum of another view says nothing about this one's).
pub const MAX_JOINTS: usize = 64;

/// One pending joint quorum: the view this peer counted just before its newcomer.
#[derive(Clone, Debug)]
pub(super) struct Joint {
    /// The newcomer; none for this peer's own join.
    pub(super) peer: Option<PeerId>,
    /// Members of the view still members here, this peer included if it was one (a
    /// member forgotten or left is out of the view as it is out of the members).
    pub(super) size: usize,
    /// Of them, reachable now (alive and counted), this peer included if it is one.
    pub(super) reachable: usize,
    /// Of them, not yet known to count the newcomer (this peer not included): it ends
    /// at zero.
    pub(super) waiting: usize,
}

impl Joint {
    fn holds(&self) -> bool {
        2 * self.reachable > self.size
    }
}

fn bit(slot: usize) -> u64 {
    1 << slot
}

fn slots(mask: u64) -> impl Iterator<Item = usize> {
    (0..MAX_JOINTS).filter(move |i| mask & bit(*i) != 0)
}

impl Membership {
    /// Test-only: the joint quorum off (no view is recorded when a newcomer is
    /// counted), as before the rule. For the model checker to show what it is needed
    /// for; off unless called.
    #[doc(hidden)]
    pub fn without_joint_quorum(mut self) -> Self {
        self.joint_off = true;
        self
    }

    /// Joint quorums pending here (newcomers counted by this peer whose view does not
    /// all count them yet, as far as this peer knows).
    pub fn joints_pending(&self) -> usize {
        self.joints.iter().flatten().count()
    }

    /// The first pending joint quorum this peer does not reach a strict majority of:
    /// (reachable, members of the view), this peer included in both.
    pub(super) fn joint_unmet(&self) -> Option<(usize, usize)> {
        self.joints.iter().flatten().find(|j| !j.holds()).map(|j| (j.reachable, j.size))
    }

    /// Before this peer counts newcomer `peer` by its own rule: records the view it
    /// counts now (its counted members and itself) as the newcomer's joint quorum.
    /// Answers false, and records nothing, when every slot is taken: the newcomer must
    /// not be counted yet. Nothing to record with the quorum off, with a fixed member
    /// list (the view never changes) or with no other member (a view of this peer
    /// alone is always reached).
    pub(super) fn start_joint(&mut self, peer: &PeerId) -> bool {
        if self.joint_off || self.fixed.is_some() || self.counted == 0 {
            return true;
        }
        let joint = Joint { peer: Some(*peer), size: self.counted + 1, reachable: self.up + 1, waiting: self.counted };
        self.place(joint, |p, m| m.counted && p != peer)
    }

    /// Puts `joint` in a free slot, its view the members `in_view`; false if none is free.
    fn place(&mut self, joint: Joint, in_view: impl Fn(&PeerId, &super::Member) -> bool) -> bool {
        let Some(slot) = (0..MAX_JOINTS).find(|i| self.joints.get(*i).is_none_or(Option::is_none)) else {
            return false;
        };
        for (p, m) in self.members.iter_mut() {
            if in_view(p, m) {
                m.views |= bit(slot);
            }
        }
        if slot == self.joints.len() {
            self.joints.push(Some(joint));
        } else {
            self.joints[slot] = Some(joint);
        }
        true
    }

    /// Whether a joint quorum could be recorded now (a slot is free, or none is needed).
    pub(super) fn joint_room(&self) -> bool {
        self.joint_off
            || self.fixed.is_some()
            || self.joints.len() < MAX_JOINTS
            || self.joints.iter().any(Option::is_none)
    }

    /// A counted member in the views `views` became alive (`+1`) or not (`-1`).
    pub(super) fn joint_reach(&mut self, views: u64, alive: bool) {
        for i in slots(views) {
            if let Some(j) = self.joints.get_mut(i).and_then(Option::as_mut) {
                if alive {
                    j.reachable += 1;
                } else {
                    j.reachable = j.reachable.saturating_sub(1);
                }
            }
        }
    }

    /// The newcomers of the joint quorums pending here (none: this peer's own join), as
    /// a gossip table names them for a peer that joins through this one.
    pub fn joint_newcomers(&self) -> impl Iterator<Item = Option<&PeerId>> {
        self.joints.iter().flatten().map(|j| j.peer.as_ref())
    }

    /// A joining peer takes its voucher's view as its own (without the rule of its own
    /// counts): that view may hold changes not yet known to every member (`pending`,
    /// the voucher's own join among them), and this peer's join is one more. Each
    /// becomes a joint quorum here, of the view's members that are not pending: this
    /// peer serves only while it also reaches a strict majority of them, until each is
    /// known, from its own table, to count the change.
    pub(super) fn inherit_joints(&mut self, pending: &[PeerId]) {
        if self.joint_off || self.fixed.is_some() {
            return;
        }
        let in_view = |p: &PeerId, m: &super::Member| m.counted && !pending.contains(p);
        let size = self.members.iter().filter(|(p, m)| in_view(p, m)).count();
        if size == 0 {
            return;
        }
        let reachable = self.members.iter().filter(|(p, m)| in_view(p, m) && m.alive).count();
        let changes: Vec<Option<PeerId>> =
            std::iter::once(None).chain(pending.iter().filter(|p| self.is_counted(p)).map(|p| Some(*p))).collect();
        for peer in changes {
            if !self.place(Joint { peer, size, reachable, waiting: size }, in_view) {
                return;
            }
        }
    }

    /// `from`'s own gossip table (it came over `from`'s connection: not relayed) lists
    /// `counted` as members `from` counts, and this peer too if `counts_this_peer`:
    /// `from` leaves the joint quorum of each of them here, and a joint quorum ends once
    /// every other member of its view has. Only the sender's word about itself is
    /// taken: a table says nothing of what another peer counts.
    pub fn counted_by(&mut self, from: &PeerId, counted: impl IntoIterator<Item = PeerId>, counts_this_peer: bool) {
        let Some(m) = self.members.get(from) else { return };
        let mut open = m.views & !m.counts;
        if open == 0 {
            return;
        }
        let mut matched = 0;
        if counts_this_peer {
            matched |= self.slot_of(open, None);
        }
        for x in counted {
            if open & !matched == 0 {
                break;
            }
            matched |= self.slot_of(open & !matched, Some(&x));
        }
        open &= matched;
        if let Some(m) = self.members.get_mut(from) {
            m.counts |= open;
        }
        let mut done = Vec::new();
        for i in slots(open) {
            if let Some(j) = self.joints[i].as_mut() {
                j.waiting = j.waiting.saturating_sub(1);
                if j.waiting == 0 {
                    done.push(i);
                }
            }
        }
        for i in done {
            self.end_joint(i);
        }
    }

    /// The bit of the slot among `mask` whose newcomer is `peer` (none: this peer), or 0.
    fn slot_of(&self, mask: u64, peer: Option<&PeerId>) -> u64 {
        slots(mask).find(|i| self.joints[*i].as_ref().is_some_and(|j| j.peer.as_ref() == peer)).map_or(0, bit)
    }

    /// The alive members whose own table a joint quorum pending here still waits for
    /// (in its view, not yet known to count its change): gossip with them ends it.
    pub fn awaited(&self) -> impl Iterator<Item = &PeerId> {
        self.members.iter().filter(|(_, m)| m.alive && m.views & !m.counts != 0).map(|(p, _)| p)
    }

    /// Whether a table of `from` listing `peer` (none: this peer) as counted would
    /// change anything here (`from` is in the view of `peer`'s pending joint quorum and
    /// not yet known to count it).
    pub fn awaits(&self, from: &PeerId, peer: Option<&PeerId>) -> bool {
        let Some(m) = self.members.get(from) else { return false };
        self.slot_of(m.views & !m.counts, peer) != 0
    }

    /// `peer` restarted (a later incarnation): what it counted is not known any more.
    pub(super) fn joint_restarted(&mut self, peer: &PeerId) {
        let Some(m) = self.members.get_mut(peer) else { return };
        let known = m.views & m.counts;
        m.counts = 0;
        for i in slots(known) {
            if let Some(j) = self.joints.get_mut(i).and_then(Option::as_mut) {
                j.waiting += 1;
            }
        }
    }

    /// `peer` is no longer a member here (forgotten, left, forgotten by the operator;
    /// call while its entry is still there, before its counts change): it leaves every
    /// view it was in, and the joint quorum of which it is the newcomer ends.
    pub(super) fn joint_gone(&mut self, peer: &PeerId) {
        let Some(m) = self.members.get_mut(peer) else { return };
        let (views, counts, reached) = (m.views, m.counts, m.counted && m.alive);
        m.views = 0;
        m.counts = 0;
        let mut done = Vec::new();
        for i in slots(views) {
            if let Some(j) = self.joints.get_mut(i).and_then(Option::as_mut) {
                j.size = j.size.saturating_sub(1);
                if reached {
                    j.reachable = j.reachable.saturating_sub(1);
                }
                if counts & bit(i) == 0 {
                    j.waiting = j.waiting.saturating_sub(1);
                }
                if j.waiting == 0 {
                    done.push(i);
                }
            }
        }
        done.extend((0..self.joints.len()).filter(|i| self.joints[*i].as_ref().is_some_and(|j| j.peer == Some(*peer))));
        for i in done {
            self.end_joint(i);
        }
    }

    fn end_joint(&mut self, slot: usize) {
        if self.joints.get_mut(slot).and_then(Option::take).is_none() {
            return;
        }
        for m in self.members.values_mut() {
            m.views &= !bit(slot);
            m.counts &= !bit(slot);
        }
        while self.joints.last().is_some_and(Option::is_none) {
            self.joints.pop();
        }
    }
}
