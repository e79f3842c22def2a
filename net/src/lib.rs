//! The accept loop every brownout listener uses (the control plane's 8080 UI/API/ingest, 4318
//! OTLP/HTTP and 4317 OTLP/gRPC ports, and the serving tier's OpenAI-compatible port), so that
//! slow, idle or numerous clients cannot exhaust it.
//!
//! - **Connection cap**: a [`CappedListener`] holds at most [`ConnLimits::max`] open
//!   connections, and one client address at most [`ConnLimits::per_ip`] of them. One more (over
//!   its address's cap, or with the listener full and nothing to evict, below) is accepted and
//!   answered at once with `503` and `Retry-After: 1` ([`OverCap::Http503`], the
//!   JSON body set with [`CappedListener::busy_body`]), or closed ([`OverCap::Close`]: gRPC,
//!   whose clients read that as `UNAVAILABLE` and retry), and reported to
//!   [`CappedListener::on_refused`].
//! - **Eviction when full** (module `evict`): a connection that finds the listener full takes
//!   the slot of the oldest open connection that has not yet sent a whole request head (HTTP/1:
//!   its blank line; HTTP/2: a `HEADERS` frame with `END_HEADERS`; behind TLS the handshake
//!   counts as not yet), which is closed at once ([`CappedListener::on_evicted`]). Only when
//!   every open connection has sent a head is the new one refused as above. So a client that
//!   sends a whole request promptly is admitted however many slow ones hold the listener.
//! - **Header-read timeout**: an HTTP/1 connection waiting for a request head (a new one, or
//!   an idle keep-alive one) must deliver the whole head within
//!   [`ConnLimits::header_read_timeout`] (hyper's `header_read_timeout`, with a timer —
//!   [`serve_http`]); a client trickling its headers a byte at a time is closed after it.
//! - **Idle timeout**: an HTTP/2 (and gRPC) connection that moves no byte either way for
//!   [`ConnLimits::idle_timeout`] is closed, and so is one that never sends a byte; HTTP/2 has
//!   no header timeout.
//! - **`TCP_NODELAY`** on every accepted connection: small writes (an SSE token, a gRPC answer)
//!   do not wait for the peer's delayed ACK.
//!
//! So 1,000+ trickling connections from one address hold at most the per-address cap, each for
//! at most the header timeout, and other clients keep being served (this crate's tests, the
//! control plane's `tests/it/ingest_slow_clients.rs`, the serving tier's `tests/api.rs`).
//!
//! Feature `tonic`: [`CappedStream`] is a tonic connection and [`incoming`] turns the listener
//! into the stream `tonic::transport::Server::serve_with_incoming_shutdown` takes.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

mod evict;
pub use evict::Slot;
use evict::{HeadWatch, Registry};
#[cfg(feature = "tls")]
mod tls;
#[cfg(all(feature = "tls", feature = "tonic"))]
pub use tls::incoming_tls;
#[cfg(feature = "tls")]
pub use tls::{Tls, TlsFiles, client_config};

/// The limits of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Open connections on the listener, at most.
    pub max: usize,
    /// Open connections from one client address, at most.
    pub per_ip: usize,
    /// The whole HTTP/1 request head must arrive within this.
    pub header_read_timeout: Duration,
    /// An HTTP/2 connection (or one that never sent a byte) that moves nothing for this long
    /// is closed.
    pub idle_timeout: Duration,
}

/// The default [`ConnLimits::max`]: 16,384 connections. One open connection that sent part of a
/// request head (the most an idle one holds: hyper's read buffer, the task, the slot) costs
/// about 17.6 KiB of the process's memory (`examples/conn_memory.rs`, docs/BENCHMARKS.md), so
/// a listener filled with slowloris connections holds about 290 MiB, and needs as many file
/// descriptors (`ulimit -n` at least the sum over the process's listeners, plus its own).
pub const DEFAULT_MAX_CONNECTIONS: usize = 16_384;

