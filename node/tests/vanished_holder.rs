//! A holder's node vanishes without releasing (its event loop is aborted, as in a crash):
//! a waiter on another node gets the lock within about one lease, and not before the
//! vanished holder's validity (its votes' leases) has ended.

mod common;

use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_wins_within_about_one_lease_after_the_holder_vanishes() {
    let (mut nodes, handles) = common::meshed(5, &common::config(8, 6, LEASE)).await;

    let holder = handles[1].lock_timeout("vanish", Duration::from_secs(10)).await.expect("holder acquires");
    let first_token = holder.token();

    let waiter = handles[2].clone();
    let wait = tokio::spawn(async move {
        let guard = waiter.lock_timeout("vanish", Duration::from_secs(30)).await;
        (Instant::now(), guard)
    });
    common::wait_for("the waiter to queue", Duration::from_secs(5), || async {
        handles[2].status().await.unwrap().locks_waiting == ["vanish"]
    })
    .await;
    // Every replica has seen the waiter: its REQUESTs have been answered (it is queued).
    common::wait_for("the waiter's requests to reach the replicas", Duration::from_secs(5), || async {
        let mut queued = 0;
        for h in &handles {
            queued += h
                .hosted_replicas("vanish")
                .await
                .unwrap()
                .iter()
                .filter(|r| r.queue.iter().any(|(p, _)| *p == handles[2].peer_id()))
                .count();
        }
        queued == 8
    })
    .await;
    assert!(!wait.is_finished(), "the waiter must not win while the lock is held");

    // The holder's node vanishes: no RELEASE, connections drop. Its last validity
    // deadline (the conservative end of its votes' leases: its renewals' send times plus
    // LEASE, less the drift margin) is the earliest a replica could have let its vote go:
    // no one may win before it.
    assert!(!holder.is_lost());
    let valid_until = holder.valid_until();
    let (name, token) = holder.into_detached();
    assert_eq!((name.as_str(), token), ("vanish", first_token));
    let vanished_at = Instant::now();
    drop(nodes.remove(1));

    let (won_at, guard) = tokio::time::timeout(Duration::from_secs(30), wait).await.expect("waiter finishes").unwrap();
    let guard = guard.expect("the waiter gets the lock");
    let took = won_at - vanished_at;
    let left = valid_until.saturating_duration_since(vanished_at);
    eprintln!("waiter won {took:?} after the holder vanished (lease {LEASE:?}; its validity had {left:?} left)");
    assert!(won_at >= valid_until, "won {took:?} after the vanish, within the holder's validity ({left:?} left)");
    assert!(took < 3 * LEASE, "took {took:?}, more than three leases");
    assert!(guard.token() > first_token, "token {} after {first_token}", guard.token());
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
    for node in nodes {
        node.shutdown().await.unwrap();
    }
}
