//! Unit tests of one Sigma acquisition (paper Fig. 5 and §4), fed hand-made responses
//! (and, for the handoff trap, real replicas).

use std::time::Duration;

use sigma_behaviour::proto::clock::micros;
use sigma_behaviour::proto::{
    Client, ClientError, Config, Event, LostReason, Phase, Recovery, Replica, Response, Time, Timestamp, ToReplica,
};

type Ts = Timestamp<u32>;

const T0: Time = Duration::from_secs(1);
const LEASE: Duration = Duration::from_secs(10);
const RENEW: Duration = Duration::from_secs(3);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
const RTT: Duration = Duration::from_millis(100);
const ADVICE: Duration = Duration::from_secs(5);

fn ms(x: u64) -> Duration {
    Duration::from_millis(x)
}

/// n = 5, m = 3 unless a test says otherwise; no clock-drift margin, so that leases
/// come out exact (`leases_are_shortened_by_the_drift_bound` tests the margin).
fn config() -> Config {
    Config::default()
        .with_max_drift_ppm(0)
        .with_quorum(5, 3)
        .with_lease(LEASE)
        .with_renew_interval(RENEW)
        .with_request_timeout(REQUEST_TIMEOUT)
        .with_initial_rtt(RTT)
        .with_advice_bounds(ms(10), Duration::from_secs(60))
        .with_retry_slack_percent(0)
        // Fig. 5's rules one at a time: the reset recovery's own messages (re-ask,
        // RELAY) are tested in tests/recovery.rs.
        .with_recovery(Recovery::None)
}

const ME: Ts = Timestamp { counter: 1_000, client: 1 };
const B: Ts = Timestamp { counter: 900, client: 2 };
const C: Ts = Timestamp { counter: 800, client: 3 };

fn client(cfg: Config) -> Client<u32> {
    let mut c = Client::new(cfg, ME, T0);
    drain(&mut c);
    c
}

/// The answer of a replica to the REQUEST sent at `echo`, naming `owner`.
fn answer(owner: Ts, stamp: u64, echo: Time) -> Response<u32> {
    let ours = owner == ME;
    Response {
        ts: ME,
        owner,
        stamp,
        position: if ours { 0 } else { 1 },
        advice: if ours { Duration::ZERO } else { ADVICE },
        lease: LEASE,
        echo: micros(echo),
        grant_delay: Duration::ZERO,
        promoted: false,
        inquire: false,
        next: Vec::new(),
        solicit: false,
    }
}

/// An unsolicited notice that this acquisition was promoted to owner.
fn promotion(stamp: u64) -> Response<u32> {
    Response { promoted: true, echo: micros(T0), ..answer(ME, stamp, T0) }
}

fn drain(c: &mut Client<u32>) -> Vec<(usize, ToReplica<u32>)> {
    std::iter::from_fn(|| c.poll_transmit()).collect()
}

fn events(c: &mut Client<u32>) -> Vec<Event> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

fn yields(out: &[(usize, ToReplica<u32>)]) -> Vec<(usize, u64)> {
    out.iter()
        .filter_map(|(i, m)| match m {
            ToReplica::Yield { ts, stamp } => {
                assert_eq!(*ts, ME);
                Some((*i, *stamp))
            }
            _ => None,
        })
        .collect()
}

fn requests(out: &[(usize, ToReplica<u32>)]) -> Vec<usize> {
    out.iter().filter(|(_, m)| matches!(m, ToReplica::Request { .. })).map(|(i, _)| *i).collect()
}

/// `j_same + n − j < m` from the client's `resp[]`, computed independently.
fn nobody_can_win(c: &Client<u32>, n: usize, m: usize) -> bool {
    let owners: Vec<Ts> = c.views().iter().filter_map(|v| v.owner).collect();
    let j_same = owners.iter().map(|o| owners.iter().filter(|p| *p == o).count()).max().unwrap_or(0);
    j_same + n - owners.len() < m
}

/// A client that won at `T0` with votes from replicas 0, 1, 2 (stamps 100, 300, 200),
/// replicas 3 and 4 owned by B.
fn holding(cfg: Config) -> Client<u32> {
    let mut c = client(cfg);
    for (i, s) in [(0, 100), (1, 300), (2, 200)] {
        c.handle_response(T0, i, answer(ME, s, T0)).unwrap();
    }
    for i in [3, 4] {
        c.handle_response(T0, i, answer(B, 50, T0)).unwrap();
    }
    assert_eq!(c.phase(), Phase::Holding);
    events(&mut c);
    drain(&mut c);
    c
}

