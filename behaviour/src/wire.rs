//! The wire protocol: `/sigma/2.0.0`, CBOR-encoded (cbor4ii, as libp2p's
//! `request_response::cbor`) requests and replies in length-prefixed frames with request
//! ids, pipelined on one long-lived stream per connection and direction (the transport is
//! `behaviour/src/behaviour/link.rs`; the framing is [`encode_frame`], [`parse_frame`]).
//!
//! Two requests travel in both directions between any two peers:
//! - [`Request::Replica`]: a client's REQUEST, RELEASE or YIELD for replica `index` of
//!   `resource`; the reply carries the replica's RESPONSE for the sender, a redirect to
//!   a closer peer, or a rejection;
//! - [`Request::Notify`]: a replica's unsolicited RESPONSE (a promoted queue head, or the
//!   answer to a YIELD about another owner); the reply is an acknowledgement.
//!
//! Both travel alone or in a [`Request::Batch`]: what one step of this peer sends to one
//! peer (the REQUESTs of an acquisition for the replicas that peer hosts, a host's
//! RESPONSEs to one client) goes as one request, answered by one [`Reply::Batch`] with a
//! reply per item, in order.
//!
//! and four for operators, answered without changing any replica:
//! - [`Request::Inspect`]: the state of replica `index` (owner, lease, queue), answered
//!   with [`Reply::Replica`] or a redirect;
//! - [`Request::Holding`]: asks a lock's holder about its acquisition (token, validity,
//!   the value attached to it);
//! - [`Request::Revoke`]: asks a lock's holder to give the lock up (an operator's
//!   break-lock); the holder decides whether the sender may (see `Config::admin`);
//! - [`Request::Locks`]: asks a peer for the locks it holds and waits for (`sigma locks
//!   --swarm`), a page of at most [`MAX_LISTED_LOCKS`] at a time; the asker checks the
//!   answer ([`LockList::is_valid`]) before using it.
//!
//! Everything here comes from remote peers and is untrusted: [`validate_resource`] and
//! [`Request::validate`] are applied before anything reaches the core. Size limits are
//! deliberately small: a lock message is a few dozen bytes.

use std::sync::atomic::AtomicU64;

use libp2p::{Multiaddr, PeerId, StreamProtocol};
use serde::{Deserialize, Serialize};

use crate::proto::{Response, Timestamp, ToReplica, MAX_REPLICAS, RELAY_DEPTH};

/// Protocol name; the version is part of it. A peer speaking another version is not
/// offered this protocol and the exchange fails with `UnsupportedProtocols`.
/// (1.1.0: batches on request-response, a stream per request; 2.0.0: framed requests
/// and replies on one long-lived stream, [`encode_frame`], and RELAYs and RELEASEs
/// naming up to three waiters, which a 1.1.0 peer would refuse or drop.)
pub const PROTOCOL: StreamProtocol = StreamProtocol::new("/sigma/2.0.0");

/// The previous protocol (request-response, one stream per request): no longer spoken.
pub const OLD_PROTOCOL: StreamProtocol = StreamProtocol::new("/sigma/1.1.0");

/// Most items in a [`Request::Batch`] (a step that sends more to one peer is split):
/// the default lock's 32 REQUESTs to one peer go as one.
pub const MAX_BATCH: usize = 32;
/// Largest request accepted, in bytes: a full batch of the largest items (test
/// `a_full_batch_fits_the_frame_limits`).
pub const MAX_REQUEST_BYTES: u64 = 24 * 1024;
/// Largest reply accepted, in bytes: a full batch of the largest replies (a redirect
/// with a few long addresses each).
pub const MAX_REPLY_BYTES: u64 = 64 * 1024;
/// Longest resource name, in bytes.
pub const MAX_RESOURCE_LEN: usize = 200;
/// Most addresses sent with a redirect.
pub const MAX_REDIRECT_ADDRS: usize = 8;
/// Most waiters listed in a [`ReplicaState`] (the queue's length is always given).
pub const MAX_INSPECT_QUEUE: usize = 16;
/// Largest value a holder attaches to its lock ([`HoldingState::value`]), in bytes.
pub const MAX_VALUE_LEN: usize = 4096;
/// Most acquisitions in one [`LockList`] (a page: ask again from the last for more). A
/// full page of the longest names fits [`MAX_REPLY_BYTES`].
pub const MAX_LISTED_LOCKS: usize = 128;

