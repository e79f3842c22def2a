//! Ingest limits beyond body size: per-tenant item rates and a cap on open connections.
//!
//! - **Tenants**: a sender names itself with the `X-Brownout-Tenant` header (gRPC metadata
//!   `x-brownout-tenant`); without one it is `default`. Each tenant gets a GCRA bucket
//!   (`governor`) of `ingest.tenant_items_per_sec` items per second with a burst of
//!   `ingest.tenant_burst_items`. Items are spans, log records, failure events and snapshots,
//!   counted after decoding. Past the rate: `429` with `Retry-After` (gRPC `RESOURCE_EXHAUSTED`);
//!   nothing of the request is kept, so the client retries it whole.
//! - **Connections**: each listener holds at most `server.max_connections` open connections.
//!   One more is accepted and answered at once with `503` and `Retry-After: 1` (HTTP), or closed
//!   (gRPC, whose clients read that as `UNAVAILABLE` and retry), so a flood of idle connections
//!   cannot exhaust file descriptors or memory.

use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The header (and gRPC metadata key) that names the tenant.
pub const TENANT_HEADER: &str = "x-brownout-tenant";
/// The tenant of requests without the header.
pub const DEFAULT_TENANT: &str = "default";
/// Longest tenant name.
pub const MAX_TENANT_LEN: usize = 64;

/// Validates a tenant name from a header value: `None` (absent) is [`DEFAULT_TENANT`]; otherwise
/// 1–64 of `[A-Za-z0-9._-]`.
///
/// # Errors
/// A message saying what is wrong (the caller answers 400 / `INVALID_ARGUMENT`).
pub fn tenant_name(value: Option<&[u8]>) -> Result<String, String> {
    let Some(v) = value else {
        return Ok(DEFAULT_TENANT.to_string());
    };
    let ok = !v.is_empty()
        && v.len() <= MAX_TENANT_LEN
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(String::from_utf8_lossy(v).into_owned())
    } else {
        Err(format!(
            "{TENANT_HEADER} must be 1-{MAX_TENANT_LEN} characters of A-Z a-z 0-9 . _ -"
        ))
    }
}

/// Why a tenant's request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantLimitError {
    #[error(
        "tenant {tenant:?} is over its ingest rate of {rate} items/s; retry in {retry_after_secs} s"
    )]
    RateLimited {
        tenant: String,
        rate: u32,
        retry_after_secs: u32,
    },
    #[error(
        "a request of {items} items is more than tenant {tenant:?} may send at once ({burst}); send smaller batches"
    )]
    TooManyItems {
        tenant: String,
        items: u32,
        burst: u32,
    },
}

impl TenantLimitError {
    pub fn retry_after_secs(&self) -> u32 {
        match self {
            TenantLimitError::RateLimited {
                retry_after_secs, ..
            } => *retry_after_secs,
            TenantLimitError::TooManyItems { .. } => 1,
        }
    }
}

/// Per-tenant item rates (GCRA, one bucket per tenant name).
pub struct TenantLimiter {
    limiter: Option<DefaultKeyedRateLimiter<String>>,
    rate: u32,
    burst: NonZeroU32,
    checks: AtomicU64,
}

impl std::fmt::Debug for TenantLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantLimiter")
            .field("rate", &self.rate)
            .field("burst", &self.burst)
            .finish_non_exhaustive()
    }
}

impl TenantLimiter {
    /// `rate` items per second and tenant (`None`: unlimited), bursts of up to `burst`.
    pub fn new(rate: Option<NonZeroU32>, burst: NonZeroU32) -> TenantLimiter {
        TenantLimiter {
            limiter: rate.map(|r| RateLimiter::keyed(Quota::per_second(r).allow_burst(burst))),
            rate: rate.map_or(0, NonZeroU32::get),
            burst,
            checks: AtomicU64::new(0),
        }
    }

