//! `deploy/`: the Kubernetes manifests and the systemd units, against the schemas and the code.
//!
//! - Every kustomization (base and each overlay) renders with `kubectl kustomize` (kustomize v5)
//!   and validates with `kubernetes-validate --strict` (built-in kinds) and
//!   `deploy/kubernetes/validate-crds.py` (the Prometheus Operator's kinds, against the schemas of
//!   its published CRDs); `secrets.example.yaml` too.
//! - Drift: every flag, subcommand, environment variable, port and HTTP path the rendered
//!   manifests and the units give our four binaries exists in them: flags and subcommands in
//!   their `--help`, environment variables in `--help` or in the binary's own bytes, ports are
//!   the ones the binary listens on (its flags, its defaults, the mounted brownout.toml), and
//!   every probe, scrape and annotation path answers something other than 404 from the real
//!   binary, started here. The mounted brownout.toml, SLO file and policy are parsed by the
//!   control plane's own loaders. Services and monitors select pods that have the named ports.
//!   A variable's name as a string in the binary is evidence that the code names it, not proof
//!   that it reads it; a short name the compiler folds into instructions (std's `TMPDIR`) is not
//!   found, and is refused: give such a setting another way.
//! - The drain: preStop sleeps plus the binary's own stop (a gate's `--shutdown-grace-secs` + 10 s)
//!   end inside the grace period, a sidecar upstream outlives its gate's drain, the gates'
//!   readiness is `/health` and their liveness not, the control plane has two replicas or more,
//!   every Secret key read is in `secrets.example.yaml`; the gate's unit stops it with SIGTERM or
//!   SIGINT and waits out its drain.
//! - The PrometheusRules say what alerts/ says; every dashboard is a sidecar ConfigMap.
//! - The units pass `systemd-analyze verify` with no warning.
//!
//! Needs kubectl, kubernetes-validate and cloudcoil.models.prometheus_operator (PyPI),
//! systemd-analyze (scripts/test.sh installs them all) and the four binaries, which
//! `cargo test --workspace` builds; alone:
//! `cargo build -p brownout-serving -p brownout-gpu-agent -p brownout-demo && cargo test -p brownout --test it deploy_`.
//! A missing tool or binary fails the test with what to install; nothing is skipped. Run alone,
//! the three other binaries are whatever was last built: rebuild them after changing their code.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use brownout_test_support::{free_port, repo_root};
use serde::Deserialize;
use serde_yaml::Value;

/// Our binaries; any other image's command (vLLM, Redis, ClickHouse) is not checked here.
const OURS: [&str; 4] = ["brownout", "brownout-serve", "gpu-agent", "brownout-demo"];

/// Variables a container or unit sets for something other than our binary: the NVIDIA container
/// runtime reads these two to give a container NVML without a GPU request.
const FOR_THE_RUNTIME: [&str; 2] = ["NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"];

/// The marker of a kustomization that reads files outside its folder (the dashboards).
const NEEDS_NO_RESTRICTOR: &str =
    "# render: kubectl kustomize --load-restrictor LoadRestrictionsNone";

pub(crate) fn k8s_dir() -> PathBuf {
    repo_root().join("deploy/kubernetes")
}

pub(crate) fn binary(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_brownout"))
        .parent()
        .expect("bin dir")
        .join(name);
    assert!(
        p.exists(),
        "{} is not built: cargo test --workspace builds it, or \
         cargo build -p brownout-serving -p brownout-gpu-agent -p brownout-demo",
        p.display()
    );
    p
}

fn run(cmd: &mut Command, install: &str) -> std::process::Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}; {install} (scripts/test.sh does)"))
}

/// Every kustomization: base and each overlay, by folder name.
fn kustomizations() -> Vec<PathBuf> {
    let mut v = vec![k8s_dir().join("base")];
    let mut o: Vec<PathBuf> = std::fs::read_dir(k8s_dir().join("overlays"))
        .expect("deploy/kubernetes/overlays")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("kustomization.yaml").exists())
        .collect();
    o.sort();
    assert!(o.len() >= 3, "overlays: {o:?}");
    v.extend(o);
    v
}

fn kubectl_with_kustomize_v5() {
    let out = run(
        Command::new("kubectl").args(["version", "--client"]),
        "install kubectl (Debian: kubernetes-client)",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text
        .lines()
        .find_map(|l| l.strip_prefix("Kustomize Version: v"))
        .unwrap_or_else(|| panic!("kubectl has no kustomize built in: {text}"));
    let major: u32 = v
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    assert!(
        major >= 5,
        "kubectl's kustomize is v{v}; these kustomizations need v5 (kubectl 1.27 or newer)"
    );
}

fn render(dir: &Path) -> String {
    let kust = std::fs::read_to_string(dir.join("kustomization.yaml")).expect("kustomization");
    let mut cmd = Command::new("kubectl");
    cmd.arg("kustomize");
    if kust.contains(NEEDS_NO_RESTRICTOR) {
        cmd.args(["--load-restrictor", "LoadRestrictionsNone"]);
    }
    let out = run(cmd.arg(dir), "install kubectl");
    // A warning (a deprecated field, say) fails it too.
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

pub(crate) fn docs(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).expect("rendered YAML parses"))
        .filter(|v| !v.is_null())
        .collect()
}

pub(crate) fn name_of(d: &Value) -> String {
    format!(
        "{}/{}",
        d["kind"].as_str().unwrap_or("?"),
        d["metadata"]["name"].as_str().unwrap_or("?")
    )
}

