//! The built-in web UI: server-rendered pages over view models, readable without JavaScript.
//!
//! - [`model`]: the view-model structs of every page and the [`UiDataSource`] trait the process
//!   wiring implements over the real components (store, patterns, SLO engine, degrade, agents);
//! - [`chart`]: SVG sparklines, line charts with thresholds, tier timelines, gauge bars;
//! - this file: [`router`], the Tera templates (`templates/web/*.html`, embedded at compile time),
//!   the formatting filters and the error page.
//!
//! Pages: `/` overview → `/services/{service}` → `/services/{service}/instances/{instance}` (its
//! logs) is the three-level drill-down of docs/REQUIREMENTS.md R7.3, one click per level;
//! `/hosts`, `/hosts/{host}`, `/patterns`, `/slos`, `/degradation`, `/agents` (tool breakers and
//! loop kills), `/logs` (log search) and `/traces/{trace_id}` (the waterfall; both in
//! [`traces`]), `/debug/resource` (the console
//! of R7.4). Every view is also served as JSON under `/ui/api/...` (same paths). The only script (`/static/brownout.js`)
//! polls `/ui/api/overview` to keep the tier badges live, writing text only (`textContent`).
//!
//! Escaping: Tera autoescapes every `.html` template; the only `| safe` output is SVG built by
//! [`chart`], which escapes its own text. Links to traces are rendered only for `http(s)://`
//! URLs. A strict Content-Security-Policy (no inline script) is a second fence, not the first.

pub mod chart;
pub mod live;
pub mod model;
pub mod traces;

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Json, Response};
use axum::routing::get;
use serde::Serialize;
use serde_json::Value;

pub use model::*;

use chart::{LineOpts, Severity, Threshold, YFormat};

/// The templates, embedded so the binary does not depend on its working directory.
macro_rules! templates {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../../templates/web/", $name)))),*]
    };
}
const TEMPLATES: &[(&str, &str)] = templates![
    "base.html",
    "macros.html",
    "overview.html",
    "hosts.html",
    "host.html",
    "service.html",
    "instance.html",
    "logs.html",
    "trace.html",
    "patterns.html",
    "slos.html",
    "degradation.html",
    "resource.html",
    "agents.html",
    "error.html",
];
const CSS: &str = include_str!("../../templates/web/static/brownout.css");
const JS: &str = include_str!("../../templates/web/static/brownout.js");

/// Sent with every response: no inline script, nothing from elsewhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The KV alert thresholds of docs/REQUIREMENTS.md R2.3 (P2 at 85 %, P1 at 92 %) and R2.2's VRAM
/// watermark.
const KV_WARN: f64 = 0.85;
const KV_CRIT: f64 = 0.92;
const VRAM_WARN: f64 = 0.75;
/// The TTFT SLO (docs/REQUIREMENTS.md R2.4: basic Q&A under 2 s is P0).
const TTFT_SLO_S: f64 = 2.0;

#[derive(Clone)]
struct UiState {
    source: Arc<dyn UiDataSource>,
    tera: Arc<tera::Tera>,
}

/// Builds the Tera instance with the embedded templates, filters and chart functions.
///
/// # Panics
/// If an embedded template does not parse: a build defect, caught by every web test.
pub fn templates() -> tera::Tera {
    let mut t = tera::Tera::default();
    t.add_raw_templates(TEMPLATES.iter().copied())
        .unwrap_or_else(|e| panic!("embedded web templates must parse: {e:?}"));
    t.autoescape_on(vec![".html"]);
    t.register_filter("pct", filter_pct);
    t.register_filter("num", filter_num);
    t.register_filter("secs", filter_secs);
    t.register_filter("gib", filter_gib);
    t.register_filter("clock", filter_clock);
    t.register_filter("ago", filter_ago);
    t.register_filter("http_url", filter_http_url);
    t.register_filter("path", filter_path);
    t.register_function("gauge", fn_gauge);
    t.register_function("spark", fn_spark);
    t.register_function("budget", fn_budget);
    t.register_function("burn_windows", fn_burn_windows);
    t
}

