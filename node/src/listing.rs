//! The swarm's locks (`sigma locks --swarm`, `GET /v1/swarm/locks`): every alive member
//! (this node included) is asked for the acquisitions it took that hold or wait
//! ([`sigma_behaviour::wire::Request::Locks`]), and the answers are put together by lock
//! name: its holder (the peer that says it holds it, with its token and validity) and
//! its waiters.
//!
//! A snapshot, not a consistent cut: the peers answer at slightly different moments, so
//! a lock that changed hands meanwhile may show two holders or none; a lock whose
//! holder did not answer (cut off, overloaded, an old version) is missing, or listed
//! with its waiters only. At most [`MAX_ASKED`] members are asked and at most
//! [`MAX_PAGES`] pages are read from each; what was left out is said
//! ([`SwarmLocks::unanswered`], [`SwarmLocks::truncated`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sigma_behaviour::wire::LockEntry;

/// Most members asked (the first in id order, this node always among them).
pub const MAX_ASKED: usize = 256;
/// Most pages read from one peer ([`sigma_behaviour::wire::MAX_LISTED_LOCKS`] each).
pub const MAX_PAGES: usize = 8;

/// A peer that holds a lock, as it answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SwarmHolder {
    /// The peer it is held through.
    pub peer: String,
    /// The acquisition's Lamport counter.
    pub counter: u64,
    /// Fencing token.
    pub token: u64,
    /// How long exclusion was still guaranteed when the peer answered (ms).
    pub valid_for_ms: u64,
}

/// A peer that waits for a lock, as it answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SwarmWaiter {
    /// The peer it waits through.
    pub peer: String,
    /// The acquisition's Lamport counter.
    pub counter: u64,
    /// Its place in line (1 = next); `None` until m replicas answered it.
    pub position: Option<u32>,
    /// Votes it holds.
    pub votes: u16,
}

/// One lock held or waited for somewhere in the swarm.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SwarmLock {
    /// Lock name.
    pub name: String,
    /// The peers that say they hold it (one; two only while a lock changes hands
    /// between answers; none if its holder did not answer or nobody holds it).
    pub holders: Vec<SwarmHolder>,
    /// The peers that wait for it, best placed first.
    pub waiters: Vec<SwarmWaiter>,
}

/// A peer whose list was longer than what was read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Truncated {
    /// The peer.
    pub peer: String,
    /// Its acquisitions not listed.
    pub more: u32,
}

/// Answer of `GET /v1/swarm/locks`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SwarmLocks {
    /// Peers asked: the alive members, this node included (at most 256).
    pub asked: usize,
    /// Peers that answered.
    pub answered: usize,
    /// Peers that did not answer (or answered out of bounds): their locks are missing.
    pub unanswered: Vec<String>,
    /// Peers whose list was cut (more than 8 pages of 128).
    pub truncated: Vec<Truncated>,
    /// The locks, by name.
    pub locks: Vec<SwarmLock>,
    /// The names the peers listed here announced (by peer id), where known.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub names: BTreeMap<String, String>,
}

/// What one peer answered: its acquisitions and how many were left out, or `None`.
pub type PeerAnswer = (libp2p::PeerId, Option<(Vec<LockEntry>, u32)>);

/// Puts the peers' answers together by lock name.
pub fn gather(answers: Vec<PeerAnswer>) -> SwarmLocks {
    let mut out = SwarmLocks { asked: answers.len(), ..SwarmLocks::default() };
    let mut locks: BTreeMap<String, SwarmLock> = BTreeMap::new();
    for (peer, answer) in answers {
        let Some((entries, more)) = answer else {
            out.unanswered.push(peer.to_string());
            continue;
        };
        out.answered += 1;
        if more > 0 {
            out.truncated.push(Truncated { peer: peer.to_string(), more });
        }
        for e in entries {
            let lock = locks.entry(e.resource.clone()).or_insert_with(|| SwarmLock {
                name: e.resource.clone(),
                holders: Vec::new(),
                waiters: Vec::new(),
            });
            let peer = peer.to_string();
            if e.held {
                lock.holders.push(SwarmHolder {
                    peer,
                    counter: e.counter,
                    token: e.token,
                    valid_for_ms: e.valid_for_ms,
                });
            } else {
                lock.waiters.push(SwarmWaiter { peer, counter: e.counter, position: e.position, votes: e.votes });
            }
        }
    }
    for lock in locks.values_mut() {
        lock.holders.sort_by_key(|h| std::cmp::Reverse(h.token));
        lock.waiters.sort_by_key(|w| (w.position.is_none(), w.position, std::cmp::Reverse(w.votes)));
    }
    out.locks = locks.into_values().collect();
    out
}

impl SwarmLocks {
    /// The peers listed here.
    pub fn peers(&self) -> Vec<String> {
        let mut peers: Vec<String> = self
            .locks
            .iter()
            .flat_map(|l| l.holders.iter().map(|h| h.peer.clone()).chain(l.waiters.iter().map(|w| w.peer.clone())))
            .chain(self.unanswered.iter().cloned())
            .collect();
        peers.sort_unstable();
        peers.dedup();
        peers
    }

