//! The embedded API on a small real swarm: try-lock, timeouts, release on drop,
//! detached locks, renewals, loss on shutdown, bad input.

mod common;

use std::time::{Duration, Instant};

use sigma_node::{LockError, LockOptions, Node, NodeHandle};

const LEASE: Duration = Duration::from_secs(1);

async fn three() -> (Vec<Node>, Vec<NodeHandle>) {
    common::meshed(3, &common::config(5, 3, LEASE)).await
}

/// True when no replica of `name` on any node has `peer` as owner or waiter.
async fn forgotten(handles: &[NodeHandle], name: &str, peer: sigma_node::libp2p::PeerId) -> bool {
    for h in handles {
        for r in h.hosted_replicas(name).await.unwrap() {
            if r.owner.is_some_and(|(p, _, _)| p == peer) || r.queue.iter().any(|(p, _)| *p == peer) {
                return false;
            }
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_and_timeouts_give_up_cleanly() {
    let (nodes, h) = three().await;
    let held = h[0].lock("api/try").await.unwrap();
    assert_eq!(h[0].status().await.unwrap().locks_held, vec![("api/try".to_owned(), held.token())]);

    let t = Instant::now();
    assert!(h[1].try_lock("api/try").await.unwrap().is_none(), "held elsewhere");
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(900) && waited < Duration::from_secs(3), "try_lock took {waited:?}");
    assert_eq!(h[2].lock_timeout("api/try", Duration::from_millis(200)).await.unwrap_err(), LockError::Timeout);
    // The abandoned attempts leave no trace: no waiter left on the node, none in the queues.
    assert!(h[1].status().await.unwrap().locks_waiting.is_empty());
    common::wait_for("abandoned waiters to leave the queues", Duration::from_secs(5), || async {
        forgotten(&h, "api/try", h[1].peer_id()).await && forgotten(&h, "api/try", h[2].peer_id()).await
    })
    .await;

    // Dropping the caller's future abandons the attempt too.
    assert!(tokio::time::timeout(Duration::from_millis(100), h[1].lock("api/try")).await.is_err());
    common::wait_for("a cancelled waiter to be abandoned", Duration::from_secs(5), || async {
        h[1].status().await.unwrap().locks_waiting.is_empty() && forgotten(&h, "api/try", h[1].peer_id()).await
    })
    .await;

    let first = held.token();
    held.release().await.unwrap();
    let next = h[1].try_lock("api/try").await.unwrap().expect("free after release");
    assert!(next.token() > first);
    next.release().await.unwrap();
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_releases_and_detached_locks_release_by_token() {
    let (nodes, h) = three().await;
    let guard = h[0].lock("api/drop").await.unwrap();
    drop(guard);
    // Released at once, well before the lease could run out.
    let t = Instant::now();
    let again = h[1].lock_timeout("api/drop", Duration::from_secs(5)).await.unwrap();
    assert!(t.elapsed() < LEASE / 2, "dropped guard released after {:?}", t.elapsed());

    let (name, token) = again.into_detached();
    assert_eq!(h[1].status().await.unwrap().locks_held, vec![(name.clone(), token)]);
    assert!(!h[1].release_by_token(&name, token + 1).await.unwrap(), "wrong token");
    assert!(!h[0].release_by_token(&name, token).await.unwrap(), "held through another node");
    assert!(h[1].release_by_token(&name, token).await.unwrap());
    assert!(!h[1].release_by_token(&name, token).await.unwrap(), "already released");
    assert!(h[1].status().await.unwrap().locks_held.is_empty());
    let third = h[2].lock_timeout("api/drop", Duration::from_secs(5)).await.unwrap();
    assert!(third.token() > token);
    third.release().await.unwrap();
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_is_renewed_while_held_and_lost_on_shutdown() {
    let (mut nodes, h) = three().await;
    let guard = h[0].lock("api/renew").await.unwrap();
    let first = guard.valid_until();
    assert!(first > Instant::now() && first <= Instant::now() + LEASE, "{first:?}");
    // Held for two leases: the deadline keeps moving, the lock is never lost.
    let renewed = async {
        let mut seen = first;
        while seen < first + 2 * LEASE {
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(!guard.is_lost(), "lost while renewing");
            seen = guard.valid_until();
        }
    };
    tokio::select! {
        () = renewed => {}
        () = guard.lost() => panic!("lock lost while held"),
        () = tokio::time::sleep(4 * LEASE) => panic!("valid_until did not advance: {:?}", guard.valid_until()),
    }
    assert!(h[1].try_lock("api/renew").await.unwrap().is_none(), "still exclusive after two leases");

    // A node that shuts down releases its locks; its guards report the loss.
    let node = nodes.remove(0);
    let token = guard.token();
    node.shutdown().await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), guard.lost()).await.expect("lost() resolves on shutdown");
    assert!(guard.is_lost());
    assert_eq!(guard.release().await.unwrap_err(), LockError::NodeStopped);
    assert_eq!(h[0].lock("api/renew").await.unwrap_err(), LockError::NodeStopped);
    assert!(matches!(h[0].status().await, Err(sigma_node::NodeError::Stopped)));
    // The lock was released before the node stopped: no replica left names it.
    for other in &h[1..] {
        for r in other.hosted_replicas("api/renew").await.unwrap() {
            assert!(r.owner.is_none_or(|(p, _, _)| p != h[0].peer_id()), "replica {} still owned: {r:?}", r.index);
        }
    }
    let next = h[1].lock_timeout("api/renew", Duration::from_secs(5)).await.unwrap();
    assert!(next.token() > token);
    next.release().await.unwrap();
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_and_quorums_are_refused() {
    let (nodes, h) = three().await;
    for name in ["", "has space", "ünïcode", &"x".repeat(201)] {
        assert_eq!(h[0].lock(name).await.unwrap_err(), LockError::BadName, "{name:?}");
    }
    // One lock, one replica set: n is the swarm's (5 here), m at least the swarm's (3).
    for quorum in [(4, 2), (3, 4), (300, 200), (7, 5), (5, 2), (5, 6)] {
        let err =
            h[0].lock_with("api/q", LockOptions { quorum: Some(quorum), ..LockOptions::default() }).await.unwrap_err();
        assert!(matches!(err, LockError::SwarmQuorum(_)), "{quorum:?}: {err:?}");
    }
    // More votes on the same replicas work.
    let g = h[0]
        .lock_with(
            "api/q",
            LockOptions { quorum: Some((5, 4)), timeout: Some(Duration::from_secs(5)), ..LockOptions::default() },
        )
        .await
        .unwrap();
    g.release().await.unwrap();
    // A timeout too far to represent means no timeout.
    let g =
        h[1].lock_with("api/q2", LockOptions { timeout: Some(Duration::MAX), ..LockOptions::default() }).await.unwrap();
    g.release().await.unwrap();
    assert!(h[0].status().await.unwrap().locks_held.is_empty());
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}

/// A stopping node tells its embedded holders first (`lost()` fires) and takes their
/// own releases during its release grace, before it releases what remains: a holder
/// gets to stop its work rather than find its lock given away under it. It used to
/// release at once and no longer take the holder's release (`NodeStopped`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_node_tells_its_holders_first_and_takes_their_releases() {
    let (mut nodes, h) = three().await;
    let guard = h[0].lock("api/stop").await.unwrap();
    let holder = tokio::spawn(async move {
        guard.lost().await;
        // The holder's work takes a moment to stop; then it lets go.
        tokio::time::sleep(Duration::from_millis(200)).await;
        guard.release().await
    });
    let node = nodes.remove(0);
    node.shutdown().await.unwrap();
    let released = holder.await.unwrap();
    assert_eq!(released, Err(LockError::Lost), "the node took the holder's own release (not NodeStopped)");
    let next = h[1].lock_timeout("api/stop", Duration::from_secs(10)).await.unwrap();
    next.release().await.unwrap();
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}
