//! Who this peer believes the swarm is, and whether it may serve replicas.
//!
//! The split-brain rules of ARCHITECTURE.md ("Split brain"), kept apart from the libp2p
//! glue so that they can be tested on their own:
//!
//! - **Readiness.** A peer given bootstrap peers is *joining* until a Kademlia bootstrap
//!   has completed while it was connected to at least one sigma peer, and it has heard
//!   from a peer that serves (the gossip's serving bit, [`Membership::joined_through`]).
//!   It hosts nothing and lets no acquisition start before that. A peer started without
//!   bootstrap peers is a one-node swarm and ready at once.
//! - **Members.** Every sigma peer *counted* here, present or departed. A peer is
//!   counted once it is *alive* here while this peer (joined) reaches a majority of the
//!   members it counts, or when the serving peer this peer joined through named it. Alive: connected (and answering liveness pings),
//!   or its heartbeat, relayed by the membership gossip, advanced while this peer
//!   watched, within the gossip liveness window and since its last connection here
//!   closed. So a peer connected to a few others still sees the whole swarm alive, and a
//!   peer cut off sees nobody advance. A peer without a majority counts no newcomer
//!   (it is alive, and hosts what it is closest to, but is neither reachable nor a
//!   member in the count): a minority cannot grow into a majority by joins. A departed
//!   member is forgotten after the membership window, but only while this peer serves:
//!   on the minority side of a split nobody ages out, so the minority never comes to
//!   believe it is the whole swarm. With a fixed member list (an allow-list), the
//!   members are the list, whoever is alive. docs/design/membership.md argues the rules.
//! - **Serving.** A ready peer serves (hosts replicas, grants votes) while it reaches a
//!   strict majority of the members, itself included. A 50/50 split serves on neither
//!   side.
//! - **Prefix groups** ([`Membership::with_groups`], module `group`): the members are
//!   the peers of this peer's group, every rule above holds within it, and while a
//!   split of the group is pending here a peer also needs a strict majority of its own
//!   half. Off unless the owner turns it on (the node does not yet).
//! - **Takeover delay.** When serving begins (start, rejoin after a split, resume after
//!   a stall) every replica this peer starts grants nothing for the delay; and for one
//!   delay after a member departs, replicas whose key that member was closer to start
//!   held too: their previous host may have granted them.
//! - **Stalls.** A peer whose event loop was silent longer than the liveness timeout may
//!   have been declared gone by the others, who then took over its replicas: it starts
//!   over as if it had just begun serving.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::time::Duration;

use libp2p::kad::KBucketKey;
use libp2p::PeerId;

use crate::liveness::{Leave, Proof};
use crate::proto::Time;

mod departures;
mod exchange;
mod gossip;
mod group;
mod joint;
pub use exchange::{Arrival, Merged};
pub use gossip::Record;
pub use group::{same_prefix, MAX_DEPTH};
pub use joint::MAX_JOINTS;

/// Most members remembered; beyond it the longest-departed is forgotten first (and, to
/// stay on the safe side, counts as a departure that has just happened).
pub const MAX_MEMBERS: usize = 10_000;

/// Longest takeover delay a member's settings can impose on this peer (a lease of an
/// hour is far past any sensible one; a larger value heard is taken as this).
pub const MAX_TAKEOVER_DELAY: Duration = Duration::from_secs(3600);

/// The member table's hasher: SipHash-1-3 as std's, keyed at random for each table, or
/// with given keys ([`Membership::with_hash_keys`]) where a run must replay exactly (the
/// membership simulator: the table's order decides, e.g., which newcomers are counted
/// first when joint quorums run short).
#[derive(Clone, Debug)]
pub struct MemberHasher(u64, u64);

impl Default for MemberHasher {
    fn default() -> Self {
        use rand::RngCore;
        MemberHasher(rand::rngs::OsRng.next_u64(), rand::rngs::OsRng.next_u64())
    }
}

impl BuildHasher for MemberHasher {
    type Hasher = siphasher::sip::SipHasher13;
    fn build_hasher(&self) -> Self::Hasher {
        siphasher::sip::SipHasher13::new_with_keys(self.0, self.1)
    }
}

/// Why a peer does not serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Serving: ready, and a majority of the members is reachable.
    Serving,
    /// Given bootstrap peers and not yet joined to them: no Kademlia bootstrap with a
    /// sigma peer completed, or no peer that serves heard.
    Joining,
    /// No address that other peers can dial is known for this peer (no confirmed
    /// external address, where one is required): it hosts nothing, and no peer counts
    /// it as a host; its own acquisitions go to the hosts the others agree on.
    Unreachable,
    /// Leaving the swarm (a graceful stop): it hosts nothing any more, and has told the
    /// others so ([`Membership::leave`]).
    Leaving,
    /// Reaches `reachable` of `members` members (itself included in both): not a strict
    /// majority, e.g. the minority side of a network partition, or an isolated peer.
    Minority {
        /// Reachable members, this peer included.
        reachable: usize,
        /// Members, this peer included.
        members: usize,
    },
    /// Reaches a strict majority of its members, but only `reachable` of the `of`
    /// members of the view before a change not yet known to all of them (a newcomer it
    /// counts, or its own join: the joint quorum, docs/design/membership.md): e.g. a
    /// peer cut off with peers that joined it just before the cut.
    Joint {
        /// Reachable members of that earlier view, this peer included if it is one.
        reachable: usize,
        /// Members of that earlier view still members, this peer included if it is one.
        of: usize,
    },
    /// Reaches a strict majority of its members, but only `reachable` of the `members`
    /// members of its own half of its group, whose split is pending here (prefix
    /// groups: docs/design/membership-at-scale.md).
    Half {
        /// Reachable members of this peer's half, itself included.
        reachable: usize,
        /// Counted members of this peer's half, itself included.
        members: usize,
    },
    /// Joined (prefix groups on), but not every member of the view it joined is known
    /// yet to count it: a newcomer serves nothing until then, so that every member waits
    /// for its word on a split (docs/design/membership-at-scale.md).
    Counting,
}

impl Readiness {
    /// Short name for status pages and metrics labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Readiness::Serving => "serving",
            Readiness::Joining => "joining",
            Readiness::Unreachable => "unreachable",
            Readiness::Leaving => "leaving",
            Readiness::Minority { .. } => "minority",
            Readiness::Joint { .. } => "joint",
            Readiness::Half { .. } => "half",
            Readiness::Counting => "counting",
        }
    }
}

impl std::fmt::Display for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Readiness::Serving => f.write_str("serving"),
            Readiness::Joining => f.write_str(
                "joining the swarm (no Kademlia bootstrap completed with a sigma peer, or no serving peer heard, yet)",
            ),
            Readiness::Unreachable => {
                f.write_str("unreachable (no external address that other peers can dial: hosts no replica)")
            }
            Readiness::Leaving => f.write_str("leaving the swarm (stopping): hosts no replica"),
            Readiness::Minority { reachable, members } => {
                write!(f, "reaches {reachable} of {members} known peers (itself included): no strict majority")
            }
            Readiness::Joint { reachable, of } => write!(
                f,
                "reaches {reachable} of the {of} peers of its view before a recent join: no strict majority of \
                 them, and they do not all count the newcomer yet"
            ),
            Readiness::Counting => f.write_str(
                "joined, but not every member of its view counts it yet: a newcomer to a group serves nothing until \
                 then",
            ),
            Readiness::Half { reachable, members } => write!(
                f,
                "reaches {reachable} of the {members} members of its half of a group that is splitting (itself \
                 included): no strict majority of them"
            ),
        }
    }
}

/// Why an operator's forget was refused ([`Membership::forget`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForgetError {
    /// Not a member here.
    Unknown,
    /// Alive here: not gone.
    Alive,
    /// On the fixed member list.
    Listed,
}

impl std::fmt::Display for ForgetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ForgetError::Unknown => "not a member here",
            ForgetError::Alive => "alive here: only a peer gone for good may be forgotten",
            ForgetError::Listed => "on the member list (--allow-peer): change the list instead",
        })
    }
}

