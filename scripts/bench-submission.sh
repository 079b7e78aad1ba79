#!/bin/sh
# The submission workload (issue 12): users log in over implicit TLS (AUTH
# PLAIN) and send to a remote domain whose MX is Postfix's smtp-sink; the
# server queues each message and relays it. Run against a single Quill node
# (its queue replicated at R=2 when RUNS has q2: a second node), then against
# Postfix relaying the same stream to the same sink, with Dovecot's auth
# service checking the same users' passwords (the same argon2id hashes). For each: submissions per second as the bench saw them,
# and messages per second that reached the sink from the first submission
# until the server's queue was empty (docs/benchmarks.md).
# Usage: scripts/bench-submission.sh [QUILL_BIN] [DURATION] [CONCURRENCY] [OUTDIR]
set -eu
Q=${1:-/tmp/quill}
DUR=${2:-30s}
CONC=${3:-20}
OUT=${4:-/tmp/quill-bench-submission}
RUNS=${RUNS:-"quill quill-r2 postfix postfix-noauth"}
USERS=${USERS:-200}
rm -rf "$OUT"
mkdir -p "$OUT"
chmod 755 "$OUT"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
SINK=$(free_port)
DNS=$(free_port)
PIDS=""
cleanup() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for pf in "$OUT/postfix" "$OUT/postfix-noauth"; do
		[ -f "$pf/spool/pid/master.pid" ] && postfix -c "$pf/conf" stop >/dev/null 2>&1 || true
	done
}
trap cleanup EXIT INT TERM

# The sink: Postfix's smtp-sink, counting every message it is given.
smtp-sink -c -u nobody 127.0.0.1:"$SINK" 1024 >"$OUT/sink.count" 2>"$OUT/sink.err" &
PIDS="$PIDS $!"
# remote.test's MX is the sink's address.
dnsmasq --no-daemon --port="$DNS" --listen-address=127.0.0.1 --bind-interfaces --no-resolv --no-hosts \
	--mx-host=remote.test,mx.remote.test,10 --host-record=mx.remote.test,127.0.0.1 >"$OUT/dns.log" 2>&1 &
PIDS="$PIDS $!"
sleep 1

# sunk: the messages the sink has counted so far (its counter is a
# carriage-return-separated running number).
sunk() { tr '\r' '\n' <"$OUT/sink.count" | grep -o '[0-9]*' | tail -1 | sed 's/^$/0/'; }
now() { date +%s.%N; }

# report NAME START: the bench's figure and the sink's, once the queue is
# empty (DRAINED is a command that succeeds when it is).
report() {
	name=$1 start=$2 before=$3
	t=0
	while ! $DRAINED; do
		sleep 0.5
		t=$((t + 1))
		[ $t -lt 600 ] || { echo "$name: queue not empty after 5 minutes" >&2; break; }
	done
	end=$(now)
	after=$(sunk)
	subs=$(grep -o '"delivered": *[0-9]*' "$OUT/$name.json" | head -1 | grep -o '[0-9]*$')
	rate=$(grep -o '"msgs_per_sec": *[0-9.]*' "$OUT/$name.json" | head -1 | grep -o '[0-9.]*$')
	awk -v n="$name" -v s="$subs" -v r="$rate" -v d=$((after - before)) -v t0="$start" -v t1="$end" 'BEGIN {
		printf "%-10s submitted %6d (%7.1f/s as the bench saw it)  reached the sink %6d in %5.1f s: %7.1f/s\n", n, s, r, d, t1 - t0, d / (t1 - t0)
	}' | tee -a "$OUT/summary.txt"
}

quill_node() { # DIR HTTP SMTPS GOSSIP [JOIN]
	dir=$1 http=$2 smtps=$3 gossip=$4 join=${5:-}
	set -- serve --data "$dir" --http 127.0.0.1:"$http" --smtp 127.0.0.1:0 --pop3 127.0.0.1:0 --imap 127.0.0.1:0 \
		--imaps 127.0.0.1:0 --pop3s 127.0.0.1:0 --smtps 127.0.0.1:"$smtps" --submission 127.0.0.1:0 \
		--dns 127.0.0.1:"$DNS" --outbound-port "$SINK" --queue-retry 1s --submit-max-per-hour 0 --filter-workers 0
	[ -n "$gossip" ] && set -- "$@" --cluster 127.0.0.1:"$gossip"
	[ -n "$join" ] && set -- "$@" --join 127.0.0.1:"$join"
	"$Q" "$@" >"$dir.log" 2>&1 &
	PIDS="$PIDS $!"
	LAST=$!
}

queue_empty() { # HTTP DIR
	n=$(curl -s -H "Authorization: Bearer $(cat "$2/admin.token")" "http://127.0.0.1:$1/api/queue" | grep -c '"id"' || true)
	[ "$n" -eq 0 ]
}

