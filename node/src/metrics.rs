//! Prometheus metrics of a sigma daemon.
//!
//! One [`Registry`] holds everything `/metrics` serves: libp2p's own metrics
//! (`libp2p::metrics::Metrics::new(&mut registry)`, prefix `libp2p_`) and ours (prefix
//! `sigma_`). The protocol counters live in the node's event loop
//! ([`sigma_behaviour::Counters`], [`sigma_behaviour::ReplicaTotals`]); they are read
//! once per scrape ([`Metrics::set_snapshot`]) and encoded by a [`Collector`], so the
//! event loop does no metrics work of its own. Acquire latency is observed by the
//! callers that wait for locks (the HTTP acquire path, which `sigma lock` uses).
//!
//! | metric | type | labels |
//! | --- | --- | --- |
//! | `sigma_replica_grants_total`, `_releases_total`, `_yields_total`, `_lease_expiries_total` | counter | |
//! | `sigma_replicas_hosted` | gauge | |
//! | `sigma_replicas_created_total` (replica resets seen from inside) | counter | |
//! | `sigma_replicas_handed_over_total` (dropped for a closer live peer) | counter | |
//! | `sigma_responses_refused_total` | counter | `reason` |
//! | `sigma_redirects_sent_total`, `sigma_redirects_followed_total`, `sigma_lookups_total`, `sigma_ownership_checks_total`, `sigma_ownership_lost_total`, `sigma_ownership_by_neighbourhood_total`, `sigma_self_lookups_incomplete_total`, `sigma_bootstraps_cut_total` | counter | |
//! | `sigma_kad_requests_total` | counter | `purpose`: bootstrap, self, neighbourhood, host, ownership, other |
//! | `sigma_messages_in_total`, `sigma_messages_out_total` (messages, batched or not) | counter | `kind` |
//! | `sigma_requests_out_total`, `sigma_batches_out_total`, `sigma_requests_in_total` (transport requests: a batch counts one) | counter | |
//! | `sigma_messages_rejected_total` | counter | `reason` |
//! | `sigma_inbound_failures_total`, `sigma_outbound_failures_total` | counter | `kind` |
//! | `sigma_gossip_bytes_total`, `sigma_gossip_messages_total` (membership tables, requests and replies: their CBOR as the gossip protocol writes it) | counter | `direction`: out, in |
//! | `sigma_pings_total` (liveness pings of this peer answered: 32 bytes each way) | counter | |
//! | `sigma_acquisitions_total`, `sigma_acquired_total`, `sigma_lost_total` | counter | |
//! | `sigma_token_regressions_total` (a won token not above the last one seen here) | counter | |
//! | `sigma_revoked_total` | counter | held locks revoked by an operator (`sigma release --token`) |
//! | `sigma_completed_total`, `sigma_completed_messages_total` | counter | messages per CS entry = their ratio |
//! | `sigma_acquire_duration_seconds` | histogram | `outcome` |
//! | `sigma_http_locks_held` | gauge | |
//! | `sigma_http_rejected_total` (refused by the API's gate, `sigma_daemon::http::gate`, or a holder route: `not_held`, `bad_lease`) | counter | `reason` |
//! | `sigma_http_connections_refused_total` (past `--http-max-connections`) | counter | `listener`: api, metrics |
//! | `sigma_http_connections_timed_out_total` (no full request head within `--http-header-timeout`) | counter | `listener` |
//!
//! The replica totals are sums over the replicas hosted *now*: a replica that moves
//! away takes its counts with it, which Prometheus reads as a counter reset.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabel as _, EncodeLabelSet, EncodeMetric, LabelSetEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use sigma_behaviour::{Counters, ReplicaTotals};

/// How an acquisition ended, for the latency histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The lock was granted.
    Acquired,
    /// The caller's timeout ran out first.
    Timeout,
    /// The node does not serve (joining, minority) and the timeout ran out.
    NotReady,
    /// Any other failure (bad name, node stopped, …).
    Error,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Acquired => "acquired",
            Outcome::Timeout => "timeout",
            Outcome::NotReady => "not_ready",
            Outcome::Error => "error",
        }
    }
}

