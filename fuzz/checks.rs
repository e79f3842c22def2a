//! The checks each fuzz target runs, shared with `tests/fuzz_corpus.rs` (which replays the
//! committed corpus on stable Rust) through `#[path]`. Each function takes the raw input and
//! panics only on a real bug (a parser panicking, or a broken invariant asserted here).
#![allow(dead_code)]

use brownout::degrade::Policy;
use brownout::ingest::http::{MAX_LISTED_ERRORS, parse_ndjson};
use brownout::ingest::otlp::{convert_logs, convert_traces};
use brownout::slo::spec::parse_str;
use brownout_protocol::FailureEvent;
use brownout_protocol::Tier;
use brownout_protocol::{Command, SignedCommand};
use brownout_serving::model::Tokenizer;
use brownout_serving::model::gguf::Gguf;
use brownout_serving::model::tiny;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use std::sync::LazyLock;

const KEY: &[u8] = b"fuzz-hmac-key-0123456789abcdef";

/// The Ed25519 key the fuzzed commands are checked against (a fixed seed: reproducible).
static ED: LazyLock<brownout_protocol::CommandSigningKey> =
    LazyLock::new(|| brownout_protocol::CommandSigningKey::from_seed(&[0x5a; 32]));

static TOK: LazyLock<Tokenizer> = LazyLock::new(|| {
    let (tokens, types, merges) = tiny::vocab();
    Tokenizer::new(tokens, &types, &merges).expect("the tiny vocabulary builds a tokenizer")
});

/// NDJSON failure events: `FailureEvent::parse_line` on one line and the control plane's
/// body splitter `brownout::ingest::http::parse_ndjson` on the whole input.
pub fn failure_ndjson(data: &[u8]) {
    if let Ok(ev) = FailureEvent::parse_line(data) {
        // What parses must serialise and parse back to the same event.
        let line = serde_json::to_vec(&ev).expect("a parsed event serialises");
        let again = FailureEvent::parse_line(&line).expect("a serialised event parses");
        assert_eq!(ev, again);
    }
    // The body splitter with the default and a tiny line limit.
    for max_line in [1 << 20, 64] {
        let p = parse_ndjson(data, max_line);
        assert!(p.errors.len() <= MAX_LISTED_ERRORS);
        assert!(p.errors.len() <= p.num_rejected);
        assert!(p.num_too_long <= p.num_rejected);
    }
}

/// Command verification: `SignedCommand { json, sig }.verify(key)` on fuzzed json/sig, and
/// `serde_json::from_slice::<Command>`. A forged (unsigned) command must never verify.
pub fn command_verify(data: &[u8]) {
    // Input layout: sig text, a 0xFF byte, json text (0xFF never occurs in UTF-8).
    let (sig, json) = match data.iter().position(|b| *b == 0xFF) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&[][..], data),
    };
    let _ = serde_json::from_slice::<Command>(json);
    let sig = String::from_utf8_lossy(sig).into_owned();
    let json = String::from_utf8_lossy(json).into_owned();
    let forged = SignedCommand {
        json: json.clone(),
        sig,
    };
    // A signature verifies only when it is the HMAC of exactly these bytes under the key
    // (hex case and surrounding whitespace aside).
    if forged.verify(KEY).is_ok() {
        let expected = brownout_protocol::sign(KEY, forged.json.as_bytes());
        assert_eq!(forged.sig.trim().to_ascii_lowercase(), expected);
    }
    assert!(forged.verify(b"another key").is_err() || forged.verify(KEY).is_err());
    let _ = forged.verify_for(KEY, "c1");
    // The Ed25519 verifier (the default scheme): fuzzed text never verifies under a key whose
    // private half the input cannot have, whatever its key id, and never panics.
    let ed = brownout_protocol::CommandVerifier::ed25519([ED.public()]);
    if ed.verify(&forged).is_ok() {
        // Only the one valid signature (Ed25519 signing is deterministic) can verify.
        let expected = brownout_protocol::CommandSigner::Ed25519(ED.clone())
            .sign_bytes(forged.json.as_bytes());
        assert_eq!(forged.sig.trim(), expected);
    }
    // An Ed25519 verifier never accepts an HMAC signature, even with the right HMAC key.
    let hmac_sig = SignedCommand {
        json: json.clone(),
        sig: brownout_protocol::sign(KEY, json.as_bytes()),
    };
    assert!(ed.verify(&hmac_sig).is_err());
    // A command that parses, once signed with the key, verifies to the same command; with
    // another key it does not.
    if let Ok(cmd) = serde_json::from_str::<Command>(&json) {
        let signed = SignedCommand::sign(&cmd, KEY);
        let back = signed.verify(KEY).expect("own signature verifies");
        // The command comes back exactly, floats included (`burn_rate`, `jitter_ratio`, numbers
        // inside unknown fields): serde_json is built with `float_roundtrip`, without which some
        // shortest float texts parse one ULP off (fuzz finding, see docs/SECURITY.md).
        assert_eq!(back, cmd);
        assert!(signed.verify(b"another key").is_err());
        let signer = brownout_protocol::CommandSigner::Ed25519(ED.clone());
        let signed = signer.sign(&cmd);
        assert_eq!(
            ed.verify(&signed).expect("own Ed25519 signature verifies"),
            cmd
        );
        let other = brownout_protocol::CommandSigningKey::from_seed(&[0x5b; 32]);
        assert!(
            brownout_protocol::CommandVerifier::ed25519([other.public()])
                .verify(&signed)
                .is_err()
        );
        // An old (HMAC-only) subscriber refuses it.
        assert!(signed.verify(KEY).is_err());
    }
}

