//! A dial refused by this peer's own connection limit says nothing of the host: the
//! client keeps the host and retries, and does not look it up as if it were gone. In a
//! swarm far larger than the limit, treating the refusal as a dead host dropped the true
//! host from the client's view, sent the retry to a farther peer (which redirected it
//! back) and started a Kademlia lookup (more dials at the limit): a 300-peer in-process
//! swarm followed 15,461 redirects and 5,717 host lookups for 48 critical sections.

use std::time::Duration;

use futures::future::select_all;
use futures::StreamExt;
use libp2p::connection_limits::{self, ConnectionLimits};
use libp2p::kad::KBucketKey;
use libp2p::swarm::{NetworkBehaviour, Swarm, SwarmEvent};
use libp2p::PeerId;
use libp2p_swarm_test::SwarmExt;
use sigma_behaviour::proto;
use sigma_behaviour::{wire, Behaviour, Config, Event};

#[derive(NetworkBehaviour)]
struct Peer {
    // First: a denied connection must not reach the other behaviour.
    limits: connection_limits::Behaviour,
    sigma: Behaviour,
}

/// n = 1 (the host decides alone), retries every 300 ms, no takeover delay.
fn config() -> Config {
    Config::default()
        .with_protocol(
            proto::Config::default()
                .with_quorum(1, 1)
                .with_lease(Duration::from_secs(5))
                .with_request_timeout(Duration::from_millis(300)),
        )
        .with_takeover_delay(Some(Duration::ZERO))
}

fn peer(max_established: Option<u32>) -> Swarm<Peer> {
    Swarm::new_ephemeral_tokio(|kp| Peer {
        limits: connection_limits::Behaviour::new(ConnectionLimits::default().with_max_established(max_established)),
        sigma: Behaviour::new(&kp, config()),
    })
}

/// A lock whose one replica key is closest to `host` among `peers`.
fn lock_hosted_by(host: PeerId, peers: &[PeerId]) -> String {
    (0..)
        .map(|i| format!("lock-{i}"))
        .find(|name| {
            let key = KBucketKey::new(wire::replica_name(name, 0).into_bytes());
            let d = |p: &PeerId| KBucketKey::from(*p).distance(&key);
            peers.iter().all(|p| *p == host || d(&host) < d(p))
        })
        .expect("some name")
}

#[tokio::test]
async fn a_dial_denied_by_the_local_limit_keeps_the_host_and_retries() {
    // The client may hold one connection; it holds one to another peer.
    let mut client = peer(Some(1));
    let mut other = peer(None);
    let mut host = peer(None);
    let (host_addr, _) = host.listen().with_memory_addr_external().await;
    other.listen().with_memory_addr_external().await;
    client.connect(&mut other).await;

    let ids = [*client.local_peer_id(), *other.local_peer_id(), *host.local_peer_id()];
    let name = lock_hosted_by(ids[2], &ids);
    client.behaviour_mut().sigma.add_address(&ids[2], host_addr);
    let id = client.behaviour_mut().sigma.acquire(&name, None).expect("acquire");

    let mut swarms = [client, other, host];
    let mut freed = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let next = select_all(swarms.iter_mut().map(|s| s.next()));
        let Ok((event, i, _)) = tokio::time::timeout_at(deadline, next).await else {
            panic!("not acquired within 20 s: {:?}", swarms[0].behaviour().sigma.counters().outbound_failures);
        };
        if i == 0 {
            match event {
                Some(SwarmEvent::Behaviour(PeerEvent::Sigma(Event::Acquired { id: got, .. }))) if got == id => break,
                Some(SwarmEvent::OutgoingConnectionError { .. }) if !freed => {
                    // Denied: the slot frees (the other peer goes away), and the
                    // client's own retry must reach the host.
                    freed = true;
                    let other = *swarms[1].local_peer_id();
                    let _ = swarms[0].disconnect_peer_id(other);
                }
                _ => {}
            }
        }
    }
    let counters = swarms[0].behaviour().sigma.counters();
    println!("client: failures {:?}, host lookups {}", counters.outbound_failures, counters.lookups);
    assert!(freed, "the client's dial to the host was never denied: the test did not test the limit");
    assert_eq!(counters.outbound_failures.get("dial_failure"), None, "a denied dial counted as an unreachable host");
    assert_eq!(counters.lookups, 0, "the client looked the host up after its own limit denied the dial");
}
