//! What a request must pass before it reaches the API's handlers.
//!
//! The API listens on loopback only, but a loopback port is reachable from more than the
//! local user's own programs: a web page in the user's browser can send it a form POST
//! (a "simple" request, sent without a CORS preflight), and a page under an attacker's
//! domain that re-resolves to 127.0.0.1 (DNS rebinding) can even read the answers. The
//! gate refuses, in this order, each with its [`ErrorCode`] in the [`super::ErrorBody`] and
//! counted in `sigma_http_rejected_total{reason}`:
//!
//! | check | status | code |
//! | --- | --- | --- |
//! | an admin route (`/v1/admin/*`, `/v1/revoke/*`) and no admin token is configured | 403 | `admin_disabled` |
//! | an admin route and `Authorization: Bearer …` is not the admin token (`--admin-token-file`) | 401 | `unauthorized` |
//! | another route, a bearer token is configured (`--api-token-file`) and `Authorization: Bearer …` does not match | 401 | `unauthorized` |
//! | `Host` missing or not a loopback address or `localhost` (DNS rebinding) | 403 | `bad_host` |
//! | `Origin` present and not a loopback origin (a web page) | 403 | `bad_origin` |
//! | a POST without `Content-Type: application/json` and without a `Sigma-Client` header (a form) | 415 | `bad_content_type` |
//! | a body larger than [`MAX_BODY`] | 413 | `body_too_large` |
//! | more than `max_in_flight` acquires at once (waiting ones included) | 503 | `busy` |
//! | more than [`HOLDER_IN_FLIGHT`] keep-alives and releases at once | 503 | `busy` |
//! | more than [`OTHER_IN_FLIGHT`] other requests at once (status, inspect, metrics, …) | 503 | `busy` |
//!
//! The three kinds of request draw on three pools of permits: acquires that wait for a
//! lock cannot starve a holder's keep-alive or release (a refused keep-alive would let
//! the client lease run out under a holder whose lock is fine), nor the probes and
//! scrapes that tell an operator what is going on. The acquire handler also bounds the
//! acquires waiting for one lock name ([`super::ApiOptions::max_waiters_per_lock`]).
//!
//! A browser cannot send a JSON content type, a custom header or an `Authorization` header
//! to another origin without a preflight, which this API never answers. Programs send
//! `Content-Type: application/json` on every POST (or `Sigma-Client: <anything>`).

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::Response;
use tokio::sync::Semaphore;

use super::ErrorCode;
use sigma_node::metrics::Metrics;

/// Largest request body accepted (the API's bodies are a token or a list of peer ids).
pub const MAX_BODY: usize = 64 * 1024;

/// Default bound on requests served at once (`--api-max-requests`).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// Keep-alives and releases served at once (their own pool: never starved by acquires).
pub const HOLDER_IN_FLIGHT: usize = 1024;

/// Requests other than acquires, keep-alives and releases served at once.
pub const OTHER_IN_FLIGHT: usize = 256;

/// The header a program may send instead of a JSON content type.
pub const CLIENT_HEADER: &str = "sigma-client";

/// Why the gate refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Missing or wrong bearer token.
    Unauthorized,
    /// An admin route on a daemon with no admin token.
    AdminDisabled,
    /// `Host` is not loopback.
    BadHost,
    /// `Origin` is not loopback.
    BadOrigin,
    /// A POST that a web form could have sent.
    BadContentType,
    /// The body is larger than [`MAX_BODY`].
    BodyTooLarge,
    /// Too many requests of its kind at once.
    Busy,
    /// Too many acquires wait for this lock name on this daemon.
    TooManyWaiters,
    /// The daemon is stopping: no new acquire; a holder's keep-alive is refused so that
    /// its client stops using the lock and releases it.
    Stopping,
    /// The daemon holds [`super::MAX_HTTP_LOCKS`] locks for HTTP clients (checked by the
    /// acquire handler, answered and counted like the gate's refusals).
    TooManyLocks,
}

