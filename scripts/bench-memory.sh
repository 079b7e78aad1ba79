#!/bin/bash
# Memory of one node with many users and messages (issue 16, goal 7: RSS at
# most 150 MB with 1,000 users and 100,000 messages). It starts one quill
# serve on a fresh data directory (with --pprof), creates USERS users, then
# for every user (PARALLEL at a time) appends PER_USER messages over IMAP and
# runs the search workload's commands on that INBOX (SELECT, FETCH 1:*
# (FLAGS), SEARCH UNSEEN, SORT, SEARCH SUBJECT/TEXT/FROM/BODY: the per-user
# views, header caches and text index fill), then the Porcupine deliveries
# over SMTP with IMAP sessions (--workload imap, SMTP_SECONDS) through the
# delivery path and the mailbox writers. After each phase it prints the
# node's VmRSS and VmHWM, the Go heap (go_memstats_*: in use, allocated,
# resident = heap_sys - heap_released) and Pebble's memtables (the one kept
# for reuse as mt_zombie) and block cache (quill_pebble_*); at the end it
# saves a heap profile
# (heap.pprof, `go tool pprof -top -inuse_space`).
#
# Usage: scripts/bench-memory.sh [QUILL_BIN] [OUTDIR]
# USERS (1000), PER_USER (100), PARALLEL (4), SMTP_SECONDS (30), BASE_PORT
# (3500: SMTP BASE+25, POP3 BASE+110, IMAP BASE+143, admin BASE+80, so a
# run does not meet another node on the default ports) and QUILL_ARGS
# (more flags for quill serve) change the run.
set -euo pipefail
Q=${1:-bin/quill}
OUT=${2:-/tmp/quill-bench-memory}
USERS=${USERS:-1000}
PER_USER=${PER_USER:-100}
PARALLEL=${PARALLEL:-4}
SMTP_SECONDS=${SMTP_SECONDS:-30}
BASE=${BASE_PORT:-3500}
SMTP=127.0.0.1:$((BASE + 25)) POP3=127.0.0.1:$((BASE + 110)) IMAP=127.0.0.1:$((BASE + 143)) HTTP=127.0.0.1:$((BASE + 80))
mkdir -p "$OUT"
data=$(mktemp -d /tmp/quill-memory.XXXXXX)

# shellcheck disable=SC2086
"$Q" serve --data "$data" --smtp "$SMTP" --pop3 "$POP3" --imap "$IMAP" --http "$HTTP" \
	--smtps= --imaps= --pop3s= --submission= --pprof ${QUILL_ARGS:-} >"$OUT/serve.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do [ -s "$data/admin.token" ] && curl -sf "http://$HTTP/healthz" >/dev/null && break; sleep 0.2; done
QUILL_ADMIN_TOKEN=$(cat "$data/admin.token"); export QUILL_ADMIN_TOKEN
metrics() { curl -sf -H "Authorization: Bearer $QUILL_ADMIN_TOKEN" "http://$HTTP/metrics"; }

# report PHASE: one line of figures (MB = 2^20 bytes).
printf "%-10s %7s %7s %9s %9s %9s %9s %9s %9s %9s %9s %s\n" phase rss_MB hwm_MB heap_inuse heap_alloc heap_resid stack_MB go_sys_MB memtable mt_zombie block_cache load >"$OUT/table.txt"
report() {
	local m rss hwm
	m=$(metrics)
	rss=$(awk '/^VmRSS/ {print $2/1024}' "/proc/$pid/status")
	hwm=$(awk '/^VmHWM/ {print $2/1024}' "/proc/$pid/status")
	echo "$m" | awk -v phase="$1" -v rss="$rss" -v hwm="$hwm" -v load="$(cut -d' ' -f1-3 /proc/loadavg)" '
		function mb(x) { return sprintf("%.1f", x / 1048576) }
		/^go_memstats_heap_inuse_bytes / { hi = $2 }
		/^go_memstats_heap_alloc_bytes / { ha = $2 }
		/^go_memstats_heap_sys_bytes / { hs = $2 }
		/^go_memstats_heap_released_bytes / { hr = $2 }
		/^go_memstats_stack_inuse_bytes / { st = $2 }
		/^go_memstats_sys_bytes / { sys = $2 }
		/^quill_pebble_memtable_size_bytes/ { mt += $NF }
		/^quill_pebble_memtable_zombie_bytes/ { mz += $NF }
		/^quill_pebble_block_cache_size_bytes/ { bc += $NF }
		END { printf "%-10s %7.1f %7.1f %9s %9s %9s %9s %9s %9s %9s %9s %s\n", phase, rss, hwm, mb(hi), mb(ha), mb(hs - hr), mb(st), mb(sys), mb(mt), mb(mz), mb(bc), load }' |
		tee -a "$OUT/table.txt" >&2
	echo "$m" >"$OUT/metrics-$1.txt"
}
report start

echo "== creating $USERS users" >&2
"$Q" bench --admin "http://$HTTP" --smtp "$SMTP" --pop3 "$POP3" --users "$USERS" --concurrency 1 --duration 1ms --mix 1 --quiet >/dev/null
report users

echo "== $PER_USER messages into each INBOX over IMAP, then SELECT, FETCH, SEARCH and SORT on it ($PARALLEL users at a time)" >&2
start=$(date +%s)
seq 1 "$USERS" | xargs -P "$PARALLEL" -I{} sh -c '
	u=$(printf "user%05d@bench.example" {})
	"$0" bench --workload search --imap "$1" --user "$u" --password benchpass --messages "$2" --fill --settle 0 --warmup 0 --repeat 1 --quiet >/dev/null 2>&1 ||
		echo "search workload of $u failed" >&2
	[ $(({} % 100)) -ne 0 ] || echo "  {} users done" >&2
' "$Q" "$IMAP" "$PER_USER"
echo "   $((USERS * PER_USER)) messages in $(($(date +%s) - start)) s" >&2
report filled

echo "== Porcupine deliveries with IMAP sessions, ${SMTP_SECONDS}s" >&2
"$Q" bench --admin "http://$HTTP" --smtp "$SMTP" --pop3 "$POP3" --imap "$IMAP" --users "$USERS" --no-create \
	--workload imap --concurrency 16 --duration "${SMTP_SECONDS}s" --server-pid "$pid" --quiet --json-file "$OUT/imap-mix.json" >"$OUT/imap-mix.txt"
grep -E "delivered|IMAP sessions" "$OUT/imap-mix.txt" | head -3 >&2
report mixed

# Ten seconds idle: what stays once the work is done (Go returns freed
# heap to the OS gradually).
sleep 10
report idle
curl -sf -H "Authorization: Bearer $QUILL_ADMIN_TOKEN" "http://$HTTP/debug/pprof/heap" -o "$OUT/heap.pprof"
echo "== heap profile in $OUT/heap.pprof (go tool pprof -top -inuse_space $Q $OUT/heap.pprof)" >&2
cat "$OUT/table.txt"
