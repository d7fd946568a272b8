//! The API's one error contract: every error answer is an [`ErrorBody`], JSON, whose
//! `code` is an [`ErrorCode`], and each code has one HTTP status ([`ErrorCode::status`]).
//! Whatever refuses a request answers this way: the handlers, the [`super::gate`], the
//! extractors here (a query parameter a route does not take, a value or path that does
//! not parse, a body too large to buffer), the fallbacks of unknown routes and methods,
//! and, should anything else still answer an error without a JSON body, [`json_errors`],
//! which gives it one. docs/operating.md has the table of codes and what a client should
//! do on each.

use std::fmt;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::{header, request::Parts, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Why a request was refused: the `code` of every error answer. Each code has one HTTP
/// status; the table in docs/operating.md says what a client should do on each.
///
/// | code | status |
/// | --- | --- |
/// | `bad_request`, `unknown_parameter`, `bad_name`, `bad_quorum`, `bad_lease`, `bad_value` | 400 |
/// | `unauthorized` | 401 |
/// | `admin_disabled`, `bad_host`, `bad_origin`, `revoke_refused` | 403 |
/// | `not_found`, `not_held` | 404 |
/// | `method_not_allowed` | 405 |
/// | `lost` | 409 |
/// | `body_too_large` | 413 |
/// | `bad_content_type` | 415 |
/// | `not_won` | 423 |
/// | `internal` | 500 |
/// | `not_ready`, `held_back`, `unresponsive`, `stopping`, `busy`, `too_many_waiters`, `too_many_locks` | 503 |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: a query value, body or path that does not parse.
    BadRequest,
    /// 400: a query parameter the route does not take (the message names it).
    UnknownParameter,
    /// 400: not a lock name (1 to 200 bytes of `[A-Za-z0-9._/-]`).
    BadName,
    /// 400: a quorum (`n`, `m`, `min_peers`) this swarm cannot use.
    BadQuorum,
    /// 400: a keep-alive or release without the token and lease id the acquire answered.
    BadLease,
    /// 400: a lock's value larger than 4096 bytes, or given both as text and as base64,
    /// or bad base64.
    BadValue,
    /// 401: no bearer token, or not the one this route needs.
    Unauthorized,
    /// 403: an admin route on a daemon with no admin token.
    AdminDisabled,
    /// 403: `Host` is not a loopback address or `localhost`.
    BadHost,
    /// 403: `Origin` is not a loopback origin (a web page).
    BadOrigin,
    /// 403: an owner of the lock's replicas, which may hold it, refused the revoke (this
    /// node is not among its `--admin-peer`s).
    RevokeRefused,
    /// 404: no such route.
    NotFound,
    /// 404: the lock is not held under that token (and lease): released, lost, expired.
    NotHeld,
    /// 405: the route does not take this method.
    MethodNotAllowed,
    /// 409: the lock was won, then lost before it could be handed over.
    Lost,
    /// 413: the body is larger than [`super::gate::MAX_BODY`].
    BodyTooLarge,
    /// 415: a POST without `Content-Type: application/json` or a `Sigma-Client` header.
    BadContentType,
    /// 423: the lock was not won within the acquire's `timeout_ms`.
    NotWon,
    /// 500: the daemon failed (no randomness for a lease id, metrics encoding).
    Internal,
    /// 503: the node does not serve (joining its swarm, or it reaches no majority).
    NotReady,
    /// 503 (`/readyz`): serving, but a new lock waits out the takeover delay.
    HeldBack,
    /// 503: the node's event loop did not answer, or it has stopped.
    Unresponsive,
    /// 503: the daemon is stopping; a holder must stop using the lock and release it.
    Stopping,
    /// 503: too many requests of this kind at once.
    Busy,
    /// 503: too many acquires wait for this lock on this daemon.
    TooManyWaiters,
    /// 503: this daemon holds as many locks for HTTP clients as it may.
    TooManyLocks,
}

impl ErrorCode {
    /// Every code, in the order of the table.
    pub const ALL: [ErrorCode; 26] = [
        ErrorCode::BadRequest,
        ErrorCode::UnknownParameter,
        ErrorCode::BadName,
        ErrorCode::BadQuorum,
        ErrorCode::BadLease,
        ErrorCode::BadValue,
        ErrorCode::Unauthorized,
        ErrorCode::AdminDisabled,
        ErrorCode::BadHost,
        ErrorCode::BadOrigin,
        ErrorCode::RevokeRefused,
        ErrorCode::NotFound,
        ErrorCode::NotHeld,
        ErrorCode::MethodNotAllowed,
        ErrorCode::Lost,
        ErrorCode::BodyTooLarge,
        ErrorCode::BadContentType,
        ErrorCode::NotWon,
        ErrorCode::Internal,
        ErrorCode::NotReady,
        ErrorCode::HeldBack,
        ErrorCode::Unresponsive,
        ErrorCode::Stopping,
        ErrorCode::Busy,
        ErrorCode::TooManyWaiters,
        ErrorCode::TooManyLocks,
    ];

