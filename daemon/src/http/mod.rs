//! The local HTTP control API of a sigma daemon: for `sigma lock`, `sigma status`, the
//! testnet driver and programs in other languages. It listens on a unix socket
//! ([`ApiAddr::Unix`], mode [`SOCKET_MODE`]: the daemon's user and group, each client's
//! user id logged) or on a loopback address ([`Api::bind`] refuses any other). Every
//! request passes the [`gate`] first: `Host` and `Origin` must be loopback (no web page,
//! no DNS rebinding), every POST carries `Content-Type: application/json` (or a
//! `Sigma-Client` header), bodies are at most 64 KiB, acquires, holders' requests and
//! the rest are bounded in separate pools, and with `--api-token-file` every request
//! needs `Authorization: Bearer <token>`. On loopback TCP without a token, any local
//! program that can reach the port can take locks (and release only those whose lease
//! id it was given).
//!
//! | method and path | body | answer |
//! | --- | --- | --- |
//! | `POST /v1/locks/{name}/acquire?timeout_ms=T&n=N&m=M` | | blocks until held: 200 [`Acquired`]; 408 on timeout; 400 bad name or quorum; 503 node stopped |
//! | `POST /v1/locks/{name}/release` | [`ReleaseBody`] `{"token": …}` | 200 [`Released`]; 404 not held under that token |
//! | `POST /v1/locks/{name}/keepalive` | [`ReleaseBody`] `{"token": …}` | 200 [`KeptAlive`]; 404 not held (released, lost, expired) |
//! | `GET /v1/locks/{name}` | | 200 [`LockView`]: locks held here for HTTP clients, this peer's replicas of the lock |
//! | `GET /v1/inspect/{name}` | | 200 [`sigma_node::inspect::Inspection`]: the lock seen from the hosts of all its replicas (holder, token, validity, waiters and positions, each replica) |
//! | `POST /v1/revoke/{name}` | [`ReleaseBody`] `{"token": …}` | 200 [`sigma_node::inspect::Revoked`]: the holder gave it up; 404 not held under that token, or refused (the holder's `--admin-peer`) |
//! | `GET /v1/status` | | 200 the node's [`sigma_node::Status`] |
//! | `GET /healthz` | | 200 [`Probe`] while the event loop answers; 503 `unresponsive` |
//! | `GET /readyz` | | 200 [`Probe`] when serving with nothing held back; 503 `not_ready` or `held_back` |
//! | `POST /v1/admin/forget` | [`PeerList`] `{"peers": […]}` | 200 [`Forgotten`]: members gone for good taken out of this node's counts (admin token) |
//! | `GET /v1/openapi.json` | | 200 the OpenAPI document of all of this ([`openapi`]) |
//! | `GET /metrics` | | Prometheus / OpenMetrics text ([`sigma_node::metrics`]) |
//!
//! Errors are JSON [`ErrorBody`] `{"error": "…"}`. A lock name may contain `/`; it can
//! be sent as is (`/v1/locks/orders/42/acquire`) or percent-encoded (`orders%2F42`):
//! the last segment of a POST path is the action, a GET path has none.
//!
//! `timeout_ms` is optional (absent: wait as long as it takes); `n` and `m` come
//! together or not at all (absent: the daemon's quorum).
//!
//! **Who holds a lock taken over HTTP.** The daemon does, on behalf of the client, keyed
//! by (name, fencing token), renewing the lock's votes in the background, for as long as
//! the client keeps its *client lease* alive: `ttl_ms` at acquire (default 5 s, 200 ms
//! to 1 h), renewed by `POST …/keepalive` with the token. A client that stops renewing
//! (killed, crashed, cut off) loses the lock one TTL after its last renewal: the daemon
//! releases it and counts it (`sigma_client_leases_expired_total`). `POST …/release`
//! releases at once. A client that goes away while still *waiting* cancels its
//! acquisition (the request's future is dropped). A held lock that is lost (quorum gone,
//! lease lapsed) is dropped from the table at once: the next keep-alive answers 404,
//! which is how `sigma lock` notices. When the daemon stops, it releases the locks it
//! still holds.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

pub mod gate;
mod serve;

pub use serve::{Peer, DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS};

use sigma_node::metrics::{self, Metrics, Outcome};
use sigma_node::{LockError, LockGuard, LockOptions, NodeHandle, RevokeError};

/// Why the API could not start.
#[derive(Debug)]
pub enum ApiError {
    /// The address does not parse as `IP:PORT` or `localhost:PORT`.
    BadAddress(String),
    /// The address is not a loopback address.
    NotLoopback(SocketAddr),
    /// A daemon already answers on this unix socket.
    SocketInUse(PathBuf),
    /// Binding failed.
    Io(std::io::Error),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::BadAddress(s) => {
                write!(f, "bad API address {s:?}: expected IP:PORT (e.g. 127.0.0.1:7591) or unix:PATH")
            }
            ApiError::SocketInUse(p) => {
                write!(f, "another process answers on the API socket {}: is a daemon already running?", p.display())
            }
            ApiError::NotLoopback(a) => write!(
                f,
                "refusing API address {a}: the control API has no authentication and binds to loopback only \
                 (127.0.0.0/8 or [::1])"
            ),
            ApiError::Io(e) => write!(f, "cannot bind the control API: {e}"),
        }
    }
}

impl std::error::Error for ApiError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ApiError::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Default API address of `sigma run` and of the client commands.
pub const DEFAULT_API: &str = "127.0.0.1:7591";

/// The API socket of the shipped systemd unit (`RuntimeDirectory=sigma`): the client
/// commands use it when it exists and no address is given.
pub const DEFAULT_API_SOCKET: &str = "/run/sigma/api.sock";

/// Mode of the API's unix socket: its owner (the daemon's user) and its group may
/// connect; who is in the group decides who may use the API.
pub const SOCKET_MODE: u32 = 0o660;

/// Where the control API listens: a loopback TCP address, or a unix socket (whose
/// file permissions and directory decide who may connect, and which no other user's
/// process can take over while the daemon is down).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiAddr {
    /// A loopback address.
    Tcp(SocketAddr),
    /// A unix socket at this path.
    Unix(PathBuf),
}

