//! A hostile peer for `soak --flood`: a bare libp2p peer speaking the sigma wire (no
//! Sigma behind it) that sends REQUESTs for made-up lock names to every node, never
//! renews and never releases, as fast as the nodes answer. It shows what one remote
//! peer can make a node hold (the per-peer quota, the global cap, the rate limit).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use futures::StreamExt as _;
use sigma_behaviour::link;
use sigma_behaviour::proto::message::ToReplica;
use sigma_behaviour::proto::Timestamp;
use sigma_behaviour::wire::{Reply, Request};
use sigma_node::libp2p::swarm::SwarmEvent;
use sigma_node::libp2p::{noise, tcp, yamux, Multiaddr, PeerId, Swarm, SwarmBuilder};
use tokio::sync::watch;

type Wire = link::Behaviour;

/// What the flood did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct FloodReport {
    /// REQUESTs sent.
    pub sent: u64,
    /// Answers by kind: `accepted` (RESPONSEs: a replica queued it), `redirected`,
    /// `rejected:<reason>`, `failed` (no answer).
    pub answers: BTreeMap<String, u64>,
    /// Seconds from the first request to the last answer.
    pub seconds: f64,
}

/// Sends `total` REQUESTs for made-up names (`flood-K`, replica K mod n) round-robin to
/// `targets` (`…/p2p/ID` addresses), at most `window` in flight, until done or `stop`.
pub async fn run(
    targets: Vec<Multiaddr>,
    n: u16,
    total: u64,
    window: usize,
    mut stop: watch::Receiver<bool>,
) -> Result<FloodReport> {
    let mut swarm: Swarm<Wire> = SwarmBuilder::with_new_identity()
        .with_tokio()
        .with_tcp(tcp::Config::default(), noise::Config::new, yamux::Config::default)
        .context("flooder transport")?
        .with_behaviour(|_| {
            // Client only: the hosts' notices to it are not served (as request-response
            // with outbound support only did not).
            Wire::new(
                link::Config { request_timeout: Duration::from_secs(10), inbound: false, ..link::Config::default() },
                Default::default(),
            )
        })
        .context("flooder behaviour")?
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(60)))
        .build();
    let me = *swarm.local_peer_id();
    let mut peers: Vec<PeerId> = Vec::new();
    for addr in &targets {
        let Some(sigma_node::libp2p::multiaddr::Protocol::P2p(peer)) = addr.iter().last() else {
            anyhow::bail!("flood target {addr} does not end with /p2p/ID");
        };
        swarm.add_peer_address(peer, addr.clone());
        peers.push(peer);
    }
    anyhow::ensure!(!peers.is_empty(), "nothing to flood");
    let mut report = FloodReport::default();
    let (mut in_flight, mut k) = (0usize, 0u64);
    let start = Instant::now();
    while report.sent < total || in_flight > 0 {
        while in_flight < window && report.sent < total && !*stop.borrow() {
            let peer = peers[(k % peers.len() as u64) as usize];
            let msg = ToReplica::Request { ts: Timestamp::new(k + 1, me), sent: 0, floor: 0 };
            let index = (k % u64::from(n)) as u16;
            swarm
                .behaviour_mut()
                .send_request(&peer, Request::Replica { resource: format!("flood-{k}"), index, n, msg });
            k += 1;
            report.sent += 1;
            in_flight += 1;
        }
        if in_flight == 0 {
            break;
        }
        tokio::select! {
            event = swarm.select_next_some() => match event {
                SwarmEvent::Behaviour(link::Event::Message {
                    message: link::Message::Response { response, .. }, ..
                }) => {
                    in_flight -= 1;
                    let kind = match response {
                        Reply::Responses(_) => "accepted".to_owned(),
                        Reply::Redirect { .. } => "redirected".to_owned(),
                        Reply::Rejected(r) => format!("rejected:{}", r.as_str()),
                        Reply::Ack | Reply::Replica(_) | Reply::Holding(_) | Reply::Locks(_) => "ack".to_owned(),
                        Reply::Batch(_) => "batch".to_owned(),
                    };
                    *report.answers.entry(kind).or_default() += 1;
                }
                SwarmEvent::Behaviour(link::Event::OutboundFailure { .. }) => {
                    in_flight -= 1;
                    *report.answers.entry("failed".to_owned()).or_default() += 1;
                }
                _ => {}
            },
            _ = stop.changed() => {}
        }
    }
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}
