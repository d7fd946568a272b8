//! sigma-daemon: the `sigma` command and what only a daemon needs beside the embeddable
//! peer of [`sigma_node`]: the loopback HTTP control API ([`http`]) and its typed client
//! ([`client`]), for `sigma lock`, the testnet driver and Rust programs that talk to a
//! running daemon instead of embedding a [`sigma_node::Node`].
//!
//! The binary (`src/main.rs`) dispatches each subcommand to its module under `src/cmd/`.

pub mod client;
pub mod http;
pub mod metrics;
pub mod version;