impl ApiAddr {
    /// `unix:PATH`, or a loopback `IP:PORT` ([`parse_loopback_addr`]).
    pub fn parse(s: &str) -> Result<ApiAddr, ApiError> {
        match s.trim().strip_prefix("unix:") {
            Some("") => Err(ApiError::BadAddress(s.to_owned())),
            Some(path) => Ok(ApiAddr::Unix(PathBuf::from(path))),
            None => parse_loopback_addr(s).map(ApiAddr::Tcp),
        }
    }
}

impl From<SocketAddr> for ApiAddr {
    fn from(a: SocketAddr) -> ApiAddr {
        ApiAddr::Tcp(a)
    }
}

impl std::fmt::Display for ApiAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiAddr::Tcp(a) => write!(f, "{a}"),
            ApiAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// Binds the API's unix socket at `path` with [`SOCKET_MODE`]. A socket file left by a
/// daemon that is gone is replaced; one a live process answers on is refused.
fn bind_socket(path: &std::path::Path) -> Result<tokio::net::UnixListener, ApiError> {
    use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ApiError::Io(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            )));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ApiError::SocketInUse(path.to_owned()));
        }
        std::fs::remove_file(path).map_err(ApiError::Io)?;
    }
    // Created with the umask's mode (at most the owner may connect), then opened to the
    // group: never wider than SOCKET_MODE in between.
    let listener = tokio::net::UnixListener::bind(path).map_err(ApiError::Io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE)).map_err(ApiError::Io)?;
    Ok(listener)
}

/// Parses `IP:PORT` (or `localhost:PORT`) and checks that it is a loopback address.
pub fn parse_loopback_addr(s: &str) -> Result<SocketAddr, ApiError> {
    let s = s.trim();
    let addr = match s.strip_prefix("localhost:") {
        Some(port) => SocketAddr::new(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            port.parse().map_err(|_| ApiError::BadAddress(s.to_owned()))?,
        ),
        None => s.parse::<SocketAddr>().map_err(|_| ApiError::BadAddress(s.to_owned()))?,
    };
    check_loopback(addr)
}

/// Accepts loopback addresses only (IPv4-mapped IPv6 loopback included).
pub fn check_loopback(addr: SocketAddr) -> Result<SocketAddr, ApiError> {
    if addr.ip().to_canonical().is_loopback() {
        Ok(addr)
    } else {
        Err(ApiError::NotLoopback(addr))
    }
}

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

/// Any error answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: String,
    /// A stable code where the client may act on it: `not_ready` (503: the node is
    /// joining its swarm or reaches no majority of the peers it knows), `stopping` (503:
    /// the daemon is stopping; a holder must stop using the lock), `not_held` (404),
    /// `bad_lease` (400), `unresponsive` and `held_back` (503, the probes), and the
    /// gate's codes ([`gate::Refusal`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
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

/// `(valid_until_ms since the epoch, valid_for_ms from now)` of a deadline.
fn deadline_ms(at: Instant) -> (u64, u64) {
    let left = at.saturating_duration_since(Instant::now());
    let abs = SystemTime::now() + left;
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    (ms(abs.duration_since(UNIX_EPOCH).unwrap_or_default()), ms(left))
}

/// A holder's proof of ownership: 128 random bits from the OS, answered once by the
/// acquire and required by keep-alive and release. Never shown by status, locks,
/// inspect, metrics or logs (its `Debug` hides it); the fencing token is public.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct LeaseId(u128);

impl LeaseId {
    fn new() -> Result<LeaseId, rand::Error> {
        use rand::RngCore as _;
        let mut bytes = [0u8; 16];
        rand::rngs::OsRng.try_fill_bytes(&mut bytes)?;
        Ok(LeaseId(u128::from_be_bytes(bytes)))
    }

    /// 32 hexadecimal digits, as [`LeaseId::to_hex`] writes them (either case).
    fn parse(s: &str) -> Option<LeaseId> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u128::from_str_radix(s, 16).ok().map(LeaseId)
    }

    fn to_hex(self) -> String {
        format!("{:032x}", self.0)
    }
}

impl std::fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseId(..)")
    }
}

enum HolderCmd {
    /// Answers the deadline told to the client (see [`Acquired::valid_until_ms`]).
    Info(oneshot::Sender<Instant>),
    /// Renews the client lease; answers the new deadline and the lease length, or `None`
    /// while the daemon stops (the lease is not renewed then).
    KeepAlive(oneshot::Sender<Option<(Instant, Duration)>>),
    Release(oneshot::Sender<Result<(), LockError>>),
}

/// A lock held for an HTTP client, keyed in the [`Table`] by its lease id.
struct Entry {
    name: String,
    token: u64,
    tx: mpsc::Sender<HolderCmd>,
}

/// The locks held for HTTP clients, by lease id; `changed` wakes a stop that waits for
/// the table to empty.
#[derive(Clone, Default)]
struct Table {
    entries: Arc<Mutex<HashMap<LeaseId, Entry>>>,
    changed: Arc<tokio::sync::Notify>,
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseId, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    /// The holder task of `lease`, if it holds `name` under `token`.
    fn holder(&self, name: &str, token: u64, lease: LeaseId) -> Option<mpsc::Sender<HolderCmd>> {
        self.lock().get(&lease).filter(|e| e.name == name && e.token == token).map(|e| e.tx.clone())
    }

    fn remove(&self, lease: LeaseId, metrics: &Metrics) {
        let mut t = self.lock();
        t.remove(&lease);
        metrics.set_http_locks_held(t.len());
        drop(t);
        self.changed.notify_waiters();
    }
}

/// The earlier of the lock's validity and the end of the client lease: the one deadline
/// a holder is told, before which the daemon never lets the lock go.
fn deadline(guard: &LockGuard, lease_end: tokio::time::Instant) -> Instant {
    guard.valid_until().min(lease_end.into_std())
}

