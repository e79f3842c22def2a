//! The control plane's integration tests, as modules of one test binary (so the workspace is
//! linked once): `cargo test -p brownout --test it [module::]`. Tests that need the demo world
//! or the bundled serving tier are in the brownout-demo crate's tests.
//!
//! Each module says what it covers and what it needs (Redis at `REDIS_TEST_URL`, ClickHouse at
//! `CLICKHOUSE_TEST_URL`, promtool, chromium, kubectl, kubernetes-validate, systemd-analyze:
//! `scripts/test.sh` provides them all).

mod alerts_rules;
mod architecture;
mod dashboards_valid;
mod degrade_capacity;
mod degrade_key_rotation;
mod degrade_override;
mod degrade_override_now;
mod degrade_policy;
mod degrade_protocol_doc;
mod degrade_self_latch;
mod degrade_stopbleed;
mod deploy_keys;
mod deploy_manifests;
mod drills;
mod error_contract;
mod harness_real_servers;
mod ingest_config;
mod ingest_crash;
mod ingest_hostile;
mod ingest_http;
mod ingest_limits;
mod ingest_otlp_exporter;
mod ingest_slow_clients;
mod ingest_spool_clickhouse;
mod no_ansi;
mod patterns_accuracy;
mod patterns_cli;
mod patterns_engine;
mod patterns_failures;
mod patterns_share;
mod plane_persistence;
mod report_chromium;
mod report_cli;
mod report_golden;
mod report_store;
mod slo_eval;
mod slo_persist;
mod slo_share;
mod slo_spec;
mod store_behaviour;
mod store_clickhouse_tls;
mod store_cluster;
mod store_logs;
mod store_sli;
mod tls_listeners;
mod token_reload;
mod web_live;
mod web_live_source;
mod web_logs_traces;
mod web_pages;
mod web_screenshots;
mod web_xss;
mod wire_names_doc;