pub(crate) fn strs(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn seq(v: &Value) -> &[Value] {
    v.as_sequence().map_or(&[], |s| s.as_slice())
}

#[test]
fn deploy_every_kustomization_renders_and_validates_strictly() {
    kubectl_with_kustomize_v5();
    let tmp = tempfile::tempdir().unwrap();
    let mut files = vec![k8s_dir().join("secrets.example.yaml")];
    for dir in kustomizations() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let f = tmp.path().join(format!("{name}.yaml"));
        std::fs::write(&f, render(&dir)).unwrap();
        files.push(f);
    }
    let out = run(
        Command::new("python3")
            .args(["-m", "kubernetes_validate", "--strict"])
            .args(&files),
        "pip install kubernetes-validate",
    );
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "kubernetes-validate --strict:\n{text}"
    );
    let mut crd_kinds = BTreeSet::new();
    for line in text.lines().filter(|l| !l.starts_with("INFO ")) {
        // The only warning allowed: a kind whose schema kubernetes-validate lacks, and only the
        // Prometheus Operator's, which validate-crds.py checks next.
        assert!(
            line.contains("Couldn't find schema for kind")
                && line.contains("with api version monitoring.coreos.com/v1"),
            "kubernetes-validate said: {line}"
        );
        crd_kinds.insert(
            line.split("kind ")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap(),
        );
    }
    let passed = text.lines().filter(|l| l.starts_with("INFO ")).count();
    assert!(passed >= 30, "only {passed} objects validated:\n{text}");
    assert!(
        crd_kinds.contains("ServiceMonitor") && crd_kinds.contains("PrometheusRule"),
        "{crd_kinds:?}"
    );
    let out = run(
        Command::new("python3")
            .arg(k8s_dir().join("validate-crds.py"))
            .args(&files),
        "pip install cloudcoil.models.prometheus_operator",
    );
    let crd = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "validate-crds.py:\n{crd}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("kubernetes-validate --strict: {passed} objects; the operator's kinds:\n{crd}");
}

// ---- what the binaries have --------------------------------------------------------------

/// One binary's `--help` per subcommand path, and its strings, read once.
#[derive(Default)]
struct Binaries {
    help: HashMap<(String, Vec<String>), Result<String, String>>,
    strings: HashMap<(String, String), bool>,
}

impl Binaries {
    fn help(&mut self, bin: &str, sub: &[String]) -> Result<String, String> {
        self.help
            .entry((bin.to_string(), sub.to_vec()))
            .or_insert_with(|| {
                let out = run(
                    Command::new(binary(bin)).args(sub).arg("--help"),
                    "build it",
                );
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                if out.status.success() {
                    Ok(text)
                } else {
                    Err(String::from_utf8_lossy(&out.stderr).into_owned())
                }
            })
            .clone()
    }

    /// Whether the binary's bytes hold `s` (the name of a variable it reads is a string in it).
    fn holds(&mut self, bin: &str, s: &str) -> bool {
        *self
            .strings
            .entry((bin.to_string(), s.to_string()))
            .or_insert_with(|| {
                let st = Command::new("grep")
                    .args(["-qaF", "--", s])
                    .arg(binary(bin))
                    .status()
                    .expect("grep");
                st.success()
            })
    }
}

/// `--flag` as a whole word in a help text.
fn has_flag(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(i, _)| {
        let next = help[i + flag.len()..].chars().next();
        let prev = help[..i].chars().next_back();
        !matches!(next, Some(c) if c.is_ascii_alphanumeric() || c == '-')
            && !matches!(prev, Some(c) if c.is_ascii_alphanumeric() || c == '-')
    })
}

/// The `[default: N]` of `--flag` in a help text (clap prints it in the flag's block).
fn flag_default(help: &str, flag: &str) -> Option<String> {
    let at = help.find(&format!("{flag} <"))?;
    let mut lines = help[at..].lines();
    let first = lines.next()?;
    std::iter::once(first)
        .chain(lines.take_while(|l| !l.trim_start().starts_with('-')))
        .find_map(|l| l.split("[default: ").nth(1))
        .and_then(|d| d.split(']').next())
        .map(String::from)
}

/// How a manifest or unit starts one of our binaries.
struct Invocation {
    /// Where it is named (for messages).
    at: String,
    bin: String,
    args: Vec<String>,
    /// Names set in its environment, with their literal value where the manifest gives one.
    env: BTreeMap<String, Option<String>>,
    /// Variables the orchestrator expands into `args` (`$(X)` in Kubernetes, `${X}` in systemd).
    expanded: BTreeSet<String>,
}

impl Invocation {
    /// The leading words before the first flag: the subcommand path.
    fn sub(&self) -> Vec<String> {
        self.args
            .iter()
            .take_while(|a| !a.starts_with('-'))
            .cloned()
            .collect()
    }

    fn flag_value(&self, flag: &str) -> Option<String> {
        let mut it = self.args.iter();
        while let Some(a) = it.next() {
            if a == flag {
                return it.next().cloned();
            }
            if let Some(v) = a.strip_prefix(&format!("{flag}=")) {
                return Some(v.to_string());
            }
        }
        None
    }

    /// Every name the invocation uses that the binary lacks.
    fn problems(&self, b: &mut Binaries) -> Vec<String> {
        let mut out = Vec::new();
        let sub = self.sub();
        let help = match b.help(&self.bin, &sub) {
            Ok(h) => h,
            Err(e) => {
                return vec![format!(
                    "{}: `{} {}` is not a command of it: {e}",
                    self.at,
                    self.bin,
                    sub.join(" ")
                )];
            }
        };
        for a in self.args.iter().filter(|a| a.starts_with("--")) {
            let flag = a.split('=').next().unwrap();
            if !has_flag(&help, flag) {
                out.push(format!(
                    "{}: {} {} has no flag {flag}",
                    self.at,
                    self.bin,
                    sub.join(" ")
                ));
            }
        }
        for name in &self.expanded {
            if !self.env.contains_key(name) {
                out.push(format!(
                    "{}: expands {name}, which it does not set",
                    self.at
                ));
            }
        }
        for name in self.env.keys() {
            if self.expanded.contains(name) || FOR_THE_RUNTIME.contains(&name.as_str()) {
                continue;
            }
            let in_help = help.contains(&format!("[env: {name}="))
                || help.contains(&format!("[env: {name}]"));
            if !in_help && !b.holds(&self.bin, name) {
                out.push(format!(
                    "{}: {} reads no variable {name}",
                    self.at, self.bin
                ));
            }
        }
        out
    }
}

/// Variables named `$(X)` (Kubernetes) or `${X}` / `$X` (systemd) in `words`.
fn expanded_vars(words: &[String], open: &str, close: &str) -> BTreeSet<String> {
    let mut v = BTreeSet::new();
    for w in words {
        for part in w.split(open).skip(1) {
            if let Some(name) = part.split(close).next() {
                v.insert(name.to_string());
            }
        }
    }
    v
}

