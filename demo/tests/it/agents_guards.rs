//! Agent guards end to end through the real Redis (a unique cluster per test): the control plane
//! (`Plane`, real loopback listeners) ingests tool-call spans over OTLP/HTTP, its agent guards
//! find a loop and a failing tool, the controller publishes the signed command to Redis, and a
//! serving tier (the real OpenAI API on its own socket, the toy model, the Redis subscriber)
//! applies it: 409 `agent_loop_detected` for the looping conversation and its trace only, the
//! breaker as `tool:<name>` on `/v1/features`, 503 `tool_disabled`, then `probe`, then closed.
//!
//! Waits poll with generous deadlines (deadlock guards, never timing assertions).

use std::time::Duration;

use brownout_demo::{World, WorldOptions};
use brownout_test_support::{redis_url, require_redis, unique, wait_for_async};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value as AV};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message as _;
use serde_json::{Value, json};

const POLICY: &str = r#"
evaluate_interval_ms: 100
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
agents:
  loops: { window: 5, repeats: 3, abort_secs: 600 }
  breakers: { min_calls: 10, cool_down_secs: 3, close_after_successes: 2, probe_ratio: 0.5 }
"#;

const WAIT: Duration = Duration::from_secs(30);

async fn world(name: &str) -> World {
    let url = redis_url();
    require_redis(&url);
    World::start(WorldOptions {
        model: "toy".into(),
        cluster: unique(&format!("ag-{name}-")),
        redis_url: Some(url),
        policy_yaml: POLICY.into(),
        num_engines: 1,
        agents: false,
        ..WorldOptions::default()
    })
    .await
    .unwrap()
}

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(AV::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

/// One GenAI `execute_tool` span.
fn tool_span(trace: [u8; 16], n: u64, tool: &str, args: &str, conv: &str, error: bool) -> Span {
    let start = brownout_protocol::now_ms() * 1_000_000;
    let mut attributes = vec![
        kv("gen_ai.operation.name", "execute_tool"),
        kv("gen_ai.tool.name", tool),
        kv("gen_ai.tool.call.arguments", args),
    ];
    if !conv.is_empty() {
        attributes.push(kv("gen_ai.conversation.id", conv));
    }
    Span {
        trace_id: trace.to_vec(),
        span_id: (n + 1).to_be_bytes().to_vec(),
        parent_span_id: vec![7; 8],
        name: format!("execute_tool {tool}"),
        kind: 1,
        start_time_unix_nano: start,
        end_time_unix_nano: start + 20_000_000,
        attributes,
        status: Some(Status {
            code: if error { 2 } else { 0 },
            message: if error {
                "upstream 502".into()
            } else {
                String::new()
            },
        }),
        ..Default::default()
    }
}

async fn send_spans(c: &reqwest::Client, w: &World, spans: Vec<Span>) {
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", "agent-orchestrator")],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let r = c
        .post(format!("http://{}/v1/traces", w.otlp_http_addr()))
        .bearer_auth(w.tokens().0)
        .header("content-type", "application/x-protobuf")
        .body(req.encode_to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

/// A chat completion declaring `tools`, with extra headers; (status, body).
async fn chat(
    c: &reqwest::Client,
    engine: &str,
    tools: &[&str],
    headers: &[(&str, String)],
) -> (u16, Value) {
    let mut body = json!({"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0});
    if !tools.is_empty() {
        body["tools"] = tools
            .iter()
            .map(|t| json!({"type": "function", "function": {"name": t, "parameters": {"type": "object"}}}))
            .collect();
    }
    let mut r = c.post(format!("{engine}/v1/chat/completions")).json(&body);
    for (k, v) in headers {
        r = r.header(*k, v);
    }
    let r = r.send().await.unwrap();
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

fn traceparent(trace: [u8; 16]) -> String {
    format!("00-{}-00f067aa0ba902b7-01", hex(trace))
}

fn hex(b: [u8; 16]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The state of feature `name` on the engine's `/v1/features` (None: not listed).
async fn feature_state(c: &reqwest::Client, engine: &str, name: &str) -> Option<String> {
    let v: Value = c
        .get(format!("{engine}/v1/features"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["features"].as_array().and_then(|fs| {
        fs.iter()
            .find(|f| f["name"] == name)
            .and_then(|f| f["state"].as_str().map(str::to_string))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_looping_conversation_is_flagged_stored_and_refused_409_other_traces_untouched() {
    let w = world("loop").await;
    let c = reqwest::Client::new();
    let engine = w.engine_urls()[0].clone();
    let conv = unique("conv-loop-");
    let (looping, other): ([u8; 16], [u8; 16]) = ([0x11; 16], [0x22; 16]);
    // Before: both traces are served.
    let (s, v) = chat(
        &c,
        &engine,
        &["web_search"],
        &[("x-brownout-conversation", conv.clone())],
    )
    .await;
    assert_eq!(s, 200, "{v}");

    // Seven identical calls in the looping conversation, distinct ones in the other trace.
    for i in 0..7u64 {
        send_spans(
            &c,
            &w,
            vec![
                tool_span(
                    looping,
                    i,
                    "web_search",
                    r#"{"q": "cheapest flight"}"#,
                    &conv,
                    false,
                ),
                tool_span(
                    other,
                    100 + i,
                    "web_search",
                    &format!(r#"{{"q": "page {i}"}}"#),
                    "",
                    false,
                ),
            ],
        )
        .await;
    }

    // The conversation's next call gets 409, by its header and by its trace alone.
    let conv_h = [("x-brownout-conversation", conv.clone())];
    wait_for_async("the looping conversation is refused", WAIT, || async {
        chat(&c, &engine, &["web_search"], &conv_h).await.0 == 409
    })
    .await;
    let (s, v) = chat(&c, &engine, &["web_search"], &conv_h).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("agent_loop_detected")),
        "{v}"
    );
    let (s, _) = chat(&c, &engine, &[], &[("traceparent", traceparent(looping))]).await;
    assert_eq!(s, 409, "the trace of the loop is aborted too");
    // Others pass: another conversation, the other trace, no id at all.
    let (s, v) = chat(
        &c,
        &engine,
        &["web_search"],
        &[
            ("x-brownout-conversation", unique("conv-ok-")),
            ("traceparent", traceparent(other)),
        ],
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(chat(&c, &engine, &[], &[]).await.0, 200);

    // The loop is a stored failure event of category agent_loop (the query API reads the store).
    let cp = format!("http://{}", w.http_addr());
    let read = w.tokens().1.to_string();
    let items =
        brownout_test_support::eventually_async("the agent_loop failure is stored", WAIT, || {
            let (c, cp, read) = (&c, &cp, &read);
            async move {
                let v: Value = c
                    .get(format!("{cp}/api/v1/failures?category=agent_loop"))
                    .bearer_auth(read)
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                let items = v["items"].as_array()?.clone();
                (!items.is_empty()).then_some(items)
            }
        })
        .await;
    assert_eq!(items.len(), 1, "one loop, one event: {items:?}");
    assert_eq!(items[0]["trace_id"], hex(looping));
    assert_eq!(items[0]["error_type"], "AgentLoopDetected");
    assert_eq!(items[0]["attributes"]["conversation_id"], conv.as_str());

    // The command in force carries the abort entries; the Agents page lists the kill.
    let d: Value = c
        .get(format!("{cp}/api/v1/degrade"))
        .bearer_auth(&read)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let aborts = d["command"]["abort"].as_array().unwrap();
    assert!(
        aborts
            .iter()
            .any(|a| a["id"] == conv.as_str() && a["kind"] == "conversation"),
        "{d}"
    );
    assert!(!aborts.iter().any(|a| a["id"] == hex(other).as_str()));
    let page = c
        .get(format!("{cp}/agents"))
        .bearer_auth(&read)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(&conv[..20]), "the kill is listed");
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tool_failing_60_percent_opens_reaches_v1_features_probes_and_closes() {
    let w = world("breaker").await;
    let c = reqwest::Client::new();
    let engine = w.engine_urls()[0].clone();
    let trace = [0x33; 16];
    // Ten calls of `flaky`, six failing; `calculator` always fine.
    let spans: Vec<Span> = (0..10u64)
        .flat_map(|i| {
            [
                tool_span(trace, i, "flaky", &format!("{{\"i\": {i}}}"), "", i < 6),
                tool_span(
                    trace,
                    100 + i,
                    "calculator",
                    &format!("{{\"i\": {i}}}"),
                    "",
                    false,
                ),
            ]
        })
        .collect();
    send_spans(&c, &w, spans).await;

    wait_for_async("tool:flaky disabled on /v1/features", WAIT, || async {
        feature_state(&c, &engine, "tool:flaky").await.as_deref() == Some("disabled")
    })
    .await;
    assert_eq!(feature_state(&c, &engine, "tool:calculator").await, None);
    let (s, v) = chat(&c, &engine, &["flaky"], &[]).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("tool_disabled")),
        "{v}"
    );
    assert_eq!(v["error"]["tool"], "flaky");
    assert_eq!(chat(&c, &engine, &["calculator"], &[]).await.0, 200);

    // After the cool-down (3 s): half-open, a share of calls passes (the first, ratio 0.5).
    wait_for_async("tool:flaky in probe", WAIT, || async {
        feature_state(&c, &engine, "tool:flaky").await.as_deref() == Some("probe")
    })
    .await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(chat(&c, &engine, &["flaky"], &[]).await.0);
    }
    assert_eq!(
        statuses,
        [200, 503, 200, 503],
        "probe_ratio 0.5 from the policy"
    );

    // Two good probe calls close it.
    send_spans(
        &c,
        &w,
        vec![
            tool_span(trace, 50, "flaky", "{}", "", false),
            tool_span(trace, 51, "flaky", "{}", "", false),
        ],
    )
    .await;
    wait_for_async("tool:flaky closed", WAIT, || async {
        feature_state(&c, &engine, "tool:flaky").await.is_none()
    })
    .await;
    assert_eq!(chat(&c, &engine, &["flaky"], &[]).await.0, 200);

    // The Agents page (JSON twin) has the decisions with their reasons.
    let v: Value = c
        .get(format!("http://{}/ui/api/agents", w.http_addr()))
        .bearer_auth(w.tokens().1)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let reasons: Vec<&str> = v["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["tool"] == "flaky")
        .filter_map(|t| t["reason"].as_str())
        .collect();
    assert_eq!(reasons.len(), 3, "{v}");
    assert!(
        reasons[2].starts_with("60% of 10 calls failed"),
        "{reasons:?}"
    );
    w.stop().await.unwrap();
}
