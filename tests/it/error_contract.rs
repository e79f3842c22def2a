//! The one HTTP error contract (`src/error.rs`), walked over every router of a composed plane on
//! real sockets: the query API, ingest (8080 and 4318), patterns, SLOs, reports, degradation,
//! the UI's JSON twins, the login, unknown routes and wrong methods. Every 4xx answers
//! `{"error": {"code": <string>, "message": <string>}}` as `application/json`, and nothing else
//! at the top level (`POST /v1/failures` adds its per-line report next to `error`, as
//! documented). The OTLP receivers answer OTLP's `Status` instead, as the OTLP/HTTP
//! specification asks: checked here too, so the exception stays deliberate.

use std::time::Duration;

use brownout::auth::Tokens;
use brownout::config::{Config, Secret};
use brownout::degrade::{InProcBus, Transport};
use brownout::plane::{App, Listeners, Plane, PlaneOptions};
use serde_json::Value as J;

const INGEST: &str = "ingest-token-errors-aaaa";
const READ: &str = "read-token-errors-bbbbbbb";
const ADMIN: &str = "admin-token-errors-ccccc";

async fn plane(dir: &std::path::Path) -> Plane {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut config = Config::defaults();
    config.data_dir = dir.to_path_buf();
    config.ingest.batch_max_delay = Duration::from_millis(20);
    let tokens = Tokens::new(
        Some(Secret::new(INGEST)),
        Some(Secret::new(READ)),
        Some(Secret::new(ADMIN)),
    );
    let app = App::build(config, tokens).await.unwrap();
    let opts = PlaneOptions::defaults(
        "errors",
        b"error-contract-key-0123456789",
        Transport::InProc(InProcBus::new()),
    )
    .unwrap();
    Plane::start(app, Listeners::loopback().await.unwrap(), opts)
        .await
        .unwrap()
}

/// One request: method, base (`h`: 8080, `o`: 4318), path, token, extra header, body, and the
/// status it must get.
struct Case {
    method: &'static str,
    base: char,
    path: &'static str,
    token: Option<&'static str>,
    header: Option<(&'static str, &'static str)>,
    body: &'static str,
    status: u16,
}

const fn case(
    method: &'static str,
    base: char,
    path: &'static str,
    token: Option<&'static str>,
    body: &'static str,
    status: u16,
) -> Case {
    Case {
        method,
        base,
        path,
        token,
        header: None,
        body,
        status,
    }
}