/// A request between two sigma peers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Client → host of replica `index` of `resource`.
    Replica {
        /// Resource (lock) name.
        resource: String,
        /// Replica index, `0..n`.
        index: u16,
        /// Number of replicas the client uses for this resource.
        n: u16,
        /// The protocol message.
        msg: ToReplica<PeerId>,
    },
    /// Round-trip probe along the path a REQUEST takes (the host of replica `index`),
    /// without protocol work: the baseline of the acquire-latency benchmark. Answered
    /// with `Ack`, or a redirect like any replica message.
    Ping {
        /// Resource name.
        resource: String,
        /// Replica index.
        index: u16,
        /// Number of replicas.
        n: u16,
    },
    /// Replica host → client: an unsolicited RESPONSE.
    Notify {
        /// Resource name.
        resource: String,
        /// Replica index.
        index: u16,
        /// The RESPONSE.
        resp: Response<PeerId>,
    },
    /// Anyone → host of replica `index`: its state, for `sigma inspect`. Answered with
    /// [`Reply::Replica`], or a redirect like any replica message.
    Inspect {
        /// Resource name.
        resource: String,
        /// Replica index.
        index: u16,
        /// Number of replicas.
        n: u16,
    },
    /// Anyone → the peer that took acquisition `counter`: what it is now. Answered with
    /// [`Reply::Holding`].
    Holding {
        /// Resource name.
        resource: String,
        /// The acquisition's Lamport counter (its client is the receiver).
        counter: u64,
    },
    /// Operator → the holder of `resource` under fencing `token`: give it up. The
    /// holder's application learns it lost the lock (revoked), and the lock is released
    /// as by its holder. Answered with `Ack`, or `Rejected(NotHolder)` /
    /// `Rejected(NotAllowed)`.
    Revoke {
        /// Resource name.
        resource: String,
        /// The holder's fencing token.
        token: u64,
    },
    /// Anyone → any peer: the acquisitions it took that hold or wait (`sigma locks
    /// --swarm`). Answered with [`Reply::Locks`]: at most [`MAX_LISTED_LOCKS`], in
    /// (lock name, counter) order, from the first after `after`.
    Locks {
        /// List from the first acquisition after this one (lock name, Lamport counter);
        /// `None`: from the start.
        after: Option<(String, u64)>,
    },
    /// Several [`Request::Replica`], [`Request::Notify`], [`Request::Ping`] and
    /// [`Request::Inspect`] items for one peer (1 to
    /// [`MAX_BATCH`]), answered by a [`Reply::Batch`] with one reply per item, in order;
    /// each item is validated, rate-limited and answered as if it came alone.
    Batch(Vec<Request>),
}

/// A replica's state as its host sees it ([`Request::Inspect`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaState {
    /// Current owner, its grant stamp, and how long its lease still runs here (ms).
    pub owner: Option<(Timestamp<PeerId>, u64, u64)>,
    /// The first [`MAX_INSPECT_QUEUE`] waiters, in service order.
    pub queue: Vec<Timestamp<PeerId>>,
    /// Waiters in all.
    pub queue_len: u32,
    /// How long the takeover delay still holds its grants back (ms; 0: not held).
    pub held_back_ms: u64,
}

/// An acquisition as its own peer sees it ([`Request::Holding`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldingState {
    /// Whether it holds the lock (else it waits).
    pub held: bool,
    /// Fencing token (0 while waiting).
    pub token: u64,
    /// How long exclusion is still guaranteed (ms; 0 while waiting).
    pub valid_for_ms: u64,
    /// Votes it holds.
    pub votes: u16,
    /// The value its holder attached (at most [`MAX_VALUE_LEN`] bytes); absent from a
    /// peer that predates values, or when none was attached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_bytes::ByteBuf>,
    /// How many times the value was set (1 for the value given at acquire; 0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub value_version: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

impl HoldingState {
    /// Whether a remote peer's answer keeps within the bounds (an asker drops one
    /// that does not).
    pub fn is_valid(&self) -> bool {
        self.value.as_ref().is_none_or(|v| v.len() <= MAX_VALUE_LEN)
    }
}

/// One acquisition of the answering peer ([`Request::Locks`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockEntry {
    /// Lock name.
    pub resource: String,
    /// The acquisition's Lamport counter (its client is the answering peer).
    pub counter: u64,
    /// Whether it holds the lock (else it waits).
    pub held: bool,
    /// Fencing token (0 while waiting).
    pub token: u64,
    /// How long exclusion is still guaranteed (ms; 0 while waiting).
    pub valid_for_ms: u64,
    /// Votes it holds.
    pub votes: u16,
    /// Its place in line (1 = next) while waiting; `None` until m replicas answered.
    pub position: Option<u32>,
}

/// The answer to [`Request::Locks`]: a page of the answering peer's acquisitions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockList {
    /// At most [`MAX_LISTED_LOCKS`], in (lock name, counter) order.
    pub locks: Vec<LockEntry>,
    /// How many come after these (ask again after the last one for them).
    pub more: u32,
}

impl LockList {
    /// Within the bounds: at most [`MAX_LISTED_LOCKS`] entries, each a valid lock name.
    /// A peer's answer that is not is dropped (as no answer) and counted.
    pub fn is_valid(&self) -> bool {
        self.locks.len() <= MAX_LISTED_LOCKS && self.locks.iter().all(|l| validate_resource(&l.resource).is_ok())
    }
}

