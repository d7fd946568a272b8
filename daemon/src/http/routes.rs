//! The handlers of the API's routes, and the OpenAPI document generated from them.

use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use sigma_node::metrics::{self, Outcome};
use sigma_node::watch::LockState;
use sigma_node::{LockError, LockOptions, RevokeError};
use tokio::sync::{mpsc, oneshot};

use super::error::{error, Body, LockName, NoParams, Params};
use super::holders::{deadline_ms, hold, HolderCmd, LeaseId};
use super::*;

/// The query of an acquire (what the OpenAPI document lists for it, and all it takes).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct AcquireQuery {
    /// Give up after this many ms (423 `not_won`); absent: wait as long as it takes.
    timeout_ms: Option<u64>,
    /// Client lease: released this long after the last keepalive (default 5000, 200 to
    /// 3600000).
    ttl_ms: Option<u64>,
    /// Replicas (with m); must be the swarm's.
    n: Option<usize>,
    /// Votes needed (with n); at least the swarm's.
    m: Option<usize>,
    /// Votes from at least this many distinct peers.
    min_peers: Option<usize>,
    /// A semaphore of this many slots (1 to 64): at most that many holders of the name
    /// at once; the answer says which slot (`slot`) and names its lock (`name`).
    slots: Option<u16>,
}

/// Splits a POST path `NAME/ACTION`.
pub(super) fn split_action(path: &str) -> Option<(&str, &str)> {
    path.rsplit_once('/')
}

pub(super) async fn post_lock(
    State(s): State<AppState>,
    axum::Extension(peer): axum::Extension<serve::Peer>,
    LockName(path): LockName,
    uri: Uri,
    Body(body): Body,
) -> Response {
    match split_action(&path) {
        Some((name, "acquire")) => match Params::<AcquireQuery>::from_uri(&uri) {
            Ok(q) => match acquire_value(&body) {
                Ok(value) => acquire(s, name, q, value, peer).await,
                Err(refused) => {
                    s.metrics.http_rejected(refused.0.as_str());
                    error(refused.0, refused.1)
                }
            },
            Err(refused) => refused.into_response(),
        },
        Some((name, "value")) => {
            if let Err(refused) = super::error::check_params(&uri, &[]) {
                return refused.into_response();
            }
            set_value(s, name, &body).await
        }
        Some((name, action @ ("release" | "keepalive"))) => {
            if let Err(refused) = super::error::check_params(&uri, &[]) {
                return refused.into_response();
            }
            let lease = match serde_json::from_slice::<HolderBody>(&body) {
                Ok(b) => LeaseId::parse(&b.lease).map(|lease| (b.token, lease)),
                Err(_) => None,
            };
            let Some((token, lease)) = lease else {
                s.metrics.http_rejected(ErrorCode::BadLease.as_str());
                return error(
                    ErrorCode::BadLease,
                    format!(
                        "bad {action} body: expected {{\"token\": N, \"lease\": \"32 hex digits\"}}, the token and \
                         lease id the acquire answered"
                    ),
                );
            };
            let Some(tx) = s.held.holder(name, token, lease) else {
                s.metrics.http_rejected(ErrorCode::NotHeld.as_str());
                return not_held(name, token);
            };
            if action == "release" {
                release(name, token, tx).await
            } else {
                keepalive(&s, name, token, tx).await
            }
        }
        _ => error(
            ErrorCode::NotFound,
            format!(
                "no route POST /v1/locks/{path}: expected POST /v1/locks/{{name}}/acquire, /v1/locks/{{name}}/keepalive, \
                 /v1/locks/{{name}}/value or /v1/locks/{{name}}/release"
            ),
        ),
    }
}

/// The value of an acquire's body: none for an empty body, `{}` or `null`.
fn acquire_value(body: &[u8]) -> Result<Option<Vec<u8>>, (ErrorCode, String)> {
    let text = std::str::from_utf8(body).unwrap_or("?").trim();
    if text.is_empty() || text == "null" {
        return Ok(None);
    }
    let b: AcquireBody = serde_json::from_slice(body).map_err(|e| {
        (
            ErrorCode::BadRequest,
            format!("bad acquire body: {e}; expected {{\"value\": \"text\"}}, {{\"value_base64\": \"…\"}} or none"),
        )
    })?;
    value_of(b.value.as_deref(), b.value_base64.as_deref())
}

/// The bytes of a body's `value` or `value_base64`, checked against the bound.
fn value_of(text: Option<&str>, base64: Option<&str>) -> Result<Option<Vec<u8>>, (ErrorCode, String)> {
    let value = sigma_node::value::from_fields(text, base64).map_err(|e| (ErrorCode::BadValue, e))?;
    match value {
        Some(v) if v.len() > sigma_behaviour::wire::MAX_VALUE_LEN => Err((
            ErrorCode::BadValue,
            format!("value of {} bytes refused: at most {} bytes", v.len(), sigma_behaviour::wire::MAX_VALUE_LEN),
        )),
        v => Ok(v),
    }
}