/// Holds `guard` for an HTTP client until it releases, its lease of `ttl` runs out
/// without a keep-alive, or the lock is lost: one task per held lock owns the guard,
/// answers queries, renews the lease (not while the daemon stops), releases on command
/// and drops the entry when the lock is lost. Answers the deadline told at acquire.
fn hold(s: &AppState, lease: LeaseId, guard: LockGuard, ttl: Duration) -> Instant {
    let (name, token) = (guard.name().to_owned(), guard.token());
    let (tx, mut rx) = mpsc::channel(8);
    {
        let mut t = s.held.lock();
        t.insert(lease, Entry { name: name.clone(), token, tx });
        s.metrics.set_http_locks_held(t.len());
    }
    let mut expires = tokio::time::Instant::now() + ttl;
    let told = deadline(&guard, expires);
    let (table, metrics, stopping) = (s.held.clone(), s.metrics.clone(), s.stopping.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(expires) => {
                    table.remove(lease, &metrics);
                    metrics.client_lease_expired();
                    tracing::warn!(%name, token, ?ttl, "HTTP client stopped renewing its lease: lock released");
                    let _ = guard.release().await;
                    return;
                }
                () = guard.lost() => {
                    table.remove(lease, &metrics);
                    tracing::warn!(%name, token, "a lock held for an HTTP client was lost");
                    return;
                }
                cmd = rx.recv() => match cmd {
                    Some(HolderCmd::Info(reply)) => {
                        let _ = reply.send(deadline(&guard, expires));
                    }
                    Some(HolderCmd::KeepAlive(reply)) => {
                        if *stopping.borrow() {
                            let _ = reply.send(None);
                        } else {
                            expires = tokio::time::Instant::now() + ttl;
                            let _ = reply.send(Some((deadline(&guard, expires), ttl)));
                        }
                    }
                    Some(HolderCmd::Release(reply)) => {
                        table.remove(lease, &metrics);
                        let _ = reply.send(guard.release().await);
                        return;
                    }
                    // Unreachable while the entry is in the table, which holds the sender.
                    None => {
                        table.remove(lease, &metrics);
                        let _ = guard.release().await;
                        return;
                    }
                }
            }
        }
    });
    told
}

/// Counts the acquires waiting for each lock name on this daemon; an entry lives while
/// one does, so the map holds at most as many names as acquires in flight.
#[derive(Clone, Default)]
struct Waiters(Arc<Mutex<HashMap<String, usize>>>);

/// One waiting acquire, counted until dropped (answered, or its client went away).
struct Waiting {
    waiters: Waiters,
    name: String,
}

impl Waiters {
    fn enter(&self, name: &str, max: usize) -> Option<Waiting> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // `max` is at least 1, so a name refused here already has a waiting acquire.
        let n = map.entry(name.to_owned()).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Waiting { waiters: self.clone(), name: name.to_owned() })
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut map = self.waiters.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.name);
            }
        }
    }
}

#[derive(Clone)]
struct AppState {
    handle: NodeHandle,
    metrics: Metrics,
    registry: Arc<Registry>,
    held: Table,
    waiters: Waiters,
    max_waiters_per_lock: usize,
    /// Set once when the daemon starts to stop ([`Api::shutdown`]).
    stopping: watch::Receiver<bool>,
    gate: gate::Gate,
}

fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(ErrorBody { error: msg.into(), code: None })).into_response()
}

fn error_with_code(status: StatusCode, code: &str, msg: impl Into<String>) -> Response {
    (status, Json(ErrorBody { error: msg.into(), code: Some(code.to_owned()) })).into_response()
}

#[derive(Debug, Deserialize)]
struct AcquireQuery {
    timeout_ms: Option<u64>,
    n: Option<usize>,
    m: Option<usize>,
    min_peers: Option<usize>,
    ttl_ms: Option<u64>,
}

/// Splits a POST path `NAME/ACTION`.
fn split_action(path: &str) -> Option<(&str, &str)> {
    path.rsplit_once('/')
}

async fn post_lock(
    State(s): State<AppState>,
    axum::Extension(peer): axum::Extension<serve::Peer>,
    Path(path): Path<String>,
    query: Result<Query<AcquireQuery>, QueryRejection>,
    body: axum::body::Bytes,
) -> Response {
    match split_action(&path) {
        Some((name, "acquire")) => match query {
            Ok(Query(q)) => acquire(s, name, q, peer).await,
            Err(e) => error(
                StatusCode::BAD_REQUEST,
                format!("bad query (timeout_ms, n, m, min_peers, ttl_ms are integers): {e}"),
            ),
        },
        Some((name, action @ ("release" | "keepalive"))) => {
            let lease = match serde_json::from_slice::<HolderBody>(&body) {
                Ok(b) => LeaseId::parse(&b.lease).map(|lease| (b.token, lease)),
                Err(_) => None,
            };
            let Some((token, lease)) = lease else {
                s.metrics.http_rejected("bad_lease");
                return error_with_code(
                    StatusCode::BAD_REQUEST,
                    "bad_lease",
                    format!(
                        "bad {action} body: expected {{\"token\": N, \"lease\": \"32 hex digits\"}}, the token and \
                         lease id the acquire answered"
                    ),
                );
            };
            let Some(tx) = s.held.holder(name, token, lease) else {
                s.metrics.http_rejected("not_held");
                return not_held(name, token);
            };
            if action == "release" {
                release(name, token, tx).await
            } else {
                keepalive(&s, name, token, tx).await
            }
        }
        _ => error(
            StatusCode::NOT_FOUND,
            "expected POST /v1/locks/{name}/acquire, /v1/locks/{name}/keepalive or /v1/locks/{name}/release",
        ),
    }
}

fn not_held(name: &str, token: u64) -> Response {
    error_with_code(
        StatusCode::NOT_FOUND,
        "not_held",
        format!("lock {name} token {token} is not held by this daemon under that lease (released, lost or expired)"),
    )
}

