//! The proxy's handlers: the bundled engine's request shapes and checks, the gate, then the
//! upstream (docs/UPSTREAM.md).

use std::convert::Infallible;
use std::time::Instant;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use brownout_protocol::wire;
use brownout_protocol::{Category, Criticality};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::limiter::{Slot, Wait};
use super::sse::{self, Splitter};
use super::{ProxyState, Route, describe};
use crate::api::error::ApiError;
use crate::api::handlers::{body_error, meta_error, parse_json, record_refusal, refusal_error};
use crate::api::openai::{ChatRequest, CompletionRequest, completion_prompt, validate_common};
use crate::gate::meta::{CRITICALITY_HEADER, TRACEPARENT_HEADER};
use crate::gate::{RequestMeta, UserPermit};
use crate::scheduler::batch::ReserveStats;
use crate::telemetry::RequestRecord;

/// Most bytes of one SSE event the proxy reads into for its metrics (the bytes themselves are
/// passed on whatever their size); past it the rest of the stream is passed on unread.
const MAX_EVENT_BYTES: usize = 1 << 20;
/// Most bytes of a non-streaming answer or an upstream error body.
const MAX_ANSWER_BYTES: usize = 64 << 20;
/// Request headers passed upstream as they are.
const PASSED_HEADERS: [&str; 4] = [
    TRACEPARENT_HEADER,
    "tracestate",
    "x-request-id",
    CRITICALITY_HEADER,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Completion,
    Chat,
}

impl Kind {
    fn path(self) -> &'static str {
        match self {
            Kind::Completion => "/v1/completions",
            Kind::Chat => "/v1/chat/completions",
        }
    }
}

/// An admitted request.
struct Ctx {
    criticality: Criticality,
    feature: String,
    route: &'static str,
    /// The model name sent upstream.
    model: String,
    tier: u8,
    command: (u64, u64),
    user: Option<String>,
    conversation: Option<String>,
    started: Instant,
    prompt_tokens: usize,
    queue_s: f64,
    /// The per-user slot, held until the request ends.
    _permit: Option<UserPermit>,
}

/// What the proxy saw of an answer.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    completion_tokens: usize,
    prompt_tokens: Option<usize>,
    ttft_s: f64,
}

