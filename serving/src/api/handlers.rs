//! Request handlers.

use std::convert::Infallible;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

use brownout_protocol::wire;
use brownout_protocol::{Category, Criticality};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::error::ApiError;
use super::openai::{
    ChatRequest, CommonParams, CompletionRequest, Validated, chat_messages, completion_prompt,
    validate_common,
};
use super::text::TextAssembler;
use super::{AppState, Inner};
use crate::gate::{MetaError, Outcome, Refusal, RequestMeta, RouteChoice, UserPermit};
use crate::model::Route;
use crate::scheduler::engine::{EngineRequest, SeqEvent, SeqStats, SubmitError};
use crate::scheduler::{AdmissionError, FinishReason, SamplingParams};
use crate::telemetry::RequestRecord;

pub use crate::gate::meta::{
    CONVERSATION_HEADER, CRITICALITY_HEADER, FEATURE_HEADER, TRACEPARENT_HEADER, USER_HEADER,
};

/// Who is asking, and what the degradation state lets them have.
#[derive(Debug, Clone)]
pub struct RequestCtx {
    pub criticality: Criticality,
    pub feature: String,
    pub route: Route,
    pub max_tokens_cap: Option<usize>,
    pub tier: u8,
    pub started: Instant,
    /// `(epoch, version)` of the command it was admitted under.
    pub command: (u64, u64),
    pub user: Option<String>,
    pub conversation: Option<String>,
    /// The per-user slot, given back when the last clone of the context is dropped (the end of
    /// the request, or the client going away).
    _permit: Option<Arc<UserPermit>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Completion,
    Chat,
}

/// Runs the gate (docs/SERVING.md "Admission"): the tier rules, the stop-bleed actions and the
/// agent guards.
///
/// # Errors
/// The gate's refusal as an HTTP error (counted, traced and exported as a deliberate outcome).
pub(crate) fn admit(st: &Inner, meta: RequestMeta) -> Result<RequestCtx, ApiError> {
    st.metrics.set_tier(st.control.tier().as_u8());
    st.metrics.inc_arrival(meta.retry);
    match st.gate.admit(&meta) {
        Ok(a) => Ok(RequestCtx {
            criticality: meta.criticality,
            route: match a.route {
                RouteChoice::Fallback if st.fallback_available => Route::Fallback,
                _ => Route::Primary,
            },
            max_tokens_cap: a.max_tokens_cap.map(|c| c as usize),
            tier: a.tier.as_u8(),
            started: Instant::now(),
            command: a.command,
            user: meta.user,
            conversation: meta.conversation,
            feature: meta.feature,
            _permit: a.permit.map(Arc::new),
        }),
        Err(r) => {
            refused(st, &meta, &r);
            Err(refusal_error(r))
        }
    }
}

