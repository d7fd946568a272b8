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
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{AsyncRead, AsyncWrite, Future};
use libp2p::core::transport::PortUse;
use libp2p::core::upgrade::ReadyUpgrade;
use libp2p::core::Endpoint;
use libp2p::swarm::behaviour::PeerAddresses;
use libp2p::swarm::dial_opts::DialOpts;
use libp2p::swarm::handler::{ConnectionEvent, DialUpgradeError, FullyNegotiatedInbound, FullyNegotiatedOutbound};
use libp2p::swarm::{
    ConnectionDenied, ConnectionHandler, ConnectionHandlerEvent, ConnectionId, DialError, FromSwarm, NetworkBehaviour,
    NotifyHandler, Stream, StreamUpgradeError, SubstreamProtocol, THandler, THandlerInEvent, THandlerOutEvent, ToSwarm,
};
use libp2p::{connection_limits, memory_connection_limits, Multiaddr, PeerId, StreamProtocol};
use tokio::time::{Instant, Sleep};

use crate::wire::{self, CodecStats, FrameError, FrameKind, Reply, Request};

/// Most inbound streams kept per connection (a well-behaved peer opens one; one that
/// opens more loses the oldest).
pub const MAX_INBOUND_STREAMS: usize = 8;
/// Default bound on the requests waiting for replies per connection, and queued per peer
/// while it is dialled.
pub const DEFAULT_MAX_OUTBOUND: usize = 2048;
/// Bytes read from a stream at a time.
const READ_CHUNK: usize = 16 * 1024;
/// Reads per stream per poll before the handler yields (and wakes itself).
const READS_PER_POLL: usize = 32;

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

/// From the behaviour to a connection's handler.
#[derive(Debug)]
pub enum FromBehaviour {
    /// Send a request.
    Send(u64, Request),
    /// Answer inbound request `id` of stream `stream`.
    Respond {
        /// The inbound stream.
        stream: u64,
        /// The peer's request id.
        id: u64,
        /// The reply.
        reply: Reply,
    },
}

/// From a connection's handler to the behaviour.
#[derive(Debug)]
pub enum ToBehaviour {
    /// A request of the peer.
    Request {
        /// The inbound stream it came on.
        stream: u64,
        /// The peer's id for it.
        id: u64,
        /// The request.
        request: Request,
    },
    /// The reply to request `id`.
    Reply(u64, Reply),
    /// These requests failed.
    Failed(Vec<u64>, OutboundFailure),
    /// An inbound request went unanswered.
    InboundFailed(InboundFailure),
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

// ---------------------------------------------------------------------------------
// The connection handler

/// Bytes to write on a stream.
#[derive(Debug, Default)]
struct WriteBuf {
    buf: Vec<u8>,
    pos: usize,
    flush: bool,
}

impl WriteBuf {
    fn idle(&self) -> bool {
        self.pos >= self.buf.len() && !self.flush
    }

    fn clear(&mut self) {
        *self = WriteBuf::default();
    }

