//! The sigma transport: one long-lived stream per connection and direction, carrying
//! framed, pipelined requests and replies (`/sigma/2.0.0`, [`wire::encode_frame`]).
//!
//! request-response opened a yamux stream per request: opening and closing frames, a
//! multistream-select negotiation, a handler entry and two or three timers each. Here a
//! connection's handler opens one stream for its requests when it first has one to send
//! and keeps it; the peer's requests come on the stream the peer opened. Every request
//! has an id (the sender's counter); replies name it and may come in any order, so many
//! requests are in flight on one stream (the host answers batch items asynchronously).
//!
//! The API is request-response's, so the behaviour changed little:
//! [`Behaviour::send_request`] → [`RequestId`]; an inbound request comes with a
//! [`ResponseChannel`] for [`Behaviour::send_response`]; [`Event`] reports messages and
//! failures ([`OutboundFailure`] names request-response's cases).
//!
//! - **Timeouts without a timer per request**: requests are due in the order they were
//!   sent (one timeout for all), so a handler keeps one tokio sleep, armed for its oldest
//!   request, owed reply or the end of its keep-alive linger, and only while there is
//!   one (armed early, it fires and is re-armed: not reset on every reply). A request
//!   unanswered after the timeout fails with [`OutboundFailure::Timeout`]; its late reply
//!   is dropped.
//! - **Failures**: a stream that fails (an I/O error, the peer closing it, a reply that
//!   does not decode) fails every request waiting on it (`ConnectionClosed`); the next
//!   request opens a new stream. A closed connection fails every request sent on it; a
//!   peer not connected is dialled and a failed dial fails its requests (`DialFailure`;
//!   `DialDenied` when a connection limit here refused it).
//!   A peer that does not speak the protocol (an old `/sigma/1.1.0` one) refuses the
//!   negotiation: the waiting requests fail with `UnsupportedProtocols`, and so does every
//!   later one on that connection, at once.
//! - **Bad input**: an inbound frame whose header announces a body over the limit
//!   (requests 24 KiB), is of the wrong kind, or whose body does not decode, is counted
//!   ([`CodecStats`]: `oversized`, `malformed`) and its stream is dropped, with the
//!   replies still owed on it: a length-prefixed stream cannot be trusted past a bad
//!   frame, and skipping an announced 4 GiB body is not an option. The connection stays,
//!   and the sender's next request opens a new stream. Nothing a peer sends panics.
//! - **Bounds**: at most `max_inbound` requests of the peer awaiting our reply per
//!   connection (past it, the handler stops reading: the peer's requests wait in the
//!   stream's window, and time out on its side if we stay busy); a reply not sent within
//!   the timeout is forgotten (counted `timeout`). At most `max_outbound` requests waiting
//!   for replies per connection, and as many queued per peer while dialling; past
//!   either, a request fails at once (`Busy`). At most [`MAX_INBOUND_STREAMS`] inbound
//!   streams per connection (the oldest goes).
//! - **Keep-alive**: the streams do not keep the connection alive by themselves
//!   (`ignore_for_keep_alive`); the handler does while a request waits for its reply or a
//!   reply is owed or unwritten, and for a linger after (1 s, [`Config::linger`]: the swarm
//!   starts a futures-timer delay each time keep-alive turns false, once per request on a
//!   busy connection without it), then leaves the connection to the swarm's idle
//!   timeout, as request-response did.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use libp2p::core::transport::PortUse;
use libp2p::core::Endpoint;
use libp2p::swarm::behaviour::PeerAddresses;
use libp2p::swarm::dial_opts::DialOpts;
use libp2p::swarm::{
    ConnectionDenied, ConnectionId, DialError, FromSwarm, NetworkBehaviour, NotifyHandler, THandler, THandlerInEvent,
    THandlerOutEvent, ToSwarm,
};
use libp2p::{connection_limits, memory_connection_limits, Multiaddr, PeerId, StreamProtocol};

use crate::wire::{self, CodecStats, Reply, Request};

mod handler;
pub use handler::{FromBehaviour, Handler, ToBehaviour};

/// Most inbound streams kept per connection (a well-behaved peer opens one; one that
/// opens more loses the oldest).
pub const MAX_INBOUND_STREAMS: usize = 8;
/// Default bound on the requests waiting for replies per connection, and queued per peer
/// while it is dialled.
pub const DEFAULT_MAX_OUTBOUND: usize = 2048;

