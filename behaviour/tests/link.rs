//! The sigma transport (`link`): pipelined requests on one long-lived stream, replies
//! in any order, timeouts, a connection closing under requests in flight, bad frames,
//! the bound on requests in flight, an unknown protocol, keep-alive and dialling.

use std::time::Duration;

use futures::prelude::*;
use libp2p::core::transport::MemoryTransport;
use libp2p::core::upgrade::Version;
use libp2p::core::Transport as _;
use libp2p::request_response::{self, ProtocolSupport};
use libp2p::swarm::{NetworkBehaviour, Swarm, SwarmEvent};
use libp2p::{noise, yamux, PeerId};
use libp2p_swarm_test::SwarmExt;
use sigma_behaviour::link::{self, OutboundFailure, RequestId};
use sigma_behaviour::wire::{self, ReplicaState, Reply, Request};

fn config(timeout: Duration) -> link::Config {
    link::Config { request_timeout: timeout, ..link::Config::default() }
}

fn peer(config: link::Config) -> Swarm<link::Behaviour> {
    Swarm::new_ephemeral_tokio(|_| link::Behaviour::new(config, Default::default()))
}

/// A request telling `k` apart, and a reply naming it.
fn ping(k: u32) -> Request {
    Request::Ping { resource: format!("r{k}"), index: 0, n: 1 }
}
fn reply_to(request: &Request) -> Reply {
    let Request::Ping { resource, .. } = request else { panic!("{request:?}") };
    let k: u32 = resource[1..].parse().unwrap();
    Reply::Replica(ReplicaState { queue_len: k, ..ReplicaState::default() })
}

#[derive(Debug)]
enum Side {
    Client,
    Server,
}

/// The next event of either swarm (within 10 s).
async fn next<A: NetworkBehaviour, B: NetworkBehaviour>(
    c: &mut Swarm<A>,
    s: &mut Swarm<B>,
) -> (Side, Option<SwarmEvent<A::ToSwarm>>, Option<SwarmEvent<B::ToSwarm>>)
where
    A::ToSwarm: std::fmt::Debug,
    B::ToSwarm: std::fmt::Debug,
{
    let either = async {
        tokio::select! {
            e = c.select_next_some() => (Side::Client, Some(e), None),
            e = s.select_next_some() => (Side::Server, None, Some(e)),
        }
    };
    tokio::time::timeout(Duration::from_secs(10), either).await.expect("no event within 10 s")
}

/// Drives both swarms for `d`, returning the behaviours' events.
async fn drive_for(
    c: &mut Swarm<link::Behaviour>,
    s: &mut Swarm<link::Behaviour>,
    d: Duration,
) -> (Vec<link::Event>, Vec<link::Event>) {
    let (mut ce, mut se) = (Vec::new(), Vec::new());
    let deadline = tokio::time::Instant::now() + d;
    loop {
        let e = tokio::time::timeout_at(deadline, async {
            tokio::select! {
                e = c.select_next_some() => (Some(e), None),
                e = s.select_next_some() => (None, Some(e)),
            }
        })
        .await;
        match e {
            Err(_) => return (ce, se),
            Ok((Some(SwarmEvent::Behaviour(e)), _)) => ce.push(e),
            Ok((_, Some(SwarmEvent::Behaviour(e)))) => se.push(e),
            Ok(_) => {}
        }
    }
}

/// Drives both until the server has `count` requests; returns them with their channels.
async fn requests(
    c: &mut Swarm<link::Behaviour>,
    s: &mut Swarm<link::Behaviour>,
    count: usize,
) -> Vec<(Request, link::ResponseChannel)> {
    let mut got = Vec::new();
    while got.len() < count {
        if let (Side::Server, _, Some(SwarmEvent::Behaviour(link::Event::Message { message, .. }))) = next(c, s).await {
            let link::Message::Request { request, channel } = message else { panic!("{message:?}") };
            got.push((request, channel));
        }
    }
    got
}

