//! The connection handler of the transport: one connection's two streams, ours
//! (requests out, replies in) and the peer's (requests in, replies out), their
//! framing, deadlines and keep-alive (see the module's doc, `link/mod.rs`), and the
//! messages it exchanges with [`super::Behaviour`].

use std::collections::{HashSet, VecDeque};
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{AsyncRead, AsyncWrite, Future};
use libp2p::core::upgrade::ReadyUpgrade;
use libp2p::swarm::handler::{ConnectionEvent, DialUpgradeError, FullyNegotiatedInbound, FullyNegotiatedOutbound};
use libp2p::swarm::{ConnectionHandler, ConnectionHandlerEvent, Stream, StreamUpgradeError, SubstreamProtocol};
use libp2p::StreamProtocol;
use tokio::time::{Instant, Sleep};

// Up to the transport's own types (its settings and failures), which the behaviour's
// side and the handler share; nothing here names the behaviour itself.
use super::{Config, InboundFailure, OutboundFailure, MAX_INBOUND_STREAMS};
use crate::wire::{self, CodecStats, FrameError, FrameKind, Reply, Request};

/// Bytes read from a stream at a time.
const READ_CHUNK: usize = 16 * 1024;
/// Reads per stream per poll before the handler yields (and wakes itself).
const READS_PER_POLL: usize = 32;

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
    pub(super) fn new(config: Config, stats: Arc<CodecStats>) -> Self {
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
