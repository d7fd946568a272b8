//! A typed client of a daemon's HTTP control API ([`crate::http`]): what `sigma lock`,
//! `sigma status`, `sigma inspect`, the testnet and Rust programs that talk to a running
//! daemon (instead of embedding a [`sigma_node::Node`]) use. One method per endpoint, the
//! answers as the types the daemon serialises, every refusal as a [`ClientError`].
//!
//! **The holder's contract.** An acquire answers a fencing token (public), a lease id
//! (the secret keep-alive and release need) and a deadline, `valid_for_ms`: the lock may
//! go to someone else after it, and not before. Count it from when the request was
//! *sent*, and stop using the lock at it unless a keep-alive (sent before it) answered a
//! later one, whatever else happens: a refused connection, a timeout or 503 `busy` only
//! mean no new deadline; 404 `not_held` and 503 `stopping` mean stop now
//! ([`ClientError::code`]).
//!
//! **Errors.** Every refusal of the daemon is a [`ClientError::Refused`] with its
//! [`ErrorCode`]: match on the code, never on the message (docs/operating.md, "Errors",
//! says what to do on each). "Not won in time" is [`ErrorCode::NotWon`] (HTTP 423).
//!
//! ```no_run
//! # async fn demo() -> Result<(), sigma_daemon::client::ClientError> {
//! use sigma_daemon::client::{AcquireOptions, Client};
//! use std::time::Duration;
//!
//! let api = Client::new("127.0.0.1:7591".parse::<std::net::SocketAddr>().unwrap());
//! let opts = AcquireOptions { timeout: Some(Duration::from_secs(10)), ..AcquireOptions::default() };
//! let sent = std::time::Instant::now();
//! let lock = api.acquire("orders/42", &opts).await?;
//! let mut deadline = sent + Duration::from_millis(lock.valid_for_ms);
//! // ... work until `deadline` at the latest, passing lock.token to the protected
//! // resource; renew well before it (sent again just before the call):
//! let sent = std::time::Instant::now();
//! let kept = api.keepalive("orders/42", lock.token, &lock.lease).await?;
//! deadline = sent + Duration::from_millis(kept.valid_for_ms);
//! // ... and stop at `deadline` if renewals fail, whatever the error ...
//! api.release("orders/42", lock.token, &lock.lease).await?;
//! # Ok(())
//! # }
//! ```

use std::time::{Duration, Instant};

use reqwest::header::{HeaderValue, AUTHORIZATION};
use serde::de::DeserializeOwned;

use crate::http::{
    gate, AcquireBody, Acquired, ApiAddr, ErrorBody, Forgotten, HolderBody, KeptAlive, LockView, PeerList, Released,
    RevokeBody, ValueBody, ValueSet,
};
use sigma_node::inspect::{Inspection, Revoked};
use sigma_node::Status;

pub use crate::http::ErrorCode;

/// How much longer than an acquire's own timeout the client waits for the daemon's
/// answer: the daemon answers 423 `not_won` itself; this only bounds a hung daemon.
pub const ACQUIRE_SLACK: Duration = Duration::from_secs(5);
/// Deadline of every other call, unless [`Client::with_timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No connection to the daemon, or it broke.
    #[error("cannot reach the sigma daemon at {api} (is `sigma run` running?): {source}")]
    Unreachable {
        /// The API address.
        api: ApiAddr,
        /// What the transport said.
        source: reqwest::Error,
    },
    /// The daemon did not answer within the call's deadline.
    #[error("the sigma daemon at {api} did not answer in time")]
    NoAnswer {
        /// The API address.
        api: ApiAddr,
    },
    /// The daemon refused the call: its [`ErrorCode`] says why (and gives the HTTP
    /// status, [`ErrorCode::status`]), its message says it to a person.
    #[error("{message} ({code})")]
    Refused {
        /// The error's stable code.
        code: ErrorCode,
        /// The daemon's message.
        message: String,
    },
    /// An error answer without a code this client knows (not a sigma daemon, or one of
    /// another version): its HTTP status and body.
    #[error("HTTP {status} from the sigma daemon: {message}")]
    Unexpected {
        /// HTTP status.
        status: u16,
        /// The body (or the status's text).
        message: String,
    },
    /// A token that cannot be sent as a header.
    #[error("the {0} token is not a valid header value")]
    BadToken(&'static str),
    /// An answer that does not decode.
    #[error("bad answer from the sigma daemon: {0}")]
    Decode(String),
}

