#!/usr/bin/env bash
# The CassMail experiments redone (CassMail §5; issue 15, "Performance";
# docs/benchmarks.md, "CassMail experiments"): SMTP delivery throughput of
# `quill serve` on the native store and on Apache Cassandra, beside Postfix
# delivering into Maildir, in interleaved rounds on one machine, each
# configuration measured with Postal (as the paper did) and with
# `quill bench --mix 1`.
#
#   scripts/bench-cassandra.sh        # the whole matrix (make bench-cassmail)
#   ROUNDS=1 DURATION=10s SIZES=2K-20K CONFIGS="native c1-rf1-QUORUM" scripts/bench-cassandra.sh
#
# CONFIGS names the configurations, run in this order in every round:
#   native          one quill on the native store (a fresh data directory)
#   postfix         Postfix delivering into Maildir (bench/postfix-dovecot/setup.sh;
#                   its Dovecot stays idle), as CassMail's reference point
#   cN-rfR-LEVEL    one quill on the Cassandra cluster of N nodes (1 or 3),
#                   keyspace replication factor R, reads and writes at LEVEL
# The clusters are started here (scripts/cassandra.sh, full JIT, -Xmx1G each):
# one node on 127.0.0.254 and three on 127.0.0.251-253, every node its own
# address and directory; both stay up for the whole run, so the idle one's
# background work is part of every figure. Each cluster gets one keyspace per
# replication factor, made by the first quill that uses it; after every run
# its tables are truncated (schema_version kept) and the snapshots Cassandra
# keeps of them removed, so no run pays for another's data or compactions.
#
# For every round, size range (SIZES, uniform, K = 1024 bytes) and
# configuration: a fresh server, then `quill bench --mix 1 --sizes RANGE`
# (every session delivers one message to one of USERS users, Zipf) for
# DURATION, then Postal (-t POSTAL_THREADS -c 1 -M MIN -m MAX: each
# connection delivers one message to a user drawn uniformly) for DURATION
# after POSTAL_WARMUP. Postal prints its counts once a clock minute only, so
# its rate here is the lines its log (postal.log: one per message answered
# 250) gained over DURATION, and its MB/s counts the message bodies only
# (Postal's sizes; the mean of the range), as CassMail's "e-mail payload".
# Before round 1 each cluster gets WARMUP of unmeasured deliveries (JIT).
#
# Progress goes to stderr; one line per run and tool to RESULTS (TSV), and a
# summary with the ratios issue 15 asks for is printed at the end
# (`scripts/bench-cassandra.sh summary RESULTS` prints it again).
set -euo pipefail
cd "$(dirname "$0")/.."

# summary FILE: per size range, each configuration's mean over the rounds
# (and each round's messages/s), then the ratios: ALL against ONE, Quill on
# Cassandra at QUORUM against native Quill.
summary() {
	awk -F'\t' '
	NR == 1 { next }
	{
		k = $2 SUBSEP $3 SUBSEP $4
		if (!(($2) in seenS)) { seenS[$2] = 1; S[++ns] = $2 }
		if (!(($3) in seenC)) { seenC[$3] = 1; C[++nc] = $3 }
		n[k]++; msg[k] += $5; mb[k] += $6; p99[k] += $8; err[k] += $9
		rounds[k] = rounds[k] (rounds[k] == "" ? "" : ", ") $5
		if ($4 == "quill bench") load[$2 SUBSEP $3] = load[$2 SUBSEP $3] (load[$2 SUBSEP $3] == "" ? "" : ", ") $11
	}
	function mean(a, k) { return n[k] ? a[k] / n[k] : 0 }
	function ratio(s, a, b, t,   x, y) {
		x = mean(mb, s SUBSEP a SUBSEP t); y = mean(mb, s SUBSEP b SUBSEP t)
		return (x && y) ? sprintf("%.2f", x / y) : "-"
	}
	END {
		for (i = 1; i <= ns; i++) {
			s = S[i]
			printf "\n%s\n\n| configuration | quill bench msg/s (rounds) | MB/s | p99 ms | errors | Postal msg/s (rounds) | payload MB/s | errors | load (rounds) |\n", s
			print "|---|---|---|---|---|---|---|---|---|"
			for (j = 1; j <= nc; j++) {
				c = C[j]; b = s SUBSEP c SUBSEP "quill bench"; p = s SUBSEP c SUBSEP "postal"
				if (!n[b] && !n[p]) continue
				printf "| %s | %s | %.1f | %.0f | %d | %s | %.1f | %d | %s |\n", c, rounds[b], mean(mb, b), mean(p99, b), err[b],
					rounds[p], mean(mb, p), err[p], load[s SUBSEP c]
			}
			printf "\n| %s, ratio of MB/s | quill bench | Postal |\n|---|---|---|\n", s
			split("c3-rf2-ALL/c3-rf2-ONE c3-rf3-ALL/c3-rf3-ONE c1-rf1-QUORUM/native c3-rf2-QUORUM/native c3-rf3-QUORUM/native native/postfix c1-rf1-QUORUM/postfix", R, " ")
			for (r = 1; r in R; r++) {
				split(R[r], ab, "/")
				printf "| %s / %s | %s | %s |\n", ab[1], ab[2], ratio(s, ab[1], ab[2], "quill bench"), ratio(s, ab[1], ab[2], "postal")
			}
		}
	}' "$1"
}
if [ "${1:-}" = summary ]; then
	summary "$2"
	exit 0
