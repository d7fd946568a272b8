//! Peers on real networks, as far as loopback can show: a node whose bootstrap peer is
//! named by DNS (a global-scope address) does not take its loopback listen address for
//! an external one, so it hosts nothing, no peer counts it, and its locks are served by
//! the others; given `--external-address`, the same node hosts.

use std::time::Duration;

use sigma_node::libp2p::multiaddr::Protocol;
use sigma_node::libp2p::Multiaddr;
use sigma_node::{Node, NodeConfig};

mod common;
mod port;

/// `node`'s TCP port on 127.0.0.1 as `/dns4/localhost/tcp/PORT/p2p/ID`.
fn dns_addr(node: &Node) -> Multiaddr {
    let port = node
        .listen_addrs()
        .first()
        .and_then(|a| a.iter().find_map(|p| if let Protocol::Tcp(port) = p { Some(port) } else { None }))
        .expect("a TCP listen address");
    format!("/dns4/localhost/tcp/{port}/p2p/{}", node.peer_id()).parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_no_peer_can_dial_hosts_nothing_and_its_locks_are_served_by_the_others() {
    common::init_tracing();
    let base = common::config(8, 5, Duration::from_secs(2));
    let nodes = common::swarm(2, &base).await;
    // Joins through a DNS name: its swarm's scope is global, its listen address only
    // loopback: no external address.
    let hidden = Node::start(NodeConfig { bootstrap: vec![dns_addr(&nodes[0])], ..base.clone() }).await.unwrap();
    let h = hidden.handle();
    common::wait_for("the DNS-bootstrapped node to join", Duration::from_secs(20), || async {
        h.status().await.is_ok_and(|s| s.readiness == "unreachable" && s.routable_peers >= 2)
    })
    .await;
    let status = h.status().await.unwrap();
    assert!(status.external_addrs.is_empty(), "{:?}", status.external_addrs);
    for n in &nodes {
        let s = n.handle().status().await.unwrap();
        assert_eq!(s.external_addrs.len(), 1, "a loopback node's own listen address: {:?}", s.external_addrs);
    }

    let guard = tokio::time::timeout(Duration::from_secs(20), h.lock("reports/7")).await.expect("in time").unwrap();
    assert_eq!(h.status().await.unwrap().replicas_hosted, 0, "the unreachable node hosts nothing");
    let mut hosted = 0;
    for n in &nodes {
        let s = n.handle().status().await.unwrap();
        assert_eq!(s.members, 2, "nobody counts the unreachable node: {} members", s.members);
        hosted += s.replicas_hosted;
    }
    assert_eq!(hosted, 8, "the two others host all 8 replicas");
    guard.release().await.unwrap();

    // A node joining the same way, told the address it can be dialled at: it hosts,
    // and the others count it.
    hidden.shutdown().await.expect("clean shutdown");
    let port = port::port_outside_ephemeral_range();
    let addr: Multiaddr = format!("/ip4/127.0.0.1/tcp/{port}").parse().unwrap();
    let told = Node::start(NodeConfig {
        bootstrap: vec![dns_addr(&nodes[0])],
        listen: vec![addr.clone()],
        external_addresses: vec![addr.clone()],
        ..base.clone()
    })
    .await
    .unwrap();
    let t = told.handle();
    common::wait_for("the told node to serve", Duration::from_secs(20), || async {
        t.status().await.is_ok_and(|s| s.readiness == "serving")
    })
    .await;
    assert_eq!(t.status().await.unwrap().external_addrs, vec![addr]);
    let n0 = nodes[0].handle();
    common::wait_for("the others to count it", Duration::from_secs(20), || async {
        n0.status().await.is_ok_and(|s| s.members == 3)
    })
    .await;
}