// Reference: Fig. 5 Request: one timestamp, REQUEST to every replica.
#[test]
fn start_sends_request_to_every_replica() {
    let mut c = Client::new(config(), ME, T0);
    let out = drain(&mut c);
    assert_eq!(out.len(), 5);
    for (k, (i, m)) in out.iter().enumerate() {
        assert_eq!(*i, k);
        assert_eq!(*m, ToReplica::Request { ts: ME, sent: micros(T0), floor: 0 });
    }
    assert_eq!((c.phase(), c.votes(), c.token()), (Phase::Waiting, 0, 0));
    assert_eq!(c.poll_timeout(), Some(T0 + REQUEST_TIMEOUT));
    assert!(events(&mut c).is_empty());
}

// Reference: Fig. 5 OnResponse, case 1: "The client is the winner by quorum consensus".
#[test]
fn wins_with_m_votes_and_the_largest_stamp_as_token() {
    let mut c = client(config());
    c.handle_response(T0 + ms(20), 0, answer(ME, 100, T0)).unwrap();
    c.handle_response(T0 + ms(20), 1, answer(ME, 300, T0)).unwrap();
    assert_eq!((c.phase(), c.votes()), (Phase::Waiting, 2));
    assert!(events(&mut c).is_empty());
    c.handle_response(T0 + ms(30), 2, answer(ME, 200, T0)).unwrap();
    assert_eq!(c.phase(), Phase::Holding);
    assert_eq!(events(&mut c), vec![Event::Acquired { token: 300, votes: 3, valid_until: T0 + LEASE }]);
    assert_eq!(c.token(), 300);
    assert_eq!(c.valid_until(), Some(T0 + LEASE), "leases counted from the echoed send time");
}

// Reference: Fig. 5 OnResponse, case 2: "Some one does win but not this client. The
// client does nothing because it knows it has been registered on the replicas".
#[test]
fn case_2_waits_and_never_yields() {
    let mut c = client(config());
    c.handle_response(T0, 0, answer(ME, 10, T0)).unwrap();
    c.handle_response(T0, 1, answer(B, 20, T0)).unwrap();
    assert!(!nobody_can_win(&c, 5, 3), "j = 2: B or we may still win");
    for i in 2..5 {
        c.handle_response(T0, i, answer(B, 20, T0)).unwrap();
    }
    assert!(!nobody_can_win(&c, 5, 3), "B has m");
    let mut now = T0;
    for _ in 0..20 {
        now += ms(500);
        c.handle_timeout(now);
        let out = drain(&mut c);
        assert!(out.iter().all(|(i, m)| *i == 0 || matches!(m, ToReplica::Request { .. })), "{out:?}");
    }
    assert_eq!(c.stats().yield_rounds, 0);
    assert_eq!(c.phase(), Phase::Waiting);
}

// Reference: Fig. 5 OnResponse, case 3 (`j_same + n − j < m`): YIELD every held vote and
// `Clear(resp[i])`; gated by one smoothed round trip without progress (client doc).
#[test]
fn case_3_yields_every_held_vote_after_one_round_trip_without_progress() {
    let mut c = client(config());
    let now = T0 + ms(40);
    c.handle_response(now, 0, answer(ME, 10, T0)).unwrap();
    c.handle_response(now, 1, answer(ME, 11, T0)).unwrap();
    c.handle_response(now, 2, answer(B, 12, T0)).unwrap();
    c.handle_response(now, 3, answer(B, 13, T0)).unwrap();
    assert!(!nobody_can_win(&c, 5, 3));
    c.handle_response(now, 4, answer(C, 14, T0)).unwrap();
    assert!(nobody_can_win(&c, 5, 3), "2 + 5 − 5 < 3");
    let gate = now + c.srtt();
    assert_eq!(c.poll_timeout(), Some(gate));
    c.handle_timeout(gate - Duration::from_nanos(1));
    assert!(drain(&mut c).is_empty(), "not before one round trip");
    c.handle_timeout(gate);
    let out = drain(&mut c);
    assert_eq!(yields(&out), vec![(0, 10), (1, 11)], "each YIELD names the grant it hands back");
    assert_eq!(out.len(), 2);
    assert_eq!(c.votes(), 0);
    assert_eq!(c.views()[0].owner, None, "Clear(resp[i])");
    assert_eq!(c.views()[1].owner, None);
    assert_eq!(c.views()[2].owner, Some(B), "other entries stay");
    assert_eq!((c.stats().yield_rounds, c.stats().yields), (1, 2));
    assert_eq!(c.phase(), Phase::Waiting);
}