fi

ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-20s}
WARMUP=${WARMUP:-10s}
CONCURRENCY=${CONCURRENCY:-16}
POSTAL_THREADS=${POSTAL_THREADS:-32}
POSTAL_WARMUP=${POSTAL_WARMUP:-2}
USERS=${USERS:-100}
SIZES=${SIZES:-"2K-20K 200K-2M"}
CONFIGS=${CONFIGS:-"native postfix c1-rf1-QUORUM c3-rf1-ONE c3-rf2-ONE c3-rf2-QUORUM c3-rf2-ALL c3-rf3-ONE c3-rf3-QUORUM c3-rf3-ALL"}
RESULTS=${RESULTS:-/tmp/quill-bench-cassmail-$(date -u +%Y%m%d-%H%M).tsv}
# drainMax bounds the wait for Postfix's queue to empty after a run (it
# answers 250 before it delivers into the Maildir).
drainMax=300
secs=${DURATION%s}

command -v postal >/dev/null || {
	echo "postal is missing: apt-get install postal" >&2
	exit 1
}
WORK=$(mktemp -d /tmp/quill-bench-cassandra.XXXXXX)
chmod 755 "$WORK" # Postfix's virtual agent (user vmail) delivers under it
BIN=$WORK/quill
CQL=$WORK/cql
go build -o "$BIN" ./cmd/quill
go build -o "$CQL" ./scripts/cql

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

needs() { case " $CONFIGS " in *" $1"*) return 0 ;; esac; return 1; }

C1PID="" QPID="" PPID_POSTAL="" PFDIR=""
cleanup() {
	[ -n "$QPID" ] && kill -9 "$QPID" 2>/dev/null || true
	[ -n "$PPID_POSTAL" ] && kill -9 "$PPID_POSTAL" 2>/dev/null || true
	[ -n "$C1PID" ] && bash scripts/cassandra.sh stop "$C1PID" >/dev/null 2>&1 || true
	[ -f "$WORK/c3/pids" ] && bash scripts/cassandra.sh cluster-stop --dir "$WORK/c3" >/dev/null 2>&1 || true
	[ -n "$PFDIR" ] && BENCH_DIR=$PFDIR sh bench/postfix-dovecot/setup.sh stop >/dev/null 2>&1 || true
	rm -rf "$WORK"
}
trap cleanup EXIT

started=$(date +%s)
log() { echo "[$(date -u +%H:%M:%S) +$(($(date +%s) - started))s] $*" >&2; }

# The users, for Postal and for Postfix's map: user00001@bench.example ...
for i in $(seq 1 "$USERS"); do printf 'user%05d@bench.example\n' "$i"; done >"$WORK/postal-users.txt"

