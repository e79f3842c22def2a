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
use brownout_protocol::{Category, Criticality, FeatureState};
use rand::Rng;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::error::ApiError;
use super::openai::{
    ChatRequest, CompletionRequest, Validated, chat_messages, completion_prompt, validate_common,
};
use super::text::TextAssembler;
use super::{AppState, Inner};
use crate::model::Route;
use crate::scheduler::engine::{EngineRequest, SeqEvent, SeqStats, SubmitError};
use crate::scheduler::{AdmissionError, FinishReason, SamplingParams};
use crate::telemetry::RequestRecord;

pub const CRITICALITY_HEADER: &str = "x-brownout-criticality";
pub const FEATURE_HEADER: &str = "x-brownout-feature";

/// Who is asking, and what the degradation state lets them have.
#[derive(Debug, Clone)]
pub struct RequestCtx {
    pub criticality: Criticality,
    pub feature: String,
    pub route: Route,
    pub max_tokens_cap: Option<usize>,
    pub tier: u8,
    pub started: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Completion,
    Chat,
}

/// Applies the tier rules to a request's headers.
///
/// # Errors
/// 400 on a bad header, 503 `feature_disabled` (T1+), 429 `shed` (T3).
pub(crate) fn admit(st: &Inner, headers: &HeaderMap) -> Result<RequestCtx, ApiError> {
    let header_str = |name: &'static str| -> Result<Option<&str>, ApiError> {
        match headers.get(name) {
            None => Ok(None),
            Some(v) => v.to_str().map(Some).map_err(|_| {
                ApiError::bad_request(
                    "invalid_header",
                    format!("header {name} must be visible ASCII"),
                )
            }),
        }
    };
    let criticality = match header_str(CRITICALITY_HEADER)? {
        None => Criticality::Default,
        Some(v) => Criticality::parse(v).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_header",
                format!(
                    "header {CRITICALITY_HEADER} must be critical, default or sheddable (got {:?})",
                    v.chars().take(40).collect::<String>()
                ),
            )
        })?,
    };
    let feature = header_str(FEATURE_HEADER)?.unwrap_or("").trim().to_string();
    if feature.len() > 128 {
        return Err(ApiError::bad_request(
            "invalid_header",
            format!("header {FEATURE_HEADER} is longer than 128 bytes"),
        ));
    }
    let applied = st.control.current();
    let cmd = &applied.command;
    let tier = cmd.tier.as_u8();
    st.metrics.set_tier(tier);
    if !feature.is_empty() && cmd.feature_state(&feature) == FeatureState::Disabled {
        st.metrics.inc_feature_disabled(&feature);
        refused(
            st,
            criticality,
            &feature,
            tier,
            Category::Degraded,
            format!("feature {feature} disabled at tier T{tier}"),
        );
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "feature_disabled",
            format!("The feature `{feature}` is temporarily disabled to protect the service (tier T{tier})."),
        )
        .with("hint", json!("Grey this feature out in the UI; GET /v1/features lists feature states and streams changes."))
        .with("feature", json!(feature))
        .with("tier", json!(tier)));
    }
    if let Some(shed) = &cmd.shed
        && criticality != Criticality::Critical
        && criticality < shed.admit_min_criticality
    {
        st.metrics.inc_shed(criticality.as_str());
        let jitter = shed.jitter_ratio.clamp(0.0, 10.0);
        let factor = if jitter > 0.0 {
            rand::rng().random_range(1.0..=1.0 + jitter)
        } else {
            1.0
        };
        let retry = (f64::from(shed.retry_after_s.max(1)) * factor).ceil() as u64;
        let eta = chrono::DateTime::from_timestamp_millis(shed.recovery_eta_ms as i64)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "shed",
            format!("The service is shedding {criticality} traffic to protect critical requests (tier T{tier}); retry after {retry} s."),
        )
        .with("estimated_recovery_at", json!(eta))
        .with("tier", json!(tier));
        e.retry_after_s = Some(retry);
        refused(
            st,
            criticality,
            &feature,
            tier,
            Category::RateLimited,
            format!("{criticality} request shed at tier T{tier}"),
        );
        return Err(e);
    }
    let class = match criticality {
        Criticality::Critical => "critical",
        Criticality::Default => "default",
        Criticality::Sheddable => {
            if cmd.model_route.contains_key("sheddable") {
                "sheddable"
            } else {
                "default"
            }
        }
    };
    let route = if cmd.route_for(class) == "fallback" && st.fallback_available {
        Route::Fallback
    } else {
        Route::Primary
    };
    let max_tokens_cap = match criticality {
        Criticality::Critical => None,
        _ => cmd.limits.max_tokens_cap.map(|c| c.max(1) as usize),
    };
    Ok(RequestCtx {
        criticality,
        feature,
        route,
        max_tokens_cap,
        tier,
        started: Instant::now(),
    })
}

