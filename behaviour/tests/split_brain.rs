//! The split-brain rules on in-memory swarms: a joining peer grants nothing, an isolated
//! peer cannot win and its holder loses the lock before anyone else wins it, a
//! partition serves on the majority side only and heals. Traffic is really cut: every
//! swarm carries libp2p's block list, and a cut blocks both ends.
//!
//! Every test checks exclusion on every event: a lock is won only while no other
//! acquisition counts itself its holder.

use std::collections::HashMap;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::select_all;
use futures::StreamExt;
use libp2p::allow_block_list::{self, BlockedPeers};
use libp2p::core::transport::PortUse;
use libp2p::core::Endpoint;
use libp2p::kad::KBucketKey;
use libp2p::swarm::{
    dummy, ConnectionDenied, ConnectionId, FromSwarm, NetworkBehaviour, Swarm, SwarmEvent, THandler, THandlerInEvent,
    THandlerOutEvent, ToSwarm,
};
use libp2p::{request_response, Multiaddr, PeerId};
use libp2p_swarm_test::SwarmExt;
use sigma_behaviour::proto::{self, LostReason};
use sigma_behaviour::wire;
use sigma_behaviour::{AcquisitionId, Behaviour, Config, Event, Readiness};

#[derive(NetworkBehaviour)]
struct Peer {
    // First: a denied connection must not reach the other behaviours.
    block: allow_block_list::Behaviour<BlockedPeers>,
    sigma: Behaviour,
    dials: FailedDials,
    /// Sends gossip tables of the test's making (outbound only: a peer's own gossip
    /// still answers inbound tables).
    forge: request_response::cbor::Behaviour<wire::Gossip, wire::Gossip>,
}

/// Counts the dials that failed (a dial the block list refuses fails at once, and a
/// swarm reports a behaviour's failed dial only to its behaviours).
#[derive(Default)]
struct FailedDials(usize);

impl NetworkBehaviour for FailedDials {
    type ConnectionHandler = dummy::ConnectionHandler;
    type ToSwarm = std::convert::Infallible;

    fn handle_established_inbound_connection(
        &mut self,
        _: ConnectionId,
        _: PeerId,
        _: &Multiaddr,
        _: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(dummy::ConnectionHandler)
    }

    fn handle_established_outbound_connection(
        &mut self,
        _: ConnectionId,
        _: PeerId,
        _: &Multiaddr,
        _: Endpoint,
        _: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(dummy::ConnectionHandler)
    }

    fn on_swarm_event(&mut self, event: FromSwarm) {
        if let FromSwarm::DialFailure(_) = event {
            self.0 += 1;
        }
    }

    fn on_connection_handler_event(&mut self, _: PeerId, _: ConnectionId, e: THandlerOutEvent<Self>) {
        match e {}
    }

    fn poll(&mut self, _: &mut Context<'_>) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        Poll::Pending
    }
}

const LEASE: Duration = Duration::from_secs(2);
/// The liveness timeout of [`config`]: gossip liveness 1 s + 1 s of housekeeping
/// (pings notice within 0.7 s), and a little slack for the driver.
const LIVENESS: Duration = Duration::from_millis(2500);

/// n = 5, m = 3, 2 s leases, fast liveness pings and gossip (100 ms rounds, 1 s
/// liveness); the default takeover delay (lease + drift + liveness (1 s + 1 s) + 1 s
/// ≈ 5 s).
fn config(joining: bool) -> Config {
    Config::default()
        .with_protocol(proto::Config::default().with_quorum(5, 3).with_lease(LEASE).with_request_timeout(LEASE / 4))
        .with_ping(Duration::from_millis(200), Duration::from_millis(500))
        .with_gossip(Duration::from_millis(100), 2, Duration::from_secs(1))
        .with_joining(joining)
}

struct Net {
    swarms: Vec<Swarm<Peer>>,
    addrs: Vec<Multiaddr>,
    /// Holder of each lock: (swarm, acquisition).
    holders: HashMap<String, (usize, AcquisitionId)>,
    /// Names of the acquisitions, to tell whose Lost it is.
    names: HashMap<(usize, AcquisitionId), String>,
}

impl Net {
    async fn new(count: usize, joining: bool) -> Net {
        let mut net = Net { swarms: Vec::new(), addrs: Vec::new(), holders: HashMap::new(), names: HashMap::new() };
        for _ in 0..count {
            net.spawn(joining).await;
        }
        net
    }

    /// `count` peers meshed and past their start delay: a warm-up lock won and
    /// released through peer 1, so the swarm serves at once.
    async fn serving(count: usize) -> Net {
        let mut net = Net::new(count, false).await;
        let all: Vec<usize> = (0..count).collect();
        net.mesh(&all).await;
        let warm = net.acquire(1, "warm-up");
        net.drive(Duration::from_secs(30), won(1, warm)).await;
        net.release(1, warm);
        net
    }

