//! leader-kill: the leading control-plane replica dies without releasing its lease.

use std::time::{Duration, Instant};

use super::{DrillName, Fault, Report, Target, client, degrade_status, poll, run_fault};

/// leader-kill: kills the leading replica (`--target`) and checks that a peer takes over.
///
/// # Errors
/// Only for setup problems; findings are in the report.
pub async fn leader_kill(
    t: &Target,
    peers: &[String],
    fault: &mut Fault,
    timeout: Duration,
) -> anyhow::Result<Report> {
    let mut rep = Report::new(DrillName::LeaderKill);
    let t0 = Instant::now();
    let c = client()?;
    if peers.is_empty() {
        rep.step(t0, "peers", false, "pass at least one --peer replica");
        return Ok(rep);
    }
    let before = match degrade_status(&c, t, &t.plane).await {
        Ok(s) => s,
        Err(e) => {
            rep.step(t0, "target is the leader", false, format!("{e:#}"));
            return Ok(rep);
        }
    };
    let Some(old_epoch) = before["leader_epoch"].as_u64() else {
        rep.step(
            t0,
            "target is the leader",
            false,
            "the target does not hold the lease; point --target at the leader",
        );
        return Ok(rep);
    };
    rep.step(
        t0,
        "target is the leader",
        true,
        format!("epoch {old_epoch}"),
    );
    if !rep.check(t0, "fault injected", run_fault(fault, "leader down").await) {
        return Ok(rep);
    }
    let injected = Instant::now();
    let took = poll(timeout, || async {
        for p in peers {
            if let Ok(s) = degrade_status(&c, t, p).await
                && let Some(e) = s["leader_epoch"].as_u64()
                && e > old_epoch
            {
                return Some((p.clone(), e));
            }
        }
        None
    })
    .await;
    match took {
        Some((p, e)) => {
            let ms = injected.elapsed().as_millis() as u64;
            rep.figure("takeover_after_fault_ms", ms);
            rep.step(
                t0,
                "a peer took the lease",
                true,
                format!("{p} at epoch {e}, {ms} ms after the fault"),
            );
        }
        None => rep.step(
            t0,
            "a peer took the lease",
            false,
            format!("no peer leads after {timeout:?}"),
        ),
    }
    Ok(rep)
}
