//! The behaviours `sigma::Behaviour` composes by delegation (rendezvous-server style):
//! [`Inner`], derived, with Kademlia, the transport, ping and the gossip's
//! request-response, and [`InnerEvent`], what they report; and the Kademlia protocol
//! name of a swarm's n ([`kad_protocol`]).

use libp2p::kad::{self, store::MemoryStore};
use libp2p::swarm::NetworkBehaviour;
use libp2p::{ping, request_response};

use super::link;
use crate::wire;

/// The inner behaviours, composed by the derive macro.
#[derive(NetworkBehaviour)]
#[behaviour(to_swarm = "InnerEvent")]
pub struct Inner {
    /// Replica placement.
    pub kad: kad::Behaviour<MemoryStore>,
    /// The sigma wire.
    pub link: link::Behaviour,
    /// Liveness: a connection whose ping fails is closed.
    pub ping: ping::Behaviour,
    /// Membership gossip: heartbeats.
    pub gossip: request_response::Behaviour<request_response::cbor::codec::Codec<wire::Gossip, wire::Gossip>>,
}

/// Events of [`Inner`].
#[derive(Debug)]
pub enum InnerEvent {
    /// From Kademlia.
    Kad(kad::Event),
    /// From the sigma wire.
    Link(link::Event),
    /// From ping.
    Ping(ping::Event),
    /// From the membership gossip.
    Gossip(request_response::Event<wire::Gossip, wire::Gossip>),
}

impl From<request_response::Event<wire::Gossip, wire::Gossip>> for InnerEvent {
    fn from(e: request_response::Event<wire::Gossip, wire::Gossip>) -> Self {
        InnerEvent::Gossip(e)
    }
}

impl From<ping::Event> for InnerEvent {
    fn from(e: ping::Event) -> Self {
        InnerEvent::Ping(e)
    }
}

impl From<kad::Event> for InnerEvent {
    fn from(e: kad::Event) -> Self {
        InnerEvent::Kad(e)
    }
}

impl From<link::Event> for InnerEvent {
    fn from(e: link::Event) -> Self {
        InnerEvent::Link(e)
    }
}

/// The Kademlia protocol of sigma's DHT for the default n = 32.
pub const KAD_PROTOCOL: libp2p::StreamProtocol = libp2p::StreamProtocol::new("/sigma/kad/1.0.0");

/// The Kademlia protocol of a swarm whose locks have `n` replicas. Peers configured
/// with another n speak another protocol, so they never join the swarm's DHT nor host
/// its replicas: two clients of one lock always share one replica set.
pub fn kad_protocol(n: usize) -> libp2p::StreamProtocol {
    if n == 32 {
        return KAD_PROTOCOL;
    }
    libp2p::StreamProtocol::try_from_owned(format!("/sigma/kad/1.0.0/n{n}")).unwrap_or(KAD_PROTOCOL)
}