/// Drives both until the client has `count` outcomes (replies or failures).
async fn outcomes(
    c: &mut Swarm<link::Behaviour>,
    s: &mut Swarm<link::Behaviour>,
    count: usize,
) -> Vec<(RequestId, Result<Reply, OutboundFailure>)> {
    let mut got = Vec::new();
    while got.len() < count {
        match next(c, s).await {
            (Side::Client, Some(SwarmEvent::Behaviour(link::Event::Message { message, .. })), _) => {
                let link::Message::Response { request_id, response } = message else { continue };
                got.push((request_id, Ok(response)));
            }
            (Side::Client, Some(SwarmEvent::Behaviour(link::Event::OutboundFailure { request_id, error, .. })), _) => {
                got.push((request_id, Err(error)));
            }
            _ => {}
        }
    }
    got
}

async fn pair(client: link::Config, server: link::Config) -> (Swarm<link::Behaviour>, Swarm<link::Behaviour>, PeerId) {
    let mut c = peer(client);
    let mut s = peer(server);
    s.listen().with_memory_addr_external().await;
    c.connect(&mut s).await;
    let target = *s.local_peer_id();
    (c, s, target)
}

/// Many requests in flight on one stream: all reach the server before it answers any,
/// and the replies, sent in reverse order, are matched to their requests by id.
#[tokio::test]
async fn pipelined_requests_are_answered_out_of_order() {
    let (mut c, mut s, target) = pair(config(Duration::from_secs(10)), config(Duration::from_secs(10))).await;
    let ids: Vec<(RequestId, Request)> =
        (0..5).map(|k| (c.behaviour_mut().send_request(&target, ping(k)), ping(k))).collect();
    let mut got = requests(&mut c, &mut s, 5).await;
    got.reverse();
    for (request, channel) in got {
        s.behaviour_mut().send_response(channel, reply_to(&request));
    }
    let answers = outcomes(&mut c, &mut s, 5).await;
    let order: Vec<RequestId> = answers.iter().map(|(id, _)| *id).collect();
    assert_eq!(order, ids.iter().rev().map(|(id, _)| *id).collect::<Vec<_>>(), "replies in the order sent");
    for (id, reply) in answers {
        let request = &ids.iter().find(|(i, _)| *i == id).unwrap().1;
        assert_eq!(reply, Ok(reply_to(request)));
    }
    assert_eq!(c.behaviour().pending_requests(), 0);
    assert_eq!(c.connected_peers().count(), 1);
}

/// Replies of tens of KiB (read over many reads) pipelined back to back come whole; a
/// reply over the limit is not sent (reported on the server; the client times out).
#[tokio::test]
async fn large_replies_come_whole_and_one_over_the_limit_is_not_sent() {
    let (mut c, mut s, target) = pair(config(Duration::from_millis(1500)), config(Duration::from_secs(10))).await;
    let addr: libp2p::Multiaddr =
        format!("/dns4/{}.example/tcp/65535/p2p/{}", "a".repeat(240), PeerId::random()).parse().unwrap();
    let big = |items: usize| {
        Reply::Batch(vec![Reply::Redirect { peer: PeerId::random(), addrs: vec![addr.clone(); 8] }; items])
    };
    let ids: Vec<RequestId> = (0..4).map(|k| c.behaviour_mut().send_request(&target, ping(k))).collect();
    let got = requests(&mut c, &mut s, 4).await;
    let mut expected = Vec::new();
    for (k, (_, channel)) in got.into_iter().enumerate() {
        // 20 items: ~47 KiB; 40: over the 64 KiB limit.
        let reply = big(if k == 3 { 40 } else { 20 });
        assert_eq!(wire::frame(wire::FrameKind::Reply, 0, &reply).is_ok(), k != 3);
        expected.push(reply.clone());
        s.behaviour_mut().send_response(channel, reply);
    }
    let mut answers = Vec::new();
    let mut too_large = 0;
    while answers.len() < 4 {
        match next(&mut c, &mut s).await {
            (Side::Client, Some(SwarmEvent::Behaviour(link::Event::Message { message, .. })), _) => {
                let link::Message::Response { request_id, response } = message else { continue };
                answers.push((request_id, Ok(response)));
            }
            (Side::Client, Some(SwarmEvent::Behaviour(link::Event::OutboundFailure { request_id, error, .. })), _) => {
                answers.push((request_id, Err(error)));
            }
            (Side::Server, _, Some(SwarmEvent::Behaviour(link::Event::InboundFailure { error, .. }))) => {
                assert_eq!(error, link::InboundFailure::TooLarge);
                too_large += 1;
            }
            _ => {}
        }
    }
    assert_eq!(too_large, 1);
    for (k, id) in ids.iter().enumerate() {
        let (_, answer) = answers.iter().find(|(i, _)| i == id).unwrap();
        if k == 3 {
            assert_eq!(answer, &Err(OutboundFailure::Timeout));
        } else {
            assert_eq!(answer, &Ok(expected[k].clone()));
        }
    }
}

