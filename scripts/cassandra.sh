#!/usr/bin/env bash
# Apache Cassandra 5.0 as a real component of Quill's tests (issue 15): the
# server is Maven Central's org.apache.cassandra:cassandra-all jars run on
# Java 17, one node per loopback address (127.0.0.x), each with its own
# directory for configuration, data and logs.
#
#   scripts/cassandra.sh fetch
#       copies cassandra-all and its dependencies into the jar cache
#       ($QUILL_CASSANDRA_HOME, default ~/.cache/quill-cassandra) with
#       mvn dependency:copy-dependencies (scripts/cassandra/pom.xml); kept
#       and reused once complete. Prints the jar directory.
#   scripts/cassandra.sh java
#       prints the Java 17 binary the nodes run on, or fails.
#   scripts/cassandra.sh start --dir D [--addr A] [--port P] [--storage-port S]
#                              [--seeds A1,A2] [--token T] [--wait SECONDS]
#                              [--jmx-port J]
#       writes D/conf/cassandra.yaml and logback.xml, starts a node in the
#       background, waits until its CQL port answers and prints its PID.
#       --jmx-port opens JMX on 127.0.0.1:J (Cassandra's local-only JMX),
#       which nodetool needs; without it the node has no JMX.
#   scripts/cassandra.sh run ...
#       as start, in the foreground: the script becomes the JVM (exec), so
#       the caller's process id is the node's (the Go test helper,
#       internal/cassandra/cassandratest, runs this). --short-lived: a node
#       for one test run (C1 compiler only, see jvm_flags).
#   scripts/cassandra.sh stop PID [--wait SECONDS]
#       SIGTERM (Cassandra drains its memtables), SIGKILL after the wait.
#   scripts/cassandra.sh nodetool J ARGS...
#       runs nodetool (from the same jars) against the node whose JMX port
#       is J: nodetool J status, nodetool J repair KEYSPACE.
#   scripts/cassandra.sh cluster-start --dir D [--nodes N] [--addr A] [--port P]
#   scripts/cassandra.sh cluster-stop --dir D
#       N nodes (default 3) on 127.0.0.2 ... (or on A and the addresses
#       after it) as one cluster, for the long tests (make cassandra-3);
#       their PIDs are kept in D/pids.
#
# Defaults: address 127.0.0.1, CQL port 9042, storage port 7000, seeds the
# node itself. Environment: QUILL_CASSANDRA_HOME (jar cache),
# QUILL_CASSANDRA_HEAP (the JVM's -Xmx, default 1G), QUILL_CASSANDRA_JVM_OPTS
# (more JVM flags), JAVA (a Java 17 binary; default: the first Java 17 found).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The version is the pom's; the cache is per version, so an upgrade
# fetches next to the old jars instead of mixing them.
version="$(sed -n 's:.*<cassandra.version>\(.*\)</cassandra.version>.*:\1:p' "$here/cassandra/pom.xml")"
cache="${QUILL_CASSANDRA_HOME:-$HOME/.cache/quill-cassandra}"
lib="$cache/cassandra-$version/lib"
heap="${QUILL_CASSANDRA_HEAP:-1G}"

# startWait is how long start waits for CQL to answer: a node starts in
# about 7 s on two busy cores; a first start also makes its system tables.
startWait=120
# stopWait is how long stop lets a node drain after SIGTERM before SIGKILL.
stopWait=30

die() { echo "cassandra.sh: $*" >&2; exit 1; }

