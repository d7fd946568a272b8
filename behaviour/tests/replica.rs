//! Unit tests of the replica, one handler at a time (paper Fig. 6 and §4).

use std::time::Duration;

use sigma_behaviour::proto::clock::micros;
use sigma_behaviour::proto::{Config, Replica, ReplicaError, Response, Time, Timestamp, ToReplica};

type Ts = Timestamp<u32>;

const T0: Time = Duration::from_secs(1);
const LEASE: Duration = Duration::from_secs(10);
const TCS: Duration = Duration::from_millis(400);
const GRACE: Duration = Duration::from_secs(1);

fn ms(x: u64) -> Duration {
    Duration::from_millis(x)
}

fn config() -> Config {
    Config::default()
        .with_quorum(5, 3)
        .with_lease(LEASE)
        .with_initial_tcs(TCS)
        .with_advice_bounds(ms(10), Duration::from_secs(60))
        .with_queue_grace(GRACE)
        .with_tombstone_ttl(Duration::from_secs(30))
        // Idle replicas kept as long as their tombstones, unless a test says otherwise.
        .with_idle_ttl(Duration::from_secs(30))
}

fn replica() -> Replica<u32> {
    Replica::new(config())
}

fn ts(counter: u64, client: u32) -> Ts {
    Timestamp::new(counter, client)
}

fn request(r: &mut Replica<u32>, now: Time, t: Ts) -> Result<(), ReplicaError> {
    request_floor(r, now, t, 0)
}

fn request_floor(r: &mut Replica<u32>, now: Time, t: Ts, floor: u64) -> Result<(), ReplicaError> {
    let from = t.client;
    r.handle(now, &from, ToReplica::Request { ts: t, sent: micros(now), floor })
}

fn release(r: &mut Replica<u32>, now: Time, t: Ts, token: u64) -> Result<(), ReplicaError> {
    let from = t.client;
    r.handle(now, &from, ToReplica::Release { ts: t, token, next: vec![] })
}

fn yield_(r: &mut Replica<u32>, now: Time, t: Ts, stamp: u64) -> Result<(), ReplicaError> {
    let from = t.client;
    r.handle(now, &from, ToReplica::Yield { ts: t, stamp })
}

fn drain(r: &mut Replica<u32>) -> Vec<(u32, Response<u32>)> {
    std::iter::from_fn(|| r.poll_transmit()).collect()
}

/// The single message sent since the last drain.
fn only(r: &mut Replica<u32>) -> Response<u32> {
    let mut out = drain(r);
    assert_eq!(out.len(), 1, "expected exactly one response: {out:?}");
    let (to, resp) = out.pop().expect("one message");
    assert_eq!(to, resp.ts.client, "a response goes to the client of its acquisition");
    resp
}

fn stamp(r: &Replica<u32>) -> u64 {
    r.owner().expect("an owner").1
}

fn owner(r: &Replica<u32>) -> Option<Ts> {
    r.owner().map(|(t, _)| *t)
}

fn queue(r: &Replica<u32>) -> Vec<Ts> {
    r.queue().copied().collect()
}

/// Owner `a`, then waiters in arrival order; all messages drained.
fn busy(a: Ts, waiters: &[Ts]) -> Replica<u32> {
    let mut r = replica();
    request(&mut r, T0, a).unwrap();
    for &w in waiters {
        request(&mut r, T0, w).unwrap();
    }
    drain(&mut r);
    r
}

/// Everything observable about a replica except its counters.
#[derive(Debug, PartialEq)]
struct Snapshot {
    owner: Option<(Ts, u64)>,
    lease_until: Option<Time>,
    queue: Vec<Ts>,
    tombstones: usize,
    timeout: Option<Time>,
    tcs: Duration,
}

fn snapshot(r: &Replica<u32>) -> Snapshot {
    Snapshot {
        owner: r.owner().map(|(t, s)| (*t, s)),
        lease_until: r.lease_until(),
        queue: queue(r),
        tombstones: r.tombstones(),
        timeout: r.poll_timeout(),
        tcs: r.tcs(),
    }
}

// Reference: Fig. 6 OnRequest, `C_owner = nil` branch.
#[test]
fn request_on_a_free_replica_grants_and_names_the_requester() {
    let mut r = replica();
    let a = ts(10, 1);
    request(&mut r, T0, a).unwrap();
    assert_eq!(owner(&r), Some(a));
    assert_eq!(r.lease_until(), Some(T0 + LEASE));
    assert!(stamp(&r) >= micros(T0), "hybrid stamp is at least the replica's clock");
    let resp = only(&mut r);
    assert_eq!(resp.ts, a);
    assert_eq!(resp.owner, a);
    assert_eq!(resp.stamp, stamp(&r));
    assert_eq!(resp.position, 0);
    assert_eq!(resp.advice, Duration::ZERO);
    assert_eq!(resp.lease, LEASE);
    assert_eq!(resp.echo, micros(T0));
    assert!(!resp.promoted);
    assert_eq!(r.stats().grants, 1);
    r.check_invariants().unwrap();
}

