//! A lock seen from the whole swarm (`sigma inspect`, `GET /v1/inspect/{name}`) and an
//! operator's break-lock (`sigma release NAME --token T`, `POST /v1/revoke/{name}`).
//!
//! An inspection asks the host of each of the lock's n replicas for its state (owner,
//! lease left, queue), then asks the holder, if m replicas agree on one, about its
//! acquisition (fencing token, validity). Nothing changes anywhere. A revoke goes to the
//! peer that holds the lock, which gives it up as if its holder had released it; that
//! peer decides whether the sender may (`sigma run --admin-peer`).

use serde::{Deserialize, Serialize};
use sigma_behaviour::wire::{HoldingState, ReplicaState};
use sigma_behaviour::ReplicaAnswer;

/// One acquisition (a client peer and its Lamport counter).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AcquisitionRef {
    /// The peer that took it.
    pub peer: String,
    /// Its Lamport counter.
    pub counter: u64,
}

/// What the host of one replica answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReplicaRow {
    /// Replica index (0-based; the DHT name is `NAME:index+1`).
    pub index: u16,
    /// The host asked (the last one, after redirects).
    pub host: String,
    /// `ok`, `refused` or `no_answer`.
    pub answer: String,
    /// Why it refused (a rejection code, e.g. `not_serving`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// The replica's owner, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<AcquisitionRef>,
    /// Its grant stamp (0 without owner).
    pub stamp: u64,
    /// How long the owner's lease still runs at this replica (ms).
    pub lease_left_ms: u64,
    /// Waiters, the first few in service order.
    pub queue: Vec<AcquisitionRef>,
    /// Waiters in all.
    pub queue_len: u32,
    /// How long a takeover delay still holds this replica's grants back (ms).
    pub held_back_ms: u64,
}

/// The holder of a lock: the acquisition that owns at least m replicas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HolderView {
    /// The acquisition.
    pub acquisition: AcquisitionRef,
    /// Replicas it owns.
    pub replicas: usize,
    /// Its own answer: whether it holds, its fencing token, how long exclusion is still
    /// guaranteed (`None`: it did not answer, or has finished meanwhile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// See [`HoldingState::valid_for_ms`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_for_ms: Option<u64>,
    /// The m-th longest lease left at its replicas (ms): if it stopped renewing, the
    /// lock would be free for another after about this long.
    pub lease_left_ms: u64,
    /// The value the holder attached, when it is UTF-8 text (told by the holder itself,
    /// with the token; see [`HolderView::value_bytes`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The value, in standard base64, when it is not UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_base64: Option<String>,
    /// How many times the holder set its value: 1 for a value given at acquire, one more
    /// at each replacement; 0 without a value (or without the holder's answer).
    #[serde(default)]
    pub value_version: u32,
}

impl HolderView {
    /// The value the holder attached, as bytes.
    pub fn value_bytes(&self) -> Option<Vec<u8>> {
        crate::value::from_fields(self.value.as_deref(), self.value_base64.as_deref()).ok().flatten()
    }
}

/// A waiter with its place in line: the m-th best position among the replicas that
/// queue it (1 = next), which is the position at which it would win. The holder, queued
/// at replicas it does not own, is not listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WaiterRow {
    /// The acquisition.
    pub acquisition: AcquisitionRef,
    /// Its position (1 = next in line); `None` if fewer than m replicas list it.
    pub position: Option<u32>,
    /// Replicas that queue it.
    pub replicas: usize,
}

/// Answer of `GET /v1/inspect/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Inspection {
    /// Lock name.
    pub name: String,
    /// Replicas, and votes needed to win.
    pub n: usize,
    /// Votes needed to win.
    pub m: usize,
    /// Replicas whose host answered.
    pub answered: usize,
    /// The holder, if m replicas agree on one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<HolderView>,
    /// Waiters, best placed first.
    pub waiters: Vec<WaiterRow>,
    /// Each replica.
    pub replicas: Vec<ReplicaRow>,
    /// The names the peers listed here announced (by peer id), where known.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub names: std::collections::BTreeMap<String, String>,
}

fn acq(ts: &sigma_behaviour::proto::Timestamp<libp2p::PeerId>) -> AcquisitionRef {
    AcquisitionRef { peer: ts.client.to_string(), counter: ts.counter }
}

