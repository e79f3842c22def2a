//! A ClickHouse cluster of the test's own on one machine: ZooKeeper (Debian `zookeeper`, run
//! with java from its jars) and two `clickhouse-server` processes, 2 shards × 1 replica, cluster
//! [`ClickHouseCluster::NAME`], on spare loopback ports, every file in a temp dir. Dropping it
//! kills each process by its PID (the same set-up as `bench/with-clickhouse-cluster.sh`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

/// The ZooKeeper jars and their dependencies, as Debian's `zookeeper` package installs them.
const ZK_JARS: &[&str] = &[
    "zookeeper",
    "zookeeper-jute",
    "slf4j-api",
    "log4j-1.2",
    "netty-all",
    "netty-handler",
    "netty-transport",
    "netty-common",
    "netty-buffer",
    "netty-codec",
    "netty-resolver",
    "netty-transport-native-unix-common",
    "netty-transport-native-epoll",
    "metrics-core",
    "snappy-java",
    "jline",
];

/// One running cluster. Killed (every process, by PID) when dropped.
pub struct ClickHouseCluster {
    /// The HTTP interface of each node, shard 1 first: `http://127.0.0.1:<port>`.
    pub nodes: Vec<String>,
    children: Vec<(String, Child)>,
    dir: tempfile::TempDir,
}

fn on_path(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(bin))
            .find(|f| f.is_file())
    })
}

/// GET `path` over plain HTTP/1.0; the body when the status is 200.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_string())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_string()))
}

