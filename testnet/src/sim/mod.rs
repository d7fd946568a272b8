//! Discrete-event simulation of the Sigma protocol and its baselines, and the
//! analytical models the paper's figures compare against.

pub mod analysis;
pub mod engine;
pub mod latency;
pub mod paper;
pub mod protocol;
