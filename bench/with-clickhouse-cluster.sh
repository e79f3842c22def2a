#!/usr/bin/env bash
# Runs a command against a ClickHouse cluster of its own: ZooKeeper (Debian `zookeeper`, run
# with java directly) and two clickhouse-server nodes (2 shards x 1 replica, cluster `bt2`) on
# spare loopback ports, data in a temp dir, all stopped by PID on exit. The command sees
# CLICKHOUSE_CLUSTER=bt2 and CLICKHOUSE_NODES="http://127.0.0.1:<p1> http://127.0.0.1:<p2>".
# Verified on clickhouse-server 18.16 (docs/SCALING.md): ON CLUSTER DDL, ReplicatedMergeTree,
# Distributed(bt2, db, t_local, cityHash64(trace_id)) with insert_distributed_sync=1.
#
#   bench/with-clickhouse-cluster.sh bash -c 'curl -s "${CLICKHOUSE_NODES%% *}/?query=SELECT+1"'
set -euo pipefail
[ -f /usr/share/java/zookeeper.jar ] || { echo "zookeeper is not installed (apt-get install zookeeper)" >&2; exit 1; }
command -v clickhouse-server >/dev/null || { echo "clickhouse-server is not installed" >&2; exit 1; }
. "$(dirname "$0")/lib.sh" chc

zk=$(port)
mkdir -p "$tmp/zk/data"
printf 'tickTime=2000\ndataDir=%s\nclientPort=%s\nadmin.enableServer=false\n' "$tmp/zk/data" "$zk" >"$tmp/zk/zoo.cfg"
cp=$( (ls /usr/share/java/{zookeeper,zookeeper-jute,slf4j-api,log4j-1.2,netty-all,netty-handler,netty-transport,netty-common,netty-buffer,netty-codec,netty-resolver,netty-transport-native-unix-common,netty-transport-native-epoll,metrics-core,snappy-java,jline}.jar 2>/dev/null || true) | tr '\n' ':')
java -Xmx256m -cp "$cp" org.apache.zookeeper.server.quorum.QuorumPeerMain "$tmp/zk/zoo.cfg" >"$tmp/zk/out.log" 2>&1 & pids+=($!)

declare -a http tcp
for i in 1 2; do http[$i]=$(port); tcp[$i]=$(port); done
for i in 1 2; do
  d="$tmp/n$i"; mkdir -p "$d/config.d" "$d/data" "$d/log"
  cp /etc/clickhouse-server/config.xml /etc/clickhouse-server/users.xml "$d/"
  sed -i 's#<tcp_port_secure>9440</tcp_port_secure>##' "$d/config.xml"
  cat >"$d/config.d/cluster.xml" <<XML
<yandex>
  <http_port>${http[$i]}</http_port>
  <tcp_port>${tcp[$i]}</tcp_port>
  <interserver_http_port>$(port)</interserver_http_port>
  <interserver_http_host>127.0.0.1</interserver_http_host>
  <path>$d/data/</path>
  <tmp_path>$d/data/tmp/</tmp_path>
  <user_files_path>$d/data/user_files/</user_files_path>
  <format_schema_path>$d/data/format_schemas/</format_schema_path>
  <logger><log>$d/log/server.log</log><errorlog>$d/log/err.log</errorlog><level>information</level></logger>
  <remote_servers replace="1">
    <bt2>
      <shard><internal_replication>true</internal_replication><replica><host>127.0.0.1</host><port>${tcp[1]}</port></replica></shard>
      <shard><internal_replication>true</internal_replication><replica><host>127.0.0.1</host><port>${tcp[2]}</port></replica></shard>
    </bt2>
  </remote_servers>
  <zookeeper replace="1"><node><host>127.0.0.1</host><port>$zk</port></node></zookeeper>
  <macros replace="1"><shard>0$i</shard><replica>r1</replica></macros>
</yandex>
XML
  clickhouse-server --config-file="$d/config.xml" >"$d/log/stdout.log" 2>&1 & pids+=($!)
done
for i in 1 2; do
  for n in $(seq 1 150); do curl -fsS "http://127.0.0.1:${http[$i]}/ping" >/dev/null 2>&1 && break; [ "$n" = 150 ] && { echo "node $i did not start" >&2; tail -5 "$tmp/n$i/log/err.log" >&2; exit 1; }; sleep 0.2; done
done
export CLICKHOUSE_CLUSTER=bt2
export CLICKHOUSE_NODES="http://127.0.0.1:${http[1]} http://127.0.0.1:${http[2]}"
echo "CLICKHOUSE_CLUSTER=$CLICKHOUSE_CLUSTER CLICKHOUSE_NODES=$CLICKHOUSE_NODES" >&2
"$@"
