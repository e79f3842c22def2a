//! Per-instance stop-bleed actions reach the weekly report's incident list: a demo world (one
//! engine on the tiny model, its real control plane and store), an operator drain of that engine
//! through `POST /api/v1/degrade/instances/{id}`, the engine's ack, then the end of the action.
//! The week's report (`/reports/current`) lists the action with its instance, start, reason and
//! `applied` ack while it is in force, and with its end and duration once it is over; the
//! operator's reason is HTML-escaped in the HTML report.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use brownout_demo::{World, WorldOptions};
use brownout_test_support::{wait_for, wait_for_async};
use serde_json::{Value, json};

/// Polls the week's JSON report until `done` holds for the engine's row; returns that row.
async fn report_row(
    c: &reqwest::Client,
    cp: &str,
    read: &str,
    instance: &str,
    what: &'static str,
    done: fn(&Value) -> bool,
) -> Value {
    let url = format!("{cp}/reports/current?format=json");
    let got = Arc::new(Mutex::new(Value::Null));
    let slot = got.clone();
    let (c, read, instance) = (c.clone(), read.to_string(), instance.to_string());
    wait_for_async(what, Duration::from_secs(30), move || {
        let (c, url, read, instance, slot) = (
            c.clone(),
            url.clone(),
            read.clone(),
            instance.clone(),
            slot.clone(),
        );
        async move {
            let v: Value = c
                .get(&url)
                .bearer_auth(&read)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let row = v["instance_actions"].as_array().and_then(|rows| {
                rows.iter()
                    .find(|r| r["instance"] == instance.as_str() && r["action"] == "operator")
                    .cloned()
            });
            match row {
                Some(r) if done(&r) => {
                    *slot.lock().unwrap() = r;
                    true
                }
                _ => false,
            }
        }
    })
    .await;
    let row = got.lock().unwrap().clone();
    row
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_drain_is_in_the_weekly_report_with_its_ack_and_duration() {
    let world = World::start(WorldOptions {
        num_engines: 1,
        agents: false,
        ..WorldOptions::default()
    })
    .await
    .unwrap();
    let c = reqwest::Client::new();
    let cp = format!("http://{}", world.http_addr());
    let (_, read, admin) = world.tokens();
    let (read, admin) = (read.to_string(), admin.to_string());
    let control = world.engine_controls()[0].clone();
    let instance = control.instance_id().to_string();

    // Before: the week's report has no per-instance action.
    let v: Value = c
        .get(format!("{cp}/reports/current?format=json"))
        .bearer_auth(&read)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        v["instance_actions"],
        json!([]),
        "{}",
        v["instance_actions"]
    );

    let reason = "<script>alert(1)</script> drill";
    let r = c
        .post(format!("{cp}/api/v1/degrade/instances/{instance}"))
        .bearer_auth(&admin)
        .json(&json!({"drain": true, "max_num_seqs": 2, "duration_secs": 600, "reason": reason}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    wait_for("the engine drains", Duration::from_secs(15), || {
        control
            .instance_entry()
            .is_some_and(|e| e.entry.drain == Some(true))
    })
    .await;

    // In force: listed with its instance, reason and the engine's ack.
    let row = report_row(
        &c,
        &cp,
        &read,
        &instance,
        "the report lists the drain, acked",
        |r| r["ack"].as_str().is_some_and(|a| a.starts_with("applied")),
    )
    .await;
    assert_eq!(row["end"], "still in force", "{row}");
    assert_eq!(row["trigger"], "operator", "{row}");
    let detail = row["detail"].as_str().unwrap();
    assert!(
        detail.contains("drain") && detail.contains("max_num_seqs 2") && detail.contains(reason),
        "{row}"
    );
    assert!(row["start"].as_str().unwrap().ends_with("UTC"), "{row}");

    // Visible everywhere else too: the control plane's and the engine's metrics, the engine's
    // /debug/resource and /health.
    let text = |url: String| {
        let c = c.clone();
        async move { c.get(url).send().await.unwrap().text().await.unwrap() }
    };
    let cp_metrics = text(format!("{cp}/metrics")).await;
    assert!(
        cp_metrics
            .lines()
            .any(|l| l.starts_with("brownout_degrade_instance_actions{")
                && l.contains("action=\"operator\"")
                && l.ends_with(" 1")),
        "{cp_metrics}"
    );
    let engine = world.engine_urls()[0].clone();
    let engine_metrics = text(format!("{engine}/metrics")).await;
    assert!(
        engine_metrics
            .lines()
            .any(|l| l.starts_with("brownout_serving_draining") && l.ends_with(" 1")),
        "{engine_metrics}"
    );
    let res: Value = serde_json::from_str(&text(format!("{engine}/debug/resource")).await).unwrap();
    assert_eq!(res["draining"], true, "{res}");
    assert_eq!(res["instance_entry"]["max_num_seqs"], 2, "{res}");
    let health = c.get(format!("{engine}/health")).send().await.unwrap();
    assert_eq!(health.status(), 503);
    let health: Value = health.json().await.unwrap();
    assert_eq!(health["status"], "draining", "{health}");

    // The HTML report escapes the operator's text.
    let html = c
        .get(format!("{cp}/reports/current"))
        .bearer_auth(&read)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("Per-instance stop-bleed actions"), "{html}");
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;&#x2F;script&gt;")
            || html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "the reason is escaped"
    );
    assert!(!html.contains("<script>alert(1)"), "no raw markup");
    let md = c
        .get(format!("{cp}/reports/current?format=md"))
        .bearer_auth(&read)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        md.contains("## Per-instance stop-bleed actions") && !md.contains("<script>"),
        "{md}"
    );

    // Ended by hand: the row gets its end and keeps its ack.
    let r = c
        .delete(format!("{cp}/api/v1/degrade/instances/{instance}"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    wait_for("the engine stops draining", Duration::from_secs(15), || {
        control
            .instance_entry()
            .is_none_or(|e| e.entry.drain != Some(true))
    })
    .await;
    let row = report_row(
        &c,
        &cp,
        &read,
        &instance,
        "the report closes the drain",
        |r| r["end"] != "still in force",
    )
    .await;
    assert!(row["end"].as_str().unwrap().ends_with("UTC"), "{row}");
    assert!(row["ack"].as_str().unwrap().starts_with("applied"), "{row}");
    assert!(
        row["duration"].as_str().unwrap().ends_with('s')
            || row["duration"].as_str().unwrap().ends_with("min"),
        "{row}"
    );
    world.stop().await.unwrap();
}
