//! The sans-IO core of Sigma (Lin, Lian, Chen, Zhang 2004).
//!
//! Deterministic state machines: no networking, no clock reads, no global randomness.
//! Time enters as `now: Time` (a `Duration` since an epoch of the driver's choosing)
//! and randomness as an `&mut impl Rng` argument; outputs are plain data drained with
//! `poll_transmit`, `poll_event` and `poll_timeout`, in the manner of quinn-proto.
//! The libp2p behaviour, the simulator and the tests all drive these same types.
//!
//! ```text
//!          Client (Fig. 5)                              Replica i of R (Fig. 6)
//!   ┌──────────────────────────┐   REQUEST(ts)     ┌──────────────────────────┐
//!   │ ts = Lamport stamp       │ ────────────────▶ │ owner: (ts, stamp, lease)│
//!   │ resp[0..n]: owner per    │ ◀──────────────── │ queue: waiters by ts     │
//!   │   replica (newest stamp) │   RESPONSE(owner, │ T_cs estimate            │
//!   │ win: ≥ m votes           │   T_w advice)     │ tombstones               │
//!   │ case 3: YIELD (gated)    │ ────YIELD───────▶ │ RespQueue: promote head, │
//!   │ release: RELEASE to all  │ ───RELEASE──────▶ │   unsolicited RESPONSE   │
//!   └──────────────────────────┘                   └──────────────────────────┘
//! ```
//!
//! Modules, in the paper's words:
//! - [`clock`]: Lamport timestamps `(counter, client)`, a total order (§4).
//! - [`message`]: REQUEST, RELEASE, YIELD and RESPONSE.
//! - [`replica`]: Fig. 6 with §4's leases, informed backoff and tombstones.
//! - [`client`]: Fig. 5's three outcomes, informed-backoff retries, renewals.
//!
//! The baselines the simulator compares it with (the paper's strawman, CMR, Obeidat,
//! the classical algorithms) live beside the simulator, in `sigma-testnet`.

pub mod client;
pub mod clock;
pub mod config;
pub mod error;
pub mod message;
pub mod replica;

pub use client::{Client, ClientStats, Event, LostReason, Phase};
pub use clock::{LamportClock, Timestamp};
#[doc(hidden)]
pub use config::Mutant;
pub use config::{Config, Recovery};
pub use error::{ClientError, ConfigError, ReplicaError};
pub use message::{Response, ToReplica, RELAY_DEPTH};
pub use replica::{Replica, ReplicaStats};

/// Time as the core sees it: a duration since an epoch chosen by the driver (virtual
/// time in the simulator, a monotonic clock in the node).
pub type Time = std::time::Duration;

/// Upper bound on replicas per resource: bounds every per-acquisition allocation a
/// remote peer can cause.
pub const MAX_REPLICAS: usize = 255;
