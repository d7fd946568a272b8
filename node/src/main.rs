//! `sigma`: the peer daemon and lock command line. The network node is not part of
//! this version; the protocol core and the simulator are (see README.md).

fn main() {
    eprintln!(
        "sigma {}: the peer (run, lock, status) is not available yet; try `sigma-testnet sim paper`",
        env!("CARGO_PKG_VERSION")
    );
    std::process::exit(2);
}
