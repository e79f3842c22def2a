//! A real Prometheus (Debian package `prometheus`, `/usr/bin/prometheus`) scrapes a running
//! `brownout-demo` deployment (control plane, two serving engines on the tiny model, two
//! simulated-GPU agents) with the rule files in `alerts/` loaded, while the test drives traffic
//! that succeeds, times out in the queue (outcome `error`), is shed (429) and hits a disabled
//! feature (503). Then every PromQL expression of `dashboards/*.json` (panel targets and template
//! variable queries) and every `expr` of `alerts/*.yml` is sent to `/api/v1/query`: it must parse,
//! and it must return data — alert conditions are queried with `bool` comparisons and `absent(x)`
//! as `x`, so "returns data" means "the series behind the alert exist". Expressions that cannot
//! have data here are listed below with the reason. Finally every metric name the dashboards and
//! rules reference must be one Prometheus has (`/api/v1/label/__name__/values`), which catches
//! a dashboard and an exporter disagreeing about a name.
//!
//! Needs `/usr/bin/prometheus` (scripts/test.sh installs the `prometheus` package); runs in about
//! 20 s.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use brownout_demo::{World, WorldOptions};
use brownout_protocol::Tier;
use serde_json::{Value, json};

const PROMETHEUS: &str = "/usr/bin/prometheus";

/// Rule files for SLOs of services the demo does not run (agent tasks, embeddings, an HTTP
/// gateway) or does not scrape (the simulated agent app): their expressions must parse, but
/// their input series cannot exist here.
const NOT_IN_DEMO: &[(&str, &str)] = &[
    (
        "slo-agent.yml",
        "brownout_agent_tasks_total comes from an agent runtime; the demo has none",
    ),
    (
        "slo-agent-app.yml",
        "service=\"agent-app\": the demo's agent app reports spans and failure events to brownout, no request counters",
    ),
    (
        "slo-openslo-embeddings.yml",
        "service=\"embeddings\": the demo serves chat only",
    ),
    (
        "slo-sloth-gateway.yml",
        "http_requests_total{job=\"gateway\"}: the demo has no gateway",
    ),
];

/// Known gaps between the rules and the exporters: an expression containing one of these
/// substrings must (still) return NO data. When an exporter gains the missing piece the test
/// fails here, so the exception is removed instead of rotting.
/// Empty since `brownout_serving_requests_total` carries `feature` and `criticality` labels and
/// the SLI rules read 0 (not nothing) without error series; keep the mechanism for the next gap.
const KNOWN_GAPS: &[(&str, &str)] = &[];

enum Exception {
    NotInDemo,
    KnownGap(&'static str, &'static str),
}

fn exception(e: &Expr) -> Option<Exception> {
    if NOT_IN_DEMO.iter().any(|(f, _)| *f == e.file) {
        return Some(Exception::NotInDemo);
    }
    KNOWN_GAPS
        .iter()
        .find(|(p, _)| e.expr.contains(p))
        .map(|(p, why)| Exception::KnownGap(p, why))
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn files_in(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == ext))
        .collect();
    v.sort();
    v
}

fn file_name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

// ---------------------------------------------------------------------------------------------
// The expressions.

#[derive(Debug, Clone)]
struct Expr {
    /// `file: panel/rule` for messages.
    origin: String,
    file: String,
    expr: String,
    /// The panel target's `legendFormat` (empty for rules).
    legend: String,
}

/// Template variable `name` → `(selector, label)` of its `label_values(selector, label)`.
type Variables = BTreeMap<String, (String, String)>;

fn dashboard_exprs() -> (Vec<Expr>, Variables) {
    let mut exprs = Vec::new();
    let mut vars = Variables::new();
    for p in files_in(&root().join("dashboards"), "json") {
        let file = file_name(&p);
        let d: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        for v in d["templating"]["list"].as_array().into_iter().flatten() {
            if v["type"] != "query" {
                continue;
            }
            let q = v["query"]["query"]
                .as_str()
                .or_else(|| v["query"].as_str())
                .or_else(|| v["definition"].as_str())
                .unwrap_or_else(|| panic!("{file}: variable {} has no query", v["name"]));
            let inner = q
                .trim()
                .strip_prefix("label_values(")
                .and_then(|s| s.strip_suffix(')'))
                .unwrap_or_else(|| panic!("{file}: variable query {q:?} is not label_values()"));
            let (sel, label) = inner
                .rsplit_once(',')
                .expect("label_values(selector, label)");
            let name = v["name"].as_str().unwrap().to_string();
            vars.insert(name, (sel.trim().to_string(), label.trim().to_string()));
        }
        let mut stack: Vec<&Value> = d["panels"].as_array().unwrap().iter().collect();
        while let Some(panel) = stack.pop() {
            stack.extend(panel["panels"].as_array().into_iter().flatten());
            for t in panel["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    exprs.push(Expr {
                        origin: format!(
                            "{file}: panel {:?}",
                            panel["title"].as_str().unwrap_or("")
                        ),
                        file: file.clone(),
                        expr: e.to_string(),
                        legend: t["legendFormat"].as_str().unwrap_or("").to_string(),
                    });
                }
            }
        }
    }
    (exprs, vars)
}

