//! The calls of the nodes' HTTP control API that the testnet makes, through the typed
//! client (`sigma_daemon::client`), with the outcomes the testnet counts.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, Result};
use serde::Serialize;
use sigma_daemon::client::{AcquireOptions, Client, ClientError};
use sigma_daemon::http::{Acquired, ErrorCode};

/// An HTTP client for loopback APIs: never through a proxy from the environment, and
/// with the `Sigma-Client` header the API's gate asks of every POST.
pub fn client() -> Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(sigma_daemon::http::gate::CLIENT_HEADER, reqwest::header::HeaderValue::from_static("sigma-testnet"));
    reqwest::Client::builder()
        .no_proxy()
        .default_headers(headers)
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
        .context("building the HTTP client")
}

/// `GET /v1/status`.
pub use sigma_node::Status;

/// The typed client of the node at `api`, over the shared connection pool.
fn node(client: &reqwest::Client, api: SocketAddr) -> Client {
    Client::with_http(api, client.clone())
}

/// Fetches a node's status.
pub async fn status(client: &reqwest::Client, api: SocketAddr, timeout: Duration) -> Result<Status> {
    Ok(node(client, api).with_timeout(timeout).status().await?)
}

/// The admin token of the testnet's daemons: `admin.token` beside their key files in
/// `dir`, created by the first to start.
pub fn admin_token(dir: &std::path::Path) -> Result<String> {
    let path = dir.join("admin.token");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("the daemons' admin token {}", path.display()))?;
    Ok(text.trim().to_owned())
}

/// `POST /v1/admin/{block,unblock}` with `peers` and the admin token: the node closes and
/// refuses (or accepts again) connections to them.
pub async fn admin_block(
    client: &reqwest::Client,
    api: SocketAddr,
    admin_token: &str,
    peers: &[String],
    block: bool,
    timeout: Duration,
) -> Result<()> {
    node(client, api).with_admin_token(admin_token)?.with_timeout(timeout).block(peers, block).await?;
    Ok(())
}

/// The two counters behind "protocol messages per CS entry".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Completed {
    /// `sigma_completed_total`: acquisitions that won and finished.
    pub completed: u64,
    /// `sigma_completed_messages_total`: their protocol messages.
    pub messages: u64,
    /// `sigma_requests_out_total`: transport requests sent (a batch counts one).
    pub requests: u64,
    /// `sigma_messages_rejected_total{reason="quorum_mismatch"}`: requests refused for
    /// another replica count, which peers of one swarm never send each other.
    pub quorum_mismatch: u64,
}

impl std::ops::Add for Completed {
    type Output = Completed;
    fn add(self, o: Completed) -> Completed {
        Completed {
            completed: self.completed + o.completed,
            messages: self.messages + o.messages,
            requests: self.requests + o.requests,
            quorum_mismatch: self.quorum_mismatch + o.quorum_mismatch,
        }
    }
}

/// Reads a counter (no labels) from an OpenMetrics text.
pub fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok().map(|v| v as u64))
}

/// Scrapes `GET /metrics` for the completed-acquisition counters.
pub async fn completed(client: &reqwest::Client, api: SocketAddr, timeout: Duration) -> Result<Completed> {
    let text = node(client, api).with_timeout(timeout).metrics().await?;
    Ok(Completed {
        completed: metric(&text, "sigma_completed_total").context("sigma_completed_total missing from /metrics")?,
        messages: metric(&text, "sigma_completed_messages_total")
            .context("sigma_completed_messages_total missing from /metrics")?,
        requests: metric(&text, "sigma_requests_out_total").unwrap_or(0),
        quorum_mismatch: metric(&text, "sigma_messages_rejected_total{reason=\"quorum_mismatch\"}").unwrap_or(0),
    })
}

/// How an acquire ended.
#[derive(Debug)]
pub enum Acquire {
    /// Got it.
    Granted(Acquired),
    /// `423 not_won`: not within `timeout_ms`.
    TimedOut,
    /// Anything else: transport error, `503`, `409`, a bad answer.
    Failed(String),
}

/// `POST /v1/locks/{name}/acquire?timeout_ms=`.
///
/// The HTTP timeout is well above `timeout_ms`: the daemon must answer 423 itself, for a
/// connection dropped at the moment it wins would leave the lock held for nobody.
pub async fn acquire(client: &reqwest::Client, api: SocketAddr, name: &str, timeout_ms: u64) -> Acquire {
    acquire_with(client, api, name, timeout_ms, None, None).await
}

/// [`acquire`], or with `slots` one slot of semaphore `name`; `value` attached to the
/// lock (an election's candidate).
pub async fn acquire_with(
    client: &reqwest::Client,
    api: SocketAddr,
    name: &str,
    timeout_ms: u64,
    slots: Option<u16>,
    value: Option<String>,
) -> Acquire {
    let opts = AcquireOptions {
        timeout: Some(Duration::from_millis(timeout_ms)),
        slots,
        value: value.map(String::into_bytes),
        ..AcquireOptions::default()
    };
    match node(client, api).acquire(name, &opts).await {
        Ok(a) => Acquire::Granted(a),
        Err(ClientError::Refused { code: ErrorCode::NotWon, .. }) => Acquire::TimedOut,
        Err(e) => Acquire::Failed(e.to_string()),
    }
}

/// How a release ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Release {
    /// `200`.
    Released,
    /// `404 not_held`: the daemon no longer held it (lost while held, e.g. its lease ran
    /// out).
    NotHeld,
    /// Transport error or anything else.
    Failed(String),
}

/// `POST /v1/locks/{name}/release` with `{"token": …, "lease": …}`.
pub async fn release(client: &reqwest::Client, api: SocketAddr, name: &str, token: u64, lease: &str) -> Release {
    match node(client, api).release(name, token, lease).await {
        Ok(_) => Release::Released,
        Err(ClientError::Refused { code: ErrorCode::NotHeld, .. }) => Release::NotHeld,
        Err(e) => Release::Failed(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_without_labels() {
        let text = "# TYPE sigma_completed counter\nsigma_completed_total 12\nsigma_completed_messages_total 1500\n\
                    sigma_acquired_total{x=\"y\"} 3\n# EOF\n";
        assert_eq!(metric(text, "sigma_completed_total"), Some(12));
        assert_eq!(metric(text, "sigma_completed_messages_total"), Some(1500));
        assert_eq!(metric(text, "sigma_acquired_total"), None);
        assert_eq!(metric(text, "sigma_completed"), None);
    }
}
