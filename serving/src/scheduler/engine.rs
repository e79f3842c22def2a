//! The engine loop: one dedicated OS thread owns the [`Scheduler`] and the model backend (the
//! forward pass is CPU-heavy and must not sit on tokio's workers). Async code talks to it
//! through an [`EngineHandle`]: a bounded inbox, one unbounded event channel per request (bounded
//! in practice by `max_tokens`), and shared status for `/metrics`.
//!
//! ```text
//!  handlers ──submit──> inbox (bounded) ──> engine thread: schedule → forward → sample
//!     ^                                            │
//!     └──────── SeqEvent::{Token, Finished, Failed} per request
//! ```
//! A request whose receiver is dropped (the client went away) is aborted at the next step, its
//! blocks freed, and counted as *abandoned* with the tokens generated for it
//! (`brownout_serving_abandoned_{requests,tokens}_total`). The API ends a request whose stop
//! string it saw with [`EngineHandle::stop`] first, so that is a finish, not an abandonment.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use brownout_protocol::{Category, Criticality, KvStats};
use tokio::sync::{mpsc, oneshot};

use super::batch::{
    AdmissionError, FinishReason, NewSeq, ReserveStats, Scheduler, SchedulerConfig,
};
use super::sampling::SamplingParams;
use crate::control::ControlHandle;
use crate::kvcache::{KvCacheManager, KvConfig, SeqId, SeqKvInfo};
use crate::metrics::Metrics;
use crate::model::{Route, SeqChunk};

/// What the engine needs from a model: a forward pass over sequence chunks whose K/V live in
/// the blocks of their block tables. Returns the last position's logits per chunk.
pub trait ModelBackend: Send + 'static {
    /// # Errors
    /// A message describing what failed (reported to the client as a model error).
    fn forward(&mut self, route: Route, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, String>;
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub model_name: String,
    pub sched: SchedulerConfig,
    pub kv: KvConfig,
    pub eos_token_ids: Vec<u32>,
    /// A request waiting longer than this for KV blocks fails with `timeout_resource`.
    pub max_queue_wait: Duration,
    /// Capacity of the inbox; a full inbox refuses new requests (HTTP 503).
    pub inbox_capacity: usize,
    /// Simulated GPU pace (`--simulate-step-ms`): every scheduler step that runs the model takes
    /// at least this long (the real forward runs, then the thread sleeps for the rest, as a GPU
    /// step would keep the batch busy), so a small CPU model has a GPU-like capacity bound by
    /// step time and sequence slots rather than by the CPU it shares. `None`: no padding.
    pub simulate_step: Option<Duration>,
}

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig {
            model_name: "model".into(),
            sched: SchedulerConfig::default(),
            kv: KvConfig::default(),
            eos_token_ids: Vec::new(),
            max_queue_wait: Duration::from_secs(60),
            inbox_capacity: 4096,
            simulate_step: None,
        }
    }
}

/// A generation request.
#[derive(Debug, Clone)]
pub struct EngineRequest {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub criticality: Criticality,
    pub route: Route,
}

/// Figures about one finished request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeqStats {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_prompt_tokens: usize,
    pub num_preemptions: u32,
    pub queue_s: f64,
    pub ttft_s: f64,
    pub e2e_s: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum SeqEvent {
    Token(u32),
    Finished {
        reason: FinishReason,
        stats: SeqStats,
    },
    Failed {
        category: Category,
        message: String,
        stats: SeqStats,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    #[error("the engine queue is full")]
    QueueFull,
    #[error("the engine has stopped")]
    Stopped,
}

/// `/debug/kv`'s content.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DebugKv {
    pub mode: &'static str,
    pub pool: KvStats,
    pub num_free_blocks: usize,
    pub num_cached_blocks: usize,
    pub kv_quota_blocks: usize,
    /// In force now.
    pub max_num_seqs: usize,
    /// As configured (`--max-num-seqs`).
    pub configured_max_num_seqs: usize,
    /// `fcfs` or `priority`.
    pub scheduling_policy: &'static str,
    pub critical_reserve_ratio: f64,
    pub critical_reserve: ReserveStats,
    pub running: Vec<u64>,
    pub waiting: Vec<u64>,
    pub sequences: Vec<SeqKvInfo>,
}