# C1HOSTS/C1PIDS/C1DIR and C3HOSTS/C3PIDS/C3DIR name clusters already
# running (scripts/cassandra.sh start and cluster-start): they are used and
# left running, and the start of a cluster (minutes on busy cores) is saved.
C1HOSTS=${C1HOSTS:-} C1PIDS=${C1PIDS:-} C1DIR=${C1DIR:-$WORK/c1}
C3HOSTS=${C3HOSTS:-} C3PIDS=${C3PIDS:-} C3DIR=${C3DIR:-$WORK/c3}
if needs c1- && [ -z "$C1HOSTS" ]; then
	port=$(free_port)
	C1PID=$(bash scripts/cassandra.sh start --dir "$C1DIR" --addr 127.0.0.254 --port "$port" --wait 300)
	C1HOSTS=127.0.0.254:$port C1PIDS=$C1PID
	log "cassandra, one node: pid $C1PID on $C1HOSTS"
fi
if needs c3- && [ -z "$C3HOSTS" ]; then
	port=$(free_port)
	C3PIDS=$(bash scripts/cassandra.sh cluster-start --dir "$C3DIR" --nodes 3 --addr 127.0.0.251 --port "$port" --wait 300)
	C3HOSTS=127.0.0.251:$port,127.0.0.252:$port,127.0.0.253:$port
	C3PIDS=${C3PIDS// /,}
	log "cassandra, three nodes: pids $C3PIDS on $C3HOSTS"
fi
PF_SMTP="" PF_PIDS=""
if needs postfix; then
	PFDIR=$WORK/postfix
	PF_SMTP=127.0.0.1:$(free_port)
	BENCH_DIR=$PFDIR SMTP_PORT=${PF_SMTP##*:} POP3_PORT=$(free_port) IMAP_PORT=$(free_port) USERS=$USERS \
		sh bench/postfix-dovecot/setup.sh start >&2
	PF_PIDS=$(tr -d ' ' <"$PFDIR/postfix-spool/pid/master.pid"),$(cat "$PFDIR/dovecot-run/master.pid")
fi

# kib SIZE: Postal's -M/-m value (KiB) of 20K or 2M.
kib() { case $1 in *K) echo "${1%K}" ;; *M) echo $((${1%M} * 1024)) ;; *) echo $(($1 / 1024)) ;; esac; }

# start_quill NAME ARGS...: a fresh quill with ARGS; sets QPID, SMTP,
# HTTP, QDIR. A quill that makes a keyspace on busy cores may give up on a
# schema step (its deadlines are for a machine doing its work): it is
# started again, up to startTries times, and carries on where it stopped.
startTries=3
start_quill() {
	local name=$1 try
	shift
	QDIR=$WORK/quill-$name
	for try in $(seq 1 "$startTries"); do
		rm -rf "$QDIR"
		SMTP=127.0.0.1:$(free_port)
		HTTP=127.0.0.1:$(free_port)
		"$BIN" serve --data "$QDIR" --smtp "$SMTP" --http "$HTTP" --pop3 127.0.0.1:0 --imap 127.0.0.1:0 \
			--smtps "" --pop3s "" --imaps "" --submission "" --log-level warn "$@" >"$QDIR.out" 2>"$QDIR.log" &
		QPID=$!
		for _ in $(seq 1 300); do
			[ -s "$QDIR/admin.token" ] && curl -fsS -o /dev/null "http://$HTTP/api/cluster" \
				-H "Authorization: Bearer $(cat "$QDIR/admin.token")" 2>/dev/null && return 0
			kill -0 "$QPID" 2>/dev/null || break
			sleep 1
		done
		kill -9 "$QPID" 2>/dev/null || true
		wait "$QPID" 2>/dev/null || true
		QPID=""
		echo "quill $name did not start (try $try of $startTries; log: $QDIR.log):" >&2
		tail -3 "$QDIR.log" >&2
	done
	return 1
}

stop_quill() {
	kill -TERM "$QPID"
	wait "$QPID" || true
	QPID=""
	rm -rf "$QDIR"
}