#[utoipa::path(post, path = "/v1/locks/{name}/acquire", tag = "locks",
    params(("name" = String, Path, description = "Lock name: 1 to 200 bytes of [A-Za-z0-9._/-]; a '/' may be sent as is or as %2F"),
        ("timeout_ms" = Option<u64>, Query, description = "Give up after this many ms (408); absent: wait as long as it takes"),
        ("ttl_ms" = Option<u64>, Query, description = "Client lease: released this long after the last keepalive (default 5000, 200 to 3600000)"),
        ("n" = Option<usize>, Query, description = "Replicas (with m); must be the swarm's"),
        ("m" = Option<usize>, Query, description = "Votes needed (with n); at least the swarm's"),
        ("min_peers" = Option<usize>, Query, description = "Votes from at least this many distinct peers")),
    responses((status = 200, description = "Held, for this client, until the deadline it answers; keep-alives move the deadline on", body = Acquired),
        (status = 400, description = "Bad name, quorum or query", body = ErrorBody),
        (status = 408, description = "Not won within timeout_ms", body = ErrorBody),
        (status = 409, description = "Lost before it could be handed over", body = ErrorBody),
        (status = 503, description = "Not ready (code not_ready), stopping (code stopping), busy, too many waiters for this lock, or stopped", body = ErrorBody)))]
async fn acquire(s: AppState, name: &str, q: AcquireQuery, peer: serve::Peer) -> Response {
    let quorum = match (q.n, q.m) {
        (Some(n), Some(m)) => Some((n, m)),
        (None, None) => None,
        _ => return error(StatusCode::BAD_REQUEST, "n and m go together"),
    };
    let ttl = q.ttl_ms.map_or(DEFAULT_CLIENT_TTL, Duration::from_millis);
    if !CLIENT_TTL_RANGE.contains(&ttl) {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "ttl_ms must be between {} and {}",
                CLIENT_TTL_RANGE.start().as_millis(),
                CLIENT_TTL_RANGE.end().as_millis()
            ),
        );
    }
    if *s.stopping.borrow() {
        return s.gate.refuse(gate::Refusal::Stopping);
    }
    if s.held.len() >= MAX_HTTP_LOCKS {
        return s.gate.refuse(gate::Refusal::TooManyLocks);
    }
    let Some(_waiting) = s.waiters.enter(name, s.max_waiters_per_lock) else {
        return s.gate.refuse(gate::Refusal::TooManyWaiters);
    };
    let lease = match LeaseId::new() {
        Ok(l) => l,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, format!("no randomness for a lease id: {e}")),
    };
    let opts = LockOptions { quorum, timeout: q.timeout_ms.map(Duration::from_millis), min_peers: q.min_peers };
    let start = Instant::now();
    let mut stopping = s.stopping.clone();
    let result = tokio::select! {
        r = s.handle.lock_with(name, opts) => r,
        // Dropping the acquisition abandons the wait.
        () = async { let _ = stopping.wait_for(|stop| *stop).await; } => return s.gate.refuse(gate::Refusal::Stopping),
    };
    let elapsed = start.elapsed();
    match result {
        Ok(guard) => {
            s.metrics.observe_acquire(Outcome::Acquired, elapsed);
            let (name, token, distinct_peers) = (guard.name().to_owned(), guard.token(), guard.distinct_peers());
            let told = hold(&s, lease, guard, ttl);
            let (valid_until_ms, valid_for_ms) = deadline_ms(told);
            let body = Acquired {
                name,
                token,
                lease: lease.to_hex(),
                valid_until_ms,
                valid_for_ms,
                distinct_peers,
                ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            };
            // On the unix socket (the production path) every hold is logged with the
            // client's user id; on loopback TCP (development, benchmarks) at debug.
            match peer.uid {
                Some(uid) => {
                    tracing::info!(name = %body.name, token, uid, ?elapsed, "lock acquired for an HTTP client")
                }
                None => tracing::debug!(name = %body.name, token, ?elapsed, "lock acquired for an HTTP client"),
            }
            (StatusCode::OK, Json(body)).into_response()
        }
        Err(e) => {
            let (outcome, status) = match &e {
                LockError::Timeout => (Outcome::Timeout, StatusCode::REQUEST_TIMEOUT),
                LockError::BadName | LockError::Quorum(_) | LockError::SwarmQuorum(_) => {
                    (Outcome::Error, StatusCode::BAD_REQUEST)
                }
                LockError::NodeStopped => (Outcome::Error, StatusCode::SERVICE_UNAVAILABLE),
                LockError::NotReady(_) => (Outcome::NotReady, StatusCode::SERVICE_UNAVAILABLE),
                LockError::Lost => (Outcome::Error, StatusCode::CONFLICT),
            };
            s.metrics.observe_acquire(outcome, elapsed);
            let code = matches!(e, LockError::NotReady(_)).then(|| "not_ready".to_owned());
            (status, Json(ErrorBody { error: e.to_string(), code })).into_response()
        }
    }
}

#[utoipa::path(post, path = "/v1/locks/{name}/keepalive", tag = "locks", params(("name" = String, Path, description = "Lock name: 1 to 200 bytes of [A-Za-z0-9._/-]; a '/' may be sent as is or as %2F")), request_body = HolderBody,
    responses((status = 200, description = "Client lease renewed; the answer's deadline replaces the last one", body = KeptAlive),
        (status = 400, description = "No lease id, or a malformed one (code bad_lease)", body = ErrorBody),
        (status = 404, description = "Not held under that token and lease (released, lost, expired; code not_held): stop using the lock", body = ErrorBody),
        (status = 503, description = "The daemon is stopping (code stopping): stop using the lock, then release it; or busy: retry, and stop at the last deadline", body = ErrorBody)))]
async fn keepalive(s: &AppState, name: &str, token: u64, tx: mpsc::Sender<HolderCmd>) -> Response {
    let (reply_tx, reply_rx) = oneshot::channel();
    if tx.send(HolderCmd::KeepAlive(reply_tx)).await.is_ok() {
        match reply_rx.await {
            Ok(Some((until, ttl))) => {
                let (valid_until_ms, valid_for_ms) = deadline_ms(until);
                let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
                let body = KeptAlive { name: name.to_owned(), token, valid_until_ms, valid_for_ms, ttl_ms };
                return (StatusCode::OK, Json(body)).into_response();
            }
            Ok(None) => return s.gate.refuse(gate::Refusal::Stopping),
            Err(_) => {}
        }
    }
    // The holder task ended in between: released, lost or expired.
    not_held(name, token)
}