/// ZooKeeper's `ruok` four-letter command answers `imok` once it serves.
fn zk_ruok(port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut out = String::new();
    s.write_all(b"ruok").is_ok() && s.read_to_string(&mut out).is_ok() && out == "imok"
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

impl ClickHouseCluster {
    /// The cluster's name in every node's `remote_servers`.
    pub const NAME: &'static str = "brownout_2x1";

    /// What is missing to run one, if anything.
    pub fn missing() -> Option<String> {
        let mut missing = Vec::new();
        if !Path::new("/usr/share/java/zookeeper.jar").is_file() {
            missing.push("zookeeper (apt-get install zookeeper)");
        }
        if on_path("java").is_none() {
            missing.push("java (a dependency of Debian's zookeeper)");
        }
        if on_path("clickhouse-server").is_none() {
            missing.push("clickhouse-server (apt-get install clickhouse-server)");
        }
        (!missing.is_empty()).then(|| missing.join(", "))
    }

    /// Starts ZooKeeper and both nodes and waits until each node answers `/ping` and sees
    /// ZooKeeper. `None`, after printing `SKIPPED <test>: …` on stderr, when ZooKeeper, java or
    /// clickhouse-server is not installed (scripts/test.sh installs them).
    ///
    /// # Panics
    /// When they are installed but do not start (with the tail of their logs).
    pub fn start_or_skip(test: &str) -> Option<ClickHouseCluster> {
        if let Some(m) = Self::missing() {
            eprintln!("SKIPPED {test}: not installed: {m}");
            return None;
        }
        Some(Self::start())
    }

    /// [`ClickHouseCluster::start_or_skip`] without the check. The spare ports are picked by
    /// binding port 0 and closing it, so a test running beside it can take one before a node
    /// binds it: a start that fails on "Address already in use" is tried again on new ports
    /// (three tries in all; the failed try's processes are stopped when it unwinds).
    ///
    /// # Panics
    /// When something does not start.
    pub fn start() -> ClickHouseCluster {
        for attempt in 1.. {
            match std::panic::catch_unwind(Self::start_once) {
                Ok(c) => return c,
                Err(e) => {
                    let msg = e
                        .downcast_ref::<String>()
                        .map(String::as_str)
                        .or_else(|| e.downcast_ref::<&str>().copied())
                        .unwrap_or("");
                    if attempt >= 3 || !msg.contains("Address already in use") {
                        std::panic::resume_unwind(e);
                    }
                    eprintln!(
                        "clickhouse cluster: a port was taken meanwhile; starting again on new ports"
                    );
                }
            }
        }
        unreachable!("the loop returns or unwinds")
    }

    fn start_once() -> ClickHouseCluster {
        let dir = tempfile::Builder::new()
            .prefix("brownout-chc.")
            .tempdir()
            .expect("a temporary directory");
        let mut c = ClickHouseCluster {
            nodes: Vec::new(),
            children: Vec::new(),
            dir,
        };
        let root = c.dir.path().to_path_buf();

        // ZooKeeper, standalone.
        let zk_port = free_port();
        let zk = root.join("zk");
        std::fs::create_dir_all(zk.join("data")).expect("zk dir");
        std::fs::write(
            zk.join("zoo.cfg"),
            format!(
                "tickTime=500\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={zk_port}\n\
                 clientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=ruok\n",
                zk.join("data").display()
            ),
        )
        .expect("zoo.cfg");
        let cp: Vec<String> = ZK_JARS
            .iter()
            .map(|j| format!("/usr/share/java/{j}.jar"))
            .filter(|p| Path::new(p).is_file())
            .collect();
        let log = std::fs::File::create(zk.join("out.log")).expect("zk log");
        let child = Command::new("java")
            .args(["-Xmx256m", "-XX:+UseSerialGC", "-cp", &cp.join(":")])
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(zk.join("zoo.cfg"))
            .stdout(log.try_clone().expect("zk log"))
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("start java (ZooKeeper)");
        c.children.push(("zookeeper".into(), child));
        // ZooKeeper must serve before the nodes start: 18.16 that finds it unreachable at start
        // keeps a broken session and crashes on the first ON CLUSTER query.
        let started = Instant::now();
        loop {
            if zk_ruok(zk_port) {
                break;
            }
            if let Some((what, status)) = c.exited() {
                panic!("{what} exited ({status}):\n{}", tail(&zk.join("out.log")));
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "ZooKeeper did not answer ruok within 60 s:\n{}",
                tail(&zk.join("out.log"))
            );
            std::thread::sleep(Duration::from_millis(100));
        }

        // Two nodes: 2 shards × 1 replica.
        let ports: Vec<(u16, u16, u16)> = (0..2)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let shards: String = ports
            .iter()
            .map(|(_, tcp, _)| {
                format!(
                    "<shard><internal_replication>true</internal_replication>\
                     <replica><host>127.0.0.1</host><port>{tcp}</port></replica></shard>"
                )
            })
            .collect();
        let base = std::fs::read_to_string("/etc/clickhouse-server/config.xml")
            .expect("/etc/clickhouse-server/config.xml (clickhouse-server's package)");
        // The packaged config also listens on 9440 (TLS) on some versions: not here.
        let base = base.replace("<tcp_port_secure>9440</tcp_port_secure>", "");
        for (i, (http, tcp, inter)) in ports.iter().enumerate() {
            let d = root.join(format!("n{}", i + 1));
            for sub in ["config.d", "data", "log"] {
                std::fs::create_dir_all(d.join(sub)).expect("node dir");
            }
            std::fs::write(d.join("config.xml"), &base).expect("config.xml");
            std::fs::copy("/etc/clickhouse-server/users.xml", d.join("users.xml"))
                .expect("/etc/clickhouse-server/users.xml");
            let data = d.join("data");
            let logs = d.join("log");
            // `<yandex>` is the root 18.16 wants; current versions take it as well as
            // `<clickhouse>`.
            std::fs::write(
                d.join("config.d/cluster.xml"),
                format!(
                    "<yandex>\n\
                     <http_port>{http}</http_port>\n<tcp_port>{tcp}</tcp_port>\n\
                     <interserver_http_port>{inter}</interserver_http_port>\n\
                     <interserver_http_host>127.0.0.1</interserver_http_host>\n\
                     <listen_host replace=\"1\">127.0.0.1</listen_host>\n\
                     <path>{data}/</path>\n<tmp_path>{data}/tmp/</tmp_path>\n\
                     <user_files_path>{data}/user_files/</user_files_path>\n\
                     <format_schema_path>{data}/format_schemas/</format_schema_path>\n\
                     <logger><log>{logs}/server.log</log><errorlog>{logs}/err.log</errorlog>\
                     <level>information</level></logger>\n\
                     <remote_servers replace=\"1\"><{name}>{shards}</{name}></remote_servers>\n\
                     <zookeeper replace=\"1\"><node><host>127.0.0.1</host><port>{zk_port}</port></node>\
                     <session_timeout_ms>10000</session_timeout_ms></zookeeper>\n\
                     <macros replace=\"1\"><shard>{shard:02}</shard><replica>r1</replica></macros>\n\
                     <distributed_ddl><path>/clickhouse/task_queue/ddl</path></distributed_ddl>\n\
                     </yandex>\n",
                    data = data.display(),
                    logs = logs.display(),
                    name = Self::NAME,
                    shard = i + 1,
                ),
            )
            .expect("cluster.xml");
            let out = std::fs::File::create(logs.join("stdout.log")).expect("node log");
            let child = Command::new("clickhouse-server")
                .arg(format!("--config-file={}", d.join("config.xml").display()))
                .stdout(out.try_clone().expect("node log"))
                .stderr(out)
                .stdin(Stdio::null())
                .spawn()
                .expect("start clickhouse-server");
            c.children
                .push((format!("clickhouse node {}", i + 1), child));
            c.nodes.push(format!("http://127.0.0.1:{http}"));
        }

        // Up: each node answers, and reaches ZooKeeper (system.zookeeper is readable).
        let started = Instant::now();
        for (i, (http, _, _)) in ports.iter().enumerate() {
            loop {
                let zk_ok = http_get(
                    *http,
                    "/?query=SELECT%20count()%20FROM%20system.zookeeper%20WHERE%20path%20%3D%20'/'",
                )
                .is_some();
                if zk_ok {
                    break;
                }
                if started.elapsed() > Duration::from_secs(60) {
                    let d = root.join(format!("n{}", i + 1));
                    panic!(
                        "clickhouse node {} did not start or does not see ZooKeeper within 60 s:\n{}\n--- stdout\n{}\n--- zookeeper\n{}",
                        i + 1,
                        tail(&d.join("log/err.log")),
                        tail(&d.join("log/stdout.log")),
                        tail(&zk.join("out.log"))
                    );
                }
                if let Some((what, status)) = c.exited() {
                    panic!(
                        "{what} exited ({status}) while starting:\n{}\n--- zookeeper\n{}",
                        tail(&root.join(format!("n{}/log/err.log", i + 1))),
                        tail(&zk.join("out.log"))
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        c
    }

    fn exited(&mut self) -> Option<(String, std::process::ExitStatus)> {
        self.children
            .iter_mut()
            .find_map(|(n, ch)| ch.try_wait().ok().flatten().map(|s| (n.clone(), s)))
    }

    /// The last lines of every node's error log and of ZooKeeper's output, for a failure
    /// message.
    pub fn log_tails(&self) -> String {
        let mut out = String::new();
        for i in 1..=self.nodes.len() {
            out.push_str(&format!(
                "--- node {i} err.log\n{}\n",
                tail(&self.dir.path().join(format!("n{i}/log/err.log")))
            ));
        }
        out.push_str(&format!(
            "--- zookeeper\n{}\n",
            tail(&self.dir.path().join("zk/out.log"))
        ));
        out
    }

    /// The temp dir holding every file of the cluster.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for ClickHouseCluster {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
        }
        for (_, c) in &mut self.children {
            let _ = c.wait();
        }
    }
}