/// The HTTP answer to a refusal: OpenAI's error shape plus `outcome`, `Retry-After` and the
/// `x-brownout-outcome` header.
pub fn refusal_error(r: Refusal) -> ApiError {
    let status =
        StatusCode::from_u16(r.outcome.status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let mut e = ApiError::new(status, r.outcome.code(), r.message)
        .with("outcome", json!(r.outcome.as_str()));
    for (k, v) in r.extra {
        e.extra.insert(k, v);
    }
    e.retry_after_s = r.retry_after_s;
    e.outcome = Some(r.outcome.as_str());
    e
}

/// A refused request is counted under its outcome and still becomes a span and a failure event,
/// both marked deliberate.
fn refused(st: &Inner, meta: &RequestMeta, r: &Refusal) {
    record_refusal(&st.metrics, &st.telemetry, &st.model_name, meta, r);
}

/// [`refused`] for any front (the engine's API, the `--upstream` proxy): the refusal counted
/// under its outcome, traced as deliberate for `model`.
pub(crate) fn record_refusal(
    metrics: &crate::metrics::Metrics,
    telemetry: &crate::telemetry::Telemetry,
    model: &str,
    meta: &RequestMeta,
    r: &Refusal,
) {
    let crit = meta.criticality.as_str();
    metrics.inc_refusal(r.outcome, &meta.feature, crit);
    match r.outcome {
        Outcome::Shed => metrics.inc_shed(crit),
        Outcome::FeatureDisabled => metrics.inc_feature_disabled(&meta.feature),
        _ => {}
    }
    tracing::debug!(outcome = r.outcome.as_str(), detail = %r.detail, "request refused");
    telemetry.request(RequestRecord {
        request_id: String::new(),
        model: model.to_string(),
        route: "none",
        criticality: meta.criticality,
        feature: meta.feature.clone(),
        tier: r.tier.as_u8(),
        prompt_tokens: 0,
        completion_tokens: 0,
        queue_s: 0.0,
        ttft_s: 0.0,
        num_preemptions: 0,
        latency_s: 0.0,
        finish_reason: None,
        failure: Some((r.outcome.category(), r.detail.clone())),
        outcome: r.outcome.as_str().to_string(),
        deliberate: true,
        command: r.command,
        user: meta.user.clone(),
        conversation: meta.conversation.clone(),
    });
}

pub(crate) fn meta_error(e: MetaError) -> ApiError {
    let mut a = ApiError::bad_request(e.code, e.message);
    a.param = e.param;
    a
}

pub(crate) fn body_error(e: BytesRejection) -> ApiError {
    let status = e.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            status,
            "body_too_large",
            "request body is larger than the limit",
        )
    } else {
        ApiError::new(status, "invalid_body", e.body_text())
    }
}

pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<T, ApiError> {
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("");
        if !ct.starts_with("application/json") && !ct.is_empty() {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_content_type",
                "Content-Type must be application/json",
            ));
        }
    }
    let text = std::str::from_utf8(body).map_err(|e| {
        ApiError::bad_request(
            "invalid_utf8",
            format!(
                "request body is not valid UTF-8 (at byte {})",
                e.valid_up_to()
            ),
        )
    })?;
    serde_json::from_str(text).map_err(|e| {
        ApiError::bad_request(
            "invalid_json",
            format!("request body is not a valid request: {e}"),
        )
    })
}

/// What the two OpenAI endpoints tell apart: their request type, its tools, and its input to
/// tokenize (checked before admission, encoded after it).
pub trait Endpoint: serde::de::DeserializeOwned {
    const KIND: Kind;
    fn common(&self) -> &CommonParams;
    /// The declared tools (checked against the `tool:<name>` breakers).
    fn tools(&self) -> Vec<&str> {
        Vec::new()
    }
    fn input(&self) -> Result<Input, ApiError>;
}

/// A request's checked input.
pub enum Input {
    Text(String),
    Chat(Vec<(String, String)>),
}

impl Endpoint for CompletionRequest {
    const KIND: Kind = Kind::Completion;
    fn common(&self) -> &CommonParams {
        &self.common
    }
    fn input(&self) -> Result<Input, ApiError> {
        completion_prompt(&self.prompt).map(Input::Text)
    }
}

impl Endpoint for ChatRequest {
    const KIND: Kind = Kind::Chat;
    fn common(&self) -> &CommonParams {
        &self.common
    }
    fn tools(&self) -> Vec<&str> {
        self.tool_names()
    }
    fn input(&self) -> Result<Input, ApiError> {
        chat_messages(&self.messages).map(Input::Chat)
    }
}

/// `POST /v1/completions` (`R` = [`CompletionRequest`]) and `POST /v1/chat/completions`
/// ([`ChatRequest`]): headers, body, validation, admission, then generation.
pub async fn endpoint<R: Endpoint>(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = async {
        let meta = RequestMeta::from_headers(&headers).map_err(meta_error)?;
        let body = body.map_err(body_error)?;
        let req: R = parse_json(&headers, &body)?;
        let tools = req.tools();
        let meta = meta
            .with_body(req.common().user.as_deref(), tools.iter().copied())
            .map_err(meta_error)?;
        let v = validate_common(
            req.common(),
            &st.inner.model_name,
            st.inner.engine.max_model_len(),
        )?;
        let input = req.input()?;
        let ctx = admit(&st.inner, meta)?;
        let tokens = match &input {
            Input::Text(prompt) => st.inner.codec.encode(prompt),
            Input::Chat(msgs) => st.inner.codec.encode_chat(msgs),
        };
        generate(&st, ctx, tokens, v, R::KIND).await
    }
    .await;
    r.unwrap_or_else(IntoResponse::into_response)
}