/// The UI router over `source`. Mount it at the root of the control plane's HTTP server.
pub fn router(source: Arc<dyn UiDataSource>) -> Router {
    let state = UiState {
        source,
        tera: Arc::new(templates()),
    };
    Router::new()
        .route("/", get(overview))
        .route("/hosts", get(hosts))
        .route("/hosts/{host}", get(host))
        .route("/services/{service}", get(service))
        .route("/services/{service}/instances/{instance}", get(instance))
        .route("/patterns", get(patterns))
        .route("/slos", get(slos))
        .route("/degradation", get(degradation))
        .route("/debug/resource", get(resource))
        .route("/agents", get(agents))
        .route("/logs", get(logs))
        .route("/traces/{trace_id}", get(trace))
        .route("/ui/api/logs", get(api_logs))
        .route("/ui/api/traces/{trace_id}", get(api_trace))
        .route("/ui/api/overview", get(api_overview))
        .route("/ui/api/hosts", get(api_hosts))
        .route("/ui/api/hosts/{host}", get(api_host))
        .route("/ui/api/services/{service}", get(api_service))
        .route(
            "/ui/api/services/{service}/instances/{instance}",
            get(api_instance),
        )
        .route("/ui/api/patterns", get(api_patterns))
        .route("/ui/api/slos", get(api_slos))
        .route("/ui/api/degradation", get(api_degradation))
        .route("/ui/api/resource", get(api_resource))
        .route("/ui/api/agents", get(api_agents))
        .route(
            "/static/brownout.css",
            get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS) }),
        )
        .route(
            "/static/brownout.js",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
                    JS,
                )
            }),
        )
        .fallback(not_found)
        .layer(axum::middleware::map_response(security_headers))
        .with_state(state)
}

async fn security_headers(res: Response) -> Response {
    with_security_headers(res, CSP)
}

/// Sets `csp` as the response's Content-Security-Policy, with `nosniff` and the UI's referrer
/// policy: the headers every page of the UI and of the report routes carries.
pub(crate) fn with_security_headers(mut res: Response, csp: &'static str) -> Response {
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(csp),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    res
}

// ---- errors -----------------------------------------------------------------------------------

/// Everything a page handler can fail with; renders itself as an HTML error page.
enum PageError {
    Ui(UiError),
    /// A template failed to render: a defect. Logged; the client sees a generic page.
    Render(tera::Error),
    NoRoute,
    /// A path segment that cannot be read (not UTF-8 once decoded).
    BadPath(String),
}

impl From<PathRejection> for PageError {
    fn from(r: PathRejection) -> Self {
        PageError::BadPath(r.body_text())
    }
}

impl From<UiError> for PageError {
    fn from(e: UiError) -> Self {
        PageError::Ui(e)
    }
}

impl PageError {
    fn parts(&self) -> (StatusCode, &'static str, String) {
        match self {
            PageError::Ui(e @ UiError::NotFound { .. }) => {
                (StatusCode::NOT_FOUND, "not_found", e.to_string())
            }
            PageError::Ui(UiError::Unavailable { component, .. }) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                format!("{component} is unavailable right now; try again shortly"),
            ),
            PageError::Render(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "render_failed",
                "this page could not be rendered".into(),
            ),
            PageError::NoRoute => (StatusCode::NOT_FOUND, "not_found", "no such page".into()),
            PageError::BadPath(m) => (StatusCode::BAD_REQUEST, "bad_parameter", m.clone()),
        }
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        match &self {
            PageError::Ui(UiError::Unavailable { component, detail }) => {
                tracing::warn!(component, detail, "ui data source unavailable")
            }
            PageError::Render(e) => tracing::error!(error = ?e, "ui template failed to render"),
            _ => {}
        }
        let (status, code, message) = self.parts();
        let mut ctx = tera::Context::new();
        ctx.insert("status", &status.as_u16());
        ctx.insert("code", code);
        ctx.insert("message", &message);
        ctx.insert("page", "error");
        let body = ERROR_TERA
            .render("error.html", &ctx)
            .unwrap_or_else(|_| "error".into());
        (status, Html(body)).into_response()
    }
}

static ERROR_TERA: std::sync::LazyLock<tera::Tera> = std::sync::LazyLock::new(templates);

/// The JSON twins (`/ui/api/...`) answer errors in the control plane's one contract
/// ([`crate::error::ApiError`]: `{"error": {"code", "message"}}`).
struct ApiError(UiError);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let UiError::Unavailable { component, detail } = &self.0 {
            tracing::warn!(component, detail, "ui data source unavailable");
        }
        let (status, code, message) = PageError::Ui(self.0).parts();
        crate::error::ApiError::new(status, code, message).into_response()
    }
}

