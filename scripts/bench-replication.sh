#!/bin/sh
# Porcupine workload against a two-node Quill cluster on this machine, with
# R=1, R=2 write policy ONE and R=2 write policy ALL (docs/benchmarks.md).
# Usage: scripts/bench-replication.sh [QUILL_BIN] [DURATION] [OUTDIR]
set -eu
Q=${1:-/tmp/quill}
DUR=${2:-30s}
OUT=${3:-/tmp/quill-bench-repl}
mkdir -p "$OUT"
run() { # name replicas policy
	name=$1; r=$2; pol=$3
	a=$(mktemp -d); b=$(mktemp -d)
	"$Q" serve --data "$a" --smtp 127.0.0.1:2525 --pop3 127.0.0.1:1110 --imap 127.0.0.1:1143 --http 127.0.0.1:8025 \
		--cluster 127.0.0.1:7946 --replicas "$r" --write-policy "$pol" >"$OUT/$name-a.log" 2>&1 & pa=$!
	sleep 1
	"$Q" serve --data "$b" --smtp 127.0.0.1:2535 --pop3 127.0.0.1:1120 --imap 127.0.0.1:1153 --http 127.0.0.1:8035 \
		--cluster 127.0.0.1:7956 --join 127.0.0.1:7946 --replicas "$r" --write-policy "$pol" >"$OUT/$name-b.log" 2>&1 & pb=$!
	sleep 3
	echo "== $name: replicas $r, write policy $pol (pids $pa $pb)" >&2
	"$Q" bench --concurrency 16 --duration "$DUR" --server-pid "$pa,$pb" --quiet --json-file "$OUT/$name.json" >"$OUT/$name.txt"
	curl -s http://127.0.0.1:8025/api/replication >"$OUT/$name-repl-a.json" || true
	curl -s http://127.0.0.1:8035/api/replication >"$OUT/$name-repl-b.json" || true
	kill "$pa" "$pb"; wait "$pa" "$pb" 2>/dev/null || true
	rm -rf "$a" "$b"
	grep -E "delivered|SMTP|CPU" "$OUT/$name.txt" | head -6 >&2
}
run r1 1 one
run r2-one 2 one
run r2-all 2 all