#[utoipa::path(post, path = "/v1/locks/{name}/value", tag = "locks", params(("name" = String, Path, description = "Lock name: 1 to 200 bytes of [A-Za-z0-9._/-]; a '/' may be sent as is or as %2F")), request_body = ValueBody,
    responses((status = 200, description = "The lock's value replaced: inspections, watchers and observers read it from now on", body = ValueSet),
        (status = 400, description = "`bad_lease`: no lease id, or a malformed one; `bad_value`: over 4096 bytes, both fields, or bad base64", body = ErrorBody),
        (status = 404, description = "`not_held`: not held under that token and lease (released, lost, expired)", body = ErrorBody)))]
pub(super) async fn set_value(s: AppState, name: &str, body: &[u8]) -> Response {
    let parsed = serde_json::from_slice::<ValueBody>(body).ok().and_then(|b| LeaseId::parse(&b.lease).map(|l| (b, l)));
    let Some((b, lease)) = parsed else {
        s.metrics.http_rejected(ErrorCode::BadLease.as_str());
        return error(
            ErrorCode::BadLease,
            "bad value body: expected {\"token\": N, \"lease\": \"32 hex digits\", \"value\": \"text\"} (or \
             \"value_base64\"), the token and lease id the acquire answered",
        );
    };
    let value = match value_of(b.value.as_deref(), b.value_base64.as_deref()) {
        Ok(v) => v.unwrap_or_default(),
        Err((code, message)) => {
            s.metrics.http_rejected(code.as_str());
            return error(code, message);
        }
    };
    let Some(tx) = s.held.holder(name, b.token, lease) else {
        s.metrics.http_rejected(ErrorCode::NotHeld.as_str());
        return not_held(name, b.token);
    };
    let (reply_tx, reply_rx) = oneshot::channel();
    if tx.send(HolderCmd::SetValue(value, reply_tx)).await.is_ok() {
        if let Ok(answer) = reply_rx.await {
            return match answer {
                Ok(value_version) => {
                    (StatusCode::OK, Json(ValueSet { name: name.to_owned(), token: b.token, value_version }))
                        .into_response()
                }
                Err(e) => error(ErrorCode::of_lock_error(&e), format!("lock {name} token {}: {e}", b.token)),
            };
        }
    }
    not_held(name, b.token)
}

pub(super) fn not_held(name: &str, token: u64) -> Response {
    error(
        ErrorCode::NotHeld,
        format!("lock {name} token {token} is not held by this daemon under that lease (released, lost or expired)"),
    )
}

#[utoipa::path(post, path = "/v1/locks/{name}/acquire", tag = "locks",
    params(("name" = String, Path, description = "Lock name: 1 to 200 bytes of [A-Za-z0-9._/-]; a '/' may be sent as is or as %2F"),
        AcquireQuery), request_body(content = Option<AcquireBody>, description = "Optional: the value to attach to the lock once held"),
    responses((status = 200, description = "Held, for this client, until the deadline it answers; keep-alives move the deadline on", body = Acquired),
        (status = 400, description = "`bad_name` (also a name with a `.slot` segment, reserved for semaphores), `bad_quorum` (n, m, min_peers), `bad_request` (a query value or body that does not parse, ttl_ms or slots out of range), `bad_value` (over 4096 bytes, both fields, bad base64)", body = ErrorBody),
        (status = 409, description = "`lost`: won, then lost before it could be handed over", body = ErrorBody),
        (status = 423, description = "`not_won`: not won within timeout_ms (held elsewhere, or too few votes); not 408, which clients and proxies may retry on their own", body = ErrorBody),
        (status = 500, description = "`internal`: no randomness for a lease id", body = ErrorBody),
        (status = 503, description = "`not_ready` (the node does not serve), `stopping`, `too_many_waiters` (for this lock), `too_many_locks`, `unresponsive` (the node stopped)", body = ErrorBody)))]