/// A request unanswered past the timeout fails with `Timeout`; its late reply is
/// dropped; the stream serves the next request.
#[tokio::test]
async fn a_request_times_out_and_its_late_reply_is_dropped() {
    let (mut c, mut s, target) = pair(config(Duration::from_millis(300)), config(Duration::from_secs(10))).await;
    let id = c.behaviour_mut().send_request(&target, ping(1));
    let mut held = requests(&mut c, &mut s, 1).await;
    let started = std::time::Instant::now();
    assert_eq!(outcomes(&mut c, &mut s, 1).await, vec![(id, Err(OutboundFailure::Timeout))]);
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    let (request, channel) = held.pop().unwrap();
    s.behaviour_mut().send_response(channel, reply_to(&request));
    let (client_events, _) = drive_for(&mut c, &mut s, Duration::from_millis(300)).await;
    assert!(client_events.is_empty(), "{client_events:?}");
    let id = c.behaviour_mut().send_request(&target, ping(2));
    let (request, channel) = requests(&mut c, &mut s, 1).await.pop().unwrap();
    s.behaviour_mut().send_response(channel, reply_to(&request));
    assert_eq!(outcomes(&mut c, &mut s, 1).await, vec![(id, Ok(reply_to(&ping(2))))]);
}

/// A connection closed under requests in flight fails each of them once.
#[tokio::test]
async fn a_closed_connection_fails_every_request_in_flight() {
    let (mut c, mut s, target) = pair(config(Duration::from_secs(10)), config(Duration::from_secs(10))).await;
    let mut ids: Vec<RequestId> = (0..3).map(|k| c.behaviour_mut().send_request(&target, ping(k))).collect();
    let _held = requests(&mut c, &mut s, 3).await;
    let client = *c.local_peer_id();
    s.disconnect_peer_id(client).unwrap();
    let mut failed = outcomes(&mut c, &mut s, 3).await;
    failed.sort_by_key(|(id, _)| *id);
    ids.sort();
    assert_eq!(failed, ids.into_iter().map(|id| (id, Err(OutboundFailure::ConnectionClosed))).collect::<Vec<_>>());
    assert_eq!(c.behaviour().pending_requests(), 0);
}

/// At most `max_inbound` requests of a connection await the server's replies: the
/// next are not read until replies go; none is lost.
#[tokio::test]
async fn requests_in_flight_are_bounded_per_connection() {
    let server = link::Config { max_inbound: 4, ..config(Duration::from_secs(10)) };
    let (mut c, mut s, target) = pair(config(Duration::from_secs(10)), server).await;
    let ids: Vec<RequestId> = (0..6).map(|k| c.behaviour_mut().send_request(&target, ping(k))).collect();
    let mut held = requests(&mut c, &mut s, 4).await;
    let (_, more) = drive_for(&mut c, &mut s, Duration::from_millis(300)).await;
    assert!(more.is_empty(), "past the bound: {more:?}");
    let (request, channel) = held.remove(0);
    s.behaviour_mut().send_response(channel, reply_to(&request));
    held.extend(requests(&mut c, &mut s, 1).await);
    let (_, more) = drive_for(&mut c, &mut s, Duration::from_millis(200)).await;
    assert!(more.is_empty(), "past the bound: {more:?}");
    for (request, channel) in held {
        s.behaviour_mut().send_response(channel, reply_to(&request));
    }
    let (request, channel) = requests(&mut c, &mut s, 1).await.pop().unwrap();
    s.behaviour_mut().send_response(channel, reply_to(&request));
    // Every request answered (the replies came while the test drove both swarms).
    let (ce, _) = drive_for(&mut c, &mut s, Duration::from_millis(300)).await;
    assert!(ce.iter().all(|e| !matches!(e, link::Event::OutboundFailure { .. })), "{ce:?}");
    assert_eq!(c.behaviour().pending_requests(), 0, "{ids:?}");
}