// Reference: docs/design/protocol-decisions.md, "Enough responses" (the spurious-yield trap; regression). Right
// after a handoff the client's table still names the previous owner on most replicas
// while the promotions (Fig. 6 RespQueue) arrive one by one; in between, `j_same + n − j
// < m` holds on that stale table. The client must not yield, and must win once m
// promotions have arrived.
#[test]
fn no_spurious_yield_while_promotions_arrive_after_a_handoff() {
    let (n, m) = (5, 4);
    let cfg = config().with_quorum(n, m);
    let mut replicas: Vec<Replica<u32>> = (0..n).map(|_| Replica::new(cfg.clone())).collect();
    let prev = B;
    for r in &mut replicas {
        r.handle(T0, &prev.client, ToReplica::Request { ts: prev, sent: micros(T0), floor: 0 }).unwrap();
        while r.poll_transmit().is_some() {}
    }
    let mut c = Client::new(cfg, ME, T0);
    for (i, msg) in drain(&mut c) {
        replicas[i].handle(T0 + ms(10), &ME.client, msg).unwrap();
        let (_, r) = replicas[i].poll_transmit().expect("an answer");
        c.handle_response(T0 + ms(20), i, r).unwrap();
    }
    assert!(c.views().iter().all(|v| v.owner == Some(prev)), "everyone names the previous owner");
    // The previous owner releases everywhere at once; the notices reach us one by one.
    let release = T0 + ms(100);
    let notices: Vec<(usize, Response<u32>)> = (0..n)
        .map(|i| {
            replicas[i].handle(release, &prev.client, ToReplica::Release { ts: prev, token: 0, next: vec![] }).unwrap();
            let (to, r) = replicas[i].poll_transmit().expect("a promotion");
            assert_eq!(to, ME.client);
            (i, r)
        })
        .collect();
    let step = c.srtt() * 3 / 5;
    let mut now = release;
    let mut stale_view_said_yield = false;
    for (k, (i, r)) in notices.into_iter().enumerate() {
        now += step;
        c.handle_timeout(now);
        c.handle_response(now, i, r).unwrap();
        stale_view_said_yield |= c.phase() == Phase::Waiting && nobody_can_win(&c, n, m);
        c.handle_timeout(now + step / 2);
        assert!(yields(&drain(&mut c)).is_empty(), "spurious YIELD after {} promotions", k + 1);
        if k + 1 < m {
            assert_eq!(c.phase(), Phase::Waiting);
        } else {
            assert_eq!(c.phase(), Phase::Holding, "won with {} promotions", k + 1);
            break;
        }
    }
    assert!(stale_view_said_yield, "the scenario does reach case 3 on the stale table");
    assert_eq!(c.stats().yield_rounds, 0);
    assert!(matches!(events(&mut c)[..], [Event::Acquired { votes: 4, .. }]));
}

// Reference: docs/design/protocol-decisions.md, "Response ordering": a RESPONSE naming a different owner for a replica
// already counted replaces the entry, never adds to it.
#[test]
fn a_response_naming_another_owner_replaces_the_entry() {
    let mut c = client(config());
    c.handle_response(T0, 0, answer(ME, 10, T0)).unwrap();
    c.handle_response(T0, 0, answer(ME, 10, T0)).unwrap();
    assert_eq!(c.votes(), 1, "the same vote twice is one vote");
    c.handle_response(T0, 0, answer(B, 11, T0)).unwrap();
    assert_eq!(c.votes(), 0);
    assert_eq!(c.views()[0].owner, Some(B));
    c.handle_response(T0, 0, answer(C, 12, T0)).unwrap();
    c.handle_response(T0, 1, answer(C, 12, T0)).unwrap();
    assert_eq!(c.views().iter().filter(|v| v.owner.is_some()).count(), 2, "j counts replicas");
    c.handle_response(T0, 0, answer(ME, 13, T0)).unwrap();
    assert_eq!((c.votes(), c.views()[0].owner), (1, Some(ME)));
}

