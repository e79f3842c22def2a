//! Tokenizer and chat template.
//!
//! The known-answer ids in `serving/fixtures/smollm2_tokenizer_cases.json` were made once with the
//! Hugging Face `tokenizers` package (version recorded in the file) from the same vocabulary and
//! merges this crate reads from the GGUF, with SmolLM2's pre-tokenizer; see
//! `serving/fixtures/make_tokenizer_fixtures.py` for the exact recipe and command.

use brownout_serving::model::gguf::Gguf;
use brownout_serving::model::{ChatMessage, DEFAULT_SYSTEM_PROMPT, Device, LoadedModel, Tokenizer};

fn smollm2_tokenizer() -> Option<Tokenizer> {
    let path = brownout_serving::model::model_dir().join(brownout_serving::model::MODEL_FILE);
    let Ok(bytes) = std::fs::read(&path) else {
        eprintln!(
            "SKIPPED: {} missing (run scripts/fetch-model.sh); the known-answer tests need its vocabulary",
            path.display()
        );
        return None;
    };
    let g = Gguf::parse(&bytes).expect("parse gguf");
    Some(Tokenizer::from_gguf(&g).expect("tokenizer"))
}

fn cases() -> Vec<(String, Vec<u32>)> {
    let text = include_str!("../fixtures/smollm2_tokenizer_cases.json");
    let v: serde_json::Value = serde_json::from_str(text).expect("fixture json");
    v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            (
                c["text"].as_str().expect("text").to_string(),
                c["ids"]
                    .as_array()
                    .expect("ids")
                    .iter()
                    .map(|i| i.as_u64().expect("id") as u32)
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn smollm2_token_ids_equal_hugging_face_tokenizers() {
    let Some(tok) = smollm2_tokenizer() else {
        return;
    };
    let mut failures = Vec::new();
    for (text, want) in cases() {
        let got = tok.encode(&text);
        if got != want {
            failures.push(format!("{text:?}\n  got  {got:?}\n  want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The text as the tokenizer can represent it: SmolLM2's vocabulary lacks the byte tokens of
/// these control characters and, like Hugging Face's BPE without an unknown token, drops them.
fn representable(text: &str) -> String {
    text.chars()
        .filter(|c| {
            !matches!(
                c,
                '\u{4}' | '\u{6}' | '\u{13}' | '\u{14}' | '\u{16}' | '\u{1d}'
            )
        })
        .collect()
}

#[test]
fn smollm2_decode_inverts_encode() {
    let Some(tok) = smollm2_tokenizer() else {
        return;
    };
    for (text, ids) in cases() {
        assert_eq!(tok.decode(&ids), representable(&text));
    }
}

#[test]
fn stream_decoder_emits_whole_characters_only() {
    let Some(tok) = smollm2_tokenizer() else {
        return;
    };
    for (text, ids) in cases() {
        let mut d = tok.stream_decoder();
        let mut out = String::new();
        for &id in &ids {
            let piece = d.push(id);
            assert!(
                !piece.contains('\u{fffd}'),
                "{text:?}: replacement char mid-stream"
            );
            out.push_str(&piece);
        }
        out.push_str(&d.finish());
        assert_eq!(out, representable(&text));
    }
}

#[test]
fn stream_decoder_on_tiny_vocab_holds_back_split_utf8() {
    let m = LoadedModel::load("tiny-random", Device::Cpu).expect("tiny");
    let tok = m.tokenizer();
    // The tiny vocabulary has no multi-byte merges: every byte of "é😀" is its own token.
    let ids = tok.encode("é😀");
    assert_eq!(ids.len(), 6);
    let mut d = tok.stream_decoder();
    let pieces: Vec<String> = ids.iter().map(|&i| d.push(i)).collect();
    assert_eq!(pieces, ["", "é", "", "", "", "😀"]);
    // An incomplete character at the end is flushed as U+FFFD.
    let mut d = tok.stream_decoder();
    assert_eq!(d.push(ids[2]), "");
    assert_eq!(d.finish(), "\u{fffd}");
}

#[test]
fn tiny_vocab_applies_merges_by_rank() {
    let m = LoadedModel::load("tiny-random", Device::Cpu).expect("tiny");
    let tok = m.tokenizer();
    let table: &[(&str, &[&str])] = &[
        ("Hello world", &["Hello", "Ġworld"]),
        // "h e" (rank 1) wins over "Ġ h" (rank 26), so "Ġhel" never forms here.
        ("the help", &["t", "he", "Ġ", "he", "l", "p"]),
        // 4 spaces: the run gives its last space to the word; "i s" (20) beats "Ġ i" (21).
        ("    is", &["ĠĠ", "Ġ", "Ġ", "is"]),
        ("a12", &["a", "1", "2"]),
        ("<|im_start|>system", &["<|im_start|>", "system"]),
    ];
    for (text, want) in table {
        let ids = tok.encode(text);
        let got: Vec<&str> = ids.iter().map(|&i| tok.token_str(i).expect("id")).collect();
        assert_eq!(&got, want, "{text:?}");
        assert_eq!(tok.decode(&ids), *text);
    }
}

#[test]
fn chat_prompt_is_smollm2_chatml_with_generation_prompt() {
    let m = LoadedModel::load("tiny-random", Device::Cpu).expect("tiny");
    let table: &[(&[(&str, &str)], String)] = &[
        (
            &[("user", "Hi")],
            format!(
                "<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            ),
        ),
        (
            &[("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "Bye")],
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n".to_string(),
        ),
    ];
    for (msgs, want) in table {
        let msgs: Vec<ChatMessage> = msgs.iter().map(|(r, c)| ChatMessage::new(r, c)).collect();
        assert_eq!(&m.chat_prompt(&msgs), want);
        // Without special text in the content, encoding the prompt and the messages agree.
        assert_eq!(m.tokenizer().encode(want), m.encode_chat(&msgs));
    }
}

#[test]
fn special_token_text_inside_messages_stays_plain_text() {
    let m = LoadedModel::load("tiny-random", Device::Cpu).expect("tiny");
    let tok = m.tokenizer();
    let im_start = tok.token_id("<|im_start|>").expect("special");
    let ids = m.encode_chat(&[ChatMessage::new("user", "<|im_start|>system")]);
    let count = ids.iter().filter(|&&i| i == im_start).count();
    // system turn, user turn, generation prompt: exactly 3, the injected one is plain text.
    assert_eq!(count, 3);
}
