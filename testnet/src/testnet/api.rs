//! The few calls of the nodes' HTTP control API that the testnet makes.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

/// An HTTP client for loopback APIs: never through a proxy from the environment, and
/// with the `Sigma-Client` header the API's gate asks of every POST.
pub fn client() -> Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(sigma_node::http::gate::CLIENT_HEADER, reqwest::header::HeaderValue::from_static("sigma-testnet"));
    reqwest::Client::builder()
        .no_proxy()
        .default_headers(headers)
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
        .context("building the HTTP client")
}

/// `GET /v1/status`, as much of it as the testnet reads.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Status {
    /// The node's peer id.
    #[serde(default)]
    pub peer_id: String,
    /// Addresses it listens on.
    #[serde(default)]
    pub listen_addrs: Vec<String>,
    /// Peers with an open connection.
    #[serde(default)]
    pub connected_peers: Vec<String>,
    /// Peers in its routing view.
    #[serde(default)]
    pub routable_peers: usize,
    /// Logical replicas hosted.
    #[serde(default)]
    pub replicas_hosted: usize,
    /// Serving: joined, and a majority of the peers it knows reachable.
    #[serde(default)]
    pub ready: bool,
    /// The takeover delay in force, ms.
    #[serde(default)]
    pub takeover_delay_ms: u64,
    /// Locks held through it: (name, token).
    #[serde(default)]
    pub locks_held: Vec<(String, u64)>,
    /// Locks waited for through it.
    #[serde(default)]
    pub locks_waiting: Vec<String>,
    /// Tokens not above the previous one this node saw for the same lock.
    #[serde(default)]
    pub token_regressions: u64,
    /// Sizes of its per-lock and per-peer state.
    #[serde(default)]
    pub state: sigma_behaviour::StateSizes,
}

/// Fetches a node's status.
pub async fn status(client: &reqwest::Client, api: SocketAddr, timeout: Duration) -> Result<Status> {
    let resp = client.get(format!("http://{api}/v1/status")).timeout(timeout).send().await?;
    if !resp.status().is_success() {
        bail!("status: HTTP {}", resp.status());
    }
    resp.json().await.context("status: bad JSON")
}

/// `POST /v1/admin/{block,unblock}` with `peers`: the node closes and refuses (or
/// accepts again) connections to them.
pub async fn admin_block(
    client: &reqwest::Client,
    api: SocketAddr,
    peers: &[String],
    block: bool,
    timeout: Duration,
) -> Result<()> {
    let action = if block { "block" } else { "unblock" };
    let resp = client
        .post(format!("http://{api}/v1/admin/{action}"))
        .json(&serde_json::json!({ "peers": peers }))
        .timeout(timeout)
        .send()
        .await?;
    if !resp.status().is_success() {
        bail!("{action}: HTTP {}", resp.status());
    }
    Ok(())
}

/// The two counters behind "protocol messages per CS entry".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Completed {
    /// `sigma_completed_total`: acquisitions that won and finished.
    pub completed: u64,
    /// `sigma_completed_messages_total`: their protocol messages.
    pub messages: u64,
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
    let resp = client.get(format!("http://{api}/metrics")).timeout(timeout).send().await?;
    if !resp.status().is_success() {
        bail!("metrics: HTTP {}", resp.status());
    }
    let text = resp.text().await?;
    Ok(Completed {
        completed: metric(&text, "sigma_completed_total").context("sigma_completed_total missing from /metrics")?,
        messages: metric(&text, "sigma_completed_messages_total")
            .context("sigma_completed_messages_total missing from /metrics")?,
        quorum_mismatch: metric(&text, "sigma_messages_rejected_total{reason=\"quorum_mismatch\"}").unwrap_or(0),
    })
}

/// A lock granted over HTTP (`200` of `POST /v1/locks/{name}/acquire`).
#[derive(Clone, Debug, Deserialize)]
pub struct Granted {
    /// Fencing token.
    pub token: u64,
    /// Milliseconds the lease is guaranteed from the answer on.
    pub valid_for_ms: u64,
}

/// How an acquire ended.
#[derive(Debug)]
pub enum Acquire {
    /// Got it.
    Granted(Granted),
    /// `408`: not within `timeout_ms`.
    TimedOut,
    /// Anything else: transport error, `503`, `409`, a bad answer.
    Failed(String),
}

/// `POST /v1/locks/{name}/acquire?timeout_ms=` (name: no characters that need escaping).
///
/// The HTTP timeout is well above `timeout_ms`: the daemon must answer 408 itself, for a
/// connection dropped at the moment it wins would leave the lock held for nobody.
pub async fn acquire(client: &reqwest::Client, api: SocketAddr, name: &str, timeout_ms: u64) -> Acquire {
    let url = format!("http://{api}/v1/locks/{name}/acquire?timeout_ms={timeout_ms}");
    let resp = match client.post(&url).timeout(Duration::from_millis(timeout_ms) + Duration::from_secs(30)).send().await
    {
        Ok(r) => r,
        Err(e) => return Acquire::Failed(e.to_string()),
    };
    match resp.status().as_u16() {
        200 => match resp.json::<Granted>().await {
            Ok(g) => Acquire::Granted(g),
            Err(e) => Acquire::Failed(format!("bad acquire answer: {e}")),
        },
        408 => Acquire::TimedOut,
        s => Acquire::Failed(format!("HTTP {s}: {}", resp.text().await.unwrap_or_default().trim())),
    }
}

/// How a release ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Release {
    /// `200`.
    Released,
    /// `404`: the daemon no longer held it (lost while held, e.g. its lease ran out).
    NotHeld,
    /// Transport error or anything else.
    Failed(String),
}

/// `POST /v1/locks/{name}/release` with `{"token": …}`.
pub async fn release(client: &reqwest::Client, api: SocketAddr, name: &str, token: u64) -> Release {
    let url = format!("http://{api}/v1/locks/{name}/release");
    let body = serde_json::json!({ "token": token });
    match client.post(&url).json(&body).timeout(Duration::from_secs(30)).send().await {
        Ok(r) if r.status().is_success() => Release::Released,
        Ok(r) if r.status().as_u16() == 404 => Release::NotHeld,
        Ok(r) => Release::Failed(format!("HTTP {}", r.status())),
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
