//! Graceful shutdown of the serving tier (SIGTERM or SIGINT; docs/SERVING.md "Shutdown").
//!
//! ```text
//!  Serving ──signal──▶ Draining ──all in flight done, or the grace passed──▶ Cancelled ─▶ closed
//!            new generation requests 503 instance_draining + Retry-After   │
//!            /health 503 {"status":"draining"}; in-flight requests and      │ streams still open end
//!            streams go on                                                 │ with a final error event;
//!                                                                          │ dropping them frees the KV
//! ```
//!
//! The listener keeps accepting while draining, so a load balancer that has not yet taken the
//! instance out gets a clear 503 (and `Connection: close`) instead of a refused connection, and a
//! readiness probe sees `/health` flip before the port closes. One [`layer`] does all of it for
//! both modes (the bundled engine and `--upstream`): it counts the generation requests in flight
//! (a streamed one until its body ends) and ends what is still open when the grace runs out.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::FutureExt;
use futures::future::BoxFuture;
use http_body::{Frame, SizeHint};
use serde_json::json;
use tokio::sync::{Notify, watch};

use crate::api::ApiError;

/// `Retry-After` of a request refused while the instance drains: another instance can take it
/// at once.
pub const DRAIN_RETRY_AFTER_S: u64 = 1;

/// Where the instance is in its shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Serving,
    /// Refusing new generation requests; the ones in flight go on.
    Draining,
    /// The grace is over: what is still open is being ended.
    Cancelled,
}

/// The shutdown state one instance's routes share.
#[derive(Debug)]
pub struct Drain {
    phase: watch::Sender<Phase>,
    in_flight: AtomicUsize,
    idle: Notify,
    grace: Duration,
    retry_after_s: u64,
    instance: String,
}

/// How a drain went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DrainReport {
    /// Generation requests in flight when the signal came.
    pub in_flight_at_start: usize,
    /// Of those (and any admitted just before), still open when the grace ran out and ended.
    pub cancelled: usize,
    pub waited: Duration,
}

/// Generation requests (the ones counted, and refused while draining).
fn is_generation(path: &str) -> bool {
    matches!(path, "/v1/completions" | "/v1/chat/completions")
}

/// How long the ended requests get to let go of their resources (the engine drops a sequence
/// whose receiver is gone at its next step) before the listener closes.
const CANCEL_SETTLE: Duration = Duration::from_secs(5);

impl Drain {
    /// `grace`: how long in-flight requests may take once the signal came
    /// (`--shutdown-grace-secs`); `retry_after_s`: the `Retry-After` of refused requests.
    pub fn new(instance: &str, grace: Duration, retry_after_s: u64) -> Arc<Drain> {
        Arc::new(Drain {
            phase: watch::channel(Phase::Serving).0,
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            grace,
            retry_after_s,
            instance: instance.to_string(),
        })
    }

    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// Generation requests in flight (a stream counts until its last byte is sent).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// Resolves once the phase is [`Phase::Cancelled`].
    pub fn cancelled(&self) -> BoxFuture<'static, ()> {
        let mut rx = self.phase.subscribe();
        async move {
            let _ = rx.wait_for(|p| *p == Phase::Cancelled).await;
        }
        .boxed()
    }

    /// Until no generation request is in flight.
    async fn until_idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }

    fn enter(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(self))
    }

    /// Drains: stops admitting, waits for the requests in flight up to the grace, then ends the
    /// rest and gives them [`CANCEL_SETTLE`] to let go. The listener closes after this returns.
    pub async fn run(&self) -> DrainReport {
        let started = tokio::time::Instant::now();
        self.phase.send_replace(Phase::Draining);
        let in_flight_at_start = self.in_flight();
        tracing::info!(
            in_flight = in_flight_at_start,
            grace_s = self.grace.as_secs_f64(),
            "shutdown signal: draining (new generation requests get 503 instance_draining)"
        );
        let mut cancelled = 0;
        if tokio::time::timeout(self.grace, self.until_idle())
            .await
            .is_err()
        {
            cancelled = self.in_flight();
            tracing::warn!(
                still_in_flight = cancelled,
                "shutdown grace passed: ending the requests still in flight"
            );
            self.phase.send_replace(Phase::Cancelled);
            if tokio::time::timeout(CANCEL_SETTLE, self.until_idle())
                .await
                .is_err()
            {
                tracing::warn!(
                    still_in_flight = self.in_flight(),
                    "requests did not end after being cancelled"
                );
            }
        }
        // Anything else still open (a `/v1/features/stream` watcher) ends now as well.
        self.phase.send_replace(Phase::Cancelled);
        DrainReport {
            in_flight_at_start,
            cancelled,
            waited: started.elapsed(),
        }
    }

    fn refusal(&self) -> Response {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "instance_draining",
            "this instance is shutting down and takes no new requests; retry on another instance",
        )
        .with("outcome", json!("instance_draining"))
        .with("instance", json!(self.instance));
        e.retry_after_s = Some(self.retry_after_s);
        e.outcome = Some("instance_draining");
        close_after(e.into_response())
    }

    fn health(&self) -> Response {
        let mut r = (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({
                "status": "draining", "reason": "shutting down", "instance": self.instance,
                "in_flight": self.in_flight(), "admits": "nothing new",
            })),
        )
            .into_response();
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(self.retry_after_s));
        close_after(r)
    }
}

