//! clickhouse-kill: the store goes away while failure events arrive.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{
    DrillName, Fault, Report, Target, get_json, ingest_start, poll, run_fault, success, trim,
};

/// clickhouse-kill: sends `events` failure events while the store is down, then checks each is
/// stored exactly once after recovery.
///
/// # Errors
/// Only for setup problems; findings are in the report.
pub async fn clickhouse_kill(
    t: &Target,
    fault: &mut Fault,
    recover: Option<&mut Fault>,
    events: usize,
    timeout: Duration,
) -> anyhow::Result<Report> {
    let (mut rep, t0, c, ingest, service) = match ingest_start(t, DrillName::ClickhouseKill)? {
        Ok(start) => start,
        Err(rep) => return Ok(rep),
    };
    let events = events.clamp(1, 1000);
    if !rep.check(t0, "fault injected", run_fault(fault, "store down").await) {
        return Ok(rep);
    }
    let mut sent = 0;
    for chunk in (0..events).collect::<Vec<_>>().chunks(50) {
        let body: String = chunk
            .iter()
            .map(|i| {
                format!(
                    "{}\n",
                    json!({"ts": brownout_protocol::now_ms(), "service": service, "message": format!("drill event {i}"), "category": "other"})
                )
            })
            .collect();
        let r = c
            .post(format!("{}/v1/failures", trim(&t.plane)))
            .bearer_auth(&ingest)
            .header("content-type", "application/x-ndjson")
            .body(body)
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        if let Err(e) = success(r).await {
            rep.step(t0, "events accepted during the outage", false, e);
            return Ok(rep);
        }
        sent += chunk.len();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rep.step(
        t0,
        "events accepted during the outage",
        true,
        format!("{sent} events of service {service}"),
    );
    if let Some(r) = recover
        && !rep.check(t0, "recovered", run_fault(r, "store back").await)
    {
        return Ok(rep);
    }
    let recovered = Instant::now();
    let read = t.read_token.clone();
    let url = format!(
        "{}/api/v1/failures?service={service}&limit=1000",
        trim(&t.plane)
    );
    let last = std::sync::atomic::AtomicUsize::new(0);
    let stored = poll(timeout, || async {
        let j = get_json(&c, &url, read.as_deref()).await.ok()?;
        let items = j["items"].as_array()?;
        last.store(items.len(), std::sync::atomic::Ordering::Relaxed);
        (items.len() >= sent).then(|| {
            let mut msgs: Vec<&str> = items.iter().filter_map(|i| i["message"].as_str()).collect();
            msgs.sort_unstable();
            msgs.dedup();
            (items.len(), msgs.len())
        })
    })
    .await;
    match stored {
        Some((n, unique)) if n == sent && unique == sent => {
            let ms = recovered.elapsed().as_millis() as u64;
            rep.figure("stored_after_recovery_ms", ms);
            rep.step(
                t0,
                "every event stored exactly once",
                true,
                format!("{n} rows, {unique} distinct, {ms} ms after recovery"),
            );
        }
        Some((n, unique)) => rep.step(
            t0,
            "every event stored exactly once",
            false,
            format!("{n} rows, {unique} distinct for {sent} sent"),
        ),
        None => rep.step(
            t0,
            "every event stored exactly once",
            false,
            format!(
                "{} of {sent} stored after {timeout:?}",
                last.load(std::sync::atomic::Ordering::Relaxed)
            ),
        ),
    }
    Ok(rep)
}