impl ClientError {
    /// The daemon refused the connection: nothing listens on its address, or its socket
    /// is gone (the daemon is not running). For a holder, no keep-alive can succeed any
    /// more.
    pub fn is_refused_connection(&self) -> bool {
        match self {
            ClientError::Unreachable { source, .. } => {
                source.is_connect()
                    && std::error::Error::source(source).and_then(|e| find_io(e)).is_some_and(|e| {
                        matches!(e.kind(), std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound)
                    })
            }
            _ => false,
        }
    }

    /// The daemon's code, if it refused the call.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// `503 stopping`: the daemon is stopping. A holder must stop using the lock now and
    /// release it.
    pub fn is_stopping(&self) -> bool {
        self.code() == Some(ErrorCode::Stopping)
    }
}

/// The `std::io::Error` at the bottom of an error chain, if any.
fn find_io<'a>(mut e: &'a (dyn std::error::Error + 'static)) -> Option<&'a std::io::Error> {
    loop {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        e = e.source()?;
    }
}

/// Options of [`Client::acquire`].
#[derive(Clone, Debug, Default)]
pub struct AcquireOptions {
    /// Give up after this long (423: [`ErrorCode::NotWon`]); `None`: wait as long as it
    /// takes.
    pub timeout: Option<Duration>,
    /// The client lease: the daemon releases the lock this long after the last
    /// [`Client::keepalive`]. `None`: the daemon's default (5 s).
    pub ttl: Option<Duration>,
    /// `(n, m)` for this lock; `None`: the swarm's.
    pub quorum: Option<(usize, usize)>,
    /// Votes from at least this many distinct peers; `None`: the daemon's.
    pub min_peers: Option<usize>,
    /// A value to attach to the lock once held (at most 4096 bytes; sent as text when
    /// it is UTF-8, else as base64).
    pub value: Option<Vec<u8>>,
    /// Take one of this many slots of semaphore `name` (1 to 64) instead of the lock
    /// `name`: the answer's [`Acquired::slot`] says which, its `name` is the slot's lock.
    pub slots: Option<u16>,
}

/// Server-sent events of one kind from the daemon (`GET /v1/watch/{name}`,
/// `GET /v1/observe/{name}`), read as they come: each is a `T`; the daemon's error
/// event ends the stream with [`ClientError::Refused`].
#[derive(Debug)]
pub struct Events<T> {
    resp: reqwest::Response,
    buf: Vec<u8>,
    api: ApiAddr,
    ended: bool,
    _kind: std::marker::PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> Events<T> {
    /// The next event, or `None` once the stream ended.
    pub async fn next(&mut self) -> Option<Result<T, ClientError>> {
        if self.ended {
            return None;
        }
        loop {
            if let Some(event) = self.take_event() {
                let (kind, data) = event;
                match kind.as_str() {
                    "error" => {
                        self.ended = true;
                        return Some(Err(match serde_json::from_str::<ErrorBody>(&data) {
                            Ok(b) => ClientError::Refused { code: b.code, message: b.error },
                            Err(e) => ClientError::Decode(e.to_string()),
                        }));
                    }
                    _ if data.is_empty() => continue, // a keep-alive comment
                    _ => return Some(serde_json::from_str(&data).map_err(|e| ClientError::Decode(e.to_string()))),
                }
            }
            match self.resp.chunk().await {
                Ok(Some(chunk)) => self.buf.extend_from_slice(&chunk),
                Ok(None) => {
                    self.ended = true;
                    return None;
                }
                Err(source) => {
                    self.ended = true;
                    return Some(Err(ClientError::Unreachable { api: self.api.clone(), source }));
                }
            }
        }
    }

    /// The first whole event in the buffer: (event name, data lines joined).
    fn take_event(&mut self) -> Option<(String, String)> {
        let end = self.buf.windows(2).position(|w| w == b"\n\n")?;
        let block: Vec<u8> = self.buf.drain(..end + 2).collect();
        let text = String::from_utf8_lossy(&block);
        let (mut kind, mut data) = (String::from("message"), Vec::new());
        for line in text.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                kind = v.trim_start().to_owned();
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
            }
        }
        Some((kind, data.join("\n")))
    }
}