fn admission_error(e: AdmissionError) -> ApiError {
    match e {
        AdmissionError::TooLong { .. } => {
            ApiError::bad_request("context_length_exceeded", e.to_string()).param("max_tokens")
        }
        AdmissionError::OverKvQuota { .. } => {
            ApiError::bad_request("kv_quota_exceeded", e.to_string()).param("max_tokens")
        }
        AdmissionError::EmptyPrompt => {
            ApiError::bad_request("empty_prompt", e.to_string()).param("prompt")
        }
        AdmissionError::Duplicate(_) => {
            ApiError::new(StatusCode::CONFLICT, "duplicate_request", e.to_string())
        }
    }
}

fn failure_error(category: Category, message: &str) -> ApiError {
    match category {
        Category::ModelError => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "model_error",
            "the model failed on this request",
        ),
        Category::TimeoutResource => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "timeout_resource",
            message.to_string(),
        ),
        _ => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "kv_cache_exhausted",
            message.to_string(),
        ),
    }
}

async fn generate(
    st: &AppState,
    ctx: RequestCtx,
    tokens: Vec<u32>,
    v: Validated,
    kind: Kind,
) -> Result<Response, ApiError> {
    let inner = &st.inner;
    let max_model_len = inner.engine.max_model_len();
    if tokens.len() >= max_model_len {
        return Err(ApiError::bad_request(
            "context_length_exceeded",
            format!(
                "the prompt is {} tokens; this model's context length is {max_model_len}",
                tokens.len()
            ),
        )
        .param(if kind == Kind::Chat {
            "messages"
        } else {
            "prompt"
        }));
    }
    let room = max_model_len - tokens.len();
    let mut max_tokens = match (v.max_tokens, kind) {
        (Some(m), _) => m,
        (None, Kind::Completion) => inner.default_max_tokens_completion.min(room),
        (None, Kind::Chat) => inner.default_max_tokens_chat.min(room),
    };
    if let Some(cap) = ctx.max_tokens_cap {
        max_tokens = max_tokens.min(cap);
    }
    let params = SamplingParams {
        temperature: v.temperature,
        top_p: v.top_p,
        seed: v.seed,
        max_tokens,
        stop: v.stop.clone(),
        ignore_eos: v.ignore_eos,
    };
    let prompt_tokens = tokens.len();
    let req = EngineRequest {
        prompt: tokens,
        params,
        criticality: ctx.criticality,
        route: ctx.route,
    };
    let (id, erx) = inner.engine.submit(req).map_err(|e| match e {
        SubmitError::Admission(a) => admission_error(a),
        SubmitError::QueueFull => {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "engine_overloaded",
                "the engine queue is full; retry shortly",
            );
            e.retry_after_s = Some(1);
            e
        }
        SubmitError::Stopped => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "engine_stopped",
            "the engine is not running",
        ),
    })?;
    let prefix = if kind == Kind::Chat {
        "chatcmpl"
    } else {
        "cmpl"
    };
    let meta = Meta {
        engine_id: id,
        id: format!("{prefix}-{id}"),
        created: inner.created_s,
        model: inner.model_name.clone(),
        kind,
        prompt_tokens,
    };
    if v.stream {
        Ok(stream_response(st.clone(), ctx, meta, v, erx))
    } else {
        collect_response(st, ctx, meta, v, erx).await
    }
}

struct Meta {
    /// The engine's request id (for [`EngineHandle::stop`]).
    engine_id: u64,
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    prompt_tokens: usize,
}

