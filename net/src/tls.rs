//! TLS on a capped listener (feature `tls`, rustls with the `ring` provider).
//!
//! [`Tls::load`] reads a PEM certificate chain and private key (and optionally a PEM bundle of
//! client CAs: then every client must present a certificate signed by one of them, mutual
//! TLS). The files are checked again at most once a second as connections arrive; when one's
//! modification time or size changed, all are read again and new connections get the new
//! certificate (connections already open keep theirs). A reload that fails (a half-written
//! file) keeps the previous configuration and is logged; the next change retries.
//!
//! The handshake runs in the connection's task, under the listener's caps: it must finish
//! within the header-read timeout, and until a request head arrives *inside* the TLS session
//! the connection counts as unproven, so a slow handshake is among the first evicted. A
//! plaintext client gets no HTTP answer (rustls refuses the bytes as a bad record and the
//! connection is closed).

use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use super::*;

/// Where a listener's TLS files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM bundle of the CAs whose client certificates are accepted; `None`: no client
    /// certificate is asked for.
    pub client_ca: Option<PathBuf>,
}

/// A listener's TLS configuration, reloaded when its files change.
#[derive(Debug)]
pub struct Tls {
    files: TlsFiles,
    state: Mutex<TlsState>,
}

#[derive(Debug)]
struct TlsState {
    config: Arc<rustls::ServerConfig>,
    stamp: Vec<Option<(SystemTime, u64)>>,
    checked: Instant,
}

fn stamp(files: &TlsFiles) -> Vec<Option<(SystemTime, u64)>> {
    std::iter::once(&files.cert)
        .chain(std::iter::once(&files.key))
        .chain(files.client_ca.iter())
        .map(|p| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        })
        .collect()
}

fn read_err(what: &str, path: &Path, e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("TLS {what} {}: {e}", path.display()),
    )
}

fn server_config(files: &TlsFiles) -> std::io::Result<rustls::ServerConfig> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| read_err("certificate file", &files.cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| read_err("certificate file", &files.cert, e))?;
    if certs.is_empty() {
        return Err(read_err(
            "certificate file",
            &files.cert,
            "no CERTIFICATE in it",
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| read_err("key file", &files.key, e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in
                CertificateDer::pem_file_iter(ca).map_err(|e| read_err("client CA file", ca, e))?
            {
                let c = c.map_err(|e| read_err("client CA file", ca, e))?;
                roots
                    .add(c)
                    .map_err(|e| read_err("client CA file", ca, e))?;
            }
            if roots.is_empty() {
                return Err(read_err("client CA file", ca, "no CERTIFICATE in it"));
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| read_err("client CA file", ca, e))?;
            builder.with_client_cert_verifier(v)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| read_err("certificate and key", &files.cert, e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

impl Tls {
    /// Reads `files`.
    ///
    /// # Errors
    /// A file that cannot be read or holds no usable certificate or key; a key that does not
    /// match the certificate.
    pub fn load(files: TlsFiles) -> std::io::Result<Arc<Tls>> {
        let config = Arc::new(server_config(&files)?);
        let stamp = stamp(&files);
        Ok(Arc::new(Tls {
            files,
            state: Mutex::new(TlsState {
                config,
                stamp,
                checked: Instant::now(),
            }),
        }))
    }

    /// The configuration for a new connection (the files are checked at most once a second).
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        let mut s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if s.checked.elapsed() >= Duration::from_secs(1) {
            s.checked = Instant::now();
            let now = stamp(&self.files);
            if now != s.stamp {
                match server_config(&self.files) {
                    Ok(c) => {
                        tracing::info!(cert = %self.files.cert.display(), "TLS files changed: reloaded");
                        s.config = Arc::new(c);
                        s.stamp = now;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "TLS files changed but cannot be loaded; keeping the previous ones");
                    }
                }
            }
        }
        Arc::clone(&s.config)
    }

    /// Runs the server side of the handshake on `io`.
    ///
    /// # Errors
    /// The handshake failed (plaintext, an unknown client CA, the connection evicted).
    pub async fn accept<S>(&self, io: S) -> std::io::Result<tokio_rustls::server::TlsStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        tokio_rustls::TlsAcceptor::from(self.config())
            .accept(io)
            .await
    }
}

/// A client's TLS configuration, for the connections brownout makes itself (ClickHouse over
/// `https://`): the server is verified against the PEM bundle `ca` (a private CA: only those)
/// or, without one, against the Mozilla roots (`webpki-roots`); `client` is a PEM certificate
/// chain and its key for mutual TLS. No ALPN is set (an HTTP client's connector sets its own).
///
/// # Errors
/// A file that cannot be read or holds no certificate or key; a key that does not match.
pub fn client_config(
    ca: Option<&Path>,
    client: Option<(&Path, &Path)>,
) -> std::io::Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(ca) => {
            for c in CertificateDer::pem_file_iter(ca).map_err(|e| read_err("CA file", ca, e))? {
                let c = c.map_err(|e| read_err("CA file", ca, e))?;
                roots.add(c).map_err(|e| read_err("CA file", ca, e))?;
            }
            if roots.is_empty() {
                return Err(read_err("CA file", ca, "no CERTIFICATE in it"));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots);
    Ok(match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .map_err(|e| read_err("client certificate file", cert, e))?
                .collect::<Result<_, _>>()
                .map_err(|e| read_err("client certificate file", cert, e))?;
            if chain.is_empty() {
                return Err(read_err(
                    "client certificate file",
                    cert,
                    "no CERTIFICATE in it",
                ));
            }
            let k = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| read_err("client key file", key, e))?;
            builder
                .with_client_auth_cert(chain, k)
                .map_err(|e| read_err("client certificate and key", cert, e))?
        }
    })
}

