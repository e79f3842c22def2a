//! engine-kill: a serving engine dies under an open stream.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value as J, json};

use super::{DrillName, Fault, Report, Target, client, get_json, poll, run_fault, success, trim};

/// How the open stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StreamEnd {
    /// An SSE `{"error": …}` event.
    ErrorEvent(String),
    /// The connection broke before `[DONE]`.
    Cut(String),
    /// `[DONE]` after a finish reason: the generation ended before the fault hit.
    Finished,
    /// Still open at the deadline.
    Hung,
}

/// engine-kill: opens a stream, injects the fault on its first event, and checks that the
/// stream ends without hanging and that the engine is reported down.
///
/// # Errors
/// Only for setup problems (no HTTP client); every finding is in the report.
pub async fn engine_kill(
    t: &Target,
    engine_url: &str,
    fault: &mut Fault,
    recover: Option<&mut Fault>,
    stream_deadline: Duration,
    timeout: Duration,
) -> anyhow::Result<Report> {
    let mut rep = Report::new(DrillName::EngineKill);
    let t0 = Instant::now();
    let c = client()?;
    match engine_up(&c, t, engine_url).await {
        Ok(Some(true)) => rep.step(t0, "engine reported up", true, engine_url),
        Ok(other) => {
            rep.step(
                t0,
                "engine reported up",
                false,
                format!("the control plane reports {other:?} for {engine_url}: is a gpu-agent scraping it?"),
            );
            return Ok(rep);
        }
        Err(e) => {
            rep.step(t0, "engine reported up", false, format!("{e:#}"));
            return Ok(rep);
        }
    }
    // As long a generation as the context allows (vLLM's /v1/models gives max_model_len), and
    // past end-of-sequence, so that the fault lands mid-stream.
    let max_model_len = get_json(&c, &format!("{}/v1/models", trim(engine_url)), None)
        .await
        .ok()
        .and_then(|m| m["data"][0]["max_model_len"].as_u64())
        .unwrap_or(512);
    let body = json!({
        "model": "default",
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        "stream": true,
        "max_tokens": max_model_len.saturating_sub(128).max(16),
        "ignore_eos": true,
    });
    let resp = c
        .post(format!("{}/v1/chat/completions", trim(engine_url)))
        .header(brownout_protocol::wire::header::CRITICALITY, "critical")
        .json(&body)
        .send()
        .await;
    let resp = match success(resp).await {
        Ok(r) => r,
        Err(e) => {
            rep.step(t0, "stream opened", false, e);
            return Ok(rep);
        }
    };
    rep.step(
        t0,
        "stream opened",
        true,
        "POST /v1/chat/completions stream=true",
    );
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::<u8>::new();
    let mut injected_at: Option<Instant> = None;
    let mut events = 0usize;
    let deadline = Instant::now() + stream_deadline + Duration::from_secs(30);
    let end = loop {
        let wait = match injected_at {
            Some(at) => (at + stream_deadline).saturating_duration_since(Instant::now()),
            None => deadline.saturating_duration_since(Instant::now()),
        };
        let next = tokio::time::timeout(wait, stream.next()).await;
        match next {
            Err(_) => break StreamEnd::Hung,
            Ok(None) => break StreamEnd::Cut("the connection closed without [DONE]".into()),
            Ok(Some(Err(e))) => break StreamEnd::Cut(format!("{e:#}")),
            Ok(Some(Ok(bytes))) => {
                buf.extend_from_slice(&bytes);
                let mut done = None;
                while let Some(pos) = buf.windows(2).position(|w| w == b"\n\n") {
                    let ev: Vec<u8> = buf.drain(..pos + 2).collect();
                    let text = String::from_utf8_lossy(&ev);
                    let data = text
                        .trim()
                        .strip_prefix("data:")
                        .map(str::trim)
                        .unwrap_or("");
                    if data.is_empty() {
                        continue;
                    }
                    events += 1;
                    if data == "[DONE]" {
                        done = Some(StreamEnd::Finished);
                        break;
                    }
                    if let Ok(v) = serde_json::from_str::<J>(data)
                        && v.get("error").is_some()
                    {
                        done = Some(StreamEnd::ErrorEvent(v["error"].to_string()));
                        break;
                    }
                }
                if let Some(d) = done {
                    break d;
                }
                if injected_at.is_none() && events > 0 {
                    let r = run_fault(fault, &format!("after {events} stream event(s)")).await;
                    injected_at = Some(Instant::now());
                    if !rep.check(t0, "fault injected", r) {
                        return Ok(rep);
                    }
                }
            }
        }
    };
    let end_ms = injected_at.map(|a| a.elapsed().as_millis() as u64);
    if let Some(ms) = end_ms {
        rep.figure("stream_end_after_fault_ms", ms);
    }
    match &end {
        StreamEnd::ErrorEvent(e) => rep.step(t0, "stream ended", true, format!("error event {e}")),
        StreamEnd::Cut(e) => rep.step(t0, "stream ended", true, format!("cut: {e}")),
        StreamEnd::Finished => rep.step(
            t0,
            "stream ended",
            false,
            "the generation finished normally: the fault did not hit the engine",
        ),
        StreamEnd::Hung => rep.step(
            t0,
            "stream ended",
            false,
            format!("still open {stream_deadline:?} after the fault: the client would hang"),
        ),
    }
    drop(stream);
    let since = Instant::now();
    let down = poll(timeout, || async {
        match engine_up(&c, t, engine_url).await {
            Ok(Some(false)) => Some(()),
            _ => None,
        }
    })
    .await;
    match down {
        Some(()) => {
            let ms = since.elapsed().as_millis() as u64 + end_ms.unwrap_or(0);
            rep.figure("marked_down_after_fault_ms", ms);
            rep.step(
                t0,
                "engine reported down",
                true,
                format!("{ms} ms after the fault"),
            );
        }
        None => rep.step(
            t0,
            "engine reported down",
            false,
            format!("the control plane still shows it up after {timeout:?}"),
        ),
    }
    if let Some(r) = recover {
        if !rep.check(t0, "recovered", run_fault(r, "").await) {
            return Ok(rep);
        }
        let up = poll(timeout, || async {
            matches!(engine_up(&c, t, engine_url).await, Ok(Some(true))).then_some(())
        })
        .await;
        rep.step(
            t0,
            "engine reported up again",
            up.is_some(),
            if up.is_some() {
                "after --recover"
            } else {
                "not within the timeout"
            },
        );
    }
    Ok(rep)
}

/// The `up` flag the control plane holds for the engine at `engine_url`, from any host.
async fn engine_up(
    c: &reqwest::Client,
    t: &Target,
    engine_url: &str,
) -> anyhow::Result<Option<bool>> {
    let hosts = get_json(
        c,
        &format!("{}/api/v1/hosts", trim(&t.plane)),
        t.read_token.as_deref(),
    )
    .await?;
    let want = trim(engine_url);
    for h in hosts["hosts"].as_array().into_iter().flatten() {
        for e in h["snapshot"]["engines"].as_array().into_iter().flatten() {
            if e["url"].as_str().map(trim) == Some(want) {
                return Ok(e["up"].as_bool());
            }
        }
    }
    Ok(None)
}
