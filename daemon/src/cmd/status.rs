//! `sigma status` and `sigma locks`, and how they render the daemon's status.

use clap::Args;

use super::api::{api_error, ApiArgs};
use super::init_tracing;

#[derive(Args, Debug)]
pub(crate) struct StatusCmdArgs {
    #[command(flatten)]
    pub(crate) base: StatusArgs,
    /// A readiness check for scripts and probes: exit 0 if the peer serves and no new
    /// lock waits for the takeover delay (what `GET /readyz` answers 200 to), else
    /// print why and exit 1 (69 if the daemon cannot be reached).
    #[arg(long, conflicts_with = "json")]
    pub(crate) check: bool,
}

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub(crate) api: ApiArgs,
    /// Print the daemon's JSON answer.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct LocksArgs {
    #[command(flatten)]
    pub(crate) base: StatusArgs,
    /// The locks held and waited for across the swarm, one line each: name, holder
    /// (peer and name), fencing token, validity, waiters. Every alive member is asked
    /// for its own; a snapshot, which misses the locks of a peer that does not answer
    /// (named at the end).
    #[arg(long)]
    pub(crate) swarm: bool,
}

/// `GET /v1/status` of the daemon at `api` (`what` names the command in errors).
pub(crate) async fn fetch_status(api: &ApiArgs, what: &str) -> anyhow::Result<serde_json::Value> {
    init_tracing("warn");
    let status = api.connect()?.status().await.map_err(|e| api_error(what, e))?;
    Ok(serde_json::to_value(status)?)
}

pub(crate) async fn status(cmd: StatusCmdArgs) -> anyhow::Result<u8> {
    let args = cmd.base;
    let v = fetch_status(&args.api, "status").await?;
    if cmd.check {
        let held_back = v["held_back_ms"].as_u64().unwrap_or(0);
        return Ok(if v["ready"] != true {
            println!("not ready: {}", v["readiness_detail"].as_str().unwrap_or("?"));
            1
        } else if held_back > 0 {
            println!("serving, but a new lock waits {held_back} ms more for the takeover delay");
            1
        } else {
            println!("ready: serving");
            0
        });
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    print!("{}", render_status(&v));
    Ok(0)
}

pub(crate) async fn locks(cmd: LocksArgs) -> anyhow::Result<u8> {
    let args = cmd.base;
    if cmd.swarm {
        init_tracing("warn");
        let locks = args.api.connect()?.swarm_locks().await.map_err(|e| api_error("locks --swarm", e))?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&locks)?);
        } else {
            print!("{}", locks.render());
        }
        return Ok(0);
    }
    let v = fetch_status(&args.api, "locks").await?;
    let held = v.get("locks_held").cloned().unwrap_or_default();
    let waiting = v.get("waiting").cloned().unwrap_or_default();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "held": held, "waiting": waiting }))?);
        return Ok(0);
    }
    print!("{}", render_locks(&held, &waiting));
    Ok(0)
}

/// One line per lock: `held NAME token T` or `waiting NAME position P (V votes)`.
pub(crate) fn render_locks(held: &serde_json::Value, waiting: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for h in held.as_array().into_iter().flatten() {
        if let Some([name, token]) = h.as_array().map(Vec::as_slice) {
            let _ = writeln!(out, "held     {} token {token}", name.as_str().unwrap_or("?"));
        }
    }
    for w in waiting.as_array().into_iter().flatten() {
        let name = w["name"].as_str().unwrap_or("?");
        let place = w["position"].as_u64().map_or_else(|| "not yet known".to_owned(), |p| p.to_string());
        let _ = writeln!(out, "waiting  {name} position {place} ({} votes)", w["votes"].as_u64().unwrap_or(0));
    }
    if out.is_empty() {
        out.push_str("no locks held or waited for through this peer\n");
    }
    out
}