fetch() {
  if [ -f "$lib/.complete" ]; then
    echo "$lib"
    return
  fi
  command -v mvn >/dev/null || die "mvn not found (Debian package maven)"
  rm -rf "$lib"
  mkdir -p "$lib"
  # runtime scope: what the server needs, not cassandra-all's test jars.
  # Maven's output is kept for a failure only.
  local log="$cache/fetch.log"
  if ! (cd "$here/cassandra" && mvn -B -q dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$lib") >"$log" 2>&1; then
    tail -30 "$log" >&2
    die "fetching cassandra-all $version from Maven Central failed (log: $log)"
  fi
  [ -f "$lib/cassandra-all-$version.jar" ] || die "cassandra-all-$version.jar missing after the fetch"
  touch "$lib/.complete"
  echo "$lib"
}

# java17 finds a Java 17 runtime: Cassandra 5.0 runs on Java 11 and 17 only
# (a machine may also carry a newer JDK, which it refuses).
java17() {
  local cands=("${JAVA:-}" "${JAVA_HOME:+$JAVA_HOME/bin/java}" /usr/lib/jvm/java-17-openjdk-*/bin/java "$(command -v java || true)")
  local j
  for j in "${cands[@]}"; do
    [ -n "$j" ] && [ -x "$j" ] || continue
    if "$j" -version 2>&1 | head -1 | grep -q '"17\.'; then
      echo "$j"
      return
    fi
  done
  die "no Java 17 found (Debian package openjdk-17-jre-headless, or set JAVA)"
}

# free_port prints a port nobody listens on at address $1 (a connect that
# is refused), from a random start, so two test processes rarely try the
# same one.
free_port() {
  local addr="$1" p i
  for i in $(seq 1 200); do
    p=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/$addr/$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
  die "no free port on $addr"
}

# answers reports whether something accepts connections on $1:$2.
answers() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

dir="" addr="127.0.0.1" port="" sport="" seeds="" token="" wait="$startWait" nodes=3 shortlived="" jmxport=""

parse() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --dir) dir="$2"; shift 2 ;;
      --addr) addr="$2"; shift 2 ;;
      --port) port="$2"; shift 2 ;;
      --storage-port) sport="$2"; shift 2 ;;
      --seeds) seeds="$2"; shift 2 ;;
      --token) token="$2"; shift 2 ;;
      --wait) wait="$2"; shift 2 ;;
      --nodes) nodes="$2"; shift 2 ;;
      --short-lived) shortlived=1; shift ;;
      --jmx-port) jmxport="$2"; shift 2 ;;
      *) die "unknown argument $1" ;;
    esac
  done
  [ -n "$dir" ] || die "--dir is required"
  [ -n "$port" ] || port=9042
  [ -n "$sport" ] || sport=7000
  [ -n "$seeds" ] || seeds="$addr"
}

# configure writes the node's cassandra.yaml and logback.xml. What differs
# from Cassandra's defaults, and why:
# - num_tokens 1 and, in a cluster, evenly spaced initial tokens (CassMail
#   §4 precomputes tokens for the same reason: random ones make hot spots);
#   one token per node also starts faster than 16 vnodes. Tests create
#   their keyspaces once the nodes are up, so no node bootstraps data
#   (auto_bootstrap false).
# - commitlog_sync periodic every 10 s, Cassandra's own default: an
#   acknowledged write is in the memory-mapped commit log, which survives
#   kill -9 of the JVM (the page cache keeps it); only a machine crash
#   within the period loses it, and replication (RF >= 2 with QUORUM) is
#   what covers that, as in production. The tests kill processes, never
#   the machine, so no fsync per write (batch mode) is needed.
# - small caches and one compactor: a test node holds little data and
#   shares two cores with the tests.
configure() {
  local conf="$dir/conf"
  mkdir -p "$conf" "$dir/data" "$dir/commitlog" "$dir/saved_caches" "$dir/hints" "$dir/cdc_raw" "$dir/logs"
  local seedlist="" s
  IFS=',' read -ra ss <<<"$seeds"
  for s in "${ss[@]}"; do
    case "$s" in *:*) ;; *) s="$s:$sport" ;; esac
    seedlist="${seedlist:+$seedlist,}$s"
  done
  cat >"$conf/cassandra.yaml" <<EOF
# Written by scripts/cassandra.sh for Quill's tests.
cluster_name: quill-test
num_tokens: 1
${token:+initial_token: $token}
auto_bootstrap: false
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "$seedlist"
listen_address: $addr
rpc_address: $addr
storage_port: $sport
native_transport_port: $port
start_native_transport: true
data_file_directories:
  - $dir/data
commitlog_directory: $dir/commitlog
saved_caches_directory: $dir/saved_caches
hints_directory: $dir/hints
cdc_raw_directory: $dir/cdc_raw
commitlog_sync: periodic
commitlog_sync_period: 10000ms
concurrent_compactors: 1
key_cache_size: 8MiB
counter_cache_size: 0MiB
authenticator: AllowAllAuthenticator
authorizer: AllowAllAuthorizer
EOF
  cat >"$conf/logback.xml" <<EOF
<configuration scan="false">
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>$dir/logs/system.log</file>
    <encoder><pattern>%-5level [%thread] %date{ISO8601} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
EOF
}

