//! NDJSON failure events: `FailureEvent::parse_line` on one line and the control plane's
//! body splitter `brownout::ingest::http::parse_ndjson` on the whole input.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::failure_ndjson(data));
