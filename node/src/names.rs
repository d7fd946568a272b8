//! Peer names: a short label an operator gives a peer (`sigma run --name db-1`), carried
//! to the other peers in identify's agent version (`sigma-node/0.1.0 name=db-1`), and
//! shown next to peer ids (status, inspect, the swarm's locks).
//!
//! A name says nothing about identity: any peer may call itself anything, and two peers
//! may share a name. It is a label for people, never a key. A name heard from a remote
//! peer is untrusted: only the first [`MAX_NAME_LEN`] characters of the name charset
//! are kept, and at most [`MAX_PEER_NAMES`] names are kept at all ([`PeerNames`]).

use std::collections::HashMap;

use libp2p::PeerId;

/// Longest peer name, in bytes.
pub const MAX_NAME_LEN: usize = 32;
/// Most names of other peers a node keeps.
pub const MAX_PEER_NAMES: usize = 1024;

/// What a name may hold: ASCII letters, digits, `.`, `_`, `-`.
fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// A bad name given to this node.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad peer name {0:?}: 1 to {MAX_NAME_LEN} characters of ASCII letters, digits, '.', '_' and '-' (e.g. db-1)")]
pub struct BadName(pub String);

/// Checks a name given to this node (`sigma run --name`).
pub fn validate_name(name: &str) -> Result<(), BadName> {
    if name.is_empty() || name.len() > MAX_NAME_LEN || !name.chars().all(name_char) {
        return Err(BadName(name.to_owned()));
    }
    Ok(())
}

/// [`validate_name`] as a parser (command lines).
pub fn parse_name(name: &str) -> Result<String, BadName> {
    validate_name(name).map(|()| name.to_owned())
}

/// The agent version identify announces: the node's version, and its name if it has one.
pub fn agent_version(name: Option<&str>) -> String {
    let version = format!("sigma-node/{}", env!("CARGO_PKG_VERSION"));
    match name {
        Some(name) => format!("{version} name={name}"),
        None => version,
    }
}

/// The name in a remote peer's agent version, made safe: the value of its first
/// `name=` word, cut at the first character outside the charset and to
/// [`MAX_NAME_LEN`]. `None` if there is none, or nothing is left of it.
pub fn name_from_agent(agent: &str) -> Option<String> {
    let value = agent.split(' ').find_map(|word| word.strip_prefix("name="))?;
    let name: String = value.chars().take_while(|c| name_char(*c)).take(MAX_NAME_LEN).collect();
    (!name.is_empty()).then_some(name)
}

/// The names of other peers, as their identify announced them: at most
/// [`MAX_PEER_NAMES`]. When full, a new peer's name takes the place of one whose peer
/// the caller no longer cares about (not connected, not a member), or is not kept.
#[derive(Debug, Default)]
pub(crate) struct PeerNames {
    names: HashMap<PeerId, String>,
}

impl PeerNames {
    /// Records what `peer`'s identify announced (a name, or none: a name it dropped is
    /// forgotten). `keep` says which peers' names are still wanted when room is needed.
    pub(crate) fn heard(&mut self, peer: PeerId, agent: &str, keep: impl Fn(&PeerId) -> bool) {
        let Some(name) = name_from_agent(agent) else {
            self.names.remove(&peer);
            return;
        };
        if self.names.len() >= MAX_PEER_NAMES && !self.names.contains_key(&peer) {
            self.names.retain(|p, _| keep(p));
            if self.names.len() >= MAX_PEER_NAMES {
                tracing::debug!(%peer, "no room for another peer name");
                return;
            }
        }
        self.names.insert(peer, name);
    }

    /// `peer`'s name, if known.
    #[cfg(test)]
    pub(crate) fn get(&self, peer: &PeerId) -> Option<&String> {
        self.names.get(peer)
    }

    /// The names of `peers` that have one, by peer id.
    pub(crate) fn of<'a>(
        &self,
        peers: impl IntoIterator<Item = &'a PeerId>,
    ) -> std::collections::BTreeMap<String, String> {
        peers.into_iter().filter_map(|p| Some((p.to_string(), self.names.get(p)?.clone()))).collect()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_given_are_checked() {
        for ok in ["db-1", "a", "node_7.eu-west", &"x".repeat(MAX_NAME_LEN)] {
            assert_eq!(parse_name(ok).as_deref(), Ok(ok));
        }
        for bad in ["", "db 1", "db=1", "ünï", "a\u{7}b", "x/y", &"x".repeat(MAX_NAME_LEN + 1)] {
            let e = parse_name(bad).unwrap_err();
            assert!(e.to_string().contains("1 to 32 characters"), "{e}");
        }
    }

    #[test]
    fn a_remote_name_is_cut_to_the_charset_and_the_bound() {
        assert_eq!(name_from_agent(&agent_version(Some("db-1"))).as_deref(), Some("db-1"));
        assert_eq!(name_from_agent(&agent_version(None)), None);
        assert_eq!(name_from_agent("go-libp2p/0.30"), None);
        assert_eq!(name_from_agent("x name=evil\u{1b}[2Jmore").as_deref(), Some("evil"));
        assert_eq!(name_from_agent("x name=\u{1b}[31m"), None);
        assert_eq!(name_from_agent("x name=").as_deref(), None);
        let long = format!("x name={}", "y".repeat(10_000));
        assert_eq!(name_from_agent(&long).map(|n| n.len()), Some(MAX_NAME_LEN));
    }

    #[test]
    fn names_are_bounded_and_make_room_for_wanted_peers() {
        let mut names = PeerNames::default();
        let peers: Vec<PeerId> = (0..MAX_PEER_NAMES).map(|_| PeerId::random()).collect();
        for p in &peers {
            names.heard(*p, "sigma-node/0 name=n", |_| true);
        }
        assert_eq!(names.len(), MAX_PEER_NAMES);
        let newcomer = PeerId::random();
        // Every known peer still wanted: the newcomer's name is not kept.
        names.heard(newcomer, "sigma-node/0 name=new", |_| true);
        assert_eq!((names.len(), names.get(&newcomer)), (MAX_PEER_NAMES, None));
        // Half no longer wanted: they make room.
        let wanted: std::collections::HashSet<PeerId> = peers[..MAX_PEER_NAMES / 2].iter().copied().collect();
        names.heard(newcomer, "sigma-node/0 name=new", |p| wanted.contains(p));
        assert_eq!(names.len(), MAX_PEER_NAMES / 2 + 1);
        assert_eq!(names.get(&newcomer).map(String::as_str), Some("new"));
        // A peer that drops its name is forgotten.
        names.heard(newcomer, "sigma-node/0", |_| true);
        assert_eq!(names.get(&newcomer), None);
    }
}