// Reference: Fig. 6 OnRequest `Queue.Insert(C, timestamp)`; §4 informed backoff
// `T_w = T_cs · (P + 1/2)`, P waiters ahead.
#[test]
fn request_on_a_busy_replica_queues_by_timestamp_and_advises_informed_backoff() {
    let a = ts(10, 1);
    let mut r = busy(a, &[]);
    let owner_stamp = stamp(&r);
    let (b, c, d) = (ts(30, 2), ts(40, 3), ts(20, 4));

    request(&mut r, T0, b).unwrap();
    let resp = only(&mut r);
    assert_eq!((resp.owner, resp.stamp), (a, owner_stamp), "the response names the current owner");
    assert_eq!((resp.position, resp.advice), (1, ms(200)), "T_cs · 1/2");
    assert!(!resp.promoted);

    request(&mut r, T0, c).unwrap();
    assert_eq!((only(&mut r).position, ms(600)), (2, ms(600)));

    // A later arrival with an earlier timestamp goes ahead: quasi-FCFS by timestamp.
    request(&mut r, T0, d).unwrap();
    let resp = only(&mut r);
    assert_eq!((resp.position, resp.advice), (1, ms(200)));
    assert_eq!(queue(&r), vec![d, b, c]);

    // "T_w is always updated upon the reception of a retry".
    request(&mut r, T0 + ms(50), c).unwrap();
    let resp = only(&mut r);
    assert_eq!((resp.position, resp.advice), (3, ms(1000)), "T_cs · (2 + 1/2)");
    assert_eq!(owner(&r), Some(a));
    r.check_invariants().unwrap();
}

// Reference: §4 informed backoff, bounded whatever the estimate says.
#[test]
fn advice_is_clamped_to_the_configured_bounds() {
    let cfg = config().with_initial_tcs(Duration::from_secs(100)).with_advice_bounds(ms(10), Duration::from_secs(3));
    let mut r = Replica::new(cfg);
    request(&mut r, T0, ts(1, 1)).unwrap();
    request(&mut r, T0, ts(2, 2)).unwrap();
    assert_eq!(drain(&mut r)[1].1.advice, Duration::from_secs(3));

    let cfg = config().with_initial_tcs(Duration::ZERO).with_advice_bounds(ms(70), Duration::from_secs(3));
    let mut r = Replica::new(cfg);
    request(&mut r, T0, ts(1, 1)).unwrap();
    request(&mut r, T0, ts(2, 2)).unwrap();
    assert_eq!(drain(&mut r)[1].1.advice, ms(70));
}

// Reference: Fig. 6 OnRelease (`C = C_owner`) and RespQueue: the head becomes owner and
// is sent an unsolicited RESPONSE.
#[test]
fn release_by_the_owner_promotes_the_queue_head() {
    let (a, b, c) = (ts(10, 1), ts(20, 2), ts(30, 3));
    let mut r = busy(a, &[b, c]);
    let old = stamp(&r);
    let now = T0 + ms(700);
    release(&mut r, now, a, 0).unwrap();
    assert_eq!(owner(&r), Some(b));
    assert_eq!(queue(&r), vec![c]);
    assert_eq!(r.lease_until(), Some(now + LEASE));
    let resp = only(&mut r);
    assert_eq!(resp.ts, b);
    assert_eq!(resp.owner, b);
    assert!(resp.promoted);
    assert_eq!((resp.position, resp.advice), (0, Duration::ZERO));
    assert!(resp.stamp > old, "a new grant has a new, larger stamp");
    assert_eq!(resp.stamp, stamp(&r));
    assert_eq!(resp.echo, micros(T0), "echo of B's last REQUEST");
    assert_eq!((r.stats().releases, r.stats().grants), (1, 2));
    r.check_invariants().unwrap();
}

// Reference: Fig. 6 OnRelease with an empty queue.
#[test]
fn release_by_the_owner_with_an_empty_queue_frees_the_replica() {
    let a = ts(10, 1);
    let mut r = busy(a, &[]);
    release(&mut r, T0 + ms(5), a, 0).unwrap();
    assert!(r.is_idle());
    assert!(drain(&mut r).is_empty());
    assert_eq!(r.poll_timeout(), None);
    assert_eq!(r.disposable_at(), Some(T0 + ms(5) + Duration::from_secs(30)), "once the tombstone has expired");
    assert_eq!(r.tombstones(), 1);
}

// Reference: Fig. 6 OnRelease, `Queue.Contains(C)` branch: a waiter gives up.
#[test]
fn release_by_a_waiter_removes_it_silently() {
    let (a, b, c) = (ts(10, 1), ts(20, 2), ts(30, 3));
    let mut r = busy(a, &[b, c]);
    let before = stamp(&r);
    release(&mut r, T0 + ms(5), c, 0).unwrap();
    assert_eq!(owner(&r), Some(a));
    assert_eq!(stamp(&r), before);
    assert_eq!(queue(&r), vec![b]);
    assert!(drain(&mut r).is_empty());
    r.check_invariants().unwrap();
}

// Reference: §4 failure 4 (unreliable channels): a duplicated or re-sent REQUEST with
// the same timestamp is one acquisition.
#[test]
fn duplicate_request_never_queues_twice() {
    let (a, b) = (ts(10, 1), ts(20, 2));
    let mut r = busy(a, &[b]);
    for k in 1..=3 {
        request(&mut r, T0 + ms(k), b).unwrap();
        let resp = only(&mut r);
        assert_eq!((resp.owner, resp.position), (a, 1));
    }
    request(&mut r, T0 + ms(9), a).unwrap();
    assert_eq!(only(&mut r).owner, a);
    assert_eq!(queue(&r), vec![b]);
    assert_eq!(r.stats().grants, 1);
    r.check_invariants().unwrap();
}