    /// Starts one more peer (`joining`: given bootstrap peers); answers its index.
    async fn spawn(&mut self, joining: bool) -> usize {
        self.spawn_with(config(joining)).await
    }

    /// Starts one more peer with `config`; answers its index.
    async fn spawn_with(&mut self, config: Config) -> usize {
        let mut s = Swarm::new_ephemeral_tokio(|kp| Peer {
            block: allow_block_list::Behaviour::default(),
            sigma: Behaviour::new(&kp, config),
            dials: FailedDials::default(),
            forge: request_response::cbor::Behaviour::new(
                [(wire::GOSSIP_PROTOCOL, request_response::ProtocolSupport::Outbound)],
                request_response::Config::default(),
            ),
        });
        let (addr, _) = s.listen().with_memory_addr_external().await;
        self.swarms.push(s);
        self.addrs.push(addr);
        self.swarms.len() - 1
    }

    fn dump(&self, name: &str, acqs: &[(usize, AcquisitionId)]) {
        for i in 0..self.swarms.len() {
            eprintln!("peer {i} = {}", self.peer(i));
        }
        for (i, a) in acqs {
            eprintln!("acq {i} {a:?}: {:?}", self.swarms[*i].behaviour().sigma.acquisition(*a));
        }
        for i in 0..self.swarms.len() {
            let b = &self.swarms[i].behaviour().sigma;
            eprintln!("peer {i}: {:?} members {:?} acqs {:?}", b.readiness(), b.members(), b.acquisitions());
            for r in b.replicas(Some(name)) {
                eprintln!("   {r:?}");
            }
            eprintln!("   counters {:?}", b.counters());
        }
    }

    fn peer(&self, i: usize) -> PeerId {
        *self.swarms[i].local_peer_id()
    }

    /// Connects every pair of `group` and tells each of the others' addresses.
    async fn mesh(&mut self, group: &[usize]) {
        for &i in group {
            for &j in group {
                if i < j {
                    let (a, b) = self.swarms.split_at_mut(j);
                    b[0].connect(&mut a[i]).await;
                }
            }
        }
        for &i in group {
            for &j in group {
                if i != j {
                    let (p, a) = (self.peer(j), self.addrs[j].clone());
                    self.swarms[i].behaviour_mut().sigma.add_address(&p, a);
                }
            }
        }
    }

    /// Drives until `done` holds; answers how long that took, none if it still does not
    /// after `within`.
    async fn until(&mut self, within: Duration, done: impl Fn(&Net) -> bool) -> Option<Duration> {
        let (start, step) = (tokio::time::Instant::now(), Duration::from_millis(20));
        while !done(self) {
            if start.elapsed() > within {
                return None;
            }
            self.drive(step, |_, _, _| false).await;
        }
        Some(start.elapsed())
    }

    /// Cuts all traffic between `a` and `b` (both ends block).
    /// Drives until none of `peers` serves; false if one still does after `within`.
    async fn stops_serving(&mut self, peers: &[usize], within: Duration) -> bool {
        let step = Duration::from_millis(100);
        for _ in 0..=within.as_millis() / step.as_millis() {
            if peers.iter().all(|&i| self.swarms[i].behaviour().sigma.readiness() != Readiness::Serving) {
                return true;
            }
            self.drive(step, |_, _, _| false).await;
        }
        false
    }

    fn cut(&mut self, a: &[usize], b: &[usize]) {
        for &i in a {
            for &j in b {
                let (pi, pj) = (self.peer(i), self.peer(j));
                self.swarms[i].behaviour_mut().block.block_peer(pj);
                self.swarms[j].behaviour_mut().block.block_peer(pi);
            }
        }
    }

    fn heal(&mut self) {
        for i in 0..self.swarms.len() {
            for j in 0..self.swarms.len() {
                let pj = self.peer(j);
                self.swarms[i].behaviour_mut().block.unblock_peer(pj);
            }
        }
    }

    fn acquire(&mut self, i: usize, name: &str) -> AcquisitionId {
        let id = self.swarms[i].behaviour_mut().sigma.acquire(name, None).expect("valid");
        self.names.insert((i, id), name.to_owned());
        id
    }

    fn release(&mut self, i: usize, id: AcquisitionId) {
        self.swarms[i].behaviour_mut().sigma.release(id);
        let name = &self.names[&(i, id)];
        if self.holders.get(name) == Some(&(i, id)) {
            self.holders.remove(name);
        }
    }