    /// Writes what it holds; `Ready(Ok)`: all written and flushed.
    fn poll_write(&mut self, stream: &mut Stream, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.pos < self.buf.len() {
            match Pin::new(&mut *stream).poll_write(cx, &self.buf[self.pos..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    self.pos += n;
                    self.flush = true;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.buf.clear();
        self.pos = 0;
        if self.buf.capacity() > 4 * READ_CHUNK {
            self.buf.shrink_to(READ_CHUNK);
        }
        if self.flush {
            match Pin::new(&mut *stream).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.flush = false,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// Bytes read from a stream and not yet parsed: `buf[start..end]`. Allocated (zeroed)
/// once and grown only for a frame larger than what it holds, so a read costs no
/// zeroing; a frame is refused from its header if over its limit, which bounds it.
#[derive(Debug, Default)]
struct ReadBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl ReadBuf {
    fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start >= self.end {
            self.start = 0;
            self.end = 0;
            if self.buf.len() > 4 * READ_CHUNK {
                self.buf = Vec::new();
            }
        }
    }

    /// Reads what is ready (`Ok(0)` is the end of the stream).
    fn poll_fill(&mut self, stream: &mut Stream, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.len() - self.end < READ_CHUNK / 4 {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.buf.len() - self.end < READ_CHUNK / 4 {
                let len = (self.buf.len() * 2).max(READ_CHUNK);
                self.buf.resize(len, 0);
            }
        }
        let r = Pin::new(&mut *stream).poll_read(cx, &mut self.buf[self.end..]);
        if let Poll::Ready(Ok(n)) = r {
            self.end += n;
        }
        r
    }
}

/// A stream the peer opened: its requests in, our replies out.
struct InStream {
    no: u64,
    stream: Stream,
    read: ReadBuf,
    write: WriteBuf,
    /// The peer closed its side: the stream goes once the replies owed are written.
    eof: bool,
    /// Requests read and not answered.
    owed: usize,
}

/// What a handler's poll of a stream found.
enum Outcome {
    /// Nothing more for now.
    Fine,
    /// The stream is done with (dropped).
    Drop,
}

/// The handler of one connection: our stream (requests out, replies in) and the peer's
/// (requests in, replies out).
pub struct Handler {
    config: Config,
    stats: Arc<CodecStats>,
    out: Option<Stream>,
    opening: bool,
    unsupported: bool,
    out_write: WriteBuf,
    out_read: ReadBuf,
    /// Our requests awaiting replies; `out_due` in the order sent (= of their deadlines;
    /// entries answered meanwhile are skipped).
    waiting: HashSet<u64>,
    out_due: VecDeque<(Instant, u64)>,
    inbound: Vec<InStream>,
    next_stream: u64,
    /// The peer's requests awaiting our replies: (stream, id), and in due order.
    owed: HashSet<(u64, u64)>,
    in_due: VecDeque<(Instant, (u64, u64))>,
    timer: Option<(Instant, Pin<Box<Sleep>>)>,
    /// Kept alive until then (the last request or reply plus the linger).
    linger_until: Option<Instant>,
    events: VecDeque<ToBehaviour>,
}

impl Handler {
    fn new(config: Config, stats: Arc<CodecStats>) -> Self {
        Handler {
            config,
            stats,
            out: None,
            opening: false,
            unsupported: false,
            out_write: WriteBuf::default(),
            out_read: ReadBuf::default(),
            waiting: HashSet::new(),
            out_due: VecDeque::new(),
            inbound: Vec::new(),
            next_stream: 0,
            owed: HashSet::new(),
            in_due: VecDeque::new(),
            timer: None,
            linger_until: None,
            events: VecDeque::new(),
        }
    }

    fn busy(&self) -> bool {
        !self.waiting.is_empty()
            || !self.owed.is_empty()
            || !self.out_write.idle()
            || self.inbound.iter().any(|s| !s.write.idle())
    }

    /// Our stream failed (or was never had): every request waiting fails.
    fn fail_outbound(&mut self, error: OutboundFailure) {
        self.out = None;
        self.out_write.clear();
        self.out_read = ReadBuf::default();
        self.out_due.clear();
        let mut ids: Vec<u64> = self.waiting.drain().collect();
        ids.sort_unstable();
        if !ids.is_empty() {
            self.events.push_back(ToBehaviour::Failed(ids, error));
        }
    }

    /// Drops inbound stream `at` and what is owed on it.
    fn drop_inbound(&mut self, at: usize) {
        let s = self.inbound.remove(at);
        if s.owed > 0 {
            self.owed.retain(|(no, _)| *no != s.no);
        }
    }

    /// Writes our requests and reads their replies.
    fn poll_outbound(&mut self, cx: &mut Context<'_>) {
        let Some(stream) = self.out.as_mut() else { return };
        if let Poll::Ready(Err(e)) = self.out_write.poll_write(stream, cx) {
            tracing::debug!(%e, "sigma stream: write failed");
            return self.fail_outbound(OutboundFailure::ConnectionClosed);
        }
        for _ in 0..READS_PER_POLL {
            let Some(stream) = self.out.as_mut() else { return };
            match self.out_read.poll_fill(stream, cx) {
                Poll::Pending => return,
                Poll::Ready(Ok(0)) => return self.fail_outbound(OutboundFailure::ConnectionClosed),
                Poll::Ready(Err(e)) => {
                    tracing::debug!(%e, "sigma stream: read failed");
                    return self.fail_outbound(OutboundFailure::ConnectionClosed);
                }
                Poll::Ready(Ok(_)) => {}
            }
            let mut start = 0;
            loop {
                match wire::parse_frame(&self.out_read.data()[start..], FrameKind::Reply) {
                    Ok(None) => break,
                    Ok(Some((id, total))) => {
                        let body = &self.out_read.data()[start + wire::FRAME_HEADER..start + total];
                        start += total;
                        // A reply to a request that timed out is dropped unread.
                        if !self.waiting.contains(&id) {
                            continue;
                        }
                        match wire::decode_body::<Reply>(body) {
                            Ok(reply) => {
                                self.waiting.remove(&id);
                                self.events.push_back(ToBehaviour::Reply(id, reply));
                            }
                            Err(_) => {
                                tracing::debug!("sigma stream: a reply that does not decode");
                                return self.fail_outbound(OutboundFailure::ConnectionClosed);
                            }
                        }
                    }
                    Err(e) => {
                        tracing::debug!(?e, "sigma stream: a bad reply frame");
                        return self.fail_outbound(OutboundFailure::ConnectionClosed);
                    }
                }
            }
            self.out_read.consume(start);
        }
        cx.waker().wake_by_ref();
    }

    /// Writes our replies on inbound stream `at` and reads the peer's requests.
    fn poll_inbound(&mut self, at: usize, cx: &mut Context<'_>, now: Instant) -> Outcome {
        let s = &mut self.inbound[at];
        match s.write.poll_write(&mut s.stream, cx) {
            Poll::Ready(Err(_)) => return Outcome::Drop,
            Poll::Ready(Ok(())) if s.eof && s.owed == 0 => {
                // The peer is done and has every reply: close our side.
                return match Pin::new(&mut s.stream).poll_close(cx) {
                    Poll::Pending => Outcome::Fine,
                    Poll::Ready(_) => Outcome::Drop,
                };
            }
            _ => {}
        }
        for _ in 0..READS_PER_POLL {
            let s = &mut self.inbound[at];
            // Frames already read first (up to the bound on owed replies).
            let mut start = 0;
            loop {
                if self.owed.len() >= self.config.max_inbound {
                    break;
                }
                match wire::parse_frame(&s.read.data()[start..], FrameKind::Request) {
                    Ok(None) => break,
                    Ok(Some((id, total))) => {
                        let body = &s.read.data()[start + wire::FRAME_HEADER..start + total];
                        start += total;
                        let request = match wire::decode_body::<Request>(body) {
                            Ok(r) if !self.owed.contains(&(s.no, id)) => r,
                            _ => {
                                self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                                return Outcome::Drop;
                            }
                        };
                        self.owed.insert((s.no, id));
                        s.owed += 1;
                        self.in_due.push_back((now + self.config.request_timeout, (s.no, id)));
                        self.events.push_back(ToBehaviour::Request { stream: s.no, id, request });
                    }
                    Err(e) => {
                        let counter = match e {
                            FrameError::Oversized => &self.stats.oversized,
                            FrameError::Malformed => &self.stats.malformed,
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        return Outcome::Drop;
                    }
                }
            }
            s.read.consume(start);
            // At the bound: read no more (the peer's requests wait in the stream's
            // window) until replies go.
            if s.eof || self.owed.len() >= self.config.max_inbound {
                return Outcome::Fine;
            }
            match s.read.poll_fill(&mut s.stream, cx) {
                Poll::Pending => return Outcome::Fine,
                Poll::Ready(Ok(0)) => {
                    s.eof = true;
                    if !s.read.data().is_empty() {
                        // A frame cut short.
                        self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                        return Outcome::Drop;
                    }
                    return if s.owed == 0 && s.write.idle() { Outcome::Drop } else { Outcome::Fine };
                }
                Poll::Ready(Err(_)) => return Outcome::Drop,
                Poll::Ready(Ok(_)) => {}
            }
        }
        cx.waker().wake_by_ref();
        Outcome::Fine
    }

    /// Fails what is past its deadline; answers the next deadline.
    fn expire(&mut self, now: Instant) -> Option<Instant> {
        let expired = take_due(&mut self.out_due, &mut self.waiting, now);
        if !expired.is_empty() {
            self.events.push_back(ToBehaviour::Failed(expired, OutboundFailure::Timeout));
        }
        for key in take_due(&mut self.in_due, &mut self.owed, now) {
            if let Some(s) = self.inbound.iter_mut().find(|s| s.no == key.0) {
                s.owed -= 1;
            }
            self.events.push_back(ToBehaviour::InboundFailed(InboundFailure::Timeout));
        }
        // Busy: the linger starts again from now; else it runs out.
        if self.busy() {
            self.linger_until = Some(now + self.config.linger);
        } else if self.linger_until.is_some_and(|t| t <= now) {
            self.linger_until = None;
        }
        [self.out_due.front().map(|d| d.0), self.in_due.front().map(|d| d.0), self.linger_until]
            .into_iter()
            .flatten()
            .min()
    }
}

impl ConnectionHandler for Handler {
    type FromBehaviour = FromBehaviour;
    type ToBehaviour = ToBehaviour;
    type InboundProtocol = ReadyUpgrade<StreamProtocol>;
    type OutboundProtocol = ReadyUpgrade<StreamProtocol>;
    type InboundOpenInfo = ();
    type OutboundOpenInfo = ();

    fn listen_protocol(&self) -> SubstreamProtocol<Self::InboundProtocol, ()> {
        SubstreamProtocol::new(ReadyUpgrade::new(self.config.protocol.clone()), ())
            .with_timeout(self.config.request_timeout)
    }

    fn connection_keep_alive(&self) -> bool {
        self.busy() || self.linger_until.is_some_and(|t| Instant::now() < t)
    }

    fn on_behaviour_event(&mut self, event: FromBehaviour) {
        match event {
            FromBehaviour::Send(id, request) => {
                let error = if self.unsupported {
                    Some(OutboundFailure::UnsupportedProtocols)
                } else if self.waiting.len() >= self.config.max_outbound {
                    Some(OutboundFailure::Busy)
                } else {
                    wire::encode_frame(&mut self.out_write.buf, FrameKind::Request, id, &request)
                        .err()
                        .map(|_| OutboundFailure::TooLarge)
                };
                match error {
                    Some(e) => self.events.push_back(ToBehaviour::Failed(vec![id], e)),
                    None => {
                        self.waiting.insert(id);
                        self.out_due.push_back((Instant::now() + self.config.request_timeout, id));
                    }
                }
            }
            FromBehaviour::Respond { stream, id, reply } => {
                if !self.owed.remove(&(stream, id)) {
                    return; // timed out, or its stream is gone
                }
                let Some(s) = self.inbound.iter_mut().find(|s| s.no == stream) else { return };
                s.owed -= 1;
                if wire::encode_frame(&mut s.write.buf, FrameKind::Reply, id, &reply).is_err() {
                    tracing::warn!("a sigma reply over the frame limit was not sent");
                    self.events.push_back(ToBehaviour::InboundFailed(InboundFailure::TooLarge));
                }
            }
        }
    }

    fn on_connection_event(&mut self, event: ConnectionEvent<Self::InboundProtocol, Self::OutboundProtocol, (), ()>) {
        match event {
            ConnectionEvent::FullyNegotiatedInbound(FullyNegotiatedInbound { protocol: mut stream, .. }) => {
                if !self.config.inbound {
                    return;
                }
                stream.ignore_for_keep_alive();
                if self.inbound.len() >= MAX_INBOUND_STREAMS {
                    self.drop_inbound(0);
                }
                let no = self.next_stream;
                self.next_stream += 1;
                self.inbound.push(InStream {
                    no,
                    stream,
                    read: ReadBuf::default(),
                    write: WriteBuf::default(),
                    eof: false,
                    owed: 0,
                });
            }
            ConnectionEvent::FullyNegotiatedOutbound(FullyNegotiatedOutbound { protocol: mut stream, .. }) => {
                stream.ignore_for_keep_alive();
                self.opening = false;
                self.out = Some(stream);
            }
            ConnectionEvent::DialUpgradeError(DialUpgradeError { error, .. }) => {
                self.opening = false;
                let failure = match error {
                    StreamUpgradeError::NegotiationFailed => {
                        self.unsupported = true;
                        OutboundFailure::UnsupportedProtocols
                    }
                    StreamUpgradeError::Timeout => OutboundFailure::Timeout,
                    StreamUpgradeError::Io(_) => OutboundFailure::ConnectionClosed,
                    StreamUpgradeError::Apply(never) => match never {},
                };
                self.fail_outbound(failure);
            }
            _ => {}
        }
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<ConnectionHandlerEvent<Self::OutboundProtocol, (), Self::ToBehaviour>> {
        loop {
            if let Some(e) = self.events.pop_front() {
                return Poll::Ready(ConnectionHandlerEvent::NotifyBehaviour(e));
            }
            if self.out.is_none() && !self.opening && !self.waiting.is_empty() {
                self.opening = true;
                let protocol = SubstreamProtocol::new(ReadyUpgrade::new(self.config.protocol.clone()), ())
                    .with_timeout(self.config.request_timeout);
                return Poll::Ready(ConnectionHandlerEvent::OutboundSubstreamRequest { protocol });
            }
            self.poll_outbound(cx);
            let now = Instant::now();
            let mut at = 0;
            while at < self.inbound.len() {
                match self.poll_inbound(at, cx, now) {
                    Outcome::Fine => at += 1,
                    Outcome::Drop => self.drop_inbound(at),
                }
            }
            let next = self.expire(Instant::now());
            if !self.events.is_empty() {
                continue;
            }
            // One sleep per connection, armed for the earliest deadline while there is one.
            // A sleep armed earlier than needed is left to fire (and re-armed then): a
            // reply moves the next deadline later, and resetting on each would cost a
            // timer operation per message.
            let Some(next) = next else {
                self.timer = None;
                return Poll::Pending;
            };
            match &mut self.timer {
                Some((at, sleep)) if next < *at || sleep.is_elapsed() => {
                    sleep.as_mut().reset(next);
                    *at = next;
                }
                Some(_) => {}
                None => self.timer = Some((next, Box::pin(tokio::time::sleep_until(next)))),
            }
            if let Some((_, sleep)) = &mut self.timer {
                if sleep.as_mut().poll(cx).is_ready() {
                    continue;
                }
            }
            return Poll::Pending;
        }
    }
}

/// Takes the keys of `due` (in deadline order) that are still `live` and due at `now`
/// out of both. Entries no longer live (answered meanwhile) are dropped when they reach
/// the front, and all at once when they dominate.
fn take_due<K: Copy + Eq + std::hash::Hash>(
    due: &mut VecDeque<(Instant, K)>,
    live: &mut HashSet<K>,
    now: Instant,
) -> Vec<K> {
    let mut taken = Vec::new();
    while let Some(&(at, key)) = due.front() {
        if !live.contains(&key) {
            due.pop_front();
        } else if at <= now {
            due.pop_front();
            live.remove(&key);
            taken.push(key);
        } else {
            break;
        }
    }
    if due.len() > 2 * live.len() + 1024 {
        due.retain(|(_, key)| live.contains(key));
    }
    taken
}