/// One label: `key="value"` (fixed strings, so the label sets are bounded).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Label {
    key: &'static str,
    value: &'static str,
}

impl EncodeLabelSet for Label {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        (self.key, self.value).encode(encoder.encode_label())
    }
}

/// The node's counters, read once per scrape ([`NodeHandle::counters`](crate::NodeHandle::counters)).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The Sigma behaviour's counters.
    pub counters: Counters,
    /// Sums over the replicas hosted now.
    pub replicas: ReplicaTotals,
    /// Acquisitions through this node whose fencing token was not above the last one
    /// it saw for the lock (`Status::token_regressions`; should stay 0).
    pub token_regressions: u64,
}

type Shared = Arc<Mutex<Option<Snapshot>>>;

/// Our metrics: cheap to clone, shared by the HTTP handlers.
#[derive(Clone, Debug)]
pub struct Metrics {
    snapshot: Shared,
    acquire_latency: Family<Label, Histogram, fn() -> Histogram>,
    http_locks_held: Gauge,
    client_leases_expired: prometheus_client::metrics::counter::Counter,
    http_rejected: Family<Label, prometheus_client::metrics::counter::Counter>,
    http_connections_refused: Family<Label, prometheus_client::metrics::counter::Counter>,
    http_connections_timed_out: Family<Label, prometheus_client::metrics::counter::Counter>,
}

fn latency_histogram() -> Histogram {
    // 1 ms … ~131 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

impl Metrics {
    /// Registers the sigma metrics in `registry` under the prefix `sigma`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Metrics {
            snapshot: Arc::new(Mutex::new(None)),
            acquire_latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            http_locks_held: Gauge::default(),
            client_leases_expired: Default::default(),
            http_rejected: Family::default(),
            http_connections_refused: Family::default(),
            http_connections_timed_out: Family::default(),
        };
        let sub = registry.sub_registry_with_prefix("sigma");
        sub.register_with_unit(
            "acquire_duration",
            "Time from an acquire request to its outcome (HTTP acquire path, used by `sigma lock`)",
            prometheus_client::registry::Unit::Seconds,
            m.acquire_latency.clone(),
        );
        sub.register(
            "http_locks_held",
            "Locks held by the daemon on behalf of HTTP clients",
            m.http_locks_held.clone(),
        );
        sub.register(
            "client_leases_expired",
            "Locks released because their HTTP client stopped renewing its lease (a dead client)",
            m.client_leases_expired.clone(),
        );
        sub.register(
            "http_rejected",
            "HTTP requests refused before reaching the API (bad Host or Origin, form POST, token, size, busy)",
            m.http_rejected.clone(),
        );
        sub.register(
            "http_connections_refused",
            "HTTP connections closed on accept because the listener had --http-max-connections open",
            m.http_connections_refused.clone(),
        );
        sub.register(
            "http_connections_timed_out",
            "HTTP connections closed because no full request head came within --http-header-timeout (idle included)",
            m.http_connections_timed_out.clone(),
        );
        sub.register_collector(Box::new(CounterCollector { snapshot: m.snapshot.clone() }));
        m
    }

    /// Stores the node's counters for the next encoding of the registry.
    pub fn set_snapshot(&self, snapshot: Snapshot) {
        *self.snapshot.lock().unwrap_or_else(|e| e.into_inner()) = Some(snapshot);
    }

    /// Records how long an acquisition took and how it ended.
    pub fn observe_acquire(&self, outcome: Outcome, elapsed: Duration) {
        self.acquire_latency
            .get_or_create(&Label { key: "outcome", value: outcome.as_str() })
            .observe(elapsed.as_secs_f64());
    }

    /// Counts a lock released because its HTTP client's lease ran out.
    pub fn client_lease_expired(&self) {
        self.client_leases_expired.inc();
    }

    /// Counts an HTTP request refused by the API's gate (`reason`: a fixed set of codes).
    pub fn http_rejected(&self, reason: &'static str) {
        self.http_rejected.get_or_create(&Label { key: "reason", value: reason }).inc();
    }

    /// Counts a connection closed on accept (`listener`: `api` or `metrics`).
    pub fn http_connection_refused(&self, listener: &'static str) {
        self.http_connections_refused.get_or_create(&Label { key: "listener", value: listener }).inc();
    }

    /// Counts a connection closed for want of a request head in time.
    pub fn http_connection_timed_out(&self, listener: &'static str) {
        self.http_connections_timed_out.get_or_create(&Label { key: "listener", value: listener }).inc();
    }

    /// Sets the number of locks held for HTTP clients.
    pub fn set_http_locks_held(&self, n: usize) {
        self.http_locks_held.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// Encodes the last counter snapshot at scrape time.
#[derive(Debug)]
struct CounterCollector {
    snapshot: Shared,
}

fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(v);
    let me = encoder.encode_descriptor(name, help, None, c.metric_type())?;
    c.encode(me)
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
    let me = encoder.encode_descriptor(name, help, None, g.metric_type())?;
    g.encode(me)
}