// Reference: §4 failure 3: "replica grants permission to clients with renewable lease";
// the owner's REQUEST is the renewal.
#[test]
fn owner_request_renews_its_lease() {
    let a = ts(10, 1);
    let mut r = busy(a, &[]);
    let granted = stamp(&r);
    let later = T0 + Duration::from_secs(6);
    request(&mut r, later, a).unwrap();
    assert_eq!(r.lease_until(), Some(later + LEASE));
    let resp = only(&mut r);
    assert_eq!((resp.owner, resp.stamp, resp.echo), (a, granted, micros(later)), "same grant, fresh echo");
    r.handle_timeout(T0 + LEASE);
    assert_eq!(owner(&r), Some(a), "the old deadline no longer applies");
    r.handle_timeout(later + LEASE);
    assert_eq!(owner(&r), None);
}

// Reference: Fig. 6 OnYield: the owner is re-queued under its original timestamp
// (`Queue.Insert(C, T_owner)`) and RespQueue promotes the earliest; the yielder, no
// longer owner, is told who is.
#[test]
fn yield_by_the_owner_requeues_it_and_promotes_the_earliest() {
    let (a, b) = (ts(20, 1), ts(10, 2));
    let mut r = busy(a, &[b]);
    let s = stamp(&r);
    yield_(&mut r, T0 + ms(3), a, s).unwrap();
    assert_eq!(owner(&r), Some(b));
    assert_eq!(queue(&r), vec![a], "A waits under its original timestamp");
    let out = drain(&mut r);
    assert_eq!(out.len(), 2, "{out:?}");
    let promoted = &out.iter().find(|(to, _)| *to == b.client).expect("notice to B").1;
    assert!(promoted.promoted);
    assert_eq!(promoted.owner, b);
    let told = &out.iter().find(|(to, _)| *to == a.client).expect("answer to A").1;
    assert_eq!((told.ts, told.owner, told.stamp, told.position), (a, b, promoted.stamp, 1));
    assert!(!told.promoted);
    assert_eq!(r.stats().yields, 1);
    r.check_invariants().unwrap();
}

// Reference: Fig. 6 OnYield when the yielder is itself the earliest: RespQueue hands
// the vote straight back to it, under a new grant.
#[test]
fn yield_by_the_earliest_owner_gives_the_vote_back_to_itself() {
    let (a, b) = (ts(10, 1), ts(20, 2));
    let mut r = busy(a, &[b]);
    let s = stamp(&r);
    yield_(&mut r, T0 + ms(3), a, s).unwrap();
    assert_eq!(owner(&r), Some(a));
    assert_eq!(queue(&r), vec![b]);
    let resp = only(&mut r);
    assert_eq!((resp.ts, resp.owner), (a, a));
    assert!(resp.promoted);
    assert!(resp.stamp > s);
    assert_eq!(r.lease_until(), Some(T0 + ms(3) + LEASE));
}

// Reference: Fig. 6 OnYield under §2's replicated messages. A copy of a YIELD that
// arrives after the re-grant it caused names the old grant and is not applied:
// applied, it would take back the vote the client was just told it holds.
#[test]
fn a_yield_of_an_earlier_grant_is_not_applied() {
    let (a, b) = (ts(10, 1), ts(20, 2));
    let mut r = busy(a, &[]);
    let first = stamp(&r);
    yield_(&mut r, T0 + ms(1), a, first).unwrap();
    let second = only(&mut r).stamp;
    request(&mut r, T0 + ms(2), b).unwrap();
    drain(&mut r);
    yield_(&mut r, T0 + ms(3), a, first).unwrap();
    assert_eq!(r.owner().map(|(t, s)| (*t, s)), Some((a, second)));
    assert_eq!(queue(&r), vec![b]);
    let resp = only(&mut r);
    assert_eq!((resp.owner, resp.stamp, resp.promoted), (a, second, false), "told it still owns");
    assert_eq!(r.stats().yields, 1);
}

// Reference: plain-text Fig. 6 OnYield, `if (C != C_owner) SendResponse`: a waiter's
// YIELD (say, a re-sent one) is answered with the current owner and changes nothing.
#[test]
fn yield_by_a_waiter_is_answered_with_the_owner() {
    let (a, b, c) = (ts(10, 1), ts(20, 2), ts(30, 3));
    let mut r = busy(a, &[b, c]);
    let before = snapshot(&r);
    yield_(&mut r, T0 + ms(1), c, 1234).unwrap();
    let resp = only(&mut r);
    assert_eq!((resp.ts, resp.owner, resp.position), (c, a, 2));
    assert_eq!(snapshot(&r), before);
}

// Reference: §4 failure 3: "When the lease expires, replica will grant permission to
// the next client (if any) in the queue."
#[test]
fn lease_expiry_hands_the_vote_to_the_queue_head() {
    let mut r = Replica::new(config().with_queue_grace(Duration::from_secs(30)));
    let (a, b) = (ts(10, 1), ts(20, 2));
    request(&mut r, T0, a).unwrap();
    request(&mut r, T0, b).unwrap();
    drain(&mut r);
    let deadline = T0 + LEASE;
    assert_eq!(r.poll_timeout(), Some(deadline));
    r.handle_timeout(deadline - Duration::from_nanos(1));
    assert_eq!(owner(&r), Some(a));
    assert!(drain(&mut r).is_empty());
    r.handle_timeout(deadline);
    assert_eq!(owner(&r), Some(b));
    assert!(r.queue_len() == 0);
    let resp = only(&mut r);
    assert!(resp.promoted);
    assert_eq!(resp.owner, b);
    assert_eq!(r.lease_until(), Some(deadline + LEASE));
    assert_eq!(r.stats().lease_expiries, 1);

    r.handle_timeout(deadline + LEASE);
    assert!(r.is_idle(), "no waiter left: the replica is free");
    assert_eq!(r.poll_timeout(), None);
}

