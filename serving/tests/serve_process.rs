//! `brownout-serve` as an operator runs it, against real processes: graceful shutdown on SIGTERM
//! (engine mode and `--upstream` in front of a second engine), the shared listener's caps and
//! header timeout on the `--upstream` port, and `--api-key` (raw HTTP and the real Python
//! `openai` SDK).
//!
//! The engines run `--model toy` with `--simulate-step-ms` (a simulated GPU pace: each engine step
//! takes at least that long), so a stream lasts seconds. Waits poll with generous deadlines (a
//! deadlock guard, never a timing assertion).

use std::process::{Command as Proc, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use brownout_test_support::{free_port, poll};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
use common::{KillOnDrop, client};

/// One `brownout-serve` process, killed on drop.
struct Server {
    child: KillOnDrop,
    url: String,
    port: u16,
    log: tempfile::NamedTempFile,
}

impl Server {
    /// Starts `brownout-serve ARGS` on a free port, with `env`, and waits for `/health` 200.
    async fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
        let port = free_port();
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut cmd = Proc::new(env!("CARGO_BIN_EXE_brownout-serve"));
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(args)
            .env("RUST_LOG", "info")
            .env_remove("REDIS_URL")
            .env_remove("BROWNOUT_SERVE_API_KEY")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("BROWNOUT_CONTROL_PLANE")
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("brownout-serve starts");
        let s = Server {
            child: KillOnDrop(child),
            url: format!("http://127.0.0.1:{port}"),
            port,
            log,
        };
        let health = format!("{}/health", s.url);
        let up = poll(Duration::from_secs(120), || {
            let r = client().get(&health).send();
            async move { r.await.ok().filter(|r| r.status() == 200).map(|_| ()) }
        })
        .await;
        assert!(up.is_some(), "never healthy:\n{}", s.log());
        s
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    fn sigterm(&self) {
        self.signal(libc::SIGTERM);
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = i32::try_from(self.child.0.id()).unwrap();
        // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill({sig})");
    }

    /// Waits for the process to exit (a deadlock guard of `limit`).
    async fn exit_status(&mut self, limit: Duration) -> ExitStatus {
        let child = &mut self.child.0;
        let st = poll(limit, || std::future::ready(child.try_wait().unwrap())).await;
        st.unwrap_or_else(|| panic!("still running {limit:?} after SIGTERM:\n{}", self.log()))
    }

    async fn post(&self, body: Value, key: Option<&str>) -> reqwest::Response {
        let mut b = client()
            .post(format!("{}/v1/completions", self.url))
            .json(&body);
        if let Some(k) = key {
            b = b.bearer_auth(k);
        }
        b.send().await.unwrap()
    }
}

/// A toy completion of `max_tokens` tokens (EOS ignored, so it runs its full length).
fn completion(max_tokens: u32, stream: bool) -> Value {
    json!({"model": "toy", "prompt": "hello", "max_tokens": max_tokens, "ignore_eos": true,
           "stream": stream})
}

/// An open SSE stream: its bytes so far.
struct Stream {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    text: String,
}

impl Stream {
    async fn open(s: &Server, max_tokens: u32) -> Stream {
        let r = s.post(completion(max_tokens, true), None).await;
        assert_eq!(r.status(), 200);
        let mut st = Stream {
            body: r.bytes_stream().boxed(),
            text: String::new(),
        };
        // Wait for the first token: the request is in flight in the engine.
        while !st.text.contains("\"text\"") {
            st.next().await.expect("a first token");
        }
        st
    }

    async fn next(&mut self) -> Option<()> {
        let c = self.body.next().await?.ok()?;
        self.text.push_str(&String::from_utf8_lossy(&c));
        Some(())
    }

    async fn to_end(mut self) -> String {
        while self.next().await.is_some() {}
        self.text
    }
}

/// Polls `/health` until it answers 503 `draining`.
async fn until_draining(s: &Server) -> reqwest::header::HeaderMap {
    let health = format!("{}/health", s.url);
    let r = poll(Duration::from_secs(10), || {
        let r = client().get(&health).send();
        async move { r.await.ok().filter(|r| r.status() == 503) }
    })
    .await
    .expect("/health never said draining");
    let h = r.headers().clone();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], "draining", "{v}");
    h
}

