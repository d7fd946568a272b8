//! Bad input on the wire, sent by a probe peer with a raw codec: malformed CBOR,
//! oversized frames, unknown message kinds and an unknown protocol version are refused,
//! counted, and the node keeps serving everyone else. (Reference: DESIGN "Wire".)

use std::time::Duration;

use futures::prelude::*;
use libp2p::request_response::{self, OutboundFailure, ProtocolSupport};
use libp2p::swarm::{Swarm, SwarmEvent};
use libp2p::StreamProtocol;
use libp2p_swarm_test::SwarmExt;
use sigma_behaviour::{proto, wire};
use sigma_behaviour::{Behaviour, Config, Event};

#[path = "support/raw.rs"]
mod raw;
use raw::Raw;

fn node() -> Swarm<Behaviour> {
    // No takeover delay: a lone node that just started would hold its first grants.
    let config = Config::default()
        .with_protocol(proto::Config::default().with_quorum(3, 2))
        .with_takeover_delay(Some(Duration::ZERO));
    Swarm::new_ephemeral_tokio(|kp| Behaviour::new(&kp, config))
}

fn probe(protocol: &str) -> Swarm<request_response::Behaviour<Raw>> {
    Swarm::new_ephemeral_tokio(|_| {
        request_response::Behaviour::with_codec(
            Raw,
            [(StreamProtocol::try_from_owned(protocol.to_owned()).unwrap(), ProtocolSupport::Outbound)],
            request_response::Config::default().with_request_timeout(Duration::from_secs(5)),
        )
    })
}

