//! [`Acquiring`]: this peer's acquisitions as plain state. Each acquisition (a sans-IO
//! [`Client`] with its lock's replica keys), the deadline index of their timers, the
//! index by timestamp, the finished ones remembered a while (a late grant to one is
//! handed back), the live acquisitions per lock, and the host of each replica as last
//! known for those locks (kept for an idle TTL after the last one ends). Its methods take
//! `now`; what an acquisition sends and reports is drained by the behaviour
//! (`client.rs`).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use libp2p::PeerId;

use super::config::MAX_IDLE_HOSTS;
use super::key::ReplicaKey;
use super::types::AcquisitionId;
use super::util::{shrink_if_sparse, DeadlineIndex};
use crate::proto::{self, Client, Time, Timestamp};

/// One local acquisition.
pub(super) struct Acquisition {
    pub(super) resource: String,
    pub(super) n: u16,
    /// Its replicas' keys, by index (hashed once, at the start).
    pub(super) keys: Vec<ReplicaKey>,
    pub(super) client: Client<PeerId>,
    /// Started while this peer was joining: nothing sent yet; started afresh (same
    /// timestamp) once it is ready.
    pub(super) deferred: Option<proto::Config>,
    /// D was the default (not named by the caller): lowered to 1 if the lock's keys come
    /// to fall on one alive peer (`Behaviour::relax_diversity`).
    pub(super) default_d: bool,
    /// The value attached to the acquisition (at most `wire::MAX_VALUE_LEN` bytes), and
    /// how many times it was set; told to whoever asks its holder (`Request::Holding`).
    pub(super) value: Option<(Vec<u8>, u32)>,
}

/// This peer's acquisitions and what it remembers for them (see the module's doc).
pub(super) struct Acquiring {
    acquisitions: HashMap<AcquisitionId, Acquisition>,
    /// The acquisitions' timers: an event costs O(log n), not a walk over all of them.
    due: DeadlineIndex<AcquisitionId>,
    by_ts: HashMap<Timestamp<PeerId>, AcquisitionId>,
    /// Recently finished acquisitions, their lock name and replica count: a late grant
    /// to one of them is handed back with a RELEASE (the last `finished_memory`).
    finished: HashMap<Timestamp<PeerId>, (String, u16)>,
    finished_order: VecDeque<Timestamp<PeerId>>,
    finished_memory: usize,
    /// Host of each replica as last known (slot `index` of the lock's entry), for locks
    /// with a live local acquisition, and for `idle_ttl` after (at most
    /// [`MAX_IDLE_HOSTS`] idle slots). Per lock: an acquisition that starts or ends
    /// files or takes out one entry, not n.
    hosts: HashMap<String, Vec<Option<PeerId>>>,
    /// Expiry of the cached hosts of locks without a live local acquisition.
    idle_hosts: DeadlineIndex<String>,
    /// Slots of the locks filed in `idle_hosts`.
    idle_slots: usize,
    idle_ttl: Duration,
    /// Live local acquisitions per lock name.
    live_locks: HashMap<String, usize>,
    /// Acquisitions started while joining (their start is deferred) since last ready.
    deferred: usize,
}

impl Acquiring {
    pub(super) fn new(finished_memory: usize, idle_ttl: Duration) -> Self {
        Acquiring {
            acquisitions: HashMap::new(),
            due: DeadlineIndex::default(),
            by_ts: HashMap::new(),
            finished: HashMap::new(),
            finished_order: VecDeque::new(),
            finished_memory,
            hosts: HashMap::new(),
            idle_hosts: DeadlineIndex::default(),
            idle_slots: 0,
            idle_ttl,
            live_locks: HashMap::new(),
            deferred: 0,
        }
    }

    /// Files a new acquisition under `id`; its lock's cached hosts, if idle, are in use
    /// again.
    pub(super) fn start(&mut self, id: AcquisitionId, a: Acquisition) {
        self.deferred += usize::from(a.deferred.is_some());
        self.by_ts.insert(*a.client.ts(), id);
        if !self.live_locks.contains_key(&a.resource) {
            self.hosts_in_use(&a.resource);
        }
        *self.live_locks.entry(a.resource.clone()).or_default() += 1;
        self.acquisitions.insert(id, a);
    }

    pub(super) fn get(&self, id: &AcquisitionId) -> Option<&Acquisition> {
        self.acquisitions.get(id)
    }

    pub(super) fn get_mut(&mut self, id: &AcquisitionId) -> Option<&mut Acquisition> {
        self.acquisitions.get_mut(id)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&AcquisitionId, &Acquisition)> {
        self.acquisitions.iter()
    }

    /// Acquisitions in progress or held.
    pub(super) fn len(&self) -> usize {
        self.acquisitions.len()
    }

    /// The live acquisition stamped `ts`.
    pub(super) fn id_of(&self, ts: &Timestamp<PeerId>) -> Option<AcquisitionId> {
        self.by_ts.get(ts).copied()
    }

    /// The replica count of the finished acquisition stamped `ts`, if remembered.
    pub(super) fn finished_n(&self, ts: &Timestamp<PeerId>) -> Option<u16> {
        self.finished.get(ts).map(|(_, n)| *n)
    }

    /// Finished acquisitions remembered.
    pub(super) fn finished_len(&self) -> usize {
        self.finished.len()
    }