#[cfg(feature = "tonic")]
impl tonic::transport::server::Connected
    for Watched<tokio_rustls::server::TlsStream<CappedStream>>
{
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.get_ref().get_ref().0.connect_info()
    }
}

/// The listener as the stream of TLS connections tonic serves: handshakes run in their own
/// tasks (a slow one does not hold up the others), each within `ConnLimits::header_read_timeout`.
#[cfg(feature = "tonic")]
pub fn incoming_tls(
    listener: CappedListener,
    tls: Arc<Tls>,
) -> impl futures::Stream<Item = std::io::Result<Watched<tokio_rustls::server::TlsStream<CappedStream>>>>
+ Send
+ 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let limits = listener.limits();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = tokio::select! {
                c = listener.accept_capped() => c,
                () = tx.closed() => break,
            };
            let tx = tx.clone();
            let tls = Arc::clone(&tls);
            tokio::spawn(async move {
                let watch = s.take_watch();
                match tokio::time::timeout(limits.header_read_timeout, tls.accept(s)).await {
                    Ok(Ok(t)) => {
                        let _ = tx.send(Ok(Watched::new(t, watch))).await;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!("TLS handshake timed out"),
                }
            });
        }
    });
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A test CA that signs server and client certificates.
    struct Ca(CertifiedIssuer<'static, KeyPair>);

    impl Ca {
        fn new(name: &str) -> Ca {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name
                .push(rcgen::DnType::CommonName, name.to_string());
            Ca(CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap())
        }

        /// (certificate PEM, key PEM) for `name`.
        fn leaf(&self, name: &str) -> (String, String) {
            let key = KeyPair::generate().unwrap();
            let c = CertificateParams::new(vec![name.to_string()])
                .unwrap()
                .signed_by(&key, &self.0)
                .unwrap();
            (c.pem(), key.serialize_pem())
        }

        fn roots(&self) -> rustls::RootCertStore {
            let mut r = rustls::RootCertStore::empty();
            r.add(self.0.der().clone()).unwrap();
            r
        }
    }

    fn client_config(trust: &Ca, identity: Option<(String, String)>) -> Arc<rustls::ClientConfig> {
        let b = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(trust.roots());
        let mut c = match identity {
            None => b.with_no_client_auth(),
            Some((cert, key)) => b
                .with_client_auth_cert(
                    CertificateDer::pem_slice_iter(cert.as_bytes())
                        .collect::<Result<_, _>>()
                        .unwrap(),
                    PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap(),
        };
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(c)
    }

    struct Server {
        addr: SocketAddr,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        task: tokio::task::JoinHandle<std::io::Result<()>>,
    }

    async fn serve(tls: Arc<Tls>) -> Server {
        let limits = ConnLimits {
            header_read_timeout: Duration::from_secs(2),
            ..ConnLimits::default()
        };
        serve_with(tls, limits, "ok over tls").await
    }

    /// An HTTPS server on a spare loopback port under `limits`, answering `body` at `/`.
    async fn serve_with(tls: Arc<Tls>, limits: ConnLimits, body: &'static str) -> Server {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let app = axum::Router::new().route("/", axum::routing::get(move || async move { body }));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(crate::serve_https(
            CappedListener::new(l, limits, OverCap::Http503),
            Some(tls),
            app,
            async move {
                let _ = rx.await;
            },
        ));
        Server {
            addr,
            stop: Some(tx),
            task,
        }
    }

    impl Server {
        async fn stop(mut self) {
            let _ = self.stop.take().unwrap().send(());
            self.task.await.unwrap().unwrap();
        }
    }

    /// A GET over TLS: the answer, or the error of the handshake or the exchange.
    async fn get(
        addr: SocketAddr,
        config: Arc<rustls::ClientConfig>,
    ) -> std::io::Result<(String, Vec<CertificateDer<'static>>)> {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut t = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await?;
        t.write_all(b"GET / HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
            .await?;
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), t.read_to_end(&mut out))
            .await
            .map_err(|_| std::io::Error::other("no answer in 5 s"))??;
        let peer = t
            .get_ref()
            .1
            .peer_certificates()
            .unwrap_or_default()
            .to_vec();
        Ok((String::from_utf8_lossy(&out).into_owned(), peer))
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tls_listener_serves_its_cas_clients_refuses_plaintext_and_reloads_its_certificate() {
        let dir = tempfile_dir();
        let ca = Ca::new("brownout test CA");
        let (cert, key) = ca.leaf("localhost");
        let files = TlsFiles {
            cert: write(&dir, "cert.pem", &cert),
            key: write(&dir, "key.pem", &key),
            client_ca: None,
        };
        let s = serve(Tls::load(files.clone()).unwrap()).await;
        let (answer, first) = get(s.addr, client_config(&ca, None)).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("ok over tls"), "{answer}");
        // A client of another CA does not trust the server.
        let other = Ca::new("another CA");
        let e = get(s.addr, client_config(&other, None)).await.unwrap_err();
        assert!(e.to_string().contains("certificate"), "{e}");
        // Plaintext HTTP gets no HTTP answer.
        let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out)).await;
        assert!(
            !String::from_utf8_lossy(&out).contains("HTTP/1.1"),
            "plaintext answered: {out:?}"
        );
        // A new certificate written over the files is served to new connections.
        let (cert2, key2) = ca.leaf("localhost");
        std::fs::write(&files.key, &key2).unwrap();
        std::fs::write(&files.cert, &cert2).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let (answer, now) = get(s.addr, client_config(&ca, None)).await.unwrap();
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            if now != first {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the new certificate was not picked up"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // A broken rewrite keeps the last good certificate.
        std::fs::write(&files.cert, "not a certificate").unwrap();
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let (answer, _) = get(s.addr, client_config(&ca, None)).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        s.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_a_client_ca_only_that_cas_client_certificates_get_in() {
        let dir = tempfile_dir();
        let ca = Ca::new("brownout test CA");
        let clients = Ca::new("client CA");
        let (cert, key) = ca.leaf("localhost");
        let files = TlsFiles {
            cert: write(&dir, "cert.pem", &cert),
            key: write(&dir, "key.pem", &key),
            client_ca: Some(write(&dir, "clients.pem", &clients.0.pem())),
        };
        let s = serve(Tls::load(files).unwrap()).await;
        let (answer, _) = get(
            s.addr,
            client_config(&ca, Some(clients.leaf("ingest-client"))),
        )
        .await
        .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        // No client certificate, or one of another CA: refused.
        for id in [None, Some(Ca::new("rogue CA").leaf("ingest-client"))] {
            let r = get(s.addr, client_config(&ca, id)).await;
            assert!(
                !matches!(&r, Ok((a, _)) if a.starts_with("HTTP/1.1 200")),
                "a client without a certificate of the client CA was served: {r:?}"
            );
        }
        s.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Connections stuck before or in their handshake are unproven: a full TLS listener evicts
    /// them to admit a client that completes its handshake and request.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_tls_listener_evicts_stalled_handshakes() {
        let dir = tempfile_dir();
        let ca = Ca::new("brownout test CA");
        let (cert, key) = ca.leaf("localhost");
        let tls = Tls::load(TlsFiles {
            cert: write(&dir, "cert.pem", &cert),
            key: write(&dir, "key.pem", &key),
            client_ca: None,
        })
        .unwrap();
        let limits = ConnLimits {
            max: 2,
            per_ip: 8,
            header_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
        };
        let s = serve_with(tls, limits, "ok").await;
        let addr = s.addr;
        let mut stalled = Vec::new();
        for _ in 0..2 {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
            stalled.push(c);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        for _ in 0..3 {
            let (answer, _) = get(addr, client_config(&ca, None)).await.unwrap();
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        }
        drop(stalled);
        s.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unusable_files_are_clear_errors() {
        let dir = tempfile_dir();
        let ca = Ca::new("brownout test CA");
        let (cert, key) = ca.leaf("localhost");
        let (_, other_key) = ca.leaf("localhost");
        let good = TlsFiles {
            cert: write(&dir, "cert.pem", &cert),
            key: write(&dir, "key.pem", &key),
            client_ca: None,
        };
        assert!(Tls::load(good.clone()).is_ok());
        let missing = TlsFiles {
            cert: dir.join("nope.pem"),
            ..good.clone()
        };
        let e = Tls::load(missing).unwrap_err().to_string();
        assert!(
            e.contains("certificate file") && e.contains("nope.pem"),
            "{e}"
        );
        let empty = TlsFiles {
            cert: write(&dir, "empty.pem", "nothing here"),
            ..good.clone()
        };
        let e = Tls::load(empty).unwrap_err().to_string();
        assert!(e.contains("no CERTIFICATE"), "{e}");
        let mismatched = TlsFiles {
            key: write(&dir, "other.pem", &other_key),
            ..good
        };
        assert!(
            Tls::load(mismatched).is_err(),
            "a key that is not the certificate's"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "brownout-net-tls-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
