//! SLO spec YAML (brownout/v1, Sloth prometheus/v1, OpenSLO): `brownout::slo::spec::parse_str`.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::slo_yaml(data));
