#!/usr/bin/env bash
# Screenshots of the live demo world (not the sample data): starts `brownout-demo demo --speed 5`
# on its own port, signs in with the read token the banner prints, and shoots every page with
# headless Chromium at 1400x1000 twice: during the first evening peak and after it. PORT+1 is
# taken by a local proxy that adds the read token to each request.
#
#   scripts/screenshots-live.sh                 # writes docs/screenshots/live-{during,after}-<page>.png
#   OUT=/tmp/shots DURING=70 AFTER=150 scripts/screenshots-live.sh
#
# DURING / AFTER are seconds after the load started (the banner: after the capacity calibration
# and the engines' warm-up; at --speed 5 one simulated evening lasts 120 s with its peak at 60 s).
# PORT (default 18080) is the demo's UI port. MODEL (`tiny-random`, `smollm2`) is passed as
# --model (default: the demo's own choice). The demo binary is built in release unless
# BROWNOUT_DEMO points at one. LOGS=dir keeps the demo's stdout and stderr (banner, calibration,
# the loadgen's per-evening report) there.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v chromium >/dev/null || { echo "chromium is missing: apt-get install chromium" >&2; exit 1; }
OUT=${OUT:-docs/screenshots}
DURING=${DURING:-70}
AFTER=${AFTER:-150}
PORT=${PORT:-18080}
mkdir -p "$OUT"
if [ -z "${BROWNOUT_DEMO:-}" ]; then
  echo "building brownout-demo (release)..." >&2
  cargo build --release --locked -p brownout-demo >&2
  BROWNOUT_DEMO=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/brownout-demo
fi
tmp=$(mktemp -d /tmp/brownout-shots.XXXXXX)
demo_pid=""
proxy_pid=""
cleanup() {
  [ -n "$proxy_pid" ] && kill "$proxy_pid" 2>/dev/null
  [ -n "$demo_pid" ] && kill "$demo_pid" 2>/dev/null && { wait "$demo_pid" 2>/dev/null || true; }
  rm -rf "$tmp"
}
trap cleanup EXIT

model_args=()
[ -n "${MODEL:-}" ] && model_args=(--model "$MODEL")
# The calibration and warm-up come before the banner: give them two minutes on top.
"$BROWNOUT_DEMO" demo --speed 5 --port "$PORT" --duration $((AFTER + 150)) "${model_args[@]}" >"$tmp/demo.out" 2>"$tmp/demo.err" &
demo_pid=$!
for _ in $(seq 1 1500); do
  grep -q "read token" "$tmp/demo.out" 2>/dev/null && break
  kill -0 "$demo_pid" 2>/dev/null || { echo "the demo exited:" >&2; tail -20 "$tmp/demo.err" >&2; exit 1; }
  sleep 0.2
done
start=$SECONDS
token=$(awk '/^  read token/ {print $3}' "$tmp/demo.out")
[ -n "$token" ] || { echo "no read token in the banner" >&2; exit 1; }
base="http://127.0.0.1:$PORT"
echo "demo up at $base ($(grep -o 'model: [^,)]*' "$tmp/demo.out"); load: $(awk '/^  load / {$1=""; print}' "$tmp/demo.out"))" >&2

# The UI cookie is a session cookie, which headless Chromium drops when it exits, so each shot goes
# through a small local proxy that adds the read token as a bearer header.
PROXY_PORT=$((PORT + 1))
python3 - "$base" "$token" "$PROXY_PORT" <<'PY' &
import sys, urllib.request, http.server
base, token, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        req = urllib.request.Request(base + self.path, headers={"Authorization": "Bearer " + token})
        try:
            r = urllib.request.urlopen(req, timeout=30)
            status, headers, body = r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            status, headers, body = e.code, e.headers, e.read()
        self.send_response(status)
        for k in ("content-type", "content-security-policy"):
            if headers.get(k):
                self.send_header(k, headers[k])
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
PY
proxy_pid=$!
sleep 1
base="http://127.0.0.1:$PROXY_PORT"
shoot() { # <url> <file>
  chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$tmp/profile" \
    --window-size=1400,1000 --virtual-time-budget=3000 --screenshot="$2" "$1" >/dev/null 2>&1
}

pages=(overview:/ hosts:/hosts patterns:/patterns slos:/slos degradation:/degradation resource:/debug/resource report:/reports/current)
for phase in during after; do
  at=$DURING; [ "$phase" = after ] && at=$AFTER
  wait_s=$((at - (SECONDS - start)))
  if [ "$wait_s" -gt 0 ]; then
    echo "waiting ${wait_s}s for the '$phase' shots (t=${at}s)..." >&2
    sleep "$wait_s"
  fi
  if [ -n "${LOGS:-}" ]; then
    # What the overview shows beside what the engines export, at the same moment (docs/DASHBOARDS.md
    # compares the TTFT figures).
    mkdir -p "$LOGS"
    curl -fsS "$base/ui/api/overview" >"$LOGS/$phase-overview.json" || true
    i=0
    for e in $(awk '/^  engines / {for (f = 2; f <= NF; f++) if ($f ~ /^http/) print $f}' "$tmp/demo.out"); do
      i=$((i + 1))
      curl -fsS "$e/metrics" >"$LOGS/$phase-engine-$i.prom" || true
    done
  fi
  for p in "${pages[@]}"; do
    name=${p%%:*}; path=${p#*:}
    shoot "$base$path" "$OUT/live-$phase-$name.png"
    echo "  $OUT/live-$phase-$name.png" >&2
  done
done
if [ -n "${LOGS:-}" ]; then
  mkdir -p "$LOGS"
  cp "$tmp/demo.out" "$tmp/demo.err" "$LOGS"/
fi
ls -l "$OUT"/live-*.png