fn rule_files() -> Vec<PathBuf> {
    files_in(&root().join("alerts"), "yml")
}

fn rule_exprs() -> Vec<Expr> {
    let mut out = Vec::new();
    for p in rule_files() {
        let file = file_name(&p);
        let y: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&p).unwrap())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        for g in y["groups"].as_sequence().expect("groups") {
            for r in g["rules"].as_sequence().expect("rules") {
                let name = r["alert"]
                    .as_str()
                    .map(|a| format!("alert {a}"))
                    .or_else(|| r["record"].as_str().map(|n| format!("record {n}")))
                    .expect("alert or record");
                let e = r["expr"]
                    .as_str()
                    .map(str::to_string)
                    .or_else(|| r["expr"].as_f64().map(|x| x.to_string()))
                    .expect("expr");
                out.push(Expr {
                    origin: format!("{file}: {name}"),
                    file: file.clone(),
                    expr: e.trim().to_string(),
                    legend: String::new(),
                });
            }
        }
    }
    out
}

/// Grafana's interval variables as durations that fit a short run with a 1 s scrape interval.
fn grafana_intervals(e: &str) -> String {
    e.replace("$__rate_interval", "1m")
        .replace("$__interval", "15s")
        .replace("$__range", "5m")
}

/// Applies `f` to the PromQL outside string literals, label matchers `{…}` and ranges `[…]`:
/// `f(text, i)` returns how many bytes it consumed at `i` and what to emit (or `None` to copy
/// one char).
fn outside_literals(e: &str, mut f: impl FnMut(&str, usize) -> Option<(usize, String)>) -> String {
    let b = e.as_bytes();
    let mut out = String::with_capacity(e.len() + 16);
    let mut i = 0;
    let (mut brace, mut bracket) = (0usize, 0usize);
    while i < b.len() {
        let c = b[i] as char;
        if c == '"' || c == '\'' || c == '`' {
            let start = i;
            i += 1;
            while i < b.len() && b[i] as char != c {
                if b[i] == b'\\' && c != '`' {
                    i += 1;
                }
                i += 1;
            }
            i = (i + 1).min(b.len());
            out.push_str(&e[start..i]);
            continue;
        }
        match c {
            '{' => brace += 1,
            '}' => brace = brace.saturating_sub(1),
            '[' => bracket += 1,
            ']' => bracket = bracket.saturating_sub(1),
            _ => {}
        }
        if brace == 0
            && bracket == 0
            && c != '{'
            && c != '['
            && let Some((n, s)) = f(e, i)
        {
            out.push_str(&s);
            i += n;
            continue;
        }
        let ch = e[i..].chars().next().unwrap();
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// Every comparison becomes a `bool` comparison: the result has a sample for every input
/// sample, so "returns data" checks the series behind an alert whatever their values.
fn bool_comparisons(e: &str) -> String {
    outside_literals(e, |s, i| {
        let rest = &s[i..];
        let op = ["==", "!=", ">=", "<=", ">", "<"]
            .into_iter()
            .find(|op| rest.starts_with(op))?;
        let after = rest[op.len()..].trim_start();
        if after.starts_with("bool") {
            return None;
        }
        Some((op.len(), format!("{op} bool")))
    })
}

/// `absent(x)` is empty exactly when `x` has data: query `x`.
fn strip_absent(e: &str) -> String {
    let mut s = e.to_string();
    while let Some(at) = s.find("absent(") {
        let open = at + "absent".len();
        let mut depth = 0;
        let mut close = None;
        for (j, c) in s[open..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(open + j);
                        break;
                    }
                }
                _ => {}
            }
        }
        let close = close.unwrap_or_else(|| panic!("unbalanced absent( in {e}"));
        s = format!("{}({}){}", &s[..at], &s[open + 1..close], &s[close + 1..]);
    }
    s
}

const KEYWORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
    "atan2",
];

/// Metric names in a PromQL expression: identifiers outside strings, label matchers and ranges
/// that are not functions/aggregations (followed by `(`), keywords, or grouping labels.
fn metric_names(e: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut grouping_paren = false;
    let mut in_grouping = false;
    outside_literals(e, |s, i| {
        let b = s.as_bytes();
        let c = b[i] as char;
        if in_grouping {
            if c == ')' {
                in_grouping = false;
            }
            return None;
        }
        if c == '(' && grouping_paren {
            grouping_paren = false;
            in_grouping = true;
            return None;
        }
        let starts = c.is_ascii_alphabetic() || c == '_' || c == ':';
        let prev_ident = i > 0 && {
            let p = b[i - 1] as char;
            p.is_ascii_alphanumeric() || p == '_' || p == ':' || p == '.'
        };
        if !starts || prev_ident {
            if !c.is_whitespace() {
                grouping_paren = false;
            }
            return None;
        }
        let end = s[i..]
            .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_' || ch == ':'))
            .map_or(s.len(), |n| i + n);
        let word = &s[i..end];
        let next = s[end..].trim_start().chars().next();
        let lw = word.to_ascii_lowercase();
        if [
            "by",
            "without",
            "on",
            "ignoring",
            "group_left",
            "group_right",
        ]
        .contains(&lw.as_str())
        {
            grouping_paren = true;
        } else {
            grouping_paren = false;
            if next != Some('(') && !KEYWORDS.contains(&lw.as_str()) {
                names.insert(word.to_string());
            }
        }
        Some((end - i, word.to_string()))
    });
    names
}

