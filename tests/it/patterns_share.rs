//! N control-plane replicas, one pattern miner (`control.share_patterns`,
//! `brownout::patterns::share`): two replicas each ingest part of a known failure stream, in
//! different orders, and share it through the real Redis (`REDIS_TEST_URL`, unique cluster
//! names); both end with the template ids, counts and ranked patterns (ids, counts, new-pattern
//! rates: the leader's feed and trigger) of one replica fed the whole stream. Without sharing
//! the same halves give different ids. Also: a replica started later catches up from the
//! stream, one restored from a mid-stream checkpoint continues to the same state, and an entry
//! written twice is mined once. And the same through two real planes (`Plane::start` with
//! `share_patterns`), with a restart from the stored checkpoint.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use brownout::patterns::feed::PatternFeed;
use brownout::patterns::share::{
    DEFAULT_GRACE_SECS, FailureOutbox, PatternShare, ShareCheckpoint, SharedFailure,
};
use brownout::patterns::synth::{SynthConfig, generate};
use brownout::patterns::{EngineConfig, Pattern, PatternEngine, SharedEngine, TemplateId};
use brownout::plane::tag_shared_failure;
use brownout_protocol::FailureEvent;
use brownout_test_support::{redis_url, require_redis, unique};

/// Stream time: 2026-11-23 00:00 UTC.
const BASE_MS: u64 = 1_795_392_000_000;
/// Stream seconds per round (each replica appends and reads once per round).
const ROUND_SECS: u64 = 3;

/// A known failure stream: 2 400 generated agent failures (the four scenarios of
/// docs/REQUIREMENTS.md R1.3 plus noise), one every 250 ms over 10 minutes; every 5th is a
/// tool timeout naming one of several APIs, a word slot whose template (and so its id) is named
/// by whichever line a miner sees first — the order-sensitive case.
fn stream() -> Vec<FailureEvent> {
    const APIS: [&str; 5] = ["weather", "hotel", "maps", "flights", "trains"];
    generate(&SynthConfig {
        lines: 2_400,
        seed: 26,
        ..SynthConfig::default()
    })
    .into_iter()
    .enumerate()
    .map(|(i, s)| {
        let mut ev = s.event;
        ev.ts_ms = BASE_MS + i as u64 * 250;
        if i % 5 == 0 {
            ev.message = format!(
                "tool call to the {} API timed out after {} ms",
                APIS[(i / 5 * 3 + i / 35) % APIS.len()],
                100 + i
            );
        }
        ev
    })
    .collect()
}

fn engine() -> SharedEngine {
    Arc::new(Mutex::new(PatternEngine::new(EngineConfig::default())))
}

async fn share(cluster: &str, name: &str) -> PatternShare {
    PatternShare::connect(&redis_url(), cluster, name, Duration::from_secs(2))
        .await
        .expect("connect to the test Redis")
}

/// (id, template, count) of every template, most frequent first.
fn templates(e: &SharedEngine) -> Vec<(TemplateId, String, u64)> {
    e.lock()
        .unwrap()
        .miner()
        .templates()
        .into_iter()
        .map(|t| (t.id, t.template, t.count))
        .collect()
}

fn patterns(e: &SharedEngine) -> Vec<Pattern> {
    e.lock().unwrap().patterns(BASE_MS, BASE_MS + 3_600_000)
}

/// The new-pattern rates the leader's controller would read (the feed's latest snapshot).
async fn new_pattern_rates(e: &SharedEngine) -> Vec<(String, f64)> {
    let (feed, rx) = PatternFeed::new(e.clone());
    let at = BASE_MS + 10 * 60_000;
    feed.publish_now(at).await;
    let mut r = rx.borrow().new_pattern_rates(11 * 60_000);
    r.sort_by(|a, b| a.0.cmp(&b.0));
    r
}

