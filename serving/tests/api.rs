//! API tests: in memory through `tower::ServiceExt::oneshot`, and over a real socket with
//! reqwest (streaming included). They run the engine with the deterministic paged toy model, so
//! outputs are known exactly.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use brownout_protocol::{Command, Criticality, FeatureState, Limits, Shed, Tier};
use brownout_serving::api::{self, AppState, ModelChoice, ServeOptions};
use brownout_serving::control::ControlHandle;
use brownout_serving::model::Route;
use brownout_serving::scheduler::SamplingParams;
use brownout_serving::scheduler::engine::{EngineRequest, SeqEvent};
use brownout_serving::scheduler::toy::ToyModel;
use brownout_serving::telemetry::Telemetry;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

async fn state_with(opts: ServeOptions) -> (AppState, ControlHandle) {
    let control = ControlHandle::new("test");
    let st = api::build_state(&opts, control.clone(), Telemetry::disabled())
        .await
        .expect("engine starts");
    (st, control)
}

fn toy_opts() -> ServeOptions {
    ServeOptions {
        model: ModelChoice::Toy,
        num_blocks: 256,
        block_size: 16,
        max_model_len: Some(512),
        max_body_bytes: 64 * 1024,
        ..ServeOptions::default()
    }
}

async fn app() -> (Router, AppState, ControlHandle) {
    let (st, c) = state_with(toy_opts()).await;
    (api::router(st.clone()), st, c)
}

/// What greedy decoding of the toy yields after `prompt`.
fn expected(prompt: &str, n: usize, route: Route) -> String {
    let mut ctx: Vec<u32> = prompt.bytes().map(u32::from).collect();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = ToyModel::next_token(&ctx, route);
        ctx.push(t);
        out.push(t as u8);
    }
    String::from_utf8(out).unwrap()
}

async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: impl Into<Body>,
) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let mut b = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = app
        .clone()
        .oneshot(b.body(body.into()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let h = resp.headers().clone();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, h, bytes)
}

async fn post_json(
    app: &Router,
    uri: &str,
    headers: &[(&str, &str)],
    v: Value,
) -> (StatusCode, axum::http::HeaderMap, Value) {
    let (s, h, b) = call(app, "POST", uri, headers, v.to_string()).await;
    let v = serde_json::from_slice(&b)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&b).into_owned()));
    (s, h, v)
}