/// A peer that does not speak the protocol (another version): the request fails with
/// `UnsupportedProtocols`, and so does the next one, at once.
#[tokio::test]
async fn another_protocol_version_fails_cleanly() {
    let old = link::Config { protocol: wire::OLD_PROTOCOL, ..config(Duration::from_secs(10)) };
    let (mut c, mut s, target) = pair(old, config(Duration::from_secs(10))).await;
    let a = c.behaviour_mut().send_request(&target, ping(1));
    assert_eq!(outcomes(&mut c, &mut s, 1).await, vec![(a, Err(OutboundFailure::UnsupportedProtocols))]);
    let b = c.behaviour_mut().send_request(&target, ping(2));
    assert_eq!(outcomes(&mut c, &mut s, 1).await, vec![(b, Err(OutboundFailure::UnsupportedProtocols))]);
}

/// Not connected: the peer is dialled and the request goes; an unknown peer fails with
/// `DialFailure`.
#[tokio::test]
async fn a_request_dials_and_an_unreachable_peer_fails() {
    let mut c = peer(config(Duration::from_secs(10)));
    let mut s = peer(config(Duration::from_secs(10)));
    let (addr, _) = s.listen().with_memory_addr_external().await;
    let target = *s.local_peer_id();
    c.add_peer_address(target, addr);
    let id = c.behaviour_mut().send_request(&target, ping(3));
    let (request, channel) = requests(&mut c, &mut s, 1).await.pop().unwrap();
    s.behaviour_mut().send_response(channel, reply_to(&request));
    assert_eq!(outcomes(&mut c, &mut s, 1).await, vec![(id, Ok(reply_to(&ping(3))))]);
    let nobody = PeerId::random();
    let id = c.behaviour_mut().send_request(&nobody, ping(4));
    assert_eq!(outcomes(&mut c, &mut s, 1).await, vec![(id, Err(OutboundFailure::DialFailure))]);
}

// ---------------------------------------------------------------------------------
// Keep-alive: swarms with a short idle-connection timeout.

fn idle_peer(idle: Duration) -> Swarm<link::Behaviour> {
    let identity = libp2p::identity::Keypair::generate_ed25519();
    let peer_id = identity.public().to_peer_id();
    let transport = MemoryTransport::default()
        .upgrade(Version::V1)
        .authenticate(noise::Config::new(&identity).unwrap())
        .multiplex(yamux::Config::default())
        .boxed();
    let swarm_config = libp2p::swarm::Config::with_tokio_executor().with_idle_connection_timeout(idle);
    let config = link::Config { linger: Duration::from_millis(200), ..config(Duration::from_secs(10)) };
    Swarm::new(transport, link::Behaviour::new(config, Default::default()), peer_id, swarm_config)
}

/// The connection stays while a request waits for its reply (longer than the idle
/// timeout), and closes by the idle timeout once nothing is pending (after the
/// handler's linger), although both streams stay open.
#[tokio::test]
async fn pending_requests_keep_the_connection_and_idle_ones_let_it_close() {
    let idle = Duration::from_millis(500);
    let mut c = idle_peer(idle);
    let mut s = idle_peer(idle);
    s.listen_on("/memory/0".parse().unwrap()).unwrap();
    let addr = s
        .wait(|e| match e {
            SwarmEvent::NewListenAddr { address, .. } => Some(address),
            _ => None,
        })
        .await;
    let target = *s.local_peer_id();
    c.dial(addr).unwrap();
    let mut connected = 0;
    while connected < 2 {
        if let (_, Some(SwarmEvent::ConnectionEstablished { .. }), _)
        | (_, _, Some(SwarmEvent::ConnectionEstablished { .. })) = next(&mut c, &mut s).await
        {
            connected += 1;
        }
    }
    let id = c.behaviour_mut().send_request(&target, ping(1));
    let (request, channel) = requests(&mut c, &mut s, 1).await.pop().unwrap();
    let (ce, _) = drive_for(&mut c, &mut s, idle * 3).await;
    assert!(ce.is_empty(), "{ce:?}");
    assert!(c.is_connected(&target), "closed while a request was pending");
    s.behaviour_mut().send_response(channel, reply_to(&request));
    assert_eq!(outcomes(&mut c, &mut s, 1).await, vec![(id, Ok(reply_to(&request)))]);
    let closed = async {
        loop {
            if let (Side::Client, Some(SwarmEvent::ConnectionClosed { .. }), _) = next(&mut c, &mut s).await {
                break;
            }
        }
    };
    tokio::time::timeout(idle * 6, closed).await.expect("the idle connection was not closed");
}