/// Sends `bytes` and drives both swarms until the probe's exchange ends.
async fn exchange(
    node: &mut Swarm<Behaviour>,
    probe: &mut Swarm<request_response::Behaviour<Raw>>,
    bytes: Vec<u8>,
) -> Result<Vec<u8>, String> {
    let target = *node.local_peer_id();
    probe.behaviour_mut().send_request(&target, bytes);
    let outcome = async {
        loop {
            tokio::select! {
                e = probe.select_next_some() => match e {
                    SwarmEvent::Behaviour(request_response::Event::Message {
                        message: request_response::Message::Response { response, .. }, ..
                    }) => return Ok(response),
                    SwarmEvent::Behaviour(request_response::Event::OutboundFailure { error, .. }) => {
                        return Err(match error {
                            OutboundFailure::UnsupportedProtocols => "unsupported".to_string(),
                            other => other.to_string(),
                        })
                    }
                    _ => {}
                },
                _ = node.select_next_some() => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), outcome).await.expect("exchange timed out")
}

#[tokio::test]
async fn malformed_oversized_and_unknown_are_counted_and_harmless() {
    let mut n = node();
    n.listen().with_memory_addr_external().await;
    let mut p = probe(wire::PROTOCOL.as_ref());
    p.connect(&mut n).await;

    // Control: a valid framed PING sent as raw bytes (the probe closes its side after
    // writing) is answered with its reply frame, then the node closes the stream.
    let ping = wire::Request::Ping { resource: "still-serving".into(), index: 0, n: 3 };
    let bytes = wire::frame(wire::FrameKind::Request, 42, &ping).unwrap();
    let back = exchange(&mut n, &mut p, bytes).await.expect("an answer");
    let (id, total) = wire::parse_frame(&back, wire::FrameKind::Reply).unwrap().expect("a whole reply frame");
    assert_eq!((id, total), (42, back.len()));
    assert_eq!(wire::decode_body::<wire::Reply>(&back[wire::FRAME_HEADER..]).unwrap(), wire::Reply::Ack);

    // Not a frame at all; a frame whose body is a CBOR map naming an unknown message
    // kind; a header announcing a body over the request size limit.
    let unknown_kind = vec![0xa1, 0x65, b'B', b'o', b'g', b'u', b's', 0x01];
    let mut framed_unknown = ((wire::FRAME_HEADER - 4 + unknown_kind.len()) as u32).to_be_bytes().to_vec();
    framed_unknown.push(0);
    framed_unknown.extend_from_slice(&7u64.to_be_bytes());
    framed_unknown.extend_from_slice(&unknown_kind);
    let mut oversized = ((wire::FRAME_HEADER - 4) as u32 + wire::MAX_REQUEST_BYTES as u32 + 1).to_be_bytes().to_vec();
    oversized.push(0);
    oversized.extend_from_slice(&[0x42; 64]);
    for bytes in [b"\xff\xfe garbage".to_vec(), framed_unknown, oversized] {
        // The node drops the stream: the probe reads nothing back (or an error).
        let r = exchange(&mut n, &mut p, bytes).await;
        assert!(r.as_ref().map_or(true, |b| b.is_empty()), "the node answered garbage: {r:?}");
    }
    // What was refused is counted, by kind.
    let counters = n.behaviour().counters();
    let kind = |k: &str| counters.inbound_failures.get(k).copied().unwrap_or(0);
    assert_eq!((kind("malformed"), kind("oversized")), (2, 1), "{:?}", counters.inbound_failures);

    // Still serving: a lock on the lone node (n = 3 replicas, all local).
    let id = n.behaviour_mut().acquire("still-serving", None).expect("valid");
    let event = tokio::time::timeout(Duration::from_secs(20), n.next_behaviour_event()).await.expect("no grant");
    assert!(matches!(event, Event::Acquired { id: got, .. } if got == id), "{event:?}");
}

/// An old peer (`/sigma/1.1.0`, request-response) is not spoken to: its request fails
/// with `UnsupportedProtocols` at once, it does not hang.
#[tokio::test]
async fn unknown_protocol_version_is_not_spoken() {
    let mut n = node();
    n.listen().with_memory_addr_external().await;
    let mut p = probe(wire::OLD_PROTOCOL.as_ref());
    p.connect(&mut n).await;
    let r = exchange(&mut n, &mut p, vec![0xa0]).await;
    assert_eq!(r, Err("unsupported".to_string()));
}

/// A peer's answer to `Locks` (`sigma locks --swarm`) is checked before it is used: a
/// page longer than the bound, or a name that is not a lock name (here with terminal
/// escapes), counts as no answer, and is counted; a valid one comes through as sent.
#[tokio::test]
async fn a_lock_list_out_of_bounds_counts_as_no_answer() {
    use sigma_behaviour::link;
    let mut n = node();
    n.listen().with_memory_addr_external().await;
    let mut liar = Swarm::new_ephemeral_tokio(|_| link::Behaviour::new(link::Config::default(), Default::default()));
    liar.connect(&mut n).await;
    let liar_id = *liar.local_peer_id();
    let entry = |name: String| wire::LockEntry {
        resource: name,
        counter: 1,
        held: true,
        token: 7,
        valid_for_ms: 100,
        votes: 2,
        position: None,
    };
    let too_long = (0..=wire::MAX_LISTED_LOCKS).map(|i| entry(format!("l{i}"))).collect();
    let answers = [
        (wire::LockList { locks: too_long, more: 0 }, false),
        (wire::LockList { locks: vec![entry("evil\u{1b}[2J".into())], more: 0 }, false),
        (wire::LockList { locks: vec![entry("fine".into())], more: 3 }, true),
    ];
    for (answer, valid) in answers {
        let id = n.behaviour_mut().ask(liar_id, wire::Request::Locks { after: None });
        let exchange = async {
            loop {
                tokio::select! {
                    e = liar.select_next_some() => if let SwarmEvent::Behaviour(link::Event::Message {
                        message: link::Message::Request { request, channel }, ..
                    }) = e {
                        assert_eq!(request, wire::Request::Locks { after: None });
                        liar.behaviour_mut().send_response(channel, wire::Reply::Locks(answer.clone()));
                    },
                    e = n.select_next_some() => if let SwarmEvent::Behaviour(Event::Answered { id: got, reply }) = e {
                        assert_eq!(got, id);
                        return reply;
                    },
                }
            }
        };
        let reply = tokio::time::timeout(Duration::from_secs(20), exchange).await.expect("no answer in time");
        if valid {
            assert_eq!(reply, Some(wire::Reply::Locks(answer)));
        } else {
            assert_eq!(reply, None, "an answer out of bounds came through");
        }
    }
    let counters = n.behaviour().counters();
    assert_eq!(counters.outbound_failures.get("bad_reply"), Some(&2), "{:?}", counters.outbound_failures);
}