// Reference: client doc: responses older than the one applied (lower grant stamp) are
// discarded, since the network does not keep order.
#[test]
fn stale_responses_are_rejected_and_change_nothing() {
    let mut c = client(config());
    c.handle_response(T0, 0, answer(B, 200, T0)).unwrap();
    let before = c.poll_timeout();
    assert_eq!(c.handle_response(T0 + ms(5), 0, answer(ME, 100, T0)), Err(ClientError::Stale));
    assert_eq!((c.votes(), c.views()[0].owner, c.views()[0].stamp), (0, Some(B), 200));
    assert_eq!(c.poll_timeout(), before);
    assert_eq!((c.stats().stale, c.stats().responses), (1, 1));
    assert!(drain(&mut c).is_empty() && events(&mut c).is_empty());
}

// Reference: §4 informed backoff: "replica could predict the expected waiting time T_w
// and advise it to wait so long before next retry"; the retry re-sends the REQUEST with
// the same timestamp so the replica re-queues it in its original place.
#[test]
fn informed_backoff_retry_resends_the_same_timestamp_after_the_advice() {
    let mut c = client(config().with_request_timeout(Duration::from_secs(60)));
    let now = T0 + ms(50);
    let advice = Duration::from_secs(2);
    c.handle_response(now, 3, Response { advice, ..answer(B, 7, T0) }).unwrap();
    let retry = c.views()[3].next_contact.expect("a retry is scheduled");
    assert!(retry >= now + advice && retry <= now + advice + 2 * c.srtt(), "{retry:?}");
    c.handle_timeout(retry - Duration::from_nanos(1));
    assert!(drain(&mut c).is_empty(), "no retry before T_w");
    c.handle_timeout(retry);
    let out = drain(&mut c);
    assert_eq!(out, vec![(3, ToReplica::Request { ts: ME, sent: micros(retry), floor: 7 })]);
    assert_eq!(c.stats().retries, 1);
}

// Reference: §4 failure 4: a lost message looks like a crash; a replica that has not
// answered gets the REQUEST again after the request timeout.
#[test]
fn unanswered_replicas_get_the_request_again_after_the_timeout() {
    let mut c = client(config());
    for i in 0..3 {
        c.handle_response(T0 + ms(30), i, answer(B, 5, T0)).unwrap();
    }
    c.handle_timeout(T0 + REQUEST_TIMEOUT - Duration::from_nanos(1));
    assert!(drain(&mut c).is_empty());
    c.handle_timeout(T0 + REQUEST_TIMEOUT);
    let out = drain(&mut c);
    assert_eq!(requests(&out), vec![3, 4]);
    assert!(out.iter().all(|(_, m)| m.ts() == &ME));
    assert_eq!(c.stats().retries, 2);
}

// Reference: §4 failure 3: "the holder renews while in the CS"; the renewal carries the
// fencing token (docs/design/protocol-decisions.md, "Fencing token").
#[test]
fn holding_client_renews_its_votes_with_its_token() {
    let mut c = holding(config());
    assert_eq!(c.poll_timeout(), Some(T0 + RENEW));
    c.handle_timeout(T0 + RENEW - Duration::from_nanos(1));
    assert!(drain(&mut c).is_empty());
    let at = T0 + RENEW;
    c.handle_timeout(at);
    let out = drain(&mut c);
    assert_eq!(requests(&out), vec![0, 1, 2], "only the votes held");
    for (_, m) in &out {
        assert_eq!(*m, ToReplica::Request { ts: ME, sent: micros(at), floor: 300 });
    }
    assert_eq!(c.stats().renewals, 3);
    for (i, s) in [(0, 100), (1, 300), (2, 200)] {
        c.handle_response(at + ms(30), i, answer(ME, s, at)).unwrap();
    }
    assert_eq!(c.valid_until(), Some(at + LEASE));
    assert_eq!(c.phase(), Phase::Holding);
    assert!(events(&mut c).is_empty());
}