enum EngineMsg {
    Add {
        id: u64,
        req: EngineRequest,
        tx: mpsc::UnboundedSender<SeqEvent>,
        arrived: Instant,
    },
    DebugKv(oneshot::Sender<DebugKv>),
    SetKvQuota(usize),
    /// The API saw a stop string: finish the request (not an abandonment).
    Stop(u64),
    Batch(Vec<EngineMsg>),
}

/// Status published by the engine after every step.
#[derive(Debug, Clone, Default)]
pub struct EngineStatus {
    pub kv: KvStats,
    pub num_running: usize,
    pub num_waiting: usize,
    pub num_preemptions_total: u64,
    /// In force now (the configured value lowered by the command or this instance's entry).
    pub max_num_seqs: usize,
    pub steps: u64,
    pub critical_reserve: ReserveStats,
    /// Requests whose client went away before they finished.
    pub abandoned_total: u64,
    /// Tokens generated for them (wasted work).
    pub abandoned_tokens_total: u64,
}

struct Shared {
    status: Mutex<EngineStatus>,
    max_model_len: usize,
    block_size: usize,
    kv_quota_blocks: AtomicUsize,
    /// Most blocks one non-critical request may need (the pool less the critical reserve).
    noncritical_block_cap: AtomicUsize,
    stopped: AtomicBool,
}

/// Cloneable handle on a running engine.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<EngineMsg>,
    shared: Arc<Shared>,
    next_id: Arc<AtomicU64>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle").finish_non_exhaustive()
    }
}

impl EngineHandle {
    /// Checks a request's shape against `max_model_len` and the KV quota.
    ///
    /// # Errors
    /// [`AdmissionError`] when it can never run.
    pub fn check_admission(
        &self,
        prompt_len: usize,
        max_tokens: usize,
    ) -> Result<(), AdmissionError> {
        self.check_admission_for(prompt_len, max_tokens, Criticality::Critical)
    }

    /// As [`EngineHandle::check_admission`] for a request of `criticality`: a non-critical one
    /// must also fit outside the critical reserve.
    ///
    /// # Errors
    /// [`AdmissionError`] when it can never run.
    pub fn check_admission_for(
        &self,
        prompt_len: usize,
        max_tokens: usize,
        criticality: Criticality,
    ) -> Result<(), AdmissionError> {
        if prompt_len == 0 {
            return Err(AdmissionError::EmptyPrompt);
        }
        if prompt_len + max_tokens > self.shared.max_model_len {
            return Err(AdmissionError::TooLong {
                prompt: prompt_len,
                max_tokens,
                max_model_len: self.shared.max_model_len,
            });
        }
        let needed = (prompt_len + max_tokens).div_ceil(self.shared.block_size);
        let mut quota = self.shared.kv_quota_blocks.load(Ordering::Relaxed);
        if criticality != Criticality::Critical {
            quota = quota.min(self.shared.noncritical_block_cap.load(Ordering::Relaxed));
        }
        if needed > quota {
            return Err(AdmissionError::OverKvQuota { needed, quota });
        }
        Ok(())
    }

    /// Queues a request; its events arrive on the returned receiver. Drop the receiver to abort.
    ///
    /// # Errors
    /// [`SubmitError`]: refused at admission, queue full, engine stopped.
    pub fn submit(
        &self,
        req: EngineRequest,
    ) -> Result<(u64, mpsc::UnboundedReceiver<SeqEvent>), SubmitError> {
        self.check_admission_for(req.prompt.len(), req.params.max_tokens, req.criticality)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        self.tx
            .try_send(EngineMsg::Add {
                id,
                req,
                tx,
                arrived: Instant::now(),
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => SubmitError::QueueFull,
                mpsc::error::TrySendError::Closed(_) => SubmitError::Stopped,
            })?;
        Ok((id, rx))
    }

