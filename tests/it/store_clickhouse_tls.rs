//! ClickHouse over TLS with a private CA (issue 39): a clickhouse-server of the test's own (own
//! ports and data dir, killed by PID) serves `https://` with a certificate of a CA made here and
//! requires a client certificate of a second CA (`verificationMode` strict). The store configured
//! with `storage.clickhouse_ca_file` and a client certificate and key migrates, writes and reads
//! a document over it; one that does not trust the CA, or that has no client certificate, fails;
//! TLS files with an `http://` URL are a clear configuration error.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use brownout::config::Config;
use brownout::store::Store;
use brownout::store::clickhouse::ClickHouseStore;

use crate::tls_listeners::Ca;

struct Server {
    child: Child,
    _dir: tempfile::TempDir,
    log: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tail(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// A clickhouse-server with `https_port` on the test CA's certificate, requiring client
/// certificates of `clients`. Returns it and its https port.
fn start(cert: &str, key: &str, clients: &str) -> (Server, u16) {
    let dir = tempfile::Builder::new()
        .prefix("brownout-chtls.")
        .tempdir()
        .unwrap();
    let d = dir.path();
    for sub in ["config.d", "data", "log"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    let write = |name: &str, text: &str| {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let (cert, key, clients) = (
        write("server.crt", cert),
        write("server.key", key),
        write("clients.pem", clients),
    );
    let base = std::fs::read_to_string("/etc/clickhouse-server/config.xml")
        .expect("/etc/clickhouse-server/config.xml (clickhouse-server's package)")
        .replace("<tcp_port_secure>9440</tcp_port_secure>", "");
    std::fs::write(d.join("config.xml"), base).unwrap();
    std::fs::copy("/etc/clickhouse-server/users.xml", d.join("users.xml")).unwrap();
    let (http, tcp, https, inter) = (
        brownout_test_support::free_port(),
        brownout_test_support::free_port(),
        brownout_test_support::free_port(),
        brownout_test_support::free_port(),
    );
    let data = d.join("data");
    let logs = d.join("log");
    write(
        "config.d/tls.xml",
        &format!(
            "<yandex>\n<http_port>{http}</http_port>\n<tcp_port>{tcp}</tcp_port>\n\
             <https_port>{https}</https_port>\n<interserver_http_port>{inter}</interserver_http_port>\n\
             <listen_host replace=\"1\">127.0.0.1</listen_host>\n\
             <path>{data}/</path>\n<tmp_path>{data}/tmp/</tmp_path>\n\
             <user_files_path>{data}/user_files/</user_files_path>\n\
             <format_schema_path>{data}/format_schemas/</format_schema_path>\n\
             <logger><log>{logs}/server.log</log><errorlog>{logs}/err.log</errorlog>\
             <level>information</level></logger>\n\
             <openSSL replace=\"1\"><server>\
             <certificateFile>{cert}</certificateFile><privateKeyFile>{key}</privateKeyFile>\
             <caConfig>{clients}</caConfig><verificationMode>strict</verificationMode>\
             <loadDefaultCAFile>false</loadDefaultCAFile><cacheSessions>false</cacheSessions>\
             <disableProtocols>sslv2,sslv3</disableProtocols><preferServerCiphers>true</preferServerCiphers>\
             </server></openSSL>\n</yandex>\n",
            data = data.display(),
            logs = logs.display(),
            cert = cert.display(),
            key = key.display(),
            clients = clients.display(),
        ),
    );
    let out = std::fs::File::create(logs.join("stdout.log")).unwrap();
    let child = Command::new("clickhouse-server")
        .arg(format!("--config-file={}", d.join("config.xml").display()))
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .stdin(Stdio::null())
        .spawn()
        .expect("start clickhouse-server");
    let mut server = Server {
        child,
        log: logs.join("err.log"),
        _dir: dir,
    };
    let started = Instant::now();
    // Ready once the https port takes connections (it opens with the others).
    while std::net::TcpStream::connect(("127.0.0.1", https)).is_err() {
        if let Ok(Some(status)) = server.child.try_wait() {
            panic!(
                "clickhouse-server exited ({status}):\n{}",
                tail(&server.log)
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "clickhouse-server did not open its https port within 90 s:\n{}",
            tail(&server.log)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    (server, https)
}

fn store_for(toml: &str) -> Result<ClickHouseStore, String> {
    let config =
        Config::from_toml_str("ch-tls.toml", toml, &BTreeMap::new()).map_err(|e| e.to_string())?;
    let ch = config.clickhouse.expect("a ClickHouse config");
    Ok(ClickHouseStore::new(&ch))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clickhouse_over_tls_with_a_private_ca_and_a_client_certificate() {
    if std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("clickhouse-server").is_file()))
        != Some(true)
    {
        eprintln!(
            "SKIPPED clickhouse_over_tls: clickhouse-server is not installed (scripts/test.sh installs it)"
        );
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server_ca = Ca::new("brownout ClickHouse test CA");
    let client_ca = Ca::new("brownout ClickHouse client CA");
    let (cert, key) = server_ca.leaf(&["localhost", "127.0.0.1"]);
    let (server, port) = start(&cert, &key, &client_ca.0.pem());
    let files = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = files.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let ca_file = write("ca.pem", &server_ca.0.pem());
    let (ccert, ckey) = client_ca.leaf(&["brownout-control-plane"]);
    let (ccert, ckey) = (write("client.crt", &ccert), write("client.key", &ckey));
    let prefix = format!("t{}_", uuid::Uuid::new_v4().simple());
    let url = format!("https://127.0.0.1:{port}");
    let toml = |ca: Option<&std::path::Path>, client: bool| {
        let mut t = format!("[storage]\nclickhouse_url = {url:?}\ntable_prefix = {prefix:?}\n");
        if let Some(ca) = ca {
            t += &format!("clickhouse_ca_file = {ca:?}\n");
        }
        if client {
            t += &format!(
                "clickhouse_client_cert_file = {ccert:?}\nclickhouse_client_key_file = {ckey:?}\n"
            );
        }
        t
    };

    // Trusting the CA and presenting a client certificate: the store works over TLS.
    let s = store_for(&toml(Some(&ca_file), true)).unwrap();
    let started = Instant::now();
    while let Err(e) = s.ping().await {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no answer over TLS within 60 s: {e}\n{}",
            tail(&server.log)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    s.migrate().await.unwrap();
    let doc = serde_json::json!({"over": "tls", "n": 39});
    s.put_doc("tls-test", "k", &doc).await.unwrap();
    let got = s.get_doc("tls-test", "k").await.unwrap().expect("the doc");
    assert_eq!(got.value, doc);

    // Without the private CA (the public roots) or without a client certificate: refused.
    for (what, t) in [
        ("the public roots only", toml(None, true)),
        ("no client certificate", toml(Some(&ca_file), false)),
    ] {
        let other = match store_for(&t) {
            Ok(s) => s,
            Err(e) => panic!("{what}: config refused: {e}"),
        };
        let r = other.ping().await;
        assert!(r.is_err(), "{what}: ClickHouse answered: {r:?}");
    }
    // The CA file names a CA that did not sign the server's certificate: refused too.
    let rogue = write("rogue.pem", &Ca::new("rogue").0.pem());
    let r = store_for(&toml(Some(&rogue), true)).unwrap().ping().await;
    assert!(r.is_err(), "a rogue CA was accepted: {r:?}");

    // TLS files with a plaintext URL, or half a client identity: clear errors.
    let e = Config::from_toml_str(
        "x.toml",
        &format!("[storage]\nclickhouse_url = \"http://127.0.0.1:8123\"\nclickhouse_ca_file = {ca_file:?}\n"),
        &BTreeMap::new(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("storage.clickhouse_ca_file") && e.contains("https://"),
        "{e}"
    );
    let e = Config::from_toml_str(
        "x.toml",
        &format!("[storage]\nclickhouse_url = {url:?}\nclickhouse_client_cert_file = {ccert:?}\n"),
        &BTreeMap::new(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("storage.clickhouse_client_key_file"), "{e}");
    let e = Config::from_toml_str(
        "x.toml",
        &format!(
            "[storage]\nclickhouse_url = {url:?}\nclickhouse_ca_file = \"/nonexistent/ca.pem\"\n"
        ),
        &BTreeMap::new(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("/nonexistent/ca.pem"), "{e}");

    s.drop_tables().await.unwrap();
    drop(server);
}