/// The fallback of the merged control-plane router: JSON under the API prefixes, the HTML
/// error page elsewhere (browsers).
async fn not_found(uri: axum::http::Uri) -> Response {
    if crate::error::is_json_path(uri.path()) {
        crate::error::ApiError::no_route().into_response()
    } else {
        PageError::NoRoute.into_response()
    }
}

type Page = Result<Html<String>, PageError>;

fn render(st: &UiState, name: &str, page: &str, view: &impl Serialize, extra: Value) -> Page {
    let mut ctx = tera::Context::from_serialize(view).map_err(PageError::Render)?;
    ctx.insert("page", page);
    if let Value::Object(m) = extra {
        for (k, v) in m {
            ctx.insert(k, &v);
        }
    }
    st.tera
        .render(name, &ctx)
        .map(Html)
        .map_err(PageError::Render)
}

// ---- pages ------------------------------------------------------------------------------------

async fn overview(State(st): State<UiState>) -> Page {
    let v = st.source.overview().await?;
    render(&st, "overview.html", "overview", &v, Value::Null)
}

async fn hosts(State(st): State<UiState>) -> Page {
    let v = st.source.hosts().await?;
    render(&st, "hosts.html", "hosts", &v, Value::Null)
}

async fn host(State(st): State<UiState>, name: Result<Path<String>, PathRejection>) -> Page {
    let Path(name) = name?;
    let v = st.source.host(&name).await?;
    let vram = chart::line_chart(
        &[model::Series {
            name: "max VRAM used".into(),
            points: v.vram_series.clone(),
        }],
        &LineOpts {
            y_range: Some((0.0, 1.0)),
            y_format: YFormat::Percent,
            thresholds: vec![Threshold {
                value: VRAM_WARN,
                label: "75% watermark".into(),
                severity: Severity::Warn,
            }],
            title: "VRAM used, last hour".into(),
            width: 420,
            ..LineOpts::default()
        },
    );
    let kv = chart::line_chart(
        &v.kv_series,
        &LineOpts {
            y_range: Some((0.0, 1.0)),
            y_format: YFormat::Percent,
            thresholds: kv_thresholds(),
            title: "KV-cache usage per engine, last hour".into(),
            width: 420,
            ..LineOpts::default()
        },
    );
    let queue = chart::line_chart(
        &[model::Series {
            name: "waiting requests".into(),
            points: v.queue_series.clone(),
        }],
        &LineOpts {
            title: "Queue depth, last hour".into(),
            width: 420,
            ..LineOpts::default()
        },
    );
    render(
        &st,
        "host.html",
        "hosts",
        &v,
        serde_json::json!({"charts": {"vram": vram, "kv": kv, "queue": queue}}),
    )
}

fn kv_thresholds() -> Vec<Threshold> {
    vec![
        Threshold {
            value: KV_WARN,
            label: "85% P2".into(),
            severity: Severity::Warn,
        },
        Threshold {
            value: KV_CRIT,
            label: "92% P1".into(),
            severity: Severity::Crit,
        },
    ]
}

async fn service(State(st): State<UiState>, name: Result<Path<String>, PathRejection>) -> Page {
    let Path(name) = name?;
    let v = st.source.service(&name).await?;
    let err = chart::line_chart(
        &[model::Series {
            name: "error ratio".into(),
            points: v.service.error_trend.clone(),
        }],
        &LineOpts {
            y_format: YFormat::Percent,
            title: "Error ratio, last hour".into(),
            ..LineOpts::default()
        },
    );
    render(
        &st,
        "service.html",
        "overview",
        &v,
        serde_json::json!({"charts": {"errors": err}}),
    )
}

