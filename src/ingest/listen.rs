//! The control plane's listeners (8080 UI/API/ingest, 4318 OTLP/HTTP, 4317 OTLP/gRPC): the
//! shared accept loop of `brownout-net` (net/: connection caps per listener and per client
//! address, header-read and idle timeouts, TCP_NODELAY) with the `[server]` limits.
//!
//! - `server.max_connections` open connections per listener, `server.max_connections_per_ip`
//!   per client address; one more is answered `503` + `Retry-After: 1` (HTTP) or closed (gRPC,
//!   read by its clients as `UNAVAILABLE`) and counted in
//!   `brownout_connections_refused_total{listener}`.
//! - When a listener is full, the oldest connection that has not sent a whole request head is
//!   closed to admit the new one (counted in `brownout_connections_evicted_total{listener}`);
//!   only when every open connection has sent one is the new one refused as above.
//! - `server.header_read_timeout_ms` for an HTTP/1 request head, `server.idle_timeout_ms` for
//!   an HTTP/2 / gRPC connection that moves no byte (or one that never sends any).
//!
//! So 1,000+ trickling connections from one address hold at most the per-address cap, each for
//! at most the header timeout, and other clients keep being served
//! (`tests/it/ingest_slow_clients.rs`).

pub use brownout_net::{
    CappedListener, CappedStream, ConnLimits, OverCap, Tls, incoming, incoming_tls, serve_http,
    serve_https,
};

/// The `[server]` limits.
pub fn limits(c: &crate::config::Config) -> ConnLimits {
    ConnLimits {
        max: c.max_connections,
        per_ip: c.max_connections_per_ip,
        header_read_timeout: c.header_read_timeout,
        idle_timeout: c.idle_timeout,
    }
}

/// A listener capped at the `[server]` limits whose refusals count in
/// `brownout_connections_refused_total{listener = name}`.
pub fn capped(
    l: tokio::net::TcpListener,
    config: &crate::config::Config,
    metrics: &crate::metrics::Metrics,
    name: &str,
    over: OverCap,
) -> CappedListener {
    let refused = metrics
        .ingest
        .connections_refused_total
        .with_label_values(&[name]);
    let evicted = metrics
        .ingest
        .connections_evicted_total
        .with_label_values(&[name]);
    CappedListener::new(l, limits(config), over)
        .on_refused(move |_| refused.inc())
        .on_evicted(move |_| evicted.inc())
}