impl Default for ConnLimits {
    /// [`DEFAULT_MAX_CONNECTIONS`] connections, 256 per address, 10 s for a request head, 60 s
    /// idle.
    fn default() -> Self {
        ConnLimits {
            max: DEFAULT_MAX_CONNECTIONS,
            per_ip: 256,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// What a listener does with a connection over its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverCap {
    /// Answer `503 Service Unavailable` with `Retry-After: 1`, then close.
    Http503,
    /// Close at once (HTTP/2-only gRPC clients could not read an HTTP/1.1 answer).
    Close,
}

/// Open connections per client address.
type PerIp = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// Called with the client's address for each connection turned away over a cap.
type OnRefused = Arc<dyn Fn(SocketAddr) + Send + Sync>;

/// A TCP listener that holds at most `max` open connections, `per_ip` per client address.
pub struct CappedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    per_ip: PerIp,
    limits: ConnLimits,
    over_cap: OverCap,
    busy_body: &'static str,
    on_refused: Option<OnRefused>,
    on_evicted: Option<OnRefused>,
    refusers: Arc<Semaphore>,
    registry: Arc<Registry>,
}

impl std::fmt::Debug for CappedListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CappedListener")
            .field("inner", &self.inner)
            .field("limits", &self.limits)
            .field("over_cap", &self.over_cap)
            .finish_non_exhaustive()
    }
}

/// Connections over the cap being answered at the same time, at most.
const REFUSERS: usize = 64;

