//! Errors of the core. Remote misbehaviour is a value, never a panic; an error leaves
//! the state machine exactly as it was.

use thiserror::Error;

/// Why a replica rejected a message. Nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ReplicaError {
    /// The sender is not the client named in the timestamp: a peer may only act on its
    /// own acquisitions.
    #[error("sender is not the client of this acquisition")]
    ForeignAcquisition,
    /// RELEASE or YIELD for an acquisition that neither owns the replica nor waits in it.
    #[error("acquisition neither owns nor waits on this replica")]
    NotHolder,
    /// A message for an acquisition this replica already saw released (a duplicate, or a
    /// REQUEST overtaken by its own RELEASE).
    #[error("acquisition already released here")]
    Finished,
    /// The queue is at its configured bound.
    #[error("queue full ({0} waiters)")]
    QueueFull(usize),
    /// A timestamp, floor or token further ahead of the replica's clock than
    /// `Config::max_clock_offset`: a clock far off, or a forged value.
    #[error("timestamp {value} too far ahead of this replica's clock")]
    Ahead {
        /// The value refused.
        value: u64,
    },
}

/// Why a client rejected a message. Nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ClientError {
    /// Replica index outside `0..n`.
    #[error("replica index {index} out of range (n = {n})")]
    ReplicaOutOfRange {
        /// The index received.
        index: usize,
        /// Number of replicas of the acquisition.
        n: usize,
    },
    /// A response addressed to another acquisition.
    #[error("response for another acquisition")]
    WrongAcquisition,
    /// A response older than one already applied for that replica.
    #[error("stale response")]
    Stale,
    /// A grant stamp or owner timestamp further ahead of the client's clock than
    /// `Config::max_clock_offset`.
    #[error("response stamp {value} too far ahead of this client's clock")]
    Ahead {
        /// The value refused.
        value: u64,
    },
}

/// Invalid configuration.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// The quorum must be a strict majority no larger than the replica count.
    #[error("quorum m = {m} must satisfy n/2 < m <= n (n = {n})")]
    Quorum {
        /// Replicas.
        n: usize,
        /// Quorum.
        m: usize,
    },
    /// Too many replicas.
    #[error("n = {0} exceeds the maximum of {max}", max = super::MAX_REPLICAS)]
    TooManyReplicas(usize),
    /// Renewals must come before the lease runs out.
    #[error("renew interval must be shorter than the lease")]
    RenewNotBelowLease,
    /// The request timeout bounds a promotion notice's time in flight; it must be at
    /// most half the lease.
    #[error("request timeout must be at most half the lease")]
    RequestTimeoutNotBelowLease,
    /// The clock-drift bound must stay well below 10%.
    #[error("clock drift bound {0} ppm must be below 100000")]
    Drift(u32),
    /// A win needs votes from D distinct voters, and D votes at least.
    #[error("distinct voters D = {d} must satisfy 1 <= D <= m (m = {m})")]
    Diversity {
        /// Distinct voters asked for.
        d: usize,
        /// Quorum.
        m: usize,
    },
    /// A duration that must be positive is zero.
    #[error("{0} must be greater than zero")]
    ZeroDuration(&'static str),
}
