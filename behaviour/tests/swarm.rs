//! `sigma::Behaviour` on in-memory swarms (libp2p-swarm-test): replicas placed in the
//! DHT, locks granted one holder at a time, bad input refused and counted.

use std::time::Duration;

use futures::future::select_all;
use futures::StreamExt;
use libp2p::kad::KBucketKey;
use libp2p::request_response::{self, ProtocolSupport};
use libp2p::swarm::{Swarm, SwarmEvent};
use libp2p::PeerId;
use libp2p_swarm_test::SwarmExt;
use sigma_behaviour::proto::{self, Timestamp, ToReplica};
use sigma_behaviour::wire::{self, Rejection, Reply, Request};
use sigma_behaviour::{Behaviour, Config, Event};

fn config() -> Config {
    Config::default().with_protocol(proto::Config::default().with_quorum(5, 3).with_lease(Duration::from_secs(5)))
}

async fn swarms(count: usize) -> Vec<Swarm<Behaviour>> {
    let mut swarms: Vec<Swarm<Behaviour>> = Vec::new();
    for _ in 0..count {
        let mut s = Swarm::new_ephemeral_tokio(|kp| Behaviour::new(kp.public().to_peer_id(), config()));
        s.listen().with_memory_addr_external().await;
        swarms.push(s);
    }
    for i in 0..count {
        for j in 0..i {
            let (a, b) = swarms.split_at_mut(i);
            b[0].connect(&mut a[j]).await;
        }
    }
    // Let every peer learn every other peer's address (kad routing tables).
    let addrs: Vec<(PeerId, Vec<libp2p::Multiaddr>)> =
        swarms.iter().map(|s| (*s.local_peer_id(), s.external_addresses().cloned().collect())).collect();
    for s in swarms.iter_mut() {
        for (p, a) in &addrs {
            for addr in a {
                s.behaviour_mut().add_address(p, addr.clone());
            }
        }
    }
    swarms
}

/// Drives every swarm until one emits a behaviour event; returns (swarm index, event).
async fn next_event(swarms: &mut [Swarm<Behaviour>]) -> (usize, Event) {
    loop {
        let futs = swarms.iter_mut().map(|s| Box::pin(s.select_next_some()));
        let (event, index, _) = select_all(futs).await;
        if let SwarmEvent::Behaviour(e) = event {
            return (index, e);
        }
    }
}

async fn with_timeout<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f).await.expect("timed out waiting for the swarm")
}

#[tokio::test]
async fn one_holder_at_a_time_and_handoff_on_release() {
    let mut s = swarms(3).await;
    let a = s[0].behaviour_mut().acquire("orders/42", None).expect("valid");
    let b = s[1].behaviour_mut().acquire("orders/42", None).expect("valid");
    let (first, event) = with_timeout(next_event(&mut s)).await;
    let Event::Acquired { id, token: first_token, votes, distinct_peers, .. } = event else {
        panic!("expected Acquired, got {event:?}")
    };
    assert!(votes >= 3, "won with {votes} votes");
    assert!((1..=3).contains(&distinct_peers), "{distinct_peers} distinct peers");
    let (winner, loser, loser_id) = if first == 0 { (0, 1, b) } else { (1, 0, a) };
    assert_eq!(id, if first == 0 { a } else { b });
    s[winner].behaviour_mut().release(id);
    let (second, event) = with_timeout(next_event(&mut s)).await;
    assert_eq!(second, loser, "the waiter must win next, got {event:?}");
    let Event::Acquired { id, token, .. } = event else { panic!("expected Acquired, got {event:?}") };
    assert_eq!(id, loser_id);
    assert!(token > first_token, "fencing token went from {first_token} to {token}");
    let _ = winner;
}