pub(super) async fn acquire(
    s: AppState,
    name: &str,
    q: AcquireQuery,
    value: Option<Vec<u8>>,
    peer: serve::Peer,
) -> Response {
    let quorum = match (q.n, q.m) {
        (Some(n), Some(m)) => Some((n, m)),
        (None, None) => None,
        _ => return error(ErrorCode::BadQuorum, "n and m go together"),
    };
    let ttl = q.ttl_ms.map_or(DEFAULT_CLIENT_TTL, Duration::from_millis);
    if !CLIENT_TTL_RANGE.contains(&ttl) {
        return error(
            ErrorCode::BadRequest,
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
        Err(e) => return error(ErrorCode::Internal, format!("no randomness for a lease id: {e}")),
    };
    let opts = LockOptions { quorum, timeout: q.timeout_ms.map(Duration::from_millis), min_peers: q.min_peers, value };
    let start = Instant::now();
    let mut stopping = s.stopping.clone();
    let result = tokio::select! {
        r = lock_or_slot(&s.handle, name, q.slots, opts) => r,
        // Dropping the acquisition abandons the wait.
        () = async { let _ = stopping.wait_for(|stop| *stop).await; } => return s.gate.refuse(gate::Refusal::Stopping),
    };
    let elapsed = start.elapsed();
    match result {
        Ok((guard, slot)) => {
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
                slot,
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
            let code = ErrorCode::of_lock_error(&e);
            let outcome = match code {
                ErrorCode::NotWon => Outcome::Timeout,
                ErrorCode::NotReady => Outcome::NotReady,
                _ => Outcome::Error,
            };
            s.metrics.observe_acquire(outcome, elapsed);
            let message = match e {
                LockError::Timeout => {
                    format!("lock {name} not won within {} ms (held elsewhere, or too few votes)", elapsed.as_millis())
                }
                e => e.to_string(),
            };
            error(code, message)
        }
    }
}

/// The lock `name`, or with `slots` one slot of semaphore `name` (its slot lock's guard,
/// and which slot it is).
async fn lock_or_slot(
    handle: &sigma_node::NodeHandle,
    name: &str,
    slots: Option<u16>,
    opts: LockOptions,
) -> Result<(sigma_node::LockGuard, Option<u16>), LockError> {
    match slots {
        None => handle.lock_with(name, opts).await.map(|guard| (guard, None)),
        Some(k) => handle.acquire_slot(name, k, opts).await.map(|g| {
            let slot = g.slot();
            (g.into_lock_guard(), Some(slot))
        }),
    }
}

#[utoipa::path(post, path = "/v1/locks/{name}/keepalive", tag = "locks", params(("name" = String, Path, description = "Lock name: 1 to 200 bytes of [A-Za-z0-9._/-]; a '/' may be sent as is or as %2F")), request_body = HolderBody,
    responses((status = 200, description = "Client lease renewed; the answer's deadline replaces the last one", body = KeptAlive),
        (status = 400, description = "`bad_lease`: no lease id, or a malformed one", body = ErrorBody),
        (status = 404, description = "`not_held`: not held under that token and lease (released, lost, expired): stop using the lock", body = ErrorBody),
        (status = 503, description = "`stopping`: the daemon is stopping: stop using the lock, then release it", body = ErrorBody)))]
pub(super) async fn keepalive(s: &AppState, name: &str, token: u64, tx: mpsc::Sender<HolderCmd>) -> Response {
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
        (status = 400, description = "`bad_lease`: no lease id, or a malformed one", body = ErrorBody),
        (status = 404, description = "`not_held`: not held under that token and lease (released, lost, expired)", body = ErrorBody)))]
pub(super) async fn release(name: &str, token: u64, tx: mpsc::Sender<HolderCmd>) -> Response {
    let (reply_tx, reply_rx) = oneshot::channel();
    if tx.send(HolderCmd::Release(reply_tx)).await.is_ok() {
        match reply_rx.await {
            Ok(Ok(())) => {
                tracing::debug!(name, token, "lock released by an HTTP client");
                return (StatusCode::OK, Json(Released { name: name.to_owned(), token })).into_response();
            }
            Ok(Err(e)) => return error(ErrorCode::NotHeld, format!("lock {name} token {token}: {e}")),
            Err(_) => {}
        }
    }
    // The holder task ended in between: the lock was lost.
    error(ErrorCode::NotHeld, format!("lock {name} token {token} was lost"))
}

#[utoipa::path(get, path = "/v1/locks/{name}", tag = "locks", params(("name" = String, Path, description = "Lock name: 1 to 200 bytes of [A-Za-z0-9._/-]; a '/' may be sent as is or as %2F")),
    responses((status = 200, description = "What this daemon holds of the lock, and its replicas here", body = LockView),
        (status = 400, description = "`bad_name`", body = ErrorBody),
        (status = 503, description = "`unresponsive`: the node stopped", body = ErrorBody)))]
pub(super) async fn get_lock(State(s): State<AppState>, LockName(name): LockName, _: NoParams) -> Response {
    if sigma_behaviour::wire::validate_resource(&name).is_err() {
        return error(ErrorCode::BadName, format!("invalid lock name {name:?}"));
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
        Err(e) => return error(ErrorCode::Unresponsive, e.to_string()),
    };
    let replicas = match s.handle.hosted_replicas(&name).await {
        Ok(r) => r,
        Err(e) => return error(ErrorCode::Unresponsive, e.to_string()),
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
        (status = 400, description = "`bad_name`", body = ErrorBody),
        (status = 503, description = "`unresponsive`: the node stopped", body = ErrorBody)))]
