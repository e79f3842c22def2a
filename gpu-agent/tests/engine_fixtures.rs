//! vLLM's and the bundled tier's exact `/metrics` formats, parsed from fixtures and scraped over
//! real HTTP from fixture servers.

use brownout_gpu_agent::config::parse_engine;
use brownout_gpu_agent::engine::parse::{parse_metrics, series_count};
use brownout_gpu_agent::engine::{EngineScraper, ScrapeErrorKind};
use brownout_test_support::engines::{
    BROWNOUT_SERVE_DEBUG_KV, BROWNOUT_SERVE_METRICS, VLLM_0_6_METRICS, VLLM_V1_METRICS,
    spawn_engine,
};

fn client() -> reqwest::Client {
    brownout_gpu_agent::ensure_crypto_provider();
    reqwest::Client::new()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn vllm_fixtures_parse_to_the_exact_figures() {
    struct Want {
        name: &'static str,
        body: &'static str,
        model: &'static str,
        usage: f64,
        running: f64,
        waiting: f64,
        preemptions: f64,
        blocks_total: u64,
        ttft_count: f64,
        // Worked out by hand from the fixture's buckets with histogram_quantile's rules.
        p50: f64,
        p99: f64,
        bundled: bool,
    }
    let cases = [
        Want {
            name: "vLLM v1 (0.8+), kv_cache_usage_perc, engine label",
            body: VLLM_V1_METRICS,
            model: "meta-llama/Llama-3.1-8B-Instruct",
            usage: 0.4375,
            running: 12.0,
            waiting: 3.0,
            preemptions: 7.0,
            blocks_total: 27056,
            ttft_count: 1545.0,
            // rank 772.5 in (0.1, 0.25] holding 541..1081; rank 1529.55 in (0.75, 1.0] holding 1522..1540.
            p50: 0.1 + 0.15 * (772.5 - 541.0) / 540.0,
            p99: 0.75 + 0.25 * (1529.55 - 1522.0) / 18.0,
            bundled: false,
        },
        Want {
            name: "vLLM 0.6 (V0), deprecated gpu_cache_usage_perc",
            body: VLLM_0_6_METRICS,
            model: "meta-llama/Llama-3.1-8B-Instruct",
            usage: 0.8125,
            running: 5.0,
            waiting: 0.0,
            preemptions: 2.0,
            blocks_total: 27056,
            ttft_count: 10.0,
            // rank 5 in (0.01, 0.02] holding 4..10; rank 9.9 likewise.
            p50: 0.01 + 0.01 * (5.0 - 4.0) / 6.0,
            p99: 0.01 + 0.01 * (9.9 - 4.0) / 6.0,
            bundled: false,
        },
        Want {
            name: "bundled tier (brownout-serve)",
            body: BROWNOUT_SERVE_METRICS,
            model: "smollm2-135m-instruct",
            usage: 0.625,
            running: 4.0,
            waiting: 1.0,
            preemptions: 0.0,
            blocks_total: 512,
            ttft_count: 20.0,
            // rank 10 in (0.02, 0.04] holding 3..13; rank 19.8 in (0.04, 0.06] holding 13..20.
            p50: 0.02 + 0.02 * (10.0 - 3.0) / 10.0,
            p99: 0.04 + 0.02 * (19.8 - 13.0) / 7.0,
            bundled: true,
        },
    ];
    for w in cases {
        let m = parse_metrics(w.body).unwrap_or_else(|e| panic!("{}: {e}", w.name));
        assert_eq!(m.model.as_deref(), Some(w.model), "{}", w.name);
        assert_eq!(m.kv_usage_ratio, Some(w.usage), "{}", w.name);
        assert_eq!(m.num_requests_running, Some(w.running), "{}", w.name);
        assert_eq!(m.num_requests_waiting, Some(w.waiting), "{}", w.name);
        assert_eq!(m.num_preemptions_total, Some(w.preemptions), "{}", w.name);
        assert_eq!(m.block_size, Some(16), "{}", w.name);
        assert_eq!(m.num_blocks_total, Some(w.blocks_total), "{}", w.name);
        assert_eq!(m.bundled, w.bundled, "{}", w.name);
        let ttft = m
            .ttft
            .as_ref()
            .unwrap_or_else(|| panic!("{}: no TTFT histogram", w.name));
        assert_eq!(ttft.total(), w.ttft_count, "{}", w.name);
        assert!(
            ttft.buckets.last().unwrap().0.is_infinite(),
            "{}: +Inf bucket kept",
            w.name
        );
        let (p50, p99) = (ttft.quantile(0.5).unwrap(), ttft.quantile(0.99).unwrap());
        assert!(close(p50, w.p50), "{}: p50 {p50} want {}", w.name, w.p50);
        assert!(close(p99, w.p99), "{}: p99 {p99} want {}", w.name, w.p99);
    }
}

#[test]
fn bundled_tier_fragmentation_ratios_and_tier_are_read() {
    let m = parse_metrics(BROWNOUT_SERVE_METRICS).unwrap();
    assert_eq!(m.num_blocks_used, Some(320));
    assert_eq!(m.internal_fragmentation_ratio, Some(0.046875));
    assert_eq!(m.reserved_unused_ratio, Some(0.1));
    assert_eq!(m.token_occupancy_ratio, Some(0.853125));
    assert_eq!(m.external_fragmentation_ratio, Some(0.0));
    assert_eq!(m.tier, Some(2));
}

#[test]
fn every_vllm_series_survives_the_colon_names() {
    let counts = series_count(VLLM_V1_METRICS);
    // (name as the parser reports it, label sets) — histograms count once per label set.
    let cases = [
        ("python_gc_objects_collected_total", 3),
        ("vllm:num_requests_running", 1),
        ("vllm:request_success_total", 3),
        ("vllm:request_success_created", 3),
        ("vllm:time_to_first_token_seconds", 1),
        ("vllm:time_to_first_token_seconds_count", 1),
        ("vllm:iteration_tokens_total", 1),
        ("vllm:cache_config_info", 1),
    ];
    for (name, n) in cases {
        assert_eq!(counts.get(name).copied(), Some(n), "{name}: {counts:?}");
    }
}

fn ttft_body(cumulative: &[(f64, f64)]) -> String {
    let mut s = String::from(
        "# HELP vllm:time_to_first_token_seconds TTFT.\n# TYPE vllm:time_to_first_token_seconds histogram\n",
    );
    for (le, c) in cumulative {
        let le = if le.is_infinite() {
            "+Inf".to_string()
        } else {
            format!("{le:?}")
        };
        s.push_str(&format!(
            "vllm:time_to_first_token_seconds_bucket{{model_name=\"m\",le=\"{le}\"}} {c:?}\n"
        ));
    }
    s.push_str(
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 1.0\n",
    );
    s
}

#[tokio::test]
async fn scraper_reads_bundled_tier_metrics_and_debug_kv_over_http() {
    let fx = spawn_engine(BROWNOUT_SERVE_METRICS, Some(BROWNOUT_SERVE_DEBUG_KV))
        .await
        .unwrap();
    let mut s = EngineScraper::new(
        parse_engine(&format!("serve-0={}", fx.url()), 0).unwrap(),
        30,
    );
    let r = s.scrape(&client()).await;
    assert!(r.stats.up && r.bundled);
    assert_eq!(r.stats.id, "serve-0");
    assert_eq!(r.stats.model, "smollm2-135m-instruct");
    assert_eq!(
        (
            r.stats.kv.block_size,
            r.stats.kv.num_blocks_total,
            r.stats.kv.num_blocks_used
        ),
        (16, 512, 320)
    );
    assert_eq!(r.stats.kv.usage_ratio, 0.625);
    assert_eq!(r.stats.tier, 2);
    assert_eq!(
        (r.bytes_per_block, r.model_weights_bytes, r.max_num_seqs),
        (Some(737_280), Some(634_388_480), Some(64))
    );
    assert!(r.ttft_known && r.stats.ttft_p50_s > 0.0);
    assert_eq!(r.scrape_errors, [0, 0, 0]);
}

#[tokio::test]
async fn scraper_takes_ttft_quantiles_over_the_window_not_since_start() {
    let inf = f64::INFINITY;
    // 100 fast first tokens before the agent started watching...
    let fx = spawn_engine(
        &ttft_body(&[(0.1, 100.0), (1.0, 100.0), (inf, 100.0)]),
        None,
    )
    .await
    .unwrap();
    let mut s = EngineScraper::new(parse_engine(&fx.url(), 0).unwrap(), 3);
    let client = client();
    let first = s.scrape(&client).await;
    assert!(first.ttft_known);
    assert!(
        first.stats.ttft_p99_s <= 0.1,
        "first scrape: since start {}",
        first.stats.ttft_p99_s
    );
    // ...then 10 slow ones: the window sees only those.
    fx.set_metrics(&ttft_body(&[(0.1, 100.0), (1.0, 110.0), (inf, 110.0)]));
    let second = s.scrape(&client).await;
    assert!(
        close(second.stats.ttft_p50_s, 0.1 + 0.9 * 0.5),
        "p50 {}",
        second.stats.ttft_p50_s
    );
    // A counter reset (engine restart) restarts the window instead of going negative.
    fx.set_metrics(&ttft_body(&[(0.1, 1.0), (1.0, 1.0), (inf, 1.0)]));
    let third = s.scrape(&client).await;
    assert!(
        third.ttft_known && third.stats.ttft_p99_s <= 0.1,
        "{}",
        third.stats.ttft_p99_s
    );
}

#[tokio::test]
async fn plain_vllm_is_not_asked_for_debug_kv_and_failures_are_counted_by_kind() {
    let fx = spawn_engine(VLLM_V1_METRICS, None).await.unwrap();
    let client = client();
    let mut s = EngineScraper::new(parse_engine(&fx.url(), 0).unwrap(), 30);
    let r = s.scrape(&client).await;
    assert!(r.stats.up && !r.bundled);
    assert_eq!(
        r.stats.kv.num_blocks_used,
        (0.4375f64 * 27056.0).round() as u64,
        "used blocks derived from usage × num_gpu_blocks"
    );
    assert_eq!(
        r.scrape_errors,
        [0, 0, 0],
        "no /debug/kv request, so no 404 counted"
    );

    fx.set_metrics("this is not prometheus\n");
    let r = s.scrape(&client).await;
    assert!(!r.stats.up);
    assert_eq!(r.scrape_errors[ScrapeErrorKind::Parse as usize], 1);

    // Nothing listens on a port we bound and released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut dead = EngineScraper::new(
        parse_engine(&format!("http://127.0.0.1:{port}"), 1).unwrap(),
        30,
    );
    let r = dead.scrape(&client).await;
    assert!(!r.stats.up);
    assert_eq!(r.scrape_errors[ScrapeErrorKind::Connect as usize], 1);
}
