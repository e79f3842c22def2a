//! The web UI router in memory (`tower::ServiceExt::oneshot`): every page answers 200 with its key
//! content, the drill-down links lead one level down each, unknown names are 404 pages, the JSON
//! endpoints parse, and security headers are set.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use brownout::web::{self, UiDataSource, UiError};
use brownout_test_support::ui::SampleDataSource;
use futures::future::{BoxFuture, FutureExt};
use http_body_util::BodyExt;
use tower::ServiceExt;

const NOW_MS: u64 = 1_764_460_800_000; // 2025-11-30 00:00 UTC

fn demo() -> Arc<SampleDataSource> {
    Arc::new(SampleDataSource::new(NOW_MS))
}

async fn get(
    source: Arc<dyn UiDataSource>,
    uri: &str,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let res = web::router(source)
        .oneshot(Request::get(uri).body(Body::empty()).expect("request"))
        .await
        .expect("router is infallible");
    let status = res.status();
    let headers = res.headers().clone();
    let body = res.into_body().collect().await.expect("body").to_bytes();
    (
        status,
        headers,
        String::from_utf8(body.to_vec()).expect("utf-8 page"),
    )
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[tokio::test]
async fn every_page_renders_with_its_key_content() {
    let d = demo();
    let cases: &[(&str, &[&str])] = &[
        (
            "/",
            &[
                "Overview",
                "prod-cn-east",
                "T2",
                "slo_burn",
                "chat-availability",
                "gpu-a100-01",
                "chat-gateway",
                "AgentExecutionFailed",
                "SAMPLE DATA",
            ],
        ),
        (
            "/hosts",
            &[
                "GPU hosts",
                "gpu-h100-03",
                "NVIDIA A100-SXM4-80GB",
                "engine-0",
                "internal frag.",
                "stale",
                "down",
            ],
        ),
        (
            "/hosts/gpu-a100-01",
            &[
                "gpu-a100-01",
                "VRAM used",
                "75% watermark",
                "85% P2",
                "92% P1",
                "KV-cache usage",
                "Queue depth",
                "/services/",
            ],
        ),
        (
            "/services/chat-gateway",
            &[
                "chat-gateway",
                "Golden signals",
                "Instances",
                "/services/chat-gateway/instances/",
            ],
        ),
        (
            "/patterns",
            &[
                "Failure patterns",
                "Tool Execution Timeout",
                "NEW",
                "jaeger.internal:16686",
                "rel=\"noopener noreferrer\"",
                "timeout_resource",
            ],
        ),
        (
            "/slos",
            &[
                "SLOs and error budgets",
                "chat-ttft-p99",
                "burn-down",
                "Alert history",
                "14.4×",
                "PAGE",
            ],
        ),
        (
            "/degradation",
            &[
                "Degradation",
                "prod-us-west",
                "tier timeline",
                "Acks per instance",
                "NACK",
                "lagging",
                "bad signature",
            ],
        ),
        (
            "/debug/resource",
            &[
                "/debug/resource",
                "model load",
                "warm-up",
                "ext. frag.",
                "int. frag.",
                "llama-3-70b-instruct",
            ],
        ),
    ];
    for (uri, needles) in cases {
        let (status, headers, body) = get(d.clone(), uri).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
        assert!(
            headers[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/html"),
            "{uri}"
        );
        for n in *needles {
            assert!(body.contains(n), "{uri} lacks {n:?}");
        }
        assert!(!body.contains("<script>"), "{uri}: no inline script");
    }
}

#[tokio::test]
async fn drill_down_is_one_click_per_level() {
    let d = demo();
    // Level 1: the overview links each service.
    let (_, _, overview) = get(d.clone(), "/").await;
    let (service, instance) = d
        .instance_names()
        .into_iter()
        .next()
        .expect("sample has instances");
    let service_href = format!("href=\"/services/{}\"", enc(&service));
    assert!(
        overview.contains(&service_href),
        "overview links {service_href}"
    );
    // Level 2: the service page links each of its instances.
    let (status, _, svc) = get(d.clone(), &format!("/services/{}", enc(&service))).await;
    assert_eq!(status, StatusCode::OK);
    let inst_path = format!("/services/{}/instances/{}", enc(&service), enc(&instance));
    assert!(
        svc.contains(&format!("href=\"{inst_path}\"")),
        "service page links {inst_path}"
    );
    // Level 3: the instance page shows its logs: failures and log records.
    let (status, _, inst) = get(d.clone(), &inst_path).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        inst.contains("Recent failures")
            && inst.contains("Log records")
            && inst.contains("req-")
            && inst.contains("kv_cache_exhausted"),
        "{inst}"
    );
}

#[tokio::test]
async fn unknown_names_are_404_pages_not_500() {
    let d = demo();
    for uri in [
        "/hosts/no-such-host",
        "/services/nope",
        "/services/chat-gateway/instances/nope",
        "/nowhere",
        "/hosts/%F0%9F%92%A9",
    ] {
        let (status, _, body) = get(d.clone(), uri).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{uri}");
        assert!(
            body.contains("404") && body.contains("Back to the overview"),
            "{uri}: {body}"
        );
    }
}

/// A source whose components are down.
struct Unavailable;

fn down<'a, T: Send + 'a>() -> BoxFuture<'a, Result<T, UiError>> {
    futures::future::ready(Err(UiError::Unavailable {
        component: "store",
        detail: "connection refused 10.0.0.7:8123".into(),
    }))
    .boxed()
}