impl Meta {
    fn usage(&self, completion: usize, cached: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    fn chunk(&self, text: Option<&str>, role: bool, finish: Option<&str>) -> Value {
        match self.kind {
            Kind::Completion => json!({
                "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish}],
            }),
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({
                    "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
                })
            }
        }
    }
}

fn record(
    st: &AppState,
    ctx: &RequestCtx,
    meta: &Meta,
    stats: &SeqStats,
    outcome: Result<&str, (Category, &str)>,
) {
    let label = outcome.unwrap_or("error");
    st.inner
        .metrics
        .inc_request(label, &ctx.feature, ctx.criticality.as_str());
    st.inner.telemetry.request(RequestRecord {
        request_id: meta.id.clone(),
        model: meta.model.clone(),
        route: ctx.route.as_str(),
        criticality: ctx.criticality,
        feature: ctx.feature.clone(),
        tier: ctx.tier,
        prompt_tokens: meta.prompt_tokens,
        completion_tokens: stats.completion_tokens,
        queue_s: stats.queue_s,
        ttft_s: stats.ttft_s,
        num_preemptions: stats.num_preemptions,
        latency_s: ctx.started.elapsed().as_secs_f64(),
        finish_reason: outcome.ok().map(str::to_string),
        failure: outcome.err().map(|(c, m)| (c, m.to_string())),
        outcome: label.to_string(),
        deliberate: false,
        command: ctx.command,
        user: ctx.user.clone(),
        conversation: ctx.conversation.clone(),
    });
}

/// Records the request as `abort` if it is dropped before it finished (the client went away
/// from a non-streaming request: the handler's future is dropped).
struct AbortGuard<'a> {
    st: &'a AppState,
    ctx: &'a RequestCtx,
    meta: &'a Meta,
    armed: bool,
}

impl Drop for AbortGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            record(
                self.st,
                self.ctx,
                self.meta,
                &SeqStats::default(),
                Ok("abort"),
            );
        }
    }
}

async fn collect_response(
    st: &AppState,
    ctx: RequestCtx,
    meta: Meta,
    v: Validated,
    mut erx: mpsc::UnboundedReceiver<SeqEvent>,
) -> Result<Response, ApiError> {
    let codec = st.inner.codec.clone();
    let mut asm = TextAssembler::new(move |ids: &[u32]| codec.decode(ids), v.stop);
    let mut text = String::new();
    let mut guard = AbortGuard {
        st,
        ctx: &ctx,
        meta: &meta,
        armed: true,
    };
    let (reason, stats) = loop {
        match erx.recv().await {
            Some(SeqEvent::Token(t)) => {
                text.push_str(&asm.push(t));
                if asm.is_stopped() {
                    break stopped(&st, meta.engine_id, asm.num_tokens());
                }
            }
            Some(SeqEvent::Finished { reason, stats }) => {
                text.push_str(&asm.finish());
                break (reason, stats);
            }
            Some(SeqEvent::Failed {
                category,
                message,
                stats,
            }) => {
                guard.armed = false;
                record(st, &ctx, &meta, &stats, Err((category, &message)));
                return Err(failure_error(category, &message));
            }
            None => {
                guard.armed = false;
                let stats = SeqStats::default();
                record(
                    st,
                    &ctx,
                    &meta,
                    &stats,
                    Err((Category::Other, "engine stopped")),
                );
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "engine_stopped",
                    "the engine stopped",
                ));
            }
        }
    };
    guard.armed = false;
    drop(guard);
    drop(erx);
    let completion = if stats.completion_tokens == 0 {
        asm.num_tokens()
    } else {
        stats.completion_tokens
    };
    record(st, &ctx, &meta, &stats, Ok(reason.as_str()));
    let usage = meta.usage(completion, stats.cached_prompt_tokens);
    let body = match meta.kind {
        Kind::Completion => json!({
            "id": meta.id, "object": "text_completion", "created": meta.created, "model": meta.model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": reason.as_str()}],
            "usage": usage,
        }),
        Kind::Chat => json!({
            "id": meta.id, "object": "chat.completion", "created": meta.created, "model": meta.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null,
                         "finish_reason": reason.as_str()}],
            "usage": usage,
        }),
    };
    let mut r = Json(body).into_response();
    r.headers_mut().insert(
        wire::header::ROUTE,
        header::HeaderValue::from_static(ctx.route.as_str()),
    );
    Ok(r)
}