// ---------------------------------------------------------------------------------
// Bad frames, sent by a raw request-response exchange on the protocol, next to a link
// client on the same connection.

#[path = "support/raw.rs"]
mod raw;
use raw::Raw;

#[derive(NetworkBehaviour)]
struct Client {
    link: link::Behaviour,
    raw: request_response::Behaviour<Raw>,
}

/// A malformed frame and an oversized one are counted by kind and cost only their own
/// stream: the link client's request in flight on the same connection is answered.
#[tokio::test]
async fn bad_frames_are_counted_and_cost_only_their_stream() {
    let mut c = Swarm::new_ephemeral_tokio(|_| Client {
        link: link::Behaviour::new(config(Duration::from_secs(10)), Default::default()),
        raw: request_response::Behaviour::with_codec(
            Raw,
            [(wire::PROTOCOL, ProtocolSupport::Outbound)],
            request_response::Config::default().with_request_timeout(Duration::from_secs(10)),
        ),
    });
    let mut s = peer(config(Duration::from_secs(10)));
    s.listen().with_memory_addr_external().await;
    c.connect(&mut s).await;
    let target = *s.local_peer_id();
    let id = c.behaviour_mut().link.send_request(&target, ping(9));
    // The server holds the link request while the raw frames come.
    let held = loop {
        if let (_, _, Some(SwarmEvent::Behaviour(link::Event::Message { message, .. }))) = next(&mut c, &mut s).await {
            let link::Message::Request { request, channel } = message else { panic!() };
            break (request, channel);
        }
    };
    let mut garbage = (100u32).to_be_bytes().to_vec();
    garbage.push(0);
    garbage.extend_from_slice(&[0xff; 104]);
    let mut oversized = (u32::MAX).to_be_bytes().to_vec();
    oversized.push(0);
    for bytes in [garbage, oversized, b"\xff\xfe not a frame".to_vec()] {
        c.behaviour_mut().raw.send_request(&target, bytes);
        let back = loop {
            match next(&mut c, &mut s).await {
                (
                    _,
                    Some(SwarmEvent::Behaviour(ClientEvent::Raw(request_response::Event::Message { message, .. }))),
                    _,
                ) => {
                    let request_response::Message::Response { response, .. } = message else { panic!() };
                    break Ok(response);
                }
                (
                    _,
                    Some(SwarmEvent::Behaviour(ClientEvent::Raw(request_response::Event::OutboundFailure {
                        error,
                        ..
                    }))),
                    _,
                ) => {
                    break Err(error.to_string());
                }
                _ => {}
            }
        };
        assert!(back.as_ref().map_or(true, |b| b.is_empty()), "answered a bad frame: {back:?}");
    }
    let stats = s.behaviour().stats();
    let count = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!((count(&stats.malformed), count(&stats.oversized)), (2, 1));
    s.behaviour_mut().send_response(held.1, reply_to(&held.0));
    let reply = loop {
        if let (_, Some(SwarmEvent::Behaviour(ClientEvent::Link(link::Event::Message { message, .. }))), _) =
            next(&mut c, &mut s).await
        {
            break message;
        }
    };
    let link::Message::Response { request_id, response } = reply else { panic!("{reply:?}") };
    assert_eq!((request_id, response), (id, reply_to(&ping(9))));
    assert!(c.is_connected(&target));
}
