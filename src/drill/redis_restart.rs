//! redis-restart: Redis restarts (empty) while an operator pins a tier.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{
    DrillName, Fault, Report, Target, client, degrade_status, poll, run_fault, success, trim,
};

/// redis-restart: pins tier 1 while Redis is down, and checks that every instance applies and
/// acks it after recovery.
///
/// # Errors
/// Only for setup problems; findings are in the report.
pub async fn redis_restart(
    t: &Target,
    fault: &mut Fault,
    recover: Option<&mut Fault>,
    timeout: Duration,
) -> anyhow::Result<Report> {
    let mut rep = Report::new(DrillName::RedisRestart);
    let t0 = Instant::now();
    let c = client()?;
    let Some(admin) = t.admin_token.clone() else {
        rep.step(
            t0,
            "admin token",
            false,
            "redis-restart pins a tier: pass --admin-token or BROWNOUT_ADMIN_TOKEN",
        );
        return Ok(rep);
    };
    let before = match degrade_status(&c, t, &t.plane).await {
        Ok(s) => s,
        Err(e) => {
            rep.step(t0, "status before", false, format!("{e:#}"));
            return Ok(rep);
        }
    };
    let instances: Vec<String> = before["acks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["status"] == "applied")
        .filter_map(|a| a["instance"].as_str().map(String::from))
        .collect();
    if instances.is_empty() {
        rep.step(
            t0,
            "status before",
            false,
            "no serving instance has acked anything: nothing to check",
        );
        return Ok(rep);
    }
    rep.step(
        t0,
        "status before",
        true,
        format!(
            "tier {}, instances {}",
            before["tier"],
            instances.join(", ")
        ),
    );
    if !rep.check(t0, "fault injected", run_fault(fault, "redis down").await) {
        return Ok(rep);
    }
    let injected = Instant::now();
    let pin = c
        .post(format!("{}/api/v1/degrade/override", trim(&t.plane)))
        .bearer_auth(&admin)
        .json(&json!({"tier": 1, "duration_secs": 600, "reason": "brownout drill redis-restart"}))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    let pinned = success(pin).await.map(|_| String::new());
    if !rep.check(t0, "tier 1 pinned during the outage", pinned) {
        return Ok(rep);
    }
    if let Some(r) = recover
        && !rep.check(t0, "recovered", run_fault(r, "redis back").await)
    {
        return Ok(rep);
    }
    let converged = poll(timeout, || async {
        let s = degrade_status(&c, t, &t.plane).await.ok()?;
        let cmd = &s["command"];
        if cmd["tier"].as_u64() != Some(1) {
            return None;
        }
        let (e, v) = (cmd["epoch"].as_u64()?, cmd["version"].as_u64()?);
        let acks = s["acks"].as_array()?;
        instances
            .iter()
            .all(|i| {
                acks.iter().any(|a| {
                    a["instance"].as_str() == Some(i)
                        && a["status"] == "applied"
                        && (a["epoch"].as_u64(), a["version"].as_u64()) >= (Some(e), Some(v))
                })
            })
            .then_some((e, v))
    })
    .await;
    match converged {
        Some((e, v)) => {
            let ms = injected.elapsed().as_millis() as u64;
            rep.figure("converged_after_fault_ms", ms);
            rep.step(
                t0,
                "every instance applied tier 1",
                true,
                format!("epoch {e} version {v}, {ms} ms after the fault"),
            );
        }
        None => rep.step(
            t0,
            "every instance applied tier 1",
            false,
            format!("not within {timeout:?}"),
        ),
    }
    let cleared = c
        .delete(format!("{}/api/v1/degrade/override", trim(&t.plane)))
        .bearer_auth(&admin)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map(|r| r.status().is_success())
        .unwrap_or(false);
    rep.step(
        t0,
        "pin removed",
        cleared,
        "DELETE /api/v1/degrade/override",
    );
    Ok(rep)
}