/// Configuration of the transport.
#[derive(Clone, Debug)]
pub struct Config {
    /// How long a request waits for its reply (and a reply may be owed).
    pub request_timeout: Duration,
    /// Most requests of the peer awaiting our reply, per connection.
    pub max_inbound: usize,
    /// Most requests awaiting replies per connection, and queued per peer while dialled.
    pub max_outbound: usize,
    /// Whether the peer's streams are served (a client-only tool may refuse them: they
    /// are negotiated, then dropped; the protocol is still listed).
    pub inbound: bool,
    /// The protocol (tests name an old one).
    pub protocol: StreamProtocol,
    /// How long the handler keeps the connection alive after its last request or
    /// reply, before leaving it to the swarm's idle timeout. The swarm starts a
    /// `futures_timer::Delay` each time a connection's keep-alive turns false: without
    /// the linger that was once per request on a busy connection.
    pub linger: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            request_timeout: Duration::from_secs(10),
            max_inbound: 512,
            max_outbound: DEFAULT_MAX_OUTBOUND,
            inbound: true,
            protocol: wire::PROTOCOL,
            linger: Duration::from_secs(1),
        }
    }
}

/// The id of an outbound request, unique per behaviour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where the reply to an inbound request goes: its connection, stream and id.
#[derive(Debug)]
pub struct ResponseChannel {
    peer: PeerId,
    connection: ConnectionId,
    stream: u64,
    id: u64,
}

impl ResponseChannel {
    /// The peer that sent the request.
    pub fn peer(&self) -> PeerId {
        self.peer
    }
}

/// Why an outbound request got no reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutboundFailure {
    /// The peer could not be dialled.
    DialFailure,
    /// The dial was refused here by a connection limit (libp2p's `connection_limits` or
    /// `memory_connection_limits`): nothing is known of the peer. A dial a block or
    /// allow list refused is a `DialFailure`.
    DialDenied,
    /// No reply within the request timeout.
    Timeout,
    /// The connection or the stream closed before the reply came (the request may have
    /// been delivered).
    ConnectionClosed,
    /// The peer does not speak the protocol.
    UnsupportedProtocols,
    /// Too many requests waiting already (`max_outbound`).
    Busy,
    /// The request is over the frame limit (never sent).
    TooLarge,
}

impl OutboundFailure {
    /// Stable label (metrics).
    pub fn as_str(&self) -> &'static str {
        match self {
            OutboundFailure::DialFailure => "dial_failure",
            OutboundFailure::DialDenied => "dial_denied",
            OutboundFailure::Timeout => "timeout",
            OutboundFailure::ConnectionClosed => "connection_closed",
            OutboundFailure::UnsupportedProtocols => "unsupported_protocols",
            OutboundFailure::Busy => "busy",
            OutboundFailure::TooLarge => "too_large",
        }
    }
}

impl std::fmt::Display for OutboundFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an inbound request went unanswered (malformed and oversized frames are counted
/// in [`CodecStats`], not reported).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InboundFailure {
    /// The reply was not sent within the request timeout (it is dropped if it comes).
    Timeout,
    /// The reply is over the frame limit (not sent).
    TooLarge,
}

impl InboundFailure {
    /// Stable label (metrics).
    pub fn as_str(&self) -> &'static str {
        match self {
            InboundFailure::Timeout => "timeout",
            InboundFailure::TooLarge => "too_large",
        }
    }
}

/// A message from a peer.
#[derive(Debug)]
pub enum Message {
    /// A request, to be answered through `channel`.
    Request {
        /// The request.
        request: Request,
        /// Where its reply goes.
        channel: ResponseChannel,
    },
    /// The reply to one of this peer's requests.
    Response {
        /// The request's id.
        request_id: RequestId,
        /// The reply.
        response: Reply,
    },
}

/// What the transport reports.
#[derive(Debug)]
pub enum Event {
    /// A request or a reply.
    Message {
        /// From this peer.
        peer: PeerId,
        /// On this connection.
        connection_id: ConnectionId,
        /// The message.
        message: Message,
    },
    /// An outbound request failed (exactly one outcome per request: a reply or this).
    OutboundFailure {
        /// To this peer.
        peer: PeerId,
        /// The request.
        request_id: RequestId,
        /// Why.
        error: OutboundFailure,
    },
    /// An inbound request went unanswered.
    InboundFailure {
        /// From this peer.
        peer: PeerId,
        /// On this connection.
        connection_id: ConnectionId,
        /// Why.
        error: InboundFailure,
    },
}

