//! The command keys as the Kubernetes manifests wire them (docs/DEPLOY.md "Keys",
//! docs/SECURITY.md "Command signatures"), checked without a cluster:
//!
//! 1. Who mounts what, in every rendered kustomization: the Secret `brownout-command-signing`
//!    only in the control plane's container; the Secret `brownout-ack-master` only there and in
//!    the `brownout keys ack-key` init containers; every gate reads the public key from a file
//!    and its own ack key from the file its pod's init container writes, for the pod's own name;
//!    nothing runs the HMAC compatibility mode.
//! 2. That wiring works: the objects made as `secrets.example.yaml` says (`brownout keys init`),
//!    each gate pod's init container run with its own arguments, then a real control plane and
//!    one real gate per serving pod started with exactly the files and variables their
//!    containers get (mount paths mapped to folders here, an empty data directory each so no
//!    default key can stand in): an override reaches every gate and each one's ack verifies.
//!
//! Needs kubectl (kustomize v5), Redis (`redis-server`, started here on its own port) and the
//! binaries (`cargo test --workspace` builds them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use brownout_test_support::{OwnRedis, free_port};
use serde_yaml::Value;

use crate::deploy_manifests::{
    Running, binary, containers, docs, find, k8s_dir, name_of, pod_templates, rendered, seq, strs,
};

const SIGNING: &str = "brownout-command-signing";
const ACK_MASTER: &str = "brownout-ack-master";
const PUBKEY: &str = "brownout-command-pubkey";

/// Where a volume's files come from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Source {
    Secret(String),
    ConfigMap(String),
    EmptyDir(String),
    Other(String),
}

fn source(pod: &Value, volume: &str) -> Source {
    let v = seq(&pod["volumes"])
        .iter()
        .find(|v| v["name"] == volume)
        .unwrap_or_else(|| panic!("volume {volume} is not declared"));
    if let Some(n) = v["secret"]["secretName"].as_str() {
        Source::Secret(n.into())
    } else if let Some(n) = v["configMap"]["name"].as_str() {
        Source::ConfigMap(n.into())
    } else if !v["emptyDir"].is_null() {
        Source::EmptyDir(volume.into())
    } else {
        Source::Other(volume.into())
    }
}

/// The volume (and the path inside it) that a container sees at `path`.
fn resolve(pod: &Value, c: &Value, path: &str) -> Option<(Source, String)> {
    let mut best: Option<(usize, Source, String)> = None;
    for m in seq(&c["volumeMounts"]) {
        let mount = m["mountPath"].as_str()?.trim_end_matches('/');
        let rest = if path == mount {
            Some("")
        } else {
            path.strip_prefix(&format!("{mount}/"))
        };
        if let Some(rest) = rest {
            if best.as_ref().is_none_or(|(l, _, _)| mount.len() > *l) {
                best = Some((
                    mount.len(),
                    source(pod, m["name"].as_str()?),
                    rest.to_string(),
                ));
            }
        }
    }
    best.map(|(_, s, r)| (s, r))
}

/// A container's variables: literal values, and `metadata.name` fieldRefs as `pod_name`.
fn env_of(c: &Value, pod_name: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for e in seq(&c["env"]) {
        let name = e["name"].as_str().unwrap().to_string();
        if let Some(v) = e["value"].as_str() {
            env.insert(name, v.to_string());
        } else if e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name" {
            env.insert(name, pod_name.to_string());
        }
    }
    env
}

fn secret_mounts(pod: &Value, c: &Value) -> Vec<String> {
    seq(&c["volumeMounts"])
        .iter()
        .filter_map(|m| match source(pod, m["name"].as_str()?) {
            Source::Secret(n) => Some(n),
            _ => None,
        })
        .collect()
}

fn command_line(c: &Value) -> Vec<String> {
    let mut v = strs(&c["command"]);
    v.extend(strs(&c["args"]));
    v
}

fn is_ack_key_init(c: &Value) -> bool {
    command_line(c).starts_with(&["brownout".into(), "keys".into(), "ack-key".into()])
}

/// One serving pod as the test runs it.
struct Gate {
    at: String,
    pod: Value,
    init: Value,
    gate: Value,
}