pub async fn completions(
    State(p): State<ProxyState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(&p, Kind::Completion, &headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub async fn chat_completions(
    State(p): State<ProxyState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(&p, Kind::Chat, &headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

fn invalid(e: &serde_json::Error) -> ApiError {
    ApiError::bad_request(
        "invalid_json",
        format!("request body is not a valid request: {e}"),
    )
}

async fn handle(
    p: &ProxyState,
    kind: Kind,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let inner = &p.inner;
    let meta = RequestMeta::from_headers(headers).map_err(meta_error)?;
    let body = body.map_err(body_error)?;
    let mut v: Value = parse_json(headers, &body)?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "invalid_json",
            "request body must be a JSON object",
        ));
    }
    // The same shapes and checks as the bundled engine; the body itself goes upstream (its
    // other fields — tools, response_format, logprobs… — are the upstream's to judge).
    let (common, tools) = match kind {
        Kind::Chat => {
            let r = ChatRequest::deserialize(&v).map_err(|e| invalid(&e))?;
            if r.messages.is_empty() {
                return Err(
                    ApiError::bad_request("invalid_value", "messages must not be empty")
                        .param("messages"),
                );
            }
            let tools: Vec<String> = r.tool_names().into_iter().map(str::to_string).collect();
            (r.common, tools)
        }
        Kind::Completion => {
            let r = CompletionRequest::deserialize(&v).map_err(|e| invalid(&e))?;
            completion_prompt(&r.prompt)?;
            (r.common, Vec::new())
        }
    };
    let meta = meta
        .with_body(common.user.as_deref(), tools.iter().map(String::as_str))
        .map_err(meta_error)?;
    let max_len = inner.primary.upstream.max_model_len().unwrap_or(usize::MAX);
    let checked = validate_common(&common, &inner.served_model, max_len)?;

    // The gate.
    inner.metrics.set_tier(inner.control.tier().as_u8());
    inner.metrics.inc_arrival(meta.retry);
    let admitted = match inner.gate.admit(&meta) {
        Ok(a) => a,
        Err(r) => {
            refused(p, &meta, &r);
            return Err(refusal_error(r));
        }
    };
    let route: &Route = p.route(admitted.route);
    let model = route.model();

    // T2: the route's upstream model, and the max_tokens cap for non-critical traffic.
    let obj = v.as_object_mut().expect("checked above");
    if let Some(m) = &model {
        obj.insert("model".into(), json!(m));
    }
    if let Some(cap) = admitted.max_tokens_cap {
        let mut capped = false;
        for k in ["max_tokens", "max_completion_tokens"] {
            if let Some(n) = obj.get(k).and_then(Value::as_u64) {
                obj.insert(k.into(), json!(n.min(u64::from(cap))));
                capped = true;
            }
        }
        if !capped {
            obj.insert("max_tokens".into(), json!(cap));
        }
    }
    let mut ctx = Ctx {
        criticality: meta.criticality,
        feature: meta.feature.clone(),
        route: route.name(),
        model: model.unwrap_or_else(|| inner.served_model.clone()),
        tier: admitted.tier.as_u8(),
        command: admitted.command,
        user: meta.user.clone(),
        conversation: meta.conversation.clone(),
        started,
        prompt_tokens: 0,
        queue_s: 0.0,
        _permit: admitted.permit,
    };

    // The proxy's concurrency queue.
    let slot = match inner
        .limiter
        .acquire(meta.criticality, inner.opts.max_queue_wait)
        .await
    {
        Ok(s) => s,
        Err(w) => {
            let msg = match w {
                Wait::QueueFull => "the proxy's queue for the upstream is full; retry shortly",
                Wait::TimedOut => "no upstream slot became free in time; retry shortly",
            };
            record(
                p,
                &ctx,
                &Seen::default(),
                Err((Category::TimeoutResource, msg)),
            );
            let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "upstream_overloaded", msg);
            e.retry_after_s = Some(1);
            return Err(e);
        }
    };
    ctx.queue_s = slot.queued.as_secs_f64();
    inner
        .metrics
        .observe(&inner.metrics.queue_time, ctx.queue_s);

    // Forward.
    let mut rb = inner
        .client
        .post(format!("{}{}", route.upstream.base, kind.path()))
        .header(header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&v).expect("a Value serialises"));
    if let Some(k) = &inner.opts.api_key {
        rb = rb.bearer_auth(k);
    } else if let Some(a) = headers.get(header::AUTHORIZATION) {
        rb = rb.header(header::AUTHORIZATION, a);
    }
    for h in PASSED_HEADERS {
        if let Some(val) = headers.get(h) {
            rb = rb.header(h, val);
        }
    }
    // A client that goes away drops this future: the guard records the abort, and dropping the
    // request closes the upstream connection.
    let mut guard = AbortGuard {
        p,
        ctx: &ctx,
        armed: true,
    };
    let sent = rb.send().await;
    let resp = match sent {
        Ok(r) => {
            route.upstream.mark_up();
            r
        }
        Err(e) => {
            guard.armed = false;
            return Err(send_error(p, route, &ctx, &e));
        }
    };
    let status = resp.status();
    count(p, route, &status.as_u16().to_string()[..1]);
    if !status.is_success() {
        guard.armed = false;
        return Err(upstream_status_error(p, &ctx, resp).await);
    }
    if checked.stream {
        guard.armed = false;
        drop(guard);
        return Ok(stream(p.clone(), ctx, slot, resp));
    }
    let out = read_bounded(resp).await;
    guard.armed = false;
    drop(guard);
    drop(slot);
    let (ct, bytes) = match out {
        Ok(b) => b,
        Err(e) => {
            let msg = format!("reading the upstream's answer failed: {e}");
            return Err(upstream_failed(p, &ctx, msg, e.contains("timed out")));
        }
    };
    #[derive(Deserialize, Default)]
    struct Answer {
        #[serde(default)]
        usage: Option<sse::Usage>,
        #[serde(default)]
        choices: Vec<FinishOnly>,
    }
    #[derive(Deserialize, Default)]
    struct FinishOnly {
        #[serde(default)]
        finish_reason: Option<String>,
    }
    let a: Answer = serde_json::from_slice(&bytes).unwrap_or_default();
    let seen = Seen {
        completion_tokens: a.usage.and_then(|u| u.completion_tokens).unwrap_or(0) as usize,
        prompt_tokens: a.usage.and_then(|u| u.prompt_tokens).map(|n| n as usize),
        ttft_s: 0.0,
    };
    let reason = a
        .choices
        .into_iter()
        .next()
        .and_then(|c| c.finish_reason)
        .unwrap_or_else(|| "stop".into());
    finished(p, &ctx, &seen, &reason);
    let mut r = Response::new(Body::from(bytes));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        ct.unwrap_or_else(|| HeaderValue::from_static("application/json")),
    );
    route_headers(&mut r, &ctx);
    Ok(r)
}