/// Reads what the client sent first (so that closing does not reset the connection before it
/// reads the answer), answers 503, half-closes, and drains until the client hangs up.
async fn refuse(mut stream: TcpStream, body: &str) {
    let mut buf = vec![0u8; 16 << 10];
    let _ = tokio::time::timeout(Duration::from_millis(200), async {
        let mut seen = Vec::new();
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
            if seen.windows(4).any(|w| w == b"\r\n\r\n") || seen.len() > 64 << 10 {
                break;
            }
        }
    })
    .await;
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        stream.write_all(busy_response(body).as_bytes()),
    )
    .await;
    let _ = stream.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_millis(300), async {
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

/// The 503 body unless [`CappedListener::busy_body`] sets another.
pub const BUSY_BODY: &str = r#"{"error":{"code":"too_many_connections","message":"this listener is at its connection limit; retry later"}}"#;

fn busy_response(body: &str) -> String {
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// One connection of an address, given back when dropped.
#[derive(Debug)]
struct IpSlot {
    map: PerIp,
    ip: IpAddr,
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        if let Ok(mut m) = self.map.lock()
            && let Some(n) = m.get_mut(&self.ip)
        {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

fn take_ip_slot(map: &PerIp, ip: IpAddr, per_ip: usize) -> Option<IpSlot> {
    let mut m = map.lock().ok()?;
    let n = m.entry(ip).or_insert(0);
    if *n >= per_ip {
        return None;
    }
    *n += 1;
    Some(IpSlot {
        map: Arc::clone(map),
        ip,
    })
}

impl CappedListener {
    /// Caps `inner` at `limits` (`max` and `per_ip` at least 1); over them, `over_cap`.
    pub fn new(inner: TcpListener, limits: ConnLimits, over_cap: OverCap) -> CappedListener {
        CappedListener {
            inner,
            permits: Arc::new(Semaphore::new(limits.max.max(1))),
            per_ip: PerIp::default(),
            limits,
            over_cap,
            busy_body: BUSY_BODY,
            on_refused: None,
            on_evicted: None,
            refusers: Arc::new(Semaphore::new(REFUSERS)),
            registry: Arc::default(),
        }
    }

    /// The JSON body of the 503 ([`OverCap::Http503`]); [`BUSY_BODY`] unless set.
    #[must_use]
    pub fn busy_body(mut self, body: &'static str) -> CappedListener {
        self.busy_body = body;
        self
    }

    /// Calls `f` with the client's address for each connection turned away (a counter).
    #[must_use]
    pub fn on_refused(mut self, f: impl Fn(SocketAddr) + Send + Sync + 'static) -> CappedListener {
        self.on_refused = Some(Arc::new(f));
        self
    }

    /// Calls `f` with the address of each connection evicted to make room for a new one
    /// (module `evict`: the oldest that has not completed a request head).
    #[must_use]
    pub fn on_evicted(mut self, f: impl Fn(SocketAddr) + Send + Sync + 'static) -> CappedListener {
        self.on_evicted = Some(Arc::new(f));
        self
    }

    /// Open connections that have not completed a request head (the ones eviction takes).
    pub fn unproven(&self) -> usize {
        self.registry.unproven()
    }

    /// The listener's limits.
    pub fn limits(&self) -> ConnLimits {
        self.limits
    }

    /// The next connection within the caps; connections over them are answered and dropped here.
    pub async fn accept_capped(&self) -> (CappedStream, SocketAddr) {
        loop {
            let (stream, addr) = match self.inner.accept().await {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let ip = take_ip_slot(&self.per_ip, addr.ip(), self.limits.per_ip);
            if let Some(ip) = ip {
                // A free slot, else the one of the oldest connection that has not completed a
                // request head.
                let permit = match Arc::clone(&self.permits).try_acquire_owned() {
                    Ok(p) => Some(p),
                    Err(_) => {
                        let p = self.registry.evict_oldest();
                        if p.is_some() {
                            tracing::debug!(client = %addr, "evicted the oldest unproven connection");
                            if let Some(f) = &self.on_evicted {
                                f(addr);
                            }
                        }
                        p
                    }
                };
                if let Some(permit) = permit {
                    let _ = stream.set_nodelay(true);
                    let h2_only = self.over_cap == OverCap::Close;
                    let slot = self.registry.admit(permit);
                    return (
                        CappedStream::new(stream, slot, ip, self.limits, h2_only),
                        addr,
                    );
                }
            }
            tracing::debug!(client = %addr, "connection over the cap refused");
            if let Some(f) = &self.on_refused {
                f(addr);
            }
            // Answering takes a task for up to ~1.5 s; at most `REFUSERS` at once, the rest are
            // closed without an answer.
            if self.over_cap == OverCap::Http503
                && let Ok(slot) = Arc::clone(&self.refusers).try_acquire_owned()
            {
                let body = self.busy_body;
                tokio::spawn(async move {
                    refuse(stream, body).await;
                    drop(slot);
                });
            }
        }
    }
}

impl axum::serve::Listener for CappedListener {
    type Io = CappedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        self.accept_capped().await
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection that gives its slots back when dropped and, when it speaks HTTP/2, fails its
/// reads once it has moved no byte for the idle timeout. (HTTP/1 connections are left to
/// hyper's header-read timeout, which also covers idle keep-alive connections; an idle timer
/// there would cut a long request whose answer is still being computed.)
#[derive(Debug)]
pub struct CappedStream {
    io: TcpStream,
    /// The listener slot (its permit inside) and the eviction flag.
    slot: Arc<Slot>,
    /// Scans the bytes read for the end of the first request head; `None` once taken by a
    /// layer above (TLS: [`CappedStream::take_watch`]).
    watch: Option<HeadWatch>,
    _ip: IpSlot,
    idle_for: Duration,
    idle: Pin<Box<tokio::time::Sleep>>,
    /// `None` until the first bytes say which protocol this is.
    idle_on: Option<bool>,
    /// How much of the HTTP/2 preface the first bytes matched so far.
    preface_seen: usize,
}

/// What an HTTP/2 connection sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

impl CappedStream {
    fn new(io: TcpStream, slot: Arc<Slot>, ip: IpSlot, l: ConnLimits, h2_only: bool) -> Self {
        CappedStream {
            io,
            watch: Some(HeadWatch::new(Arc::clone(&slot))),
            slot,
            _ip: ip,
            idle_for: l.idle_timeout,
            idle: Box::pin(tokio::time::sleep(l.idle_timeout)),
            idle_on: h2_only.then_some(true),
            preface_seen: 0,
        }
    }

    /// The client's address.
    pub fn peer_addr(&self) -> std::io::Result<SocketAddr> {
        self.io.peer_addr()
    }

    /// Takes the head scan, for a layer above that sees the plaintext (TLS): wrap that layer's
    /// stream in [`Watched`] with it. This stream stops scanning what it reads.
    pub fn take_watch(&mut self) -> Watch {
        Watch(self.watch.take())
    }

    fn progressed(&mut self) {
        let at = tokio::time::Instant::now() + self.idle_for;
        self.idle.as_mut().reset(at);
    }

    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        // Undecided (nothing read yet) counts as idle too: a connection that never sends a
        // byte is closed after the idle timeout.
        self.idle_on != Some(false) && self.idle.as_mut().poll(cx).is_ready()
    }

    /// What a write that returned `r` means here: bytes moved are progress and go to the head
    /// scan (`written(n)`: the start of them); a pending write past the idle timeout fails.
    fn after_write<'a>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<std::io::Result<usize>>,
        written: impl FnOnce(usize) -> &'a [u8],
    ) -> Poll<std::io::Result<usize>> {
        match r {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.progressed();
                    if let Some(w) = self.watch.as_mut() {
                        w.wrote(written(n));
                    }
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending if self.idle_expired(cx) => Poll::Ready(Err(idle_error())),
            other => other,
        }
    }
}

impl Drop for CappedStream {
    fn drop(&mut self) {
        self.slot.release();
    }
}

fn evicted_error() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "evicted: the listener was full and this connection had not sent a request head",
    )
}

/// A connection's head scan, moved above a TLS layer ([`CappedStream::take_watch`]).
#[derive(Debug)]
pub struct Watch(Option<HeadWatch>);

/// A stream (a TLS session over a [`CappedStream`]) whose plaintext is scanned for the end of
/// the first request head, so that the connection becomes safe from eviction once it sent one.
#[derive(Debug)]
pub struct Watched<S> {
    io: S,
    watch: Watch,
}

impl<S> Watched<S> {
    /// `io` scanned with `watch`.
    pub fn new(io: S, watch: Watch) -> Self {
        Watched { io, watch }
    }

    /// The stream inside.
    pub fn get_ref(&self) -> &S {
        &self.io
    }

    /// Shows the head scan what a write that returned `r` wrote (`written(n)`: the start of it).
    fn after_write<'a>(
        &mut self,
        r: Poll<std::io::Result<usize>>,
        written: impl FnOnce(usize) -> &'a [u8],
    ) -> Poll<std::io::Result<usize>> {
        if let Poll::Ready(Ok(n)) = r
            && let Some(w) = self.watch.0.as_mut()
        {
            w.wrote(written(n));
        }
        r
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r
            && let Some(w) = self.watch.0.as_mut()
        {
            w.feed(&buf.filled()[before..]);
        }
        r
    }
}

/// The `AsyncWrite` methods both wrappers ([`Watched`], [`CappedStream`]) pass straight to their
/// `io`: flush, shutdown and whether vectored writes are native. A macro, since these are trait
/// methods.
macro_rules! forward_to_io {
    () => {
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.io).poll_flush(cx)
        }
        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.io).poll_shutdown(cx)
        }
        fn is_write_vectored(&self) -> bool {
            self.io.is_write_vectored()
        }
    };
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.after_write(r, |n| &buf[..n])
    }
    forward_to_io!();
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.after_write(r, |n| first_written(bufs, n))
    }
}