// Reference: §4: "A queued client that never comes back must not block the queue";
// the waiter TTL is twice the advised wait plus a grace (module doc).
#[test]
fn a_silent_waiter_expires_after_twice_its_advice_plus_the_grace() {
    let (a, b) = (ts(10, 1), ts(20, 2));
    let mut r = busy(a, &[b]);
    let ttl = ms(200) * 2 + GRACE;
    assert_eq!(r.poll_timeout(), Some(T0 + ttl));
    r.handle_timeout(T0 + ttl - Duration::from_nanos(1));
    assert_eq!(queue(&r), vec![b]);
    r.handle_timeout(T0 + ttl);
    assert!(queue(&r).is_empty());
    assert_eq!(r.stats().waiter_expiries, 1);
    assert_eq!(owner(&r), Some(a), "the owner is unaffected");
    release(&mut r, T0 + ttl + ms(1), a, 0).unwrap();
    assert!(r.is_idle());
    assert!(drain(&mut r).is_empty(), "nobody to promote");
}

// Reference: §4 informed backoff: a waiter that re-sends its REQUEST stays queued.
#[test]
fn a_waiter_that_retries_stays_queued() {
    let (a, b) = (ts(10, 1), ts(20, 2));
    let mut r = busy(a, &[b]);
    let ttl = ms(200) * 2 + GRACE;
    let retry = T0 + ms(300);
    request(&mut r, retry, b).unwrap();
    r.handle_timeout(T0 + ttl);
    assert_eq!(queue(&r), vec![b]);
    r.handle_timeout(retry + ttl);
    assert!(queue(&r).is_empty());
}

// Reference: Fig. 6 RespQueue with §4's silent waiters: a promotion skips a waiter whose
// time is up even if no timer has removed it yet.
#[test]
fn promotion_skips_waiters_whose_time_is_up() {
    let (a, b, c) = (ts(10, 1), ts(20, 2), ts(30, 3));
    let mut r = busy(a, &[b]);
    let late = T0 + Duration::from_secs(2);
    request(&mut r, late, c).unwrap();
    drain(&mut r);
    release(&mut r, late, a, 0).unwrap();
    assert_eq!(owner(&r), Some(c));
    assert_eq!(only(&mut r).ts, c);
    assert_eq!(r.stats().waiter_expiries, 1);
}

// Reference: docs/design/protocol-decisions.md, "Tombstones": no FIFO between peers, so a RELEASE can overtake its
// own REQUEST; the tombstone keeps the late REQUEST from resurrecting the acquisition.
#[test]
fn a_request_overtaken_by_its_release_does_not_resurrect_the_acquisition() {
    let (a, b) = (ts(10, 1), ts(20, 2));
    let mut r = busy(a, &[]);
    assert_eq!(release(&mut r, T0, b, 0), Err(ReplicaError::NotHolder));
    assert_eq!(r.tombstones(), 1);
    assert_eq!(request(&mut r, T0 + ms(1), b), Err(ReplicaError::Finished));
    assert!(drain(&mut r).is_empty());
    assert_eq!(queue(&r), vec![]);

    // The same for a duplicate of the owner's REQUEST after its RELEASE.
    release(&mut r, T0 + ms(2), a, 0).unwrap();
    assert_eq!(request(&mut r, T0 + ms(3), a), Err(ReplicaError::Finished));
    assert!(r.is_idle());
    assert!(drain(&mut r).is_empty());
    assert_eq!(release(&mut r, T0 + ms(4), a, 0), Err(ReplicaError::Finished), "a duplicate RELEASE too");
    assert_eq!(yield_(&mut r, T0 + ms(4), a, 0), Err(ReplicaError::Finished));

    // Tombstones are forgotten after their lifetime.
    let _ = request(&mut r, T0 + Duration::from_secs(31), ts(99, 9));
    assert_eq!(r.tombstones(), 0);
}

// Reference: docs/design/protocol-decisions.md, "Tombstones" and "Bounds".
#[test]
fn tombstones_are_bounded() {
    let mut r = Replica::new(config().with_state_bounds(100, 3));
    for k in 0..10 {
        release(&mut r, T0, ts(k, 5), 0).unwrap_err();
        r.check_invariants().unwrap();
    }
    assert_eq!(r.tombstones(), 3);
    assert_eq!(request(&mut r, T0, ts(9, 5)), Err(ReplicaError::Finished), "the newest are kept");
    assert!(request(&mut r, T0, ts(0, 5)).is_ok(), "the oldest were dropped");
}