/// The reply to a [`Request`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// The replica's RESPONSE(s) for the sender (none, e.g. for a RELEASE).
    Responses(Vec<Response<PeerId>>),
    /// This peer does not host the replica: `peer` is closer to its key.
    Redirect {
        /// The closer peer.
        peer: PeerId,
        /// Some of its addresses.
        addrs: Vec<Multiaddr>,
    },
    /// The request was refused; nothing changed.
    Rejected(Rejection),
    /// Acknowledges a [`Request::Notify`], [`Request::Ping`] or [`Request::Revoke`].
    Ack,
    /// The answer to [`Request::Inspect`] (a replica this peer does not have is idle:
    /// the default state).
    Replica(ReplicaState),
    /// The answer to [`Request::Holding`]: `None` if the acquisition is not (or no
    /// longer) here.
    Holding(Option<HoldingState>),
    /// The answer to [`Request::Locks`].
    Locks(LockList),
    /// The answers to a [`Request::Batch`], one per item, in order.
    Batch(Vec<Reply>),
}

/// Why a request was refused. Counted per kind in the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Rejection {
    /// Resource name empty, too long, or with characters outside `[A-Za-z0-9._/-]`.
    BadResource,
    /// `index >= n`, `n == 0` or `n` above the maximum.
    BadIndex,
    /// The message names an acquisition of another peer than its sender.
    ForeignAcquisition,
    /// RELEASE or YIELD from a peer that neither owns nor waits on the replica.
    NotHolder,
    /// The acquisition was already released here.
    Finished,
    /// The replica's queue is full.
    QueueFull,
    /// A NOTIFY addressed to another peer.
    NotForMe,
    /// A timestamp, floor or token too far ahead of the receiver's clock.
    Ahead,
    /// The request's replica count is not the swarm's: every peer of a swarm must use
    /// the same n, or two clients could win on different replica sets.
    QuorumMismatch,
    /// A NOTIFY from a peer this node does not know as the host of that replica (a
    /// forged promotion, or a host that has just been replaced).
    NotHost,
    /// The peer serves no replica now: joining its swarm, on the minority side of a
    /// split, or starting over after a stall.
    NotServing,
    /// The peer hosts as many replicas as it may: a new one is refused.
    TooManyReplicas,
    /// The sender's requests created as many replicas here as one peer may.
    PeerQuota,
    /// The sender sent more requests than its budget allows; retry later.
    RateLimited,
    /// A [`Request::Revoke`] from a peer this one does not take such orders from.
    NotAllowed,
    /// The sender's acquisitions occupy as many queue entries here as one peer may (or
    /// all peers' together reach the cap): a new one is refused; queued ones are served.
    QueueQuota,
    /// A [`Request::Batch`] that is empty, longer than [`MAX_BATCH`], or holds something
    /// else than messages about one replica (a batch in a batch, an operator's question).
    BadBatch,
    /// A RELAY, or a RELEASE, naming more acquisitions than [`RELAY_DEPTH`].
    BadRelay,
}

impl Rejection {
    /// Stable label (metrics).
    pub fn as_str(&self) -> &'static str {
        match self {
            Rejection::BadResource => "bad_resource",
            Rejection::BadIndex => "bad_index",
            Rejection::ForeignAcquisition => "foreign_acquisition",
            Rejection::NotHolder => "not_holder",
            Rejection::Finished => "finished",
            Rejection::QueueFull => "queue_full",
            Rejection::NotForMe => "not_for_me",
            Rejection::Ahead => "ahead",
            Rejection::QuorumMismatch => "quorum_mismatch",
            Rejection::NotHost => "not_host",
            Rejection::NotServing => "not_serving",
            Rejection::TooManyReplicas => "too_many_replicas",
            Rejection::PeerQuota => "peer_quota",
            Rejection::RateLimited => "rate_limited",
            Rejection::NotAllowed => "not_allowed",
            Rejection::QueueQuota => "queue_quota",
            Rejection::BadBatch => "bad_batch",
            Rejection::BadRelay => "bad_relay",
        }
    }
}

/// Checks a resource name: 1 to [`MAX_RESOURCE_LEN`] bytes of `[A-Za-z0-9._/-]`.
pub fn validate_resource(name: &str) -> Result<(), Rejection> {
    let ok = !name.is_empty()
        && name.len() <= MAX_RESOURCE_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'/' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Rejection::BadResource)
    }
}

/// Checks `index < n <= MAX_REPLICAS`.
pub fn validate_index(index: u16, n: u16) -> Result<(), Rejection> {
    if n == 0 || usize::from(n) > MAX_REPLICAS || index >= n {
        Err(Rejection::BadIndex)
    } else {
        Ok(())
    }
}

/// The membership gossip protocol: heartbeats, so that a peer connected to a few
/// others knows which members are alive (ARCHITECTURE.md, "Membership gossip").
pub const GOSSIP_PROTOCOL: StreamProtocol = StreamProtocol::new("/sigma/members/1.0.0");

