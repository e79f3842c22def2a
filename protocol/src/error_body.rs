//! The JSON error body of brownout's own HTTP APIs — the control plane's (`src/error.rs`) and
//! the gpu-agent's `:9400` — so that one client-side parser reads both:
//!
//! ```json
//! {"error": {"code": "not_found", "message": "no such route"}}
//! ```
//!
//! `code` is stable and machine-readable, `message` is for people. The serving tier answers in
//! the OpenAI error shape instead (its clients are OpenAI SDKs).

use serde::{Deserialize, Serialize};

/// `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// The inside of an [`ErrorBody`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: code.into(),
                message: message.into(),
            },
        }
    }

    /// The body's JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("two strings always serialize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_is_error_code_message() {
        let b = ErrorBody::new("not_found", "no such \"route\"");
        assert_eq!(
            b.to_json(),
            r#"{"error":{"code":"not_found","message":"no such \"route\""}}"#
        );
        let back: ErrorBody = serde_json::from_str(&b.to_json()).unwrap();
        assert_eq!(back, b);
    }
}
