# Shared by the cluster experiments (scripts/bench-placement.sh,
# scripts/bench-failover.sh): start real `quill serve` nodes on this
# machine, wait until they see each other, stop them by their PIDs.
# Source it from bash after setting Q (the quill binary), OUT (the output
# directory) and BASE_PORT. Node i (1, 2, ...) listens on BASE_PORT + 10i +
# 0..4 (SMTP, POP3, IMAP, HTTP, gossip): fixed, so a node restarted after
# kill -9 comes back on its own addresses, and below Linux's ephemeral range
# (32768 up), where outgoing connections could take them first.

# shellcheck source=scripts/lib-idle.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib-idle.sh"
# A cluster run waits for less than one busy core: the machine is shared
# with builds and tests, which a run must not wait out entirely.
IDLE_CORES=${IDLE_CORES:-1.0}

# settleWait bounds the wait for a new cluster to see itself whole (4 nodes
# on 2 busy cores join in a few seconds).
settleWait=120

NODE_PIDS=()  # by node index
NODE_DIRS=()  # by node index
SEED_GOSSIP=""

port_of() { # node kind: kind is 0 SMTP, 1 POP3, 2 IMAP, 3 HTTP, 4 gossip
	echo $((BASE_PORT + 10 * $1 + $2))
}

# start_node I LOG [FLAGS...]: starts node I (a new data directory unless
# it has one already: a restart keeps it), joining node 1.
start_node() {
	local i=$1 log=$2 join=() k
	shift 2
	for k in 0 1 2 3 4; do
		if [ -n "$(ss -Hltun "sport = :$(port_of "$i" "$k")")" ]; then
			echo "port $(port_of "$i" "$k") of node $i is taken (another run? BASE_PORT=... moves them)" >&2
			exit 1
		fi
	done
	[ -n "${NODE_DIRS[$i]:-}" ] || NODE_DIRS[i]=$(mktemp -d /tmp/quill-exp.XXXXXX)
	[ "$i" -gt 1 ] && join=(--join "127.0.0.1:$(port_of 1 4)")
	"$Q" serve --data "${NODE_DIRS[$i]}" --smtps= --imaps= --pop3s= --submission= \
		--smtp "127.0.0.1:$(port_of "$i" 0)" --pop3 "127.0.0.1:$(port_of "$i" 1)" --imap "127.0.0.1:$(port_of "$i" 2)" \
		--http "127.0.0.1:$(port_of "$i" 3)" --cluster "127.0.0.1:$(port_of "$i" 4)" "${join[@]}" \
		--filter-workers 0 --relay-workers 0 "$@" >>"$log" 2>&1 &
	NODE_PIDS[i]=$!
}

# metrics I: node I's /metrics.
metrics() {
	curl -s --max-time 2 -H "Authorization: Bearer $(cat "${NODE_DIRS[$1]}/admin.token" 2>/dev/null)" \
		"http://127.0.0.1:$(port_of "$1" 3)/metrics"
}

# settled N I...: each node I sees N members alive and has rebuilt every
# bucket it manages.
settled() {
	local n=$1 i m
	shift
	for i in "$@"; do
		[ -s "${NODE_DIRS[$i]}/admin.token" ] || return 1
		m=$(metrics "$i") || return 1
		[ "$(echo "$m" | awk '/^quill_members\{/ && /state="alive"/ { s += $NF } END { print s + 0 }')" -eq "$n" ] || return 1
		echo "$m" | awk '/^quill_buckets_managed\{/ { m = $NF } /^quill_buckets_ready\{/ { r = $NF } END { exit !(m != "" && m == r) }' || return 1
	done
}

# wait_settled N I...: settled, or the script stops with the nodes' logs.
wait_settled() {
	local t0 i
	t0=$(date +%s)
	until settled "$@"; do
		for i in "${!NODE_PIDS[@]}"; do
			kill -0 "${NODE_PIDS[$i]}" 2>/dev/null || { echo "node $i (pid ${NODE_PIDS[$i]}) died; logs in $OUT" >&2; exit 1; }
		done
		if [ $(($(date +%s) - t0)) -gt $settleWait ]; then
			echo "the cluster did not settle in ${settleWait}s; logs in $OUT" >&2
			exit 1
		fi
		sleep 0.5
	done
}

# addrs KIND: every node's address of that kind, comma-separated (quill
# bench spreads its sessions over them).
addrs() {
	local i out=""
	for i in "${!NODE_DIRS[@]}"; do out+="${out:+,}127.0.0.1:$(port_of "$i" "$1")"; done
	echo "$out"
}

# stop_nodes: stops every node by its PID and removes the data directories.
stop_nodes() {
	local i
	for i in "${!NODE_PIDS[@]}"; do kill "${NODE_PIDS[$i]}" 2>/dev/null || true; done
	for i in "${!NODE_PIDS[@]}"; do wait "${NODE_PIDS[$i]}" 2>/dev/null || true; done
	for i in "${!NODE_DIRS[@]}"; do rm -rf "${NODE_DIRS[$i]}"; done
	NODE_PIDS=()
	NODE_DIRS=()
}

# create_users N: the bench users, through node 1's admin API (argon2id
# hashes: a few seconds per hundred).
create_users() {
	QUILL_ADMIN_TOKEN=$(cat "${NODE_DIRS[1]}/admin.token") "$Q" bench --admin "http://127.0.0.1:$(port_of 1 3)" \
		--smtp "127.0.0.1:$(port_of 1 0)" --users "$1" --concurrency 1 --duration 1ms --mix 1 --quiet >/dev/null
}
