//! The behaviours `sigma::Behaviour` composes by delegation (rendezvous-server style):
//! [`Inner`], derived, with Kademlia, the transport, ping and the gossip's
//! request-response, and [`InnerEvent`], what they report; and the Kademlia protocol
//! name of a swarm's n ([`kad_protocol`]).

use std::sync::Arc;

use libp2p::kad::{self, store::MemoryStore};
use libp2p::request_response::{self, ProtocolSupport};
use libp2p::swarm::NetworkBehaviour;
use libp2p::{ping, PeerId};

use super::config::{Config, KAD_REFRESH};
use super::link;
use super::traffic::{GossipCodec, GossipTraffic};
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
    /// Membership gossip: heartbeats (libp2p's CBOR codec's wire, its bytes counted).
    pub gossip: request_response::Behaviour<GossipCodec>,
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

impl Inner {
    /// The inner behaviours of the peer `local` as `config` sets them; the transport's
    /// codecs count refused frames into `codec_stats`, the gossip's its bytes into
    /// `gossip_traffic`.
    pub(super) fn new(
        local: PeerId,
        config: &Config,
        codec_stats: Arc<wire::CodecStats>,
        gossip_traffic: Arc<GossipTraffic>,
    ) -> Self {
        // Our own Kademlia protocol: sigma peers form their own DHT and never join another
        // network's by accident.
        let mut kad_config = kad::Config::new(kad_protocol(config.proto.n()));
        // Peers enter the routing table through `add_address` only, and not when their
        // bucket is full: Kademlia's own insertion then dials the bucket's least recently
        // seen disconnected peer to test it, and with bounded connections most entries
        // are disconnected, so every new connection set off another dial (a chain
        // reaction of ~20 dials per peer per second in a 100-peer swarm at 64
        // connections). A full bucket keeps its old peers, as in Kademlia, except a
        // departed one, which yields its place to a connected newcomer (`make_room_for`).
        kad_config.set_kbucket_inserts(kad::BucketInserts::Manual);
        // Kademlia's own bucket refresh (a bootstrap: one lookup per bucket, ~370
        // requests in a 300-peer swarm) every 30 minutes instead of 5: the drivers' own
        // self-lookups (every 5 minutes once joined) keep the neighbourhood fresh, and the
        // lookups of placement fill the far buckets. Every 5 minutes it was most of a
        // large swarm's traffic (ARCHITECTURE.md, "Bounded connections").
        kad_config.set_periodic_bootstrap_interval(Some(KAD_REFRESH));
        let mut kad = kad::Behaviour::with_config(local, MemoryStore::new(local), kad_config);
        // With an external address required, Kademlia's own rule: server mode while the
        // swarm has a confirmed external address, client mode (not in other peers'
        // routing tables) without.
        kad.set_mode((!config.external_address_required).then_some(kad::Mode::Server));
        let link = link::Behaviour::new(
            link::Config {
                request_timeout: config.request_timeout,
                max_inbound: config.max_concurrent_streams,
                ..link::Config::default()
            },
            codec_stats,
        );
        let ping = ping::Behaviour::new(
            ping::Config::new().with_interval(config.ping_interval).with_timeout(config.ping_timeout),
        );
        let gossip = request_response::Behaviour::with_codec(
            GossipCodec::new(gossip_traffic),
            [(wire::GOSSIP_PROTOCOL, ProtocolSupport::Full)],
            request_response::Config::default().with_request_timeout(config.gossip_liveness),
        );
        Inner { kad, link, ping, gossip }
    }
}
