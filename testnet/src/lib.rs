//! Local testnet and discrete-event simulator for sigma.

pub mod baselines;
pub mod bench;
pub mod etcd;
pub mod plot;
pub mod sim;
pub mod swarm;
pub mod testnet;
pub mod versus;