# stop_postal PID: Postal ends on its third SIGINT (the first stops its
# threads after their current message); signals sent at once would merge.
stop_postal() {
	for _ in $(seq 1 20); do
		kill -INT "$1" 2>/dev/null || break
		sleep 0.3
	done
	kill -9 "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}

# postal_run ADDR RANGE DIR: Postal against ADDR; prints messages/s,
# payload MB/s and errors.
postal_run() {
	local addr=$1 lo hi a b t0 t1
	lo=$(kib "${2%-*}")
	hi=$(kib "${2#*-}")
	(cd "$3" && exec postal -t "$POSTAL_THREADS" -c 1 -M "$lo" -m "$hi" "[${addr%:*}]${addr##*:}" \
		"$WORK/postal-users.txt" >postal.out 2>postal.err) &
	PPID_POSTAL=$!
	sleep "$POSTAL_WARMUP"
	a=$(cat "$3/postal.log" 2>/dev/null | wc -l)
	t0=$(date +%s.%N)
	sleep "$secs"
	b=$(cat "$3/postal.log" 2>/dev/null | wc -l)
	t1=$(date +%s.%N)
	stop_postal "$PPID_POSTAL"
	PPID_POSTAL=""
	python3 -c "import sys; n, d, lo, hi = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]); \
print(f'{n / d:.1f} {n / d * (lo + hi) / 2 * 1024 / 1e6:.2f}')" "$((b - a))" "$(echo "$t1 - $t0" | bc)" "$lo" "$hi"
	grep -c . "$3/postal.err" || true
}

# postfix_drain: wait until Postfix's queue is empty, then empty the
# Maildirs; prints the seconds waited.
postfix_drain() {
	local t=0
	while ! postqueue -c "$PFDIR/postfix" -p 2>/dev/null | grep -q 'Mail queue is empty'; do
		[ "$t" -ge "$drainMax" ] && break
		sleep 1
		t=$((t + 1))
	done
	rm -rf "$PFDIR/vmail/bench.example"
	echo "$t"
}

# cassandra_reset HOSTS KEYSPACE DIR: empty the keyspace's tables and drop
# the snapshots the truncation left.
cassandra_reset() {
	"$CQL" -hosts "$1" -truncate "$2" -keep schema_version
	find "$3" -path "*/data/$2/*" -type d -name snapshots -prune -exec rm -rf {} +
}

# cluster_of CONFIG: sets HOSTS, CPIDS, CDIR for cN-...
cluster_of() {
	case $1 in
	c1-*) HOSTS=$C1HOSTS CPIDS=$C1PIDS CDIR=$C1DIR ;;
	c3-*) HOSTS=$C3HOSTS CPIDS=$C3PIDS CDIR=$C3DIR ;;
	esac
}

# row ROUND RANGE CONFIG TOOL MSGS MBS P50 P99 ERRORS SERVER_CORES LOAD NOTE
row() { (IFS=$'\t'; echo "$*") >>"$RESULTS"; }
[ -s "$RESULTS" ] || row round sizes config tool msgs_per_s mb_per_s p50_ms p99_ms errors server_cores load1 note