    /// Takes `items` from `tenant`'s bucket, or says why not (and takes nothing).
    ///
    /// # Errors
    /// [`TenantLimitError`] when the tenant is over its rate or the request is bigger than the
    /// burst.
    pub fn check(&self, tenant: &str, items: usize) -> Result<(), TenantLimitError> {
        let Some(lim) = &self.limiter else {
            return Ok(());
        };
        let Some(n) = u32::try_from(items).ok().and_then(NonZeroU32::new) else {
            return if items == 0 {
                Ok(())
            } else {
                Err(TenantLimitError::TooManyItems {
                    tenant: tenant.into(),
                    items: u32::MAX,
                    burst: self.burst.get(),
                })
            };
        };
        // Forget idle tenants now and then, so the map holds only the active ones.
        if self.checks.fetch_add(1, Ordering::Relaxed) % 4096 == 4095 {
            lim.retain_recent();
            lim.shrink_to_fit();
        }
        match lim.check_key_n(&tenant.to_string(), n) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                Err(TenantLimitError::RateLimited {
                    tenant: tenant.into(),
                    rate: self.rate,
                    retry_after_secs: u32::try_from(wait.as_secs() + 1).unwrap_or(u32::MAX),
                })
            }
            Err(_) => Err(TenantLimitError::TooManyItems {
                tenant: tenant.into(),
                items: n.get(),
                burst: self.burst.get(),
            }),
        }
    }

    /// Tenants with state right now (approximate).
    pub fn tracked_tenants(&self) -> usize {
        self.limiter.as_ref().map_or(0, |l| l.len())
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

/// A TCP listener that holds at most `max` open connections.
#[derive(Debug)]
pub struct CappedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    over_cap: OverCap,
    refused: prometheus::IntCounter,
    refusers: Arc<Semaphore>,
}

/// Connections over the cap being answered at the same time, at most.
const REFUSERS: usize = 64;

/// Reads what the client sent first (so that closing does not reset the connection before it
/// reads the answer), answers 503, half-closes, and drains until the client hangs up.
async fn refuse(mut stream: TcpStream) {
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
        stream.write_all(busy_response().as_bytes()),
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

const BUSY_BODY: &str = r#"{"error":{"code":"too_many_connections","message":"this listener is at its connection limit; retry later"}}"#;

fn busy_response() -> String {
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{BUSY_BODY}",
        BUSY_BODY.len()
    )
}

impl CappedListener {
    /// `refused` counts connections turned away.
    pub fn new(
        inner: TcpListener,
        max: usize,
        over_cap: OverCap,
        refused: prometheus::IntCounter,
    ) -> CappedListener {
        CappedListener {
            inner,
            permits: Arc::new(Semaphore::new(max)),
            over_cap,
            refused,
            refusers: Arc::new(Semaphore::new(REFUSERS)),
        }
    }

    /// The next connection within the cap; connections over it are answered and dropped here.
    pub async fn accept_capped(&self) -> (CappedStream, std::net::SocketAddr) {
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
            if let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() {
                return (
                    CappedStream {
                        io: stream,
                        _permit: permit,
                    },
                    addr,
                );
            }
            self.refused.inc();
            // Answering takes a task for up to ~1.5 s; at most `REFUSERS` at once, the rest are
            // closed without an answer.
            if self.over_cap == OverCap::Http503
                && let Ok(slot) = Arc::clone(&self.refusers).try_acquire_owned()
            {
                tokio::spawn(async move {
                    refuse(stream).await;
                    drop(slot);
                });
            }
        }
    }
}

impl axum::serve::Listener for CappedListener {
    type Io = CappedStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        self.accept_capped().await
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection that gives its slot back when dropped.
#[derive(Debug)]
pub struct CappedStream {
    io: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl AsyncRead for CappedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for CappedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for CappedStream {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// The listener as the stream of connections tonic serves.
pub fn incoming(
    listener: CappedListener,
) -> impl futures::Stream<Item = std::io::Result<CappedStream>> + Send + 'static {
    futures::stream::unfold(listener, |l| async move {
        let (s, _) = l.accept_capped().await;
        Some((Ok(s), l))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names_are_checked() {
        assert_eq!(tenant_name(None).unwrap(), "default");
        assert_eq!(
            tenant_name(Some(b"team-a.prod_1")).unwrap(),
            "team-a.prod_1"
        );
        for bad in [
            &b""[..],
            b"a b",
            b"x\0",
            b"\xff",
            &[b'a'; 65][..],
            b"<script>",
        ] {
            assert!(tenant_name(Some(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn buckets_are_per_tenant_and_refusals_take_nothing() {
        let l = TenantLimiter::new(NonZeroU32::new(10), NonZeroU32::new(100).unwrap());
        l.check("a", 100).unwrap();
        let e = l.check("a", 50).unwrap_err();
        assert!(
            matches!(e, TenantLimitError::RateLimited { retry_after_secs, .. } if (1..=6).contains(&retry_after_secs)),
            "{e:?}"
        );
        // Another tenant is unaffected.
        l.check("b", 100).unwrap();
        // Larger than the burst: never possible, said so.
        assert!(matches!(
            l.check("c", 101),
            Err(TenantLimitError::TooManyItems { burst: 100, .. })
        ));
        // The refused 101 took nothing from c.
        l.check("c", 100).unwrap();
        assert_eq!(l.tracked_tenants(), 3);
        // Unlimited.
        let u = TenantLimiter::new(None, NonZeroU32::new(1).unwrap());
        u.check("a", 1_000_000).unwrap();
    }
}