impl Refusal {
    /// The `code` of the error answer and the `reason` label of the metric.
    pub fn code(self) -> ErrorCode {
        match self {
            Refusal::Unauthorized => ErrorCode::Unauthorized,
            Refusal::AdminDisabled => ErrorCode::AdminDisabled,
            Refusal::BadHost => ErrorCode::BadHost,
            Refusal::BadOrigin => ErrorCode::BadOrigin,
            Refusal::BadContentType => ErrorCode::BadContentType,
            Refusal::BodyTooLarge => ErrorCode::BodyTooLarge,
            Refusal::Busy => ErrorCode::Busy,
            Refusal::TooManyWaiters => ErrorCode::TooManyWaiters,
            Refusal::Stopping => ErrorCode::Stopping,
            Refusal::TooManyLocks => ErrorCode::TooManyLocks,
        }
    }

    fn message(self) -> String {
        match self {
            Refusal::Unauthorized => {
                "this route needs `Authorization: Bearer <token>` (the daemon's --api-token-file; \
                                       on the admin routes, its --admin-token-file)"
                    .to_owned()
            }
            Refusal::AdminDisabled => {
                "the admin routes are off: the daemon has no admin token (start it with --admin-token-file)".to_owned()
            }
            Refusal::BadHost => {
                "the Host header must name a loopback address or localhost (the API answers local programs only)"
                    .to_owned()
            }
            Refusal::BadOrigin => "requests from web pages are refused (Origin is not a loopback address)".to_owned(),
            Refusal::BadContentType => format!(
                "a POST needs `Content-Type: application/json` or a `{CLIENT_HEADER}` header (web forms are refused)"
            ),
            Refusal::BodyTooLarge => format!("request body larger than {MAX_BODY} bytes"),
            Refusal::Busy => {
                "too many requests of this kind at once (--api-max-requests for acquires): retry later".to_owned()
            }
            Refusal::TooManyWaiters => {
                "too many acquires wait for this lock on this daemon (--api-max-waiters-per-lock): retry later"
                    .to_owned()
            }
            Refusal::Stopping => {
                "the daemon is stopping: a holder must stop using the lock and release it; acquire through another \
                 daemon"
                    .to_owned()
            }
            Refusal::TooManyLocks => format!(
                "this daemon already holds {} locks for HTTP clients: release some first",
                super::MAX_HTTP_LOCKS
            ),
        }
    }

    /// The error answer.
    pub fn response(self) -> Response {
        super::error::error(self.code(), self.message())
    }
}

/// What a request is, for the pool of permits it draws on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `POST /v1/locks/{name}/acquire`: may wait as long as a lock is held elsewhere.
    Acquire,
    /// `POST /v1/locks/{name}/keepalive`, `…/release` or `…/value`: a holder's, short.
    Holder,
    /// `/v1/admin/*` and `POST /v1/revoke/*`: need the admin token.
    Admin,
    /// Everything else.
    Other,
}

impl Kind {
    /// The kind of a request from its method and path.
    pub fn of(method: &Method, path: &str) -> Kind {
        if path.starts_with("/v1/admin/") || path.starts_with("/v1/revoke/") {
            return Kind::Admin;
        }
        if method != Method::POST || !path.starts_with("/v1/locks/") {
            return Kind::Other;
        }
        match path.rsplit_once('/').map(|(_, action)| action) {
            Some("acquire") => Kind::Acquire,
            Some("keepalive" | "release" | "value") => Kind::Holder,
            _ => Kind::Other,
        }
    }
}

/// The gate's settings and its counts of requests in flight, one pool per [`Kind`].
#[derive(Clone, Debug)]
pub struct Gate {
    acquires: Arc<Semaphore>,
    holders: Arc<Semaphore>,
    others: Arc<Semaphore>,
    token: Option<Arc<str>>,
    admin_token: Option<Arc<str>>,
    metrics: Metrics,
}

impl Gate {
    /// At most `max_in_flight` acquires at once (and [`HOLDER_IN_FLIGHT`],
    /// [`OTHER_IN_FLIGHT`] of the other kinds); `token`: the bearer token every request
    /// but the admin ones must carry, if any; `admin_token`: the one the admin routes
    /// need (none: they are refused).
    pub fn new(max_in_flight: usize, token: Option<String>, admin_token: Option<String>, metrics: Metrics) -> Self {
        Gate {
            acquires: Arc::new(Semaphore::new(max_in_flight.max(1))),
            holders: Arc::new(Semaphore::new(HOLDER_IN_FLIGHT)),
            others: Arc::new(Semaphore::new(OTHER_IN_FLIGHT)),
            token: token.map(Into::into),
            admin_token: admin_token.map(Into::into),
            metrics,
        }
    }