/// A request refused by the degradation rules still becomes a failure event (and a span).
fn refused(
    st: &Inner,
    criticality: Criticality,
    feature: &str,
    tier: u8,
    category: Category,
    message: String,
) {
    st.telemetry.request(RequestRecord {
        request_id: String::new(),
        model: st.model_name.clone(),
        route: "none",
        criticality,
        feature: feature.to_string(),
        tier,
        prompt_tokens: 0,
        completion_tokens: 0,
        queue_s: 0.0,
        ttft_s: 0.0,
        num_preemptions: 0,
        latency_s: 0.0,
        finish_reason: None,
        failure: Some((category, message)),
    });
}

fn body_error(e: BytesRejection) -> ApiError {
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

fn parse_json<T: serde::de::DeserializeOwned>(
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

pub async fn completions(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = async {
        let ctx = admit(&st.inner, &headers)?;
        let body = body.map_err(body_error)?;
        let req: CompletionRequest = parse_json(&headers, &body)?;
        let v = validate_common(
            &req.common,
            &st.inner.model_name,
            st.inner.engine.max_model_len(),
        )?;
        let prompt = completion_prompt(&req.prompt)?;
        let tokens = st.inner.codec.encode(&prompt);
        generate(&st, ctx, tokens, v, Kind::Completion).await
    }
    .await;
    r.unwrap_or_else(IntoResponse::into_response)
}

pub async fn chat_completions(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = async {
        let ctx = admit(&st.inner, &headers)?;
        let body = body.map_err(body_error)?;
        let req: ChatRequest = parse_json(&headers, &body)?;
        let v = validate_common(
            &req.common,
            &st.inner.model_name,
            st.inner.engine.max_model_len(),
        )?;
        let msgs = chat_messages(&req.messages)?;
        let tokens = st.inner.codec.encode_chat(&msgs);
        generate(&st, ctx, tokens, v, Kind::Chat).await
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
    st.inner.metrics.inc_request(
        outcome.unwrap_or("error"),
        &ctx.feature,
        ctx.criticality.as_str(),
    );
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
    });
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
    let (reason, stats) = loop {
        match erx.recv().await {
            Some(SeqEvent::Token(t)) => {
                text.push_str(&asm.push(t));
                if asm.is_stopped() {
                    break (
                        FinishReason::Stop,
                        SeqStats {
                            completion_tokens: asm.num_tokens(),
                            ..SeqStats::default()
                        },
                    );
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
                record(st, &ctx, &meta, &stats, Err((category, &message)));
                return Err(failure_error(category, &message));
            }
            None => {
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
        "x-brownout-route",
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
            match erx.recv().await {
                Some(SeqEvent::Token(t)) => {
                    let d = asm.push(t);
                    if !d.is_empty() && !send(meta.chunk(Some(&d), false, None)).await {
                        record(&st, &ctx, &meta, &SeqStats::default(), Ok("abort"));
                        return; // client gone: dropping erx aborts the sequence
                    }
                    if asm.is_stopped() {
                        break (
                            FinishReason::Stop,
                            SeqStats {
                                completion_tokens: asm.num_tokens(),
                                ..SeqStats::default()
                            },
                        );
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
        "x-brownout-route",
        header::HeaderValue::from_static(route.as_str()),
    );
    r
}

pub async fn models(State(st): State<AppState>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.inner.model_name, "object": "model", "created": st.inner.created_s, "owned_by": "brownout",
            "root": st.inner.model_name, "parent": null, "max_model_len": st.inner.engine.max_model_len(),
        }],
    }))
}

pub async fn health(State(st): State<AppState>) -> Response {
    if st.inner.engine.is_stopped() {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "engine_stopped",
            "the engine is not running",
        )
        .into_response();
    }
    if st.inner.ready.load(std::sync::atomic::Ordering::Relaxed) {
        Json(json!({"status": "ok", "model": st.inner.model_name, "tier": st.inner.control.tier().as_u8()})).into_response()
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
        Some(d) => Json(d).into_response(),
        None => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "engine_stopped",
            "the engine is not running",
        )
        .into_response(),
    }
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
