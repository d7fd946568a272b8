//! Address scopes: which addresses of a peer are worth keeping and handing on.
//!
//! A peer on a real network listens on loopback, on private (LAN) addresses and maybe on
//! a public one, and identify reports all of them. A loopback or private address is of
//! use only to a peer on the same host or network: kept in a public swarm's routing
//! tables, it is handed to every peer that asks, and each of them dials into its own LAN
//! (or its own loopback) for nothing. The rule: a peer reachable at scope `S` (the widest
//! scope of its own external addresses) keeps only addresses of scope `S` or wider.

use std::net::{Ipv4Addr, Ipv6Addr};

use libp2p::multiaddr::Protocol;
use libp2p::Multiaddr;

/// How far an address reaches, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// This host only: 127.0.0.0/8, ::1, and libp2p's in-process memory transport.
    Loopback,
    /// A local network: RFC 1918, shared (100.64.0.0/10), link-local, IPv6 unique-local
    /// and link-local.
    Private,
    /// Anywhere: every other IP address, and DNS names.
    Global,
}

impl Scope {
    /// The scope of `addr`, from its first protocol; `None` for an address no peer can
    /// dial (unspecified, multicast, broadcast, documentation) or of an unknown kind.
    pub fn of(addr: &Multiaddr) -> Option<Scope> {
        match addr.iter().next()? {
            Protocol::Ip4(ip) => Self::of_ip4(ip),
            Protocol::Ip6(ip) => Self::of_ip6(ip),
            Protocol::Dns(_) | Protocol::Dns4(_) | Protocol::Dns6(_) | Protocol::Dnsaddr(_) => Some(Scope::Global),
            Protocol::Memory(_) => Some(Scope::Loopback),
            _ => None,
        }
    }

    fn of_ip4(ip: Ipv4Addr) -> Option<Scope> {
        let [a, b, ..] = ip.octets();
        if ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast() || ip.is_documentation() {
            None
        } else if ip.is_loopback() {
            Some(Scope::Loopback)
        } else if ip.is_private() || ip.is_link_local() || (a == 100 && (64..128).contains(&b)) {
            Some(Scope::Private)
        } else {
            Some(Scope::Global)
        }
    }

    fn of_ip6(ip: Ipv6Addr) -> Option<Scope> {
        if let Some(v4) = ip.to_ipv4_mapped() {
            return Self::of_ip4(v4);
        }
        let first = ip.segments()[0];
        if ip.is_unspecified() || ip.is_multicast() || first == 0x2001 && ip.segments()[1] == 0x0db8 {
            None
        } else if ip.is_loopback() {
            Some(Scope::Loopback)
        } else if first & 0xfe00 == 0xfc00 || first & 0xffc0 == 0xfe80 {
            Some(Scope::Private)
        } else {
            Some(Scope::Global)
        }
    }

    /// The widest scope of `addrs` (`None` if none has one).
    pub fn widest<'a>(addrs: impl IntoIterator<Item = &'a Multiaddr>) -> Option<Scope> {
        addrs.into_iter().filter_map(Scope::of).max()
    }

    /// Whether a peer reachable at `reach` keeps `addr` (dialable, and at least as wide).
    /// A peer with no reach of its own (no external address yet) keeps every dialable one.
    pub fn keeps(reach: Option<Scope>, addr: &Multiaddr) -> bool {
        match (Scope::of(addr), reach) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(s), Some(r)) => s >= r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Multiaddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_fall_in_their_scope() {
        for (addr, scope) in [
            ("/ip4/127.0.0.1/tcp/1", Some(Scope::Loopback)),
            ("/ip4/127.3.2.1/udp/1/quic-v1", Some(Scope::Loopback)),
            ("/ip6/::1/tcp/1", Some(Scope::Loopback)),
            ("/memory/42", Some(Scope::Loopback)),
            ("/ip4/10.1.2.3/tcp/1", Some(Scope::Private)),
            ("/ip4/172.16.0.1/tcp/1", Some(Scope::Private)),
            ("/ip4/172.32.0.1/tcp/1", Some(Scope::Global)),
            ("/ip4/192.168.1.7/tcp/1", Some(Scope::Private)),
            ("/ip4/100.64.0.1/tcp/1", Some(Scope::Private)),
            ("/ip4/100.128.0.1/tcp/1", Some(Scope::Global)),
            ("/ip4/169.254.1.1/tcp/1", Some(Scope::Private)),
            ("/ip6/fd00::1/tcp/1", Some(Scope::Private)),
            ("/ip6/fe80::1/tcp/1", Some(Scope::Private)),
            ("/ip6/::ffff:192.168.0.1/tcp/1", Some(Scope::Private)),
            ("/ip4/8.8.8.8/tcp/1", Some(Scope::Global)),
            ("/ip6/2a00:1450::1/tcp/1", Some(Scope::Global)),
            ("/dns4/sigma.example.org/tcp/4001", Some(Scope::Global)),
            ("/ip4/0.0.0.0/tcp/1", None),
            ("/ip6/::/tcp/1", None),
            ("/ip4/224.0.0.1/tcp/1", None),
            ("/ip4/192.0.2.1/tcp/1", None),
            ("/ip6/2001:db8::1/tcp/1", None),
            ("/p2p-circuit", None),
        ] {
            assert_eq!(Scope::of(&a(addr)), scope, "{addr}");
        }
    }

    #[test]
    fn a_peer_keeps_only_addresses_as_wide_as_its_own_reach() {
        let (lo, lan, public) = (a("/ip4/127.0.0.1/tcp/1"), a("/ip4/192.168.1.7/tcp/1"), a("/ip4/8.8.8.8/tcp/1"));
        assert!([&lo, &lan, &public].iter().all(|x| Scope::keeps(None, x)));
        assert!([&lo, &lan, &public].iter().all(|x| Scope::keeps(Some(Scope::Loopback), x)));
        assert!(!Scope::keeps(Some(Scope::Private), &lo));
        assert!(Scope::keeps(Some(Scope::Private), &lan) && Scope::keeps(Some(Scope::Private), &public));
        assert!(!Scope::keeps(Some(Scope::Global), &lo) && !Scope::keeps(Some(Scope::Global), &lan));
        assert!(Scope::keeps(Some(Scope::Global), &public));
        assert!(!Scope::keeps(None, &a("/ip4/0.0.0.0/tcp/1")));
        assert_eq!(Scope::widest([&lo, &lan]), Some(Scope::Private));
        assert_eq!(Scope::widest([&a("/ip4/0.0.0.0/tcp/1")]), None);
    }
}
