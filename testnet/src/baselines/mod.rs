//! The research baselines the simulator compares Sigma with, in the same sans-IO shape
//! as the Sigma core (`sigma_behaviour::proto`) and driven by the same engine
//! (`crate::sim::protocol`): the strawman of the paper's §3, Chockler–Malkhi–Reiter
//! 2001, Obeidat 2008, and the classical closed-system algorithms. None of it is part of
//! the lock service; `sigma-behaviour` holds only what a sigma user runs.

pub mod backoff;
pub mod classical;
pub mod cmr;
pub mod obeidat;
mod rounds;
pub mod strawman;
