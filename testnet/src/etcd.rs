//! etcd for `sigma-testnet bench --vs etcd`: finding the binary, a 3-member cluster on
//! 127.0.0.1 (temporary data directories, removed with it), and the lock calls of etcd
//! 3.4's v3 JSON gateway (grpc-gateway on each member's client URL).
//!
//! The lock is what etcd users get: the `v3lock` service (`/v3/lock/lock`,
//! `/v3/lock/unlock`), which runs the `concurrency` package's recipe on the member (a
//! key `NAME/LEASE` put under the lease, the lowest create revision holds, the others
//! watch the key just before theirs; unlock deletes the key). Each client grants one
//! lease (its session) before its first lock and revokes it at the end, as a
//! `concurrency.Session` does. Keys and values are base64 in the JSON gateway.

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::testnet::proc;

/// How to get etcd, printed when it is missing.
pub const HOW_TO_GET: &str = "install it with `apt-get install etcd-server` (Debian, Ubuntu: etcd 3.4) \
                              or from https://github.com/etcd-io/etcd/releases, or pass --etcd-bin PATH";

/// Members of the cluster.
pub const MEMBERS: usize = 3;

/// How long the members may take to report healthy.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(30);

/// Session lease of a client: the cluster lives only for one run and every client
/// revokes its lease at the end, so one long lease stands in for the keep-alives a
/// `concurrency.Session` would send.
const SESSION_TTL_S: u64 = 3600;

/// Finds the etcd binary: `explicit`, else `etcd` on `PATH`. `Err` says why not and
/// how to get it.
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(format!("--etcd-bin {}: no such file; {HOW_TO_GET}", p.display()))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("etcd is not on PATH; {HOW_TO_GET}"))
}

/// `etcd --version`, first line (e.g. `etcd Version: 3.4.23`).
pub fn version(bin: &Path) -> String {
    Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().next().map(str::to_owned))
        .unwrap_or_else(|| "version unknown".to_owned())
}

