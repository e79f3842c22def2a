//! plane-kill: the control plane dies (`kill -9`) while failure events arrive.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{
    DrillName, Fault, Report, Target, get_json, ingest_start, poll, run_fault, success, trim,
};

/// Concurrent senders (each one request of [`CHUNK`] events in flight at a time).
const SENDERS: usize = 4;
/// Events per NDJSON request.
const CHUNK: usize = 50;

/// plane-kill: `SENDERS` clients send `events` failure events (NDJSON, [`CHUNK`] per request);
/// once a third of them is acknowledged the fault kills the control plane; each sender stops
/// at its first refused or failed request. After the recovery, every acknowledged event must be
/// stored exactly once, and no event at all stored twice (an event whose request was cut may
/// be stored or not: it was never acknowledged).
///
/// # Errors
/// Only for setup problems; findings are in the report.
pub async fn plane_kill(
    t: &Target,
    fault: &mut Fault,
    recover: Option<&mut Fault>,
    events: usize,
    timeout: Duration,
) -> anyhow::Result<Report> {
    let (mut rep, t0, c, ingest, service) = match ingest_start(t, DrillName::PlaneKill)? {
        Ok(start) => start,
        Err(rep) => return Ok(rep),
    };
    let events = events.clamp(SENDERS * CHUNK, 100_000);
    let acked: Arc<Mutex<BTreeSet<usize>>> = Arc::default();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Kill mid-ingest: once a third is acknowledged. The sender that crosses it wakes the
    // killer at once (a fast store acknowledges thousands of events between two polls).
    let third = events / 3;
    let third_acked = Arc::new(tokio::sync::Notify::new());
    let url = format!("{}/v1/failures", trim(&t.plane));
    let mut senders = Vec::new();
    for _ in 0..SENDERS {
        let (c, url, ingest, service) = (c.clone(), url.clone(), ingest.clone(), service.clone());
        let (acked, next, third_acked) = (
            Arc::clone(&acked),
            Arc::clone(&next),
            Arc::clone(&third_acked),
        );
        senders.push(tokio::spawn(async move {
            loop {
                let start = next.fetch_add(CHUNK, std::sync::atomic::Ordering::Relaxed);
                if start >= events {
                    return None;
                }
                let ids: Vec<usize> = (start..(start + CHUNK).min(events)).collect();
                let body: String = ids
                    .iter()
                    .map(|i| {
                        format!(
                            "{}\n",
                            json!({"ts": brownout_protocol::now_ms(), "service": service,
                                   "message": format!("drill event {i}"), "category": "other"})
                        )
                    })
                    .collect();
                let r = c
                    .post(&url)
                    .bearer_auth(&ingest)
                    .header("content-type", "application/x-ndjson")
                    .body(body)
                    .timeout(Duration::from_secs(10))
                    .send()
                    .await;
                match success(r).await {
                    Ok(_) => {
                        let n = acked
                            .lock()
                            .map(|mut a| {
                                a.extend(ids);
                                a.len()
                            })
                            .unwrap_or(0);
                        if n >= third {
                            third_acked.notify_one();
                        }
                    }
                    Err(e) => return Some(e),
                }
            }
        }));
    }
    // (or when the senders are done without getting there).
    let waited = tokio::select! {
        _ = third_acked.notified() => Some(acked.lock().map(|a| a.len()).unwrap_or(0)),
        w = poll(timeout, || async {
            let n = acked.lock().map(|a| a.len()).unwrap_or(0);
            (n >= third || senders.iter().all(|s| s.is_finished())).then_some(n)
        }) => w,
    };
    let at_kill = waited.unwrap_or(0);
    let injected = run_fault(fault, "control plane killed").await;
    let mut first_error = None;
    for s in senders {
        if let Ok(Some(e)) = s.await
            && first_error.is_none()
        {
            first_error = Some(e);
        }
    }
    let acked: BTreeSet<usize> = acked.lock().map(|a| a.clone()).unwrap_or_default();
    if !rep.check(t0, "fault injected", injected) {
        return Ok(rep);
    }
    rep.figure("acked_at_kill", at_kill);
    rep.figure("acked", acked.len());
    rep.step(
        t0,
        "events acknowledged before and during the kill",
        !acked.is_empty(),
        format!(
            "{} of {events} acknowledged ({at_kill} when the fault ran); senders stopped on: {}",
            acked.len(),
            first_error
                .as_deref()
                .unwrap_or("nothing (all sent before the kill)")
        ),
    );
    if let Some(r) = recover
        && !rep.check(t0, "recovered", run_fault(r, "control plane back").await)
    {
        return Ok(rep);
    }
    let recovered = Instant::now();
    let read = t.read_token.clone();
    // Every stored event of the service, paged; `None` while the plane is not answering.
    let stored = poll(timeout, || async {
        let counts = stored_events(&c, t, &service, read.as_deref()).await?;
        acked
            .iter()
            .all(|i| counts.contains_key(i))
            .then_some(counts)
    })
    .await;
    let Some(counts) = stored else {
        let counts = stored_events(&c, t, &service, read.as_deref())
            .await
            .unwrap_or_default();
        let missing = acked.iter().filter(|i| !counts.contains_key(i)).count();
        rep.step(
            t0,
            "every acknowledged event stored",
            false,
            format!(
                "{missing} of {} acknowledged events missing after {timeout:?}",
                acked.len()
            ),
        );
        return Ok(rep);
    };
    let ms = recovered.elapsed().as_millis() as u64;
    rep.figure("stored_after_recovery_ms", ms);
    let rows: usize = counts.values().sum();
    let dup: Vec<usize> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(i, _)| *i)
        .collect();
    rep.figure("stored_rows", rows);
    rep.figure("stored_unacknowledged", counts.len() - acked.len());
    rep.step(
        t0,
        "every acknowledged event stored",
        true,
        format!(
            "{} acknowledged, all stored ({} more from requests cut by the kill), {ms} ms after recovery",
            acked.len(),
            counts.len() - acked.len()
        ),
    );
    rep.step(
        t0,
        "no event stored twice",
        dup.is_empty(),
        if dup.is_empty() {
            format!("{rows} rows, {} distinct events", counts.len())
        } else {
            format!(
                "{} events stored more than once (first: drill event {})",
                dup.len(),
                dup[0]
            )
        },
    );
    Ok(rep)
}

/// How many times each `drill event N` of `service` is stored, or `None` when the control
/// plane does not answer.
async fn stored_events(
    c: &reqwest::Client,
    t: &Target,
    service: &str,
    read: Option<&str>,
) -> Option<BTreeMap<usize, usize>> {
    let mut counts = BTreeMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!(
            "{}/api/v1/failures?service={service}&limit=1000",
            trim(&t.plane)
        );
        if let Some(cur) = &cursor {
            url.push_str(&format!("&cursor={cur}"));
        }
        let j = get_json(c, &url, read).await.ok()?;
        for item in j["items"].as_array()? {
            if let Some(n) = item["message"]
                .as_str()
                .and_then(|m| m.strip_prefix("drill event "))
                .and_then(|n| n.parse::<usize>().ok())
            {
                *counts.entry(n).or_insert(0) += 1;
            }
        }
        match j["next_cursor"].as_str() {
            Some(n) if !n.is_empty() => cursor = Some(n.to_string()),
            _ => return Some(counts),
        }
    }
}