/// A generation request in flight, counted until dropped.
#[derive(Debug)]
struct InFlight(Arc<Drain>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// While draining, each answer asks the client to close its keep-alive connection, so that its
/// next request goes (through the load balancer) to another instance.
fn close_after(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// The last event of a stream ended at shutdown: a blank line first (an upstream's event left
/// half-sent ends there), an OpenAI error object, then `[DONE]`.
fn shutdown_tail() -> Bytes {
    let e = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "instance_shutdown",
        "this instance shut down before the request finished (its shutdown grace ran out); retry",
    );
    Bytes::from(format!("\n\ndata: {}\n\ndata: [DONE]\n\n", e.body()))
}

/// A response body that keeps its request counted until it ends, and ends early (after
/// `tail`, for an event stream) when the drain is cancelled. Dropping the inner body is what
/// cancels the work behind it: the engine's sequence (its KV blocks freed) or the upstream
/// connection.
struct Guarded {
    inner: Option<Body>,
    cancelled: BoxFuture<'static, ()>,
    tail: Option<Bytes>,
    _in_flight: Option<InFlight>,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(this.tail.take().map(|t| Ok(Frame::data(t))));
        };
        if let Poll::Ready(f) = Pin::new(inner).poll_frame(cx) {
            return Poll::Ready(f);
        }
        if this.cancelled.as_mut().poll(cx).is_ready() {
            this.inner = None;
            this._in_flight = None;
            return Poll::Ready(this.tail.take().map(|t| Ok(Frame::data(t))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .as_ref()
            .map_or(self.tail.is_none(), http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(SizeHint::default, http_body::Body::size_hint)
    }
}

/// The drain middleware (see the module doc).
async fn middleware(State(d): State<Arc<Drain>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if path == "/health" && d.phase() != Phase::Serving {
        return d.health();
    }
    let generation = is_generation(path);
    // Counted first, then the phase checked: a request that passes is one the drain waits for.
    let counted = generation.then(|| d.enter());
    if generation && d.phase() != Phase::Serving {
        return d.refusal();
    }
    let mut cancelled = d.cancelled();
    let r = tokio::select! {
        r = next.run(req) => r,
        // A non-streaming request still waiting for its answer at the end of the grace: the
        // handler is dropped (its sequence with it) and the client told.
        () = &mut cancelled => {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "instance_shutdown",
                "this instance shut down before the request finished (its shutdown grace ran out); retry",
            );
            e.retry_after_s = Some(d.retry_after_s);
            return close_after(e.into_response());
        }
    };
    let is_stream = r
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let (mut parts, body) = r.into_parts();
    if d.phase() != Phase::Serving {
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let body = Guarded {
        inner: Some(body),
        cancelled,
        tail: (generation && is_stream).then(shutdown_tail),
        _in_flight: counted,
    };
    Response::from_parts(parts, Body::new(body))
}

/// `router` with the drain in front of every route.
pub fn layer(router: axum::Router, drain: Arc<Drain>) -> axum::Router {
    router.layer(axum::middleware::from_fn_with_state(drain, middleware))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::{get, post};
    use futures::StreamExt;
    use tower::ServiceExt;

    fn app(d: &Arc<Drain>) -> axum::Router {
        let slow = axum::Router::new()
            .route("/health", get(|| async { "ok" }))
            .route(
                "/v1/completions",
                post(|| async {
                    // An endless event stream: one event every 20 ms.
                    let s = futures::stream::unfold(0u64, |i| async move {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Some((
                            Ok::<_, std::convert::Infallible>(format!("data: {i}\n\n")),
                            i + 1,
                        ))
                    });
                    (
                        [(header::CONTENT_TYPE, "text/event-stream")],
                        Body::from_stream(s),
                    )
                }),
            );
        layer(slow, d.clone())
    }

    fn post_req() -> Request {
        Request::post("/v1/completions")
            .body(Body::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn a_stream_open_past_the_grace_ends_with_an_error_event_and_new_work_is_refused() {
        let d = Drain::new("i-1", Duration::from_millis(200), 3);
        let app = app(&d);
        let r = app.clone().oneshot(post_req()).await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(d.in_flight(), 1);
        let drain = tokio::spawn({
            let d = d.clone();
            async move { d.run().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Refused while draining, with Retry-After and Connection: close.
        let refused = app.clone().oneshot(post_req()).await.unwrap();
        assert_eq!(refused.status(), 503);
        assert_eq!(refused.headers()[header::RETRY_AFTER], "3");
        assert_eq!(refused.headers()[header::CONNECTION], "close");
        let b = axum::body::to_bytes(refused.into_body(), 1 << 16)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["error"]["code"], "instance_draining");
        let h = app
            .clone()
            .oneshot(Request::get("/health").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(h.status(), 503);
        // The open stream runs on, then ends with the shutdown event.
        let mut body = r.into_body().into_data_stream();
        let mut text = String::new();
        while let Some(c) = body.next().await {
            text.push_str(std::str::from_utf8(&c.unwrap()).unwrap());
        }
        assert!(text.starts_with("data: 0\n\n"), "{text}");
        assert!(
            text.contains("data: 5\n\n"),
            "ran on while draining: {text}"
        );
        assert!(text.contains("instance_shutdown"), "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        let report = drain.await.unwrap();
        assert_eq!(report.in_flight_at_start, 1);
        assert_eq!(report.cancelled, 1);
        assert_eq!(d.in_flight(), 0);
    }

    #[tokio::test]
    async fn with_nothing_in_flight_the_drain_ends_at_once() {
        let d = Drain::new("i-2", Duration::from_secs(30), 1);
        let report = tokio::time::timeout(Duration::from_secs(5), d.run())
            .await
            .expect("no wait for the grace with nothing in flight");
        assert_eq!(report.cancelled, 0);
        assert_eq!(d.phase(), Phase::Cancelled);
    }
}