fn route_headers(r: &mut Response, ctx: &Ctx) {
    r.headers_mut()
        .insert(wire::header::ROUTE, HeaderValue::from_static(ctx.route));
    if let Ok(v) = HeaderValue::from_str(&ctx.model) {
        r.headers_mut().insert(wire::header::UPSTREAM_MODEL, v);
    }
}

/// Records a non-streaming request as `abort` when its future is dropped (the client left).
struct AbortGuard<'a> {
    p: &'a ProxyState,
    ctx: &'a Ctx,
    armed: bool,
}

impl Drop for AbortGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            record(self.p, self.ctx, &Seen::default(), Ok("abort"));
        }
    }
}

fn count(p: &ProxyState, route: &Route, result: &str) {
    let result = match result {
        "2" => "2xx",
        "4" => "4xx",
        "5" => "5xx",
        other => other,
    };
    p.inner
        .proxy_metrics
        .requests
        .with_label_values(&[p.inner.served_model.as_str(), route.name(), result])
        .inc();
}

/// The request could not be sent (or its answer did not start in time).
fn send_error(p: &ProxyState, route: &Route, ctx: &Ctx, e: &reqwest::Error) -> ApiError {
    let why = describe(e);
    let up = &route.upstream;
    if e.is_connect() {
        up.mark_down(why.clone());
        count(p, route, "connect_error");
        let msg = format!(
            "The upstream of route `{}` ({}) is not reachable ({why}); retry later.",
            route.name(),
            up.base
        );
        record(
            p,
            ctx,
            &Seen::default(),
            Err((Category::TimeoutNetwork, &msg)),
        );
        let mut err = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "upstream_unavailable", msg)
            .with("route", json!(route.name()));
        err.retry_after_s = Some(p.inner.opts.unavailable_retry_after_s);
        return err;
    }
    let timeout = e.is_timeout();
    count(p, route, if timeout { "timeout" } else { "error" });
    let msg = format!(
        "The upstream of route `{}` ({}) {}",
        route.name(),
        up.base,
        if timeout {
            format!("did not answer within the read timeout ({why}).")
        } else {
            format!("failed: {why}.")
        }
    );
    upstream_failed(p, ctx, msg, timeout).with("route", json!(route.name()))
}

