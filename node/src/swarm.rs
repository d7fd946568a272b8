//! The node's composed behaviour and the swarm built around it.

use std::time::Duration;

use libp2p::allow_block_list::{self, BlockedPeers};
use libp2p::identity::Keypair;
use libp2p::swarm::NetworkBehaviour;
use libp2p::{identify, noise, tcp, yamux, Swarm, SwarmBuilder};

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
            sigma: sigma_behaviour::Behaviour::new(local, config),
            identify,
        }
    }
}

/// TCP (noise, yamux) and QUIC, on tokio.
pub(crate) fn build(
    keypair: Keypair,
    config: sigma_behaviour::Config,
    idle_connection_timeout: Duration,
) -> Result<Swarm<NodeBehaviour>, NodeError> {
    let swarm = SwarmBuilder::with_existing_identity(keypair)
        .with_tokio()
        .with_tcp(tcp::Config::default().nodelay(true), noise::Config::new, yamux::Config::default)
        .map_err(|e| NodeError::Transport(Box::new(e)))?
        .with_quic()
        .with_behaviour(|keypair| NodeBehaviour::new(keypair, config))
        .map_err(|e| NodeError::Transport(Box::new(e)))?
        .with_swarm_config(|c| c.with_idle_connection_timeout(idle_connection_timeout))
        .build();
    Ok(swarm)
}
