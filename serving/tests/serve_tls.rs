//! `brownout-serve` with vLLM's TLS flags, a real process: `--ssl-certfile`/`--ssl-keyfile`
//! serve HTTPS to a client of the test CA (made here with rcgen) and refuse plaintext and a
//! client that does not trust that CA; with `--ssl-ca-certs` only clients holding a certificate
//! of that CA are served.

use std::process::{Command as Proc, Stdio};
use std::time::Duration;

use brownout_test_support::{free_port, poll};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[allow(dead_code)] // `client` is for the other process tests
mod common;
use common::KillOnDrop;

struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, name.to_string());
        Ca(CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap())
    }

    fn leaf(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let c = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap()
            .signed_by(&key, &self.0)
            .unwrap();
        (c.pem(), key.serialize_pem())
    }
}

fn https(trust: Option<&Ca>, identity: Option<(String, String)>) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut b = reqwest::Client::builder().timeout(Duration::from_secs(5));
    if let Some(ca) = trust {
        b = b.add_root_certificate(reqwest::Certificate::from_pem(ca.0.pem().as_bytes()).unwrap());
    }
    if let Some((cert, key)) = identity {
        b = b.identity(reqwest::Identity::from_pem(format!("{cert}{key}").as_bytes()).unwrap());
    }
    b.build().unwrap()
}

async fn health(c: &reqwest::Client, port: u16) -> Option<u16> {
    c.get(format!("https://127.0.0.1:{port}/health"))
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ssl_flags_serve_https_to_the_test_cas_clients_only() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("brownout test CA");
    let clients = Ca::new("brownout client CA");
    let (cert, key) = ca.leaf(&["localhost", "127.0.0.1"]);
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    };
    let (cert, key, client_ca) = (
        write("cert.pem", &cert),
        write("key.pem", &key),
        write("clients.pem", &clients.0.pem()),
    );
    for mutual in [false, true] {
        let port = free_port();
        let mut cmd = Proc::new(env!("CARGO_BIN_EXE_brownout-serve"));
        cmd.args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--model",
            "toy",
        ])
        .args(["--ssl-certfile", &cert, "--ssl-keyfile", &key])
        .env_remove("REDIS_URL")
        .env_remove("BROWNOUT_SERVE_API_KEY")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("BROWNOUT_CONTROL_PLANE")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if mutual {
            cmd.args(["--ssl-ca-certs", &client_ca]);
        }
        let _child = KillOnDrop(cmd.spawn().expect("brownout-serve starts"));
        let good = if mutual {
            https(Some(&ca), Some(clients.leaf(&["client"])))
        } else {
            https(Some(&ca), None)
        };
        let up = poll(Duration::from_secs(120), || {
            let good = good.clone();
            async move { (health(&good, port).await == Some(200)).then_some(()) }
        })
        .await;
        assert!(up.is_some(), "mutual={mutual}: never healthy over TLS");
        // A client that does not trust the test CA is refused.
        assert_eq!(health(&https(None, None), port).await, None);
        if mutual {
            assert_eq!(
                health(&https(Some(&ca), None), port).await,
                None,
                "no client certificate"
            );
            assert_eq!(
                health(&https(Some(&ca), Some(Ca::new("rogue").leaf(&["c"]))), port).await,
                None,
                "a client certificate of another CA"
            );
        }
        // Plaintext gets no HTTP answer.
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        c.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out)).await;
        assert!(
            !String::from_utf8_lossy(&out).contains("HTTP/1.1"),
            "plaintext answered"
        );
    }
}
