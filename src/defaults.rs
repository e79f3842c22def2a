//! What the control plane runs when its config names no SLO file or policy file: the SLO specs
//! and the degradation policy shipped in `examples/`, embedded at compile time and parsed here
//! only (by `brownout serve`, `brownout report` and [`crate::plane::PlaneOptions::defaults`]).

use anyhow::Context as _;

use crate::degrade::Policy;
use crate::slo::spec::SloSpec;

/// The SLO specs shipped in `examples/slo/`, as `(file, text)`.
pub const SLO_FILES: &[(&str, &str)] = &[
    (
        "examples/slo/chat.yaml",
        include_str!("../examples/slo/chat.yaml"),
    ),
    (
        "examples/slo/agent.yaml",
        include_str!("../examples/slo/agent.yaml"),
    ),
    (
        "examples/slo/agent-app.yaml",
        include_str!("../examples/slo/agent-app.yaml"),
    ),
];

/// The default degradation policy (`examples/policy.yaml`).
pub const POLICY_YAML: &str = include_str!("../examples/policy.yaml");

/// The embedded example SLOs, parsed.
///
/// # Errors
/// When an embedded file does not parse (a defect the tests catch).
pub fn slos() -> anyhow::Result<Vec<SloSpec>> {
    let mut v = Vec::new();
    for (file, text) in SLO_FILES {
        v.extend(crate::slo::spec::parse_str(text, file)?);
    }
    Ok(v)
}

/// The embedded example policy, parsed.
///
/// # Errors
/// When it does not parse (a defect the tests catch).
pub fn policy() -> anyhow::Result<Policy> {
    Policy::from_yaml(POLICY_YAML).context("examples/policy.yaml")
}

/// `slo_file`'s specs when the config names one, else the embedded examples.
///
/// # Errors
/// The file cannot be read or does not parse.
pub fn slos_or(slo_file: Option<&std::path::Path>) -> anyhow::Result<Vec<SloSpec>> {
    match slo_file {
        Some(p) => Ok(crate::slo::spec::load_file(p)?),
        None => slos(),
    }
}

/// `policy_file`'s policy when the config names one, else the embedded example.
///
/// # Errors
/// The file cannot be read or does not parse.
pub fn policy_or(policy_file: Option<&std::path::Path>) -> anyhow::Result<Policy> {
    match policy_file {
        Some(p) => Ok(Policy::load(p)?),
        None => policy(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_embedded_examples_parse() {
        let slos = super::slos().unwrap();
        assert!(
            slos.iter().any(|s| s.name == "chat-availability"),
            "{slos:?}"
        );
        super::policy().unwrap();
    }
}
