//! Unit tests of the §3 strawman: ALOHA-like majority voting with random backoff.

use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sigma_behaviour::proto::{ClientError, Config, Event, LostReason, Phase, ReplicaError, Time, Timestamp};
use sigma_testnet::baselines::backoff::Backoff;
use sigma_testnet::baselines::strawman::{Client, Replica, Reply, ToReplica};

type Ts = Timestamp<u32>;

const T0: Time = Duration::from_secs(1);
const LEASE: Duration = Duration::from_secs(10);
const ROUND_TIMEOUT: Duration = Duration::from_secs(1);
const WINDOW: Duration = Duration::from_millis(400);
const ME: Ts = Timestamp { counter: 10, client: 1 };
const OTHER: Ts = Timestamp { counter: 20, client: 2 };

fn config() -> Config {
    Config::default().with_quorum(5, 3).with_lease(LEASE).with_request_timeout(ROUND_TIMEOUT)
}

fn rng() -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(7)
}

fn reply(round: u32, granted: bool) -> Reply<u32> {
    Reply { ts: ME, round, granted, owner: if granted { ME } else { OTHER } }
}

fn drain(c: &mut Client<u32>) -> Vec<(usize, ToReplica<u32>)> {
    std::iter::from_fn(|| c.poll_transmit()).collect()
}

fn events(c: &mut Client<u32>) -> Vec<Event> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

fn releases(out: &[(usize, ToReplica<u32>)]) -> Vec<(usize, u32)> {
    out.iter()
        .map(|(i, m)| match m {
            ToReplica::Release { ts, round } if *ts == ME => (*i, *round),
            other => panic!("expected a RELEASE, got {other:?}"),
        })
        .collect()
}

fn client(backoff: Backoff) -> Client<u32> {
    let mut c = Client::new(config(), backoff, ME, T0);
    drain(&mut c);
    c
}

/// Round 1 lost at `T0`: grants from replicas 0 and 1, rejections from 2, 3, 4.
fn lost_round(backoff: Backoff, rng: &mut ChaCha8Rng) -> Client<u32> {
    let mut c = client(backoff);
    for (i, granted) in [(0, true), (1, true), (2, false), (3, false), (4, false)] {
        c.handle_reply(T0, i, reply(1, granted), rng).unwrap();
    }
    c
}

// Reference: §3: "A replica grants a lease if it is not owned by anyone, and otherwise
// rejects the request but informs the client the current owner."
#[test]
fn replica_grants_when_free_and_rejects_naming_the_owner() {
    let mut r = Replica::new(&config());
    r.handle(T0, &ME.client, ToReplica::Request { ts: ME, round: 1 }).unwrap();
    assert_eq!(r.poll_transmit(), Some((1, Reply { ts: ME, round: 1, granted: true, owner: ME })));
    r.handle(T0, &OTHER.client, ToReplica::Request { ts: OTHER, round: 4 }).unwrap();
    assert_eq!(r.poll_transmit(), Some((2, Reply { ts: OTHER, round: 4, granted: false, owner: ME })));
    assert_eq!(r.owner(), Some((&ME, 1)));
    // Another round of the same acquisition is another request: rejected too.
    r.handle(T0, &ME.client, ToReplica::Request { ts: ME, round: 2 }).unwrap();
    assert!(!r.poll_transmit().expect("a reply").1.granted);
    assert_eq!(r.poll_transmit(), None);
}

// Reference: §3 leases: the holder's REQUEST renews; RELEASE or expiry frees; only the
// holder may release (ARCHITECTURE.md, "The core's shape": `ForeignAcquisition`).
#[test]
fn replica_lease_renewal_release_and_expiry() {
    let mut r = Replica::new(&config());
    r.handle(T0, &ME.client, ToReplica::Request { ts: ME, round: 1 }).unwrap();
    assert_eq!(r.poll_timeout(), Some(T0 + LEASE));
    let later = T0 + Duration::from_secs(6);
    r.handle(later, &ME.client, ToReplica::Request { ts: ME, round: 1 }).unwrap();
    assert_eq!(r.poll_timeout(), Some(later + LEASE));
    assert_eq!(
        r.handle(later, &OTHER.client, ToReplica::Release { ts: OTHER, round: 1 }),
        Err(ReplicaError::NotHolder)
    );
    assert_eq!(
        r.handle(later, &OTHER.client, ToReplica::Release { ts: ME, round: 1 }),
        Err(ReplicaError::ForeignAcquisition)
    );
    assert_eq!(r.handle(later, &ME.client, ToReplica::Release { ts: ME, round: 2 }), Err(ReplicaError::NotHolder));
    assert_eq!(r.owner(), Some((&ME, 1)));
    r.handle_timeout(later + LEASE - Duration::from_nanos(1));
    assert!(r.owner().is_some());
    r.handle_timeout(later + LEASE);
    assert_eq!(r.owner(), None);

    r.handle(later, &ME.client, ToReplica::Request { ts: ME, round: 3 }).unwrap();
    r.handle(later, &ME.client, ToReplica::Release { ts: ME, round: 3 }).unwrap();
    assert_eq!(r.owner(), None);
}

