//! What the membership costs on the wire: [`GossipCodec`], the gossip's request-response
//! codec (the CBOR of [`wire::Gossip`], as libp2p's `cbor` codec writes and reads it,
//! byte for byte), which counts every table it writes and reads, requests and replies,
//! into a [`GossipTraffic`] shared by every connection of the peer. The counts are
//! what the gossip protocol puts on its stream: the multiplexer's and the encryption's
//! framing are not counted, nor are the liveness pings (libp2p's ping, 32 bytes each
//! way per round trip; [`Counters::pings`](super::Counters::pings) counts this peer's).

use std::collections::TryReserveError;
use std::convert::Infallible;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cbor4ii::core::error::DecodeError;
use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use libp2p::request_response;
use libp2p::StreamProtocol;

use crate::wire;

/// Gossip tables written and read by one peer, with their bytes.
#[derive(Debug, Default)]
pub struct GossipTraffic {
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
    messages_out: AtomicU64,
    messages_in: AtomicU64,
}

impl GossipTraffic {
    /// (bytes out, bytes in, tables out, tables in) so far.
    pub(super) fn read(&self) -> (u64, u64, u64, u64) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (get(&self.bytes_out), get(&self.bytes_in), get(&self.messages_out), get(&self.messages_in))
    }

    fn wrote(&self, bytes: usize) {
        self.bytes_out.fetch_add(bytes as u64, Ordering::Relaxed);
        self.messages_out.fetch_add(1, Ordering::Relaxed);
    }

    fn got(&self, bytes: usize) {
        self.bytes_in.fetch_add(bytes as u64, Ordering::Relaxed);
        self.messages_in.fetch_add(1, Ordering::Relaxed);
    }
}

/// The gossip's codec: one CBOR table per stream and direction, read to the end of the
/// stream up to [`wire::MAX_GOSSIP_BYTES`], its bytes counted.
#[derive(Clone, Debug)]
pub struct GossipCodec {
    traffic: Arc<GossipTraffic>,
}

impl GossipCodec {
    pub(super) fn new(traffic: Arc<GossipTraffic>) -> Self {
        GossipCodec { traffic }
    }

    async fn read<T: AsyncRead + Unpin + Send>(&self, io: &mut T) -> io::Result<wire::Gossip> {
        let mut bytes = Vec::new();
        io.take(wire::MAX_GOSSIP_BYTES).read_to_end(&mut bytes).await?;
        self.traffic.got(bytes.len());
        cbor4ii::serde::from_slice(&bytes).map_err(decode_error)
    }

    async fn write<T: AsyncWrite + Unpin + Send>(&self, io: &mut T, table: &wire::Gossip) -> io::Result<()> {
        let bytes = cbor4ii::serde::to_vec(Vec::new(), table).map_err(encode_error)?;
        io.write_all(&bytes).await?;
        self.traffic.wrote(bytes.len());
        Ok(())
    }
}

impl request_response::Codec for GossipCodec {
    type Protocol = StreamProtocol;
    type Request = wire::Gossip;
    type Response = wire::Gossip;

    async fn read_request<T: AsyncRead + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
    ) -> io::Result<wire::Gossip> {
        self.read(io).await
    }

    async fn read_response<T: AsyncRead + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
    ) -> io::Result<wire::Gossip> {
        self.read(io).await
    }

    async fn write_request<T: AsyncWrite + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        table: wire::Gossip,
    ) -> io::Result<()> {
        self.write(io, &table).await
    }

    async fn write_response<T: AsyncWrite + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        table: wire::Gossip,
    ) -> io::Result<()> {
        self.write(io, &table).await
    }
}

/// libp2p's `cbor` codec's mapping of decoding errors, kept.
fn decode_error(err: cbor4ii::serde::DecodeError<Infallible>) -> io::Error {
    match err {
        cbor4ii::serde::DecodeError::Core(DecodeError::Read(e)) => io::Error::other(e),
        cbor4ii::serde::DecodeError::Core(e @ DecodeError::Unsupported { .. }) => {
            io::Error::new(io::ErrorKind::Unsupported, e)
        }
        cbor4ii::serde::DecodeError::Core(e @ DecodeError::Eof { .. }) => {
            io::Error::new(io::ErrorKind::UnexpectedEof, e)
        }
        cbor4ii::serde::DecodeError::Core(e) => io::Error::new(io::ErrorKind::InvalidData, e),
        cbor4ii::serde::DecodeError::Custom(e) => io::Error::other(e.to_string()),
    }
}

fn encode_error(err: cbor4ii::serde::EncodeError<TryReserveError>) -> io::Error {
    io::Error::other(err)
}

#[cfg(test)]
mod tests {
    use futures::executor::block_on;
    use libp2p::request_response::Codec as _;

    use super::*;

    /// The bytes counted are the bytes on the stream, and libp2p's own codec reads what
    /// this one writes (and the other way round): the wire is unchanged.
    #[test]
    fn counts_the_bytes_it_writes_and_reads_and_speaks_libp2p_cbor() {
        let table = wire::Gossip {
            beats: Vec::new(),
            serving: true,
            delay_ms: Some(17_000),
            leaves: vec![],
            joints: vec![],
            group: None,
            acks: false,
        };
        let traffic = Arc::new(GossipTraffic::default());
        let mut ours = GossipCodec::new(traffic.clone());
        let mut theirs = request_response::cbor::codec::Codec::<wire::Gossip, wire::Gossip>::default();
        let p = wire::GOSSIP_PROTOCOL;

        let mut buf = futures::io::Cursor::new(Vec::new());
        block_on(ours.write_request(&p, &mut buf, table.clone())).unwrap();
        let written = buf.get_ref().len();
        assert!(written > 0);
        assert_eq!(traffic.read(), (written as u64, 0, 1, 0));
        buf.set_position(0);
        assert_eq!(block_on(theirs.read_request(&p, &mut buf)).unwrap(), table);

        let mut buf = futures::io::Cursor::new(Vec::new());
        block_on(theirs.write_response(&p, &mut buf, table.clone())).unwrap();
        assert_eq!(buf.get_ref().len(), written);
        buf.set_position(0);
        assert_eq!(block_on(ours.read_response(&p, &mut buf)).unwrap(), table);
        assert_eq!(traffic.read(), (written as u64, written as u64, 1, 1));

        // Garbage is counted as read, and refused as libp2p's codec refuses it.
        let mut buf = futures::io::Cursor::new(vec![0xff, 0x00, 0x13]);
        let err = block_on(ours.read_request(&p, &mut buf)).unwrap_err();
        let mut buf = futures::io::Cursor::new(vec![0xff, 0x00, 0x13]);
        assert_eq!(err.kind(), block_on(theirs.read_request(&p, &mut buf)).unwrap_err().kind());
        assert_eq!(traffic.read(), (written as u64, written as u64 + 3, 1, 2));
    }
}
