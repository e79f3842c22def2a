//! The admission gate and the engine's cancellation against real `brownout-serve` processes and
//! the real Redis: commands are signed and published by hand (a unique cluster per test), the
//! processes subscribe, apply and ack them, and real HTTP clients call them.
//!
//! Waits poll with a generous deadline (a deadlock guard, never a timing assertion).

use std::process::{Child, Command as Proc, Stdio};
use std::time::{Duration, Instant};

use brownout_protocol::{
    AbortEntry, AbortKind, Ack, Command, EntryApplied, FeatureState, InstanceEntry, RedisKeys,
    SignedCommand, now_ms,
};
use futures::StreamExt;
use redis::AsyncCommands;
use serde_json::{Value, json};

use brownout_test_support::{free_port, redis_url, unique};

const KEY: &str = "gate-process-test-key";

async fn redis() -> redis::aio::MultiplexedConnection {
    let url = redis_url();
    let client = redis::Client::open(url.as_str()).unwrap();
    match tokio::time::timeout(
        Duration::from_secs(2),
        client.get_multiplexed_async_connection(),
    )
    .await
    {
        Ok(Ok(c)) => c,
        _ => panic!(
            "Redis is not reachable at {url}: start it with scripts/test.sh (or `redis-server --port 6379`)"
        ),
    }
}

fn cluster(name: &str) -> String {
    unique(&format!("g-{name}-"))
}