// Reference: §4: "T_CS is the average CS duration, as observed by the replica of
// interval between any two consecutive release operations" (EWMA with weight 1/8;
// time the replica sat free is not CS time).
#[test]
fn tcs_estimate_follows_the_intervals_between_releases() {
    let mut r = replica();
    assert_eq!(r.tcs(), TCS);
    let mut now = T0;
    let a = ts(1, 1);
    request(&mut r, now, a).unwrap();
    now += Duration::from_secs(2);
    release(&mut r, now, a, 0).unwrap();
    assert_eq!(r.tcs(), (TCS * 7 + Duration::from_secs(2)) / 8);
    assert_eq!(r.tcs(), Duration::from_micros(600_000));

    // Idle for 7 s, then held for 0.5 s: the sample is 0.5 s.
    now += Duration::from_secs(7);
    let b = ts(2, 2);
    request(&mut r, now, b).unwrap();
    now += ms(500);
    release(&mut r, now, b, 0).unwrap();
    assert_eq!(r.tcs(), Duration::from_micros(587_500));

    // A busy stretch: one handoff per second converges to 1 s.
    let mut holder = ts(3, 3);
    request(&mut r, now, holder).unwrap();
    for k in 4..60 {
        let next = ts(k, k as u32);
        request(&mut r, now, next).unwrap();
        now += Duration::from_secs(1);
        release(&mut r, now, holder, 0).unwrap();
        holder = next;
    }
    let tcs = r.tcs();
    assert!(tcs > ms(990) && tcs <= Duration::from_secs(1), "{tcs:?}");
    drain(&mut r);
    request(&mut r, now, ts(100, 100)).unwrap();
    let advice = only(&mut r).advice;
    assert_eq!(advice, tcs / 2, "advice follows the estimate");
}

// Reference: docs/design/protocol-decisions.md, "Response ordering": grant stamps strictly increase per replica,
// even within one tick of the clock.
#[test]
fn grant_stamps_strictly_increase_even_when_time_stands_still() {
    let mut r = replica();
    let mut last = 0;
    for k in 1..20 {
        let t = ts(k, k as u32);
        request(&mut r, T0, t).unwrap();
        let s = stamp(&r);
        assert!(s > last, "stamp {s} after {last}");
        last = s;
        match k % 3 {
            0 => release(&mut r, T0, t, 0).unwrap(),
            1 => r.handle_timeout(T0 + LEASE), // expiry, also a new owner next time
            _ => yield_(&mut r, T0, t, s).unwrap(), // re-granted to itself
        }
        if k % 3 == 2 {
            assert!(stamp(&r) > last);
            last = stamp(&r);
            release(&mut r, T0, t, 0).unwrap();
        }
    }
}

// Reference: docs/design/protocol-decisions.md, "Fencing token": the next grant is above every floor a REQUEST
// carried and every token a RELEASE or a renewal carried.
#[test]
fn grant_stamps_exceed_every_floor_and_token_seen() {
    let big = micros(T0) + 4_000_000; // ahead of the clock, within `max_clock_offset`
                                      // Floor of a REQUEST on a free replica.
    let mut r = replica();
    request_floor(&mut r, T0, ts(1, 1), big).unwrap();
    assert!(stamp(&r) > big);

    // Floor of a queued REQUEST, then the owner's RELEASE token: the promotion is above
    // both, although the release promotes in the same step.
    let (a, b, c) = (ts(10, 1), ts(20, 2), ts(30, 3));
    let mut r = busy(a, &[]);
    request_floor(&mut r, T0, b, big).unwrap();
    release(&mut r, T0, a, big + 10).unwrap();
    assert_eq!(owner(&r), Some(b));
    assert!(stamp(&r) > big + 10, "{} <= token {}", stamp(&r), big + 10);

    // The holder's renewal carries its token; if it then vanishes, the waiter promoted
    // on lease expiry still gets a larger stamp.
    let mut r = Replica::new(config().with_queue_grace(Duration::from_secs(60)));
    request(&mut r, T0, a).unwrap();
    request(&mut r, T0, c).unwrap();
    request_floor(&mut r, T0 + ms(1), a, big + 20).unwrap();
    r.handle_timeout(T0 + ms(1) + LEASE);
    assert_eq!(owner(&r), Some(c));
    assert!(stamp(&r) > big + 20, "{} <= renewal token {}", stamp(&r), big + 20);

    // A waiter's RELEASE token counts too.
    let mut r = busy(a, &[b]);
    release(&mut r, T0, b, big + 30).unwrap();
    release(&mut r, T0, a, 0).unwrap();
    request(&mut r, T0, c).unwrap();
    assert!(stamp(&r) > big + 30);
}

// Reference: ARCHITECTURE.md, "The core's shape": a message whose timestamp names another
// client than its sender is rejected (`ForeignAcquisition`); error.rs: on error nothing changed.
#[test]
fn messages_about_another_clients_acquisition_are_rejected_and_change_nothing() {
    let (a, b) = (ts(10, 1), ts(20, 2));
    let mut r = busy(a, &[b]);
    let s = stamp(&r);
    let before = snapshot(&r);
    let mallory = 66;
    for msg in [
        ToReplica::Release { ts: a, token: 0, next: vec![] },
        ToReplica::Yield { ts: a, stamp: s },
        ToReplica::Release { ts: b, token: 0, next: vec![] },
        ToReplica::Request { ts: b, sent: 0, floor: u64::MAX },
        ToReplica::Request { ts: ts(5, 7), sent: 0, floor: 0 },
    ] {
        assert_eq!(r.handle(T0 + ms(1), &mallory, msg), Err(ReplicaError::ForeignAcquisition));
    }
    assert_eq!(snapshot(&r), before);
    assert!(drain(&mut r).is_empty());
    assert_eq!(r.stats().rejected, 5);
    // The floor of the rejected REQUEST was not absorbed either.
    release(&mut r, T0 + ms(2), a, 0).unwrap();
    assert!(stamp(&r) < u64::MAX);
}

