//! The agent as a whole: the real NVML path on this machine, and the cycle's timing under
//! `tokio::time::pause`.

use std::time::Duration;

use brownout_gpu_agent::config::{parse_control_plane, parse_engine};
use brownout_gpu_agent::probe::nvml;
use brownout_gpu_agent::{Agent, AgentConfig};
use brownout_test_support::engines::{VLLM_V1_METRICS, spawn_engine};

/// Without libnvidia-ml (CI and the dev machines) the agent starts anyway, reports
/// `brownout_gpu_probe_up 0` with no GPU series, and still exports the engines. On a GPU
/// machine the same test checks that the cards are read instead.
#[tokio::test]
async fn without_nvml_the_agent_exports_probe_down_and_keeps_engine_metrics() {
    let fx = spawn_engine(VLLM_V1_METRICS, None).await.unwrap();
    let mut cfg = AgentConfig::new("no-gpu-host");
    cfg.listen = None;
    cfg.engines
        .push(parse_engine(&format!("vllm-a={}", fx.url()), 0).unwrap());
    let mut agent = Agent::new(cfg).expect("a missing NVML is not a start-up error");
    let handle = agent.handle();
    let report = agent.cycle().await;
    let text = handle.render_metrics();

    assert!(
        text.contains("brownout_engine_up{engine=\"vllm-a\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("brownout_kv_usage_ratio{engine=\"vllm-a\"} 0.4375\n"),
        "{text}"
    );
    assert!(
        text.contains("brownout_engine_requests_running{engine=\"vllm-a\"} 12\n"),
        "{text}"
    );
    assert!(!report.snapshot.simulated);
    if nvml::nvml().is_err() {
        assert!(!report.probe_up && report.gpus.is_empty());
        assert!(!report.snapshot.probe_up);
        assert!(
            text.contains("\nbrownout_gpu_probe_up 0\n")
                || text.starts_with("# HELP brownout_gpu_probe_up"),
            "{text}"
        );
        assert!(text.contains("brownout_gpu_probe_up 0\n"));
        assert!(
            !text.contains("DCGM_FI_DEV_FB_USED"),
            "no GPU series without a probe"
        );
        // A second cycle neither panics nor logs again; still down.
        assert!(!agent.cycle().await.probe_up);
    } else {
        assert!(report.probe_up, "NVML is present, the probe must answer");
        assert!(text.contains("brownout_gpu_probe_up 1\n"));
        assert!(report.gpus.is_empty() || text.contains("DCGM_FI_DEV_FB_USED{"));
    }
}

/// Cycles run on the interval, whatever the push does: with the control plane down, 11 ticks
/// in 10.5 s give 11 snapshots, of which the queue keeps the latest 3 and counts 8 drops.
#[tokio::test(start_paused = true)]
async fn cycles_keep_their_interval_while_the_control_plane_is_down() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = AgentConfig::new("h").with_simulated_gpus(1);
    cfg.listen = None;
    cfg.interval = Duration::from_secs(1);
    cfg.queue_capacity = 3;
    cfg.control_plane = Some(parse_control_plane(&format!("http://127.0.0.1:{port}")).unwrap());
    let agent = Agent::new(cfg).unwrap();
    let handle = agent.handle();
    let started = tokio::time::Instant::now();
    agent
        .run(None, tokio::time::sleep(Duration::from_millis(10_500)))
        .await
        .unwrap();

    let report = handle.latest().unwrap();
    assert_eq!(report.cycles_total, 11, "ticks at 0 s, 1 s, ..., 10 s");
    let c = handle.push_counts().unwrap();
    assert_eq!((c.queued, c.dropped, c.pushed), (3, 8, 0), "{c:?}");
    assert!(c.failed_attempts >= 1);
    // Shutdown waited at most the one-second flush deadline.
    assert!(
        started.elapsed() <= Duration::from_millis(11_600),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn snapshots_follow_the_interval_and_handles_see_each_one() {
    let mut cfg = AgentConfig::new("h").with_simulated_gpus(3);
    cfg.listen = None;
    cfg.interval = Duration::from_millis(250);
    let agent = Agent::new(cfg).unwrap();
    let handle = agent.handle();
    let mut rx = handle.subscribe();
    let task = tokio::spawn(agent.run(None, tokio::time::sleep(Duration::from_millis(1_100))));
    let mut seen = Vec::new();
    // The handle keeps the channel open, so stop at the fifth cycle rather than at its close.
    while seen.len() < 5 {
        rx.changed().await.unwrap();
        if let Some(r) = rx.borrow_and_update().clone() {
            seen.push((r.cycles_total, tokio::time::Instant::now()));
        }
    }
    task.await.unwrap().unwrap();
    assert_eq!(
        handle.latest().unwrap().cycles_total,
        5,
        "no cycle after shutdown at 1.1 s"
    );
    let cycles: Vec<u64> = seen.iter().map(|s| s.0).collect();
    assert_eq!(cycles, vec![1, 2, 3, 4, 5]);
    for w in seen.windows(2) {
        assert_eq!(w[1].1 - w[0].1, Duration::from_millis(250));
    }
    let snap = handle.latest_snapshot().unwrap();
    assert!(snap.simulated && snap.probe_up);
    assert_eq!(snap.gpus.len(), 3);
}
