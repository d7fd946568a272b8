//! Following a lock ([`crate::NodeHandle::watch`], `sigma watch`, `GET /v1/watch/{name}`)
//! and its leader ([`crate::NodeHandle::observe`], `sigma observe`).
//!
//! A watch inspects the lock every interval, as `sigma inspect` does (each replica's
//! host for its state, then the holder for its token and value), and delivers a
//! [`LockState`] when what it sees changed: whether the lock is held, by whom, under
//! which token, with which value (version), and how many wait. Nothing is pushed by the
//! replicas; a watcher costs the swarm one inspection per interval (n + 1 questions).
//!
//! What a watcher is promised (the ordering is this module's; what it sees is what the
//! inspections saw):
//! - a state that names a holder has its fencing token (told by the holder itself) and a
//!   (token, value version) at least that of every holder named before: holders come in
//!   token order, none comes back once a later one was named, and a value change comes
//!   once;
//! - `unknown` states may come between two states of one holder: the replicas that
//!   answered could not tell (too few answered, hosts that took replicas over recently,
//!   or the holder itself did not), or the watching node does not serve (a minority
//!   side of a partition, joining), as during a partition or while the holder's peer is
//!   unreachable;
//! - a change is seen within one interval plus one inspection, which waits at most
//!   [`QUESTION_DEADLINE`] (1 s) for the hosts and then for the holder (a few ms on a
//!   healthy swarm); a holder that held for less than that may be missed;
//! - the takeover delay shows as it is: a lock whose replicas hold their grants back is
//!   `unknown` (they know nothing of earlier votes) with its waiters counted, until a
//!   holder wins.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use crate::error::LockError;
use crate::inspect::{HolderView, Inspection};

/// How often a watch inspects its lock unless told otherwise.
pub const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_millis(500);
/// The shortest interval a watch takes.
pub const MIN_WATCH_INTERVAL: Duration = Duration::from_millis(100);
/// The longest interval a watch takes.
pub const MAX_WATCH_INTERVAL: Duration = Duration::from_secs(60);
/// How long a watch's inspection waits for each answer: a replica host or a holder
/// silent by then counts as no answer (`unknown` if it could matter), so that a dead
/// host does not hold a watcher up for the request timeout (5 s).
pub const QUESTION_DEADLINE: Duration = Duration::from_secs(1);
/// Most watches (and observations) open at once on one node: each costs the swarm an
/// inspection per interval.
pub const MAX_WATCHES: usize = 256;

/// Whether the lock is held, as far as the replicas that answered can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Held {
    /// An acquisition owns m replicas, and its holder told its token.
    Held,
    /// No acquisition owns m replicas, and none could with the replicas that did not
    /// answer or hold their grants back (a host that took them over recently).
    Free,
    /// The answers cannot tell: too few replicas answered, or the holder did not.
    Unknown,
}

/// A lock as a watch delivers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LockState {
    /// Lock name.
    pub name: String,
    /// This state's number on its watch: 1, 2, 3, … (a gap never happens).
    pub seq: u64,
    /// Held, free or unknown.
    pub state: Held,
    /// The holder (`held`), or the acquisition owning m replicas whose peer did not
    /// answer (`unknown`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<HolderView>,
    /// Acquisitions waiting (queued at some replica, the holder not counted).
    pub waiters: u32,
    /// Replica hosts that answered, of n.
    pub answered: usize,
    /// Replicas.
    pub n: usize,
}

/// What makes two states the same change: the holder's fields that move on their own
/// (lease left, validity) do not count.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Key {
    state: Held,
    holder: Option<(String, u64)>,
    token: Option<u64>,
    value_version: u32,
    waiters: u32,
}

/// The ordering of a watch: which inspections become deliveries.
#[derive(Debug, Default)]
pub(crate) struct Follow {
    /// The largest (token, value version) named so far.
    max: Option<(u64, u32)>,
    last: Option<Key>,
    seq: u64,
}

impl Follow {
    /// The state to deliver for `inspection`, if it is a change; `tells`: the watching
    /// node serves (else whatever it saw is `unknown`).
    pub(crate) fn next(&mut self, inspection: Inspection, tells: bool) -> Option<LockState> {
        let state = if tells { classify(&inspection) } else { Held::Unknown };
        let holder = if tells { inspection.holder } else { None };
        if state == Held::Held {
            let h = holder.as_ref()?;
            let seen = (h.token?, h.value_version);
            if self.max.is_some_and(|max| seen < max) {
                return None; // an earlier holder (or value), seen late: never goes back
            }
            self.max = Some(seen);
        }
        let waiters = u32::try_from(inspection.waiters.len()).unwrap_or(u32::MAX);
        let key = Key {
            state,
            holder: holder.as_ref().map(|h| (h.acquisition.peer.clone(), h.acquisition.counter)),
            token: holder.as_ref().and_then(|h| h.token),
            value_version: holder.as_ref().map_or(0, |h| h.value_version),
            waiters,
        };
        if self.last.as_ref() == Some(&key) {
            return None;
        }
        self.last = Some(key);
        self.seq += 1;
        Some(LockState {
            name: inspection.name,
            seq: self.seq,
            state,
            holder,
            waiters,
            answered: inspection.answered,
            n: inspection.n,
        })
    }
}

