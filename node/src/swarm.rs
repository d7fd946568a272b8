//! The node's composed behaviour and the swarm built around it.

use std::time::Duration;

use libp2p::allow_block_list::{self, AllowedPeers, BlockedPeers};
use libp2p::identity::Keypair;
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::NetworkBehaviour;
use libp2p::{identify, noise, tcp, yamux, PeerId, Swarm, SwarmBuilder};

use crate::admission::{self, Admission};
use crate::error::NodeError;

/// `protocol_version` announced by identify.
pub const IDENTIFY_PROTOCOL: &str = "/sigma/id/1.0.0";
/// How often identify re-asks a connected peer. Its exchange also keeps connections to
/// live peers open (ownership of a replica is decided among *connected* peers).
pub const IDENTIFY_INTERVAL: Duration = Duration::from_secs(60);

/// The behaviour of a sigma node: the Sigma protocol (Kademlia + the `/sigma/1.0.0`
/// wire) and identify, which tells each peer the listen addresses of the others.
/// Public so that an application can embed it in its own swarm; it must then feed
/// `identify::Event::Received` listen addresses to [`sigma_behaviour::Behaviour::add_address`]
/// as [`crate::Node`] does.
#[derive(NetworkBehaviour)]
pub struct NodeBehaviour {
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
    /// Address exchange.
    pub identify: identify::Behaviour,
}

impl NodeBehaviour {
    /// The behaviour for `keypair`'s peer.
    pub fn new(keypair: &Keypair, config: sigma_behaviour::Config) -> Self {
        let local = keypair.public().to_peer_id();
        let identify = identify::Behaviour::new(
            identify::Config::new(IDENTIFY_PROTOCOL.to_owned(), keypair.public())
                .with_agent_version(format!("sigma-node/{}", env!("CARGO_PKG_VERSION")))
                .with_interval(IDENTIFY_INTERVAL),
        );
        NodeBehaviour {
            block: allow_block_list::Behaviour::default(),
            allow: Toggle::from(None),
            sigma: sigma_behaviour::Behaviour::new(local, config),
            identify,
        }
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

/// TCP (noise, yamux) and QUIC, on tokio; with a swarm key, TCP only, each connection
/// encrypted with the key below noise.
pub(crate) fn build(
    keypair: Keypair,
    config: sigma_behaviour::Config,
    idle_connection_timeout: Duration,
    admission: &Admission,
) -> Result<Swarm<NodeBehaviour>, NodeError> {
    let tcp_config = tcp::Config::default().nodelay(true);
    let behaviour = |keypair: &Keypair| {
        let behaviour = NodeBehaviour::new(keypair, config);
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
            .with_behaviour(behaviour)
            .map_err(|e| NodeError::Transport(Box::new(e)))?
            .with_swarm_config(swarm_config)
            .build(),
        Some(key) => SwarmBuilder::with_existing_identity(keypair)
            .with_tokio()
            .with_other_transport(|keypair| admission::private_tcp(keypair, key, tcp_config))
            .map_err(|e| NodeError::Transport(Box::new(e)))?
            .with_behaviour(behaviour)
            .map_err(|e| NodeError::Transport(Box::new(e)))?
            .with_swarm_config(swarm_config)
            .build(),
    };
    Ok(swarm)
}
