//! End to end through the pure core: synthetic agent failures (the scenarios of docs/REQUIREMENTS.md R1.3) into
//! the PatternEngine, ranked patterns out, and the HTTP API over it.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use brownout::patterns::engine::TrendDirection;
use brownout::patterns::synth::{SynthConfig, generate};
use brownout::patterns::{PatternEngine, router};
use brownout_protocol::Category;
use http_body_util::BodyExt;
use tower::ServiceExt;

fn engine_with_week() -> (PatternEngine, SynthConfig) {
    let cfg = SynthConfig {
        lines: 6000,
        seed: 3,
        ..SynthConfig::default()
    };
    let mut e = PatternEngine::default();
    for ev in generate(&cfg) {
        e.observe(&ev.event);
    }
    (e, cfg)
}

#[test]
fn the_four_scenarios_rank_first_in_seed_order() {
    let (e, cfg) = engine_with_week();
    let ps = e.patterns(cfg.start_ms, cfg.start_ms + cfg.span_ms);
    let cats: Vec<Category> = ps.iter().take(4).map(|p| p.category).collect();
    assert_eq!(
        cats,
        vec![
            Category::KvCacheExhausted,
            Category::ToolUnavailable,
            Category::SerializationError,
            Category::StateConflict
        ],
        "{:#?}",
        ps.iter().map(|p| (&p.label, p.count)).collect::<Vec<_>>()
    );
    let total: f64 = ps.iter().map(|p| p.budget_impact).sum();
    assert!(
        (total - 1.0).abs() < 1e-9,
        "impacts add up to the whole window: {total}"
    );
    assert!(
        (0.33..0.50).contains(&ps[0].budget_impact),
        "KV share {}",
        ps[0].budget_impact
    );
    for p in &ps {
        assert!(p.is_new && p.trend.direction == TrendDirection::New);
        assert!(p.affected_users > 0 && p.affected_requests > 0 && !p.example_trace_ids.is_empty());
        assert_eq!(p.counts.iter().map(|c| c.count).sum::<u64>(), p.count);
    }
    // Patterns don't mix categories.
    assert_eq!(
        ps.iter()
            .map(|p| p.category)
            .collect::<std::collections::HashSet<_>>()
            .len(),
        ps.len()
    );
}

async fn get(app: axum::Router, uri: &str) -> (StatusCode, serde_json::Value) {
    let resp = app
        .oneshot(Request::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap())
}

#[tokio::test]
async fn api_returns_ranked_patterns_and_refuses_bad_input() {
    let (e, cfg) = engine_with_week();
    let app = router(Arc::new(Mutex::new(e)));
    let (s, v) = get(
        app.clone(),
        &format!(
            "/api/v1/patterns?since={}&until={}&limit=2",
            cfg.start_ms,
            cfg.start_ms + cfg.span_ms
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let ps = v["patterns"].as_array().unwrap();
    assert_eq!(ps.len(), 2);
    assert_eq!(ps[0]["category"], "kv_cache_exhausted");
    assert!(ps[0]["budget_impact"].as_f64().unwrap() > ps[1]["budget_impact"].as_f64().unwrap());
    assert_eq!(ps[0]["new"], true);
    let (s, v) = get(
        app.clone(),
        "/api/v1/patterns?since=2026-11-23T00:00:00Z&until=2026-11-30T00:00:00Z",
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert!(v["patterns"].as_array().unwrap().len() >= 4);
    let (s, v) = get(app.clone(), "/api/v1/patterns").await;
    assert_eq!(s, StatusCode::OK, "defaults to the last 24 h of data: {v}");
    let (s, v) = get(
        app.clone(),
        "/api/v1/patterns?since=0&until=18446744073709551615",
    )
    .await;
    assert_eq!(s, StatusCode::OK, "the widest window works: {v}");
    assert!(v["patterns"][0]["counts"].as_array().unwrap().len() <= 48);
    for (uri, needle) in [
        ("/api/v1/patterns?since=yesterday", "since"),
        ("/api/v1/patterns?until=-5", "until"),
        ("/api/v1/patterns?since=10&until=5", "after"),
        ("/api/v1/patterns?limit=0", "limit"),
    ] {
        let (s, v) = get(app.clone(), uri).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{uri}");
        assert_eq!(v["error"]["code"], "bad_request");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(needle),
            "{uri}: {v}"
        );
    }
}

#[test]
fn miner_state_survives_a_restart_through_the_engine() {
    let (e, _) = engine_with_week();
    let state = serde_json::to_string(&e.miner_state()).unwrap();
    let restored =
        PatternEngine::with_miner_state(Default::default(), serde_json::from_str(&state).unwrap())
            .unwrap();
    assert_eq!(restored.miner().templates(), e.miner().templates());
}
