//! Closed membership: which peers may connect to this one.
//!
//! By default a sigma swarm is open: any peer that reaches a member joins, and a peer
//! whose id happens to be closest to a replica key hosts that replica. Peer ids are
//! free to make, so anyone can grind ids next to a lock's keys and take its replicas
//! (ARCHITECTURE.md, "Membership policy"). [`Admission`] closes the swarm, with either
//! or both of:
//!
//! - an **allow-list** of peer ids ([`Admission::allowed_peers`]; `sigma run
//!   --allow-peer`, `--allow-peers-file`): a connection with any other peer is refused
//!   once noise has authenticated it (libp2p's `allow_block_list`), before any protocol
//!   sees it. It pins identities: a leaked file grants nothing.
//! - a **swarm key** ([`Admission::swarm_key`]; `sigma run --swarm-key`): a pre-shared
//!   key that encrypts every TCP connection below noise (libp2p's `pnet`, XSalsa20); a
//!   peer without it cannot complete a handshake. It is shared: whoever holds it joins,
//!   under any peer id. QUIC has its own encryption, which pnet cannot wrap, so a node
//!   with a swarm key speaks TCP only.
//!
//! The file formats: an allow-list file holds one peer id per line, `#` starts a
//! comment, blank lines are skipped ([`parse_allow_list`]); a swarm key file is the
//! go-libp2p/IPFS format ([`read_swarm_key`], [`new_swarm_key`]):
//!
//! ```text
//! /key/swarm/psk/1.0.0/
//! /base16/
//! 0123…(64 hex digits)
//! ```

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};

use libp2p::core::muxing::StreamMuxerBox;
use libp2p::core::transport::{Boxed, Transport as _};
use libp2p::core::upgrade::Version;
use libp2p::identity::Keypair;
use libp2p::multiaddr::Protocol;
use libp2p::pnet::{PnetConfig, PreSharedKey};
use libp2p::{noise, tcp, yamux, Multiaddr, PeerId};

/// Who may connect: [`Default`] is open membership.
#[derive(Clone, Debug, Default)]
pub struct Admission {
    /// `Some`: only these peers may connect (this node itself always may); `None`:
    /// every peer.
    pub allowed_peers: Option<HashSet<PeerId>>,
    /// `Some`: every connection is encrypted with this key before noise (TCP only; the
    /// node then neither listens on nor dials QUIC). Its `Debug` shows the fingerprint,
    /// never the key.
    pub swarm_key: Option<PreSharedKey>,
}

impl Admission {
    /// Whether anything closes the swarm.
    pub fn is_closed(&self) -> bool {
        self.allowed_peers.is_some() || self.swarm_key.is_some()
    }

    /// Whether `peer` may connect.
    pub fn allows(&self, peer: &PeerId) -> bool {
        self.allowed_peers.as_ref().is_none_or(|peers| peers.contains(peer))
    }

    /// Why `addr` cannot be listened on under this policy: a swarm key protects TCP
    /// only, so a QUIC (or any UDP) address is refused rather than left open.
    pub fn check_listen(&self, addr: &Multiaddr) -> Result<(), String> {
        if self.swarm_key.is_some() && !is_tcp(addr) {
            return Err("a swarm key (pnet) protects TCP only: with --swarm-key, listen on /tcp addresses, \
                        not QUIC or UDP"
                .to_owned());
        }
        Ok(())
    }

    /// Says how the swarm is closed, if it is (the key's fingerprint, never the key).
    pub(crate) fn log(&self) {
        if let Some(peers) = &self.allowed_peers {
            tracing::info!(peers = peers.len(), "closed membership: only listed peers may connect");
        }
        if let Some(key) = &self.swarm_key {
            tracing::info!(fingerprint = %key.fingerprint(), "private swarm: connections need the swarm key (TCP only, QUIC off)");
        }
        if !self.is_closed() {
            tracing::debug!("open membership: any peer may connect");
        }
    }
}

/// Whether `addr` is carried by TCP (and not by UDP: QUIC, WebRTC).
fn is_tcp(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| matches!(p, Protocol::Tcp(_))) && !addr.iter().any(|p| matches!(p, Protocol::Udp(_)))
}

