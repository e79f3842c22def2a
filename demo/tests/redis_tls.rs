//! Redis over TLS with an ACL user, end to end: a real `redis-server` with `--tls-port` only (no
//! plain port), mutual TLS with certificates made by the `openssl` command line, and an ACL user
//! with a password. The control plane and a serving subscriber both connect with a
//! `rediss://user:password@…` URL and the TLS files named in the environment
//! (`BROWNOUT_REDIS_CA_FILE`, `BROWNOUT_REDIS_CLIENT_CERT_FILE`, `BROWNOUT_REDIS_CLIENT_KEY_FILE`);
//! a pinned tier reaches the subscriber and its signed ack comes back verified.
//!
//! One test in this binary, because it sets process environment variables.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use brownout::degrade::{
    DegradeConfig, DegradeHandle, Override, Policy, Transport, run_controller,
};
use brownout_protocol::{RedisTls, Tier, redis_client_with};
use brownout_serving::control::{ControlHandle, SubscriberConfig, spawn_subscriber};
use brownout_test_support::wait_for;

const KEY: &[u8] = b"tls-test-key";
const POLICY: &str = r"
evaluate_interval_ms: 50
command_lease_ms: 3000
features:
  - { name: basic_qa, criticality: critical }
tiers:
  t1: { hold_down_secs: 1 }
  t2:
    hold_down_secs: 1
    params: { model_route: fallback, max_tokens_cap: 128, max_num_seqs: 8 }
  t3:
    hold_down_secs: 1
    params: { admit_min_criticality: critical, retry_after_base_secs: 20, jitter_ratio: 0.5, recovery_eta_max_secs: 600 }
";

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl is required (apt-get install openssl)");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA.
fn make_certs(dir: &Path) {
    // Extension files make both leaf certificates X.509 v3 (rustls refuses v1).
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=brownout-test-ca",
        ],
    );
    for (name, cn) in [
        ("server", "/CN=127.0.0.1"),
        ("client", "/CN=brownout-client"),
    ] {
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                cn,
            ],
        );
        let args = [
            "x509".to_string(),
            "-req".into(),
            "-in".into(),
            format!("{name}.csr"),
            "-CA".into(),
            "ca.crt".into(),
            "-CAkey".into(),
            "ca.key".into(),
            "-CAcreateserial".into(),
            "-out".into(),
            format!("{name}.crt"),
            "-days".into(),
            "2".into(),
            "-extfile".into(),
            format!("{name}.ext"),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        openssl(dir, &args);
    }
}

struct TlsRedis {
    child: Child,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_redis(dir: &Path, port: u16) -> TlsRedis {
    // No plain port; clients must present a certificate; `default` is off and `brownout` is an
    // ACL user with a password and full rights on its keys and channels.
    let conf = format!(
        "port 0\nbind 127.0.0.1\ntls-port {port}\ntls-cert-file {d}/server.crt\n\
         tls-key-file {d}/server.key\ntls-ca-cert-file {d}/ca.crt\ntls-auth-clients yes\n\
         save \"\"\nappendonly no\ndir {d}\n\
         user default off\nuser brownout on >s3cret-pw ~* &* +@all\n",
        d = dir.display()
    );
    std::fs::write(dir.join("redis.conf"), conf).unwrap();
    let child = Command::new("redis-server")
        .arg(dir.join("redis.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is required (apt-get install redis-server)");
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "TLS redis-server did not start on {port}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    TlsRedis { child }
}

async fn ping(client: &redis::Client) -> Result<String, String> {
    let mut c = tokio::time::timeout(
        Duration::from_secs(3),
        client.get_multiplexed_async_connection(),
    )
    .await
    .map_err(|_| "timed out".to_string())?
    .map_err(|e| e.to_string())?;
    redis::cmd("PING")
        .query_async::<String>(&mut c)
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_and_serving_tier_talk_over_mutual_tls_with_an_acl_user() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _redis = start_redis(dir.path(), port);
    let url = format!("rediss://brownout:s3cret-pw@127.0.0.1:{port}");
    let read = |f: &str| std::fs::read(dir.path().join(f)).unwrap();
    let full = RedisTls {
        ca: Some(read("ca.crt")),
        client_cert_and_key: Some((read("client.crt"), read("client.key"))),
    };

    // What does not get in: no client certificate, the system roots only (our CA is private),
    // plain redis:// against the TLS port, a wrong password.
    let no_client_cert = RedisTls {
        ca: Some(read("ca.crt")),
        client_cert_and_key: None,
    };
    assert!(
        ping(&redis_client_with(&url, &no_client_cert).unwrap())
            .await
            .is_err()
    );
    let e = ping(&redis_client_with(&url, &RedisTls::default()).unwrap())
        .await
        .unwrap_err();
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    let plain = format!("redis://brownout:s3cret-pw@127.0.0.1:{port}");
    assert!(
        ping(&redis_client_with(&plain, &RedisTls::default()).unwrap())
            .await
            .is_err()
    );
    let wrong = format!("rediss://brownout:nope@127.0.0.1:{port}");
    let e = ping(&redis_client_with(&wrong, &full).unwrap())
        .await
        .unwrap_err();
    assert!(
        e.contains("WRONGPASS") || e.to_lowercase().contains("auth"),
        "{e}"
    );
    assert_eq!(
        ping(&redis_client_with(&url, &full).unwrap())
            .await
            .unwrap(),
        "PONG"
    );

    // The processes read the files from the environment.
    // SAFETY: the only test in this binary; set before any other thread reads the environment.
    unsafe {
        std::env::set_var("BROWNOUT_REDIS_CA_FILE", dir.path().join("ca.crt"));
        std::env::set_var(
            "BROWNOUT_REDIS_CLIENT_CERT_FILE",
            dir.path().join("client.crt"),
        );
        std::env::set_var(
            "BROWNOUT_REDIS_CLIENT_KEY_FILE",
            dir.path().join("client.key"),
        );
    }
    let cluster = format!("tls-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let mut cfg = DegradeConfig::new(&cluster, KEY, Policy::from_yaml(POLICY).unwrap());
    cfg.replica_id = "cp-tls".into();
    cfg.leader_lease_ms = 1000;
    cfg.redis_timeout = Duration::from_millis(1000);
    let h = DegradeHandle::new(cfg, &prometheus::Registry::new()).unwrap();
    let ctl = tokio::spawn(run_controller(
        h.clone(),
        Transport::Redis { url: url.clone() },
        std::future::pending(),
    ));
    let serving = ControlHandle::new(&cluster);
    let mut scfg = SubscriberConfig::new(&url, &cluster, KEY, "tls-0");
    scfg.anti_entropy = Duration::from_millis(250);
    let sub = spawn_subscriber(serving.clone(), scfg).await;
    wait_for("leadership over TLS", Duration::from_secs(10), || {
        h.status().leader_epoch.is_some()
    })
    .await;
    h.set_override(Override {
        tier: Tier::T2,
        until_ms: brownout_protocol::now_ms() + 600_000,
        reason: "tls drill".into(),
    });
    wait_for("T2 applied over TLS", Duration::from_secs(10), || {
        serving.tier() == Tier::T2
    })
    .await;
    wait_for("a verified ack over TLS", Duration::from_secs(10), || {
        h.status()
            .acks
            .iter()
            .any(|a| a.instance == "tls-0" && a.status == "applied" && a.epoch > 0)
    })
    .await;
    ctl.abort();
    sub.abort();
}
