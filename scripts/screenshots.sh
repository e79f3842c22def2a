#!/usr/bin/env bash
# Regenerates docs/screenshots/*.png: serves the web UI on SampleDataSource (sample data, labelled
# as such on every page) and screenshots each page with headless Chromium at 1400x1000.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v chromium >/dev/null || { echo "chromium is missing: apt-get install chromium" >&2; exit 1; }
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/brownout-target}
cargo test --locked -p brownout --test it web_screenshots:: -- --ignored --nocapture
ls -l docs/screenshots/