/// Most heartbeats in one gossip message (the members bound, `MAX_MEMBERS`).
pub const MAX_GOSSIP_BEATS: usize = 10_000;

/// Largest gossip message accepted (a full table of [`MAX_GOSSIP_BEATS`] fits).
pub const MAX_GOSSIP_BYTES: u64 = 4 * 1024 * 1024;

/// One member's heartbeat as a peer relays it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Beat {
    /// The member.
    pub peer: PeerId,
    /// Its incarnation (a restart starts a higher one).
    pub incarnation: u64,
    /// Its heartbeat counter within the incarnation.
    pub counter: u64,
    /// How long ago, in ms, the relaying peer (or one before it) first saw this beat.
    pub age_ms: u32,
    /// The member's own takeover delay in ms (from its lease and liveness settings),
    /// relayed with its beat: the takeover delay in force is the swarm's longest.
    /// Absent from peers from before the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// The proof that the member made this beat ([`crate::liveness`]): required of a
    /// beat relayed for another peer, optional for the sender's own (the connection
    /// authenticates it). Absent from peers from before signed heartbeats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<crate::liveness::Proof>,
    /// The sender counts this member toward its majority (docs/design/membership.md,
    /// "Joins before a cut: a joint quorum"): the sender's word of itself, taken only
    /// from its own table, never relayed. Absent (not counted) from peers from before
    /// the field and in the sender's own beat.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub counted: bool,
}

/// A gossip exchange: the sender's own heartbeat and those of the members alive to it;
/// answered with the receiver's.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Gossip {
    /// The heartbeats.
    pub beats: Vec<Beat>,
    /// Whether the sender serves (reaches a majority of its members): a joining peer
    /// joins only through one that does. Absent in tables of peers from before the
    /// field, which are taken as serving (their own rule let them count whoever
    /// joined), so that a rolling upgrade still joins.
    #[serde(default = "serving_if_absent")]
    pub serving: bool,
    /// The sender's takeover delay in ms, the longest of its own and its members'
    /// settings: a peer joining through it keeps it for a membership window (the
    /// sender's departed members are not in the table). Absent from older peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Signed leaves of members that stopped gracefully, relayed until forgotten
    /// (docs/design/membership.md, "Leaving and forgetting"). Absent from older peers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaves: Vec<crate::liveness::Leave>,
    /// The changes of the sender's view not yet known to every member there: the
    /// newcomers whose joint quorum is pending at the sender, and the sender itself
    /// while its own join is (docs/design/membership.md, "Joins before a cut: a joint
    /// quorum"). A peer joining through the sender takes them over as joint quorums of
    /// its own. At most `membership::MAX_JOINTS`; absent from older peers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joints: Vec<PeerId>,
    /// The sender's prefix group (docs/design/membership-at-scale.md): absent from peers
    /// from before groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<Group>,
    /// A request for acknowledgements only: the sender's own beat and its `joints`; the
    /// reply holds the replier's own beat and its records of the members `joints`
    /// names, each saying whether the replier counts it (`membership::Membership::
    /// ack_request`). A peer from before the field answers with its table.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub acks: bool,
}

/// A peer's prefix group as its gossip table states it: the members are the peers whose
/// Kademlia keys share the first `depth` bits with the sender's, or the first
/// `depth - 1` while the split to `depth` is pending there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Group {
    /// Bits of the prefix, at most [`crate::membership::MAX_DEPTH`].
    pub depth: u8,
    /// The split to `depth` is pending at the sender: not every member of the parent
    /// group has said, in its own table, that it knows of it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub splitting: bool,
}

/// Most leaves in one gossip message.
pub const MAX_GOSSIP_LEAVES: usize = 1_000;

fn serving_if_absent() -> bool {
    true
}

impl Gossip {
    /// A message that carries one signed leave and nothing else: a peer's goodbye to its
    /// members (docs/design/membership.md, "Leaving and forgetting").
    pub fn leave_only(leave: crate::liveness::Leave) -> Self {
        Gossip {
            beats: Vec::new(),
            serving: false,
            delay_ms: None,
            leaves: vec![leave],
            joints: vec![],
            group: None,
            acks: false,
        }
    }

    /// Within the bounds (an oversized table is ignored and counted).
    pub fn is_valid(&self) -> bool {
        self.beats.len() <= MAX_GOSSIP_BEATS
            && self.leaves.len() <= MAX_GOSSIP_LEAVES
            && self.joints.len() <= crate::membership::MAX_JOINTS
            && self.group.is_none_or(|g| g.depth <= crate::membership::MAX_DEPTH)
    }
}

/// The name of replica `index` of `resource` in the DHT keyspace (paper §2: "R:i").
/// Replicas are numbered from 1 in the name, as in the paper.
pub fn replica_name(resource: &str, index: u16) -> String {
    format!("{resource}:{}", u32::from(index) + 1)
}

