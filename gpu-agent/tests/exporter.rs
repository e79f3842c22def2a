//! The exporter's text: golden files (regenerate with `UPDATE_GOLDEN=1`) and `promtool check
//! metrics` on both the golden inputs and a live agent's `GET /metrics`.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use brownout_gpu_agent::config::parse_engine;
use brownout_gpu_agent::exporter::{RenderContext, render};
use brownout_gpu_agent::probe::{GpuSample, ProbeKind, ProcessVram};
use brownout_gpu_agent::push::PushCounts;
use brownout_gpu_agent::{Agent, AgentConfig, CycleReport};
use brownout_protocol::GpuStats;
use brownout_test_support::engines::{
    BROWNOUT_SERVE_DEBUG_KV, BROWNOUT_SERVE_METRICS, VLLM_V1_METRICS, spawn_engine,
};
use tokio::net::TcpListener;

/// `promtool check metrics` on `text`: (success, promtool's words).
fn promtool(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is not installed: `apt-get install -y prometheus` (scripts/test.sh does it) puts it in /usr/bin");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

const CAMEL_CASE_LINT: &str = "label names should be written in 'snake_case' not 'camelCase'";

/// Checks `text` with promtool. DCGM exporter's own `modelName` label is the one thing promtool's
/// linter objects to (it fails dcgm-exporter's output the same way); we keep it for dashboard
/// compatibility, so: with `modelName` renamed the text must pass clean, and as served the only
/// complaint allowed is that lint.
fn promtool_check(name: &str, text: &str) {
    let renamed = text.replace("modelName=\"", "model_name=\"");
    let (ok, words) = promtool(&renamed);
    assert!(
        ok && words.trim().is_empty(),
        "{name}: promtool check metrics says:\n{words}\n--- text ---\n{renamed}"
    );
    let (ok, words) = promtool(text);
    if !ok {
        for line in words.lines().filter(|l| !l.trim().is_empty()) {
            assert!(
                line.ends_with(CAMEL_CASE_LINT),
                "{name}: promtool check metrics says:\n{words}\n--- text ---\n{text}"
            );
        }
        assert!(
            text.contains("modelName=\""),
            "{name}: the camelCase lint without a modelName label: {words}"
        );
    }
}

fn golden(name: &str, text: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with UPDATE_GOLDEN=1 to create it",
            path.display()
        )
    });
    assert!(
        want == text,
        "{name} differs from {}; if the change is intended, rerun with UPDATE_GOLDEN=1\n--- got ---\n{text}",
        path.display()
    );
}

/// One real cycle of a simulated 2-GPU agent over three engines (vLLM, bundled, down), with the
/// timings pinned so the text is reproducible.
async fn simulated_report() -> CycleReport {
    let vllm = spawn_engine(VLLM_V1_METRICS, None).await.unwrap();
    let serve = spawn_engine(BROWNOUT_SERVE_METRICS, Some(BROWNOUT_SERVE_DEBUG_KV))
        .await
        .unwrap();
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = AgentConfig::new("gpu-host-1").with_simulated_gpus(2);
    cfg.listen = None;
    cfg.engines = vec![
        parse_engine(&format!("vllm-0={}", vllm.url()), 0).unwrap(),
        parse_engine(&format!("serve-0={}", serve.url()), 1).unwrap(),
        parse_engine(&format!("gone-0=http://127.0.0.1:{dead_port}"), 2).unwrap(),
    ];
    let mut agent = Agent::new(cfg).unwrap();
    let mut r = (*agent.cycle().await).clone();
    r.cycle_duration = Duration::from_micros(12_500);
    for e in &mut r.engines {
        e.scrape_duration = Duration::from_millis(2);
    }
    r
}

fn nvml_like_gpu() -> GpuSample {
    GpuSample {
        stats: GpuStats {
            index: 0,
            uuid: "GPU-0f4b2a7c-1d2e-3f40-5a6b-7c8d9e0f1a2b".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_total_bytes: 81_559 * 1024 * 1024,
            memory_used_bytes: 65_000 * 1024 * 1024,
            memory_reserved_bytes: 531 * 1024 * 1024,
            gpu_util_ratio: 0.97,
            mem_util_ratio: 0.41,
            temperature_c: 71.0,
            power_w: 612.5,
        },
        memory_free_bytes: (81_559 - 65_000 - 531) * 1024 * 1024,
        last_xid: Some(79),
        ecc_sbe_volatile: Some(3),
        ecc_dbe_volatile: None,
        processes: vec![ProcessVram {
            pid: 4242,
            name: "python3 \"vllm\"".into(),
            used_bytes: 64_000 * 1024 * 1024,
        }],
        sm_clock_mhz: Some(1980.0),
        gr_engine_active_ratio: Some(0.93),
        tensor_active_ratio: Some(0.61),
    }
}