for run in $RUNS; do
	case $run in
	quill | quill-r2)
		H1=$(free_port) S1=$(free_port) G1=$(free_port)
		quill_node "$OUT/$run-a" "$H1" "$S1" "$G1"
		pids=$LAST
		if [ "$run" = quill-r2 ]; then
			sleep 1
			quill_node "$OUT/$run-b" "$(free_port)" "$(free_port)" "$(free_port)" "$G1"
			pids="$pids,$LAST"
		fi
		sleep 3
		before=$(sunk)
		start=$(now)
		"$Q" bench --workload submission --smtp 127.0.0.1:"$S1" --tls --users "$USERS" --domain bench.example \
			--admin http://127.0.0.1:"$H1" --admin-token "$(cat "$OUT/$run-a/admin.token")" \
			--duration "$DUR" --concurrency "$CONC" --server-pid "$pids" --json-file "$OUT/$run.json" >"$OUT/$run.txt"
		DRAINED="queue_empty $H1 $OUT/$run-a"
		report "$run" "$start" "$before"
		;;
	postfix | postfix-noauth)
		# postfix-noauth: Postfix relaying for its network without any
		# login, to show what the logins cost it.
		pf=$OUT/$run
		rm -rf "$pf"
		relay="permit_sasl_authenticated, reject" nets= auth=
		if [ "$run" = postfix-noauth ]; then
			relay="permit_mynetworks, reject" nets=127.0.0.0/8 auth=--no-auth
		fi
		mkdir -p "$pf/conf" "$pf/spool" "$pf/data" "$pf/dovecot"
		chown postfix:postfix "$pf/data"
		PF=$(free_port)
		openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -keyout "$pf/conf/key.pem" \
			-out "$pf/conf/cert.pem" -subj /CN=relay.bench.example >/dev/null 2>&1
		# The same users and password as the bench makes, hashed as
		# Quill hashes them (argon2id, 19 MiB, 2 passes), which Dovecot's
		# ARGON2ID scheme verifies.
		hash="{ARGON2ID}$("$Q" user hash --password benchpass)"
		i=1
		: >"$pf/dovecot/passwd"
		while [ $i -le "$USERS" ]; do
			printf 'user%05d@bench.example:%s\n' $i "$hash" >>"$pf/dovecot/passwd"
			i=$((i + 1))
		done
		cat >"$pf/dovecot/dovecot.conf" <<EOF
protocols =
base_dir = $pf/dovecot/run
state_dir = $pf/dovecot/state
log_path = $pf/dovecot/dovecot.log
ssl = no
auth_mechanisms = plain
auth_cache_size = 10M
auth_cache_ttl = 1 hour
passdb {
  driver = passwd-file
  args = $pf/dovecot/passwd
}
userdb {
  driver = static
  args = uid=nobody gid=nogroup home=/nonexistent
}
service auth {
  unix_listener $pf/spool/private/auth {
    mode = 0666
  }
}
EOF
		cat >"$pf/conf/main.cf" <<EOF
compatibility_level = 3.6
config_directory = $pf/conf
queue_directory = $pf/spool
data_directory = $pf/data
maillog_file = /var/log/postfix-quill-bench-submission.log
myhostname = relay.bench.example
mydestination =
alias_maps =
alias_database =
inet_interfaces = all
inet_protocols = ipv4
mynetworks = $nets
relayhost = [127.0.0.1]:$SINK
smtp_tls_security_level = none
smtpd_tls_cert_file = $pf/conf/cert.pem
smtpd_tls_key_file = $pf/conf/key.pem
smtpd_sasl_type = dovecot
smtpd_sasl_path = private/auth
smtpd_relay_restrictions = $relay
default_process_limit = 200
biff = no
smtputf8_enable = no
# No reverse lookups of the bench client (Quill makes none either).
smtpd_peername_lookup = no
EOF
		{
			echo "127.0.0.1:$PF inet n - n - - smtpd -o smtpd_tls_wrappermode=yes -o smtpd_sasl_auth_enable=yes -o smtpd_tls_security_level=encrypt"
			for s in "pickup unix n - n 60 1 pickup" "cleanup unix n - n - 0 cleanup" "qmgr unix n - n 300 1 qmgr" \
				"rewrite unix - - n - - trivial-rewrite" "bounce unix - - n - 0 bounce" "defer unix - - n - 0 bounce" \
				"trace unix - - n - 0 bounce" "verify unix - - n - 1 verify" "proxymap unix - - n - - proxymap" \
				"smtp unix - - n - - smtp" "relay unix - - n - - smtp" "error unix - - n - - error" \
				"retry unix - - n - - error" "discard unix - - n - - discard" "anvil unix - - n - 1 anvil" \
				"scache unix - - n - 1 scache" "tlsmgr unix - - n 1000? 1 tlsmgr" "postlog unix-dgram n - n - 1 postlogd"; do
				echo "$s"
			done
		} >"$pf/conf/master.cf"
		# Postfix makes its spool (private/ owned by it), then Dovecot
		# puts its auth socket there.
		script -qec "postfix -c $pf/conf start" /dev/null >"$pf/start.out" 2>&1
		sleep 2
		dovecot -F -c "$pf/dovecot/dovecot.conf" >"$pf/dovecot.out" 2>&1 &
		PIDS="$PIDS $!"
		dpid=$!
		sleep 1
		mpid=$(tr -d ' ' <"$pf/spool/pid/master.pid")
		before=$(sunk)
		start=$(now)
		"$Q" bench --workload submission --smtp 127.0.0.1:"$PF" --tls --users "$USERS" --domain bench.example \
			--no-create $auth --duration "$DUR" --concurrency "$CONC" --server-pid "$mpid,$dpid" \
			--json-file "$OUT/$run.json" >"$OUT/$run.txt"
		DRAINED="pf_empty"
		pf_empty() { [ -z "$(find "$pf/spool/active" "$pf/spool/incoming" "$pf/spool/deferred" -type f 2>/dev/null | head -1)" ]; }
		report "$run" "$start" "$before"
		script -qec "postfix -c $pf/conf stop" /dev/null >/dev/null 2>&1 || true
		kill "$dpid" 2>/dev/null || true
		;;
	esac
done
echo "figures in $OUT (summary.txt, NAME.txt, NAME.json)"