/// A client of one daemon's API. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Client {
    api: ApiAddr,
    /// `http://IP:PORT`, or `http://localhost` over a unix socket.
    base: String,
    http: reqwest::Client,
    token: Option<HeaderValue>,
    /// Sent instead of `token` on the admin routes (block, revoke).
    admin_token: Option<HeaderValue>,
    timeout: Duration,
}

impl Client {
    /// A client of the API at `api`: a loopback address (the daemon serves no other) or
    /// a unix socket.
    pub fn new(api: impl Into<ApiAddr>) -> Client {
        // Loopback only: never through a proxy from the environment.
        let http = reqwest::Client::builder().no_proxy().build().unwrap_or_default();
        Client::with_http(api, http)
    }

    /// The same over an existing `reqwest` client (connection pool shared with other
    /// daemons' clients). A unix socket gets a `reqwest` client of its own.
    pub fn with_http(api: impl Into<ApiAddr>, http: reqwest::Client) -> Client {
        let api = api.into();
        let (base, http) = match &api {
            ApiAddr::Tcp(a) => (format!("http://{a}"), http),
            ApiAddr::Unix(path) => {
                let http = reqwest::Client::builder().unix_socket(path.as_path()).build().unwrap_or_default();
                ("http://localhost".to_owned(), http)
            }
        };
        Client { api, base, http, token: None, admin_token: None, timeout: DEFAULT_TIMEOUT }
    }

