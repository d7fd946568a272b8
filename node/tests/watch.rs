//! A value with the lock, watching a lock and observing its leader, through the embedded
//! API on a small real swarm: what a watcher sees as holders come and go, values change,
//! waiters queue, the holder's node vanishes, and the watcher is cut off.

mod common;

use std::time::Duration;

use sigma_node::watch::{Held, LockState};
use sigma_node::{LockError, LockOptions, Node, NodeHandle, Observe, Watch};

const LEASE: Duration = Duration::from_secs(1);
const TICK: Option<Duration> = Some(Duration::from_millis(100));
/// Longest wait for a state a watcher should see within a few ticks.
const PATIENCE: Duration = Duration::from_secs(10);

async fn three() -> (Vec<Node>, Vec<NodeHandle>) {
    common::meshed(3, &common::config(5, 3, LEASE)).await
}

/// The next state on `watch` that passes `want`, each state on the way kept in `seen`;
/// fails after [`PATIENCE`].
async fn until(
    watch: &mut Watch,
    what: &str,
    seen: &mut Vec<LockState>,
    want: impl Fn(&LockState) -> bool,
) -> LockState {
    until_within(PATIENCE, watch, what, seen, want).await
}

/// [`until`], waiting at most `patience`.
async fn until_within(
    patience: Duration,
    watch: &mut Watch,
    what: &str,
    seen: &mut Vec<LockState>,
    want: impl Fn(&LockState) -> bool,
) -> LockState {
    let wait = async {
        loop {
            let s = watch.next().await.expect("the watch goes on").expect("no error");
            seen.push(s.clone());
            if want(&s) {
                return s;
            }
        }
    };
    match tokio::time::timeout(patience, wait).await {
        Ok(s) => s,
        Err(_) => panic!("no state where {what} within {patience:?}; seen: {seen:#?}"),
    }
}

/// The observer's next leader: (token, value).
async fn leader(observe: &mut Observe) -> (u64, String) {
    let l = tokio::time::timeout(PATIENCE, observe.next()).await.expect("a leader in time").unwrap().unwrap();
    (l.token.unwrap(), l.value.unwrap_or_default())
}

fn value(s: &LockState) -> Option<String> {
    s.holder.as_ref().and_then(|h| h.value.clone())
}

fn token(s: &LockState) -> Option<u64> {
    s.holder.as_ref().and_then(|h| h.token)
}

