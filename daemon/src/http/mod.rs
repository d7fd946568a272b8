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
//! | `POST /v1/locks/{name}/acquire?timeout_ms=T&n=N&m=M` | none, or [`AcquireBody`] `{"value": …}` | blocks until held: 200 [`Acquired`]; 423 `not_won` on timeout; 400 `bad_name`, `bad_quorum`, `bad_value`; 503 `not_ready`, `stopping` |
//! | `POST /v1/locks/{name}/value` | [`ValueBody`] `{"token": …, "lease": …, "value": …}` | 200 [`ValueSet`]: the held lock's value replaced; 404 `not_held`; 400 `bad_value` |
//! | `POST /v1/locks/{name}/release` | [`HolderBody`] `{"token": …, "lease": …}` | 200 [`Released`]; 404 `not_held` under that token and lease |
//! | `POST /v1/locks/{name}/keepalive` | [`HolderBody`] `{"token": …, "lease": …}` | 200 [`KeptAlive`]; 404 `not_held` (released, lost, expired); 503 `stopping` |
//! | `GET /v1/locks/{name}` | | 200 [`LockView`]: locks held here for HTTP clients, this peer's replicas of the lock |
//! | `GET /v1/inspect/{name}` | | 200 [`sigma_node::inspect::Inspection`]: the lock seen from the hosts of all its replicas (holder, token, validity, waiters and positions, each replica) |
//! | `POST /v1/revoke/{name}` | [`RevokeBody`] `{"token": …}` | 200 [`sigma_node::inspect::Revoked`]: the holder gave it up; 404 not held under that token; 403 refused (the holder's `--admin-peer`) |
//! | `GET /v1/watch/{name}?interval_ms=I` | | 200 server-sent events `state`: a [`sigma_node::watch::LockState`] each time the lock changes; 503 `busy` past 256 watches |
//! | `GET /v1/observe/{name}?interval_ms=I` | | 200 server-sent events `leader`: each new holder (or value) once, in token order |
//! | `GET /v1/swarm/locks` | | 200 [`sigma_node::listing::SwarmLocks`]: the locks held and waited for across the swarm (every alive member asked) |
//! | `GET /v1/status` | | 200 the node's [`sigma_node::Status`] |
//! | `GET /healthz` | | 200 [`Probe`] while the event loop answers; 503 `unresponsive` |
//! | `GET /readyz` | | 200 [`Probe`] when serving with nothing held back; 503 `not_ready` or `held_back` |
//! | `POST /v1/admin/forget` | [`PeerList`] `{"peers": […]}` | 200 [`Forgotten`]: members gone for good taken out of this node's counts (admin token) |
//! | `GET /v1/openapi.json` | | 200 the OpenAPI document of all of this ([`openapi`]) |
//! | `GET /metrics` | | Prometheus / OpenMetrics text ([`sigma_node::metrics`]) |
//!
//! Every error is JSON, an [`ErrorBody`] `{"error": "…", "code": "…"}` whose
//! [`ErrorCode`] has one status ([`ErrorCode::status`]), unknown routes (404 `not_found`),
//! methods (405 `method_not_allowed`) and query parameters (400 `unknown_parameter`)
//! included; the OpenAPI document lists the codes, the bearer schemes and every error
//! status of each route. A lock name may contain `/`; it can
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

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

mod error;
pub mod gate;
mod serve;

pub use serve::{Peer, DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS};

mod holders;
mod routes;
mod types;

pub use error::{ErrorBody, ErrorCode};
pub use routes::{openapi, ApiDoc};
pub use types::*;

use holders::{Table, Waiters};
use routes::{get_metrics, router};
use sigma_node::metrics::Metrics;
use sigma_node::NodeHandle;

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
                .fallback(error::not_found)
                .method_not_allowed_fallback(error::method_not_allowed)
                .with_state(state)
                .layer(tower::limit::GlobalConcurrencyLimitLayer::new(MAX_METRICS_SCRAPES))
                .layer(axum::middleware::from_fn(error::json_errors));
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
}
