//! The example config parses and validates; `serve` refuses to start without tokens and says
//! which are missing; bad files name the file, the field and the reason.

use std::collections::BTreeMap;
use std::path::Path;

use brownout::config::Config;

fn example() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/brownout.toml"))
        .unwrap()
}

#[test]
fn example_config_is_valid_and_equals_the_defaults() {
    let c = Config::from_toml_str("examples/brownout.toml", &example(), &BTreeMap::new()).unwrap();
    let d = Config::defaults();
    assert_eq!(
        format!("{c:?}"),
        format!("{d:?}"),
        "the example documents the defaults"
    );
}

#[test]
fn example_config_with_the_commented_examples_enabled_is_valid() {
    let text = example()
        .lines()
        .map(|l| {
            let t = l.trim_start();
            // "# key = value" lines are the commented examples.
            match t.strip_prefix("# ") {
                Some(rest)
                    if rest.contains(" = ")
                        && !rest.starts_with("ingest_token")
                        && !rest.starts_with("read_token")
                        && !rest.starts_with("admin_token")
                        && !rest.starts_with("command_key") =>
                {
                    rest.to_string()
                }
                _ => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let c = Config::from_toml_str("x.toml", &text, &BTreeMap::new()).unwrap();
    assert_eq!(c.clickhouse.unwrap().url, "http://127.0.0.1:8123");
    assert_eq!(c.redis_url.as_deref(), Some("redis://127.0.0.1:6379"));
}

#[test]
fn serve_refuses_to_start_without_tokens_and_names_them() {
    let env: BTreeMap<String, String> = [(
        "BROWNOUT_READ_TOKEN".to_string(),
        "read-token-0123456789".to_string(),
    )]
    .into();
    let c = Config::from_toml_str("examples/brownout.toml", &example(), &env).unwrap();
    let err = c.require_tokens().unwrap_err().to_string();
    assert!(
        err.contains("ingest token") && err.contains("admin token"),
        "{err}"
    );
    assert!(!err.contains("read token"), "{err}");
}

#[test]
fn missing_file_is_named() {
    let err = Config::load_with_env(
        Some(Path::new("/nonexistent/brownout.toml")),
        &BTreeMap::new(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("/nonexistent/brownout.toml: cannot read"),
        "{err}"
    );
}

#[test]
fn brownout_serve_binary_exits_non_zero_naming_the_missing_tokens() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_brownout"))
        .args([
            "serve",
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/examples/brownout.toml"),
        ])
        .env_remove("BROWNOUT_INGEST_TOKEN")
        .env_remove("BROWNOUT_READ_TOKEN")
        .env_remove("BROWNOUT_ADMIN_TOKEN")
        .env_remove("BROWNOUT_INGEST_TOKEN_FILE")
        .env_remove("BROWNOUT_READ_TOKEN_FILE")
        .env_remove("BROWNOUT_ADMIN_TOKEN_FILE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing to start without") && err.contains("BROWNOUT_INGEST_TOKEN"),
        "{err}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_brownout"))
        .args(["serve"])
        .env("BROWNOUT_DATA_DIR", "/tmp")
        .env("BROWNOUT_INGEST_TOKEN", "short")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("auth.ingest_token") && err.contains("16 characters"),
        "{err}"
    );
}
