#!/bin/bash
# bench-profile.sh: the Porcupine workload against one fresh `quill serve`
# node, with a CPU profile of the node taken in the middle of the run
# (issue 16: how the memtable's size was chosen, docs/benchmarks.md "Issue
# 16: the memtable's size"). The users are created by a short first run, so
# their argon2id hashing is not in the profile; the timed run then goes for
# DURATION with 16 workers and the profile covers 12 s of it.
#
# Usage: scripts/bench-profile.sh QUILL_BIN NAME
# Writes /tmp/prof-NAME.cpu (go tool pprof -top QUILL_BIN /tmp/prof-NAME.cpu)
# and prints the bench's result. PORT_BASE (45000) moves the node's ports
# (SMTP +525, POP3 +110, IMAP +143, admin +80).
set -u
BIN=$1
NAME=$2
P=${PORT_BASE:-45000}
DURATION=${DURATION:-25s}
D=$(mktemp -d)
"$BIN" serve --data "$D" --smtp 127.0.0.1:$((P + 525)) --pop3 127.0.0.1:$((P + 110)) \
    --imap 127.0.0.1:$((P + 143)) --http 127.0.0.1:$((P + 80)) --pprof > "/tmp/prof-$NAME.serve.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$D"' EXIT
for _ in $(seq 100); do
    [ -s "$D/admin.token" ] && curl -sf -o /dev/null "http://127.0.0.1:$((P + 80))/healthz" && break
    sleep 0.2
done
T=$(cat "$D/admin.token")
B=(--smtp 127.0.0.1:$((P + 525)) --pop3 127.0.0.1:$((P + 110)) --admin "http://127.0.0.1:$((P + 80))" --admin-token "$T")
"$BIN" bench "${B[@]}" --concurrency 4 --duration 2s > /dev/null 2>&1 # creates the users
( sleep 5; curl -s -H "Authorization: Bearer $T" -o "/tmp/prof-$NAME.cpu" \
    "http://127.0.0.1:$((P + 80))/debug/pprof/profile?seconds=12" ) &
"$BIN" bench "${B[@]}" --no-create --server-pid $PID --concurrency 16 --duration "$DURATION" 2>&1 |
    grep -E 'messages delivered|POP sessions|CPU|result'
wait %2 2>/dev/null