    /// Drives every swarm until `stop` says so or `limit` passes; checks exclusion on
    /// every event. Returns the events seen.
    async fn drive(
        &mut self,
        limit: Duration,
        mut stop: impl FnMut(&Net, usize, &Event) -> bool,
    ) -> Vec<(usize, Event)> {
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let futs = self.swarms.iter_mut().map(|s| Box::pin(s.select_next_some()));
            let next = tokio::time::timeout_at(deadline, select_all(futs)).await;
            let Ok((SwarmEvent::Behaviour(PeerEvent::Sigma(event)), i, _)) = next else {
                if next.is_err() {
                    return seen;
                }
                continue;
            };
            match &event {
                Event::Acquired { id, resource, .. } => {
                    if let Some(other) = self.holders.get(resource) {
                        panic!("two holders of {resource}: {other:?} and ({i}, {id:?})");
                    }
                    self.holders.insert(resource.clone(), (i, *id));
                }
                Event::Lost { id, .. } | Event::Revoked { id, .. } => {
                    let name = &self.names[&(i, *id)];
                    if self.holders.get(name) == Some(&(i, *id)) {
                        self.holders.remove(name);
                    }
                }
                Event::Probed { .. } | Event::Inspected { .. } | Event::Answered { .. } => {}
            }
            let done = stop(self, i, &event);
            seen.push((i, event));
            if done {
                return seen;
            }
        }
    }
}

fn won(i: usize, id: AcquisitionId) -> impl FnMut(&Net, usize, &Event) -> bool {
    move |_, j, e| j == i && matches!(e, Event::Acquired { id: got, .. } if *got == id)
}

/// A peer given bootstrap peers hosts nothing and wins nothing until it has joined; the
/// same peer once joined (through peers that serve) wins.
///
/// Every peer grants nothing for one takeover delay after it starts serving, so the
/// joining peer is watched past the point where it would have granted had it served:
/// with a short delay, until a lone serving peer started after the joining peer's
/// request, with twice that delay, has won a lock of its own.
#[tokio::test]
async fn a_joining_peer_grants_nothing_until_it_has_joined() {
    let delay = Duration::from_millis(500);
    let mut net = Net::new(0, false).await;
    net.spawn_with(config(true).with_takeover_delay(Some(delay))).await;
    let id = net.acquire(0, "joining");
    assert_eq!(net.swarms[0].behaviour().sigma.readiness(), Readiness::Joining);
    for _ in 0..2 {
        net.spawn_with(config(false).with_takeover_delay(Some(2 * delay))).await;
    }
    let control = net.acquire(1, "control");
    let seen = net.drive(Duration::from_secs(30), won(1, control)).await;
    assert!(net.holders.get("control") == Some(&(1, control)), "a lone serving peer wins: {seen:?}");
    assert!(seen.iter().all(|(i, _)| *i != 0), "a joining peer must not win: {seen:?}");
    assert_eq!(net.swarms[0].behaviour().sigma.readiness(), Readiness::Joining);
    assert_eq!(net.swarms[0].behaviour().sigma.acquisition(id).map(|a| a.votes), Some(0));
    assert_eq!(net.swarms[0].behaviour().sigma.replica_totals().hosted, 0, "a joining peer hosts nothing");
    net.release(1, control);
    net.mesh(&[0, 1, 2]).await;
    for i in 0..3 {
        net.swarms[i].behaviour_mut().sigma.kad_mut().bootstrap().expect("peers known");
    }
    net.drive(Duration::from_secs(30), won(0, id)).await;
    assert!(net.holders.contains_key("joining"), "the joined peer wins");
    for i in 0..3 {
        assert_eq!(net.swarms[i].behaviour().sigma.readiness(), Readiness::Serving, "peer {i}");
    }
}

/// The scenario of the split-brain issue on one machine: a peer cut off from its swarm
/// grants nothing to itself, and the holder it had loses the lock before the swarm
/// grants it again.
#[tokio::test]
async fn an_isolated_peer_cannot_win_and_its_holder_is_lost_before_the_next_grant() {
    let mut net = Net::new(3, false).await;
    net.mesh(&[0, 1, 2]).await;
    let held = net.acquire(0, "orders");
    net.drive(Duration::from_secs(30), won(0, held)).await;
    assert!(net.holders.contains_key("orders"), "peer 0 holds the lock");
    net.cut(&[0], &[1, 2]);
    let solo = net.acquire(0, "solo");
    let next = net.acquire(1, "orders");
    // Peer 1 wins "orders" only after peer 0 has counted itself Lost (the driver panics
    // on two holders); "solo" is never won by the island.
    let seen = net.drive(Duration::from_secs(30), won(1, next)).await;
    if net.holders.get("orders") != Some(&(1, next)) {
        net.dump("orders", &[(0, held), (1, next)]);
    }
    assert!(net.holders.get("orders") == Some(&(1, next)), "the swarm serves the lock again: {seen:?}");
    assert!(
        seen.iter()
            .any(|(i, e)| *i == 0 && matches!(e, Event::Lost { id, reason: LostReason::LeaseExpired } if *id == held)),
        "the isolated holder lost the lock: {seen:?}"
    );
    assert!(!net.holders.contains_key("solo"), "an isolated peer won a lock alone");
    assert!(matches!(net.swarms[0].behaviour().sigma.readiness(), Readiness::Minority { reachable: 1, members: 3 }));
    assert_eq!(net.swarms[0].behaviour().sigma.replica_totals().hosted, 0, "the island hosts nothing");
    // Healed: the island's waiter is served.
    net.heal();
    net.mesh(&[0, 1, 2]).await;
    net.drive(Duration::from_secs(30), won(0, solo)).await;
    assert!(net.holders.get("solo") == Some(&(0, solo)));
}