/// Every state delivered is a change, numbered without gaps, and the holders named come
/// in token order (a value change of one holder counts as later).
fn check_order(seen: &[LockState]) {
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.seq, i as u64 + 1, "states numbered without gaps: {seen:#?}");
    }
    let named: Vec<(u64, u32)> = seen
        .iter()
        .filter(|s| s.state == Held::Held)
        .map(|s| (token(s).expect("a held state has a token"), s.holder.as_ref().unwrap().value_version))
        .collect();
    assert!(named.windows(2).all(|w| w[0] <= w[1]), "holders in token order: {named:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_sees_each_holder_value_and_waiter_in_order() {
    let (nodes, h) = three().await;
    let mut watch = h[2].watch("w/leader", TICK).unwrap();
    let mut observe = h[1].observe("w/leader", TICK).unwrap();
    let mut seen = Vec::new();
    until(&mut watch, "the lock is free", &mut seen, |s| s.state == Held::Free && s.waiters == 0).await;

    let opts = |v: &str| LockOptions { value: Some(v.as_bytes().to_vec()), ..LockOptions::default() };
    let first = h[0].lock_with("w/leader", opts("10.0.0.1:5432")).await.unwrap();
    let s = until(&mut watch, "node 0 holds", &mut seen, |s| s.state == Held::Held).await;
    assert_eq!((token(&s), value(&s).as_deref()), (Some(first.token()), Some("10.0.0.1:5432")));
    assert_eq!(s.holder.as_ref().unwrap().value_version, 1);
    // The inspection reads the value too.
    let inspected = h[1].inspect("w/leader").await.unwrap();
    assert_eq!(inspected.holder.and_then(|h| h.value).as_deref(), Some("10.0.0.1:5432"));
    // The observer's next leader is this one (each leader and value once, in order).
    assert_eq!(leader(&mut observe).await, (first.token(), "10.0.0.1:5432".to_owned()));

    assert_eq!(first.set_value("10.0.0.1:6432").await, Ok(2));
    let s = until(&mut watch, "the new value", &mut seen, |s| value(s).as_deref() == Some("10.0.0.1:6432")).await;
    assert_eq!((token(&s), s.holder.as_ref().unwrap().value_version), (Some(first.token()), 2));
    assert_eq!(leader(&mut observe).await, (first.token(), "10.0.0.1:6432".to_owned()));
    assert_eq!(first.set_value(vec![0u8; 4097]).await, Err(LockError::ValueTooLarge(4097)));

    let waiter = {
        let h1 = h[1].clone();
        tokio::spawn(async move { h1.lock_with("w/leader", opts("10.0.0.2:5432")).await })
    };
    until(&mut watch, "one waiter", &mut seen, |s| s.state == Held::Held && s.waiters == 1).await;
    let first_token = first.token();
    first.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    let s = until(&mut watch, "node 1 holds", &mut seen, |s| value(s).as_deref() == Some("10.0.0.2:5432")).await;
    assert_eq!(token(&s), Some(second.token()));
    assert!(second.token() > first_token);
    check_order(&seen);
    assert_eq!(leader(&mut observe).await, (second.token(), "10.0.0.2:5432".to_owned()));

    second.release().await.unwrap();
    until(&mut watch, "free again", &mut seen, |s| s.state == Held::Free).await;
    check_order(&seen);
    drop(watch);
    drop(observe);
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_holder_shows_unknown_then_its_successor() {
    let (mut nodes, h) = three().await;
    let mut watch = h[2].watch("w/vanish", TICK).unwrap();
    let mut seen = Vec::new();
    let held = h[0].lock_with("w/vanish", LockOptions { value: Some(b"a".to_vec()), ..Default::default() }).await;
    let held = held.unwrap();
    let first = held.token();
    until(&mut watch, "node 0 holds", &mut seen, |s| s.state == Held::Held).await;
    let waiter = {
        let h1 = h[1].clone();
        tokio::spawn(async move { h1.lock("w/vanish").await })
    };
    until(&mut watch, "a waiter", &mut seen, |s| s.waiters == 1).await;
    // Node 0 vanishes (its task aborted: no release, no leave): its replicas still name
    // it, it answers nothing.
    std::mem::forget(held);
    drop(nodes.remove(0));
    // Unknown: the replicas still name node 0, which does not answer (or too few
    // replicas answer to tell, node 0 having hosted some of them).
    let s = until(&mut watch, "unknown", &mut seen, |s| s.state == Held::Unknown).await;
    assert!(s.holder.as_ref().is_none_or(|h| h.token.is_none()), "{s:?}");
    let next = tokio::time::timeout(PATIENCE * 3, waiter).await.expect("the waiter wins").unwrap().unwrap();
    let s = until(&mut watch, "node 1 holds", &mut seen, |s| s.state == Held::Held && token(s) != Some(first)).await;
    assert_eq!(token(&s), Some(next.token()));
    assert!(next.token() > first);
    check_order(&seen);
    next.release().await.unwrap();
    drop(watch);
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_cut_off_sees_unknown_and_then_the_lock_again() {
    let (nodes, h) = three().await;
    let held = h[0].lock("w/cut").await.unwrap();
    let mut watch = h[2].watch("w/cut", TICK).unwrap();
    let mut seen = Vec::new();
    until(&mut watch, "node 0 holds", &mut seen, |s| s.state == Held::Held).await;
    let others = vec![h[0].peer_id(), h[1].peer_id()];
    h[2].block_peers(others.clone(), true).await.unwrap();
    // Too few replicas answer, or the holder does not.
    let s = until(&mut watch, "unknown while cut off", &mut seen, |s| s.state == Held::Unknown).await;
    assert!(s.holder.as_ref().is_none_or(|h| h.token.is_none()), "{s:?}");
    h[2].block_peers(others, false).await.unwrap();
    let s = until(&mut watch, "the holder again", &mut seen, |s| s.state == Held::Held).await;
    assert_eq!(token(&s), Some(held.token()));
    check_order(&seen);
    held.release().await.unwrap();
    // Bad names and too many watches are refused.
    assert_eq!(h[0].watch("bad name", None).unwrap_err(), LockError::BadName);
    drop(watch);
    let many: Vec<Watch> = (0..sigma_node::watch::MAX_WATCHES).map(|_| h[1].watch("w/many", None).unwrap()).collect();
    assert_eq!(h[1].watch("w/many", None).unwrap_err(), LockError::TooManyWatches);
    drop(many);
    assert!(h[1].watch("w/many", None).is_ok(), "a permit comes back with its watch");
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_takeover_delay_shows_unknown_until_a_holder_wins() {
    common::init_tracing();
    // A fresh swarm's replicas hold their grants back for the takeover delay (10 s here):
    // they know nothing of votes a previous host could have given, so a watcher cannot
    // tell whether the lock is free.
    let mut config = common::config(5, 3, LEASE);
    config.behaviour = config.behaviour.with_takeover_delay(Some(Duration::from_secs(10)));
    let nodes = common::swarm(3, &config).await;
    let h: Vec<NodeHandle> = nodes.iter().map(|n| n.handle()).collect();
    common::wait_mesh(&h, 2).await;
    let mut watch = h[2].watch("w/delay", TICK).unwrap();
    let mut seen = Vec::new();
    let first = until(&mut watch, "a first state", &mut seen, |_| true).await;
    assert!(h[2].status().await.unwrap().held_back_ms > 0, "the test needs the delay still running");
    assert_eq!(first.state, Held::Unknown, "{first:?}");
    let waiter = {
        let h0 = h[0].clone();
        tokio::spawn(async move { h0.lock("w/delay").await })
    };
    let over = |s: &LockState| s.state == Held::Held;
    let s = until_within(PATIENCE * 3, &mut watch, "the holder, once the delay is over", &mut seen, over).await;
    let held = waiter.await.unwrap().unwrap();
    assert_eq!(token(&s), Some(held.token()));
    check_order(&seen);
    held.release().await.unwrap();
    drop(watch);
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}