/// An upstream that failed after it was reached: recorded as a network failure, answered 504
/// `upstream_timeout` when it timed out, else 502 `upstream_error`.
fn upstream_failed(p: &ProxyState, ctx: &Ctx, msg: String, timeout: bool) -> ApiError {
    record(
        p,
        ctx,
        &Seen::default(),
        Err((Category::TimeoutNetwork, &msg)),
    );
    let (status, code) = if timeout {
        (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout")
    } else {
        (StatusCode::BAD_GATEWAY, "upstream_error")
    };
    ApiError::new(status, code, msg)
}

/// An upstream's non-2xx answer, passed on: its OpenAI error object as it is (status and
/// `Retry-After` kept), anything else wrapped in one.
async fn upstream_status_error(p: &ProxyState, ctx: &Ctx, resp: reqwest::Response) -> ApiError {
    let status = resp.status();
    let retry = resp
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok());
    let body = read_bounded(resp).await.map(|(_, b)| b).unwrap_or_default();
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    let status = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut err = match parsed.as_ref().and_then(|v| v.get("error")) {
        Some(Value::Object(e)) => {
            let msg = e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("the upstream refused the request");
            let mut a = ApiError::new(status, "upstream_error", msg.to_string());
            // The upstream's own fields (code, type, param…) win over ours.
            for (k, val) in e {
                if k != "message" && k != "type" {
                    a.extra.insert(k.clone(), val.clone());
                }
            }
            a
        }
        _ => {
            let text: String = String::from_utf8_lossy(&body)
                .chars()
                .filter(|c| !c.is_control())
                .take(200)
                .collect();
            ApiError::new(
                status,
                "upstream_error",
                format!("the upstream answered {status}: {text}"),
            )
        }
    };
    err.retry_after_s = retry;
    let category = if status.is_client_error() {
        Category::Other
    } else {
        Category::ModelError
    };
    record(p, ctx, &Seen::default(), Err((category, &err.message)));
    err
}

/// The whole body, at most [`MAX_ANSWER_BYTES`], with its content type.
async fn read_bounded(resp: reqwest::Response) -> Result<(Option<HeaderValue>, Bytes), String> {
    let ct = resp.headers().get(header::CONTENT_TYPE).cloned();
    let mut s = resp.bytes_stream();
    let mut buf = bytes::BytesMut::new();
    while let Some(c) = s.next().await {
        let c = c.map_err(|e| describe(&e))?;
        if buf.len() + c.len() > MAX_ANSWER_BYTES {
            return Err(format!(
                "the answer is larger than {MAX_ANSWER_BYTES} bytes"
            ));
        }
        buf.extend_from_slice(&c);
    }
    Ok((ct, buf.freeze()))
}

/// Streams the upstream's SSE bytes to the client as they arrive, measuring TTFT and
/// inter-token latency on the way. A client that goes away (the body is dropped) ends the task,
/// which drops the upstream response and so closes its connection.
fn stream(p: ProxyState, ctx: Ctx, slot: Slot, resp: reqwest::Response) -> Response {
    let ct = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("text/event-stream"));
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(16);
    let mut r = Response::new(Body::from_stream(ReceiverStream::new(rx)));
    r.headers_mut().insert(header::CONTENT_TYPE, ct);
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    route_headers(&mut r, &ctx);
    tokio::spawn(async move {
        let _slot = slot;
        let upstream_of = p.route_by_name(ctx.route).upstream.clone();
        let m = p.inner.metrics.clone();
        let mut upstream = resp.bytes_stream();
        let mut split = Splitter::new(MAX_EVENT_BYTES);
        let mut inspecting = true;
        let mut seen = Seen::default();
        let mut last_token: Option<Instant> = None;
        let mut finish: Option<String> = None;
        let mut done = false;
        let end: Result<(), String> = 'outer: loop {
            let next = tokio::select! {
                biased;
                () = tx.closed() => break Ok(()),
                c = upstream.next() => c,
            };
            let chunk = match next {
                None => break Ok(()),
                // A connection cut after `[DONE]` loses nothing (some servers close abruptly).
                Some(Err(_)) if done => break Ok(()),
                Some(Err(e)) => break Err(describe(&e)),
                Some(Ok(c)) => c,
            };
            upstream_of.touch();
            if inspecting {
                split.push(&chunk);
                loop {
                    match split.next_event() {
                        Ok(Some(ev)) => {
                            let Some(data) = sse::data_of(&ev) else {
                                continue;
                            };
                            let info = sse::inspect(&data);
                            done |= info.done;
                            if info.token {
                                let now = Instant::now();
                                match last_token {
                                    None => {
                                        seen.ttft_s = ctx.started.elapsed().as_secs_f64();
                                        m.observe(&m.ttft, seen.ttft_s);
                                    }
                                    Some(t) => m.observe(&m.itl, (now - t).as_secs_f64()),
                                }
                                last_token = Some(now);
                                seen.completion_tokens += 1;
                            }
                            if let Some(f) = info.finish_reason {
                                finish = Some(f);
                            }
                            if let Some(u) = info.usage {
                                if let Some(c) = u.completion_tokens {
                                    seen.completion_tokens = c as usize;
                                }
                                seen.prompt_tokens = u.prompt_tokens.map(|n| n as usize);
                            }
                            if info.error {
                                finish = Some("error".into());
                            }
                        }
                        Ok(None) => break,
                        Err(sse::TooLarge) => {
                            inspecting = false;
                            break;
                        }
                    }
                }
            }
            if tx.send(Ok(chunk)).await.is_err() {
                break 'outer Ok(());
            }
        };
        if tx.is_closed() && !done {
            record(&p, &ctx, &seen, Ok("abort"));
            return;
        }
        match end {
            Ok(()) if done || finish.is_some() => {
                let reason = finish.unwrap_or_else(|| "stop".into());
                if reason == "error" {
                    record(
                        &p,
                        &ctx,
                        &seen,
                        Err((Category::ModelError, "the upstream sent an error event")),
                    );
                } else {
                    finished(&p, &ctx, &seen, &reason);
                }
            }
            other => {
                let why = match other {
                    Err(e) => e,
                    Ok(()) => "the upstream closed the stream before [DONE]".into(),
                };
                let timeout = why.contains("timed out");
                let msg = format!("The upstream stream broke off: {why}.");
                record(&p, &ctx, &seen, Err((Category::TimeoutNetwork, &msg)));
                let e = ApiError::new(
                    if timeout {
                        StatusCode::GATEWAY_TIMEOUT
                    } else {
                        StatusCode::BAD_GATEWAY
                    },
                    if timeout {
                        "upstream_timeout"
                    } else {
                        "upstream_error"
                    },
                    msg,
                );
                // A blank line first ends any event the upstream left half-sent.
                let tail = format!("\n\ndata: {}\n\ndata: [DONE]\n\n", e.body());
                let _ = tx.send(Ok(Bytes::from(tail))).await;
            }
        }
    });
    r
}

