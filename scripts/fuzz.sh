#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time (new inputs are added to fuzz/corpus/<target>/;
# `git clean fuzz/corpus` drops them, FUZZ_CMIN=1 minimises in place).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET=60] [TARGET...]
#
# Needs cargo-fuzz: `cargo install cargo-fuzz` (0.13+). libFuzzer needs nightly compiler
# flags; on a stable toolchain this script sets RUSTC_BOOTSTRAP=1. Builds go to a separate
# target dir (CARGO_TARGET_DIR, default /work/target-fuzz or ./target-fuzz) so sanitizer
# flags do not invalidate the normal build. FUZZ_SANITIZER=address for ASan (slower to build);
# the default is none (the code under test is safe Rust; panics and aborts are what we hunt).
# Crashes land in fuzz/artifacts/<target>/; reproduce with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none -O <target> fuzz/artifacts/<target>/<file>
# The committed corpus is replayed on stable by `cargo test -p brownout-demo --test fuzz_corpus`.
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-60}"
shift || true
all=(failure_ndjson command_verify otlp_decode policy_yaml slo_yaml gguf tokenizer)
[[ $# -gt 0 ]] && targets=("$@") || targets=("${all[@]}")

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz is not installed: cargo install cargo-fuzz" >&2
    exit 2
fi
export RUSTC_BOOTSTRAP=1
if [[ -z "${CARGO_TARGET_DIR:-}" ]]; then
    if [[ -d /work ]]; then export CARGO_TARGET_DIR=/work/target-fuzz; else export CARGO_TARGET_DIR="$PWD/target-fuzz"; fi
fi
san="${FUZZ_SANITIZER:-none}"

nice -n 10 cargo fuzz build --sanitizer "$san" -O

status=0
for t in "${targets[@]}"; do
    echo "== $t: ${secs}s"
    mkdir -p "fuzz/corpus/$t"
    start=$(date +%s)
    # -rss_limit_mb/-malloc_limit_mb: an input that makes a parser allocate >2 GiB is a finding.
    if ! nice -n 10 cargo fuzz run --sanitizer "$san" -O "$t" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
        -timeout=10 -print_final_stats=1 2>&1 | tail -n 25; then
        echo "!! $t found a crash (see fuzz/artifacts/$t/)" >&2
        status=1
    fi
    echo "== $t ran $(( $(date +%s) - start ))s"
    # FUZZ_CMIN=1: minimise the corpus in place (renames every file, seeds included, to its
    # hash; review before committing: the committed corpus is kept to a few dozen files).
    if [[ "${FUZZ_CMIN:-0}" == 1 ]]; then
        nice -n 10 cargo fuzz cmin --sanitizer "$san" -O "$t" "fuzz/corpus/$t" >/dev/null 2>&1 || true
    fi
done
exit $status