/// A member's heartbeat: (incarnation, counter), ordered; a restarted peer starts a
/// higher incarnation.
pub type Beat = (u64, u64);

/// Most members not known here that one gossip table may introduce: one peer, however
/// many ids it makes up, adds at most this many a round.
pub const MAX_NEW_PER_TABLE: usize = 64;

#[derive(Clone, Debug)]
struct Member {
    /// Connected now.
    up: bool,
    /// Alive as of the last count: connected, or heartbeat fresh.
    alive: bool,
    /// Was alive here at least once (a peer only heard of was not: one stale table
    /// relayed to a newcomer must not make it a majority).
    seen: bool,
    /// Counts toward the majority: alive here while this peer had a majority, named by
    /// the serving peer this one joined through, or on the fixed member list. A peer
    /// without a majority counts no newcomer.
    counted: bool,
    /// When it was last seen alive (for a departed member: when it left).
    left_at: Time,
    /// Highest heartbeat heard, and when (on this peer's clock) it was first observed
    /// anywhere along the gossip path (its age travels with it).
    beat: Beat,
    beat_at: Time,
    /// Alive by gossip until then: its heartbeat advanced while this peer watched.
    fresh_until: Option<Time>,
    /// Its Kademlia key (placement compares distances on every request).
    key: KBucketKey<PeerId>,
    /// Bit i: a member of the view of pending joint quorum i ([`joint`]).
    views: u64,
    /// Bit i: known, from its own table, to count the newcomer of joint quorum i.
    counts: u64,
    /// The last gossip request ([`Membership::next_exchange`]) whose table held this
    /// member's heartbeat at least as new as ours: the reply to it leaves the member out.
    echoed: u64,
    /// Its own takeover delay (from its settings: lease, drift, liveness), relayed with
    /// its heartbeat; none from a peer that does not say.
    delay: Option<Duration>,
    /// The proof of `beat` ([`crate::liveness`]), relayed with it; none if it came
    /// straight from a member from before signed heartbeats (then it is not relayed).
    proof: Option<Proof>,
    /// It left (its own signed leave, relayed until it is forgotten): in no count, not
    /// alive, until a later incarnation of it is heard.
    left: Option<Leave>,
    /// Said, in its own table, that it knows of the split pending here
    /// ([`group`]); void when a later incarnation of it is heard.
    word: bool,
}

impl Member {
    fn new(peer: PeerId, now: Time, beat: Beat) -> Self {
        Member {
            up: false,
            alive: false,
            seen: false,
            counted: false,
            left_at: now,
            beat,
            beat_at: now,
            fresh_until: None,
            key: KBucketKey::from(peer),
            views: 0,
            counts: 0,
            echoed: 0,
            delay: None,
            proof: None,
            left: None,
            word: false,
        }
    }

    /// Alive here once, and not now (nor left: a member that left is not dialled again).
    fn departed(&self) -> bool {
        self.seen && !self.alive && self.left.is_none()
    }

    /// A member present or departed (as [`Membership::peers`]).
    fn known(&self) -> bool {
        self.seen || self.counted
    }

    fn alive_at(&self, now: Time) -> bool {
        self.left.is_none() && (self.up || self.fresh_until.is_some_and(|t| now < t))
    }
}

/// The membership view of one peer (see the module doc).
#[derive(Clone, Debug)]
pub struct Membership {
    /// Not yet joined: `bootstrapped` and `joined_through` are both needed (without a
    /// fixed member list; with one, `bootstrapped` is enough).
    joining: bool,
    /// A Kademlia bootstrap completed while a sigma peer was alive here.
    bootstrapped: bool,
    /// A peer that serves was heard (or there is a fixed member list).
    vouched: bool,
    /// The fixed member list, if any: the members are these, whoever else is alive.
    fixed: Option<std::collections::HashSet<PeerId>>,
    window: Duration,
    /// This peer's own takeover delay (from its settings).
    delay: Duration,
    /// The longest of this peer's and of its members' (present or departed) own delays.
    members_delay: Duration,
    /// The delay in force at the serving peer this one joined through, and until when
    /// it is kept (one membership window): the members it knew, and this peer did not
    /// (departed ones, cut off), may have the longer settings.
    inherited: Option<(Duration, Time)>,
    /// A member's delay dropped or left: `members_delay` is recomputed at the next tick
    /// (until then it stays the longer one).
    members_delay_stale: bool,
    liveness: Duration,
    members: HashMap<PeerId, Member, MemberHasher>,
    /// Gossip requests numbered so far ([`Membership::next_exchange`]).
    exchange: u64,
    /// Counted members alive now (kept as a count: readiness is asked on every event).
    up: usize,
    /// Alive peers not counted (newcomers to a peer without a majority).
    pending: usize,
    /// Members counted toward the majority.
    counted: usize,
    /// How long a heartbeat heard through gossip keeps its member alive.
    gossip_liveness: Duration,
    /// This peer's own heartbeat.
    beat: Beat,
    /// When serving last began.
    serving_since: Option<Time>,
    /// Whether other peers can dial this one (see [`Readiness::Unreachable`]).
    dialable: bool,
    /// Departures within the takeover delay: (peer, when).
    departures: Vec<(PeerId, Time)>,
    /// A forgotten member counts as a departure of unknown place until then.
    overflow_until: Option<Time>,
    /// When the owner last called [`Membership::tick`].
    last_tick: Option<Time>,
    /// When departed members and departures were last aged.
    last_aged: Option<Time>,
    stalls: u64,
    /// Departed members forgotten since the owner last took them
    /// ([`Membership::take_forgotten`], after every tick).
    forgotten: Vec<PeerId>,
    /// This peer is leaving ([`Membership::leave`]).
    leaving: bool,
    /// Test-only planted fault: rule 1 broken ([`Membership::with_fault_counting_every_newcomer`]).
    count_every_newcomer: bool,
    /// The joint quorums of newcomers this peer counted, by slot ([`joint`]); trailing
    /// free slots are dropped.
    joints: Vec<Option<joint::Joint>>,
    /// Test-only: the joint quorum off ([`Membership::without_joint_quorum`]).
    joint_off: bool,
    /// Prefix groups ([`Membership::with_groups`]); none: the swarm is one group.
    groups: Option<group::Groups>,
}

impl Membership {
    /// A view for a peer that `joining` (was given bootstrap peers) or not; members are
    /// forgotten `window` after they leave (while serving), replicas are held `delay`,
    /// and a silence of `liveness` counts as a stall.
    pub fn new(joining: bool, window: Duration, delay: Duration, liveness: Duration) -> Self {
        Membership {
            joining,
            bootstrapped: false,
            vouched: false,
            fixed: None,
            window,
            delay,
            members_delay: delay,
            inherited: None,
            members_delay_stale: false,
            liveness,
            members: HashMap::default(),
            exchange: 0,
            up: 0,
            pending: 0,
            counted: 0,
            gossip_liveness: liveness,
            beat: (0, 0),
            serving_since: None,
            dialable: true,
            departures: Vec::new(),
            overflow_until: None,
            last_tick: None,
            last_aged: None,
            stalls: 0,
            forgotten: Vec::new(),
            leaving: false,
            count_every_newcomer: false,
            joints: Vec::new(),
            joint_off: false,
            groups: None,
        }
    }

    /// The member table hashed with these keys instead of random ones: the same calls
    /// then give the same answers in the same order (a simulation replays from its
    /// seed). Random keys keep a remote peer from choosing ids that collide.
    pub fn with_hash_keys(mut self, k0: u64, k1: u64) -> Self {
        let mut members = HashMap::with_hasher(MemberHasher(k0, k1));
        members.extend(self.members.drain());
        self.members = members;
        self
    }

    /// Test-only: a planted fault that breaks rule 1 (a newcomer counts only while this
    /// peer has a majority): every peer alive here is counted, majority or not, as
    /// before the rule. For the model checker to show that it catches the fault; off
    /// unless called.
    #[doc(hidden)]
    pub fn with_fault_counting_every_newcomer(mut self) -> Self {
        self.count_every_newcomer = true;
        self
    }

