#!/bin/sh
# Single-node SMTP delivery against its ceiling (issue 16, goal 1): Postfix's
# smtp-source sends the same stream of 4.8 KB messages to Postfix's smtp-sink
# (a server that accepts and discards mail: what the client, the kernel and
# the loopback allow) and to one `quill serve` node on a fresh data directory
# (its recipients created first through the admin API; every message fsync'd
# before its 250). Rounds interleave the two at each session count, so both
# see the same machine load. For each: messages/s, Quill's ratio to the sink,
# and server CPU per message (utime+stime of the server process from
# /proc/PID/stat before and after). docs/benchmarks.md has the figures.
#
# Usage: scripts/bench-smtp-sink.sh [QUILL_BIN] [OUTDIR]
# BASE=OTHER_QUILL_BIN adds a second node, "base", to the same rounds.
# Environment: SESSIONS ("20 100"), ROUNDS (3), MSGS (messages per run,
# 10000), SIZE (4800), USERS (recipients, 1: smtp-source's one -t address;
# more runs one smtp-source per user, the sessions split among them),
# SOURCE_OPTS (more smtp-source options, e.g. -d to keep a connection for
# many messages), QUILL_ARGS (more flags for the quill node, not base: e.g.
# "--text-index-delay 0" to count the text index inside the run), PROFILE (seconds: a CPU and an allocation profile of the
# node during the last round's largest session count, into OUTDIR).
set -eu
Q=${1:-bin/quill}
OUT=${2:-/tmp/quill-bench-smtp-sink}
SESSIONS=${SESSIONS:-"20 100"}
ROUNDS=${ROUNDS:-3}
MSGS=${MSGS:-10000}
SIZE=${SIZE:-4800}
USERS=${USERS:-1}
SOURCE_OPTS=${SOURCE_OPTS:-}
PROFILE=${PROFILE:-0}
DOMAIN=bench.example

command -v smtp-source >/dev/null || PATH=$PATH:/usr/sbin
rm -rf "$OUT"
mkdir -p "$OUT"
chmod 755 "$OUT"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PIDS=""
cleanup() { for p in $PIDS; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM

# cpu PID: the process's user+system CPU time so far, in clock ticks.
cpu() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)
now() { date +%s.%N; }

wait_port() { # PORT
	i=0
	until python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),1)" 2>/dev/null; do
		i=$((i + 1))
		[ $i -lt 100 ] || { echo "nothing listens on port $1 after 10 s" >&2; exit 1; }
		sleep 0.1
	done
}

# The sink: Postfix's smtp-sink (PIPELINING and 8BITMIME as Quill offers
# them), a backlog of 1024.
SINK=$(free_port)
smtp-sink -u nobody 127.0.0.1:"$SINK" 1024 >"$OUT/sink.log" 2>&1 &
SINKPID=$!
PIDS="$PIDS $SINKPID"

# node NAME BIN: a node on a fresh data directory with its recipients
# made through the admin API; SMTP on port $S_NAME, its PID $PID_NAME, the
# admin API on $H_NAME. The other listeners on ports of their own.
node() {
	name=$1 bin=$2
	h=$(free_port) s=$(free_port)
	set -- serve --data "$OUT/$name" --http 127.0.0.1:"$h" --smtp 127.0.0.1:"$s" --pop3 127.0.0.1:0 --imap 127.0.0.1:0 \
		--imaps 127.0.0.1:0 --pop3s 127.0.0.1:0 --smtps 127.0.0.1:0 --submission 127.0.0.1:0 --filter-workers 0 \
		--log-level warn
	[ "$PROFILE" -gt 0 ] && set -- "$@" --pprof
	# shellcheck disable=SC2086 # QUILL_ARGS is a list of flags
	[ "$name" = quill ] && set -- "$@" ${QUILL_ARGS:-}
	"$bin" "$@" >"$OUT/$name.log" 2>&1 &
	pid=$!
	PIDS="$PIDS $pid"
	wait_port "$s"
	wait_port "$h"
	token=$(cat "$OUT/$name/admin.token")
	api() { # PATH JSON
		curl -sf -X POST -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
			-d "$2" "http://127.0.0.1:$h$1" >/dev/null || { echo "$name: admin API $1 $2 failed" >&2; exit 1; }
	}
	api /api/domains "{\"name\":\"$DOMAIN\"}"
	u=1
	while [ $u -le "$USERS" ]; do
		api /api/users "{\"address\":\"rcpt$u@$DOMAIN\",\"password\":\"bench-password-$u\"}"
		u=$((u + 1))
	done
	eval "S_$name=$s PID_$name=$pid H_$name=$h TOKEN_$name=$token"
}
wait_port "$SINK"
SERVERS="sink quill"
node quill "$Q"
# BASE: another quill binary (the code before a change) measured in the
# same rounds, as "base".
if [ -n "${BASE:-}" ]; then
	node base "$BASE"
	SERVERS="$SERVERS base"
fi
S_sink=$SINK PID_sink=$SINKPID