impl UiDataSource for Unavailable {
    fn overview(&self) -> BoxFuture<'_, Result<web::OverviewView, UiError>> {
        down()
    }
    fn hosts(&self) -> BoxFuture<'_, Result<web::HostsView, UiError>> {
        down()
    }
    fn host<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<web::HostDetailView, UiError>> {
        down()
    }
    fn service<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<web::ServiceView, UiError>> {
        down()
    }
    fn instance<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<web::InstanceView, UiError>> {
        down()
    }
    fn patterns(&self) -> BoxFuture<'_, Result<web::PatternsView, UiError>> {
        down()
    }
    fn slos(&self) -> BoxFuture<'_, Result<web::SloView, UiError>> {
        down()
    }
    fn degradation(&self) -> BoxFuture<'_, Result<web::DegradationView, UiError>> {
        down()
    }
    fn resource(&self) -> BoxFuture<'_, Result<web::ResourceView, UiError>> {
        down()
    }
}

#[tokio::test]
async fn unavailable_source_is_503_without_internal_detail() {
    for uri in ["/", "/hosts", "/slos", "/ui/api/overview"] {
        let (status, _, body) = get(Arc::new(Unavailable), uri).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{uri}");
        assert!(body.contains("store is unavailable"), "{uri}: {body}");
        assert!(!body.contains("10.0.0.7"), "{uri}: internal detail leaked");
    }
}

#[tokio::test]
async fn json_endpoints_serve_the_views() {
    let d = demo();
    for uri in [
        "/ui/api/overview",
        "/ui/api/hosts",
        "/ui/api/patterns",
        "/ui/api/slos",
        "/ui/api/degradation",
        "/ui/api/resource",
    ] {
        let (status, headers, body) = get(d.clone(), uri).await;
        assert_eq!(status, StatusCode::OK, "{uri}");
        assert_eq!(headers[header::CONTENT_TYPE], "application/json", "{uri}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("valid JSON");
        assert_eq!(v["origin"], "sample", "{uri}");
    }
    for uri in [
        "/ui/api/hosts/gpu-a100-01",
        "/ui/api/services/chat-gateway",
        "/ui/api/services/chat-gateway/instances/chat-gateway-7f9c-0",
    ] {
        let (status, _, body) = get(d.clone(), uri).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("valid JSON");
        assert_eq!(v["origin"], "sample", "{uri}");
    }
    let (status, _, body) = get(d.clone(), "/ui/api/hosts/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON error");
    assert_eq!(v["error"]["code"], "not_found");
    let (_, _, body) = get(d, "/ui/api/overview").await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["clusters"][0]["tier"], 2, "tiers are numbers on the wire");
    assert_eq!(v["hosts"][4]["state"], "down");
}