async fn instance(
    State(st): State<UiState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Page {
    let Path((service, inst)) = path?;
    let v = st.source.instance(&service, &inst).await?;
    let now = st.source.now_ms();
    let q = crate::store::LogQuery {
        since_ms: now.saturating_sub(24 * 3_600_000),
        until_ms: now + 60_000,
        service: Some(service.clone()),
        host: Some(v.instance.host.clone()),
        limit: traces::INSTANCE_LOG_ROWS,
        ..crate::store::LogQuery::default()
    };
    // The failures above are the page; its log records are shown when the store answers.
    let (records, records_error) = match st.source.log_search(&q).await {
        Ok(p) => (
            p.items.iter().map(traces::log_line).collect::<Vec<_>>(),
            None,
        ),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let logs_link = format!(
        "service={}&host={}&since={}",
        enc(&service),
        enc(&v.instance.host),
        q.since_ms
    );
    render(
        &st,
        "instance.html",
        "overview",
        &v,
        serde_json::json!({"records": records, "records_error": records_error, "logs_link": logs_link}),
    )
}

// ---- logs and traces (docs/DASHBOARDS.md "Logs" and "Trace waterfall") -------------------------

/// Percent-encodes a query-string value.
fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The `/logs` view of the query string `raw`: the records, or why the filters were refused.
async fn logs_view(st: &UiState, raw: Option<&str>) -> Result<traces::LogsView, UiError> {
    let now = st.source.now_ms();
    let origin = st.source.origin();
    let uri: axum::http::Uri = format!("/logs?{}", raw.unwrap_or(""))
        .parse()
        .unwrap_or_else(|_| axum::http::Uri::from_static("/logs"));
    let parsed = axum::extract::Query::<crate::api::LogParams>::try_from_uri(&uri);
    let (params, error) = match parsed {
        Ok(axum::extract::Query(p)) => (p, None),
        Err(e) => (crate::api::LogParams::default(), Some(e.body_text())),
    };
    let s = |v: &Option<String>| traces::cut(v.as_deref().unwrap_or(""), 300);
    let filters = traces::LogFilters {
        service: s(&params.service),
        host: s(&params.host),
        instance: s(&params.instance),
        severity: s(&params.severity),
        q: s(&params.q),
        since: s(&params.since),
        until: s(&params.until),
    };
    let mut view = traces::LogsView {
        origin,
        generated_at_ms: now,
        filters,
        records: Vec::new(),
        next_query: None,
        error,
    };
    if view.error.is_some() {
        return Ok(view);
    }
    let mut params = params;
    if params.limit.is_none() {
        params.limit = Some(traces::LOG_PAGE_ROWS.to_string());
    }
    let q = match crate::api::log_query(params, now) {
        Ok(q) => q,
        Err(e) => {
            view.error = Some(e.message);
            return Ok(view);
        }
    };
    let page = st.source.log_search(&q).await?;
    view.records = page.items.iter().map(traces::log_line).collect();
    if let Some(c) = page.next_cursor {
        let f = &view.filters;
        let mut qs: Vec<String> = [
            ("service", &f.service),
            ("host", &f.host),
            ("instance", &f.instance),
            ("severity", &f.severity),
            ("q", &f.q),
            ("since", &f.since),
            ("until", &f.until),
        ]
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}", enc(v)))
        .collect();
        qs.push(format!("limit={}", q.page_size()));
        qs.push(format!("cursor={}", enc(&c)));
        view.next_query = Some(qs.join("&"));
    }
    Ok(view)
}

async fn logs(State(st): State<UiState>, uri: axum::http::Uri) -> Page {
    let v = logs_view(&st, uri.query()).await?;
    render(&st, "logs.html", "logs", &v, Value::Null)
}

async fn api_logs(
    State(st): State<UiState>,
    uri: axum::http::Uri,
) -> Result<Json<traces::LogsView>, ApiError> {
    logs_view(&st, uri.query())
        .await
        .map(Json)
        .map_err(ApiError)
}

async fn trace_view(st: &UiState, trace_id: &str) -> Result<traces::TraceView, UiError> {
    if !traces::is_trace_id(trace_id) {
        return Err(UiError::not_found("trace", traces::cut(trace_id, 64)));
    }
    let id = trace_id.to_ascii_lowercase();
    let spans = st.source.trace_spans(&id).await?;
    if spans.is_empty() {
        return Err(UiError::not_found("trace", id));
    }
    Ok(traces::waterfall(
        st.source.origin(),
        st.source.now_ms(),
        &id,
        &spans,
        st.source.trace_url(&id),
    ))
}

async fn trace(State(st): State<UiState>, id: Result<Path<String>, PathRejection>) -> Page {
    let Path(id) = id?;
    let v = trace_view(&st, &id).await?;
    let svg = traces::waterfall_svg(&v);
    render(
        &st,
        "trace.html",
        "logs",
        &v,
        serde_json::json!({"waterfall": svg}),
    )
}

async fn api_trace(
    State(st): State<UiState>,
    crate::error::Path(id): crate::error::Path<String>,
) -> Result<Json<traces::TraceView>, ApiError> {
    trace_view(&st, &id).await.map(Json).map_err(ApiError)
}

async fn patterns(State(st): State<UiState>) -> Page {
    let v = st.source.patterns().await?;
    render(&st, "patterns.html", "patterns", &v, Value::Null)
}

async fn slos(State(st): State<UiState>) -> Page {
    let v = st.source.slos().await?;
    let charts: Vec<chart::Svg> = v
        .slos
        .iter()
        .map(|s| {
            chart::line_chart(
                &[model::Series {
                    name: "budget remaining".into(),
                    points: s.budget_series.clone(),
                }],
                &LineOpts {
                    y_range: Some((
                        s.budget_series.iter().map(|p| p.value).fold(0.0, f64::min),
                        1.0,
                    )),
                    y_format: YFormat::Percent,
                    thresholds: vec![
                        Threshold {
                            value: 0.25,
                            label: "25% left".into(),
                            severity: Severity::Warn,
                        },
                        Threshold {
                            value: 0.0,
                            label: "budget spent".into(),
                            severity: Severity::Crit,
                        },
                    ],
                    title: format!(
                        "{}: error budget burn-down over {}",
                        s.summary.name, s.period
                    ),
                    ..LineOpts::default()
                },
            )
        })
        .collect();
    render(
        &st,
        "slos.html",
        "slos",
        &v,
        serde_json::json!({"charts": charts}),
    )
}

async fn degradation(State(st): State<UiState>) -> Page {
    let v = st.source.degradation().await?;
    let charts: Vec<chart::Svg> = v
        .clusters
        .iter()
        .map(|c| chart::tier_timeline(&c.timeline, c.window_start_ms, c.window_end_ms, 900))
        .collect();
    render(
        &st,
        "degradation.html",
        "degradation",
        &v,
        serde_json::json!({"charts": charts}),
    )
}

async fn resource(State(st): State<UiState>) -> Page {
    let v = st.source.resource().await?;
    render(
        &st,
        "resource.html",
        "resource",
        &v,
        serde_json::json!({"ttft_slo_s": TTFT_SLO_S}),
    )
}

async fn agents(State(st): State<UiState>) -> Page {
    let v = st.source.agents().await?;
    render(&st, "agents.html", "agents", &v, Value::Null)
}

// ---- JSON -------------------------------------------------------------------------------------

async fn api_agents(State(st): State<UiState>) -> Result<Json<AgentsView>, ApiError> {
    st.source.agents().await.map(Json).map_err(ApiError)
}

async fn api_overview(State(st): State<UiState>) -> Result<Json<OverviewView>, ApiError> {
    st.source.overview().await.map(Json).map_err(ApiError)
}
async fn api_hosts(State(st): State<UiState>) -> Result<Json<HostsView>, ApiError> {
    st.source.hosts().await.map(Json).map_err(ApiError)
}
async fn api_host(
    State(st): State<UiState>,
    crate::error::Path(host): crate::error::Path<String>,
) -> Result<Json<HostDetailView>, ApiError> {
    st.source.host(&host).await.map(Json).map_err(ApiError)
}
async fn api_service(
    State(st): State<UiState>,
    crate::error::Path(service): crate::error::Path<String>,
) -> Result<Json<ServiceView>, ApiError> {
    st.source
        .service(&service)
        .await
        .map(Json)
        .map_err(ApiError)
}
async fn api_instance(
    State(st): State<UiState>,
    crate::error::Path((service, instance)): crate::error::Path<(String, String)>,
) -> Result<Json<InstanceView>, ApiError> {
    st.source
        .instance(&service, &instance)
        .await
        .map(Json)
        .map_err(ApiError)
}
async fn api_patterns(State(st): State<UiState>) -> Result<Json<PatternsView>, ApiError> {
    st.source.patterns().await.map(Json).map_err(ApiError)
}
async fn api_slos(State(st): State<UiState>) -> Result<Json<SloView>, ApiError> {
    st.source.slos().await.map(Json).map_err(ApiError)
}
async fn api_degradation(State(st): State<UiState>) -> Result<Json<DegradationView>, ApiError> {
    st.source.degradation().await.map(Json).map_err(ApiError)
}
async fn api_resource(State(st): State<UiState>) -> Result<Json<ResourceView>, ApiError> {
    st.source.resource().await.map(Json).map_err(ApiError)
}

// ---- filters and functions --------------------------------------------------------------------

fn num_arg(args: &HashMap<String, Value>, key: &str, default: f64) -> f64 {
    args.get(key).and_then(Value::as_f64).unwrap_or(default)
}

fn as_f64(v: &Value, filter: &str) -> tera::Result<f64> {
    v.as_f64()
        .ok_or_else(|| tera::Error::msg(format!("filter {filter} expects a number, got {v}")))
}

/// `0.853 | pct` → `85.3%` (`digits`, default 1).
fn filter_pct(v: &Value, args: &HashMap<String, Value>) -> tera::Result<Value> {
    let x = as_f64(v, "pct")?;
    let d = num_arg(args, "digits", 1.0) as usize;
    Ok(Value::String(format!("{:.*}%", d, x * 100.0)))
}

/// `12.345 | num` → `12.3` (`digits`, default 1).
fn filter_num(v: &Value, args: &HashMap<String, Value>) -> tera::Result<Value> {
    let x = as_f64(v, "num")?;
    let d = num_arg(args, "digits", 1.0) as usize;
    Ok(Value::String(format!("{x:.d$}")))
}

/// Seconds as `340 ms` or `2.70 s`.
fn filter_secs(v: &Value, _: &HashMap<String, Value>) -> tera::Result<Value> {
    Ok(Value::String(YFormat::Seconds.fmt(as_f64(v, "secs")?)))
}

/// Bytes as GiB with one decimal.
fn filter_gib(v: &Value, _: &HashMap<String, Value>) -> tera::Result<Value> {
    Ok(Value::String(format!(
        "{:.1} GiB",
        as_f64(v, "gib")? / f64::from(1u32 << 30)
    )))
}

/// Unix ms as `HH:MM:SS` UTC.
fn filter_clock(v: &Value, _: &HashMap<String, Value>) -> tera::Result<Value> {
    let ms = v
        .as_i64()
        .ok_or_else(|| tera::Error::msg("filter clock expects unix ms"))?;
    Ok(Value::String(
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|t| t.format("%H:%M:%S").to_string())
            .unwrap_or_default(),
    ))
}

