//! The bundled engine's queue-wait and TTFT p99 reach the agent snapshots the fast triggers
//! (`queue_wait_p99`, `ttft_p99`, `p99_jump`) read: a real serving tier (the tiny-random model
//! behind real HTTP, one sequence at a time so requests queue) is scraped by the gpu-agent's
//! real scraper, and its p99s are the ones of the engine's own `vllm:request_queue_time_seconds`
//! and `vllm:time_to_first_token_seconds` histograms over the scrapes' window (bucket deltas),
//! not since the engine started.

use std::time::Duration;

use brownout_gpu_agent::config::parse_engine;
use brownout_gpu_agent::engine::EngineScraper;
use brownout_gpu_agent::engine::parse::parse_metrics;
use brownout_serving::control::ControlHandle;
use serde_json::json;

/// A serving tier on the tiny-random model that runs one sequence at a time.
async fn serving() -> String {
    use brownout_serving::api::{self as serving_api, ServeOptions};
    let opts = ServeOptions {
        model: "tiny-random".parse().unwrap(),
        served_model_name: Some("default".into()),
        max_num_seqs: 1,
        ..ServeOptions::default()
    };
    let control = ControlHandle::with_instance("t-queue-wait", "gpu-1/engine-0");
    let state = serving_api::build_state(
        &opts,
        control,
        brownout_serving::telemetry::Telemetry::disabled(),
    )
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        serving_api::run_server(state, None, listener, std::future::pending())
            .await
            .unwrap();
    });
    base
}

async fn metrics_text(c: &reqwest::Client, base: &str) -> String {
    c.get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// `n` completions at once (they queue behind each other: max_num_seqs 1).
async fn burst(c: &reqwest::Client, base: &str, n: usize, max_tokens: u32) {
    let mut tasks = Vec::new();
    for i in 0..n {
        let (c, url) = (c.clone(), format!("{base}/v1/completions"));
        tasks.push(tokio::spawn(async move {
            let r = c
                .post(url)
                .timeout(Duration::from_secs(120))
                .json(&json!({"model": "default", "prompt": format!("hello {i}"),
                    "max_tokens": max_tokens, "ignore_eos": true, "temperature": 0}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_wait_and_ttft_p99_come_from_the_engines_histograms_over_the_window() {
    brownout_gpu_agent::ensure_crypto_provider();
    let base = serving().await;
    let c = reqwest::Client::new();
    // A few requests before the agent watches: a warm engine and a non-empty history.
    burst(&c, &base, 2, 4).await;

    // Window of two scrapes: each p99 covers what happened since the previous scrape.
    let mut s = EngineScraper::new(parse_engine(&format!("engine-0={base}"), 0).unwrap(), 2);
    let first = s.scrape(&c).await;
    assert!(first.stats.up && first.bundled, "{first:?}");
    let before = parse_metrics(&metrics_text(&c, &base).await).unwrap();

    // Eight at once, one sequence at a time: all but the first wait in the queue.
    burst(&c, &base, 8, 24).await;
    let after_text = metrics_text(&c, &base).await;
    let after = parse_metrics(&after_text).unwrap();
    let second = s.scrape(&c).await;

    let delta = |a: &Option<_>, b: &Option<_>| {
        let (a, b): (&brownout_gpu_agent::engine::histogram::Histogram, _) =
            (a.as_ref().unwrap(), b.as_ref().unwrap());
        a.since(b).unwrap()
    };
    let q = delta(&after.queue_time, &before.queue_time);
    let t = delta(&after.ttft, &before.ttft);
    assert_eq!(q.total(), 8.0, "the engine observed each queue wait once");
    let want_q = q.quantile(0.99).unwrap();
    let want_t = t.quantile(0.99).unwrap();
    assert!(
        want_q > 0.0,
        "requests behind a busy sequence waited: {after_text}"
    );
    assert!(
        (second.stats.queue_wait_p99_s - want_q).abs() < 1e-9,
        "snapshot queue-wait p99 {} vs the histogram delta's {want_q}",
        second.stats.queue_wait_p99_s
    );
    assert!(
        second.ttft_known && (second.stats.ttft_p99_s - want_t).abs() < 1e-9,
        "snapshot TTFT p99 {} vs the histogram delta's {want_t}",
        second.stats.ttft_p99_s
    );

    // Nothing new since: the window holds no observation, so no stale p99 is reported.
    let third = s.scrape(&c).await;
    assert_eq!(third.stats.queue_wait_p99_s, 0.0, "{third:?}");
    assert!(!third.ttft_known);
}
