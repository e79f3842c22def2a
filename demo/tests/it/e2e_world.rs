//! End to end, in one process but over real sockets: the control plane, two serving engines on
//! the tiny model and two simulated-GPU agents (the `brownout-demo` deployment). An operator pins
//! tier 3; both engines apply it, ack it, shed sheddable traffic with 429 + Retry-After and keep
//! serving critical traffic; the UI and the APIs show it; clearing the pin steps back down.

use std::time::Duration;

use brownout_demo::{World, WorldOptions};
use brownout_protocol::Tier;
use brownout_test_support::{wait_for, wait_for_async};
use serde_json::{Value, json};

/// Polls `GET url` (bearer `token`) until `pred` holds for the JSON body.
async fn eventually_json(
    c: &reqwest::Client,
    url: &str,
    token: &str,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&Value) -> bool,
) {
    let pred = &pred;
    wait_for_async(what, timeout, || async move {
        let v: Value = c
            .get(url)
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        pred(&v)
    })
    .await;
}

fn chat(feature: &str, criticality: &str) -> (Value, [(String, String); 2]) {
    (
        json!({"model": "default", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}),
        [
            ("x-brownout-feature".into(), feature.into()),
            ("x-brownout-criticality".into(), criticality.into()),
        ],
    )
}

async fn post_chat(
    c: &reqwest::Client,
    url: &str,
    feature: &str,
    criticality: &str,
) -> reqwest::Response {
    let (body, headers) = chat(feature, criticality);
    let mut r = c.post(format!("{url}/v1/chat/completions")).json(&body);
    for (k, v) in headers {
        r = r.header(k, v);
    }
    r.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_tier3_reaches_every_engine_sheds_sheddable_and_keeps_critical() {
    let world = World::start(WorldOptions::default()).await.unwrap();
    let c = reqwest::Client::new();
    let cp = format!("http://{}", world.http_addr());
    let (ingest, read, admin) = world.tokens();
    let (ingest, read, admin) = (ingest.to_string(), read.to_string(), admin.to_string());
    let engines = world.engine_urls();

    // Agents report both hosts.
    eventually_json(
        &c,
        &format!("{cp}/api/v1/hosts"),
        &read,
        "both hosts reported",
        Duration::from_secs(10),
        |v| v["hosts"].as_array().is_some_and(|h| h.len() == 2),
    )
    .await;

    // Overrides need the admin token: the read and ingest tokens are refused.
    let pin = json!({"tier": 3, "duration_secs": 120, "reason": "e2e drill"});
    for t in [&read, &ingest] {
        let r = c
            .post(format!("{cp}/api/v1/degrade/override"))
            .bearer_auth(t)
            .json(&pin)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "override with a non-admin token");
    }
    let r = c
        .post(format!("{cp}/api/v1/degrade/override"))
        .bearer_auth(&admin)
        .json(&pin)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());

    for h in world.engine_controls() {
        wait_for("engine applied T3", Duration::from_secs(10), || {
            h.tier() == Tier::T3
        })
        .await;
    }
    eventually_json(
        &c,
        &format!("{cp}/api/v1/degrade"),
        &read,
        "both engines acked",
        Duration::from_secs(10),
        |v| {
            let version = v["command"]["version"].as_u64();
            v["tier"] == 3
                && v["acks"].as_array().is_some_and(|a| {
                    a.len() == 2
                        && a.iter()
                            .all(|x| x["status"] == "applied" && x["version"].as_u64() == version)
                })
        },
    )
    .await;

    for e in &engines {
        let shed = post_chat(&c, e, "simple_tasks", "sheddable").await;
        assert_eq!(shed.status(), 429);
        let retry: f64 = shed.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            (5.0..=8.0).contains(&retry),
            "Retry-After {retry} = 5 s × U[1, 1.5], rounded up to whole seconds"
        );
        let body: Value = shed.json().await.unwrap();
        assert!(
            body["error"]["estimated_recovery_at"].is_string()
                || body["estimated_recovery_at"].is_string(),
            "{body}"
        );
        let disabled = post_chat(&c, e, "pdf_analysis", "critical").await;
        assert_eq!(
            disabled.status(),
            503,
            "pdf_analysis is greyed out from T1 on"
        );
        let ok = post_chat(&c, e, "login", "critical").await;
        assert_eq!(ok.status(), 200, "critical traffic is never shed");
        let f: Value = c
            .get(format!("{e}/v1/features"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let pdf = f["features"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == "pdf_analysis")
            .unwrap()
            .clone();
        assert_eq!(pdf["state"], "disabled", "{f}");
    }

    // The UI is behind the read token; login sets the cookie; the degradation page shows T3.
    let ui = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    assert_eq!(
        ui.get(format!("{cp}/degradation"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        ui.get(format!("{cp}/login?token=wrong"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let login = ui
        .get(format!("{cp}/login?token={read}"))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 303);
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let page = ui
        .get(format!("{cp}/degradation"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(html.contains("T3"), "degradation page shows the tier");
    // The weekly report is a page too: the login cookie opens it; JSON APIs without a token
    // get the JSON 401.
    let report = ui
        .get(format!("{cp}/reports/current"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(report.status(), 200);
    assert_eq!(
        ui.get(format!("{cp}/reports/current"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let api = ui.get(format!("{cp}/api/v1/slos")).send().await.unwrap();
    assert_eq!(api.status(), 401);
    let body: Value = api.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthorized");
    assert!(
        html.to_ascii_lowercase().contains("simulated"),
        "simulated GPUs are labelled"
    );

    // Clearing the pin: the controller leaves T3 one tier per hold-down (demo policy: 20 s), so
    // the next command is T2, never straight to T0.
    let r = c
        .delete(format!("{cp}/api/v1/degrade/override"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let h = world.engine_controls()[0].clone();
    wait_for("stepped down to T2", Duration::from_secs(40), || {
        h.tier() == Tier::T2
    })
    .await;

    // Requests became spans (OTLP) and refusals failure events: both reached the control plane.
    eventually_json(
        &c,
        &format!("{cp}/api/v1/failures?limit=50"),
        &read,
        "failures ingested",
        Duration::from_secs(10),
        |v| {
            v["items"]
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x["category"] == "rate_limited"))
        },
    )
    .await;
    // Request spans reach the control plane over OTLP/gRPC (with the ingest token) and the SLO
    // evaluator counts them for the `chat` service.
    eventually_json(
        &c,
        &format!("{cp}/api/v1/slos"),
        &read,
        "SLO counts request spans",
        Duration::from_secs(20),
        |v| {
            v["slos"].as_array().is_some_and(|s| {
                s.iter().any(|x| {
                    x["name"] == "chat-availability"
                        && x["period_events"]["total"].as_u64().unwrap_or(0) > 0
                })
            })
        },
    )
    .await;
    world.stop().await.unwrap();
}
