//! The demo's report ranks the real problems (docs/REPORT.md, docs/SLO.md "Deliberate
//! refusals"): a demo world (one engine on the tiny model), an operator pin of T2 under which the
//! engine refuses the features the tier disables, and the agent application's injected faults
//! (`brownout_demo::faults`: GPU queue timeouts, tool timeouts, KV pressure) over a short
//! compressed peak. This week's report then ranks exactly those three kinds, none of the
//! engine's own `feature … disabled at tier …` refusals, and its degradation timeline holds the
//! pinned tier with the refusals as its cost. The faults are the bad events of the example SLO
//! `agent-app-availability` (the app reports 19 good steps per fault), so the patterns API
//! ranks the three kinds by a real, non-zero impact whose shares add up to all of that SLO's
//! bad events (docs/SLO.md "Pattern impact").

use std::time::Duration;

use brownout::loadgen::LoadShape;
use brownout_demo::{World, WorldOptions, faults};
use brownout_protocol::Tier;
use brownout_test_support::{wait_for, wait_for_async};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_report_ranks_injected_faults_and_shows_the_tiers_with_their_cost() {
    let world = World::start(WorldOptions {
        num_engines: 1,
        agents: false,
        ..WorldOptions::default()
    })
    .await
    .unwrap();
    let c = reqwest::Client::new();
    let cp = format!("http://{}", world.http_addr());
    let (ingest, read, admin) = world.tokens();
    let (ingest, read, admin) = (ingest.to_string(), read.to_string(), admin.to_string());
    let engine = world.engine_urls()[0].clone();

    // Pin T2: the demo policy disables pdf_analysis, image_generation, multilingual_email (T1)
    // and web_search (T2).
    let r = c
        .post(format!("{cp}/api/v1/degrade/override"))
        .bearer_auth(&admin)
        .json(&json!({"tier": 2, "duration_secs": 600, "reason": "report drill"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let h = world.engine_controls()[0].clone();
    wait_for("engine applied T2", Duration::from_secs(15), || {
        h.tier() == Tier::T2
    })
    .await;

    // The engine refuses the disabled features on purpose: 30 refusals.
    let mut refused = 0;
    for i in 0..30 {
        let feature = ["pdf_analysis", "image_generation", "web_search"][i % 3];
        let res = c
            .post(format!("{engine}/v1/chat/completions"))
            .header("x-brownout-feature", feature)
            .header("x-brownout-criticality", "sheddable")
            .json(&json!({"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 503, "{feature} is disabled at T2");
        refused += 1;
    }

    // The application's faults over a compressed 6 s peak: 5/s at the edges, 3× at the top.
    let shape = LoadShape {
        duration: Duration::from_secs(6),
        peak_factor: 3.0,
        burst_prob_per_s: 0.0,
        ..LoadShape::default()
    };
    let injected = faults::run(faults::FaultConfig {
        control_plane: cp.clone(),
        ingest_token: ingest.clone(),
        shape,
        base_per_s: 5.0,
        ok_steps_per_fault: 19,
        seed: 3,
    })
    .await;
    assert!(injected >= 30, "{injected} faults injected");

    // Release the pin so the episode has an end in the report's timeline (it steps down per
    // hold-down; the report shows the episode open or closed alike).
    let r = c
        .delete(format!("{cp}/api/v1/degrade/override"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());

    // The week's report, once the pipeline wrote the faults and the refusals.
    let url = format!("{cp}/reports/current?format=json");
    let report = std::sync::Arc::new(std::sync::Mutex::new(Value::Null));
    let got = report.clone();
    let (c2, read2) = (c.clone(), read.clone());
    wait_for_async(
        "the report holds the faults and the refusals",
        Duration::from_secs(30),
        move || {
            let (c, url, read, got) = (c2.clone(), url.clone(), read2.clone(), got.clone());
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
                let faults: u64 = v["top"]
                    .as_array()
                    .map(|t| t.iter().filter_map(|p| p["count"].as_u64()).sum())
                    .unwrap_or(0);
                let refusals: u64 = v["refusals"]
                    .as_array()
                    .map(|t| t.iter().filter_map(|p| p["count"].as_u64()).sum())
                    .unwrap_or(0);
                let done = faults >= injected && refusals >= refused;
                *got.lock().unwrap() = v;
                done
            }
        },
    )
    .await;
    let v = report.lock().unwrap().clone();

    // TOP-3: the three injected kinds, nothing of brownout's own.
    let mut cats: Vec<String> = v["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["category"].as_str().unwrap().to_string())
        .collect();
    cats.sort();
    assert_eq!(
        cats,
        ["kv_cache_exhausted", "timeout_resource", "tool_unavailable"],
        "{v:#}"
    );
    for t in v["top"].as_array().unwrap() {
        assert!(
            !t["label"].as_str().unwrap().contains("disabled"),
            "{}",
            t["label"]
        );
    }
    assert_eq!(v["roadmap"].as_array().unwrap().len(), 3, "{v:#}");
    // The timeline: the pinned T2, with what it refused.
    let eps = v["episodes"].as_array().unwrap();
    assert!(!eps.is_empty(), "{v:#}");
    assert_eq!(eps[0]["max_tier"], 2);
    assert!(
        eps[0]["tiers"].as_str().unwrap().starts_with("T2 "),
        "{}",
        eps[0]["tiers"]
    );
    assert!(
        eps[0]["cost"].as_str().unwrap().contains("disabled"),
        "{}",
        eps[0]["cost"]
    );

    // Impact: the faults are agent-app-availability's bad events (one per fault, 19 good
    // steps beside each), and each pattern's share of them is its count over the stored bad.
    let slo_url = format!("{cp}/api/v1/slos/agent-app-availability");
    let pat_url = format!("{cp}/api/v1/patterns");
    let got = std::sync::Arc::new(std::sync::Mutex::new((Value::Null, Value::Null)));
    let seen = got.clone();
    let (c2, read2) = (c.clone(), read.clone());
    wait_for_async(
        "the SLO counts every fault and step, the patterns explain every bad event",
        Duration::from_secs(30),
        move || {
            let (c, read, seen) = (c2.clone(), read2.clone(), seen.clone());
            let (slo_url, pat_url) = (slo_url.clone(), pat_url.clone());
            async move {
                let get = |u: String| {
                    let (c, read) = (c.clone(), read.clone());
                    async move {
                        let r = c.get(u).bearer_auth(read).send().await.unwrap();
                        if r.status().is_success() {
                            r.json::<Value>().await.unwrap()
                        } else {
                            Value::Null
                        }
                    }
                };
                let slo = get(slo_url).await;
                let pats = get(pat_url).await;
                let explained: u64 = pats["patterns"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|p| p["slo_impact"].as_array().into_iter().flatten())
                    .filter(|i| i["slo"] == "agent-app-availability")
                    .filter_map(|i| i["events"].as_u64())
                    .sum();
                let total = slo["period_events"]["total"].as_u64().unwrap_or(0);
                let good = slo["period_events"]["good"].as_u64().unwrap_or(0);
                let done =
                    total == 20 * injected && total - good == injected && explained == injected;
                *seen.lock().unwrap() = (slo, pats);
                done
            }
        },
    )
    .await;
    let (slo, pats) = got.lock().unwrap().clone();
    assert_eq!(slo["source"], "store", "{slo:#}");
    let pats = pats["patterns"].as_array().unwrap().clone();
    assert!(pats.len() >= 3, "{pats:#?}");
    let impacts: Vec<f64> = pats
        .iter()
        .map(|p| p["budget_impact"].as_f64().unwrap())
        .collect();
    for (p, &i) in pats.iter().zip(&impacts) {
        assert!(i > 0.0, "impact 0: {p:#}");
        let on_slo = p["slo_impact"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["slo"] == "agent-app-availability")
            .unwrap_or_else(|| panic!("no impact on agent-app-availability: {p:#}"));
        let share = on_slo["share"].as_f64().unwrap();
        let events = on_slo["events"].as_u64().unwrap();
        assert!(
            (share - events as f64 / injected as f64).abs() < 1e-9,
            "share {share} is not {events} of {injected}: {p:#}"
        );
        assert_eq!(events, p["count"].as_u64().unwrap(), "{p:#}");
    }
    assert!(
        impacts.windows(2).all(|w| w[0] >= w[1]),
        "not ranked by impact: {impacts:?}"
    );
    let shares: f64 = pats
        .iter()
        .flat_map(|p| p["slo_impact"].as_array().unwrap().iter())
        .filter(|x| x["slo"] == "agent-app-availability")
        .map(|x| x["share"].as_f64().unwrap())
        .sum();
    assert!((shares - 1.0).abs() < 1e-9, "the shares add up to {shares}");
    world.stop().await.unwrap();
}
