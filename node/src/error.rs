//! Errors of the node and of its lock API.

use std::io;
use std::path::PathBuf;

use libp2p::Multiaddr;
use sigma_behaviour::proto::ConfigError;

/// Why the persistent identity could not be loaded or created.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The key file exists but could not be read.
    #[error("cannot read key file {path}: {source}")]
    Read {
        /// The key file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The key file exists but does not hold a libp2p private key. It is left untouched.
    #[error(
        "key file {path} is not a libp2p private key (protobuf encoding): {reason}; \
         it was left untouched: restore it, or move it away to start with a new identity"
    )]
    Corrupt {
        /// The key file.
        path: PathBuf,
        /// What the decoder said.
        reason: String,
    },
    /// The key file did not exist and could not be created.
    #[error("cannot create key file {path}: {source}")]
    Create {
        /// The key file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
}

/// Errors of [`crate::Node`] and of the non-lock methods of [`crate::NodeHandle`].
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The persistent identity could not be loaded or created.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The transport (TCP + noise + yamux, QUIC) could not be built.
    #[error("cannot build the transport: {0}")]
    Transport(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A listen address was refused or its listener failed before it was up.
    #[error("cannot listen on {addr}: {reason}")]
    Listen {
        /// The listen address.
        addr: Multiaddr,
        /// Why.
        reason: String,
    },
    /// A bootstrap address is not usable.
    #[error("bad bootstrap address {addr}: {reason}")]
    Bootstrap {
        /// The bootstrap address.
        addr: Multiaddr,
        /// Why.
        reason: String,
    },
    /// The node's name ([`crate::NodeConfig::name`]) is not a valid peer name.
    #[error(transparent)]
    Name(#[from] crate::names::BadName),
    /// The node's event loop is not running (shut down, or dropped).
    #[error("the node is stopped")]
    Stopped,
}

/// Errors of the lock methods of [`crate::NodeHandle`] and of [`crate::LockGuard`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// The lock name is not valid on the wire.
    #[error("invalid lock name (1 to {max} bytes of [A-Za-z0-9._/-])", max = sigma_behaviour::wire::MAX_RESOURCE_LEN)]
    BadName,
    /// The requested quorum is not usable.
    #[error("invalid quorum: {0}")]
    Quorum(#[from] ConfigError),
    /// A per-lock quorum other than the swarm's replica count (or fewer votes than the
    /// swarm's quorum): it could let two clients hold the lock on different replica sets.
    #[error("{0}")]
    SwarmQuorum(String),
    /// The lock was not won in time; the attempt has been abandoned.
    #[error("timed out waiting for the lock")]
    Timeout,
    /// The node does not serve (it is joining its swarm, or reaches no majority of the
    /// peers it knows) and the lock was not won within the timeout.
    #[error("the node is not ready: {0}")]
    NotReady(String),
    /// The node's event loop is not running.
    #[error("the node is stopped")]
    NodeStopped,
    /// The lock was lost while held: exclusion was not guaranteed until the release.
    #[error("the lock was lost before it was released")]
    Lost,
    /// A value larger than [`sigma_behaviour::wire::MAX_VALUE_LEN`] bytes.
    #[error("value of {0} bytes refused: at most {max} bytes", max = sigma_behaviour::wire::MAX_VALUE_LEN)]
    ValueTooLarge(usize),
    /// Too many watches open on this node ([`crate::watch::MAX_WATCHES`]).
    #[error("too many watches open on this node (at most {max})", max = crate::watch::MAX_WATCHES)]
    TooManyWatches,
    /// A semaphore's slot count is out of range, or its name too long for its slot
    /// locks' names ([`crate::semaphore::check`]).
    #[error("invalid semaphore: {0}")]
    BadSlots(String),
    /// A lock name with a `.slot` segment, reserved for semaphores' slot locks.
    #[error(
        "lock name {0} has a `.slot` segment, reserved for semaphore slots: take the semaphore with slots instead"
    )]
    ReservedName(String),
}

impl From<sigma_behaviour::AcquireError> for LockError {
    fn from(e: sigma_behaviour::AcquireError) -> Self {
        use sigma_behaviour::AcquireError as E;
        match e {
            E::BadName => LockError::BadName,
            E::Quorum(e) => LockError::Quorum(e),
            e @ (E::SwarmQuorum { .. } | E::MinPeers { .. }) => LockError::SwarmQuorum(e.to_string()),
            E::ValueTooLarge { len } => LockError::ValueTooLarge(len),
        }
    }
}

/// Errors of [`crate::NodeHandle::revoke`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RevokeError {
    /// The lock name is bad, or the node is stopped.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// Every peer that owns a replica of the lock answered, and none holds it under that
    /// token: there is nothing to revoke.
    #[error("lock {name} is not held under token {token} here or at any peer that owns one of its replicas")]
    NotFound {
        /// Lock name.
        name: String,
        /// The token asked for.
        token: u64,
    },
    /// No owner revoked it, and some refused to (`not_allowed`: this node is not among
    /// their `--admin-peer`s): one of them may hold it under that token.
    #[error(
        "lock {name} token {token} was not revoked: refused by {}; a holder obeys revokes only from its own \
         node and its --admin-peer peers",
        .refused.join(", ")
    )]
    Refused {
        /// Lock name.
        name: String,
        /// The token asked for.
        token: u64,
        /// The owners that refused, as `peer: reason`.
        refused: Vec<String>,
    },
    /// No owner revoked it or refused to, and some did not answer: one of them may hold
    /// it under that token.
    #[error("lock {name} token {token} was not revoked: no answer from {}", .peers.join(", "))]
    Unanswered {
        /// Lock name.
        name: String,
        /// The token asked for.
        token: u64,
        /// The owners that did not answer.
        peers: Vec<String>,
    },
}
