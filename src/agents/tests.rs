//! The guards end to end on spans as ingest converts them (OTLP → rows), on a logical clock.

use brownout_protocol::Command;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, KeyValue, KeyValueList, any_value::Value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};

use super::*;
use crate::ingest::otlp::convert_traces;

pub(crate) const T0: u64 = 1_764_460_800_000;

pub(crate) fn kv(k: &str, v: Value) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}

pub(crate) fn s(v: &str) -> Value {
    Value::StringValue(v.into())
}

/// One `execute_tool` span as the OpenTelemetry SDK sends it.
pub(crate) fn tool_span(
    trace: u8,
    n: u8,
    attrs: Vec<KeyValue>,
    error: bool,
    duration_ms: u64,
) -> Span {
    let start = T0 * 1_000_000;
    Span {
        trace_id: vec![trace; 16],
        span_id: vec![n.max(1); 8],
        parent_span_id: vec![9; 8],
        name: "execute_tool".into(),
        kind: 1,
        start_time_unix_nano: start,
        end_time_unix_nano: start + duration_ms * 1_000_000,
        attributes: attrs,
        status: Some(Status {
            code: if error { 2 } else { 0 },
            message: if error {
                "tool failed".into()
            } else {
                String::new()
            },
        }),
        ..Default::default()
    }
}