impl Request {
    /// Validates what can be checked without state.
    pub fn validate(&self) -> Result<(), Rejection> {
        match self {
            Request::Replica { msg: ToReplica::Relay { next, .. } | ToReplica::Release { next, .. }, .. }
                if next.len() > RELAY_DEPTH =>
            {
                Err(Rejection::BadRelay)
            }
            Request::Replica { resource, index, n, .. }
            | Request::Ping { resource, index, n }
            | Request::Inspect { resource, index, n } => {
                validate_resource(resource)?;
                validate_index(*index, *n)
            }
            Request::Holding { resource, .. } | Request::Revoke { resource, .. } => validate_resource(resource),
            Request::Locks { after: Some((resource, _)) } => validate_resource(resource),
            Request::Locks { after: None } => Ok(()),
            Request::Notify { resource, index, .. } => {
                validate_resource(resource)?;
                validate_index(*index, u16::try_from(MAX_REPLICAS).unwrap_or(u16::MAX))
            }
            Request::Batch(items) => {
                let batchable = |r: &Request| {
                    matches!(
                        r,
                        Request::Replica { .. }
                            | Request::Notify { .. }
                            | Request::Ping { .. }
                            | Request::Inspect { .. }
                    )
                };
                if items.is_empty() || items.len() > MAX_BATCH || !items.iter().all(batchable) {
                    return Err(Rejection::BadBatch);
                }
                Ok(()) // each item is validated on its own, and answered on its own
            }
        }
    }

    /// Short name of the message kind (metrics).
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Replica { msg, .. } => msg.kind(),
            Request::Ping { .. } => "ping",
            Request::Notify { .. } => "notify",
            Request::Inspect { .. } => "inspect",
            Request::Holding { .. } => "holding",
            Request::Revoke { .. } => "revoke",
            Request::Locks { .. } => "locks",
            Request::Batch(_) => "batch",
        }
    }
}

/// Inbound frames refused before any message exists (shared by every connection of a
/// behaviour; read into `Counters::inbound_failures`).
#[derive(Debug, Default)]
pub struct CodecStats {
    /// Frames that are not a valid CBOR [`Request`] (garbage, unknown message kinds), or
    /// whose header is not a request's.
    pub malformed: AtomicU64,
    /// Frames over [`MAX_REQUEST_BYTES`].
    pub oversized: AtomicU64,
}

/// Bytes before a frame's body: its length (u32, big-endian, what follows it: the kind,
/// the id and the body), its kind (u8) and its request id (u64, big-endian).
pub const FRAME_HEADER: usize = 13;

/// What a frame carries. A stream carries requests one way and their replies the other
/// (the opener sends requests), so a reader knows which kind it expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// A [`Request`]: body at most [`MAX_REQUEST_BYTES`].
    Request,
    /// A [`Reply`] to the request of the same id: body at most [`MAX_REPLY_BYTES`].
    Reply,
}

impl FrameKind {
    fn byte(self) -> u8 {
        match self {
            FrameKind::Request => 0,
            FrameKind::Reply => 1,
        }
    }

    /// The largest body of this kind.
    pub fn limit(self) -> u64 {
        match self {
            FrameKind::Request => MAX_REQUEST_BYTES,
            FrameKind::Reply => MAX_REPLY_BYTES,
        }
    }
}

/// Why a frame was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The body is over its kind's limit.
    Oversized,
    /// A header that is not the expected kind's, or a body that does not decode.
    Malformed,
}

/// Appends one frame (`kind`, request `id`, `body` in CBOR) to `out`. A body over its
/// kind's limit is not appended (`Oversized`).
pub fn encode_frame<T: Serialize>(out: &mut Vec<u8>, kind: FrameKind, id: u64, body: &T) -> Result<(), FrameError> {
    let body = cbor4ii::serde::to_vec(Vec::with_capacity(128), body).map_err(|_| FrameError::Malformed)?;
    if body.len() as u64 > kind.limit() {
        return Err(FrameError::Oversized);
    }
    let len = u32::try_from(body.len() + FRAME_HEADER - 4).map_err(|_| FrameError::Oversized)?;
    out.reserve(FRAME_HEADER + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.push(kind.byte());
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&body);
    Ok(())
}

/// The frame at the front of `buf`, if it is whole: its request id and its length in
/// bytes (the body is `buf[FRAME_HEADER..length]`). `Ok(None)`: more bytes are needed.
/// A header of another kind than `expect`, or announcing a body over the kind's limit,
/// is refused as soon as its first five bytes are in (nothing more is read of it).
pub fn parse_frame(buf: &[u8], expect: FrameKind) -> Result<Option<(u64, usize)>, FrameError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if buf[4] != expect.byte() || len < FRAME_HEADER - 4 {
        return Err(FrameError::Malformed);
    }
    if (len - (FRAME_HEADER - 4)) as u64 > expect.limit() {
        return Err(FrameError::Oversized);
    }
    let total = len + 4;
    if buf.len() < total {
        return Ok(None);
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&buf[5..FRAME_HEADER]);
    Ok(Some((u64::from_be_bytes(id), total)))
}