#[utoipa::path(post, path = "/v1/locks/{name}/release", tag = "locks", params(("name" = String, Path, description = "Lock name: 1 to 200 bytes of [A-Za-z0-9._/-]; a '/' may be sent as is or as %2F")), request_body = HolderBody,
    responses((status = 200, description = "Released", body = Released),
        (status = 400, description = "No lease id, or a malformed one (code bad_lease)", body = ErrorBody),
        (status = 404, description = "Not held under that token and lease (code not_held)", body = ErrorBody)))]
async fn release(name: &str, token: u64, tx: mpsc::Sender<HolderCmd>) -> Response {
    let (reply_tx, reply_rx) = oneshot::channel();
    if tx.send(HolderCmd::Release(reply_tx)).await.is_ok() {
        match reply_rx.await {
            Ok(Ok(())) => {
                tracing::debug!(name, token, "lock released by an HTTP client");
                return (StatusCode::OK, Json(Released { name: name.to_owned(), token })).into_response();
            }
            Ok(Err(e)) => {
                return error_with_code(StatusCode::NOT_FOUND, "not_held", format!("lock {name} token {token}: {e}"))
            }
            Err(_) => {}
        }
    }
    // The holder task ended in between: the lock was lost.
    error_with_code(StatusCode::NOT_FOUND, "not_held", format!("lock {name} token {token} was lost"))
}

#[utoipa::path(get, path = "/v1/locks/{name}", tag = "locks", params(("name" = String, Path, description = "Lock name: 1 to 200 bytes of [A-Za-z0-9._/-]; a '/' may be sent as is or as %2F")),
    responses((status = 200, description = "What this daemon holds of the lock, and its replicas here", body = LockView),
        (status = 400, description = "Bad name", body = ErrorBody)))]
async fn get_lock(State(s): State<AppState>, Path(name): Path<String>) -> Response {
    if sigma_behaviour::wire::validate_resource(&name).is_err() {
        return error(StatusCode::BAD_REQUEST, format!("invalid lock name {name:?}"));
    }
    let senders: Vec<(u64, mpsc::Sender<HolderCmd>)> =
        s.held.lock().values().filter(|e| e.name == name).map(|e| (e.token, e.tx.clone())).collect();
    let mut held = Vec::new();
    for (token, tx) in senders {
        let (reply_tx, reply_rx) = oneshot::channel();
        if tx.send(HolderCmd::Info(reply_tx)).await.is_err() {
            continue;
        }
        if let Ok(Ok(until)) = tokio::time::timeout(Duration::from_secs(2), reply_rx).await {
            let (valid_until_ms, valid_for_ms) = deadline_ms(until);
            held.push(HeldView { token, valid_until_ms, valid_for_ms });
        }
    }
    held.sort_by_key(|h| h.token);
    let status = match s.handle.status().await {
        Ok(st) => st,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let replicas = match s.handle.hosted_replicas(&name).await {
        Ok(r) => r,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let view = LockView {
        held_by_this_node: status.locks_held.iter().any(|(n, _)| *n == name),
        waiting_on_this_node: status.locks_waiting.contains(&name),
        name,
        held,
        replicas: replicas
            .into_iter()
            .map(|r| ReplicaView {
                index: r.index,
                owner: r.owner.map(|(peer, counter, stamp)| OwnerView { peer: peer.to_string(), counter, stamp }),
                queue: r
                    .queue
                    .into_iter()
                    .map(|(peer, counter)| WaiterView { peer: peer.to_string(), counter })
                    .collect(),
            })
            .collect(),
    };
    (StatusCode::OK, Json(view)).into_response()
}

#[utoipa::path(get, path = "/v1/inspect/{name}", tag = "operators", params(("name" = String, Path, description = "Lock name: 1 to 200 bytes of [A-Za-z0-9._/-]; a '/' may be sent as is or as %2F")),
    responses((status = 200, description = "The lock seen from the hosts of all its replicas", body = sigma_node::inspect::Inspection),
        (status = 400, description = "Bad name", body = ErrorBody)))]
async fn get_inspect(State(s): State<AppState>, Path(name): Path<String>) -> Response {
    match s.handle.inspect(&name).await {
        Ok(view) => (StatusCode::OK, Json(view)).into_response(),
        Err(e @ LockError::BadName) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

#[utoipa::path(post, path = "/v1/revoke/{name}", tag = "operators", params(("name" = String, Path, description = "Lock name: 1 to 200 bytes of [A-Za-z0-9._/-]; a '/' may be sent as is or as %2F")), request_body = RevokeBody,
    responses((status = 200, description = "The holder gave the lock up", body = sigma_node::inspect::Revoked),
        (status = 404, description = "Not held under that token, or the holder refused", body = ErrorBody)))]
async fn post_revoke(
    State(s): State<AppState>,
    axum::Extension(peer): axum::Extension<serve::Peer>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let token = match serde_json::from_slice::<RevokeBody>(&body) {
        Ok(b) => b.token,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad revoke body (expected {{\"token\": N}}): {e}")),
    };
    match s.handle.revoke(&name, token).await {
        Ok(done) => {
            tracing::warn!(name, token, holder = %done.holder, uid = ?peer.uid, "lock revoked through the API");
            (StatusCode::OK, Json(done)).into_response()
        }
        Err(e @ RevokeError::NotFound { .. }) => error(StatusCode::NOT_FOUND, e.to_string()),
        Err(e @ RevokeError::Lock(LockError::BadName)) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// Answer of `GET /healthz` and `GET /readyz` when they pass.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Probe {
    /// `serving` (or, for `/healthz`, the readiness whatever it is: alive is enough).
    pub readiness: String,
}

/// How long a probe waits for the node's event loop.
const PROBE_PATIENCE: Duration = Duration::from_secs(2);

#[utoipa::path(get, path = "/healthz", tag = "node",
    responses((status = 200, description = "The daemon's event loop answers (liveness): restart it only on a 503 or no answer", body = Probe),
        (status = 503, description = "`unresponsive`: the event loop did not answer within 2 s, or the node stopped", body = ErrorBody)))]
async fn get_healthz(State(s): State<AppState>) -> Response {
    match probe_status(&s).await {
        Ok(st) => (StatusCode::OK, Json(Probe { readiness: st.readiness })).into_response(),
        Err(unresponsive) => unresponsive,
    }
}