#[tokio::test]
async fn static_assets_and_security_headers() {
    let d = demo();
    let (status, headers, css) = get(d.clone(), "/static/brownout.css").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/css")
    );
    assert!(css.contains(".tier-badge"));
    let (status, headers, js) = get(d.clone(), "/static/brownout.js").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/javascript")
    );
    assert!(
        js.contains("/ui/api/overview") && !js.contains("innerHTML"),
        "live updates write text only"
    );
    let (_, headers, _) = get(d, "/").await;
    let csp = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
}

#[tokio::test]
async fn non_http_trace_links_are_shown_as_text() {
    let vocab = brownout_test_support::ui::Vocabulary {
        trace_url_prefix: "javascript:alert(1)//".into(),
        ..brownout_test_support::ui::Vocabulary::default()
    };
    let d = Arc::new(SampleDataSource::with_vocabulary(NOW_MS, vocab));
    let (status, _, body) = get(d, "/patterns").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !body.contains("javascript:"),
        "no javascript: URL anywhere in the page"
    );
    // The trace is still linked: to the built-in waterfall.
    assert!(
        body.contains("<a href=\"/traces/0af7651916cd43dd8448eb211c80319c\">trace "),
        "the trace id is still shown and linked to /traces/: {body}"
    );
}

/// A live source before anything has reported: every list empty.
struct Empty;

fn ok<'a, T: Send + 'a>(v: T) -> BoxFuture<'a, Result<T, UiError>> {
    futures::future::ready(Ok(v)).boxed()
}

impl UiDataSource for Empty {
    fn overview(&self) -> BoxFuture<'_, Result<web::OverviewView, UiError>> {
        ok(web::OverviewView {
            origin: web::DataOrigin::Live,
            generated_at_ms: NOW_MS,
            clusters: vec![],
            slos: vec![],
            hosts: vec![],
            services: vec![],
            top_patterns: vec![],
        })
    }
    fn hosts(&self) -> BoxFuture<'_, Result<web::HostsView, UiError>> {
        ok(web::HostsView {
            origin: web::DataOrigin::Live,
            generated_at_ms: NOW_MS,
            hosts: vec![],
        })
    }
    fn host<'a>(&'a self, h: &'a str) -> BoxFuture<'a, Result<web::HostDetailView, UiError>> {
        futures::future::ready(Err(UiError::not_found("host", h))).boxed()
    }
    fn service<'a>(&'a self, s: &'a str) -> BoxFuture<'a, Result<web::ServiceView, UiError>> {
        futures::future::ready(Err(UiError::not_found("service", s))).boxed()
    }
    fn instance<'a>(
        &'a self,
        _: &'a str,
        i: &'a str,
    ) -> BoxFuture<'a, Result<web::InstanceView, UiError>> {
        futures::future::ready(Err(UiError::not_found("instance", i))).boxed()
    }
    fn patterns(&self) -> BoxFuture<'_, Result<web::PatternsView, UiError>> {
        ok(web::PatternsView {
            origin: web::DataOrigin::Live,
            generated_at_ms: NOW_MS,
            patterns: vec![],
        })
    }
    fn slos(&self) -> BoxFuture<'_, Result<web::SloView, UiError>> {
        ok(web::SloView {
            origin: web::DataOrigin::Live,
            generated_at_ms: NOW_MS,
            slos: vec![],
        })
    }
    fn degradation(&self) -> BoxFuture<'_, Result<web::DegradationView, UiError>> {
        ok(web::DegradationView {
            origin: web::DataOrigin::Live,
            generated_at_ms: NOW_MS,
            clusters: vec![],
        })
    }
    fn resource(&self) -> BoxFuture<'_, Result<web::ResourceView, UiError>> {
        ok(web::ResourceView {
            origin: web::DataOrigin::Live,
            generated_at_ms: NOW_MS,
            engines: vec![],
        })
    }
}