fn labelled(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &'static str,
    values: &BTreeMap<&'static str, u64>,
) -> Result<(), std::fmt::Error> {
    let mut me = encoder.encode_descriptor(name, help, None, ConstCounter::new(0u64).metric_type())?;
    for (k, v) in values {
        let labels = [(label, *k)];
        let fe = me.encode_family(&labels)?;
        ConstCounter::new(*v).encode(fe)?;
    }
    Ok(())
}

impl Collector for CounterCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let guard = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        let Some(Snapshot { counters: c, replicas: t, token_regressions }) = guard.as_ref() else { return Ok(()) };
        counter(&mut e, "replica_grants", "Votes granted by the replicas hosted here", t.grants)?;
        counter(&mut e, "replica_releases", "RELEASEs applied by the replicas hosted here", t.releases)?;
        counter(&mut e, "replica_yields", "YIELDs applied by the replicas hosted here", t.yields)?;
        counter(
            &mut e,
            "replica_lease_expiries",
            "Owner leases that ran out on the replicas hosted here",
            t.lease_expiries,
        )?;
        let g = ConstGauge::new(i64::try_from(t.hosted).unwrap_or(i64::MAX));
        let me =
            e.encode_descriptor("replicas_hosted", "Logical replicas hosted by this peer", None, g.metric_type())?;
        g.encode(me)?;
        counter(
            &mut e,
            "replicas_created",
            "Replicas this peer started hosting with empty memory (resets seen from inside)",
            c.replicas_created,
        )?;
        counter(
            &mut e,
            "replicas_evicted",
            "Idle replicas dropped once they had nothing left to remember (not a reset)",
            c.replicas_evicted,
        )?;
        counter(
            &mut e,
            "addresses_ignored",
            "Addresses of other peers not kept: narrower than this node's external ones (a LAN or loopback address seen by a public node), or not dialable",
            c.addresses_ignored,
        )?;
        counter(
            &mut e,
            "messages_resent",
            "Client messages sent again after a host refused them for this node's request budget",
            c.resent,
        )?;
        counter(
            &mut e,
            "resends_abandoned",
            "Refused client messages given up after 10 resends or past the bound of those waiting (a RELEASE's votes then lapse with their leases)",
            c.resends_abandoned,
        )?;
        counter(
            &mut e,
            "routing_departed_replaced",
            "Departed members (alive here once, neither connected nor alive now) that left a full k-bucket of the routing table for a connected newcomer",
            c.departed_replaced,
        )?;
        counter(
            &mut e,
            "routing_departed_forgotten",
            "Departed members forgotten past the membership window that left the routing table",
            c.departed_forgotten,
        )?;
        counter(
            &mut e,
            "members_left",
            "Members taken out of the counts by their own signed leave (a graceful stop)",
            c.members_left,
        )?;
        counter(
            &mut e,
            "members_forgotten_by_operator",
            "Members taken out of the counts by the operator (sigma admin forget)",
            c.members_forgotten_by_operator,
        )?;
        counter(
            &mut e,
            "replicas_handed_over",
            "Replicas dropped because a closer peer became live and hosts them now",
            c.replicas_handed_over,
        )?;
        labelled(
            &mut e,
            "responses_refused",
            "Responses refused by local acquisitions (stale, too far ahead, ...), by reason",
            "reason",
            &c.responses_refused,
        )?;
        counter(&mut e, "redirects_sent", "Redirects sent (not the closest live peer for a key)", c.redirects_sent)?;
        counter(&mut e, "redirects_followed", "Redirects followed", c.redirects_followed)?;
        counter(&mut e, "lookups", "Kademlia lookups started to find a replica's host", c.lookups)?;
        counter(
            &mut e,
            "ownership_checks",
            "Kademlia lookups started to check that no closer peer hosts a key",
            c.ownership_checks,
        )?;
        counter(&mut e, "ownership_lost", "Ownership lookups that found a closer peer for a key", c.ownership_lost)?;
        counter(
            &mut e,
            "ownership_by_neighbourhood",
            "Keys found this peer's from its last self-lookup, without a lookup of their own",
            c.ownership_by_neighbourhood,
        )?;
        counter(
            &mut e,
            "self_lookups_incomplete",
            "Self-lookups not taken as the neighbourhood: timed out, or fewer than k peers found with a request failed",
            c.self_lookups_incomplete,
        )?;
        counter(
            &mut e,
            "bootstraps_cut",
            "Kademlia bootstraps cut to their self-lookup (a join, or a bucket refresh sooner than half the refresh interval)",
            c.bootstraps_cut,
        )?;
        labelled(
            &mut e,
            "kad_requests",
            "Kademlia requests sent, by what their query was for (bootstrap, self, neighbourhood, host, ownership, other)",
            "purpose",
            &c.kad_requests,
        )?;
        labelled(
            &mut e,
            "messages_in",
            "Sigma messages received (alone or in a batch), by kind",
            "kind",
            &c.messages_in,
        )?;
        labelled(
            &mut e,
            "messages_out",
            "Sigma messages sent (alone or in a batch), by kind",
            "kind",
            &c.messages_out,
        )?;
        counter(
            &mut e,
            "requests_out",
            "Sigma transport requests sent (a batch of messages counts one)",
            c.requests_out,
        )?;
        counter(&mut e, "batches_out", "Sigma transport requests sent that carried a batch", c.batches_out)?;
        counter(&mut e, "requests_in", "Sigma transport requests received (a batch counts one)", c.requests_in)?;
        labelled(&mut e, "messages_rejected", "Inbound sigma requests rejected, by reason", "reason", &c.rejected)?;
        labelled(
            &mut e,
            "inbound_failures",
            "Inbound sigma streams that failed, by kind",
            "kind",
            &c.inbound_failures,
        )?;
        labelled(
            &mut e,
            "outbound_failures",
            "Outbound sigma requests that failed, by kind",
            "kind",
            &c.outbound_failures,
        )?;
        gauge(
            &mut e,
            "ready",
            "1 while this peer serves: joined its swarm and reaches a strict majority of the peers it knows",
            u64::from(c.serving),
        )?;
        gauge(
            &mut e,
            "joining",
            "1 while this peer has not yet joined the swarm it was given bootstrap peers of",
            u64::from(c.joining),
        )?;
        gauge(
            &mut e,
            "joint",
            "1 while this peer reaches a majority of its members but not of those it counted before a recent join (docs/design/membership.md)",
            u64::from(c.joint),
        )?;
        gauge(
            &mut e,
            "joints_pending",
            "Newcomers counted here that not every member counted before them is known to count yet",
            c.joints_pending as u64,
        )?;
        gauge(
            &mut e,
            "members",
            "Known sigma peers (present or departed within the membership window), this one included",
            c.members as u64,
        )?;
        gauge(
            &mut e,
            "reachable_members",
            "Known sigma peers connected now, this one included",
            c.reachable_members as u64,
        )?;
        counter(
            &mut e,
            "replicas_dropped_not_serving",
            "Replicas dropped because this peer stopped serving (minority, stall)",
            c.replicas_dropped_not_serving,
        )?;
        counter(
            &mut e,
            "replicas_held",
            "Replicas started under the takeover delay (no grant until their previous host's votes ran out)",
            c.replicas_held,
        )?;
        counter(&mut e, "ping_failures", "Connections closed because a liveness ping failed", c.ping_failures)?;
        counter(&mut e, "pings", "Liveness pings of this peer answered (32 bytes each way)", c.pings)?;
        let directions = |out: u64, inn: u64| BTreeMap::from([("out", out), ("in", inn)]);
        labelled(
            &mut e,
            "gossip_bytes",
            "Bytes of the membership gossip's tables (requests and replies) as its protocol writes them, by direction",
            "direction",
            &directions(c.gossip_bytes_out, c.gossip_bytes_in),
        )?;
        labelled(
            &mut e,
            "gossip_messages",
            "Membership gossip tables (requests and replies), by direction",
            "direction",
            &directions(c.gossip_out, c.gossip_in),
        )?;
        counter(
            &mut e,
            "connections_trimmed",
            "Peers disconnected to stay under the connection watermarks (least recently used first)",
            c.connections_trimmed,
        )?;
        counter(
            &mut e,
            "stalls",
            "Times the event loop was found stalled past the liveness timeout (replicas dropped and held)",
            c.stalls,
        )?;
        counter(&mut e, "acquisitions", "Acquisitions started on this peer", c.acquisitions)?;
        counter(&mut e, "acquired", "Acquisitions that won the lock", c.acquired)?;
        counter(&mut e, "lost", "Acquisitions that lost the lock while holding it", c.lost)?;
        counter(&mut e, "revoked", "Held locks revoked by an operator", c.revoked)?;
        counter(&mut e, "completed", "Acquisitions that won and finished", c.completed)?;
        counter(
            &mut e,
            "token_regressions",
            "Locks won through this peer whose fencing token was not above the last one it saw for the lock (should stay 0)",
            *token_regressions,
        )?;
        counter(
            &mut e,
            "completed_messages",
            "Protocol messages (REQUEST, YIELD, RELEASE, RESPONSE) of the finished acquisitions",
            c.completed_messages,
        )?;
        Ok(())
    }
}