    /// Queues several requests in one message: the engine admits all of them before its next
    /// step (deterministic batching for tests and benchmarks).
    ///
    /// # Errors
    /// As [`EngineHandle::submit`]; nothing is queued on error.
    pub fn submit_batch(
        &self,
        reqs: Vec<EngineRequest>,
    ) -> Result<Vec<(u64, mpsc::UnboundedReceiver<SeqEvent>)>, SubmitError> {
        for r in &reqs {
            self.check_admission_for(r.prompt.len(), r.params.max_tokens, r.criticality)?;
        }
        let mut msgs = Vec::with_capacity(reqs.len());
        let mut out = Vec::with_capacity(reqs.len());
        let arrived = Instant::now();
        for req in reqs {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = mpsc::unbounded_channel();
            msgs.push(EngineMsg::Add {
                id,
                req,
                tx,
                arrived,
            });
            out.push((id, rx));
        }
        self.tx
            .try_send(EngineMsg::Batch(msgs))
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => SubmitError::QueueFull,
                mpsc::error::TrySendError::Closed(_) => SubmitError::Stopped,
            })?;
        Ok(out)
    }

    pub async fn debug_kv(&self) -> Option<DebugKv> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(EngineMsg::DebugKv(tx)).await.ok()?;
        rx.await.ok()
    }

    /// Ends request `id` as finished (`stop`) — the API calls it when it saw a stop string,
    /// before dropping the receiver, so the engine does not count it as abandoned. Best effort:
    /// with the inbox full the request is aborted as a gone client.
    pub fn stop(&self, id: u64) {
        let _ = self.tx.try_send(EngineMsg::Stop(id));
    }

    /// Sets the most KV blocks one request may hold.
    pub async fn set_kv_quota_blocks(&self, n: usize) {
        self.shared.kv_quota_blocks.store(n, Ordering::Relaxed);
        let _ = self.tx.send(EngineMsg::SetKvQuota(n)).await;
    }

    pub fn status(&self) -> EngineStatus {
        self.shared
            .status
            .lock()
            .expect("status lock never poisoned")
            .clone()
    }

    pub fn max_model_len(&self) -> usize {
        self.shared.max_model_len
    }

    pub fn is_stopped(&self) -> bool {
        self.shared.stopped.load(Ordering::Relaxed)
    }
}

struct ReqState {
    tx: mpsc::UnboundedSender<SeqEvent>,
    arrived: Instant,
    scheduled_at: Option<Instant>,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
}

/// Starts the engine thread. It stops when every [`EngineHandle`] is dropped.
///
/// # Errors
/// When the OS refuses a thread.
pub fn spawn_engine<B: ModelBackend>(
    cfg: EngineConfig,
    backend: B,
    metrics: Arc<Metrics>,
    control: Option<ControlHandle>,
) -> std::io::Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel(cfg.inbox_capacity.max(1));
    let shared = Arc::new(Shared {
        status: Mutex::new(EngineStatus {
            max_num_seqs: cfg.sched.max_num_seqs,
            ..EngineStatus::default()
        }),
        max_model_len: cfg.sched.max_model_len,
        block_size: cfg.kv.block_size,
        kv_quota_blocks: AtomicUsize::new(cfg.kv.num_blocks),
        noncritical_block_cap: AtomicUsize::new(cfg.kv.num_blocks),
        stopped: AtomicBool::new(false),
    });
    let handle = EngineHandle {
        tx,
        shared: shared.clone(),
        next_id: Arc::new(AtomicU64::new(1)),
    };
    let join = std::thread::Builder::new()
        .name("brownout-engine".into())
        .spawn(move || {
            let run = std::panic::AssertUnwindSafe(|| {
                let mut e = Engine::new(cfg, backend, metrics, control, shared.clone());
                e.run(rx);
            });
            if let Err(p) = std::panic::catch_unwind(run) {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                tracing::error!(
                    panic = msg.as_deref().unwrap_or("?"),
                    "engine thread panicked; the engine is stopped"
                );
            }
            shared.stopped.store(true, Ordering::Relaxed);
        })?;
    Ok((handle, join))
}

struct Engine<B> {
    cfg: EngineConfig,
    sched: Scheduler,
    backend: B,
    metrics: Arc<Metrics>,
    control: Option<ControlHandle>,
    shared: Arc<Shared>,
    reqs: HashMap<SeqId, ReqState>,
    last_prefix: (u64, u64),
    last_preemptions: u64,
    steps: u64,
    abandoned: u64,
    abandoned_tokens: u64,
}

impl<B: ModelBackend> Engine<B> {
    fn new(
        cfg: EngineConfig,
        backend: B,
        metrics: Arc<Metrics>,
        control: Option<ControlHandle>,
        shared: Arc<Shared>,
    ) -> Self {
        let sched = Scheduler::new(cfg.sched, KvCacheManager::new(cfg.kv));
        shared
            .noncritical_block_cap
            .store(sched.noncritical_block_cap(), Ordering::Relaxed);
        Engine {
            cfg,
            sched,
            backend,
            metrics,
            control,
            shared,
            reqs: HashMap::new(),
            last_prefix: (0, 0),
            last_preemptions: 0,
            steps: 0,
            abandoned: 0,
            abandoned_tokens: 0,
        }
    }

