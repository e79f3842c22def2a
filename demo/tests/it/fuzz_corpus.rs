//! Replays every committed fuzz corpus file (`fuzz/corpus/<target>/*`) through the same checks
//! the cargo-fuzz targets run (`fuzz/checks.rs`), so CI covers the corpus on stable Rust.
//!
//! `UPDATE_FUZZ_SEEDS=1 cargo test -p brownout-demo --test it fuzz_corpus::` (re)writes the seed files (`seed-*`) from
//! real inputs: example YAML, protocol examples, a tokenizer-only GGUF written by the tiny model's
//! writer, OTLP protobuf/JSON built from opentelemetry-proto types.

#[path = "../../../fuzz/checks.rs"]
mod checks;

use std::path::{Path, PathBuf};

type Check = fn(&[u8]);

const TARGETS: &[(&str, Check)] = &[
    ("failure_ndjson", checks::failure_ndjson),
    ("command_verify", checks::command_verify),
    ("otlp_decode", checks::otlp_decode),
    ("policy_yaml", checks::policy_yaml),
    ("slo_yaml", checks::slo_yaml),
    ("gguf", checks::gguf),
    ("tokenizer", checks::tokenizer),
];

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

#[test]
fn every_committed_corpus_file_passes_its_target_checks() {
    if std::env::var_os("UPDATE_FUZZ_SEEDS").is_some() {
        write_seeds();
    }
    for (target, check) in TARGETS {
        let dir = corpus_dir(target);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e} (run UPDATE_FUZZ_SEEDS=1)", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        assert!(
            files.len() >= 3,
            "{target}: only {} corpus files in {}",
            files.len(),
            dir.display()
        );
        for f in files {
            let data = std::fs::read(&f).unwrap();
            let r = std::panic::catch_unwind(|| check(&data));
            assert!(r.is_ok(), "{target}: {} fails its checks", f.display());
        }
    }
}

/// The checks themselves catch what they claim to: a forged signature never verifies, a
/// non-round-tripping tokenizer input would be caught (spot check on tricky strings).
#[test]
fn checks_hold_on_hand_picked_inputs() {
    // Tokenizer round trip on strings with specials, digits, CJK, emoji, combining marks, CRLF.
    for s in [
        "",
        "<|im_start|>user\nhi<|im_end|>",
        "<|im_start",
        "12345 ٣٤ ⅷ",
        "日本語 😀 e\u{301}",
        "a\r\n\tb  ",
        "\u{0}\u{7f}\u{ffff}",
    ] {
        checks::tokenizer(s.as_bytes());
    }
    // A valid signature layout verifies only with the right bytes.
    let json = br#"{"cluster":"c1","epoch":1,"version":2,"tier":0,"issued_at_ms":1,"expires_at_ms":2,"reason":{"trigger":"operator","detail":""}}"#;
    let sig = brownout_protocol::sign(b"fuzz-hmac-key-0123456789abcdef", json);
    let mut input = sig.into_bytes();
    input.push(0xFF);
    input.extend_from_slice(json);
    checks::command_verify(&input);
    let sc = brownout_protocol::SignedCommand {
        json: String::from_utf8(json.to_vec())
            .unwrap()
            .replace("\"tier\":0", "\"tier\":3"),
        sig: String::from_utf8(input[..64].to_vec()).unwrap(),
    };
    assert!(sc.verify(b"fuzz-hmac-key-0123456789abcdef").is_err());
}

fn write(target: &str, name: &str, data: &[u8]) {
    let dir = corpus_dir(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("seed-{name}")), data).unwrap();
}