    /// Sends `Authorization: Bearer <token>` (a daemon started with `--api-token-file`).
    pub fn with_token(mut self, token: &str) -> Result<Client, ClientError> {
        let value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| ClientError::BadToken("API"))?;
        self.token = Some(value);
        Ok(self)
    }

    /// Sends `Authorization: Bearer <token>` on the admin routes (`revoke`, `block`): the
    /// daemon's admin token (`--admin-token-file`).
    pub fn with_admin_token(mut self, token: &str) -> Result<Client, ClientError> {
        let value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| ClientError::BadToken("admin"))?;
        self.admin_token = Some(value);
        Ok(self)
    }

    /// Deadline of every call but acquire (default [`DEFAULT_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    /// The API address.
    pub fn api(&self) -> &ApiAddr {
        &self.api
    }

    /// `POST /v1/locks/{name}/acquire`: waits until the lock is held (or
    /// `opts.timeout`). The daemon holds it for this client while it keeps its lease
    /// alive ([`Client::keepalive`]).
    pub async fn acquire(&self, name: &str, opts: &AcquireOptions) -> Result<Acquired, ClientError> {
        let mut query = Vec::new();
        if let Some(t) = opts.timeout {
            query.push(format!("timeout_ms={}", t.as_millis()));
        }
        if let Some((n, m)) = opts.quorum {
            query.push(format!("n={n}&m={m}"));
        }
        if let Some(d) = opts.min_peers {
            query.push(format!("min_peers={d}"));
        }
        if let Some(ttl) = opts.ttl {
            query.push(format!("ttl_ms={}", ttl.as_millis()));
        }
        if let Some(k) = opts.slots {
            query.push(format!("slots={k}"));
        }
        let mut url = self.lock_url(name, Some("acquire"));
        if !query.is_empty() {
            url = format!("{url}?{}", query.join("&"));
        }
        let mut request = self.http.post(url);
        if let Some(value) = &opts.value {
            let (value, value_base64) = sigma_node::value::to_fields(value);
            request = request.json(&AcquireBody { value, value_base64 });
        }
        if let Some(t) = opts.timeout {
            request = request.timeout(t + ACQUIRE_SLACK);
        }
        self.call(request).await
    }

    /// `POST /v1/locks/{name}/value`: replaces the value of a held lock (`lease`:
    /// [`Acquired::lease`]); answers its version.
    pub async fn set_value(&self, name: &str, token: u64, lease: &str, value: &[u8]) -> Result<ValueSet, ClientError> {
        let (text, base64) = sigma_node::value::to_fields(value);
        let body = ValueBody { token, lease: lease.to_owned(), value: text, value_base64: base64 };
        let request = self.http.post(self.lock_url(name, Some("value"))).json(&body);
        self.call(request.timeout(self.timeout)).await
    }

    /// `GET /v1/watch/{name}`: the lock's states as they change (see
    /// [`sigma_node::watch`] for what a watcher is promised); `interval`: how often the
    /// daemon inspects it (default 500 ms).
    pub async fn watch(
        &self,
        name: &str,
        interval: Option<Duration>,
    ) -> Result<Events<sigma_node::watch::LockState>, ClientError> {
        self.events("watch", name, interval).await
    }

    /// `GET /v1/observe/{name}`: the lock's leaders (its holders with their values),
    /// each once and in token order.
    pub async fn observe(
        &self,
        name: &str,
        interval: Option<Duration>,
    ) -> Result<Events<sigma_node::inspect::HolderView>, ClientError> {
        self.events("observe", name, interval).await
    }

    async fn events<T>(&self, route: &str, name: &str, interval: Option<Duration>) -> Result<Events<T>, ClientError> {
        let mut url = format!("{}/v1/{route}/{}", self.base, encode_name(name));
        if let Some(i) = interval {
            url = format!("{url}?interval_ms={}", i.as_millis());
        }
        // No deadline on the whole call: the stream lasts as long as the watcher wants.
        let resp = self.send(self.http.get(url), self.token.as_ref()).await?;
        Ok(Events { resp, buf: Vec::new(), api: self.api.clone(), ended: false, _kind: std::marker::PhantomData })
    }

    /// `POST /v1/locks/{name}/keepalive`: renews the client lease of a held lock
    /// (`lease`: [`Acquired::lease`]) and answers the new deadline.
    pub async fn keepalive(&self, name: &str, token: u64, lease: &str) -> Result<KeptAlive, ClientError> {
        let body = HolderBody { token, lease: lease.to_owned() };
        let request = self.http.post(self.lock_url(name, Some("keepalive"))).json(&body);
        self.call(request.timeout(self.timeout)).await
    }

    /// `POST /v1/locks/{name}/release` (`lease`: [`Acquired::lease`]).
    pub async fn release(&self, name: &str, token: u64, lease: &str) -> Result<Released, ClientError> {
        let body = HolderBody { token, lease: lease.to_owned() };
        let request = self.http.post(self.lock_url(name, Some("release"))).json(&body);
        self.call(request.timeout(self.timeout)).await
    }

    /// `GET /v1/locks/{name}`: what this daemon holds of the lock, and its replicas here.
    pub async fn lock(&self, name: &str) -> Result<LockView, ClientError> {
        self.call(self.http.get(self.lock_url(name, None)).timeout(self.timeout)).await
    }

    /// `GET /v1/inspect/{name}`: the lock seen from the hosts of all its replicas.
    pub async fn inspect(&self, name: &str) -> Result<Inspection, ClientError> {
        let url = format!("{}/v1/inspect/{}", self.base, encode_name(name));
        self.call(self.http.get(url).timeout(self.timeout)).await
    }

    /// `GET /v1/swarm/locks`: the locks held and waited for across the swarm.
    pub async fn swarm_locks(&self) -> Result<sigma_node::listing::SwarmLocks, ClientError> {
        let url = format!("{}/v1/swarm/locks", self.base);
        self.call(self.http.get(url).timeout(self.timeout)).await
    }

    /// `POST /v1/revoke/{name}`: an operator's break-lock (see [`sigma_node::NodeHandle::revoke`]).
    pub async fn revoke(&self, name: &str, token: u64) -> Result<Revoked, ClientError> {
        let url = format!("{}/v1/revoke/{}", self.base, encode_name(name));
        self.call_admin(self.http.post(url).json(&RevokeBody { token }).timeout(self.timeout)).await
    }

    /// `GET /v1/status`.
    pub async fn status(&self) -> Result<Status, ClientError> {
        self.call(self.http.get(format!("{}/v1/status", self.base)).timeout(self.timeout)).await
    }

    /// `GET /metrics`: the OpenMetrics text.
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let request = self.http.get(format!("{}/metrics", self.base)).timeout(self.timeout);
        let resp = self.send(request, self.token.as_ref()).await?;
        resp.text().await.map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// `POST /v1/admin/block` (or `unblock`): answers the peers blocked afterwards.
    pub async fn block(&self, peers: &[String], block: bool) -> Result<Vec<String>, ClientError> {
        let action = if block { "block" } else { "unblock" };
        let url = format!("{}/v1/admin/{action}", self.base);
        let request = self.http.post(url).json(&PeerList { peers: peers.to_vec() }).timeout(self.timeout);
        let list: PeerList = self.call_admin(request).await?;
        Ok(list.peers)
    }

    /// `POST /v1/admin/forget`: peers gone for good, taken out of the daemon's
    /// membership counts.
    pub async fn forget(&self, peers: &[String]) -> Result<Forgotten, ClientError> {
        let url = format!("{}/v1/admin/forget", self.base);
        let request = self.http.post(url).json(&PeerList { peers: peers.to_vec() }).timeout(self.timeout);
        self.call_admin(request).await
    }

    fn lock_url(&self, name: &str, action: Option<&str>) -> String {
        let base = format!("{}/v1/locks/{}", self.base, encode_name(name));
        action.map_or_else(|| base.clone(), |a| format!("{base}/{a}"))
    }

    async fn call<T: DeserializeOwned>(&self, request: reqwest::RequestBuilder) -> Result<T, ClientError> {
        let resp = self.send(request, self.token.as_ref()).await?;
        resp.json().await.map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// [`Client::call`] on an admin route: with the admin token.
    async fn call_admin<T: DeserializeOwned>(&self, request: reqwest::RequestBuilder) -> Result<T, ClientError> {
        let resp = self.send(request, self.admin_token.as_ref()).await?;
        resp.json().await.map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// Sends with the gate's header (and `bearer`), and turns refusals into errors.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        bearer: Option<&HeaderValue>,
    ) -> Result<reqwest::Response, ClientError> {
        let mut request = request.header(gate::CLIENT_HEADER, "sigma-client");
        if let Some(t) = bearer {
            request = request.header(AUTHORIZATION, t.clone());
        }
        let resp = request.send().await.map_err(|e| {
            if e.is_timeout() {
                ClientError::NoAnswer { api: self.api.clone() }
            } else {
                ClientError::Unreachable { api: self.api.clone(), source: e }
            }
        })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = resp.text().await.unwrap_or_default();
        Err(match serde_json::from_str::<ErrorBody>(&body) {
            Ok(e) => ClientError::Refused { code: e.code, message: e.error },
            Err(_) if body.trim().is_empty() => {
                ClientError::Unexpected { status: status.as_u16(), message: status.to_string() }
            }
            Err(_) => ClientError::Unexpected { status: status.as_u16(), message: body.trim().to_owned() },
        })
    }
}

