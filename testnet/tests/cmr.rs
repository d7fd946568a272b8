//! Unit tests of the Chockler–Malkhi–Reiter backoff mutex (2001), §3 and §4.

use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sigma_behaviour::proto::{Config, Event, LostReason, Phase, ReplicaError, Time, Timestamp};
use sigma_testnet::baselines::backoff::Backoff;
use sigma_testnet::baselines::cmr::{Client, Replica, Reply, ToReplica};

const T0: Time = Duration::from_secs(1);
const DELTA: Duration = Duration::from_secs(10);
const A: Timestamp<u32> = Timestamp { counter: 10, client: 1 };
const B: Timestamp<u32> = Timestamp { counter: 20, client: 2 };
const C: Timestamp<u32> = Timestamp { counter: 30, client: 3 };
const BACKOFF: Backoff = Backoff::Exponential { base: Duration::from_millis(100), cap: Duration::from_secs(10) };

fn config() -> Config {
    Config::default().with_quorum(5, 3).with_lease(DELTA)
}

fn replies(r: &mut Replica<u32>) -> Vec<(u32, Reply<u32>)> {
    std::iter::from_fn(|| r.poll_transmit()).collect()
}

fn try_(ts: Timestamp<u32>, round: u32) -> ToReplica<u32> {
    ToReplica::Try { ts, round }
}

// §3 server: "free" unless it answered free less than Δ ago.
#[test]
fn server_grants_free_then_locked_until_delta() {
    let mut r = Replica::new(&config(), false);
    r.handle(T0, &1, try_(A, 1)).unwrap();
    r.handle(T0, &2, try_(B, 1)).unwrap();
    let out = replies(&mut r);
    assert!(out[0].1.free && !out[1].1.free);
    // Δ expiry: free again without any release.
    r.handle(T0 + DELTA, &2, try_(B, 2)).unwrap();
    assert!(replies(&mut r)[0].1.free);
    assert_eq!(r.handle(T0, &1, try_(B, 1)), Err(ReplicaError::ForeignAcquisition));
}

// §3 client: m free answers of a quorum win; the lease is the fixed period Δ.
#[test]
fn client_wins_with_m_free_and_must_finish_within_delta() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut c = Client::new(config(), BACKOFF, false, A, T0);
    assert_eq!(std::iter::from_fn(|| c.poll_transmit()).count(), 5);
    for i in 0..3 {
        c.handle_reply(T0, i, Reply { ts: A, round: 1, free: true }, &mut rng).unwrap();
    }
    assert_eq!(c.phase(), Phase::Holding);
    assert!(matches!(c.poll_event(), Some(Event::Acquired { valid_until, .. }) if valid_until == T0 + DELTA));
    c.handle_timeout(T0 + DELTA, &mut rng);
    assert_eq!(c.poll_event(), Some(Event::Lost(LostReason::LeaseExpired)));
}

// §3 conflict and backoff: a locked answer that makes m unreachable releases the grants
// and backs off for rand[0, base · 2^(retry-1)); the window doubles per failed try.
#[test]
fn conflict_releases_and_backs_off_exponentially() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let mut c = Client::new(config(), BACKOFF, false, A, T0);
    let _: Vec<_> = std::iter::from_fn(|| c.poll_transmit()).collect();
    let mut now = T0;
    for retry in 1..=4u32 {
        let round = c.round();
        c.handle_reply(now, 0, Reply { ts: A, round, free: true }, &mut rng).unwrap();
        for i in 1..4 {
            c.handle_reply(now, i, Reply { ts: A, round, free: false }, &mut rng).unwrap();
        }
        assert!(c.backing_off());
        let out: Vec<_> = std::iter::from_fn(|| c.poll_transmit()).collect();
        assert_eq!(out, vec![(0, ToReplica::Release { ts: A, round })]);
        let wait = c.poll_timeout().unwrap() - now;
        assert!(wait < Duration::from_millis(100) * (1 << (retry - 1)), "retry {retry}: {wait:?}");
        now += wait;
        c.handle_timeout(now, &mut rng);
        assert_eq!(c.round(), round + 1);
        assert_eq!(std::iter::from_fn(|| c.poll_transmit()).count(), 5);
    }
    // A free answer of an abandoned round is given back on arrival.
    c.handle_reply(now, 4, Reply { ts: A, round: 1, free: true }, &mut rng).unwrap();
    assert_eq!(c.poll_transmit(), Some((4, ToReplica::Release { ts: A, round: 1 })));
}

// §4 delayed reply list: a held server records requesters and, when free, answers free
// to the lowest id and locked to the others.
#[test]
fn delayed_reply_list_serves_lowest_id_on_release_and_on_expiry() {
    let mut r = Replica::new(&config(), true);
    r.handle(T0, &1, try_(A, 1)).unwrap();
    r.handle(T0, &3, try_(C, 1)).unwrap();
    r.handle(T0, &2, try_(B, 1)).unwrap();
    assert_eq!(replies(&mut r).len(), 1, "no rejection while held");
    assert_eq!(r.delayed(), vec![B, C]);
    r.handle(T0, &1, ToReplica::Release { ts: A, round: 1 }).unwrap();
    let out = replies(&mut r);
    assert_eq!(out, vec![(2, Reply { ts: B, round: 1, free: true }), (3, Reply { ts: C, round: 1, free: false })]);
    // Expiry of Δ also serves the list; a withdrawn try is not served.
    r.handle(T0, &1, try_(A, 2)).unwrap();
    r.handle(T0, &3, try_(C, 2)).unwrap();
    r.handle(T0, &3, ToReplica::Release { ts: C, round: 2 }).unwrap();
    r.handle_timeout(T0 + DELTA);
    assert_eq!(replies(&mut r), vec![(1, Reply { ts: A, round: 2, free: true })]);
    assert_eq!(r.holder(), Some((&A, 2)));
}