/// A request answered by the upstream.
fn finished(p: &ProxyState, ctx: &Ctx, seen: &Seen, reason: &str) {
    let m = &p.inner.metrics;
    m.observe(&m.e2e, ctx.started.elapsed().as_secs_f64());
    m.inc(&m.generation_tokens, seen.completion_tokens as f64);
    m.inc(&m.prompt_tokens, seen.prompt_tokens.unwrap_or(0) as f64);
    record(p, ctx, seen, Ok(reason));
}

fn record(p: &ProxyState, ctx: &Ctx, seen: &Seen, outcome: Result<&str, (Category, &str)>) {
    let inner = &p.inner;
    let label = outcome.unwrap_or("error");
    inner
        .metrics
        .inc_request(label, &ctx.feature, ctx.criticality.as_str());
    inner.telemetry.request(RequestRecord {
        request_id: String::new(),
        model: ctx.model.clone(),
        route: ctx.route,
        criticality: ctx.criticality,
        feature: ctx.feature.clone(),
        tier: ctx.tier,
        prompt_tokens: seen.prompt_tokens.unwrap_or(ctx.prompt_tokens),
        completion_tokens: seen.completion_tokens,
        queue_s: ctx.queue_s,
        ttft_s: seen.ttft_s,
        num_preemptions: 0,
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

/// A refusal: counted under its outcome, traced as deliberate (as the engine's API does).
fn refused(p: &ProxyState, meta: &RequestMeta, r: &crate::gate::Refusal) {
    let inner = &p.inner;
    record_refusal(
        &inner.metrics,
        &inner.telemetry,
        &inner.served_model,
        meta,
        r,
    );
}

pub async fn models(State(p): State<ProxyState>) -> Json<Value> {
    let i = &p.inner;
    crate::api::handlers::model_list(
        &i.served_model,
        i.created_s,
        json!(i.primary.model()),
        json!(i.primary.upstream.max_model_len()),
    )
}

/// `/health`: 503 `upstream_unavailable` while the primary route's upstream is down, 503
/// `draining` as the engine's, else 200 (`degraded` when only the fallback's upstream is down).
pub async fn health(State(p): State<ProxyState>) -> Response {
    let i = &p.inner;
    let instance = i.control.instance_id();
    let tier = i.control.tier().as_u8();
    let routes = p.routes_view();
    if !i.primary.upstream.is_up() {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "upstream_unavailable",
            format!(
                "The primary upstream ({}) is down: {}.",
                i.primary.upstream.base,
                i.primary.upstream.last_error()
            ),
        )
        .with("status", json!("upstream_down"))
        .with("upstreams", routes);
        e.retry_after_s = Some(i.opts.unavailable_retry_after_s);
        return e.into_response();
    }
    if let Some(d) = i.gate.draining() {
        let mut r = (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "status": "draining", "model": i.served_model, "tier": tier,
                "instance": instance, "reason": d.entry.reason,
                "admits": "critical requests only", "upstreams": routes,
            })),
        )
            .into_response();
        r.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(i.gate.config().drain_retry_after_s),
        );
        return r;
    }
    let status = if i.fallback.upstream.is_up() {
        "ok"
    } else {
        "degraded"
    };
    Json(
        json!({"status": status, "model": i.served_model, "tier": tier, "instance": instance,
                "upstreams": routes}),
    )
    .into_response()
}