    fn pool(&self, kind: Kind) -> &Arc<Semaphore> {
        match kind {
            Kind::Acquire => &self.acquires,
            Kind::Holder => &self.holders,
            Kind::Other | Kind::Admin => &self.others,
        }
    }

    /// The checks on the request line and headers (everything but the in-flight bound).
    pub fn admit(&self, kind: Kind, method: &Method, headers: &HeaderMap) -> Result<(), Refusal> {
        let needed = match kind {
            Kind::Admin => Some(self.admin_token.as_ref().ok_or(Refusal::AdminDisabled)?),
            _ => self.token.as_ref(),
        };
        if let Some(token) = needed {
            let given = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .unwrap_or("");
            if !same(given.trim().as_bytes(), token.as_bytes()) {
                return Err(Refusal::Unauthorized);
            }
        }
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        if !host.is_some_and(loopback_host) {
            return Err(Refusal::BadHost);
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let local = origin
                .to_str()
                .ok()
                .and_then(|o| o.strip_prefix("http://").or_else(|| o.strip_prefix("https://")))
                .is_some_and(loopback_host);
            if !local {
                return Err(Refusal::BadOrigin);
            }
        }
        if method == Method::POST {
            let json = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(';').next())
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
            if !json && !headers.contains_key(CLIENT_HEADER) {
                return Err(Refusal::BadContentType);
            }
        }
        let length = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        if length.is_some_and(|l: u64| l > MAX_BODY as u64) {
            return Err(Refusal::BodyTooLarge);
        }
        Ok(())
    }

    /// Counts and answers a refusal.
    pub fn refuse(&self, why: Refusal) -> Response {
        self.metrics.http_rejected(why.code().as_str());
        tracing::debug!(reason = %why.code(), "HTTP request refused");
        why.response()
    }
}

/// The middleware: checks, then holds one in-flight permit of the request's pool while
/// the handler runs (a waiting acquire holds it until it is answered or its client goes
/// away).
pub async fn check(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    let kind = Kind::of(req.method(), req.uri().path());
    if let Err(why) = gate.admit(kind, req.method(), req.headers()) {
        return gate.refuse(why);
    }
    let Ok(permit) = gate.pool(kind).clone().try_acquire_owned() else {
        return gate.refuse(Refusal::Busy);
    };
    let resp = next.run(req).await;
    drop(permit);
    resp
}

