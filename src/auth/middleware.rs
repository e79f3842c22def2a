//! The axum layers that put routes behind the tokens.
//!
//! | layer | role |
//! |---|---|
//! | [`require`] with a [`Guard`] | one role, bearer header (the query API) |
//! | [`require_ui`], [`protect_ui`] | read, from the bearer header or the `brownout_token` cookie set by `/login` (the web UI, `/reports`, the read APIs browsers open) |
//! | [`require_degrade_role`] | ingest for `/v1/alertmanager`, read for `GET`, admin for the rest (overrides) |

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{Role, Tokens};

/// State for [`require`]: which role, and the tokens.
#[derive(Clone)]
pub struct Guard {
    pub role: Role,
    pub tokens: Arc<Tokens>,
}

/// axum middleware: `router.route_layer(axum::middleware::from_fn_with_state(Guard{..}, require))`.
pub async fn require(State(g): State<Guard>, req: Request, next: Next) -> Response {
    match g.tokens.check(g.role, req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// The degradation routes need different roles: the Alertmanager webhook is ingest, reading the
/// state is read, everything else (overrides) is admin.
pub async fn require_degrade_role(
    State(tokens): State<Arc<Tokens>>,
    req: Request,
    next: Next,
) -> Response {
    let role = if req.uri().path() == "/v1/alertmanager" {
        Role::Ingest
    } else if req.method() == axum::http::Method::GET {
        Role::Read
    } else {
        Role::Admin
    };
    match tokens.check(role, req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// The cookie that carries the read token for browsers.
const UI_COOKIE: &str = "brownout_token";

/// Puts the web UI behind the read token. Browsers log in once at `/login?token=…`, which sets
/// an HttpOnly, SameSite=Strict cookie; API clients may send the bearer header instead.
pub fn protect_ui(ui: Router, tokens: Arc<Tokens>) -> Router {
    let login = Router::new()
        .route("/login", axum::routing::get(ui_login))
        .with_state(tokens.clone());
    ui.route_layer(axum::middleware::from_fn_with_state(tokens, require_ui))
        .merge(login)
}

fn cookie_token(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == UI_COOKIE)
        .map(|(_, v)| v.to_string())
}

/// axum middleware: the read token from the bearer header or the login cookie. JSON clients
/// (`/api/...`) get the JSON 401; browsers get a page that says how to sign in.
pub async fn require_ui(State(tokens): State<Arc<Tokens>>, req: Request, next: Next) -> Response {
    let ok = cookie_token(req.headers()).is_some_and(|t| tokens.allows(Role::Read, &t))
        || tokens.check(Role::Read, req.headers()).is_ok();
    if ok {
        return next.run(req).await;
    }
    if crate::error::is_json_path(req.uri().path()) {
        // JSON clients get the JSON 401 that says what was missing.
        if let Err(e) = tokens.check(Role::Read, req.headers()) {
            return e.into_response();
        }
    }
    (
        StatusCode::UNAUTHORIZED,
        axum::response::Html(
            "<!doctype html><title>brownout: sign in</title><h1>Sign in</h1>\
             <p>Open <code>/login?token=&lt;read token&gt;</code> once (the token is printed by \
             <code>brownout-demo demo</code>, or set with BROWNOUT_READ_TOKEN).</p>",
        ),
    )
        .into_response()
}

#[derive(serde::Deserialize)]
struct LoginQuery {
    token: String,
}

async fn ui_login(
    State(tokens): State<Arc<Tokens>>,
    q: Result<axum::extract::Query<LoginQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(axum::extract::Query(q)) = q else {
        return crate::error::ApiError::bad_request(
            "bad_parameter",
            "use /login?token=<read token>",
        )
        .into_response();
    };
    let valid = !q.token.is_empty()
        && q.token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && tokens.allows(Role::Read, &q.token);
    if !valid {
        return crate::error::ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "that token is not a read or admin token",
        )
        .into_response();
    }
    (
        StatusCode::SEE_OTHER,
        [
            (
                axum::http::header::SET_COOKIE,
                format!("{UI_COOKIE}={}; Path=/; HttpOnly; SameSite=Strict", q.token),
            ),
            (axum::http::header::LOCATION, "/".to_string()),
        ],
    )
        .into_response()
}