/// Concatenates the text of an SSE body; returns (text, finish_reason, saw_done, usage).
fn parse_sse(body: &str) -> (String, Option<String>, bool, Option<Value>) {
    let mut text = String::new();
    let (mut finish, mut done, mut usage) = (None, false, None);
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        if let Some(c) = v["choices"].get(0) {
            if let Some(t) = c["text"].as_str().or(c["delta"]["content"].as_str()) {
                text.push_str(t);
            }
            if let Some(f) = c["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
        if v.get("usage").is_some_and(|u| !u.is_null()) {
            usage = Some(v["usage"].clone());
        }
    }
    (text, finish, done, usage)
}

#[tokio::test]
async fn completion_returns_the_models_greedy_tokens_and_usage() {
    let (app, _, _) = app().await;
    let (s, h, v) = post_json(
        &app,
        "/v1/completions",
        &[],
        json!({"model": "toy", "prompt": "Hello", "max_tokens": 12, "temperature": 0}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(
        v["choices"][0]["text"],
        expected("Hello", 12, Route::Primary)
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert_eq!(h["x-brownout-route"], "primary");
}

#[tokio::test]
async fn chat_stream_and_non_stream_agree_and_stop_strings_cut() {
    let (app, _, _) = app().await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "temperature": 0});
    let (s, _, v) = post_json(&app, "/v1/chat/completions", &[], body.clone()).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let full = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(full, expected("user: hi\nassistant: ", 20, Route::Primary));

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    sb["stream_options"] = json!({"include_usage": true});
    let (s, h, raw) = call(&app, "POST", "/v1/chat/completions", &[], sb.to_string()).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        h["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let (text, finish, done, usage) = parse_sse(std::str::from_utf8(&raw).unwrap());
    assert_eq!(
        (text.as_str(), finish.as_deref(), done),
        (full.as_str(), Some("length"), true)
    );
    assert_eq!(usage.unwrap()["completion_tokens"], 20);

    // A stop string taken from the middle of the known output.
    let stop = &full[5..7];
    let cut = &full[..full.find(stop).unwrap()];
    for stream in [false, true] {
        let mut b = body.clone();
        b["stop"] = json!([stop]);
        b["stream"] = json!(stream);
        let (s, _, raw) = call(&app, "POST", "/v1/chat/completions", &[], b.to_string()).await;
        assert_eq!(s, StatusCode::OK);
        let (text, finish) = if stream {
            let (t, f, _, _) = parse_sse(std::str::from_utf8(&raw).unwrap());
            (t, f.unwrap())
        } else {
            let v: Value = serde_json::from_slice(&raw).unwrap();
            (
                v["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                v["choices"][0]["finish_reason"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        };
        assert_eq!(
            (text.as_str(), finish.as_str()),
            (cut, "stop"),
            "stream={stream}"
        );
    }
}

#[tokio::test]
async fn seeded_sampling_is_reproducible() {
    let (app, _, _) = app().await;
    let body = json!({"prompt": "seed me", "max_tokens": 16, "temperature": 1.5, "top_p": 0.9, "seed": 42});
    let (_, _, a) = post_json(&app, "/v1/completions", &[], body.clone()).await;
    let (_, _, b) = post_json(&app, "/v1/completions", &[], body).await;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    assert_ne!(
        a["choices"][0]["text"],
        expected("seed me", 16, Route::Primary),
        "temperature 1.5 departs from greedy"
    );
}

#[tokio::test]
async fn bad_input_gets_openai_errors_and_the_server_keeps_serving() {
    let (app, _, _) = app().await;
    let big = "x".repeat(70 * 1024);
    type Case<'a> = (
        &'a str,
        Vec<(&'a str, &'a str)>,
        Vec<u8>,
        StatusCode,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "malformed json",
            vec![],
            b"{\"prompt\": ".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        (
            "missing prompt",
            vec![],
            br#"{"max_tokens": 3}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        (
            "unknown model",
            vec![],
            br#"{"model": "gpt-9", "prompt": "a"}"#.to_vec(),
            StatusCode::NOT_FOUND,
            "model_not_found",
        ),
        (
            "absurd max_tokens",
            vec![],
            br#"{"prompt": "a", "max_tokens": 99999999}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_value",
        ),
        (
            "zero max_tokens",
            vec![],
            br#"{"prompt": "a", "max_tokens": 0}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_value",
        ),
        (
            "huge number",
            vec![],
            br#"{"prompt": "a", "max_tokens": 1e400}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        (
            "prompt + max_tokens over context",
            vec![],
            json!({"prompt": "a".repeat(500), "max_tokens": 100})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "context_length_exceeded",
        ),
        (
            "prompt over context",
            vec![],
            json!({"prompt": "a".repeat(600)}).to_string().into_bytes(),
            StatusCode::BAD_REQUEST,
            "context_length_exceeded",
        ),
        (
            "invalid utf-8",
            vec![],
            b"{\"prompt\": \"\xff\xfe\"}".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_utf8",
        ),
        (
            "body over limit",
            vec![],
            json!({"prompt": big}).to_string().into_bytes(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
        ),
        (
            "bad criticality",
            vec![("x-brownout-criticality", "urgent")],
            br#"{"prompt": "a"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_header",
        ),
        (
            "n = 2",
            vec![],
            br#"{"prompt": "a", "n": 2}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "unsupported_value",
        ),
        (
            "temperature 5",
            vec![],
            br#"{"prompt": "a", "temperature": 5}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_value",
        ),
        (
            "top_p 0",
            vec![],
            br#"{"prompt": "a", "top_p": 0}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_value",
        ),
        (
            "empty prompt",
            vec![],
            br#"{"prompt": ""}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "empty_prompt",
        ),
        (
            "prompt of only controls",
            vec![],
            br#"{"prompt": "\u0000\u0001"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "empty_prompt",
        ),
    ];
    for (name, headers, body, want_status, want_code) in cases {
        let (s, _, raw) = call(&app, "POST", "/v1/completions", &headers, body).await;
        let v: Value = serde_json::from_slice(&raw).unwrap_or_else(|e| {
            panic!(
                "{name}: body is not JSON ({e}): {}",
                String::from_utf8_lossy(&raw)
            )
        });
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (want_status, Some(want_code)),
            "{name}: {v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{name}"
        );
        assert!(v["error"]["type"].is_string(), "{name}");
    }
    let (s, _, raw) = call(
        &app,
        "POST",
        "/v1/chat/completions",
        &[],
        br#"{"messages": []}"#.to_vec(),
    )
    .await;
    assert_eq!(
        s,
        StatusCode::BAD_REQUEST,
        "{}",
        String::from_utf8_lossy(&raw)
    );
    let (s, _, _) = call(&app, "GET", "/v1/completions", &[], Body::empty()).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    // Still serving.
    let (s, _, v) = post_json(
        &app,
        "/v1/completions",
        &[],
        json!({"prompt": "ok", "max_tokens": 3, "temperature": 0}),
    )
    .await;
    assert_eq!(
        (s, v["choices"][0]["text"].as_str().unwrap()),
        (StatusCode::OK, expected("ok", 3, Route::Primary).as_str())
    );
}

#[tokio::test]
async fn control_characters_are_stripped_and_text_nfc_normalised() {
    let (app, _, _) = app().await;
    let (_, _, a) = post_json(
        &app,
        "/v1/completions",
        &[],
        json!({"prompt": "a\u{0}b\u{1b}c\u{301}", "max_tokens": 8, "temperature": 0}),
    )
    .await;
    assert_eq!(a["usage"]["prompt_tokens"], 4, "{a}"); // "ab" + "ć" (2 UTF-8 bytes)
    assert_eq!(
        a["choices"][0]["text"],
        expected("ab\u{107}", 8, Route::Primary)
    );
}

fn command(tier: Tier, version: u64) -> Command {
    let mut c = Command::normal("test", 1, version, brownout_protocol::now_ms(), 60_000);
    c.tier = tier;
    c
}

#[tokio::test]
async fn degradation_tiers_are_obeyed() {
    let (app, st, control) = app().await;
    let prompt = json!({"prompt": "tiers", "max_tokens": 40, "temperature": 0});

    // T1: a disabled feature → 503 feature_disabled with a hint; other features pass.
    let mut t1 = command(Tier::T1, 1);
    t1.features = BTreeMap::from([("pdf_analysis".to_string(), FeatureState::Disabled)]);
    control.apply(t1, 1).unwrap();
    let (s, _, v) = post_json(
        &app,
        "/v1/completions",
        &[("x-brownout-feature", "pdf_analysis")],
        prompt.clone(),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("feature_disabled"))
    );
    assert!(v["error"]["hint"].is_string());
    let (s, _, _) = post_json(
        &app,
        "/v1/completions",
        &[("x-brownout-feature", "basic_qa")],
        prompt.clone(),
    )
    .await;
    assert_eq!(s, StatusCode::OK);

    // T2: default traffic → fallback route, max_tokens capped; critical keeps primary, uncapped.
    let mut t2 = command(Tier::T2, 2);
    t2.model_route = BTreeMap::from([("default".to_string(), "fallback".to_string())]);
    t2.limits = Limits {
        max_tokens_cap: Some(8),
        max_num_seqs: Some(4),
        ..Limits::default()
    };
    control.apply(t2, 2).unwrap();
    let (s, h, v) = post_json(&app, "/v1/completions", &[], prompt.clone()).await;
    assert_eq!(
        (s, h["x-brownout-route"].to_str().unwrap()),
        (StatusCode::OK, "fallback")
    );
    assert_eq!(
        v["choices"][0]["text"],
        expected("tiers", 8, Route::Fallback)
    );
    let (_, h, v) = post_json(
        &app,
        "/v1/completions",
        &[("x-brownout-criticality", "critical")],
        prompt.clone(),
    )
    .await;
    assert_eq!(h["x-brownout-route"], "primary");
    assert_eq!(v["usage"]["completion_tokens"], 40);
    let dbg: Value =
        serde_json::from_slice(&call(&app, "GET", "/debug/kv", &[], Body::empty()).await.2)
            .unwrap();
    assert_eq!(
        dbg["max_num_seqs"], 4,
        "the engine applied limits.max_num_seqs"
    );

    // T3: below admit_min_criticality → 429 with a jittered Retry-After; critical is never shed.
    let mut t3 = command(Tier::T3, 3);
    t3.shed = Some(Shed {
        admit_min_criticality: Criticality::Critical,
        retry_after_s: 20,
        jitter_ratio: 0.5,
        recovery_eta_ms: 1_764_460_890_000,
        admit_rps: None,
    });
    control.apply(t3, 3).unwrap();
    for crit in ["sheddable", "default"] {
        let (s, h, v) = post_json(
            &app,
            "/v1/completions",
            &[("x-brownout-criticality", crit)],
            prompt.clone(),
        )
        .await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (StatusCode::TOO_MANY_REQUESTS, Some("shed")),
            "{crit}"
        );
        let ra: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
        assert!(
            (20..=30).contains(&ra),
            "Retry-After {ra} within 20 × [1, 1.5]"
        );
        assert_eq!(v["error"]["estimated_recovery_at"], "2025-11-30T00:01:30Z");
    }
    // Even a shed policy that names `critical` as too low cannot shed critical.
    let (s, _, _) = post_json(
        &app,
        "/v1/completions",
        &[("x-brownout-criticality", "critical")],
        prompt.clone(),
    )
    .await;
    assert_eq!(s, StatusCode::OK);

    let m = st.metrics().render();
    assert!(
        m.contains("brownout_serving_shed_total{criticality=\"sheddable\",model_name=\"toy\"} 1"),
        "{m}"
    );
    assert!(m.contains(
        "brownout_serving_feature_disabled_total{feature=\"pdf_analysis\",model_name=\"toy\"} 1"
    ));
    let (_, _, raw) = call(&app, "GET", "/metrics", &[], Body::empty()).await;
    assert!(
        String::from_utf8(raw)
            .unwrap()
            .contains("brownout_serving_tier{model_name=\"toy\"} 3")
    );
}

#[tokio::test]
async fn metrics_pass_promtool_and_use_vllm_names() {
    let (app, _, _) = app().await;
    post_json(
        &app,
        "/v1/completions",
        &[],
        json!({"prompt": "metrics please", "max_tokens": 4}),
    )
    .await;
    post_json(
        &app,
        "/v1/completions",
        &[
            ("x-brownout-feature", "pdf_analysis"),
            ("x-brownout-criticality", "sheddable"),
        ],
        json!({"prompt": "metrics please", "max_tokens": 4}),
    )
    .await;
    let (s, h, raw) = call(&app, "GET", "/metrics", &[], Body::empty()).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        h["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = String::from_utf8(raw).unwrap();
    for name in [
        "vllm:kv_cache_usage_perc{model_name=\"toy\"}",
        "vllm:num_requests_running{model_name=\"toy\"}",
        "vllm:num_requests_waiting{model_name=\"toy\"}",
        "vllm:num_preemptions_total{model_name=\"toy\"}",
        "vllm:time_to_first_token_seconds_bucket{model_name=\"toy\",le=",
        "vllm:inter_token_latency_seconds_count{model_name=\"toy\"}",
        "vllm:e2e_request_latency_seconds_sum{model_name=\"toy\"}",
        "vllm:prompt_tokens_total{model_name=\"toy\"}",
        "vllm:generation_tokens_total{model_name=\"toy\"}",
        "vllm:prefix_cache_queries_total{model_name=\"toy\"}",
        "vllm:prefix_cache_hits_total{model_name=\"toy\"}",
        "brownout_kv_blocks_usable{model_name=\"toy\"} 256",
        // vLLM's per-request histograms and finish reasons (vllm/v1/metrics/loggers.py): the
        // two requests and the start-up warm-up.
        "vllm:request_prompt_tokens_bucket{model_name=\"toy\",le=\"10\"} 1",
        "vllm:request_prompt_tokens_bucket{model_name=\"toy\",le=\"20\"} 3",
        "vllm:request_generation_tokens_bucket{model_name=\"toy\",le=\"5\"} 3",
        "vllm:request_max_num_generation_tokens_bucket{model_name=\"toy\",le=\"5\"} 3",
        "vllm:request_queue_time_seconds_count{model_name=\"toy\"} 3",
        "vllm:request_prefill_time_seconds_count{model_name=\"toy\"} 3",
        "vllm:request_decode_time_seconds_count{model_name=\"toy\"} 3",
        "vllm:request_success_total{finished_reason=\"length\",model_name=\"toy\"} 3",
        "vllm:request_success_total{finished_reason=\"abort\",model_name=\"toy\"} 0",
        "brownout_kv_blocks_used{model_name=\"toy\"}",
        "brownout_kv_internal_fragmentation_ratio{model_name=\"toy\"}",
        "brownout_kv_reserved_unused_ratio{model_name=\"toy\"}",
        "brownout_kv_token_occupancy_ratio{model_name=\"toy\"}",
        "brownout_kv_external_fragmentation_ratio{model_name=\"toy\"}",
        "brownout_serving_tier{model_name=\"toy\"} 0",
        "brownout_serving_shed_total{criticality=\"critical\",model_name=\"toy\"} 0",
        // One finished request each, by feature and criticality (warm-up is not counted).
        "brownout_serving_requests_total{criticality=\"default\",feature=\"\",model_name=\"toy\",outcome=\"length\"} 1",
        "brownout_serving_requests_total{criticality=\"sheddable\",feature=\"pdf_analysis\",model_name=\"toy\",outcome=\"length\"} 1",
    ] {
        assert!(text.contains(name), "missing {name} in\n{text}");
    }
    // prompt tokens of the two requests (14 each) plus warm-up (7).
    assert!(
        text.contains("vllm:prompt_tokens_total{model_name=\"toy\"} 35"),
        "{text}"
    );
    // promtool 2.x lints one thing the contract requires: vLLM's `vllm:` names (a colon is
    // reserved for recording rules). That exact complaint is allowed and nothing else; the same
    // exposition with the colons rewritten must pass promtool with exit 0.
    let (code, out) = promtool(&text);
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let allowed =
            line.starts_with("vllm:") && line.ends_with("metric names should not contain ':'");
        assert!(allowed, "promtool: {line}\n{out}");
    }
    assert!(
        code == 0 || code == 3,
        "promtool failed to parse (exit {code}): {out}"
    );
    let renamed = text.replace("vllm:", "vllm_");
    let (code, out) = promtool(&renamed);
    assert_eq!(code, 0, "promtool check metrics: {out}");
}

fn promtool(text: &str) -> (i32, String) {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is installed (/usr/bin/promtool)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn health_models_and_debug_kv() {
    let (app, _, _) = app().await;
    let (s, _, raw) = call(&app, "GET", "/health", &[], Body::empty()).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&raw));
    let (_, _, raw) = call(&app, "GET", "/v1/models", &[], Body::empty()).await;
    let v: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(
        (
            v["data"][0]["id"].as_str(),
            v["data"][0]["max_model_len"].as_u64()
        ),
        (Some("toy"), Some(512))
    );
    let (_, _, raw) = call(&app, "GET", "/debug/kv", &[], Body::empty()).await;
    let v: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(
        (
            v["mode"].as_str(),
            v["pool"]["num_blocks_total"].as_u64(),
            v["pool"]["block_size"].as_u64()
        ),
        (Some("paged"), Some(256), Some(16))
    );
    assert!(v["sequences"].is_array());
    assert!(
        v["instance_id"].is_string(),
        "the id a gpu-agent reports to the control plane: {v}"
    );
    let (s, _, raw) = call(&app, "GET", "/nope", &[], Body::empty()).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(
        serde_json::from_slice::<Value>(&raw).unwrap()["error"]["code"],
        "not_found"
    );
}

/// Sends a batch straight to the engine (admitted together, so the pool pressure is exact) and
/// collects each request's tokens.
async fn run_batch(st: &AppState, reqs: Vec<EngineRequest>) -> Vec<Vec<u32>> {
    let rxs = st.engine().submit_batch(reqs).unwrap();
    let mut outs = Vec::new();
    for (_, mut rx) in rxs {
        let mut toks = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await
                .unwrap()
            {
                Some(SeqEvent::Token(t)) => toks.push(t),
                Some(SeqEvent::Finished { .. }) => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        outs.push(toks);
    }
    outs
}

fn counter(m: &str, name: &str) -> f64 {
    m.lines()
        .find(|l| l.starts_with(name))
        .unwrap()
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn preemption_and_prefix_caching_leave_outputs_unchanged() {
    // 12 blocks of 4 tokens for 6 requests of 29 tokens (8 blocks each), admitted together: the
    // engine must preempt and recompute; "shared prefix " is 3 full blocks common to all.
    let (st, _) = state_with(ServeOptions {
        num_blocks: 12,
        block_size: 4,
        max_num_seqs: 6,
        max_model_len: Some(48),
        ..toy_opts()
    })
    .await;
    let prompts: Vec<String> = (0..6).map(|i| format!("shared prefix {i}")).collect();
    let reqs = prompts
        .iter()
        .map(|p| EngineRequest {
            prompt: p.bytes().map(u32::from).collect(),
            params: SamplingParams {
                max_tokens: 14,
                ..SamplingParams::default()
            },
            criticality: Criticality::Default,
            route: Route::Primary,
        })
        .collect();
    let outs = run_batch(&st, reqs).await;
    for (p, toks) in prompts.iter().zip(outs) {
        let text: String = toks.iter().map(|&t| t as u8 as char).collect();
        assert_eq!(text, expected(p, 14, Route::Primary), "{p}");
    }
    let m = st.metrics().render();
    assert!(
        counter(&m, "vllm:num_preemptions_total{") > 0.0,
        "the pool is too small for all six: preemption expected\n{m}"
    );
    assert!(
        counter(&m, "vllm:prefix_cache_hits_total{") > 0.0,
        "shared prefix blocks hit"
    );
    let dbg = st.engine().debug_kv().await.unwrap();
    assert!(
        dbg.sequences.is_empty() && dbg.pool.num_blocks_used == 0,
        "everything freed"
    );

    // The same through HTTP, concurrently (timing decides how much they overlap).
    let app = api::router(st.clone());
    let mut tasks = Vec::new();
    for p in prompts {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let (s, _, v) = post_json(
                &app,
                "/v1/completions",
                &[],
                json!({"prompt": p, "max_tokens": 14, "temperature": 0}),
            )
            .await;
            (p, s, v)
        }));
    }
    for t in tasks {
        let (p, s, v) = t.await.unwrap();
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(
            v["choices"][0]["text"],
            expected(&p, 14, Route::Primary),
            "{p}"
        );
    }
}

#[tokio::test]
async fn a_request_that_can_never_fit_the_kv_pool_is_a_400() {
    let (st, _) = state_with(ServeOptions {
        num_blocks: 4,
        block_size: 4,
        max_model_len: Some(64),
        ..toy_opts()
    })
    .await;
    let app = api::router(st);
    let (s, _, v) = post_json(
        &app,
        "/v1/completions",
        &[],
        json!({"prompt": "0123456789", "max_tokens": 10}),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("kv_quota_exceeded")),
        "{v}"
    );
}

