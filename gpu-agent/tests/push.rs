//! Snapshot push against a real axum server standing in for the control plane: outage and
//! recovery (the latest N arrive, in order), refused tokens, and the full agent pushing.

use std::time::Duration;

use brownout_gpu_agent::push::{PushTarget, SnapshotQueue, run_pusher};
use brownout_gpu_agent::{Agent, AgentConfig, config::parse_control_plane};
use brownout_protocol::AgentSnapshot;
use brownout_test_support::engines::SnapshotSink;
use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::sync::watch;

fn client() -> reqwest::Client {
    brownout_gpu_agent::ensure_crypto_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

fn snapshot(ts_ms: u64) -> Bytes {
    Bytes::from(
        serde_json::to_vec(&AgentSnapshot {
            host: "h".into(),
            ts_ms,
            ..Default::default()
        })
        .unwrap(),
    )
}

/// Polls `cond` every 10 ms for up to 5 s.
async fn eventually(what: &str, cond: impl FnMut() -> bool) {
    brownout_test_support::wait_for(what, Duration::from_secs(5), cond).await;
}

#[tokio::test]
async fn outage_keeps_the_latest_n_and_delivers_them_in_order_when_the_server_returns() {
    // Reserve a port, then leave it closed: the control plane is down.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let queue = std::sync::Arc::new(SnapshotQueue::new(5));
    let target = PushTarget {
        url: PushTarget::endpoint(&parse_control_plane(&format!("http://{addr}")).unwrap()),
        token: Some("s3cret".into()),
        backoff_min: Duration::from_millis(5),
        backoff_max: Duration::from_millis(40),
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let q = queue.clone();
    let pusher = tokio::spawn(async move {
        run_pusher(&q, client(), target, stop_rx, Duration::from_millis(200)).await
    });

    for ts in 0..12 {
        queue.push(snapshot(ts));
    }
    eventually("a few failed attempts", || {
        queue.counts().failed_attempts >= 3
    })
    .await;
    let c = queue.counts();
    assert_eq!((c.queued, c.dropped, c.pushed), (5, 7, 0), "{c:?}");

    // The control plane comes back on the same address.
    let sink = SnapshotSink::new(Some("s3cret"));
    let listener = TcpListener::bind(addr).await.unwrap();
    let (srv_stop_tx, srv_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sink.clone().serve(listener, async {
        let _ = srv_stop_rx.await;
    }));
    eventually("the backlog delivered", || sink.received().len() == 5).await;
    let ts: Vec<u64> = sink.received().iter().map(|s| s.ts_ms).collect();
    assert_eq!(
        ts,
        vec![7, 8, 9, 10, 11],
        "the latest N, oldest first, none lost"
    );
    assert_eq!(
        *sink.refused.lock().unwrap(),
        0,
        "the bearer token was sent"
    );

    // New snapshots flow straight through once it is up.
    queue.push(snapshot(12));
    eventually("the next one", || sink.received().len() == 6).await;
    let c = queue.counts();
    assert_eq!(
        (c.queued, c.pushed, c.dropped, c.rejected),
        (0, 6, 7, 0),
        "{c:?}"
    );

    stop_tx.send(true).unwrap();
    pusher.await.unwrap();
    let _ = srv_stop_tx.send(());
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_refused_token_is_dropped_and_counted_not_retried_forever() {
    let sink = SnapshotSink::new(Some("right"));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(sink.clone().serve(listener, std::future::pending()));
    let queue = std::sync::Arc::new(SnapshotQueue::new(10));
    let target = PushTarget {
        url: PushTarget::endpoint(&parse_control_plane(&format!("http://{addr}")).unwrap()),
        token: Some("wrong".into()),
        backoff_min: Duration::from_millis(5),
        backoff_max: Duration::from_millis(40),
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let q = queue.clone();
    let pusher = tokio::spawn(async move {
        run_pusher(&q, client(), target, stop_rx, Duration::from_millis(200)).await
    });
    for ts in 0..3 {
        queue.push(snapshot(ts));
    }
    eventually("all three refused", || queue.counts().rejected == 3).await;
    let c = queue.counts();
    assert_eq!((c.queued, c.pushed, c.failed_attempts), (0, 0, 0), "{c:?}");
    assert_eq!(*sink.refused.lock().unwrap(), 3);
    assert!(sink.received().is_empty());
    stop_tx.send(true).unwrap();
    pusher.await.unwrap();
}

#[tokio::test]
async fn the_agent_pushes_simulated_snapshots_with_its_token() {
    let sink = SnapshotSink::new(Some("agent-token"));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(sink.clone().serve(listener, std::future::pending()));

    let mut cfg = AgentConfig::new("gpu-host-7").with_simulated_gpus(2);
    cfg.listen = None;
    cfg.interval = Duration::from_millis(20);
    cfg.control_plane = Some(parse_control_plane(&format!("http://{addr}")).unwrap());
    cfg.ingest_token = Some("agent-token".into());
    let agent = Agent::new(cfg).unwrap();
    let handle = agent.handle();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(agent.run(None, async {
        let _ = stop_rx.await;
    }));
    eventually("three snapshots", || sink.received().len() >= 3).await;
    let _ = stop_tx.send(());
    task.await.unwrap().unwrap();

    let got = sink.received();
    assert!(got.windows(2).all(|w| w[0].ts_ms <= w[1].ts_ms), "in order");
    for s in &got {
        assert_eq!(s.host, "gpu-host-7");
        assert!(s.simulated && s.probe_up);
        assert_eq!(s.gpus.len(), 2);
    }
    assert_eq!(
        handle.latest_snapshot().unwrap().gpus.len(),
        2,
        "the handle reads the same snapshots in-process"
    );
    assert!(handle.push_counts().unwrap().pushed >= 3);
}