/// The control plane's container and pod, and the serving pods, of one rendered overlay; the
/// wiring problems found on the way.
fn wiring(
    overlay: &str,
    docs: &[Value],
    problems: &mut Vec<String>,
) -> (Option<(Value, Value)>, Vec<Gate>) {
    let mut plane = None;
    let mut gates = Vec::new();
    for (at, _, pod) in pod_templates(docs) {
        let at = format!("{overlay}: {at}");
        let inits = seq(&pod["initContainers"]);
        for c in containers(pod) {
            let cl = command_line(c);
            let cname = c["name"].as_str().unwrap_or("?");
            let bin = cl.first().map(String::as_str).unwrap_or("");
            let is_plane = bin == "brownout" && cl.get(1).map(String::as_str) == Some("serve");
            let is_gate =
                bin == "brownout-serve" && cl.get(1).map(String::as_str) != Some("fetch-model");
            for e in seq(&c["env"]) {
                let n = e["name"].as_str().unwrap_or("");
                if n == "BROWNOUT_COMMAND_KEY" || n == "BROWNOUT_COMMAND_SIGNATURE" {
                    problems.push(format!(
                        "{at} {cname}: sets {n} (the HMAC compatibility mode)"
                    ));
                }
            }
            let secrets = secret_mounts(pod, c);
            if secrets.iter().any(|s| s == SIGNING) && !is_plane {
                problems.push(format!(
                    "{at} {cname}: mounts the signing key and is not the control plane"
                ));
            }
            if secrets.iter().any(|s| s == ACK_MASTER) && !is_plane && !is_ack_key_init(c) {
                problems.push(format!("{at} {cname}: mounts the ack master"));
            }
            if is_plane {
                let env = env_of(c, "pod");
                for (var, want) in [
                    ("BROWNOUT_COMMAND_SIGNING_KEY_FILE", SIGNING),
                    ("BROWNOUT_ACK_MASTER_KEY_FILE", ACK_MASTER),
                ] {
                    match env.get(var).and_then(|p| resolve(pod, c, p)) {
                        Some((Source::Secret(n), _)) if n == want => {}
                        other => problems.push(format!(
                            "{at} {cname}: {var} is not a file of the Secret {want}: {other:?}"
                        )),
                    }
                }
                plane = Some((pod.clone(), c.clone()));
            }
            if is_gate {
                let env = env_of(c, "POD");
                if env.get("BROWNOUT_INSTANCE_ID").map(String::as_str) != Some("POD") {
                    problems.push(format!(
                        "{at} {cname}: BROWNOUT_INSTANCE_ID is not the pod's name"
                    ));
                }
                match env.get("BROWNOUT_COMMAND_PUBKEY_FILE").and_then(|p| resolve(pod, c, p)) {
                    Some((Source::ConfigMap(n), _)) if n == PUBKEY => {}
                    other => problems.push(format!(
                        "{at} {cname}: BROWNOUT_COMMAND_PUBKEY_FILE is not a file of the ConfigMap {PUBKEY}: {other:?}"
                    )),
                }
                let ack = env
                    .get("BROWNOUT_ACK_KEY_FILE")
                    .and_then(|p| resolve(pod, c, p));
                // The init container that writes that very file, for this pod's name.
                let init = inits.iter().find(|i| {
                    if !is_ack_key_init(i) {
                        return false;
                    }
                    let l = command_line(i);
                    let flag = |f: &str| l.iter().position(|a| a == f).and_then(|k| l.get(k + 1));
                    let ienv = env_of(i, "POD");
                    let instance = flag("--instance").map(|v| expand(v, &ienv));
                    let out = flag("--out").and_then(|p| resolve(pod, i, p));
                    instance.as_deref() == Some("POD")
                        && out.is_some()
                        && out == ack
                        && matches!(ack, Some((Source::EmptyDir(_), _)))
                });
                match init {
                    Some(i) => gates.push(Gate {
                        at: format!("{at} {cname}"),
                        pod: pod.clone(),
                        init: i.clone(),
                        gate: c.clone(),
                    }),
                    None => problems.push(format!(
                        "{at} {cname}: BROWNOUT_ACK_KEY_FILE ({ack:?}) is not written by a `brownout keys ack-key --instance <pod name>` init container into an emptyDir"
                    )),
                }
            }
        }
    }
    (plane, gates)
}

/// `$(NAME)` replaced by the variable's value, as Kubernetes expands arguments.
fn expand(word: &str, env: &BTreeMap<String, String>) -> String {
    let mut w = word.to_string();
    for (k, v) in env {
        w = w.replace(&format!("$({k})"), v);
    }
    w
}