/// The host of each of the lock's n = 5 keys among `peers`: the closest by XOR distance.
fn hosts(net: &Net, name: &str, peers: &[usize]) -> Vec<usize> {
    (0..5u16)
        .map(|i| {
            let key = KBucketKey::new(wire::replica_name(name, i).into_bytes());
            *peers.iter().min_by_key(|&&j| KBucketKey::from(net.peer(j)).distance(&key)).expect("peers")
        })
        .collect()
}

/// Quorum diversity must not outlive the hosts that could meet it: a waiter's D = 2 was
/// set while three peers hosted the lock's keys; once the holder's peer is cut off, every
/// key falls on one survivor. The survivor's votes alone must then win (the majority
/// rule and the takeover delay still stand), not wait for the departed member to return.
#[tokio::test]
async fn a_lock_left_on_one_survivor_is_served_after_its_holder_is_cut_off() {
    let mut net = Net::new(3, false).await;
    // Roles and a name: keys spread over the three peers, all on `host` without `gone`.
    // (Whatever the ids, some order of roles has such names.)
    let roles = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];
    let (name, [gone, waiter, host]) = (0..2_000)
        .flat_map(|k| roles.iter().map(move |r| (format!("orders-{k}"), *r)))
        .find(|(name, [_, waiter, host])| {
            let all = hosts(&net, name, &[0, 1, 2]);
            all.iter().any(|h| h != &all[0]) && hosts(&net, name, &[*waiter, *host]).iter().all(|h| h == host)
        })
        .expect("such a name among 2,000");
    net.mesh(&[0, 1, 2]).await;
    let held = net.acquire(gone, &name);
    net.drive(Duration::from_secs(30), won(gone, held)).await;
    assert!(net.holders.contains_key(&name), "peer {gone} holds {name}");
    let next = net.acquire(waiter, &name);
    net.drive(Duration::from_millis(500), |_, _, _| false).await;
    let others: Vec<usize> = (0..3).filter(|&i| i != gone).collect();
    net.cut(&[gone], &others);
    let seen = net.drive(Duration::from_secs(30), won(waiter, next)).await;
    assert!(net.holders.get(&name) == Some(&(waiter, next)), "the votes of peer {host} serve {name}: {seen:?}");
}

/// A 2/3 partition: the majority side serves (after the takeover delay), the minority
/// side grants nothing once it has noticed; once healed the minority's waiter is served.
///
/// The minority's waiter asks only after the minority has stopped serving: in the
/// liveness window right after the cut, two minority peers that host m of the n
/// replicas can still grant (two distinct voters), and that holder is Lost at its
/// lease's end, before the majority's takeover delay ends (the exclusion check on every
/// event covers it). A Lost acquisition is finished and never served again.
#[tokio::test]
async fn a_partition_serves_on_the_majority_side_only_and_heals() {
    let mut net = Net::new(5, false).await;
    net.mesh(&[0, 1, 2, 3, 4]).await;
    // Past the start delay: a lock is granted at once in a stable swarm.
    let warm = net.acquire(2, "warm-up");
    net.drive(Duration::from_secs(30), won(2, warm)).await;
    net.release(2, warm);
    net.cut(&[0, 1], &[2, 3, 4]);
    let majority = net.acquire(3, "p");
    // The minority notices within the liveness timeout (its members' heartbeats stale).
    assert!(net.stops_serving(&[0, 1], LIVENESS).await, "the minority still serves after {LIVENESS:?}");
    for i in [0, 1] {
        let r = net.swarms[i].behaviour().sigma.readiness();
        assert!(matches!(r, Readiness::Minority { reachable: 2, members: 5 }), "peer {i}: {r:?}");
    }
    let minority = net.acquire(0, "p");
    net.drive(Duration::from_secs(30), won(3, majority)).await;
    assert!(net.holders.get("p") == Some(&(3, majority)), "the majority side serves");
    let waiting = net.swarms[0].behaviour().sigma.acquisition(minority).map(|a| a.phase);
    assert_eq!(waiting, Some(proto::Phase::Waiting), "the minority's waiter waits");
    net.release(3, majority);
    net.heal();
    net.mesh(&[0, 1, 2, 3, 4]).await;
    net.drive(Duration::from_secs(30), won(0, minority)).await;
    assert!(net.holders.get("p") == Some(&(0, minority)), "the minority's waiter is served after the heal");
}

