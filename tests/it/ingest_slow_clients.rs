//! Slow and idle clients cannot hold the slots (a running control plane, real sockets):
//! 1,100 connections from one address trickle their request heads a byte at a time at the
//! OTLP/HTTP and the HTTP listeners while a client from another address keeps sending
//! failures, and every one of its requests is answered 200. The trickling connections beyond
//! the per-address cap are refused (counted), and the ones admitted are closed by the
//! header-read timeout. A connection that never sends a byte is closed too (HTTP: header
//! timeout; gRPC: idle timeout).
//! And the reconnecting slowloris of issue 39 (five source addresses, more tricklers than the
//! listener holds): a full listener evicts the oldest connection without a whole request head,
//! so a client posting whole requests is answered every time.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use brownout::auth::Tokens;
use brownout::config::{Config, Secret};
use brownout::plane::{App, Listeners, Running};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const INGEST: &str = "ingest-token-slow-aaaaaaaa";
const READ: &str = "read-token-slow-bbbbbbbbbb";
const TRICKLERS: usize = 1100;
const PER_IP: usize = 200;

/// Raises this process's open-file limit to its hard limit (1,100 client sockets and as many
/// server sockets live in this one process).
fn raise_nofile() {
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
        let _ = libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        assert!(
            l.rlim_cur >= 4 * TRICKLERS as u64 + 256,
            "this test needs about {} open files; the limit is {}",
            4 * TRICKLERS + 256,
            l.rlim_cur
        );
    }
}

async fn start() -> (Running, tempfile::TempDir) {
    start_with(|config| {
        config.max_connections_per_ip = PER_IP;
        config.header_read_timeout = Duration::from_secs(2);
        config.idle_timeout = Duration::from_secs(2);
    })
    .await
}

async fn start_with(f: impl FnOnce(&mut Config)) -> (Running, tempfile::TempDir) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::defaults();
    config.data_dir = dir.path().to_path_buf();
    f(&mut config);
    let tokens = Tokens::new(
        Some(Secret::new(INGEST)),
        Some(Secret::new(READ)),
        Some(Secret::new("admin-token-slow-cccccccc")),
    );
    let app = App::build(config, tokens).await.unwrap();
    let run = app.spawn(Listeners::loopback().await.unwrap(), axum::Router::new());
    (run, dir)
}

/// `n` clients that each open a connection to `addr` and send a request head one byte every
/// 200 ms (400 bytes: 80 s), reconnecting whenever the server closes or refuses it, until
/// `stop`; `closed` counts the connections the server ended.
fn trickle(
    addr: SocketAddr,
    n: usize,
    closed: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (closed, stop) = (Arc::clone(&closed), Arc::clone(&stop));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut c) = tokio::net::TcpStream::connect(addr).await else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    let head = b"POST /v1/failures HTTP/1.1\r\nhost: x\r\nx-pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
                    let mut buf = [0u8; 512];
                    for b in head.iter().cycle().take(400) {
                        if c.write_all(std::slice::from_ref(b)).await.is_err() {
                            break;
                        }
                        // Anything read (a 503) or EOF means the server is done with us.
                        if let Ok(Ok(_) | Err(_)) =
                            tokio::time::timeout(Duration::from_millis(200), c.read(&mut buf))
                                .await
                        {
                            break;
                        }
                    }
                    closed.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        })
        .collect()
}