    /// The takeover delay in force: the longest of this peer's own and of the own
    /// delays its members (present or departed) announced. A replica taken over must
    /// wait out the votes its previous host could grant, and those last as long as
    /// that host's lease and liveness settings say, not this peer's.
    pub fn delay(&self) -> Duration {
        self.inherited.map_or(self.members_delay, |(d, _)| d.max(self.members_delay))
    }

    /// The longest of this peer's own delay and its members' (not what it inherited
    /// from the peer it joined through: the value would otherwise be handed on from
    /// joiner to joiner), as gossiped for a joining peer to inherit.
    pub fn members_delay(&self) -> Duration {
        self.members_delay
    }

    /// This peer's own takeover delay (from its settings), as gossiped.
    pub fn own_delay(&self) -> Duration {
        self.delay
    }

    /// `peer` announced its own takeover delay `delay` with heartbeat `beat`: taken if
    /// that is the newest heartbeat known of it (a stale relay does not undo a newer
    /// value), capped at [`MAX_TAKEOVER_DELAY`].
    pub fn heard_delay(&mut self, peer: &PeerId, beat: Beat, delay: Duration) {
        let delay = delay.min(MAX_TAKEOVER_DELAY);
        let Some(m) = self.members.get_mut(peer) else { return };
        if m.beat != beat || m.delay == Some(delay) {
            return;
        }
        if m.delay.is_some_and(|d| d > delay) {
            self.members_delay_stale = true;
        }
        m.delay = Some(delay);
        if m.known() {
            self.members_delay = self.members_delay.max(delay);
        }
    }

    fn recompute_members_delay(&mut self) {
        let members = self.members.values().filter(|m| m.known()).filter_map(|m| m.delay);
        self.members_delay = members.fold(self.delay, Duration::max);
        self.members_delay_stale = false;
    }

    /// Members heard of only through gossip stay alive this long after their heartbeat
    /// last advanced (default: the liveness timeout).
    pub fn with_gossip(mut self, liveness: Duration, incarnation: u64) -> Self {
        self.gossip_liveness = liveness;
        self.beat = (incarnation, 0);
        self
    }

    /// The members are `peers` (and this peer), whoever else is alive: a majority is
    /// one of the list, and a joining peer needs no serving peer to join through (any
    /// two majorities of one list overlap). For a swarm closed by an allow-list that
    /// every peer shares. Call before anything else.
    pub fn with_members(mut self, peers: impl IntoIterator<Item = PeerId>, local: PeerId) -> Self {
        let fixed: std::collections::HashSet<PeerId> =
            peers.into_iter().filter(|p| *p != local).take(MAX_MEMBERS).collect();
        for p in &fixed {
            let mut m = Member::new(*p, Duration::ZERO, (0, 0));
            m.counted = true;
            self.members.insert(*p, m);
        }
        self.counted = fixed.len();
        self.fixed = Some(fixed);
        self.vouched = true;
        self
    }

    /// Whether `peer` is alive here (connected, or its heartbeat fresh).
    pub fn is_alive(&self, peer: &PeerId) -> bool {
        self.members.get(peer).is_some_and(|m| m.alive)
    }

    /// Whether this peer counts `peer` toward its majority (as its gossip table says).
    pub fn is_counted(&self, peer: &PeerId) -> bool {
        self.members.get(peer).is_some_and(|m| m.counted)
    }

    /// Whether `peer` was alive here and is not now (departed within the window, or
    /// frozen in a minority).
    pub fn is_departed(&self, peer: &PeerId) -> bool {
        self.members.get(peer).is_some_and(Member::departed)
    }

    /// The departures within the takeover delay, in the order they happened: (member,
    /// when it stopped being alive here). A simulation reads who departed when.
    pub fn recent_departures(&self) -> &[(PeerId, Time)] {
        &self.departures
    }

    /// The departed members forgotten (past the window) since the last call.
    pub fn take_forgotten(&mut self) -> Vec<PeerId> {
        std::mem::take(&mut self.forgotten)
    }

    /// The alive members.
    pub fn alive(&self) -> impl Iterator<Item = &PeerId> + Clone {
        self.members.iter().filter(|(_, m)| m.alive).map(|(p, _)| p)
    }

    /// The Kademlia keys of the members alive now.
    pub fn alive_keys(&self) -> impl Iterator<Item = &KBucketKey<PeerId>> + Clone {
        self.members.values().filter(|m| m.alive).map(|m| &m.key)
    }

    /// The Kademlia keys of every member, present or departed (as [`Membership::peers`]).
    pub fn peer_keys(&self) -> impl Iterator<Item = &KBucketKey<PeerId>> + Clone {
        self.members.values().filter(|m| m.known()).map(|m| &m.key)
    }

    /// The alive member closest to `key`, if it is closer than `than`.
    pub fn closest_alive<T: Clone>(&self, key: &KBucketKey<T>, than: &KBucketKey<PeerId>) -> Option<PeerId> {
        let mine = than.distance(key);
        self.members
            .iter()
            .filter(|(_, m)| m.alive)
            .map(|(p, m)| (m.key.distance(key), *p))
            .filter(|(d, _)| *d < mine)
            .min()
            .map(|(_, p)| p)
    }

    /// Every member, present or departed (this peer not included): counted here, or
    /// alive here once.
    pub fn peers(&self) -> impl Iterator<Item = &PeerId> + Clone {
        self.members.iter().filter(|(_, m)| m.known()).map(|(p, _)| p)
    }

    /// Members not alive now (departed within the window, or frozen in a minority).
    pub fn departed(&self) -> impl Iterator<Item = &PeerId> {
        self.members.iter().filter(|(_, m)| m.departed()).map(|(p, _)| p)
    }

    /// A Kademlia bootstrap completed: it counts toward joining if a sigma peer is
    /// alive here.
    pub fn bootstrapped(&mut self) {
        if self.joining && self.up + self.pending > 0 {
            self.bootstrapped = true;
            self.join_if_done();
        }
    }

    /// Members counted toward the majority, this peer included.
    pub fn members(&self) -> usize {
        self.counted + 1
    }

    /// Reachable members (counted, and alive: connected or heartbeat fresh), this peer
    /// excluded.
    pub fn reachable(&self) -> usize {
        self.up
    }

    /// Alive peers not counted toward the majority: newcomers alive while this peer had
    /// no majority (counted once it has one), or peers off the fixed list.
    pub fn uncounted(&self) -> usize {
        self.pending
    }

    /// Whether this peer may serve, and why not.
    pub fn readiness(&self) -> Readiness {
        if self.leaving {
            return Readiness::Leaving;
        }
        if self.joining {
            return Readiness::Joining;
        }
        if !self.dialable {
            return Readiness::Unreachable;
        }
        let (reachable, members) = (self.reachable() + 1, self.members());
        if 2 * reachable <= members {
            return Readiness::Minority { reachable, members };
        }
        if let Some((reachable, of)) = self.joint_unmet() {
            return Readiness::Joint { reachable, of };
        }
        if self.own_join_pending() {
            return Readiness::Counting;
        }
        match self.half_unmet() {
            Some((reachable, members)) => Readiness::Half { reachable, members },
            None => Readiness::Serving,
        }
    }

    /// Joined, and a majority of the members (this peer included) reachable, and of
    /// the view of every pending joint quorum: no island, whether or not this peer can
    /// be dialled (an unreachable peer's acquisitions are served by the others).
    pub fn majority(&self) -> bool {
        !self.joining && 2 * (self.reachable() + 1) > self.members() && self.joint_unmet().is_none()
    }

    /// Whether other peers can dial this one: a peer that cannot serves nothing (and
    /// starts serving again, under the takeover delay, once it can).
    pub fn set_dialable(&mut self, dialable: bool) {
        self.dialable = dialable;
    }

