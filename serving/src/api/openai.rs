//! OpenAI request shapes (what we accept) and their validation into engine terms.

use serde::Deserialize;

use super::error::ApiError;
use super::text::sanitize;

/// `stop` may be one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

/// `prompt` may be a string or a list holding one string.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Fields shared by both endpoints.
#[derive(Debug, Clone, Deserialize)]
pub struct CommonParams {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    /// The chat API's newer name for `max_tokens`.
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<StopField>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<i64>,
    pub user: Option<String>,
    /// vLLM's extra sampling parameter: keep generating past end-of-sequence tokens (benchmarks
    /// and drills that need a stream of a known length).
    #[serde(default)]
    pub ignore_eos: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptField,
    #[serde(flatten)]
    pub common: CommonParams,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<ChatContent>,
}

/// Content may be a string or a list of `{"type":"text","text":…}` parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ChatContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// One `tools` entry: `{"type": "function", "function": {"name": …, …}}`. Only the function
/// name is read (the gate's tool breakers key on it); the model does not call tools.
#[derive(Debug, Clone, Deserialize)]
pub struct ToolDef {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub function: Option<FunctionDef>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FunctionDef {
    pub name: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    /// Declared tools (checked against the `tool:<name>` breakers).
    #[serde(default)]
    pub tools: Option<Vec<ToolDef>>,
    #[serde(flatten)]
    pub common: CommonParams,
}

impl ChatRequest {
    /// The declared functions' names (entries without a function are not tools we gate).
    pub fn tool_names(&self) -> Vec<&str> {
        self.tools
            .iter()
            .flatten()
            .filter_map(|t| t.function.as_ref().map(|f| f.name.as_str()))
            .collect()
    }
}

/// A validated request (text sanitised, numbers in range).
#[derive(Debug, Clone, PartialEq)]
pub struct Validated {
    pub max_tokens: Option<usize>,
    pub temperature: f32,
    pub top_p: f32,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
}

pub const MAX_STOP_STRINGS: usize = 4;

/// Checks the shared fields.
///
/// # Errors
/// A 400/404 [`ApiError`] naming the bad field.
pub fn validate_common(
    c: &CommonParams,
    served_model: &str,
    max_model_len: usize,
) -> Result<Validated, ApiError> {
    if let Some(m) = &c.model
        && m != served_model
    {
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "model_not_found",
            format!(
                "The model `{}` does not exist; this server serves `{served_model}`.",
                sanitize(m).chars().take(100).collect::<String>()
            ),
        )
        .param("model"));
    }
    let max_tokens = match c.max_completion_tokens.or(c.max_tokens) {
        None => None,
        Some(v) if v < 1 => {
            return Err(ApiError::bad_request(
                "invalid_value",
                format!("max_tokens must be at least 1 (got {v})"),
            )
            .param("max_tokens"));
        }
        Some(v) if v as u64 > max_model_len as u64 => {
            return Err(ApiError::bad_request(
                "invalid_value",
                format!(
                    "max_tokens ({v}) is larger than the model's context length ({max_model_len})"
                ),
            )
            .param("max_tokens"));
        }
        Some(v) => Some(v as usize),
    };
    let temperature = c.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad_request(
            "invalid_value",
            format!("temperature must be in [0, 2] (got {temperature})"),
        )
        .param("temperature"));
    }
    let top_p = c.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad_request(
            "invalid_value",
            format!("top_p must be in (0, 1] (got {top_p})"),
        )
        .param("top_p"));
    }
    if let Some(n) = c.n
        && n != 1
    {
        return Err(ApiError::bad_request(
            "unsupported_value",
            format!("only n = 1 is supported (got {n})"),
        )
        .param("n"));
    }
    let stop: Vec<String> = match &c.stop {
        None => Vec::new(),
        Some(StopField::One(s)) => vec![s.clone()],
        Some(StopField::Many(v)) => v.clone(),
    };
    if stop.len() > MAX_STOP_STRINGS {
        return Err(ApiError::bad_request(
            "invalid_value",
            format!(
                "at most {MAX_STOP_STRINGS} stop strings (got {})",
                stop.len()
            ),
        )
        .param("stop"));
    }
    let stop: Vec<String> = stop
        .iter()
        .map(|s| sanitize(s))
        .filter(|s| !s.is_empty())
        .collect();
    if stop.iter().any(|s| s.len() > 256) {
        return Err(ApiError::bad_request(
            "invalid_value",
            "stop strings must be at most 256 bytes",
        )
        .param("stop"));
    }
    Ok(Validated {
        max_tokens,
        temperature: temperature as f32,
        top_p: top_p as f32,
        seed: c.seed.map(|s| s as u64),
        stop,
        stream: c.stream,
        include_usage: c.stream_options.as_ref().is_some_and(|o| o.include_usage),
        ignore_eos: c.ignore_eos,
    })
}

/// The prompt text of a completion request.
///
/// # Errors
/// 400 when it is a list of other than one string.
pub fn completion_prompt(p: &PromptField) -> Result<String, ApiError> {
    match p {
        PromptField::One(s) => Ok(sanitize(s)),
        PromptField::Many(v) if v.len() == 1 => Ok(sanitize(&v[0])),
        PromptField::Many(v) => Err(ApiError::bad_request(
            "unsupported_value",
            format!("prompt must be one string (got a list of {})", v.len()),
        )
        .param("prompt")),
    }
}

/// The chat messages as sanitised `(role, text)` pairs.
///
/// # Errors
/// 400 on an empty list, an unknown role or a non-text content part.
pub fn chat_messages(msgs: &[ChatMessage]) -> Result<Vec<(String, String)>, ApiError> {
    if msgs.is_empty() {
        return Err(
            ApiError::bad_request("invalid_value", "messages must not be empty").param("messages"),
        );
    }
    let mut out = Vec::with_capacity(msgs.len());
    for m in msgs {
        if !matches!(
            m.role.as_str(),
            "system" | "user" | "assistant" | "developer" | "tool"
        ) {
            return Err(ApiError::bad_request(
                "invalid_value",
                format!(
                    "unknown message role `{}`",
                    sanitize(&m.role).chars().take(40).collect::<String>()
                ),
            )
            .param("messages"));
        }
        let text = match &m.content {
            None => String::new(),
            Some(ChatContent::Text(t)) => sanitize(t),
            Some(ChatContent::Parts(parts)) => {
                let mut t = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(x)) => t.push_str(&sanitize(x)),
                        _ => {
                            return Err(ApiError::bad_request(
                                "unsupported_value",
                                "only text content parts are supported",
                            )
                            .param("messages"));
                        }
                    }
                }
                t
            }
        };
        out.push((m.role.clone(), text));
    }
    Ok(out)
}
