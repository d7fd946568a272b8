//! Prefix groups (docs/design/membership-at-scale.md): the membership of the peers
//! whose Kademlia keys share this peer's first `depth` bits, and the split of a group
//! into its two halves.
//!
//! A group is a swarm of its own: every rule of the module doc holds within it, and a
//! key is hosted only in its own group. Groups come from splits: the swarm starts as
//! one group (depth 0, exactly the swarm without groups), and a serving peer that
//! counts at least `split_at` members in each half decides the split
//! ([`Membership::with_groups`]). The split rule, while the split to `depth` is pending
//! at this peer (it decided it, or a member told it in its own table):
//!
//! - the members stay the parent group's (the first `depth - 1` bits), and today's rule
//!   holds over them: a strict majority of the counted members and of every pending
//!   joint quorum;
//! - and this peer also needs a strict majority of the counted members of its own half
//!   (itself included), and hosts only its half's keys;
//! - the split ends here once every member it counts has said, in its own table, that
//!   it knows of the split; the other half's members then leave this peer's
//!   membership, and its half is its group.
//!
//! A joining peer takes its voucher's group, and serves nothing while the joint quorum
//! of its own join is pending (until every member of its voucher's view is known to
//! count it, each member then also waits for its word on a split).
//! `behaviour/tests/group_split_model.rs` checks this rule, abstractly (its
//! `Mend::JoinerWaits`): without it, a newcomer that joins through a member that does
//! not know of the split yet can serve a key that a member of the half serves across a
//! cut; and a word taken only from a member with no joint quorum pending (its
//! `Mend::SettledWord`) is not enough once a voucher leaves or restarts.

use libp2p::kad::KBucketKey;
use libp2p::PeerId;

// `Membership`'s own methods, kept in a file of their own: the type and its fields
// are the parent module's.
use super::Membership;
use crate::wire;

/// Deepest group: 2^16 groups, far more than a swarm of ten thousand needs.
pub const MAX_DEPTH: u8 = 16;

/// This peer's prefix group (see the module doc).
#[derive(Clone, Debug)]
pub(super) struct Groups {
    /// This peer's Kademlia key.
    key: KBucketKey<PeerId>,
    /// Bits of the group's prefix.
    depth: u8,
    /// The split to `depth` is pending here: the members are the parent's.
    splitting: bool,
    /// Least members (this peer included) each half of its view must count for this
    /// peer to decide a split; none: it decides none (it follows those it hears).
    split_at: Option<usize>,
}

/// Whether hashed keys `a` and `b` share their first `depth` bits.
pub fn same_prefix(a: &[u8], b: &[u8], depth: u8) -> bool {
    let (whole, rest) = (usize::from(depth / 8), depth % 8);
    if a.len() < whole + usize::from(rest > 0) || b.len() < whole + usize::from(rest > 0) {
        return false;
    }
    a[..whole] == b[..whole] && (rest == 0 || (a[whole] ^ b[whole]) >> (8 - rest) == 0)
}

impl Membership {
    /// Prefix groups on: this peer's key is `local`'s, its group is at `depth` (kept
    /// across restarts by the owner: a peer that knew of a split must not serve by its
    /// parent's rule again; a depth above 0 starts with its split pending, so that the
    /// members' words are heard again), and it decides a split once each half of its
    /// view counts `split_at` members (none: it decides none). Call before
    /// anything else.
    pub fn with_groups(mut self, local: PeerId, depth: u8, split_at: Option<usize>) -> Self {
        let depth = depth.min(MAX_DEPTH);
        self.groups = Some(Groups { key: KBucketKey::from(local), depth, splitting: depth > 0, split_at });
        self
    }

    /// This peer's group as its gossip table states it; none without groups.
    pub fn group(&self) -> Option<wire::Group> {
        self.groups.as_ref().map(|g| wire::Group { depth: g.depth, splitting: g.splitting })
    }

    /// Whether this peer may host `key`: the key is in its group (in its own half while
    /// a split is pending). Always, without groups.
    pub fn in_group<T>(&self, key: &KBucketKey<T>) -> bool {
        self.groups.as_ref().is_none_or(|g| same_prefix(g.key.hashed_bytes(), key.hashed_bytes(), g.depth))
    }

    /// Whether `peer` (its key `key`) can be a member here: in the group, or in the
    /// parent while a split is pending.
    pub(super) fn may_be_member(&self, key: &KBucketKey<PeerId>) -> bool {
        self.groups.as_ref().is_none_or(|g| {
            let depth = g.depth - u8::from(g.splitting);
            same_prefix(g.key.hashed_bytes(), key.hashed_bytes(), depth)
        })
    }