/// The lock name as one path segment ('/' included), so no URL normalisation applies.
pub fn encode_name(name: &str) -> String {
    const SET: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.');
    percent_encoding::utf8_percent_encode(name, SET).to_string()
}

/// A lock held through the HTTP API, kept by its holder's rules (docs/operating.md,
/// "The HTTP API"): its lease id, and its one deadline, counted from the *send* of the
/// keep-alive that confirmed it (never from an answer's arrival, which may come late).
/// The lock may go to someone else after the deadline, never before. The holder renews
/// it well before ([`Holding::next_renewal`], [`Holding::renew`]) and must stop using
/// the lock at it: [`Holding::renew`] says the lock is lost (and [`Holding::is_lost`]
/// stays true) when the daemon no longer holds it, is stopping, is gone (a refused
/// connection), or no renewal was confirmed before the time given, whatever else the
/// daemon answers. `sigma lock` is built on it.
#[derive(Debug)]
pub struct Holding {
    client: Client,
    name: String,
    token: u64,
    lease: String,
    ttl: Duration,
    deadline: Instant,
    valid_until_ms: u64,
    confirmed_at: Instant,
    lost: Option<String>,
    warned: bool,
}

/// The longest a renewal may take (one that takes long is no renewal).
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a lock acquired was lost before its holding could start.
#[derive(Debug, thiserror::Error)]
#[error("lock {name} (token {token}) was lost at once: {source}")]
pub struct LostAtOnce {
    /// The lock.
    pub name: String,
    /// Its fencing token.
    pub token: u64,
    /// The confirming keep-alive's error.
    #[source]
    pub source: ClientError,
}