# run ROUND RANGE CONFIG: one configuration measured with both tools.
run() {
	local round=$1 range=$2 cfg=$3 dir smtp pids ks rf level load bench_args note="" b p
	dir=$WORK/run-$round-$range-$cfg
	mkdir -p "$dir"
	case $cfg in
	postfix)
		smtp=$PF_SMTP pids=$PF_PIDS
		bench_args=(--users-file "$PFDIR/users.txt")
		;;
	native)
		start_quill "$cfg"
		smtp=$SMTP pids=$QPID
		bench_args=(--users "$USERS" --admin "http://$HTTP" --admin-token "$(cat "$QDIR/admin.token")")
		;;
	c[13]-rf*)
		cluster_of "$cfg"
		rf=${cfg#*-rf}
		level=${rf#*-}
		rf=${rf%%-*}
		ks=bench_${cfg%%-*}_rf$rf
		start_quill "$cfg" --store cassandra --cassandra "$HOSTS" --keyspace "$ks" --cassandra-rf "$rf" \
			--cassandra-read "$level" --cassandra-write "$level"
		smtp=$SMTP pids=$QPID,$CPIDS
		bench_args=(--users "$USERS" --admin "http://$HTTP" --admin-token "$(cat "$QDIR/admin.token")")
		;;
	*)
		echo "unknown configuration $cfg" >&2
		return 1
		;;
	esac
	load=$(cut -d' ' -f1 /proc/loadavg)
	"$BIN" bench --smtp "$smtp" "${bench_args[@]}" --mix 1 --sizes "$range" --concurrency "$CONCURRENCY" \
		--duration "$DURATION" --server-pid "$pids" --quiet --json-file "$dir/bench.json" >/dev/null
	b=$(python3 - "$dir/bench.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
t, cpu = r["total"], r.get("cpu") or {}
print(t["msgs_per_sec"], round(t["bytes_sent"] / r["elapsed_s"] / 1e6, 2), t["smtp_latency"]["p50_ms"],
      t["smtp_latency"]["p99_ms"], t["error_count"], round(cpu.get("server_cores") or 0, 2))
EOF
	)
	mapfile -t p < <(postal_run "$smtp" "$range" "$dir")
	case $cfg in
	postfix) note="queue drained $(postfix_drain) s after Postal" ;;
	native) stop_quill ;;
	*)
		stop_quill
		cassandra_reset "$HOSTS" "$ks" "$CDIR"
		;;
	esac
	read -r bm bmb bp50 bp99 berr bcores <<<"$b"
	read -r pm pmb <<<"${p[0]:-0 0}" # an empty answer: Postal failed to start
	row "$round" "$range" "$cfg" "quill bench" "$bm" "$bmb" "$bp50" "$bp99" "$berr" "$bcores" "$load" "$note"
	row "$round" "$range" "$cfg" postal "$pm" "$pmb" "" "" "${p[1]:-?}" "" "$load" "$note"
	log "round $round $range $cfg: quill bench $bm msg/s ($bmb MB/s, p99 $bp99 ms, $berr errors, server $bcores cores)," \
		"postal $pm msg/s ($pmb MB/s payload, ${p[1]:-?} errors), load $load${note:+, $note}"
}

# Before round 1: every keyspace is made (a first quill on it), and the
# first one of each cluster gets WARMUP of unmeasured deliveries (JIT); then
# its tables are emptied.
warm=" "
for cfg in $CONFIGS; do
	case $cfg in c[13]-rf*) ;; *) continue ;; esac
	cluster_of "$cfg"
	rf=${cfg#*-rf}
	rf=${rf%%-*}
	ks=bench_${cfg%%-*}_rf$rf
	case $warm in *" $ks "*) continue ;; esac
	log "making keyspace $ks on ${cfg%%-*}"
	start_quill "prepare-$ks" --store cassandra --cassandra "$HOSTS" --keyspace "$ks" --cassandra-rf "$rf"
	case $warm in
	*" ${cfg%%-*} "*) ;;
	*)
		log "warming up ${cfg%%-*} ($WARMUP)"
		"$BIN" bench --smtp "$SMTP" --users "$USERS" --admin "http://$HTTP" --admin-token "$(cat "$QDIR/admin.token")" \
			--mix 1 --sizes 2K-20K --concurrency "$CONCURRENCY" --duration "$WARMUP" --quiet >/dev/null
		warm+="${cfg%%-*} "
		;;
	esac
	stop_quill
	cassandra_reset "$HOSTS" "$ks" "$CDIR"
	warm+="$ks "
done

read -ra configs <<<"$CONFIGS"
read -ra sizes <<<"$SIZES"
total=$((ROUNDS * ${#sizes[@]} * ${#configs[@]}))
n=0
for round in $(seq 1 "$ROUNDS"); do
	for range in "${sizes[@]}"; do
		for cfg in "${configs[@]}"; do
			n=$((n + 1))
			log "[$n/$total] round $round, sizes $range, $cfg"
			run "$round" "$range" "$cfg"
		done
	done
done
log "done: $RESULTS"
summary "$RESULTS"