pub(super) async fn get_inspect(State(s): State<AppState>, LockName(name): LockName, _: NoParams) -> Response {
    match s.handle.inspect(&name).await {
        Ok(view) => (StatusCode::OK, Json(view)).into_response(),
        Err(e) => error(ErrorCode::of_lock_error(&e), e.to_string()),
    }
}

/// The query of a watch or an observation.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct WatchQuery {
    /// Inspect the lock this often (ms; default 500, 100 to 60000).
    interval_ms: Option<u64>,
}

impl WatchQuery {
    fn interval(&self) -> Result<Option<Duration>, String> {
        let range = sigma_node::watch::MIN_WATCH_INTERVAL..=sigma_node::watch::MAX_WATCH_INTERVAL;
        match self.interval_ms.map(Duration::from_millis) {
            Some(d) if !range.contains(&d) => Err(format!(
                "interval_ms must be between {} and {}",
                range.start().as_millis(),
                range.end().as_millis()
            )),
            d => Ok(d),
        }
    }
}

/// A stream of server-sent events, one per item, with a comment every 15 s to keep
/// proxies from closing an idle stream; ends after an error event.
fn sse<T: serde::Serialize + Send + 'static>(
    kind: &'static str,
    items: impl futures::Stream<Item = Result<T, sigma_node::LockError>> + Send + 'static,
    id: impl Fn(&T) -> String + Send + Sync + 'static,
) -> Response {
    use axum::response::sse::{Event, KeepAlive, Sse};
    use futures::StreamExt as _;
    let events = items
        .scan(false, move |ended, item| {
            if *ended {
                return futures::future::ready(None);
            }
            let event = match item {
                Ok(t) => Event::default().event(kind).id(id(&t)).json_data(&t),
                Err(e) => {
                    *ended = true;
                    let body = ErrorBody { error: e.to_string(), code: ErrorCode::of_lock_error(&e) };
                    Event::default().event("error").json_data(&body)
                }
            };
            futures::future::ready(Some(event))
        })
        .map(|e| e.map_err(std::io::Error::other));
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}

#[utoipa::path(get, path = "/v1/watch/{name}", tag = "locks", params(("name" = String, Path, description = "Lock name: 1 to 200 bytes of [A-Za-z0-9._/-]; a '/' may be sent as is or as %2F"), WatchQuery),
    responses((status = 200, description = "Server-sent events: an `event: state` whose data is a `LockState` (JSON) and whose id its `seq`, each time the lock changes (held, free or unknown; holder, token, value, waiters); the first at once. What a watcher is promised: docs/operating.md, \"Watch\". An `event: error` (an `ErrorBody`) ends the stream.", body = sigma_node::watch::LockState, content_type = "text/event-stream"),
        (status = 400, description = "`bad_name`, `bad_request` (interval_ms out of range)", body = ErrorBody),
        (status = 503, description = "`busy`: too many watches on this node (256); `unresponsive`: the node stopped", body = ErrorBody)))]
pub(super) async fn get_watch(
    State(s): State<AppState>,
    LockName(name): LockName,
    Params(q): Params<WatchQuery>,
) -> Response {
    follow(&s, &name, &q, false)
}

/// A watch (`observe`: an observation) of `name` as server-sent events, or the error.
fn follow(s: &AppState, name: &str, q: &WatchQuery, observe: bool) -> Response {
    let interval = match q.interval() {
        Ok(i) => i,
        Err(why) => return error(ErrorCode::BadRequest, why),
    };
    let events = if observe {
        s.handle.observe(name, interval).map(|leaders| {
            sse("leader", leaders, |h: &sigma_node::inspect::HolderView| {
                format!("{}.{}", h.token.unwrap_or(0), h.value_version)
            })
        })
    } else {
        s.handle.watch(name, interval).map(|watch| sse("state", watch, |st: &LockState| st.seq.to_string()))
    };
    events.unwrap_or_else(|e| error(ErrorCode::of_lock_error(&e), e.to_string()))
}

#[utoipa::path(get, path = "/v1/observe/{name}", tag = "locks", params(("name" = String, Path, description = "Lock name: 1 to 200 bytes of [A-Za-z0-9._/-]; a '/' may be sent as is or as %2F"), WatchQuery),
    responses((status = 200, description = "Server-sent events: an `event: leader` whose data is the holder (`HolderView`: token, value) and whose id its token, for each new holder and each new value of a holder, once and in token order: an election's leaders. An `event: error` ends the stream.", body = sigma_node::inspect::HolderView, content_type = "text/event-stream"),
        (status = 400, description = "`bad_name`, `bad_request` (interval_ms out of range)", body = ErrorBody),
        (status = 503, description = "`busy`: too many watches on this node (256); `unresponsive`: the node stopped", body = ErrorBody)))]
pub(super) async fn get_observe(
    State(s): State<AppState>,
    LockName(name): LockName,
    Params(q): Params<WatchQuery>,
) -> Response {
    follow(&s, &name, &q, true)
}

