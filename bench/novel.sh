#!/usr/bin/env bash
# Throughput on lines the miner has not seen, beside drain3 on the same input.
#
#   bench/novel.sh LOGHUB_DIR [BROWNOUT_BIN] [OUT_DIR]
#
# LOGHUB_DIR    Loghub-2k with the corrected ground truth
#               (DIR/<Name>/<Name>_2k.log_structured_corrected.csv, as for bench/loghub.sh).
# BROWNOUT_BIN  default: $CARGO_TARGET_DIR/release/brownout, else target/release/brownout.
#
# Two inputs per dataset, each mined in-process by `brownout patterns bench` (a fresh miner per
# pass: nothing is carried from one pass to the next) and by bench/drain3_peer.py (one pass):
#   asis/    the 2 000 content lines of each file once, in order (a file's own repeated lines are
#            answered from the line cache, as in production);
#   unique/  each distinct content line once (no line is ever seen twice: the line cache never
#            answers; the honest figure for novel input).
# Then the same for the LLM-app failure corpora (testdata/failures). Writes <out>/asis.md,
# <out>/unique.md and <out>/failures.md. Needs python3 and drain3 (`pip install drain3==0.9.11`).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-}" in -h|--help|"") sed -n '2,20p' "$0"; exit 2 ;; esac
data="$1"
bin="${2:-${CARGO_TARGET_DIR:-$here/../target}/release/brownout}"
out="${3:-}"
[ -d "$data" ] || { echo "$data: not a directory (Loghub-2k)" >&2; exit 2; }
[ -x "$bin" ] || { echo "no brownout binary at $bin" >&2; exit 2; }
python3 -c 'import drain3' 2>/dev/null || { echo "drain3 missing: pip install drain3==0.9.11" >&2; exit 2; }
out="${out:-$here/out/novel-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out/asis" "$out/unique"
python3 - "$data" "$out" <<'PY'
import csv, os, sys
data, out = sys.argv[1], sys.argv[2]
for name in sorted(os.listdir(data)):
    p = os.path.join(data, name, name + "_2k.log_structured_corrected.csv")
    if not os.path.exists(p):
        continue
    rows = list(csv.DictReader(open(p, encoding="utf-8", errors="replace")))
    seen = set()
    for kind in ("asis", "unique"):
        with open(os.path.join(out, kind, name + ".log"), "w", encoding="utf-8") as log, \
             open(os.path.join(out, kind, name + ".truth"), "w", encoding="utf-8") as truth:
            for r in rows:
                c = r["Content"].replace("\n", " ")
                if kind == "unique":
                    if c in seen:
                        continue
                    seen.add(c)
                log.write(c + "\n")
                truth.write(r["EventTemplate"] + "\n")
PY
for kind in asis unique; do
  echo "== $kind" >&2
  "$bin" patterns bench --corpus "$out/$kind" --peer "$here/drain3_peer.py" > "$out/$kind.md"
done
echo "== failures" >&2
"$bin" patterns bench --corpus "$here/../testdata/failures" --peer "$here/drain3_peer.py" > "$out/failures.md"
wc -l "$out"/unique/*.log | tail -1 >&2
echo "reports: $out/{asis,unique,failures}.md" >&2