/// Membership gossip: a peer that lost its connections to most members (closed as idle,
/// or refused by a connection limit) still sees them alive through a peer that reaches
/// them, and keeps serving; cut off from everyone, it sees their heartbeats go stale
/// and stops within the gossip liveness window.
#[tokio::test]
async fn members_alive_through_gossip_count_and_a_cut_off_peer_still_stops() {
    let mut net = Net::serving(5).await;
    // Peer 0 keeps only peer 1: it refuses 2, 3 and 4 (they still reach each other).
    for j in [2, 3, 4] {
        let p = net.peer(j);
        net.swarms[0].behaviour_mut().block.block_peer(p);
    }
    let locked = net.acquire(1, "through-gossip");
    net.drive(Duration::from_secs(30), won(1, locked)).await;
    net.drive(Duration::from_secs(3), |_, _, _| false).await;
    let r = net.swarms[0].behaviour().sigma.readiness();
    assert_eq!(r, Readiness::Serving, "peer 0 sees 2, 3 and 4 alive through peer 1's gossip");
    assert_eq!(net.swarms[0].behaviour().sigma.members(), (5, 5));
    // Now cut 0 from 1 as well: 2, 3 and 4's heartbeats stop reaching it.
    net.cut(&[0], &[1]);
    assert!(net.stops_serving(&[0], LIVENESS).await, "a cut-off peer stops serving within the liveness timeout");
    assert!(matches!(net.swarms[0].behaviour().sigma.readiness(), Readiness::Minority { reachable: 1, members: 5 }));
}

/// One peer cannot forge the swarm's membership. Peers 0 to 3 serve, and 0 hears of 1
/// only through the gossip of 2 and 3 (the cut {0} | {1}). Peer 3 sends 0 tables of its
/// own making for two seconds: 500 made-up ids (half of them SHA-256 multihashes, which
/// no key hashes to here) whose counters advance every round, and a beat (u64::MAX,
/// u64::MAX) for peers 1 and 2, without proofs. Had 0 taken them, the ghosts would
/// count as members and, once they stopped, leave 0 a minority of 4 in 504; the
/// inflated beats would silence 1 and 2 for good. Only a member itself can refresh its
/// heartbeat: 0 refuses every forged beat, counts them, keeps serving throughout with
/// 4 members, still hears 1 through the others, and wins a lock once the cut heals.
#[tokio::test]
async fn a_forged_membership_changes_nothing_at_the_peer_it_is_sent_to() {
    let mut net = Net::serving(4).await;
    net.cut(&[0], &[1]);
    net.drive(LIVENESS, |_, _, _| false).await;
    assert_eq!(net.swarms[0].behaviour().sigma.members(), (4, 4), "1 alive at 0 through the gossip");
    // Ids made of random bytes: identity multihashes (no key decodes from them) and
    // SHA-256 ones.
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(1);
    let ghosts: Vec<PeerId> = (0..500u64)
        .map(|i| {
            let mut digest = [0u8; 32];
            rand::RngCore::fill_bytes(&mut rng, &mut digest);
            let code = if i % 2 == 0 { 0 } else { 0x12 };
            PeerId::from_multihash(libp2p::multihash::Multihash::wrap(code, &digest).unwrap()).unwrap()
        })
        .collect();
    let (victim, inflated) = (net.peer(0), [net.peer(1), net.peer(2)]);
    let incarnation = sigma_behaviour::liveness::wall_ms();
    let beat = |peer, incarnation, counter| wire::Beat {
        peer,
        incarnation,
        counter,
        age_ms: 0,
        delay_ms: None,
        proof: None,
        counted: false,
    };
    let mut serving = true;
    for round in 1..=20u64 {
        let beats = ghosts
            .iter()
            .map(|g| beat(*g, incarnation, round))
            .chain(inflated.iter().map(|p| beat(*p, u64::MAX, u64::MAX)))
            .collect();
        let table = wire::Gossip {
            beats,
            serving: true,
            delay_ms: None,
            leaves: vec![],
            joints: vec![],
            group: None,
            acks: false,
        };
        net.swarms[3].behaviour_mut().forge.send_request(&victim, table);
        net.drive(Duration::from_millis(100), |_, _, _| false).await;
        serving &= net.swarms[0].behaviour().sigma.readiness() == Readiness::Serving;
    }
    // The ghosts fall silent: had they been taken, they would now depart.
    for _ in 0..2 * LIVENESS.as_millis() / 100 {
        net.drive(Duration::from_millis(100), |_, _, _| false).await;
        serving &= net.swarms[0].behaviour().sigma.readiness() == Readiness::Serving;
    }
    let b = &net.swarms[0].behaviour().sigma;
    let refused = b.counters().inbound_failures.get("beat_unproven").copied().unwrap_or(0)
        + b.counters().inbound_failures.get("beat_too_many_new").copied().unwrap_or(0);
    assert!(serving, "peer 0 stopped serving during or after the attack: {:?}", b.readiness());
    assert_eq!(b.members(), (4, 4), "ghosts counted, or 1 or 2 silenced");
    assert!(refused >= 20 * 500, "every forged beat is refused and counted: {:?}", b.counters().inbound_failures);
    // With the cut healed (0 cannot reach the replicas 1 hosts), a lock is won through 0.
    net.heal();
    net.mesh(&[0, 1]).await;
    let id = net.acquire(0, "after-the-attack");
    net.drive(Duration::from_secs(30), won(0, id)).await;
    assert!(net.holders.get("after-the-attack") == Some(&(0, id)), "peer 0 wins a lock after the attack");
}