# jvm_flags are Cassandra 5.0's conf/jvm17-server.options (its JPMS
# --add-exports/--add-opens list, G1, Netty's settings) and what
# jvm-server.options and cassandra-env.sh add, with a small heap.
jvm_flags() {
  cat <<EOF
-Xms256M
-Xmx$heap
-Xss256k
-XX:+UseG1GC
-XX:+ParallelRefProcEnabled
-XX:MaxTenuringThreshold=1
-XX:G1HeapRegionSize=16m
-XX:G1RSetUpdatingPauseTimePercent=5
-XX:MaxGCPauseMillis=300
-XX:InitiatingHeapOccupancyPercent=70
-XX:+ExitOnOutOfMemoryError
-XX:+PerfDisableSharedMem
-Djava.net.preferIPv4Stack=true
-Djdk.attach.allowAttachSelf=true
--add-exports=java.base/jdk.internal.misc=ALL-UNNAMED
--add-exports=java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED
--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED
--add-exports=java.rmi/sun.rmi.server=ALL-UNNAMED
--add-exports=java.sql/java.sql=ALL-UNNAMED
--add-exports=java.base/java.lang.ref=ALL-UNNAMED
--add-exports=jdk.unsupported/sun.misc=ALL-UNNAMED
--add-exports=jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED
--add-exports=jdk.attach/sun.tools.attach=ALL-UNNAMED
--add-opens=java.base/java.lang.module=ALL-UNNAMED
--add-opens=java.base/jdk.internal.loader=ALL-UNNAMED
--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED
--add-opens=java.base/jdk.internal.reflect=ALL-UNNAMED
--add-opens=java.base/jdk.internal.math=ALL-UNNAMED
--add-opens=java.base/jdk.internal.module=ALL-UNNAMED
--add-opens=java.base/jdk.internal.util.jar=ALL-UNNAMED
--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED
--add-opens=java.base/sun.nio.ch=ALL-UNNAMED
--add-opens=java.base/java.io=ALL-UNNAMED
--add-opens=java.base/java.lang.reflect=ALL-UNNAMED
--add-opens=jdk.compiler/com.sun.tools.javac=ALL-UNNAMED
--add-opens=java.base/java.lang=ALL-UNNAMED
--add-opens=java.base/java.util=ALL-UNNAMED
--add-opens=java.base/java.nio=ALL-UNNAMED
--add-opens=java.base/java.util.concurrent=ALL-UNNAMED
--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED
-Dio.netty.tryReflectionSetAccessible=true
-Dio.netty.allocator.useCacheForAllThreads=true
-Dio.netty.allocator.maxOrder=11
-Dcassandra.config=file://$dir/conf/cassandra.yaml
-Dlogback.configurationFile=file://$dir/conf/logback.xml
-Dcassandra.logdir=$dir/logs
-Dcassandra.storagedir=$dir
-Dcassandra-foreground=yes
-Dcassandra.skip_wait_for_gossip_to_settle=0
-Dcassandra.ring_delay_ms=1000
-Dcassandra.max_local_pause_in_ms=10000
EOF
  # A node that lives for one test run compiles with C1 only: C2's
  # compiler threads would take the two cores from the tests while the
  # node starts (12 s to CQL instead of 19 s here), and a short run never
  # repays them.
  [ -z "$shortlived" ] || echo "-XX:TieredStopAtLevel=1"
  # JMX on the loopback only (what cassandra-env.sh's LOCAL_JMX does), for
  # nodetool; each node of a machine needs its own port.
  [ -z "$jmxport" ] || echo "-Dcassandra.jmx.local.port=$jmxport"
  # Extra flags for an experiment or a test (QUILL_CASSANDRA_JVM_OPTS).
  local f
  for f in ${QUILL_CASSANDRA_JVM_OPTS:-}; do echo "$f"; done
}

run() {
  parse "$@"
  local j
  j="$(java17)"
  fetch >/dev/null
  configure
  mapfile -t flags < <(jvm_flags)
  exec "$j" "${flags[@]}" -cp "$dir/conf:$lib/*" org.apache.cassandra.service.CassandraDaemon
}