/// A request arriving during the drain is refused 503 `instance_draining` + Retry-After.
async fn assert_refused_while_draining(s: &Server) {
    let r = s.post(completion(4, false), None).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"), "{:?}", r.headers());
    assert_eq!(r.headers()["connection"], "close");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "instance_draining", "{v}");
}

fn toy_engine(grace: &str) -> Vec<String> {
    [
        "--model",
        "toy",
        "--simulate-step-ms",
        "30",
        "--shutdown-grace-secs",
        grace,
    ]
    .map(String::from)
    .to_vec()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Engine mode: a stream in flight at SIGTERM finishes; meanwhile `/health` says draining and a
/// new request is refused; then the process exits 0, well within the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_stream_in_flight_finish_refuses_new_work_and_exits_0() {
    let args = toy_engine("30");
    let mut s = Server::start(&strs(&args), &[]).await;
    // 120 tokens at >= 30 ms a step: about 4 s.
    let stream = Stream::open(&s, 120).await;
    s.sigterm();
    let signalled = Instant::now();
    let h = until_draining(&s).await;
    assert!(h.contains_key("retry-after"));
    assert_refused_while_draining(&s).await;
    let text = stream.to_end().await;
    assert!(
        text.contains("\"finish_reason\":\"length\""),
        "the stream ran to its end: {text}"
    );
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(!text.contains("\"error\""), "{text}");
    let st = s.exit_status(Duration::from_secs(25)).await;
    assert!(st.success(), "exit status {st}:\n{}", s.log());
    assert!(
        signalled.elapsed() < Duration::from_secs(30),
        "exited within the grace"
    );
    let log = s.log();
    assert!(log.contains("in_flight_at_signal=1"), "{log}");
    assert!(log.contains("cancelled=0"), "{log}");
}

/// Past the grace, a stream still open ends with a final error event and `[DONE]`; its sequence
/// is dropped from the engine (no sequence and no KV block held at exit); the exit is 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_grace_a_stream_ends_with_an_error_event_its_kv_freed_and_exit_0() {
    let mut args = toy_engine("1");
    args.push("--no-prefix-caching".into());
    let mut s = Server::start(&strs(&args), &[]).await;
    // 2,000 tokens: about a minute, far past the 1 s grace.
    let stream = Stream::open(&s, 2000).await;
    s.sigterm();
    let text = tokio::time::timeout(Duration::from_secs(20), stream.to_end())
        .await
        .expect("the stream was ended after the grace");
    let tail = text.rsplit("data: ").nth(1).unwrap_or_default();
    let ev: Value = serde_json::from_str(tail.trim()).unwrap_or_else(|_| panic!("{text}"));
    assert_eq!(ev["error"]["code"], "instance_shutdown", "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(!text.contains("finish_reason\":\"length"), "{text}");
    let st = s.exit_status(Duration::from_secs(20)).await;
    assert!(st.success(), "exit status {st}:\n{}", s.log());
    let log = s.log();
    assert!(log.contains("cancelled=1"), "{log}");
    assert!(
        log.contains("sequences=0 kv_blocks_used=0 of"),
        "the sequence and its KV blocks were freed: {log}"
    );
}