/// Unix ms relative to `now` (unix ms): `42 s ago`, `7 min ago`, `3 h ago`, `2 d ago`.
fn filter_ago(v: &Value, args: &HashMap<String, Value>) -> tera::Result<Value> {
    let t = v
        .as_f64()
        .ok_or_else(|| tera::Error::msg("filter ago expects unix ms"))?;
    let now = num_arg(args, "now", t);
    let s = ((now - t) / 1000.0).max(0.0);
    let text = if s < 90.0 {
        format!("{s:.0} s ago")
    } else if s < 90.0 * 60.0 {
        format!("{:.0} min ago", s / 60.0)
    } else if s < 36.0 * 3600.0 {
        format!("{:.0} h ago", s / 3600.0)
    } else {
        format!("{:.0} d ago", s / 86_400.0)
    };
    Ok(Value::String(text))
}

/// Percent-encodes one path segment: everything but RFC 3986 unreserved characters, so a name
/// with `/`, `?`, `#` or quotes stays one segment and one attribute value.
fn filter_path(v: &Value, _: &HashMap<String, Value>) -> tera::Result<Value> {
    let s = v
        .as_str()
        .ok_or_else(|| tera::Error::msg("filter path expects a string"))?;
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    Ok(Value::String(out))
}

/// The URL if it is `http://` or `https://`, else the empty string (no `javascript:` links).
fn filter_http_url(v: &Value, _: &HashMap<String, Value>) -> tera::Result<Value> {
    let s = v.as_str().unwrap_or("").trim();
    let lower = s.to_ascii_lowercase();
    let ok = (lower.starts_with("http://") || lower.starts_with("https://"))
        && !s.chars().any(|c| c.is_control() || c.is_whitespace());
    Ok(Value::String(if ok {
        s.to_string()
    } else {
        String::new()
    }))
}

