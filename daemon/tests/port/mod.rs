//! A TCP port on 127.0.0.1 for a daemon that must listen at a known address, or be
//! restarted at the same one.
//!
//! Binding port 0, closing it and handing the number on races with every socket on the
//! machine: the kernel hands the same range to other processes' listeners on port 0
//! and to the local side of their outgoing connections, and a daemon of this test once
//! found its port taken ("cannot listen on /ip4/127.0.0.1/tcp/41981"). Ports below the
//! ephemeral range are given to nobody who does not ask for them by number.

use std::net::TcpListener;

/// A port below the kernel's ephemeral range, free now; each process starts its search
/// at a different place (its pid), so concurrent test binaries rarely try the same one.
pub fn port_outside_ephemeral_range() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(32_768);
    let (first, last) = (10_000u16, low.saturating_sub(1).max(10_001));
    let span = u32::from(last - first);
    let start = std::process::id() % span;
    (0..span)
        .map(|k| first + u16::try_from((start + k) % span).expect("below the span"))
        .find(|p| TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port on 127.0.0.1 below the ephemeral range")
}
