#!/usr/bin/env bash
# Loghub-2k log-parsing benchmark: brownout's template miner beside drain3, in one session.
#
#   bench/loghub.sh --data DIR --scorer EVAL_PY [--bin BROWNOUT] [--rounds N] [--scale K]
#                   [--datasets A,B,...] [--out DIR]
#
# --data     Loghub-2k with the corrected ground truth: DIR/<Name>/<Name>_2k.log and
#            <Name>_2k.log_structured_corrected.csv (logpai/loghub; the corrected CSVs are in
#            logpai/logparser, data/loghub_2k_corrected/). Also read from $LOGHUB_DIR.
# --scorer   A Loghub scorer that takes `--cmd "TOOL {input}"` and prints GA/FGA/PA/FTA and,
#            with --throughput-scale K, lines per CPU-second (Loghub-2.0's metrics; see
#            docs/BENCHMARKS.md). Also read from $LOGHUB_SCORER.
# --bin      The brownout binary (default: $CARGO_TARGET_DIR/release/brownout, else
#            target/release/brownout; build it with `cargo build --release --bin brownout`).
# --rounds   Throughput rounds, brownout and drain3 alternating (default 3); the report gives
#            the median round. The machine may be shared: alternate, repeat, take the median.
# --scale    Throughput input: each 2k file repeated K times (default 20).
#
# Needs python3 and drain3 (`pip install drain3==0.9.11`). Writes the scorer's JSON for every
# run and report.md (per-dataset tables, content and raw lines) under --out.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
data="${LOGHUB_DIR:-}"
scorer="${LOGHUB_SCORER:-}"
bin=""
rounds=3
scale=20
datasets="all"
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data="$2"; shift 2 ;;
    --scorer) scorer="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --scale) scale="$2"; shift 2 ;;
    --datasets) datasets="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$data" ] && [ -d "$data" ] || { echo "--data DIR (Loghub-2k) is required" >&2; exit 2; }
[ -n "$scorer" ] && [ -f "$scorer" ] || { echo "--scorer EVAL_PY is required" >&2; exit 2; }
if [ -z "$bin" ]; then
  bin="${CARGO_TARGET_DIR:-$here/../target}/release/brownout"
fi
[ -x "$bin" ] || { echo "no brownout binary at $bin (cargo build --release --bin brownout)" >&2; exit 2; }
python3 -c 'import drain3' 2>/dev/null || { echo "drain3 missing: pip install drain3==0.9.11" >&2; exit 2; }
out="${out:-$here/out/loghub-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
export LOGHUB_DIR="$data"

brownout_cmd="$bin patterns mine {input}"
drain3_cmd="python3 $here/drain3_loghub.py {input}"
score() { # label input-mode json [extra scorer args...]
  local label="$1" mode="$2" json="$3"; shift 3
  local cmd="$brownout_cmd"
  [ "${label%%-*}" = drain3 ] && cmd="$drain3_cmd"
  echo "== $label ($mode)" >&2
  python3 "$scorer" --cmd "$cmd" --label "$label" --input "$mode" --datasets "$datasets" \
    --out-json "$out/$json" "$@" | tail -1 >&2
}

# Accuracy on the message content (the default) and on whole raw lines.
score brownout content brownout-content.json
score drain3 content drain3-content.json
score brownout raw brownout-raw.json
score drain3 raw drain3-raw.json
# In-process, every line mined once by a fresh miner (no process start-up, no repeated input):
# the content lines and true templates as corpora for `brownout patterns bench`, beside drain3
# (bench/drain3_peer.py, one pass each).
python3 "$scorer" --cmd "$brownout_cmd" --datasets "$datasets" --keep-outputs "$out/lines" \
  > /dev/null
mkdir -p "$out/corpus"
python3 - "$out/lines" "$out/corpus" <<'PY'
import os, sys
src, dst = sys.argv[1], sys.argv[2]
for f in sorted(os.listdir(src)):
    rows = [l.rstrip("\n").split("\t") for l in open(os.path.join(src, f), encoding="utf-8")][1:]
    name = f[:-4]
    with open(os.path.join(dst, name + ".log"), "w", encoding="utf-8") as log, \
         open(os.path.join(dst, name + ".truth"), "w", encoding="utf-8") as truth:
        for r in rows:
            log.write(r[4] + "\n")
            truth.write(r[3] + "\n")
PY
echo "== in-process (patterns bench)" >&2
"$bin" patterns bench --corpus "$out/corpus" --peer "$here/drain3_peer.py" > "$out/inprocess.md"
# Throughput, alternating.
for r in $(seq 1 "$rounds"); do
  score "brownout-r$r" content "brownout-thr-$r.json" --throughput-scale "$scale"
  score "drain3-r$r" content "drain3-thr-$r.json" --throughput-scale "$scale"
done
python3 "$here/loghub_report.py" "$out" "$rounds" "$bin" > "$out/report.md"
echo "report: $out/report.md" >&2
