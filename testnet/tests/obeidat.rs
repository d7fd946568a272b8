//! Unit tests of Obeidat, Gubarev and Al-yousef (2008): §4.1 coordinator, §4.3
//! messages, §4.4 leases, §4.1 election and recovery.

use std::time::Duration;

use sigma_behaviour::proto::{Config, Event, Phase, Time, Timestamp};
use sigma_testnet::baselines::obeidat::{Client, Replica, ToClient, ToReplica};

const T0: Time = Duration::from_secs(1);
const LEASE: Duration = Duration::from_secs(10);
const A: Timestamp<u32> = Timestamp { counter: 10, client: 1 };
const B: Timestamp<u32> = Timestamp { counter: 20, client: 2 };

fn config() -> Config {
    Config::default().with_quorum(3, 2).with_lease(LEASE)
}

fn to_clients(r: &mut Replica<u32>) -> Vec<(u32, ToClient<u32>)> {
    std::iter::from_fn(|| r.poll_transmit()).collect()
}
fn to_replicas(r: &mut Replica<u32>) -> Vec<(usize, ToReplica<u32>)> {
    std::iter::from_fn(|| r.poll_transmit_replica()).collect()
}

// §4.3 REQUEST/RESPONSE/ADDREQUEST: only the coordinator answers; a busy resource
// queues the requester FCFS and tells the replicas and the queued clients.
#[test]
fn coordinator_grants_then_queues_fcfs() {
    let mut coord = Replica::new(&config(), 0, false, T0);
    let mut other = Replica::new(&config(), 1, false, T0);
    other.handle_client(T0, &1, ToReplica::Request { ts: A }).unwrap();
    assert!(to_clients(&mut other).is_empty(), "a non-coordinator does not answer");
    coord.handle_client(T0, &1, ToReplica::Request { ts: A }).unwrap();
    coord.handle_client(T0, &2, ToReplica::Request { ts: B }).unwrap();
    let out = to_clients(&mut coord);
    assert!(matches!(&out[0], (1, ToClient::Response { granted: true, .. })));
    assert!(matches!(&out[1], (1, ToClient::AddRequest { entry, .. }) if entry.ts == B));
    assert!(matches!(&out[2], (2, ToClient::Response { granted: false, queue, .. }) if queue.len() == 2));
    let adds = to_replicas(&mut coord);
    assert_eq!(adds.len(), 4, "ADDREQUEST of A and B to replicas 1 and 2");
    for (_, m) in adds.into_iter().filter(|(i, _)| *i == 1) {
        other.handle_replica(T0, 0, m).unwrap();
    }
    assert_eq!(other.queue(), vec![A, B]);
}

// §4.3 RELEASE (token pass, Lemma 1b): the owner's RELEASE reaches the next client,
// which enters; the coordinator also passes the token with GRANT.
#[test]
fn release_passes_the_token() {
    let mut coord = Replica::new(&config(), 0, false, T0);
    let mut a = Client::new(config(), A, T0);
    let mut b = Client::new(config(), B, T0);
    for (c, from) in [(&mut a, 1), (&mut b, 2)] {
        let reqs: Vec<_> = std::iter::from_fn(|| c.poll_transmit()).filter(|(i, _)| *i == 0).collect();
        for (_, m) in reqs {
            coord.handle_client(T0, &from, m).unwrap();
        }
    }
    for (to, m) in to_clients(&mut coord) {
        if to == 1 { a.handle_replica(T0, 0, m) } else { b.handle_replica(T0, 0, m) }.unwrap();
    }
    assert_eq!((a.phase(), b.phase()), (Phase::Holding, Phase::Waiting));
    assert_eq!(b.queue(), vec![A, B]);
    let t1 = T0 + Duration::from_secs(1);
    a.release(t1);
    let peer: Vec<_> = std::iter::from_fn(|| a.poll_transmit_client()).collect();
    assert_eq!(peer, vec![(2, ToClient::Release { ts: B, released: A, at: t1 })]);
    b.handle_client(t1, &2, peer[0].1.clone()).unwrap_err(); // wrong sender
    b.handle_client(t1, &1, peer[0].1.clone()).unwrap();
    b.poll_event();
    assert_eq!(b.phase(), Phase::Holding);
    assert!(b.poll_event().is_none());
    // The coordinator, on the same RELEASE, passes the token itself.
    coord.handle_client(t1, &1, ToReplica::Release { ts: A }).unwrap();
    assert_eq!(to_clients(&mut coord), vec![(2, ToClient::Grant { ts: B, until: t1 + LEASE })]);
}