#[tokio::test]
async fn real_socket_streaming_with_reqwest() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (st, _) = state_with(toy_opts()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(api::run_server(st, None, listener, async move {
        let _ = stop_rx.await;
    }));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let resp = client
        .post(format!("http://{addr}/v1/completions"))
        .header("x-brownout-criticality", "critical")
        .json(&json!({"prompt": "socket", "max_tokens": 10, "temperature": 0, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    use futures::StreamExt;
    let mut stream = resp.bytes_stream();
    let mut body = String::new();
    let mut chunks = 0;
    while let Some(b) = stream.next().await {
        body.push_str(std::str::from_utf8(&b.unwrap()).unwrap());
        chunks += 1;
    }
    let (text, finish, done, _) = parse_sse(&body);
    assert_eq!(
        (text.as_str(), finish.as_deref(), done),
        (
            expected("socket", 10, Route::Primary).as_str(),
            Some("length"),
            true
        )
    );
    assert!(chunks >= 1);
    let health = client
        .get(format!("http://{addr}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(12), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn contiguous_mode_serves_the_same_tokens() {
    let (st, _) = state_with(ServeOptions {
        kv_mode: brownout_serving::kvcache::AllocMode::Contiguous,
        num_blocks: 64,
        block_size: 4,
        ..toy_opts()
    })
    .await;
    // (Exact reservation sizes and first-fit placement: kvcache::tests::stats_measure_slack_and_reservation.)
    assert_eq!(st.engine().debug_kv().await.unwrap().mode, "contiguous");
    let app = api::router(st.clone());
    let (s, _, v) = post_json(
        &app,
        "/v1/completions",
        &[],
        json!({"prompt": "contiguous", "max_tokens": 9, "temperature": 0}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v["choices"][0]["text"],
        expected("contiguous", 9, Route::Primary)
    );
}

#[tokio::test]
async fn the_kv_quota_changes_at_run_time() {
    let (st, _) = state_with(toy_opts()).await;
    let app = api::router(st.clone());
    let body = json!({"prompt": "quota", "max_tokens": 60});
    assert_eq!(
        post_json(&app, "/v1/completions", &[], body.clone())
            .await
            .0,
        StatusCode::OK
    );
    st.engine().set_kv_quota_blocks(4).await; // 64 tokens of 16
    let (s, _, v) = post_json(&app, "/v1/completions", &[], body.clone()).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("kv_quota_exceeded")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 4")
    );
    assert_eq!(st.engine().debug_kv().await.unwrap().kv_quota_blocks, 4);
    st.engine().set_kv_quota_blocks(256).await;
    assert_eq!(
        post_json(&app, "/v1/completions", &[], body).await.0,
        StatusCode::OK
    );
}

/// A backend whose engine thread dies (panics) on its Nth forward step, as a crashed worker would.
struct DiesAfter {
    inner: ToyModel,
    steps_left: usize,
}

impl brownout_serving::scheduler::engine::ModelBackend for DiesAfter {
    fn forward(
        &mut self,
        route: Route,
        chunks: &[brownout_serving::model::SeqChunk<'_>],
    ) -> Result<Vec<Vec<f32>>, String> {
        if self.steps_left == 0 {
            panic!("injected engine fault (test)");
        }
        self.steps_left -= 1;
        brownout_serving::scheduler::engine::ModelBackend::forward(&mut self.inner, route, chunks)
    }
}

/// The engine dies mid-stream: the open stream gets an `engine_stopped` error event and
/// `[DONE]` (no hang), and later requests are refused with 503 instead of waiting forever.
#[tokio::test]
async fn engine_death_mid_stream_sends_an_error_event_and_ends_the_stream() {
    use brownout_serving::scheduler::engine::{EngineConfig, spawn_engine};
    let metrics = std::sync::Arc::new(brownout_serving::metrics::Metrics::new("toy"));
    let cfg = EngineConfig {
        model_name: "toy".into(),
        ..EngineConfig::default()
    };
    let (engine, thread) = spawn_engine(
        cfg.clone(),
        DiesAfter {
            inner: ToyModel::new(cfg.kv.num_blocks, cfg.kv.block_size),
            steps_left: 5,
        },
        metrics.clone(),
        None,
    )
    .unwrap();
    let st = AppState::new(
        engine,
        std::sync::Arc::new(api::ToyCodec),
        ControlHandle::new("t"),
        metrics,
        Telemetry::disabled(),
        api::ApiOptions {
            model_name: "toy".into(),
            ..api::ApiOptions::default()
        },
    );
    st.set_ready(true);
    let app = api::router(st);
    let body = json!({"model": "toy", "prompt": "a b c", "max_tokens": 200, "stream": true,
                      "ignore_eos": true});
    let (status, _, bytes) = tokio::time::timeout(
        Duration::from_secs(10),
        call(&app, "POST", "/v1/completions", &[], body.to_string()),
    )
    .await
    .expect("the stream hung after the engine died");
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(bytes).unwrap();
    let errors: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v.get("error").is_some())
        .collect();
    assert_eq!(errors.len(), 1, "{text}");
    assert_eq!(errors[0]["error"]["code"], "engine_stopped", "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    // The engine thread has ended (its panic is caught and logged, not propagated).
    thread
        .join()
        .expect("the engine thread catches its own panic");
    // Later requests are answered at once, not queued on a dead engine.
    let (status, _, v) = tokio::time::timeout(
        Duration::from_secs(5),
        post_json(
            &app,
            "/v1/completions",
            &[],
            json!({"model": "toy", "prompt": "x"}),
        ),
    )
    .await
    .expect("a request to a dead engine hung");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
}

/// Hostile metadata: over-long, non-ASCII or control-character user ids, conversation ids and
/// tool names are refused with a 400 that names them; odd but valid Unicode users are served
/// and shown escaped (and cut) in `/debug/resource`; a bad `traceparent` is ignored.
#[tokio::test]
async fn hostile_users_tools_and_conversations_are_bounded_and_escaped() {
    let mut opts = toy_opts();
    opts.gate.user_concurrency = 1;
    let (st, _) = state_with(opts).await;
    let app = api::router(st.clone());
    let chat = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    // (headers, body, code, param)
    type Case<'a> = (Vec<(&'a str, String)>, Value, &'a str, Option<&'a str>);
    let bad: Vec<Case> = vec![
        (
            vec![("x-brownout-user", "u".repeat(257))],
            chat(json!({})),
            "invalid_header",
            None,
        ),
        (
            vec![("x-brownout-conversation", "c".repeat(129))],
            chat(json!({})),
            "invalid_header",
            None,
        ),
        (
            vec![],
            chat(json!({"user": "a\u{0}b"})),
            "invalid_value",
            Some("user"),
        ),
        (
            vec![],
            chat(json!({"user": "é".repeat(200)})),
            "invalid_value",
            Some("user"),
        ),
        (
            vec![],
            chat(
                json!({"tools": [{"type": "function", "function": {"name": "<img src=x onerror=alert(1)>"}}]}),
            ),
            "invalid_value",
            Some("tools"),
        ),
        (
            vec![],
            chat(
                json!({"tools": (0..129).map(|i| json!({"type": "function", "function": {"name": format!("t{i}")}})).collect::<Vec<_>>()}),
            ),
            "invalid_value",
            Some("tools"),
        ),
    ];
    for (headers, body, code, param) in bad {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (s, _, v) = post_json(&app, "/v1/chat/completions", &h, body).await;
        assert_eq!(
            (s, v["error"]["code"].as_str(), v["error"]["param"].as_str()),
            (StatusCode::BAD_REQUEST, Some(code), param),
            "{v}"
        );
    }
    // Not visible ASCII in a header: 400 too.
    let req = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .header(
            "x-brownout-conversation",
            axum::http::HeaderValue::from_bytes(b"conv-\xff").unwrap(),
        )
        .body(Body::from(chat(json!({})).to_string()))
        .unwrap();
    assert_eq!(
        app.clone().oneshot(req).await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );
    // A malformed traceparent is ignored.
    let (s, _, _) = post_json(
        &app,
        "/v1/chat/completions",
        &[("traceparent", "not-a-trace")],
        chat(json!({})),
    )
    .await;
    assert_eq!(s, StatusCode::OK);

    // An odd but valid user: RTL override, zero-width joiners, quotes and markup.
    let odd = "\u{202e}\"</script><b>ü\u{200d}👩\u{200d}💻".repeat(6);
    let agent = |stream: bool| {
        chat(
            json!({"user": odd, "stream": stream, "max_tokens": 400, "ignore_eos": true,
                    "tools": [{"type": "function", "function": {"name": "web_search"}}]}),
        )
    };
    // Its first request streams and is left unread: in flight, holding the user's one slot.
    let held = app
        .clone()
        .oneshot(
            Request::post("/v1/chat/completions")
                .header("content-type", "application/json")
                .body(Body::from(agent(true).to_string()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let (s, h, v) = post_json(&app, "/v1/chat/completions", &[], agent(false)).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (
            StatusCode::TOO_MANY_REQUESTS,
            Some("user_concurrency_limit")
        ),
        "{v}"
    );
    assert_eq!(h["x-brownout-outcome"], "user_cap");
    // Another user passes.
    let mut other = agent(false);
    other["user"] = json!("plain-user");
    other["max_tokens"] = json!(2);
    assert_eq!(
        post_json(&app, "/v1/chat/completions", &[], other).await.0,
        StatusCode::OK
    );
    let (s, _, raw) = call(&app, "GET", "/debug/resource", &[], Body::empty()).await;
    assert_eq!(s, StatusCode::OK);
    let r: Value = serde_json::from_slice(&raw).expect("valid JSON");
    let top = &r["user_concurrency"]["top_offenders"][0];
    assert_eq!(
        top["user"].as_str().unwrap(),
        odd.chars().take(64).collect::<String>()
    );
    assert_eq!(
        (top["in_flight"].as_u64(), top["refused"].as_u64()),
        (Some(1), Some(1))
    );
    let text = String::from_utf8(raw).unwrap();
    assert!(
        text.contains("\\\"</script>"),
        "quotes are escaped in the JSON text"
    );
    // Dropping the unread stream gives the slot back.
    drop(held);
    let start = std::time::Instant::now();
    loop {
        let (s, _, _) = post_json(&app, "/v1/chat/completions", &[], {
            let mut b = agent(false);
            b["max_tokens"] = json!(2);
            b
        })
        .await;
        if s == StatusCode::OK {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "slot never freed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let m = String::from_utf8(call(&app, "GET", "/metrics", &[], Body::empty()).await.2).unwrap();
    assert!(
        !m.contains("plain-user") && !m.contains("script"),
        "no user label values"
    );
}

/// A request ended by its stop string is a finish, not an abandoned one, though the API drops
/// its receiver early.
#[tokio::test]
async fn stop_strings_end_requests_without_counting_them_abandoned() {
    let (app, st, _) = app().await;
    let full = expected("stops", 300, Route::Primary);
    let stop = &full[3..5];
    for stream in [false, true] {
        let b = json!({"prompt": "stops", "max_tokens": 300, "temperature": 0, "ignore_eos": true,
                       "stop": [stop], "stream": stream});
        let (s, _, _) = call(&app, "POST", "/v1/completions", &[], b.to_string()).await;
        assert_eq!(s, StatusCode::OK);
    }
    let start = std::time::Instant::now();
    while st.engine().status().num_running > 0 {
        assert!(start.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let s = st.engine().status();
    assert_eq!((s.abandoned_total, s.abandoned_tokens_total), (0, 0));
}
