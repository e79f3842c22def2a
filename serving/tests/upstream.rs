//! `brownout-serve --upstream`: real proxy processes in front of real upstream processes
//! (another brownout-serve; llama.cpp's server when it is installed), commands signed and
//! published on the real Redis (a unique cluster per test), real HTTP clients.
//!
//! Waits poll with a generous deadline (a deadlock guard, never a timing assertion).

use std::process::{Command as Proc, Stdio};
use std::time::{Duration, Instant};

use brownout_protocol::{
    Ack, Command, Criticality, FeatureState, InstanceEntry, RedisKeys, Shed, SignedCommand, Tier,
    now_ms,
};
use futures::StreamExt;
use redis::AsyncCommands;
use serde_json::{Value, json};

use brownout_test_support::{free_port, redis_url, unique};

mod common;
use common::{KillOnDrop, client};

const KEY: &str = "upstream-test-key";

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
    unique(&format!("u-{name}-"))
}

/// One process, killed on drop.
struct Server {
    _child: KillOnDrop,
    url: String,
    instance: String,
    log: std::path::PathBuf,
}

/// Where the processes are told to subscribe (none: no Redis).
struct Sub<'a> {
    cluster: &'a str,
    instance: &'a str,
}

impl Server {
    /// `brownout-serve ARGS` on `port`; waits for `/health` to answer 200 when `healthy`.
    async fn start(
        name: &str,
        port: u16,
        args: &[&str],
        sub: Option<Sub<'_>>,
        healthy: bool,
    ) -> Server {
        let log = std::env::temp_dir().join(format!("upstream-test-{name}-{port}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let mut cmd = Proc::new(env!("CARGO_BIN_EXE_brownout-serve"));
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(args)
            .env("RUST_LOG", "warn")
            .env_remove("REDIS_URL")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("BROWNOUT_CONTROL_PLANE")
            .env_remove("BROWNOUT_UPSTREAM_API_KEY")
            .stdout(Stdio::null())
            .stderr(out);
        let instance = match &sub {
            Some(s) => {
                cmd.args(["--redis-url", &redis_url(), "--cluster", s.cluster])
                    .args(["--instance-id", s.instance])
                    .env("BROWNOUT_COMMAND_KEY", KEY)
                    // The HMAC compatibility mode, chosen explicitly (serving/tests/command_keys_process.rs
                    // covers the Ed25519 default).
                    .env("BROWNOUT_COMMAND_SIGNATURE", "hmac");
                s.instance.to_string()
            }
            None => format!("brownout-serve-{port}"),
        };
        let child = cmd.spawn().expect("brownout-serve starts");
        let s = Server {
            _child: KillOnDrop(child),
            url: format!("http://127.0.0.1:{port}"),
            instance,
            log,
        };
        if healthy {
            s.wait_health(200).await;
        } else {
            // Up (answering), whatever its health.
            let start = Instant::now();
            while client()
                .get(format!("{}/v1/models", s.url))
                .send()
                .await
                .is_err()
            {
                assert!(
                    start.elapsed() < Duration::from_secs(120),
                    "{name} never answered:\n{}",
                    s.log()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        s
    }

    async fn wait_health(&self, status: u16) -> Value {
        let start = Instant::now();
        loop {
            let (s, v) = self.get("/health").await;
            if s == status {
                return v;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "{} /health never answered {status} (last {s} {v}):\n{}",
                self.url,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        match client().get(format!("{}{path}", self.url)).send().await {
            Ok(r) => {
                let s = r.status().as_u16();
                let text = r.text().await.unwrap_or_default();
                (
                    s,
                    serde_json::from_str(&text).unwrap_or(Value::String(text)),
                )
            }
            Err(e) => (0, Value::String(e.to_string())),
        }
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

    async fn chat(
        &self,
        headers: &[(&str, &str)],
        max_tokens: u32,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        self.call(
            "/v1/chat/completions",
            headers,
            json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens,
                   "ignore_eos": true, "temperature": 0}),
        )
        .await
    }
}

/// The value of the series `name{…labels…}` (labels in any order, summed), 0 when absent.
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

async fn wait_metric(srv: &Server, what: &str, f: impl Fn(&str) -> bool) -> String {
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

/// The `data:` payloads of an SSE body, in order.
async fn sse_events(r: reqwest::Response, limit: Option<usize>) -> Vec<String> {
    let mut stream = r.bytes_stream();
    let mut buf = String::new();
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        while let Some(i) = buf.find("\n\n") {
            let ev: String = buf.drain(..i + 2).collect();
            if let Some(d) = ev.trim().strip_prefix("data: ") {
                out.push(d.to_string());
            }
        }
        if limit.is_some_and(|n| out.len() >= n) {
            break;
        }
    }
    out
}

/// The text of a stream's content events (chat `delta.content` or completion `text`).
fn stream_text(evs: &[String]) -> String {
    evs.iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| {
            let c = &v["choices"][0];
            c["delta"]["content"]
                .as_str()
                .or(c["text"].as_str())
                .map(str::to_string)
        })
        .collect()
}

/// Publishes `cmd` signed with the test key (state hash, then notify) and waits for the acks.
async fn publish(cl: &str, cmd: &Command, servers: &[&Server]) {
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
    for srv in servers {
        let start = Instant::now();
        loop {
            let v: Option<String> = conn.hget(keys.acks(), &srv.instance).await.unwrap();
            if let Some(v) = v
                && let Ok(Ack::Applied { version, .. }) =
                    Ack::parse_signed(&v, KEY.as_bytes(), &srv.instance)
                && version == cmd.version
            {
                break;
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
}

fn cmd(cl: &str, version: u64, tier: Tier) -> Command {
    let mut c = Command::normal(cl, 1, version, now_ms(), 600_000);
    c.tier = tier;
    c.reason.trigger = "operator".into();
    c.reason.detail = "upstream test".into();
    c
}

async fn upstream(name: &str, model: &str, extra: &[&str]) -> Server {
    let mut args = vec!["--model", model];
    args.extend_from_slice(extra);
    Server::start(name, free_port(), &args, None, true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_and_streams_pass_through_with_the_proxys_metrics() {
    let up = upstream("pass-up", "toy", &[]).await;
    let url = up.url.clone();
    let px = Server::start("pass-px", free_port(), &["--upstream", &url], None, true).await;

    // /v1/models: the upstream's model, under its name, with its context length.
    let (s, m) = px.get("/v1/models").await;
    assert_eq!(s, 200);
    assert_eq!(m["data"][0]["id"], "toy", "{m}");
    assert_eq!(m["data"][0]["max_model_len"], 2048);
    let (s, h) = px.get("/health").await;
    assert_eq!((s, h["status"].as_str()), (200, Some("ok")), "{h}");
    assert_eq!(h["upstreams"]["primary"]["url"], url.as_str());

    // Non-streaming chat and completion: the upstream's answer, as it is.
    let (s, hd, v) = px.chat(&[], 5).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(hd["x-brownout-route"], "primary");
    let (_, _, direct) = up.chat(&[], 5).await;
    assert_eq!(
        v["choices"][0]["message"]["content"], direct["choices"][0]["message"]["content"],
        "the same text as calling the upstream directly"
    );
    let (s, _, v) = px
        .call(
            "/v1/completions",
            &[],
            json!({"prompt": "hi", "max_tokens": 3, "ignore_eos": true}),
        )
        .await;
    assert_eq!(
        (s, v["object"].as_str()),
        (200, Some("text_completion")),
        "{v}"
    );
    assert_eq!(v["usage"]["completion_tokens"], 3);

    // Streaming: the upstream's events passed through one by one, ending with [DONE].
    let body = json!({"messages": [{"role": "user", "content": "stream"}], "max_tokens": 6,
                      "ignore_eos": true, "temperature": 0, "stream": true,
                      "stream_options": {"include_usage": true}});
    let r = client()
        .post(format!("{}/v1/chat/completions", px.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let via = sse_events(r, None).await;
    let r = client()
        .post(format!("{}/v1/chat/completions", up.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    let direct = sse_events(r, None).await;
    assert_eq!(
        via.len(),
        direct.len(),
        "the same events: {via:?} vs {direct:?}"
    );
    assert_eq!(via.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(stream_text(&via), stream_text(&direct));
    assert!(!stream_text(&via).is_empty());
    let usage: Value = serde_json::from_str(&via[via.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 6, "{usage}");

    // Bad requests are answered by the proxy, as the bundled engine answers them.
    let (s, _, v) = px
        .call(
            "/v1/chat/completions",
            &[],
            json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (404, Some("model_not_found")),
        "{v}"
    );
    let (s, _, v) = px
        .call(
            "/v1/chat/completions",
            &[],
            json!({"n": 2, "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!((s, v["error"]["param"].as_str()), (400, Some("n")), "{v}");
    let r = client()
        .post(format!("{}/v1/chat/completions", px.url))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let (s, _, v) = px
        .call(
            "/v1/chat/completions",
            &[("x-brownout-criticality", "urgent")],
            json!({"messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (400, Some("invalid_header")),
        "{v}"
    );

    // /v1/features as the engine serves it.
    let (s, f) = px.get("/v1/features").await;
    assert_eq!(s, 200, "{f}");

    // The vLLM-named metrics, measured at the proxy.
    let m = px.metrics().await;
    let count = |n: &str| metric(&m, n, &[("model_name", "toy")]);
    assert_eq!(count("vllm:e2e_request_latency_seconds_count"), 3.0, "{m}");
    assert_eq!(count("vllm:request_queue_time_seconds_count"), 3.0);
    assert_eq!(
        count("vllm:time_to_first_token_seconds_count"),
        1.0,
        "the stream's TTFT"
    );
    assert!(count("vllm:inter_token_latency_seconds_count") >= 1.0);
    assert_eq!(count("vllm:generation_tokens_total"), 14.0, "5 + 3 + 6");
    assert_eq!(
        metric(&m, "brownout_upstream_up", &[("route", "primary")]),
        1.0
    );
    assert_eq!(
        metric(&m, "brownout_upstream_requests_total", &[("result", "2xx")]),
        3.0
    );
    assert_eq!(
        metric(
            &m,
            "brownout_serving_requests_total",
            &[("outcome", "length")]
        ),
        3.0
    );
    assert_eq!(metric(&m, "vllm:num_requests_running", &[]), 0.0);

    // The upstream's own metrics, passed through; it saw only the valid requests (+ direct).
    let r = client()
        .get(format!("{}/metrics/upstream/primary", px.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let um = r.text().await.unwrap();
    assert_eq!(
        metric(
            &um,
            "brownout_serving_requests_total",
            &[("outcome", "length")]
        ),
        5.0,
        "3 proxied + 2 direct: {um}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_obeys_t1_t2_t3_and_drain_commands() {
    let cl = cluster("cmds");
    let big = upstream("cmd-big", "toy", &["--served-model-name", "big"]).await;
    let small = upstream("cmd-small", "toy", &["--served-model-name", "small"]).await;
    let (pu, fu) = (
        format!("primary={}", big.url),
        format!("fallback={}", small.url),
    );
    let px = Server::start(
        "cmd-px",
        free_port(),
        &["--upstream", &pu, "--upstream", &fu],
        Some(Sub {
            cluster: &cl,
            instance: "proxy-a",
        }),
        true,
    )
    .await;
    let (_, h) = px.get("/health").await;
    assert_eq!(h["upstreams"]["fallback"]["model"], "small", "{h}");
    let (s, _, v) = px.chat(&[], 4).await;
    assert_eq!(
        (s, v["model"].as_str()),
        (200, Some("big")),
        "T0: the primary"
    );

    // T1: a disabled feature and an open tool breaker.
    let mut c = cmd(&cl, 1, Tier::T1);
    c.features
        .insert("summarize".into(), FeatureState::Disabled);
    c.features
        .insert("tool:web_search".into(), FeatureState::Disabled);
    publish(&cl, &c, &[&px]).await;
    let (s, _, v) = px.chat(&[("x-brownout-feature", "summarize")], 4).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("feature_disabled")),
        "{v}"
    );
    assert_eq!(v["error"]["feature"], "summarize");
    assert_eq!(px.chat(&[("x-brownout-feature", "chat")], 4).await.0, 200);
    let (s, _, v) = px
        .call(
            "/v1/chat/completions",
            &[],
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
                   "tools": [{"type": "function", "function": {"name": "web_search"}}]}),
        )
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("tool_disabled")),
        "{v}"
    );
    let (_, f) = px.get("/v1/features").await;
    assert!(f.to_string().contains("summarize"), "{f}");

    // T2: default traffic to the fallback route's model, max_tokens capped; critical untouched.
    let mut c = cmd(&cl, 2, Tier::T2);
    c.model_route.insert("default".into(), "fallback".into());
    c.model_route.insert("critical".into(), "primary".into());
    c.limits.max_tokens_cap = Some(3);
    publish(&cl, &c, &[&px]).await;
    let (s, hd, v) = px.chat(&[], 50).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["model"], "small", "the fallback route's upstream model");
    assert_eq!(v["usage"]["completion_tokens"], 3, "max_tokens capped: {v}");
    assert_eq!(hd["x-brownout-route"], "fallback");
    assert_eq!(hd["x-brownout-upstream-model"], "small");
    let (s, _, v) = px
        .call(
            "/v1/completions",
            &[],
            json!({"prompt": "p", "ignore_eos": true}),
        )
        .await;
    assert_eq!(
        (s, v["usage"]["completion_tokens"].as_u64()),
        (200, Some(3)),
        "a cap where none was asked: {v}"
    );
    let (s, hd, v) = px.chat(&[("x-brownout-criticality", "critical")], 8).await;
    assert_eq!((s, v["model"].as_str()), (200, Some("big")), "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 8, "critical is not capped");
    assert_eq!(hd["x-brownout-route"], "primary");
    let sm = small.metrics().await;
    assert_eq!(
        metric(
            &sm,
            "brownout_serving_requests_total",
            &[("outcome", "length")]
        ),
        2.0,
        "the fallback upstream served the two"
    );

    // T3: below critical is shed with Retry-After and the recovery ETA.
    let mut c = cmd(&cl, 3, Tier::T3);
    c.shed = Some(Shed {
        admit_min_criticality: Criticality::Critical,
        retry_after_s: 7,
        jitter_ratio: 0.0,
        recovery_eta_ms: now_ms() + 120_000,
        admit_rps: None,
    });
    publish(&cl, &c, &[&px]).await;
    let (s, hd, v) = px.chat(&[("x-brownout-criticality", "sheddable")], 2).await;
    assert_eq!((s, v["error"]["code"].as_str()), (429, Some("shed")), "{v}");
    assert_eq!(hd["retry-after"], "7");
    assert_eq!(hd["x-brownout-outcome"], "shed");
    assert!(
        v["error"]["estimated_recovery_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{v}"
    );
    assert_eq!(px.chat(&[], 2).await.0, 429);
    assert_eq!(
        px.chat(&[("x-brownout-criticality", "critical")], 2)
            .await
            .0,
        200
    );

    // Drain of this instance: non-critical 503, /health says draining; critical passes.
    let mut c = cmd(&cl, 4, Tier::T0);
    c.instances.insert(
        "proxy-a".into(),
        InstanceEntry {
            drain: Some(true),
            reason: "upstream maintenance".into(),
            ..InstanceEntry::default()
        },
    );
    publish(&cl, &c, &[&px]).await;
    let (s, hd, v) = px.chat(&[], 2).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("instance_draining")),
        "{v}"
    );
    assert_eq!(hd["retry-after"], "2");
    let (s, h) = px.get("/health").await;
    assert_eq!((s, h["status"].as_str()), (503, Some("draining")), "{h}");
    assert_eq!(
        px.chat(&[("x-brownout-criticality", "critical")], 2)
            .await
            .0,
        200
    );

    let m = px.metrics().await;
    for (o, n) in [
        ("feature_disabled", 1.0),
        ("tool_disabled", 1.0),
        ("shed", 2.0),
        ("drained", 1.0),
    ] {
        assert_eq!(
            metric(&m, "brownout_serving_refusals_total", &[("outcome", o)]),
            n,
            "{o}: {m}"
        );
    }
    assert_eq!(metric(&m, "brownout_serving_draining", &[]), 1.0);
    assert_eq!(metric(&m, "brownout_serving_command_version", &[]), 4.0);

    // Back to T0: everyone on the primary again.
    publish(&cl, &cmd(&cl, 5, Tier::T0), &[&px]).await;
    let (s, _, v) = px.chat(&[("x-brownout-criticality", "sheddable")], 4).await;
    assert_eq!((s, v["model"].as_str()), (200, Some("big")), "{v}");
    px.wait_health(200).await;
}

/// A client that goes away mid-stream, and one that gives up on a non-streaming request, both
/// close their upstream request: the upstream counts them abandoned and stops decoding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_cancels_the_upstream_request() {
    let up = upstream("gone-up", "tiny-random", &["--max-num-seqs", "1"]).await;
    let url = up.url.clone();
    let px = Server::start("gone-px", free_port(), &["--upstream", &url], None, true).await;
    let long = |stream: bool| {
        json!({"prompt": "hello", "max_tokens": 1000, "ignore_eos": true, "stream": stream,
               "temperature": 0})
    };
    let r = client()
        .post(format!("{}/v1/completions", px.url))
        .json(&long(true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let evs = sse_events(r, Some(2)).await; // `r` is dropped here: the client is gone
    assert!(evs[0].contains("text_completion"), "{evs:?}");
    let m = wait_metric(&up, "the upstream's cancellation", |m| {
        metric(m, "brownout_serving_abandoned_requests_total", &[]) >= 1.0
    })
    .await;
    let wasted = metric(&m, "brownout_serving_abandoned_tokens_total", &[]);
    assert!(
        (1.0..1000.0).contains(&wasted),
        "the upstream stopped decoding ({wasted} of 1000)"
    );
    let pm = wait_metric(&px, "the proxy's abort", |m| {
        metric(
            m,
            "brownout_serving_requests_total",
            &[("outcome", "abort")],
        ) >= 1.0
    })
    .await;
    assert_eq!(
        metric(&pm, "vllm:num_requests_running", &[]),
        0.0,
        "its slot is free"
    );

    // Non-streaming: the client gives up while the upstream decodes.
    let quitter = tokio::spawn({
        let url = px.url.clone();
        async move {
            client()
                .post(format!("{url}/v1/completions"))
                .json(&long(false))
                .send()
                .await
        }
    });
    let start = Instant::now();
    while up.get("/debug/kv").await.1["running"]
        .as_array()
        .map_or(0, Vec::len)
        == 0
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    quitter.abort();
    wait_metric(&up, "the second cancellation", |m| {
        metric(m, "brownout_serving_abandoned_requests_total", &[]) >= 2.0
    })
    .await;
    let pm = wait_metric(&px, "the proxy's second abort", |m| {
        metric(
            m,
            "brownout_serving_requests_total",
            &[("outcome", "abort")],
        ) >= 2.0
    })
    .await;
    assert_eq!(metric(&pm, "vllm:num_requests_running", &[]), 0.0);
    let (_, kv) = up.get("/debug/kv").await;
    assert_eq!(
        kv["pool"]["num_blocks_used"], 0,
        "the upstream freed its blocks"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_is_down_gives_503_and_health_says_so() {
    let port = free_port();
    let dead = format!("http://127.0.0.1:{port}");
    let px = Server::start(
        "down-px",
        free_port(),
        &[
            "--upstream",
            &dead,
            "--served-model-name",
            "toy",
            "--upstream-health-interval-ms",
            "100",
        ],
        None,
        false,
    )
    .await;
    let h = px.wait_health(503).await;
    assert_eq!(h["error"]["code"], "upstream_unavailable", "{h}");
    assert_eq!(h["error"]["upstreams"]["primary"]["up"], false);
    let (s, hd, v) = px.chat(&[], 2).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("upstream_unavailable")),
        "{v}"
    );
    assert_eq!(v["error"]["type"], "service_unavailable_error");
    assert!(
        v["error"]["message"].as_str().unwrap().contains(&dead),
        "{v}"
    );
    assert_eq!(hd["retry-after"], "5");

    // The upstream comes up: the probe notices, requests pass.
    let up = Server::start("down-up", port, &["--model", "toy"], None, true).await;
    px.wait_health(200).await;
    assert_eq!(px.chat(&[], 2).await.0, 200);
    // And goes away again.
    drop(up);
    px.wait_health(503).await;
    assert_eq!(px.chat(&[], 2).await.0, 503);
    let m = px.metrics().await;
    assert_eq!(metric(&m, "brownout_upstream_up", &[]), 0.0);
    assert!(
        metric(
            &m,
            "brownout_upstream_requests_total",
            &[("result", "connect_error")]
        ) >= 2.0,
        "{m}"
    );
}

/// A minimal OpenAI-compatible server in the test: `/v1/models` lists `fake`; a chat whose
/// first message is `hold` is never answered (its connection stays open), any other gets `ok`.
async fn fake_upstream() -> String {
    use axum::routing::{get, post};
    let app = axum::Router::new()
        .route(
            "/v1/models",
            get(|| async { axum::Json(json!({"object": "list", "data": [{"id": "fake", "object": "model"}]})) }),
        )
        .route(
            "/v1/chat/completions",
            post(|axum::Json(b): axum::Json<Value>| async move {
                if b["messages"][0]["content"] == "hold" {
                    std::future::pending::<()>().await;
                }
                axum::Json(json!({"id": "x", "object": "chat.completion", "model": b["model"],
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}))
            }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    url
}

async fn limiter(px: &Server) -> Value {
    px.get("/debug/resource").await.1["upstream"]["limiter"].clone()
}

async fn wait_limiter(px: &Server, what: &str, f: impl Fn(&Value) -> bool) {
    let start = Instant::now();
    loop {
        let l = limiter(px).await;
        if f(&l) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never {what}: {l}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The critical reserve as a concurrency reserve: two slots, one of them critical-only. A
/// default request the upstream never answers holds the non-critical slot; the next default
/// request waits in the proxy's queue (and gives up after --max-queue-wait-secs), while a
/// critical one is served from the reserve at once. The command's limits.max_num_seqs lowers
/// the concurrency in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_critical_reserve_keeps_upstream_slots_for_critical_requests() {
    let cl = cluster("reserve");
    let url = fake_upstream().await;
    let px = Server::start(
        "res-px",
        free_port(),
        &[
            "--upstream",
            &url,
            "--upstream-max-concurrency",
            "2",
            "--critical-reserve-ratio",
            "0.5",
            "--max-queue-wait-secs",
            "2",
        ],
        Some(Sub {
            cluster: &cl,
            instance: "proxy-r",
        }),
        true,
    )
    .await;
    let l = limiter(&px).await;
    assert_eq!(
        (l["in_force"].as_u64(), l["reserve"].as_u64()),
        (Some(2), Some(1)),
        "{l}"
    );
    let chat = |content: &'static str, crit: &'static str| {
        let url = px.url.clone();
        async move {
            let r = client()
                .post(format!("{url}/v1/chat/completions"))
                .header("x-brownout-criticality", crit)
                .json(&json!({"messages": [{"role": "user", "content": content}]}))
                .send()
                .await
                .unwrap();
            let s = r.status().as_u16();
            let retry = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_string());
            (s, retry, r.json::<Value>().await.unwrap())
        }
    };
    let holder = tokio::spawn(chat("hold", "default"));
    wait_limiter(&px, "held the non-critical slot", |l| {
        l["non_critical_in_flight"] == 1
    })
    .await;
    let waiter = tokio::spawn(chat("next", "sheddable"));
    wait_limiter(&px, "queued the second default request", |l| {
        l["waiting"] == 1
    })
    .await;
    let (s, _, v) = chat("urgent", "critical").await;
    assert_eq!(s, 200, "critical takes the reserved slot at once: {v}");
    assert_eq!(
        limiter(&px).await["waiting"],
        1,
        "the default one still waits"
    );
    let (s, retry, v) = waiter.await.unwrap();
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("upstream_overloaded")),
        "{v}"
    );
    assert_eq!(retry.as_deref(), Some("1"));
    let m = px.metrics().await;
    assert_eq!(
        metric(&m, "brownout_serving_critical_reserve_seqs", &[]),
        1.0
    );
    assert_eq!(
        metric(&m, "vllm:num_requests_running", &[]),
        1.0,
        "the held one"
    );

    // limits.max_num_seqs = 1: the one slot is taken, so even critical waits now.
    let mut c = cmd(&cl, 1, Tier::T2);
    c.limits.max_num_seqs = Some(1);
    publish(&cl, &c, &[&px]).await;
    let l = limiter(&px).await;
    assert_eq!(
        (l["in_force"].as_u64(), l["reserve"].as_u64()),
        (Some(1), Some(0)),
        "{l}"
    );
    let (s, _, v) = chat("urgent", "critical").await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("upstream_overloaded")),
        "{v}"
    );
    holder.abort();
    wait_limiter(&px, "freed the held slot", |l| l["in_flight"] == 0).await;
    assert_eq!(chat("after", "default").await.0, 200);
}

/// llama.cpp's OpenAI-compatible server (`pip install 'llama-cpp-python[server]'`) with the
/// SmolLM2 GGUF (`scripts/fetch-model.sh`) behind the proxy; skipped with a message when either
/// is absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_cpp_server_behind_the_proxy() {
    let ok = Proc::new("python3")
        .args(["-c", "import llama_cpp.server"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "SKIPPED llama_cpp_server_behind_the_proxy: llama-cpp-python[server] is not installed (pip install 'llama-cpp-python[server]')"
        );
        return;
    }
    let gguf = std::env::var("HOME")
        .map(|h| {
            std::path::PathBuf::from(h)
                .join(".cache/brownout/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        })
        .ok()
        .filter(|p| p.exists());
    let Some(gguf) = gguf else {
        eprintln!(
            "SKIPPED llama_cpp_server_behind_the_proxy: the SmolLM2 GGUF is not in ~/.cache/brownout/models (scripts/fetch-model.sh)"
        );
        return;
    };
    let port = free_port();
    let log = std::env::temp_dir().join(format!("upstream-test-llamacpp-{port}.log"));
    let child = Proc::new("python3")
        .args(["-m", "llama_cpp.server", "--model"])
        .arg(&gguf)
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--n_ctx",
            "2048",
            "--model_alias",
            "smollm2",
        ])
        // Its default interrupts a running stream whenever another request (a health probe)
        // arrives; docs/UPSTREAM.md.
        .args(["--interrupt_requests", "False"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("python3 starts");
    let _llama = KillOnDrop(child);
    let url = format!("http://127.0.0.1:{port}");
    let start = Instant::now();
    while !client()
        .get(format!("{url}/v1/models"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "llama.cpp server never answered:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let px = Server::start("llama-px", free_port(), &["--upstream", &url], None, true).await;
    let (_, m) = px.get("/v1/models").await;
    assert_eq!(m["data"][0]["id"], "smollm2", "{m}");
    let (s, _, v) = px.chat(&[], 8).await;
    assert_eq!(s, 200, "{v}");
    assert!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{v}"
    );
    let r = client()
        .post(format!("{}/v1/chat/completions", px.url))
        .json(&json!({"messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 12, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let evs = sse_events(r, None).await;
    assert_eq!(evs.last().map(String::as_str), Some("[DONE]"), "{evs:?}");
    assert!(!stream_text(&evs).is_empty(), "{evs:?}");
    let pm = px.metrics().await;
    assert_eq!(
        metric(&pm, "vllm:time_to_first_token_seconds_count", &[]),
        1.0,
        "{pm}"
    );
    assert_eq!(
        metric(&pm, "vllm:e2e_request_latency_seconds_count", &[]),
        2.0
    );
}