// §4.4.1 leasing: when the owner's lease expires the next in the queue gets the grant.
#[test]
fn lease_expiry_passes_the_token() {
    let mut coord = Replica::new(&config(), 0, false, T0);
    coord.handle_client(T0, &1, ToReplica::Request { ts: A }).unwrap();
    coord.handle_client(T0, &2, ToReplica::Request { ts: B }).unwrap();
    to_clients(&mut coord);
    assert_eq!(coord.poll_timeout(), Some(T0 + LEASE));
    coord.handle_timeout(T0 + LEASE);
    assert_eq!(to_clients(&mut coord), vec![(2, ToClient::Grant { ts: B, until: T0 + LEASE * 2 })]);
    let mut c = Client::new(config(), A, T0);
    c.handle_replica(T0, 0, ToClient::Grant { ts: A, until: T0 + LEASE }).unwrap();
    assert!(matches!(c.poll_event(), Some(Event::Acquired { .. })));
    c.handle_timeout(T0 + LEASE);
    assert_eq!(c.phase(), Phase::Lost);
}

// §4.1 coordinator failure and election, recovery: the coordinator comes back with
// fresh memory and sends RECOVER; the others elect (IAMCOORDINATOR, highest stamp
// wins), the winner stays quiet one lease and rebuilds the recovering replica (UPDATE).
#[test]
fn coordinator_failure_election_and_recovery() {
    let mut r1 = Replica::new(&config(), 1, false, T0);
    let mut r2 = Replica::new(&config(), 2, false, T0);
    let mut fresh = Replica::new(&config(), 0, true, T0);
    assert!(fresh.recovering());
    let recover = to_replicas(&mut fresh);
    assert_eq!(recover, vec![(1, ToReplica::Recover), (2, ToReplica::Recover)]);
    r1.handle_replica(T0, 0, ToReplica::Recover).unwrap();
    r2.handle_replica(T0, 0, ToReplica::Recover).unwrap();
    assert!(r1.is_coordinator() && r2.is_coordinator(), "both detected the failure");
    let m1 = to_replicas(&mut r1);
    let m2 = to_replicas(&mut r2);
    for (to, m) in m1.iter().chain(&m2) {
        let from = if m1.contains(&(*to, m.clone())) { 1 } else { 2 };
        match to {
            1 => r1.handle_replica(T0, from, m.clone()).unwrap(),
            2 => r2.handle_replica(T0, from, m.clone()).unwrap(),
            _ => {
                let _ = fresh.handle_replica(T0, from, m.clone());
            }
        }
    }
    assert!(!r1.is_coordinator() && r2.is_coordinator(), "equal counters: the higher index wins");
    assert_eq!(r1.coordinator(), r2.coordinator());
    assert!(!fresh.recovering(), "rebuilt by UPDATE");
    assert_eq!(fresh.coordinator(), r2.coordinator());
    // Quiet for one lease: no answer to a REQUEST.
    r2.handle_client(T0, &1, ToReplica::Request { ts: A }).unwrap();
    assert!(to_clients(&mut r2).is_empty());
    r2.handle_timeout(T0 + LEASE);
    r2.handle_client(T0 + LEASE, &1, ToReplica::Request { ts: A }).unwrap();
    assert!(matches!(to_clients(&mut r2)[..], [(1, ToClient::Response { granted: true, .. })]));
}