/// OTLP decoding as the control plane does it (prost protobuf and OTLP/JSON through serde,
/// see `src/ingest/http.rs` `decode`) followed by the conversion to rows in
/// `src/ingest/otlp.rs` (`convert_traces`, `convert_logs`).
pub fn otlp_decode(data: &[u8]) {
    if let Ok(req) = ExportTraceServiceRequest::decode(data) {
        let _ = convert_traces(&req);
    }
    if let Ok(req) = ExportLogsServiceRequest::decode(data) {
        let _ = convert_logs(&req, 1_700_000_000_000);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(req) = serde_json::from_str::<ExportTraceServiceRequest>(text) {
            let _ = convert_traces(&req);
        }
        if let Ok(req) = serde_json::from_str::<ExportLogsServiceRequest>(text) {
            let _ = convert_logs(&req, 1_700_000_000_000);
        }
    }
}

/// Degradation policy YAML: `brownout::degrade::Policy::from_yaml`.
pub fn policy_yaml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(policy) = Policy::from_yaml(text) {
        assert!(policy.tier(Tier::T0).is_none());
        for t in [Tier::T1, Tier::T2, Tier::T3] {
            let _ = policy.tier(t);
        }
    }
}

/// SLO spec YAML (brownout/v1, Sloth prometheus/v1, OpenSLO): `brownout::slo::spec::parse_str`.
pub fn slo_yaml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = parse_str(text, "fuzz.yaml") {
        // Errors render (they are shown to the user).
        let _ = e.to_string();
    }
}

/// GGUF reading: `Gguf::parse` and, when it parses, `Tokenizer::from_gguf` (and a little
/// encoding/decoding with the tokenizer it builds).
pub fn gguf(data: &[u8]) {
    let Ok(g) = Gguf::parse(data) else {
        return;
    };
    if let Ok(tok) = Tokenizer::from_gguf(&g) {
        let ids = tok.encode("hello <|im_start|> 123 wörld");
        let _ = tok.decode(&ids);
    }
}

/// The tiny-random model's tokenizer on arbitrary UTF-8: `decode(encode(s)) == s`, the same
/// for `encode_plain`, and the streaming decoder yields the same text as `decode`.
pub fn tokenizer(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let tok = &*TOK;
    for ids in [tok.encode(s), tok.encode_plain(s)] {
        assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
        assert_eq!(tok.decode(&ids), s, "round trip of {s:?} via {ids:?}");
        let mut dec = tok.stream_decoder();
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(&dec.push(id));
        }
        streamed.push_str(&dec.finish());
        assert_eq!(streamed, s, "streamed decode of {s:?} via {ids:?}");
    }
}