fn write_seeds() {
    let root = &Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // Failure NDJSON: the protocol's example lines, a multi-line body with CRLF and bad lines.
    let full = r#"{"ts":1764460800000,"service":"muse","host":"gpu-3","request_id":"r1","trace_id":"abc","user_id":"u9","feature":"pdf_analysis","criticality":"sheddable","category":"tool_unavailable","error_type":"AgentExecutionFailed","message":"tool call to weather API timed out after 8000 ms","latency_ms":8001.5,"attributes":{"tool":"weather"}}"#;
    let short = r#"{"ts":"2026-11-27T20:15:00Z","service":"muse-agent","message":"boom"}"#;
    write("failure_ndjson", "full", full.as_bytes());
    write("failure_ndjson", "short", short.as_bytes());
    write(
        "failure_ndjson",
        "body",
        format!("{full}\r\n\n{short}\nnot json\n{{\"ts\":\"x\"}}\n").as_bytes(),
    );
    write(
        "failure_ndjson",
        "unicode",
        r#"{"ts":"2026-11-27T20:15:00+08:00","service":"s","message":"日本 \u0000 😀","category":"martian"}"#
            .as_bytes(),
    );
    // Commands: the two examples of docs/PROTOCOL.md, signed (sig 0xFF json) and unsigned.
    let doc = std::fs::read_to_string(root.join("docs/PROTOCOL.md")).unwrap();
    let mut n = 0;
    for block in doc.split("```json\n").skip(1) {
        let text = block.split("```").next().unwrap();
        if !text.contains("\"epoch\"") {
            continue;
        }
        let cmd: brownout_protocol::Command = serde_json::from_str(text).unwrap();
        let signed =
            brownout_protocol::SignedCommand::sign(&cmd, b"fuzz-hmac-key-0123456789abcdef");
        let mut input = signed.sig.clone().into_bytes();
        input.push(0xFF);
        input.extend_from_slice(signed.json.as_bytes());
        write("command_verify", &format!("signed-{n}"), &input);
        write("command_verify", &format!("doc-{n}"), text.as_bytes());
        n += 1;
    }
    let normal = brownout_protocol::Command::normal("c1", 1, 1, 1_764_460_800_000, 30_000);
    write("command_verify", "normal", normal.to_json().as_bytes());
    // OTLP: traces and logs as protobuf and OTLP/JSON.
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
    use prost::Message;
    let kv = |k: &str, v: Value| KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    };
    let s = |v: &str| Value::StringValue(v.into());
    let t0 = 1_764_460_800_000_000_000u64;
    let spans = (0..3u8)
        .map(|i| Span {
            trace_id: vec![7; 16],
            span_id: vec![i + 1; 8],
            parent_span_id: if i == 0 { vec![] } else { vec![1; 8] },
            name: format!("step-{i}"),
            kind: if i == 0 { 2 } else { 1 },
            start_time_unix_nano: t0 + u64::from(i) * 1_000_000,
            end_time_unix_nano: t0 + u64::from(i) * 1_000_000 + 500_000,
            attributes: vec![
                kv("feature", s("pdf_analysis")),
                kv("brownout.ttft_s", Value::DoubleValue(0.25)),
                kv("gen_ai.usage.output_tokens", Value::IntValue(42)),
            ],
            status: Some(Status {
                code: if i == 2 { 2 } else { 0 },
                message: if i == 2 {
                    "tool call timed out".into()
                } else {
                    String::new()
                },
            }),
            ..Default::default()
        })
        .collect();
    let traces = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", s("muse-agent")),
                    kv("host.name", s("gpu-7")),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    write("otlp_decode", "traces.pb", &traces.encode_to_vec());
    write(
        "otlp_decode",
        "traces.json",
        serde_json::to_string(&traces).unwrap().as_bytes(),
    );
    let rec = |sev: i32, body: &str| LogRecord {
        time_unix_nano: t0,
        severity_number: sev,
        severity_text: if sev >= 17 {
            "ERROR".into()
        } else {
            "INFO".into()
        },
        body: Some(AnyValue {
            value: Some(s(body)),
        }),
        attributes: vec![
            kv("feature", s("image_generation")),
            kv("error_type", s("AgentExecutionFailed")),
        ],
        trace_id: vec![0x77; 16],
        span_id: vec![1; 8],
        ..Default::default()
    };
    let logs = ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource {
                attributes: vec![kv("service.name", s("painter"))],
                ..Default::default()
            }),
            scope_logs: vec![ScopeLogs {
                log_records: vec![rec(9, "started"), rec(17, "resource_quota_exhausted")],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    write("otlp_decode", "logs.pb", &logs.encode_to_vec());
    write(
        "otlp_decode",
        "logs.json",
        serde_json::to_string(&logs).unwrap().as_bytes(),
    );
    // YAML: the example files.
    for f in ["policy.yaml"] {
        write(
            "policy_yaml",
            f,
            &std::fs::read(root.join("examples").join(f)).unwrap(),
        );
    }
    write(
        "policy_yaml",
        "bad-field.yaml",
        b"version: brownout/v1\ntiers:\n  t1:\n    enter: {nope: 1}\n",
    );
    for e in std::fs::read_dir(root.join("examples/slo")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        write("slo_yaml", &name, &std::fs::read(&p).unwrap());
    }
    write(
        "slo_yaml",
        "edge.spec.yaml",
        &std::fs::read(root.join("tests/golden/slo/edge.spec.yaml")).unwrap(),
    );
    // GGUF: the tiny model's tokenizer metadata with small tensors of several types.
    use brownout_serving::model::gguf::{GgmlType, GgufWriter, MetaValue};
    let (tokens, types, merges) = brownout_serving::model::tiny::vocab();
    let mut w = GgufWriter::new();
    w.meta("general.architecture", MetaValue::Str("llama".into()))
        .meta("general.alignment", MetaValue::U32(32))
        .meta("tokenizer.ggml.model", MetaValue::Str("gpt2".into()))
        .meta(
            "tokenizer.ggml.tokens",
            MetaValue::Array(tokens.iter().map(|t| MetaValue::Str(t.clone())).collect()),
        )
        .meta(
            "tokenizer.ggml.token_type",
            MetaValue::Array(types.iter().map(|&t| MetaValue::I32(t as i32)).collect()),
        )
        .meta(
            "tokenizer.ggml.merges",
            MetaValue::Array(merges.iter().map(|m| MetaValue::Str(m.clone())).collect()),
        )
        .meta("tokenizer.ggml.eos_token_id", MetaValue::U32(2));
    write("gguf", "tokenizer.gguf", &w.to_bytes());
    let mut w = GgufWriter::new();
    w.meta("general.architecture", MetaValue::Str("llama".into()))
        .meta("llama.rope.freq_base", MetaValue::F32(10000.0))
        .meta("flag", MetaValue::Bool(true))
        .tensor("a.weight", &[4, 2], GgmlType::F32, vec![0u8; 32])
        .tensor(
            "b.weight",
            &[32, 1],
            GgmlType::Q8_0,
            vec![0u8; GgmlType::Q8_0.block_bytes()],
        )
        .tensor(
            "c.weight",
            &[32, 1],
            GgmlType::Q4_1,
            vec![0u8; GgmlType::Q4_1.block_bytes()],
        );
    write("gguf", "tensors.gguf", &w.to_bytes());
    let mut w = GgufWriter::new();
    w.meta("general.architecture", MetaValue::Str("llama".into()));
    write("gguf", "empty.gguf", &w.to_bytes());
    // Tokenizer: chat text, digits, scripts, emoji, whitespace runs.
    for (i, t) in [
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat's 12+30?<|im_end|>",
        "Hello world, it's   fine\n\n\tthe end",
        "日本語のテキスト 😀👍🏽 e\u{301} ﷺ",
        "I'll we've they're DON'T 123456789 x1y2",
    ]
    .iter()
    .enumerate()
    {
        write("tokenizer", &format!("text-{i}"), t.as_bytes());
    }
}
