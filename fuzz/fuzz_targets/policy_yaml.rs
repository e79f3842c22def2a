//! Degradation policy YAML: `brownout::degrade::Policy::from_yaml`.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::policy_yaml(data));