/// `--upstream` in front of a second engine: the proxy drains the same way (the stream finishes
/// through it, new work is refused, `/health` flips), exits 0, and the upstream serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_upstream_proxy_too() {
    let up_args = toy_engine("30");
    let upstream = Server::start(&strs(&up_args), &[]).await;
    let mut proxy = Server::start(
        &[
            "--upstream",
            &upstream.url,
            "--shutdown-grace-secs",
            "30",
            "--upstream-health-interval-ms",
            "200",
        ],
        &[],
    )
    .await;
    let stream = Stream::open(&proxy, 120).await;
    proxy.sigterm();
    until_draining(&proxy).await;
    assert_refused_while_draining(&proxy).await;
    let text = stream.to_end().await;
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let st = proxy.exit_status(Duration::from_secs(25)).await;
    assert!(st.success(), "exit status {st}:\n{}", proxy.log());
    assert!(proxy.log().contains("in_flight_at_signal=1"));
    let r = upstream.post(completion(4, false), None).await;
    assert_eq!(r.status(), 200, "the upstream still serves");
}

/// A slow-header flood against the `--upstream` port: 50 connections trickle a request head.
/// The proxy holds `--max-connections` of them, each new one taking the slot of the oldest
/// (closed at once, not answered 503); a whole request sent while the listener is full is
/// answered; the held ones are closed at the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_header_flood_on_the_upstream_port_is_capped_and_timed_out() {
    let up_args = toy_engine("30");
    let upstream = Server::start(&strs(&up_args), &[]).await;
    let proxy = Server::start(
        &[
            "--upstream",
            &upstream.url,
            "--max-connections",
            "10",
            "--max-connections-per-ip",
            "10",
            "--header-read-timeout-ms",
            "1000",
        ],
        &[],
    )
    .await;
    let addr = format!("127.0.0.1:{}", proxy.port);
    let mut conns = Vec::new();
    // From five addresses (127.0.0.2…6, 10 each: within the per-address cap), so the listener
    // cap is what they hit; the whole request below comes from 127.0.0.1.
    for i in 0..50u8 {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(std::net::SocketAddr::from(([127, 0, 0, 2 + i % 5], 0)))
            .unwrap();
        let mut c = sock.connect(addr.parse().unwrap()).await.unwrap();
        c.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        conns.push(c);
    }
    // The listener is full of unfinished heads: a whole request still gets in.
    let h = client()
        .get(format!("{}/health", proxy.url))
        .send()
        .await
        .unwrap();
    assert_eq!(
        h.status(),
        200,
        "a whole request is admitted while the flood holds every slot"
    );
    let start = Instant::now();
    let (mut refused, mut closed) = (0, 0);
    for mut c in conns {
        let mut out = Vec::new();
        // Every connection ends well within 4 s: refused at once, or cut at the 1 s timeout.
        let r = tokio::time::timeout(
            Duration::from_secs(4).saturating_sub(start.elapsed()),
            c.read_to_end(&mut out),
        )
        .await;
        assert!(
            r.is_ok(),
            "a trickling connection was still open 4 s later ({refused} refused, {closed} closed so far)"
        );
        let text = String::from_utf8_lossy(&out);
        if text.starts_with("HTTP/1.1 503") {
            assert!(text.contains("too_many_connections"), "{text}");
            refused += 1;
        } else {
            closed += 1;
        }
    }
    assert_eq!(
        refused, 0,
        "over the cap, the oldest unfinished head goes, no 503"
    );
    assert_eq!(closed, 50);
    let h = client()
        .get(format!("{}/health", proxy.url))
        .send()
        .await
        .unwrap();
    assert_eq!(h.status(), 200, "served again after the flood");
}

