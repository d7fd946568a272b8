//! The daemon's allocator: jemalloc, one arena, unused pages returned by a background
//! thread after a decay (10 s, jemalloc's default).
//!
//! A burst of lock names builds tens of thousands of replicas, dropped 5 s after their
//! last release. With glibc's malloc their memory stayed in the heap, scattered among the
//! few chunks that outlived the burst: `malloc_trim` gave the pages back, and the locks
//! after the burst were slower the more often it trimmed, most likely because their
//! allocations faulted those pages in again (the faults were not counted).
//! `sigma-testnet soak --nodes 3 --names 5000` (RSS at the end over the warmed-up start;
//! lock+release p50 after the burst against before it):
//!
//! | allocator | RSS | latency |
//! | --- | --- | --- |
//! | glibc, one arena, `malloc_trim` every 10 s | +9.3 to +12.1 MB | +19.9% |
//! | glibc, one arena, no trim | +58.1 to +72.5 MB | +1.6% |
//! | glibc, one arena, a trim when 4 MB more are free | +17.2 to +24.6 MB | +2.3%, +4.6% |
//! | the same and one more trim 60 s later | +11.0 to +12.1 MB | +10.3% |
//! | jemalloc, one arena, background purging | +5.9 to +7.8 MB | −5.1% |
//!
//! jemalloc keeps small objects in slabs per size class and takes the lowest free slot
//! first, so live objects gather in few pages and the rest are purged whole. The
//! library (`sigma-node`) sets no allocator: an embedding application keeps its own.

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A C string for jemalloc to read at start-up (`const char *malloc_conf`).
#[repr(transparent)]
struct ConfString(*const std::ffi::c_char);

// SAFETY: it points to a string literal, never written.
unsafe impl Sync for ConfString {}

/// jemalloc's options (`_RJEM_MALLOC_CONF` in the environment adds to them): one arena,
/// as the hot path is one event-loop task and each arena keeps its own fragments of a
/// burst; unused pages returned by a background thread rather than by whichever thread
/// frees next.
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: ConfString = ConfString(c"background_thread:true,narenas:1".as_ptr());
