#!/usr/bin/env bash
# The ClickHouse side of ingest into a cluster, without the control plane: span-shaped rows (the
# store's spans columns; traces of 10 spans, 1 % errors) in 20 000-row TSV batches, as ingest
# writes them, POSTed one after the other (a) into a one-node MergeTree on node 1 and (b) through
# a Distributed table (cityHash64(trace_id)) over ReplicatedMergeTree on both shards, with
# insert_distributed_sync=1 as the cluster store sends it. Three rounds of 10 batches each,
# alternating; every batch differs (ReplicatedMergeTree would deduplicate a repeated block).
# Run under bench/with-clickhouse-cluster.sh:
#
#   bench/with-clickhouse-cluster.sh bench/clickhouse-cluster-insert.sh
set -euo pipefail
n1=${CLICKHOUSE_NODES%% *}; n2=${CLICKHOUSE_NODES##* }
c=$CLICKHOUSE_CLUSTER
d=$(mktemp -d /tmp/brownout-chc-bench.XXXXXX)
trap 'rm -rf "$d"' EXIT
q() { curl -fsS "$1/?insert_distributed_sync=1" --data-binary "$2"; }
cols="ts DateTime, start_us UInt64, duration_us UInt64, trace_id String, span_id String, parent_span_id String, service String, name String, kind UInt8, status UInt8, status_message String, feature String, criticality String, host String, is_request UInt8, attr_keys Array(String), attr_values Array(String), batch_id UInt64, seq UInt32"
q $n1 "CREATE TABLE default.b_one ($cols) ENGINE = MergeTree() PARTITION BY toYYYYMMDD(ts) ORDER BY (service, ts)" 
q $n1 "CREATE TABLE default.b_local ON CLUSTER $c ($cols) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default.b_local', '{replica}') PARTITION BY toYYYYMMDD(ts) ORDER BY (service, ts)" >/dev/null
q $n1 "CREATE TABLE default.b ON CLUSTER $c ($cols) ENGINE = Distributed($c, default, b_local, cityHash64(trace_id))" >/dev/null
# 20 000-row batches of span-shaped rows (a trace of 10 spans, 1 % errors), as ingest writes them.
for b in $(seq 0 59); do
  q $n1 "SELECT toDateTime(1795996800 + intDiv(number, 1000)), 1795996800000000 + number * 37, 1000 + number % 5000, lower(hex(MD5(toString(intDiv(number, 10))))), lower(hex(substring(MD5(toString(number)), 1, 8))), if(number % 10 = 0, '', lower(hex(substring(MD5(toString(intDiv(number, 10) * 10)), 1, 8)))), 'muse', concat('op', toString(number % 10)), if(number % 10 = 0, 2, 1), if(number % 100 = 0, 2, 1), '', 'chat', 'default', 'gpu-1', number % 10 = 0, ['service.name', 'k'], ['muse', toString(number)], $b, number % 20000 FROM system.numbers LIMIT $((b * 20000)), 20000 FORMAT TSV" > $d/batch$b.tsv
done
echo "batch: $(wc -c <"$d/batch0.tsv") bytes of TSV, 20000 rows" >&2
bench() {
  local node=$1 table=$2 first=$3
  local t0=$(date +%s.%N)
  for b in $(seq $first $((first + 9))); do curl -fsS "$node/?insert_distributed_sync=1&query=INSERT%20INTO%20$table%20FORMAT%20TSV" --data-binary @$d/batch$b.tsv; done
  local t1=$(date +%s.%N)
  python3 -c "print('$table: 200000 rows in %.2f s = %.0f rows/s' % ($t1 - $t0, 200000 / ($t1 - $t0)))"
}
for r in 0 1 2; do
  bench $n1 default.b_one $((r * 20))
  bench $n1 default.b $((r * 20 + 10))
done
echo "one node: $(q $n1 'SELECT count() FROM default.b_one')  distributed: $(q $n1 'SELECT count() FROM default.b')  shard1: $(q $n1 'SELECT count() FROM default.b_local') shard2: $(q $n2 'SELECT count() FROM default.b_local')"
uptime