// ---- the rendered manifests --------------------------------------------------------------

pub(crate) struct Overlay {
    pub(crate) name: String,
    pub(crate) docs: Vec<Value>,
}

pub(crate) fn rendered() -> Vec<Overlay> {
    kubectl_with_kustomize_v5();
    kustomizations()
        .iter()
        .map(|d| Overlay {
            name: d.file_name().unwrap().to_string_lossy().into_owned(),
            docs: docs(&render(d)),
        })
        .collect()
}

/// (where, pod template metadata, pod spec) of every workload.
pub(crate) fn pod_templates(docs: &[Value]) -> Vec<(String, &Value, &Value)> {
    let mut v = Vec::new();
    for d in docs {
        let t = match d["kind"].as_str() {
            Some("Deployment" | "DaemonSet" | "StatefulSet" | "Job" | "ReplicaSet") => {
                &d["spec"]["template"]
            }
            Some("CronJob") => &d["spec"]["jobTemplate"]["spec"]["template"],
            Some("Pod") => d,
            _ => continue,
        };
        v.push((name_of(d), &t["metadata"], &t["spec"]));
    }
    v
}

pub(crate) fn containers(pod: &Value) -> impl Iterator<Item = &Value> {
    seq(&pod["initContainers"])
        .iter()
        .chain(seq(&pod["containers"]))
}

pub(crate) fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
}

/// Our binary in a container, if it runs one.
fn invocation(docs: &[Value], at: &str, c: &Value) -> Option<Invocation> {
    let cmd = strs(&c["command"]);
    let bin = cmd.first()?.rsplit('/').next()?.to_string();
    if !OURS.contains(&bin.as_str()) {
        return None;
    }
    let mut args: Vec<String> = cmd[1..].to_vec();
    args.extend(strs(&c["args"]));
    let mut env = BTreeMap::new();
    for e in seq(&c["env"]) {
        env.insert(
            e["name"].as_str().expect("env name").to_string(),
            e["value"].as_str().map(String::from),
        );
    }
    for from in seq(&c["envFrom"]) {
        let cm = from["configMapRef"]["name"]
            .as_str()
            .expect("envFrom configMapRef");
        let data = &find(docs, "ConfigMap", cm).expect("envFrom's ConfigMap")["data"];
        for (k, v) in data.as_mapping().expect("data") {
            env.insert(
                k.as_str().unwrap().to_string(),
                v.as_str().map(String::from),
            );
        }
    }
    let expanded = expanded_vars(&args, "$(", ")");
    Some(Invocation {
        at: format!("{at} container {}", c["name"].as_str().unwrap_or("?")),
        bin,
        args,
        env,
        expanded,
    })
}

/// The file a container sees at `path`, when a ConfigMap volume puts it there.
fn mounted_file(docs: &[Value], pod: &Value, c: &Value, path: &str) -> Option<String> {
    for m in seq(&c["volumeMounts"]) {
        let mount = m["mountPath"].as_str()?;
        let Some(rest) = path.strip_prefix(&format!("{}/", mount.trim_end_matches('/'))) else {
            continue;
        };
        let vol = seq(&pod["volumes"])
            .iter()
            .find(|v| v["name"] == m["name"])?;
        let cm = find(docs, "ConfigMap", vol["configMap"]["name"].as_str()?)?;
        return cm["data"][rest].as_str().map(String::from);
    }
    None
}

/// The ports the invocation listens on, and the control plane's mounted files checked by its
/// own loaders.
fn listening_ports(
    docs: &[Value],
    pod: &Value,
    c: &Value,
    inv: &Invocation,
    b: &mut Binaries,
) -> BTreeSet<u16> {
    let sub = inv.sub();
    let help = b.help(&inv.bin, &sub).unwrap_or_default();
    let from_flag = |flag: &str, env: Option<&str>| -> u16 {
        inv.flag_value(flag)
            .or_else(|| env.and_then(|e| inv.env.get(e).cloned().flatten()))
            .or_else(|| flag_default(&help, flag))
            .unwrap_or_else(|| panic!("{}: no {flag} and no default", inv.at))
            .parse()
            .unwrap_or_else(|e| panic!("{}: {flag}: {e}", inv.at))
    };
    match (inv.bin.as_str(), sub.first().map(String::as_str)) {
        ("brownout", Some("serve")) => {
            let path = inv.flag_value("--config").expect("brownout serve --config");
            let text = mounted_file(docs, pod, c, &path)
                .unwrap_or_else(|| panic!("{}: {path} is not mounted from a ConfigMap", inv.at));
            // With the container's environment as the manifest gives it (Secrets aside).
            let env: BTreeMap<String, String> = inv
                .env
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
                .collect();
            let cfg = brownout::config::Config::from_toml_str(&path, &text, &env)
                .unwrap_or_else(|e| panic!("{}: {e}", inv.at));
            let slo = cfg
                .slo_file
                .as_ref()
                .expect("control.slo_file")
                .display()
                .to_string();
            let slo_text = mounted_file(docs, pod, c, &slo).expect("the SLO file is mounted");
            let specs = brownout::slo::spec::parse_str(&slo_text, &slo)
                .unwrap_or_else(|e| panic!("{}: {e}", inv.at));
            assert!(!specs.is_empty(), "{slo}: no SLO");
            let pol = cfg
                .policy_file
                .as_ref()
                .expect("policy_file")
                .display()
                .to_string();
            let pol_text = mounted_file(docs, pod, c, &pol).expect("the policy is mounted");
            brownout::degrade::policy::Policy::from_yaml(&pol_text)
                .unwrap_or_else(|e| panic!("{}: {pol}: {e}", inv.at));
            [cfg.http_addr, cfg.otlp_http_addr, cfg.otlp_grpc_addr]
                .iter()
                .map(|a| a.port())
                .collect()
        }
        ("brownout-serve", None) => [from_flag("--port", Some("BROWNOUT_SERVE_PORT"))].into(),
        ("gpu-agent", None) => [from_flag("--port", None)].into(),
        ("brownout-demo", Some("demo")) => [from_flag("--port", None)].into(),
        _ => BTreeSet::new(),
    }
}

