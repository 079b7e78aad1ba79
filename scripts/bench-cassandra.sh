#!/usr/bin/env bash
# SMTP delivery through `quill serve` on the native store and on Apache
# Cassandra, in interleaved rounds on one machine (issue 15's CassMail
# table; docs/benchmarks.md, "quill serve on Cassandra"). One Cassandra node
# is started (scripts/cassandra.sh, full JIT) and stopped by its PID at the
# end; every run gets a new quill data directory and, on Cassandra, a new
# keyspace, so no run pays for another's compactions.
#
#   scripts/bench-cassandra.sh            # ROUNDS=3 DURATION=20s CONCURRENCY=16
#
# The workload is `quill bench --mix 1`: every session delivers one message
# of Porcupine's sizes (mean 4.7 KB, a tail to 1 MiB) to one of 100 users.
# Each run prints deliveries per second, SMTP latency, errors, and the CPU
# of the server: quill's, and on Cassandra quill's and Cassandra's together.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-20s}
CONCURRENCY=${CONCURRENCY:-16}
USERS=${USERS:-100}
LEVELS=${LEVELS:-"QUORUM ONE ALL"}
WORK=$(mktemp -d /tmp/quill-bench-cassandra.XXXXXX)
BIN=$WORK/quill
go build -o "$BIN" ./cmd/quill

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# One Cassandra node on an address of its own in 127.0.0.250-254.
CADDR=127.0.0.$((250 + RANDOM % 5))
CPORT=$(free_port)
CPID=$(bash scripts/cassandra.sh start --dir "$WORK/cassandra" --addr "$CADDR" --port "$CPORT")
QPID=""
cleanup() {
	[ -n "$QPID" ] && kill -9 "$QPID" 2>/dev/null || true
	bash scripts/cassandra.sh stop "$CPID" >/dev/null 2>&1 || true
	rm -rf "$WORK"
}
trap cleanup EXIT
echo "cassandra: pid $CPID on $CADDR:$CPORT" >&2

# run NAME ARGS...: a fresh quill with ARGS, the bench against it, one
# report line.
run() {
	local name=$1
	shift
	local dir=$WORK/run-$name-$RANDOM smtp http
	smtp=$(free_port)
	http=$(free_port)
	"$BIN" serve --data "$dir" --smtp "127.0.0.1:$smtp" --http "127.0.0.1:$http" --pop3 127.0.0.1:0 --imap 127.0.0.1:0 \
		--smtps "" --pop3s "" --imaps "" --submission "" --log-level warn "$@" >"$dir.out" 2>"$dir.log" &
	QPID=$!
	for _ in $(seq 1 180); do
		[ -s "$dir/admin.token" ] && curl -fsS -o /dev/null "http://127.0.0.1:$http/api/cluster" \
			-H "Authorization: Bearer $(cat "$dir/admin.token")" 2>/dev/null && break
		sleep 1
	done
	"$BIN" bench --smtp "127.0.0.1:$smtp" --admin "http://127.0.0.1:$http" --admin-token "$(cat "$dir/admin.token")" \
		--mix 1 --users "$USERS" --concurrency "$CONCURRENCY" --duration "$DURATION" --server-pid "$QPID${SERVER_PIDS:+,$SERVER_PIDS}" \
		--quiet --json-file "$dir.json" >/dev/null
	python3 - "$name" "$dir.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[2]))
t, cpu = r["total"], r.get("cpu") or {}
server = cpu.get("server_cores") or 0
rate = t["msgs_per_sec"]
print(f'{sys.argv[1]:24} {rate:8.1f} msg/s  p50 {t["smtp_latency"]["p50_ms"]:6.1f} ms  p99 {t["smtp_latency"]["p99_ms"]:7.1f} ms'
      f'  errors {t["error_count"]:4}  server {server:4.2f} cores  {1000 * server / rate if rate else 0:5.2f} ms CPU/msg'
      f'  machine {cpu.get("machine_cores", 0):4.2f} cores')
EOF
	kill -TERM "$QPID"
	wait "$QPID" || true
	QPID=""
}

for round in $(seq 1 "$ROUNDS"); do
	echo "round $round" >&2
	run "native-r$round"
	for level in $LEVELS; do
		# The server's CPU on Cassandra is quill's and Cassandra's.
		SERVER_PIDS=$CPID run "cassandra-$level-r$round" --store cassandra --cassandra "$CADDR:$CPORT" \
			--keyspace "bench_${level,,}_$round" --cassandra-rf 1 --cassandra-read "$level" --cassandra-write "$level"
	done
done
