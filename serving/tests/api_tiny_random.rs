//! The engine and API over the real model code path (`tiny-random`: a tiny Llama with seeded
//! random weights, GGUF, BPE tokenizer, paged forward): concurrent batched, preempted and
//! prefix-cached generation must equal the model's own single-sequence greedy decoding.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use brownout_protocol::Criticality;
use brownout_serving::api::{self, ModelChoice, ServeOptions};
use brownout_serving::control::ControlHandle;
use brownout_serving::model::{Device, LoadedModel, Route};
use brownout_serving::scheduler::SamplingParams;
use brownout_serving::scheduler::engine::{EngineRequest, SeqEvent};
use brownout_serving::telemetry::Telemetry;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

fn greedy_text(m: &LoadedModel, prompt: &str, n: usize, route: Route) -> String {
    let ids = m.tokenizer().encode(prompt);
    let out = m.generate_greedy(route, &ids, n).unwrap();
    let eos = &m.config().eos_token_ids;
    let kept: Vec<u32> = out.into_iter().take_while(|t| !eos.contains(t)).collect();
    m.tokenizer().decode(&kept)
}

#[tokio::test]
async fn tiny_random_batched_preempted_generation_equals_single_sequence_greedy() {
    let reference = LoadedModel::load("tiny-random", Device::Cpu).unwrap();
    // A small pool (6 blocks of 8) for 4 concurrent requests forces preemption.
    let opts = ServeOptions {
        model: ModelChoice::TinyRandom,
        device: "cpu".into(),
        num_blocks: 6,
        block_size: 8,
        max_num_seqs: 4,
        max_num_batched_tokens: 16,
        max_model_len: Some(48),
        ..ServeOptions::default()
    };
    let st = api::build_state(&opts, ControlHandle::new("t"), Telemetry::disabled())
        .await
        .unwrap();
    let prompts = [
        "hello world, this is a shared prefix 1",
        "hello world, this is a shared prefix 2",
        "abc",
        "hello world",
    ];
    // Straight to the engine, admitted together: exact pool pressure.
    let reqs = prompts
        .iter()
        .map(|p| EngineRequest {
            prompt: reference.tokenizer().encode(p),
            params: SamplingParams {
                max_tokens: 10,
                ..SamplingParams::default()
            },
            criticality: Criticality::Default,
            route: Route::Primary,
        })
        .collect();
    let rxs = st.engine().submit_batch(reqs).unwrap();
    for ((_, mut rx), p) in rxs.into_iter().zip(prompts) {
        let mut toks = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(60), rx.recv())
                .await
                .unwrap()
            {
                Some(SeqEvent::Token(t)) => toks.push(t),
                Some(SeqEvent::Finished { .. }) => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(
            reference.tokenizer().decode(&toks),
            greedy_text(&reference, p, 10, Route::Primary),
            "engine, prompt {p:?}"
        );
    }
    assert!(
        st.engine().status().num_preemptions_total > 0,
        "6 blocks of 8 cannot hold four 20–50 token sequences at once"
    );

    // Through HTTP, concurrently, on both routes.
    let name = st.model_name().to_string();
    let app = api::router(st.clone());
    let mut tasks = Vec::new();
    for (i, p) in prompts.into_iter().enumerate() {
        let app = app.clone();
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            let body = json!({"model": name, "prompt": p, "max_tokens": 10, "temperature": 0});
            let crit = if i % 2 == 0 { "critical" } else { "default" };
            let req = Request::post("/v1/completions")
                .header("content-type", "application/json")
                .header("x-brownout-criticality", crit)
                .body(Body::from(body.to_string()))
                .unwrap();
            let resp = tokio::time::timeout(Duration::from_secs(60), app.oneshot(req))
                .await
                .unwrap()
                .unwrap();
            let status = resp.status();
            let v: Value =
                serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes())
                    .unwrap();
            (p, status, v)
        }));
    }
    for t in tasks {
        let (p, status, v) = t.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(
            v["choices"][0]["text"].as_str().unwrap(),
            greedy_text(&reference, p, 10, Route::Primary),
            "prompt {p:?}"
        );
    }
    let dbg = st.engine().debug_kv().await.unwrap();
    assert_eq!(dbg.pool.num_blocks_used, 0, "all blocks returned");
}