// Reference: Fig. 6 OnRelease/OnYield for a client that is neither `C_owner` nor queued:
// a no-op, reported as NotHolder (the RELEASE still leaves a tombstone, see the trap
// test above).
#[test]
fn release_or_yield_from_a_client_that_holds_nothing_is_not_holder() {
    let (a, b, c) = (ts(10, 1), ts(20, 2), ts(30, 3));
    let mut r = busy(a, &[b]);
    let before = snapshot(&r);
    assert_eq!(yield_(&mut r, T0 + ms(1), c, 0), Err(ReplicaError::NotHolder));
    assert_eq!(snapshot(&r), before);
    assert_eq!(release(&mut r, T0 + ms(1), c, 0), Err(ReplicaError::NotHolder));
    assert_eq!(r.owner().map(|(t, s)| (*t, s)), before.owner);
    assert_eq!(queue(&r), before.queue);
    assert_eq!(r.lease_until(), before.lease_until);
    assert!(drain(&mut r).is_empty());
    assert_eq!(r.stats().releases, 0);
}

// Reference: docs/design/protocol-decisions.md, "Bounds": the queue bound refuses new waiters only.
#[test]
fn queue_bound_rejects_new_waiters_only() {
    let mut r = Replica::new(config().with_state_bounds(2, 100));
    let (a, b, c, d) = (ts(10, 1), ts(20, 2), ts(30, 3), ts(5, 4));
    for t in [a, b, c] {
        request(&mut r, T0, t).unwrap();
    }
    drain(&mut r);
    let before = snapshot(&r);
    assert_eq!(request(&mut r, T0 + ms(1), d), Err(ReplicaError::QueueFull(2)));
    assert!(drain(&mut r).is_empty());
    assert_eq!(snapshot(&r), before);
    request(&mut r, T0 + ms(2), c).unwrap(); // a waiter's retry
    request(&mut r, T0 + ms(2), a).unwrap(); // the owner's renewal
    assert_eq!(drain(&mut r).len(), 2);
    r.check_invariants().unwrap();
}

// Reference: §2 "random reset": `Replica::new` is a replica that lost all memory; it
// votes again (the "change of heart" of §3).
#[test]
fn new_is_a_reset_that_wipes_everything() {
    let (a, b, c) = (ts(10, 1), ts(20, 2), ts(30, 3));
    let mut r = busy(a, &[b]);
    release(&mut r, T0 + ms(1), c, 0).unwrap_err();
    release(&mut r, T0 + Duration::from_secs(1), a, 0).unwrap();
    assert_eq!(owner(&r), Some(b));
    assert_eq!(r.tombstones(), 2);
    assert_ne!(r.tcs(), TCS);

    r = Replica::new(config());
    assert!(r.is_idle());
    assert_eq!((r.tombstones(), r.tcs(), r.poll_timeout()), (0, TCS, None));
    assert_eq!(*r.stats(), Default::default());
    assert!(drain(&mut r).is_empty());
    request(&mut r, T0 + Duration::from_secs(1), c).unwrap();
    assert_eq!(owner(&r), Some(c), "it votes for whoever asks first");
    request(&mut r, T0 + Duration::from_secs(1), a).unwrap();
    assert_eq!(queue(&r), vec![a], "and has forgotten A's release");
}

// Reference: module doc, "Spurious calls are harmless".
#[test]
fn spurious_timeouts_change_nothing() {
    let (a, b) = (ts(10, 1), ts(20, 2));
    let mut r = busy(a, &[b]);
    let before = snapshot(&r);
    for k in 0..10 {
        r.handle_timeout(T0 + ms(k * 100));
    }
    assert_eq!(snapshot(&r), before);
    assert!(drain(&mut r).is_empty());
}

// Reference: §4 (Lamport clocks), bounded as hybrid logical clocks bound them. One
// REQUEST with `floor: u64::MAX` would pin every later grant stamp at u64::MAX (the
// stale-response filter and the YIELD guard compare stamps); values further ahead of the
// replica's clock than `max_clock_offset` are refused and change nothing.
#[test]
fn values_far_ahead_of_the_clock_are_refused() {
    let mut r = replica();
    let far = micros(T0) + 3_600_000_000;
    assert_eq!(request_floor(&mut r, T0, ts(10, 1), u64::MAX), Err(ReplicaError::Ahead { value: u64::MAX }));
    assert_eq!(request(&mut r, T0, ts(far, 2)), Err(ReplicaError::Ahead { value: far }));
    assert_eq!(release(&mut r, T0, ts(10, 1), far), Err(ReplicaError::Ahead { value: far }));
    assert!(r.owner().is_none() && drain(&mut r).is_empty());
    request_floor(&mut r, T0, ts(10, 1), micros(T0) + 1_000).unwrap();
    let stamp = r.owner().map(|(_, s)| s).unwrap();
    assert_eq!(stamp, micros(T0) + 1_001, "a floor within the bound is absorbed");
}

