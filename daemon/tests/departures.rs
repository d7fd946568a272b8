//! Departures with real `sigma run` daemons on 127.0.0.1: more than half a swarm
//! stopping must not stop the rest for good. A graceful stop (SIGTERM) announces a
//! signed leave that takes the peer out of every count at once; peers killed without
//! one are taken out by the operator (`sigma admin forget`) on each survivor.

use std::path::Path;
use std::process::{Output, Stdio};

use serde_json::Value;
use tokio::process::Command;

mod daemon;

use daemon::{assert_locked, daemon, eventually, lock_echo, serving_with, status, Daemon, SIGMA};

/// Five daemons, 1 to 4 bootstrapping to 0; answers once all five serve with 5 members.
async fn five(dir: &Path) -> Vec<Daemon> {
    let first = daemon(dir, "d0", &[]).await;
    let boot = first.listen.clone();
    let mut ds = vec![first];
    for i in 1..5 {
        ds.push(daemon(dir, &format!("d{i}"), &boot).await);
    }
    for d in &ds {
        serving_with(d, 5).await;
    }
    ds
}

/// `sigma admin forget PEERS…` through `d`, with the daemons' admin token.
async fn forget(dir: &Path, d: &Daemon, peers: &[String]) -> Output {
    Command::new(SIGMA)
        .args(["admin", "forget", "--api", &d.api, "--admin-token-file"])
        .arg(dir.join("admin.token"))
        .args(peers)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap()
}

/// Three of five daemons stopped with SIGTERM (as `systemctl stop`), one after the
/// other: each leaves, so the two survivors count 2 members, serve, and grant a lock,
/// without a restart. Before the leave they stayed a minority of 2 in 5 for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survivors_serve_again_after_most_of_the_swarm_stops_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    let mut ds = five(dir.path()).await;
    for d in &mut ds[2..] {
        let pid = nix::unistd::Pid::from_raw(d.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let exit = d.child.wait().await.unwrap();
        assert!(exit.success(), "a graceful stop exits 0: {exit:?}");
    }
    for d in &ds[..2] {
        serving_with(d, 2).await;
        let st = status(d).await;
        assert_eq!(st["departed_members"], Value::Array(vec![]), "they left: nothing to forget");
    }
    assert_locked(&lock_echo(&ds[1], "after-three-left", "30s").await, "a survivor");
}

/// Three of five daemons killed (SIGKILL: no leave): the survivors are a minority of
/// 2 in 5 and list the three as departed; forgetting an alive peer is refused;
/// once the operator forgets the three on both survivors, they serve with 2 members
/// and grant a lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_forgets_killed_peers_and_the_survivors_serve_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut ds = five(dir.path()).await;
    let gone: Vec<String> = ds[2..].iter().map(|d| d.peer_id.to_string()).collect();
    for d in &mut ds[2..] {
        d.child.kill().await.unwrap();
    }
    for d in &ds[..2] {
        eventually(&format!("{} to list the killed peers as departed", d.peer_id), || async move {
            let st = status(d).await;
            let departed = st["departed_members"].as_array().cloned().unwrap_or_default();
            st["readiness"] == "minority" && departed.len() == 3
        })
        .await;
    }
    let alive = forget(dir.path(), &ds[0], &[ds[1].peer_id.to_string()]).await;
    assert_eq!(alive.status.code(), Some(1), "{}", String::from_utf8_lossy(&alive.stderr));
    assert!(String::from_utf8_lossy(&alive.stdout).contains("alive here"), "{alive:?}");
    assert_eq!(status(&ds[0]).await["members"], 5, "a refused forget changes nothing");
    for d in &ds[..2] {
        let out = forget(dir.path(), d, &gone).await;
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).matches("forgotten ").count(), 3, "{out:?}");
    }
    for d in &ds[..2] {
        serving_with(d, 2).await;
    }
    assert_locked(&lock_echo(&ds[0], "after-three-killed", "30s").await, "a survivor");
}