/// Which replica the "load balancer" sends event `i` to: runs of 3 and 6, uneven halves.
fn to_a(i: usize) -> bool {
    (i / 3) % 3 == 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_failures_mine_what_one_fed_the_whole_stream_mines() {
    require_redis(&redis_url());
    let (cluster, whole_cluster) = (unique("pat-share-"), unique("pat-share-whole-"));
    let events = stream();

    let (a, b, whole) = (engine(), engine(), engine());
    let (oa, ob, ow) = (
        FailureOutbox::default(),
        FailureOutbox::default(),
        FailureOutbox::default(),
    );
    let (mut sa, mut sb) = (share(&cluster, "cp-a").await, share(&cluster, "cp-b").await);
    let mut sw = share(&whole_cluster, "cp-whole").await;
    let mut tags = Vec::new();
    let mut checkpoint: Option<String> = None;

    let rounds = (events.len() as u64 * 250).div_ceil(ROUND_SECS * 1000);
    for r in 0..rounds {
        let (from, until) = (r * ROUND_SECS * 1000, (r + 1) * ROUND_SECS * 1000);
        let window: Vec<(usize, &FailureEvent)> = events
            .iter()
            .enumerate()
            .filter(|(_, e)| (from..until).contains(&(e.ts_ms - BASE_MS)))
            .collect();
        // Three orders: the whole stream backwards, a's part in order, b's sorted by message.
        for (_, ev) in window.iter().rev() {
            tag_shared_failure(&whole, &ow, ev);
        }
        for (_, ev) in window.iter().filter(|(i, _)| to_a(*i)) {
            tags.push((tag_shared_failure(&a, &oa, ev), (*ev).clone()));
        }
        let mut part_b: Vec<&FailureEvent> = window
            .iter()
            .filter(|(i, _)| !to_a(*i))
            .map(|(_, e)| *e)
            .collect();
        part_b.sort_by(|x, y| x.message.cmp(&y.message));
        for ev in part_b {
            tags.push((tag_shared_failure(&b, &ob, ev), ev.clone()));
        }
        let t = (BASE_MS + until) / 1000;
        // b's entry of a round goes first every other round.
        if r % 2 == 0 {
            sa.round(&a, &oa, t).await.unwrap();
            sb.round(&b, &ob, t).await.unwrap();
        } else {
            sb.round(&b, &ob, t).await.unwrap();
            sa.round(&a, &oa, t).await.unwrap();
        }
        sw.round(&whole, &ow, t).await.unwrap();
        if r == rounds / 2 {
            checkpoint = Some(serde_json::to_string(&sa.checkpoint(&a)).unwrap());
        }
    }
    // The stream ends: heartbeats, one a second, until the last slices are mined.
    let end = (BASE_MS + rounds * ROUND_SECS * 1000) / 1000;
    for t in end + 1..=end + DEFAULT_GRACE_SECS + 2 {
        sa.round(&a, &oa, t).await.unwrap();
        sb.round(&b, &ob, t).await.unwrap();
        sw.round(&whole, &ow, t).await.unwrap();
    }
    for (who, s) in [("cp-a", &sa), ("cp-b", &sb), ("whole", &sw)] {
        assert!(
            s.cursor().buffered.is_empty(),
            "{who}: failures left unmined"
        );
    }

    let want = templates(&whole);
    assert!(want.len() >= 10, "{} templates", want.len());
    assert_eq!(
        whole.lock().unwrap().num_observed(),
        events.len() as u64,
        "every failure mined once"
    );
    let want_patterns = patterns(&whole);
    let want_rates = new_pattern_rates(&whole).await;
    assert!(!want_rates.is_empty());
    for (who, e) in [("cp-a", &a), ("cp-b", &b)] {
        assert_eq!(
            e.lock().unwrap().num_observed(),
            events.len() as u64,
            "{who} mined every replica's failures"
        );
        assert_eq!(templates(e), want, "{who}: template ids, texts and counts");
        assert_eq!(
            patterns(e),
            want_patterns,
            "{who}: ranked patterns (ids, counts, …)"
        );
        assert_eq!(
            new_pattern_rates(e).await,
            want_rates,
            "{who}: new-pattern trigger input"
        );
    }

    // The tag given at ingest (before the failure is mined) is the final template's pattern
    // id for nearly every failure; it can differ only for the first lines of a new template.
    let final_miner = whole.lock().unwrap();
    let same = tags
        .iter()
        .filter(|(tag, ev)| {
            *tag == brownout::patterns::PatternId::from_template(final_miner.lookup(ev)).0
        })
        .count();
    drop(final_miner);
    eprintln!(
        "ingest tags equal to the final template's: {same}/{}",
        tags.len()
    );
    assert!(same * 100 >= tags.len() * 95, "{same}/{}", tags.len());

    // Without sharing, each replica mines its own part (here in stream order): the first
    // failures of a kind differ, and so do the ids.
    let (alone_a, alone_b) = (engine(), engine());
    for (i, ev) in events.iter().enumerate() {
        if to_a(i) {
            alone_a.lock().unwrap().observe(ev);
        }
    }
    for (i, ev) in events.iter().enumerate() {
        if !to_a(i) {
            alone_b.lock().unwrap().observe(ev);
        }
    }
    // The same template text under another id.
    let renamed = |e: &SharedEngine| -> Vec<String> {
        let whole_ids: std::collections::BTreeMap<String, TemplateId> =
            want.iter().map(|t| (t.1.clone(), t.0)).collect();
        templates(e)
            .into_iter()
            .filter(|t| whole_ids.get(&t.1).is_some_and(|id| *id != t.0))
            .map(|t| t.1)
            .collect()
    };
    for (who, e) in [("cp-a", &alone_a), ("cp-b", &alone_b)] {
        let r = renamed(e);
        assert!(
            !r.is_empty(),
            "unshared {who} agrees on every id: the stream does not test anything"
        );
        eprintln!(
            "unshared {who}: {} templates under other ids, e.g. {:?}",
            r.len(),
            r[0]
        );
    }

    // A replica started now mines the stream from its start and ends where the others are.
    let c = engine();
    let mut sc = share(&cluster, "cp-c").await;
    let got = sc
        .round(&c, &FailureOutbox::default(), end + DEFAULT_GRACE_SECS + 3)
        .await
        .unwrap();
    assert_eq!(got.mined, events.len() as u64, "{got:?}");
    assert_eq!(templates(&c), want, "late replica");
    assert_eq!(patterns(&c), want_patterns, "late replica");

    // One restored from cp-a's mid-stream checkpoint continues to the same templates.
    let cp: ShareCheckpoint = serde_json::from_str(&checkpoint.unwrap()).unwrap();
    let (restored, cursor) = cp.restore(EngineConfig::default()).unwrap();
    let d: SharedEngine = Arc::new(Mutex::new(restored));
    let mut sd = share(&cluster, "cp-d").await.with_cursor(cursor);
    let got = sd
        .round(&d, &FailureOutbox::default(), end + DEFAULT_GRACE_SECS + 4)
        .await
        .unwrap();
    assert!(got.mined > 0 && got.mined < events.len() as u64, "{got:?}");
    assert_eq!(templates(&d), want, "restored from a checkpoint");

    // An entry appended twice (an XADD whose answer was lost, sent again with the same s) is
    // mined once.
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = format!("brownout:{{{cluster}}}:failures");
    let extra = [SharedFailure::from_event(&events[0])];
    let json = serde_json::to_string(&extra).unwrap();
    for _ in 0..2 {
        let _: String = redis::cmd("XADD")
            .arg(&key)
            .arg("*")
            .arg("o")
            .arg("cp-x/1")
            .arg("s")
            .arg(1)
            .arg("t")
            .arg(end + 20)
            .arg("d")
            .arg(&json)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let before = c.lock().unwrap().num_observed();
    // Rounds (c heartbeats while the failure waits) until its slice completes.
    for t in end + 30..end + 31 + DEFAULT_GRACE_SECS + 20 {
        sc.round(&c, &FailureOutbox::default(), t).await.unwrap();
    }
    assert_eq!(c.lock().unwrap().num_observed(), before + 1);

    for k in [&cluster, &whole_cluster] {
        let _: Result<(), _> = redis::cmd("DEL")
            .arg(format!("brownout:{{{k}}}:failures"))
            .query_async(&mut conn)
            .await;
    }
}

/// The wiring of `brownout serve` with `control.share_patterns`: two planes (each its own
/// store) accept failures through ingest; both end with the same templates, ids and counts
/// (every failure of both, mined once); a plane restarted on its data directory continues from
/// its checkpoint without counting anything twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_planes_sharing_failures_agree_and_a_restart_continues_from_the_checkpoint() {
    use brownout::auth::Tokens;
    use brownout::config::Config;
    use brownout::degrade::{InProcBus, Transport};
    use brownout::ingest::{Accepted, accept};
    use brownout::plane::{App, Listeners, Plane, PlaneOptions};

    require_redis(&redis_url());
    let cluster = unique("pat-plane-");
    async fn start(dir: &std::path::Path, cluster: &str, name: &str) -> Plane {
        let mut config = Config::defaults();
        config.data_dir = dir.to_path_buf();
        let app = App::build(config, Tokens::random()).await.unwrap();
        let mut opts = PlaneOptions::defaults(
            cluster,
            b"key-key-key-key-key",
            Transport::InProc(InProcBus::new()),
        )
        .unwrap();
        opts.ui = None;
        opts.replica_id = Some(name.into());
        opts.share_patterns = Some(redis_url());
        Plane::start(app, Listeners::loopback().await.unwrap(), opts)
            .await
            .unwrap()
    }
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (pa, pb) = (
        start(da.path(), &cluster, "cp-a").await,
        start(db.path(), &cluster, "cp-b").await,
    );
    let now = brownout_protocol::now_ms();
    let apis = ["weather", "hotel", "maps", "flights"];
    let failures = |n: usize, first: usize| -> Vec<FailureEvent> {
        (first..first + n)
            .map(|i| {
                FailureEvent::from_attributes(
                    now + i as u64,
                    &format!(
                        "tool call to the {} API timed out after {} ms",
                        apis[i % apis.len()],
                        100 + i
                    ),
                    [
                        ("service.name", "muse".to_string()),
                        ("request_id", format!("r{i}")),
                    ],
                )
            })
            .collect()
    };
    // a gets the hotel line first, b the weather line: unshared, their ids would differ.
    for (p, evs) in [(&pa, failures(30, 1)), (&pb, failures(30, 40))] {
        let rows = Accepted {
            failures: evs,
            ..Accepted::default()
        };
        accept(&p.state().ingest, "t", rows, 10_000).await.unwrap();
    }
    let observed = |p: &Plane| p.patterns.lock().unwrap().num_observed();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while (observed(&pa) < 60 || observed(&pb) < 60) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!((observed(&pa), observed(&pb)), (60, 60), "both mined all");
    let want = templates(&pa.patterns);
    assert_eq!(templates(&pb.patterns), want);
    assert_eq!(want.iter().map(|t| t.2).sum::<u64>(), 60);
    pa.stop().await.unwrap();

    // Restarted on its data directory: the checkpoint brings the templates back, the stream is
    // read after its position, so nothing is mined twice.
    let pa = start(da.path(), &cluster, "cp-a").await;
    assert_eq!(
        templates(&pa.patterns),
        want,
        "restored from the checkpoint"
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(templates(&pa.patterns), want, "nothing mined twice");
    // The engine's counts start empty after a restart (they are not in the checkpoint): had it
    // mined the stream again from its start, it would have observed the 60 again.
    assert_eq!(
        observed(&pa),
        0,
        "the stream was read after the checkpoint's position"
    );
    pa.stop().await.unwrap();
    pb.stop().await.unwrap();
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: Result<(), _> = redis::cmd("DEL")
        .arg(format!("brownout:{{{cluster}}}:failures"))
        .query_async(&mut conn)
        .await;
}