    /// Whether a joining peer may join through `peer`, whose table states `group`: it
    /// is a member of this peer's group at the deeper of the two depths (always if
    /// either has no groups).
    pub(super) fn may_vouch(&self, peer: &PeerId, group: Option<wire::Group>) -> bool {
        let (Some(g), Some(t)) = (self.groups.as_ref(), group) else { return true };
        let members_at = |depth: u8, splitting: bool| depth.min(MAX_DEPTH).saturating_sub(u8::from(splitting));
        let depth = members_at(t.depth, t.splitting).max(members_at(g.depth, g.splitting));
        same_prefix(g.key.hashed_bytes(), KBucketKey::from(*peer).hashed_bytes(), depth)
    }

    /// With groups on: whether the joint quorum of this peer's own join is pending (it
    /// then serves nothing: [`Readiness::Counting`](super::Readiness::Counting)).
    pub(super) fn own_join_pending(&self) -> bool {
        self.groups.is_some() && self.joints.iter().flatten().any(|j| j.peer.is_none())
    }

    /// While a split is pending: (reachable, members) of this peer's half, itself
    /// included in both, if that is not a strict majority.
    pub(super) fn half_unmet(&self) -> Option<(usize, usize)> {
        let g = self.groups.as_ref().filter(|g| g.splitting)?;
        let half = self
            .members
            .values()
            .filter(|m| m.counted && same_prefix(g.key.hashed_bytes(), m.key.hashed_bytes(), g.depth));
        let (reachable, members) = half.fold((1, 1), |(r, n), m| (r + usize::from(m.alive), n + 1));
        (2 * reachable <= members).then_some((reachable, members))
    }

    /// `from`'s own table (not relayed) states its group `group`: from a counted member,
    /// its word that it knows of the split pending here, or a split this peer did not
    /// know of (one level at a time). Ends the split here if that was the last word.
    pub(super) fn heard_group(&mut self, from: &PeerId, group: Option<wire::Group>) {
        let (Some(g), Some(theirs)) = (self.groups.as_ref(), group) else { return };
        let counted = self.members.get(from).is_some_and(|m| m.counted);
        if !counted {
            return;
        }
        if theirs.depth > g.depth && g.depth < MAX_DEPTH && !g.splitting {
            self.start_split();
        }
        let Some(g) = self.groups.as_ref() else { return };
        if g.splitting && theirs.depth >= g.depth {
            if let Some(m) = self.members.get_mut(from) {
                m.word = true;
            }
            self.end_split_if_done();
        }
    }

    /// The split to one level deeper is pending here from now on.
    fn start_split(&mut self) {
        if let Some(g) = self.groups.as_mut() {
            g.depth += 1;
            g.splitting = true;
        }
        for m in self.members.values_mut() {
            m.word = false;
        }
    }

    /// Decides a split if this peer may (see [`Membership::with_groups`]): it reaches
    /// a majority, and each half of its counted members (itself included) holds
    /// `split_at`. Joint quorums pending here do not stop it (the model checks the rule
    /// so).
    pub(super) fn decide_split(&mut self) {
        let Some(g) = self.groups.as_ref() else { return };
        let Some(least) = g.split_at else { return };
        if g.splitting || g.depth >= MAX_DEPTH || !self.majority() || self.joining {
            return;
        }
        let mine = g.key.hashed_bytes();
        let (same, other) = self.members.values().filter(|m| m.counted).fold((1, 0), |(s, o), m| {
            if same_prefix(mine, m.key.hashed_bytes(), g.depth + 1) {
                (s + 1, o)
            } else {
                (s, o + 1)
            }
        });
        if same >= least && other >= least {
            self.start_split();
        }
    }

    /// Ends the pending split once every counted member has given its word: the other
    /// half leaves this peer's membership (not as departures: none of them is closer
    /// to a key of this half than every member of it, so none hosted one that this
    /// peer may now take over).
    pub(super) fn end_split_if_done(&mut self) {
        if !self.groups.as_ref().is_some_and(|g| g.splitting) {
            return;
        }
        if self.members.values().any(|m| m.counted && !m.word) {
            return;
        }
        if let Some(g) = self.groups.as_mut() {
            g.splitting = false;
        }
        self.regroup();
    }

