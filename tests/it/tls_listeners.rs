//! TLS on the control plane's listeners (a running control plane, real sockets, certificates
//! from a CA made here with rcgen): with `server.tls_cert_file`/`tls_key_file` and
//! `tls_client_ca_file`, the OTLP/HTTP port serves a client of the test CA holding a client
//! certificate of the client CA, and refuses plaintext, a client that does not trust the test
//! CA, one without a client certificate and one with a certificate of another CA; the 8080 port
//! serves over TLS without a client certificate; the OTLP/gRPC port completes a TLS handshake
//! with ALPN `h2` for a client of the client CA only. Misconfigured TLS fields are clear errors.

use std::sync::Arc;
use std::time::Duration;

use brownout::auth::Tokens;
use brownout::config::{Config, Secret};
use brownout::plane::{App, Listeners};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const INGEST: &str = "ingest-token-tls-aaaaaaaaaa";

pub(crate) struct Ca(pub(crate) CertifiedIssuer<'static, KeyPair>);

impl Ca {
    pub(crate) fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, name.to_string());
        Ca(CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap())
    }

    /// (certificate PEM, key PEM) for the names.
    pub(crate) fn leaf(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let c = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap()
            .signed_by(&key, &self.0)
            .unwrap();
        (c.pem(), key.serialize_pem())
    }
}

fn client(trust: Option<&Ca>, identity: Option<(String, String)>) -> reqwest::Client {
    let mut b = reqwest::Client::builder().timeout(Duration::from_secs(5));
    if let Some(ca) = trust {
        b = b.add_root_certificate(reqwest::Certificate::from_pem(ca.0.pem().as_bytes()).unwrap());
    }
    if let Some((cert, key)) = identity {
        b = b.identity(reqwest::Identity::from_pem(format!("{cert}{key}").as_bytes()).unwrap());
    }
    b.build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_listeners_serve_the_test_cas_clients_and_refuse_the_rest() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let server_ca = Ca::new("brownout test CA");
    let client_ca = Ca::new("brownout client CA");
    let (cert, key) = server_ca.leaf(&["localhost", "127.0.0.1"]);
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let toml = format!(
        "[server]\ntls_cert_file = {:?}\ntls_key_file = {:?}\ntls_client_ca_file = {:?}\n",
        write("cert.pem", &cert),
        write("key.pem", &key),
        write("clients.pem", &client_ca.0.pem()),
    );
    let mut config =
        Config::from_toml_str("tls.toml", &toml, &std::collections::BTreeMap::new()).unwrap();
    config.data_dir = dir.path().to_path_buf();
    let tokens = Tokens::new(
        Some(Secret::new(INGEST)),
        Some(Secret::new("read-token-tls-bbbbbbbbbbb")),
        Some(Secret::new("admin-token-tls-cccccccccc")),
    );
    let app = App::build(config, tokens).await.unwrap();
    let run = app.spawn(Listeners::loopback().await.unwrap(), axum::Router::new());

    let post = |c: reqwest::Client, addr: std::net::SocketAddr| async move {
        c.post(format!("https://{addr}/v1/failures"))
            .bearer_auth(INGEST)
            .header("content-type", "application/x-ndjson")
            .body(format!(
                "{{\"ts\":{},\"service\":\"tls\",\"message\":\"over tls\"}}\n",
                brownout_protocol::now_ms()
            ))
            .send()
            .await
    };
    // OTLP/HTTP: the test CA's client with a client certificate of the client CA.
    let ok = post(
        client(Some(&server_ca), Some(client_ca.leaf(&["ingest-client"]))),
        run.otlp_http_addr,
    )
    .await
    .unwrap();
    assert_eq!(ok.status().as_u16(), 200);
    // No client certificate, one of another CA, or not trusting the server: refused.
    for (what, c) in [
        ("no client certificate", client(Some(&server_ca), None)),
        (
            "a client certificate of another CA",
            client(
                Some(&server_ca),
                Some(Ca::new("rogue").leaf(&["ingest-client"])),
            ),
        ),
        (
            "a client that does not trust the test CA",
            client(None, Some(client_ca.leaf(&["ingest-client"]))),
        ),
    ] {
        let r = post(c, run.otlp_http_addr).await;
        assert!(
            !matches!(&r, Ok(r) if r.status().is_success()),
            "{what}: served: {r:?}"
        );
    }
    // Plaintext gets no HTTP answer on either HTTP port.
    for addr in [run.otlp_http_addr, run.http_addr] {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out)).await;
        assert!(
            !String::from_utf8_lossy(&out).contains("HTTP/1.1"),
            "{addr}: plaintext answered"
        );
    }
    // 8080 over TLS, no client certificate asked for.
    let h = client(Some(&server_ca), None)
        .get(format!("https://{}/healthz", run.http_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(h.status().as_u16(), 200);
    // gRPC: a TLS handshake negotiating h2 for the client CA's client; refused without.
    let handshake = |identity: Option<(String, String)>| {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from(
                server_ca.0.der().to_vec(),
            ))
            .unwrap();
        let b = rustls::ClientConfig::builder().with_root_certificates(roots);
        let mut cfg = match identity {
            None => b.with_no_client_auth(),
            Some((cert, key)) => {
                use rustls::pki_types::pem::PemObject;
                b.with_client_auth_cert(
                    rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
                        .collect::<Result<_, _>>()
                        .unwrap(),
                    rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap()
            }
        };
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        let addr = run.otlp_grpc_addr;
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            let mut t = tokio_rustls::TlsConnector::from(Arc::new(cfg))
                .connect(
                    rustls::pki_types::ServerName::try_from("localhost").unwrap(),
                    tcp,
                )
                .await?;
            // TLS 1.3: a refused client certificate shows on the first read.
            t.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                .await?;
            let mut b = [0u8; 9];
            t.read_exact(&mut b).await?;
            let alpn = t.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
            Ok::<_, std::io::Error>((alpn, b[3]))
        }
    };
    let (alpn, frame) = handshake(Some(client_ca.leaf(&["ingest-client"])))
        .await
        .unwrap();
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    assert_eq!(frame, 4, "the server's first HTTP/2 frame is SETTINGS");
    assert!(
        handshake(None).await.is_err(),
        "gRPC without a client certificate was served"
    );
    run.stop().await.unwrap();
}

#[test]
fn misconfigured_tls_is_a_clear_error() {
    let env = std::collections::BTreeMap::new();
    let e = Config::from_toml_str(
        "t.toml",
        "[server]\ntls_cert_file = \"/nope/cert.pem\"\n",
        &env,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("server.tls_key_file"), "{e}");
    let e = Config::from_toml_str(
        "t.toml",
        "[server]\ntls_cert_file = \"/nope/cert.pem\"\ntls_key_file = \"/nope/key.pem\"\n",
        &env,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("/nope/cert.pem"), "{e}");
    let e = Config::from_toml_str(
        "t.toml",
        "[server]\ntls_client_ca_file = \"/x.pem\"\n",
        &env,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("server.tls_client_ca_file"), "{e}");
}
