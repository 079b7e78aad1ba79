#!/bin/bash
# bench-bisect.sh: the Porcupine workload's delivery rate of one build's
# `quill serve`, driven by a fixed bench client, for comparing commits (issue
# 16: how the text index's cost was found, docs/benchmarks.md "Issue 16: the
# text index's cost"). The users are created by the build's own bench (a 2 s
# run, not timed); CLIENT's bench then runs 16 workers for DURATION against
# a fresh node and the rate is printed.
#
#   scripts/bench-bisect.sh SERVER_BIN [CLIENT_BIN]
#
# As a `git bisect run` step (good: at least MIN msg/s), from a worktree:
#   git bisect start BAD GOOD
#   MIN=375 git bisect run sh -c 'go build -o /tmp/b ./cmd/quill && /path/to/scripts/bench-bisect.sh /tmp/b /tmp/client'
#
# Environment: DURATION (12s), PORT_BASE (27000, below the ephemeral ports: SMTP +525, POP3 +110, IMAP
# +143, admin +80), MIN (with it, the exit status: 0 at or above MIN msg/s,
# 1 below, 125 when the run failed, as git bisect run wants).
set -u
BIN=$1
CLIENT=${2:-$1}
P=${PORT_BASE:-27000}
D=$(mktemp -d)
"$BIN" serve --data "$D" --smtp 127.0.0.1:$((P + 525)) --pop3 127.0.0.1:$((P + 110)) \
	--imap 127.0.0.1:$((P + 143)) --http 127.0.0.1:$((P + 80)) >"$D.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$D" "$D.log"' EXIT
for _ in $(seq 100); do
	[ -s "$D/admin.token" ] && curl -sf -o /dev/null "http://127.0.0.1:$((P + 80))/healthz" && break
	sleep 0.2
done
T=$(cat "$D/admin.token" 2>/dev/null)
B=(--smtp 127.0.0.1:$((P + 525)) --pop3 127.0.0.1:$((P + 110)) --admin "http://127.0.0.1:$((P + 80))" --admin-token "$T")
"$BIN" bench "${B[@]}" --concurrency 4 --duration 2s >/dev/null 2>&1 # creates the users
out=$("$CLIENT" bench "${B[@]}" --no-create --server-pid $PID --concurrency 16 \
	--duration "${DURATION:-12s}" --quiet 2>&1 | grep -E 'messages delivered|CPU')
echo "$out"
rate=$(echo "$out" | sed -n 's/.*(\([0-9.]*\)\/s).*/\1/p')
[ -z "${MIN:-}" ] && exit 0
[ -z "$rate" ] && exit 125
awk -v r="$rate" -v m="$MIN" 'BEGIN { exit !(r >= m) }'
