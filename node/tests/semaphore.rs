//! Semaphores on an in-process swarm: 6 tasks on 4 nodes take one of 2 slots of one
//! name, 6 times each. By the holders' own intervals there are never more than 2 at
//! once, each slot is held by one at a time with growing tokens, and every task is
//! served; with both slots held, a bounded try fails with a timeout; bad slot counts
//! and reserved names are refused; a writer holding every slot keeps readers out.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sigma_node::semaphore::{self, MAX_SLOTS};
use sigma_node::{LockError, LockOptions};
use tokio::task::JoinSet;

const NODES: usize = 4;
const TASKS: usize = 6;
const ROUNDS: usize = 6;
const SLOTS: u16 = 2;

/// One holder's interval, as it saw it.
#[derive(Clone, Copy, Debug)]
struct Held {
    task: usize,
    slot: u16,
    token: u64,
    enter: Instant,
    exit: Instant,
}

/// The most holders at one moment (an exit at the same instant as an entry counts as
/// before it), with a moment where it was reached.
fn most_at_once(sections: &[Held]) -> (usize, Option<Instant>) {
    let mut edges: Vec<(Instant, i32)> = sections.iter().flat_map(|h| [(h.enter, 1), (h.exit, -1)]).collect();
    edges.sort();
    let (mut now, mut most, mut at) = (0i32, 0i32, None);
    for (t, d) in edges {
        now += d;
        if now > most {
            (most, at) = (now, Some(t));
        }
    }
    (most as usize, at)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_slots_never_have_three_holders_and_everyone_is_served() {
    let (nodes, handles) = common::meshed(NODES, &common::config(16, 12, Duration::from_secs(2))).await;

    let sections = std::sync::Arc::new(Mutex::new(Vec::<Held>::new()));
    let mut tasks = JoinSet::new();
    for task in 0..TASKS {
        let (handle, sections) = (handles[task % NODES].clone(), sections.clone());
        tasks.spawn(async move {
            for round in 0..ROUNDS {
                let options = LockOptions { timeout: Some(Duration::from_secs(30)), ..LockOptions::default() };
                let guard = handle.acquire_slot("pool", SLOTS, options).await.map_err(|e| format!("{task}: {e}"))?;
                let enter = Instant::now();
                assert!(guard.slot() < SLOTS && guard.name() == "pool");
                assert_eq!(guard.lock_name(), semaphore::slot_lock_name("pool", guard.slot()));
                // 10 to 40 ms: long enough for the holders to overlap.
                tokio::time::sleep(Duration::from_millis(10 + ((task * 7 + round * 13) % 31) as u64)).await;
                let held = Held { task, slot: guard.slot(), token: guard.token(), enter, exit: Instant::now() };
                sections.lock().unwrap().push(held);
                guard.release().await.map_err(|e| format!("{task}: release: {e}"))?;
            }
            Ok::<(), String>(())
        });
    }
    let all = tokio::time::timeout(Duration::from_secs(90), async {
        while let Some(r) = tasks.join_next().await {
            r.expect("task panicked").expect("acquire failed");
        }
    })
    .await;
    let sections = sections.lock().unwrap().clone();
    let (most, at) = most_at_once(&sections);
    let per_slot: Vec<usize> = (0..SLOTS).map(|s| sections.iter().filter(|h| h.slot == s).count()).collect();
    eprintln!("{} sections, at most {most} holders at once (at {at:?}), by slot {per_slot:?}", sections.len());
    assert!(all.is_ok(), "not finished after 90 s: {} sections", sections.len());
    assert_eq!(sections.len(), TASKS * ROUNDS, "every task served every round");
    assert!(most <= SLOTS as usize, "{most} holders at once: {sections:#?}");
    for slot in 0..SLOTS {
        let mut mine: Vec<Held> = sections.iter().filter(|h| h.slot == slot).copied().collect();
        mine.sort_by_key(|h| h.enter);
        for w in mine.windows(2) {
            assert!(w[0].exit <= w[1].enter, "slot {slot} held twice at once: {:?} and {:?}", w[0], w[1]);
            assert!(w[1].token > w[0].token, "slot {slot}'s token went back: {:?} then {:?}", w[0], w[1]);
        }
    }
    for task in 0..TASKS {
        assert_eq!(sections.iter().filter(|h| h.task == task).count(), ROUNDS, "task {task}");
    }
    for h in &handles {
        let s = h.status().await.unwrap();
        assert!(s.locks_held.is_empty() && s.locks_waiting.is_empty(), "left held or waiting: {s:?}");
    }
    for node in nodes {
        node.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_slot_held_a_bounded_try_times_out_and_a_release_lets_it_in() {
    let (nodes, handles) = common::meshed(3, &common::config(8, 6, Duration::from_secs(2))).await;
    let wait = |ms| LockOptions { timeout: Some(Duration::from_millis(ms)), ..LockOptions::default() };

    let a = handles[0].acquire_slot("busy", 2, wait(10_000)).await.expect("first slot");
    let b = handles[1].acquire_slot("busy", 2, wait(10_000)).await.expect("second slot");
    assert_ne!(a.slot(), b.slot(), "two holders on one slot");
    let tried = handles[2].acquire_slot("busy", 2, wait(300)).await;
    assert_eq!(tried.err(), Some(LockError::Timeout), "a third holder of 2 slots");
    // A caller with K = 1 shares slot 0 by index.
    let one = handles[2].acquire_slot("busy", 1, wait(300)).await;
    assert_eq!(one.err(), Some(LockError::Timeout), "slot 0 is held");

    let freed = b.slot();
    b.release().await.unwrap();
    let c = handles[2].acquire_slot("busy", 2, wait(10_000)).await.expect("the freed slot");
    assert_eq!(c.slot(), freed);
    // Nothing of the abandoned attempts is left behind (the event loop notices a caller
    // that has gone at its next refresh).
    let h = handles[2].clone();
    common::wait_for("the abandoned attempt to go", Duration::from_secs(5), || async {
        h.status().await.unwrap().locks_waiting.is_empty()
    })
    .await;
    let s = handles[2].status().await.unwrap();
    assert_eq!(s.locks_held.len(), 1, "{s:?}");
    drop((a, c));

    // The read-write recipe: a writer takes every slot in index order; a reader then
    // finds none free, and gets one once the writer is done.
    let w0 = handles[0].lock_slot("busy", 0, wait(10_000)).await.expect("writer: slot 0");
    let w1 = handles[0].lock_slot("busy", 1, wait(10_000)).await.expect("writer: slot 1");
    assert_eq!((w0.slot(), w1.slot(), w1.lock_name()), (0, 1, "busy/.slot/1"));
    let reader = handles[1].acquire_slot("busy", 2, wait(300)).await;
    assert_eq!(reader.err(), Some(LockError::Timeout), "a reader beside the writer");
    w0.release().await.unwrap();
    w1.release().await.unwrap();
    let reader = handles[1].acquire_slot("busy", 2, wait(10_000)).await.expect("a reader after the writer");
    drop(reader);
    for node in nodes {
        node.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn bad_slot_counts_and_reserved_names_are_refused() {
    let node = sigma_node::Node::start(common::config(1, 1, Duration::from_secs(2))).await.unwrap();
    let h = node.handle();
    for k in [0, MAX_SLOTS + 1] {
        let e = h.acquire_slot("pool", k, LockOptions::default()).await.unwrap_err();
        assert!(matches!(e, LockError::BadSlots(_)), "{k}: {e:?}");
        assert!(e.to_string().contains("between 1 and 64"), "{e}");
    }
    let e = h.lock("pool/.slot/0").await.unwrap_err();
    assert_eq!(e, LockError::ReservedName("pool/.slot/0".into()));
    assert!(matches!(h.acquire_slot("a/.slot", 2, LockOptions::default()).await, Err(LockError::ReservedName(_))));
    node.shutdown().await.unwrap();
}
