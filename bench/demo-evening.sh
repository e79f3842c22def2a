#!/usr/bin/env bash
# Runs `brownout-demo demo` for a while and records every tier change the control plane decides,
# read once a second from GET /api/v1/degrade: the demo's evening as a user sees it
# (docs/BENCHMARKS.md "The demo's evening"). Prints one line per change and, at the end, the
# count of rises after the first step down of each evening and whether T0 came back before the
# next evening.
#
#   bench/demo-evening.sh [--model tiny-random|smollm2] [--speed 2] [--duration 660] [--port 18080]
#
# Needs the release build (cargo build --release -p brownout-demo), curl and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
model=tiny-random speed=2 duration=660 port=18080
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --speed) speed=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
bin=${CARGO_TARGET_DIR:-target}/release/brownout-demo
[ -x "$bin" ] || { echo "build it first: cargo build --release -p brownout-demo ($bin)" >&2; exit 2; }
log=$(mktemp /tmp/demo-evening.XXXXXX)
"$bin" demo --model "$model" --speed "$speed" --duration "$duration" --port "$port" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -f "$log"' EXIT
token=""
for _ in $(seq 1 600); do
  token=$(sed -n 's/^  read token *//p' "$log" | head -1)
  [ -n "$token" ] && break
  kill -0 $pid 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 1
done
[ -n "$token" ] || { echo "no banner after 600 s" >&2; tail -20 "$log" >&2; exit 1; }
evening=$(sed -n 's/.*an evening every \([0-9.]*\) s.*/\1/p' "$log" | head -1)
echo "demo: model $model, speed $speed, an evening every ${evening:-?} s; $(grep -m1 'load ' "$log" | sed 's/^ *//')"
start=$(date +%s.%N)
python3 - "$port" "$token" "$duration" "$start" "${evening:-0}" <<'EOF'
import json, sys, time, urllib.request
port, token, duration, start, evening = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
url = f"http://127.0.0.1:{port}/api/v1/degrade"
last, changes = None, []
while time.time() - start < duration - 5:
    try:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        v = json.load(urllib.request.urlopen(req, timeout=5))
        tier = v.get("tier")
        if tier != last:
            t = time.time() - start
            reason = (v.get("command") or {}).get("reason", {})
            print(f"{t:7.1f} s  T{last} -> T{tier}  ({reason.get('trigger', '?')}: {reason.get('detail', '')[:110]})", flush=True)
            if last is not None:
                changes.append((t, last, tier))
            last = tier
    except Exception as e:  # the demo is still starting, or stopping
        pass
    time.sleep(1)
# Per evening: rises after its first step down, and whether T0 came back before the next one.
if evening > 0:
    n = int(duration // evening) + 1
    for k in range(n):
        lo, hi = k * evening, (k + 1) * evening
        ev = [c for c in changes if lo <= c[0] < hi]
        if not ev:
            continue
        first_down = next((i for i, c in enumerate(ev) if c[2] < c[1]), None)
        rerises = 0 if first_down is None else sum(1 for c in ev[first_down:] if c[2] > c[1])
        back = ev[-1][2] == 0
        print(f"evening {k + 1} ({lo:.0f}-{hi:.0f} s): {len(ev)} changes, peak T{max(c[2] for c in ev)}, {rerises} re-raise(s) after the first step down, {'back at T0' if back else 'NOT back at T0'} before the next evening")
print(f"total: {len(changes)} tier changes in {duration:.0f} s")
EOF