// Reference: client doc and the Fig. 2 argument: after the win, the holder must keep m
// votes (fewer, and two quorums need not share 2m − n replicas that each reset). n = 5,
// m = 3: 3 votes keep it, 2 lose it.
#[test]
fn votes_falling_to_n_minus_m_lose_the_lock() {
    let mut c = holding(config());
    c.handle_response(T0 + ms(1), 3, answer(ME, 60, T0)).unwrap();
    c.handle_response(T0 + ms(2), 0, answer(C, 101, T0)).unwrap();
    assert_eq!((c.phase(), c.votes()), (Phase::Holding, 3));
    assert!(events(&mut c).is_empty());
    c.handle_response(T0 + ms(3), 1, answer(C, 301, T0)).unwrap();
    assert_eq!((c.phase(), c.votes()), (Phase::Lost, 2));
    assert_eq!(events(&mut c), vec![Event::Lost(LostReason::VotesTaken)]);
    assert_eq!(c.poll_timeout(), None, "no more renewals");
    c.handle_timeout(T0 + RENEW);
    assert!(drain(&mut c).is_empty());
}

// Reference: §4 failure 3 from the holder's side: without renewal acknowledgements the
// lock is lost when fewer than m of its votes may still be live.
#[test]
fn no_renewal_acks_lose_the_lock_at_valid_until() {
    let mut c = holding(config());
    let deadline = T0 + LEASE;
    assert_eq!(c.valid_until(), Some(deadline));
    let mut now = T0;
    while now + RENEW < deadline {
        now += RENEW;
        c.handle_timeout(now);
        assert_eq!(c.phase(), Phase::Holding);
    }
    c.handle_timeout(deadline - Duration::from_nanos(1));
    assert_eq!(c.phase(), Phase::Holding);
    assert_eq!(c.poll_timeout().map(|t| t <= deadline), Some(true));
    c.handle_timeout(deadline);
    assert_eq!(c.phase(), Phase::Lost);
    assert_eq!(events(&mut c), vec![Event::Lost(LostReason::LeaseExpired)]);
}

// Reference: Fig. 5 Release: RELEASE to all n replicas (owner, waiter, or neither).
#[test]
fn release_sends_release_to_all_and_is_idempotent() {
    let mut c = holding(config());
    c.release(T0 + ms(5));
    let out = drain(&mut c);
    assert_eq!(out.len(), 5);
    for (k, (i, m)) in out.iter().enumerate() {
        assert_eq!((*i, m), (k, &ToReplica::Release { ts: ME, token: 300, next: vec![] }));
    }
    assert_eq!(c.phase(), Phase::Released);
    assert_eq!(c.poll_timeout(), None);
    c.release(T0 + ms(6));
    assert!(drain(&mut c).is_empty(), "idempotent");
    assert_eq!(c.stats().releases, 5);
    c.handle_response(T0 + ms(7), 3, answer(ME, 77, T0)).unwrap();
    c.handle_timeout(T0 + LEASE * 2);
    assert!(drain(&mut c).is_empty() && events(&mut c).is_empty());
    assert_eq!(c.votes(), 3, "responses after the release are ignored");

    // Abandoning a wait is a release too, with no token.
    let mut w = client(config());
    w.release(T0);
    assert!(drain(&mut w).iter().all(|(_, m)| *m == ToReplica::Release { ts: ME, token: 0, next: vec![] }));
}

// Reference: error.rs: remote misbehaviour is a value and changes nothing.
#[test]
fn out_of_range_replica_and_wrong_acquisition_are_errors_that_change_nothing() {
    let mut c = client(config());
    c.handle_response(T0, 0, answer(ME, 10, T0)).unwrap();
    let (votes, timeout, stats) = (c.votes(), c.poll_timeout(), c.stats().clone());
    assert_eq!(c.handle_response(T0, 5, answer(ME, 11, T0)), Err(ClientError::ReplicaOutOfRange { index: 5, n: 5 }));
    let other = Response { ts: B, ..answer(ME, 11, T0) };
    assert_eq!(c.handle_response(T0, 1, other), Err(ClientError::WrongAcquisition));
    assert_eq!((c.votes(), c.poll_timeout(), c.stats()), (votes, timeout, &stats));
    assert_eq!(c.views()[1].owner, None);
    assert!(drain(&mut c).is_empty() && events(&mut c).is_empty());
}

// Reference: client doc, "responses arriving after the win are applied ... and never
// undo it unless the client's votes fall to n − m or fewer".
#[test]
fn responses_after_the_win_add_votes_and_do_not_undo_it() {
    let mut c = holding(config());
    c.handle_response(T0 + ms(1), 3, promotion(70)).unwrap();
    assert_eq!(c.votes(), 4);
    c.handle_response(T0 + ms(2), 3, answer(C, 80, T0)).unwrap();
    c.handle_response(T0 + ms(2), 4, answer(C, 81, T0)).unwrap();
    assert_eq!((c.phase(), c.votes(), c.token()), (Phase::Holding, 3, 300));
    assert!(events(&mut c).is_empty());
}