/// The node's status for a probe, or the 503 `unresponsive` answer if the event loop
/// did not give it within [`PROBE_PATIENCE`].
async fn probe_status(s: &AppState) -> Result<sigma_node::Status, Response> {
    match tokio::time::timeout(PROBE_PATIENCE, s.handle.status()).await {
        Ok(Ok(st)) => Ok(st),
        Ok(Err(e)) => Err(error_with_code(StatusCode::SERVICE_UNAVAILABLE, "unresponsive", e.to_string())),
        Err(_) => Err(error_with_code(
            StatusCode::SERVICE_UNAVAILABLE,
            "unresponsive",
            format!("the event loop did not answer within {PROBE_PATIENCE:?}"),
        )),
    }
}

#[utoipa::path(get, path = "/readyz", tag = "node",
    responses((status = 200, description = "The peer serves and no new lock waits for a takeover delay: a lock taken now is granted at once (readiness)", body = Probe),
        (status = 503, description = "`not_ready` (joining, a minority, unreachable, leaving) or `held_back` (serving, but a new lock waits out the takeover delay); the message says which and for how long", body = ErrorBody)))]
async fn get_readyz(State(s): State<AppState>) -> Response {
    let st = match probe_status(&s).await {
        Ok(st) => st,
        Err(unresponsive) => return unresponsive,
    };
    if !st.ready {
        return error_with_code(StatusCode::SERVICE_UNAVAILABLE, "not_ready", st.readiness_detail);
    }
    if st.held_back_ms > 0 {
        let msg = format!(
            "serving, but a new lock waits {} ms more for the takeover delay (every replica this peer starts grants \
             nothing until then)",
            st.held_back_ms
        );
        return error_with_code(StatusCode::SERVICE_UNAVAILABLE, "held_back", msg);
    }
    (StatusCode::OK, Json(Probe { readiness: st.readiness })).into_response()
}

#[utoipa::path(get, path = "/v1/status", tag = "node",
    responses((status = 200, description = "The node: peers, readiness, locks, state sizes", body = sigma_node::Status)))]
async fn get_status(State(s): State<AppState>) -> Response {
    match s.handle.status().await {
        Ok(st) => (StatusCode::OK, Json(st)).into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// Body of `POST /v1/admin/block` and `…/unblock`, and answer of all three admin calls.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PeerList {
    /// Peer ids.
    pub peers: Vec<String>,
}

#[utoipa::path(get, path = "/v1/admin/blocked", tag = "admin",
    responses((status = 200, description = "Peers blocked now", body = PeerList)))]
async fn get_blocked(State(s): State<AppState>) -> Response {
    block(s, Vec::new(), true).await
}

#[utoipa::path(post, path = "/v1/admin/block", tag = "admin", request_body = PeerList,
    responses((status = 200, description = "Their connections closed and refused; the peers blocked afterwards", body = PeerList)))]
async fn post_block(
    State(s): State<AppState>,
    axum::Extension(peer): axum::Extension<serve::Peer>,
    body: axum::body::Bytes,
) -> Response {
    match parse_peers(&body) {
        Ok(peers) => {
            tracing::info!(?peers, uid = ?peer.uid, "peers blocked through the API");
            block(s, peers, true).await
        }
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

#[utoipa::path(post, path = "/v1/admin/unblock", tag = "admin", request_body = PeerList,
    responses((status = 200, description = "The peers blocked afterwards", body = PeerList)))]
async fn post_unblock(
    State(s): State<AppState>,
    axum::Extension(peer): axum::Extension<serve::Peer>,
    body: axum::body::Bytes,
) -> Response {
    match parse_peers(&body) {
        Ok(peers) => {
            tracing::info!(?peers, uid = ?peer.uid, "peers unblocked through the API");
            block(s, peers, false).await
        }
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

fn parse_peers(body: &[u8]) -> Result<Vec<libp2p::PeerId>, String> {
    let list: PeerList =
        serde_json::from_slice(body).map_err(|e| format!("bad body (expected {{\"peers\": [peer ids]}}): {e}"))?;
    list.peers.iter().map(|p| p.parse().map_err(|e| format!("bad peer id {p:?}: {e}"))).collect()
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

#[utoipa::path(post, path = "/v1/admin/forget", tag = "admin", request_body = PeerList,
    responses((status = 200, description = "Peers gone for good, taken out of this node's membership counts (only a peer not alive here, and not on the member list)", body = Forgotten)))]
async fn post_forget(
    State(s): State<AppState>,
    axum::Extension(peer): axum::Extension<serve::Peer>,
    body: axum::body::Bytes,
) -> Response {
    let peers = match parse_peers(&body) {
        Ok(peers) => peers,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    tracing::warn!(?peers, uid = ?peer.uid, "members forgotten through the API");
    match s.handle.forget_peers(peers).await {
        Ok(outcomes) => {
            let mut answer = Forgotten { forgotten: Vec::new(), refused: Vec::new() };
            for (p, outcome) in outcomes {
                match outcome {
                    Ok(()) => answer.forgotten.push(p.to_string()),
                    Err(why) => answer.refused.push(ForgetRefusal { peer: p.to_string(), reason: why.to_string() }),
                }
            }
            (StatusCode::OK, Json(answer)).into_response()
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// The admin control is on the same loopback-only listener as the rest of the API.
async fn block(s: AppState, peers: Vec<libp2p::PeerId>, block: bool) -> Response {
    match s.handle.block_peers(peers, block).await {
        Ok(blocked) => (StatusCode::OK, Json(PeerList { peers: blocked.iter().map(ToString::to_string).collect() }))
            .into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

#[utoipa::path(get, path = "/metrics", tag = "node",
    responses((status = 200, description = "Prometheus / OpenMetrics text", content_type = "application/openmetrics-text")))]
async fn get_metrics(State(s): State<AppState>) -> Response {
    match s.handle.counters().await {
        Ok((c, t)) => s.metrics.set_snapshot(c, t),
        Err(e) => tracing::debug!(%e, "metrics: counters unavailable"),
    }
    s.metrics.set_http_locks_held(s.held.len());
    match metrics::encode(&s.registry) {
        Ok(text) => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response(),
        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "metrics encoding failed"),
    }
}

/// The API's routes over a node, behind the gate.
/// The API's OpenAPI 3.1 document, generated from the handlers and types above.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(title = "sigma daemon API", description = "The local control API of a sigma peer (loopback only)."),
    paths(
        acquire,
        keepalive,
        release,
        get_lock,
        get_inspect,
        post_revoke,
        get_status,
        get_metrics,
        get_blocked,
        post_block,
        post_unblock,
        post_forget,
        get_healthz,
        get_readyz,
        get_openapi
    )
)]
pub struct ApiDoc;

/// The OpenAPI document (`GET /v1/openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    <ApiDoc as utoipa::OpenApi>::openapi()
}

#[utoipa::path(get, path = "/v1/openapi.json", tag = "node",
    responses((status = 200, description = "This document", content_type = "application/json")))]
