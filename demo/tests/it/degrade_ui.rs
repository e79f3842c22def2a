//! The grey-out demo page in a real headless Chromium: after a command is published on Redis,
//! the feature's button is disabled within 100 ms.
//!
//! The page (served by the serving tier's control router) reports each change it renders, with
//! the browser's `Date.now()`, to a same-origin path given as `?report=`; the test compares that
//! with the time it published at (same machine, same clock).

use std::process::Stdio;
use std::time::Duration;

use axum::Json;
use axum::routing::post;
use brownout::degrade::redis::{PublishOutcome, RedisBus};
use brownout_protocol::{Command, Criticality, FeatureState, Tier, now_ms};
use brownout_serving::control::http::router;
use brownout_serving::control::{
    ControlHandle, FeatureCatalog, SubscriberConfig, spawn_subscriber,
};
use brownout_test_support::redis_url;

const KEY: &[u8] = b"ui-test-key";
const CHROMIUM: &str = "/usr/bin/chromium";

#[tokio::test]
async fn button_greys_out_within_100ms_of_publish_in_headless_chromium() {
    assert!(
        std::path::Path::new(CHROMIUM).exists(),
        "chromium is required at {CHROMIUM} (apt-get install chromium)"
    );
    let url = redis_url();
    let cl = format!("t-ui-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut bus = match RedisBus::connect(&url, &cl, "cp-ui", Duration::from_secs(1), KEY).await {
        Ok(b) => b,
        Err(e) => panic!("Redis is not reachable at {url} ({e}): start it with scripts/test.sh"),
    };

    // Serving side: subscriber + feature router + a report sink for the page.
    let h = ControlHandle::new(&cl);
    let mut scfg = SubscriberConfig::new(&url, &cl, KEY, "ui-0");
    scfg.anti_entropy = Duration::from_millis(500);
    let sub = spawn_subscriber(h.clone(), scfg).await;
    let catalog = FeatureCatalog::new(vec![
        ("pdf_analysis".into(), Criticality::Sheddable),
        ("basic_qa".into(), Criticality::Critical),
    ]);
    let (rep_tx, mut rep_rx) = tokio::sync::mpsc::channel::<serde_json::Value>(64);
    let app = router(h.clone(), catalog).route(
        "/report",
        post(move |Json(v): Json<serde_json::Value>| {
            let tx = rep_tx.clone();
            async move {
                let _ = tx.send(v).await;
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let profile = tempfile::tempdir().unwrap();
    let mut chromium = tokio::process::Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-port=0",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("http://127.0.0.1:{port}/?report=/report"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start chromium");

    // The page has rendered the initial state and is listening.
    let ready = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let v = rep_rx.recv().await.expect("report channel open");
            if v["event"] == "ready" {
                return v;
            }
        }
    })
    .await
    .expect("the page never reported ready (chromium did not load it?)");
    assert_eq!(ready["tier"], 0);

    // Publish T1 through the real fenced publisher.
    let epoch = bus.try_acquire(10_000, 0).await.unwrap().expect("lease");
    let published_at = now_ms();
    let out = bus
        .publish(epoch, 1, KEY, |v| {
            let mut c = Command::normal(&cl, epoch, v, published_at, 30_000);
            c.tier = Tier::T1;
            c.reason.trigger = "gpu_util".into();
            c.features
                .insert("pdf_analysis".into(), FeatureState::Disabled);
            c
        })
        .await
        .unwrap();
    assert!(matches!(out, PublishOutcome::Published { .. }), "{out:?}");

    let change = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let v = rep_rx.recv().await.expect("report channel open");
            if v["event"] == "change" {
                return v;
            }
        }
    })
    .await
    .expect("the button never greyed out");
    assert_eq!(change["feature"], "pdf_analysis");
    assert_eq!(change["disabled"], true);
    assert_eq!(change["tier"], 1);
    let greyed_at = change["at_ms"].as_u64().unwrap();
    let latency = greyed_at.saturating_sub(published_at);
    eprintln!("publish -> button disabled in the browser: {latency} ms");
    assert!(
        latency <= 100,
        "button disabled {latency} ms after publish (budget 100 ms)"
    );
    // The critical feature never changed.
    tokio::time::sleep(Duration::from_millis(100)).await;
    while let Ok(v) = rep_rx.try_recv() {
        assert_ne!(v["feature"], "basic_qa", "critical feature touched: {v}");
    }

    let _ = chromium.kill().await;
    server.abort();
    sub.abort();
    let _ = bus.release(epoch).await;
}
