#!/bin/bash
# Porcupine Fig. 12-14 redone (docs/benchmarks.md, "Porcupine Fig.
# 12-14"): the throughput of a 4-node cluster second by second through a
# kill -9 of one node under a steady load, and the node's restart. quill
# bench spreads the Porcupine workload (paced at RATE requests/s, so the
# offered load stays the same when a node goes) over the four nodes; while
# it runs, every node's /metrics is read every POLL seconds (members alive,
# user map epoch, buckets managed and rebuilt), and the nodes' JSON logs
# give the instants of the membership change ("member left or failed",
# "member joined") and of each new user map ("user map changed"). It
# prints the phases in seconds from the kill and from the restart, and
# writes series.tsv (msg/s and errors per second) for scripts/plot
# (PLOT=FILE.svg).
#
# Usage: scripts/bench-failover.sh [QUILL_BIN] [OUTDIR]
# RATE (40 requests/s), CONCURRENCY (32: workers enough to keep the pace
# while some wait on the dead node), KILL_AT (30 s into the run), DOWN
# (60 s before the restart), AFTER (40 s after it), USERS (500), NODES (4;
# the last is killed), POLL (0.5 s), BASE_PORT (25000).
set -euo pipefail
Q=$(realpath "${1:-bin/quill}")
OUT=${2:-/tmp/quill-bench-failover}
RATE=${RATE:-40}
CONCURRENCY=${CONCURRENCY:-32}
KILL_AT=${KILL_AT:-30}
DOWN=${DOWN:-60}
AFTER=${AFTER:-40}
USERS=${USERS:-500}
NODES=${NODES:-4}
POLL=${POLL:-0.5}
BASE_PORT=${BASE_PORT:-25000}
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib-cluster.sh
. "$HERE/lib-cluster.sh"
mkdir -p "$OUT"
rm -f "$OUT"/*.log "$OUT"/poll.tsv "$OUT"/events.tsv
poller=""
finish() {
	if [ -n "$poller" ]; then kill "$poller" 2>/dev/null || true; fi
	stop_nodes
}
trap finish EXIT INT TERM
now_ms() { date +%s%3N; }
V=$NODES # the victim

for i in $(seq "$NODES"); do
	start_node "$i" "$OUT/node$i.log" --log-format json
	[ "$i" -eq 1 ] && wait_settled 1 1
done
wait_settled "$NODES" $(seq "$NODES")
create_users "$USERS"
idle

# poll: one line per node per POLL: ms node alive epoch managed ready
# ("-" for a node that does not answer).
(
	set +eo pipefail # a node that does not answer is a line of "-"
	while :; do
		t=$(now_ms)
		for i in $(seq "$NODES"); do
			metrics "$i" 2>/dev/null | awk -v t="$t" -v i="$i" '
				/^quill_members\{/ && /state="alive"/ { a = $NF }
				/^quill_usermap_epoch\{/ { e = $NF } /^quill_buckets_managed\{/ { m = $NF } /^quill_buckets_ready\{/ { r = $NF }
				END { if (a == "") print t, i, "-", "-", "-", "-"; else print t, i, a, e, m, r }'
		done
		sleep "$POLL"
	done
) >"$OUT/poll.tsv" &
poller=$!

total=$((KILL_AT + DOWN + AFTER))
cut -d' ' -f1-3 /proc/loadavg >"$OUT/load-start"
echo "== $NODES nodes, $RATE requests/s for ${total}s; node $V killed at ${KILL_AT}s, restarted ${DOWN}s later (load $(cat "$OUT/load-start"))" >&2
"$Q" bench --no-create --users "$USERS" --smtp "$(addrs 0)" --pop3 "$(addrs 1)" --concurrency "$CONCURRENCY" \
	--rate "$RATE" --duration "${total}s" --json-file "$OUT/bench.json" >"$OUT/bench.txt" 2>"$OUT/bench.progress" &
bench=$!
sleep "$KILL_AT"
kill -9 "${NODE_PIDS[$V]}"
t_kill=$(now_ms)
wait "${NODE_PIDS[$V]}" 2>/dev/null || true
echo "killed node $V (pid ${NODE_PIDS[$V]}) at $t_kill" >&2
sleep "$DOWN"
t_restart=$(now_ms)
start_node "$V" "$OUT/node$V-restart.log" --log-format json
echo "restarted node $V (pid ${NODE_PIDS[$V]}) at $t_restart" >&2
wait "$bench"
cut -d' ' -f1-3 /proc/loadavg >"$OUT/load-end"
kill "$poller" 2>/dev/null || true
poller=""
echo "$t_kill $t_restart" >"$OUT/times"

# events.tsv: ms node event detail, from every node's JSON log (slog's
# times are RFC 3339 with milliseconds, UTC on this machine).
for f in "$OUT"/node*.log; do
	n=$(basename "$f" .log | sed 's/^node//; s/-restart//')
	grep '^{' "$f" | jq -r --arg n "$n" '
		select(.msg == "user map changed" or .msg == "member left or failed" or .msg == "member joined" or .msg == "node started")
		| ((.time | sub("\\.[0-9]+"; "") | sub("\\+00:00$"; "Z") | fromdateiso8601) * 1000
		   + (([.time | match("\\.([0-9]{3})").captures[0].string] | first // "0") | tonumber)) as $ms
		| [$ms, $n, (.msg | gsub(" "; "_")), (.members // .node // "-" | tostring)] | @tsv'
done | sort -n >"$OUT/events.tsv"
start_ms=$(jq .start_unix_ms "$OUT/bench.json")
jq -r '.series[] | [.unix_ms, .msgs_per_sec, .errors, (.refused_connections // 0)] | @tsv' "$OUT/bench.json" >"$OUT/series-ms.tsv"

# The phases, in seconds from the kill and from the restart.
awk -v tk="$t_kill" -v tr="$t_restart" -v V="$V" -v N="$NODES" -v t0="$start_ms" -v out="$OUT" '
	function s(ms) { return ms == "" ? "-" : sprintf("%.1f", (ms - tk) / 1000) }
	function r(ms) { return ms == "" ? "-" : sprintf("%.1f", (ms - tr) / 1000) }
	function maxall(arr, from, to,   i, m) { m = 0; for (i = from; i <= to; i++) { if (!(i in arr)) return ""; if (arr[i] > m) m = arr[i] } return m }
	function minall(arr, from, to,   i, m) { m = ""; for (i = from; i <= to; i++) if ((i in arr) && (m == "" || arr[i] < m)) m = arr[i]; return m }
	FILENAME ~ /events.tsv$/ {
		t = $1; n = $2; e = $3; d = $4
		if (t > tk && t < tr) {
			if (e == "member_left_or_failed" && !(n in dead)) dead[n] = t
			if (e == "user_map_changed" && d == N - 1 && !(n in map1)) map1[n] = t
		}
		if (t > tr) {
			if (e == "node_started" && n == V && started == "") started = t
			if (e == "member_joined" && n != V && !(n in joined)) joined[n] = t
			if (e == "user_map_changed" && d == N && !(n in map2)) map2[n] = t
		}
		next
	}
	FILENAME ~ /poll.tsv$/ {
		# One round: every node at the same t.
		if ($1 != pt) { flush(); pt = $1; ok1 = 1; ok2 = 1; seen = 0 }
		seen++
		if ($2 != V && !($3 == N - 1 && $5 == $6)) ok1 = 0
		if (!($3 == N && $5 == $6)) ok2 = 0
		next
	}
	function flush() {
		if (pt == "" || seen < N) return
		if (pt > tk && pt < tr && ok1 && ready1 == "") ready1 = pt
		if (pt > tr && ok2 && ready2 == "") ready2 = pt
	}
	FILENAME ~ /series-ms.tsv$/ {
		t = $1; v = $2; err = $3
		if (t > t0 + 5000 && t <= tk) { pre += v; npre++ }
		if (t > tk && t <= tk + 30000 && (lo == "" || v < lo)) lo = v
		if (t > tk && t < tr) { errk += err; refk += $4 }
		if (t > tr) { errr += err }
		sec[++ns] = t; val[ns] = v
		next
	}
	END {
		flush()
		base = npre ? pre / npre : 0
		# Recovered: the first second after the kill that starts 5 in a row at 90% of the rate before it.
		for (i = 1; i <= ns; i++) {
			if (sec[i] <= tk || rec != "") continue
			good = 1
			for (j = i; j < i + 5 && j <= ns; j++) if (val[j] < 0.9 * base) good = 0
			if (good && i + 4 <= ns) rec = sec[i] - 1000
		}
		printf "| phase | seconds |\n|---|---|\n"
		printf "| msg/s before the kill (mean) | %.1f |\n", base
		printf "| lowest msg/s in the 30 s after the kill | %s |\n", lo
		printf "| kill to the first survivor declaring the node dead | %s |\n", s(minall(dead, 1, N - 1))
		printf "| kill to every survivor declaring it dead | %s |\n", s(maxall(dead, 1, N - 1))
		printf "| kill to every survivor on the new user map (%d members) | %s |\n", N - 1, s(maxall(map1, 1, N - 1))
		printf "| kill to every survivor'"'"'s buckets rebuilt (metrics) | %s |\n", s(ready1)
		printf "| kill to throughput back at 90%% of before (5 s in a row) | %s |\n", s(rec)
		printf "| failed sessions while the node was down | %d |\n", errk
		printf "| connections refused by the dead node (the session went to another) | %d |\n", refk
		printf "| restart to the node started (store open, listening) | %s |\n", r(started)
		printf "| restart to every survivor seeing it joined | %s |\n", r(maxall(joined, 1, N - 1))
		printf "| restart to every node on the rejoined user map (%d members) | %s |\n", N, r(maxall(map2, 1, N))
		printf "| restart to every node'"'"'s buckets rebuilt (metrics) | %s |\n", r(ready2)
		printf "| failed sessions after the restart | %d |\n", errr
		# Marks for the plot, in seconds from the start of the run.
		m = out "/marks"
		printf "" > m
		printf "%.1f:kill -9\n", (tk - t0) / 1000 >> m
		if (maxall(dead, 1, N - 1) != "") printf "%.1f:declared dead\n", (maxall(dead, 1, N - 1) - t0) / 1000 >> m
		if (maxall(map1, 1, N - 1) != "") printf "%.1f:new map\n", (maxall(map1, 1, N - 1) - t0) / 1000 >> m
		printf "%.1f:restart\n", (tr - t0) / 1000 >> m
		if (maxall(map2, 1, N) != "") printf "%.1f:rejoined map\n", (maxall(map2, 1, N) - t0) / 1000 >> m
	}' "$OUT/events.tsv" "$OUT/poll.tsv" "$OUT/series-ms.tsv" | tee "$OUT/phases.md"
echo "load at the start $(cat "$OUT/load-start"), at the end $(cat "$OUT/load-end")" | tee -a "$OUT/phases.md"

(printf "t\tmsg/s\tfailed sessions/s\trefused connections/s\n"
	awk -v t0="$start_ms" '{ printf "%.0f\t%s\t%s\t%s\n", ($1 - t0) / 1000, $2, $3, $4 }' "$OUT/series-ms.tsv") >"$OUT/series.tsv"
if [ -n "${PLOT:-}" ]; then
	PLOT=$(realpath -m "$PLOT")
	mapfile -t marks < <(sed 's/^/-mark\n/' "$OUT/marks")
	(cd "$HERE/.." && go run ./scripts/plot -title "$NODES nodes at $RATE requests/s: node $V killed (kill -9), then restarted" \
		-x "seconds" -y "per second" "${marks[@]}") <"$OUT/series.tsv" >"$PLOT"
fi