#[utoipa::path(get, path = "/v1/swarm/locks", tag = "operators",
    responses((status = 200, description = "The locks held and waited for across the swarm: every alive member (at most 256, this node included) asked for its own; a snapshot, which misses the locks of a peer that did not answer (listed in `unanswered`)", body = sigma_node::listing::SwarmLocks),
        (status = 503, description = "`unresponsive`: the node stopped", body = ErrorBody)))]
pub(super) async fn get_swarm_locks(State(s): State<AppState>, _: NoParams) -> Response {
    match s.handle.swarm_locks().await {
        Ok(locks) => (StatusCode::OK, Json(locks)).into_response(),
        Err(e) => error(ErrorCode::Unresponsive, e.to_string()),
    }
}

#[utoipa::path(post, path = "/v1/revoke/{name}", tag = "operators", params(("name" = String, Path, description = "Lock name: 1 to 200 bytes of [A-Za-z0-9._/-]; a '/' may be sent as is or as %2F")), request_body = RevokeBody,
    responses((status = 200, description = "The holder gave the lock up", body = sigma_node::inspect::Revoked),
        (status = 400, description = "`bad_name`, `bad_request` (a body that is not `{\"token\": N}`)", body = ErrorBody),
        (status = 403, description = "`revoke_refused`: not revoked: an owner of the lock's replicas, which may hold it, refused (this node is not among its `--admin-peer`s)", body = ErrorBody),
        (status = 404, description = "`not_held`: not held under that token by any owner of the lock's replicas", body = ErrorBody),
        (status = 503, description = "`unresponsive`: an owner of the lock's replicas did not answer, or the node stopped", body = ErrorBody)))]
pub(super) async fn post_revoke(
    State(s): State<AppState>,
    axum::Extension(peer): axum::Extension<serve::Peer>,
    LockName(name): LockName,
    _: NoParams,
    Body(body): Body,
) -> Response {
    let token = match serde_json::from_slice::<RevokeBody>(&body) {
        Ok(b) => b.token,
        Err(e) => return error(ErrorCode::BadRequest, format!("bad revoke body (expected {{\"token\": N}}): {e}")),
    };
    match s.handle.revoke(&name, token).await {
        Ok(done) => {
            tracing::warn!(name, token, holder = %done.holder, uid = ?peer.uid, "lock revoked through the API");
            (StatusCode::OK, Json(done)).into_response()
        }
        Err(e @ RevokeError::NotFound { .. }) => error(ErrorCode::NotHeld, e.to_string()),
        Err(e @ RevokeError::Refused { .. }) => error(ErrorCode::RevokeRefused, e.to_string()),
        Err(e @ RevokeError::Unanswered { .. }) => error(ErrorCode::Unresponsive, e.to_string()),
        Err(RevokeError::Lock(e)) => error(ErrorCode::of_lock_error(&e), e.to_string()),
    }
}

/// How long a probe waits for the node's event loop.
pub(super) const PROBE_PATIENCE: Duration = Duration::from_secs(2);

#[utoipa::path(get, path = "/healthz", tag = "node",
    responses((status = 200, description = "The daemon's event loop answers (liveness): restart it only on a 503 or no answer", body = Probe),
        (status = 503, description = "`unresponsive`: the event loop did not answer within 2 s, or the node stopped", body = ErrorBody)))]
pub(super) async fn get_healthz(State(s): State<AppState>, _: NoParams) -> Response {
    match probe_status(&s).await {
        Ok(st) => (StatusCode::OK, Json(Probe { readiness: st.readiness })).into_response(),
        Err(unresponsive) => unresponsive,
    }
}

/// The node's status for a probe, or the 503 `unresponsive` answer if the event loop
/// did not give it within [`PROBE_PATIENCE`].
pub(super) async fn probe_status(s: &AppState) -> Result<sigma_node::Status, Response> {
    match tokio::time::timeout(PROBE_PATIENCE, s.handle.status()).await {
        Ok(Ok(st)) => Ok(st),
        Ok(Err(e)) => Err(error(ErrorCode::Unresponsive, e.to_string())),
        Err(_) => {
            Err(error(ErrorCode::Unresponsive, format!("the event loop did not answer within {PROBE_PATIENCE:?}")))
        }
    }
}

#[utoipa::path(get, path = "/readyz", tag = "node",
    responses((status = 200, description = "The peer serves and no new lock waits for a takeover delay: a lock taken now is granted at once (readiness)", body = Probe),
        (status = 503, description = "`not_ready` (joining, a minority, a joint quorum not reached, unreachable, leaving) or `held_back` (serving, but a new lock waits out the takeover delay); the message says which and for how long", body = ErrorBody)))]