fn stream_response(
    st: AppState,
    ctx: RequestCtx,
    meta: Meta,
    v: Validated,
    mut erx: mpsc::UnboundedReceiver<SeqEvent>,
) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(64);
    let route = ctx.route;
    tokio::spawn(async move {
        let send = |v: Value| {
            let tx = tx.clone();
            async move {
                tx.send(Ok(Event::default().data(v.to_string())))
                    .await
                    .is_ok()
            }
        };
        let codec = st.inner.codec.clone();
        let mut asm = TextAssembler::new(move |ids: &[u32]| codec.decode(ids), v.stop);
        if meta.kind == Kind::Chat && !send(meta.chunk(None, true, None)).await {
            return;
        }
        let (reason, stats) = loop {
            let event = tokio::select! {
                ev = erx.recv() => ev,
                // The client went away (the server dropped the response body) while nothing
                // was being sent — above all while the request waited for its first token.
                // Dropping `erx` now cancels it in the engine before its prefill, instead of at
                // its first token: no work is done for it, and no TTFT longer than any client
                // waited is recorded.
                () = tx.closed() => {
                    record(&st, &ctx, &meta, &SeqStats::default(), Ok("abort"));
                    return;
                }
            };
            match event {
                Some(SeqEvent::Token(t)) => {
                    let d = asm.push(t);
                    if !d.is_empty() && !send(meta.chunk(Some(&d), false, None)).await {
                        record(&st, &ctx, &meta, &SeqStats::default(), Ok("abort"));
                        return; // client gone: dropping erx aborts the sequence
                    }
                    if asm.is_stopped() {
                        break stopped(&st, meta.engine_id, asm.num_tokens());
                    }
                }
                Some(SeqEvent::Finished { reason, stats }) => {
                    let d = asm.finish();
                    if !d.is_empty() {
                        send(meta.chunk(Some(&d), false, None)).await;
                    }
                    break (reason, stats);
                }
                Some(SeqEvent::Failed {
                    category,
                    message,
                    stats,
                }) => {
                    record(&st, &ctx, &meta, &stats, Err((category, &message)));
                    send(failure_error(category, &message).body()).await;
                    let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
                    return;
                }
                None => {
                    send(
                        ApiError::new(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "engine_stopped",
                            "the engine stopped",
                        )
                        .body(),
                    )
                    .await;
                    let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
                    return;
                }
            }
        };
        drop(erx);
        let completion = if stats.completion_tokens == 0 {
            asm.num_tokens()
        } else {
            stats.completion_tokens
        };
        record(&st, &ctx, &meta, &stats, Ok(reason.as_str()));
        send(meta.chunk(None, false, Some(reason.as_str()))).await;
        if v.include_usage {
            let mut u = meta.chunk(None, false, None);
            u["choices"] = json!([]);
            u["usage"] = meta.usage(completion, stats.cached_prompt_tokens);
            send(u).await;
        }
        let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
    });
    let mut r = Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response();
    r.headers_mut().insert(
        wire::header::ROUTE,
        header::HeaderValue::from_static(route.as_str()),
    );
    r
}

pub async fn models(State(st): State<AppState>) -> Json<Value> {
    model_list(
        &st.inner.model_name,
        st.inner.created_s,
        json!(st.inner.model_name),
        json!(st.inner.engine.max_model_len()),
    )
}

/// A stop string was reached: the engine stops the sequence, which ends with `stop` and the
/// `completion_tokens` the text assembler took.
fn stopped(st: &AppState, engine_id: u64, completion_tokens: usize) -> (FinishReason, SeqStats) {
    st.inner.engine.stop(engine_id);
    (
        FinishReason::Stop,
        SeqStats {
            completion_tokens,
            ..SeqStats::default()
        },
    )
}