/// Held, free or unknown (see [`Held`]).
fn classify(i: &Inspection) -> Held {
    if let Some(h) = &i.holder {
        return if h.token.is_some() { Held::Held } else { Held::Unknown };
    }
    // A replica that did not answer, or whose host took it over so recently that it
    // holds its grants back (the takeover delay: it knows nothing of the votes its
    // previous host gave), cannot tell.
    let unanswered = i.replicas.iter().filter(|r| r.answer != "ok" || r.held_back_ms > 0).count();
    let mut votes: std::collections::HashMap<(&str, u64), usize> = std::collections::HashMap::new();
    for owner in i.replicas.iter().filter_map(|r| r.owner.as_ref()) {
        *votes.entry((owner.peer.as_str(), owner.counter)).or_default() += 1;
    }
    let best = votes.values().copied().max().unwrap_or(0);
    if i.answered == 0 || best + unanswered >= i.m {
        Held::Unknown
    } else {
        Held::Free
    }
}

/// A lock followed ([`crate::NodeHandle::watch`]): a [`Stream`] of its states, each a
/// change. Ends when the node stops (after an `Err(LockError::NodeStopped)`); dropping
/// it stops the inspections.
pub struct Watch {
    rx: mpsc::Receiver<Result<LockState, LockError>>,
    _permit: Arc<OwnedSemaphorePermit>,
}

impl Watch {
    pub(crate) fn new(rx: mpsc::Receiver<Result<LockState, LockError>>, permit: OwnedSemaphorePermit) -> Self {
        Watch { rx, _permit: Arc::new(permit) }
    }

    /// The next state (a change), or `None` once the watch has ended.
    pub async fn next(&mut self) -> Option<Result<LockState, LockError>> {
        self.rx.recv().await
    }
}

impl Stream for Watch {
    type Item = Result<LockState, LockError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watch")
    }
}

/// A lock's leaders followed ([`crate::NodeHandle::observe`]): each holder, and each
/// new value of a holder, once and in token order.
#[derive(Debug)]
pub struct Observe {
    watch: Watch,
    last: Option<(u64, u32)>,
}

impl Observe {
    pub(crate) fn new(watch: Watch) -> Self {
        Observe { watch, last: None }
    }

    /// The next leader (or the leader's next value), or `None` once the node stopped.
    pub async fn next(&mut self) -> Option<Result<HolderView, LockError>> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }
}