/// The start of what a vectored write of `n` bytes wrote: its first non-empty buffer, cut to `n`.
fn first_written<'a>(bufs: &'a [std::io::IoSlice<'_>], n: usize) -> &'a [u8] {
    bufs.iter()
        .find(|b| !b.is_empty())
        .map_or(&[][..], |b| &b[..b.len().min(n)])
}

fn idle_error() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "connection idle past its idle timeout",
    )
}

impl AsyncRead for CappedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.slot.evicted(cx) {
            return Poll::Ready(Err(evicted_error()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let got = &buf.filled()[before..];
                if !got.is_empty() {
                    if let Some(w) = self.watch.as_mut() {
                        w.feed(got);
                    }
                    if self.idle_on.is_none() {
                        let rest = &H2_PREFACE[self.preface_seen..];
                        let n = got.len().min(rest.len());
                        if got[..n] != rest[..n] {
                            self.idle_on = Some(false);
                        } else {
                            self.preface_seen += n;
                            if self.preface_seen == H2_PREFACE.len() {
                                self.idle_on = Some(true);
                            }
                        }
                    }
                    self.progressed();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if self.idle_expired(cx) => Poll::Ready(Err(idle_error())),
            other => other,
        }
    }
}

impl AsyncWrite for CappedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.slot.evicted(cx) {
            return Poll::Ready(Err(evicted_error()));
        }
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.after_write(cx, r, |n| &buf[..n])
    }

    forward_to_io!();

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.after_write(cx, r, |n| first_written(bufs, n))
    }
}