pub(crate) fn export(spans: Vec<Span>) -> Vec<SpanRow> {
    convert_traces(&ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", s("orchestrator"))],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    })
    .spans
}

fn call(trace: u8, tool: &str, args: &str, error: bool) -> Span {
    tool_span(
        trace,
        1,
        vec![
            kv("gen_ai.operation.name", s("execute_tool")),
            kv("gen_ai.tool.name", s(tool)),
            kv("gen_ai.tool.call.arguments", s(args)),
        ],
        error,
        10,
    )
}

pub(crate) fn guards(yaml: &str) -> Arc<AgentGuards> {
    AgentGuards::new(AgentsPolicy::from_yaml(yaml).unwrap(), None).unwrap()
}

#[test]
fn a_looping_trace_becomes_an_agent_loop_failure_and_an_abort_other_traces_untouched() {
    let g = guards("{}");
    let mut failures = Vec::new();
    for i in 0..7u64 {
        let spans = export(vec![
            call(1, "search", r#"{"q": "same thing"}"#, false),
            call(2, "search", &format!(r#"{{"q": "page {i}"}}"#), false),
        ]);
        failures.extend(g.observe_at(&spans, T0 + i).failures);
    }
    assert_eq!(failures.len(), 1, "{failures:?}");
    let f = &failures[0];
    assert_eq!(f.category, Category::AgentLoop);
    assert_eq!(f.error_type, LOOP_ERROR_TYPE);
    assert_eq!(f.trace_id, hex::encode([1u8; 16]));
    assert_eq!(f.service, "orchestrator");
    assert!(f.message.contains("latest tool search"), "{}", f.message);
    let part = g.command_part(T0 + 10);
    assert_eq!(part.abort.len(), 1);
    assert_eq!(part.abort[0].id, hex::encode([1u8; 16]));
    assert_eq!(part.abort[0].kind, brownout_protocol::AbortKind::Trace);
    // The failure line round-trips through the NDJSON parser with its category.
    let line = serde_json::to_string(f).unwrap();
    let back = FailureEvent::parse_line(line.as_bytes()).unwrap();
    assert_eq!(back.category, Category::AgentLoop);
}

#[test]
fn a_failing_tool_opens_then_probes_then_closes_and_the_command_carries_it() {
    let g = guards(
        "breakers: { min_calls: 10, cool_down_secs: 30, close_after_successes: 2, probe_ratio: 0.25 }",
    );
    let mut t = T0;
    for i in 0..10 {
        // 60 %: six of ten fail.
        g.observe_at(&export(vec![call(3, "weather", "{}", i < 6)]), t);
        t += 500;
    }
    let part = g.command_part(t);
    assert_eq!(part.features["tool:weather"], FeatureState::Disabled);
    let mut cmd = Command::normal("c", 1, 1, t, 30_000);
    cmd.features
        .insert("tool:weather".into(), FeatureState::Probe);
    cmd.features
        .insert("pdf_analysis".into(), FeatureState::Disabled);
    part.apply(&mut cmd);
    assert_eq!(
        cmd.features["tool:weather"],
        FeatureState::Disabled,
        "stricter wins"
    );
    assert_eq!(cmd.features["pdf_analysis"], FeatureState::Disabled);
    assert_eq!(cmd.limits.probe_ratio, None, "no probe, no ratio");
    // Cool-down: half-open, the command says probe with the policy's ratio.
    let part = g.command_part(t + 30_000);
    assert_eq!(part.features["tool:weather"], FeatureState::Probe);
    let mut cmd = Command::normal("c", 1, 2, t, 30_000);
    part.apply(&mut cmd);
    assert_eq!(cmd.limits.probe_ratio, Some(0.25));
    // Two good probes close it.
    g.observe_at(&export(vec![call(3, "weather", "{}", false)]), t + 30_001);
    g.observe_at(&export(vec![call(3, "weather", "{}", false)]), t + 30_002);
    let part = g.command_part(t + 30_003);
    assert!(part.features.is_empty(), "{part:?}");
    let v = g.view(t + 30_003);
    let reasons: Vec<(&str, &str)> = v
        .transitions
        .iter()
        .map(|t| (t.to.as_str(), t.reason.as_str()))
        .collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert!(
        reasons[2].1.starts_with("60% of 10 calls failed"),
        "{reasons:?}"
    );
    assert!(reasons[0].1.contains("2 probe calls in a row succeeded"));
}

#[test]
fn attribute_values_of_every_otlp_type_are_read_without_panicking() {
    let g = guards("loops: { window: 2, repeats: 2 }\nbreakers: { min_calls: 1 }");
    let values = vec![
        s("plain"),
        Value::BoolValue(true),
        Value::IntValue(-42),
        Value::DoubleValue(f64::NAN),
        Value::DoubleValue(1.5e300),
        Value::BytesValue(vec![0, 0xff, 0x10]),
        Value::ArrayValue(ArrayValue {
            values: vec![
                AnyValue {
                    value: Some(s("a")),
                },
                AnyValue { value: None },
                AnyValue {
                    value: Some(Value::ArrayValue(ArrayValue { values: vec![] })),
                },
            ],
        }),
        Value::KvlistValue(KeyValueList {
            values: vec![
                kv("q", s("x")),
                KeyValue {
                    key: "empty".into(),
                    value: None,
                    ..Default::default()
                },
            ],
        }),
    ];
    let mut n = 0u8;
    for name in &values {
        for args in &values {
            for conv in &values {
                n = n.wrapping_add(1);
                let spans = export(vec![tool_span(
                    n.max(1),
                    n,
                    vec![
                        kv("gen_ai.operation.name", s("execute_tool")),
                        kv("gen_ai.tool.name", name.clone()),
                        kv("gen_ai.tool.call.arguments", args.clone()),
                        kv("gen_ai.conversation.id", conv.clone()),
                        kv("enduser.id", args.clone()),
                    ],
                    n.is_multiple_of(2),
                    u64::from(n),
                )]);
                let _ = g.observe_at(&spans, T0 + u64::from(n));
            }
        }
    }
    // An attribute whose value is absent altogether, and an operation name of another type.
    let spans = export(vec![tool_span(
        7,
        7,
        vec![
            KeyValue {
                key: "gen_ai.tool.name".into(),
                value: None,
                ..Default::default()
            },
            kv("gen_ai.operation.name", Value::IntValue(3)),
        ],
        false,
        1,
    )]);
    assert_eq!(g.observe_at(&spans, T0).tool_calls, 0);
    let v = g.view(T0 + 1000);
    // Numbers, booleans, bytes (hex), arrays and maps (JSON) all render to a tool name.
    assert_eq!(v.breakers.len(), values.len());
    assert!(v.breakers.iter().any(|b| b.tool == "-42"));
    assert!(v.breakers.iter().any(|b| b.tool == "00ff10"));
    assert!(v.breakers.iter().any(|b| b.tool == r#"{"empty":null,"q":"x"}"#
        || b.tool == r#"{"q":"x","empty":null}"#));
    // A map-valued conversation id and map-valued arguments still make a loop.
    let map = values.last().unwrap().clone();
    let mut found = Vec::new();
    for i in 0..3 {
        let spans = export(vec![tool_span(
            9,
            9,
            vec![
                kv("gen_ai.tool.name", s("lookup")),
                kv("gen_ai.tool.call.arguments", map.clone()),
                kv("gen_ai.conversation.id", map.clone()),
            ],
            false,
            1,
        )]);
        found.extend(g.observe_at(&spans, T0 + 2000 + i).failures);
    }
    assert_eq!(found.len(), 1);
    assert!(
        found[0].attributes["abort_id"].contains("\"q\":\"x\""),
        "{:?}",
        found[0]
    );
    let part = g.command_part(T0 + 3000);
    assert!(
        part.abort
            .iter()
            .any(|a| a.id == found[0].attributes["abort_id"])
    );
}

#[test]
fn huge_and_unusual_unicode_tool_names_are_bounded_in_state_and_in_the_command() {
    let g = guards("breakers: { min_calls: 1, max_tools: 8 }");
    let names = [
        "🔥".repeat(1_000_000),
        "\u{202e}evil\u{200b}<script>alert(1)</script>".to_string(),
        "ｔｏｏｌ".to_string(),
        "a\u{0}b\u{7f}c\u{9c}".to_string(),
        "Ω".repeat(65),
    ];
    for (i, n) in names.iter().enumerate() {
        g.observe_at(&export(vec![call(5, n, "{}", true)]), T0 + i as u64);
    }
    let part = g.command_part(T0 + 10);
    assert_eq!(part.features.len(), names.len());
    for k in part.features.keys() {
        let name = k.strip_prefix("tool:").unwrap();
        assert!(name.chars().count() <= semconv::MAX_TOOL_NAME_CHARS, "{k}");
        assert!(!name.chars().any(char::is_control), "{k:?}");
    }
    assert!(part.features.contains_key("tool:abc"));
    // Thousands more names: at most max_tools are kept, the rest counted.
    for i in 0..5000u64 {
        g.observe_at(
            &export(vec![call(6, &format!("t{i}\u{1F600}"), "{}", true)]),
            T0 + 20 + i,
        );
    }
    let c = g.view(T0 + 6000).breaker_counts;
    assert_eq!(c.tracked, 8);
    assert!(c.untracked >= 5000 - 3, "{c:?}");
}

#[test]
fn the_merge_keeps_the_abort_list_within_the_protocol_bound() {
    let part = CommandPart {
        abort: (0..10)
            .map(|i| AbortEntry {
                id: format!("n{i}"),
                kind: brownout_protocol::AbortKind::Trace,
                until_ms: 10,
                reason: String::new(),
            })
            .collect(),
        ..CommandPart::default()
    };
    let mut cmd = Command::normal("c", 1, 1, 0, 1);
    cmd.abort = (0..brownout_protocol::MAX_ABORT_ENTRIES - 3)
        .map(|i| AbortEntry {
            id: format!("o{i}"),
            kind: brownout_protocol::AbortKind::Conversation,
            until_ms: 10,
            reason: String::new(),
        })
        .collect();
    part.apply(&mut cmd);
    assert_eq!(cmd.abort.len(), brownout_protocol::MAX_ABORT_ENTRIES);
    assert_eq!(cmd.abort.last().unwrap().id, "n9", "the newest are kept");
}

#[test]
fn metrics_count_evictions_and_loops() {
    let r = Registry::new();
    let g = AgentGuards::new(
        AgentsPolicy::from_yaml("loops: { max_traces: 10 }").unwrap(),
        Some(&r),
    )
    .unwrap();
    for i in 0..50u8 {
        g.observe_at(&export(vec![call(i.max(1), "x", "{}", false)]), T0);
    }
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&r.gather())
        .unwrap();
    assert!(text.contains("brownout_agents_traces_tracked 10"), "{text}");
    assert!(
        text.contains(r#"brownout_agents_trace_evictions_total{reason="capacity"} 39"#),
        "{text}"
    );
    assert!(text.contains(r#"brownout_agents_tool_calls_total{outcome="ok"} 50"#));
}