/// Departed members are dialled again by a peer that does not serve, never by one that
/// serves: a cut-off peer (a minority of one) keeps dialling the others so that a healed
/// partition reconnects, while the majority side hears of its departed members through
/// the gossip. (Every serving peer of a large swarm redialling members that merely
/// looked departed made hundreds of dials a second, and lost the swarm its majority.)
#[tokio::test]
async fn only_a_peer_that_does_not_serve_dials_departed_members_again() {
    let mut net = Net::new(3, false).await;
    net.mesh(&[0, 1, 2]).await;
    net.drive(Duration::from_secs(1), |_, _, _| false).await;
    for i in 0..3 {
        assert_eq!(net.swarms[i].behaviour().sigma.readiness(), Readiness::Serving, "peer {i}");
    }
    net.cut(&[2], &[0, 1]);
    assert!(net.stops_serving(&[2], LIVENESS).await, "the cut-off peer still serves after {LIVENESS:?}");
    // Past the liveness timeout on every side: peer 2 has departed for 0 and 1. Each
    // dial of a blocked peer is refused at once.
    let before: Vec<usize> = net.swarms.iter().map(|s| s.behaviour().dials.0).collect();
    net.drive(Duration::from_secs(6), |_, _, _| false).await;
    let dials: Vec<usize> = net.swarms.iter().zip(&before).map(|(s, b)| s.behaviour().dials.0 - b).collect();
    for i in [0, 1] {
        let b = &net.swarms[i].behaviour().sigma;
        assert_eq!(b.readiness(), Readiness::Serving, "peer {i}");
        assert_eq!(b.members(), (2, 3), "peer {i}: peer 2 departed");
    }
    assert_eq!(&dials[..2], &[0, 0], "serving peers dialled the departed member: {dials:?}");
    assert!(dials[2] >= 2, "the cut-off peer dials its departed members every 2 s: {dials:?}");
}

/// A minority must not grow into a majority by joins. Peers 0, 1
/// and 2 serve; the cut {0} | {1, 2} leaves 0 reaching 1 of 3. Two new peers, 3 and 4,
/// join through 0 only, during the cut. Counting them would make 0 reach 3 of 5, and
/// them 3 of 3: both sides would grant the same lock. A peer that does not serve counts
/// no newcomer, and a joining peer joins only through a peer that serves: 0 stays a
/// minority, 3 and 4 stay joining, and only the majority side's waiter wins. Once the
/// cut heals, 0 serves again and 3 and 4 join through it.
#[tokio::test]
async fn a_minority_does_not_grow_into_a_majority_by_joins() {
    let mut net = Net::serving(3).await;
    net.cut(&[0], &[1, 2]);
    assert!(net.stops_serving(&[0], LIVENESS).await, "the cut-off peer still serves after {LIVENESS:?}");
    assert_eq!(net.swarms[0].behaviour().sigma.readiness(), Readiness::Minority { reachable: 1, members: 3 });
    // Two peers start during the cut with peer 0 as their bootstrap peer; they cannot
    // reach 1 and 2 either.
    let joiners = [net.spawn(true).await, net.spawn(true).await];
    net.cut(&joiners, &[1, 2]);
    net.mesh(&[0, joiners[0], joiners[1]]).await;
    for j in joiners {
        net.swarms[j].behaviour_mut().sigma.bootstrap().expect("peer 0 is known");
    }
    let minority = net.acquire(0, "orders");
    let majority = net.acquire(1, "orders");
    // The majority side wins (after the takeover delay of the keys 0 hosted); the
    // driver panics if the minority's side also grants while it holds.
    net.drive(Duration::from_secs(30), won(1, majority)).await;
    if net.holders.get("orders") != Some(&(1, majority)) {
        net.dump("orders", &[(0, minority), (1, majority)]);
    }
    assert!(net.holders.get("orders") == Some(&(1, majority)), "the majority side serves");
    // Long enough for the minority's side to have served and waited out a takeover
    // delay, had it counted the newcomers.
    let delay = net.swarms[0].behaviour().sigma.takeover_delay();
    net.drive(delay + LEASE, |_, _, _| false).await;
    let r = net.swarms[0].behaviour().sigma.readiness();
    assert_eq!(r, Readiness::Minority { reachable: 1, members: 3 }, "peer 0 counted the peers that joined it");
    for j in joiners {
        assert_eq!(net.swarms[j].behaviour().sigma.readiness(), Readiness::Joining, "peer {j} joined a minority");
    }
    let waiting = net.swarms[0].behaviour().sigma.acquisition(minority).map(|a| a.phase);
    assert_eq!(waiting, Some(proto::Phase::Waiting), "the minority's waiter waits");
    // Healed: peer 0 serves again, and the newcomers join through it.
    net.release(1, majority);
    net.heal();
    net.mesh(&[0, 1, 2, joiners[0], joiners[1]]).await;
    net.drive(Duration::from_secs(30), won(0, minority)).await;
    assert!(net.holders.get("orders") == Some(&(0, minority)), "the minority's waiter is served after the heal");
    let all = net.acquire(joiners[0], "after");
    net.drive(Duration::from_secs(30), won(joiners[0], all)).await;
    for i in 0..5 {
        assert_eq!(net.swarms[i].behaviour().sigma.readiness(), Readiness::Serving, "peer {i}");
    }
}

