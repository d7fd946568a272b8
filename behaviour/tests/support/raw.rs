//! A request-response codec of raw bytes, shared by the wire tests: it sends arbitrary
//! bytes as a request and reads whatever comes back (up to 64 KiB).

use std::io;

use futures::prelude::*;
use libp2p::request_response::Codec;
use libp2p::StreamProtocol;

/// Sends arbitrary bytes as a request and reads whatever comes back.
#[derive(Clone, Default)]
pub struct Raw;

async fn read_all<T: AsyncRead + Unpin + Send>(io: &mut T) -> io::Result<Vec<u8>> {
    let mut v = Vec::new();
    io.take(1 << 16).read_to_end(&mut v).await?;
    Ok(v)
}

impl Codec for Raw {
    type Protocol = StreamProtocol;
    type Request = Vec<u8>;
    type Response = Vec<u8>;

    async fn read_request<T: AsyncRead + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
    ) -> io::Result<Vec<u8>> {
        read_all(io).await
    }
    async fn read_response<T: AsyncRead + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
    ) -> io::Result<Vec<u8>> {
        read_all(io).await
    }
    async fn write_request<T: AsyncWrite + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        req: Vec<u8>,
    ) -> io::Result<()> {
        io.write_all(&req).await
    }
    async fn write_response<T: AsyncWrite + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        res: Vec<u8>,
    ) -> io::Result<()> {
        io.write_all(&res).await
    }
}
