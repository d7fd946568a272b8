//! Discrete-event simulation of the Sigma protocol and its analytical models.

pub mod analysis;
pub mod latency;