    fn run(&mut self, mut rx: mpsc::Receiver<EngineMsg>) {
        loop {
            if !self.sched.has_work() {
                match rx.blocking_recv() {
                    Some(m) => self.handle(m),
                    None => return,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(m) => self.handle(m),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        if !self.sched.has_work() {
                            return;
                        }
                        break;
                    }
                }
            }
            self.apply_control();
            self.drop_gone_and_expired();
            if !self.step() && self.sched.has_work() {
                // Nothing could be scheduled (e.g. max_num_seqs lowered to below the running
                // count is impossible; waiting for blocks is): don't spin.
                std::thread::sleep(Duration::from_millis(2));
            }
            self.publish();
        }
    }

    fn handle(&mut self, m: EngineMsg) {
        match m {
            EngineMsg::Add {
                id,
                req,
                tx,
                arrived,
            } => {
                let prompt_len = req.prompt.len();
                let new = NewSeq {
                    id,
                    prompt: req.prompt,
                    params: req.params,
                    criticality: req.criticality,
                    route: req.route,
                    eos_token_ids: self.cfg.eos_token_ids.clone(),
                };
                match self.sched.add(new) {
                    Ok(()) => {
                        self.reqs.insert(
                            SeqId(id),
                            ReqState {
                                tx,
                                arrived,
                                scheduled_at: None,
                                first_token_at: None,
                                last_token_at: None,
                            },
                        );
                    }
                    Err(e) => {
                        let _ = tx.send(SeqEvent::Failed {
                            category: Category::KvCacheExhausted,
                            message: e.to_string(),
                            stats: SeqStats {
                                prompt_tokens: prompt_len,
                                ..SeqStats::default()
                            },
                        });
                    }
                }
            }
            EngineMsg::DebugKv(tx) => {
                // Show the limits of the command in force even when idle.
                self.apply_control();
                let kv = self.sched.kv();
                let _ = tx.send(DebugKv {
                    mode: kv.config().mode.as_str(),
                    pool: kv.stats(),
                    num_free_blocks: kv.num_free_blocks(),
                    num_cached_blocks: kv.pool().map_or(0, |p| p.num_cached()),
                    kv_quota_blocks: self.sched.kv_quota_blocks(),
                    max_num_seqs: self.sched.config().max_num_seqs,
                    configured_max_num_seqs: self.cfg.sched.max_num_seqs,
                    scheduling_policy: self.sched.config().policy.as_str(),
                    critical_reserve_ratio: self.sched.config().critical_reserve_ratio,
                    critical_reserve: self.sched.reserve_stats(),
                    running: self.sched.running_ids().iter().map(|s| s.0).collect(),
                    waiting: self.sched.waiting_ids().iter().map(|s| s.0).collect(),
                    sequences: kv.seq_infos(),
                });
            }
            EngineMsg::SetKvQuota(n) => self.sched.set_kv_quota_blocks(n),
            EngineMsg::Stop(id) => {
                if self.reqs.contains_key(&SeqId(id)) {
                    self.finish(SeqId(id), |stats| SeqEvent::Finished {
                        reason: FinishReason::Stop,
                        stats,
                    });
                }
            }
            EngineMsg::Batch(msgs) => {
                for m in msgs {
                    self.handle(m);
                }
            }
        }
    }

    fn apply_control(&mut self) {
        let base = self.cfg.sched.max_num_seqs;
        // This instance's entry, else limits.max_num_seqs, never above the configured value.
        let cap = self.control.as_ref().map_or(base, |c| c.max_num_seqs(base));
        if cap != self.sched.config().max_num_seqs {
            self.sched.set_max_num_seqs(cap);
        }
    }

    fn stats_of(&self, id: SeqId, now: Instant) -> SeqStats {
        let s = self.sched.seq(id);
        let r = self.reqs.get(&id);
        let secs = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
            _ => 0.0,
        };
        SeqStats {
            prompt_tokens: s.map_or(0, |s| s.prompt_len),
            completion_tokens: s.map_or(0, |s| s.output().len()),
            cached_prompt_tokens: s.map_or(0, |s| s.num_cached_prompt_tokens),
            num_preemptions: s.map_or(0, |s| s.num_preemptions),
            queue_s: secs(r.map(|r| r.arrived), r.and_then(|r| r.scheduled_at)),
            ttft_s: secs(r.map(|r| r.arrived), r.and_then(|r| r.first_token_at)),
            e2e_s: secs(r.map(|r| r.arrived), Some(now)),
        }
    }

    /// Ends each of `seqs` as failed with a model error saying `msg`.
    fn fail_model_error(&mut self, seqs: impl IntoIterator<Item = SeqId>, msg: &str) {
        for seq in seqs {
            self.finish(seq, |stats| SeqEvent::Failed {
                category: Category::ModelError,
                message: msg.to_string(),
                stats,
            });
        }
    }

    fn finish(&mut self, id: SeqId, ev: impl FnOnce(SeqStats) -> SeqEvent) {
        let now = Instant::now();
        let stats = self.stats_of(id, now);
        let event = ev(stats.clone());
        // vLLM's per-request histograms and `vllm:request_success_total{finished_reason}`.
        if let Some(r) = self.reqs.get(&id) {
            let secs = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
                (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
                _ => 0.0,
            };
            let reason = match &event {
                SeqEvent::Finished { reason, .. } => reason.as_str(),
                _ => "error",
            };
            self.metrics.observe_finished(
                reason,
                &crate::metrics::FinishedRequest {
                    queue_s: secs(Some(r.arrived), r.scheduled_at.or(Some(now))),
                    prefill_s: secs(r.scheduled_at, r.first_token_at),
                    decode_s: secs(r.first_token_at, r.last_token_at),
                    prompt_tokens: stats.prompt_tokens,
                    generation_tokens: stats.completion_tokens,
                },
            );
        }
        // brownout_serving_requests_total is counted by the API (it knows the feature).
        if !matches!(
            &event,
            SeqEvent::Finished {
                reason: FinishReason::Abort,
                ..
            }
        ) {
            self.metrics.observe(&self.metrics.e2e, stats.e2e_s);
        }
        if let Some(r) = self.reqs.remove(&id) {
            let _ = r.tx.send(event);
        }
        self.sched.remove(id);
    }

    fn drop_gone_and_expired(&mut self) {
        let now = Instant::now();
        let gone: Vec<SeqId> = self
            .reqs
            .iter()
            .filter(|(_, r)| r.tx.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            let tokens = self.sched.seq(id).map_or(0, |s| s.output().len()) as u64;
            self.abandoned += 1;
            self.abandoned_tokens += tokens;
            self.metrics.inc_abandoned(tokens);
            self.finish(id, |stats| SeqEvent::Finished {
                reason: FinishReason::Abort,
                stats,
            });
        }
        let expired: Vec<SeqId> = self
            .sched
            .waiting_ids()
            .into_iter()
            .filter(|id| {
                self.reqs.get(id).is_some_and(|r| {
                    r.first_token_at.is_none()
                        && now.duration_since(r.arrived) > self.cfg.max_queue_wait
                })
            })
            .collect();
        for id in expired {
            let msg = format!(
                "waited more than {:?} for KV blocks",
                self.cfg.max_queue_wait
            );
            self.finish(id, |stats| SeqEvent::Failed {
                category: Category::TimeoutResource,
                message: msg,
                stats,
            });
        }
    }

    /// One scheduling step and forward pass. Returns whether anything ran.
    fn step(&mut self) -> bool {
        let plan = self.sched.schedule();
        if plan.chunks.is_empty() {
            return false;
        }
        self.steps += 1;
        let now = Instant::now();
        for c in &plan.chunks {
            if let Some(r) = self.reqs.get_mut(&c.seq) {
                r.scheduled_at.get_or_insert(now);
            }
        }
        let mut padded = false;
        for route in [Route::Primary, Route::Fallback] {
            let chunks: Vec<_> = plan
                .chunks
                .iter()
                .copied()
                .filter(|c| self.sched.seq(c.seq).is_some_and(|s| s.route == route))
                .collect();
            if chunks.is_empty() {
                continue;
            }
            let tables: Vec<Vec<u32>> = chunks
                .iter()
                .map(|c| {
                    self.sched
                        .kv()
                        .block_table(c.seq)
                        .expect("scheduled sequence has blocks")
                        .iter()
                        .map(|b| b.0)
                        .collect()
                })
                .collect();
            let result = {
                let seq_chunks: Vec<SeqChunk<'_>> = chunks
                    .iter()
                    .zip(&tables)
                    .map(|(c, t)| {
                        let s = self.sched.seq(c.seq).expect("scheduled");
                        SeqChunk {
                            tokens: &s.tokens[c.start_pos..c.start_pos + c.num_tokens],
                            start_pos: c.start_pos,
                            block_table: t,
                        }
                    })
                    .collect();
                self.backend.forward(route, &seq_chunks)
            };
            if !padded {
                // The simulated GPU pace: the step's tokens come out no earlier than `min`.
                padded = true;
                if let Some(min) = self.cfg.simulate_step {
                    let spent = now.elapsed();
                    if spent < min {
                        std::thread::sleep(min - spent);
                    }
                }
            }
            match result {
                Ok(logits) if logits.len() == chunks.len() => {
                    for (c, l) in chunks.iter().zip(logits) {
                        self.sched.chunk_done(c);
                        if c.samples {
                            self.sample_and_emit(c.seq, &l);
                        }
                    }
                }
                Ok(logits) => {
                    let msg = format!(
                        "model returned {} logits rows for {} chunks",
                        logits.len(),
                        chunks.len()
                    );
                    self.fail_model_error(chunks.iter().map(|c| c.seq), &msg);
                }
                Err(msg) => {
                    tracing::warn!(route = route.as_str(), error = %msg, "model forward failed");
                    self.fail_model_error(chunks.iter().map(|c| c.seq), &msg);
                }
            }
        }
        true
    }

    fn sample_and_emit(&mut self, id: SeqId, logits: &[f32]) {
        let Some(s) = self.sched.seq_mut(id) else {
            return;
        };
        let tok = {
            let super::batch::Sequence {
                sampler, params, ..
            } = s;
            sampler.sample(logits, params)
        };
        let now = Instant::now();
        let is_eos = !s.params.ignore_eos && s.eos_token_ids.contains(&tok);
        let prompt_len = s.prompt_len;
        let max_tokens = s.params.max_tokens;
        if let Some(r) = self.reqs.get_mut(&id) {
            match r.last_token_at {
                None => {
                    r.first_token_at = Some(now);
                    self.metrics.observe(
                        &self.metrics.request_max_num_generation_tokens,
                        max_tokens as f64,
                    );
                    // vLLM counts a request's prompt once, cached or not, when it starts decoding.
                    self.metrics
                        .inc(&self.metrics.prompt_tokens, prompt_len as f64);
                    self.metrics.observe(
                        &self.metrics.ttft,
                        now.duration_since(r.arrived).as_secs_f64(),
                    );
                }
                Some(prev) => self
                    .metrics
                    .observe(&self.metrics.itl, now.duration_since(prev).as_secs_f64()),
            }
            r.last_token_at = Some(now);
            if !is_eos {
                // EOS ends the sequence; it is counted but never shown as text.
                let _ = r.tx.send(SeqEvent::Token(tok));
            }
        }
        self.metrics.inc(&self.metrics.generation_tokens, 1.0);
        if let Some(reason) = self.sched.append_token(id, tok) {
            self.finish(id, |stats| SeqEvent::Finished { reason, stats });
        }
    }

    fn publish(&mut self) {
        let kv = self.sched.kv();
        let stats = kv.stats();
        self.metrics.set_kv(&stats);
        self.metrics
            .set_queue(self.sched.num_running(), self.sched.num_waiting());
        let (q, h) = (kv.prefix_queries_tokens, kv.prefix_hits_tokens);
        self.metrics.inc(
            &self.metrics.prefix_cache_queries,
            (q - self.last_prefix.0) as f64,
        );
        self.metrics.inc(
            &self.metrics.prefix_cache_hits,
            (h - self.last_prefix.1) as f64,
        );
        self.last_prefix = (q, h);
        let p = self.sched.num_preemptions_total;
        self.metrics.inc(
            &self.metrics.num_preemptions,
            (p - self.last_preemptions) as f64,
        );
        self.last_preemptions = p;
        let reserve = self.sched.reserve_stats();
        self.metrics
            .set_engine_limits(self.sched.config().max_num_seqs, &reserve);
        self.shared
            .noncritical_block_cap
            .store(self.sched.noncritical_block_cap(), Ordering::Relaxed);
        let mut st = self
            .shared
            .status
            .lock()
            .expect("status lock never poisoned");
        *st = EngineStatus {
            kv: stats,
            num_running: self.sched.num_running(),
            num_waiting: self.sched.num_waiting(),
            num_preemptions_total: p,
            max_num_seqs: self.sched.config().max_num_seqs,
            steps: self.steps,
            critical_reserve: reserve,
            abandoned_total: self.abandoned,
            abandoned_tokens_total: self.abandoned_tokens,
        };
    }
}