    /// A released acquisition goes: remembered as finished, its lock's cached hosts
    /// kept for the idle TTL if it was the lock's last.
    pub(super) fn finish(&mut self, id: AcquisitionId, now: Time) {
        let Some(a) = self.acquisitions.remove(&id) else { return };
        let ts = *a.client.ts();
        let (resource, n) = (a.resource, a.n);
        // The lock's host cache expires a while after its last local
        // acquisition: the next one of a busy lock needs no redirects.
        let last = match self.live_locks.get_mut(&resource) {
            Some(c) if *c > 1 => {
                *c -= 1;
                false
            }
            _ => true,
        };
        if last {
            self.live_locks.remove(&resource);
            self.hosts_idle(&resource, now);
        }
        self.by_ts.remove(&ts);
        shrink_if_sparse(&mut self.acquisitions);
        shrink_if_sparse(&mut self.by_ts);
        shrink_if_sparse(&mut self.live_locks);
        shrink_if_sparse(&mut self.hosts);
        self.finished.insert(ts, (resource, n));
        self.finished_order.push_back(ts);
        while self.finished_order.len() > self.finished_memory {
            if let Some(old) = self.finished_order.pop_front() {
                self.finished.remove(&old);
            }
        }
    }

    /// Files an acquisition under its next deadline (none while deferred or gone).
    pub(super) fn reindex(&mut self, id: AcquisitionId) {
        let at = self.acquisitions.get(&id).filter(|a| a.deferred.is_none()).and_then(|a| a.client.poll_timeout());
        self.due.set(&id, at);
    }

    /// The acquisitions due at `now` (collected: handling one may re-file it).
    pub(super) fn due(&self, now: Time) -> Vec<AcquisitionId> {
        self.due.due(now)
    }

    /// The earliest deadline: an acquisition's timer, or an idle lock's cached hosts.
    pub(super) fn next_due(&self) -> Option<Time> {
        [self.due.first(), self.idle_hosts.first()].into_iter().flatten().min()
    }

    /// The acquisitions started while this peer was joining, once (the count starts
    /// over).
    pub(super) fn take_deferred(&mut self) -> Vec<AcquisitionId> {
        if self.deferred == 0 {
            return Vec::new();
        }
        self.deferred = 0;
        self.acquisitions.iter().filter(|(_, a)| a.deferred.is_some()).map(|(id, _)| *id).collect()
    }

    /// The cached host of a replica.
    pub(super) fn cached_host(&self, resource: &str, index: u16) -> Option<PeerId> {
        self.hosts.get(resource)?.get(usize::from(index)).copied().flatten()
    }

    /// Cached hosts, all locks together.
    pub(super) fn hosts_len(&self) -> usize {
        self.hosts.values().map(|slots| slots.iter().flatten().count()).sum()
    }

    /// Caches the host of a replica of a lock with a live local acquisition (a slot per
    /// replica index this peer sent to: at most n per such lock); other locks' hosts are
    /// computed per message.
    pub(super) fn cache_host(&mut self, key: &ReplicaKey, peer: PeerId) {
        let (resource, index) = (key.resource(), key.index());
        if !self.live_locks.contains_key(resource) {
            return;
        }
        if !self.hosts.contains_key(resource) {
            self.hosts.insert(resource.to_owned(), Vec::new());
        }
        if let Some(slots) = self.hosts.get_mut(resource) {
            let i = usize::from(index);
            if slots.len() <= i {
                slots.resize(i + 1, None);
            }
            slots[i] = Some(peer);
        }
    }

    /// Forgets the cached host of one replica (it could not be reached).
    pub(super) fn forget_host(&mut self, key: &ReplicaKey) {
        let slots = self.hosts.get_mut(key.resource());
        if let Some(slot) = slots.and_then(|slots| slots.get_mut(usize::from(key.index()))) {
            *slot = None;
        }
    }

    /// Drops the cached hosts of the idle locks whose TTL ran out at `now`.
    pub(super) fn expire_idle_hosts(&mut self, now: Time) {
        for lock in self.idle_hosts.due(now) {
            self.forget_idle_hosts(lock);
        }
    }

    /// A lock's last local acquisition ended: its cached hosts stay for the idle TTL,
    /// the oldest idle lock's dropped while the idle slots are over [`MAX_IDLE_HOSTS`].
    fn hosts_idle(&mut self, resource: &str, now: Time) {
        if let Some(slots) = self.hosts.get(resource) {
            self.idle_slots += slots.len();
            let until = now + self.idle_ttl;
            self.idle_hosts.set(&resource.to_owned(), Some(until));
        }
        while self.idle_slots > MAX_IDLE_HOSTS {
            let Some(lock) = self.idle_hosts.first_key() else { break };
            self.forget_idle_hosts(lock);
        }
    }

    /// A lock without a live local acquisition gets one: its cached hosts, if idle, are
    /// in use again.
    fn hosts_in_use(&mut self, resource: &str) {
        if self.idle_hosts.is_filed(resource) {
            self.idle_hosts.set(&resource.to_owned(), None);
            self.idle_slots = self.idle_slots.saturating_sub(self.hosts.get(resource).map_or(0, Vec::len));
        }
    }

    /// Drops an idle lock's cached hosts.
    fn forget_idle_hosts(&mut self, lock: String) {
        self.idle_hosts.set(&lock, None);
        let slots = self.hosts.remove(&lock).map_or(0, |slots| slots.len());
        self.idle_slots = self.idle_slots.saturating_sub(slots);
        shrink_if_sparse(&mut self.hosts);
    }
}