/// `host[:port]` (or `[v6]:port`) names a loopback address or `localhost`.
fn loopback_host(hostport: &str) -> bool {
    let host = if let Some(rest) = hostport.strip_prefix('[') {
        match rest.split_once(']') {
            Some((h, _)) => h,
            None => return false,
        }
    } else {
        hostport.rsplit_once(':').map_or(hostport, |(h, _)| h)
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// Compares in time independent of where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn gate(token: Option<&str>) -> Gate {
        let mut registry = prometheus_client::registry::Registry::default();
        Gate::new(4, token.map(str::to_owned), Some("adm1n".to_owned()), Metrics::register(&mut registry))
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    const JSON: (&str, &str) = ("content-type", "application/json");

    #[test]
    fn a_local_program_passes() {
        let g = gate(None);
        for host in ["127.0.0.1:7700", "localhost:7700", "LOCALHOST", "[::1]:7700", "127.0.0.2"] {
            assert_eq!(g.admit(Kind::Other, &Method::GET, &headers(&[("host", host)])), Ok(()), "{host}");
            assert_eq!(g.admit(Kind::Other, &Method::POST, &headers(&[("host", host), JSON])), Ok(()), "{host}");
        }
        let h = headers(&[("host", "127.0.0.1:1"), ("content-type", "application/json; charset=utf-8")]);
        assert_eq!(g.admit(Kind::Other, &Method::POST, &h), Ok(()));
        let h = headers(&[("host", "127.0.0.1:1"), (CLIENT_HEADER, "x")]);
        assert_eq!(g.admit(Kind::Other, &Method::POST, &h), Ok(()));
        let h = headers(&[("host", "127.0.0.1:1"), ("origin", "http://localhost:7700"), JSON]);
        assert_eq!(g.admit(Kind::Other, &Method::POST, &h), Ok(()));
    }

    #[test]
    fn web_pages_and_rebound_names_are_refused() {
        let g = gate(None);
        for host in ["evil.example:7700", "127.0.0.1.evil.example", "10.0.0.1:7700", "[::2]:1", "[::1", ""] {
            assert_eq!(
                g.admit(Kind::Other, &Method::GET, &headers(&[("host", host)])),
                Err(Refusal::BadHost),
                "{host:?}"
            );
        }
        assert_eq!(g.admit(Kind::Other, &Method::GET, &HeaderMap::new()), Err(Refusal::BadHost), "no Host");
        for origin in ["http://evil.example", "null", "file://", "http://127.0.0.1.evil.example"] {
            let h = headers(&[("host", "127.0.0.1:7700"), ("origin", origin), JSON]);
            assert_eq!(g.admit(Kind::Other, &Method::POST, &h), Err(Refusal::BadOrigin), "{origin}");
        }
        for ct in ["application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x"] {
            let h = headers(&[("host", "127.0.0.1:7700"), ("content-type", ct)]);
            assert_eq!(g.admit(Kind::Other, &Method::POST, &h), Err(Refusal::BadContentType), "{ct}");
        }
        let h = headers(&[("host", "127.0.0.1:7700")]);
        assert_eq!(g.admit(Kind::Other, &Method::POST, &h), Err(Refusal::BadContentType), "no content type");
        let h = headers(&[("host", "127.0.0.1:7700"), JSON, ("content-length", "65537")]);
        assert_eq!(g.admit(Kind::Other, &Method::POST, &h), Err(Refusal::BodyTooLarge));
    }

    #[test]
    fn the_admin_routes_need_the_admin_token_and_no_other() {
        let local = ("host", "127.0.0.1:7700");
        for g in [gate(None), gate(Some("s3cret"))] {
            assert_eq!(g.admit(Kind::Admin, &Method::GET, &headers(&[local])), Err(Refusal::Unauthorized));
            let api = headers(&[local, ("authorization", "Bearer s3cret")]);
            assert_eq!(g.admit(Kind::Admin, &Method::GET, &api), Err(Refusal::Unauthorized), "the API token");
            let admin = headers(&[local, ("authorization", "Bearer adm1n")]);
            assert_eq!(g.admit(Kind::Admin, &Method::GET, &admin), Ok(()));
        }
        let mut registry = prometheus_client::registry::Registry::default();
        let off = Gate::new(4, None, None, Metrics::register(&mut registry));
        let admin = headers(&[local, ("authorization", "Bearer adm1n")]);
        assert_eq!(off.admit(Kind::Admin, &Method::GET, &admin), Err(Refusal::AdminDisabled));
        assert_eq!(off.admit(Kind::Other, &Method::GET, &headers(&[local])), Ok(()));
    }

    #[test]
    fn requests_are_sorted_into_their_pools() {
        assert_eq!(Kind::of(&Method::POST, "/v1/locks/a/acquire"), Kind::Acquire);
        assert_eq!(Kind::of(&Method::POST, "/v1/locks/orders/42/acquire"), Kind::Acquire);
        assert_eq!(Kind::of(&Method::POST, "/v1/locks/a/keepalive"), Kind::Holder);
        assert_eq!(Kind::of(&Method::POST, "/v1/locks/a%2Fb/release"), Kind::Holder);
        assert_eq!(Kind::of(&Method::POST, "/v1/locks/a/value"), Kind::Holder);
        assert_eq!(Kind::of(&Method::GET, "/v1/locks/acquire"), Kind::Other);
        assert_eq!(Kind::of(&Method::POST, "/v1/revoke/a"), Kind::Admin);
        assert_eq!(Kind::of(&Method::GET, "/v1/admin/blocked"), Kind::Admin);
        assert_eq!(Kind::of(&Method::GET, "/v1/status"), Kind::Other);
        assert_eq!(Kind::of(&Method::POST, "/v1/admin/block"), Kind::Admin);
    }

    #[test]
    fn a_configured_token_is_required() {
        let g = gate(Some("s3cret"));
        let local = ("host", "127.0.0.1:7700");
        assert_eq!(g.admit(Kind::Other, &Method::GET, &headers(&[local])), Err(Refusal::Unauthorized));
        for wrong in ["Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret"] {
            let h = headers(&[local, ("authorization", wrong)]);
            assert_eq!(g.admit(Kind::Other, &Method::GET, &h), Err(Refusal::Unauthorized), "{wrong}");
        }
        assert_eq!(g.admit(Kind::Other, &Method::GET, &headers(&[local, ("authorization", "Bearer s3cret")])), Ok(()));
    }
}