fn row(index: usize, answer: &ReplicaAnswer) -> ReplicaRow {
    let index = u16::try_from(index).unwrap_or(u16::MAX);
    let empty = ReplicaState::default();
    let (host, kind, refused, state) = match answer {
        ReplicaAnswer::State { host, state } => (host, "ok", None, state),
        ReplicaAnswer::Refused { host, reason } => (host, "refused", Some(reason.as_str().to_owned()), &empty),
        ReplicaAnswer::NoAnswer { host } => (host, "no_answer", None, &empty),
    };
    ReplicaRow {
        index,
        host: host.to_string(),
        answer: kind.to_owned(),
        refused,
        owner: state.owner.as_ref().map(|(ts, _, _)| acq(ts)),
        stamp: state.owner.as_ref().map_or(0, |(_, stamp, _)| *stamp),
        lease_left_ms: state.owner.as_ref().map_or(0, |(_, _, left)| *left),
        queue: state.queue.iter().map(acq).collect(),
        queue_len: state.queue_len,
        held_back_ms: state.held_back_ms,
    }
}

/// The k-th largest of `values` (1-based), if there are that many.
fn kth_largest(mut values: Vec<u64>, k: usize) -> Option<u64> {
    values.sort_unstable_by(|a, b| b.cmp(a));
    k.checked_sub(1).and_then(|i| values.get(i).copied())
}

/// Puts the replicas' answers together: the holder (the owner of at least m replicas)
/// and the waiters with their positions. The holder's own answer is added by
/// [`Inspection::with_holding`].
pub fn gather(name: &str, m: usize, answers: &[ReplicaAnswer]) -> Inspection {
    let replicas: Vec<ReplicaRow> = answers.iter().enumerate().map(|(i, a)| row(i, a)).collect();
    let answered = replicas.iter().filter(|r| r.answer == "ok").count();
    let mut owned: std::collections::BTreeMap<&AcquisitionRef, Vec<u64>> = Default::default();
    let mut places: std::collections::BTreeMap<&AcquisitionRef, Vec<u64>> = Default::default();
    for r in &replicas {
        if let Some(o) = &r.owner {
            owned.entry(o).or_default().push(r.lease_left_ms);
        }
        for (i, w) in r.queue.iter().enumerate() {
            places.entry(w).or_default().push(i as u64 + 1);
        }
    }
    let holder =
        owned.iter().filter(|(_, leases)| leases.len() >= m).max_by_key(|(_, l)| l.len()).map(|(a, l)| HolderView {
            acquisition: (*a).clone(),
            replicas: l.len(),
            token: None,
            valid_for_ms: None,
            lease_left_ms: kth_largest(l.clone(), m).unwrap_or(0),
            value: None,
            value_base64: None,
            value_version: 0,
        });
    // The holder may still be queued at replicas it does not own (it holds m of n):
    // it is not a waiter.
    let mut waiters: Vec<WaiterRow> = places
        .into_iter()
        .filter(|(a, _)| holder.as_ref().is_none_or(|h| h.acquisition != **a))
        .map(|(a, ps)| {
            // The m-th best position: where it stands once m replicas can serve it.
            let mut ps = ps;
            ps.sort_unstable();
            let position = m.checked_sub(1).and_then(|i| ps.get(i)).map(|p| u32::try_from(*p).unwrap_or(u32::MAX));
            WaiterRow { acquisition: a.clone(), position, replicas: ps.len() }
        })
        .collect();
    waiters.sort_by_key(|w| (w.position.is_none(), w.position, std::cmp::Reverse(w.replicas)));
    Inspection {
        name: name.to_owned(),
        n: answers.len(),
        m,
        answered,
        holder,
        waiters,
        replicas,
        names: Default::default(),
    }
}

impl Inspection {
    /// Adds the holder's own answer about its acquisition.
    pub fn with_holding(mut self, holding: Option<&HoldingState>) -> Self {
        if let (Some(h), Some(s)) = (self.holder.as_mut(), holding) {
            if s.held && s.is_valid() {
                h.token = Some(s.token);
                h.valid_for_ms = Some(s.valid_for_ms);
                if let Some(v) = &s.value {
                    (h.value, h.value_base64) = crate::value::to_fields(v);
                    h.value_version = s.value_version;
                }
            }
        }
        self
    }

    /// The peers listed here: the holder, the waiters, the replicas' hosts and owners.
    pub fn peers(&self) -> Vec<String> {
        let mut peers: Vec<String> = self
            .holder
            .iter()
            .map(|h| h.acquisition.peer.clone())
            .chain(self.waiters.iter().map(|w| w.acquisition.peer.clone()))
            .chain(
                self.replicas
                    .iter()
                    .flat_map(|r| [Some(r.host.clone()), r.owner.as_ref().map(|o| o.peer.clone())])
                    .flatten(),
            )
            .collect();
        peers.sort_unstable();
        peers.dedup();
        peers
    }

