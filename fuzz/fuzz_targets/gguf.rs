//! GGUF reading: `Gguf::parse` and, when it parses, `Tokenizer::from_gguf` (and a little
//! encoding/decoding with the tokenizer it builds).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::gguf(data));