fn metric(text: &str, line_prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {line_prefix} in /metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn trickling_connections_do_not_starve_a_legitimate_client() {
    raise_nofile();
    let (run, _dir) = start().await;
    let closed = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = trickle(
        run.otlp_http_addr,
        TRICKLERS,
        Arc::clone(&closed),
        Arc::clone(&stop),
    );
    tasks.extend(trickle(
        run.http_addr,
        TRICKLERS,
        Arc::clone(&closed),
        Arc::clone(&stop),
    ));
    // Let them connect and start trickling.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The legitimate client comes from another loopback address.
    let legit = reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut served = 0;
    // 6 s or more: three header timeouts, with the tricklers reconnecting all along.
    for i in 0..30 {
        for addr in [run.otlp_http_addr, run.http_addr] {
            let body = format!(
                "{{\"ts\":{},\"service\":\"legit\",\"message\":\"still served {i}\"}}\n",
                brownout_protocol::now_ms()
            );
            let r = legit
                .post(format!("http://{addr}/v1/failures"))
                .bearer_auth(INGEST)
                .header("content-type", "application/x-ndjson")
                .body(body)
                .send()
                .await
                .unwrap_or_else(|e| panic!("legitimate request {i} to {addr} failed: {e}"));
            assert_eq!(r.status().as_u16(), 200, "request {i} to {addr}");
            served += 1;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(served, 60);

    // Past the per-address cap, connections were refused at once; the admitted ones were
    // closed by the header-read timeout (2 s), long before their 400 bytes (80 s) were sent.
    let m = legit
        .get(format!("http://{}/metrics", run.http_addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for l in ["otlp_http", "http"] {
        let refused = metric(
            &m,
            &format!("brownout_connections_refused_total{{listener=\"{l}\"}}"),
        );
        assert!(
            refused >= (TRICKLERS - PER_IP) as f64,
            "{l}: {refused} refused"
        );
    }
    // Admitted tricklers were closed and reconnected: more closes than clients.
    assert!(
        closed.load(Ordering::Relaxed) > 2 * TRICKLERS,
        "{} closes",
        closed.load(Ordering::Relaxed)
    );
    // Once they stop reconnecting, every open one is ended by the server well before its
    // 80 s head is complete.
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("every trickling connection is closed by the server")
            .unwrap();
    }
    run.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_by_the_idle_timeout() {
    let (run, _dir) = start().await;
    for addr in [run.otlp_grpc_addr, run.http_addr] {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 64];
        // Never sends a byte: closed after the idle (gRPC) or header (HTTP) timeout of 2 s.
        let r = tokio::time::timeout(Duration::from_secs(20), c.read(&mut buf)).await;
        assert!(
            r.is_ok(),
            "{addr}: the server kept a silent connection open for 20 s"
        );
    }
    run.stop().await.unwrap();
}

/// `n` clients from `from` that each open a connection to `addr` and send a request head one
/// byte every 100 ms, never finishing it, reconnecting 50 ms after the server drops them, until
/// `stop`; `dropped` counts the connections the server ended.
fn trickle_from(
    from: Ipv4Addr,
    addr: SocketAddr,
    n: usize,
    dropped: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (dropped, stop) = (Arc::clone(&dropped), Arc::clone(&stop));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let sock = tokio::net::TcpSocket::new_v4().unwrap();
                    sock.bind(SocketAddr::from((from, 0))).unwrap();
                    let Ok(mut c) = sock.connect(addr).await else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    };
                    let head = b"POST /v1/failures HTTP/1.1\r\nhost: x\r\nx-pad: ";
                    let mut buf = [0u8; 512];
                    for b in head.iter().chain(std::iter::repeat(&b'a')) {
                        if stop.load(Ordering::Relaxed)
                            || c.write_all(std::slice::from_ref(b)).await.is_err()
                        {
                            break;
                        }
                        // Anything read (a 503), EOF or a reset: the server is done with us.
                        if let Ok(Ok(_) | Err(_)) =
                            tokio::time::timeout(Duration::from_millis(100), c.read(&mut buf)).await
                        {
                            dropped.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        })
        .collect()
}

/// The reconnecting slowloris of issue 39: five source addresses (127.0.0.2…6) × 100
/// connections trickle request heads at the OTLP/HTTP port and reconnect the moment they are
/// dropped, more than the listener holds (300, 100 per address, a header timeout longer than
/// the test). A client on 127.0.0.1 posts once a second, a whole request each time: every one
/// of its requests is answered 200, because a full listener closes the oldest connection that
/// has not sent a whole head to admit a new one. Counted: the evictions happened (the listener
/// was full) and the tricklers were dropped and came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnecting_slowloris_from_five_addresses_never_starves_a_whole_request() {
    const PER_SOURCE: usize = 100;
    let (run, _dir) = start_with(|c| {
        c.max_connections = 300;
        c.max_connections_per_ip = PER_SOURCE;
        c.header_read_timeout = Duration::from_secs(60);
    })
    .await;
    let addr = run.otlp_http_addr;
    let dropped = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for last in 2..=6u8 {
        tasks.extend(trickle_from(
            Ipv4Addr::new(127, 0, 0, last),
            addr,
            PER_SOURCE,
            Arc::clone(&dropped),
            Arc::clone(&stop),
        ));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let legit = reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::LOCALHOST))
        // A new connection for every request: each one must get past the full listener.
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut answered = 0;
    for i in 0..8 {
        let body = format!(
            "{{\"ts\":{},\"service\":\"legit\",\"message\":\"answered {i}\"}}\n",
            brownout_protocol::now_ms()
        );
        let r = legit
            .post(format!("http://{addr}/v1/failures"))
            .bearer_auth(INGEST)
            .header("content-type", "application/x-ndjson")
            .body(body)
            .send()
            .await;
        match r {
            Ok(r) if r.status().as_u16() == 200 => answered += 1,
            Ok(r) => panic!("legitimate request {i}: {}", r.status()),
            Err(e) => panic!("legitimate request {i} failed: {e}"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(answered, 8, "every legitimate request answered");
    let m = legit
        .get(format!("http://{}/metrics", run.http_addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let evicted = metric(
        &m,
        "brownout_connections_evicted_total{listener=\"otlp_http\"}",
    );
    assert!(evicted >= 200.0, "the listener was full: {evicted} evicted");
    assert!(
        dropped.load(Ordering::Relaxed) >= 200,
        "tricklers were dropped and reconnected: {}",
        dropped.load(Ordering::Relaxed)
    );
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .expect("the tricklers stop")
            .unwrap();
    }
    run.stop().await.unwrap();
}
