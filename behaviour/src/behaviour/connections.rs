//! [`Connections`]: the peers this one has open connections to, as the behaviour sees
//! them. How many connections each has (a peer with one is live for the ownership
//! checks), the last liveness-ping round trip to each (the transit time added to the
//! ages in its gossip), when each was last used by sigma, and the connections to close:
//! those whose ping failed, and the least recently used peers trimmed past the
//! watermarks (docs/design/connections.md). Plain state: its methods take `now`; the
//! behaviour's poll hands the closes to the swarm.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use libp2p::swarm::ConnectionId;
use libp2p::PeerId;

use super::config::TRIM_GRACE;
use crate::proto::Time;

/// Open connections and the ones to close (see the module's doc).
#[derive(Debug, Default)]
pub(super) struct Connections {
    /// Peers with at least one open connection: the "live" peers of ownership checks.
    connected: HashMap<PeerId, usize>,
    /// The last liveness-ping round trip to each connected peer: the transit time added
    /// to the ages of the heartbeats its gossip requests carry.
    ping_rtt: HashMap<PeerId, Duration>,
    /// When each connected peer was last used by sigma (connection trimming).
    last_used: HashMap<PeerId, Time>,
    /// Peers whose connections are to be closed (trimmed), and those asked to close
    /// and not yet disconnected (a subset of the connected peers).
    to_trim: VecDeque<PeerId>,
    trimming: HashSet<PeerId>,
    /// Past the high watermark: trimming goes on until the low one is reached, even
    /// when a pass found fewer idle peers than it needed.
    trim_active: bool,
    /// Connections whose liveness ping failed, to close.
    to_close: VecDeque<(PeerId, ConnectionId)>,
}

impl Connections {
    /// A connection to `peer` was established at `now`.
    pub(super) fn established(&mut self, peer: PeerId, now: Time) {
        *self.connected.entry(peer).or_default() += 1;
        self.last_used.insert(peer, now);
    }

    /// A connection to `peer` closed; answers whether it was its last (`peer` is then
    /// forgotten here).
    pub(super) fn closed(&mut self, peer: &PeerId) -> bool {
        let Some(c) = self.connected.get_mut(peer) else { return false };
        *c = c.saturating_sub(1);
        if *c > 0 {
            return false;
        }
        self.connected.remove(peer);
        self.ping_rtt.remove(peer);
        self.last_used.remove(peer);
        self.trimming.remove(peer);
        true
    }

    pub(super) fn is_connected(&self, peer: &PeerId) -> bool {
        self.connected.contains_key(peer)
    }

    /// Peers with an open connection.
    pub(super) fn peers(&self) -> impl Iterator<Item = &PeerId> {
        self.connected.keys()
    }

    /// `peer`'s connection was just used (not trimmed for a while).
    pub(super) fn used(&mut self, peer: PeerId, now: Time) {
        if let Some(t) = self.last_used.get_mut(&peer) {
            *t = now;
        }
    }

    /// A liveness ping to a connected `peer` came back after `rtt`.
    pub(super) fn ping_rtt(&mut self, peer: PeerId, rtt: Duration) {
        if self.connected.contains_key(&peer) {
            self.ping_rtt.insert(peer, rtt);
        }
    }

    /// The last ping round trip to `peer`, if any.
    pub(super) fn rtt(&self, peer: &PeerId) -> Option<Duration> {
        self.ping_rtt.get(peer).copied()
    }

    /// A liveness ping on `connection` failed: it is to be closed.
    pub(super) fn ping_failed(&mut self, peer: PeerId, connection: ConnectionId) {
        self.to_close.push_back((peer, connection));
    }

    /// Past the high watermark, the least recently used peers not used within
    /// [`TRIM_GRACE`] are queued for disconnection down to the low one (looked at on
    /// every event: a few dozen connections cost little to sort, and a dial refused at
    /// the limit costs a retry). Answers how many were queued now, `None` while no
    /// trimming is due.
    pub(super) fn trim(&mut self, now: Time, watermarks: Option<(usize, usize)>) -> Option<usize> {
        let (high, low) = watermarks?;
        let open = self.connected.len().saturating_sub(self.trimming.len());
        self.trim_active = (self.trim_active || open > high) && open > low;
        if !self.trim_active {
            return None;
        }
        let mut idle: Vec<(Time, PeerId)> = self
            .last_used
            .iter()
            .filter(|(p, t)| now.saturating_sub(**t) >= TRIM_GRACE && !self.trimming.contains(*p))
            .map(|(p, t)| (*t, *p))
            .collect();
        idle.sort_unstable();
        let excess = self.connected.len().saturating_sub(low + self.trimming.len());
        let mut queued = 0;
        for (_, peer) in idle.into_iter().take(excess) {
            queued += 1;
            self.trimming.insert(peer);
            self.to_trim.push_back(peer);
        }
        Some(queued)
    }

    /// Whether peers wait to be disconnected.
    pub(super) fn trims_waiting(&self) -> bool {
        !self.to_trim.is_empty()
    }

    /// The next connection to close (a failed ping).
    pub(super) fn pop_close(&mut self) -> Option<(PeerId, ConnectionId)> {
        self.to_close.pop_front()
    }

    /// The next peer to disconnect (trimmed).
    pub(super) fn pop_trim(&mut self) -> Option<PeerId> {
        self.to_trim.pop_front()
    }
}