/// An open connection's requests in flight (the behaviour's view).
#[derive(Debug)]
struct Connection {
    id: ConnectionId,
    pending: HashSet<u64>,
}

/// The transport's `NetworkBehaviour`.
pub struct Behaviour {
    config: Config,
    stats: Arc<CodecStats>,
    next_id: u64,
    connected: HashMap<PeerId, Vec<Connection>>,
    /// Requests for peers not connected, sent once a connection is established.
    queued: HashMap<PeerId, Vec<(u64, Request)>>,
    events: VecDeque<ToSwarm<Event, FromBehaviour>>,
    /// Addresses given through `Swarm::add_peer_address` (as request-response kept
    /// them; in the sigma behaviour Kademlia gives most).
    addresses: PeerAddresses,
}

impl Behaviour {
    /// A transport counting refused frames into `stats`.
    pub fn new(config: Config, stats: Arc<CodecStats>) -> Self {
        Behaviour {
            config,
            stats,
            next_id: 0,
            connected: HashMap::new(),
            queued: HashMap::new(),
            events: VecDeque::new(),
            addresses: PeerAddresses::default(),
        }
    }

    /// The shared counts of refused frames.
    pub fn stats(&self) -> &Arc<CodecStats> {
        &self.stats
    }

    /// Sends `request` to `peer` (dialling it if not connected). Exactly one outcome is
    /// reported: [`Message::Response`] or [`Event::OutboundFailure`].
    pub fn send_request(&mut self, peer: &PeerId, request: Request) -> RequestId {
        let id = self.next_id;
        self.next_id += 1;
        if let Some(conn) = self.connected.get_mut(peer).and_then(|c| c.first_mut()) {
            conn.pending.insert(id);
            self.events.push_back(ToSwarm::NotifyHandler {
                peer_id: *peer,
                handler: NotifyHandler::One(conn.id),
                event: FromBehaviour::Send(id, request),
            });
            return RequestId(id);
        }
        let queue = self.queued.entry(*peer).or_default();
        if queue.len() >= self.config.max_outbound {
            self.events.push_back(ToSwarm::GenerateEvent(Event::OutboundFailure {
                peer: *peer,
                request_id: RequestId(id),
                error: OutboundFailure::Busy,
            }));
            return RequestId(id);
        }
        if queue.is_empty() {
            self.events.push_back(ToSwarm::Dial { opts: DialOpts::peer_id(*peer).build() });
        }
        queue.push((id, request));
        RequestId(id)
    }

    /// Sends the reply to an inbound request (dropped if its connection or stream is
    /// gone, or its timeout passed: the sender has given up by then).
    pub fn send_response(&mut self, channel: ResponseChannel, reply: Reply) {
        self.events.push_back(ToSwarm::NotifyHandler {
            peer_id: channel.peer,
            handler: NotifyHandler::One(channel.connection),
            event: FromBehaviour::Respond { stream: channel.stream, id: channel.id, reply },
        });
    }

    /// Whether `peer` has a connection.
    pub fn is_connected(&self, peer: &PeerId) -> bool {
        self.connected.get(peer).is_some_and(|c| !c.is_empty())
    }

    /// Requests in flight on connections plus those queued for peers being dialled.
    pub fn pending_requests(&self) -> usize {
        self.connected.values().flatten().map(|c| c.pending.len()).sum::<usize>()
            + self.queued.values().map(Vec::len).sum::<usize>()
    }

    fn handler(&self) -> Handler {
        Handler::new(self.config.clone(), self.stats.clone())
    }

    fn fail(&mut self, peer: PeerId, ids: impl IntoIterator<Item = u64>, error: &OutboundFailure) {
        for id in ids {
            self.events.push_back(ToSwarm::GenerateEvent(Event::OutboundFailure {
                peer,
                request_id: RequestId(id),
                error: error.clone(),
            }));
        }
    }
}

impl NetworkBehaviour for Behaviour {
    type ConnectionHandler = Handler;
    type ToSwarm = Event;

    fn handle_established_inbound_connection(
        &mut self,
        _: ConnectionId,
        _: PeerId,
        _: &Multiaddr,
        _: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(self.handler())
    }