pub(crate) fn render_status(v: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let str_list = |key: &str| -> Vec<String> {
        match v.get(key) {
            Some(serde_json::Value::Array(a)) => {
                a.iter().map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned)).collect()
            }
            _ => Vec::new(),
        }
    };
    let num = |key: &str| v.get(key).map_or_else(|| "?".to_owned(), |x| x.to_string());
    // A peer id with the name it announced, if any.
    let who = |peer: &str| match v["peer_names"].get(peer).and_then(|n| n.as_str()) {
        Some(name) => format!("{peer} ({name})"),
        None => peer.to_owned(),
    };
    let mut out = String::new();
    let _ = writeln!(out, "peer id:          {}", v.get("peer_id").and_then(|x| x.as_str()).unwrap_or("?"));
    if let Some(name) = v.get("name").and_then(|x| x.as_str()) {
        let _ = writeln!(out, "name:             {name}");
    }
    let listen = str_list("listen_addrs");
    let _ = writeln!(
        out,
        "listening on:     {}",
        if listen.is_empty() { "-".to_owned() } else { listen.join("\n                  ") }
    );
    let external = str_list("external_addrs");
    let _ = writeln!(
        out,
        "external:         {}",
        if external.is_empty() {
            "- (no address other peers can dial: hosts no replica)".to_owned()
        } else {
            external.join("\n                  ")
        }
    );
    let connected = str_list("connected_peers");
    let _ = writeln!(out, "connected peers:  {}", connected.len());
    for p in &connected {
        let _ = writeln!(out, "                  {}", who(p));
    }
    let _ = writeln!(out, "routable peers:   {}", num("routable_peers"));
    let ready = v.get("ready").and_then(serde_json::Value::as_bool);
    let detail = v.get("readiness_detail").and_then(|x| x.as_str()).unwrap_or("?");
    let _ = writeln!(
        out,
        "ready:            {} ({detail}; {} of {} known peers reachable)",
        match ready {
            Some(true) => "yes",
            Some(false) => "no",
            None => "?",
        },
        num("reachable_members"),
        num("members"),
    );
    let departed: Vec<String> = str_list("departed_members").iter().map(|p| who(p)).collect();
    if !departed.is_empty() {
        let _ = writeln!(out, "departed peers:   {} (sigma admin forget, if gone for good)", departed.join(", "));
    }
    if let Some(ms) = v.get("held_back_ms").and_then(serde_json::Value::as_u64).filter(|ms| *ms > 0) {
        let _ = writeln!(out, "new locks wait:   {ms} ms more (the takeover delay after serving began)");
    }
    let _ = writeln!(out, "replicas hosted:  {}", num("replicas_hosted"));
    let held: Vec<String> = match v.get("locks_held") {
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|x| match x {
                serde_json::Value::Array(p) if p.len() == 2 => {
                    format!("{} (token {})", p[0].as_str().unwrap_or("?"), p[1])
                }
                other => other.to_string(),
            })
            .collect(),
        _ => Vec::new(),
    };
    let _ = writeln!(out, "locks held:       {}", if held.is_empty() { "-".to_owned() } else { held.join(", ") });
    let waiting = str_list("locks_waiting");
    let _ = writeln!(out, "locks waited for: {}", if waiting.is_empty() { "-".to_owned() } else { waiting.join(", ") });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_render_with_places_in_line() {
        let held = serde_json::json!([["orders/42", 7]]);
        let waiting = serde_json::json!([
            {"name": "a", "position": 2, "votes": 3},
            {"name": "b", "position": null, "votes": 0},
        ]);
        let s = render_locks(&held, &waiting);
        assert!(s.contains("held     orders/42 token 7"), "{s}");
        assert!(s.contains("waiting  a position 2 (3 votes)"), "{s}");
        assert!(s.contains("waiting  b position not yet known (0 votes)"), "{s}");
    }

    #[test]
    fn status_renders() {
        let v = serde_json::json!({
            "peer_id": "12D3KooW",
            "listen_addrs": ["/ip4/127.0.0.1/tcp/1"],
            "connected_peers": ["A", "B"],
            "routable_peers": 2,
            "replicas_hosted": 5,
            "locks_held": [["orders/42", 7]],
            "locks_waiting": [],
        });
        let s = render_status(&v);
        assert!(s.contains("peer id:          12D3KooW"), "{s}");
        assert!(s.contains("external:         - (no address other peers can dial"), "{s}");
        let mut with_external = v.clone();
        with_external["external_addrs"] = serde_json::json!(["/ip4/203.0.113.7/tcp/7590"]);
        assert!(render_status(&with_external).contains("external:         /ip4/203.0.113.7/tcp/7590"));
        assert!(s.contains("connected peers:  2"), "{s}");
        assert!(s.contains("orders/42 (token 7)"), "{s}");
        assert!(s.contains("locks waited for: -"), "{s}");
        assert!(!s.contains("name:"), "{s}");
        let mut named = v.clone();
        named["name"] = serde_json::json!("db-1");
        named["peer_names"] = serde_json::json!({"B": "db-2"});
        let s = render_status(&named);
        assert!(s.contains("name:             db-1\n"), "{s}");
        assert!(s.contains("                  A\n                  B (db-2)\n"), "{s}");
    }
}
