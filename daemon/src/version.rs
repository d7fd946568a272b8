//! What this build is: the version, the commit and the wire protocol, for `sigma
//! --version` and the `sigma_build_info` metric.

use std::sync::LazyLock;

/// The crate's version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit built (12 hex digits), or `unknown` for a build outside a git checkout
/// without `$SIGMA_BUILD_COMMIT` (`build.rs`).
pub const COMMIT: &str = env!("SIGMA_COMMIT");

/// The Sigma wire protocol this build speaks (peers that do not speak it cannot vote
/// with it), e.g. `/sigma/2.0.0`.
pub fn protocol() -> &'static str {
    static PROTOCOL: libp2p::StreamProtocol = sigma_behaviour::wire::PROTOCOL;
    PROTOCOL.as_ref()
}

/// `0.1.0 (commit 5baa107c0e1f, protocol /sigma/2.0.0)`: what `sigma --version` prints
/// after the program's name.
pub fn line() -> &'static str {
    static LINE: LazyLock<String> = LazyLock::new(|| format!("{VERSION} (commit {COMMIT}, protocol {})", protocol()));
    &LINE
}
