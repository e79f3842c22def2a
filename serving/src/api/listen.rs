//! The serving tier's listener: the shared accept loop of `brownout-net` (net/: the same rules
//! as the control plane's listeners), with the 503 over the cap in the OpenAI error shape.
//!
//! - **Connection cap**: at most `--max-connections` open connections, and one client address
//!   at most `--max-connections-per-ip` of them. One more is accepted and answered at once with
//!   `503` and `Retry-After: 1`, then closed.
//! - **Header-read timeout**: an HTTP/1 connection must deliver a whole request head within
//!   `--header-read-timeout-ms`; a client trickling its headers a byte at a time is closed.
//! - **Idle timeout**: an HTTP/2 connection that moves no byte either way for
//!   `--idle-timeout-ms` is closed, and so is one that never sends a byte.
//! - TCP_NODELAY on every connection: each SSE token is a small write that must not wait for
//!   the peer's delayed ACK.
//!
//! - **Eviction when full**: a new connection takes the slot of the oldest one that has not
//!   sent a whole request head; only when every open one has is it answered 503 as above.
//! - **TLS** (`--ssl-certfile`, `--ssl-keyfile`, optional `--ssl-ca-certs` for client
//!   certificates): rustls, the files reloaded when they change.
//!
//! So trickling connections from one address hold at most the per-address cap, each for at most
//! the header timeout, and other clients keep being served (`tests/api.rs`).
//!
//! [`serve`] / [`serve_tls`] run an app behind the drain ([`super::drain`]) on that listener:
//! every mode (`serve/`), [`super::run_server`] and the in-process servers (`demo/`).

pub use brownout_net::{
    CappedListener, ConnLimits, OverCap, Tls, TlsFiles, serve_http, serve_https,
};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

use super::drain::{Drain, DrainReport};

/// After the drain, how long the listener waits for the connections to close before it
/// returns anyway.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// The 503 body over the connection cap, in the OpenAI error shape.
pub const BUSY_BODY: &str = r#"{"error":{"message":"the server is at its connection limit; retry later","type":"server_error","param":null,"code":"too_many_connections"}}"#;

/// `listener` capped at `limits`, answering over them with [`BUSY_BODY`].
pub fn capped(listener: tokio::net::TcpListener, limits: ConnLimits) -> CappedListener {
    CappedListener::new(listener, limits, OverCap::Http503).busy_body(BUSY_BODY)
}

/// Serves `app` behind the drain on the capped `listener` until `shutdown`, then drains
/// ([`Drain::run`]: the listener keeps answering meanwhile), closes the listener, and waits up to
/// [`CLOSE_WAIT`] for the connections to end. Every mode and the in-process servers (`demo/`)
/// come through here.
///
/// # Errors
/// Socket errors from the server.
pub async fn serve(
    app: Router,
    listener: TcpListener,
    limits: ConnLimits,
    drain: Arc<Drain>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<DrainReport> {
    serve_tls(app, listener, limits, None, drain, shutdown).await
}

/// [`serve`] over TLS when `tls` is `Some` (`--ssl-certfile` and friends).
///
/// # Errors
/// Socket errors from the server.
pub async fn serve_tls(
    app: Router,
    listener: TcpListener,
    limits: ConnLimits,
    tls: Option<Arc<Tls>>,
    drain: Arc<Drain>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<DrainReport> {
    let app = super::drain::layer(app, drain.clone());
    let (close_tx, close_rx) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(serve_https(
        capped(listener, limits),
        tls,
        app,
        async move {
            let _ = close_rx.await;
        },
    ));
    tokio::pin!(shutdown);
    tokio::select! {
        () = &mut shutdown => {}
        r = &mut server => {
            // The server ended by itself (it does not today: accept errors are retried).
            r.map_err(std::io::Error::other)??;
            return Ok(DrainReport::default());
        }
    }
    let report = drain.run().await;
    let _ = close_tx.send(());
    match tokio::time::timeout(CLOSE_WAIT, &mut server).await {
        Ok(r) => r.map_err(std::io::Error::other)??,
        Err(_) => {
            tracing::warn!("connections still open after the drain; closing anyway");
            server.abort();
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_answer_is_an_openai_error() {
        let v: serde_json::Value = serde_json::from_str(BUSY_BODY).unwrap();
        assert_eq!(v["error"]["code"], "too_many_connections");
        assert_eq!(v["error"]["type"], "server_error");
        assert!(v["error"]["param"].is_null());
        assert!(v["error"]["message"].as_str().unwrap().contains("retry"));
    }

    /// A trickling client holds its one slot until the header timeout; meanwhile another
    /// connection from its address is answered 503 in the OpenAI shape.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn over_the_cap_is_an_openai_503_and_a_trickler_is_timed_out() {
        use std::time::Duration;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let limits = ConnLimits {
            max: 8,
            per_ip: 1,
            header_read_timeout: Duration::from_millis(500),
            idle_timeout: Duration::from_secs(5),
        };
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_http(capped(l, limits), app, async move {
            let _ = stop_rx.await;
        }));
        let get = || async {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut out = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out)).await;
            String::from_utf8_lossy(&out).into_owned()
        };
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HT").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let busy = get().await;
        assert!(busy.starts_with("HTTP/1.1 503"), "{busy}");
        let body = busy.split("\r\n\r\n").nth(1).unwrap_or_default();
        assert_eq!(body, BUSY_BODY);
        // The header timeout closes the trickler; its slot is back.
        let mut buf = [0u8; 64];
        let r = tokio::time::timeout(Duration::from_secs(10), slow.read(&mut buf)).await;
        assert!(r.is_ok(), "the trickler was kept past the header timeout");
        let ok = get().await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        let _ = stop_tx.send(());
        server.await.unwrap().unwrap();
    }
}
