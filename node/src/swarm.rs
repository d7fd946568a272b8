//! The node's composed behaviour and the swarm built around it.

use std::time::Duration;

use libp2p::allow_block_list::{self, AllowedPeers, BlockedPeers};
use libp2p::identity::Keypair;
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::NetworkBehaviour;
use libp2p::{
    autonat, connection_limits, identify, memory_connection_limits, noise, tcp, yamux, Multiaddr, PeerId, Swarm,
    SwarmBuilder,
};
use sigma_behaviour::addr::Scope;

use crate::admission::{self, Admission};
use crate::error::NodeError;

/// `protocol_version` announced by identify.
pub const IDENTIFY_PROTOCOL: &str = "/sigma/id/1.0.0";
/// How often identify re-asks a connected peer (its exchange does not keep a
/// connection open).
pub const IDENTIFY_INTERVAL: Duration = Duration::from_secs(60);

/// Bounds on a node's connections (ARCHITECTURE.md, "Bounded connections"). A
/// connection past a bound is refused (a dial of this node's own fails and is retried
/// by whoever needed it); idle connections close after the node's idle timeout, so a
/// node in a swarm of thousands keeps a few dozen.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnectionBounds {
    /// Established connections, both directions.
    pub max_established: u32,
    /// Established incoming connections (the rest is left for this node's own dials).
    pub max_established_incoming: u32,
    /// Established connections to one peer.
    pub max_established_per_peer: u32,
    /// Incoming connections still in their handshake.
    pub max_pending_incoming: u32,
    /// Outgoing dials in progress.
    pub max_pending_outgoing: u32,
    /// No new connection while the process's resident memory is above this many bytes;
    /// `None`: 80% of the machine's memory.
    pub max_memory_bytes: Option<usize>,
}

impl Default for ConnectionBounds {
    fn default() -> Self {
        ConnectionBounds {
            max_established: 256,
            max_established_incoming: 192,
            max_established_per_peer: 2,
            max_pending_incoming: 64,
            max_pending_outgoing: 128,
            max_memory_bytes: None,
        }
    }
}

impl ConnectionBounds {
    /// The connection-trimming watermarks derived from the bound on established
    /// connections (`sigma_behaviour::Config::with_connection_watermarks`): past three
    /// quarters of it, the least recently used peers are disconnected down to half, so
    /// that the dials the protocol needs find room.
    pub fn watermarks(&self) -> (usize, usize) {
        let max = self.max_established as usize;
        (max * 3 / 4, max / 2)
    }

    fn limits(&self) -> connection_limits::Behaviour {
        connection_limits::Behaviour::new(
            connection_limits::ConnectionLimits::default()
                .with_max_established(Some(self.max_established))
                .with_max_established_incoming(Some(self.max_established_incoming))
                .with_max_established_per_peer(Some(self.max_established_per_peer))
                .with_max_pending_incoming(Some(self.max_pending_incoming))
                .with_max_pending_outgoing(Some(self.max_pending_outgoing)),
        )
    }

    fn memory(&self) -> memory_connection_limits::Behaviour {
        match self.max_memory_bytes {
            Some(bytes) => memory_connection_limits::Behaviour::with_max_bytes(bytes),
            None => memory_connection_limits::Behaviour::with_max_percentage(0.8),
        }
    }
}

/// The behaviour of a sigma node: the Sigma protocol (Kademlia + the `/sigma/2.0.0`
/// wire) and identify, which tells each peer the listen addresses of the others.
/// Public so that an application can embed it in its own swarm; it must then feed
/// `identify::Event::Received` listen addresses to [`sigma_behaviour::Behaviour::add_address`]
/// as [`crate::Node`] does.
#[derive(NetworkBehaviour)]
pub struct NodeBehaviour {
    /// Connection counts ([`ConnectionBounds`]). First with `memory` and `block`: a
    /// refused connection must not reach the protocols.
    pub limits: connection_limits::Behaviour,
    /// No new connection while the process's memory is over its bound.
    pub memory: memory_connection_limits::Behaviour,
    /// Peers this node refuses (the loopback-only admin control, `POST /v1/admin/block`):
    /// their connections are closed and new ones refused. The local testnet cuts
    /// traffic with it to make partitions. First, so that a denied connection never
    /// reaches the other behaviours (request-response asserts that every connection it
    /// saw established is reported closed).
    pub block: allow_block_list::Behaviour<BlockedPeers>,
    /// Closed membership (`--allow-peer`): when on, only the listed peers may connect.
    /// Before `sigma` for the reason `block` is.
    pub allow: Toggle<allow_block_list::Behaviour<AllowedPeers>>,
    /// Locks and replicas.
    pub sigma: sigma_behaviour::Behaviour,
    /// Address exchange. Announces the node's external addresses only (not every
    /// listen address: a loopback or LAN one is of no use to most peers).
    pub identify: identify::Behaviour,
    /// AutoNAT: other peers dial back the public addresses they observe this node at;
    /// a dial that succeeds confirms the address as external. Serves the same to them.
    /// Off on a node whose addresses are all loopback (`runs_autonat` in this module).
    pub autonat: Toggle<autonat::Behaviour>,
}