pub(super) async fn get_readyz(State(s): State<AppState>, _: NoParams) -> Response {
    let st = match probe_status(&s).await {
        Ok(st) => st,
        Err(unresponsive) => return unresponsive,
    };
    if !st.ready {
        return error(ErrorCode::NotReady, st.readiness_detail);
    }
    if st.held_back_ms > 0 {
        let msg = format!(
            "serving, but a new lock waits {} ms more for the takeover delay (every replica this peer starts grants \
             nothing until then)",
            st.held_back_ms
        );
        return error(ErrorCode::HeldBack, msg);
    }
    (StatusCode::OK, Json(Probe { readiness: st.readiness })).into_response()
}

#[utoipa::path(get, path = "/v1/status", tag = "node",
    responses((status = 200, description = "The node: peers, readiness, locks, state sizes", body = sigma_node::Status),
        (status = 503, description = "`unresponsive`: the node stopped", body = ErrorBody)))]
pub(super) async fn get_status(State(s): State<AppState>, _: NoParams) -> Response {
    match s.handle.status().await {
        Ok(st) => (StatusCode::OK, Json(st)).into_response(),
        Err(e) => error(ErrorCode::Unresponsive, e.to_string()),
    }
}

#[utoipa::path(get, path = "/v1/admin/blocked", tag = "admin",
    responses((status = 200, description = "Peers blocked now", body = PeerList),
        (status = 503, description = "`unresponsive`: the node stopped", body = ErrorBody)))]
pub(super) async fn get_blocked(State(s): State<AppState>, _: NoParams) -> Response {
    block(s, Vec::new(), true).await
}

#[utoipa::path(post, path = "/v1/admin/block", tag = "admin", request_body = PeerList,
    responses((status = 200, description = "Their connections closed and refused; the peers blocked afterwards", body = PeerList),
        (status = 400, description = "`bad_request`: a body that is not `{\"peers\": [peer ids]}`", body = ErrorBody),
        (status = 503, description = "`unresponsive`: the node stopped", body = ErrorBody)))]
pub(super) async fn post_block(
    State(s): State<AppState>,
    axum::Extension(peer): axum::Extension<serve::Peer>,
    _: NoParams,
    Body(body): Body,
) -> Response {
    match parse_peers(&body) {
        Ok(peers) => {
            tracing::info!(?peers, uid = ?peer.uid, "peers blocked through the API");
            block(s, peers, true).await
        }
        Err(e) => error(ErrorCode::BadRequest, e),
    }
}

#[utoipa::path(post, path = "/v1/admin/unblock", tag = "admin", request_body = PeerList,
    responses((status = 200, description = "The peers blocked afterwards", body = PeerList),
        (status = 400, description = "`bad_request`: a body that is not `{\"peers\": [peer ids]}`", body = ErrorBody),
        (status = 503, description = "`unresponsive`: the node stopped", body = ErrorBody)))]
pub(super) async fn post_unblock(
    State(s): State<AppState>,
    axum::Extension(peer): axum::Extension<serve::Peer>,
    _: NoParams,
    Body(body): Body,
) -> Response {
    match parse_peers(&body) {
        Ok(peers) => {
            tracing::info!(?peers, uid = ?peer.uid, "peers unblocked through the API");
            block(s, peers, false).await
        }
        Err(e) => error(ErrorCode::BadRequest, e),
    }
}

pub(super) fn parse_peers(body: &[u8]) -> Result<Vec<libp2p::PeerId>, String> {
    let list: PeerList =
        serde_json::from_slice(body).map_err(|e| format!("bad body (expected {{\"peers\": [peer ids]}}): {e}"))?;
    list.peers.iter().map(|p| p.parse().map_err(|e| format!("bad peer id {p:?}: {e}"))).collect()
}
#[utoipa::path(post, path = "/v1/admin/forget", tag = "admin", request_body = PeerList,
    responses((status = 200, description = "Peers gone for good, taken out of this node's membership counts (only a peer not alive here, and not on the member list)", body = Forgotten),
        (status = 400, description = "`bad_request`: a body that is not `{\"peers\": [peer ids]}`", body = ErrorBody),
        (status = 503, description = "`unresponsive`: the node stopped", body = ErrorBody)))]
pub(super) async fn post_forget(
    State(s): State<AppState>,
    axum::Extension(peer): axum::Extension<serve::Peer>,
    _: NoParams,
    Body(body): Body,
) -> Response {
    let peers = match parse_peers(&body) {
        Ok(peers) => peers,
        Err(e) => return error(ErrorCode::BadRequest, e),
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
        Err(e) => error(ErrorCode::Unresponsive, e.to_string()),
    }
}

/// The admin control is on the same loopback-only listener as the rest of the API.
pub(super) async fn block(s: AppState, peers: Vec<libp2p::PeerId>, block: bool) -> Response {
    match s.handle.block_peers(peers, block).await {
        Ok(blocked) => (StatusCode::OK, Json(PeerList { peers: blocked.iter().map(ToString::to_string).collect() }))
            .into_response(),
        Err(e) => error(ErrorCode::Unresponsive, e.to_string()),
    }
}