/// Why an allow-list or a swarm key could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A line of an allow-list file is not a peer id.
    #[error("{path}, line {line}: {entry:?} is not a peer id ({reason})")]
    BadPeer {
        /// The allow-list file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The text found there (comment removed).
        entry: String,
        /// What the parser said.
        reason: String,
    },
    /// The swarm key file is not in the `/key/swarm/psk/1.0.0/` format.
    #[error(
        "{path} is not a swarm key ({reason}): expected the lines /key/swarm/psk/1.0.0/, /base16/ and 64 hex \
         digits (`sigma swarm-key` makes one)"
    )]
    BadSwarmKey {
        /// The key file.
        path: PathBuf,
        /// What the parser said.
        reason: String,
    },
}

/// A line of an allow-list that is not a peer id: (1-based line, text, parser's reason).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadLine {
    /// 1-based line number.
    pub line: usize,
    /// The text found there, comment removed.
    pub entry: String,
    /// What the parser said.
    pub reason: String,
}

/// A peer id as an operator writes it. Stricter than `PeerId`'s `FromStr`, which takes
/// any short identity multihash: `12D3KooWtypo` parses, as a peer nobody can be. Here the
/// id must hold a public key this node can use (ed25519, as sigma's peers have) or be
/// a SHA-256 of one, so a truncated or mistyped id is an error, not a silent stranger.
pub fn parse_peer_id(text: &str) -> Result<PeerId, String> {
    let peer: PeerId = text.parse().map_err(|e| format!("{e}"))?;
    let hash: &libp2p::multihash::Multihash<64> = peer.as_ref();
    let whole = match hash.code() {
        IDENTITY => libp2p::identity::PublicKey::try_decode_protobuf(hash.digest()).is_ok(),
        SHA2_256 => hash.digest().len() == 32,
        _ => false,
    };
    if !whole {
        return Err("it holds no usable public key (truncated or mistyped?)".to_owned());
    }
    Ok(peer)
}

/// Multihash codes of peer ids: the key itself (short keys), or its SHA-256.
const IDENTITY: u64 = 0x00;
const SHA2_256: u64 = 0x12;

/// The peer ids of an allow-list text: one per line; `#` starts a comment (a whole
/// line or the end of one); blank lines and surrounding whitespace are ignored.
pub fn parse_allow_list(text: &str) -> Result<Vec<PeerId>, BadLine> {
    let mut peers = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let entry = line.split('#').next().unwrap_or_default().trim();
        if entry.is_empty() {
            continue;
        }
        let peer = parse_peer_id(entry).map_err(|reason| BadLine { line: i + 1, entry: entry.to_owned(), reason })?;
        peers.push(peer);
    }
    Ok(peers)
}

/// The peer ids of the allow-list file at `path` (see [`parse_allow_list`]).
pub fn read_allow_list(path: &Path) -> Result<Vec<PeerId>, AdmissionError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| AdmissionError::Read { path: path.to_owned(), source })?;
    parse_allow_list(&text).map_err(|bad| AdmissionError::BadPeer {
        path: path.to_owned(),
        line: bad.line,
        entry: bad.entry,
        reason: bad.reason,
    })
}

/// The swarm key in the file at `path`. Warns if others may read it.
pub fn read_swarm_key(path: &Path) -> Result<PreSharedKey, AdmissionError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| AdmissionError::Read { path: path.to_owned(), source })?;
    let key = text
        .parse::<PreSharedKey>()
        .map_err(|e| AdmissionError::BadSwarmKey { path: path.to_owned(), reason: e.to_string() })?;
    warn_if_exposed(path);
    Ok(key)
}

/// A new random swarm key (from the operating system's CSPRNG). Its `Display` is the
/// key file's text.
pub fn new_swarm_key() -> Result<PreSharedKey, rand::Error> {
    use rand::RngCore as _;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.try_fill_bytes(&mut bytes)?;
    Ok(PreSharedKey::new(bytes))
}

/// TCP, then the swarm key's encryption (pnet), then noise and yamux: the transport of
/// a node with a swarm key (libp2p's `examples/ipfs-private`). The error is boxed as
/// `SwarmBuilder::with_other_transport` takes it.
pub(crate) fn private_tcp(
    keypair: &Keypair,
    key: PreSharedKey,
    tcp_config: tcp::Config,
) -> Result<Boxed<(PeerId, StreamMuxerBox)>, Box<dyn std::error::Error + Send + Sync>> {
    Ok(tcp::tokio::Transport::new(tcp_config)
        .and_then(move |socket, _| PnetConfig::new(key).handshake(socket))
        .upgrade(Version::V1Lazy)
        .authenticate(noise::Config::new(keypair)?)
        .multiplex(yamux::Config::default())
        .map(|(peer, muxer), _| (peer, StreamMuxerBox::new(muxer)))
        .boxed())
}