#[tokio::test]
async fn empty_live_source_renders_every_page_with_empty_states() {
    let cases: &[(&str, &str)] = &[
        ("/", "No cluster has published a command yet."),
        ("/", "No gpu-agent has reported yet."),
        ("/", "No SLOs configured."),
        ("/", "No failure patterns in the last 24 h."),
        ("/hosts", "No gpu-agent has reported yet."),
        ("/patterns", "No failure patterns mined yet."),
        ("/slos", "No SLOs configured."),
        ("/degradation", "No cluster has published a command yet."),
        ("/debug/resource", "No engines reporting."),
    ];
    for (uri, needle) in cases {
        let (status, _, body) = get(Arc::new(Empty), uri).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
        assert!(body.contains(needle), "{uri} lacks {needle:?}");
        assert!(
            body.contains("class=\"origin live\"") && !body.contains("SAMPLE DATA"),
            "{uri}: live origin"
        );
    }
}

/// The sample world, except that every engine on `gpu-a100-01` has no block in use.
struct IdleEngines(SampleDataSource);

impl UiDataSource for IdleEngines {
    fn overview(&self) -> BoxFuture<'_, Result<web::OverviewView, UiError>> {
        self.0.overview()
    }
    fn hosts(&self) -> BoxFuture<'_, Result<web::HostsView, UiError>> {
        self.0.hosts()
    }
    fn host<'a>(&'a self, h: &'a str) -> BoxFuture<'a, Result<web::HostDetailView, UiError>> {
        async move {
            let mut v = self.0.host(h).await?;
            for e in &mut v.host.snapshot.engines {
                e.kv.num_blocks_used = 0;
                // What the engine reports for an empty pool (0 tokens over 0 slots).
                e.kv.token_occupancy_ratio = 1.0;
            }
            Ok(v)
        }
        .boxed()
    }
    fn service<'a>(&'a self, s: &'a str) -> BoxFuture<'a, Result<web::ServiceView, UiError>> {
        self.0.service(s)
    }
    fn instance<'a>(
        &'a self,
        s: &'a str,
        i: &'a str,
    ) -> BoxFuture<'a, Result<web::InstanceView, UiError>> {
        self.0.instance(s, i)
    }
    fn patterns(&self) -> BoxFuture<'_, Result<web::PatternsView, UiError>> {
        self.0.patterns()
    }
    fn slos(&self) -> BoxFuture<'_, Result<web::SloView, UiError>> {
        self.0.slos()
    }
    fn degradation(&self) -> BoxFuture<'_, Result<web::DegradationView, UiError>> {
        self.0.degradation()
    }
    fn resource(&self) -> BoxFuture<'_, Result<web::ResourceView, UiError>> {
        self.0.resource()
    }
}

#[tokio::test]
async fn an_engine_with_no_block_in_use_shows_no_token_occupancy() {
    let (status, _, busy) = get(demo(), "/hosts/gpu-a100-01").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !busy.contains("title=\"no blocks in use\""),
        "the sample engines have blocks in use"
    );
    let (status, _, idle) = get(
        Arc::new(IdleEngines(SampleDataSource::new(NOW_MS))),
        "/hosts/gpu-a100-01",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        idle.contains("title=\"no blocks in use\""),
        "an idle engine shows a dash, not 100 %"
    );
    assert!(
        !idle.contains(">100.0%<") && !idle.contains(">100.0 %<"),
        "no 100 % occupancy for 0 blocks"
    );
}

/// The sample world with its overview changed by `edit`.
struct EditedOverview(SampleDataSource, fn(&mut web::OverviewView));

impl UiDataSource for EditedOverview {
    fn overview(&self) -> BoxFuture<'_, Result<web::OverviewView, UiError>> {
        async move {
            let mut v = self.0.overview().await?;
            (self.1)(&mut v);
            Ok(v)
        }
        .boxed()
    }
    fn hosts(&self) -> BoxFuture<'_, Result<web::HostsView, UiError>> {
        self.0.hosts()
    }
    fn host<'a>(&'a self, h: &'a str) -> BoxFuture<'a, Result<web::HostDetailView, UiError>> {
        self.0.host(h)
    }
    fn service<'a>(&'a self, s: &'a str) -> BoxFuture<'a, Result<web::ServiceView, UiError>> {
        self.0.service(s)
    }
    fn instance<'a>(
        &'a self,
        s: &'a str,
        i: &'a str,
    ) -> BoxFuture<'a, Result<web::InstanceView, UiError>> {
        self.0.instance(s, i)
    }
    fn patterns(&self) -> BoxFuture<'_, Result<web::PatternsView, UiError>> {
        self.0.patterns()
    }
    fn slos(&self) -> BoxFuture<'_, Result<web::SloView, UiError>> {
        self.0.slos()
    }
    fn degradation(&self) -> BoxFuture<'_, Result<web::DegradationView, UiError>> {
        self.0.degradation()
    }
    fn resource(&self) -> BoxFuture<'_, Result<web::ResourceView, UiError>> {
        self.0.resource()
    }
}