fn container_ports(c: &Value) -> BTreeMap<String, u16> {
    seq(&c["ports"])
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or("").to_string(),
                p["containerPort"].as_u64().expect("containerPort") as u16,
            )
        })
        .collect()
}

fn labels_match(selector: &Value, labels: &Value) -> bool {
    selector
        .as_mapping()
        .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| &labels[k.as_str().unwrap()] == v))
}

/// What brownout-serve takes after its `--shutdown-grace-secs` at most: 5 s for the cancelled
/// work to settle (`CANCEL_SETTLE`), 5 s for the connections to close (`CLOSE_WAIT`).
const SERVE_AFTER_GRACE_S: u64 = 10;

/// A brownout-serve invocation's `--shutdown-grace-secs`: its own, else the help's default.
fn serve_grace(inv: &Invocation, b: &mut Binaries) -> Result<u64, String> {
    let v = inv.flag_value("--shutdown-grace-secs").or_else(|| {
        b.help(&inv.bin, &inv.sub())
            .ok()
            .and_then(|h| flag_default(&h, "--shutdown-grace-secs"))
    });
    v.as_deref()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{}: no --shutdown-grace-secs (got {v:?})", inv.at))
}

/// Every running container's preStop sleep plus its binary's stop ends inside the pod's
/// termination grace period (at its end comes SIGKILL): the control plane's `shutdown_grace_ms`
/// and gpu-agent's stop 10 s (up to the period), brownout-serve's `--shutdown-grace-secs` plus
/// [`SERVE_AFTER_GRACE_S`] (strictly under it). In a pod where a gate forwards to a loopback upstream (vLLM beside
/// it), every other container's preStop outlasts the gate's preStop plus its grace, so the
/// upstream still answers the requests the gate lets finish. (Init containers are not running
/// when the pod stops.)
fn drain_problems(docs: &[Value], at: &str, pod: &Value, b: &mut Binaries) -> Vec<String> {
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
    let sleep_of = |c: &Value| {
        c["lifecycle"]["preStop"]["sleep"]["seconds"]
            .as_u64()
            .unwrap_or(0)
    };
    let mut v = Vec::new();
    // (the gate's preStop + grace) of gates with a loopback upstream
    let mut upstream_needed_until = None;
    for c in seq(&pod["containers"]) {
        let name = c["name"].as_str().unwrap_or("?");
        let sleep = sleep_of(c);
        let (after, why, strict) = match invocation(docs, at, c) {
            Some(inv) if inv.bin == "brownout-serve" && inv.sub().is_empty() => {
                match serve_grace(&inv, b) {
                    Ok(g) => {
                        if inv.args.iter().any(|a| {
                            a.contains("=http://127.0.0.1:") || a.contains("=http://localhost:")
                        }) {
                            upstream_needed_until = Some(sleep + g);
                        }
                        (
                            g + SERVE_AFTER_GRACE_S,
                            format!(" (--shutdown-grace-secs {g} + {SERVE_AFTER_GRACE_S} s)"),
                            true,
                        )
                    }
                    Err(e) => {
                        v.push(e);
                        continue;
                    }
                }
            }
            Some(_) => (10, String::new(), false),
            None => (0, String::new(), false),
        };
        // A gate's sum is an upper bound it reaches only when a stream outlives the grace:
        // strictly under the period. The others' 10 s is an allowance: up to it.
        if sleep + after > grace || (strict && sleep + after == grace) {
            v.push(format!(
                "{at} container {name}: preStop {sleep} s + {after} s stop{why} is not under \
                 terminationGracePeriodSeconds {grace}"
            ));
        }
    }
    if let Some(until) = upstream_needed_until {
        for c in seq(&pod["containers"]) {
            let ours = strs(&c["command"])
                .first()
                .is_some_and(|b| OURS.contains(&b.as_str()));
            if !ours && sleep_of(c) <= until {
                v.push(format!(
                    "{at} container {}: preStop {} s ends before the gate's drain does ({until} s)",
                    c["name"].as_str().unwrap_or("?"),
                    sleep_of(c)
                ));
            }
        }
    }
    v
}

/// Every `http://NAME:PORT` a container is given (args, env values, ConfigMap values it reads)
/// whose NAME is a bare Service name: that Service exists in the overlay and has that port.
/// Names with dots (your Redis, ClickHouse or vLLM elsewhere) and loopback are not checked.
fn service_url_problems(o: &Overlay) -> Vec<String> {
    let mut values: Vec<String> = Vec::new();
    for (_, _, pod) in pod_templates(&o.docs) {
        for c in containers(pod) {
            values.extend(strs(&c["args"]));
            values.extend(
                seq(&c["env"])
                    .iter()
                    .filter_map(|e| e["value"].as_str().map(String::from)),
            );
        }
    }
    for d in o.docs.iter().filter(|d| d["kind"] == "ConfigMap") {
        if let Some(m) = d["data"].as_mapping() {
            values.extend(m.values().filter_map(|v| v.as_str().map(String::from)));
        }
    }
    let mut v = Vec::new();
    for val in values {
        for part in val.split("://").skip(1) {
            let host_port = part.split(['/', ' ', '\n']).next().unwrap_or("");
            let host_port = host_port.rsplit('@').next().unwrap_or("");
            let Some((host, port)) = host_port.split_once(':') else {
                continue;
            };
            if host.contains('.') || host.contains('$') || host == "localhost" || host.is_empty() {
                continue;
            }
            let port: u64 = port.split(',').next().unwrap_or("").parse().unwrap_or(0);
            match find(&o.docs, "Service", host) {
                Some(svc)
                    if seq(&svc["spec"]["ports"])
                        .iter()
                        .any(|p| p["port"].as_u64() == Some(port)) => {}
                Some(_) => v.push(format!(
                    "{}: {val}: Service {host} has no port {port}",
                    o.name
                )),
                None => v.push(format!(
                    "{}: {val}: no Service {host} in this overlay",
                    o.name
                )),
            }
        }
    }
    v
}

/// What serves one HTTP path: which binary, run how.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug)]
struct Route {
    bin: String,
    /// A gate's (`--upstream`) arguments as the manifest gives them: it is started with them.
    /// Empty for the others, which are started with arguments of the test's own.
    args: Vec<String>,
    path: String,
}

