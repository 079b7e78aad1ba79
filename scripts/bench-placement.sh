#!/bin/bash
# Porcupine Fig. 10/11 redone (docs/benchmarks.md, "Porcupine Fig. 10/11"):
# the throughput of a 4-node cluster under the Porcupine workload (users
# drawn by Zipf, alpha 1.3) with each of the three placement policies of
# `quill serve --placement` (static: a user's mail on fixed nodes hashed
# from the name, as a statically partitioned server; random: the same
# candidates as dynamic, blind to load; dynamic: Quill's load-aware choice),
# first with every node alike ("even"), then with one node's disk slowed
# ("slow": --disk-delay on node 4, every sync of its log held). Every run
# is a fresh cluster; the variants alternate round by round (the machine
# is shared: policies are compared only within one round). quill bench
# spreads its sessions over the four nodes at random. It prints a table:
# msg/s, POP sessions/s, SMTP latency, errors, node 4's share of the bytes
# written to the nodes' logs, the load average at the start of each run,
# and each policy's rate over dynamic's in the same round and condition;
# scripts/plot draws it (PLOT=FILE.svg).
#
# Usage: scripts/bench-placement.sh [QUILL_BIN] [OUTDIR]
# ROUNDS (1), DURATION (40s), CONCURRENCY (16), USERS (500), POLICIES
# ("static random dynamic"), CONDITIONS ("even slow"), DISK_DELAY (0s:
# every node's sync delay, a slow disk everywhere), SLOW_DELAY (40ms:
# node 4's in the slow condition), NODES (4), BASE_PORT (24000).
set -euo pipefail
Q=$(realpath "${1:-bin/quill}")
OUT=${2:-/tmp/quill-bench-placement}
ROUNDS=${ROUNDS:-1}
DURATION=${DURATION:-40s}
CONCURRENCY=${CONCURRENCY:-16}
USERS=${USERS:-500}
POLICIES=${POLICIES:-static random dynamic}
CONDITIONS=${CONDITIONS:-even slow}
DISK_DELAY=${DISK_DELAY:-0s}
SLOW_DELAY=${SLOW_DELAY:-40ms}
NODES=${NODES:-4}
BASE_PORT=${BASE_PORT:-24000}
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib-cluster.sh
. "$HERE/lib-cluster.sh"
mkdir -p "$OUT"
trap stop_nodes EXIT INT TERM

run() { # name policy condition
	local name=$1 policy=$2 cond=$3 i delay pids=()
	idle
	for i in $(seq "$NODES"); do
		delay=$DISK_DELAY
		[ "$cond" = slow ] && [ "$i" -eq "$NODES" ] && delay=$SLOW_DELAY
		start_node "$i" "$OUT/$name-node$i.log" --placement "$policy" --disk-delay "$delay"
		# Node 1 first, so the others join a cluster that exists.
		[ "$i" -eq 1 ] && wait_settled 1 1
	done
	wait_settled "$NODES" $(seq "$NODES")
	create_users "$USERS"
	for i in $(seq "$NODES"); do pids+=("${NODE_PIDS[$i]}"); done
	cut -d' ' -f1-3 /proc/loadavg >"$OUT/$name.load"
	echo "== $name (load $(cat "$OUT/$name.load"))" >&2
	"$Q" bench --no-create --users "$USERS" --smtp "$(addrs 0)" --pop3 "$(addrs 1)" --concurrency "$CONCURRENCY" \
		--duration "$DURATION" --server-pid "$(IFS=,; echo "${pids[*]}")" --quiet --json-file "$OUT/$name.json" >"$OUT/$name.txt"
	grep -E "delivered|POP sessions" "$OUT/$name.txt" | head -2 >&2
	# Where the writes went: each node's bytes written to its log
	# (message bodies, replica copies, profiles, the writers' REDO log).
	for i in $(seq "$NODES"); do
		metrics "$i" | awk -v i="$i" '/^quill_pebble_wal_written_bytes_total\{/ { print i, $NF }'
	done >"$OUT/$name.wal"
	stop_nodes
}

# table prints one row per run found in OUTDIR, and each policy's rate over
# dynamic's of the same round and condition.
table() {
	printf "%-22s %8s %7s %13s %7s %12s %10s %15s %8s\n" run msg/s POP/s "SMTP p50/p99" errors "server cores" "node $NODES log" "load 1/5/15" "/dynamic"
	for round in $(seq "$ROUNDS"); do
		for cond in $CONDITIONS; do
			for p in $POLICIES; do
				f=$OUT/$p-$cond-$round.json d=$OUT/dynamic-$cond-$round.json
				[ -s "$f" ] || continue
				ratio=-
				[ -s "$d" ] && ratio=$(jq -n --slurpfile a "$f" --slurpfile b "$d" '$a[0].total.msgs_per_sec / $b[0].total.msgs_per_sec * 100 | round / 100')
				# Node N's share of the bytes written to every node's log.
				share=-
				[ -s "$OUT/$p-$cond-$round.wal" ] && share=$(awk -v n="$NODES" '{ s += $2 } $1 == n { v = $2 } END { if (s > 0) printf "%.0f%%", v / s * 100 }' "$OUT/$p-$cond-$round.wal")
				jq -r --arg run "$p-$cond-$round" --arg load "$(cat "$OUT/$p-$cond-$round.load")" --arg ratio "$ratio" --arg share "$share" '
					[$run, .total.msgs_per_sec, .total.pop_sessions_per_sec,
					 "\(.total.smtp_latency.p50_ms | round)/\(.total.smtp_latency.p99_ms | round)",
					 .total.error_count, (.cpu.server_cores // 0), $share, $load, $ratio] | @tsv' "$f" |
					awk -F'\t' '{ printf "%-22s %8.1f %7.1f %13s %7s %12.2f %10s %15s %8s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }'
			done
		done
	done
}

if [ -z "${TABLE_ONLY:-}" ]; then
	for round in $(seq "$ROUNDS"); do
		for cond in $CONDITIONS; do
			for p in $POLICIES; do
				run "$p-$cond-$round" "$p" "$cond"
			done
		done
	done
fi
table | tee "$OUT/table.txt"
if [ -n "${PLOT:-}" ]; then
	# Mean msg/s per policy and condition over the rounds, as bars.
	for cond in $CONDITIONS; do
		printf "%s" "$cond"
		for p in $POLICIES; do
			printf "\t%s" "$(cat "$OUT"/"$p-$cond"-*.json | jq -s 'map(.total.msgs_per_sec) | add / length | . * 10 | round / 10')"
		done
		echo
	done | (printf "condition\t%s\n" "$(echo "$POLICIES" | tr ' ' '\t')"; cat) >"$OUT/bars.tsv"
	PLOT=$(realpath -m "$PLOT")
	(cd "$HERE/.." && go run ./scripts/plot -bars -title "$NODES nodes, Zipf users: messages/s by placement policy" -y "messages/s") \
		<"$OUT/bars.tsv" >"$PLOT"
fi
