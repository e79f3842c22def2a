//! Proves the test harness talks to the real servers: a signed command goes through Redis and
//! comes back verified; rows go into ClickHouse 18.16 and come back.
//!
//! Both servers are started by `scripts/test.sh` (the README's test command). When one is
//! absent these tests fail with a message that says how to start it.

use brownout_protocol::{Command, RedisKeys, SignedCommand, Tier, now_ms};
use brownout_test_support::{redis_url, unique};

fn clickhouse_url() -> String {
    std::env::var("CLICKHOUSE_TEST_URL").unwrap_or_else(|_| "http://127.0.0.1:8123".into())
}

#[tokio::test]
async fn signed_command_round_trips_through_real_redis() {
    let client = redis::Client::open(redis_url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap_or_else(|e| {
        panic!("Redis is not reachable at {} ({e}); start it with scripts/test.sh or `redis-server --port 6379`", redis_url())
    });
    let cluster = unique("harness-");
    let keys = RedisKeys::new(&cluster).unwrap();
    let key = b"harness-key";
    let mut cmd = Command::normal(&cluster, 1, 1, now_ms(), 30_000);
    cmd.tier = Tier::T2;
    let signed = SignedCommand::sign(&cmd, key);

    let _: () = redis::cmd("HSET")
        .arg(keys.state())
        .arg("epoch")
        .arg(1)
        .arg("version")
        .arg(1)
        .arg("command")
        .arg(&signed.json)
        .arg("sig")
        .arg(&signed.sig)
        .query_async(&mut con)
        .await
        .unwrap();
    let (json, sig): (String, String) = redis::cmd("HMGET")
        .arg(keys.state())
        .arg("command")
        .arg("sig")
        .query_async(&mut con)
        .await
        .unwrap();
    let back = SignedCommand { json, sig };
    assert_eq!(back.verify_for(key, &cluster).unwrap(), cmd);
    assert!(back.verify(b"wrong key").is_err());
    let _: () = redis::cmd("DEL")
        .arg(keys.state())
        .query_async(&mut con)
        .await
        .unwrap();
}

#[derive(Debug, clickhouse::Row, serde::Serialize, serde::Deserialize, PartialEq)]
struct Row {
    ts: u32,
    ts_us: u64,
    service: String,
    attr_keys: Vec<String>,
    attr_values: Vec<String>,
}

#[tokio::test]
async fn rows_round_trip_through_real_clickhouse() {
    let client = clickhouse::Client::default()
        .with_url(clickhouse_url())
        .with_validation(false);
    let table = unique("harness_");
    client
        .query(&format!(
            "CREATE TABLE {table} (ts DateTime, ts_us UInt64, service String, attr_keys Array(String), attr_values Array(String)) \
             ENGINE = MergeTree() PARTITION BY toYYYYMMDD(ts) ORDER BY (service, ts_us)"
        ))
        .execute()
        .await
        .unwrap_or_else(|e| {
            panic!("ClickHouse is not reachable at {} ({e}); start it with scripts/test.sh", clickhouse_url())
        });
    let rows: Vec<Row> = (0..100u32)
        .map(|i| Row {
            ts: 1_764_460_800 + i,
            ts_us: 1_764_460_800_000_000 + u64::from(i),
            service: format!("svc-{}", i % 3),
            attr_keys: vec!["k".into()],
            attr_values: vec![format!("v{i}")],
        })
        .collect();
    let mut insert = client.insert::<Row>(&table).await.unwrap();
    for r in &rows {
        insert.write(r).await.unwrap();
    }
    insert.end().await.unwrap();
    let got: Vec<Row> = client
        .query(&format!("SELECT ts, ts_us, service, attr_keys, attr_values FROM {table} WHERE service = ? ORDER BY ts_us"))
        .bind("svc-1")
        .fetch_all()
        .await
        .unwrap();
    let want: Vec<&Row> = rows.iter().filter(|r| r.service == "svc-1").collect();
    assert_eq!(got.len(), want.len());
    assert!(got.iter().zip(want).all(|(a, b)| a == b));
    client
        .query(&format!("DROP TABLE {table}"))
        .execute()
        .await
        .unwrap();
}