/// Checks one overlay; returns the problems, and the HTTP paths it asks of our binaries.
fn check_overlay(o: &Overlay, b: &mut Binaries) -> (Vec<String>, BTreeSet<Route>) {
    let mut problems = Vec::new();
    let mut routes = BTreeSet::new();
    // per pod template: port names → numbers, and our ports → (binary, a gate's arguments)
    let mut pods: Vec<(
        &Value,
        BTreeMap<String, u16>,
        BTreeMap<u16, (String, Vec<String>)>,
    )> = Vec::new();
    for (at, meta, pod) in pod_templates(&o.docs) {
        let at = format!("{}: {at}", o.name);
        let mut names = BTreeMap::new();
        let mut ours = BTreeMap::new();
        problems.extend(drain_problems(&o.docs, &at, pod, b));
        for c in containers(pod) {
            let declared = container_ports(c);
            names.extend(declared.clone());
            let Some(inv) = invocation(&o.docs, &at, c) else {
                continue;
            };
            problems.extend(inv.problems(b));
            let listening = listening_ports(&o.docs, pod, c, &inv, b);
            let decl: BTreeSet<u16> = declared.values().copied().collect();
            if decl != listening {
                problems.push(format!(
                    "{}: declares ports {decl:?}, listens on {listening:?}",
                    inv.at
                ));
            }
            let args = if inv.args.iter().any(|a| a.starts_with("--upstream")) {
                inv.args.clone()
            } else {
                Vec::new()
            };
            for p in &listening {
                ours.insert(*p, (inv.bin.clone(), args.clone()));
            }
            if inv.bin == "brownout-serve" && !declared.is_empty() {
                // The drain: readiness on /health (503 while drained or without upstream),
                // liveness anything but /health (a drain must not restart it).
                if c["readinessProbe"]["httpGet"]["path"] != "/health" {
                    problems.push(format!("{}: readiness is not GET /health", inv.at));
                }
                if c["livenessProbe"].is_null()
                    || c["livenessProbe"]["httpGet"]["path"] == "/health"
                {
                    problems.push(format!(
                        "{}: needs a liveness probe other than /health",
                        inv.at
                    ));
                }
            }
            for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
                let pr = &c[probe];
                let (port, path) = if !pr["httpGet"].is_null() {
                    (&pr["httpGet"]["port"], pr["httpGet"]["path"].as_str())
                } else if !pr["tcpSocket"].is_null() {
                    (&pr["tcpSocket"]["port"], None)
                } else {
                    continue;
                };
                let n = port
                    .as_u64()
                    .map(|n| n as u16)
                    .or_else(|| declared.get(port.as_str().unwrap_or("")).copied());
                match n {
                    Some(n) if listening.contains(&n) => {}
                    _ => problems.push(format!(
                        "{}: {probe} on {port:?}, not a port it listens on",
                        inv.at
                    )),
                }
                if let Some(path) = path {
                    routes.insert(Route {
                        bin: inv.bin.clone(),
                        args: args.clone(),
                        path: path.to_string(),
                    });
                }
            }
        }
        let ann = &meta["annotations"];
        if ann["prometheus.io/scrape"].as_str() == Some("true") {
            let port: u16 = ann["prometheus.io/port"]
                .as_str()
                .and_then(|p| p.parse().ok())
                .expect("prometheus.io/port");
            match ours.get(&port) {
                Some((bin, args)) => {
                    routes.insert(Route {
                        bin: bin.clone(),
                        args: args.clone(),
                        path: ann["prometheus.io/path"]
                            .as_str()
                            .unwrap_or("/metrics")
                            .into(),
                    });
                }
                None => problems.push(format!(
                    "{at}: scrape annotation on {port}, which none of ours listens on"
                )),
            }
        }
        pods.push((meta, names, ours));
    }
    problems.extend(service_url_problems(o));
    // Services, ServiceMonitors and PodMonitors: the pods they select have the ports they name.
    let selected = |sel: &Value| -> Vec<usize> {
        (0..pods.len())
            .filter(|&i| labels_match(sel, &pods[i].0["labels"]))
            .collect()
    };
    for d in &o.docs {
        let at = format!("{}: {}", o.name, name_of(d));
        let kind = d["kind"].as_str().unwrap_or("");
        let (sel, ports): (&Value, Vec<(Value, Option<&str>)>) = match kind {
            "Service" => (
                &d["spec"]["selector"],
                seq(&d["spec"]["ports"])
                    .iter()
                    .map(|p| (p["targetPort"].clone(), None))
                    .collect(),
            ),
            "PodMonitor" => (
                &d["spec"]["selector"]["matchLabels"],
                seq(&d["spec"]["podMetricsEndpoints"])
                    .iter()
                    .map(|e| (e["port"].clone(), e["path"].as_str()))
                    .collect(),
            ),
            "ServiceMonitor" => {
                // The pods behind the Services it selects, by the Service port's target.
                let mut v = Vec::new();
                let mut sel = &Value::Null;
                for svc in o.docs.iter().filter(|s| {
                    s["kind"] == "Service"
                        && labels_match(
                            &d["spec"]["selector"]["matchLabels"],
                            &s["metadata"]["labels"],
                        )
                }) {
                    sel = &svc["spec"]["selector"];
                    for e in seq(&d["spec"]["endpoints"]) {
                        let sp = seq(&svc["spec"]["ports"])
                            .iter()
                            .find(|p| p["name"] == e["port"]);
                        if let Some(sp) = sp {
                            v.push((sp["targetPort"].clone(), e["path"].as_str()));
                        }
                    }
                }
                if v.is_empty() {
                    problems.push(format!("{at}: selects no Service port"));
                }
                (sel, v)
            }
            _ => continue,
        };
        let chosen = selected(sel);
        if chosen.is_empty() {
            problems.push(format!("{at}: selects no pod"));
        }
        for i in chosen {
            let (_, names, ours) = &pods[i];
            for (port, path) in &ports {
                let n = port
                    .as_u64()
                    .map(|n| n as u16)
                    .or_else(|| names.get(port.as_str().unwrap_or("")).copied());
                let Some(n) = n else {
                    problems.push(format!(
                        "{at}: port {port:?} is not a port of the pods it selects"
                    ));
                    continue;
                };
                if let (Some(path), Some((bin, args))) = (path, ours.get(&n)) {
                    routes.insert(Route {
                        bin: bin.clone(),
                        args: args.clone(),
                        path: path.to_string(),
                    });
                }
            }
        }
    }
    (problems, routes)
}

