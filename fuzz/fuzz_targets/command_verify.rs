//! Command verification: `SignedCommand { json, sig }.verify(key)` on fuzzed json/sig, and
//! `serde_json::from_slice::<Command>`. A forged (unsigned) command must never verify.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::command_verify(data));
