#!/bin/bash
# The Porcupine workload (docs/benchmarks.md, "Commands": quill bench
# --concurrency 16 --duration 60s) against Quill and against Postfix +
# Dovecot (bench/postfix-dovecot/setup.sh) in the same run, the servers
# interleaved round after round, each run on a fresh data directory or a
# fresh Postfix + Dovecot. Dovecot runs with its static passdb and with
# DOVECOT_PASSDB=argon2 (Quill's own argon2id hashes, checked at every
# login as Quill checks its users'), each in its default configuration and
# with DOVECOT_PERFORMANCE=1. It prints a table: deliveries/s, POP
# sessions/s, latencies, server CPU per delivered message, the load
# average at the start of each run, and Quill's rate over the peer's in
# the same round (issue 16, goal 2: at least 6x). As root (setup.sh);
# the table is read from quill bench's JSON reports with jq.
#
# Usage: scripts/bench-porcupine.sh [QUILL_BIN] [OUTDIR]
# ROUNDS (1), DURATION (60s), CONCURRENCY (16), RUNS (the variants, in
# order: "quill pf-static pf-argon2 pf-static-perf pf-argon2-perf"),
# BASE_PORT (4500: Quill on BASE+25/110/143/80, Postfix + Dovecot on
# BASE+26/111/144, so the run meets no other server on the default ports).
set -euo pipefail
Q=$(realpath "${1:-bin/quill}")
OUT=${2:-/tmp/quill-bench-porcupine}
ROUNDS=${ROUNDS:-1}
DURATION=${DURATION:-60s}
CONCURRENCY=${CONCURRENCY:-16}
RUNS=${RUNS:-quill pf-static pf-argon2 pf-static-perf pf-argon2-perf}
BASE=${BASE_PORT:-4500}
HERE=$(cd "$(dirname "$0")/.." && pwd)
SETUP=$HERE/bench/postfix-dovecot/setup.sh
export BENCH_DIR=${BENCH_DIR:-/tmp/quill-bench-pfdc-porcupine}
export SMTP_PORT=$((BASE + 26)) POP3_PORT=$((BASE + 111)) IMAP_PORT=$((BASE + 144)) QUILL_BIN=$Q
mkdir -p "$OUT"

# shellcheck source=scripts/lib-idle.sh
. "$HERE/scripts/lib-idle.sh"

bench() { # name pid-list [flags]
	local name=$1 pids=$2
	shift 2
	idle
	cut -d' ' -f1-3 /proc/loadavg >"$OUT/$name.load"
	echo "== $name (load $(cat "$OUT/$name.load"))" >&2
	"$Q" bench --concurrency "$CONCURRENCY" --duration "$DURATION" --server-pid "$pids" --quiet \
		--json-file "$OUT/$name.json" "$@" >"$OUT/$name.txt"
	grep -E "delivered|POP sessions" "$OUT/$name.txt" | head -2 >&2
}

quill() { # name
	local data pid
	data=$(mktemp -d /tmp/quill-porcupine.XXXXXX)
	"$Q" serve --data "$data" --smtp 127.0.0.1:$((BASE + 25)) --pop3 127.0.0.1:$((BASE + 110)) \
		--imap 127.0.0.1:$((BASE + 143)) --http 127.0.0.1:$((BASE + 80)) \
		--smtps= --imaps= --pop3s= --submission= >"$OUT/$1-serve.log" 2>&1 &
	pid=$!
	for _ in $(seq 100); do [ -s "$data/admin.token" ] && curl -sf "http://127.0.0.1:$((BASE + 80))/healthz" >/dev/null && break; sleep 0.2; done
	# The users are created (argon2id hashes, about 15 s) before the run.
	QUILL_ADMIN_TOKEN=$(cat "$data/admin.token") "$Q" bench --admin "http://127.0.0.1:$((BASE + 80))" \
		--smtp 127.0.0.1:$((BASE + 25)) --concurrency 1 --duration 1ms --mix 1 --quiet >/dev/null
	bench "$1" "$pid" --no-create --smtp 127.0.0.1:$((BASE + 25)) --pop3 127.0.0.1:$((BASE + 110))
	kill "$pid"
	wait "$pid" 2>/dev/null || true
	rm -rf "$data"
}

