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
        simulate_step: None,
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

/// The toy model, one forward per permit the test hands out: the engine moves exactly as far as
/// the test lets it (no timing anywhere).
struct Stepped {
    inner: ToyModel,
    permits: std::sync::mpsc::Receiver<()>,
}

impl ModelBackend for Stepped {
    fn forward(&mut self, route: Route, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, String> {
        self.permits.recv().map_err(|_| "test over".to_string())?;
        self.inner.forward(route, chunks)
    }
}

struct Driver {
    e: EngineHandle,
    permits: std::sync::mpsc::Sender<()>,
}

impl Driver {
    fn start(c: EngineConfig, control: Option<brownout_serving::control::ControlHandle>) -> Driver {
        let (tx, rx) = std::sync::mpsc::channel();
        let backend = Stepped {
            inner: ToyModel::new(c.kv.num_blocks, c.kv.block_size),
            permits: rx,
        };
        let e = spawn_engine(c, backend, Arc::new(Metrics::new("t")), control)
            .unwrap()
            .0;
        Driver { e, permits: tx }
    }

    /// Lets one forward run and waits until the engine has published the step after it.
    async fn step(&self) {
        let before = self.e.status().steps;
        self.permits.send(()).unwrap();
        wait(&self.e, "a step", |s| s.steps > before).await;
    }
}

async fn wait(
    e: &EngineHandle,
    what: &str,
    f: impl Fn(&brownout_serving::scheduler::engine::EngineStatus) -> bool,
) {
    // A deadlock guard, not a timing assertion: each wait is for one engine iteration.
    for _ in 0..2000 {
        if f(&e.status()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}: {:?}", e.status());
}

fn reserve_cfg() -> EngineConfig {
    EngineConfig {
        model_name: "t".into(),
        sched: SchedulerConfig {
            max_num_seqs: 5,
            max_num_batched_tokens: 256,
            max_model_len: 512,
            critical_reserve_ratio: 0.2,
            ..SchedulerConfig::default()
        },
        kv: KvConfig {
            num_blocks: 200,
            block_size: 4,
            mode: AllocMode::Paged,
            enable_prefix_caching: true,
        },
        eos_token_ids: vec![],
        max_queue_wait: Duration::from_secs(600),
        inbox_capacity: 64,
        simulate_step: None,
    }
}

fn long(c: Criticality, max_tokens: usize) -> EngineRequest {
    EngineRequest {
        params: SamplingParams {
            max_tokens,
            ignore_eos: true,
            ..SamplingParams::default()
        },
        criticality: c,
        ..req(max_tokens)
    }
}

/// The real engine loop with the critical reserve: 8 default requests fill the 4 unreserved
/// slots of 5; a critical request then runs at once from the reserved slot and finishes while
/// all four defaults are still running, with no preemption.
#[tokio::test]
async fn a_critical_request_is_served_from_the_reserve_while_defaults_fill_the_rest() {
    let d = Driver::start(reserve_cfg(), None);
    let defaults =
        d.e.submit_batch((0..8).map(|_| long(Criticality::Default, 100)).collect())
            .unwrap();
    d.step().await;
    let s = d.e.status();
    assert_eq!((s.num_running, s.num_waiting), (4, 4));
    assert_eq!(
        (s.critical_reserve.seqs, s.critical_reserve.seqs_used),
        (1, 0)
    );
    assert_eq!(s.critical_reserve.blocks, 40, "20 % of 200 blocks");
    let (_, mut crit) = d.e.submit(long(Criticality::Critical, 3)).unwrap();
    let mut steps = 0;
    let finished = loop {
        d.step().await;
        steps += 1;
        assert!(
            steps <= 10,
            "the critical request did not get the reserved slot"
        );
        if d.e.status().critical_reserve.seqs_used == 1 {
            assert_eq!(d.e.status().num_running, 5);
        }
        let mut done = None;
        while let Ok(ev) = crit.try_recv() {
            if let SeqEvent::Finished { reason, .. } = ev {
                done = Some(reason);
            }
        }
        if let Some(r) = done {
            break r;
        }
    };
    assert_eq!(finished, FinishReason::Length);
    assert!(steps <= 4, "prefill + 3 tokens, no waiting ({steps} steps)");
    let s = d.e.status();
    assert_eq!(s.num_preemptions_total, 0);
    assert_eq!(s.num_running, 4, "the defaults kept running");
    drop(defaults);
}

/// `instances[<id>].max_num_seqs` lowers this instance only, overriding limits.max_num_seqs.
#[tokio::test]
async fn the_instance_entry_sets_max_num_seqs_for_its_instance_only() {
    use brownout_protocol::{Command, InstanceEntry};
    let mut cmd = Command::normal("c", 1, 1, 0, u64::MAX / 4);
    cmd.limits.max_num_seqs = Some(4);
    cmd.instances.insert(
        "gpu-3/engine-0".into(),
        InstanceEntry {
            max_num_seqs: Some(2),
            ..InstanceEntry::default()
        },
    );
    let mut c = reserve_cfg();
    c.sched.max_num_seqs = 8;
    for (inst, want) in [("gpu-3/engine-0", 2), ("gpu-4/engine-0", 4)] {
        let h = brownout_serving::control::ControlHandle::with_instance("c", inst);
        h.apply(cmd.clone(), 1).unwrap();
        let d = Driver::start(c.clone(), Some(h));
        let dbg = d.e.debug_kv().await.unwrap();
        assert_eq!(
            (dbg.max_num_seqs, dbg.configured_max_num_seqs),
            (want, 8),
            "{inst}"
        );
    }
}

/// A dropped receiver (the client went away) is cancelled at the next step: blocks freed,
/// counted as abandoned with the tokens made for it. A request the API stopped (stop string)
/// is not an abandonment.
#[tokio::test]
async fn an_abandoned_request_is_cancelled_and_its_tokens_counted_a_stopped_one_is_not() {
    let d = Driver::start(reserve_cfg(), None);
    let (_, rx) = d.e.submit(long(Criticality::Default, 100)).unwrap();
    for _ in 0..4 {
        d.step().await; // prefill + 3 more tokens: 4 generated
    }
    assert!(d.e.status().kv.num_blocks_used > 0);
    drop(rx);
    // The engine is already inside the next forward: that step finishes (a 5th token nobody
    // reads), then the sequence is cancelled before any other.
    d.permits.send(()).unwrap();
    wait(&d.e, "the abandonment", |s| s.abandoned_total == 1).await;
    let s = d.e.status();
    assert_eq!((s.abandoned_tokens_total, s.num_running), (5, 0));
    assert_eq!(s.steps, 5, "no forward ran for it after the cancel");
    assert_eq!(s.kv.num_blocks_used, 0, "its blocks are free");

    let (id, rx) = d.e.submit(long(Criticality::Default, 100)).unwrap();
    d.step().await;
    d.e.stop(id);
    drop(rx);
    d.permits.send(()).unwrap();
    wait(&d.e, "the stop", |s| s.num_running == 0).await;
    assert_eq!(
        d.e.status().abandoned_total,
        1,
        "a stop is not an abandonment"
    );
}