    /// Not joining any more (acquisitions may start).
    pub fn ready(&self) -> bool {
        !self.joining
    }

    /// Times this peer found its event loop stalled past the liveness timeout.
    pub fn stalls(&self) -> u64 {
        self.stalls
    }

    /// Housekeeping: call on every event and at least once a second. Notices stalls
    /// and the start and end of serving; once a second, ages out departed members (only
    /// while serving) and past departures. Returns true when serving *stopped* or
    /// restarted: the owner must drop every hosted replica.
    pub fn tick(&mut self, now: Time) -> bool {
        let stalled = self.last_tick.is_some_and(|t| now.saturating_sub(t) >= self.liveness);
        self.last_tick = Some(now);
        if stalled {
            self.stalls += 1;
        }
        if self.last_aged.is_none_or(|t| now.saturating_sub(t) >= Duration::from_secs(1)) {
            self.last_aged = Some(now);
            // Heartbeats that went stale: their members depart.
            let stale: Vec<PeerId> =
                self.members.iter().filter(|(_, m)| m.alive && !m.alive_at(now)).map(|(p, _)| *p).collect();
            for p in stale {
                self.recount(p, now);
            }
            if self.readiness() == Readiness::Serving {
                let window = self.window;
                let fixed = &self.fixed;
                let gone: Vec<PeerId> = self
                    .members
                    .iter()
                    .filter(|(p, m)| {
                        !m.alive
                            && now.saturating_sub(m.left_at) >= window
                            && !fixed.as_ref().is_some_and(|l| l.contains(*p))
                    })
                    .map(|(p, _)| *p)
                    .collect();
                for p in &gone {
                    // Out of the joint quorums first: that reads its part in them.
                    self.joint_gone(p);
                    if self.members.remove(p).is_some_and(|m| m.known()) {
                        self.forgotten.push(*p);
                    }
                }
                if !gone.is_empty() {
                    self.counted = self.members.values().filter(|m| m.counted).count();
                    self.members_delay_stale = true;
                }
            }
            self.end_split_if_done();
            self.decide_split();
            if self.members_delay_stale {
                self.recompute_members_delay();
            }
            if self.inherited.is_some_and(|(_, until)| now >= until) {
                self.inherited = None;
            }
            let delay = self.delay();
            self.departures.retain(|(_, t)| now.saturating_sub(*t) < delay);
            if self.overflow_until.is_some_and(|t| t + delay <= now) {
                self.overflow_until = None;
            }
        }
        let serving = self.readiness() == Readiness::Serving;
        if self.fixed.is_none() && self.pending > 0 && self.majority() && self.joint_room() {
            // A majority again (or room for a joint quorum again): the newcomers that
            // came while it had none are counted now (alive, they add as many to the
            // reachable as to the members), each with its joint quorum.
            let newcomers: Vec<PeerId> =
                self.members.iter().filter(|(_, m)| m.alive && !m.counted).map(|(p, _)| *p).collect();
            for p in newcomers {
                if !self.admit(&p) {
                    break;
                }
            }
        }
        match (self.serving_since, serving) {
            (None, true) => {
                self.serving_since = Some(now);
                false
            }
            (Some(_), false) => {
                self.serving_since = None;
                true
            }
            (Some(_), true) if stalled => {
                self.serving_since = Some(now);
                true
            }
            _ => false,
        }
    }

    /// Serving now (as of the last [`Membership::tick`]).
    pub fn serving(&self) -> bool {
        self.serving_since.is_some()
    }

