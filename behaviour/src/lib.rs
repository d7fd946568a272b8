//! sigma-behaviour: the Sigma distributed mutual-exclusion protocol (Lin, Lian, Chen,
//! Zhang 2004) inside a libp2p Kademlia DHT.
//!
//! # Layout
//! - [`proto`]: the sans-IO core (clients, replicas). No I/O,
//!   no clock reads, no global randomness: the simulator and the tests drive it too.
//! - [`addr`]: address scopes (loopback, private, global): which addresses of other
//!   peers are kept and handed on.
//! - [`latency`]: one-way latency distributions (the simulator's, and the test-only
//!   message delay of [`Config::with_message_delay`]).
//! - [`membership`] and [`liveness`]: who the swarm is, whether this peer may serve,
//!   and the signed heartbeats only a member itself can refresh.
//! - [`wire`]: the `/sigma/2.0.0` messages, their framing and their validation.
//! - [`link`]: the transport (framed, pipelined requests and replies on one long-lived
//!   stream per connection and direction).
//! - [`Behaviour`]: the libp2p `NetworkBehaviour` that places replicas in the DHT and
//!   drives the core.

pub mod addr;
mod behaviour;
pub mod latency;
pub mod liveness;
pub mod membership;
pub use membership::{ForgetError, Readiness};
pub mod proto;
pub mod wire;

pub use behaviour::link;
pub use behaviour::{
    kad_protocol, AcquireError, AcquisitionId, AcquisitionInfo, Admin, Behaviour, BootClock, Config, Counters, Event,
    GossipCodec, Inner, InnerEvent, ProbeId, ReplicaAnswer, ReplicaInfo, ReplicaTotals, StateSizes, Traffic,
    DEFAULT_GOSSIP_FANOUT, DEFAULT_GOSSIP_INTERVAL, DEFAULT_GOSSIP_LIVENESS, DEFAULT_IDLE_HOSTS_TTL,
    DEFAULT_MAX_CONCURRENT_STREAMS, DEFAULT_MAX_ENTRIES, DEFAULT_MAX_ENTRIES_PER_PEER, DEFAULT_MEMBERSHIP_WINDOW,
    DEFAULT_PING_INTERVAL, DEFAULT_PING_TIMEOUT, KAD_PROTOCOL,
};