/// Decodes a frame's body.
pub fn decode_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    cbor4ii::serde::from_slice(body).map_err(|_| FrameError::Malformed)
}

/// One frame as bytes (tests and tools).
pub fn frame<T: Serialize>(kind: FrameKind, id: u64, body: &T) -> Result<Vec<u8>, FrameError> {
    let mut out = Vec::new();
    encode_frame(&mut out, kind, id, body)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `value` framed as `kind` and read back through the frame limits.
    fn round_trip<T: Serialize + serde::de::DeserializeOwned>(kind: FrameKind, value: &T) -> (usize, T) {
        let bytes = frame(kind, 7, value).expect("within the limit");
        let (id, total) = parse_frame(&bytes, kind).expect("a valid header").expect("whole");
        assert_eq!((id, total), (7, bytes.len()));
        (bytes.len() - FRAME_HEADER, decode_body(&bytes[FRAME_HEADER..total]).expect("decodes"))
    }

    #[test]
    fn resource_names() {
        assert!(validate_resource("orders/42").is_ok());
        assert!(validate_resource("a.b_c-d").is_ok());
        assert_eq!(validate_resource(""), Err(Rejection::BadResource));
        assert_eq!(validate_resource("has space"), Err(Rejection::BadResource));
        assert_eq!(validate_resource("colon:1"), Err(Rejection::BadResource));
        assert_eq!(validate_resource(&"x".repeat(MAX_RESOURCE_LEN + 1)), Err(Rejection::BadResource));
        assert_eq!(validate_resource("é"), Err(Rejection::BadResource));
    }

    #[test]
    fn indices() {
        assert!(validate_index(0, 1).is_ok());
        assert!(validate_index(31, 32).is_ok());
        assert_eq!(validate_index(32, 32), Err(Rejection::BadIndex));
        assert_eq!(validate_index(0, 0), Err(Rejection::BadIndex));
        assert_eq!(validate_index(0, 256), Err(Rejection::BadIndex));
    }

    #[test]
    fn a_relay_is_bounded_and_round_trips() {
        let ts = |k| Timestamp::new(k, PeerId::random());
        let relay = |k: usize| Request::Replica {
            resource: "orders".into(),
            index: 3,
            n: 32,
            msg: ToReplica::Relay { ts: ts(1), next: (0..k as u64).map(|j| ts(2 + j)).collect() },
        };
        assert!(relay(RELAY_DEPTH).validate().is_ok());
        assert_eq!(relay(RELAY_DEPTH + 1).validate(), Err(Rejection::BadRelay));
        let request = relay(RELAY_DEPTH);
        let (len, back) = round_trip(FrameKind::Request, &request);
        assert!(len as u64 <= MAX_REQUEST_BYTES);
        assert_eq!(back, request);
        // A notice with INQUIRE, the next waiters and a solicitation: in
        // `a_full_batch_fits_the_frame_limits`.
    }

    #[test]
    fn a_full_inspect_reply_fits_the_reply_limit() {
        let ts = || Timestamp::new(u64::MAX, PeerId::random());
        let state = ReplicaState {
            owner: Some((ts(), u64::MAX, u64::MAX)),
            queue: (0..MAX_INSPECT_QUEUE).map(|_| ts()).collect(),
            queue_len: u32::MAX,
            held_back_ms: u64::MAX,
        };
        let reply = Reply::Replica(state);
        let (len, back) = round_trip(FrameKind::Reply, &reply);
        assert!(len as u64 <= MAX_REPLY_BYTES, "{len} bytes");
        assert_eq!(back, reply, "read back through the size limit");
    }

    /// A full page of the swarm's locks, every name the longest and every number the
    /// largest, fits the reply limit; a longer page or a bad name is not valid.
    #[test]
    fn a_full_lock_list_fits_the_reply_limit_and_more_is_not_valid() {
        let entry = |i: usize| LockEntry {
            resource: format!("{i:0>width$}", width = MAX_RESOURCE_LEN),
            counter: u64::MAX,
            held: true,
            token: u64::MAX,
            valid_for_ms: u64::MAX,
            votes: u16::MAX,
            position: Some(u32::MAX),
        };
        let list = LockList { locks: (0..MAX_LISTED_LOCKS).map(entry).collect(), more: u32::MAX };
        assert!(list.is_valid());
        let reply = Reply::Locks(list.clone());
        let (len, back) = round_trip(FrameKind::Reply, &reply);
        assert!(len as u64 <= MAX_REPLY_BYTES, "{len} bytes");
        assert_eq!(back, reply, "read back through the size limit");
        let mut long = list.clone();
        long.locks.push(entry(0));
        assert!(!long.is_valid());
        let mut bad = list;
        bad.locks[7].resource = "evil\u{1b}[2J".into();
        assert!(!bad.is_valid());
        assert!(Request::Locks { after: None }.validate().is_ok());
        assert!(Request::Locks { after: Some(("a".into(), 1)) }.validate().is_ok());
        assert_eq!(Request::Locks { after: Some(("".into(), 1)) }.validate(), Err(Rejection::BadResource));
        let batch = Request::Batch(vec![Request::Locks { after: None }]);
        assert_eq!(batch.validate(), Err(Rejection::BadBatch), "not an item of a batch");
    }

    /// The largest batch a peer sends (every item the largest of its kind) and the
    /// largest reply fit the codec's limits; one item more is refused.
    #[test]
    fn a_full_batch_fits_the_frame_limits() {
        let name = "x".repeat(MAX_RESOURCE_LEN);
        let ts = || Timestamp::new(u64::MAX, PeerId::random());
        let resp = || Response {
            ts: ts(),
            owner: ts(),
            stamp: u64::MAX,
            position: u32::MAX,
            advice: std::time::Duration::MAX,
            lease: std::time::Duration::MAX,
            echo: u64::MAX,
            grant_delay: std::time::Duration::MAX,
            promoted: true,
            inquire: true,
            next: (0..RELAY_DEPTH).map(|_| ts()).collect(),
            solicit: true,
        };
        let items = |i: usize| match i % 2 {
            0 => Request::Notify { resource: name.clone(), index: u16::MAX, resp: resp() },
            _ => Request::Replica {
                resource: name.clone(),
                index: u16::MAX,
                n: u16::MAX,
                msg: ToReplica::Relay { ts: ts(), next: (0..RELAY_DEPTH).map(|_| ts()).collect() },
            },
        };
        let batch = Request::Batch((0..MAX_BATCH).map(items).collect());
        assert!(batch.validate().is_ok());
        assert_eq!(Request::Batch((0..=MAX_BATCH).map(items).collect()).validate(), Err(Rejection::BadBatch));
        let (len, back) = round_trip(FrameKind::Request, &batch);
        assert!(len as u64 <= MAX_REQUEST_BYTES, "{len} bytes");
        assert_eq!(back, batch);

        let addr: Multiaddr =
            format!("/dns4/{}.example/tcp/65535/p2p/{}", "a".repeat(240), PeerId::random()).parse().unwrap();
        let redirect = || Reply::Redirect { peer: PeerId::random(), addrs: vec![addr.clone(); MAX_REDIRECT_ADDRS] };
        let replies = |i: usize| if i % 2 == 0 { redirect() } else { Reply::Responses(vec![resp(), resp()]) };
        let reply = Reply::Batch((0..MAX_BATCH).map(replies).collect());
        let (len, back) = round_trip(FrameKind::Reply, &reply);
        assert!(len as u64 <= MAX_REPLY_BYTES, "{len} bytes");
        assert_eq!(back, reply);
    }

    /// Frames are refused by their header: another kind, a body over the kind's limit
    /// (as soon as the first five bytes are in), a length too short for the header; a
    /// frame cut short waits for more bytes.
    #[test]
    fn frame_headers_are_checked() {
        let ping = Request::Ping { resource: "a".into(), index: 0, n: 1 };
        let bytes = frame(FrameKind::Request, 1, &ping).unwrap();
        assert_eq!(parse_frame(&bytes, FrameKind::Reply), Err(FrameError::Malformed));
        assert_eq!(parse_frame(&bytes[..bytes.len() - 1], FrameKind::Request), Ok(None));
        assert_eq!(parse_frame(&bytes[..4], FrameKind::Request), Ok(None));
        let mut big = ((MAX_REQUEST_BYTES as u32) + 10).to_be_bytes().to_vec();
        big.push(0);
        assert_eq!(parse_frame(&big, FrameKind::Request), Err(FrameError::Oversized));
        let mut short = 3u32.to_be_bytes().to_vec();
        short.extend_from_slice(&[0, 0, 0, 0]);
        assert_eq!(parse_frame(&short, FrameKind::Request), Err(FrameError::Malformed));
        let over = Request::Ping { resource: "x".repeat(MAX_REQUEST_BYTES as usize), index: 0, n: 1 };
        assert_eq!(frame(FrameKind::Request, 1, &over), Err(FrameError::Oversized));
        // A valid header over garbage: the body does not decode.
        let mut garbage = frame(FrameKind::Request, 2, &ping).unwrap();
        garbage.truncate(FRAME_HEADER);
        garbage.extend_from_slice(b"\xff\xfe");
        garbage[..4].copy_from_slice(&((FRAME_HEADER - 4 + 2) as u32).to_be_bytes());
        let (_, total) = parse_frame(&garbage, FrameKind::Request).unwrap().unwrap();
        assert_eq!(decode_body::<Request>(&garbage[FRAME_HEADER..total]), Err(FrameError::Malformed));
    }

    #[test]
    fn replica_names_follow_the_paper() {
        assert_eq!(replica_name("R", 0), "R:1");
        assert_eq!(replica_name("foo/bar", 31), "foo/bar:32");
    }

    /// A full gossip table (every heartbeat with the largest numbers) fits the frame limit.
    #[test]
    fn a_full_gossip_table_fits_the_frame_limit() {
        use futures::executor::block_on;
        use libp2p::request_response::Codec as _;
        let proof = crate::liveness::Proof {
            anchor: serde_bytes::ByteArray::new([0xff; crate::liveness::TOKEN_LEN]),
            signature: vec![0xff; 64],
            token: serde_bytes::ByteArray::new([0xff; crate::liveness::TOKEN_LEN]),
        };
        let beat = |_| Beat {
            peer: PeerId::random(),
            incarnation: u64::MAX,
            counter: u64::MAX,
            age_ms: u32::MAX,
            delay_ms: Some(u64::MAX),
            proof: Some(proof.clone()),
            counted: true,
        };
        let leaves = (0..MAX_GOSSIP_LEAVES)
            .map(|_| crate::liveness::Leave {
                peer: PeerId::random(),
                incarnation: u64::MAX,
                signature: vec![0xff; 64],
            })
            .collect();
        let full = Gossip {
            beats: (0..MAX_GOSSIP_BEATS).map(beat).collect(),
            serving: true,
            delay_ms: Some(u64::MAX),
            leaves,
            joints: (0..crate::membership::MAX_JOINTS).map(|_| PeerId::random()).collect(),
            group: Some(Group { depth: crate::membership::MAX_DEPTH, splitting: true }),
            acks: true,
        };
        assert!(full.is_valid());
        let mut codec = libp2p::request_response::cbor::codec::Codec::<Gossip, Gossip>::default()
            .set_request_size_maximum(MAX_GOSSIP_BYTES);
        let mut buf = futures::io::Cursor::new(Vec::new());
        block_on(codec.write_request(&GOSSIP_PROTOCOL, &mut buf, full.clone())).unwrap();
        let len = buf.get_ref().len() as u64;
        assert!(len <= MAX_GOSSIP_BYTES, "{len} bytes");
        buf.set_position(0);
        assert_eq!(block_on(codec.read_request(&GOSSIP_PROTOCOL, &mut buf)).unwrap(), full);
        let over = Gossip {
            beats: (0..=MAX_GOSSIP_BEATS).map(beat).collect(),
            serving: true,
            delay_ms: None,
            leaves: vec![],
            joints: vec![],
            group: None,
            acks: false,
        };
        assert!(!over.is_valid());
        let deep = Gossip {
            beats: vec![],
            serving: true,
            delay_ms: None,
            leaves: vec![],
            joints: vec![],
            group: Some(Group { depth: crate::membership::MAX_DEPTH + 1, splitting: false }),
            acks: false,
        };
        assert!(!deep.is_valid(), "a group deeper than any");
    }

    /// The serving bit is an optional field of the gossip, not a new protocol: a table
    /// of a peer from before it decodes as serving (a rolling upgrade still joins), and
    /// an older peer ignores it.
    #[test]
    fn the_serving_bit_is_optional_both_ways() {
        use futures::executor::block_on;
        use libp2p::request_response::Codec as _;
        #[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        struct Before {
            beats: Vec<Beat>,
        }
        let beats = vec![Beat {
            peer: PeerId::random(),
            incarnation: 1,
            counter: 2,
            age_ms: 3,
            delay_ms: None,
            proof: None,
            counted: false,
        }];
        let mut old = libp2p::request_response::cbor::codec::Codec::<Before, Before>::default();
        let mut new = libp2p::request_response::cbor::codec::Codec::<Gossip, Gossip>::default();
        let mut buf = futures::io::Cursor::new(Vec::new());
        block_on(old.write_request(&GOSSIP_PROTOCOL, &mut buf, Before { beats: beats.clone() })).unwrap();
        buf.set_position(0);
        let read = block_on(new.read_request(&GOSSIP_PROTOCOL, &mut buf)).unwrap();
        assert_eq!(
            read,
            Gossip {
                beats: beats.clone(),
                serving: true,
                delay_ms: None,
                leaves: vec![],
                joints: vec![],
                group: None,
                acks: false
            }
        );
        let mut buf = futures::io::Cursor::new(Vec::new());
        block_on(new.write_request(
            &GOSSIP_PROTOCOL,
            &mut buf,
            Gossip {
                beats: beats.clone(),
                serving: false,
                delay_ms: Some(1),
                leaves: vec![],
                joints: vec![],
                group: None,
                acks: false,
            },
        ))
        .unwrap();
        buf.set_position(0);
        assert_eq!(block_on(old.read_request(&GOSSIP_PROTOCOL, &mut buf)).unwrap(), Before { beats: beats.clone() });
        buf.set_position(0);
        assert!(!block_on(new.read_request(&GOSSIP_PROTOCOL, &mut buf)).unwrap().serving);
    }
}