/// `gauge(ratio=, warn=, crit=, label=, text=)`: a [`chart::gauge_bar`] (its label is escaped there).
fn fn_gauge(args: &HashMap<String, Value>) -> tera::Result<Value> {
    let ratio = num_arg(args, "ratio", f64::NAN);
    let label = args.get("label").and_then(Value::as_str).unwrap_or("");
    let text = args.get("text").and_then(Value::as_str);
    let svg = chart::gauge_bar(
        ratio,
        num_arg(args, "warn", 0.8),
        num_arg(args, "crit", 0.9),
        label,
        text,
    );
    Ok(Value::String(svg.as_str().to_string()))
}

/// `budget(remaining=, text=)`: a [`chart::budget_bar`] (filled by the budget left).
fn fn_budget(args: &HashMap<String, Value>) -> tera::Result<Value> {
    let remaining = num_arg(args, "remaining", f64::NAN);
    let text = args.get("text").and_then(Value::as_str).unwrap_or("");
    Ok(Value::String(
        chart::budget_bar(remaining, text).as_str().to_string(),
    ))
}

/// `burn_windows(slos=)`: the union of the burn-rate windows of the SLO summaries, shortest
/// first ([`chart::window_union`]): the overview's columns, so an SLO with other windows than the
/// first still lines up (blank cells where it lacks one).
fn fn_burn_windows(args: &HashMap<String, Value>) -> tera::Result<Value> {
    let slos = args.get("slos").and_then(Value::as_array);
    let names = slos
        .into_iter()
        .flatten()
        .filter_map(|s| s.get("burn_rates").and_then(Value::as_array))
        .flatten()
        .filter_map(|b| b.get("window").and_then(Value::as_str));
    Ok(Value::from(chart::window_union(names)))
}