/// Peer 0's lease in [`one_long_lease_peer`].
const LONG_LEASE: Duration = Duration::from_secs(15);

/// Peer 0 grants [`LONG_LEASE`]s, peers 1 and 2 the 2 s of [`config`]; none meshed yet.
async fn one_long_lease_peer() -> Net {
    let mut net = Net::new(0, false).await;
    net.spawn_with(config(false).with_protocol(
        proto::Config::default().with_quorum(5, 3).with_lease(LONG_LEASE).with_request_timeout(LEASE / 4),
    ))
    .await;
    net.spawn(false).await;
    net.spawn(false).await;
    net
}

/// Settings differ per peer: peer 0 grants 15 s leases, peers 1
/// and 2 the 2 s of [`config`], so their own takeover delay (≈ 5 s) is shorter than a
/// vote of peer 0 lives. A holder whose m votes are peer 0's keeps them valid for up
/// to 15 s after peer 0 is cut off; the takeover delay of the peers that take its keys
/// over must outlast them: it is computed from the longest of the swarm's settings.
#[tokio::test]
async fn a_longer_lease_elsewhere_lengthens_the_takeover_delay() {
    let mut net = one_long_lease_peer().await;
    // A name with 3 or 4 of its 5 keys on peer 0: the holder's m votes are peer 0's,
    // and it won with a second voter.
    let name = (0..2_000)
        .map(|k| format!("settings-{k}"))
        .find(|name| (3..=4).contains(&hosts(&net, name, &[0, 1, 2]).iter().filter(|&&h| h == 0).count()))
        .expect("such a name among 2,000");
    net.mesh(&[0, 1, 2]).await;
    let held = net.acquire(0, &name);
    net.drive(Duration::from_secs(40), won(0, held)).await;
    assert!(net.holders.contains_key(&name), "peer 0 holds {name}");
    net.cut(&[0], &[1, 2]);
    let next = net.acquire(1, &name);
    // The driver panics if peer 1 wins while peer 0's holder still counts itself one.
    net.drive(Duration::from_secs(40), won(1, next)).await;
    if net.holders.get(&name) != Some(&(1, next)) {
        net.dump(&name, &[(0, held), (1, next)]);
    }
    assert!(net.holders.get(&name) == Some(&(1, next)), "the majority side serves {name} again");
}