#[utoipa::path(get, path = "/metrics", tag = "node",
    responses((status = 200, description = "Prometheus / OpenMetrics text", content_type = "application/openmetrics-text"),
        (status = 500, description = "`internal`: the metrics did not encode", body = ErrorBody)))]
pub(super) async fn get_metrics(State(s): State<AppState>, _: NoParams) -> Response {
    match s.handle.counters().await {
        Ok(snapshot) => s.metrics.set_snapshot(snapshot),
        Err(e) => tracing::debug!(%e, "metrics: counters unavailable"),
    }
    s.metrics.set_http_locks_held(s.held.len());
    match metrics::encode(&s.registry) {
        Ok(text) => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response(),
        Err(_) => error(ErrorCode::Internal, "metrics encoding failed"),
    }
}

/// The API's OpenAPI 3.1 document, generated from the handlers and types above, with
/// what every route shares ([`Contract`]).
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "sigma daemon API",
        description = "The local control API of a sigma peer (loopback only). Every error answer is an `ErrorBody` \
                       whose `code` is an `ErrorCode`; each code has one status. A path not listed here answers 404 \
                       `not_found`, a method a path does not list 405 `method_not_allowed`."
    ),
    paths(
        acquire,
        keepalive,
        set_value,
        release,
        get_lock,
        get_inspect,
        get_watch,
        get_observe,
        get_swarm_locks,
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
    ),
    components(schemas(ErrorCode)),
    modifiers(&Contract)
)]
pub struct ApiDoc;

/// The security scheme of the lock routes' token (`--api-token-file`): needed only when
/// the daemon has one.
pub const API_TOKEN_SCHEME: &str = "api_token";
/// The security scheme of the admin routes' token (`--admin-token-file`): always needed.
pub const ADMIN_TOKEN_SCHEME: &str = "admin_token";

/// What every route shares, added to each operation of the document: its bearer token
/// (optional on the lock routes, required on the admin ones) and the errors of the
/// [`gate`] and of the query check, which any route may answer.
struct Contract;

impl utoipa::Modify for Contract {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
        let components = doc.components.get_or_insert_with(Default::default);
        let bearer = |what: &str| {
            let mut http = Http::new(HttpAuthScheme::Bearer);
            http.description = Some(what.to_owned());
            SecurityScheme::Http(http)
        };
        components.add_security_scheme(
            API_TOKEN_SCHEME,
            bearer("The daemon's API token (--api-token-file), if it has one: every route but the admin ones needs it then"),
        );
        components.add_security_scheme(
            ADMIN_TOKEN_SCHEME,
            bearer("The daemon's admin token (--admin-token-file): /v1/admin/* and /v1/revoke/* need it"),
        );
        for (path, item) in doc.paths.paths.iter_mut() {
            let admin = gate::Kind::of(&axum::http::Method::GET, path) == gate::Kind::Admin;
            let operations = [(false, item.get.as_mut()), (true, item.post.as_mut())];
            for (post, op) in operations.into_iter().filter_map(|(post, op)| Some((post, op?))) {
                op.security = Some(if admin {
                    vec![SecurityRequirement::new(ADMIN_TOKEN_SCHEME, Vec::<String>::new())]
                } else {
                    // Either none (a daemon without a token) or the API token.
                    vec![
                        SecurityRequirement::default(),
                        SecurityRequirement::new(API_TOKEN_SCHEME, Vec::<String>::new()),
                    ]
                });
                let mut shared = vec![
                    (400, "`unknown_parameter`: a query parameter this route does not take"),
                    (401, "`unauthorized`: no bearer token, or not the one this route needs"),
                    (403, "`bad_host` (Host is not loopback), `bad_origin` (a web page)"),
                    (503, "`busy`: too many requests of this kind at once: retry later"),
                ];
                if admin {
                    shared.push((403, "`admin_disabled`: the daemon has no admin token"));
                }
                if post {
                    shared.push((413, "`body_too_large`: a body larger than 64 KiB"));
                    shared.push((
                        415,
                        "`bad_content_type`: neither `Content-Type: application/json` nor a `Sigma-Client` header",
                    ));
                }
                for (status, what) in shared {
                    add_error(op, status, what);
                }
            }
        }
    }
}

/// Declares the error answer `status` of `op` (with the [`ErrorBody`] schema), or adds
/// `what` to the one it declares.
fn add_error(op: &mut utoipa::openapi::path::Operation, status: u16, what: &str) {
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
    let responses = &mut op.responses.responses;
    match responses.get_mut(&status.to_string()) {
        Some(RefOr::T(known)) => known.description = format!("{}; {what}", known.description),
        Some(RefOr::Ref(_)) => {}
        None => {
            let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build();
            let response = ResponseBuilder::new().description(what).content("application/json", content).build();
            responses.insert(status.to_string(), RefOr::T(response));
        }
    }
}