    /// `peer`, with its name if it has one.
    pub fn who(&self, peer: &str) -> String {
        match self.names.get(peer) {
            Some(name) => format!("{peer} ({name})"),
            None => peer.to_owned(),
        }
    }

    /// A table for people: one line per lock (per holder, if several), then what was
    /// left out.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut rows: Vec<[String; 5]> = Vec::new();
        for l in &self.locks {
            let waiters = l.waiters.len().to_string();
            if l.holders.is_empty() {
                rows.push([l.name.clone(), "-".into(), "-".into(), "-".into(), waiters.clone()]);
            }
            for h in &l.holders {
                rows.push([
                    l.name.clone(),
                    self.who(&h.peer),
                    h.token.to_string(),
                    format!("{} ms", h.valid_for_ms),
                    waiters.clone(),
                ]);
            }
        }
        let mut out = String::new();
        if rows.is_empty() {
            out.push_str("no locks held or waited for\n");
        } else {
            let head = ["LOCK", "HOLDER", "TOKEN", "VALID FOR", "WAITERS"].map(str::to_owned);
            let table: Vec<[String; 5]> = std::iter::once(head).chain(rows).collect();
            for line in aligned(&table, [false, false, true, true, true]) {
                let _ = writeln!(out, "{line}");
            }
        }
        let _ = writeln!(out, "{} of {} peers answered", self.answered, self.asked);
        for p in &self.unanswered {
            let _ = writeln!(out, "no answer from {} (its locks are not listed)", self.who(p));
        }
        for t in &self.truncated {
            let _ = writeln!(out, "{} more through {} not listed", t.more, self.who(&t.peer));
        }
        out
    }
}

/// Rows of five cells as lines of aligned columns, two spaces apart (`right`: which
/// columns align right), with no trailing spaces: the tables of `sigma locks --swarm`
/// and `sigma top`. Widths count characters; the cells are ASCII.
pub fn aligned(rows: &[[String; 5]], right: [bool; 5]) -> Vec<String> {
    let mut widths = [0usize; 5];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    rows.iter()
        .map(|row| {
            let cells: Vec<String> = (0..5)
                .map(|i| {
                    if right[i] {
                        format!("{:>w$}", row[i], w = widths[i])
                    } else {
                        format!("{:<w$}", row[i], w = widths[i])
                    }
                })
                .collect();
            cells.join("  ").trim_end().to_owned()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use libp2p::PeerId;

    fn entry(name: &str, counter: u64, held: bool) -> LockEntry {
        LockEntry {
            resource: name.into(),
            counter,
            held,
            token: if held { 100 + counter } else { 0 },
            valid_for_ms: if held { 900 } else { 0 },
            votes: if held { 24 } else { 3 },
            position: (!held).then_some(u32::try_from(counter).unwrap()),
        }
    }

    #[test]
    fn answers_are_put_together_by_lock() {
        let (a, b, c, d) = (PeerId::random(), PeerId::random(), PeerId::random(), PeerId::random());
        let answers = vec![
            (a, Some((vec![entry("db", 1, true), entry("jobs", 5, false)], 0))),
            (b, Some((vec![entry("db", 3, false), entry("db", 2, false)], 7))),
            (c, None),
            (d, Some((vec![entry("jobs", 4, false)], 0))),
        ];
        let mut s = gather(answers);
        assert_eq!((s.asked, s.answered), (4, 3));
        assert_eq!(s.unanswered, [c.to_string()]);
        assert_eq!(s.truncated, [Truncated { peer: b.to_string(), more: 7 }]);
        let db = &s.locks[0];
        assert_eq!((db.name.as_str(), db.holders.len(), db.waiters.len()), ("db", 1, 2));
        assert_eq!(db.holders[0].peer, a.to_string());
        assert_eq!(db.waiters.iter().map(|w| w.position).collect::<Vec<_>>(), [Some(2), Some(3)], "best placed first");
        let jobs = &s.locks[1];
        assert!(jobs.holders.is_empty() && jobs.waiters.len() == 2);
        s.names.insert(a.to_string(), "db-1".into());
        let text = s.render();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("LOCK") && lines[0].ends_with("WAITERS"), "{text}");
        assert!(lines[1].starts_with("db  ") && lines[1].contains(&format!("{a} (db-1)")), "{text}");
        assert!(lines[1].contains(" 101 ") && lines[1].contains("900 ms") && lines[1].ends_with(" 2"), "{text}");
        assert!(lines[2].starts_with("jobs") && lines[2].ends_with(" 2"), "{text}");
        assert!(text.contains("3 of 4 peers answered"), "{text}");
        assert!(text.contains(&format!("no answer from {c}")), "{text}");
        assert!(text.contains(&format!("7 more through {b} not listed")), "{text}");
        assert!(s.peers().contains(&d.to_string()) && s.peers().contains(&c.to_string()));
    }

    #[test]
    fn nothing_held_says_so() {
        let s = gather(vec![(PeerId::random(), Some((Vec::new(), 0)))]);
        assert_eq!(s.render(), "no locks held or waited for\n1 of 1 peers answered\n");
    }
}
