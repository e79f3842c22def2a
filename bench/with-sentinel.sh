#!/usr/bin/env bash
# Runs a command against a Redis Sentinel set of its own: one master, one replica and three
# Sentinels on spare loopback ports, files in a temp dir, all stopped by PID on exit.
# The command sees REDIS_URL=redis+sentinel://…/brownout-bench (docs/SCALING.md).
#
#   bench/with-sentinel.sh target/debug/examples/degrade_bench 10 500 0
set -euo pipefail
command -v redis-sentinel >/dev/null || { echo "redis-sentinel is not installed (apt-get install redis-sentinel)" >&2; exit 1; }
. "$(dirname "$0")/lib.sh" sentinel
up() { for _ in $(seq 1 100); do redis-cli -p "$1" ping >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "port $1 did not answer" >&2; exit 1; }
m=$(port); r=$(port)
mkdir -p "$tmp/m" "$tmp/r"
redis-server --port "$m" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp/m" >"$tmp/m.log" 2>&1 & pids+=($!)
up "$m"
redis-server --port "$r" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp/r" --replicaof 127.0.0.1 "$m" >"$tmp/r.log" 2>&1 & pids+=($!)
up "$r"
hosts=()
for i in 1 2 3; do
  s=$(port); mkdir -p "$tmp/s$i"
  printf 'port %s\nbind 127.0.0.1\ndir %s\nsentinel monitor brownout-bench 127.0.0.1 %s 2\nsentinel down-after-milliseconds brownout-bench 1000\nsentinel failover-timeout brownout-bench 5000\n' \
    "$s" "$tmp/s$i" "$m" >"$tmp/s$i/sentinel.conf"
  redis-sentinel "$tmp/s$i/sentinel.conf" >"$tmp/s$i.log" 2>&1 & pids+=($!)
  up "$s"
  hosts+=("127.0.0.1:$s")
done
for _ in $(seq 1 100); do redis-cli -p "$m" info replication | grep -q 'state=online' && break; sleep 0.1; done
export REDIS_URL="redis+sentinel://$(IFS=,; echo "${hosts[*]}")/brownout-bench"
echo "REDIS_URL=$REDIS_URL" >&2
"$@"
