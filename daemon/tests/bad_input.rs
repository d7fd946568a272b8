//! Bad input on the wire against real `sigma run` daemons: a client swarm of the test
//! process (TCP + noise + yamux) sends daemon 0 garbage, a frame cut short, an unknown
//! message kind, an oversized frame (each on a stream of its own, next to the client's
//! long-lived sigma stream), the old protocol version and well-formed but invalid
//! requests.
//! Each is refused (and answered with the right rejection where there is an answer),
//! counted under its label in `/metrics`, and the daemons keep serving everyone else.

use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::prelude::*;
use libp2p::kad::KBucketKey;
use libp2p::request_response::{self, OutboundFailure, OutboundRequestId, ProtocolSupport};
use libp2p::swarm::{NetworkBehaviour, Swarm, SwarmEvent};
use libp2p::{noise, tcp, yamux, PeerId, SwarmBuilder};
use sigma_behaviour::link;
use sigma_behaviour::proto::{Timestamp, ToReplica};
use sigma_behaviour::wire::{self, FrameKind, Rejection, Reply, Request};
use tokio::process::Command;

mod daemon;

use daemon::{daemon, eventually, get_json, get_text, sample, PATIENCE, SIGMA};

/// The daemons' number of replicas per lock (their default).
const N: u16 = 32;

// ---------------------------------------------------------------------------------
// The client swarm

// The raw-bytes codec of the behaviour's wire tests.
#[path = "../../behaviour/tests/support/raw.rs"]
mod raw;
use raw::Raw;

/// One connection, three ways to talk over it: raw bytes on a stream of `/sigma/2.0.0`
/// (written, closed, the rest read back), the real transport on `/sigma/2.0.0`, raw
/// bytes on the old `/sigma/1.1.0`. Outbound only: the client serves nothing.
#[derive(NetworkBehaviour)]
struct Client {
    raw: request_response::Behaviour<Raw>,
    sigma: link::Behaviour,
    old: request_response::Behaviour<Raw>,
}

fn client() -> Swarm<Client> {
    let config = || request_response::Config::default().with_request_timeout(Duration::from_secs(10));
    SwarmBuilder::with_new_identity()
        .with_tokio()
        .with_tcp(tcp::Config::default().nodelay(true), noise::Config::new, yamux::Config::default)
        .expect("tcp transport")
        .with_behaviour(|_| Client {
            raw: request_response::Behaviour::with_codec(Raw, [(wire::PROTOCOL, ProtocolSupport::Outbound)], config()),
            sigma: link::Behaviour::new(
                link::Config { request_timeout: Duration::from_secs(10), inbound: false, ..link::Config::default() },
                Default::default(),
            ),
            old: request_response::Behaviour::with_codec(
                Raw,
                [(wire::OLD_PROTOCOL, ProtocolSupport::Outbound)],
                config(),
            ),
        })
        .expect("client behaviour")
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(60)))
        .build()
}

/// How an exchange of the client ended.
#[derive(Debug)]
enum Answer {
    /// Bytes read back by a raw exchange (empty: the daemon dropped the stream).
    Bytes(Vec<u8>),
    /// A decoded sigma reply.
    Reply(Reply),
    /// A raw exchange failed on the client's side.
    Failed(OutboundFailure),
    /// The sigma exchange failed on the client's side (shown by assertion messages).
    SigmaFailed(#[allow(dead_code)] link::OutboundFailure),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Via {
    Raw,
    Sigma,
    Old,
}

/// An exchange's id.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Id {
    Raw(OutboundRequestId),
    Sigma(link::RequestId),
}

/// Sends a request through `via` and drives the client until that exchange ends.
async fn exchange(swarm: &mut Swarm<Client>, to: PeerId, via: Via, raw: Vec<u8>, req: Option<Request>) -> Answer {
    let id = match via {
        Via::Raw => Id::Raw(swarm.behaviour_mut().raw.send_request(&to, raw)),
        Via::Old => Id::Raw(swarm.behaviour_mut().old.send_request(&to, raw)),
        Via::Sigma => Id::Sigma(swarm.behaviour_mut().sigma.send_request(&to, req.expect("a request"))),
    };
    let answer = async {
        loop {
            let event = swarm.select_next_some().await;
            let SwarmEvent::Behaviour(event) = event else {
                if let SwarmEvent::ConnectionClosed { peer_id, cause, .. } = &event {
                    panic!("the daemon {peer_id} closed the connection: {cause:?}");
                }
                continue;
            };
            let ended = match event {
                ClientEvent::Raw(e) => ended(e, Answer::Bytes).map(|(r, a)| (Via::Raw, Id::Raw(r), a)),
                ClientEvent::Old(e) => ended(e, Answer::Bytes).map(|(r, a)| (Via::Old, Id::Raw(r), a)),
                ClientEvent::Sigma(link::Event::Message {
                    message: link::Message::Response { request_id, response },
                    ..
                }) => Some((Via::Sigma, Id::Sigma(request_id), Answer::Reply(response))),
                ClientEvent::Sigma(link::Event::OutboundFailure { request_id, error, .. }) => {
                    Some((Via::Sigma, Id::Sigma(request_id), Answer::SigmaFailed(error)))
                }
                ClientEvent::Sigma(_) => None,
            };
            if let Some((v, r, answer)) = ended {
                if v == via && r == id {
                    return answer;
                }
            }
        }
    };
    tokio::time::timeout(PATIENCE, answer).await.expect("exchange timed out")
}

