//! Discrete-event simulation of the Sigma protocol and its baselines, the analytical
//! models the paper's figures compare against, and the side-by-side comparison.

pub mod analysis;
pub mod compare;
pub mod engine;
pub use sigma_behaviour::latency;
pub mod membership;
pub mod paper;
pub mod protocol;
