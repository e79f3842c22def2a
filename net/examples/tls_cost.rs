//! What TLS costs a listener: the same axum app served by `serve_http` (plaintext) and
//! `serve_https` (rustls, ring, TLS 1.3) in this process, driven by raw HTTP/1.1 clients.
//!
//! - **Handshake**: `--conns` sequential connections, each one POST then close (a new
//!   exporter connection): mean time per connection.
//! - **Steady state**: `--streams` keep-alive connections in parallel, each POSTing
//!   `--requests` bodies of `--body` bytes (an OTLP export batch): requests/s.
//!
//! Plaintext and TLS runs alternate (`--rounds`), in the same session; the ratios TLS/plaintext
//! are printed per round.
//!
//! `cargo run --release -p brownout-net --features tls --example tls_cost`

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use brownout_net::{CappedListener, ConnLimits, OverCap, Tls, TlsFiles, serve_https};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

fn arg(name: &str, default: usize) -> usize {
    let a: Vec<String> = std::env::args().collect();
    a.iter()
        .position(|x| x == name)
        .and_then(|i| a.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, req: &[u8], buf: &mut Vec<u8>) {
    s.write_all(req).await.unwrap();
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before the answer");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            assert!(head.starts_with("http/1.1 200"), "{head}");
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return;
            }
        }
    }
}

enum Conn {
    Plain(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
}

async fn connect(addr: SocketAddr, tls: Option<&tokio_rustls::TlsConnector>) -> Conn {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    match tls {
        None => Conn::Plain(tcp),
        Some(c) => Conn::Tls(Box::new(
            c.connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await
                .unwrap(),
        )),
    }
}

async fn one(c: &mut Conn, req: &[u8], buf: &mut Vec<u8>) {
    match c {
        Conn::Plain(s) => exchange(s, req, buf).await,
        Conn::Tls(s) => exchange(s.as_mut(), req, buf).await,
    }
}

fn request(body: usize, close: bool) -> Vec<u8> {
    let mut r = format!(
        "POST / HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/x-protobuf\r\ncontent-length: {body}{}\r\n\r\n",
        if close { "\r\nconnection: close" } else { "" }
    )
    .into_bytes();
    r.extend(std::iter::repeat_n(b'x', body));
    r
}

async fn handshakes(
    addr: SocketAddr,
    tls: Option<&tokio_rustls::TlsConnector>,
    n: usize,
    body: usize,
) -> Duration {
    let req = request(body, true);
    let mut buf = Vec::new();
    let t = Instant::now();
    for _ in 0..n {
        let mut c = connect(addr, tls).await;
        one(&mut c, &req, &mut buf).await;
    }
    t.elapsed() / n as u32
}

async fn steady(
    addr: SocketAddr,
    tls: Option<tokio_rustls::TlsConnector>,
    streams: usize,
    requests: usize,
    body: usize,
) -> f64 {
    let req = Arc::new(request(body, false));
    let mut conns = Vec::new();
    for _ in 0..streams {
        conns.push(connect(addr, tls.as_ref()).await);
    }
    let t = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            let req = Arc::clone(&req);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                for _ in 0..requests {
                    one(&mut c, &req, &mut buf).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (streams * requests) as f64 / t.elapsed().as_secs_f64()
}

async fn start(tls: Option<Arc<Tls>>) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/",
        axum::routing::post(|b: axum::body::Bytes| async move { b.len().to_string() }),
    );
    tokio::spawn(serve_https(
        CappedListener::new(l, ConnLimits::default(), OverCap::Http503),
        tls,
        app,
        std::future::pending(),
    ));
    addr
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (conns, streams, requests, body, rounds) = (
        arg("--conns", 500),
        arg("--streams", 2),
        arg("--requests", 5000),
        arg("--body", 16 << 10),
        arg("--rounds", 3),
    );
    let dir = std::env::temp_dir().join(format!("brownout-tls-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(p, rcgen::KeyPair::generate().unwrap()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    std::fs::write(dir.join("cert.pem"), leaf.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    let tls = Tls::load(TlsFiles {
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
        client_ca: None,
    })
    .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(ca.der().to_vec())).unwrap();
    let mut cc = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cc.alpn_protocols = vec![b"http/1.1".to_vec()];
    // No session resumption: every connection pays a full handshake (the worst case).
    cc.resumption = rustls::client::Resumption::disabled();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cc));
    let plain = start(None).await;
    let secure = start(Some(tls)).await;
    println!(
        "conns={conns} streams={streams} requests={requests} body={body} (ECDSA P-256 certificate, TLS 1.3, no resumption)"
    );
    for r in 0..rounds {
        let hp = handshakes(plain, None, conns, body).await;
        let ht = handshakes(secure, Some(&connector), conns, body).await;
        let sp = steady(plain, None, streams, requests, body).await;
        let st = steady(secure, Some(connector.clone()), streams, requests, body).await;
        println!(
            "round {r}: new connection + 1 POST: plaintext {:.0} µs, TLS {:.0} µs (TLS/plaintext time {:.2}); keep-alive: plaintext {sp:.0} req/s, TLS {st:.0} req/s (TLS/plaintext rate {:.2})",
            hp.as_secs_f64() * 1e6,
            ht.as_secs_f64() * 1e6,
            ht.as_secs_f64() / hp.as_secs_f64(),
            st / sp
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
