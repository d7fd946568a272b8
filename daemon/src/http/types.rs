//! The bodies and answers of the API: what clients send and what the handlers
//! serialise (and the OpenAPI document describes).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Answer of a successful acquire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Acquired {
    /// Lock name.
    pub name: String,
    /// Fencing token: public (status and inspect show it); pass it to the protected
    /// resource with every write.
    pub token: u64,
    /// The lease id: 32 hex digits, the secret that proves this client holds the lock.
    /// Keep-alive and release need it; nothing else ever shows it.
    pub lease: String,
    /// The deadline: the earliest time the lock may be given to someone else (ms since
    /// the Unix epoch, daemon's clock). The earlier of the lock's validity and the end
    /// of the client lease; the daemon never lets the lock go before it. Each keep-alive
    /// answers a new one. A client should count it from when it *sent* the request
    /// ([`Acquired::valid_for_ms`] after the send) and stop using the lock then, whatever
    /// the daemon answers in between.
    pub valid_until_ms: u64,
    /// The same deadline as a duration from the moment of the answer.
    pub valid_for_ms: u64,
    /// Distinct peers whose replicas voted for this holder.
    pub distinct_peers: usize,
    /// The client lease: unless renewed (`POST /v1/locks/{name}/keepalive`) within
    /// this long, the daemon releases the lock (a dead client keeps nothing).
    pub ttl_ms: u64,
    /// With `slots`: the semaphore slot held, in `0..slots`; `name` is then that slot's
    /// lock (`NAME/.slot/N`), and the token orders that slot's holders. Keep-alive and
    /// release take either name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u16>,
}

/// Answer to a keep-alive: the lock is still held, the client lease renewed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct KeptAlive {
    /// Lock name.
    pub name: String,
    /// Fencing token.
    pub token: u64,
    /// The new deadline; see [`Acquired::valid_until_ms`].
    pub valid_until_ms: u64,
    /// See [`Acquired::valid_for_ms`].
    pub valid_for_ms: u64,
    /// The client lease now ends this long from the answer.
    pub ttl_ms: u64,
}

/// Locks the daemon holds for HTTP clients at most (a new acquire past it: 503
/// `too_many_locks`); acquires in flight when it is reached may add up to
/// `--api-max-requests` more.
pub const MAX_HTTP_LOCKS: usize = 10_000;

/// Client lease of an HTTP-held lock when the acquire names none.
pub const DEFAULT_CLIENT_TTL: Duration = Duration::from_secs(5);
/// Bounds of a client lease.
pub const CLIENT_TTL_RANGE: std::ops::RangeInclusive<Duration> = Duration::from_millis(200)..=Duration::from_secs(3600);

/// Body of a keep-alive and of a release: what the acquire answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HolderBody {
    /// The fencing token the acquire returned.
    pub token: u64,
    /// The lease id the acquire returned ([`Acquired::lease`]).
    pub lease: String,
}

/// Body of an acquire (optional: none, `{}` or `null` attach no value): the value to
/// attach to the lock, which inspections, watchers and observers read with the token.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// The value as UTF-8 text (at most 4096 bytes): a leader's address, say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The value in standard base64, for bytes that are not text (instead of `value`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_base64: Option<String>,
}

/// Body of `POST /v1/locks/{name}/value`: what the acquire answered, and the new value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ValueBody {
    /// The fencing token the acquire returned.
    pub token: u64,
    /// The lease id the acquire returned ([`Acquired::lease`]).
    pub lease: String,
    /// The new value as UTF-8 text (at most 4096 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The new value in standard base64 (instead of `value`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_base64: Option<String>,
}

/// Answer of `POST /v1/locks/{name}/value`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ValueSet {
    /// Lock name.
    pub name: String,
    /// Fencing token.
    pub token: u64,
    /// The value's version: 1 for a value given at acquire, one more at each change.
    pub value_version: u32,
}

/// Body of an operator's revoke (break-lock): the holder's fencing token, which
/// `sigma inspect` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RevokeBody {
    /// The holder's fencing token.
    pub token: u64,
}

/// Answer of a successful release.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Released {
    /// Lock name.
    pub name: String,
    /// The released token.
    pub token: u64,
}

/// A lock held by the daemon for an HTTP client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HeldView {
    /// Fencing token.
    pub token: u64,
    /// The holder's deadline; see [`Acquired::valid_until_ms`].
    pub valid_until_ms: u64,
    /// See [`Acquired::valid_for_ms`].
    pub valid_for_ms: u64,
}

/// Current owner of a replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OwnerView {
    /// Owner's peer id.
    pub peer: String,
    /// Lamport counter of its acquisition.
    pub counter: u64,
    /// Grant stamp (fencing token material).
    pub stamp: u64,
}

/// A waiter in a replica's queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WaiterView {
    /// Waiter's peer id.
    pub peer: String,
    /// Lamport counter of its acquisition.
    pub counter: u64,
}

/// One replica of the lock hosted by this peer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReplicaView {
    /// Replica index (0-based; the DHT name is `NAME:index+1`).
    pub index: u16,
    /// Owner, if any.
    pub owner: Option<OwnerView>,
    /// Waiters in service order.
    pub queue: Vec<WaiterView>,
}

/// Answer of `GET /v1/locks/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LockView {
    /// Lock name.
    pub name: String,
    /// Whether this node holds the lock (for an HTTP client or an embedded caller).
    pub held_by_this_node: bool,
    /// Whether an acquisition of this node waits for it.
    pub waiting_on_this_node: bool,
    /// Locks held by the daemon for HTTP clients under this name (normally 0 or 1).
    pub held: Vec<HeldView>,
    /// This peer's replicas of the lock.
    pub replicas: Vec<ReplicaView>,
}

/// Answer of `GET /healthz` and `GET /readyz` when they pass.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Probe {
    /// `serving` (or, for `/healthz`, the readiness whatever it is: alive is enough).
    pub readiness: String,
}

/// Body of `POST /v1/admin/block` and `…/unblock`, and answer of all three admin calls.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PeerList {
    /// Peer ids.
    pub peers: Vec<String>,
}

/// Answer of `POST /v1/admin/forget`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Forgotten {
    /// The peers forgotten.
    pub forgotten: Vec<String>,
    /// The peers not forgotten, each with why (alive here, not a member, listed).
    pub refused: Vec<ForgetRefusal>,
}

/// A peer `POST /v1/admin/forget` did not forget.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ForgetRefusal {
    /// The peer.
    pub peer: String,
    /// Why not.
    pub reason: String,
}