#[tokio::test]
async fn bad_input_is_refused_counted_and_harmless() {
    let mut s = swarms(2).await;
    let mut probe = Swarm::new_ephemeral_tokio(|_| {
        request_response::cbor::Behaviour::<Request, Reply>::new(
            [(wire::PROTOCOL, ProtocolSupport::Full)],
            request_response::Config::default(),
        )
    });
    probe.connect(&mut s[0]).await;
    let target = *s[0].local_peer_id();
    let me = *probe.local_peer_id();
    let someone = PeerId::random();
    // A lock name whose replica 0 this node hosts (closest of the three peers), so the
    // stateful checks are reached instead of a redirect.
    let peers = [target, *s[1].local_peer_id(), me];
    let owned = (0..)
        .map(|k| format!("ok-{k}"))
        .find(|name| {
            let key = KBucketKey::new(wire::replica_name(name, 0).into_bytes());
            let d = |p: &PeerId| KBucketKey::from(*p).distance(&key);
            peers.iter().min_by_key(|p| d(p)) == Some(&target)
        })
        .expect("some name lands on the target");
    let cases = vec![
        (Request::Replica { resource: "bad name!".into(), index: 0, n: 5, msg: request(me) }, Rejection::BadResource),
        (Request::Replica { resource: owned.clone(), index: 7, n: 5, msg: request(me) }, Rejection::BadIndex),
        (Request::Replica { resource: owned.clone(), index: 0, n: 0, msg: request(me) }, Rejection::BadIndex),
        (
            Request::Replica { resource: owned.clone(), index: 0, n: 5, msg: request(someone) },
            Rejection::ForeignAcquisition,
        ),
        (
            Request::Replica {
                resource: owned.clone(),
                index: 0,
                n: 5,
                msg: ToReplica::Release { ts: Timestamp::new(1, me), token: 0 },
            },
            Rejection::NotHolder,
        ),
    ];
    for (request, expected) in cases {
        probe.behaviour_mut().send_request(&target, request.clone());
        let reply = with_timeout(async {
            loop {
                let (s0, s1) = s.split_at_mut(1);
                tokio::select! {
                    e = probe.select_next_some() => {
                        if let SwarmEvent::Behaviour(request_response::Event::Message {
                            message: request_response::Message::Response { response, .. }, ..
                        }) = e {
                            break response;
                        }
                    }
                    _ = s0[0].select_next_some() => {}
                    _ = s1[0].select_next_some() => {}
                }
            }
        })
        .await;
        match reply {
            Reply::Rejected(r) => assert_eq!(r, expected, "for {request:?}"),
            other => panic!("for {request:?}: expected Rejected({expected:?}), got {other:?}"),
        }
    }
    let c = s[0].behaviour().counters();
    let total: u64 = c.rejected.values().sum();
    assert_eq!(total, 5, "rejections counted: {:?}", c.rejected);
    // The node still serves everyone else.
    let id = s[1].behaviour_mut().acquire("after-bad-input", None).expect("valid");
    let (who, event) = with_timeout(next_event(&mut s)).await;
    assert_eq!(who, 1);
    assert!(matches!(event, Event::Acquired { id: got, .. } if got == id), "{event:?}");
}

fn request(client: PeerId) -> ToReplica<PeerId> {
    ToReplica::Request { ts: Timestamp::new(1, client), sent: 1, floor: 0 }
}

// Reference: §2 system model, DESIGN "Replicas in the DHT": replica i of R lives on the
// XOR-closest peer to key("R:i"), and on no other.
#[tokio::test]
async fn each_replica_lives_on_the_closest_peer_only() {
    let mut s = swarms(5).await;
    let peers: Vec<PeerId> = s.iter().map(|x| *x.local_peer_id()).collect();
    for (k, name) in ["alpha", "beta/1", "gamma.2"].iter().enumerate() {
        let id = s[k].behaviour_mut().acquire(name, None).expect("valid");
        let (who, event) = with_timeout(next_event(&mut s)).await;
        assert_eq!(who, k, "{event:?}");
        s[k].behaviour_mut().release(id);
    }
    // Let the releases land.
    for _ in 0..50 {
        let futs = s.iter_mut().map(|x| Box::pin(x.select_next_some()));
        let _ = tokio::time::timeout(Duration::from_millis(20), select_all(futs)).await;
    }
    for name in ["alpha", "beta/1", "gamma.2"] {
        for index in 0..5u16 {
            let hosts: Vec<PeerId> = s
                .iter()
                .filter(|x| x.behaviour().replicas(Some(name)).iter().any(|r| r.index == index))
                .map(|x| *x.local_peer_id())
                .collect();
            let key = KBucketKey::new(wire::replica_name(name, index).into_bytes());
            let closest = peers.iter().min_by_key(|p| KBucketKey::from(**p).distance(&key)).copied();
            assert_eq!(hosts, closest.into_iter().collect::<Vec<_>>(), "replica {name}:{index}");
        }
    }
}
