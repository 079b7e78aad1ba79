#!/bin/sh
# Flat costs from 1 to 16 nodes (issue 16, docs/benchmarks.md): for each
# cluster size it starts that many real `quill serve` nodes on this machine
# (each its own data directory and free ports, every node joining the
# first), waits until every node sees every other alive and its buckets
# ready, drives the same SMTP load spread evenly over the nodes (one
# `quill bench --mix 1` per node, the total rate fixed), scrapes every
# node's /metrics before and after, and prints per delivered message the
# node-to-node RPC calls of deliveries, all RPC bytes and the WAL fsyncs,
# and per node per second the RPCs of timers (audit, scans) and the gossip
# bytes and messages sent. Every node is stopped by its
# PID. Usage:
#   scripts/bench-scale.sh [QUILL_BIN] [OUTDIR]
# SIZES="1 2 4 8 16" (the cluster sizes), RATE=20 (messages per second, the
# whole cluster), DURATION=30s, USERS=200.
set -eu
Q=${1:-bin/quill}
OUT=${2:-/tmp/quill-bench-scale}
SIZES=${SIZES:-"1 2 4 8 16"}
RATE=${RATE:-20}
DURATION=${DURATION:-30s}
USERS=${USERS:-200}
# settleWait bounds the wait for a new cluster to see itself whole: 16
# nodes on 2 busy cores join in about 10 s.
settleWait=120
# drainWait lets the update logs push what the last deliveries left, so the
# replica pushes of every delivered message are counted.
drainWait=3
mkdir -p "$OUT"
case $Q in /*) ;; *) Q=$(pwd)/$Q ;; esac

pids=""
dirs=""
cleanup() {
	for p in $pids; do kill "$p" 2>/dev/null || true; done
	for p in $pids; do wait "$p" 2>/dev/null || true; done
	for d in $dirs; do rm -rf "$d"; done
	pids=""; dirs=""
}
trap cleanup EXIT INT TERM

# freeport sets port to a TCP and UDP port no socket uses, above the last
# one handed out (so the nodes of one run do not collide either), below
# Linux's ephemeral range (32768 up), where outgoing connections would
# take ports the nodes have not bound yet.
port=$(( 20000 + $$ % 10000 ))
freeport() {
	while :; do
		port=$((port + 1))
		[ $port -ge 32768 ] && port=20000
		[ -z "$(ss -Htuan "sport = :$port")" ] && return
	done
}

# scrape N WHEN: the counters of every node of the run, one file, each line
# prefixed with the node's index.
scrape() {
	i=1
	for d in $dirs; do
		http=$(cat "$d/.bench-http")
		curl -s -H "Authorization: Bearer $(cat "$d/admin.token")" "http://$http/metrics" |
			grep -E '^quill_(rpc_calls_total|rpc_sent_bytes_total|pebble_wal_fsync_seconds_count|messages_delivered_total|gossip_bytes_total|gossip_messages_total)' |
			sed "s/^/$i /"
		i=$((i + 1))
	done >"$OUT/n$1-$2.txt"
}

# settled N: every node sees N members alive and has every bucket it
# manages ready.
settled() {
	for d in $dirs; do
		[ -s "$d/admin.token" ] || return 1
		m=$(curl -s -H "Authorization: Bearer $(cat "$d/admin.token")" "http://$(cat "$d/.bench-http")/metrics") || return 1
		alive=$(echo "$m" | awk '/^quill_members\{/ && /state="alive"/ { s += $NF } END { print s + 0 }')
		[ "$alive" -eq "$1" ] || return 1
		echo "$m" | awk '/^quill_buckets_managed\{/ { m = $NF } /^quill_buckets_ready\{/ { r = $NF } END { exit !(m == r) }' || return 1
	done
}

run() {
	n=$1
	seed=""
	i=1
	while [ "$i" -le "$n" ]; do
		d=$(mktemp -d /tmp/quill-scale.XXXXXX)
		freeport; smtp=127.0.0.1:$port
		freeport; pop3=127.0.0.1:$port
		freeport; imap=127.0.0.1:$port
		freeport; http=127.0.0.1:$port
		freeport; gossip=127.0.0.1:$port
		echo "$http" >"$d/.bench-http"; echo "$smtp" >"$d/.bench-smtp"
		join=""
		[ -n "$seed" ] && join="--join $seed"
		# shellcheck disable=SC2086
		"$Q" serve --data "$d" --smtps= --imaps= --pop3s= --submission= --smtp "$smtp" --pop3 "$pop3" --imap "$imap" \
			--http "$http" --cluster "$gossip" $join --filter-workers 0 --relay-workers 0 >"$OUT/n$n-node$i.log" 2>&1 &
		pids="$pids $!"; dirs="$dirs $d"
		[ -z "$seed" ] && seed=$gossip
		i=$((i + 1))
	done
	first=$(echo "$dirs" | awk '{ print $1 }')
	t0=$(date +%s)
	until settled "$n"; do
		for p in $pids; do
			kill -0 "$p" 2>/dev/null || { echo "node pid $p of $n died (logs: $OUT/n$n-node*.log)" >&2; exit 1; }
		done
		if [ $(( $(date +%s) - t0 )) -gt $settleWait ]; then
			echo "$n nodes did not settle in ${settleWait}s" >&2; exit 1
		fi
		sleep 1
	done
	echo "== $n nodes settled in $(( $(date +%s) - t0 )) s (pids$pids); load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
	QUILL_ADMIN_TOKEN=$(cat "$first/admin.token"); export QUILL_ADMIN_TOKEN
	# The users are created, and every node delivers a few messages, before
	# the counters are read: the figures are the steady load's alone.
	"$Q" bench --admin "http://$(cat "$first/.bench-http")" --smtp "$(cat "$first/.bench-smtp")" --users "$USERS" --mix 1 \
		--concurrency 2 --duration 2s --quiet >/dev/null
	for d in $dirs; do
		"$Q" bench --no-create --users "$USERS" --smtp "$(cat "$d/.bench-smtp")" --mix 1 --concurrency 1 --duration 1s --quiet >/dev/null &
		benches="$benches $!"
	done
	wait_benches
	sleep "$drainWait"
	scrape "$n" before
	start=$(date +%s.%N)
	i=1
	per=$(echo "$RATE $n" | awk '{ printf "%.3f", $1 / $2 }')
	for d in $dirs; do
		"$Q" bench --no-create --users "$USERS" --seed "$i" --smtp "$(cat "$d/.bench-smtp")" --mix 1 --concurrency 2 \
			--rate "$per" --duration "$DURATION" --quiet --json-file "$OUT/n$n-bench$i.json" >/dev/null &
		benches="$benches $!"
		i=$((i + 1))
	done
	wait_benches
	sleep "$drainWait"
	scrape "$n" after
	end=$(date +%s.%N)
	load=$(cut -d' ' -f1-3 /proc/loadavg)
	cleanup
	report "$n" "$(echo "$end $start" | awk '{ print $1 - $2 }')" "$load"
}

# wait_benches waits for the bench processes started in the background
# (not the nodes, which cleanup stops).
wait_benches() {
	for p in $benches; do wait "$p"; done
	benches=""
}
benches=""

# report N SECONDS LOAD: one table row from the before and after scrapes,
# and the RPC calls per delivery by method. The calls of a delivery
# (deliveryCalls: the recipient's lookup, UID allocation and confirmation
# at the user's manager, the store at the coordinator, its pushes to the
# other replicas, and the profile writes of UID reservations, which are
# pushes too) are counted per message; the others (the writers' audit,
# soft-state scans) run on timers, so they are counted per node per second.
deliveryCalls='^(UserManager.Lookup|Writer.Alloc|Writer.Confirm|Replica.Write|Replica.Push)$'
report() {
	awk -v n="$1" -v secs="$2" -v load="$3" -v byMethod="$OUT/n$1-methods.txt" -v dcalls="$deliveryCalls" '
		FNR == NR { before[$1 " " $2] = $3; next }
		{
			d = $3 - before[$1 " " $2]
			name = $2; sub(/\{.*/, "", name)
			if (name == "quill_messages_delivered_total") delivered += d
			else if (name == "quill_pebble_wal_fsync_seconds_count") fsyncs += d
			else if (name == "quill_rpc_sent_bytes_total") rpcbytes += d
			else if (name == "quill_rpc_calls_total" && $2 ~ /side="client"/) {
				match($2, /method="[^"]*"/); m = substr($2, RSTART + 8, RLENGTH - 9)
				if (m ~ dcalls) calls += d; else bg += d
				bym[m] += d
			}
			else if (name == "quill_gossip_bytes_total" && $2 ~ /direction="sent"/) gbytes += d
			else if (name == "quill_gossip_messages_total" && $2 ~ /direction="sent"/) gmsgs += d
		}
		END {
			if (delivered == 0) { printf "%5d  no deliveries\n", n; exit }
			printf "%5d %9d %8.1f %10.2f %11.0f %8.2f %10.2f %14.0f %12.1f   %s\n", n, delivered, delivered / secs,
				calls / delivered, rpcbytes / delivered, fsyncs / delivered, bg / n / secs, gbytes / n / secs, gmsgs / n / secs, load
			for (m in bym) if (bym[m] > 0) {
				if (m ~ dcalls) printf "%d %s %.3f /msg\n", n, m, bym[m] / delivered > byMethod
				else printf "%d %s %.3f /node/s\n", n, m, bym[m] / n / secs > byMethod
			}
		}' "$OUT/n$1-before.txt" "$OUT/n$1-after.txt" | tee -a "$OUT/table.txt"
}

: >"$OUT/table.txt"
printf "%5s %9s %8s %10s %11s %8s %10s %14s %12s   %s\n" nodes delivered msg/s "RPC/msg" "RPC B/msg" "fsync/msg" "bg RPC/n/s" "gossip B/n/s" "gossip m/n/s" "load (1, 5, 15 min)" | tee "$OUT/table.txt"
for n in $SIZES; do
	run "$n"
done
echo >&2
echo "RPC calls by method (nodes:calls), per delivered message or per node per second:" >&2
sort -k2,2 -k1,1n "$OUT"/n*-methods.txt | awk '
	{ if ($2 != m) { if (m != "") print line " " unit; m = $2; unit = $4; line = sprintf("  %-22s", m) } line = line sprintf(" %3d:%.2f", $1, $3) }
	END { if (m != "") print line " " unit }' >&2