/// `/v1/models`' answer: the one served model (`root` and `max_model_len` are what the engine or
/// the upstream says; `null` when it does not say).
pub fn model_list(id: &str, created_s: u64, root: Value, max_model_len: Value) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": id, "object": "model", "created": created_s, "owned_by": "brownout",
            "root": root, "parent": null, "max_model_len": max_model_len,
        }],
    }))
}

/// `/health`: 200 `ok` when serving; 503 while loading, after an engine stop, and while this
/// instance's command entry says drain (`{"status": "draining"}` with `Retry-After`), so a load
/// balancer's readiness check takes a draining instance out of rotation.
pub async fn health(State(st): State<AppState>) -> Response {
    if st.inner.engine.is_stopped() {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "engine_stopped",
            "the engine is not running",
        )
        .into_response();
    }
    let ready = st.inner.ready.load(std::sync::atomic::Ordering::Relaxed);
    let instance = st.inner.control.instance_id();
    let tier = st.inner.control.tier().as_u8();
    if ready && let Some(d) = st.inner.gate.draining() {
        let mut r = (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "status": "draining", "model": st.inner.model_name, "tier": tier,
                "instance": instance, "reason": d.entry.reason,
                "admits": "critical requests only",
            })),
        )
            .into_response();
        r.headers_mut().insert(
            header::RETRY_AFTER,
            header::HeaderValue::from(st.inner.gate.config().drain_retry_after_s),
        );
        return r;
    }
    if ready {
        Json(json!({"status": "ok", "model": st.inner.model_name, "tier": tier, "instance": instance})).into_response()
    } else {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "the model is still loading",
        )
        .into_response()
    }
}

pub async fn metrics(State(st): State<AppState>) -> Response {
    st.inner.metrics.set_tier(st.inner.control.tier().as_u8());
    st.inner.metrics.set_gate(&st.inner.gate.figures());
    let body = st.inner.metrics.render() + &st.inner.telemetry.render_metrics();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

pub async fn debug_kv(State(st): State<AppState>) -> Response {
    match st.inner.engine.debug_kv().await {
        Some(d) => {
            // The instance id lets a gpu-agent report the id commands address this tier by.
            let mut v = serde_json::to_value(&d).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                o.insert("instance_id".into(), st.inner.control.instance_id().into());
            }
            Json(v).into_response()
        }
        None => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "engine_stopped",
            "the engine is not running",
        )
        .into_response(),
    }
}

/// `/debug/resource`: the gate (drain, admission bucket, per-user cap and its top offenders,
/// abort list, probes, refusals by outcome) and the engine's limits (scheduling policy,
/// `max_num_seqs` in force, the critical reserve and its use, abandoned requests).
pub async fn debug_resource(State(st): State<AppState>) -> Response {
    let Some(kv) = st.inner.engine.debug_kv().await else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "engine_stopped",
            "the engine is not running",
        )
        .into_response();
    };
    let status = st.inner.engine.status();
    let mut v = st.inner.gate.debug();
    v["engine"] = json!({
        "scheduling_policy": kv.scheduling_policy,
        "max_num_seqs": {"configured": kv.configured_max_num_seqs, "in_force": kv.max_num_seqs},
        "critical_reserve": {
            "ratio": kv.critical_reserve_ratio,
            "seqs": kv.critical_reserve.seqs,
            "seqs_used": kv.critical_reserve.seqs_used,
            "blocks": kv.critical_reserve.blocks,
            "blocks_used": kv.critical_reserve.blocks_used,
        },
        "num_running": kv.running.len(),
        "num_waiting": kv.waiting.len(),
        "kv_blocks_used": kv.pool.num_blocks_used,
        "kv_blocks_total": kv.pool.num_blocks_total,
        "abandoned_total": status.abandoned_total,
        "abandoned_tokens_total": status.abandoned_tokens_total,
    });
    Json(v).into_response()
}

pub async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}