/// A peer that joins during the cut of scenario 2 hears only the members alive where it
/// joins, not peer 0 with its 15 s leases; it would start serving the keys it is closest
/// to after its own ≈ 5 s delay. It keeps the delay of the peer it joined through, which
/// knew peer 0's.
#[tokio::test]
async fn a_peer_joining_during_a_cut_keeps_the_delay_of_the_peer_it_joined_through() {
    let mut net = one_long_lease_peer().await;
    // A name with 3 of its 5 keys on peer 0 and 2 on peers 1 and 2; with the joiner and
    // without peer 0, at least one of peer 0's keys on the joiner: its vote and the two
    // of peers 1 and 2 are the m = 3 a waiter needs. (Whether a joiner's id can take
    // one of peer 0's keys depends on the ids: joiners that cannot stay idle.)
    let mut found = None;
    for _ in 0..16 {
        let joiner = net.spawn(true).await;
        let name = (0..2_000).map(|k| format!("joined-{k}")).find(|name| {
            let before = hosts(&net, name, &[0, 1, 2]);
            let after = hosts(&net, name, &[1, 2, joiner]);
            before.iter().filter(|&&h| h == 0).count() == 3
                && before.iter().zip(&after).any(|(&b, &a)| b == 0 && a == joiner)
        });
        if let Some(name) = name {
            found = Some((joiner, name));
            break;
        }
    }
    let (joiner, name) = found.expect("a joiner and a name among 16 joiners and 2,000 names");
    net.mesh(&[0, 1, 2]).await;
    let held = net.acquire(0, &name);
    net.drive(Duration::from_secs(40), won(0, held)).await;
    assert!(net.holders.contains_key(&name), "peer 0 holds {name}");
    net.cut(&[0], &[1, 2, joiner]);
    // The joiner comes once peers 1 and 2 count peer 0 departed: their tables no
    // longer name it.
    for _ in 0..LIVENESS.as_millis() / 100 {
        if [1, 2].iter().all(|&i| net.swarms[i].behaviour().sigma.members() == (2, 3)) {
            break;
        }
        net.drive(Duration::from_millis(100), |_, _, _| false).await;
    }
    assert_eq!(net.swarms[1].behaviour().sigma.members(), (2, 3), "peer 0 departed for peer 1");
    net.mesh(&[1, 2, joiner]).await;
    net.swarms[joiner].behaviour_mut().sigma.bootstrap().expect("peers 1 and 2 are known");
    let next = net.acquire(1, &name);
    // The driver panics if peer 1 wins while peer 0's holder still counts itself one.
    net.drive(Duration::from_secs(40), won(1, next)).await;
    if net.holders.get(&name) != Some(&(1, next)) {
        net.dump(&name, &[(0, held), (1, next)]);
    }
    assert!(net.holders.get(&name) == Some(&(1, next)), "the majority side serves {name} again");
    let delay = net.swarms[joiner].behaviour().sigma.takeover_delay();
    assert!(delay > LONG_LEASE, "the joiner's takeover delay {delay:?} is shorter than peer 0's lease");
}

/// Joins before a cut is noticed (docs/design/membership.md, "Joins before a cut: a
/// joint quorum"): peers that join a cut-off peer *before* it has noticed the cut
/// (within the liveness timeout) are counted, as it still serves; with two of them it
/// reaches 3 of 5 once it notices. Their joint quorums (a majority of the 3 members it
/// counted before them, which it no longer reaches) stop it all the same.
#[tokio::test]
async fn joins_before_the_cut_is_noticed_do_not_grow_a_minority() {
    let mut net = Net::serving(3).await;
    net.cut(&[0], &[1, 2]);
    assert_eq!(net.swarms[0].behaviour().sigma.readiness(), Readiness::Serving, "not noticed yet");
    let joiners = [net.spawn(true).await, net.spawn(true).await];
    net.cut(&joiners, &[1, 2]);
    net.mesh(&[0, joiners[0], joiners[1]]).await;
    for j in joiners {
        net.swarms[j].behaviour_mut().sigma.bootstrap().expect("peer 0 is known");
    }
    // The driver panics if both sides grant the lock.
    net.acquire(0, "orders");
    let majority = net.acquire(1, "orders");
    net.drive(Duration::from_secs(30), won(1, majority)).await;
    let delay = net.swarms[0].behaviour().sigma.takeover_delay();
    net.drive(delay + LEASE, |_, _, _| false).await;
    let r = net.swarms[0].behaviour().sigma.readiness();
    assert!(r != Readiness::Serving, "peer 0 serves on the peers that joined it: {r:?}");
}

/// What a join costs with the joint quorum: a peer joining a serving swarm of three
/// through peer 0 is counted by every peer, and every joint quorum it opened has ended
/// (each member's own table listed it as counted), and so has the joiner's own, within a
/// few gossip rounds (100 ms here, fanout 2); the others serve throughout.
#[tokio::test]
async fn a_join_ends_every_joint_quorum_within_a_few_gossip_rounds() {
    let mut net = Net::serving(3).await;
    let all_ended = |net: &Net| net.swarms.iter().all(|s| s.behaviour().sigma.joints_pending() == 0);
    assert!(net.until(Duration::from_secs(5), all_ended).await.is_some(), "the first meetings' joint quorums");
    let joiner = net.spawn(true).await;
    net.mesh(&[0, joiner]).await;
    net.swarms[joiner].behaviour_mut().sigma.bootstrap().expect("peer 0 is known");
    let counted = |net: &Net| net.swarms.iter().all(|s| s.behaviour().sigma.members() == (4, 4));
    let serving = |net: &Net| net.swarms[..3].iter().all(|s| s.behaviour().sigma.readiness() == Readiness::Serving);
    let counted_after = net.until(Duration::from_secs(10), |net| counted(net) && serving(net)).await;
    let ended_after = net.until(Duration::from_secs(10), |net| all_ended(net) && serving(net)).await;
    println!(
        "a join through peer 0: counted everywhere after {counted_after:?}, joint quorums ended {ended_after:?} later"
    );
    assert!(counted_after.is_some() && ended_after.is_some(), "{counted_after:?} {ended_after:?}");
}