impl NodeBehaviour {
    /// The behaviour for `keypair`'s peer, with the default [`ConnectionBounds`].
    pub fn new(keypair: &Keypair, config: sigma_behaviour::Config) -> Self {
        Self::bounded(keypair, config, &ConnectionBounds::default())
    }

    /// The behaviour for `keypair`'s peer, with `bounds` on its connections.
    pub fn bounded(keypair: &Keypair, config: sigma_behaviour::Config, bounds: &ConnectionBounds) -> Self {
        let local = keypair.public().to_peer_id();
        NodeBehaviour {
            limits: bounds.limits(),
            memory: bounds.memory(),
            block: allow_block_list::Behaviour::default(),
            allow: Toggle::from(None),
            sigma: sigma_behaviour::Behaviour::new(keypair, config),
            identify: identify_behaviour(keypair, None),
            autonat: Toggle::from(Some(autonat::Behaviour::new(local, autonat::Config::default()))),
        }
    }

    /// With a peer name, announced to the other peers in identify's agent version
    /// ([`crate::names`]); `name` must pass [`crate::names::validate_name`].
    pub fn with_name(mut self, keypair: &Keypair, name: &str) -> Self {
        self.identify = identify_behaviour(keypair, Some(name));
        self
    }

    /// Without AutoNAT (a node whose addresses are all loopback: `runs_autonat` in this
    /// module).
    pub fn without_autonat(mut self) -> Self {
        self.autonat = Toggle::from(None);
        self
    }

    /// Closed membership: connections only with `peers` and `local` (this node).
    pub fn with_allowed_peers(mut self, local: PeerId, peers: impl IntoIterator<Item = PeerId>) -> Self {
        let mut allow = allow_block_list::Behaviour::<AllowedPeers>::default();
        for peer in peers.into_iter().chain([local]) {
            allow.allow_peer(peer);
        }
        self.allow = Toggle::from(Some(allow));
        self
    }
}

/// Identify, announcing the node's version and its name, if it has one.
fn identify_behaviour(keypair: &Keypair, name: Option<&str>) -> identify::Behaviour {
    identify::Behaviour::new(
        identify::Config::new(IDENTIFY_PROTOCOL.to_owned(), keypair.public())
            .with_agent_version(crate::names::agent_version(name))
            .with_interval(IDENTIFY_INTERVAL)
            .with_hide_listen_addrs(true),
    )
}

/// Whether a node runs AutoNAT, from its listen and given external addresses: not
/// when every one is loopback (or there is none). Peers on its own host are then the
/// only ones that can dial it, at loopback addresses, and AutoNAT neither tests nor
/// dials back anything but public addresses: it would only add a handler to every
/// connection, polled at every wake (8 daemons on 2 cores, a lock taken through node
/// k mod 8: acquire p50 1.06–1.09 → 1.02–1.05 ms). An unspecified listen address
/// (`0.0.0.0`) may be reached from anywhere, and an external address that is not
/// loopback (a tunnel to a loopback listener) says it is: AutoNAT runs.
pub(crate) fn runs_autonat<'a>(addrs: impl IntoIterator<Item = &'a Multiaddr>) -> bool {
    addrs.into_iter().any(|a| Scope::of(a) != Some(Scope::Loopback))
}