    fn handle_established_outbound_connection(
        &mut self,
        _: ConnectionId,
        _: PeerId,
        _: &Multiaddr,
        _: Endpoint,
        _: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(self.handler())
    }

    fn handle_pending_outbound_connection(
        &mut self,
        _: ConnectionId,
        peer: Option<PeerId>,
        _: &[Multiaddr],
        _: Endpoint,
    ) -> Result<Vec<Multiaddr>, ConnectionDenied> {
        Ok(peer.map(|p| self.addresses.get(&p).collect()).unwrap_or_default())
    }

    fn on_swarm_event(&mut self, event: FromSwarm) {
        self.addresses.on_swarm_event(&event);
        match event {
            // Registered only once established (another behaviour may still deny a
            // connection after its handler was made): requests queued for the peer go.
            FromSwarm::ConnectionEstablished(e) => {
                let mut conn = Connection { id: e.connection_id, pending: HashSet::new() };
                for (id, request) in self.queued.remove(&e.peer_id).unwrap_or_default() {
                    conn.pending.insert(id);
                    self.events.push_back(ToSwarm::NotifyHandler {
                        peer_id: e.peer_id,
                        handler: NotifyHandler::One(e.connection_id),
                        event: FromBehaviour::Send(id, request),
                    });
                }
                self.connected.entry(e.peer_id).or_default().push(conn);
            }
            FromSwarm::ConnectionClosed(e) => {
                let Some(conns) = self.connected.get_mut(&e.peer_id) else { return };
                let Some(at) = conns.iter().position(|c| c.id == e.connection_id) else { return };
                let conn = conns.remove(at);
                if conns.is_empty() {
                    self.connected.remove(&e.peer_id);
                }
                let mut ids: Vec<u64> = conn.pending.into_iter().collect();
                ids.sort_unstable();
                self.fail(e.peer_id, ids, &OutboundFailure::ConnectionClosed);
            }
            FromSwarm::DialFailure(e) => {
                // Another dial (or a connection) is under way: its outcome decides.
                if matches!(e.error, DialError::DialPeerConditionFalse(_)) {
                    return;
                }
                let Some(peer) = e.peer_id else { return };
                if self.is_connected(&peer) {
                    return;
                }
                // Refused by a connection limit here: the peer may be fine. (Refused by
                // a block or allow list, it is as unreachable as a failed dial.)
                let failure = match &e.error {
                    DialError::Denied { cause }
                        if cause.downcast_ref::<connection_limits::Exceeded>().is_some()
                            || cause.downcast_ref::<memory_connection_limits::MemoryUsageLimitExceeded>().is_some() =>
                    {
                        OutboundFailure::DialDenied
                    }
                    _ => OutboundFailure::DialFailure,
                };
                if let Some(queue) = self.queued.remove(&peer) {
                    self.fail(peer, queue.into_iter().map(|(id, _)| id), &failure);
                }
            }
            _ => {}
        }
    }

    fn on_connection_handler_event(
        &mut self,
        peer: PeerId,
        connection_id: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        let conn = self.connected.get_mut(&peer).and_then(|c| c.iter_mut().find(|c| c.id == connection_id));
        match event {
            ToBehaviour::Request { stream, id, request } => {
                let channel = ResponseChannel { peer, connection: connection_id, stream, id };
                let message = Message::Request { request, channel };
                self.events.push_back(ToSwarm::GenerateEvent(Event::Message { peer, connection_id, message }));
            }
            ToBehaviour::Reply(id, response) => {
                if conn.is_some_and(|c| c.pending.remove(&id)) {
                    let message = Message::Response { request_id: RequestId(id), response };
                    self.events.push_back(ToSwarm::GenerateEvent(Event::Message { peer, connection_id, message }));
                }
            }
            ToBehaviour::Failed(ids, error) => {
                let Some(conn) = conn else { return };
                let ids: Vec<u64> = ids.into_iter().filter(|id| conn.pending.remove(id)).collect();
                self.fail(peer, ids, &error);
            }
            ToBehaviour::InboundFailed(error) => {
                self.events.push_back(ToSwarm::GenerateEvent(Event::InboundFailure { peer, connection_id, error }));
            }
        }
    }

    fn poll(&mut self, _: &mut Context<'_>) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        match self.events.pop_front() {
            Some(e) => Poll::Ready(e),
            None => {
                if self.events.capacity() > 1024 {
                    self.events.shrink_to(64);
                }
                Poll::Pending
            }
        }
    }
}