    /// `peer`, with its name if it has one.
    fn who(&self, peer: &str) -> String {
        match self.names.get(peer) {
            Some(name) => format!("{peer} ({name})"),
            None => peer.to_owned(),
        }
    }

    /// A table for people, with a line per replica (`sigma inspect --replicas`).
    pub fn render(&self) -> String {
        self.render_with(true)
    }

    /// The same, the replicas summed up in one line unless `replicas`: what they
    /// answered (owned by the holder, by another acquisition, idle, refused and why,
    /// no answer) and whether any holds its grants back (`sigma inspect`).
    pub fn render_with(&self, replicas: bool) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "lock {}: {} of {} replica hosts answered (m = {})",
            self.name, self.answered, self.n, self.m
        );
        match &self.holder {
            Some(h) => {
                let _ = write!(
                    out,
                    "holder: {} #{} ({} replicas",
                    self.who(&h.acquisition.peer),
                    h.acquisition.counter,
                    h.replicas
                );
                match (h.token, h.valid_for_ms) {
                    (Some(t), Some(v)) => {
                        let _ = write!(out, ", token {t}, valid for {v} ms");
                    }
                    _ => out.push_str(", the holder did not answer"),
                }
                let _ = writeln!(out, ", free in ≤ {} ms without renewal)", h.lease_left_ms);
                match (&h.value, &h.value_base64) {
                    (Some(v), _) => {
                        let _ = writeln!(out, "value: {} (version {})", crate::value::quoted(v), h.value_version);
                    }
                    (None, Some(b)) => {
                        let _ = writeln!(out, "value (base64): {b} (version {})", h.value_version);
                    }
                    (None, None) => {}
                }
            }
            None => out.push_str("holder: none (no acquisition owns m replicas)\n"),
        }
        if self.waiters.is_empty() {
            out.push_str("waiters: none\n");
        } else {
            out.push_str("waiters:\n");
            for w in &self.waiters {
                let pos = w.position.map_or_else(|| "-".to_owned(), |p| p.to_string());
                let _ = writeln!(
                    out,
                    "  position {pos:>3}  {} #{}  (queued at {} replicas)",
                    self.who(&w.acquisition.peer),
                    w.acquisition.counter,
                    w.replicas
                );
            }
        }
        if !replicas {
            out.push_str(&self.replica_summary());
            return out;
        }
        out.push_str("replicas:\n");
        for r in &self.replicas {
            let what = match (r.answer.as_str(), &r.owner) {
                ("ok", Some(o)) => format!(
                    "owner {} #{} stamp {} lease {} ms, {} waiting",
                    o.peer, o.counter, r.stamp, r.lease_left_ms, r.queue_len
                ),
                ("ok", None) if r.queue_len > 0 => format!("no owner, {} waiting", r.queue_len),
                ("ok", None) => "idle".to_owned(),
                ("refused", _) => format!("refused: {}", r.refused.as_deref().unwrap_or("?")),
                _ => "no answer".to_owned(),
            };
            let held =
                if r.held_back_ms > 0 { format!(" (grants held back {} ms)", r.held_back_ms) } else { String::new() };
            let _ = writeln!(out, "  {:>2}  host {}  {what}{held}", r.index, self.who(&r.host));
        }
        out
    }
}

impl Inspection {
    /// One line: how many replicas answered what, and the longest hold of grants.
    fn replica_summary(&self) -> String {
        use std::collections::BTreeMap;
        let holder = self.holder.as_ref().map(|h| &h.acquisition);
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for r in &self.replicas {
            let kind = match (r.answer.as_str(), &r.owner) {
                ("ok", Some(o)) if Some(o) == holder => "owned by the holder".to_owned(),
                ("ok", Some(_)) => "owned by another acquisition".to_owned(),
                ("ok", None) if r.queue_len > 0 => "no owner, waiters queued".to_owned(),
                ("ok", None) => "idle".to_owned(),
                ("refused", _) => format!("refused ({})", r.refused.as_deref().unwrap_or("?")),
                _ => "no answer".to_owned(),
            };
            *kinds.entry(kind).or_default() += 1;
        }
        let parts: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let held: Vec<u64> = self.replicas.iter().map(|r| r.held_back_ms).filter(|ms| *ms > 0).collect();
        let held = match held.iter().max() {
            Some(max) => format!("; {} hold grants back (up to {max} ms more: the takeover delay)", held.len()),
            None => String::new(),
        };
        format!("replicas: {}{held} (--replicas: one line each)\n", parts.join(", "))
    }
}