#[cfg(unix)]
fn warn_if_exposed(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path) {
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(path = %path.display(), mode = format!("{:o}", mode & 0o777), "swarm key file is readable by others");
        }
    }
}

#[cfg(not(unix))]
fn warn_if_exposed(_path: &Path) {}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> PeerId {
        Keypair::generate_ed25519().public().to_peer_id()
    }

    #[test]
    fn allow_list_skips_comments_and_blank_lines() {
        let (a, b) = (peer(), peer());
        let text = format!("# the swarm\n\n  {a}  \n{b} # second host\n   # indented comment\n");
        assert_eq!(parse_allow_list(&text), Ok(vec![a, b]));
        assert_eq!(parse_allow_list(""), Ok(vec![]));
    }

    #[test]
    fn a_bad_allow_list_line_is_named() {
        let a = peer();
        let err = parse_allow_list(&format!("{a}\n# ok\n12D3KooWnot-a-peer # typo\n")).unwrap_err();
        assert_eq!(err.line, 3);
        assert_eq!(err.entry, "12D3KooWnot-a-peer");
        assert!(!err.reason.is_empty());
        // Valid base58 and a valid (7-byte identity) multihash, but no key: a typo.
        let err = parse_allow_list("12D3KooWtypo\n").unwrap_err();
        assert_eq!((err.line, err.reason.contains("no usable public key")), (1, true), "{err:?}");
        assert!("12D3KooWtypo".parse::<PeerId>().is_ok(), "libp2p alone takes it");
    }

    #[test]
    fn allow_list_file_errors_name_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("allow");
        std::fs::write(&path, format!("{}\nnope\n", peer())).unwrap();
        let msg = read_allow_list(&path).unwrap_err().to_string();
        assert!(msg.contains("allow, line 2: \"nope\" is not a peer id"), "{msg}");
        let msg = read_allow_list(&dir.path().join("missing")).unwrap_err().to_string();
        assert!(msg.starts_with("cannot read"), "{msg}");
    }

    #[test]
    fn swarm_key_file_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("swarm.key");
        let key = new_swarm_key().unwrap();
        std::fs::write(&path, key.to_string()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("/key/swarm/psk/1.0.0/\n/base16/\n"), "{text}");
        let back = read_swarm_key(&path).unwrap();
        assert_eq!(back.fingerprint().to_string(), key.fingerprint().to_string());
        assert_eq!(back.to_string(), key.to_string());
        assert_ne!(new_swarm_key().unwrap().to_string(), key.to_string(), "fresh keys differ");
        // The Debug form (logs, NodeConfig) shows the fingerprint, never the key.
        let hex = text.lines().nth(2).unwrap();
        assert!(!format!("{:?}", Admission { swarm_key: Some(key), ..Admission::default() }).contains(hex));
    }

    #[test]
    fn bad_swarm_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("swarm.key");
        for text in
            ["", "/key/swarm/psk/1.0.0/\n/base16/\n1234\n", "/key/swarm/psk/1.0.0/\n/base64/\n00\n", "x\ny\nz\n"]
        {
            std::fs::write(&path, text).unwrap();
            let msg = read_swarm_key(&path).unwrap_err().to_string();
            assert!(msg.contains("is not a swarm key"), "{text:?}: {msg}");
        }
    }

    #[test]
    fn a_swarm_key_refuses_quic_listeners() {
        let open = Admission::default();
        let closed = Admission { swarm_key: Some(new_swarm_key().unwrap()), ..Admission::default() };
        let quic: Multiaddr = "/ip4/127.0.0.1/udp/0/quic-v1".parse().unwrap();
        let tcp: Multiaddr = "/ip4/127.0.0.1/tcp/0".parse().unwrap();
        assert!(open.check_listen(&quic).is_ok());
        assert!(closed.check_listen(&tcp).is_ok());
        assert!(closed.check_listen(&quic).unwrap_err().contains("TCP only"));
    }

    #[test]
    fn an_allow_list_allows_only_its_peers() {
        let (a, b) = (peer(), peer());
        assert!(Admission::default().allows(&a), "open");
        let closed = Admission { allowed_peers: Some([a].into()), ..Admission::default() };
        assert!(closed.allows(&a) && !closed.allows(&b));
    }
}