/// A process of ours, killed (by its PID) when dropped; its output goes to `log`.
pub(crate) struct Running {
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status code of `GET path`, once the port answers (within `limit`); a process that exits
/// first fails the test with its output.
fn get_status(p: &mut Running, port: u16, path: &str, limit: Duration) -> u16 {
    let start = Instant::now();
    loop {
        if let Some(st) = p.child.try_wait().expect("try_wait") {
            panic!(
                "{} exited ({st}) before answering:\n{}",
                p.log.display(),
                std::fs::read_to_string(&p.log).unwrap_or_default()
            );
        }
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            write!(
                s,
                "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut head = [0u8; 12];
            if s.read_exact(&mut head).is_ok() {
                let line = String::from_utf8_lossy(&head);
                return line[9..12]
                    .parse()
                    .unwrap_or_else(|_| panic!("status line {line:?}"));
            }
        }
        assert!(
            start.elapsed() < limit,
            "nothing answered on 127.0.0.1:{port} within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts the binary a route names on a spare port: a gate with the manifest's own arguments
/// (its port and upstream URLs swapped for a spare port and an upstream nobody answers on, as
/// when vLLM is still loading), the others in a mode of the test's own.
fn start_for(route: &Route, tmp: &Path) -> (Running, u16) {
    let port = free_port();
    let log = tmp.join(format!("{}-{port}.log", route.bin));
    let mut cmd = Command::new(binary(&route.bin));
    cmd.stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
    for v in [
        "REDIS_URL",
        "CLICKHOUSE_URL",
        "BROWNOUT_CONTROL_PLANE",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ] {
        cmd.env_remove(v);
    }
    match route.bin.as_str() {
        "brownout" => {
            let (h, g) = (free_port(), free_port());
            let cfg = tmp.join(format!("cp-{port}.toml"));
            std::fs::write(
                &cfg,
                format!(
                    "[server]\nhttp_addr = \"127.0.0.1:{port}\"\notlp_http_addr = \"127.0.0.1:{h}\"\n\
                     otlp_grpc_addr = \"127.0.0.1:{g}\"\n[storage]\ndata_dir = {:?}\n",
                    tmp.join(format!("data-{port}"))
                ),
            )
            .unwrap();
            cmd.args(["serve", "--config"]).arg(&cfg);
            for t in ["INGEST", "READ", "ADMIN"] {
                cmd.env(
                    format!("BROWNOUT_{t}_TOKEN"),
                    format!("deploy-test-{t}-token-0123456789"),
                );
            }
        }
        "brownout-serve" if !route.args.is_empty() => {
            let dead = free_port();
            let mut args = route.args.iter();
            while let Some(a) = args.next() {
                match a.as_str() {
                    "--port" => {
                        args.next();
                    }
                    "--upstream" => {
                        let v = args.next().expect("--upstream value");
                        let r = v.split_once('=').map_or("primary", |(r, _)| r);
                        cmd.arg("--upstream")
                            .arg(format!("{r}=http://127.0.0.1:{dead}"));
                    }
                    _ => {
                        cmd.arg(a);
                    }
                }
            }
            cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()]);
        }
        "brownout-serve" => {
            cmd.args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--model",
                "toy",
            ]);
        }
        "gpu-agent" => {
            cmd.args([
                "--listen",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--simulate-gpus",
                "1",
            ]);
        }
        other => panic!("no way to start {other} here"),
    }
    let child = cmd.spawn().expect("start the binary");
    (Running { child, log }, port)
}

#[test]
fn deploy_manifests_name_only_what_the_binaries_have() {
    let mut b = Binaries::default();
    let mut problems = Vec::new();
    let mut routes = BTreeSet::new();
    let mut checked = 0;
    for o in rendered() {
        let (p, r) = check_overlay(&o, &mut b);
        checked += pod_templates(&o.docs).len();
        problems.extend(p);
        routes.extend(r);
    }
    // Every HTTP path asked of a binary answers from the real binary with a route (not 404).
    let tmp = tempfile::tempdir().unwrap();
    let mut by_server: BTreeMap<(String, Vec<String>), Vec<String>> = BTreeMap::new();
    for r in &routes {
        by_server
            .entry((r.bin.clone(), r.args.clone()))
            .or_default()
            .push(r.path.clone());
    }
    for ((bin, args), paths) in &by_server {
        let route = Route {
            bin: bin.clone(),
            args: args.clone(),
            path: String::new(),
        };
        let (mut proc, port) = start_for(&route, tmp.path());
        for path in paths {
            let code = get_status(&mut proc, port, path, Duration::from_secs(120));
            println!("{bin} {}: GET {path} -> {code}", args.join(" "));
            if code == 404 {
                problems.push(format!("{bin} {}: no route {path} (404)", args.join(" ")));
            }
        }
    }
    assert!(checked >= 6, "only {checked} workloads");
    // Every key of the Secret a container reads is one secrets.example.yaml says how to make.
    let example = docs(&std::fs::read_to_string(k8s_dir().join("secrets.example.yaml")).unwrap());
    let secret = example
        .iter()
        .find(|d| d["kind"] == "Secret")
        .expect("the example Secret");
    let secret_name = secret["metadata"]["name"].as_str().unwrap();
    for o in rendered() {
        let cp = find(&o.docs, "Deployment", "brownout-control-plane").expect("the control plane");
        let n = cp["spec"]["replicas"].as_u64().unwrap_or(1);
        assert!(n >= 2, "{}: the control plane runs {n} replica(s)", o.name);
        for (at, _, pod) in pod_templates(&o.docs) {
            for c in containers(pod) {
                for e in seq(&c["env"]) {
                    let r = &e["valueFrom"]["secretKeyRef"];
                    if r.is_null() {
                        continue;
                    }
                    let key = r["key"].as_str().unwrap_or("?");
                    if r["name"] != secret_name || secret["stringData"][key].is_null() {
                        problems.push(format!(
                            "{}: {at}: {} reads {}/{key}, which secrets.example.yaml lacks",
                            o.name,
                            e["name"].as_str().unwrap_or("?"),
                            r["name"].as_str().unwrap_or("?")
                        ));
                    }
                }
            }
        }
    }
    let must = [
        "/healthz",
        "/health",
        "/metrics",
        "/metrics/upstream/primary",
    ];
    for m in must {
        assert!(
            routes.iter().any(|r| r.path == m),
            "no manifest asks for {m}: {routes:?}"
        );
    }
    assert!(
        problems.is_empty(),
        "the manifests name what the binaries lack:\n{}",
        problems.join("\n")
    );
}