/// The outcome of a revoke.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Revoked {
    /// Lock name.
    pub name: String,
    /// The fencing token revoked.
    pub token: u64,
    /// The peer that held it and gave it up.
    pub holder: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use libp2p::PeerId;
    use sigma_behaviour::proto::Timestamp;
    use sigma_behaviour::wire::Rejection;

    fn state(owner: Option<(Timestamp<PeerId>, u64)>, queue: Vec<Timestamp<PeerId>>) -> ReplicaState {
        ReplicaState {
            owner: owner.map(|(ts, lease)| (ts, 7, lease)),
            queue_len: u32::try_from(queue.len()).unwrap(),
            queue,
            held_back_ms: 0,
        }
    }

    #[test]
    fn the_holder_owns_m_replicas_and_waiters_are_placed_by_their_mth_best_position() {
        let host = PeerId::random();
        let (a, b, c) = (PeerId::random(), PeerId::random(), PeerId::random());
        let ta = Timestamp::new(1, a);
        let tb = Timestamp::new(2, b);
        let tc = Timestamp::new(3, c);
        // n = 5, m = 3: a owns 3 replicas (leases 100, 300, 200) and waits at the 4th,
        // which b owns; the 5th host refuses. At a's replicas b waits first, first,
        // second; c second, second, first.
        let answers = vec![
            ReplicaAnswer::State { host, state: state(Some((ta, 100)), vec![tb, tc]) },
            ReplicaAnswer::State { host, state: state(Some((ta, 300)), vec![tb, tc]) },
            ReplicaAnswer::State { host, state: state(Some((ta, 200)), vec![tc, tb]) },
            ReplicaAnswer::State { host, state: state(Some((tb, 50)), vec![ta]) },
            ReplicaAnswer::Refused { host, reason: Rejection::NotServing },
        ];
        let i = gather("x", 3, &answers);
        assert_eq!(i.answered, 4);
        let h = i.holder.clone().expect("a holder");
        assert_eq!(h.acquisition, AcquisitionRef { peer: a.to_string(), counter: 1 });
        assert_eq!(h.replicas, 3);
        assert_eq!(h.lease_left_ms, 100, "the 3rd longest lease");
        // b stands 1st, 1st, 2nd: it wins once 3 replicas serve it, at the 2nd turn; c
        // too. The holder, queued where it does not own, is no waiter.
        assert_eq!(i.waiters.len(), 2);
        assert!(i.waiters.iter().all(|w| w.position == Some(2) && w.replicas == 3), "{:?}", i.waiters);
        assert_eq!(i.replicas[4].refused.as_deref(), Some("not_serving"));
        let i = i.with_holding(Some(&HoldingState {
            held: true,
            token: 42,
            valid_for_ms: 900,
            votes: 3,
            value: Some(b"10.0.0.7:5432".to_vec().into()),
            value_version: 2,
        }));
        assert_eq!(i.holder.as_ref().and_then(|h| h.token), Some(42));
        assert!(i.render().contains("token 42"), "{}", i.render());
        assert!(i.render().contains("value: \"10.0.0.7:5432\" (version 2)"), "{}", i.render());
        assert_eq!(i.holder.as_ref().and_then(HolderView::value_bytes).as_deref(), Some(&b"10.0.0.7:5432"[..]));
        let mut i = i;
        i.names.insert(a.to_string(), "db-1".to_owned());
        assert!(i.render_with(false).contains(&format!("holder: {a} (db-1) #1")), "{}", i.render_with(false));
        assert!(i.peers().contains(&host.to_string()) && i.peers().contains(&c.to_string()));
    }

    #[test]
    fn no_holder_without_m_agreeing_replicas() {
        let host = PeerId::random();
        let ta = Timestamp::new(1, PeerId::random());
        let tb = Timestamp::new(2, PeerId::random());
        let answers = vec![
            ReplicaAnswer::State { host, state: state(Some((ta, 100)), vec![]) },
            ReplicaAnswer::State { host, state: state(Some((tb, 100)), vec![]) },
            ReplicaAnswer::NoAnswer { host },
        ];
        let i = gather("x", 2, &answers);
        assert_eq!(i.holder, None);
        assert!(i.waiters.is_empty());
        assert!(i.render().contains("holder: none"));
        let short = i.render_with(false);
        assert!(short.contains("replicas: 1 no answer, 2 owned by another acquisition"), "{short}");
        assert_eq!(short.lines().count(), 4, "{short}");
    }
}