/// `k` distinct free TCP ports on 127.0.0.1 (bound together, read back and released:
/// etcd takes fixed ports).
fn free_ports(k: usize) -> Result<Vec<u16>> {
    let listeners = (0..k)
        .map(|_| TcpListener::bind("127.0.0.1:0").context("finding a free port on 127.0.0.1"))
        .collect::<Result<Vec<_>>>()?;
    listeners.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

/// A member: its process and files.
#[derive(Debug)]
struct Member {
    name: String,
    child: Child,
    client: SocketAddr,
    log: PathBuf,
}

/// A 3-member etcd on 127.0.0.1, in a temporary directory. Dropping it kills the
/// members and removes the directory (also on error, panic or Ctrl-C in the driver:
/// the members run in their own process group, so only the driver gets the terminal's
/// signals, and its guard stops them).
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: PathBuf,
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            let _ = m.child.kill();
            let _ = m.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl EtcdCluster {
    /// The members' process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.members.iter().map(|m| m.child.id()).collect()
    }

    /// Starts the members under `dir` (created; removed on drop) and waits until each
    /// answers `GET /health` with `"health":"true"`.
    pub async fn start(bin: &Path, dir: &Path, http: &reqwest::Client) -> Result<EtcdCluster> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut cluster = EtcdCluster { members: Vec::new(), dir: dir.to_path_buf() };
        let free = free_ports(2 * MEMBERS)?;
        let ports: Vec<(u16, u16)> = free.chunks(2).map(|p| (p[0], p[1])).collect();
        let initial: Vec<String> =
            ports.iter().enumerate().map(|(i, (_, peer))| format!("e{i}=http://127.0.0.1:{peer}")).collect();
        let token = format!("sigma-bench-{}", std::process::id());
        for (i, (client, peer)) in ports.iter().enumerate() {
            let name = format!("e{i}");
            let log = dir.join(format!("{name}.log"));
            let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
            let err = out.try_clone()?;
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let mut cmd = Command::new(bin);
            cmd.arg("--name")
                .arg(&name)
                .arg("--data-dir")
                .arg(dir.join(&name))
                .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &initial.join(","), "--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", &token])
                // No metrics or pprof listener beyond the client URL, and quiet logs.
                .args(["--log-level", "warn", "--logger", "zap"])
                .env_remove("ETCDCTL_API")
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err);
            // Its own process group: a Ctrl-C reaches the driver only, whose guard stops it.
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
            let child = cmd.spawn().with_context(|| format!("spawning {} for member {name}", bin.display()))?;
            cluster.members.push(Member { name, child, client: SocketAddr::from(([127, 0, 0, 1], *client)), log });
        }
        cluster.wait_healthy(http).await?;
        Ok(cluster)
    }

    async fn wait_healthy(&mut self, http: &reqwest::Client) -> Result<()> {
        let deadline = Instant::now() + HEALTH_TIMEOUT;
        loop {
            let mut healthy = 0;
            for m in &mut self.members {
                if let Some(st) = m.child.try_wait()? {
                    bail!(proc::with_log(&format!("etcd member {} exited during start-up ({st})", m.name), &m.log));
                }
                let url = format!("http://{}/health", m.client);
                let ok = match http.get(url).timeout(Duration::from_secs(2)).send().await {
                    Ok(r) => r.json::<Value>().await.is_ok_and(|v| v["health"] == "true"),
                    Err(_) => false,
                };
                healthy += usize::from(ok);
            }
            if healthy == self.members.len() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let m = &self.members[0];
                bail!(proc::with_log(
                    &format!("etcd: {healthy} of {MEMBERS} members healthy after {} s", HEALTH_TIMEOUT.as_secs()),
                    &m.log
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The members' client addresses.
    pub fn endpoints(&self) -> Vec<SocketAddr> {
        self.members.iter().map(|m| m.client).collect()
    }
}

/// `POST http://ENDPOINT/v3/PATH` with a JSON body: the answer, or the gateway's error.
async fn call(http: &reqwest::Client, endpoint: SocketAddr, path: &str, body: &Value) -> Result<Value> {
    let url = format!("http://{endpoint}/v3/{path}");
    let resp = http
        .post(&url)
        .json(body)
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = resp.status();
    let v: Value = resp.json().await.with_context(|| format!("POST {url}: {status}, not JSON"))?;
    if let Some(e) = gateway_error(&v) {
        bail!("POST {url}: {status}: {e}");
    }
    Ok(v)
}

/// The error of a gateway answer (`{"error": …, "code": …}`), if it is one.
pub fn gateway_error(v: &Value) -> Option<String> {
    let e = v.get("error")?;
    let msg = e.as_str().map_or_else(|| e.to_string(), str::to_owned);
    Some(format!("{msg} (grpc code {})", v.get("code").unwrap_or(&Value::Null)))
}

/// An int64 of the gateway (JSON strings, as proto3's mapping writes them; absent: 0).
pub fn int64(v: &Value) -> Result<i64> {
    match v {
        Value::Null => Ok(0),
        Value::String(s) => s.parse().with_context(|| format!("not an int64: {s:?}")),
        Value::Number(n) => n.as_i64().with_context(|| format!("not an int64: {n}")),
        other => bail!("not an int64: {other}"),
    }
}

/// `POST /v3/lease/grant`: a session lease; answers its id.
pub async fn grant(http: &reqwest::Client, endpoint: SocketAddr) -> Result<i64> {
    let v = call(http, endpoint, "lease/grant", &json!({ "TTL": SESSION_TTL_S })).await?;
    int64(&v["ID"])
}

/// `POST /v3/lease/revoke`: ends a session (deletes any key still under it).
pub async fn revoke(http: &reqwest::Client, endpoint: SocketAddr, lease: i64) -> Result<()> {
    call(http, endpoint, "lease/revoke", &json!({ "ID": lease.to_string() })).await.map(drop)
}

/// A held etcd lock.
#[derive(Clone, Debug)]
pub struct Held {
    /// The lock's key (`NAME/LEASE-in-hex`), base64: unlock deletes it.
    pub key: String,
    /// The revision of the answer's header (at least the key's create revision).
    pub revision: i64,
}

/// `POST /v3/lock/lock`: blocks until `name` is held under `lease`.
pub async fn lock(http: &reqwest::Client, endpoint: SocketAddr, name: &str, lease: i64) -> Result<Held> {
    let body = json!({ "name": B64.encode(name), "lease": lease.to_string() });
    let v = call(http, endpoint, "lock/lock", &body).await?;
    let key = v["key"].as_str().with_context(|| format!("lock {name}: no key in {v}"))?.to_owned();
    Ok(Held { key, revision: int64(&v["header"]["revision"])? })
}

/// `POST /v3/lock/unlock`: deletes the lock's key.
pub async fn unlock(http: &reqwest::Client, endpoint: SocketAddr, held: &Held) -> Result<()> {
    call(http, endpoint, "lock/unlock", &json!({ "key": held.key })).await.map(drop)
}

/// `POST /v3/kv/range` over the lock's prefix (`NAME/`): the keys left, decoded. An
/// unlocked lock with no waiter has none.
pub async fn keys_under(http: &reqwest::Client, endpoint: SocketAddr, name: &str) -> Result<Vec<String>> {
    let prefix = format!("{name}/");
    // The range end of a prefix: its last byte plus one ('/' + 1 = '0').
    let end = format!("{name}0");
    let body = json!({ "key": B64.encode(&prefix), "range_end": B64.encode(end), "keys_only": true });
    let v = call(http, endpoint, "kv/range", &body).await?;
    let kvs = v["kvs"].as_array().cloned().unwrap_or_default();
    kvs.iter()
        .map(|kv| {
            let k = kv["key"].as_str().context("a range answer without key")?;
            let raw = B64.decode(k).with_context(|| format!("key {k:?} is not base64"))?;
            Ok(String::from_utf8_lossy(&raw).into_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_errors_and_int64s_are_read() {
        let err = json!({"error": "illegal base64 data at input byte 0", "code": 3});
        assert_eq!(gateway_error(&err).unwrap(), "illegal base64 data at input byte 0 (grpc code 3)");
        let ok = json!({"header": {"revision": "42"}, "key": "bXlsb2NrLzU1"});
        assert!(gateway_error(&ok).is_none());
        assert_eq!(int64(&ok["header"]["revision"]).unwrap(), 42);
        assert_eq!(int64(&Value::Null).unwrap(), 0);
        assert!(int64(&json!("x")).is_err());
    }

    #[test]
    fn a_missing_binary_says_how_to_get_etcd() {
        let e = locate(Some(Path::new("/nonexistent/etcd"))).unwrap_err();
        assert!(e.contains("apt-get install etcd-server"), "{e}");
    }
}