// Reference: §4 lease + client doc (conservative lease accounting). A vote whose lease
// has lapsed by the client's own account may be someone else's by now: counting it
// would announce a lock that is already invalid (or not exclusive).
#[test]
fn a_lapsed_vote_does_not_count_toward_the_win() {
    let mut c = client(config().with_quorum(3, 2));
    let late = T0 + LEASE + ms(1);
    c.handle_response(late, 0, answer(ME, 10, T0)).unwrap(); // answered at T0, delivered late
                                                             // Promoted a lease after the replica received our REQUEST: still live now.
    c.handle_response(late, 1, Response { grant_delay: LEASE, ..promotion(20) }).unwrap();
    assert_eq!((c.votes(), c.phase()), (2, Phase::Waiting), "only one live vote");
    assert!(events(&mut c).is_empty());
    c.handle_response(late + ms(5), 0, answer(ME, 10, late)).unwrap(); // renewed
    assert_eq!(c.phase(), Phase::Holding);
    let valid_until = match events(&mut c)[..] {
        [Event::Acquired { valid_until, .. }] => valid_until,
        ref e => panic!("{e:?}"),
    };
    assert!(valid_until > late + ms(5));
}

// Reference: Fig. 5 case 3 `Clear(resp[i])` under §2's reordered and duplicated
// messages: a RESPONSE that still names us under the grant we yielded was sent before
// the replica applied the YIELD; it is no vote. A newer grant is.
#[test]
fn a_yielded_vote_is_not_restored_by_an_older_response() {
    let mut c = client(config().with_quorum(3, 2));
    c.handle_response(T0, 0, answer(ME, 10, T0)).unwrap();
    c.handle_response(T0, 1, answer(B, 11, T0)).unwrap();
    c.handle_response(T0, 2, answer(C, 12, T0)).unwrap();
    c.handle_timeout(T0 + c.srtt());
    assert_eq!(yields(&drain(&mut c)), vec![(0, 10)]);
    assert_eq!(c.views()[0].yielded, Some(10));
    assert_eq!(c.handle_response(T0 + ms(200), 0, answer(ME, 10, T0 + ms(150))), Err(ClientError::Stale));
    assert_eq!(c.votes(), 0);
    c.handle_response(T0 + ms(210), 0, promotion(15)).unwrap();
    assert_eq!((c.votes(), c.views()[0].yielded), (1, None));
}

// Reference: Fig. 5 case 3 + §4 failure 4: if neither the YIELD nor its answer arrives,
// the retry sends the YIELD again (harmless: it names the grant) with a REQUEST.
#[test]
fn a_yield_left_unanswered_is_sent_again_with_the_retry() {
    let mut c = client(config().with_quorum(3, 2));
    c.handle_response(T0, 0, answer(ME, 10, T0)).unwrap();
    c.handle_response(T0, 1, answer(B, 11, T0)).unwrap();
    c.handle_response(T0, 2, answer(C, 12, T0)).unwrap();
    let at = T0 + c.srtt();
    c.handle_timeout(at);
    drain(&mut c);
    c.handle_timeout(at + REQUEST_TIMEOUT);
    let out = drain(&mut c);
    assert_eq!(yields(&out), vec![(0, 10)]);
    assert_eq!(requests(&out), vec![0]);
}

