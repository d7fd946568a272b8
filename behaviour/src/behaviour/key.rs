//! [`ReplicaKey`]: one replica of one lock, as every role names it. Built where a lock
//! name enters the behaviour (an acquisition's start, a decoded request) and passed on
//! from there: its Kademlia key is hashed once, not again by each role that compares
//! peers with it.

use std::cmp::Ordering;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use libp2p::kad::KBucketKey;

use crate::wire;

/// Replica `index` of lock `resource`, with its Kademlia key: the SHA-256 of the
/// replica's name ([`wire::replica_name`], `"R:{index+1}"`). Compared, hashed and
/// ordered by (lock name, index), as the `(String, u16)` it replaces. Shared: a clone
/// is a reference count, so a message, a deadline and a map entry can each hold one.
#[derive(Clone)]
pub(super) struct ReplicaKey(Arc<Parts>);

struct Parts {
    resource: String,
    index: u16,
    kad: KBucketKey<Vec<u8>>,
}

impl ReplicaKey {
    /// Replica `index` of `resource`, its key hashed now.
    pub(super) fn new(resource: &str, index: u16) -> Self {
        let kad = KBucketKey::new(wire::replica_name(resource, index).into_bytes());
        ReplicaKey(Arc::new(Parts { resource: resource.to_owned(), index, kad }))
    }

    /// The replicas `0..n` of `resource` (an acquisition's, or a probe's).
    pub(super) fn all(resource: &str, n: u16) -> Vec<ReplicaKey> {
        (0..n).map(|index| ReplicaKey::new(resource, index)).collect()
    }

    /// The lock's name.
    pub(super) fn resource(&self) -> &str {
        &self.0.resource
    }

    /// The replica's index among the lock's n.
    pub(super) fn index(&self) -> u16 {
        self.0.index
    }

    /// The Kademlia key peers are compared with (XOR distance).
    pub(super) fn kad(&self) -> &KBucketKey<Vec<u8>> {
        &self.0.kad
    }

    /// The name a Kademlia lookup of the key asks for (Kademlia hashes it itself).
    pub(super) fn name(&self) -> Vec<u8> {
        self.0.kad.preimage().clone()
    }
}

impl PartialEq for ReplicaKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.index == other.0.index && self.0.resource == other.0.resource
    }
}

impl Eq for ReplicaKey {}

impl Hash for ReplicaKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (&self.0.resource, self.0.index).hash(state);
    }
}

impl PartialOrd for ReplicaKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ReplicaKey {
    fn cmp(&self, other: &Self) -> Ordering {
        (&self.0.resource, self.0.index).cmp(&(&other.0.resource, other.0.index))
    }
}

impl std::fmt::Debug for ReplicaKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.0.resource, self.0.index)
    }
}