#[cfg(feature = "tonic")]
impl tonic::transport::server::Connected for CappedStream {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// The listener as the stream of connections tonic serves.
#[cfg(feature = "tonic")]
pub fn incoming(
    listener: CappedListener,
) -> impl futures::Stream<Item = std::io::Result<CappedStream>> + Send + 'static {
    futures::stream::unfold(listener, |l| async move {
        let (s, _) = l.accept_capped().await;
        Some((Ok(s), l))
    })
}

/// Resolves on the first SIGTERM (what Kubernetes sends on a rollout, a scale-in or a node
/// drain) or SIGINT (Ctrl-C): the `shutdown` future the binaries give [`serve_http`] and their
/// own drains.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { () = ctrl_c => {}, () = term => {} }
    tracing::info!("shutdown signal received");
}

/// Serves `router` on `listener` (HTTP/1 and HTTP/2) until `shutdown` resolves, then lets open
/// connections finish their requests (graceful) and returns when they have. Unlike
/// `axum::serve`, hyper gets a timer, so the header-read timeout applies.
///
/// # Errors
/// Never today (accept errors are retried); the `Result` matches the other servers.
pub async fn serve_http(
    listener: CappedListener,
    router: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_http_inner(listener, None, router, shutdown).await
}

/// [`serve_http`] over TLS when `tls` is `Some` (feature `tls`): each connection's handshake
/// runs in its task, within the header-read timeout; a failed one closes the connection.
///
/// # Errors
/// Never today, as [`serve_http`].
#[cfg(feature = "tls")]
pub async fn serve_https(
    listener: CappedListener,
    tls: Option<Arc<Tls>>,
    router: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_http_inner(listener, tls, router, shutdown).await
}

#[cfg(not(feature = "tls"))]
type MaybeTls = Option<std::convert::Infallible>;
#[cfg(feature = "tls")]
type MaybeTls = Option<Arc<Tls>>;

async fn serve_http_inner(
    listener: CappedListener,
    tls: MaybeTls,
    router: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;
    use tower::ServiceExt;

    let limits = listener.limits();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Each connection task holds a clone; `closed()` resolves when all have ended.
    let (open_tx, open_rx) = tokio::sync::watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let (mut io, _addr) = tokio::select! {
            c = listener.accept_capped() => c,
            () = &mut shutdown => break,
        };
        let svc = TowerToHyperService::new(router.clone().map_request(
            |r: axum::http::Request<hyper::body::Incoming>| r.map(axum::body::Body::new),
        ));
        let mut stop = stop_rx.clone();
        let open = open_rx.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let mut b = Builder::new(TokioExecutor::new());
            b.http1()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            b.http2().timer(TokioTimer::new());
            macro_rules! serve {
                ($io:expr) => {{
                    let conn = b.serve_connection_with_upgrades(TokioIo::new($io), svc);
                    tokio::pin!(conn);
                    loop {
                        tokio::select! {
                            r = conn.as_mut() => {
                                if let Err(e) = r {
                                    tracing::trace!(error = %e, "connection ended");
                                }
                                break;
                            }
                            _ = stop.changed() => conn.as_mut().graceful_shutdown(),
                        }
                    }
                }};
            }
            match tls {
                None => serve!(io),
                #[cfg(feature = "tls")]
                Some(tls) => {
                    let watch = io.take_watch();
                    match tokio::time::timeout(limits.header_read_timeout, tls.accept(io)).await {
                        Ok(Ok(t)) => serve!(Watched::new(t, watch)),
                        Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!("TLS handshake timed out"),
                    }
                }
                #[cfg(not(feature = "tls"))]
                Some(never) => match never {},
            }
            drop(open);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(open_rx);
    open_tx.closed().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_address_slots_are_counted_and_given_back() {
        let map = PerIp::default();
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let s1 = take_ip_slot(&map, a, 2).unwrap();
        let s2 = take_ip_slot(&map, a, 2).unwrap();
        assert!(take_ip_slot(&map, a, 2).is_none());
        let other = take_ip_slot(&map, b, 2).unwrap();
        drop(s1);
        let s3 = take_ip_slot(&map, a, 2).unwrap();
        drop((s2, s3, other));
        assert!(map.lock().unwrap().is_empty(), "no entry left behind");
    }
}