/// A listen address came up: it counts as external (announced to peers, and what lets
/// this node host replicas) when it is at least as wide as `floor`, the widest of the
/// bootstrap addresses (any dialable address when `None`).
pub(crate) fn listen_address_up(swarm: &mut Swarm<NodeBehaviour>, addr: &Multiaddr, floor: Option<Scope>) {
    if Scope::keeps(floor, addr) {
        tracing::info!(%addr, "listen address taken as external");
        swarm.add_external_address(addr.clone());
    }
}

/// TCP (noise, yamux) and QUIC, on tokio, and DNS names (`/dns4/…`) resolved by the
/// system's resolver; with a swarm key, TCP only, each connection
/// encrypted with the key below noise.
pub(crate) fn build(
    keypair: Keypair,
    config: sigma_behaviour::Config,
    bounds: &ConnectionBounds,
    idle_connection_timeout: Duration,
    admission: &Admission,
    autonat: bool,
    name: Option<&str>,
) -> Result<Swarm<NodeBehaviour>, NodeError> {
    let tcp_config = tcp::Config::default().nodelay(true);
    let behaviour = |keypair: &Keypair| {
        let behaviour = NodeBehaviour::bounded(keypair, config, bounds);
        let behaviour = if autonat { behaviour } else { behaviour.without_autonat() };
        let behaviour = match name {
            Some(name) => behaviour.with_name(keypair, name),
            None => behaviour,
        };
        match &admission.allowed_peers {
            Some(peers) => behaviour.with_allowed_peers(keypair.public().to_peer_id(), peers.iter().copied()),
            None => behaviour,
        }
    };
    let swarm_config = |c: libp2p::swarm::Config| c.with_idle_connection_timeout(idle_connection_timeout);
    let swarm = match admission.swarm_key {
        None => SwarmBuilder::with_existing_identity(keypair)
            .with_tokio()
            .with_tcp(tcp_config, noise::Config::new, yamux::Config::default)
            .map_err(|e| NodeError::Transport(Box::new(e)))?
            .with_quic()
            .with_dns()
            .map_err(|e| NodeError::Transport(Box::new(e)))?
            .with_behaviour(behaviour)
            .map_err(|e| NodeError::Transport(Box::new(e)))?
            .with_swarm_config(swarm_config)
            .build(),
        Some(key) => SwarmBuilder::with_existing_identity(keypair)
            .with_tokio()
            .with_other_transport(|keypair| admission::private_tcp(keypair, key, tcp_config))
            .map_err(|e| NodeError::Transport(Box::new(e)))?
            .with_dns()
            .map_err(|e| NodeError::Transport(Box::new(e)))?
            .with_behaviour(behaviour)
            .map_err(|e| NodeError::Transport(Box::new(e)))?
            .with_swarm_config(swarm_config)
            .build(),
    };
    Ok(swarm)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(s: &[&str]) -> bool {
        let addrs: Vec<Multiaddr> = s.iter().map(|a| a.parse().expect("multiaddr")).collect();
        runs_autonat(&addrs)
    }

    #[test]
    fn autonat_runs_unless_every_address_is_loopback() {
        assert!(!runs(&[]));
        assert!(!runs(&["/ip4/127.0.0.1/tcp/0"]));
        assert!(!runs(&["/ip4/127.0.0.1/tcp/0", "/ip6/::1/udp/0/quic-v1", "/memory/7"]));
        assert!(runs(&["/ip4/0.0.0.0/tcp/7590"]));
        assert!(runs(&["/ip4/127.0.0.1/tcp/0", "/ip4/192.168.1.5/tcp/0"]));
        assert!(runs(&["/ip6/::/tcp/0"]));
        assert!(runs(&["/ip4/203.0.113.7/tcp/7590"]));
        // A loopback listener behind a tunnel, with its public address given.
        assert!(runs(&["/ip4/127.0.0.1/tcp/7590", "/dns4/sigma-1.example.org/tcp/7590"]));
    }

    #[test]
    fn a_behaviour_without_autonat_has_it_off() {
        let key = Keypair::generate_ed25519();
        let on = NodeBehaviour::new(&key, sigma_behaviour::Config::default());
        assert!(on.autonat.is_enabled());
        assert!(!on.without_autonat().autonat.is_enabled());
    }
}
