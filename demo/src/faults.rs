//! The demo's application faults: the failures an agent application reports on top of what the
//! serving engines do (docs/REQUIREMENTS.md R1: apps send their failure logs), injected so that a
//! first run has the seeds' real causes to rank — GPU queue timeouts, tool timeouts, KV-cache
//! pressure — beside brownout's own deliberate refusals, which the report must not rank.
//!
//! Every event is POSTed as NDJSON to the control plane's `/v1/failures` with the ingest token,
//! as a real application would, from service `agent-app` (so no chat SLO is touched), carries
//! `attributes.simulated = "true"`, and follows the same evening curve as the load: a few per
//! second outside the peak, `peak_factor` times more at its top.
//!
//! The app also reports the steps that went well, as a real app instrumented with
//! OpenTelemetry does: `ok_steps_per_fault` OTLP/JSON server spans of service `agent-app` per
//! fault, POSTed to the control plane's `/v1/traces`. With them the example SLO
//! `agent-app-availability` (examples/slo/agent-app.yaml) has its good events beside the bad
//! ones, and the failure patterns mined from the faults explain its bad events: their impact
//! (docs/SLO.md "Pattern impact") is not 0.

use std::time::{Duration, Instant};

use brownout::loadgen::LoadShape;
use rand::{Rng as _, SeedableRng as _, rngs::StdRng};
use serde_json::json;

/// The injected kinds: `(error_type, category, share)`.
pub const KINDS: [(&str, &str, u32); 3] = [
    ("GpuQueueTimeout", "timeout_resource", 45),
    ("ToolTimeout", "tool_unavailable", 35),
    ("KvCachePressure", "kv_cache_exhausted", 20),
];

/// Where and how fast to inject.
#[derive(Debug, Clone)]
pub struct FaultConfig {
    /// The control plane's base URL (`http://127.0.0.1:8080`).
    pub control_plane: String,
    pub ingest_token: String,
    /// The load's shape: the fault rate follows its evening curve.
    pub shape: LoadShape,
    /// Faults per second outside the peak.
    pub base_per_s: f64,
    /// Successful steps reported (as spans) per fault: 19 is a 5 % failure ratio.
    pub ok_steps_per_fault: u32,
    pub seed: u64,
}

/// `n` successful steps of the agent app ending at `end_ms`, as an OTLP/JSON export request.
pub fn ok_steps(n: usize, rng: &mut StdRng, end_ms: u64) -> serde_json::Value {
    let spans: Vec<serde_json::Value> = (0..n)
        .map(|_| {
            let dur_ms = 200 + rng.random_range(0..2_000u64);
            let feature = if rng.random_range(0..10) < 8 {
                "trip_planner"
            } else {
                "pdf_analysis"
            };
            json!({
                "traceId": format!("{:032x}", rng.random::<u128>() | 1),
                "spanId": format!("{:016x}", rng.random::<u64>() | 1),
                "name": "agent step",
                "kind": 2,
                "startTimeUnixNano": ((end_ms - dur_ms) * 1_000_000).to_string(),
                "endTimeUnixNano": (end_ms * 1_000_000).to_string(),
                "status": {"code": 1},
                "attributes": [
                    {"key": "brownout.feature", "value": {"stringValue": feature}},
                    {"key": "simulated", "value": {"stringValue": "true"}},
                ],
            })
        })
        .collect();
    json!({"resourceSpans": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "agent-app"}},
            {"key": "host.name", "value": {"stringValue": "app-1"}},
        ]},
        "scopeSpans": [{"spans": spans}],
    }]})
}

/// One fault event of `kind` (an index into [`KINDS`]) as NDJSON.
pub fn event(kind: usize, rng: &mut StdRng, ts_ms: u64) -> serde_json::Value {
    let (error_type, category, _) = KINDS[kind % KINDS.len()];
    let (feature, message) = match kind % KINDS.len() {
        0 => (
            "trip_planner",
            format!(
                "agent step waited {} ms in the GPU queue for a completion and hit the flow deadline of 8000 ms",
                8_000 + rng.random_range(0..4_000)
            ),
        ),
        1 => {
            let tool = ["web_search", "weather_api", "flight_search"][rng.random_range(0..3)];
            (
                "trip_planner",
                format!(
                    "tool {tool} timed out after {} ms",
                    5_000 + rng.random_range(0..3_000)
                ),
            )
        }
        _ => (
            "pdf_analysis",
            format!(
                "KV cache pressure: prompt of {} tokens needs {} blocks, {} free",
                6_000 + rng.random_range(0..4_000),
                400 + rng.random_range(0..200),
                rng.random_range(0..40)
            ),
        ),
    };
    json!({
        "ts": ts_ms,
        "service": "agent-app",
        "host": "app-1",
        "user_id": format!("user-{}", rng.random_range(0..500)),
        "feature": feature,
        "criticality": "default",
        "category": category,
        "error_type": error_type,
        "message": message,
        "attributes": {"simulated": "true"},
    })
}

/// Injects faults over one run of `cfg.shape`, once a second. Returns how many were accepted.
/// Errors are reported once on stderr, never fatal: the demo goes on without its faults.
pub async fn run(cfg: FaultConfig) -> u64 {
    let Ok(client) = brownout::loadgen::http_client() else {
        eprintln!("brownout-demo: no HTTP client for the application faults; running without them");
        return 0;
    };
    let mut warned = false;
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let total_share: u32 = KINDS.iter().map(|k| k.2).sum();
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut carry = 0.0f64;
    let mut accepted = 0u64;
    while start.elapsed() < cfg.shape.duration {
        tick.tick().await;
        carry += cfg.base_per_s * cfg.shape.evening(start.elapsed());
        let n = carry.floor() as usize;
        carry -= n as f64;
        if n == 0 {
            continue;
        }
        let now = brownout_protocol::now_ms();
        let mut body = String::new();
        for _ in 0..n {
            let mut pick = rng.random_range(0..total_share);
            let kind = KINDS
                .iter()
                .position(|k| {
                    if pick < k.2 {
                        true
                    } else {
                        pick -= k.2;
                        false
                    }
                })
                .unwrap_or(0);
            body.push_str(&event(kind, &mut rng, now).to_string());
            body.push('\n');
        }
        let steps = n * cfg.ok_steps_per_fault as usize;
        if steps > 0 {
            let r = client
                .post(format!("{}/v1/traces", cfg.control_plane))
                .bearer_auth(&cfg.ingest_token)
                .json(&ok_steps(steps, &mut rng, now))
                .send()
                .await;
            match r {
                Ok(r) if r.status().is_success() => {}
                Ok(r) if !warned => {
                    warned = true;
                    eprintln!(
                        "brownout-demo: application spans refused: HTTP {}",
                        r.status()
                    );
                }
                Err(e) if !warned => {
                    warned = true;
                    eprintln!("brownout-demo: application spans not sent: {e}");
                }
                _ => {}
            }
        }
        match client
            .post(format!("{}/v1/failures", cfg.control_plane))
            .bearer_auth(&cfg.ingest_token)
            .header("content-type", "application/x-ndjson")
            .body(body)
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => accepted += n as u64,
            Ok(r) if !warned => {
                warned = true;
                eprintln!(
                    "brownout-demo: application faults refused: HTTP {}",
                    r.status()
                );
            }
            Err(e) if !warned => {
                warned = true;
                eprintln!("brownout-demo: application faults not sent: {e}");
            }
            _ => {}
        }
    }
    accepted
}