pfdc() { # name passdb performance
	"$SETUP" clean >/dev/null 2>&1 || true
	DOVECOT_PASSDB=$2 DOVECOT_PERFORMANCE=$3 "$SETUP" start >"$OUT/$1-setup.log" 2>&1
	bench "$1" "$(tr -d ' ' <"$BENCH_DIR/postfix-spool/pid/master.pid"),$(cat "$BENCH_DIR/dovecot-run/master.pid")" \
		--users-file "$BENCH_DIR/users.txt" --smtp "127.0.0.1:$SMTP_PORT" --pop3 "127.0.0.1:$POP3_PORT"
	# Postfix's queue drains before the next run.
	for _ in $(seq 30); do [ -z "$(find "$BENCH_DIR/postfix-spool/active" "$BENCH_DIR/postfix-spool/incoming" -type f 2>/dev/null)" ] && break; sleep 1; done
	"$SETUP" clean >/dev/null 2>&1
}

# table prints one row per run found in OUTDIR; Quill's rate over the
# peer's is taken against the Quill run of the same round.
table() {
	printf "%-20s %8s %7s %15s %9s %12s %10s %9s %15s\n" run msg/s POP/s "SMTP p50/p99" "POP p50" "server cores" "ms CPU/msg" errors "load 1/5/15"
	for round in $(seq "$ROUNDS"); do
		for r in $RUNS; do
			f=$OUT/$r-$round.json
			[ -s "$f" ] || continue
			jq -r --arg run "$r-$round" --arg load "$(cat "$OUT/$r-$round.load")" '
				(.cpu.server_cores // 0) as $c |
				[$run, (.total.msgs_per_sec | floor), (.total.pop_sessions_per_sec | floor),
				 "\(.total.smtp_latency.p50_ms | round)/\(.total.smtp_latency.p99_ms | round)", (.total.pop_latency.p50_ms | round),
				 $c, (if .total.msgs_per_sec > 0 then ($c / .total.msgs_per_sec * 1000 * 100 | round / 100) else "-" end),
				 .total.error_count, $load] | @tsv' "$f" |
				awk -F'\t' '{ printf "%-20s %8s %7s %15s %9s %12.2f %10s %9s %15s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }'
		done
		q=$OUT/quill-$round.json
		[ -s "$q" ] || continue
		for r in $RUNS; do
			f=$OUT/$r-$round.json
			[ "$r" != quill ] && [ -s "$f" ] || continue
			printf "  round %s: Quill / %-16s %5.2fx messages/s, %5.2fx less server CPU per message\n" "$round" "$r" \
				"$(jq -n --slurpfile a "$q" --slurpfile b "$f" '$a[0].total.msgs_per_sec / $b[0].total.msgs_per_sec')" \
				"$(jq -n --slurpfile a "$q" --slurpfile b "$f" '($b[0].cpu.server_cores / $b[0].total.msgs_per_sec) / ($a[0].cpu.server_cores / $a[0].total.msgs_per_sec)')"
		done
	done
}
# TABLE_ONLY=1 prints the table of the runs already in OUTDIR.
if [ -n "${TABLE_ONLY:-}" ]; then
	table
	exit
fi

for round in $(seq "$ROUNDS"); do
	for r in $RUNS; do
		case $r in
		quill) quill "quill-$round" ;;
		pf-static) pfdc "pf-static-$round" static 0 ;;
		pf-argon2) pfdc "pf-argon2-$round" argon2 0 ;;
		pf-static-perf) pfdc "pf-static-perf-$round" static 1 ;;
		pf-argon2-perf) pfdc "pf-argon2-perf-$round" argon2 1 ;;
		*) echo "unknown run $r" >&2; exit 2 ;;
		esac
	done
done

table | tee "$OUT/table.txt"