#[tokio::test]
async fn exporter_text_matches_golden_files_and_passes_promtool() {
    let sim = simulated_report().await;
    let push = Some(PushCounts {
        pushed: 120,
        failed_attempts: 4,
        dropped: 2,
        rejected: 1,
        queued: 3,
        capacity: 60,
    });
    let nvml_down = CycleReport {
        gpus: Vec::new(),
        probe_up: false,
        snapshot: Default::default(),
        ..sim.clone()
    };
    let nvml_up = CycleReport {
        gpus: vec![nvml_like_gpu()],
        probe_up: true,
        ..nvml_down.clone()
    };
    let cases: [(&str, Option<&CycleReport>, ProbeKind, Option<PushCounts>); 4] = [
        (
            "simulated_2gpu_3engines.prom",
            Some(&sim),
            ProbeKind::Simulated,
            push,
        ),
        ("nvml_down.prom", Some(&nvml_down), ProbeKind::Nvml, None),
        ("nvml_one_gpu.prom", Some(&nvml_up), ProbeKind::Nvml, push),
        ("before_first_cycle.prom", None, ProbeKind::Nvml, None),
    ];
    for (name, report, probe_kind, push) in cases {
        let text = render(
            report,
            &RenderContext {
                host: "gpu-host-1",
                probe_kind,
                vram_watermark_ratio: 0.75,
                push,
            },
        );
        promtool_check(name, &text);
        golden(name, &text);
    }
}

#[tokio::test]
async fn every_simulated_gpu_series_says_so_and_real_ones_do_not() {
    let sim = simulated_report().await;
    let ctx = |k| RenderContext {
        host: "h",
        probe_kind: k,
        vram_watermark_ratio: 0.75,
        push: None,
    };
    let text = render(Some(&sim), &ctx(ProbeKind::Simulated));
    let gpu_lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            !l.starts_with('#')
                && (l.starts_with("DCGM_") || l.starts_with("brownout_gpu_"))
                && !l.starts_with("brownout_gpu_agent_")
        })
        .collect();
    assert!(gpu_lines.len() > 20, "{text}");
    for l in &gpu_lines {
        assert!(
            l.contains("simulated=\"true\""),
            "unlabelled simulated series: {l}"
        );
    }
    let real = CycleReport {
        gpus: vec![nvml_like_gpu()],
        ..sim
    };
    let text = render(Some(&real), &ctx(ProbeKind::Nvml));
    assert!(!text.contains("simulated="), "{text}");
    // DCGM's units: MiB for framebuffer, % for utilisation, W for power.
    assert!(text.contains("DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-0f4b2a7c-1d2e-3f40-5a6b-7c8d9e0f1a2b\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"h\",hostname=\"h\"} 65000\n"), "{text}");
    // The fields of dcgm-exporter's dashboard: SM clock in MHz, profiling ratios 0-1.
    assert!(
        text.contains("DCGM_FI_DEV_SM_CLOCK{gpu=\"0\"") && text.contains("} 1980\n"),
        "{text}"
    );
    assert!(
        text.contains("DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu=\"0\"") && text.contains("} 0.93\n"),
        "{text}"
    );
    assert!(
        text.contains("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu=\"0\"") && text.contains("} 0.61\n"),
        "{text}"
    );
    // brownout's own GPU series: snake_case labels only.
    assert!(text.contains("brownout_gpu_utilization_ratio{gpu=\"0\",uuid=\"GPU-0f4b2a7c-1d2e-3f40-5a6b-7c8d9e0f1a2b\",device=\"nvidia0\",gpu_model=\"NVIDIA H100 80GB HBM3\",host=\"h\"} 0.97\n"), "{text}");
    for l in text.lines().filter(|l| l.starts_with("brownout_")) {
        assert!(
            !l.contains("modelName=") && !l.contains("UUID=") && !l.contains("Hostname="),
            "camelCase label on {l}"
        );
    }
    assert!(text.contains("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\""), "{text}");
    assert!(text.contains("} 97\n"), "{text}");
    assert!(text.contains("DCGM_FI_DEV_POWER_USAGE{") && text.contains("} 612.5\n"));
    assert!(
        text.contains("brownout_gpu_vram_watermark_exceeded{gpu=\"0\"")
            && text.contains("host=\"h\"} 1\n"),
        "65000/81559 > 0.75"
    );
    assert!(
        text.contains("process=\"python3 \\\"vllm\\\"\""),
        "label values are escaped: {text}"
    );
}

#[tokio::test]
async fn a_live_agent_serves_metrics_that_pass_promtool() {
    let vllm = spawn_engine(VLLM_V1_METRICS, None).await.unwrap();
    let serve = spawn_engine(BROWNOUT_SERVE_METRICS, Some(BROWNOUT_SERVE_DEBUG_KV))
        .await
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let mut cfg = AgentConfig::new("live-host").with_simulated_gpus(8);
    cfg.interval = Duration::from_millis(20);
    cfg.engines = vec![
        parse_engine(&vllm.url(), 0).unwrap(),
        parse_engine(&serve.url(), 1).unwrap(),
    ];
    let agent = Agent::new(cfg).unwrap();
    let mut rx = agent.handle().subscribe();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(agent.run(Some(listener), async {
        let _ = stop_rx.await;
    }));
    rx.wait_for(|r| r.as_ref().is_some_and(|r| r.cycles_total >= 3))
        .await
        .unwrap();

    brownout_gpu_agent::ensure_crypto_provider();
    let client = reqwest::Client::new();
    let resp = client.get(format!("{url}/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    let text = resp.text().await.unwrap();
    promtool_check("live /metrics", &text);
    assert_eq!(text.matches("DCGM_FI_DEV_FB_USED{").count(), 8, "{text}");
    assert!(
        text.contains("brownout_kv_usage_ratio{engine=\"engine-1\"} 0.625\n"),
        "{text}"
    );

    let snap: brownout_protocol::AgentSnapshot = client
        .get(format!("{url}/v1/snapshot"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!((snap.gpus.len(), snap.engines.len()), (8, 2));
    assert_eq!(
        client
            .get(format!("{url}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    let _ = stop_tx.send(());
    task.await.unwrap().unwrap();
}