    /// Members that cannot be members here any more (outside the group) leave the
    /// membership; not departures, not forgotten (they live on in their own group).
    fn regroup(&mut self) {
        let out: Vec<PeerId> =
            self.members.iter().filter(|(_, m)| !self.may_be_member(&m.key)).map(|(p, _)| *p).collect();
        if out.is_empty() {
            return;
        }
        for p in &out {
            self.joint_gone(p);
            if let Some(m) = self.members.remove(p) {
                if m.alive {
                    if m.counted {
                        self.up -= 1;
                    } else {
                        self.pending -= 1;
                    }
                }
                if m.counted {
                    self.counted -= 1;
                }
            }
        }
        self.members_delay_stale = true;
    }

    /// A joining peer takes the group of the serving peer it joins through (`theirs`),
    /// or keeps its own if it is deeper (it knew of a split the voucher does not know
    /// yet: that split is pending here then). Members outside the group leave.
    pub(super) fn join_group(&mut self, theirs: Option<wire::Group>) {
        let Some(g) = self.groups.as_mut() else { return };
        match theirs {
            Some(t) if t.depth.min(MAX_DEPTH) > g.depth => {
                g.depth = t.depth.min(MAX_DEPTH);
                g.splitting = t.splitting;
            }
            Some(t) if t.depth == g.depth => g.splitting |= t.splitting,
            _ => g.splitting |= g.depth > 0,
        }
        self.regroup();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use libp2p::kad::KBucketKey;
    use libp2p::PeerId;

    use super::same_prefix;
    use crate::liveness::{self, Refused};
    use crate::membership::{Arrival, Membership, Readiness, Record};
    use crate::wire::{self, Group};

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn prefixes_compare_bit_by_bit() {
        let a = [0b1010_0000, 0xff];
        let b = [0b1011_0000, 0x00];
        assert!(same_prefix(&a, &b, 0));
        assert!(same_prefix(&a, &b, 3));
        assert!(!same_prefix(&a, &b, 4));
        assert!(!same_prefix(&a, &b, 16));
        assert!(same_prefix(&a, &a, 16));
        assert!(!same_prefix(&a, &a, 17), "past the key: no prefix");
    }

    /// Random peers, `same` of them in `local`'s half at depth 1 and `other` in the
    /// other half.
    fn halves(local: &PeerId, same: usize, other: usize) -> (Vec<PeerId>, Vec<PeerId>) {
        let mine = KBucketKey::from(*local);
        let (mut s, mut o) = (Vec::new(), Vec::new());
        while s.len() < same || o.len() < other {
            let p = PeerId::random();
            if same_prefix(mine.hashed_bytes(), KBucketKey::from(p).hashed_bytes(), 1) {
                if s.len() < same {
                    s.push(p);
                }
            } else if o.len() < other {
                o.push(p);
            }
        }
        (s, o)
    }

    fn grouped(local: PeerId, split_at: Option<usize>) -> Membership {
        Membership::new(false, 60 * S, 10 * S, 3 * S).with_groups(local, 0, split_at)
    }

    /// `m` connected to `peers` at `now`, each of which counts all of them: no joint
    /// quorum pending.
    fn settled(m: &mut Membership, peers: &[PeerId], now: Duration) {
        for p in peers {
            m.connected(*p, now);
        }
        for q in peers {
            m.counted_by(q, peers.iter().copied().filter(|p| p != q), false);
        }
        assert_eq!(m.joints_pending(), 0);
    }

    /// `m` merges `from`'s own table stating `group`, with `pending` changes (a view
    /// not settled if any) and counting `counts`.
    fn table_of(
        m: &mut Membership,
        local: &PeerId,
        from: PeerId,
        group: Group,
        pending: &[PeerId],
        counts: &[PeerId],
        now: Duration,
    ) {
        let beat = |peer| wire::Beat {
            peer,
            incarnation: 1,
            counter: 1,
            age_ms: 0,
            delay_ms: None,
            proof: None,
            counted: true,
        };
        let gossip = wire::Gossip {
            beats: counts.iter().copied().map(beat).collect(),
            serving: true,
            delay_ms: None,
            leaves: vec![],
            joints: pending.to_vec(),
            group: Some(group),
            acks: false,
        };
        let arrival = Arrival { transit: Duration::ZERO, echo: None };
        m.merge(local, from, &gossip, arrival, now, liveness::wall_ms());
    }

    const SPLITTING: Group = Group { depth: 1, splitting: true };

    #[test]
    fn a_split_is_decided_once_both_halves_hold_enough() {
        let local = PeerId::random();
        let (same, other) = halves(&local, 2, 3);
        let mut m = grouped(local, Some(3));
        let first: Vec<PeerId> = same[..1].iter().chain(&other).copied().collect();
        settled(&mut m, &first, Duration::ZERO);
        m.tick(Duration::ZERO);
        assert_eq!(m.group(), Some(Group { depth: 0, splitting: false }), "its half counts 2 of the 3 needed");
        // The third of the half comes, with its joint quorum: enough.
        m.connected(same[1], S);
        m.tick(2 * S);
        assert_eq!(m.joints_pending(), 1);
        assert_eq!(m.group(), Some(SPLITTING));
        assert_eq!(m.readiness(), Readiness::Serving);
        let mut never = grouped(local, None);
        settled(&mut never, &[same.clone(), other.clone()].concat(), Duration::ZERO);
        never.tick(Duration::ZERO);
        assert_eq!(never.group().map(|g| g.depth), Some(0), "without split_at it decides none");
        let mut minority = grouped(local, Some(3));
        settled(&mut minority, &[same.clone(), other.clone()].concat(), Duration::ZERO);
        for p in &other {
            minority.disconnected(*p, Duration::ZERO);
        }
        minority.tick(Duration::ZERO);
        assert_eq!(minority.group().map(|g| g.depth), Some(0), "3 of 6: no majority, no split");
    }

    #[test]
    fn while_a_split_is_pending_a_peer_also_needs_a_majority_of_its_half() {
        let local = PeerId::random();
        let (same, other) = halves(&local, 2, 4);
        let mut m = grouped(local, Some(2));
        settled(&mut m, &[same.clone(), other.clone()].concat(), Duration::ZERO);
        m.tick(Duration::ZERO);
        assert_eq!(m.group(), Some(SPLITTING));
        m.disconnected(same[0], S);
        m.disconnected(same[1], S);
        m.tick(S);
        assert_eq!(m.readiness(), Readiness::Half { reachable: 1, members: 3 }, "5 of the 7 members, 1 of its 3");
        assert!(!m.serving());
    }

    #[test]
    fn the_split_ends_once_every_counted_member_said_so() {
        let local = PeerId::random();
        let (same, other) = halves(&local, 2, 2);
        let mut m = grouped(local, Some(2));
        settled(&mut m, &[same.clone(), other.clone()].concat(), Duration::ZERO);
        m.tick(Duration::ZERO);
        assert_eq!(m.group(), Some(SPLITTING));
        let others: Vec<PeerId> = same.iter().chain(&other).copied().collect();
        table_of(&mut m, &local, others[0], Group { depth: 0, splitting: false }, &[], &[], S);
        for q in &others[1..] {
            table_of(&mut m, &local, *q, SPLITTING, &[others[0]], &[], S);
        }
        assert_eq!(m.group(), Some(SPLITTING), "a table of the parent's depth says nothing of the split");
        table_of(&mut m, &local, others[0], Group { depth: 1, splitting: false }, &[], &[], S);
        assert_eq!(m.group(), Some(Group { depth: 1, splitting: false }));
        assert_eq!(m.members(), 3, "its half is its group");
        assert!(other.iter().all(|p| !m.is_alive(p) && !m.is_departed(p)), "the other half left, not departed");
        assert_eq!(m.readiness(), Readiness::Serving);
        let key = |p: &PeerId| KBucketKey::from(*p);
        assert!(m.in_group(&key(&same[0])) && !m.in_group(&key(&other[0])));
        // The other half's records are not members' any more, nor its connections.
        let (stranger, mut chain) = loop {
            let key = libp2p::identity::Keypair::generate_ed25519();
            let p = key.public().to_peer_id();
            if !m.in_group(&KBucketKey::from(p)) {
                break (p, liveness::Chain::new(key, liveness::wall_ms(), None));
            }
        };
        let proof = chain.proof(1);
        let record = Record {
            peer: stranger,
            beat: (chain.incarnation(), 1),
            age: Duration::ZERO,
            delay_ms: None,
            proof: proof.as_ref(),
        };
        assert_eq!(
            m.heard_record(record, &same[0], 2 * S, liveness::wall_ms(), None, &mut 0),
            Err(Refused::OtherGroup)
        );
        m.connected(other[0], 2 * S);
        assert!(!m.is_alive(&other[0]));
        assert_eq!(m.members(), 3);
    }

    #[test]
    fn a_word_said_in_an_earlier_life_is_void() {
        let local = PeerId::random();
        let mine = KBucketKey::from(local);
        // Two members in each half, with their keys (to sign beats of two incarnations).
        let (mut keys, mut halves) = (Vec::new(), [0, 0]);
        while keys.len() < 4 {
            let key = libp2p::identity::Keypair::generate_ed25519();
            let peer = key.public().to_peer_id();
            let half = usize::from(same_prefix(mine.hashed_bytes(), KBucketKey::from(peer).hashed_bytes(), 1));
            if halves[half] < 2 {
                halves[half] += 1;
                keys.push(key);
            }
        }
        let peers: Vec<PeerId> = keys.iter().map(|k| k.public().to_peer_id()).collect();
        let mut m = grouped(local, Some(2));
        settled(&mut m, &peers, Duration::ZERO);
        m.tick(Duration::ZERO);
        assert_eq!(m.group(), Some(SPLITTING));
        let wall = liveness::wall_ms();
        let incarnation = |m: &mut Membership, incarnation: u64, now: Duration| {
            let mut chain = liveness::Chain::new(keys[0].clone(), incarnation, None);
            for counter in 1..=2 {
                let proof = chain.proof(counter);
                let beat = (incarnation, counter);
                let record =
                    Record { peer: peers[0], beat, age: Duration::ZERO, delay_ms: None, proof: proof.as_ref() };
                m.heard_record(record, &peers[1], now, wall, None, &mut 0).unwrap();
            }
        };
        incarnation(&mut m, wall, S);
        table_of(&mut m, &local, peers[0], SPLITTING, &[], &[], S);
        // A later incarnation of peer 0 is heard (relayed) before the others' words.
        incarnation(&mut m, wall + 1, 2 * S);
        for p in &peers[1..] {
            table_of(&mut m, &local, *p, SPLITTING, &[], &[], 2 * S);
        }
        assert_eq!(m.group(), Some(SPLITTING), "peer 0 has not said it in this life");
        table_of(&mut m, &local, peers[0], SPLITTING, &[], &[], 3 * S);
        assert_eq!(m.group(), Some(Group { depth: 1, splitting: false }));
    }

    #[test]
    fn a_split_is_learnt_from_a_counted_member_only() {
        let local = PeerId::random();
        let (same, other) = halves(&local, 1, 2);
        let mut m = grouped(local, None);
        for p in same.iter().chain(&other[..1]) {
            m.connected(*p, Duration::ZERO);
        }
        m.tick(Duration::ZERO);
        let stranger = PeerId::random();
        table_of(&mut m, &local, stranger, SPLITTING, &[], &[], S);
        assert_eq!(m.group().map(|g| g.depth), Some(0), "from a peer it does not count");
        table_of(&mut m, &local, other[0], Group { depth: 1, splitting: false }, &[], &[], S);
        assert_eq!(m.group(), Some(SPLITTING), "learnt, and other[0]'s word taken with it");
        table_of(&mut m, &local, same[0], SPLITTING, &[], &[], S);
        assert_eq!(m.group(), Some(Group { depth: 1, splitting: false }));
    }

    /// The mend the model checks (`Mend::JoinerWaits`): a newcomer serves nothing until
    /// every member of its voucher's view counts it.
    #[test]
    fn a_joining_peer_takes_its_vouchers_group_and_serves_once_every_member_counts_it() {
        let local = PeerId::random();
        let (same, other) = halves(&local, 2, 1);
        let fresh = || {
            let mut m = Membership::new(true, 60 * S, 10 * S, 3 * S).with_groups(local, 0, None);
            for p in same.iter().chain(&other) {
                m.connected(*p, Duration::ZERO);
            }
            m.bootstrapped();
            m
        };
        let split = Group { depth: 1, splitting: false };
        let mut m = fresh();
        table_of(&mut m, &local, other[0], split, &[], &[], S);
        assert!(!m.ready(), "a voucher of another group");
        table_of(&mut m, &local, same[0], split, &[], &[same[1]], S);
        assert!(m.ready());
        assert_eq!(m.group(), Some(split));
        assert_eq!(m.members(), 3, "itself, its voucher and the member the voucher named");
        assert!(!m.is_alive(&other[0]), "the other group's peer is not a member");
        m.tick(S);
        assert_eq!(m.readiness(), Readiness::Counting);
        assert!(!m.serving());
        m.counted_by(&same[0], [], true);
        m.tick(S);
        assert_eq!(m.readiness(), Readiness::Counting, "one of the two members counts it");
        m.counted_by(&same[1], [], true);
        m.tick(2 * S);
        assert_eq!(m.readiness(), Readiness::Serving);
        let mut plain = Membership::new(true, 60 * S, 10 * S, 3 * S);
        plain.connected(same[0], Duration::ZERO);
        plain.bootstrapped();
        plain.joined_through(same[0], [same[1]], &[], None, None, S);
        plain.tick(S);
        assert_eq!(plain.readiness(), Readiness::Serving, "without groups a newcomer serves at once");
    }
}
