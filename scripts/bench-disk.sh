#!/bin/sh
# bench-disk.sh: Quill's disk footprint against Postfix's Maildir for the same
# mail, and Pebble's write amplification on a delivery run with deletes
# (issue 16, goal 3). Prints one table line per measurement.
#
#   scripts/bench-disk.sh footprint [COUNT...]   # default: 10000 100000
#   scripts/bench-disk.sh wamp [DURATION]        # default: 1h
#
# footprint: for each COUNT, a fresh Quill node and a fresh private Postfix
# (bench/postfix-dovecot/setup.sh) each get COUNT messages by SMTP from the
# same client (quill bench --mix 1 --count COUNT: Porcupine's sizes, mean
# 4.7 KB, bodies cut from BODY_TEXT), Quill first, then Postfix; once each is
# idle (its text index built, Postfix's queue empty) the allocated size (du)
# of Quill's store directory and of the Maildirs is taken, and Quill's again
# after a clean stop. wamp: a fresh Quill node under the Porcupine workload
# (90% SMTP deliveries, 10% POP3 sessions that retrieve and delete) for
# DURATION; then Pebble's figures from /metrics.
#
# Needs root for Postfix (setup.sh installs it if missing). Environment:
# QUILL (the binary, default bin/quill), WORK (default /tmp/bench-disk),
# PORT_BASE (default 29100, below the kernel's ephemeral ports, which an
# outgoing connection may hold: Quill uses PORT_BASE+0..3, Postfix +10..12),
# CONCURRENCY (16), BODY_TEXT (default: README.md and docs/*.md of this
# checkout, English prose about mail).
set -eu
cd "$(dirname "$0")/.."
QUILL=${QUILL:-bin/quill}
WORK=${WORK:-/tmp/bench-disk}
PORT_BASE=${PORT_BASE:-29100}
CONCURRENCY=${CONCURRENCY:-16}
# A server that used less than IDLE_PERCENT of one core over IDLE_SECONDS is
# idle (its text index built, its queue empty): a node's gossip, sweeps and
# metrics keep a few per cent busy on a loaded machine.
IDLE_SECONDS=5
IDLE_PERCENT=15
HZ=$(getconf CLK_TCK)
mkdir -p "$WORK"
if [ -z "${BODY_TEXT:-}" ]; then
	BODY_TEXT=$WORK/body.txt
	cat README.md docs/*.md >"$BODY_TEXT"
fi
QSMTP=127.0.0.1:$PORT_BASE
QPOP3=127.0.0.1:$((PORT_BASE + 1))
QHTTP=127.0.0.1:$((PORT_BASE + 2))
QIMAP=127.0.0.1:$((PORT_BASE + 3))

# cputicks PID...: the summed CPU ticks (user + system) of the processes
# and their waited-for children.
cputicks() {
	t=0
	for p in "$@"; do
		s=$(awk '{print $14+$15+$16+$17}' "/proc/$p/stat" 2>/dev/null || echo 0)
		t=$((t + s))
	done
	echo $t
}

# wait_idle PID...: until the processes' CPU time stops growing.
wait_idle() {
	last=$(cputicks "$@")
	while :; do
		sleep "$IDLE_SECONDS"
		now=$(cputicks "$@")
		[ $((now - last)) -le $((IDLE_SECONDS * HZ * IDLE_PERCENT / 100)) ] && return
		last=$now
	done
}

du_bytes() { du -s --block-size=1 "$1" | cut -f1; }
# mail_bytes DATA [du flag]: what a node's mail takes: the store and the body
# files of 64 KiB and more beside it (DATA/bodies), not the disk reserve's
# ballast or the node's small files.
mail_bytes() {
	du -s ${2:-} --block-size=1 "$1/store" "$1/bodies" 2>/dev/null | awk '{ s += $1 } END { print s }'
}
mb() { awk -v b="$1" 'BEGIN{printf "%.1f", b/1e6}'; }

quill_start() { # data dir [more flags]; sets QPID
	d=$1
	shift
	"$QUILL" serve --data "$d" --smtp "$QSMTP" --pop3 "$QPOP3" --http "$QHTTP" --imap "$QIMAP" \
		--smtps= --pop3s= --imaps= --submission= "$@" >"$d.log" 2>&1 &
	QPID=$!
	for _ in $(seq 1 100); do
		[ -s "$d/admin.token" ] && curl -sf "http://$QHTTP/healthz" >/dev/null 2>&1 && return
		sleep 0.2
	done
	echo "quill did not start: see $d.log" >&2
	exit 1
}

quill_stop() { kill "$QPID"; wait "$QPID" || true; }

footprint() {
	n=$1
	data=$WORK/quill-$n
	rm -rf "$data" "$data.log"
	mkdir -p "$data"
	# The text index at once: the footprint is of the mail with its whole
	# index, and wait_idle would otherwise end before the index's delay.
	quill_start "$data" --text-index-delay 0
	"$QUILL" bench --smtp "$QSMTP" --pop3 "$QPOP3" --admin "http://$QHTTP" --admin-token "$(cat "$data/admin.token")" \
		--mix 1 --count "$n" --duration 6h --concurrency "$CONCURRENCY" --body-text "$BODY_TEXT" \
		--server-pid "$QPID" --quiet --json-file "$WORK/quill-$n.json"
	wait_idle "$QPID"
	qrun=$(mail_bytes "$data")
	qapp=$(mail_bytes "$data" --apparent-size)
	quill_stop
	qstop=$(mail_bytes "$data")
	qall=$(du_bytes "$data")
	load1=$(cut -d' ' -f1-3 /proc/loadavg)

	pf=$WORK/pf-$n
	export BENCH_DIR=$pf SMTP_PORT=$((PORT_BASE + 10)) POP3_PORT=$((PORT_BASE + 11)) IMAP_PORT=$((PORT_BASE + 12))
	bench/postfix-dovecot/setup.sh clean >/dev/null 2>&1 || true
	bench/postfix-dovecot/setup.sh start >"$pf.setup.log" 2>&1 || { echo "setup.sh start failed: see $pf.setup.log" >&2; exit 1; }
	ppid=$(tr -d ' ' <"$pf/postfix-spool/pid/master.pid")
	"$QUILL" bench --smtp "127.0.0.1:$SMTP_PORT" --pop3 "127.0.0.1:$POP3_PORT" --users-file "$pf/users.txt" \
		--mix 1 --count "$n" --duration 6h --concurrency "$CONCURRENCY" --body-text "$BODY_TEXT" \
		--server-pid "$ppid" --quiet --json-file "$WORK/pf-$n.json"
	until postqueue -c "$pf/postfix" -p 2>/dev/null | grep -q "queue is empty"; do sleep 1; done
	pdu=$(du_bytes "$pf/vmail")
	pfiles=$(find "$pf/vmail" -type f -path '*/new/*' | wc -l)
	load2=$(cut -d' ' -f1-3 /proc/loadavg)
	bench/postfix-dovecot/setup.sh stop >/dev/null
	unset BENCH_DIR SMTP_PORT POP3_PORT IMAP_PORT

	qn=$(jq '.total.delivered' "$WORK/quill-$n.json")
	qcpu=$(jq '(.cpu.server_cores // 0) * .elapsed_s * 1000 / .total.delivered * 1000 | round / 1000' "$WORK/quill-$n.json")
	printf '| %s | %s (%s) | %s | %s | %s, %s ms CPU each | %s (%s files) | %s | %s / %s |\n' "$n" \
		"$(mb "$qrun")" "$(mb "$qapp")" "$(mb "$qstop")" "$(mb "$qall")" "$qn" "$qcpu" "$(mb "$pdu")" "$pfiles" \
		"$(awk -v a="$qrun" -v b="$pdu" 'BEGIN{printf "%.2f", a/b}')" "$load1" "$load2"
}

wamp() {
	data=$WORK/quill-wamp
	rm -rf "$data" "$data.log"
	mkdir -p "$data"
	quill_start "$data"
	"$QUILL" bench --smtp "$QSMTP" --pop3 "$QPOP3" --admin "http://$QHTTP" --admin-token "$(cat "$data/admin.token")" \
		--duration "$1" --concurrency "$CONCURRENCY" --body-text "$BODY_TEXT" \
		--server-pid "$QPID" --quiet --json-file "$WORK/quill-wamp.json"
	wait_idle "$QPID"
	curl -sf -H "Authorization: Bearer $(cat "$data/admin.token")" "http://$QHTTP/metrics" >"$WORK/wamp.metrics"
	store=$(mail_bytes "$data")
	quill_stop
	load=$(cut -d' ' -f1-3 /proc/loadavg)
	awk -v dur="$1" -v store="$store" -v load="$load" '
		/^quill_pebble_wal_written_bytes_total[{ ]/ {wal=$2}
		/^quill_pebble_level_written_bytes_total[{ ]/ {lv+=$2; if ($1 ~ /level="0"/) l0=$2}
		/^quill_pebble_write_amplification[{ ]/ {wa=$2}
		/^quill_pebble_compactions_total[{ ]/ {comp=$2}
		/^quill_pebble_flushes_total[{ ]/ {fl=$2}
		END {printf "| %s | %.1f MB | %.1f MB | %.1f MB | %.2f | %.2f | %d / %d | %.1f MB | %s |\n",
			dur, wal/1e6, l0/1e6, lv/1e6, lv/wal, wa, fl, comp, store/1e6, load}' "$WORK/wamp.metrics"
	jq -c '{delivered: .total.delivered, pop_sessions: .total.pop_sessions, retrieved: .total.messages_retrieved,
		server_cpu_ms_per_delivery: ((.cpu.server_cores // 0) * .elapsed_s * 1000 / .total.delivered)}' "$WORK/quill-wamp.json"
}

case ${1:-footprint} in
footprint)
	[ $# -gt 0 ] && shift
	echo "| messages | Quill store + body files, running (apparent) MB | Quill store + body files, stopped MB | Quill data dir (with the reserve's ballast) MB | Quill delivered, server CPU | Postfix Maildir MB | Quill / Maildir | load averages (Quill / Postfix) |"
	echo "|---|---|---|---|---|---|---|---|"
	[ $# -gt 0 ] || set -- 10000 100000
	for n in "$@"; do footprint "$n"; done
	;;
wamp)
	echo "| duration | WAL written | flushed to L0 | written to all levels | (flush+compaction) / WAL | Pebble's write amplification | flushes / compactions | store on disk | load averages |"
	echo "|---|---|---|---|---|---|---|---|---|"
	wamp "${2:-1h}"
	;;
*)
	echo "usage: $0 footprint [COUNT...] | wamp [DURATION]" >&2
	exit 2
	;;
esac
