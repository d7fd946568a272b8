//! The accept loop of the API's listeners (the control API and the metrics-only one),
//! in place of `axum::serve`, which has neither of the two bounds a listener that any
//! local process (or, for metrics, any host) can reach needs:
//!
//! - **a cap on open connections** ([`Limits::max_connections`]): a connection past it
//!   is closed on accept and counted in `sigma_http_connections_refused_total{listener}`;
//! - **a deadline for each request head** ([`Limits::header_timeout`]): a connection
//!   that does not send a complete request head within it, idle between two requests
//!   included, is closed (hyper's `header_read_timeout`) and counted in
//!   `sigma_http_connections_timed_out_total{listener}`. A request whose head arrived
//!   has no deadline here: an acquire may wait as long as its lock is held elsewhere.
//!
//! HTTP/1.1 only (what the clients speak); each connection is served by hyper with the
//! axum router as its service. Every request carries the connection's [`Peer`] as an
//! extension: on a unix socket, the connecting process's user id (`SO_PEERCRED`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use sigma_node::metrics::Metrics;

/// Default of [`Limits::max_connections`] (`--http-max-connections`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default of [`Limits::header_timeout`] (`--http-header-timeout`).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// A bound listener.
pub enum Listener {
    /// TCP (loopback for the API; any address for metrics).
    Tcp(TcpListener),
    /// A unix socket.
    Unix(UnixListener),
}

/// Who is at the other end of a request's connection, as the kernel says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peer {
    /// The connecting process's user id (unix sockets only).
    pub uid: Option<u32>,
}

/// An accepted connection.
enum Accepted {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream, Peer),
}

impl Listener {
    async fn accept(&self) -> std::io::Result<Accepted> {
        match self {
            Listener::Tcp(l) => l.accept().await.map(|(s, _)| Accepted::Tcp(s)),
            Listener::Unix(l) => l.accept().await.map(|(s, _)| {
                let uid = s.peer_cred().ok().map(|c| c.uid());
                Accepted::Unix(s, Peer { uid })
            }),
        }
    }
}

/// The bounds of one listener.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections open at once; more are closed on accept.
    pub max_connections: usize,
    /// A request head (or the next one, on a kept-alive connection) must arrive within
    /// this long.
    pub header_timeout: Duration,
}

/// Serves `router` on `listener` until `shutdown` resolves; then asks each open
/// connection to close after its request in progress and returns (the caller bounds how
/// long it waits for the rest). `listener_name` labels the metrics.
pub async fn serve(
    listener: Listener,
    router: Router,
    limits: Limits,
    listener_name: &'static str,
    metrics: Metrics,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (closing, closing_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(stream) => stream,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before accept: not
                    // the listener's end. Give the others a moment to close.
                    tracing::debug!(%e, listener = listener_name, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics.http_connection_refused(listener_name);
            drop(stream);
            continue;
        };
        let connection = Connection {
            router: router.clone(),
            limits,
            listener_name,
            metrics: metrics.clone(),
            closing: closing_rx.clone(),
        };
        connections.spawn(async move {
            let _slot = slot;
            match stream {
                Accepted::Tcp(s) => connection.serve(s, Peer::default()).await,
                Accepted::Unix(s, peer) => connection.serve(s, peer).await,
            }
        });
    }
    let _ = closing.send(true);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// What serving one connection needs.
struct Connection {
    router: Router,
    limits: Limits,
    listener_name: &'static str,
    metrics: Metrics,
    closing: watch::Receiver<bool>,
}

impl Connection {
    async fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(mut self, stream: S, peer: Peer) {
        let router = self.router;
        let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(peer);
            tower::Service::call(&mut router.clone(), request)
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(TokioTimer::new()).header_read_timeout(self.limits.header_timeout);
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let mut connection = std::pin::pin!(connection);
        let closing = &mut self.closing;
        let served = tokio::select! {
            r = connection.as_mut() => r,
            () = async { let _ = closing.wait_for(|c| *c).await; } => {
                connection.as_mut().graceful_shutdown();
                connection.await
            }
        };
        if let Err(e) = served {
            if e.is_timeout() {
                self.metrics.http_connection_timed_out(self.listener_name);
            }
            tracing::trace!(%e, listener = self.listener_name, "HTTP connection ended");
        }
    }
}
