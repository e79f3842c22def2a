#!/usr/bin/env bash
# End to end into the cluster: the real OpenTelemetry SDK (examples/ingest_bench.rs --external,
# gRPC, traces of 10 spans, 1 % errors) -> a real `brownout serve` (release) -> ClickHouse,
# (a) into one node (plain MergeTree tables on node 1, CLICKHOUSE_CLUSTER unset) and (b) into
# the 2-shard Distributed tables over ReplicatedMergeTree (`clickhouse_cluster`), alternating,
# ROUNDS rounds of each, every run with its own table prefix and a fresh server. For each run:
# spans/s accepted (the server's brownout_ingest_spans_total, sampled once a second), spans
# stored (count() through the table the server reads, after the writer drained) and, for the
# cluster, the rows on each shard. Run under bench/with-clickhouse-cluster.sh:
#
#   cargo build --release -p brownout && cargo build --release -p brownout --example ingest_bench
#   bench/with-clickhouse-cluster.sh bench/clickhouse-cluster-serve.sh
#
# RATE (offered spans/s, default 120000), SECS (per run, 30), ROUNDS (2), THREADS (2),
# BROWNOUT_BIN, INGEST_BENCH override the defaults.
set -euo pipefail
bin=${BROWNOUT_BIN:-target/release/brownout}
loadgen=${INGEST_BENCH:-target/release/examples/ingest_bench}
rate=${RATE:-120000}; secs=${SECS:-30}; rounds=${ROUNDS:-2}; threads=${THREADS:-2}
n1=${CLICKHOUSE_NODES%% *}; n2=${CLICKHOUSE_NODES##* }
cluster=$CLICKHOUSE_CLUSTER
[ -x "$bin" ] && [ -x "$loadgen" ] || { echo "build $bin and $loadgen first (see the header)" >&2; exit 1; }
d=$(mktemp -d /tmp/brownout-chc-serve.XXXXXX)
server=
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -rf "$d"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
secret() { python3 -c 'import secrets; print(secrets.token_hex(24))'; }
q() { curl -fsS "$1/" --data-binary "$2"; }
export BROWNOUT_INGEST_TOKEN=$(secret) BROWNOUT_READ_TOKEN=$(secret) BROWNOUT_ADMIN_TOKEN=$(secret) BROWNOUT_COMMAND_KEY=$(secret)

run() { # run <one|cluster> <round>
  local mode=$1 r=$2 prefix="e2e_${1}${2}_" http grpc
  http=$(port); grpc=$(port)
  cat >"$d/$mode$r.toml" <<TOML
[server]
http_addr = "127.0.0.1:$http"
otlp_http_addr = "127.0.0.1:$(port)"
otlp_grpc_addr = "127.0.0.1:$grpc"
[storage]
data_dir = "$d/data-$mode$r"
clickhouse_url = "$n1"
table_prefix = "$prefix"
[ingest]
batch_max_delay_ms = 200
TOML
  if [ "$mode" = cluster ]; then
    CLICKHOUSE_CLUSTER=$cluster "$bin" serve --config "$d/$mode$r.toml" >"$d/$mode$r.log" 2>&1 &
  else
    env -u CLICKHOUSE_CLUSTER "$bin" serve --config "$d/$mode$r.toml" >"$d/$mode$r.log" 2>&1 &
  fi
  server=$!
  for n in $(seq 1 150); do curl -fsS "http://127.0.0.1:$http/healthz" >/dev/null 2>&1 && break; [ "$n" = 150 ] && { echo "serve did not start" >&2; tail -20 "$d/$mode$r.log" >&2; exit 1; }; sleep 0.2; done
  local load; load=$(cut -d' ' -f1-3 /proc/loadavg)
  local out; out=$("$loadgen" --external "http://127.0.0.1:$http/metrics" --endpoint "http://127.0.0.1:$grpc" \
    --token "$BROWNOUT_INGEST_TOKEN" --transport grpc --seconds "$secs" --threads "$threads" --rate "$rate")
  local summary; summary=$(grep '^summary:' <<<"$out")
  local accepted; accepted=$(sed -E 's/.* accepted=([0-9]+).*/\1/' <<<"$summary")
  # Wait for the writer: the stored count reaches what was accepted (or stops moving).
  local stored=0 prev=-1 same=0 t0; t0=$(date +%s.%N)
  for n in $(seq 1 240); do
    stored=$(q "$n1" "SELECT count() FROM default.${prefix}spans")
    [ "$stored" -ge "$accepted" ] && break
    if [ "$stored" = "$prev" ]; then same=$((same + 1)); [ $same -ge 10 ] && break; else same=0; fi
    prev=$stored; sleep 0.5
  done
  local drain; drain=$(python3 -c "import time; print('%.1f' % (time.time() - $t0))")
  local shards=""
  if [ "$mode" = cluster ]; then
    shards=" shard1=$(q "$n1" "SELECT count() FROM default.${prefix}spans_local") shard2=$(q "$n2" "SELECT count() FROM default.${prefix}spans_local")"
  fi
  kill "$server"; wait "$server" 2>/dev/null || true; server=
  echo "RESULT mode=$mode round=$r load_avg_at_start=\"$load\" ${summary#summary: } stored=$stored drain_s=$drain$shards"
}

for r in $(seq 1 "$rounds"); do
  run one "$r"
  run cluster "$r"
done
uptime
