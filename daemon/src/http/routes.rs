//! The handlers of the API's routes, and the OpenAPI document generated from them.

use std::time::{Duration, Instant};

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use sigma_node::metrics::{self, Outcome};
use sigma_node::{LockError, LockOptions, RevokeError};
use tokio::sync::{mpsc, oneshot};

use super::holders::{deadline_ms, hold, HolderCmd, LeaseId};
use super::*;

pub(super) fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(ErrorBody { error: msg.into(), code: None })).into_response()
}

pub(super) fn error_with_code(status: StatusCode, code: &str, msg: impl Into<String>) -> Response {
    (status, Json(ErrorBody { error: msg.into(), code: Some(code.to_owned()) })).into_response()
}

#[derive(Debug, Deserialize)]
pub(super) struct AcquireQuery {
    timeout_ms: Option<u64>,
    n: Option<usize>,
    m: Option<usize>,
    min_peers: Option<usize>,
    ttl_ms: Option<u64>,
}

/// Splits a POST path `NAME/ACTION`.
pub(super) fn split_action(path: &str) -> Option<(&str, &str)> {
    path.rsplit_once('/')
}

pub(super) async fn post_lock(
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

pub(super) fn not_held(name: &str, token: u64) -> Response {
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
pub(super) async fn acquire(s: AppState, name: &str, q: AcquireQuery, peer: serve::Peer) -> Response {
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
        (status = 400, description = "No lease id, or a malformed one (code bad_lease)", body = ErrorBody),
        (status = 404, description = "Not held under that token and lease (code not_held)", body = ErrorBody)))]
pub(super) async fn release(name: &str, token: u64, tx: mpsc::Sender<HolderCmd>) -> Response {
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
pub(super) async fn get_lock(State(s): State<AppState>, Path(name): Path<String>) -> Response {
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
pub(super) async fn get_inspect(State(s): State<AppState>, Path(name): Path<String>) -> Response {
    match s.handle.inspect(&name).await {
        Ok(view) => (StatusCode::OK, Json(view)).into_response(),
        Err(e @ LockError::BadName) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

#[utoipa::path(post, path = "/v1/revoke/{name}", tag = "operators", params(("name" = String, Path, description = "Lock name: 1 to 200 bytes of [A-Za-z0-9._/-]; a '/' may be sent as is or as %2F")), request_body = RevokeBody,
    responses((status = 200, description = "The holder gave the lock up", body = sigma_node::inspect::Revoked),
        (status = 404, description = "Not held under that token, or the holder refused", body = ErrorBody)))]
pub(super) async fn post_revoke(
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

/// How long a probe waits for the node's event loop.
pub(super) const PROBE_PATIENCE: Duration = Duration::from_secs(2);

#[utoipa::path(get, path = "/healthz", tag = "node",
    responses((status = 200, description = "The daemon's event loop answers (liveness): restart it only on a 503 or no answer", body = Probe),
        (status = 503, description = "`unresponsive`: the event loop did not answer within 2 s, or the node stopped", body = ErrorBody)))]
pub(super) async fn get_healthz(State(s): State<AppState>) -> Response {
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
        (status = 503, description = "`not_ready` (joining, a minority, a joint quorum not reached, unreachable, leaving) or `held_back` (serving, but a new lock waits out the takeover delay); the message says which and for how long", body = ErrorBody)))]
pub(super) async fn get_readyz(State(s): State<AppState>) -> Response {
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
pub(super) async fn get_status(State(s): State<AppState>) -> Response {
    match s.handle.status().await {
        Ok(st) => (StatusCode::OK, Json(st)).into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

#[utoipa::path(get, path = "/v1/admin/blocked", tag = "admin",
    responses((status = 200, description = "Peers blocked now", body = PeerList)))]
pub(super) async fn get_blocked(State(s): State<AppState>) -> Response {
    block(s, Vec::new(), true).await
}

#[utoipa::path(post, path = "/v1/admin/block", tag = "admin", request_body = PeerList,
    responses((status = 200, description = "Their connections closed and refused; the peers blocked afterwards", body = PeerList)))]
pub(super) async fn post_block(
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
pub(super) async fn post_unblock(
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

pub(super) fn parse_peers(body: &[u8]) -> Result<Vec<libp2p::PeerId>, String> {
    let list: PeerList =
        serde_json::from_slice(body).map_err(|e| format!("bad body (expected {{\"peers\": [peer ids]}}): {e}"))?;
    list.peers.iter().map(|p| p.parse().map_err(|e| format!("bad peer id {p:?}: {e}"))).collect()
}
#[utoipa::path(post, path = "/v1/admin/forget", tag = "admin", request_body = PeerList,
    responses((status = 200, description = "Peers gone for good, taken out of this node's membership counts (only a peer not alive here, and not on the member list)", body = Forgotten)))]
pub(super) async fn post_forget(
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
pub(super) async fn block(s: AppState, peers: Vec<libp2p::PeerId>, block: bool) -> Response {
    match s.handle.block_peers(peers, block).await {
        Ok(blocked) => (StatusCode::OK, Json(PeerList { peers: blocked.iter().map(ToString::to_string).collect() }))
            .into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

#[utoipa::path(get, path = "/metrics", tag = "node",
    responses((status = 200, description = "Prometheus / OpenMetrics text", content_type = "application/openmetrics-text")))]
pub(super) async fn get_metrics(State(s): State<AppState>) -> Response {
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
pub(super) async fn get_openapi() -> Response {
    (StatusCode::OK, Json(openapi())).into_response()
}

/// The API's routes over a node, behind the gate.
pub(super) fn router(state: AppState, gate: gate::Gate) -> Router {
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
}