/// The end of an outbound exchange, if `event` is one.
fn ended<Req, Res>(
    event: request_response::Event<Req, Res>,
    wrap: fn(Res) -> Answer,
) -> Option<(OutboundRequestId, Answer)> {
    match event {
        request_response::Event::Message {
            message: request_response::Message::Response { request_id, response },
            ..
        } => Some((request_id, wrap(response))),
        request_response::Event::OutboundFailure { request_id, error, .. } => Some((request_id, Answer::Failed(error))),
        _ => None,
    }
}

/// `request` as the transport frames it (request id 1).
async fn encode(request: Request) -> Vec<u8> {
    wire::frame(FrameKind::Request, 1, &request).expect("encodes")
}

/// `bytes` read as one framed sigma reply to request 1.
async fn decode(bytes: Vec<u8>) -> Result<Reply, String> {
    let (id, total) = wire::parse_frame(&bytes, FrameKind::Reply).map_err(|e| format!("{e:?}"))?.ok_or("cut short")?;
    if (id, total) != (1, bytes.len()) {
        return Err(format!("frame of request {id}, {total} of {} bytes", bytes.len()));
    }
    wire::decode_body(&bytes[wire::FRAME_HEADER..]).map_err(|e| format!("{e:?}"))
}

// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_on_the_wire_is_refused_counted_and_harmless() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let d0 = daemon(dir.path(), "d0", &[]).await;
    let d1 = daemon(dir.path(), "d1", &d0.listen[..1]).await;
    for d in [&d0, &d1] {
        let url = format!("http://{}/v1/status", d.api);
        eventually("the daemons to route to each other", || {
            let url = url.clone();
            async move { get_json(&url).await["routable_peers"].as_u64() >= Some(1) }
        })
        .await;
    }

    // A lock name whose replica 0 daemon 0 hosts (closer to "NAME:1" than daemon 1), so
    // that the stateful checks are reached instead of a redirect.
    let owned = (0..)
        .map(|k| format!("bad-input-{k}"))
        .find(|name| {
            let key = KBucketKey::new(wire::replica_name(name, 0).into_bytes());
            KBucketKey::from(d0.peer_id).distance(&key) < KBucketKey::from(d1.peer_id).distance(&key)
        })
        .expect("some name lands on daemon 0");

    let mut swarm = client();
    let me = *swarm.local_peer_id();
    let target = d0.peer_id;
    let addr = d0.listen.iter().find(|a| a.to_string().contains("/tcp/")).expect("a TCP address").clone();
    swarm.dial(addr).expect("dial daemon 0");
    tokio::time::timeout(PATIENCE, async {
        loop {
            match swarm.select_next_some().await {
                SwarmEvent::ConnectionEstablished { peer_id, .. } if peer_id == target => break,
                SwarmEvent::OutgoingConnectionError { error, .. } => panic!("dialing daemon 0: {error}"),
                _ => {}
            }
        }
    })
    .await
    .expect("connected to daemon 0");

    // Control: a valid PING sent as raw bytes is answered (Ack): what follows is refused
    // for its content, not for the way it is sent.
    let ping = Request::Ping { resource: owned.clone(), index: 0, n: N };
    let ping_bytes = encode(ping.clone()).await;
    match exchange(&mut swarm, target, Via::Raw, ping_bytes.clone(), None).await {
        Answer::Bytes(b) => assert_eq!(decode(b).await.expect("a sigma reply"), Reply::Ack),
        other => panic!("valid raw PING: {other:?}"),
    }

    // (a) Not CBOR; a valid frame cut short. (b) Valid CBOR, unknown message kind: the
    // PING frame with its variant renamed. (c) A well-formed PING over the size limit.
    let tag = [0x64, b'P', b'i', b'n', b'g'];
    let at = ping_bytes.windows(tag.len()).position(|w| w == tag).expect("the PING frame names its variant");
    let mut unknown_kind = ping_bytes.clone();
    unknown_kind[at + 1..at + 5].copy_from_slice(b"Pong");
    // (The header announces the body's length: the daemon refuses it before reading it.)
    let mut oversized = ((wire::FRAME_HEADER - 4) as u32 + wire::MAX_REQUEST_BYTES as u32 + 1).to_be_bytes().to_vec();
    oversized.push(0);
    oversized.extend_from_slice(&1u64.to_be_bytes());
    oversized.extend_from_slice(&vec![b'x'; 1024]);
    let truncated = ping_bytes[..ping_bytes.len() / 2].to_vec();
    for (what, bytes) in [
        ("garbage", b"\xff\xfe garbage".to_vec()),
        ("truncated frame", truncated),
        ("unknown message kind", unknown_kind),
        ("oversized frame", oversized),
    ] {
        // The daemon drops the stream: nothing comes back (or the exchange fails).
        match exchange(&mut swarm, target, Via::Raw, bytes, None).await {
            Answer::Bytes(b) => assert!(b.is_empty(), "{what}: the daemon answered {b:?}"),
            Answer::Failed(e) => assert!(!matches!(e, OutboundFailure::UnsupportedProtocols), "{what}: {e}"),
            other => unreachable!("{other:?}"),
        }
    }

    // (h) The old protocol version is not spoken.
    match exchange(&mut swarm, target, Via::Old, encode(ping.clone()).await, None).await {
        Answer::Failed(OutboundFailure::UnsupportedProtocols) => {}
        other => panic!("/sigma/1.1.0: expected UnsupportedProtocols, got {other:?}"),
    }

    // (d)-(g) Well-formed but invalid requests, through the real codec.
    let request = |client: PeerId| ToReplica::Request { ts: Timestamp::new(1, client), sent: 1, floor: 0 };
    let cases = [
        (Request::Replica { resource: "bad name!".into(), index: 0, n: N, msg: request(me) }, Rejection::BadResource),
        (Request::Replica { resource: owned.clone(), index: N, n: N, msg: request(me) }, Rejection::BadIndex),
        (
            Request::Replica { resource: owned.clone(), index: 0, n: N, msg: request(d1.peer_id) },
            Rejection::ForeignAcquisition,
        ),
        (
            Request::Replica {
                resource: owned.clone(),
                index: 0,
                n: N,
                msg: ToReplica::Release { ts: Timestamp::new(1, me), token: 0, next: vec![] },
            },
            Rejection::NotHolder,
        ),
        // (i) A replica count other than the swarm's, and a floor far ahead of the clock
        // (u64::MAX would pin the replica's grant stamps there).
        (Request::Replica { resource: owned.clone(), index: 0, n: N - 1, msg: request(me) }, Rejection::QuorumMismatch),
        (
            Request::Replica {
                resource: owned.clone(),
                index: 0,
                n: N,
                msg: ToReplica::Request { ts: Timestamp::new(1, me), sent: 1, floor: u64::MAX },
            },
            Rejection::Ahead,
        ),
    ];
    for (req, expected) in cases {
        match exchange(&mut swarm, target, Via::Sigma, Vec::new(), Some(req.clone())).await {
            Answer::Reply(Reply::Rejected(r)) => assert_eq!(r, expected, "for {req:?}"),
            other => panic!("for {req:?}: expected Rejected({expected:?}), got {other:?}"),
        }
    }

    // The same connection is still open and this client still served.
    assert!(swarm.is_connected(&target), "daemon 0 dropped the client");
    match exchange(&mut swarm, target, Via::Sigma, Vec::new(), Some(ping)).await {
        Answer::Reply(Reply::Ack) => {}
        other => panic!("PING after the bad input: {other:?}"),
    }

    // Every class is counted under its label on daemon 0.
    let expected = [
        ("sigma_messages_rejected_total{reason=\"bad_resource\"}", 1),
        ("sigma_messages_rejected_total{reason=\"bad_index\"}", 1),
        ("sigma_messages_rejected_total{reason=\"foreign_acquisition\"}", 1),
        ("sigma_messages_rejected_total{reason=\"not_holder\"}", 1),
        ("sigma_messages_rejected_total{reason=\"quorum_mismatch\"}", 1),
        ("sigma_messages_rejected_total{reason=\"ahead\"}", 1),
        ("sigma_inbound_failures_total{kind=\"malformed\"}", 3),
        ("sigma_inbound_failures_total{kind=\"oversized\"}", 1),
        ("sigma_messages_in_total{kind=\"ping\"}", 2),
    ];
    let metrics_url = format!("http://{}/metrics", d0.api);
    let deadline = Instant::now() + Duration::from_secs(5);
    let text = loop {
        let text = get_text(&metrics_url).await;
        if expected.iter().all(|(series, _)| sample(&text, series).is_some()) || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for (series, want) in expected {
        assert_eq!(sample(&text, series), Some(want), "{series} in /metrics of daemon 0:\n{text}");
    }
    assert_eq!(sample(&text, "sigma_messages_rejected_total{reason=\"not_for_me\"}"), None, "{text}");
    drop(swarm);

    // The daemons keep serving everyone else: `sigma lock` through each of them, first
    // on the lock whose replica 0 received the bogus RELEASE.
    for (d, name) in [(&d1, owned.as_str()), (&d0, "after-bad-input")] {
        let out = Command::new(SIGMA)
            .args(["lock", name, "--timeout", "15s", "--api", &d.api, "--", "true"])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(PATIENCE, out).await.expect("sigma lock hung").unwrap();
        assert!(
            out.status.success(),
            "sigma lock {name} via {}: {:?}\n{}",
            d.peer_id,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!("bad input test took {:?}", started.elapsed());
}