/// The folders standing in for the volumes of one pod: a Secret or ConfigMap is the folder the
/// test made for that object (only its own files), an emptyDir one folder per pod.
struct Volumes<'a> {
    objects: &'a BTreeMap<Source, PathBuf>,
    pod_dir: PathBuf,
}

impl Volumes<'_> {
    fn host_path(&self, pod: &Value, c: &Value, path: &str) -> Option<PathBuf> {
        let (src, rest) = resolve(pod, c, path)?;
        let dir = match &src {
            Source::EmptyDir(v) => {
                let d = self.pod_dir.join(v);
                std::fs::create_dir_all(&d).unwrap();
                d
            }
            other => self
                .objects
                .get(other)
                .unwrap_or_else(|| panic!("no test object for {other:?}"))
                .clone(),
        };
        Some(dir.join(rest))
    }

    /// The variables of `c` with every path into a volume mapped to its folder here.
    fn env(&self, pod: &Value, c: &Value, pod_name: &str) -> BTreeMap<String, String> {
        env_of(c, pod_name)
            .into_iter()
            .map(|(k, v)| {
                let v = self
                    .host_path(pod, c, &v)
                    .map_or(v, |p| p.display().to_string());
                (k, v)
            })
            .collect()
    }
}

#[tokio::test]
async fn deploy_the_manifests_command_keys_command_an_engine() {
    // 1. The wiring in every kustomization.
    let mut problems = Vec::new();
    let mut plane = None;
    let mut gates = Vec::new();
    for o in rendered() {
        let (p, g) = wiring(&o.name, &o.docs, &mut problems);
        if p.is_none() {
            problems.push(format!("{}: no control plane", o.name));
        }
        plane = plane.or(p);
        gates.extend(g);
    }
    assert!(
        problems.is_empty(),
        "the manifests' command keys:\n{}",
        problems.join("\n")
    );
    assert!(gates.len() >= 3, "only {} serving pods found", gates.len());

    // The objects as secrets.example.yaml names them, made from `brownout keys init`.
    let example = docs(&std::fs::read_to_string(k8s_dir().join("secrets.example.yaml")).unwrap());
    let tmp = tempfile::tempdir().unwrap();
    let keys = tmp.path().join("brownout-keys");
    let out = Command::new(binary("brownout"))
        .args(["keys", "init", "--dir"])
        .arg(&keys)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let public = String::from_utf8(out.stdout).unwrap();
    assert!(public.trim().starts_with("ed25519:"), "{public}");
    let mut objects = BTreeMap::new();
    for (src, kind, file) in [
        (
            Source::Secret(SIGNING.into()),
            "Secret",
            "command-signing.key",
        ),
        (
            Source::Secret(ACK_MASTER.into()),
            "Secret",
            "ack-master.key",
        ),
        (
            Source::ConfigMap(PUBKEY.into()),
            "ConfigMap",
            "command-signing.pub",
        ),
    ] {
        let (Source::Secret(name) | Source::ConfigMap(name)) = &src else {
            unreachable!()
        };
        let d = find(&example, kind, name)
            .unwrap_or_else(|| panic!("secrets.example.yaml lacks {kind} {name}"));
        let data = if kind == "Secret" {
            &d["stringData"]
        } else {
            &d["data"]
        };
        assert!(
            !data[file].is_null(),
            "secrets.example.yaml: {} has no key {file}",
            name_of(d)
        );
        let dir = tmp.path().join("objects").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(keys.join(file), dir.join(file)).unwrap();
        objects.insert(src, dir);
    }

    // 2. The control plane with its container's key files.
    let redis = OwnRedis::start();
    let (cp_pod, cp) = plane.expect("a control plane");
    let vols = Volumes {
        objects: &objects,
        pod_dir: tmp.path().join("pod-control-plane"),
    };
    let http = free_port();
    let cfg = tmp.path().join("cp.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nhttp_addr = \"127.0.0.1:{http}\"\notlp_http_addr = \"127.0.0.1:{}\"\n\
             otlp_grpc_addr = \"127.0.0.1:{}\"\n[storage]\ndata_dir = {:?}\n",
            free_port(),
            free_port(),
            tmp.path().join("cp-data")
        ),
    )
    .unwrap();
    let mut procs = Vec::new();
    let mut cmd = Command::new(binary("brownout"));
    cmd.args(["serve", "--config"]).arg(&cfg);
    for (k, v) in vols.env(&cp_pod, &cp, "brownout-control-plane-0") {
        if k.starts_with("BROWNOUT_COMMAND") || k.starts_with("BROWNOUT_ACK") {
            cmd.env(k, v);
        }
    }
    for t in ["INGEST", "READ", "ADMIN"] {
        cmd.env(
            format!("BROWNOUT_{t}_TOKEN"),
            format!("deploy-keys-{t}-token-0123456789"),
        );
    }
    procs.push(spawn(cmd, &tmp.path().join("cp.log"), &redis));

    // 3. Each serving pod: its init container, then its gate.
    let mut names = Vec::new();
    for (n, g) in gates.iter().enumerate() {
        let pod_name = format!("serving-{n}-5d8c7f-x{n}q2z");
        let vols = Volumes {
            objects: &objects,
            pod_dir: tmp.path().join(&pod_name),
        };
        let ienv = env_of(&g.init, &pod_name);
        let args: Vec<String> = command_line(&g.init)[1..]
            .iter()
            .map(|a| {
                let a = expand(a, &ienv);
                vols.host_path(&g.pod, &g.init, &a)
                    .map_or(a, |p| p.display().to_string())
            })
            .collect();
        let out = Command::new(binary("brownout"))
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: the init container `brownout {}` failed: {}",
            g.at,
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let mut cmd = Command::new(binary("brownout-serve"));
        cmd.args([
            "--model",
            "toy",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ]);
        for (k, v) in vols.env(&g.pod, &g.gate, &pod_name) {
            if k.starts_with("BROWNOUT_COMMAND")
                || k.starts_with("BROWNOUT_ACK")
                || k == "BROWNOUT_INSTANCE_ID"
            {
                cmd.env(k, v);
            }
        }
        // An empty data directory: no default key there can stand in for the mounted ones.
        cmd.env(
            "BROWNOUT_DATA_DIR",
            tmp.path().join(format!("{pod_name}-data")),
        );
        procs.push(spawn(
            cmd,
            &tmp.path().join(format!("{pod_name}.log")),
            &redis,
        ));
        names.push((pod_name, g.at.clone()));
    }

    // 4. An override reaches every gate, and each ack verifies.
    let admin = "deploy-keys-ADMIN-token-0123456789";
    let read = "deploy-keys-READ-token-0123456789";
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let start = Instant::now();
    loop {
        let r = client
            .post(format!("http://127.0.0.1:{http}/api/v1/degrade/override"))
            .bearer_auth(admin)
            .json(&serde_json::json!({"tier": 3, "duration_secs": 120, "reason": "deploy keys"}))
            .send()
            .await;
        if r.as_ref().is_ok_and(|r| r.status().is_success()) {
            break;
        }
        check_alive(&mut procs);
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the control plane takes no override: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut last = serde_json::Value::Null;
    while start.elapsed() < Duration::from_secs(90) {
        check_alive(&mut procs);
        if let Ok(r) = client
            .get(format!("http://127.0.0.1:{http}/api/v1/degrade"))
            .bearer_auth(read)
            .send()
            .await
        {
            last = r.json().await.unwrap_or(serde_json::Value::Null);
            let applied = |n: &str| {
                last["acks"].as_array().is_some_and(|a| {
                    a.iter()
                        .any(|a| a["instance"] == n && a["status"] == "applied")
                })
            };
            if names.iter().all(|(n, _)| applied(n)) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!(
        "not every gate applied the override with a verified ack ({names:?}):\n{}",
        serde_json::to_string_pretty(&last["acks"]).unwrap()
    );
}

fn spawn(mut cmd: Command, log: &Path, redis: &OwnRedis) -> Running {
    for v in [
        "CLICKHOUSE_URL",
        "BROWNOUT_CONTROL_PLANE",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "BROWNOUT_COMMAND_PUBKEY",
        "BROWNOUT_ACK_KEY",
        "BROWNOUT_CLUSTER",
    ] {
        cmd.env_remove(v);
    }
    cmd.env("REDIS_URL", redis.url())
        .stdout(Stdio::from(std::fs::File::create(log).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()));
    Running {
        child: cmd.spawn().expect("start the binary"),
        log: log.to_path_buf(),
    }
}

fn check_alive(procs: &mut [Running]) {
    for p in procs {
        if let Some(st) = p.child.try_wait().unwrap() {
            panic!(
                "{} exited ({st}):\n{}",
                p.log.display(),
                std::fs::read_to_string(&p.log).unwrap_or_default()
            );
        }
    }
}