# send NAME PORT PID SESS ROUND: one run of smtp-source, appended to
# results.txt as "name sessions round msgs secs ticks".
send() {
	name=$1 port=$2 pid=$3 sess=$4 round=$5
	per=$((sess / USERS)) msgs=$((MSGS / USERS))
	[ $per -ge 1 ] || per=1
	c0=$(cpu "$pid")
	t0=$(now)
	u=1 src=""
	while [ $u -le "$USERS" ]; do
		# shellcheck disable=SC2086 # SOURCE_OPTS is a list of options
		smtp-source $SOURCE_OPTS -s "$per" -l "$SIZE" -m "$msgs" -f "sender@source.example" \
			-t "rcpt$u@$DOMAIN" -M source.example 127.0.0.1:"$port" >>"$OUT/source.log" 2>&1 &
		src="$src $!"
		u=$((u + 1))
	done
	failed=0
	for p in $src; do wait "$p" || failed=1; done
	t1=$(now)
	c1=$(cpu "$pid")
	[ $failed -eq 0 ] || { echo "$name: smtp-source failed (see $OUT/source.log)" >&2; exit 1; }
	echo "$name $sess $round $((msgs * USERS)) $(echo "$t1 - $t0" | bc) $((c1 - c0))" >>"$OUT/results.txt"
	awk -v n="$name" -v s="$sess" -v r="$round" -v m=$((msgs * USERS)) -v t0="$t0" -v t1="$t1" -v c=$((c1 - c0)) -v hz="$TICK" 'BEGIN {
		printf "round %d  %-5s %3d sessions: %6d msgs in %6.2f s = %7.0f msg/s, server CPU %.3f ms/msg\n", r, n, s, m, t1 - t0, m / (t1 - t0), c * 1000 / hz / m
	}' >&2
}

echo "load before: $(uptime)" | tee "$OUT/summary.txt"
# run SERVER SESS ROUND
run() { eval "send $1 \$S_$1 \$PID_$1 $2 $3"; }
# A warm-up run of each, not counted: the node's first deliveries create
# the mailboxes and fill its caches.
MSGS_SAVE=$MSGS
MSGS=$((USERS * 200))
for srv in $SERVERS; do run "$srv" 20 0; done
MSGS=$MSGS_SAVE
: >"$OUT/results.txt"

last=$(echo "$SESSIONS" | awk '{ print $NF }')
r=1
while [ $r -le "$ROUNDS" ]; do
	for sess in $SESSIONS; do
		for srv in $SERVERS; do
			if [ "$srv" = quill ] && [ "$PROFILE" -gt 0 ] && [ $r -eq "$ROUNDS" ] && [ "$sess" = "$last" ]; then
				# The profiles cover the middle of the run: PROFILE seconds
				# of CPU, and the allocations made meanwhile (the heap
				# profile's difference over those seconds).
				(sleep 1 && curl -sf -H "Authorization: Bearer $TOKEN_quill" -o "$OUT/cpu.prof" \
					"http://127.0.0.1:$H_quill/debug/pprof/profile?seconds=$PROFILE") &
				PROFS="$! "
				(sleep 1 && curl -sf -H "Authorization: Bearer $TOKEN_quill" -o "$OUT/allocs.prof" \
					"http://127.0.0.1:$H_quill/debug/pprof/allocs?seconds=$PROFILE") &
				PROFS="$PROFS $!"
			fi
			run "$srv" "$sess" "$r"
		done
	done
	r=$((r + 1))
done
for p in ${PROFS:-}; do wait "$p" || echo "a profile failed (is $Q built with --pprof?)" >&2; done
echo "load after:  $(uptime)" | tee -a "$OUT/summary.txt"

# The table: per session count, the rate of each round, the median, Quill's
# ratio to the sink's median, and CPU per message over all rounds.
awk -v hz="$TICK" '
function median(a, n,   i, j, t) {
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{
	k = $1 SUBSEP $2; n[k]++; rate[k, n[k]] = $4 / $5; rates[k] = rates[k] sprintf(" %6.0f", $4 / $5)
	msgs[k] += $4; ticks[k] += $6; if (!($2 in seen)) { seen[$2] = 1; order[++ns] = $2 }
	if (!($1 in seensrv)) { seensrv[$1] = 1; srvs[++nsrv] = $1 }
}
END {
	printf "%-8s %-6s %-28s %8s %11s %10s\n", "sessions", "server", "msg/s per round", "median", "of the sink", "CPU ms/msg"
	for (i = 1; i <= ns; i++) {
		s = order[i]
		for (srv = 1; srv <= nsrv; srv++) {
			name = srvs[srv]; k = name SUBSEP s
			if (!(k in n)) continue
			delete a; for (j = 1; j <= n[k]; j++) a[j] = rate[k, j]
			m[name] = median(a, n[k])
			ratio = name != "sink" ? sprintf("%.2f", m[name] / m["sink"]) : ""
			printf "%-8s %-6s %-28s %8.0f %11s %10.3f\n", s, name, rates[k], m[name], ratio, ticks[k] * 1000 / hz / msgs[k]
		}
	}
}' "$OUT/results.txt" | tee -a "$OUT/summary.txt"