async fn get_openapi() -> Response {
    (StatusCode::OK, Json(openapi())).into_response()
}

fn router(state: AppState, gate: gate::Gate) -> Router {
    Router::new()
        .route("/v1/openapi.json", get(get_openapi))
        .route("/v1/locks/{*path}", get(get_lock).post(post_lock))
        .route("/v1/inspect/{*name}", get(get_inspect))
        .route("/v1/revoke/{*name}", axum::routing::post(post_revoke))
        .route("/v1/status", get(get_status))
        .route("/healthz", get(get_healthz))
        .route("/readyz", get(get_readyz))
        .route("/v1/admin/blocked", get(get_blocked))
        .route("/v1/admin/block", axum::routing::post(post_block))
        .route("/v1/admin/unblock", axum::routing::post(post_unblock))
        .route("/v1/admin/forget", axum::routing::post(post_forget))
        .route("/metrics", get(get_metrics))
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(gate, gate::check))
        .layer(axum::extract::DefaultBodyLimit::max(gate::MAX_BODY))
}

/// Options of the API ([`Api::bind_with`]).
#[derive(Clone, Debug)]
pub struct ApiOptions {
    /// Acquires served at once (waiting ones included); more are refused (503 `busy`).
    /// Keep-alives, releases and the other requests have pools of their own ([`gate`]).
    pub max_in_flight: usize,
    /// Acquires waiting at once for one lock name; more are refused (503
    /// `too_many_waiters`).
    pub max_waiters_per_lock: usize,
    /// If set, every request but the admin ones needs `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// The token the admin routes (`/v1/admin/*`, `/v1/revoke/*`) need; `None`: they
    /// are refused (403 `admin_disabled`).
    pub admin_token: Option<String>,
    /// If set, `/metrics` (and nothing else) is also served on this address, which may
    /// be any (a remote Prometheus scrapes it): no gate, at most
    /// [`MAX_METRICS_SCRAPES`] at once.
    pub metrics_addr: Option<SocketAddr>,
    /// Connections open at once on each listener; more are closed on accept.
    pub max_connections: usize,
    /// A connection that sends no complete request head within this long (idle between
    /// requests included) is closed.
    pub header_timeout: Duration,
}

/// Scrapes served at once on the metrics address; more wait.
pub const MAX_METRICS_SCRAPES: usize = 4;

/// Default of [`ApiOptions::max_waiters_per_lock`].
pub const DEFAULT_MAX_WAITERS_PER_LOCK: usize = 256;

impl Default for ApiOptions {
    fn default() -> Self {
        ApiOptions {
            max_in_flight: gate::DEFAULT_MAX_IN_FLIGHT,
            max_waiters_per_lock: DEFAULT_MAX_WAITERS_PER_LOCK,
            token: None,
            admin_token: None,
            metrics_addr: None,
            max_connections: serve::DEFAULT_MAX_CONNECTIONS,
            header_timeout: serve::DEFAULT_HEADER_TIMEOUT,
        }
    }
}

/// A running control API.
pub struct Api {
    addr: ApiAddr,
    metrics_addr: Option<SocketAddr>,
    held: Table,
    stopping: watch::Sender<bool>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

/// How [`Api::shutdown`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// Every lock held for an HTTP client was released by its client or ran out.
    Clean,
    /// This many were still held when the patience ran out. Releasing them would cut
    /// their holders short of the deadline they were told: the caller should stop the
    /// node without releasing anything (their votes then lapse on their own, after that
    /// deadline), as a crash would.
    Abandoned(usize),
}

impl Api {
    /// Binds `addr` (loopback only; port 0 picks a free port) and serves the API
    /// for `handle` with the default [`ApiOptions`]. `registry` must already contain
    /// `metrics` (and libp2p's).
    pub async fn bind(
        addr: impl Into<ApiAddr>,
        handle: NodeHandle,
        metrics: Metrics,
        registry: Arc<Registry>,
    ) -> Result<Api, ApiError> {
        Api::bind_with(addr, handle, metrics, registry, ApiOptions::default()).await
    }

    /// [`Api::bind`] with options.
    pub async fn bind_with(
        addr: impl Into<ApiAddr>,
        handle: NodeHandle,
        metrics: Metrics,
        registry: Arc<Registry>,
        options: ApiOptions,
    ) -> Result<Api, ApiError> {
        let (listener, addr) = match addr.into() {
            ApiAddr::Tcp(addr) => {
                let listener = tokio::net::TcpListener::bind(check_loopback(addr)?).await.map_err(ApiError::Io)?;
                let addr = listener.local_addr().map_err(ApiError::Io)?;
                (serve::Listener::Tcp(listener), ApiAddr::Tcp(addr))
            }
            ApiAddr::Unix(path) => (serve::Listener::Unix(bind_socket(&path)?), ApiAddr::Unix(path)),
        };
        let held = Table::default();
        let gate = gate::Gate::new(options.max_in_flight, options.token, options.admin_token, metrics.clone());
        let (stopping, stopping_rx) = watch::channel(false);
        let state = AppState {
            handle,
            metrics: metrics.clone(),
            registry,
            held: held.clone(),
            waiters: Waiters::default(),
            max_waiters_per_lock: options.max_waiters_per_lock.max(1),
            stopping: stopping_rx,
            gate: gate.clone(),
        };
        let metrics_listener = match options.metrics_addr {
            Some(a) => Some(tokio::net::TcpListener::bind(a).await.map_err(ApiError::Io)?),
            None => None,
        };
        let metrics_addr = match &metrics_listener {
            Some(l) => Some(l.local_addr().map_err(ApiError::Io)?),
            None => None,
        };
        let limits = serve::Limits { max_connections: options.max_connections, header_timeout: options.header_timeout };
        let (stop, stopped) = oneshot::channel::<()>();
        let stopped = futures::FutureExt::shared(stopped);
        let api_stopped = stopped.clone();
        let serve = serve::serve(listener, router(state.clone(), gate), limits, "api", metrics.clone(), async move {
            let _ = api_stopped.await;
        });
        let task = tokio::spawn(async move {
            let Some(listener) = metrics_listener else { return serve.await };
            let metrics_only = Router::new()
                .route("/metrics", get(get_metrics))
                .with_state(state)
                .layer(tower::limit::GlobalConcurrencyLimitLayer::new(MAX_METRICS_SCRAPES));
            let scrape =
                serve::serve(serve::Listener::Tcp(listener), metrics_only, limits, "metrics", metrics, async move {
                    let _ = stopped.await;
                });
            let (a, b) = tokio::join!(serve, scrape);
            a.and(b)
        });
        Ok(Api { addr, metrics_addr, held, stopping, stop, task })
    }