// Reference: client code comment: a vote held while still waiting, with an earlier
// acquisition owning another replica, is renewed by YIELD (the replica re-decides by
// timestamp); the YIELD names the grant it renews. With no earlier one in sight it is
// renewed by REQUEST and kept.
#[test]
fn a_vote_held_while_waiting_is_renewed_by_yield_when_an_earlier_one_is_in_sight() {
    let mut c = client(config().with_request_timeout(Duration::from_secs(60)));
    c.handle_response(T0, 2, answer(ME, 42, T0)).unwrap();
    let late: Ts = Timestamp { counter: 1_100, client: 4 };
    c.handle_response(T0, 3, answer(late, 43, T0)).unwrap();
    assert_eq!(c.views()[2].next_contact, Some(T0 + RENEW));
    c.handle_timeout(T0 + RENEW);
    let out = drain(&mut c);
    assert_eq!((yields(&out), requests(&out)), (vec![], vec![2]), "only a later one in sight: renewed, not yielded");
    assert_eq!((c.votes(), c.views()[2].owner), (1, Some(ME)));
    c.handle_response(T0 + RENEW, 4, answer(B, 44, T0)).unwrap();
    c.handle_response(T0 + RENEW + ms(10), 2, answer(ME, 45, T0 + RENEW)).unwrap();
    c.handle_timeout(T0 + RENEW * 2 + ms(10));
    let out = drain(&mut c);
    assert_eq!(yields(&out), vec![(2, 45)], "B is earlier than ME: yielded");
    assert_eq!((c.votes(), c.views()[2].owner), (0, None));
}

// Reference: error.rs "never a panic" on remote input: a replica granting a lease
// shorter than our renew interval is renewed at the latest when that lease ends.
#[test]
fn a_lease_shorter_than_the_renew_interval_does_not_panic() {
    let mut c = holding(config());
    let short = Response { lease: ms(500), ..answer(ME, 100, T0 + ms(10)) };
    c.handle_response(T0 + ms(20), 0, short).unwrap();
    let v = &c.views()[0];
    assert!(v.next_contact.is_some_and(|t| t <= T0 + LEASE));
}

// Reference: client doc: the YIELD gate uses a smoothed round trip measured from echoed
// REQUESTs (promotions are not replies and do not count).
#[test]
fn round_trip_estimate_follows_echoed_requests_only() {
    let mut c = client(config());
    assert_eq!(c.srtt(), RTT);
    c.handle_response(T0 + ms(40), 0, answer(B, 5, T0)).unwrap();
    assert_eq!(c.srtt(), (RTT * 7 + ms(40)) / 8);
    let before = c.srtt();
    c.handle_response(T0 + Duration::from_secs(3), 1, promotion(9)).unwrap();
    assert_eq!(c.srtt(), before);
}

// Reference: §4 (lease) and the Fig. 2 argument. n = 5, m = 3: a holder of all five
// votes whose renewals reach only two replicas loses the lock when the third-latest
// lease ends, not the (n − m + 1)-th: on two live votes another client could win with
// the three others and a single reset (2m − n = 1 here, but n − m + 1 = 3 at 5/3
// would have kept it valid on one vote).
#[test]
fn the_holder_is_valid_while_m_of_its_votes_are_live() {
    let mut c = client(config());
    for i in 0..5 {
        c.handle_response(T0, i, answer(ME, 100 + i as u64, T0)).unwrap();
    }
    assert_eq!(c.phase(), Phase::Holding);
    let later = T0 + RENEW;
    for i in [3, 4] {
        c.handle_response(later, i, answer(ME, 100 + i as u64, later)).unwrap();
    }
    assert_eq!(c.valid_until(), Some(T0 + LEASE), "the third-latest lease: replicas 0–2");
    c.handle_timeout(T0 + LEASE);
    assert_eq!(c.phase(), Phase::Lost);
    assert_eq!(events(&mut c).last(), Some(&Event::Lost(LostReason::LeaseExpired)));
}

// Reference: §4 (lease), Fig. 6 `RespQueue`. A promotion notice counts from our own
// REQUEST's send time plus the time the replica kept us queued, however long the notice
// then spent in flight: a notice that arrives after its lease ended is no vote.
#[test]
fn a_promotion_counts_only_what_is_left_of_its_lease() {
    let mut c = client(config().with_quorum(3, 2));
    let queued = Duration::from_secs(2);
    let notice = |stamp| Response { grant_delay: queued, ..promotion(stamp) };
    let on_time = T0 + queued + ms(50);
    c.handle_response(on_time, 0, notice(10)).unwrap();
    assert_eq!(c.views()[0].vote_until, Some(T0 + queued + LEASE));
    let late = T0 + queued + LEASE + ms(1); // held back past its lease
    c.handle_response(late, 1, notice(20)).unwrap();
    assert_eq!(c.phase(), Phase::Waiting, "the late notice is no live vote");
    assert_eq!(c.views()[1].vote_until, Some(T0 + queued + LEASE));
}

