//! The local multi-process testnet: real `sigma run` daemons on 127.0.0.1, each its own
//! process with its own key file, log file and HTTP control API.
//!
//! - [`cluster`]: `up` / `status` / `down` and the manifest (`DIR/manifest.json`);
//! - [`workload`]: HTTP clients in the driver, each bound to a node and a resource,
//!   recording every critical section (enter, exit, token, lease);
//! - [`chaos`]: faults at seeded random moments (kill, restart, join, pause) and a
//!   supervisor that notices nodes dying on their own;
//! - [`check`]: exclusion, fencing tokens, starvation, from the recorded intervals;
//! - [`membership`]: the membership's cost per node over the workload, from the
//!   daemons' `/metrics` at both ends, against the goals `sim membership` prints;
//! - [`holders`]: `sigma lock NAME -- CMD` run for real, checked from the commands' own
//!   timestamps (`run --holders N`);
//! - [`run`]: `sigma-testnet run`, the whole job (up, workload, faults, checker, down)
//!   with a live view and a summary;
//! - [`soak`]: `sigma-testnet soak`, a stream of distinct lock names (and, with
//!   [`flood`], a hostile peer) to see that a swarm gives its memory back.
//!
//! Ports: with `--base-port P`, node i listens for peers on TCP `P + i` and serves its
//! API on `P + 1000 + i`; without it both are ephemeral (port 0, read back from the
//! node's `SIGMA_LISTEN=` and `SIGMA_API=` lines) and kept for restarts.

pub mod api;
pub mod chaos;
pub mod check;
pub mod cluster;
pub mod flood;
pub mod holders;
pub mod membership;
pub mod observers;
pub mod proc;
pub mod run;
pub mod soak;
pub mod workload;
