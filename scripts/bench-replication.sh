#!/bin/sh
# Porcupine workload against a two-node Quill cluster on this machine, with
# R=1, R=2 write policy ONE and R=2 write policy ALL, then R=2 ONE with
# deliveries only (docs/benchmarks.md). After each run it reads both nodes'
# RPC counters (quill_rpc_*: bytes and calls per method) and reports the
# node-to-node bytes per delivered message next to the mean message size.
# Usage: scripts/bench-replication.sh [QUILL_BIN] [DURATION] [OUTDIR]
# RUNS="r2-one smtp-r2" picks runs; BENCH_ARGS adds flags to quill bench.
set -eu
Q=${1:-/tmp/quill}
DUR=${2:-30s}
OUT=${3:-/tmp/quill-bench-repl}
RUNS=${RUNS:-"r1 r2-one r2-all smtp-r2"}
# PORT_OFFSET moves every port, so two runs on one machine cannot collide.
O=${PORT_OFFSET:-0}
mkdir -p "$OUT"

# metrics NAME WHEN: both nodes' RPC counters, one file.
metrics() {
	for node in "$((8025 + O)) $a" "$((8035 + O)) $b"; do
		set -- "$1" "$2" $node
		curl -s -H "Authorization: Bearer $(cat "$4/admin.token")" "http://127.0.0.1:$3/metrics" | grep '^quill_rpc_' | sed "s/^/$3 /"
	done >"$OUT/$1-metrics-$2.txt"
}

# rpcbytes NAME: what the RPC counters of both nodes grew by during the
# bench, per method (bytes sent by either side, which is every payload byte
# once, and calls made), and the total per delivered message.
rpcbytes() {
	name=$1
	delivered=$(grep -o '"delivered": *[0-9]*' "$OUT/$name.json" | head -1 | grep -o '[0-9]*$')
	size=$(grep -o '"mean_message_size": *[0-9.]*' "$OUT/$name.json" | head -1 | grep -o '[0-9.]*$')
	printf "%-28s %12s %10s %14s %12s\n" method bytes calls bytes/delivery calls/delivery
	awk '
		FNR == NR { before[$1 " " $2] = $3; next }
		{ printf "%s %.0f\n", $2, $3 - before[$1 " " $2] }
	' "$OUT/$name-metrics-before.txt" "$OUT/$name-metrics-after.txt" | awk -v d="$delivered" -v size="$size" '
		/^quill_rpc_sent_bytes_total\{/ {
			match($0, /method="[^"]*"/); m = substr($0, RSTART + 8, RLENGTH - 9)
			bytes[m] += $NF; total += $NF
		}
		/^quill_rpc_calls_total\{/ && /side="client"/ {
			match($0, /method="[^"]*"/); m = substr($0, RSTART + 8, RLENGTH - 9)
			calls[m] += $NF; ncalls += $NF
		}
		END {
			if (d == 0) { print "no deliveries"; exit }
			for (m in bytes) printf "%-28s %12d %10d %14.0f %12.2f\n", m, bytes[m], calls[m], bytes[m] / d, calls[m] / d
			printf "%-28s %12d %10d %14.0f %12.2f\n", "TOTAL", total, ncalls, total / d, ncalls / d
			goal = 1.1 * size + 1024
			printf "delivered %d, mean message %.0f B: RPC bytes per delivery %.0f (%.2f x the message); goal 1.1 x message + 1 KB = %.0f: %s\n", d, size, total / d, (total / d) / size, goal, (total / d < goal ? "met" : "NOT met")
		}' | sort -k1,1 | awk '/^TOTAL|^delivered/ { tail = tail $0 "\n"; next } { print } END { printf "%s", tail }'
}

run() { # name replicas policy [bench flags]
	addrs="--smtp 127.0.0.1:$((2525 + O)) --pop3 127.0.0.1:$((1110 + O)) --imap 127.0.0.1:$((1143 + O)) --admin http://127.0.0.1:$((8025 + O))"
	name=$1; r=$2; pol=$3; shift 3
	a=$(mktemp -d); b=$(mktemp -d)
	"$Q" serve --data "$a" --smtps= --imaps= --pop3s= --submission= --smtp 127.0.0.1:$((2525 + O)) --pop3 127.0.0.1:$((1110 + O)) --imap 127.0.0.1:$((1143 + O)) --http 127.0.0.1:$((8025 + O)) \
		--cluster 127.0.0.1:$((7946 + O)) --replicas "$r" --write-policy "$pol" >"$OUT/$name-a.log" 2>&1 & pa=$!
	sleep 1
	"$Q" serve --data "$b" --smtps= --imaps= --pop3s= --submission= --smtp 127.0.0.1:$((2535 + O)) --pop3 127.0.0.1:$((1120 + O)) --imap 127.0.0.1:$((1153 + O)) --http 127.0.0.1:$((8035 + O)) \
		--cluster 127.0.0.1:$((7956 + O)) --join 127.0.0.1:$((7946 + O)) --replicas "$r" --write-policy "$pol" >"$OUT/$name-b.log" 2>&1 & pb=$!
	sleep 3
	# The admin API asks for the token on every call; quill bench creates
	# the users through node a.
	QUILL_ADMIN_TOKEN=$(cat "$a/admin.token"); export QUILL_ADMIN_TOKEN
	echo "== $name: replicas $r, write policy $pol $* (pids $pa $pb)" >&2
	# Users are created (and a few messages delivered) before the counters
	# are read, so the figures are the workload's alone.
	"$Q" bench $addrs --concurrency 4 --duration 2s --quiet "$@" >/dev/null
	sleep 2
	metrics "$name" before
	# shellcheck disable=SC2086
	"$Q" bench $addrs --no-create --concurrency 16 --duration "$DUR" --server-pid "$pa,$pb" --quiet --json-file "$OUT/$name.json" "$@" ${BENCH_ARGS:-} >"$OUT/$name.txt"
	# Let the update logs drain so their pushes are counted.
	sleep 3
	metrics "$name" after
	curl -s -H "Authorization: Bearer $QUILL_ADMIN_TOKEN" http://127.0.0.1:$((8025 + O))/api/replication >"$OUT/$name-repl-a.json" || true
	curl -s -H "Authorization: Bearer $(cat "$b/admin.token")" http://127.0.0.1:$((8035 + O))/api/replication >"$OUT/$name-repl-b.json" || true
	kill "$pa" "$pb"; wait "$pa" "$pb" 2>/dev/null || true
	rm -rf "$a" "$b"
	grep -E "delivered|SMTP|CPU" "$OUT/$name.txt" | head -6 >&2
	rpcbytes "$name" | tee "$OUT/$name-rpc.txt" >&2
}
for r in $RUNS; do
	case $r in
	r1) run r1 1 one ;;
	r2-one) run r2-one 2 one ;;
	r2-all) run r2-all 2 all ;;
	smtp-r2) run smtp-r2 2 one --mix 1 ;;
	*) echo "unknown run $r" >&2; exit 2 ;;
	esac
done