#[cfg(test)]
mod serve_tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(from: [u8; 4], addr: SocketAddr) -> String {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(SocketAddr::from((from, 0))).unwrap();
        let mut c = sock.connect(addr).await.unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tricklers_are_capped_per_address_and_timed_out_while_others_are_served() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let limits = ConnLimits {
            max: 16,
            per_ip: 2,
            header_read_timeout: Duration::from_millis(500),
            idle_timeout: Duration::from_secs(5),
        };
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let refused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&refused);
        let listener = CappedListener::new(l, limits, OverCap::Http503)
            .busy_body(r#"{"error":{"code":"too_many_connections","type":"server_error"}}"#)
            .on_refused(move |_| {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            });
        let server = tokio::spawn(serve_http(listener, app, async move {
            let _ = stop_rx.await;
        }));
        // Two connections from 127.0.0.1 trickle a head; a third from there is refused.
        let mut slow = Vec::new();
        for _ in 0..2 {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(b"GET / HT").await.unwrap();
            slow.push(c);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let third = get([127, 0, 0, 1], addr).await;
        assert!(third.starts_with("HTTP/1.1 503"), "{third}");
        assert!(third.contains("too_many_connections"), "{third}");
        assert!(
            third.contains("server_error"),
            "the listener's own body: {third}"
        );
        assert!(third.contains("retry-after: 1"), "{third}");
        assert_eq!(refused.load(std::sync::atomic::Ordering::Relaxed), 1);
        // Another address is served meanwhile.
        let other = get([127, 0, 0, 2], addr).await;
        assert!(other.starts_with("HTTP/1.1 200"), "{other}");
        // The header-read timeout closes the tricklers.
        for mut c in slow {
            let mut buf = [0u8; 256];
            let r = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf)).await;
            assert!(
                r.is_ok(),
                "a trickling connection was kept past the header timeout"
            );
        }
        // Their slots are back.
        let again = get([127, 0, 0, 1], addr).await;
        assert!(again.starts_with("HTTP/1.1 200"), "{again}");
        let _ = stop_tx.send(());
        server.await.unwrap().unwrap();
    }
}

