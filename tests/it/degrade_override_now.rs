//! An operator override is decided and published at once, not at the controller's next
//! evaluation tick; and a leader whose commands nobody acknowledges says so. Runs the real
//! controller loop on the in-process bus under tokio's paused clock (a logical clock: no
//! wall-clock assertion).

use std::time::Duration;

use brownout::degrade::{
    DegradeConfig, DegradeHandle, InProcBus, Override, Policy, Transport, run_controller,
};
use brownout_protocol::{Tier, now_ms};

/// The example policy with the longest evaluation interval the policy allows (60 s).
fn slow_policy() -> Policy {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/policy.yaml"))
            .unwrap()
            .replace("evaluate_interval_ms: 500", "evaluate_interval_ms: 60000")
            .replace("command_lease_ms: 15000", "command_lease_ms: 300000");
    let p = Policy::from_yaml(&text).unwrap();
    assert_eq!(p.evaluate_interval, Duration::from_secs(60));
    p
}

#[tokio::test(start_paused = true)]
async fn an_override_is_published_without_waiting_for_the_next_tick() {
    let registry = prometheus::Registry::new();
    let h = DegradeHandle::new(
        DegradeConfig::new("override-now", b"k", slow_policy()),
        &registry,
    )
    .unwrap();
    let bus = InProcBus::new();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run_controller(
        h.clone(),
        Transport::InProc(bus.clone()),
        async move {
            let _ = stop_rx.await;
        },
    ));
    // The first tick publishes T0.
    while h.command().is_none() {
        tokio::task::yield_now().await;
    }
    assert_eq!(h.command().unwrap().tier, Tier::T0);
    let before = tokio::time::Instant::now();
    h.set_override(Override {
        tier: Tier::T3,
        until_ms: now_ms() + 600_000,
        reason: "operator".into(),
    });
    // Wait on the logical clock; the next tick would be 60 s away.
    while h.command().unwrap().tier != Tier::T3 {
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(
            before.elapsed() < Duration::from_secs(30),
            "the override waited for the evaluation tick"
        );
    }
    assert!(
        bus.commands().borrow().is_some(),
        "the bus carries the command"
    );
    let _ = stop_tx.send(());
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn commands_nobody_acknowledges_raise_a_warning_and_a_metric() {
    let registry = prometheus::Registry::new();
    let mut policy = slow_policy();
    policy.evaluate_interval = Duration::from_millis(50);
    let h = DegradeHandle::new(
        DegradeConfig::new("nobody-listens", b"k", policy),
        &registry,
    )
    .unwrap();
    let bus = InProcBus::new(); // no serving tier subscribes: nobody acks
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run_controller(
        h.clone(),
        Transport::InProc(bus.clone()),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let gauge = |r: &prometheus::Registry| {
        r.gather()
            .iter()
            .find(|f| f.name() == "brownout_degradation_unacked_commands")
            .map(|f| f.get_metric()[0].get_gauge().get_value())
    };
    assert_eq!(gauge(&registry), Some(0.0), "exists at 0 from the start");
    // UNACKED_WARN_MS of real time: the issue times are wall-clock milliseconds.
    brownout_test_support::wait_for("the unacked warning", Duration::from_secs(15), || {
        h.status().unacked.is_some()
    })
    .await;
    let u = h.status().unacked.unwrap();
    assert!(u.commands >= 1, "{u:?}");
    assert!(u.hint.contains("BROWNOUT_CLUSTER"), "{u:?}");
    assert!(gauge(&registry).unwrap() >= 1.0);
    // An instance acks the current version: the warning clears.
    let cmd = h.command().unwrap();
    bus.ack_sender()
        .send((
            "serve-late".into(),
            brownout_protocol::Ack::Applied {
                epoch: cmd.epoch,
                version: cmd.version,
                applied_at_ms: now_ms(),
                entry: None,
            },
        ))
        .await
        .unwrap();
    brownout_test_support::wait_for("the warning clears", Duration::from_secs(5), || {
        h.status().unacked.is_none()
    })
    .await;
    assert_eq!(gauge(&registry), Some(0.0));
    let _ = stop_tx.send(());
    task.await.unwrap().unwrap();
}
