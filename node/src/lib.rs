//! sigma-node: a Sigma lock-service peer and its embedded API.
//!
//! A [`Node`] runs a libp2p swarm (TCP + noise + yamux, QUIC) with the Sigma behaviour
//! ([`sigma_behaviour::Behaviour`]: Kademlia placement of the lock replicas plus the
//! `/sigma/2.0.0` wire) and identify, in an event loop on a tokio task. Programs talk to
//! it through a cloneable [`NodeHandle`]:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use sigma_node::{Node, NodeConfig};
//!
//! let node = Node::start(NodeConfig {
//!     bootstrap: vec!["/ip4/10.0.0.1/tcp/7590/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN".parse()?],
//!     key_file: Some("/var/lib/sigma/key".into()),
//!     ..NodeConfig::default()
//! })
//! .await?;
//! let locks = node.handle();
//! let guard = locks.lock("orders/42").await?;
//! // ... work, passing guard.token() to the protected resource ...
//! guard.release().await?;
//! node.shutdown().await?;
//! # Ok(())
//! # }
//! ```
//!
//! The lease of a held lock is renewed in the background; [`LockGuard::lost`] resolves
//! when exclusion is no longer guaranteed.

pub mod admission;
mod command;
mod error;
mod event_loop;
mod guard;
pub mod identity;
pub mod inspect;
pub mod listing;
pub mod metrics;
pub mod names;
mod node;
pub mod semaphore;
mod swarm;
pub mod value;
pub mod watch;

pub use admission::Admission;
pub use error::{IdentityError, LockError, NodeError, RevokeError};
pub use guard::LockGuard;
pub use node::{
    Libp2pMetrics, LockOptions, Node, NodeConfig, NodeHandle, Status, WaitingLock, DEFAULT_IDLE_CONNECTION_TIMEOUT,
};
pub use semaphore::SlotGuard;
pub use swarm::{ConnectionBounds, NodeBehaviour, NodeBehaviourEvent, IDENTIFY_INTERVAL, IDENTIFY_PROTOCOL};
pub use watch::{Observe, Watch};

/// The crates this one is built on, for applications that embed [`NodeBehaviour`].
pub use libp2p;
pub use sigma_behaviour;
