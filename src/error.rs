//! The control plane's one HTTP error contract.
//!
//! Every JSON route answers an error as
//!
//! ```json
//! {"error": {"code": "bad_parameter", "message": "since=\"yesterday\" is neither unix milliseconds nor RFC 3339"}}
//! ```
//!
//! with a 4xx/5xx status, a stable machine-readable `code`, a message for people and, on 503 and
//! 429, a `Retry-After` header. Internal details go to the log, never to the client. Routes
//! build an [`ApiError`]; the extractors' rejections become one through `From` (or the
//! [`Json`], [`Query`] and [`Path`] extractors here, whose rejection already is one).
//!
//! Two deliberate exceptions: the OTLP receivers (`/v1/traces`, `/v1/logs`) answer with OTLP's
//! `Status` message (protobuf or JSON, as the OTLP/HTTP specification asks), and the web UI's
//! HTML pages (`/`, `/hosts`, …) render an HTML error page for browsers; their JSON twins under
//! `/ui/api/` use this contract. The serving tier keeps the OpenAI error shape.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// A refused or failed request: a status, a stable code and a human message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub retry_after_secs: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after_secs: None,
        }
    }
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    pub fn unavailable(
        code: &'static str,
        message: impl Into<String>,
        retry_after_secs: u32,
    ) -> ApiError {
        ApiError {
            retry_after_secs: Some(retry_after_secs),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, message)
        }
    }
    /// Logs `err` and answers 500 without details.
    pub fn internal(context: &str, err: &dyn std::fmt::Display) -> ApiError {
        tracing::error!(error = %err, "{context}");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("{context}; see the server log"),
        )
    }
    /// A store that cannot answer is "unavailable", not a bug: 503.
    pub fn store(err: &crate::store::StoreError) -> ApiError {
        tracing::warn!(error = %err, "store query failed");
        ApiError::unavailable("store_unavailable", "the store cannot answer right now", 5)
    }
    /// No route at this path (the routers' fallback).
    pub fn no_route() -> ApiError {
        ApiError::not_found("no such route")
    }
    /// The route exists, with other methods.
    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "this route does not take that method",
        )
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": {"code": self.code, "message": self.message}});
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after_secs {
            r.headers_mut().insert(header::RETRY_AFTER, s.into());
        }
        r
    }
}

impl From<JsonRejection> for ApiError {
    /// A body that is not JSON, not the expected JSON, or not sent as JSON: 400 `invalid_json`.
    fn from(r: JsonRejection) -> ApiError {
        ApiError::bad_request("invalid_json", r.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    /// A query string that does not fit the route's parameters: 400 `bad_parameter`.
    fn from(r: QueryRejection) -> ApiError {
        ApiError::bad_request("bad_parameter", r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    /// A path segment that is not valid (e.g. not UTF-8 once decoded): 400 `bad_parameter`.
    fn from(r: PathRejection) -> ApiError {
        ApiError::bad_request("bad_parameter", r.body_text())
    }
}

/// `axum::Json` whose rejection is an [`ApiError`].
pub struct Json<T>(pub T);

impl<T, S> FromRequest<S> for Json<T>
where
    axum::Json<T>: FromRequest<S, Rejection = JsonRejection>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let axum::Json(v) = axum::Json::<T>::from_request(req, state).await?;
        Ok(Json(v))
    }
}

/// An axum extractor from the request's parts whose rejection is an [`ApiError`] (the
/// rejection's `From` impl above picks the error code).
macro_rules! parts_extractor {
    ($(#[$doc:meta])* $name:ident, $rejection:ty) => {
        $(#[$doc])*
        pub struct $name<T>(pub T);

        impl<T, S> FromRequestParts<S> for $name<T>
        where
            axum::extract::$name<T>: FromRequestParts<S, Rejection = $rejection>,
            S: Send + Sync,
        {
            type Rejection = ApiError;

            async fn from_request_parts(
                parts: &mut Parts,
                state: &S,
            ) -> Result<Self, Self::Rejection> {
                let axum::extract::$name(v) =
                    axum::extract::$name::<T>::from_request_parts(parts, state).await?;
                Ok($name(v))
            }
        }
    };
}

parts_extractor!(
    /// `axum::extract::Query` whose rejection is an [`ApiError`].
    Query,
    QueryRejection
);
parts_extractor!(
    /// `axum::extract::Path` whose rejection is an [`ApiError`].
    Path,
    PathRejection
);

/// Paths where JSON clients live (`/api/`, `/ui/api/`, `/v1/`): unknown routes, refused
/// sign-ins and the like answer there in this contract, elsewhere (browser pages) in HTML.
pub fn is_json_path(path: &str) -> bool {
    ["/api/", "/ui/api/", "/v1/"]
        .iter()
        .any(|p| path.starts_with(p))
}

/// The fallback of the JSON routers: `404 not_found` in the contract's shape.
pub async fn no_route() -> ApiError {
    ApiError::no_route()
}

/// The method fallback of the JSON routers: `405 method_not_allowed` in the contract's shape.
pub async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}

/// Parses a time query parameter: unix milliseconds or RFC 3339. The error names the parameter
/// and the value; callers choose the code.
///
/// # Errors
/// Neither form.
pub fn parse_time(field: &str, s: &str) -> Result<u64, String> {
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(ms);
    }
    let t = chrono::DateTime::parse_from_rfc3339(s)
        .map_err(|_| format!("{field}={s:?} is neither unix milliseconds nor RFC 3339"))?;
    u64::try_from(t.timestamp_millis())
        .map_err(|_| format!("{field}={s:?} is before 1970-01-01T00:00:00Z (unix ms 0)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_in_both_forms_and_the_error_names_the_parameter() {
        assert_eq!(parse_time("since", "1000"), Ok(1000));
        assert_eq!(
            parse_time("since", "2026-11-30T00:00:00Z"),
            Ok(1_795_996_800_000)
        );
        let e = parse_time("until", "-5").unwrap_err();
        assert!(e.contains("until") && e.contains("\"-5\""), "{e}");
        let e = parse_time("since", "0001-01-01T00:00:00Z").unwrap_err();
        assert!(e.contains("before 1970"), "{e}");
    }

    #[tokio::test]
    async fn the_body_has_the_one_shape_and_retry_after_when_given() {
        use http_body_util::BodyExt as _;
        let r = ApiError::unavailable("store_unavailable", "later", 5).into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "5");
        let body = r.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error": {"code": "store_unavailable", "message": "later"}})
        );
    }
}
