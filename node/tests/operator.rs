//! An operator's tools on a small real swarm: inspecting a lock from any node (holder,
//! token, validity, waiters and their places in line, each replica), and revoking a
//! held lock from any node, which its holder obeys only from the peers it trusts.

mod common;

use std::time::Duration;

use sigma_node::sigma_behaviour::Admin;
use sigma_node::{Node, NodeConfig, NodeHandle, RevokeError};

const LEASE: Duration = Duration::from_secs(1);

/// A lock name none of whose `n` replica keys is closest to `handles[who]` among all the
/// handles' peers: that node hosts none of its replicas.
fn hosted_elsewhere(handles: &[NodeHandle], who: usize, n: u16) -> String {
    use sigma_node::libp2p::kad::KBucketKey;
    use sigma_node::sigma_behaviour::wire::replica_name;
    (0..1000)
        .map(|i| format!("ops/x{i}"))
        .find(|name| {
            (0..n).all(|index| {
                let key = KBucketKey::new(replica_name(name, index).into_bytes());
                let host = handles.iter().min_by_key(|h| KBucketKey::from(h.peer_id()).distance(&key)).unwrap();
                host.peer_id() != handles[who].peer_id()
            })
        })
        .expect("some name among 1,000")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_from_any_node_and_revoke_only_where_the_holder_allows() {
    common::init_tracing();
    let base = common::config(5, 3, LEASE);
    let nodes = common::swarm(3, &base).await;
    // A fourth node that takes revokes from any peer of the swarm.
    let open_config = NodeConfig {
        bootstrap: vec![common::dial_addr(&nodes[0])],
        behaviour: base.behaviour.clone().with_admin(Admin::Any),
        ..base.clone()
    };
    let open = Node::start(open_config).await.expect("node starts");
    let mut h: Vec<NodeHandle> = nodes.iter().map(Node::handle).collect();
    h.push(open.handle());
    common::wait_mesh(&h, 3).await;

    // Node 0 holds, node 1 waits; node 2, which hosts none of the lock's replicas,
    // inspects.
    let name = hosted_elsewhere(&h, 2, 5);
    let name = name.as_str();
    let held = h[0].lock(name).await.expect("lock");
    assert!(h[2].hosted_replicas(name).await.unwrap().is_empty(), "node 2 hosts none of {name}");
    let waiter = {
        let h1 = h[1].clone();
        let name = name.to_owned();
        tokio::spawn(async move { h1.lock(&name).await })
    };
    common::wait_for("the waiter to be queued at m replicas", Duration::from_secs(10), || async {
        let view = h[2].inspect(name).await.expect("inspect");
        view.waiters.first().is_some_and(|w| w.position.is_some())
    })
    .await;
    let view = h[2].inspect(name).await.expect("inspect");
    assert_eq!(view.answered, 5, "every replica host answers: {view:?}");
    let holder = view.holder.clone().expect("a holder");
    assert_eq!(holder.acquisition.peer, h[0].peer_id().to_string());
    assert!(holder.replicas >= 3, "{view:?}");
    assert_eq!(holder.token, Some(held.token()), "the holder's own token");
    assert!(holder.valid_for_ms.is_some_and(|v| v > 0 && v <= LEASE.as_millis() as u64 * 2), "{holder:?}");
    assert_eq!(view.waiters.len(), 1, "{view:?}");
    assert_eq!(view.waiters[0].acquisition.peer, h[1].peer_id().to_string());
    assert_eq!(view.waiters[0].position, Some(1));
    // The waiter sees its own place in line.
    let waits = h[1].status().await.unwrap().waiting;
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert_eq!((waits[0].name.as_str(), waits[0].position), (name, Some(1)), "{waits:?}");
    let text = view.render();
    assert!(text.contains(&format!("token {}", held.token())) && text.contains("position   1"), "{text}");

    // Node 0 takes no orders from other peers: the revoke is refused, the lock kept.
    match h[2].revoke(name, held.token()).await {
        Err(RevokeError::Refused { refused, .. }) => {
            assert!(refused.iter().any(|r| r.ends_with("not_allowed")), "{refused:?}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(!held.is_lost());
    // A wrong token revokes nothing, even on the holder's own node.
    assert!(matches!(h[0].revoke(name, held.token() + 1).await, Err(RevokeError::NotFound { .. })));
    assert!(!held.is_lost());

    // On its own node, the operator may: the holder learns it lost the lock, the waiter
    // gets it with a larger token.
    let done = h[0].revoke(name, held.token()).await.expect("revoked on the holder's node");
    assert_eq!(done.holder, h[0].peer_id().to_string());
    tokio::time::timeout(Duration::from_secs(5), held.lost()).await.expect("the holder is told");
    let next = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("the waiter wins").unwrap().unwrap();
    assert!(next.token() > held.token());
    next.release().await.unwrap();

    // A holder that takes orders from any peer obeys a revoke sent from another node.
    let theirs = h[3].lock("ops/y").await.expect("lock");
    assert!(matches!(h[1].revoke("ops/y", theirs.token() + 1).await, Err(RevokeError::NotFound { .. })));
    assert!(!theirs.is_lost());
    let done = h[1].revoke("ops/y", theirs.token()).await.expect("revoked from another node");
    assert_eq!(done.holder, h[3].peer_id().to_string());
    tokio::time::timeout(Duration::from_secs(5), theirs.lost()).await.expect("the holder is told");
    let after = h[1].try_lock("ops/y").await.unwrap().expect("free after the revoke");
    assert!(after.token() > theirs.token());
    let counters = h[3].counters().await.unwrap().counters;
    assert_eq!(counters.revoked, 1);
    after.release().await.unwrap();

    // Bad names are refused before anything is sent.
    assert!(h[2].inspect("bad name").await.is_err());
    assert!(matches!(h[2].revoke("bad name", 1).await, Err(RevokeError::Lock(_))));
    for n in nodes {
        n.shutdown().await.unwrap();
    }
    open.shutdown().await.unwrap();
}
