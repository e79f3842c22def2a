//! The composed plane keeps the template miner's state in the store: a restart on the same data
//! directory starts with the templates it had learnt.

use brownout::auth::Tokens;
use brownout::config::Config;
use brownout::degrade::{InProcBus, Transport};
use brownout::plane::{Plane, PlaneOptions};
use brownout::serve::{App, Listeners};
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