// Reference: DESIGN "Safety is probabilistic" assumes clocks that agree on durations: a
// lease is counted shorter by the drift bound (1,000 ppm by default), so a replica whose
// clock runs slow does not hold the vote longer than the client believes.
#[test]
fn leases_are_shortened_by_the_drift_bound() {
    let mut c = client(config().with_max_drift_ppm(1_000));
    c.handle_response(T0 + ms(20), 0, answer(ME, 1, T0)).unwrap();
    assert_eq!(c.views()[0].vote_until, Some(T0 + LEASE - LEASE / 1_000));
}

// Reference: §4 (Lamport clocks), bounded as hybrid logical clocks bound them: a grant
// stamp or owner timestamp far ahead of the client's clock (u64::MAX from a faulty or
// hostile host) is refused and changes nothing.
#[test]
fn responses_far_ahead_of_the_clock_are_refused() {
    let mut c = client(config());
    let now = T0 + ms(20);
    let far = micros(now) + 3_600_000_000;
    assert_eq!(c.handle_response(now, 0, answer(ME, u64::MAX, T0)), Err(ClientError::Ahead { value: u64::MAX }));
    let owner = Timestamp { counter: far, client: 9 };
    assert_eq!(c.handle_response(now, 1, answer(owner, 5, T0)), Err(ClientError::Ahead { value: far }));
    assert_eq!((c.votes(), c.views()[0].stamp, c.views()[1].owner), (0, 0, None));
}

// Quorum diversity: m votes from one voter (a one-peer island hosting every replica it
// can see) do not win; a vote from a second peer does.
#[test]
fn a_win_needs_votes_from_d_distinct_voters() {
    let mut c = client(config().with_min_voters(2));
    let island = 7;
    for i in 0..4 {
        c.handle_response_from(T0 + RTT, i, island, answer(ME, 10 + i as u64, T0)).unwrap();
    }
    assert_eq!(c.votes(), 4);
    assert_eq!(c.phase(), Phase::Waiting, "four votes from one peer are one voter");
    assert!(events(&mut c).is_empty());
    c.handle_response_from(T0 + RTT, 4, 8, answer(ME, 20, T0)).unwrap();
    assert_eq!(c.phase(), Phase::Holding);
    assert!(matches!(events(&mut c).as_slice(), [Event::Acquired { votes: 5, .. }]));
}

// The driver lowers D when the lock's keys came to fall on one peer: a waiter short of
// voters only wins at once; a lower D never raises, and a waiter short of votes waits.
#[test]
fn lowering_diversity_wins_with_the_votes_held() {
    let mut c = client(config().with_min_voters(2));
    let now = T0 + RTT;
    c.handle_response_from(now, 0, 7, answer(ME, 10, T0)).unwrap();
    c.handle_response_from(now, 1, 7, answer(ME, 11, T0)).unwrap();
    assert!(!c.short_of_voters(now), "two votes of m = 3 are short of votes, not of voters");
    c.lower_min_voters(now, 1);
    assert_eq!((c.phase(), c.min_voters()), (Phase::Waiting, 1));
    c.lower_min_voters(now, 2);
    assert_eq!(c.min_voters(), 1, "never raised");
    let mut c = client(config().with_min_voters(2));
    for i in 0..3 {
        c.handle_response_from(now, i, 7, answer(ME, 10 + i as u64, T0)).unwrap();
    }
    assert!(c.short_of_voters(now));
    assert_eq!(c.phase(), Phase::Waiting);
    c.lower_min_voters(now, 0);
    assert_eq!(c.phase(), Phase::Waiting, "D = 0 is ignored");
    c.lower_min_voters(now, 1);
    assert_eq!(c.phase(), Phase::Holding);
    assert!(matches!(events(&mut c).as_slice(), [Event::Acquired { votes: 3, .. }]));
}

// Without named voters (the simulator, the model checker) every replica is its own.
#[test]
fn unnamed_voters_count_one_per_replica() {
    let mut c = client(config().with_min_voters(3));
    for i in 0..3 {
        c.handle_response(T0 + RTT, i, answer(ME, 10 + i as u64, T0)).unwrap();
    }
    assert_eq!(c.phase(), Phase::Holding);
}

#[test]
fn diversity_must_be_between_one_and_m() {
    assert!(config().with_min_voters(0).validate().is_err());
    assert!(config().with_min_voters(4).validate().is_err());
    assert!(config().with_min_voters(3).validate().is_ok());
}
