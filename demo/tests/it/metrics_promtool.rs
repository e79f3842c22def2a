//! The control plane's degradation metrics and the serving tier's command metrics, in one
//! registry as a deployment scrapes them, pass `promtool check metrics`. Here, not in the root
//! crate, because it needs the bundled serving tier.

#[test]
fn degradation_and_serving_metrics_pass_promtool() {
    let registry = prometheus::Registry::new();
    let cfg = brownout::degrade::DegradeConfig::new(
        "prod",
        b"k",
        brownout::degrade::Policy::from_yaml(include_str!("../../../examples/policy.yaml"))
            .unwrap(),
    );
    let h = brownout::degrade::DegradeHandle::new(cfg, &registry).unwrap();
    h.metrics()
        .decisions_total
        .with_label_values(&["gpu_util"])
        .inc();
    h.metrics().publish_seconds.observe(0.0004);
    h.metrics()
        .ack_lag_seconds
        .with_label_values(&["prod", "serving-0"])
        .set(0.002);
    let serving = brownout_serving::control::ControlHandle::new("prod");
    serving.metrics().register(&registry).unwrap();
    serving
        .metrics()
        .refused_total
        .with_label_values(&["bad_signature"])
        .inc();
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    for name in [
        "brownout_degradation_tier{cluster=\"prod\"} 0",
        "brownout_degradation_decisions_total{trigger=\"gpu_util\"} 1",
        "brownout_degradation_publish_seconds_count 1",
        "brownout_degradation_ack_lag_seconds{cluster=\"prod\",engine_instance=\"serving-0\"} 0.002",
        "brownout_serving_commands_refused_total{reason=\"bad_signature\"} 1",
        "brownout_serving_commands_applied_total 0",
    ] {
        assert!(text.contains(name), "{name} missing in\n{text}");
    }
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool must be installed (/usr/bin/promtool)");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