impl Holding {
    /// Starts holding `acquired` (lock `name`, client lease `ttl`): renews the lease
    /// once at once, so that the deadline is counted from a send time. A lock lost in
    /// between is released and reported.
    pub async fn confirm(
        client: Client,
        name: String,
        acquired: Acquired,
        ttl: Duration,
    ) -> Result<Holding, LostAtOnce> {
        let token = acquired.token;
        let mut h = Holding {
            client,
            name,
            token,
            lease: acquired.lease,
            ttl,
            deadline: Instant::now(),
            valid_until_ms: acquired.valid_until_ms,
            confirmed_at: Instant::now(),
            lost: None,
            warned: false,
        };
        let sent = Instant::now();
        match h.client.clone().with_timeout(KEEPALIVE_TIMEOUT).keepalive(&h.name, token, &h.lease).await {
            Ok(kept) => {
                h.deadline = sent + Duration::from_millis(kept.valid_for_ms);
                h.valid_until_ms = kept.valid_until_ms;
                h.confirmed_at = sent;
                Ok(h)
            }
            Err(source) => {
                let _ = h.release().await;
                Err(LostAtOnce { name: h.name, token, source })
            }
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its fencing token.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The deadline: the lock may go to someone else after it, never before.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The deadline as the daemon wrote it at the confirming renewal (ms since the
    /// Unix epoch; later renewals move [`Holding::deadline`] on, not this).
    pub fn valid_until_ms(&self) -> u64 {
        self.valid_until_ms
    }

    /// When the confirming renewal was sent.
    pub fn confirmed_at(&self) -> Instant {
        self.confirmed_at
    }

    /// Time left until the deadline.
    pub fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Why the lock was lost, once [`Holding::renew`] found it lost.
    pub fn is_lost(&self) -> Option<&str> {
        self.lost.as_deref()
    }

    /// When to renew next: half-way to `stop_at` (the time the holder must start to
    /// stop), at most every quarter of the client lease, at least 50 ms apart.
    pub fn next_renewal(&self, stop_at: Instant) -> Instant {
        let now = Instant::now();
        now + (stop_at.saturating_duration_since(now) / 2).clamp(Duration::from_millis(50), self.ttl / 4)
    }

    /// Renews the client lease; `Some(why)` when the lock must be taken as lost (then
    /// and ever after): the daemon no longer holds it, is stopping or is gone, or
    /// `stop_at` came with no renewal answered in time.
    pub async fn renew(&mut self, stop_at: Instant) -> Option<String> {
        if self.lost.is_none() {
            self.lost = self.try_renew(stop_at).await;
        }
        self.lost.clone()
    }

    async fn try_renew(&mut self, stop_at: Instant) -> Option<String> {
        if Instant::now() >= stop_at {
            return Some("no keep-alive confirmed it before its deadline".to_owned());
        }
        // An answer after `stop_at` would come too late to move it: wait no longer.
        let sent = Instant::now();
        let patience = stop_at.saturating_duration_since(sent).min(KEEPALIVE_TIMEOUT);
        match self.client.clone().with_timeout(patience).keepalive(&self.name, self.token, &self.lease).await {
            Ok(kept) => {
                self.deadline = self.deadline.max(sent + Duration::from_millis(kept.valid_for_ms));
                self.warned = false;
                None
            }
            Err(e) if e.code() == Some(ErrorCode::NotHeld) => Some("the daemon no longer holds it".to_owned()),
            Err(e) if e.is_stopping() => Some("the daemon is stopping".to_owned()),
            Err(e) if e.is_refused_connection() => Some(format!("the daemon is gone ({e})")),
            Err(e) => {
                if !self.warned {
                    tracing::warn!(lock = %self.name, error = %e, "cannot renew the lock");
                    self.warned = true;
                }
                (Instant::now() >= stop_at).then(|| format!("no keep-alive confirmed it before its deadline ({e})"))
            }
        }
    }

    /// Releases the lock: `Ok(true)` released, `Ok(false)` the daemon does not hold it
    /// (lost).
    pub async fn release(&self) -> Result<bool, ClientError> {
        let client = self.client.clone().with_timeout(Duration::from_secs(10));
        match client.release(&self.name, self.token, &self.lease).await {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some(ErrorCode::NotHeld) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_one_path_segment() {
        assert_eq!(encode_name("orders/42"), "orders%2F42");
        assert_eq!(encode_name("a.b_c-d"), "a.b_c-d");
    }
}
