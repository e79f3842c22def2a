//! `--api-key` (env `BROWNOUT_SERVE_API_KEY`, comma-separated; several keys allowed, so a key
//! can be rotated without downtime): a request must send `Authorization: Bearer <key>` with one
//! of them, else `401` in OpenAI's error shape (`invalid_api_key`). `/health` and `/metrics`
//! stay open (probes and Prometheus) unless `--api-key-all-routes`.
//!
//! The comparison takes the same time whichever key matches and however much of a key a guess
//! gets right: the presented key and every configured key are hashed (SHA-256, so lengths do
//! not show), and every digest is compared in constant time (`subtle`), none skipped.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::api::ApiError;

/// The accepted keys, as digests.
#[derive(Clone)]
pub struct ApiKeys {
    digests: Arc<Vec<[u8; 32]>>,
    all_routes: bool,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeys")
            .field("keys", &self.digests.len())
            .field("all_routes", &self.all_routes)
            .finish()
    }
}

fn digest(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

impl ApiKeys {
    /// `None` when `keys` is empty (no authentication).
    ///
    /// # Errors
    /// A key that is empty, longer than 512 bytes, or not visible ASCII (it could not be sent in
    /// a header).
    pub fn new(keys: &[String], all_routes: bool) -> Result<Option<ApiKeys>, String> {
        let mut digests = Vec::with_capacity(keys.len());
        for (i, k) in keys.iter().enumerate() {
            let k = k.trim();
            if k.is_empty() || k.len() > 512 || !k.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "--api-key number {} must be 1-512 visible ASCII characters",
                    i + 1
                ));
            }
            digests.push(digest(k.as_bytes()));
        }
        Ok((!digests.is_empty()).then(|| ApiKeys {
            digests: Arc::new(digests),
            all_routes,
        }))
    }

    /// Whether `presented` is one of the keys (constant time in which and how much matched).
    pub fn accepts(&self, presented: &[u8]) -> bool {
        let d = digest(presented);
        let mut ok = subtle::Choice::from(0u8);
        for k in self.digests.iter() {
            ok |= k[..].ct_eq(&d[..]);
        }
        ok.into()
    }

    fn open(&self, path: &str) -> bool {
        !self.all_routes && matches!(path, "/health" | "/metrics")
    }
}

/// The key of `Authorization: Bearer <key>`.
fn bearer(req: &Request) -> Option<&[u8]> {
    let v = req.headers().get(header::AUTHORIZATION)?.as_bytes();
    let scheme = v.get(..7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| v[7..].trim_ascii())
}

fn unauthorized(missing: bool) -> Response {
    let msg = if missing {
        "You didn't provide an API key. You need to provide your API key in an Authorization \
         header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
    } else {
        "Incorrect API key provided."
    };
    // OpenAI answers 401 with type `invalid_request_error` and code `invalid_api_key`.
    let e = ApiError::new(StatusCode::UNAUTHORIZED, "invalid_api_key", msg)
        .with("type", json!("invalid_request_error"));
    let mut r = e.into_response();
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

async fn middleware(State(keys): State<ApiKeys>, req: Request, next: Next) -> Response {
    if keys.open(req.uri().path()) {
        return next.run(req).await;
    }
    match bearer(&req).map(|k| keys.accepts(k)) {
        Some(true) => next.run(req).await,
        Some(false) => unauthorized(false),
        None => unauthorized(true),
    }
}

/// `router` behind the keys (unchanged with none).
pub fn layer(router: axum::Router, keys: Option<ApiKeys>) -> axum::Router {
    match keys {
        Some(k) => router.layer(axum::middleware::from_fn_with_state(k, middleware)),
        None => router,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::routing::get;
    use tower::ServiceExt;

    #[test]
    fn keys_are_checked_and_bad_ones_refused() {
        let k = ApiKeys::new(&["sk-one".into(), " sk-two ".into()], false)
            .unwrap()
            .unwrap();
        assert!(k.accepts(b"sk-one"));
        assert!(k.accepts(b"sk-two"), "trimmed when configured");
        assert!(!k.accepts(b"sk-on"));
        assert!(!k.accepts(b"sk-one "));
        assert!(!k.accepts(b""));
        assert!(ApiKeys::new(&[], false).unwrap().is_none());
        assert!(ApiKeys::new(&["".into()], false).is_err());
        assert!(ApiKeys::new(&["a b".into()], false).is_err());
        assert!(ApiKeys::new(&["x".repeat(513)], false).is_err());
        assert!(!format!("{k:?}").contains("sk-"), "no key in Debug");
    }

    async fn call(app: &axum::Router, path: &str, auth: Option<&str>) -> (u16, String) {
        let mut r = Request::get(path);
        if let Some(a) = auth {
            r = r.header(header::AUTHORIZATION, a);
        }
        let resp = app
            .clone()
            .oneshot(r.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let b = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&b).into_owned())
    }

    #[tokio::test]
    async fn the_routes_need_a_key_but_health_and_metrics_stay_open() {
        let app = axum::Router::new()
            .route("/v1/models", get(|| async { "models" }))
            .route("/health", get(|| async { "ok" }))
            .route("/metrics", get(|| async { "m" }));
        let keys = ApiKeys::new(&["k1".into(), "k2".into()], false).unwrap();
        let open = layer(app.clone(), keys);
        let (s, b) = call(&open, "/v1/models", None).await;
        assert_eq!(s, 401);
        let v: serde_json::Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["param"].is_null());
        let (s, b) = call(&open, "/v1/models", Some("Bearer nope")).await;
        assert_eq!(s, 401);
        assert!(b.contains("Incorrect API key"), "{b}");
        assert_eq!(call(&open, "/v1/models", Some("Bearer k2")).await.0, 200);
        assert_eq!(call(&open, "/v1/models", Some("bearer k1")).await.0, 200);
        assert_eq!(call(&open, "/v1/models", Some("Basic k1")).await.0, 401);
        assert_eq!(call(&open, "/health", None).await.0, 200);
        assert_eq!(call(&open, "/metrics", None).await.0, 200);
        let all = layer(app, ApiKeys::new(&["k1".into()], true).unwrap());
        assert_eq!(call(&all, "/health", None).await.0, 401);
        assert_eq!(call(&all, "/metrics", Some("Bearer k1")).await.0, 200);
    }
}