    /// Until when a replica started now must grant nothing, if at all: one delay after
    /// serving began, or after a member `closer` to the replica's key than this peer
    /// departed (or one was forgotten for lack of room).
    pub fn hold_until(&self, now: Time, closer: impl Fn(&PeerId) -> bool) -> Option<Time> {
        let delay = self.delay();
        let began = self.serving_since.map(|t| t + delay);
        let departed = self.departures.iter().filter(|(p, _)| closer(p)).map(|(_, t)| *t + delay).max();
        [began, departed, self.overflow_until.map(|t| t + delay)].into_iter().flatten().max().filter(|t| *t > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::liveness::{self, Refused};

    const S: Duration = Duration::from_secs(1);

    fn view(joining: bool) -> Membership {
        Membership::new(joining, 60 * S, 10 * S, 3 * S)
    }

    /// Each of `peers` sends its own table, listing the others as members it counts
    /// (a swarm whose gossip has gone round).
    fn tabled(m: &mut Membership, peers: &[PeerId]) {
        for p in peers {
            m.counted_by(p, peers.iter().copied().filter(|q| q != p), false);
        }
    }

    #[test]
    fn a_one_node_swarm_serves_and_holds_its_first_replicas_one_delay() {
        let mut m = view(false);
        assert!(!m.tick(Duration::ZERO));
        assert_eq!(m.readiness(), Readiness::Serving);
        assert_eq!(m.hold_until(Duration::ZERO, |_| false), Some(10 * S));
    }

    #[test]
    fn a_peer_no_one_can_dial_serves_only_once_it_can_and_then_holds_one_delay() {
        let mut m = view(false);
        m.set_dialable(false);
        assert!(!m.tick(Duration::ZERO));
        assert_eq!(m.readiness(), Readiness::Unreachable);
        assert!(!m.serving());
        m.set_dialable(true);
        assert!(!m.tick(5 * S));
        assert!(m.serving());
        assert_eq!(m.hold_until(5 * S, |_| false), Some(15 * S), "one delay from when it became dialable");
        m.set_dialable(false);
        assert!(m.tick(6 * S), "serving stopped: the owner drops its replicas");
        assert_eq!(m.readiness(), Readiness::Unreachable);
    }

    #[test]
    fn a_joining_peer_is_ready_after_a_bootstrap_with_a_peer_and_a_serving_peer_heard() {
        let mut m = view(true);
        m.tick(Duration::ZERO);
        m.bootstrapped();
        assert_eq!(m.readiness(), Readiness::Joining, "a bootstrap with nobody connected does not count");
        let p = PeerId::random();
        m.connected(p, S);
        m.bootstrapped();
        m.tick(S);
        assert_eq!(m.readiness(), Readiness::Joining, "no serving peer heard yet");
        assert_eq!(m.uncounted(), 1, "a peer that does not serve counts no newcomer");
        m.joined_through(p, [], &[], None, None, S);
        m.tick(S);
        assert_eq!(m.readiness(), Readiness::Serving);
        assert!(m.serving());
        assert_eq!((m.reachable(), m.members(), m.uncounted()), (1, 2, 0));
    }

    /// Issue 40, scenario 1: peers A, B, C; the cut {A} | {B, C}; D and E join through
    /// A during it. Counted, they would make A reach 3 of 5 (and D and E, 3 of 3).
    #[test]
    fn a_minority_counts_no_newcomer_until_it_serves_again() {
        let mut a = view(false);
        let (b, c) = (PeerId::random(), PeerId::random());
        a.connected(b, Duration::ZERO);
        a.connected(c, Duration::ZERO);
        a.tick(Duration::ZERO);
        assert!(a.serving());
        a.disconnected(b, S);
        a.disconnected(c, S);
        assert!(a.tick(S), "serving stopped");
        let (d, e) = (PeerId::random(), PeerId::random());
        a.connected(d, 2 * S);
        a.connected(e, 2 * S);
        a.tick(2 * S);
        assert_eq!(a.readiness(), Readiness::Minority { reachable: 1, members: 3 }, "the newcomers counted");
        assert_eq!(a.uncounted(), 2);
        assert!(a.is_alive(&d), "alive all the same (it hosts the keys it is closest to)");
        // One newcomer departs and comes back: still not counted.
        a.disconnected(d, 3 * S);
        a.connected(d, 4 * S);
        a.tick(4 * S);
        assert_eq!(a.readiness(), Readiness::Minority { reachable: 1, members: 3 });
        // Healed: A serves on its old members, and counts the newcomers then.
        a.connected(b, 5 * S);
        a.connected(c, 5 * S);
        a.tick(5 * S);
        assert!(a.serving());
        assert_eq!((a.reachable() + 1, a.members(), a.uncounted()), (5, 5, 0));
        // Counted now, each with its joint quorum: until B and C count them too, a cut
        // of A with them is not a majority of the members A counted before them.
        assert_eq!(a.joints_pending(), 3, "C (met after B at the start), D and E");
        a.disconnected(b, 6 * S);
        a.disconnected(c, 6 * S);
        assert!(a.tick(6 * S), "serving stopped");
        assert_eq!(a.readiness(), Readiness::Joint { reachable: 1, of: 2 }, "A and B, before C");
        // B and C count them (their tables say so): they are members like the others,
        // and a cut of A with them is 3 of 5 (B and C reach 2 of 5).
        a.connected(b, 7 * S);
        a.connected(c, 7 * S);
        tabled(&mut a, &[b, c, d, e]);
        assert_eq!(a.joints_pending(), 0);
        a.disconnected(b, 8 * S);
        a.disconnected(c, 8 * S);
        a.tick(8 * S);
        assert_eq!(a.readiness(), Readiness::Serving, "A, D and E: 3 of 5, the change known to B and C");
    }

    /// Issue 40's known gap: D and E join A just before the cut {A, D, E} | {B, C}, while
    /// A still serves, and A counts them. Each has its joint quorum, the members A
    /// counted just before it; A reaches 3 of 5 once it notices the cut, but 1 of the 3
    /// of its view before D: it stops serving (B and C, 2 of 3, serve). Healed, it
    /// serves again under the takeover delay, as after any stop.
    #[test]
    fn a_newcomer_counted_while_serving_needs_a_majority_of_the_view_before_it() {
        let mut a = view(false);
        let (b, c, d, e) = (PeerId::random(), PeerId::random(), PeerId::random(), PeerId::random());
        a.connected(b, Duration::ZERO);
        a.connected(c, Duration::ZERO);
        tabled(&mut a, &[b, c]);
        a.tick(Duration::ZERO);
        assert_eq!((a.serving(), a.joints_pending()), (true, 0));
        a.connected(d, S);
        a.connected(e, S);
        a.tick(S);
        assert_eq!((a.reachable() + 1, a.members(), a.joints_pending()), (5, 5, 2), "counted while serving");
        // The cut, noticed.
        a.disconnected(b, 2 * S);
        a.disconnected(c, 2 * S);
        assert!(a.tick(2 * S), "serving stopped: the owner drops its replicas");
        assert_eq!(a.readiness(), Readiness::Joint { reachable: 1, of: 3 });
        assert!(!a.majority(), "no newcomer is counted meanwhile");
        let f = PeerId::random();
        a.connected(f, 3 * S);
        a.tick(3 * S);
        assert_eq!((a.members(), a.uncounted()), (5, 1));
        assert!(a.readiness().to_string().contains("1 of the 3 peers of its view before a recent join"));
        // Healed: serving again, one takeover delay before any replica grants.
        a.connected(b, 4 * S);
        a.connected(c, 4 * S);
        assert!(!a.tick(4 * S));
        assert!(a.serving());
        assert_eq!(a.hold_until(4 * S, |_| false), Some(14 * S), "resumed under the delay");
        assert_eq!((a.members(), a.uncounted(), a.joints_pending()), (6, 0, 3), "F counted now, with its own");
    }

    /// A member leaves a newcomer's joint quorum only by its own table (one that came
    /// over its own connection) listing the newcomer as counted: a table of another
    /// peer says nothing of it, a relayed heartbeat neither, and a restart of the member
    /// undoes what it said.
    #[test]
    fn a_joint_quorum_shrinks_only_by_the_members_own_tables() {
        let mut a = view(false);
        let mut members = signed(3);
        let (b, c, d) = (members[0].0, members[1].0, members[2].0);
        a.connected(b, Duration::ZERO);
        a.connected(c, Duration::ZERO);
        tabled(&mut a, &[b, c]);
        a.tick(Duration::ZERO);
        a.connected(d, S);
        a.tick(S);
        assert_eq!(a.joints_pending(), 1);
        assert!(a.awaits(&b, Some(&d)) && a.awaits(&c, Some(&d)) && !a.awaits(&d, Some(&d)));
        // D's own table, and B's naming what C counts, do not speak for C.
        a.counted_by(&d, [b, c], false);
        a.counted_by(&b, [c, d], false);
        assert!(!a.awaits(&b, Some(&d)), "B counts D, in its own words");
        assert!(a.awaits(&c, Some(&d)), "nobody speaks for C but C");
        relayed(&mut a, &mut members[1], 1, S, None).unwrap();
        relayed(&mut a, &mut members[1], 2, S, None).unwrap();
        assert!(a.awaits(&c, Some(&d)), "C's heartbeat relayed by someone says nothing of what C counts");
        // B restarts: what it said is void.
        a.heard(b, (1, 1), Duration::ZERO, S, None);
        a.heard(b, (1, 2), Duration::ZERO, S, None);
        assert!(!a.awaits(&b, Some(&d)), "B's beats, first heard and advancing");
        a.heard(b, (2, 1), Duration::ZERO, S, None);
        assert!(a.awaits(&b, Some(&d)), "a later incarnation of B has not counted D yet");
        a.counted_by(&b, [d], false);
        a.counted_by(&c, [d], false);
        assert_eq!(a.joints_pending(), 0, "the whole view counts D");
        // With C cut off now, A and B are 2 of 3 of the old view and 3 of 4 members.
        a.disconnected(c, 2 * S);
        a.tick(2 * S);
        assert!(a.serving());
    }

    /// A joint quorum's view loses the members that are no longer members here (an
    /// operator's forget, a signed leave, the window), and it ends when its newcomer is
    /// no longer a member.
    #[test]
    fn a_joint_quorum_follows_members_that_are_forgotten() {
        let mut a = view(false);
        let mut members = signed(2);
        let (b, c) = (members[0].0, members[1].0);
        let (d, e) = (PeerId::random(), PeerId::random());
        a.connected(b, Duration::ZERO);
        a.connected(c, Duration::ZERO);
        tabled(&mut a, &[b, c]);
        a.connected(d, S);
        a.connected(e, S);
        a.tick(S);
        assert_eq!(a.joints_pending(), 2);
        // C killed; the operator forgets it: it leaves both views.
        a.disconnected(c, 2 * S);
        a.tick(2 * S);
        assert_eq!(a.forget(&c, 2 * S), Ok(()));
        a.counted_by(&b, [d, e], false);
        a.counted_by(&d, [e], false);
        assert_eq!(a.joints_pending(), 0, "B counts both, D counts E: nobody else is left to wait for");
        // A leave: B's signed leave takes it out of the view of a newer newcomer.
        let f = PeerId::random();
        a.connected(f, 3 * S);
        a.tick(3 * S);
        assert_eq!(a.joints_pending(), 1);
        let wall = liveness::wall_ms();
        relayed(&mut a, &mut members[0], 1, 3 * S, None).unwrap();
        assert_eq!(a.heard_leave(&members[0].1.leave().unwrap(), wall, 3 * S), Ok(true));
        a.counted_by(&d, [f], false);
        a.counted_by(&e, [f], false);
        assert_eq!(a.joints_pending(), 0, "B is out of F's view");
        // A newcomer forgotten: its joint quorum ends with it.
        let g = PeerId::random();
        a.connected(g, 4 * S);
        a.tick(4 * S);
        assert_eq!(a.joints_pending(), 1);
        a.disconnected(g, 5 * S);
        a.tick(5 * S);
        assert_eq!(a.forget(&g, 5 * S), Ok(()));
        assert_eq!(a.joints_pending(), 0);
    }

    /// A joining peer takes its voucher's view as its own, and with it the changes of
    /// that view not yet known to every member there (the voucher's newcomers with a
    /// joint quorum pending, the voucher's own join) and its own join: each a joint
    /// quorum of the view's other members. Joined through A, which counts D with a joint
    /// quorum pending, E needs a majority of A, B and C until each of them counts D and E.
    #[test]
    fn a_joining_peer_takes_over_its_vouchers_pending_changes() {
        let (a, b, c, d) = (PeerId::random(), PeerId::random(), PeerId::random(), PeerId::random());
        let mut e = view(true);
        e.connected(a, S);
        e.bootstrapped();
        for p in [b, c, d] {
            e.heard(p, (1, 1), Duration::ZERO, S, None);
        }
        e.joined_through(a, [b, c, d], &[d], None, None, S);
        assert_eq!(e.joints_pending(), 2, "D's, and its own join");
        e.connected(d, S);
        e.tick(S);
        assert_eq!(e.readiness(), Readiness::Joint { reachable: 1, of: 3 }, "3 of 5 members, 1 of A, B and C");
        for p in [b, c] {
            e.heard(p, (1, 2), Duration::ZERO, 2 * S, None);
        }
        e.tick(2 * S);
        assert!(e.serving());
        assert!(e.awaits(&b, Some(&d)) && e.awaits(&b, None), "B counts neither yet");
        assert!(!e.awaits(&d, None), "D is not of the view");
        for p in [a, b] {
            e.counted_by(&p, [d], true);
        }
        e.counted_by(&c, [d], false);
        assert_eq!(e.joints_pending(), 1, "C has not counted E");
        e.counted_by(&c, [], true);
        assert_eq!(e.joints_pending(), 0);
        // A table whose every member is pending names no view to hold them to.
        let mut f = view(true);
        f.connected(a, S);
        f.bootstrapped();
        f.heard(d, (1, 1), Duration::ZERO, S, None);
        f.joined_through(a, [d], &[a, d], None, None, S);
        assert_eq!(f.readiness(), Readiness::Joining, "not joined through it");
    }

    /// At most [`MAX_JOINTS`] joint quorums are pending: a newcomer past them is not
    /// counted (alive, uncounted) until one ends.
    #[test]
    fn joint_quorums_are_bounded_and_a_newcomer_past_them_waits() {
        let mut a = view(false);
        let b = PeerId::random();
        a.connected(b, Duration::ZERO);
        let newcomers: Vec<PeerId> = (0..=MAX_JOINTS).map(|_| PeerId::random()).collect();
        for x in &newcomers {
            a.connected(*x, S);
        }
        a.tick(S);
        assert_eq!((a.joints_pending(), a.uncounted()), (MAX_JOINTS, 1));
        assert!(a.serving(), "every view reached");
        a.counted_by(&b, [newcomers[0]], false);
        assert_eq!(a.joints_pending(), MAX_JOINTS - 1, "the first one's view was A and B");
        a.tick(2 * S);
        assert_eq!((a.joints_pending(), a.uncounted()), (MAX_JOINTS, 0), "the last one counted now");
    }

    /// A joining peer counts the peer it joined through and the members that peer named:
    /// its first majority is one of a serving peer's members, not of whoever it reaches.
    #[test]
    fn a_joining_peer_counts_the_members_of_the_peer_it_joined_through() {
        let mut d = view(true);
        let (a, b, c) = (PeerId::random(), PeerId::random(), PeerId::random());
        d.connected(a, Duration::ZERO);
        d.bootstrapped();
        for p in [b, c] {
            d.heard(p, (1, 1), Duration::ZERO, Duration::ZERO, None);
        }
        d.joined_through(a, [b, c], &[], Some(66 * S), None, Duration::ZERO);
        assert_eq!(d.delay(), 66 * S, "the delay in force where it joined");
        assert_eq!(d.members_delay(), 10 * S, "not handed on to its own joiners");
        d.tick(Duration::ZERO);
        assert_eq!(d.readiness(), Readiness::Minority { reachable: 2, members: 4 }, "b and c not heard alive yet");
        d.heard(b, (1, 2), Duration::ZERO, S, None);
        d.tick(S);
        assert!(d.serving(), "3 of 4");
        // Only the first serving peer heard vouches; later ones are ordinary gossip.
        let x = PeerId::random();
        d.heard(x, (1, 1), Duration::ZERO, S, None);
        d.joined_through(x, [], &[], Some(600 * S), None, S);
        assert_eq!(d.members(), 4);
        assert_eq!(d.delay(), 66 * S);
        // Kept for one membership window.
        for t in 2..=61u32 {
            d.heard(b, (1, u64::from(t) + 1), Duration::ZERO, t * S, None);
            d.tick(t * S);
        }
        assert_eq!(d.delay(), 10 * S);
    }

    /// Issue 40, scenario 2: settings differ per peer. The takeover delay in force is the
    /// longest own delay of this peer and its members, present or departed; a stale
    /// relay does not change it, a remote value is capped, and it shrinks back once the
    /// member with the long one is forgotten.
    #[test]
    fn the_takeover_delay_is_the_longest_of_the_members() {
        let mut m = view(false);
        m.tick(Duration::ZERO);
        let (p, q) = (PeerId::random(), PeerId::random());
        // Two members that stay, so that this peer serves (and forgets) throughout.
        for r in [PeerId::random(), PeerId::random()] {
            m.connected(r, Duration::ZERO);
        }
        m.connected(p, Duration::ZERO);
        m.heard(p, (1, 1), Duration::ZERO, Duration::ZERO, None);
        m.heard_delay(&p, (1, 1), 66 * S);
        assert_eq!(m.delay(), 66 * S, "a member with a 60 s lease");
        assert_eq!(m.own_delay(), 10 * S);
        m.heard_delay(&p, (1, 0), 17 * S);
        assert_eq!(m.delay(), 66 * S, "a stale relay is ignored");
        // Heard of only (never alive here): not counted yet.
        m.heard(q, (1, 1), Duration::ZERO, Duration::ZERO, None);
        m.heard_delay(&q, (1, 1), 100 * 3600 * S);
        assert_eq!(m.delay(), 66 * S);
        m.heard(q, (1, 2), Duration::ZERO, S, None);
        m.heard_delay(&q, (1, 2), 100 * 3600 * S);
        assert_eq!(m.delay(), MAX_TAKEOVER_DELAY, "alive: its delay counts, capped");
        // Departed members still count (their votes may be out there) ...
        m.disconnected(p, 5 * S);
        m.tick(5 * S);
        assert!(!m.is_alive(&p) && !m.is_alive(&q));
        assert!(m.serving());
        assert_eq!(m.hold_until(5 * S, |x| *x == p), Some(5 * S + MAX_TAKEOVER_DELAY));
        // ... until they are forgotten.
        for t in 6..=70 {
            m.tick(t * S);
        }
        assert_eq!(m.members(), 3, "both forgotten after the window");
        assert_eq!(m.delay(), 10 * S);
    }

    /// With a fixed member list (an allow-list) the majority is one of the list, and a
    /// joining peer needs no serving peer: any two majorities of the list overlap.
    #[test]
    fn with_a_member_list_the_majority_is_of_the_list() {
        let local = PeerId::random();
        let list: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
        let mut m = view(true).with_members(list.iter().copied().chain([local]), local);
        assert_eq!(m.members(), 5);
        m.connected(list[0], Duration::ZERO);
        m.bootstrapped();
        m.tick(Duration::ZERO);
        assert_eq!(m.readiness(), Readiness::Minority { reachable: 2, members: 5 }, "joined without a voucher");
        // A peer off the list is alive but never counted, serving or not.
        let stranger = PeerId::random();
        m.connected(stranger, S);
        m.connected(list[1], S);
        m.tick(S);
        assert!(m.serving(), "3 of the 5 listed");
        assert_eq!((m.reachable() + 1, m.members(), m.uncounted()), (3, 5, 1));
        // Listed peers never met are not forgotten after the window.
        for t in 2..200 {
            m.tick(t * S);
        }
        assert_eq!(m.members(), 5);
    }

    #[test]
    fn the_minority_stops_and_never_ages_the_majority_out() {
        let mut m = view(false);
        let peers: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
        for p in &peers {
            m.connected(*p, Duration::ZERO);
        }
        m.tick(Duration::ZERO);
        assert!(m.serving());
        // A 2/3 split: this peer keeps one of four.
        for p in &peers[1..] {
            m.disconnected(*p, S);
        }
        assert!(m.tick(S), "serving stopped");
        assert_eq!(m.readiness(), Readiness::Minority { reachable: 2, members: 5 });
        for t in 2..1000 {
            m.tick(t * S);
        }
        assert_eq!(m.readiness(), Readiness::Minority { reachable: 2, members: 5 }, "nobody aged out");
        // Healed: serving again, every new replica held one delay.
        for p in &peers[1..] {
            m.connected(*p, 1000 * S);
        }
        m.tick(1000 * S);
        assert!(m.serving());
        assert_eq!(m.hold_until(1000 * S, |_| false), Some(1010 * S));
    }

    #[test]
    fn the_majority_ages_departed_members_out_and_holds_their_keys_one_delay() {
        let mut m = view(false);
        let peers: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
        for p in &peers {
            m.connected(*p, Duration::ZERO);
        }
        tabled(&mut m, &peers);
        for t in 0..=20 {
            m.tick(t * S); // past the start delay
        }
        m.disconnected(peers[0], 21 * S);
        assert!(!m.tick(21 * S));
        assert!(m.serving(), "4 of 5 reachable");
        assert_eq!(m.hold_until(21 * S, |p| *p == peers[0]), Some(31 * S), "the departed peer was closer");
        assert_eq!(m.hold_until(21 * S, |p| *p == peers[1]), None, "a key nobody left");
        for t in 22..=32 {
            m.tick(t * S);
        }
        assert_eq!(m.hold_until(32 * S, |p| *p == peers[0]), None, "the delay is over");
        assert_eq!(m.members(), 5);
        for t in 33..=81 {
            m.tick(t * S);
        }
        assert_eq!(m.members(), 4, "aged out after the window");
    }

    #[test]
    fn a_stall_past_the_liveness_timeout_restarts_serving() {
        let mut m = view(false);
        m.tick(Duration::ZERO);
        m.tick(S);
        assert!(m.tick(5 * S), "silent for 4 s > 3 s");
        assert_eq!(m.stalls(), 1);
        assert_eq!(m.hold_until(5 * S, |_| false), Some(15 * S));
    }

    #[test]
    fn a_50_50_split_serves_on_neither_side() {
        let mut m = view(false);
        let peers: Vec<PeerId> = (0..3).map(|_| PeerId::random()).collect();
        for p in &peers {
            m.connected(*p, Duration::ZERO);
        }
        m.tick(Duration::ZERO);
        m.disconnected(peers[0], S);
        m.disconnected(peers[1], S);
        m.tick(S);
        assert_eq!(m.readiness(), Readiness::Minority { reachable: 2, members: 4 });
    }

    /// Members with keys of their own, each with its heartbeat chain.
    fn signed(n: usize) -> Vec<(PeerId, liveness::Chain)> {
        (0..n)
            .map(|_| {
                let key = libp2p::identity::Keypair::generate_ed25519();
                (key.public().to_peer_id(), liveness::Chain::new(key, liveness::wall_ms(), None))
            })
            .collect()
    }

    /// `m` hears beat `counter` of `member` relayed by a third peer (with its proof if
    /// `proven`).
    fn relayed(
        m: &mut Membership,
        member: &mut (PeerId, liveness::Chain),
        counter: u64,
        now: Time,
        echo: Option<u64>,
    ) -> Result<bool, Refused> {
        let proof = member.1.proof(counter);
        let beat = (member.1.incarnation(), counter);
        let record = Record { peer: member.0, beat, age: Duration::ZERO, delay_ms: None, proof: proof.as_ref() };
        m.heard_record(record, &PeerId::random(), now, liveness::wall_ms(), echo, &mut 0)
    }

    /// A serving view with `n` members alive by gossip (each heard at beats 1 and 2).
    fn alive_by_gossip(n: usize) -> (Membership, Vec<(PeerId, liveness::Chain)>) {
        let mut m = view(false);
        m.tick(Duration::ZERO);
        let mut members = signed(n);
        for member in &mut members {
            relayed(&mut m, member, 1, Duration::ZERO, None).unwrap();
            relayed(&mut m, member, 2, S, None).unwrap();
        }
        m.tick(S);
        (m, members)
    }

    #[test]
    fn a_gossip_reply_leaves_out_what_the_request_held_as_new() {
        let mut m = view(false);
        let mut members = signed(4);
        let peers: Vec<PeerId> = members.iter().map(|(p, _)| *p).collect();
        // Alive here by gossip: each heard at beat 1, then 2.
        for member in &mut members {
            relayed(&mut m, member, 1, Duration::ZERO, None).unwrap();
            relayed(&mut m, member, 2, S, None).unwrap();
        }
        m.tick(S);
        let all = |m: &Membership, reply_to| {
            let mut v: Vec<PeerId> = m.beats(S, reply_to, &[]).map(|(p, ..)| p).collect();
            v.sort();
            v
        };
        let mut expected = peers.clone();
        expected.sort();
        assert_eq!(all(&m, None), expected, "every alive member is gossiped");
        // A request holds peer 0 newer than here, peer 1 as new, peer 2 older; not peer 3.
        let x = m.next_exchange();
        relayed(&mut m, &mut members[0], 3, S, Some(x)).unwrap();
        relayed(&mut m, &mut members[1], 2, S, Some(x)).unwrap();
        relayed(&mut m, &mut members[2], 1, S, Some(x)).unwrap();
        let mut newer = vec![peers[2], peers[3]];
        newer.sort();
        assert_eq!(all(&m, Some(x)), newer, "the reply: what is newer here, and what the request lacked");
        assert_eq!(all(&m, None), expected, "a round's table is still whole");
        let y = m.next_exchange();
        assert_eq!(all(&m, Some(y)), expected, "the marks are per request");
        // A request whose joint quorums wait on peer 1 gets peer 1's record back: the
        // reply says whether this peer counts it.
        let mut kept: Vec<PeerId> = m.beats(S, Some(x), &peers[1..2]).map(|(p, ..)| p).collect();
        kept.sort();
        let mut with_1 = vec![peers[1], peers[2], peers[3]];
        with_1.sort();
        assert_eq!(kept, with_1, "kept though the request held it as new");
    }

    /// A joining peer counts the members its voucher's table names: a reply to a peer
    /// that does not serve is whole, even of what the request held as new.
    #[test]
    fn a_reply_to_a_peer_that_does_not_serve_is_whole() {
        let (mut m, mut members) = alive_by_gossip(3);
        let x = m.next_exchange();
        for member in &mut members {
            relayed(&mut m, member, 2, S, Some(x)).unwrap();
        }
        let local = PeerId::random();
        let request = |serving| crate::wire::Gossip {
            beats: Vec::new(),
            serving,
            delay_ms: None,
            leaves: Vec::new(),
            joints: Vec::new(),
            group: None,
            acks: false,
        };
        let named = |g: crate::wire::Gossip| g.beats.iter().filter(|b| b.peer != local).count();
        assert_eq!(named(m.reply(local, None, S, &request(true), x)), 0, "a serving peer held them all");
        assert_eq!(named(m.reply(local, None, S, &request(false), x)), 3, "a joining peer gets every member");
    }

    /// An acknowledgement request carries only the asker's beat and pending changes, and
    /// its reply only the replier's beat and its records of those changes, each saying
    /// whether the replier counts it: what ends the asker's joint quorums.
    #[test]
    fn an_ack_request_gets_the_records_of_its_changes_alone() {
        let (mut m, members) = alive_by_gossip(3);
        let local = PeerId::random();
        let ask = m.ack_request(local, None);
        assert!(ask.acks);
        assert_eq!(ask.beats.iter().map(|b| b.peer).collect::<Vec<_>>(), vec![local], "its own beat alone");
        let request = crate::wire::Gossip { beats: Vec::new(), serving: true, joints: vec![members[1].0], ..ask };
        let x = m.next_exchange();
        let reply = m.reply(local, None, S, &request, x);
        let named: Vec<(PeerId, bool)> = reply.beats.iter().map(|b| (b.peer, b.counted)).collect();
        assert_eq!(named, vec![(local, false), (members[1].0, m.is_counted(&members[1].0))]);
        assert!(!reply.acks, "a reply is a table");
        let y = m.next_exchange();
        let whole = m.reply(local, None, S, &crate::wire::Gossip { acks: false, ..request }, y);
        assert_eq!(whole.beats.len(), 4, "a round's request gets every record the asker lacks");
    }

    /// Only a member itself can refresh its heartbeat: a relayed beat without a proof,
    /// or with another beat's, is refused and changes nothing; a beat of the member
    /// itself, straight from it, needs none (the connection authenticates it) but is not
    /// relayed further.
    #[test]
    fn relayed_heartbeats_count_only_with_their_owners_proof() {
        let mut m = view(false);
        let mut members = signed(2);
        let (p, q) = (members[0].0, members[1].0);
        let inc = members[0].1.incarnation();
        relayed(&mut m, &mut members[0], 1, Duration::ZERO, None).unwrap();
        assert_eq!(relayed(&mut m, &mut members[0], 2, S, None), Ok(true), "proven: alive");
        let wall = liveness::wall_ms();
        let forged = Record { peer: p, beat: (inc, u64::MAX), age: Duration::ZERO, delay_ms: None, proof: None };
        assert_eq!(m.heard_record(forged, &q, S, wall, None, &mut 0), Err(Refused::Unproven));
        let stolen = members[0].1.proof(3);
        let forged = Record { proof: stolen.as_ref(), beat: (inc, 4), ..forged };
        assert_eq!(m.heard_record(forged, &q, S, wall, None, &mut 0), Err(Refused::BadToken));
        assert_eq!(relayed(&mut m, &mut members[0], 3, 2 * S, None), Ok(false), "its own next beat still counts");
        // Straight from q, without a proof: alive, but not relayed.
        let inc_q = members[1].1.incarnation();
        for (c, t) in [(1, 0), (2, 1)] {
            let own = Record { peer: q, beat: (inc_q, c), age: Duration::ZERO, delay_ms: None, proof: None };
            m.heard_record(own, &q, t * S, wall, None, &mut 0).unwrap();
        }
        assert!(m.is_alive(&q));
        assert_eq!(m.beats(2 * S, None, &[]).map(|(p, ..)| p).collect::<Vec<_>>(), vec![p]);
    }

    /// One table introduces at most [`MAX_NEW_PER_TABLE`] members, and with a member
    /// list none off it.
    #[test]
    fn a_table_introduces_a_bounded_number_of_members_and_none_off_the_list() {
        let mut m = view(false);
        let mut members = signed(MAX_NEW_PER_TABLE + 1);
        let (from, wall) = (PeerId::random(), liveness::wall_ms());
        let mut introduced = 0;
        let answers: Vec<_> = members
            .iter_mut()
            .map(|(p, c)| {
                let proof = c.proof(1);
                let record = Record {
                    peer: *p,
                    beat: (c.incarnation(), 1),
                    age: Duration::ZERO,
                    delay_ms: None,
                    proof: proof.as_ref(),
                };
                m.heard_record(record, &from, S, wall, None, &mut introduced)
            })
            .collect();
        assert!(answers[..MAX_NEW_PER_TABLE].iter().all(|a| a.is_ok()));
        assert_eq!(answers[MAX_NEW_PER_TABLE], Err(Refused::TooManyNew));
        let mut listed = view(false).with_members([members[0].0], PeerId::random());
        let proof = members[1].1.proof(2);
        let record = Record {
            peer: members[1].0,
            beat: (members[1].1.incarnation(), 2),
            age: Duration::ZERO,
            delay_ms: None,
            proof: proof.as_ref(),
        };
        assert_eq!(listed.heard_record(record, &from, S, wall, None, &mut 0), Err(Refused::NotListed));
    }

    /// A member's signed leave takes it out of both counts at once: three of five
    /// leaving leaves the two others serving, where three departures would leave them a
    /// minority until the window passed (and, not serving, forever). Its keys count as
    /// departed for one delay; a later incarnation of it is a newcomer; a leave not
    /// signed by the member, or of an older incarnation than heard, changes nothing.
    #[test]
    fn members_that_leave_are_out_of_every_count_at_once() {
        let mut m = view(false);
        let mut members = signed(4);
        for member in &mut members {
            relayed(&mut m, member, 1, Duration::ZERO, None).unwrap();
            relayed(&mut m, member, 2, S, None).unwrap();
        }
        m.tick(S);
        assert_eq!((m.reachable() + 1, m.members()), (5, 5));
        let wall = liveness::wall_ms();
        // Member 0's signature on member 1's leave.
        let mut forged = members[0].1.leave().unwrap();
        forged.peer = members[1].0;
        forged.incarnation = members[1].1.incarnation();
        assert_eq!(m.heard_leave(&forged, wall, S), Err(Refused::BadSignature));
        for member in &members[..3] {
            assert_eq!(m.heard_leave(&member.1.leave().unwrap(), wall, 2 * S), Ok(true));
        }
        assert_eq!(m.heard_leave(&members[0].1.leave().unwrap(), wall, 2 * S), Ok(false), "once");
        m.tick(2 * S);
        assert_eq!((m.reachable() + 1, m.members()), (2, 2), "two of two: serving");
        assert!(m.serving());
        assert_eq!(m.leaves().count(), 3, "relayed");
        let left = members[0].0;
        assert!(m.hold_until(2 * S, |p| *p == left).is_some(), "its keys wait out its votes");
        // Its beats of the incarnation that ended change nothing; a restart is a newcomer.
        assert_eq!(relayed(&mut m, &mut members[0], 3, 3 * S, None), Ok(false));
        assert!(!m.is_alive(&left));
        assert_eq!(m.departed().count(), 0, "a member that left is not dialled again");
        let key = libp2p::identity::Keypair::generate_ed25519();
        let mut again = (key.public().to_peer_id(), liveness::Chain::new(key.clone(), liveness::wall_ms(), None));
        relayed(&mut m, &mut again, 1, 3 * S, None).unwrap();
        relayed(&mut m, &mut again, 2, 3 * S, None).unwrap();
        assert_eq!(m.heard_leave(&again.1.leave().unwrap(), wall, 3 * S), Ok(true));
        let mut restarted = (again.0, liveness::Chain::new(key, again.1.incarnation() + 1, None));
        assert_eq!(relayed(&mut m, &mut restarted, 1, 4 * S, None), Ok(true), "a restart is a newcomer");
    }

    /// The operator forgets members gone for good (killed, never to return): out of
    /// both counts at once. Refused for a member alive here and for a listed one.
    #[test]
    fn an_operator_forgets_only_members_that_are_gone() {
        let mut m = view(false);
        let peers: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
        for p in &peers {
            m.connected(*p, Duration::ZERO);
        }
        m.tick(Duration::ZERO);
        for p in &peers[..3] {
            m.disconnected(*p, S);
        }
        m.tick(S);
        assert_eq!(m.readiness(), Readiness::Minority { reachable: 2, members: 5 });
        assert_eq!(m.forget(&peers[3], S), Err(ForgetError::Alive));
        assert_eq!(m.forget(&PeerId::random(), S), Err(ForgetError::Unknown));
        for p in &peers[..3] {
            assert_eq!(m.forget(p, S), Ok(()));
        }
        m.tick(2 * S);
        assert_eq!(m.readiness(), Readiness::Serving, "two of two");
        assert_eq!(m.take_forgotten().len(), 3, "they leave the routing table too");
        let mut list = view(false).with_members(peers.clone(), PeerId::random());
        assert_eq!(list.forget(&peers[0], S), Err(ForgetError::Listed));
    }
}
