//! The composed plane keeps the template miner's state in the store: a restart on the same data
//! directory starts with the templates it had learnt.

use brownout::auth::Tokens;
use brownout::config::Config;
use brownout::degrade::{InProcBus, Transport};
use brownout::plane::{App, Listeners, Plane, PlaneOptions};
use std::time::Duration;

use brownout_protocol::{FailureEvent, now_ms};

async fn start(dir: &std::path::Path) -> Plane {
    let mut config = Config::defaults();
    config.data_dir = dir.to_path_buf();
    let app = App::build(config, Tokens::random()).await.unwrap();
    let mut opts = PlaneOptions::defaults(
        "persist",
        b"key-key-key-key-key",
        Transport::InProc(InProcBus::new()),
    )
    .unwrap();
    opts.ui = None;
    Plane::start(app, Listeners::loopback().await.unwrap(), opts)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_miner_state_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let plane = start(dir.path()).await;
    let messages = [
        "tool call to the weather API timed out after 8000 ms",
        "KV cache exhausted: no free blocks for seq 17",
        "failed to deserialize agent state: unexpected token at byte 4711",
    ];
    for (i, m) in messages.iter().enumerate() {
        let ev = FailureEvent::from_attributes(
            now_ms(),
            m,
            [
                ("service.name", "muse".to_string()),
                ("request_id", format!("r{i}")),
            ],
        );
        plane.patterns.lock().unwrap().observe(&ev);
    }
    let learnt = plane.patterns.lock().unwrap().miner().templates().len();
    assert!(learnt >= 3, "{learnt}");
    plane.stop().await.unwrap();

    let again = start(dir.path()).await;
    let restored = again.patterns.lock().unwrap().miner().templates().len();
    assert_eq!(restored, learnt, "templates restored from the store");
    again.stop().await.unwrap();
}

/// `Plane::stop` waits for its tasks: the controller releases the leader lease on the way out
/// (a stop that aborted it would leave the lease to expire, delaying a peer's takeover).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_releases_the_leader_lease() {
    use redis::AsyncCommands as _;
    let url = brownout_test_support::redis_url();
    brownout_test_support::require_redis(&url);
    let cluster = brownout_test_support::unique("lease-");
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::defaults();
    config.data_dir = dir.path().to_path_buf();
    let app = App::build(config, Tokens::random()).await.unwrap();
    let mut opts = PlaneOptions::defaults(
        &cluster,
        b"key-key-key-key-key",
        Transport::Redis { url: url.clone() },
    )
    .unwrap();
    opts.ui = None;
    let plane = Plane::start(app, Listeners::loopback().await.unwrap(), opts)
        .await
        .unwrap();
    let degrade = plane.degrade.clone();
    brownout_test_support::wait_for("the plane to lead", Duration::from_secs(20), || {
        degrade.leader_epoch().is_some()
    })
    .await;
    let key = brownout_protocol::RedisKeys::new(&cluster)
        .unwrap()
        .leader();
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let held: Option<String> = conn.get(&key).await.unwrap();
    assert!(held.is_some(), "the leader key is set while it leads");
    plane.stop().await.unwrap();
    let after: Option<String> = conn.get(&key).await.unwrap();
    assert_eq!(after, None, "the lease was released at stop");
}