// Reference: DESIGN "Fencing tokens": every replica that learns a holder's token grants
// above it. A holder whose vote here lapsed (and went to B) still sends its RELEASE with
// its token; the next grant here must exceed that token, though the RELEASE is refused.
#[test]
fn a_lapsed_holders_release_moves_the_stamps_past_its_token() {
    let mut r = replica();
    let (a, b, c) = (ts(10, 1), ts(20, 2), ts(30, 3));
    request(&mut r, T0, a).unwrap();
    r.handle_timeout(T0 + LEASE); // A's lease runs out; nobody waits
    request(&mut r, T0 + LEASE, b).unwrap();
    let token = micros(T0 + LEASE) + 1_000; // A's token, from another replica's stamp
    assert_eq!(release(&mut r, T0 + LEASE + ms(1), a, token), Err(ReplicaError::NotHolder));
    release(&mut r, T0 + LEASE + ms(2), b, 0).unwrap();
    request(&mut r, T0 + LEASE + ms(3), c).unwrap();
    let stamp = r.owner().map(|(_, s)| s).unwrap();
    assert!(stamp > token, "next grant {stamp} above the lapsed holder's token {token}");
}

// Reference: Fig. 6 `RespQueue`. The promotion notice tells the waiter how long after its
// last REQUEST arrived the lease started, so the waiter can bound the lease from its own
// send time whatever the notice's transit time.
#[test]
fn a_promotion_reports_how_long_the_waiter_was_queued() {
    let mut r = replica();
    let (a, b) = (ts(10, 1), ts(20, 2));
    request(&mut r, T0, a).unwrap();
    request(&mut r, T0 + ms(100), b).unwrap();
    drain(&mut r);
    release(&mut r, T0 + ms(700), a, 0).unwrap();
    let out = drain(&mut r);
    let notice = &out.iter().find(|(to, _)| *to == 2).expect("B is told").1;
    assert!(notice.promoted);
    assert_eq!((notice.echo, notice.grant_delay), (micros(T0 + ms(100)), ms(600)));
    request(&mut r, T0 + ms(900), b).unwrap(); // a renewal: the lease restarts on arrival
    assert_eq!(drain(&mut r)[0].1.grant_delay, Duration::ZERO);
}

// A REQUEST the driver held before handing it over (an ownership check) counts from when
// it reached the host: the grant delay includes the time held, for a first grant, a
// renewal and a later promotion alike; a `heard` after `now` counts as `now`.
#[test]
fn a_request_held_by_the_driver_counts_from_its_arrival() {
    let mut r = replica();
    let (a, b) = (ts(10, 1), ts(20, 2));
    let sent = micros(T0);
    r.handle_heard(T0 + ms(300), T0 + ms(100), &1, ToReplica::Request { ts: a, sent, floor: 0 }).unwrap();
    let grant = only(&mut r);
    assert_eq!((grant.owner, grant.echo, grant.grant_delay), (a, sent, ms(200)));
    r.handle_heard(T0 + ms(900), T0 + ms(500), &1, ToReplica::Request { ts: a, sent, floor: 0 }).unwrap();
    assert_eq!(only(&mut r).grant_delay, ms(400), "a renewal held 400 ms");
    r.handle_heard(T0 + ms(1_000), T0 + ms(950), &2, ToReplica::Request { ts: b, sent, floor: 0 }).unwrap();
    drain(&mut r);
    release(&mut r, T0 + ms(1_200), a, 0).unwrap();
    let out = drain(&mut r);
    let notice = &out.iter().find(|(to, _)| *to == 2).expect("B is told").1;
    assert_eq!(notice.grant_delay, ms(250), "queued from its arrival at 950 ms");
    r.handle_heard(T0 + ms(1_300), T0 + ms(9_000), &2, ToReplica::Request { ts: b, sent, floor: 0 }).unwrap();
    assert_eq!(only(&mut r).grant_delay, Duration::ZERO, "heard later than now counts as now");
}

// The takeover delay: a replica taken over from a host that may have granted it queues
// requests by timestamp and grants nothing until the delay ends; then the earliest
// waiter, not the first to arrive, gets the vote.
#[test]
fn a_replica_holding_grants_queues_by_timestamp_and_grants_the_earliest_when_the_delay_ends() {
    let mut r = replica();
    let until = T0 + LEASE;
    r.hold_grants_until(until);
    let (late, early) = (ts(20, 2), ts(10, 1));
    request(&mut r, T0, late).unwrap();
    request(&mut r, T0 + ms(5), early).unwrap();
    assert_eq!(owner(&r), None, "nothing is granted during the takeover delay");
    assert!(drain(&mut r).is_empty(), "no response names an owner while there is none");
    assert_eq!(queue(&r), vec![early, late]);
    assert_eq!(r.holding_grants_until(), Some(until));
    assert!(r.poll_timeout().is_some_and(|t| t <= until), "the end of the delay is a deadline");
    r.check_invariants().unwrap();
    // A renewal keeps a waiter alive through a long delay.
    request(&mut r, until - ms(1), late).unwrap();
    request(&mut r, until - ms(1), early).unwrap();
    r.handle_timeout(until);
    assert_eq!(owner(&r), Some(early), "the earliest waiter gets the vote");
    let resp = only(&mut r);
    assert!(resp.promoted && resp.owner == early && resp.ts == early, "{resp:?}");
    assert_eq!(queue(&r), vec![late]);
    assert_eq!(r.holding_grants_until(), None);
    r.check_invariants().unwrap();
}