    /// The HTTP status of every answer with this code.
    pub fn status(self) -> StatusCode {
        use ErrorCode as C;
        match self {
            C::BadRequest | C::UnknownParameter | C::BadName | C::BadQuorum | C::BadLease | C::BadValue => {
                StatusCode::BAD_REQUEST
            }
            C::Unauthorized => StatusCode::UNAUTHORIZED,
            C::AdminDisabled | C::BadHost | C::BadOrigin | C::RevokeRefused => StatusCode::FORBIDDEN,
            C::NotFound | C::NotHeld => StatusCode::NOT_FOUND,
            C::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            C::Lost => StatusCode::CONFLICT,
            C::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            C::BadContentType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            // Not 408, which clients and proxies may retry on their own: an acquire
            // retried that way waits again, unasked. 423 Locked: the lock was not free to
            // take within the time; 409 is `lost`.
            C::NotWon => StatusCode::LOCKED,
            C::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            C::NotReady
            | C::HeldBack
            | C::Unresponsive
            | C::Stopping
            | C::Busy
            | C::TooManyWaiters
            | C::TooManyLocks => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The code as it is written in an answer (`not_won`); also the `reason` label of
    /// `sigma_http_rejected_total`.
    pub fn as_str(self) -> &'static str {
        use ErrorCode as C;
        match self {
            C::BadRequest => "bad_request",
            C::UnknownParameter => "unknown_parameter",
            C::BadName => "bad_name",
            C::BadQuorum => "bad_quorum",
            C::BadLease => "bad_lease",
            C::BadValue => "bad_value",
            C::Unauthorized => "unauthorized",
            C::AdminDisabled => "admin_disabled",
            C::BadHost => "bad_host",
            C::BadOrigin => "bad_origin",
            C::RevokeRefused => "revoke_refused",
            C::NotFound => "not_found",
            C::NotHeld => "not_held",
            C::MethodNotAllowed => "method_not_allowed",
            C::Lost => "lost",
            C::BodyTooLarge => "body_too_large",
            C::BadContentType => "bad_content_type",
            C::NotWon => "not_won",
            C::Internal => "internal",
            C::NotReady => "not_ready",
            C::HeldBack => "held_back",
            C::Unresponsive => "unresponsive",
            C::Stopping => "stopping",
            C::Busy => "busy",
            C::TooManyWaiters => "too_many_waiters",
            C::TooManyLocks => "too_many_locks",
        }
    }

    /// The code written `s`, if it is one.
    pub fn parse(s: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// The code of a [`sigma_node::LockError`].
    pub fn of_lock_error(e: &sigma_node::LockError) -> ErrorCode {
        use sigma_node::LockError as E;
        match e {
            E::BadName => ErrorCode::BadName,
            E::Quorum(_) | E::SwarmQuorum(_) => ErrorCode::BadQuorum,
            E::Timeout => ErrorCode::NotWon,
            E::NotReady(_) => ErrorCode::NotReady,
            E::NodeStopped => ErrorCode::Unresponsive,
            E::Lost => ErrorCode::Lost,
            E::ValueTooLarge(_) => ErrorCode::BadValue,
            E::TooManyWatches => ErrorCode::Busy,
            E::BadSlots(_) => ErrorCode::BadRequest,
            E::ReservedName(_) => ErrorCode::BadName,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every error answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong, for a person.
    pub error: String,
    /// Why, for a program: act on this, not on the message.
    pub code: ErrorCode,
}

/// The error answer with `code` (and its status) and `message`.
pub(super) fn error(code: ErrorCode, message: impl Into<String>) -> Response {
    (code.status(), Json(ErrorBody { error: message.into(), code })).into_response()
}

/// An error answer still to be written: what the checks below return.
#[derive(Debug)]
pub(super) struct Refused(ErrorCode, String);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        error(self.0, self.1)
    }
}

/// Refuses a query parameter not in `allowed` (400 `unknown_parameter`, naming it).
pub(super) fn check_params(uri: &Uri, allowed: &[&str]) -> Result<(), Refused> {
    if uri.query().is_none_or(str::is_empty) {
        return Ok(());
    }
    let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(uri)
        .map_err(|e| Refused(ErrorCode::BadRequest, format!("bad query string: {}", e.body_text())))?;
    match pairs.into_iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
        None => Ok(()),
        Some((k, _)) if allowed.is_empty() => {
            Err(Refused(ErrorCode::UnknownParameter, format!("unknown query parameter {k:?}: this route takes none")))
        }
        Some((k, _)) => Err(Refused(
            ErrorCode::UnknownParameter,
            format!("unknown query parameter {k:?}: this route takes {}", allowed.join(", ")),
        )),
    }
}

/// The query parameters of a route, as `T`, whose [`utoipa::IntoParams`] (what the
/// OpenAPI document lists) names them: any other is refused (400 `unknown_parameter`),
/// and so is a value that does not parse (400 `bad_request`).
pub(super) struct Params<T>(pub(super) T);

impl<T: DeserializeOwned + utoipa::IntoParams> Params<T> {
    /// The parameters of `uri`'s query.
    pub(super) fn from_uri(uri: &Uri) -> Result<T, Refused> {
        let names: Vec<String> =
            T::into_params(|| Some(utoipa::openapi::path::ParameterIn::Query)).into_iter().map(|p| p.name).collect();
        check_params(uri, &names.iter().map(String::as_str).collect::<Vec<_>>())?;
        match Query::<T>::try_from_uri(uri) {
            Ok(Query(t)) => Ok(t),
            Err(e) => Err(Refused(ErrorCode::BadRequest, format!("bad query: {}", e.body_text()))),
        }
    }
}

impl<S: Send + Sync, T: DeserializeOwned + utoipa::IntoParams> FromRequestParts<S> for Params<T> {
    type Rejection = Refused;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Refused> {
        Params::from_uri(&parts.uri).map(Params)
    }
}

/// A route that takes no query parameter: any is refused (400 `unknown_parameter`).
pub(super) struct NoParams;

impl<S: Send + Sync> FromRequestParts<S> for NoParams {
    type Rejection = Refused;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Refused> {
        check_params(&parts.uri, &[]).map(|()| NoParams)
    }
}

/// The lock name of a path (`{*name}`), percent-decoded; one that does not decode as
/// UTF-8 is refused (400 `bad_name`). Its syntax is checked by the node.
pub(super) struct LockName(pub(super) String);

impl<S: Send + Sync> FromRequestParts<S> for LockName {
    type Rejection = Refused;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Refused> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(name)) => Ok(LockName(name)),
            Err(e) => Err(Refused(ErrorCode::BadName, format!("bad lock name in the path: {}", e.body_text()))),
        }
    }
}

