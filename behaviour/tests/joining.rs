//! What a peer pays to join: its Kademlia bootstrap is cut to the lookup of its own id.
//! Kademlia's bootstrap goes on to refresh every bucket farther than the closest peer (a
//! lookup per bucket, each asking about twenty peers, most of them not connected), and
//! kad starts one of its own when a peer enters a table of fewer than k peers: in a busy
//! swarm a joining peer dialled most of it. Ready after its self-lookup, it should have
//! asked about its neighbourhood, not the swarm.

use std::collections::HashSet;
use std::time::Duration;

use futures::future::select_all;
use futures::StreamExt;
use libp2p::swarm::{Swarm, SwarmEvent};
use libp2p::PeerId;
use libp2p_swarm_test::SwarmExt;
use sigma_behaviour::{Behaviour, Config, Readiness};

/// Peers already in the swarm.
const SWARM: usize = 80;

/// No gossip and no pings within the test's time: the joining peer's connections are
/// Kademlia's.
fn config(joining: bool) -> Config {
    Config::default()
        .with_ping(Duration::from_secs(60), Duration::from_secs(120))
        .with_gossip(Duration::from_secs(60), 2, Duration::from_secs(600))
        .with_joining(joining)
}

#[tokio::test]
async fn a_joining_peer_asks_its_neighbourhood_not_the_swarm() {
    let mut swarms: Vec<Swarm<Behaviour>> = Vec::new();
    let mut addrs = Vec::new();
    for i in 0..=SWARM {
        let joining = i == SWARM;
        let mut s = Swarm::new_ephemeral_tokio(|kp| Behaviour::new(&kp, config(joining)));
        let (addr, _) = s.listen().with_memory_addr_external().await;
        swarms.push(s);
        addrs.push(addr);
    }
    let peers: Vec<PeerId> = swarms.iter().map(|s| *s.local_peer_id()).collect();
    // The swarm's routing tables hold every peer (as many as their buckets take); the
    // joining peer knows one of them.
    for i in 0..SWARM {
        for j in (0..SWARM).filter(|&j| j != i) {
            swarms[i].behaviour_mut().add_address(&peers[j], addrs[j].clone());
        }
    }
    let joiner = SWARM;
    swarms[joiner].behaviour_mut().add_address(&peers[0], addrs[0].clone());
    let query = swarms[joiner].behaviour_mut().bootstrap().expect("a peer is known");

    let mut dialled: HashSet<PeerId> = HashSet::new();
    let mut ready_at: Option<tokio::time::Instant> = None;
    // Kademlia requests of bootstraps when the join's self-lookup had answered.
    let mut at_join = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let next = select_all(swarms.iter_mut().map(|s| s.next()));
        let Ok((event, i, _)) = tokio::time::timeout_at(deadline, next).await else {
            panic!("the joining peer was not ready within 30 s ({} peers dialled)", dialled.len());
        };
        if i == joiner {
            if let Some(SwarmEvent::ConnectionEstablished { peer_id, .. }) = event {
                dialled.insert(peer_id);
            }
        }
        let sigma = swarms[joiner].behaviour_mut();
        let joined = sigma.readiness() != Readiness::Joining && sigma.kad_mut().query(&query).is_none();
        match ready_at {
            None if joined => {
                ready_at = Some(tokio::time::Instant::now());
                at_join = bootstrap_requests(sigma);
            }
            // Past kad's own bootstrap, which it starts 500 ms after a peer enters a
            // small table.
            Some(t) if t.elapsed() >= Duration::from_secs(3) => break,
            _ => {}
        }
    }
    let after = bootstrap_requests(swarms[joiner].behaviour());
    let counters = swarms[joiner].behaviour().counters();
    println!(
        "joined a swarm of {SWARM}: connected to {} peers; bootstraps cut to their self-lookup: {}; \
         Kademlia requests of bootstraps: {at_join} by the join, {} after",
        dialled.len(),
        counters.bootstraps_cut,
        after - at_join
    );
    assert!(
        dialled.len() <= SWARM / 2,
        "the joining peer connected to {} of {SWARM} peers: more than its neighbourhood",
        dialled.len()
    );
    // kad's own bootstrap after the join is finished before it asks more than α peers.
    assert!(at_join > 0, "the join's self-lookup sent no request");
    assert!(
        after - at_join <= 3,
        "kad's own bootstrap after the join sent {} requests (the join's sent {at_join})",
        after - at_join
    );

    // Joined: a self-lookup runs once, and not again while the neighbourhood it found is
    // fresh (half the ownership TTL). A self-lookup some of whose requests failed (the
    // join's connections idle out about now: a request on a closing one fails) found
    // fewer than k peers and is not a neighbourhood: the next one runs (at most 5).
    let sigma = swarms[joiner].behaviour_mut();
    assert!(!sigma.has_neighbourhood(), "no self-lookup has run since the join");
    for attempt in 0.. {
        let sigma = swarms[joiner].behaviour_mut();
        let lookup = sigma.lookup_self().expect("peers are known").expect("no neighbourhood yet: a lookup starts");
        assert_eq!(sigma.lookup_self().expect("peers are known"), Some(lookup), "one self-lookup at a time");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while swarms[joiner].behaviour_mut().kad_mut().query(&lookup).is_some() {
            let next = select_all(swarms.iter_mut().map(|s| s.next()));
            assert!(tokio::time::timeout_at(deadline, next).await.is_ok(), "the self-lookup did not end within 30 s");
        }
        let sigma = swarms[joiner].behaviour();
        let incomplete = sigma.counters().self_lookups_incomplete;
        assert_eq!(
            sigma.has_neighbourhood(),
            incomplete == attempt,
            "a complete self-lookup's answer is the neighbourhood"
        );
        if sigma.has_neighbourhood() {
            println!("self-lookups until one found every peer it asked about: {}", attempt + 1);
            break;
        }
        assert!(attempt < 4, "5 self-lookups lost requests");
    }
    let sigma = swarms[joiner].behaviour_mut();
    assert_eq!(sigma.lookup_self().expect("peers are known"), None, "a fresh neighbourhood is not looked up again");
}

/// Kademlia requests sent by bootstraps (the join's and kad's own).
fn bootstrap_requests(sigma: &Behaviour) -> u64 {
    sigma.counters().kad_requests.get("bootstrap").copied().unwrap_or(0)
}