#[cfg(test)]
mod evict_tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn connect(from: [u8; 4], addr: SocketAddr) -> TcpStream {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(SocketAddr::from((from, 0))).unwrap();
        sock.connect(addr).await.unwrap()
    }

    async fn answer(mut c: TcpStream) -> String {
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    async fn post(from: [u8; 4], addr: SocketAddr, path: &str) -> String {
        let mut c = connect(from, addr).await;
        c.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        answer(c).await
    }

    /// A listener full of trickling connections from four addresses still admits a client
    /// that sends a whole head, every time; a connection whose head is in (its answer still
    /// being computed) is never the one evicted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_listener_evicts_unfinished_heads_oldest_first_never_a_whole_request() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let limits = ConnLimits {
            max: 8,
            per_ip: 4,
            header_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
        };
        let app = axum::Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .route(
                "/slow",
                axum::routing::get(|| async {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    "slow ok"
                }),
            );
        let evicted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&evicted);
        let listener = CappedListener::new(l, limits, OverCap::Http503).on_evicted(move |_| {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_http(listener, app, async move {
            let _ = stop_rx.await;
        }));
        // A whole request whose answer takes 1.5 s: proven, it holds its slot throughout.
        let mut slow = connect([127, 0, 0, 1], addr).await;
        slow.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        // 16 trickling heads from four addresses, 7 slots left: the listener is full.
        let mut tricklers = Vec::new();
        for a in 2..6u8 {
            for _ in 0..4 {
                let mut c = connect([127, 0, 0, a], addr).await;
                c.write_all(b"POST / HTTP/1.1\r\nhost: x\r\n")
                    .await
                    .unwrap();
                tricklers.push(c);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let after_flood = evicted.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            after_flood,
            16 - 7,
            "each trickler over the cap evicted an older one"
        );
        // The oldest tricklers were the ones evicted: they read EOF or an error at once.
        for c in tricklers.iter_mut().take(16 - 7) {
            let mut b = [0u8; 64];
            let r = tokio::time::timeout(Duration::from_secs(2), c.read(&mut b)).await;
            assert!(
                matches!(r, Ok(Ok(0) | Err(_))),
                "an old trickler was not evicted: {r:?}"
            );
        }
        // A client sending whole requests is answered every time.
        for _ in 0..5 {
            let r = post([127, 0, 0, 1], addr, "/").await;
            assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        }
        // The connection with a whole request in was never evicted.
        let r = answer(slow).await;
        assert!(
            r.starts_with("HTTP/1.1 200") && r.ends_with("slow ok"),
            "{r}"
        );
        drop(tricklers);
        let _ = stop_tx.send(());
        server.await.unwrap().unwrap();
    }

    /// A client that sends one whole request, reads its answer and then trickles the next head
    /// on the same keep-alive connection is unproven again, and evicted like other tricklers;
    /// one that sends its next request whole is answered on the same connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_keep_alive_connection_trickling_its_next_head_is_evicted() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let limits = ConnLimits {
            max: 4,
            per_ip: 4,
            header_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
        };
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let listener = CappedListener::new(l, limits, OverCap::Http503);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_http(listener, app, async move {
            let _ = stop_rx.await;
        }));
        async fn one_answer(c: &mut TcpStream) -> String {
            let mut got = Vec::new();
            let mut b = [0u8; 256];
            while !String::from_utf8_lossy(&got).ends_with("ok") {
                let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut b))
                    .await
                    .expect("an answer within 5 s")
                    .unwrap();
                assert!(n > 0, "closed before answering");
                got.extend_from_slice(&b[..n]);
            }
            String::from_utf8_lossy(&got).into_owned()
        }
        // A keep-alive client that behaves: two whole requests on one connection.
        let mut good = connect([127, 0, 0, 1], addr).await;
        for _ in 0..2 {
            good.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .unwrap();
            assert!(one_answer(&mut good).await.starts_with("HTTP/1.1 200"));
        }
        drop(good);
        // The attacker: one whole request, its answer, then a trickled second head.
        let mut sly = connect([127, 0, 0, 2], addr).await;
        sly.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        assert!(one_answer(&mut sly).await.starts_with("HTTP/1.1 200"));
        sly.write_all(b"GET / HTTP/1.1\r\nhost").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Three plain tricklers fill the listener; the sly one is the oldest unproven.
        let mut tricklers = Vec::new();
        for _ in 0..3 {
            let mut c = connect([127, 0, 0, 3], addr).await;
            c.write_all(b"POST / HTTP/1.1\r\n").await.unwrap();
            tricklers.push(c);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // A whole request gets in, taking the sly connection's slot.
        let r = post([127, 0, 0, 4], addr, "/").await;
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        let mut b = [0u8; 64];
        let r = tokio::time::timeout(Duration::from_secs(2), sly.read(&mut b)).await;
        assert!(
            matches!(r, Ok(Ok(0) | Err(_))),
            "the keep-alive trickler was not evicted: {r:?}"
        );
        // The tricklers that came after it are still open (nothing else was needed).
        for c in &mut tricklers {
            let r = tokio::time::timeout(Duration::from_millis(200), c.read(&mut b)).await;
            assert!(r.is_err(), "a newer trickler was evicted first: {r:?}");
        }
        drop(tricklers);
        let _ = stop_tx.send(());
        server.await.unwrap().unwrap();
    }
}