    /// The bound address.
    pub fn local_addr(&self) -> &ApiAddr {
        &self.addr
    }

    /// The metrics address, if one was asked for ([`ApiOptions::metrics_addr`]).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Stops without cutting a holder short. From the call on, acquires are refused and
    /// waiting ones abandoned (503 `stopping`), and keep-alives are answered 503
    /// `stopping`, which tells a holder's client to stop using the lock and release it;
    /// releases are still served. Waits until every lock held for an HTTP client is
    /// released or has run out with its client lease (no longer renewed, so it ends
    /// within its TTL), or for `patience`, then stops serving. Call before stopping the
    /// node; see [`Stopped`] for what to do with the locks still held then.
    pub async fn shutdown(self, patience: Duration) -> Stopped {
        let _ = self.stopping.send(true);
        let held = self.held.len();
        if held > 0 {
            tracing::info!(held, ?patience, "stopping: waiting for HTTP clients to release their locks");
        }
        let empty = async {
            loop {
                let changed = self.held.changed.notified();
                if self.held.len() == 0 {
                    return;
                }
                changed.await;
            }
        };
        let outcome = match tokio::time::timeout(patience, empty).await {
            Ok(()) => Stopped::Clean,
            Err(_) => Stopped::Abandoned(self.held.len()),
        };
        let _ = self.stop.send(());
        // Requests still open end when the node stops; do not wait for them.
        let _ = tokio::time::timeout(Duration::from_millis(500), self.task).await;
        if let ApiAddr::Unix(path) = &self.addr {
            let _ = std::fs::remove_file(path);
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_addresses_are_accepted() {
        for s in ["127.0.0.1:7700", "127.0.0.2:0", "[::1]:80", "localhost:9", " 127.0.0.1:1 ", "[::ffff:127.0.0.1]:5"] {
            assert!(parse_loopback_addr(s).is_ok(), "{s}");
        }
    }

    #[test]
    fn other_addresses_are_refused() {
        for s in ["0.0.0.0:7700", "192.168.1.2:80", "[::]:80", "10.0.0.1:1", "[::ffff:10.0.0.1]:5"] {
            match parse_loopback_addr(s) {
                Err(ApiError::NotLoopback(_)) => {}
                other => panic!("{s}: {other:?}"),
            }
        }
        for s in ["", "127.0.0.1", "localhost", "localhost:x", "example.com:80", "127.0.0.1:99999"] {
            match parse_loopback_addr(s) {
                Err(ApiError::BadAddress(_)) => {}
                other => panic!("{s}: {other:?}"),
            }
        }
        let msg = parse_loopback_addr("0.0.0.0:1").unwrap_err().to_string();
        assert!(msg.contains("loopback"), "{msg}");
    }

    #[test]
    fn the_openapi_document_has_every_route_and_its_types() {
        let doc = serde_json::to_value(openapi()).unwrap();
        let mut paths: Vec<&str> = doc["paths"].as_object().unwrap().keys().map(String::as_str).collect();
        paths.sort_unstable();
        let mut want = vec![
            "/healthz",
            "/metrics",
            "/readyz",
            "/v1/admin/block",
            "/v1/admin/blocked",
            "/v1/admin/forget",
            "/v1/admin/unblock",
            "/v1/inspect/{name}",
            "/v1/locks/{name}",
            "/v1/locks/{name}/acquire",
            "/v1/locks/{name}/keepalive",
            "/v1/locks/{name}/release",
            "/v1/openapi.json",
            "/v1/revoke/{name}",
            "/v1/status",
        ];
        want.sort_unstable();
        assert_eq!(paths, want);
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for t in [
            "Acquired",
            "KeptAlive",
            "Released",
            "HolderBody",
            "RevokeBody",
            "ErrorBody",
            "LockView",
            "Inspection",
            "Status",
        ] {
            assert!(schemas.contains_key(t), "schema {t} missing: {:?}", schemas.keys().collect::<Vec<_>>());
        }
        let acquire = &doc["paths"]["/v1/locks/{name}/acquire"]["post"];
        let params: Vec<&str> =
            acquire["parameters"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
        assert_eq!(params, ["name", "timeout_ms", "ttl_ms", "n", "m", "min_peers"]);
    }

    #[test]
    fn post_paths_split_on_the_last_segment() {
        assert_eq!(split_action("a/acquire"), Some(("a", "acquire")));
        assert_eq!(split_action("orders/42/release"), Some(("orders/42", "release")));
        assert_eq!(split_action("a/acquire/acquire"), Some(("a/acquire", "acquire")));
        assert_eq!(split_action("acquire"), None);
    }

    #[test]
    fn deadlines_in_the_past_are_zero_from_now() {
        let (abs, left) = deadline_ms(Instant::now() - Duration::from_secs(1));
        assert_eq!(left, 0);
        assert!(abs > 1_600_000_000_000);
        let (_, left) = deadline_ms(Instant::now() + Duration::from_secs(10));
        assert!((9_000..=10_000).contains(&left), "{left}");
    }
}