const CASES: &[Case] = &[
    // Query API.
    case("GET", 'h', "/api/v1/hosts", None, "", 401),
    case("GET", 'h', "/api/v1/traces/xyz", Some(READ), "", 400),
    case(
        "GET",
        'h',
        "/api/v1/traces/0123456789abcdef0123456789abcdef",
        Some(READ),
        "",
        404,
    ),
    case(
        "GET",
        'h',
        "/api/v1/failures?since=yesterday",
        Some(READ),
        "",
        400,
    ),
    case("GET", 'h', "/api/v1/failures?bogus=1", Some(READ), "", 400),
    case("GET", 'h', "/api/v1/logs", None, "", 401),
    case(
        "GET",
        'h',
        "/api/v1/logs?severity=loud",
        Some(READ),
        "",
        400,
    ),
    case("GET", 'h', "/api/v1/logs?bogus=1", Some(READ), "", 400),
    case("DELETE", 'h', "/api/v1/hosts", Some(READ), "", 405),
    // Ingest, on both listeners.
    case("POST", 'h', "/v1/failures", None, "{}", 401),
    case("POST", 'o', "/v1/failures", Some(READ), "{}", 401),
    case("POST", 'h', "/v1/failures", Some(INGEST), "not json\n", 400),
    case("POST", 'o', "/v1/agents/snapshot", Some(INGEST), "{}", 400),
    Case {
        header: Some(("x-brownout-tenant", "no spaces allowed")),
        ..case("POST", 'h', "/v1/failures", Some(INGEST), "{}", 400)
    },
    Case {
        header: Some(("content-encoding", "br")),
        ..case("POST", 'o', "/v1/failures", Some(INGEST), "{}", 415)
    },
    case("GET", 'o', "/v1/failures", Some(INGEST), "", 405),
    case("GET", 'o', "/nope", Some(INGEST), "", 404),
    // Patterns, SLOs, reports.
    case("GET", 'h', "/api/v1/patterns", None, "", 401),
    case(
        "GET",
        'h',
        "/api/v1/patterns?since=yesterday",
        Some(READ),
        "",
        400,
    ),
    case("GET", 'h', "/api/v1/patterns?limit=0", Some(READ), "", 400),
    case("GET", 'h', "/api/v1/slos/nope", Some(READ), "", 404),
    case("GET", 'h', "/reports/2026-W99", Some(READ), "", 400),
    case(
        "GET",
        'h',
        "/reports/current?format=pdf",
        Some(READ),
        "",
        400,
    ),
    // Degradation.
    case("GET", 'h', "/api/v1/degrade", None, "", 401),
    case(
        "POST",
        'h',
        "/api/v1/degrade/override",
        Some(READ),
        r#"{"tier":1,"duration_secs":60,"reason":"x"}"#,
        401,
    ),
    case(
        "POST",
        'h',
        "/api/v1/degrade/override",
        Some(ADMIN),
        "not json",
        400,
    ),
    case(
        "POST",
        'h',
        "/api/v1/degrade/override",
        Some(ADMIN),
        r#"{"tier":9,"duration_secs":60,"reason":"x"}"#,
        400,
    ),
    case(
        "POST",
        'h',
        "/v1/alertmanager",
        Some(INGEST),
        r#"{"version":"3","alerts":[]}"#,
        400,
    ),
    case("PUT", 'h', "/api/v1/degrade", Some(ADMIN), "{}", 405),
    // The UI's JSON twins and the login.
    case("GET", 'h', "/ui/api/hosts/nope", Some(READ), "", 404),
    case("GET", 'h', "/ui/api/services/nope", Some(READ), "", 404),
    case(
        "GET",
        'h',
        "/ui/api/services/a/instances/b",
        Some(READ),
        "",
        404,
    ),
    case("GET", 'h', "/ui/api/overview", None, "", 401),
    case("GET", 'h', "/login", None, "", 400),
    case("GET", 'h', "/login?token=not-a-token", None, "", 401),
    // Unknown routes under the API prefixes.
    case("GET", 'h', "/api/v1/nope", Some(READ), "", 404),
    case("GET", 'h', "/v1/nope", Some(INGEST), "", 404),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_router_answers_4xx_in_the_one_json_shape() {
    let dir = tempfile::tempdir().unwrap();
    let plane = plane(dir.path()).await;
    let http = format!("http://{}", plane.running.http_addr);
    let otlp = format!("http://{}", plane.running.otlp_http_addr);
    let c = reqwest::Client::new();
    let mut failures = Vec::new();
    for k in CASES {
        let base = if k.base == 'h' { &http } else { &otlp };
        let mut r = c
            .request(k.method.parse().unwrap(), format!("{base}{}", k.path))
            .header("content-type", "application/json")
            .body(k.body);
        if let Some(t) = k.token {
            r = r.bearer_auth(t);
        }
        if let Some((n, v)) = k.header {
            r = r.header(n, v);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        let ct = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = resp.text().await.unwrap();
        let what = format!("{} {}{} -> {status} {ct} {body}", k.method, k.base, k.path);
        if status != k.status {
            failures.push(format!("want {}: {what}", k.status));
            continue;
        }
        if !ct.starts_with("application/json") {
            failures.push(format!("not JSON: {what}"));
            continue;
        }
        let v: J = match serde_json::from_str(&body) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("unparsable ({e}): {what}"));
                continue;
            }
        };
        let shaped = v["error"]["code"].as_str().is_some_and(|s| !s.is_empty())
            && v["error"]["message"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
            && v["error"].as_object().is_some_and(|o| o.len() == 2);
        let extra_ok = v.as_object().is_some_and(|o| {
            o.len() == 1
                || (k.path == "/v1/failures"
                    && o.keys()
                        .all(|k| ["error", "accepted", "rejected", "errors"].contains(&k.as_str())))
        });
        if !shaped || !extra_ok {
            failures.push(format!("wrong shape: {what}"));
        }
    }
    // The OTLP receivers answer OTLP's Status (`{"code": <int>, "message": …}` in JSON).
    let r = c
        .post(format!("{otlp}/v1/traces"))
        .bearer_auth(INGEST)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: J = r.json().await.unwrap();
    assert!(
        v["code"].is_i64() && v["message"].is_string(),
        "OTLP Status: {v}"
    );
    plane.stop().await.unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The control plane keeps its own `ApiError`, and the gpu-agent answers with the protocol's
/// `ErrorBody`: both must write the same bytes, so one client parser reads either.
#[tokio::test]
async fn the_error_body_is_the_protocols_error_body_byte_for_byte() {
    use axum::response::IntoResponse as _;
    use brownout::error::ApiError;
    use brownout_protocol::ErrorBody;
    for e in [
        ApiError::no_route(),
        ApiError::method_not_allowed(),
        ApiError::bad_request("bad_parameter", "since=\"yesterday\" is not a time \\ ü"),
        ApiError::unavailable("store_unavailable", "the store cannot answer right now", 5),
    ] {
        let want = ErrorBody::new(e.code, e.message.clone()).to_json();
        let r = e.clone().into_response();
        assert_eq!(r.status(), e.status);
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        assert_eq!(std::str::from_utf8(&body).unwrap(), want, "{e}");
        let back: ErrorBody = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (back.error.code.as_str(), back.error.message),
            (e.code, e.message)
        );
    }
}
