//! How much heap an idle replica keeps (one that granted and was released, and now
//! only remembers its tombstone until `tombstone_ttl`): a node keeps such replicas for
//! about a minute after every lock name's last use, so their size is what a stream of
//! names costs (ARCHITECTURE.md, "Bounded state"). Measured with a counting allocator,
//! deterministic; printed, and held under a bound.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use libp2p::PeerId;
use sigma_behaviour::proto::{Config, Replica, Timestamp, ToReplica};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator, only counting bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn an_idle_replica_keeps_little_memory() {
    const N: usize = 10_000;
    let config = Config::default().with_quorum(5, 3);
    let t = |ms: u64| Duration::from_millis(1_000_000 + ms);
    let peers: Vec<PeerId> = (0..N).map(|_| PeerId::random()).collect();
    let before = LIVE.load(Ordering::Relaxed);
    let mut replicas: Vec<Replica<PeerId>> = Vec::with_capacity(N);
    let vec_bytes = (LIVE.load(Ordering::Relaxed) - before) as f64;
    for (k, peer) in peers.iter().enumerate() {
        let mut r = Replica::new(config.clone());
        let ts = Timestamp::new(k as u64 + 1, *peer);
        r.handle(t(0), peer, ToReplica::Request { ts, sent: 1, floor: 0 }).unwrap();
        while r.poll_transmit().is_some() {}
        r.handle(t(5), peer, ToReplica::Release { ts, token: 0, next: vec![] }).unwrap();
        while r.poll_transmit().is_some() {}
        r.handle_timeout(t(10));
        r.compact();
        assert!(r.is_idle(), "released and nothing queued");
        replicas.push(r);
    }
    let heap = (LIVE.load(Ordering::Relaxed) - before) as f64 - vec_bytes;
    let inline = std::mem::size_of::<Replica<PeerId>>();
    let per = heap / N as f64;
    println!("idle replica: {inline} bytes inline + {per:.0} bytes of heap (tombstone kept)");
    // 2,888 bytes before `compact` and the small tombstone set: a `BTreeMap` node for
    // the one tombstone, and the queue's and outbox's emptied buffers.
    assert!(per < 256.0, "an idle replica keeps {per:.0} bytes of heap");
}