/// The container `name` of a workload, to change it.
fn container_mut<'a>(workload: &'a mut Value, name: &str) -> &'a mut Value {
    workload["spec"]["template"]["spec"]["containers"]
        .as_sequence_mut()
        .expect("containers")
        .iter_mut()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

#[test]
fn deploy_a_flag_the_binary_lacks_is_caught() {
    // The drift check itself, on overlays/vllm changed by hand: a flag and a variable
    // brownout-serve does not have, a port gpu-agent does not listen on, a Service port nobody
    // serves, a grace period shorter than the gate's preStop plus its --shutdown-grace-secs and
    // what follows it...
    let o = rendered()
        .into_iter()
        .find(|o| o.name == "vllm")
        .expect("overlay vllm");
    let mut text = serde_yaml::to_string(&o.docs).unwrap();
    text = text
        .replace("--upstream-max-concurrency", "--upstream-max-concurrencies")
        .replace("BROWNOUT_INSTANCE_ID", "BROWNOUT_INSTANCE_NAME")
        .replace("containerPort: 9400", "containerPort: 9401")
        .replace("http://brownout-otlp:4317", "http://brownout-otlp:4316")
        .replace(
            "terminationGracePeriodSeconds: 60",
            "terminationGracePeriodSeconds: 35",
        );
    let mut docs: Vec<Value> = serde_yaml::from_str(&text).unwrap();
    // ...and the gate's liveness on /health, where a drain would restart it.
    let vllm = docs
        .iter_mut()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "vllm")
        .expect("Deployment/vllm");
    container_mut(vllm, "gate")["livenessProbe"] =
        serde_yaml::from_str("{httpGet: {path: /health, port: http}}").unwrap();
    // ...and vLLM's preStop shorter than the gate's preStop plus its grace (gone while the gate
    // still lets requests finish).
    container_mut(vllm, "vllm")["lifecycle"]["preStop"]["sleep"]["seconds"] = 20.into();
    let (p, _) = check_overlay(
        &Overlay {
            name: "vllm (changed)".into(),
            docs,
        },
        &mut Binaries::default(),
    );
    let all = p.join("\n");
    for want in [
        "has no flag --upstream-max-concurrencies",
        "reads no variable BROWNOUT_INSTANCE_NAME",
        "declares ports {9401}, listens on {9400}",
        "http://brownout-otlp:4316: Service brownout-otlp has no port 4316",
        "container gate: preStop 5 s + 40 s stop (--shutdown-grace-secs 30 + 10 s) is not under \
         terminationGracePeriodSeconds 35",
        "container vllm: preStop 20 s ends before the gate's drain does (35 s)",
        "container gate: needs a liveness probe other than /health",
    ] {
        assert!(all.contains(want), "not caught: {want}\n{all}");
    }
}

#[test]
fn deploy_the_prometheusrules_are_the_alerts_dir() {
    let dir = k8s_dir().join("components/prometheus-operator");
    let text = std::fs::read_to_string(dir.join("prometheusrule.yaml")).unwrap();
    let mut seen = BTreeSet::new();
    for d in docs(&text) {
        let src = d["metadata"]["annotations"]["brownout/source-file"]
            .as_str()
            .expect("source-file annotation")
            .to_string();
        let file: Value =
            serde_yaml::from_str(&std::fs::read_to_string(repo_root().join(&src)).unwrap())
                .unwrap();
        assert_eq!(
            d["spec"]["groups"],
            file["groups"],
            "{} differs from {src}: run {}/gen-prometheusrule.py",
            name_of(&d),
            dir.display()
        );
        seen.insert(src);
    }
    let mut want = BTreeSet::new();
    for e in std::fs::read_dir(repo_root().join("alerts")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "yml") {
            want.insert(format!(
                "alerts/{}",
                p.file_name().unwrap().to_string_lossy()
            ));
        }
    }
    assert_eq!(
        seen, want,
        "run gen-prometheusrule.py: a rules file has no PrometheusRule"
    );
}

#[test]
fn deploy_every_dashboard_is_a_sidecar_configmap() {
    kubectl_with_kustomize_v5();
    let d = docs(&render(&k8s_dir().join("overlays/vllm-monitoring")));
    let mut n = 0;
    for e in std::fs::read_dir(repo_root().join("dashboards")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let file = p.file_name().unwrap().to_string_lossy().into_owned();
        let body = std::fs::read_to_string(&p).unwrap();
        let cm = d
            .iter()
            .find(|c| c["kind"] == "ConfigMap" && c["data"][file.as_str()].is_string())
            .unwrap_or_else(|| panic!("no ConfigMap carries dashboards/{file}: add it to components/grafana-dashboards"));
        assert_eq!(
            cm["data"][file.as_str()].as_str(),
            Some(body.as_str()),
            "{file}"
        );
        assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1", "{file}");
        n += 1;
    }
    assert!(n >= 5, "{n} dashboards");
}

// ---- systemd -------------------------------------------------------------------------------

fn units() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo_root().join("deploy/systemd"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "service"))
        .collect();
    v.sort();
    v
}

/// `Key=value` lines of a unit's or environment file's text (comments and sections left out).
fn assignments(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('[') && l.contains('='))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.trim().to_string(), v.trim().to_string())
        })
        .collect()
}