fn set_gauges(p: &ProxyState) {
    let i = &p.inner;
    i.metrics.set_tier(i.control.tier().as_u8());
    i.metrics.set_gate(&i.gate.figures());
    let f = i.limiter.figures();
    i.metrics.set_queue(f.in_flight, f.waiting);
    i.metrics.set_engine_limits(
        f.in_force,
        &ReserveStats {
            seqs: f.reserve,
            seqs_used: f.reserve_used,
            blocks: 0,
            blocks_used: 0,
        },
    );
    for r in [&i.primary, &i.fallback] {
        i.proxy_metrics
            .up
            .with_label_values(&[i.served_model.as_str(), r.name(), r.upstream.base.as_str()])
            .set(i64::from(r.upstream.is_up()));
    }
}

pub async fn metrics(State(p): State<ProxyState>) -> Response {
    set_gauges(&p);
    let i = &p.inner;
    let body = i.metrics.render() + &i.telemetry.render_metrics();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// `/metrics/upstream/{route}`: the route's upstream's own `/metrics`, as it is.
pub async fn upstream_metrics(State(p): State<ProxyState>, Path(route): Path<String>) -> Response {
    let r = match route.as_str() {
        "primary" => &p.inner.primary,
        "fallback" => &p.inner.fallback,
        _ => {
            return ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "the route must be primary or fallback",
            )
            .into_response();
        }
    };
    let sent = p
        .inner
        .client
        .get(format!("{}/metrics", r.upstream.base))
        .send()
        .await;
    let unavailable = |why: String| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "upstream_unavailable",
            format!(
                "the upstream's /metrics ({}) failed: {why}",
                r.upstream.base
            ),
        )
        .into_response()
    };
    match sent {
        Ok(resp) => {
            let status =
                StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            match read_bounded(resp).await {
                Ok((ct, b)) => {
                    let mut out = Response::new(Body::from(b));
                    *out.status_mut() = status;
                    out.headers_mut().insert(
                        header::CONTENT_TYPE,
                        ct.unwrap_or_else(|| HeaderValue::from_static("text/plain; version=0.0.4")),
                    );
                    out
                }
                Err(e) => unavailable(e),
            }
        }
        Err(e) => unavailable(describe(&e)),
    }
}

/// `/debug/resource`: the gate's part (as the engine's) and the proxy's limiter and routes.
pub async fn debug_resource(State(p): State<ProxyState>) -> Response {
    let mut v = p.inner.gate.debug();
    v["upstream"] = json!({
        "limiter": p.inner.limiter.figures(),
        "critical_reserve_ratio": p.inner.opts.critical_reserve_ratio,
        "routes": p.routes_view(),
    });
    Json(v).into_response()
}
