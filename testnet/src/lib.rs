//! Local testnet and discrete-event simulator for sigma.

pub mod plot;
pub mod sim;
