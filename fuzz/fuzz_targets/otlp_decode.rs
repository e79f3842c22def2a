//! OTLP decoding as the control plane does it (prost protobuf and OTLP/JSON through serde,
//! see `src/ingest/http.rs` `decode`) followed by the conversion to rows in
//! `src/ingest/otlp.rs` (`convert_traces`, `convert_logs`).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::otlp_decode(data));
