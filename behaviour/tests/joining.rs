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
        let mut s = Swarm::new_ephemeral_tokio(|kp| Behaviour::new(kp.public().to_peer_id(), config(joining)));
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
            None if joined => ready_at = Some(tokio::time::Instant::now()),
            // Past kad's own bootstrap, which it starts 500 ms after a peer enters a
            // small table.
            Some(t) if t.elapsed() >= Duration::from_secs(3) => break,
            _ => {}
        }
    }
    let counters = swarms[joiner].behaviour().counters();
    println!(
        "joined a swarm of {SWARM}: connected to {} peers; bootstraps cut to their self-lookup: {}",
        dialled.len(),
        counters.bootstraps_cut
    );
    assert!(
        dialled.len() <= SWARM / 2,
        "the joining peer connected to {} of {SWARM} peers: more than its neighbourhood",
        dialled.len()
    );
}