// Reference: §3: "all clients that want to enter critical section (CS) send requests to
// each of the replicas ... The one who obtains m out of n replicas (m > n/2) is the
// winner at this round."
#[test]
fn client_wins_with_m_grants() {
    let mut r = rng();
    let mut c = Client::new(config(), Backoff::Constant { window: WINDOW }, ME, T0);
    let out = drain(&mut c);
    assert_eq!(out, (0..5).map(|i| (i, ToReplica::Request { ts: ME, round: 1 })).collect::<Vec<_>>());
    c.handle_reply(T0, 0, reply(1, true), &mut r).unwrap();
    c.handle_reply(T0, 3, reply(1, false), &mut r).unwrap();
    c.handle_reply(T0, 1, reply(1, true), &mut r).unwrap();
    assert_eq!(c.phase(), Phase::Waiting);
    c.handle_reply(T0, 0, reply(1, true), &mut r).unwrap(); // a duplicate counts once
    assert_eq!(c.phase(), Phase::Waiting);
    c.handle_reply(T0 + Duration::from_millis(5), 4, reply(1, true), &mut r).unwrap();
    assert_eq!(c.phase(), Phase::Holding);
    assert_eq!(events(&mut c), vec![Event::Acquired { token: 0, votes: 3, valid_until: T0 + LEASE }]);
    assert_eq!(c.granted(), vec![0, 1, 4]);
    assert_eq!(c.collisions, 0);
}

// Reference: §3: "Losers release acquired votes (if any), back-off and retry after a
// random period"; the period comes from the `Backoff` policy.
#[test]
fn losing_a_round_releases_its_votes_and_backs_off() {
    let backoff = Backoff::Constant { window: WINDOW };
    let mut r = rng();
    let mut c = client(backoff);
    c.handle_reply(T0, 0, reply(1, true), &mut r).unwrap();
    c.handle_reply(T0, 1, reply(1, true), &mut r).unwrap();
    c.handle_reply(T0, 2, reply(1, false), &mut r).unwrap();
    c.handle_reply(T0, 3, reply(1, false), &mut r).unwrap();
    assert!(drain(&mut c).is_empty(), "2 grants + 1 unanswered can still make m = 3");
    let mut replay = r.clone();
    c.handle_reply(T0, 4, reply(1, false), &mut r).unwrap();
    assert_eq!(releases(&drain(&mut c)), vec![(0, 1), (1, 1)]);
    assert_eq!((c.phase(), c.collisions), (Phase::Waiting, 1));
    let delay = backoff.delay(1, &mut replay);
    assert!(delay < WINDOW);
    let retry = T0 + delay;
    assert_eq!(c.poll_timeout(), Some(retry));

    c.handle_timeout(retry - Duration::from_nanos(1), &mut r);
    assert!(drain(&mut c).is_empty());
    c.handle_timeout(retry, &mut r);
    assert_eq!(c.round(), 2);
    assert_eq!(drain(&mut c), (0..5).map(|i| (i, ToReplica::Request { ts: ME, round: 2 })).collect::<Vec<_>>());
    assert_eq!(c.poll_timeout(), Some(retry + ROUND_TIMEOUT));
}

// Reference: §3 (losers release): a grant that arrives for a round already given up, or
// while backing off, is released at once and never counted.
#[test]
fn late_grants_from_abandoned_rounds_are_released() {
    let mut r = rng();
    let mut c = lost_round(Backoff::Constant { window: WINDOW }, &mut r);
    drain(&mut c);
    c.handle_reply(T0, 0, reply(1, true), &mut r).unwrap(); // duplicate, while backing off
    assert_eq!(releases(&drain(&mut c)), vec![(0, 1)]);
    let retry = c.poll_timeout().expect("backoff timer");
    c.handle_timeout(retry, &mut r);
    drain(&mut c);
    c.handle_reply(retry, 2, reply(1, true), &mut r).unwrap(); // round 1, now in round 2
    assert_eq!(releases(&drain(&mut c)), vec![(2, 1)]);
    c.handle_reply(retry, 3, reply(1, false), &mut r).unwrap();
    assert!(drain(&mut c).is_empty(), "a late rejection needs nothing");
    assert!(c.granted().is_empty(), "nothing counted in round 2");
    assert_eq!(c.phase(), Phase::Waiting);
}

// Reference: §3 with §4 failure 4: an unanswered replica counts as a rejection when the
// round times out.
#[test]
fn round_timeout_counts_unanswered_replicas_as_rejections() {
    let mut r = rng();
    let mut c = client(Backoff::Constant { window: Duration::ZERO });
    c.handle_reply(T0, 0, reply(1, true), &mut r).unwrap();
    c.handle_reply(T0, 1, reply(1, true), &mut r).unwrap();
    c.handle_timeout(T0 + ROUND_TIMEOUT, &mut r);
    assert_eq!(releases(&drain(&mut c)), vec![(0, 1), (1, 1)]);
    assert_eq!(c.collisions, 1);
    assert_eq!(c.poll_timeout(), Some(T0 + ROUND_TIMEOUT), "zero window: retry at once");
}