impl Stream for Observe {
    type Item = Result<HolderView, LockError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match Pin::new(&mut self.watch).poll_next(cx) {
                Poll::Ready(Some(Ok(LockState { state: Held::Held, holder: Some(h), .. }))) => {
                    let seen = (h.token.unwrap_or(0), h.value_version);
                    if self.last != Some(seen) {
                        self.last = Some(seen);
                        return Poll::Ready(Some(Ok(h)));
                    }
                }
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::{AcquisitionRef, ReplicaRow};

    fn row(index: u16, owner: Option<(&str, u64)>, answered: bool) -> ReplicaRow {
        ReplicaRow {
            index,
            host: "h".into(),
            answer: if answered { "ok" } else { "no_answer" }.into(),
            refused: None,
            owner: owner.map(|(p, c)| AcquisitionRef { peer: p.into(), counter: c }),
            stamp: 0,
            lease_left_ms: 100,
            queue: vec![],
            queue_len: 0,
            held_back_ms: 0,
        }
    }

    fn holder(peer: &str, counter: u64, token: Option<u64>, version: u32) -> HolderView {
        HolderView {
            acquisition: AcquisitionRef { peer: peer.into(), counter },
            replicas: 2,
            token,
            valid_for_ms: token.map(|_| 900),
            lease_left_ms: 900,
            value: (version > 0).then(|| format!("v{version}")),
            value_base64: None,
            value_version: version,
        }
    }

    /// n = 3, m = 2: `owners` by replica (`None` owner, or no answer with `false`).
    fn inspection(owners: &[(Option<(&str, u64)>, bool)], holder: Option<HolderView>) -> Inspection {
        let replicas: Vec<ReplicaRow> =
            owners.iter().enumerate().map(|(i, (o, answered))| row(i as u16, *o, *answered)).collect();
        Inspection {
            name: "x".into(),
            n: 3,
            m: 2,
            answered: owners.iter().filter(|(_, a)| *a).count(),
            holder,
            waiters: vec![],
            replicas,
            names: Default::default(),
        }
    }

    #[test]
    fn free_only_when_no_acquisition_could_own_m_replicas() {
        let free = inspection(&[(None, true), (None, true), (None, false)], None);
        assert_eq!(classify(&free), Held::Free);
        // A owns one, one replica silent: A may own two.
        let maybe = inspection(&[(Some(("a", 1)), true), (None, true), (None, false)], None);
        assert_eq!(classify(&maybe), Held::Unknown);
        let split = inspection(&[(Some(("a", 1)), true), (Some(("b", 1)), true), (None, true)], None);
        assert_eq!(classify(&split), Held::Free);
        // A replica taken over recently (held back) knows nothing of earlier votes.
        let mut taken_over = inspection(&[(Some(("a", 1)), true), (None, true), (None, true)], None);
        taken_over.replicas[1].held_back_ms = 500;
        assert_eq!(classify(&taken_over), Held::Unknown);
        let silent = inspection(&[(None, false), (None, false), (None, false)], None);
        assert_eq!(classify(&silent), Held::Unknown);
        let owned = [(Some(("a", 1)), true), (Some(("a", 1)), true), (None, true)];
        assert_eq!(classify(&inspection(&owned, Some(holder("a", 1, Some(7), 0)))), Held::Held);
        assert_eq!(classify(&inspection(&owned, Some(holder("a", 1, None, 0)))), Held::Unknown);
    }

    impl Follow {
        fn next_told(&mut self, i: Inspection) -> Option<LockState> {
            self.next(i, true)
        }
    }

    #[test]
    fn a_watcher_that_does_not_serve_cannot_tell() {
        let owned = [(Some(("a", 1)), true), (Some(("a", 1)), true), (None, true)];
        let mut f = Follow::default();
        assert_eq!(
            f.next(inspection(&owned, Some(holder("a", 1, Some(7), 0))), false).map(|s| s.state),
            Some(Held::Unknown)
        );
        assert_eq!(f.next(inspection(&[(None, true), (None, true), (None, true)], None), false).map(|s| s.state), None);
    }

    #[test]
    fn holders_come_once_and_in_token_order() {
        let owned_a = [(Some(("a", 1)), true), (Some(("a", 1)), true), (None, true)];
        let owned_b = [(Some(("b", 4)), true), (Some(("b", 4)), true), (None, true)];
        let mut f = Follow::default();
        let s = f.next_told(inspection(&owned_a, Some(holder("a", 1, Some(10), 1)))).expect("first state");
        assert_eq!((s.seq, s.state, s.holder.and_then(|h| h.token)), (1, Held::Held, Some(10)));
        // The same again (lease moved on): no change.
        let mut again = holder("a", 1, Some(10), 1);
        again.lease_left_ms = 5;
        assert_eq!(f.next_told(inspection(&owned_a, Some(again))), None);
        // A new value of the same holder is a change; an older one afterwards is not.
        assert_eq!(f.next_told(inspection(&owned_a, Some(holder("a", 1, Some(10), 2)))).map(|s| s.seq), Some(2));
        assert_eq!(f.next_told(inspection(&owned_a, Some(holder("a", 1, Some(10), 1)))), None);
        // Unknown between two states of one holder.
        let unknown = f.next_told(inspection(&owned_a, Some(holder("a", 1, None, 0)))).expect("unknown");
        assert_eq!(unknown.state, Held::Unknown);
        assert_eq!(f.next_told(inspection(&owned_a, Some(holder("a", 1, Some(10), 2)))).map(|s| s.seq), Some(4));
        // B takes over; a late view of A is dropped, never delivered again.
        let b = f.next_told(inspection(&owned_b, Some(holder("b", 4, Some(11), 0)))).expect("b");
        assert_eq!((b.seq, b.holder.map(|h| h.acquisition.peer)), (5, Some("b".to_owned())));
        assert_eq!(f.next_told(inspection(&owned_a, Some(holder("a", 1, Some(10), 2)))), None);
        let free = f.next_told(inspection(&[(None, true), (None, true), (None, true)], None)).expect("free");
        assert_eq!((free.seq, free.state), (6, Held::Free));
        assert_eq!(f.next_told(inspection(&owned_a, Some(holder("a", 1, Some(10), 2)))), None, "A never comes back");
    }
}