/// The overview's SLO table: `(header cells, cells of each body row)`.
fn slo_table(page: &str) -> (Vec<String>, Vec<usize>) {
    let start = page.find("SLOs and error budgets").expect("SLO section");
    let table = &page[start..];
    let table = &table[..table.find("</table>").expect("end of the SLO table")];
    let head = &table[table.find("<thead>").unwrap()..table.find("</thead>").unwrap()];
    let headers = head
        .split("<th>")
        .skip(1)
        .map(|c| c[..c.find("</th>").unwrap()].to_string())
        .collect();
    let body = &table[table.find("<tbody>").unwrap()..];
    let rows = body
        .split("<tr>")
        .skip(1)
        .map(|r| r.matches("<td").count())
        .collect();
    (headers, rows)
}

#[tokio::test]
async fn the_slo_table_has_a_column_for_every_window_of_every_slo() {
    fn edit(v: &mut web::OverviewView) {
        assert!(v.slos.len() >= 3, "the sample has SLOs to edit");
        // The second SLO has other windows than the first; the third lacks the 3d one.
        v.slos[1].burn_rates = vec![
            web::BurnRate {
                window: "30m".into(),
                rate: 2.0,
                threshold: 14.4,
            },
            web::BurnRate {
                window: "6h".into(),
                rate: 7.0,
                threshold: 6.0,
            },
        ];
        v.slos[2].burn_rates.retain(|b| b.window != "3d");
    }
    let (status, _, page) = get(
        Arc::new(EditedOverview(SampleDataSource::new(NOW_MS), edit)),
        "/",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (headers, rows) = slo_table(&page);
    assert_eq!(
        headers,
        [
            "SLO",
            "objective",
            "budget left",
            "felt by users",
            "burn 5m",
            "30m",
            "1h",
            "6h",
            "3d",
            "alert"
        ],
        "the union of the windows, shortest first"
    );
    assert!(rows.len() >= 3);
    for (i, cells) in rows.iter().enumerate() {
        assert_eq!(*cells, headers.len(), "row {i} has a cell per column");
    }
    assert!(page.contains("has no 30m window"), "a blank cell says why");
    // The edited SLO's 6h rate sits under 6h: the cell after its three blanks and 30m.
    assert!(page.contains("6h burn rate; threshold 6") && page.contains(">7.0×</td>"));
}

#[tokio::test]
async fn an_untouched_budget_draws_a_full_bar_and_a_spent_one_an_empty_bar() {
    fn edit(v: &mut web::OverviewView) {
        v.slos[0].budget_remaining_ratio = 1.0;
        v.slos[1].budget_remaining_ratio = -2.5;
    }
    let (status, _, page) = get(
        Arc::new(EditedOverview(SampleDataSource::new(NOW_MS), edit)),
        "/",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !page.contains("error budget used"),
        "the tooltip says what the bar is"
    );
    assert!(page.contains("<title>error budget left: 100.0%</title>"));
    assert!(
        page.contains(r#"width="96.0" height="12" class="gauge-fill ok""#),
        "100 % left fills the bar"
    );
    assert!(page.contains("<title>error budget left: -250.0%</title>"));
    assert!(
        page.contains(r#"width="0.0" height="12" class="gauge-fill crit""#),
        "an overspent budget leaves it empty, in red"
    );
}

mod degradation_timeline {
    use brownout::degrade::{DecisionRecord, Transition};
    use brownout::web::live::degradation::{
        ACK_GRACE_MS, TIER_WINDOW_MIN_MS, TIER_WINDOW_MS, ack_lagging, tier_changes, window_start,
    };
    use brownout_protocol::{Command, Tier};

    const T: u64 = super::NOW_MS;

    fn rec(at_ms: u64, previous: u8, tier: u8, trigger: &str) -> DecisionRecord {
        let t = |u: u8| Tier::try_from(u).unwrap();
        DecisionRecord {
            at_ms,
            tier: t(tier),
            previous: t(previous),
            transition: if tier > previous {
                Transition::Enter
            } else if tier < previous {
                Transition::StepDown
            } else {
                Transition::Hold
            },
            trigger: trigger.into(),
            detail: format!("{trigger} detail"),
            reasons: vec![],
            dry_run: false,
            published: Some((1, at_ms / 1000)),
            instance_actions: vec![],
            instance_acks: Default::default(),
        }
    }

    #[test]
    fn the_timeline_spans_the_data_with_a_minimum() {
        // Two minutes of decisions: the five-minute minimum, not six hours.
        let recs = [
            rec(T - 120_000, 0, 0, "recovered"),
            rec(T - 60_000, 0, 1, "queue_depth"),
        ];
        assert_eq!(window_start(&recs, T), T - TIER_WINDOW_MIN_MS);
        // Two hours: from a little before the first decision.
        let recs = [rec(T - 2 * 3_600_000, 0, 0, "recovered")];
        let start = window_start(&recs, T);
        assert!(
            start < T - 2 * 3_600_000 && start > T - 3 * 3_600_000,
            "{start}"
        );
        // Older than six hours: six hours.
        let recs = [rec(T - 30 * 3_600_000, 0, 0, "recovered")];
        assert_eq!(window_start(&recs, T), T - TIER_WINDOW_MS);
        assert_eq!(window_start(&[], T), T - TIER_WINDOW_MIN_MS);
    }

    #[test]
    fn the_first_row_at_start_up_does_not_read_recovered() {
        let (rows, quiet) = tier_changes(&[rec(T - 10_000, 0, 0, "recovered")], T - 300_000);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].reason.trigger, "none");
        assert!(
            rows[0]
                .reason
                .detail
                .contains("since the control loop started")
        );
        assert!(quiet, "never left T0");
        // A real recovery still reads recovered.
        let (rows, quiet) = tier_changes(
            &[
                rec(T - 50_000, 0, 0, "recovered"),
                rec(T - 40_000, 0, 1, "queue_depth"),
                rec(T - 10_000, 1, 0, "recovered"),
            ],
            T - 300_000,
        );
        let triggers: Vec<&str> = rows.iter().map(|r| r.reason.trigger.as_str()).collect();
        assert_eq!(triggers, ["none", "queue_depth", "recovered"]);
        assert!(!quiet);
    }

    #[test]
    fn a_change_of_trigger_at_the_same_tier_is_a_row() {
        let (rows, _) = tier_changes(
            &[
                rec(T - 90_000, 0, 0, "recovered"),
                rec(T - 80_000, 0, 2, "operator"),
                rec(T - 20_000, 2, 2, "slo_burn"),
                rec(T - 10_000, 2, 2, "slo_burn"),
            ],
            T - 300_000,
        );
        let rows: Vec<(u8, &str)> = rows
            .iter()
            .map(|r| (r.tier.as_u8(), r.reason.trigger.as_str()))
            .collect();
        assert_eq!(rows, [(0, "none"), (2, "operator"), (2, "slo_burn")]);
    }

    #[test]
    fn an_ack_is_lagging_only_after_the_grace() {
        let cmd = Command::normal("c", 1, 7, T - 500, 15_000);
        // Published half a second ago, the instance acked the previous version 5 s ago (a
        // lease refresh): not lagging yet.
        assert!(!ack_lagging(true, T - 5_000, Some(&cmd), T));
        // Not applied ACK_GRACE_MS after it was published: lagging.
        let old = Command::normal("c", 1, 7, T - ACK_GRACE_MS - 1, 15_000);
        assert!(ack_lagging(true, T - 5_000, Some(&old), T));
        // Up to date: never lagging.
        assert!(!ack_lagging(false, T - 60_000, Some(&old), T));
        // No ack for longer than a refresh plus the grace, even right after a publish.
        assert!(ack_lagging(true, T - 8_000, Some(&cmd), T));
    }
}
