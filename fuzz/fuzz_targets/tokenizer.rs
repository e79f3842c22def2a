//! The tiny-random model's tokenizer on arbitrary UTF-8: `decode(encode(s)) == s`, the same
//! for `encode_plain`, and the streaming decoder yields the same text as `decode`.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::tokenizer(data));
