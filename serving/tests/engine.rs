//! The engine loop on its own: failures become the right events, gone clients free their blocks.

use std::sync::Arc;
use std::time::Duration;

use brownout_protocol::{Category, Criticality};
use brownout_serving::kvcache::{AllocMode, KvConfig};
use brownout_serving::metrics::Metrics;
use brownout_serving::model::{Route, SeqChunk};
use brownout_serving::scheduler::engine::{
    EngineConfig, EngineHandle, EngineRequest, ModelBackend, SeqEvent, spawn_engine,
};
use brownout_serving::scheduler::toy::ToyModel;
use brownout_serving::scheduler::{FinishReason, SamplingParams, SchedulerConfig};

fn cfg(max_queue_wait: Duration) -> EngineConfig {
    EngineConfig {
        model_name: "t".into(),
        sched: SchedulerConfig {
            max_num_seqs: 4,
            max_num_batched_tokens: 64,
            max_model_len: 128,
            ..SchedulerConfig::default()
        },
        kv: KvConfig {
            num_blocks: 32,
            block_size: 4,
            mode: AllocMode::Paged,
            enable_prefix_caching: true,
        },
        eos_token_ids: vec![],
        max_queue_wait,
        inbox_capacity: 16,
    }
}

fn req(max_tokens: usize) -> EngineRequest {
    EngineRequest {
        prompt: vec![1, 2, 3, 4, 5],
        params: SamplingParams {
            max_tokens,
            ..SamplingParams::default()
        },
        criticality: Criticality::Default,
        route: Route::Primary,
    }
}

async fn last_event(rx: &mut tokio::sync::mpsc::UnboundedReceiver<SeqEvent>) -> SeqEvent {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
            .unwrap()
        {
            SeqEvent::Token(_) => continue,
            other => return other,
        }
    }
}

fn start<B: ModelBackend>(c: EngineConfig, b: B) -> EngineHandle {
    spawn_engine(c, b, Arc::new(Metrics::new("t")), None)
        .unwrap()
        .0
}

#[tokio::test]
async fn waiting_past_the_queue_deadline_fails_as_timeout_resource() {
    let e = start(cfg(Duration::ZERO), ToyModel::new(32, 4));
    let (_, mut rx) = e.submit(req(3)).unwrap();
    match last_event(&mut rx).await {
        SeqEvent::Failed {
            category, message, ..
        } => {
            assert_eq!(category, Category::TimeoutResource);
            assert!(message.contains("KV blocks"), "{message}");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
}

struct Broken;
impl ModelBackend for Broken {
    fn forward(&mut self, _: Route, _: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, String> {
        Err("kernel exploded".into())
    }
}

#[tokio::test]
async fn a_model_failure_fails_the_batch_as_model_error_and_the_engine_keeps_running() {
    let e = start(cfg(Duration::from_secs(60)), Broken);
    for _ in 0..2 {
        let (_, mut rx) = e.submit(req(3)).unwrap();
        match last_event(&mut rx).await {
            SeqEvent::Failed {
                category, message, ..
            } => assert_eq!(
                (category, message.as_str()),
                (Category::ModelError, "kernel exploded")
            ),
            other => panic!("{other:?}"),
        }
    }
    assert!(!e.is_stopped());
    assert_eq!(
        e.debug_kv().await.unwrap().pool.num_blocks_used,
        0,
        "failed sequences free their blocks"
    );
}

#[tokio::test]
async fn a_dropped_receiver_aborts_and_frees_blocks() {
    let e = start(cfg(Duration::from_secs(60)), ToyModel::new(32, 4));
    let (_, rx) = e.submit(req(100)).unwrap();
    drop(rx);
    let (_, mut rx2) = e.submit(req(2)).unwrap();
    assert!(matches!(
        last_event(&mut rx2).await,
        SeqEvent::Finished {
            reason: FinishReason::Length,
            ..
        }
    ));
    for _ in 0..100 {
        let d = e.debug_kv().await.unwrap();
        if d.sequences.is_empty() {
            assert_eq!(d.pool.num_blocks_used, 0);
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the aborted sequence still holds blocks");
}

#[tokio::test]
async fn finished_events_carry_usage_and_timings() {
    let e = start(cfg(Duration::from_secs(60)), ToyModel::new(32, 4));
    let (_, mut rx) = e.submit(req(6)).unwrap();
    let mut n = 0;
    loop {
        match rx.recv().await.unwrap() {
            SeqEvent::Token(_) => n += 1,
            SeqEvent::Finished { reason, stats } => {
                assert_eq!(
                    (reason, n, stats.prompt_tokens, stats.completion_tokens),
                    (FinishReason::Length, 6, 5, 6)
                );
                assert!(
                    stats.ttft_s > 0.0
                        && stats.e2e_s >= stats.ttft_s
                        && stats.queue_s <= stats.ttft_s
                );
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    for _ in 0..200 {
        if e.status().steps >= 6 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("status never showed the steps: {:?}", e.status());
}
