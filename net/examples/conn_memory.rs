//! What one open connection costs the accept loop: opens N connections to a `serve_http`
//! listener in this process, each having sent part of a request head (the slowloris case, the
//! worst an idle connection gets: hyper holds its read buffer), and prints the growth of this
//! process's resident memory and of the kernel's TCP buffer memory per connection.
//!
//! `cargo run --release -p brownout-net --example conn_memory -- 10000`

use std::net::SocketAddr;
use std::time::Duration;

use brownout_net::{CappedListener, ConnLimits, OverCap, serve_http};
use tokio::io::AsyncWriteExt;

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The kernel's TCP memory in pages (`/proc/net/sockstat`, "TCP: ... mem N").
fn tcp_mem_pages() -> u64 {
    let s = std::fs::read_to_string("/proc/net/sockstat").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("TCP:"))
        .and_then(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.iter()
                .position(|x| *x == "mem")
                .and_then(|i| w.get(i + 1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let limits = ConnLimits {
        max: n + 16,
        per_ip: n + 16,
        header_read_timeout: Duration::from_secs(600),
        idle_timeout: Duration::from_secs(600),
    };
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
    let listener = CappedListener::new(l, limits, OverCap::Http503);
    tokio::spawn(serve_http(listener, app, std::future::pending()));
    // Warm the server (allocator, first connection) before the baseline.
    let mut warm = Vec::new();
    for _ in 0..16 {
        warm.push(open(addr).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (rss0, tcp0) = (rss_kib(), tcp_mem_pages());
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(open(addr).await);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (rss1, tcp1) = (rss_kib(), tcp_mem_pages());
    let per = |a: u64, b: u64, unit: u64| (b.saturating_sub(a) * unit) as f64 / n as f64;
    println!(
        "connections={n} rss_growth_kib={} per_connection_bytes={:.0} kernel_tcp_per_connection_bytes={:.0} (both ends)",
        rss1.saturating_sub(rss0),
        per(rss0, rss1, 1024),
        per(tcp0, tcp1, 4096),
    );
    drop(conns);
}

async fn open(addr: SocketAddr) -> tokio::net::TcpStream {
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(b"POST /v1/traces HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    c
}