/// A request's body, whole. One larger than [`super::gate::MAX_BODY`] that the gate
/// could not see coming (no `Content-Length`) is refused here (413 `body_too_large`).
pub(super) struct Body(pub(super) Bytes);

impl FromRequest<super::AppState> for Body {
    type Rejection = Response;

    async fn from_request(req: Request, state: &super::AppState) -> Result<Self, Response> {
        match Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(Body(bytes)),
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(state.gate.refuse(super::gate::Refusal::BodyTooLarge))
            }
            Err(e) => Err(error(ErrorCode::BadRequest, format!("cannot read the body: {}", e.body_text()))),
        }
    }
}

/// The answer to a path no route serves (404 `not_found`).
pub(super) async fn not_found(uri: Uri) -> Response {
    error(ErrorCode::NotFound, format!("no route {}: GET /v1/openapi.json lists them", uri.path()))
}

/// The answer to a method a route does not take (405 `method_not_allowed`).
pub(super) async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    error(ErrorCode::MethodNotAllowed, format!("{} does not take {method}", uri.path()))
}

/// The last resort of the contract: an error answer without a JSON body (what axum or a
/// layer of tower would answer on its own) gets the [`ErrorBody`] of its status, its
/// text as the message. Each such answer is a bug of the mapping above, hence logged.
pub(super) async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    if !status.is_client_error() && !status.is_server_error() {
        return resp;
    }
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if json {
        return resp;
    }
    let code = match status {
        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => ErrorCode::BadRequest,
        StatusCode::NOT_FOUND => ErrorCode::NotFound,
        StatusCode::METHOD_NOT_ALLOWED => ErrorCode::MethodNotAllowed,
        StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::BodyTooLarge,
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ErrorCode::BadContentType,
        _ => ErrorCode::Internal,
    };
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&text).trim().to_owned();
    tracing::warn!(%status, %code, text, "an error answer without a JSON body: given one");
    let mut fixed = error(code, if text.is_empty() { status.to_string() } else { text });
    // Keep what the answer said besides (`Allow` of a 405).
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            fixed.headers_mut().entry(name).or_insert_with(|| value.clone());
        }
    }
    fixed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_code_is_written_as_serde_writes_it_and_parses_back() {
        for code in ErrorCode::ALL {
            assert_eq!(serde_json::to_value(code).unwrap(), serde_json::Value::from(code.as_str()));
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            assert!(code.status().is_client_error() || code.status().is_server_error(), "{code}");
        }
        let mut names: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len(), "a code listed twice");
        assert_eq!(ErrorCode::NotWon.status().as_u16(), 423);
        assert_eq!(ErrorCode::parse("timeout"), None);
    }
}