start() {
  parse "$@"
  fetch >/dev/null
  java17 >/dev/null
  answers "$addr" "$port" && die "$addr:$port is in use"
  mkdir -p "$dir/logs"
  # setsid: the node outlives this script and the caller's terminal; stop
  # it by the PID printed.
  setsid "${BASH_SOURCE[0]}" run --dir "$dir" --addr "$addr" --port "$port" --storage-port "$sport" \
    --seeds "$seeds" ${token:+--token "$token"} ${shortlived:+--short-lived} ${jmxport:+--jmx-port "$jmxport"} </dev/null >"$dir/logs/stdout.log" 2>&1 &
  local pid=$! i
  for i in $(seq 1 "$wait"); do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -20 "$dir/logs/stdout.log" >&2
      die "node $addr exited during start (logs in $dir/logs)"
    fi
    if answers "$addr" "$port"; then
      echo "$pid"
      return
    fi
    sleep 1
  done
  kill -KILL "$pid" 2>/dev/null || true
  die "node $addr: CQL port $port did not answer within ${wait}s (logs in $dir/logs)"
}

stop() {
  local pid="${1:-}"
  [ -n "$pid" ] || die "stop needs a PID"
  shift
  wait="$stopWait"
  [ "${1:-}" = "--wait" ] && wait="$2"
  kill -TERM "$pid" 2>/dev/null || return 0
  local i
  for i in $(seq 1 "$wait"); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# nodetool runs Cassandra's nodetool from the jars against the JMX port $1
# of a node: with the server's JPMS flags (its FileUtils reaches into
# sun.nio.ch) and a logback configuration that keeps the tool's own debug
# logging off the terminal.
nodetool() {
  local jport="${1:-}"
  [ -n "$jport" ] || die "nodetool needs the node's JMX port"
  shift
  local j
  j="$(java17)"
  fetch >/dev/null
  local lb="$cache/logback-tools.xml"
  cat >"$lb" <<EOF
<configuration scan="false">
  <appender name="STDERR" class="ch.qos.logback.core.ConsoleAppender">
    <target>System.err</target>
    <encoder><pattern>%-5level %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="STDERR"/></root>
</configuration>
EOF
  mapfile -t opens < <(dir=/nonexistent jvm_flags | grep -- '^--add-')
  "$j" -Xmx256M "${opens[@]}" -Dlogback.configurationFile="file://$lb" -cp "$lib/*" \
    org.apache.cassandra.tools.NodeTool -h 127.0.0.1 -p "$jport" "$@"
}

# tokens prints n evenly spaced Murmur3 tokens (the ring is -2^63 .. 2^63-1),
# added step by step so bash's 64-bit arithmetic never overflows.
tokens() {
  local n="$1" step t i
  step=$((9223372036854775807 / n * 2))
  t=$((-9223372036854775807 - 1))
  for i in $(seq 1 "$n"); do
    echo "$t"
    [ "$i" -lt "$n" ] && t=$((t + step))
  done
}

cluster_start() {
  parse "$@"
  # --addr names the first node's address (127.0.0.2 when not given), the
  # others take the addresses after it; the first is the seed.
  local n="$nodes" i a seedaddr="$addr" pids=()
  [ "$seedaddr" = 127.0.0.1 ] && seedaddr=127.0.0.2
  mapfile -t toks < <(tokens "$n")
  mkdir -p "$dir"
  if [ -f "$dir/pids" ]; then
    while read -r pid; do
      [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && die "a node of $dir runs already (pid $pid): cluster-stop first"
    done <"$dir/pids"
  fi
  : >"$dir/pids"
  for i in $(seq 1 "$n"); do
    a="${seedaddr%.*}.$((${seedaddr##*.} + i - 1))"
    # Nodes join one at a time: Cassandra refuses two nodes entering the
    # ring at once.
    pid="$(start --dir "$dir/node$i" --addr "$a" --port "$port" --storage-port "$sport" --seeds "$seedaddr" --token "${toks[$((i - 1))]}")"
    echo "$pid" >>"$dir/pids"
    echo "node $i: $a:$port pid $pid" >&2
    pids+=("$pid")
  done
  echo "${pids[*]}"
}

cluster_stop() {
  parse "$@"
  [ -f "$dir/pids" ] || return 0
  local pid
  while read -r pid; do
    [ -n "$pid" ] && stop "$pid" &
  done <"$dir/pids"
  wait
  rm -f "$dir/pids"
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  fetch) fetch ;;
  java) java17 ;;
  start) start "$@" ;;
  run) run "$@" ;;
  stop) stop "$@" ;;
  cluster-start) cluster_start "$@" ;;
  cluster-stop) cluster_stop "$@" ;;
  nodetool) nodetool "$@" ;;
  *) die "usage: cassandra.sh fetch|java|start|run|stop|nodetool|cluster-start|cluster-stop (see the header)" ;;
esac