/// brownout-serve's unit stops it with a signal it drains on, and waits out the drain:
/// `TimeoutStopSec` above `--shutdown-grace-secs` plus [`SERVE_AFTER_GRACE_S`].
fn serve_unit_stop_problems(
    inv: &Invocation,
    a: &[(String, String)],
    b: &mut Binaries,
) -> Vec<String> {
    let get = |k: &str| a.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let mut v = Vec::new();
    let signal = get("KillSignal").unwrap_or("SIGTERM");
    if !matches!(signal, "SIGTERM" | "SIGINT") {
        v.push(format!("{}: KillSignal={signal} does not drain", inv.at));
    }
    let grace = match serve_grace(inv, b) {
        Ok(g) => g,
        Err(e) => return vec![e],
    };
    // systemd's default is 90 s; a plain number is seconds.
    let timeout = get("TimeoutStopSec").map_or(Some(90), |t| {
        t.strip_suffix('s').unwrap_or(t).parse::<u64>().ok()
    });
    match timeout {
        Some(t) if t > grace + SERVE_AFTER_GRACE_S => {}
        t => v.push(format!(
            "{}: TimeoutStopSec {} is not above --shutdown-grace-secs {grace} + \
             {SERVE_AFTER_GRACE_S} s",
            inv.at,
            t.map_or("(not a number of seconds)".to_string(), |t| format!(
                "{t} s"
            ))
        )),
    }
    v
}

#[test]
fn deploy_systemd_units_verify_and_name_only_what_the_binaries_have() {
    let units = units();
    assert_eq!(units.len(), 4, "{units:?}");
    // A root with systemd's own units, ours, and our binaries where ExecStart names them.
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    std::fs::create_dir_all(r.join("etc/systemd/system")).unwrap();
    std::fs::create_dir_all(r.join("usr/local/bin")).unwrap();
    std::fs::create_dir_all(r.join("usr/lib/systemd")).unwrap();
    let cp = Command::new("cp")
        .args(["-a", "/usr/lib/systemd/system"])
        .arg(r.join("usr/lib/systemd/"))
        .status()
        .expect("cp");
    assert!(
        cp.success(),
        "systemd's units in /usr/lib/systemd/system: apt-get install systemd"
    );
    let mut b = Binaries::default();
    let mut problems = Vec::new();
    for u in &units {
        std::fs::copy(u, r.join("etc/systemd/system").join(u.file_name().unwrap())).unwrap();
        let text = std::fs::read_to_string(u).unwrap();
        let a = assignments(&text);
        let exec = &a
            .iter()
            .find(|(k, _)| k == "ExecStart")
            .expect("ExecStart")
            .1;
        let words: Vec<String> = exec.split_whitespace().map(String::from).collect();
        let bin = words[0].rsplit('/').next().unwrap().to_string();
        assert!(OURS.contains(&bin.as_str()), "{}: runs {bin}", u.display());
        let stub = r.join("usr/local/bin").join(&bin);
        std::fs::write(
            &stub,
            format!("#!/bin/sh\nexec {:?} \"$@\"\n", binary(&bin)),
        )
        .unwrap();
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Other commands of the unit (ExecReload's kill): the host's own, into the root.
        for (k, v) in &a {
            let Some(cmd) = v.split_whitespace().next() else {
                continue;
            };
            if k.starts_with("Exec") && k != "ExecStart" && cmd.starts_with('/') {
                let host = Path::new(cmd);
                assert!(
                    host.exists(),
                    "{}: {k} runs {cmd}, which this host lacks",
                    u.display()
                );
                let dst = r.join(cmd.trim_start_matches('/'));
                std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
                std::fs::copy(host, &dst).unwrap();
            }
        }
        let mut env = BTreeMap::new();
        for (k, v) in &a {
            if k == "Environment" {
                let (n, val) = v.split_once('=').unwrap();
                env.insert(n.to_string(), Some(val.to_string()));
            }
            if k == "EnvironmentFile" {
                // The example of /etc/brownout/X.env is deploy/systemd/env/X.env.
                let name = Path::new(v.trim_start_matches('-')).file_name().unwrap();
                let ex = repo_root().join("deploy/systemd/env").join(name);
                let t = std::fs::read_to_string(&ex).unwrap_or_else(|e| {
                    panic!("{}: no example {}: {e}", u.display(), ex.display())
                });
                for (n, val) in assignments(&t) {
                    env.insert(n, Some(val));
                }
                // `#NAME=` lines are variables it offers to set: they must exist too.
                for l in t.lines() {
                    if let Some((n, _)) = l.strip_prefix('#').and_then(|l| l.split_once('=')) {
                        if !n.is_empty() && n.bytes().all(|c| c.is_ascii_uppercase() || c == b'_') {
                            env.entry(n.to_string()).or_insert(None);
                        }
                    }
                }
            }
        }
        let expanded = expanded_vars(&words, "${", "}");
        let inv = Invocation {
            at: u.display().to_string(),
            bin,
            args: words[1..].to_vec(),
            env,
            expanded,
        };
        if inv.bin == "brownout-serve" {
            problems.extend(serve_unit_stop_problems(&inv, &a, &mut b));
        }
        problems.extend(inv.problems(&mut b));
    }
    let paths: Vec<PathBuf> = units
        .iter()
        .map(|u| r.join("etc/systemd/system").join(u.file_name().unwrap()))
        .collect();
    let out = run(
        Command::new("systemd-analyze")
            .args(["verify", "--root"])
            .arg(r)
            .args(&paths),
        "apt-get install systemd",
    );
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify (exit {:?}), every line is a defect:\n{said}",
        out.status.code()
    );
    assert!(
        problems.is_empty(),
        "the units name what the binaries lack:\n{}",
        problems.join("\n")
    );
}

/// The policy the base mounts is the one policy (`examples/policy.yaml`, the control plane's
/// built-in default): a copy, since kustomize loads nothing from outside its folder.
#[test]
fn deploy_the_mounted_policy_is_the_default_policy() {
    let copy = std::fs::read_to_string(
        brownout_test_support::repo_root().join("deploy/kubernetes/base/config/policy.yaml"),
    )
    .expect("the base's policy");
    assert_eq!(
        brownout::degrade::policy::Policy::from_yaml(&copy).expect("it parses"),
        brownout::degrade::policy::Policy::seed_default(),
        "copy examples/policy.yaml to deploy/kubernetes/base/config/policy.yaml"
    );
}