// ---------------------------------------------------------------------------------------------
// Prometheus as a child process.

struct Prometheus {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn host_port(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string()
}

fn start_prometheus(cp: &str, engines: &[String], agents: &[String]) -> Prometheus {
    assert!(
        Path::new(PROMETHEUS).is_file(),
        "{PROMETHEUS} not found: install the Debian package `prometheus` (scripts/test.sh does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let list = |urls: &[String]| {
        urls.iter()
            .map(|u| format!("\"{}\"", host_port(u)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let rules = rule_files()
        .iter()
        .map(|p| format!("  - \"{}\"\n", p.display()))
        .collect::<String>();
    // No honor_labels: the control plane exports the serving instance of an ack as
    // `engine_instance`, so Prometheus' own `instance` target label collides with nothing.
    // Job names: `gpu-agent` is what alerts/hosts.yml's GPUAgentDown expects; the engines carry
    // `service: chat` as a target label, which is how the SLO rules' `service="chat"` is met
    // (docs/SLO.md: "a scrape target label is enough").
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n{rules}\
         scrape_configs:\n\
         \x20 - job_name: brownout\n    static_configs:\n      - targets: [\"{cp}\"]\n\
         \x20 - job_name: vllm\n    static_configs:\n      - targets: [{engines}]\n        labels:\n          service: chat\n\
         \x20 - job_name: gpu-agent\n    static_configs:\n      - targets: [{agents}]\n",
        cp = host_port(cp),
        engines = list(engines),
        agents = list(agents),
    );
    let cfg_path = dir.path().join("prometheus.yml");
    std::fs::write(&cfg_path, &config).unwrap();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let port = free_port();
    let child = Command::new(PROMETHEUS)
        .arg(format!("--config.file={}", cfg_path.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("start {PROMETHEUS}: {e}"));
    Prometheus {
        child,
        url: format!("http://127.0.0.1:{port}"),
        dir,
    }
}

/// `GET {prom}/api/v1/{path}` with query parameters; `Err` carries Prometheus's error.
async fn api(
    c: &reqwest::Client,
    prom: &Prometheus,
    path: &str,
    params: &[(&str, &str)],
) -> Result<Value, String> {
    let r = c
        .get(
            reqwest::Url::parse_with_params(&format!("{}/api/v1/{path}", prom.url), params)
                .map_err(|e| format!("url: {e}"))?,
        )
        .send()
        .await
        .map_err(|e| format!("request: {e}"))?;
    let v: Value = r.json().await.map_err(|e| format!("body: {e}"))?;
    if v["status"] == "success" {
        Ok(v["data"].clone())
    } else {
        Err(format!("{}: {}", v["errorType"], v["error"]))
    }
}

// ---------------------------------------------------------------------------------------------
// Upstream dashboards: their queries and the metric families and labels they rely on, copied
// from the upstream files (docs/DASHBOARDS.md §7 lists them with the same sources).

/// vllm-project/vllm `examples/observability/prometheus_grafana/grafana.json`: every panel
/// query, verbatim (`$model_name` is its one template variable, `label_values(model_name)`).
const VLLM_DASHBOARD_QUERIES: &[&str] = &[
    "histogram_quantile(0.99, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{model_name=\"$model_name\"}[$__rate_interval])))",
    "histogram_quantile(0.95, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{model_name=\"$model_name\"}[$__rate_interval])))",
    "histogram_quantile(0.9, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{model_name=\"$model_name\"}[$__rate_interval])))",
    "histogram_quantile(0.5, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{model_name=\"$model_name\"}[$__rate_interval])))",
    "rate(vllm:e2e_request_latency_seconds_sum{model_name=\"$model_name\"}[$__rate_interval])\n/\nrate(vllm:e2e_request_latency_seconds_count{model_name=\"$model_name\"}[$__rate_interval])",
    "rate(vllm:prompt_tokens_total{model_name=\"$model_name\"}[$__rate_interval])",
    "rate(vllm:generation_tokens_total{model_name=\"$model_name\"}[$__rate_interval])",
    "histogram_quantile(0.99, sum by(le) (rate(vllm:inter_token_latency_seconds_bucket{model_name=\"$model_name\"}[$__rate_interval])))",
    "histogram_quantile(0.95, sum by(le) (rate(vllm:inter_token_latency_seconds_bucket{model_name=\"$model_name\"}[$__rate_interval])))",
    "histogram_quantile(0.9, sum by(le) (rate(vllm:inter_token_latency_seconds_bucket{model_name=\"$model_name\"}[$__rate_interval])))",
    "histogram_quantile(0.5, sum by(le) (rate(vllm:inter_token_latency_seconds_bucket{model_name=\"$model_name\"}[$__rate_interval])))",
    "rate(vllm:inter_token_latency_seconds_sum{model_name=\"$model_name\"}[$__rate_interval])\n/\nrate(vllm:inter_token_latency_seconds_count{model_name=\"$model_name\"}[$__rate_interval])",
    "vllm:num_requests_running{model_name=\"$model_name\"}",
    "vllm:num_requests_waiting{model_name=\"$model_name\"}",
    "histogram_quantile(0.99, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket{model_name=\"$model_name\"}[$__rate_interval])))",
    "histogram_quantile(0.95, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket{model_name=\"$model_name\"}[$__rate_interval])))",
    "histogram_quantile(0.9, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket{model_name=\"$model_name\"}[$__rate_interval])))",
    "histogram_quantile(0.5, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket{model_name=\"$model_name\"}[$__rate_interval])))",
    "rate(vllm:time_to_first_token_seconds_sum{model_name=\"$model_name\"}[$__rate_interval])\n/\nrate(vllm:time_to_first_token_seconds_count{model_name=\"$model_name\"}[$__rate_interval])",
    "vllm:kv_cache_usage_perc{model_name=\"$model_name\"}",
    "sum by(le) (increase(vllm:request_prompt_tokens_bucket{model_name=\"$model_name\"}[$__rate_interval]))",
    "sum by(le) (increase(vllm:request_generation_tokens_bucket{model_name=\"$model_name\"}[$__rate_interval]))",
    "sum by(finished_reason) (increase(vllm:request_success_total{model_name=\"$model_name\"}[$__rate_interval]))",
    "rate(vllm:request_queue_time_seconds_sum{model_name=\"$model_name\"}[$__rate_interval])",
    "rate(vllm:request_prefill_time_seconds_sum{model_name=\"$model_name\"}[$__rate_interval])",
    "rate(vllm:request_decode_time_seconds_sum{model_name=\"$model_name\"}[$__rate_interval])",
    "rate(vllm:request_max_num_generation_tokens_sum{model_name=\"$model_name\"}[$__rate_interval])",
];

/// The metric families vLLM's dashboard reads and the labels it selects or groups on.
const VLLM_FAMILIES: &[(&str, &[&str])] = &[
    (
        "vllm:e2e_request_latency_seconds_bucket",
        &["model_name", "le"],
    ),
    ("vllm:e2e_request_latency_seconds_sum", &["model_name"]),
    ("vllm:e2e_request_latency_seconds_count", &["model_name"]),
    ("vllm:prompt_tokens_total", &["model_name"]),
    ("vllm:generation_tokens_total", &["model_name"]),
    (
        "vllm:inter_token_latency_seconds_bucket",
        &["model_name", "le"],
    ),
    ("vllm:num_requests_running", &["model_name"]),
    ("vllm:num_requests_waiting", &["model_name"]),
    (
        "vllm:time_to_first_token_seconds_bucket",
        &["model_name", "le"],
    ),
    ("vllm:kv_cache_usage_perc", &["model_name"]),
    ("vllm:request_prompt_tokens_bucket", &["model_name", "le"]),
    (
        "vllm:request_generation_tokens_bucket",
        &["model_name", "le"],
    ),
    (
        "vllm:request_success_total",
        &["model_name", "finished_reason"],
    ),
    ("vllm:request_queue_time_seconds_sum", &["model_name"]),
    ("vllm:request_prefill_time_seconds_sum", &["model_name"]),
    ("vllm:request_decode_time_seconds_sum", &["model_name"]),
    (
        "vllm:request_max_num_generation_tokens_sum",
        &["model_name"],
    ),
];

/// NVIDIA/dcgm-exporter `grafana/dcgm-exporter-dashboard.json`: every panel query, verbatim
/// (template variables `$Hostname` = `label_values(DCGM_FI_DEV_FB_FREE, Hostname)` and
/// `$gpu` = `label_values(DCGM_FI_DEV_FB_FREE{Hostname=~"$Hostname"}, gpu)`).
const DCGM_DASHBOARD_QUERIES: &[&str] = &[
    "max(DCGM_FI_DEV_GPU_TEMP{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (Hostname, gpu, uuid)",
    "avg(DCGM_FI_DEV_GPU_TEMP{Hostname=~\"$Hostname\", gpu=~\"$gpu\"})",
    "max(DCGM_FI_DEV_POWER_USAGE{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (Hostname, gpu, uuid)",
    "sum(max(DCGM_FI_DEV_POWER_USAGE{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (gpu))",
    "max(DCGM_FI_DEV_SM_CLOCK{Hostname=~\"$Hostname\", gpu=~\"$gpu\"} * 1000000) by (Hostname, UUID, gpu)",
    "max(DCGM_FI_PROF_GR_ENGINE_ACTIVE{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)",
    "max(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)",
    "max(DCGM_FI_DEV_FB_USED{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)",
];

/// The DCGM families that dashboard reads, with the labels dcgm-exporter puts on them
/// (`hostname` is the name dcgm-exporter's main uses since it renamed `Hostname`; brownout
/// exports both). `GPU_I_ID` / `GPU_I_PROFILE` exist only on MIG slices: not required.
const DCGM_FAMILIES: &[&str] = &[
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
];
const DCGM_LABELS: &[&str] = &["gpu", "UUID", "device", "modelName", "Hostname", "hostname"];

/// `{{label}}` names in a Grafana legend format.
fn legend_labels(legend: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = legend;
    while let Some(a) = rest.find("{{") {
        let Some(b) = rest[a..].find("}}") else { break };
        out.push(rest[a + 2..a + b].trim().to_string());
        rest = &rest[a + b + 2..];
    }
    out
}

/// Series of an instant query: their label maps.
async fn series_of(
    c: &reqwest::Client,
    prom: &Prometheus,
    q: &str,
) -> Result<Vec<BTreeMap<String, String>>, String> {
    let d = api(c, prom, "query", &[("query", q)]).await?;
    Ok(d["result"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| {
                    r["metric"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                                .collect()
                        })
                        .unwrap_or_default()
                })
                .collect()
        })
        .unwrap_or_default())
}

/// Nothing fires in a short run (every `for:` is at least 1 m): count pending alerts too.
fn probe_firing(q: &str) -> String {
    q.replace("alertstate=\"firing\"", "alertstate=~\"firing|pending\"")
}

/// `family` has series, and each of `labels` is set on them.
async fn check_family(
    c: &reqwest::Client,
    prom: &Prometheus,
    family: &str,
    labels: &[&str],
    failures: &mut Vec<String>,
) {
    let series = series_of(c, prom, family).await.unwrap_or_default();
    if series.is_empty() {
        failures.push(format!("{family}: no series"));
        return;
    }
    for l in labels {
        if !series
            .iter()
            .all(|m| m.get(*l).is_some_and(|v| !v.is_empty()))
        {
            failures.push(format!("{family}: label {l} missing: {:?}", series[0]));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Traffic.

async fn chat(
    c: &reqwest::Client,
    engine: &str,
    feature: &str,
    criticality: &str,
    max_tokens: u32,
) -> u16 {
    c.post(format!("{engine}/v1/chat/completions"))
        .header("x-brownout-feature", feature)
        .header("x-brownout-criticality", criticality)
        .json(&json!({"model": "default", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hello there, how are you today?"}]}))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prometheus_scrapes_the_demo_and_every_dashboard_and_rule_expression_has_data() {
    let started = Instant::now();
    let mut opts = WorldOptions::default();
    // Two sequences at a time and a 50 ms queue deadline: a burst leaves requests waiting past
    // the deadline, which finish with outcome="error" (the SLO error ratios need error series).
    opts.engine.max_num_seqs = 2;
    opts.engine.max_queue_wait = Duration::from_millis(50);
    let world = World::start(opts).await.expect("start the demo world");
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let cp = format!("http://{}", world.http_addr());
    let engines = world.engine_urls();
    let agents = world.agent_urls();
    let admin = world.tokens().2.to_string();

    let mut prom = start_prometheus(&cp, &engines, &agents);
    let expected_targets = 1 + engines.len() + agents.len();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = prom.child.try_wait().unwrap() {
            panic!("prometheus exited ({status}):\n{}", prom.log());
        }
        let up = api(&c, &prom, "targets", &[("state", "active")])
            .await
            .map_or(0, |d| {
                d["activeTargets"]
                    .as_array()
                    .map_or(0, |t| t.iter().filter(|t| t["health"] == "up").count())
            });
        if up == expected_targets {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{up} of {expected_targets} scrape targets up after 20 s: {:?}\nprometheus log:\n{}",
            api(&c, &prom, "targets", &[]).await,
            prom.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Traffic at T0: successes (also for the feature- and criticality-narrowed SLOs of
    // slo-chat.yml), then a burst that overruns the queue deadline.
    for e in &engines {
        for _ in 0..3 {
            assert_eq!(chat(&c, e, "simple_tasks", "default", 8).await, 200);
        }
        assert_eq!(chat(&c, e, "pdf_analysis", "sheddable", 8).await, 200);
        assert_eq!(chat(&c, e, "login", "critical", 8).await, 200);
        // A burst; repeated (at most 5 times) until one request times out in the queue.
        let mut all = Vec::new();
        for _ in 0..5 {
            let burst: Vec<_> = (0..12)
                .map(|_| {
                    let (c, e) = (c.clone(), e.clone());
                    tokio::spawn(async move { chat(&c, &e, "simple_tasks", "default", 64).await })
                })
                .collect();
            for b in burst {
                all.push(b.await.unwrap());
            }
            if all.iter().any(|&s| s != 200) {
                break;
            }
        }
        assert!(
            all.contains(&503),
            "bursts of 12 with 2 running and a 50 ms queue deadline time some out (503): {all:?}"
        );
    }

    // Pin T3: sheddable → 429, a disabled feature → 503, critical still served.
    let r = c
        .post(format!("{cp}/api/v1/degrade/override"))
        .bearer_auth(&admin)
        .json(&json!({"tier": 3, "duration_secs": 120, "reason": "prometheus scrape test"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    for h in world.engine_controls() {
        brownout_test_support::wait_for("engine applied T3", Duration::from_secs(10), || {
            h.tier() == Tier::T3
        })
        .await;
    }
    for e in &engines {
        assert_eq!(chat(&c, e, "simple_tasks", "sheddable", 4).await, 429);
        assert_eq!(chat(&c, e, "pdf_analysis", "critical", 4).await, 503);
        assert_eq!(chat(&c, e, "login", "critical", 4).await, 200);
    }

    // Expressions, template variables and the metric names they use.
    let (mut exprs, vars) = dashboard_exprs();
    let dashboard_count = exprs.len();
    exprs.extend(rule_exprs());
    // Names used by the expressions expected to have data (the exceptions are checked below).
    let mut wanted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in exprs.iter().filter(|e| exception(e).is_none()) {
        for n in metric_names(&grafana_intervals(&e.expr)) {
            wanted.entry(n).or_default().insert(e.origin.clone());
        }
    }
    for (sel, _) in vars.values() {
        for n in metric_names(sel) {
            wanted
                .entry(n)
                .or_default()
                .insert("template variable".into());
        }
    }
    assert!(
        wanted.contains_key("vllm:kv_cache_usage_perc") && wanted.contains_key("up"),
        "name extraction works: {:?}",
        wanted.keys().collect::<Vec<_>>()
    );
    let must_exist: BTreeSet<&str> = wanted.keys().map(String::as_str).collect();

    // Scrapes and rule evaluations catch up with the traffic: every name present (or 20 s).
    let mut names: BTreeSet<String> = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(d) = api(&c, &prom, "label/__name__/values", &[]).await {
            names = d
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
        }
        let pending = api(
            &c,
            &prom,
            "query",
            &[("query", "ALERTS{alertstate=\"pending\"}")],
        )
        .await
        .is_ok_and(|d| d["result"].as_array().is_some_and(|r| !r.is_empty()));
        if (must_exist.iter().all(|n| names.contains(*n)) && pending) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // A few more evaluations so recording rules built on recording rules have values.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let missing: Vec<String> = must_exist
        .iter()
        .filter(|n| !names.contains(**n))
        .map(|n| format!("  {n} (used by {:?})", wanted[*n]))
        .collect();
    assert!(
        missing.is_empty(),
        "metric names referenced by dashboards/rules that no exporter or recording rule \
         produces:\n{}\nPrometheus has: {names:?}\nprometheus log:\n{}",
        missing.join("\n"),
        prom.log()
    );

    // Template variables: label_values() has values; a real value replaces `$var`.
    let mut values: BTreeMap<String, String> = BTreeMap::new();
    for (name, (sel, label)) in &vars {
        let d = api(
            &c,
            &prom,
            &format!("label/{label}/values"),
            &[("match[]", sel)],
        )
        .await
        .unwrap_or_else(|e| panic!("variable ${name}: label_values({sel}, {label}): {e}"));
        let first = d
            .as_array()
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("variable ${name}: label_values({sel}, {label}) is empty"));
        values.insert(name.clone(), first.to_string());
    }

    let mut failures = Vec::new();
    let mut checked_with_data = 0;
    let (mut not_in_demo, mut gaps_used) = (0, BTreeSet::new());
    for e in &exprs {
        let mut q = grafana_intervals(&e.expr);
        for (name, v) in &values {
            q = q
                .replace(&format!("${{{name}}}"), v)
                .replace(&format!("${name}"), v);
        }
        // Parses: the expression exactly as written (intervals and variables substituted).
        if let Err(err) = api(&c, &prom, "query", &[("query", &q)]).await {
            failures.push(format!("{}: does not run: {err}\n    {q}", e.origin));
            continue;
        }
        let mut probe = bool_comparisons(&strip_absent(&q));
        // Exception: a panel counting FIRING alerts. `for:` is at least 1 m for every rule, so
        // nothing fires in a short run; the same ALERTS series exist in state "pending".
        probe = probe.replace("alertstate=\"firing\"", "alertstate=~\"firing|pending\"");
        let result = match api(&c, &prom, "query", &[("query", &probe)]).await {
            Ok(d) => d["result"].clone(),
            Err(err) => {
                failures.push(format!(
                    "{}: probe does not run: {err}\n    {probe}",
                    e.origin
                ));
                continue;
            }
        };
        let has_data = match &result {
            Value::Array(a) => !a.is_empty(),
            Value::Null => false,
            _ => true, // scalar or string
        };
        match exception(e) {
            Some(Exception::NotInDemo) => {
                not_in_demo += 1;
                continue;
            }
            Some(Exception::KnownGap(pat, why)) => {
                gaps_used.insert(pat);
                if has_data {
                    failures.push(format!(
                        "{}: returns data although listed as a known gap ({pat}: {why}); remove \
                         the exception\n    {probe}",
                        e.origin
                    ));
                }
                continue;
            }
            None => {}
        }
        if has_data {
            checked_with_data += 1;
        } else {
            failures.push(format!("{}: no data\n    {probe}", e.origin));
        }
    }
    for (pat, _) in KNOWN_GAPS {
        if !gaps_used.contains(pat) {
            failures.push(format!(
                "known gap {pat:?} matches no expression: remove it"
            ));
        }
    }
    // brownout's own panels: every legend label is filled, no two series read the same, and a
    // per-engine panel shows exactly one series per engine.
    // Variables at "All" (`.*`, every variable is multi-select), as a dashboard opens.
    let n_engines = engines.len();
    for e in exprs.iter().filter(|e| !e.legend.is_empty()) {
        let mut q = grafana_intervals(&e.expr);
        for name in values.keys() {
            q = q
                .replace(&format!("${{{name}}}"), ".*")
                .replace(&format!("${name}"), ".*");
        }
        let probe = probe_firing(&q);
        let series = match series_of(&c, &prom, &probe).await {
            Ok(s) => s,
            Err(err) => {
                failures.push(format!("{}: {err}", e.origin));
                continue;
            }
        };
        let labels = legend_labels(&e.legend);
        let mut legends = BTreeSet::new();
        for m in &series {
            let mut shown = e.legend.clone();
            for l in &labels {
                let v = m.get(l).map(String::as_str).unwrap_or("");
                if v.is_empty() {
                    failures.push(format!(
                        "{}: legend {:?} has an empty {{{{{l}}}}} for series {m:?}",
                        e.origin, e.legend
                    ));
                }
                shown = shown.replace(&format!("{{{{{l}}}}}"), v);
            }
            if !legends.insert(shown.clone()) {
                failures.push(format!(
                    "{}: two series read {shown:?} (the same thing counted twice?): {series:?}",
                    e.origin
                ));
            }
        }
        let names = metric_names(&q);
        let engine_metrics = !names.is_empty()
            && names.iter().all(|n| {
                n.starts_with("vllm:")
                        || n.starts_with("brownout_serving_")
                        // one series per serving instance that acks
                        || n == "brownout_degradation_ack_lag_seconds"
            });
        let per_engine = labels
            .iter()
            .any(|l| l == "engine" || l == "engine_instance")
            || (labels.iter().any(|l| l == "instance") && engine_metrics);
        if per_engine && series.len() != n_engines {
            failures.push(format!(
                "{}: {} series, want one per engine ({n_engines}): {series:?}",
                e.origin,
                series.len()
            ));
        }
    }

    // "Firing alerts" (overview) shows every severity the rules use: each severity with an
    // alert pending or firing now appears in the panel.
    let active: BTreeSet<String> = series_of(&c, &prom, "ALERTS{alertstate=~\"firing|pending\"}")
        .await
        .unwrap()
        .iter()
        .filter_map(|m| m.get("severity").cloned())
        .collect();
    let firing_panel = exprs
        .iter()
        .find(|e| e.origin.ends_with("panel \"Firing alerts\""))
        .expect("the overview has a Firing alerts panel");
    let shown: BTreeSet<String> = series_of(&c, &prom, &probe_firing(&firing_panel.expr))
        .await
        .unwrap()
        .iter()
        .filter_map(|m| m.get("severity").cloned())
        .collect();
    if !active.is_subset(&shown) || active.is_empty() {
        failures.push(format!(
            "Firing alerts panel shows severities {shown:?}, alerts have {active:?}"
        ));
    }

    // vLLM's own dashboard, unchanged: every query returns data; its families carry its labels.
    let model_name = series_of(&c, &prom, "vllm:num_requests_running")
        .await
        .unwrap()
        .first()
        .and_then(|m| m.get("model_name").cloned())
        .expect("model_name on vllm:num_requests_running");
    for q in VLLM_DASHBOARD_QUERIES {
        let q = grafana_intervals(q).replace("$model_name", &model_name);
        match series_of(&c, &prom, &q).await {
            Ok(s) if !s.is_empty() => {}
            other => failures.push(format!(
                "vLLM dashboard query without data: {q}\n    {other:?}"
            )),
        }
    }
    for (family, labels) in VLLM_FAMILIES {
        check_family(&c, &prom, family, labels, &mut failures).await;
    }
    let reasons: BTreeSet<String> = series_of(&c, &prom, "vllm:request_success_total")
        .await
        .unwrap()
        .iter()
        .filter_map(|m| m.get("finished_reason").cloned())
        .collect();
    for r in ["stop", "length", "abort", "error"] {
        if !reasons.contains(r) {
            failures.push(format!(
                "vllm:request_success_total has no finished_reason={r:?}: {reasons:?}"
            ));
        }
    }

    // NVIDIA's dcgm-exporter dashboard, unchanged, on the simulated GPUs.
    let host = series_of(&c, &prom, "DCGM_FI_DEV_FB_FREE")
        .await
        .unwrap()
        .first()
        .and_then(|m| m.get("Hostname").cloned())
        .expect("Hostname on DCGM_FI_DEV_FB_FREE");
    for q in DCGM_DASHBOARD_QUERIES {
        let q = q.replace("$Hostname", &host).replace("$gpu", ".*");
        match series_of(&c, &prom, &q).await {
            Ok(s) if !s.is_empty() => {}
            other => failures.push(format!(
                "DCGM dashboard query without data: {q}\n    {other:?}"
            )),
        }
    }
    for family in DCGM_FAMILIES {
        check_family(&c, &prom, family, DCGM_LABELS, &mut failures).await;
        // Simulated GPUs say so on every series.
        let all = series_of(&c, &prom, family).await.unwrap();
        if all.is_empty()
            || all
                .iter()
                .any(|m| m.get("simulated").map(String::as_str) != Some("true"))
        {
            failures.push(format!(
                "{family}: every simulated series carries simulated=\"true\": {all:?}"
            ));
        }
    }
    // camelCase labels only on DCGM_ series.
    for m in series_of(&c, &prom, "{__name__=~\"brownout_.*\"}")
        .await
        .unwrap()
    {
        if let Some(l) = m
            .keys()
            .find(|k| k.chars().any(|ch| ch.is_ascii_uppercase()))
        {
            failures.push(format!("{} carries the camelCase label {l}", m["__name__"]));
            break;
        }
    }
    // Known in advance: the feature catalog's features exist before a command disables them.
    let disabled: BTreeSet<String> =
        series_of(&c, &prom, "brownout_serving_feature_disabled_total")
            .await
            .unwrap()
            .iter()
            .filter_map(|m| m.get("feature").cloned())
            .collect();
    for f in ["pdf_analysis", "image_generation", "web_search", "login"] {
        if !disabled.contains(f) {
            failures.push(format!(
                "brownout_serving_feature_disabled_total lacks feature={f:?}: {disabled:?}"
            ));
        }
    }
    // Every instance acked: nothing unacknowledged.
    match series_of(&c, &prom, "brownout_degradation_unacked_commands == 0").await {
        Ok(s) if s.len() == 1 => {}
        other => failures.push(format!(
            "brownout_degradation_unacked_commands is 0 while engines ack: {other:?}"
        )),
    }

    assert!(
        failures.is_empty(),
        "{} of {} expressions failed:\n{}\nprometheus log:\n{}",
        failures.len(),
        exprs.len(),
        failures.join("\n"),
        prom.log()
    );
    assert!(
        dashboard_count >= 40 && checked_with_data >= 60,
        "the walk found {dashboard_count} dashboard expressions, {checked_with_data} with data"
    );
    eprintln!(
        "{} expressions ({dashboard_count} from dashboards) parse; {checked_with_data} return data; \
         {not_in_demo} are SLOs of services not in the demo; {} are known gaps (no data); \
         {} metric names present; {:.1} s",
        exprs.len(),
        exprs.len() - checked_with_data - not_in_demo,
        must_exist.len(),
        started.elapsed().as_secs_f64()
    );
    drop(prom);
    world.stop().await.unwrap();
}

#[test]
fn metric_names_and_probes_are_extracted_from_promql() {
    let cases: &[(&str, &[&str])] = &[
        (
            "histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket{model_name=~\"$m\"}[5m])))",
            &["vllm:time_to_first_token_seconds_bucket"],
        ),
        (
            "DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) > 0.75",
            &["DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED"],
        ),
        (
            "count by (severity) (ALERTS{alertstate=\"firing\", severity=~\"P1|P2\"})",
            &["ALERTS"],
        ),
        ("up{job=\"gpu-agent\"} == 0", &["up"]),
        (
            "(slo:sli_error:ratio_rate1h{slo=\"x\"} > (14.4 * 0.01)) and on (slo) (slo:sli_events:count5m >= 5)",
            &["slo:sli_error:ratio_rate1h", "slo:sli_events:count5m"],
        ),
        ("vector(0.99)", &[]),
        (
            "1 - slo:period_burn_rate:ratio",
            &["slo:period_burn_rate:ratio"],
        ),
    ];
    for (e, want) in cases {
        let got: Vec<String> = metric_names(e).into_iter().collect();
        assert_eq!(
            got,
            want.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            "{e}"
        );
    }
    let probes = [
        ("a > 0.85", "a > bool 0.85"),
        ("a >= bool 2", "a >= bool 2"),
        ("up{job=\"x\"} == 0", "up{job=\"x\"} == bool 0"),
        (
            "x{le=~\"2|2.0\",a!=\"b\"} <= 1",
            "x{le=~\"2|2.0\",a!=\"b\"} <= bool 1",
        ),
        ("absent(x{a=\"b\"})", "(x{a=\"b\"})"),
        ("absent(sum(rate(x[5m])))", "(sum(rate(x[5m])))"),
    ];
    for (e, want) in probes {
        assert_eq!(bool_comparisons(&strip_absent(e)), want, "{e}");
    }
}
