//! SmolLM2-Instruct's chat template (ChatML), as in the GGUF's `tokenizer.chat_template`:
//!
//! ```text
//!  {% if first message is not system %}<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n
//!  for each message: <|im_start|>{role}\n{content}<|im_end|>\n
//!  add_generation_prompt: <|im_start|>assistant\n
//! ```

use serde::{Deserialize, Serialize};

use super::tokenizer::Tokenizer;

/// SmolLM2-Instruct's default system prompt (used when the first message is not `system`).
pub const DEFAULT_SYSTEM_PROMPT: &str =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// One chat message (`/v1/chat/completions`' `messages[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

fn parts(messages: &[ChatMessage]) -> Vec<(bool, String)> {
    // (is_template_text, text): template text may hold special tokens, message text may not.
    let mut out = Vec::new();
    if messages.first().is_none_or(|m| m.role != "system") {
        out.push((true, "<|im_start|>system\n".to_string()));
        out.push((false, DEFAULT_SYSTEM_PROMPT.to_string()));
        out.push((true, "<|im_end|>\n".to_string()));
    }
    for m in messages {
        out.push((true, "<|im_start|>".to_string()));
        out.push((false, format!("{}\n{}", m.role, m.content)));
        out.push((true, "<|im_end|>\n".to_string()));
    }
    out.push((true, "<|im_start|>assistant\n".to_string()));
    out
}

/// The prompt text with the generation prompt appended.
pub fn render(messages: &[ChatMessage]) -> String {
    parts(messages).into_iter().map(|(_, s)| s).collect()
}

/// Token ids of the prompt; special-token strings inside message text stay plain text (so a user
/// cannot inject `<|im_start|>system`).
pub fn encode(tok: &Tokenizer, messages: &[ChatMessage]) -> Vec<u32> {
    let mut ids = Vec::new();
    for (template, s) in parts(messages) {
        if template {
            ids.extend(tok.encode(&s));
        } else {
            ids.extend(tok.encode_plain(&s));
        }
    }
    ids
}