// Reference: backoff.rs (Chockler–Malkhi–Reiter): the exponential window doubles with
// each collision up to its cap, and the strawman client feeds it its collision count.
#[test]
fn exponential_backoff_grows_with_collisions() {
    let base = Duration::from_millis(10);
    let cap = Duration::from_millis(200);
    let policy = Backoff::Exponential { base, cap };
    let mut draws = ChaCha8Rng::seed_from_u64(11);
    let mut previous = Duration::ZERO;
    for attempt in 1..=7 {
        let window = (base * (1 << (attempt - 1))).min(cap);
        let max = (0..2_000).map(|_| policy.delay(attempt, &mut draws)).max().expect("draws");
        assert!(max < window && max * 10 >= window * 9, "attempt {attempt}: {max:?} vs {window:?}");
        assert!(max >= previous || window == cap);
        previous = max;
    }

    // The client's k-th backoff is drawn from the k-th window.
    let mut r = rng();
    let mut c = client(policy);
    let mut now = T0;
    for round in 1..=6u32 {
        let mut replay = r.clone();
        for i in 0..5 {
            c.handle_reply(now, i, reply(round, false), &mut r).unwrap();
        }
        assert_eq!(c.collisions, round);
        let wait = c.poll_timeout().expect("backoff") - now;
        assert_eq!(wait, policy.delay(round, &mut replay));
        assert!(wait < (base * (1 << (round - 1))).min(cap));
        now += wait;
        c.handle_timeout(now, &mut r);
        assert_eq!(c.round(), round + 1);
        drain(&mut c);
    }
}

// Reference: §3 leases while in the CS: the holder renews; a rejection or an expired
// lease is a loss.
#[test]
fn holder_renews_and_loses_on_rejection_or_expiry() {
    let mut r = rng();
    let mut c = client(Backoff::Constant { window: WINDOW });
    for i in 0..3 {
        c.handle_reply(T0, i, reply(1, true), &mut r).unwrap();
    }
    events(&mut c);
    let renew = c.poll_timeout().expect("renewal timer");
    assert!(renew > T0 && renew < T0 + LEASE);
    c.handle_timeout(renew, &mut r);
    assert_eq!(drain(&mut c), (0..3).map(|i| (i, ToReplica::Request { ts: ME, round: 1 })).collect::<Vec<_>>());
    c.handle_reply(renew, 0, reply(1, false), &mut r).unwrap();
    assert_eq!((c.phase(), events(&mut c)), (Phase::Lost, vec![Event::Lost(LostReason::VotesTaken)]));

    let mut c = client(Backoff::Constant { window: WINDOW });
    for i in 0..3 {
        c.handle_reply(T0, i, reply(1, true), &mut r).unwrap();
    }
    events(&mut c);
    let mut now = T0;
    while c.phase() == Phase::Holding {
        now = c.poll_timeout().expect("a timer while holding");
        assert!(now <= T0 + LEASE);
        c.handle_timeout(now, &mut r);
    }
    assert_eq!(now, T0 + LEASE);
    assert_eq!(events(&mut c), vec![Event::Lost(LostReason::LeaseExpired)]);
}

// Reference: §3: leaving the CS releases the votes of the round; idempotent.
#[test]
fn release_gives_back_the_granted_votes_once() {
    let mut r = rng();
    let mut c = client(Backoff::Constant { window: WINDOW });
    for i in [1, 3, 4] {
        c.handle_reply(T0, i, reply(1, true), &mut r).unwrap();
    }
    c.release(T0);
    assert_eq!(releases(&drain(&mut c)), vec![(1, 1), (3, 1), (4, 1)]);
    assert_eq!((c.phase(), c.poll_timeout()), (Phase::Released, None));
    c.release(T0);
    assert!(drain(&mut c).is_empty());
    // A grant in flight at the release is given back when it arrives (the call
    // reports it as stale: the acquisition is over).
    let late = c.handle_reply(T0, 0, reply(1, true), &mut r);
    assert!(matches!(late, Ok(()) | Err(ClientError::Stale)), "{late:?}");
    assert_eq!(releases(&drain(&mut c)), vec![(0, 1)]);

    // Released while backing off: the votes were already given back.
    let mut c = lost_round(Backoff::Constant { window: WINDOW }, &mut r);
    drain(&mut c);
    c.release(T0);
    assert!(drain(&mut c).is_empty());
}

// Reference: error.rs: bad input is an error value and changes nothing.
#[test]
fn out_of_range_and_wrong_acquisition_are_errors() {
    let mut r = rng();
    let mut c = client(Backoff::Constant { window: WINDOW });
    assert_eq!(c.handle_reply(T0, 5, reply(1, true), &mut r), Err(ClientError::ReplicaOutOfRange { index: 5, n: 5 }));
    let other = Reply { ts: OTHER, ..reply(1, true) };
    assert_eq!(c.handle_reply(T0, 0, other, &mut r), Err(ClientError::WrongAcquisition));
    assert!(drain(&mut c).is_empty());
    assert!(c.granted().is_empty());
    assert_eq!(c.phase(), Phase::Waiting);
}