/// The registry encoded in the OpenMetrics text format.
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, registry)?;
    Ok(s)
}

/// Content type of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_encoded_with_prefix_and_labels() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let mut c = Counters::default();
        c.messages_in.insert("request", 7);
        c.rejected.insert("bad_resource", 2);
        c.acquired = 3;
        c.gossip_bytes_out = 4096;
        c.gossip_in = 9;
        let t = ReplicaTotals { hosted: 4, grants: 5, ..ReplicaTotals::default() };
        m.set_snapshot(Snapshot { counters: c, replicas: t, token_regressions: 0 });
        m.observe_acquire(Outcome::Acquired, Duration::from_millis(3));
        m.set_http_locks_held(1);
        let text = encode(&registry).unwrap();
        for needle in [
            "sigma_messages_in_total{kind=\"request\"} 7",
            "sigma_messages_rejected_total{reason=\"bad_resource\"} 2",
            "sigma_acquired_total 3",
            "sigma_replicas_hosted 4",
            "sigma_replica_grants_total 5",
            "sigma_acquire_duration_seconds_count{outcome=\"acquired\"} 1",
            "sigma_http_locks_held 1",
            "sigma_token_regressions_total 0",
            "sigma_gossip_bytes_total{direction=\"out\"} 4096",
            "sigma_gossip_bytes_total{direction=\"in\"} 0",
            "sigma_gossip_messages_total{direction=\"in\"} 9",
            "sigma_pings_total 0",
        ] {
            assert!(text.contains(needle), "{needle} missing from\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn no_snapshot_no_counters() {
        let mut registry = Registry::default();
        let _m = Metrics::register(&mut registry);
        let text = encode(&registry).unwrap();
        assert!(!text.contains("sigma_acquired_total"));
    }
}