/// The OpenAPI document (`GET /v1/openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    <ApiDoc as utoipa::OpenApi>::openapi()
}

#[utoipa::path(get, path = "/v1/openapi.json", tag = "node",
    responses((status = 200, description = "This document", content_type = "application/json")))]
pub(super) async fn get_openapi(_: NoParams) -> Response {
    (StatusCode::OK, Json(openapi())).into_response()
}

/// The API's routes over a node, behind the gate; every error answer JSON.
pub(super) fn router(state: AppState, gate: gate::Gate) -> Router {
    Router::new()
        .route("/v1/openapi.json", get(get_openapi))
        .route("/v1/locks/{*path}", get(get_lock).post(post_lock))
        .route("/v1/inspect/{*name}", get(get_inspect))
        .route("/v1/watch/{*name}", get(get_watch))
        .route("/v1/observe/{*name}", get(get_observe))
        .route("/v1/swarm/locks", get(get_swarm_locks))
        .route("/v1/revoke/{*name}", axum::routing::post(post_revoke))
        .route("/v1/status", get(get_status))
        .route("/healthz", get(get_healthz))
        .route("/readyz", get(get_readyz))
        .route("/v1/admin/blocked", get(get_blocked))
        .route("/v1/admin/block", axum::routing::post(post_block))
        .route("/v1/admin/unblock", axum::routing::post(post_unblock))
        .route("/v1/admin/forget", axum::routing::post(post_forget))
        .route("/metrics", get(get_metrics))
        .fallback(super::error::not_found)
        .method_not_allowed_fallback(super::error::method_not_allowed)
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(gate, gate::check))
        .layer(axum::extract::DefaultBodyLimit::max(gate::MAX_BODY))
        .layer(axum::middleware::from_fn(super::error::json_errors))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            "/v1/locks/{name}/value",
            "/v1/observe/{name}",
            "/v1/openapi.json",
            "/v1/revoke/{name}",
            "/v1/status",
            "/v1/swarm/locks",
            "/v1/watch/{name}",
        ];
        want.sort_unstable();
        assert_eq!(paths, want);
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for t in [
            "Acquired",
            "KeptAlive",
            "Released",
            "HolderBody",
            "AcquireBody",
            "ValueBody",
            "ValueSet",
            "LockState",
            "RevokeBody",
            "ErrorBody",
            "LockView",
            "Inspection",
            "Status",
            "SwarmLocks",
        ] {
            assert!(schemas.contains_key(t), "schema {t} missing: {:?}", schemas.keys().collect::<Vec<_>>());
        }
        let acquire = &doc["paths"]["/v1/locks/{name}/acquire"]["post"];
        let params: Vec<&str> =
            acquire["parameters"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
        assert_eq!(params, ["name", "timeout_ms", "ttl_ms", "n", "m", "min_peers", "slots"]);
    }

    #[test]
    fn the_document_lists_every_error_code_and_the_bearer_schemes() {
        let doc = serde_json::to_value(openapi()).unwrap();
        let listed: Vec<&str> = doc["components"]["schemas"]["ErrorCode"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let all: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(listed, all);
        assert_eq!(doc["components"]["schemas"]["ErrorBody"]["required"], serde_json::json!(["error", "code"]));
        for scheme in [API_TOKEN_SCHEME, ADMIN_TOKEN_SCHEME] {
            assert_eq!(doc["components"]["securitySchemes"][scheme]["scheme"], "bearer", "{scheme}");
        }
        let revoke = &doc["paths"]["/v1/revoke/{name}"]["post"];
        assert_eq!(revoke["security"], serde_json::json!([{ ADMIN_TOKEN_SCHEME: [] }]));
        let status = &doc["paths"]["/v1/status"]["get"];
        assert_eq!(status["security"], serde_json::json!([{}, { API_TOKEN_SCHEME: [] }]));
        for code in ["400", "401", "403", "413", "415", "503"] {
            let schema = &revoke["responses"][code]["content"]["application/json"]["schema"]["$ref"];
            assert_eq!(schema, "#/components/schemas/ErrorBody", "revoke {code}");
        }
        for code in ["400", "401", "403", "503"] {
            assert!(status["responses"][code].is_object(), "status {code}");
        }
        assert!(status["responses"]["413"].is_null(), "a GET reads no body");
    }

    #[test]
    fn post_paths_split_on_the_last_segment() {
        assert_eq!(split_action("a/acquire"), Some(("a", "acquire")));
        assert_eq!(split_action("orders/42/release"), Some(("orders/42", "release")));
        assert_eq!(split_action("a/acquire/acquire"), Some(("a/acquire", "acquire")));
        assert_eq!(split_action("acquire"), None);
    }
}