/// `spark(points=, width=, height=)`: a [`chart::sparkline`] of `[{ts_ms, value}]`.
fn fn_spark(args: &HashMap<String, Value>) -> tera::Result<Value> {
    let points: Vec<Point> = match args.get("points") {
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| tera::Error::msg(format!("spark points: {e}")))?,
        None => Vec::new(),
    };
    let svg = chart::sparkline(
        &points,
        num_arg(args, "width", 120.0) as u32,
        num_arg(args, "height", 28.0) as u32,
    );
    Ok(Value::String(svg.as_str().to_string()))
}

/// The Agents page (the web knows the agents' view; the agents know nothing of the web).
#[cfg(test)]
mod agents_page_tests {
    use super::templates;
    use crate::agents::tests::{T0, export, guards, kv, s, tool_span};
    use crate::agents::{AgentsView, breakers, loops};

    #[test]
    fn the_agents_page_escapes_hostile_names_and_lists_are_bounded() {
        let g =
            guards("loops: { window: 1, repeats: 2 }\nbreakers: { min_calls: 1, max_tools: 16 }");
        let evil = r#"<script>alert("x")</script><img src=x onerror=alert(1)>"#;
        for i in 0..300u64 {
            let conv = format!("{evil}{i}");
            let span = tool_span(
                (i % 200 + 1) as u8,
                1,
                vec![
                    kv("gen_ai.tool.name", s(&format!("{evil}{}", i % 40))),
                    kv("gen_ai.conversation.id", s(&conv)),
                ],
                true,
                1,
            );
            g.observe_at(&export(vec![span.clone(), span]), T0 + i * 40_000);
        }
        let v = g.view(T0 + 300 * 40_000);
        assert!(v.loop_kills.len() <= loops::KILLS_KEPT);
        assert!(v.transitions.len() <= breakers::TRANSITIONS_KEPT);
        assert!(v.breakers.len() <= 16);
        let mut ctx = tera::Context::from_serialize(&v).unwrap();
        ctx.insert("page", "agents");
        let html = templates().render("agents.html", &ctx).unwrap();
        assert!(!html.contains("<script>alert"), "raw markup in the page");
        assert!(!html.contains("<img src=x"), "raw markup in the page");
        assert!(
            html.contains("&lt;script&gt;alert"),
            "names are shown, escaped"
        );
        assert!(html.contains("Tool breakers"));
        // An empty view (no guards in this process) renders too.
        let mut ctx = tera::Context::from_serialize(AgentsView::default()).unwrap();
        ctx.insert("page", "agents");
        let html = templates().render("agents.html", &ctx).unwrap();
        assert!(html.contains("Agent guards are not running"));
    }
}