/// `--api-key` from the environment (two keys): missing or wrong 401 in OpenAI's shape, either
/// key 200, `/health` and `/metrics` open; the real `openai` Python SDK is accepted with a right
/// key and raises `AuthenticationError` with a wrong one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_is_required_on_the_openai_routes_only() {
    let s = Server::start(
        &["--model", "toy"],
        &[("BROWNOUT_SERVE_API_KEY", "sk-first,sk-second")],
    )
    .await;
    for key in [None, Some("sk-third")] {
        let r = s.post(completion(4, false), key).await;
        assert_eq!(r.status(), 401);
        assert_eq!(r.headers()["www-authenticate"], "Bearer");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    }
    for key in ["sk-first", "sk-second"] {
        let r = s.post(completion(4, false), Some(key)).await;
        assert_eq!(r.status(), 200);
    }
    for open in ["/health", "/metrics"] {
        let r = client()
            .get(format!("{}{open}", s.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{open} stays open");
    }
    let models = client()
        .get(format!("{}/v1/models", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 401);
    // The real OpenAI SDK.
    let script = r#"
import sys, openai
base = sys.argv[1] + "/v1"
ok = openai.OpenAI(base_url=base, api_key="sk-second", max_retries=0)
r = ok.completions.create(model="toy", prompt="hi", max_tokens=3)
assert r.choices[0].finish_reason in ("length", "stop"), r
try:
    openai.OpenAI(base_url=base, api_key="sk-wrong", max_retries=0).models.list()
    print("wrong key accepted")
    sys.exit(1)
except openai.AuthenticationError as e:
    assert e.status_code == 401 and e.code == "invalid_api_key", e
print("sdk ok")
"#;
    let out = tokio::process::Command::new("python3")
        .args(["-c", script, &s.url])
        .output()
        .await
        .expect("python3 runs (scripts/test.sh installs the openai package)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("sdk ok"),
        "the openai SDK run failed (pip install openai):\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--upstream` with keys on both sides: `--upstream-api-key` replaces the client's key (the
/// proxy's own key is not the upstream's); without it the client's key is passed on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_mode_replaces_or_forwards_the_key() {
    let upstream = Server::start(&["--model", "toy", "--api-key", "sk-upstream"], &[]).await;
    let replacing = Server::start(
        &[
            "--upstream",
            &upstream.url,
            "--api-key",
            "sk-proxy",
            "--upstream-api-key",
            "sk-upstream",
        ],
        &[],
    )
    .await;
    // (the key a client sends, the status it gets)
    for (key, status) in [
        (Some("sk-proxy"), 200),
        (Some("sk-upstream"), 401),
        (None, 401),
    ] {
        let got = replacing.post(completion(4, false), key).await.status();
        assert_eq!(got, status, "replacing, client key {key:?}");
    }
    // Forwarding: the same key on both; the proxy's probes get 401 (it has no key of its own)
    // and count the upstream up; the model name is given.
    let forwarding = Server::start(
        &[
            "--upstream",
            &upstream.url,
            "--api-key",
            "sk-upstream",
            "--served-model-name",
            "toy",
            "--upstream-model",
            "primary=toy",
        ],
        &[],
    )
    .await;
    for (key, status) in [
        (Some("sk-upstream"), 200),
        (Some("sk-proxy"), 401),
        (None, 401),
    ] {
        let got = forwarding.post(completion(4, false), key).await.status();
        assert_eq!(got, status, "forwarding, client key {key:?}");
    }
}

/// SIGINT (Ctrl-C) with nothing in flight: the drain ends at once and the exit is 0. The real
/// model (`tiny-random`, `--device auto` by default) says in the start banner where it runs
/// and, when CUDA is not used, why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_with_nothing_in_flight_exits_0_and_the_banner_says_where_the_model_runs() {
    let mut s = Server::start(&["--shutdown-grace-secs", "30"], &[]).await;
    s.signal(libc::SIGINT);
    let st = s.exit_status(Duration::from_secs(20)).await;
    assert!(st.success(), "exit status {st}:\n{}", s.log());
    let log = s.log();
    let banner = log
        .lines()
        .find(|l| l.contains("engine ready"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(banner.contains("device=auto"), "{banner}");
    assert!(
        banner.contains("cuda=in use for the primary route")
            || banner.contains("cuda=unavailable, running on the CPU: "),
        "{banner}"
    );
    assert!(log.contains("in_flight_at_signal=0 cancelled=0"), "{log}");
}
