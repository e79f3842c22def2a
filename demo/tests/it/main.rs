//! The tests that need the demo world or the bundled serving tier (the control plane's own are
//! in the root crate's `tests/it`), as modules of one test binary:
//! `cargo test -p brownout-demo --test it [module::]`. `tests/redis_tls.rs` is a binary of its
//! own: it sets process environment variables, which no other test may see.

mod agent_queue_wait;
mod agents_guards;
mod bench_overload;
mod degrade_redis;
mod degrade_sentinel;
mod degrade_stopbleed;
mod degrade_ui;
mod demo_loop;
mod drills;
mod e2e_world;
mod first_run_defaults;
mod fuzz_corpus;
mod metrics_promtool;
mod no_ansi;
mod prometheus_scrape;
mod report_refusals;
mod report_stopbleed;