/// One `brownout-serve` process, killed on drop.
struct Server {
    child: Child,
    url: String,
    instance: String,
    log: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    async fn start(cluster: &str, instance: &str, model: &str, args: &[&str]) -> Server {
        let port = free_port();
        let log =
            std::env::temp_dir().join(format!("{cluster}-{}.log", instance.replace('/', "_")));
        let out = std::fs::File::create(&log).unwrap();
        let child = Proc::new(env!("CARGO_BIN_EXE_brownout-serve"))
            .args(["--model", model, "--host", "127.0.0.1"])
            .args(["--port", &port.to_string()])
            .args(["--redis-url", &redis_url(), "--cluster", cluster])
            .args(["--instance-id", instance])
            .args(args)
            .env("BROWNOUT_COMMAND_KEY", KEY)
            // The HMAC compatibility mode, chosen explicitly (serving/tests/command_keys_process.rs
            // covers the Ed25519 default).
            .env("BROWNOUT_COMMAND_SIGNATURE", "hmac")
            .env("RUST_LOG", "warn")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("BROWNOUT_CONTROL_PLANE")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("brownout-serve starts");
        let s = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
            instance: instance.to_string(),
            log,
        };
        let c = client();
        let start = Instant::now();
        loop {
            if let Ok(r) = c.get(format!("{}/health", s.url)).send().await
                && r.status() == 200
            {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "{instance} never became healthy:\n{}",
                s.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        s
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let r = client()
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap();
        let s = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            s,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn metrics(&self) -> String {
        client()
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// A non-streaming completion; returns (status, headers, body).
    async fn call(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: Value,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut b = client().post(format!("{}{path}", self.url)).json(&body);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let r = b.send().await.unwrap();
        let (s, h) = (r.status().as_u16(), r.headers().clone());
        let text = r.text().await.unwrap();
        (
            s,
            h,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn complete(&self, headers: &[(&str, &str)]) -> (u16, reqwest::header::HeaderMap, Value) {
        self.call(
            "/v1/completions",
            headers,
            json!({"prompt": "hello", "max_tokens": 4, "temperature": 0}),
        )
        .await
    }
}

fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// The value of the series `name{…labels…}` in a Prometheus text exposition (labels in any
/// order), 0 when absent.
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
            (n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| v.parse::<f64>().ok())?
        })
        .sum()
}

/// Publishes `cmd` signed with the test key the way the control plane does (state hash, then
/// notify), and waits for every instance's ack of it; returns the acks.
async fn publish(cl: &str, cmd: &Command, servers: &[&Server]) -> Vec<Ack> {
    let mut conn = redis().await;
    let keys = RedisKeys::new(cl).unwrap();
    let s = SignedCommand::sign(cmd, KEY.as_bytes());
    let _: () = redis::pipe()
        .atomic()
        .hset_multiple(
            keys.state(),
            &[
                ("epoch", cmd.epoch.to_string()),
                ("version", cmd.version.to_string()),
                ("command", s.json.clone()),
                ("sig", s.sig.clone()),
            ],
        )
        .ignore()
        .publish(keys.notify(), format!("{}:{}", cmd.epoch, cmd.version))
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut acks = Vec::new();
    for srv in servers {
        let start = Instant::now();
        loop {
            let v: Option<String> = conn.hget(keys.acks(), &srv.instance).await.unwrap();
            if let Some(v) = v {
                let ack = Ack::parse_signed(&v, KEY.as_bytes(), &srv.instance).unwrap();
                if matches!(ack, Ack::Applied { version, .. } if version == cmd.version) {
                    acks.push(ack);
                    break;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{} never acked {}:\n{}",
                srv.instance,
                cmd.version,
                srv.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    acks
}

fn cmd(cl: &str, version: u64) -> Command {
    let mut c = Command::normal(cl, 1, version, now_ms(), 600_000);
    c.reason.trigger = "operator".into();
    c.reason.detail = "gate process test".into();
    c
}

fn entry_of(a: &Ack) -> Option<EntryApplied> {
    match a {
        Ack::Applied { entry, .. } => *entry,
        Ack::Refused { .. } => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_entry_drains_its_instance_only_and_sets_its_max_num_seqs() {
    let cl = cluster("drain");
    let a = Server::start(&cl, "gpu-3/engine-0", "toy", &["--max-num-seqs", "8"]).await;
    let b = Server::start(&cl, "gpu-4/engine-0", "toy", &["--max-num-seqs", "8"]).await;
    let mut c = cmd(&cl, 1);
    c.limits.max_num_seqs = Some(6);
    c.instances.insert(
        "gpu-3/engine-0".into(),
        InstanceEntry {
            drain: Some(true),
            max_num_seqs: Some(3),
            reason: "xid 79 on gpu-3".into(),
            ..InstanceEntry::default()
        },
    );
    let acks = publish(&cl, &c, &[&a, &b]).await;
    assert_eq!(
        entry_of(&acks[0]),
        Some(EntryApplied {
            own: true,
            default: false
        }),
        "the drained instance acks its own entry"
    );
    assert_eq!(entry_of(&acks[1]), None, "the other had none");

    // The drained instance: 503 instance_draining + Retry-After to default, 200 to critical.
    let (s, h, v) = a.complete(&[]).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("instance_draining")),
        "{v}"
    );
    assert_eq!(h["retry-after"], "2");
    assert_eq!(h["x-brownout-outcome"], "drained");
    assert_eq!(v["error"]["outcome"], "drained");
    assert!(v["error"]["message"].as_str().unwrap().contains("xid 79"));
    let (s, _, _) = a.complete(&[("x-brownout-criticality", "sheddable")]).await;
    assert_eq!(s, 503);
    let (s, _, v) = a.complete(&[("x-brownout-criticality", "critical")]).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = a.get("/health").await;
    assert_eq!((s, v["status"].as_str()), (503, Some("draining")), "{v}");
    // The other instance serves everyone.
    assert_eq!(b.complete(&[]).await.0, 200);
    assert_eq!(b.get("/health").await.0, 200);

    // Metrics and /debug/resource say so.
    let m = a.metrics().await;
    assert_eq!(metric(&m, "brownout_serving_draining", &[]), 1.0);
    assert_eq!(
        metric(&b.metrics().await, "brownout_serving_draining", &[]),
        0.0
    );
    assert_eq!(
        metric(
            &m,
            "brownout_serving_requests_total",
            &[("outcome", "drained")]
        ),
        2.0
    );
    assert_eq!(
        metric(
            &m,
            "brownout_serving_refusals_total",
            &[("outcome", "drained"), ("criticality", "default")]
        ),
        1.0
    );
    assert_eq!(metric(&m, "brownout_serving_command_version", &[]), 1.0);
    let (_, ra) = a.get("/debug/resource").await;
    let (_, rb) = b.get("/debug/resource").await;
    assert_eq!(ra["draining"], true);
    assert_eq!(ra["instance_entry"]["applied"], "own");
    assert_eq!(
        ra["engine"]["max_num_seqs"],
        json!({"configured": 8, "in_force": 3}),
        "the instance entry overrides limits.max_num_seqs"
    );
    assert_eq!(
        rb["engine"]["max_num_seqs"],
        json!({"configured": 8, "in_force": 6})
    );
    assert_eq!(
        metric(&a.metrics().await, "brownout_serving_max_num_seqs", &[]),
        3.0
    );

    // Lifting the drain (a newer command) restores the instance.
    publish(&cl, &cmd(&cl, 2), &[&a, &b]).await;
    assert_eq!(a.complete(&[]).await.0, 200);
    assert_eq!(a.get("/health").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admission_bucket_throttles_non_critical_traffic() {
    let cl = cluster("bucket");
    let a = Server::start(&cl, "ramp-a", "toy", &[]).await;
    let mut c = cmd(&cl, 1);
    // The "*" entry: every instance ramps at 0.01 requests/s — a burst of one, then one per
    // 100 s, so the second call is throttled whatever the machine's speed.
    c.instances.insert(
        "*".into(),
        InstanceEntry {
            admit_rps: Some(0.01),
            reason: "recovery ramp".into(),
            ..InstanceEntry::default()
        },
    );
    let acks = publish(&cl, &c, &[&a]).await;
    assert_eq!(
        entry_of(&acks[0]),
        Some(EntryApplied {
            own: false,
            default: true
        })
    );
    assert_eq!(a.complete(&[]).await.0, 200);
    let (s, h, v) = a.complete(&[]).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (429, Some("admission_throttled")),
        "{v}"
    );
    assert_eq!(h["retry-after"], "60", "capped at 60 s");
    assert_eq!(h["x-brownout-outcome"], "throttled");
    for _ in 0..3 {
        assert_eq!(
            a.complete(&[("x-brownout-criticality", "critical")])
                .await
                .0,
            200,
            "critical is never throttled"
        );
    }
    let (_, r) = a.get("/debug/resource").await;
    assert_eq!(r["admission"]["admit_rps"], 0.01);
    assert_eq!(r["admission"]["throttled_total"], 1);
    let m = a.metrics().await;
    assert_eq!(metric(&m, "brownout_serving_admit_rps", &[]), 0.01);
    assert_eq!(
        metric(
            &m,
            "brownout_serving_requests_total",
            &[("outcome", "throttled")]
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_conversation_or_trace_gets_409_and_others_pass() {
    let cl = cluster("abort");
    let a = Server::start(&cl, "abort-a", "toy", &[]).await;
    let mut c = cmd(&cl, 1);
    c.abort = vec![
        AbortEntry {
            id: "conv-loop-1".into(),
            kind: AbortKind::Conversation,
            until_ms: now_ms() + 600_000,
            reason: "same tool call 40 times in 60 s".into(),
        },
        AbortEntry {
            id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            kind: AbortKind::Trace,
            until_ms: now_ms() + 600_000,
            reason: String::new(),
        },
        AbortEntry {
            id: "conv-expired".into(),
            kind: AbortKind::Conversation,
            until_ms: now_ms().saturating_sub(1),
            reason: String::new(),
        },
    ];
    publish(&cl, &c, &[&a]).await;
    let (s, h, v) = a
        .complete(&[
            ("x-brownout-conversation", "conv-loop-1"),
            ("x-brownout-criticality", "critical"),
        ])
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("agent_loop_detected")),
        "{v}"
    );
    assert_eq!(h["x-brownout-outcome"], "loop_abort");
    assert!(v["error"]["message"].as_str().unwrap().contains("40 times"));
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    assert_eq!(a.complete(&[("traceparent", tp)]).await.0, 409);
    let other = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01";
    assert_eq!(a.complete(&[("traceparent", other)]).await.0, 200);
    assert_eq!(
        a.complete(&[("x-brownout-conversation", "conv-ok")])
            .await
            .0,
        200
    );
    assert_eq!(
        a.complete(&[("x-brownout-conversation", "conv-expired")])
            .await
            .0,
        200,
        "an expired entry is inert"
    );
    let (_, r) = a.get("/debug/resource").await;
    assert_eq!(r["abort"]["active"], 2);
    assert_eq!(r["refused"]["loop_abort"], 2);
    assert_eq!(
        metric(&a.metrics().await, "brownout_serving_abort_entries", &[]),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_tool_gets_503_and_a_probe_lets_only_its_share_through() {
    let cl = cluster("tools");
    let a = Server::start(&cl, "tools-a", "toy", &[]).await;
    let mut c = cmd(&cl, 1);
    c.features
        .insert("tool:web_search".into(), FeatureState::Disabled);
    c.features
        .insert("tool:code_exec".into(), FeatureState::Probe);
    c.limits.probe_ratio = Some(0.25);
    publish(&cl, &c, &[&a]).await;
    let chat = |tool: &str| {
        json!({
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0,
            "tools": [{"type": "function", "function": {"name": tool, "parameters": {"type": "object"}}}],
        })
    };
    let (s, h, v) = a
        .call("/v1/chat/completions", &[], chat("web_search"))
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("tool_disabled")),
        "{v}"
    );
    assert_eq!(h["x-brownout-outcome"], "tool_disabled");
    assert_eq!(v["error"]["tool"], "web_search");
    assert!(
        v["error"]["hint"]
            .as_str()
            .unwrap()
            .contains("tool:web_search")
    );
    assert_eq!(
        a.call("/v1/chat/completions", &[], chat("calculator"))
            .await
            .0,
        200
    );
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(
            a.call("/v1/chat/completions", &[], chat("code_exec"))
                .await
                .0,
        );
    }
    assert_eq!(
        statuses,
        [200, 503, 503, 503, 200, 503, 503, 503],
        "1 in 4 passes"
    );
    // /v1/features shows the breakers.
    let (_, f) = a.get("/v1/features").await;
    let state = |n: &str| {
        f["features"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == n)
            .map(|x| {
                (
                    x["state"].clone(),
                    x["reason"].as_str().unwrap_or("").to_string(),
                )
            })
    };
    let (ws, why) = state("tool:web_search").unwrap();
    assert_eq!(ws, "disabled");
    assert!(why.contains("breaker open"), "{why}");
    let (ce, why) = state("tool:code_exec").unwrap();
    assert_eq!(ce, "probe");
    assert!(why.contains("25% of calls pass"), "{why}");
    let m = a.metrics().await;
    assert_eq!(
        metric(
            &m,
            "brownout_serving_requests_total",
            &[("outcome", "tool_disabled")]
        ),
        7.0
    );
}

/// Reads SSE `data:` payloads of a streaming response until `n` have arrived.
async fn first_events(r: reqwest::Response, n: usize) -> Vec<String> {
    let mut stream = r.bytes_stream();
    let mut buf = String::new();
    let mut out = Vec::new();
    while out.len() < n {
        let chunk = stream.next().await.expect("stream ended early").unwrap();
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(i) = buf.find("\n\n") {
            let ev: String = buf.drain(..i + 2).collect();
            if let Some(d) = ev.trim().strip_prefix("data: ") {
                out.push(d.to_string());
            }
        }
    }
    out
}

async fn wait_until(srv: &Server, what: &str, f: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let m = srv.metrics().await;
        if f(&m) {
            return m;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}:\n{m}\n{}",
            srv.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The real model in a real process: a client that goes away mid-stream, and one that gives up
/// on a queued non-streaming request, are both cancelled in the engine — their sequences leave
/// the batch, their KV blocks are freed, and the tokens made for them are counted as wasted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_is_cancelled_in_the_engine() {
    let cl = cluster("gone");
    let a = Server::start(&cl, "gone-a", "tiny-random", &["--max-num-seqs", "1"]).await;
    let long = |stream: bool| {
        json!({"prompt": "hello", "max_tokens": 1000, "ignore_eos": true, "stream": stream,
               "temperature": 0})
    };
    // 1. Streaming: read two events, then drop the connection.
    let r = client()
        .post(format!("{}/v1/completions", a.url))
        .header("x-brownout-criticality", "critical")
        .json(&long(true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let evs = first_events(r, 2).await; // `r` is consumed and dropped here
    assert!(evs[0].contains("text_completion"), "{evs:?}");
    let m = wait_until(&a, "the stream's cancellation", |m| {
        metric(m, "brownout_serving_abandoned_requests_total", &[]) >= 1.0
    })
    .await;
    let wasted = metric(&m, "brownout_serving_abandoned_tokens_total", &[]);
    assert!(
        (1.0..1000.0).contains(&wasted),
        "the engine stopped decoding it ({wasted} of 1000 tokens made)"
    );
    assert_eq!(
        metric(
            &m,
            "brownout_serving_requests_total",
            &[("outcome", "abort")]
        ),
        1.0
    );
    let (_, kv) = a.get("/debug/kv").await;
    assert_eq!(kv["running"], json!([]));
    assert_eq!(kv["pool"]["num_blocks_used"], 0, "its blocks are free");

    // 2. Non-streaming, queued behind a long request (one slot): the client gives up.
    let busy = tokio::spawn({
        let url = a.url.clone();
        async move {
            client()
                .post(format!("{url}/v1/completions"))
                .json(&long(false))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    let start = Instant::now();
    while a.get("/debug/kv").await.1["running"]
        .as_array()
        .map_or(0, Vec::len)
        == 0
    {
        assert!(start.elapsed() < Duration::from_secs(30));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let quitter = tokio::spawn({
        let url = a.url.clone();
        async move {
            client()
                .post(format!("{url}/v1/completions"))
                .json(&json!({"prompt": "patience", "max_tokens": 900, "ignore_eos": true}))
                .send()
                .await
        }
    });
    let start = Instant::now();
    while a.get("/debug/kv").await.1["waiting"]
        .as_array()
        .map_or(0, Vec::len)
        == 0
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the second request never queued"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    quitter.abort(); // the client goes away: its connection closes
    let m = wait_until(&a, "the queued request's cancellation", |m| {
        metric(m, "brownout_serving_abandoned_requests_total", &[]) >= 2.0
    })
    .await;
    assert!(
        metric(&m, "brownout_serving_abandoned_tokens_total", &[]) < wasted + 900.0,
        "the queued request was not decoded to the end"
    );
    assert_eq!(
        busy.await.unwrap(),
        200,
        "the running request was untouched"
    );
    let m = a.metrics().await;
    assert_eq!(
        metric(
            &m,
            "brownout_serving_requests_total",
            &[("outcome", "abort")]
        ),
        2.0,
        "the API counts the non-streaming abort too"
    );
    let (_, kv) = a.get("/debug/kv").await;
    assert_eq!(kv["pool"]["num_blocks_used"], 0);
}

/// A streaming client that goes away while its request still waits for a slot is cancelled in
/// the engine at once, before its prefill: no token is made for it and no TTFT is recorded for
/// it (before, the engine noticed only when it sent the first token, and recorded a TTFT longer
/// than any client had waited: the overload benchmark's false TTFT p99s of 11-30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_client_that_leaves_while_queued_is_cancelled_before_its_first_token() {
    let cl = cluster("gone-queued");
    // One slot, and every step padded to 20 ms: the long request holds the slot for ~20 s.
    let a = Server::start(
        &cl,
        "gq-a",
        "tiny-random",
        &["--max-num-seqs", "1", "--simulate-step-ms", "20"],
    )
    .await;
    let busy = tokio::spawn({
        let url = a.url.clone();
        async move {
            client()
                .post(format!("{url}/v1/completions"))
                .json(
                    &json!({"prompt": "hello", "max_tokens": 1000, "ignore_eos": true,
                              "temperature": 0}),
                )
                .send()
                .await
        }
    });
    let kv_len = |kv: &Value, k: &str| kv[k].as_array().map_or(0, Vec::len);
    let start = Instant::now();
    while kv_len(&a.get("/debug/kv").await.1, "running") == 0 {
        assert!(start.elapsed() < Duration::from_secs(30), "never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Its first token is out (its TTFT recorded) before the stream comes.
    let ttfts = |m: &str| metric(m, "vllm:time_to_first_token_seconds_count", &[]);
    let before = ttfts(
        &wait_until(&a, "the long request's first token", |m| {
            metric(m, "vllm:generation_tokens_total", &[]) >= 1.0
        })
        .await,
    );
    // The stream's headers come at once; its request waits behind the long one.
    let r = client()
        .post(format!("{}/v1/completions", a.url))
        .json(&json!({"prompt": "patience", "max_tokens": 50, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let start = Instant::now();
    while kv_len(&a.get("/debug/kv").await.1, "waiting") == 0 {
        assert!(start.elapsed() < Duration::from_secs(30), "never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    drop(r); // the client goes away: its connection closes
    let m = wait_until(&a, "the queued stream's cancellation", |m| {
        metric(m, "brownout_serving_abandoned_requests_total", &[]) >= 1.0
    })
    .await;
    let (_, kv) = a.get("/debug/kv").await;
    assert_eq!(
        (kv_len(&kv, "running"), kv_len(&kv, "waiting")),
        (1, 0),
        "cancelled while the long request still runs, not when it got the slot: {kv}"
    );
    assert_eq!(
        metric(&m, "brownout_serving_abandoned_tokens_total", &[]),
        0.0,
        "no token was made for it"
    );
    assert_eq!(ttfts(&m), before, "no TTFT was recorded for it");
    busy.abort();
}

/// The per-user cap with real concurrency: two agent requests of one user wait in the engine's
/// queue behind long critical work (one slot), so they are in flight; the user's third gets 429
/// while another user's request is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_user_over_the_cap_gets_429_while_another_user_passes() {
    let cl = cluster("ucap");
    let a = Server::start(
        &cl,
        "ucap-a",
        "tiny-random",
        &["--max-num-seqs", "1", "--user-concurrency", "2"],
    )
    .await;
    let post = |headers: Vec<(&'static str, String)>, body: Value| {
        let url = a.url.clone();
        tokio::spawn(async move {
            let mut b = client().post(format!("{url}/v1/completions")).json(&body);
            for (k, v) in headers {
                b = b.header(k, v);
            }
            b.send().await.map(|r| r.status().as_u16())
        })
    };
    let long = json!({"prompt": "hold", "max_tokens": 1000, "ignore_eos": true});
    // Long critical work ahead (not agent traffic: uncapped).
    let mut blockers = Vec::new();
    for _ in 0..3 {
        blockers.push(post(
            vec![("x-brownout-criticality", "critical".into())],
            long.clone(),
        ));
    }
    let agent = |user: &str, conv: &str| {
        vec![
            ("x-brownout-user", user.to_string()),
            ("x-brownout-conversation", conv.to_string()),
        ]
    };
    let small = json!({"prompt": "agent step", "max_tokens": 2});
    let held = [
        post(agent("alice", "c1"), small.clone()),
        post(agent("alice", "c2"), small.clone()),
    ];
    // Both are admitted (and queued behind the blockers).
    let start = Instant::now();
    loop {
        let (_, r) = a.get("/debug/resource").await;
        if r["user_concurrency"]["in_flight_requests"] == 2 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{r}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let (s, h, v) = a
        .call(
            "/v1/completions",
            &[
                ("x-brownout-user", "alice"),
                ("x-brownout-conversation", "c3"),
            ],
            small.clone(),
        )
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (429, Some("user_concurrency_limit")),
        "{v}"
    );
    assert_eq!(h["retry-after"], "1");
    assert_eq!(h["x-brownout-outcome"], "user_cap");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 2")
    );
    // The body's `user` counts the same way when no header names one.
    let mut body = small.clone();
    body["user"] = json!("alice");
    let (s, _, _) = a
        .call(
            "/v1/completions",
            &[("x-brownout-conversation", "c4")],
            body,
        )
        .await;
    assert_eq!(s, 429);
    // Another user is admitted (it queues like everyone else).
    let bob = post(agent("bob", "b1"), small.clone());
    let (_, r) = a.get("/debug/resource").await;
    assert_eq!(r["user_concurrency"]["top_offenders"][0]["user"], "alice");
    assert_eq!(r["user_concurrency"]["top_offenders"][0]["refused"], 2);
    assert_eq!(bob.await.unwrap().unwrap(), 200);
    for h in held {
        assert_eq!(h.await.unwrap().unwrap(), 200);
    }
    for b in blockers {
        assert_eq!(b.await.unwrap().unwrap(), 200);
    }
    // Done: alice's slots are back.
    assert_eq!(
        a.call(
            "/v1/completions",
            &[
                ("x-brownout-user", "alice"),
                ("x-brownout-conversation", "c5")
            ],
            small,
        )
        .await
        .0,
        200
    );
    let m = a.metrics().await;
    assert_eq!(
        metric(
            &m,
            "brownout_serving_requests_total",
            &[("outcome", "user_cap")]
        ),
        2.0
    );
    assert!(
        !m.contains("alice"),
        "no per-user label values in the metrics"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fcfs_has_no_reserve_and_bad_flags_are_refused_with_a_reason() {
    let cl = cluster("flags");
    let f = Server::start(&cl, "fcfs-a", "toy", &["--scheduling-policy", "fcfs"]).await;
    let (_, r) = f.get("/debug/resource").await;
    assert_eq!(r["engine"]["scheduling_policy"], "fcfs");
    assert_eq!(r["engine"]["critical_reserve"]["seqs"], 0);
    assert_eq!(r["engine"]["critical_reserve"]["blocks"], 0);
    let p = Server::start(&cl, "prio-a", "toy", &[]).await;
    let (_, r) = p.get("/debug/resource").await;
    assert_eq!(r["engine"]["scheduling_policy"], "priority");
    assert_eq!(r["engine"]["critical_reserve"]["ratio"], 0.2);
    assert_eq!(
        r["engine"]["critical_reserve"]["seqs"], 6,
        "round(32 × 0.2)"
    );
    for (args, want) in [
        (&["--scheduling-policy", "lottery"][..], "fcfs or priority"),
        (&["--critical-reserve-ratio", "1.5"][..], "[0, 1)"),
        (&["--instance-id", "*"][..], "reserved"),
        (&["--instance-id", "has space"][..], "visible ASCII"),
    ] {
        let out = Proc::new(env!("CARGO_BIN_EXE_brownout-serve"))
            .args(["--model", "toy", "--port", "0"])
            .args(args)
            .env_remove("REDIS_URL")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