// A request that arrives after the delay ended but before its timer ran must not jump
// the waiters queued during it.
#[test]
fn a_request_after_the_delay_does_not_jump_the_waiters_queued_during_it() {
    let mut r = replica();
    r.hold_grants_until(T0 + ms(100));
    let (early, newcomer) = (ts(10, 1), ts(30, 3));
    request(&mut r, T0, early).unwrap();
    request(&mut r, T0 + ms(200), newcomer).unwrap();
    assert_eq!(owner(&r), Some(early));
    assert_eq!(queue(&r), vec![newcomer]);
    let out = drain(&mut r);
    assert!(out.iter().any(|(to, resp)| *to == 1 && resp.promoted), "{out:?}");
    assert!(out.iter().any(|(to, resp)| *to == 3 && resp.owner == early && resp.position == 1), "{out:?}");
}

// An idle replica can be dropped once its tombstones are past their time and the clock
// is past its last grant stamp; it says when that will be through its timeout.
#[test]
fn a_released_replica_becomes_disposable_when_its_tombstones_expire() {
    let mut r = replica();
    let a = ts(10, 1);
    request(&mut r, T0, a).unwrap();
    assert!(!r.is_disposable(T0), "owned");
    let stamp = stamp(&r);
    release(&mut r, T0 + ms(10), a, stamp).unwrap();
    drain(&mut r);
    assert!(r.is_idle());
    assert!(!r.is_disposable(T0 + ms(20)), "the tombstone must outlive a late REQUEST of the released acquisition");
    let expiry = T0 + ms(10) + Duration::from_secs(30);
    assert_eq!(r.disposable_at(), Some(expiry), "when the tombstone expires");
    assert!(!r.is_disposable(expiry - ms(1)));
    assert!(r.is_disposable(expiry));
}

// A stream of distinct lock names keeps every idle replica for its idle TTL, not for
// its tombstones' whole life: a late REQUEST of a released acquisition that reaches a
// new replica is granted and handed back by its client (which remembers it finished),
// so the tombstone past the idle TTL only saves that round trip.
#[test]
fn an_idle_replica_is_disposable_after_its_idle_ttl_though_its_tombstones_live_longer() {
    let mut r = Replica::new(config().with_idle_ttl(Duration::from_secs(2)));
    let a = ts(10, 1);
    request(&mut r, T0, a).unwrap();
    let stamp = stamp(&r);
    release(&mut r, T0 + ms(10), a, stamp).unwrap();
    drain(&mut r);
    assert_eq!(r.tombstones(), 1);
    let expiry = T0 + ms(10) + Duration::from_secs(2);
    assert_eq!(r.disposable_at(), Some(expiry), "the idle TTL after the release, not the 30 s tombstone");
    assert!(!r.is_disposable(expiry - ms(1)));
    assert!(r.is_disposable(expiry));
    // While the replica is in use, its tombstones keep their whole TTL.
    let b = ts(20, 2);
    request(&mut r, T0 + ms(20), b).unwrap();
    drain(&mut r);
    assert_eq!(r.disposable_at(), None, "held by B");
    let late = T0 + ms(20) + Duration::from_secs(3);
    assert!(matches!(request(&mut r, late, a), Err(ReplicaError::Finished)), "A's late REQUEST, past the idle TTL");
}

#[test]
fn a_replica_on_hold_or_with_a_waiter_is_not_disposable() {
    let mut r = replica();
    r.hold_grants_until(T0 + LEASE);
    assert!(!r.is_disposable(T0), "the takeover delay is state");
    let q = busy(ts(10, 1), &[ts(20, 2)]);
    assert!(!q.is_disposable(T0 + ms(1)), "owned, with a waiter");
    let mut lapsed = busy(ts(10, 1), &[]);
    lapsed.handle_timeout(T0 + LEASE);
    assert!(lapsed.is_idle(), "the lease ran out");
    assert!(lapsed.is_disposable(T0 + LEASE), "an expired lease leaves nothing to remember");
}

// Reference: §4 (reset recovery, ARCHITECTURE.md "Reset recovery"). A RELEASE names the
// waiters after the releaser: the replica asks the ones it does not know for their
// REQUEST, and a name ahead of its clock is skipped without refusing the release.
#[test]
fn a_release_solicits_the_unknown_waiters_it_names_and_skips_names_ahead() {
    let mut r = replica();
    let (a, b) = (ts(10, 1), ts(20, 2));
    request(&mut r, T0, a.clone()).unwrap();
    request(&mut r, T0, b.clone()).unwrap();
    drain(&mut r);
    let (unknown, ahead) = (ts(30, 3), ts(u64::MAX / 2, 4));
    let next = vec![b.clone(), unknown.clone(), ahead];
    let now = T0 + ms(100);
    r.handle(now, &1, ToReplica::Release { ts: a, token: 0, next }).expect("the release is applied");
    assert_eq!(r.owner().map(|(t, _)| t.clone()), Some(b.clone()), "the vote moved to the next waiter");
    let out = drain(&mut r);
    let solicited: Vec<u32> = out.iter().filter(|(_, resp)| resp.solicit).map(|(to, _)| *to).collect();
    assert_eq!(solicited, vec![3], "only the unknown waiter is asked, once: {out:?}");
    assert!(out.iter().any(|(to, resp)| *to == 2 && resp.promoted), "the next waiter is told: {out:?}");
}
