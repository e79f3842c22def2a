//! The loader that tells the SLO spec formats apart and converts each into the validated model
//! ([`super::model`], re-exported here).
//!
//! ```text
//!  brownout/v1 YAML ──┐
//!  Sloth prometheus/v1 ├─> raw serde structs (deny_unknown_fields) ─> validate ─> Vec<SloSpec>
//!  OpenSLO v1 SLO/SLI ─┘
//! ```
//!
//! Everything downstream (budget math, the evaluator, rule generation) reads only [`SloSpec`].

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize as _;

pub use super::model::*;

/// Reads one spec file (any of the three formats).
///
/// # Errors
/// [`SpecError`] naming the file, the field and the reason.
pub fn load_file(path: &Path) -> Result<Vec<SloSpec>, SpecError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| SpecError::Io {
        file: file.clone(),
        source,
    })?;
    parse_str(&text, &file)
}

/// Reads several spec files and checks that SLO names are unique across all of them.
///
/// # Errors
/// The first file that fails, or the second file defining an already-seen name.
pub fn load_files<P: AsRef<Path>>(paths: &[P]) -> Result<Vec<SloSpec>, SpecError> {
    let mut out: Vec<SloSpec> = Vec::new();
    for p in paths {
        for spec in load_file(p.as_ref())? {
            if let Some(prev) = out.iter().find(|s| s.name == spec.name) {
                return Err(SpecError::invalid(
                    &spec.source.file,
                    format!("slo {:?}", spec.name),
                    format!("name already defined in {}", prev.source.file),
                ));
            }
            out.push(spec);
        }
    }
    Ok(out)
}

/// Parses spec text; `file` is only used in messages. The format is recognised by the
/// top-level `version: brownout/v1`, `version: prometheus/v1` (Sloth) or
/// `apiVersion: openslo/v1` (possibly several `---` documents).
///
/// # Errors
/// [`SpecError`] naming the file, the field and the reason.
pub fn parse_str(text: &str, file: &str) -> Result<Vec<SloSpec>, SpecError> {
    #[derive(serde::Deserialize)]
    struct Sniff {
        version: Option<String>,
        #[serde(rename = "apiVersion")]
        api_version: Option<String>,
    }
    let first = serde_yaml::Deserializer::from_str(text)
        .next()
        .ok_or_else(|| SpecError::parse(file, "empty file"))?;
    let sniff = Sniff::deserialize(first).map_err(|e| SpecError::parse(file, e))?;
    let specs = match (sniff.version.as_deref(), sniff.api_version.as_deref()) {
        (Some(super::raw::VERSION), _) => super::raw::convert(text, file)?,
        (Some(super::sloth::VERSION), _) => super::sloth::convert(text, file)?,
        (_, Some(super::openslo::API_VERSION)) => super::openslo::convert(text, file)?,
        (Some(v), _) => {
            return Err(SpecError::invalid(
                file,
                "version",
                format!("{v:?} is not brownout/v1 or prometheus/v1 (Sloth)"),
            ));
        }
        (None, Some(v)) => {
            return Err(SpecError::invalid(
                file,
                "apiVersion",
                format!("{v:?} is not openslo/v1"),
            ));
        }
        (None, None) => {
            return Err(SpecError::parse(
                file,
                "no `version` (brownout/v1, prometheus/v1) or `apiVersion` (openslo/v1) at the top",
            ));
        }
    };
    if specs.is_empty() {
        return Err(SpecError::parse(file, "defines no SLO"));
    }
    let mut seen = BTreeSet::new();
    for s in &specs {
        if !seen.insert(s.name.as_str()) {
            return Err(SpecError::invalid(
                file,
                format!("slo {:?}", s.name),
                "name defined twice in this file",
            ));
        }
    }
    Ok(specs)
}
