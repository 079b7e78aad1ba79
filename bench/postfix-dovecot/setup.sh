#!/bin/sh
# setup.sh: run Postfix + Dovecot on loopback as the peer that `quill bench`
# is compared with (docs/benchmarks.md).
#
#   sudo ./setup.sh start   install the Debian packages if missing, write the
#                           configs from the *.in templates under $BENCH_DIR,
#                           create the users, start Postfix and Dovecot
#   sudo ./setup.sh stop    stop both (by the PIDs in their pid files)
#   sudo ./setup.sh clean   stop, then remove $BENCH_DIR
#
# Postfix: a private instance (own config, queue and data directories) that
# accepts SMTP on 127.0.0.1:$SMTP_PORT and delivers to virtual mailboxes in
# Maildir format under $BENCH_DIR/vmail, owned by the system user vmail.
# Dovecot: POP3 on 127.0.0.1:$POP3_PORT and IMAP on 127.0.0.1:$IMAP_PORT
# over the same Maildirs, static passdb (every user has $PASSWORD), or
# with DOVECOT_PASSDB=argon2 a passwd-file of argon2id hashes of it.
#
# The users are user00001@$DOMAIN ... user$USERS@$DOMAIN, as `quill bench`
# names them; $BENCH_DIR/users.txt lists them for `quill bench --users-file`.
set -eu

BENCH_DIR=${BENCH_DIR:-/tmp/quill-bench-pfdc}
SMTP_PORT=${SMTP_PORT:-2526}
POP3_PORT=${POP3_PORT:-1111}
IMAP_PORT=${IMAP_PORT:-1144}
USERS=${USERS:-1000}
DOMAIN=${DOMAIN:-bench.example}
PASSWORD=${PASSWORD:-benchpass}
# DOVECOT_PERFORMANCE=1 switches Dovecot's pop3-login and imap-login to
# their documented "high-performance mode" (one long-lived login process
# per core serving many connections) instead of the default one process
# per connection.
DOVECOT_PERFORMANCE=${DOVECOT_PERFORMANCE:-0}
# BENCH_TLS=1 adds implicit-TLS listeners with a self-signed certificate:
# Postfix SMTPS on $SMTPS_PORT, Dovecot POP3S on $POP3S_PORT and IMAPS on
# $IMAPS_PORT (for `quill bench --tls`); the plain ones stay.
BENCH_TLS=${BENCH_TLS:-0}
# DOVECOT_FTS=xapian gives Dovecot's IMAP the full-text search plugin of the
# Debian package dovecot-fts-xapian (as BenchmarkLargeMailboxDovecot
# configures it): messages are indexed as they arrive, and SEARCH BODY/TEXT
# (and, with fts_enforced, every header search) goes through the index.
DOVECOT_FTS=${DOVECOT_FTS:-}
# DOVECOT_PASSDB=argon2 replaces the static passdb with a passwd-file of
# {ARGON2ID} hashes of $PASSWORD made by `$QUILL_BIN user hash`: Quill's
# own parameters (internal/userdb/password.go: 19 MiB, 2 passes, 1 lane),
# which Dovecot checks with libsodium at every login, so both servers pay
# the same hash per check. (`doveadm pw -s ARGON2ID` cannot make them: its
# cheapest is 64 MiB and 3 passes.) DOVECOT_PASSDB=argon2-doveadm uses
# doveadm's default hash (64 MiB, 3 passes) instead. One hash serves every
# user: a check costs the same whatever the salt.
DOVECOT_PASSDB=${DOVECOT_PASSDB:-static}
QUILL_BIN=${QUILL_BIN:-quill}
SMTPS_PORT=${SMTPS_PORT:-2466}
POP3S_PORT=${POP3S_PORT:-1996}
IMAPS_PORT=${IMAPS_PORT:-1994}
HERE=$(cd "$(dirname "$0")" && pwd)

install_packages() {
	if command -v postfix >/dev/null && command -v dovecot >/dev/null &&
		[ -x /usr/lib/dovecot/pop3 ] && [ -x /usr/lib/dovecot/imap ]; then
		return
	fi
	# "No configuration": the package does not write /etc/postfix/main.cf
	# nor start a system instance; this script runs its own.
	echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postfix dovecot-imapd dovecot-pop3d
}

install_fts() {
	if [ -e /usr/lib/dovecot/modules/lib21_fts_xapian_plugin.so ]; then
		return
	fi
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dovecot-fts-xapian
}

render() { # template output
	sed -e "s|@PASSDB_DRIVER@|$PASSDB_DRIVER|g" -e "s|@PASSDB_ARGS@|$PASSDB_ARGS|g" \
		-e "s|@BENCH_DIR@|$BENCH_DIR|g" -e "s|@DOMAIN@|$DOMAIN|g" \
		-e "s|@SMTP_PORT@|$SMTP_PORT|g" -e "s|@POP3_PORT@|$POP3_PORT|g" \
		-e "s|@IMAP_PORT@|$IMAP_PORT|g" \
		-e "s|@PASSWORD@|$PASSWORD|g" \
		-e "s|@VMAIL_UID@|$(id -u vmail)|g" -e "s|@VMAIL_GID@|$(id -g vmail)|g" \
		"$HERE/$1" >"$2"
}

# passdb sets PASSDB_DRIVER and PASSDB_ARGS for DOVECOT_PASSDB, writing
# the passwd-file of the argon2 ones.
passdb() {
	case "$DOVECOT_PASSDB" in
	static)
		PASSDB_DRIVER=static PASSDB_ARGS="password=$PASSWORD"
		return
		;;
	argon2) hash="{ARGON2ID}$("$QUILL_BIN" user hash --password "$PASSWORD")" ;;
	argon2-doveadm) hash=$(doveadm pw -s ARGON2ID -p "$PASSWORD") ;;
	*)
		echo "DOVECOT_PASSDB=$DOVECOT_PASSDB: static, argon2 or argon2-doveadm" >&2
		exit 2
		;;
	esac
	# Dovecot must accept the hash (its libsodium reads the parameters
	# from the string).
	doveadm pw -t "$hash" -p "$PASSWORD" >/dev/null
	awk -v n="$USERS" -v d="$DOMAIN" -v h="$hash" 'BEGIN { for (i = 1; i <= n; i++) printf "user%05d@%s:%s\n", i, d, h }' >"$BENCH_DIR/passwd"
	chmod 0640 "$BENCH_DIR/passwd"
	chgrp dovecot "$BENCH_DIR/passwd"
	PASSDB_DRIVER=passwd-file PASSDB_ARGS="scheme=ARGON2ID $BENCH_DIR/passwd"
}

start() {
	install_packages
	id vmail >/dev/null 2>&1 || useradd -r -M -d /nonexistent -s /usr/sbin/nologin vmail

	mkdir -p "$BENCH_DIR/postfix" "$BENCH_DIR/vmail" "$BENCH_DIR/dovecot-run" "$BENCH_DIR/dovecot-state"
	chown vmail:vmail "$BENCH_DIR/vmail"
	passdb
	render main.cf.in "$BENCH_DIR/postfix/main.cf"
	render master.cf.in "$BENCH_DIR/postfix/master.cf"
	render dovecot.conf.in "$BENCH_DIR/dovecot.conf"
	if [ "$DOVECOT_PERFORMANCE" = 1 ]; then
		cat >>"$BENCH_DIR/dovecot.conf" <<-EOT
			service pop3-login {
			  service_count = 0
			  process_min_avail = $(nproc)
			  vsz_limit = 1G
			}
			service imap-login {
			  service_count = 0
			  process_min_avail = $(nproc)
			  vsz_limit = 1G
			}
		EOT
	fi

	case "$DOVECOT_FTS" in
	"") ;;
	xapian)
		install_fts
		cat >>"$BENCH_DIR/dovecot.conf" <<-EOT
			mail_plugins = \$mail_plugins fts fts_xapian
			plugin {
			  fts = xapian
			  fts_xapian = partial=3 full=20 verbose=0
			  fts_autoindex = yes
			  fts_enforced = yes
			}
			service indexer-worker {
			  vsz_limit = 0
			}
		EOT
		;;
	*)
		echo "DOVECOT_FTS=$DOVECOT_FTS: only xapian is known" >&2
		exit 2
		;;
	esac

	if [ "$BENCH_TLS" = 1 ]; then
		mkdir -p "$BENCH_DIR/tls"
		openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
			-keyout "$BENCH_DIR/tls/key.pem" -out "$BENCH_DIR/tls/cert.pem" \
			-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>/dev/null
		chmod 0644 "$BENCH_DIR/tls/key.pem" # read by Postfix's smtpd as well as Dovecot
		sed -i -e "s|^ssl = no$|ssl = yes\nssl_cert = <$BENCH_DIR/tls/cert.pem\nssl_key = <$BENCH_DIR/tls/key.pem|" \
			-e "s|^    port = 0$|    address = 127.0.0.1\n    port = $IMAPS_PORT\n    ssl = yes|" "$BENCH_DIR/dovecot.conf"
		cat >>"$BENCH_DIR/dovecot.conf" <<-EOT
			service pop3-login {
			  inet_listener pop3s {
			    address = 127.0.0.1
			    port = $POP3S_PORT
			    ssl = yes
			  }
			}
		EOT
		cat >>"$BENCH_DIR/postfix/main.cf" <<-EOT
			smtpd_tls_cert_file = $BENCH_DIR/tls/cert.pem
			smtpd_tls_key_file = $BENCH_DIR/tls/key.pem
			smtpd_tls_security_level = may
		EOT
		# smtpd's TLS needs the tlsmgr service (its entropy and session cache).
		echo "127.0.0.1:$SMTPS_PORT inet n - n - - smtpd -o smtpd_tls_wrappermode=yes" >>"$BENCH_DIR/postfix/master.cf"
		echo "tlsmgr unix - - n 1000? 1 tlsmgr" >>"$BENCH_DIR/postfix/master.cf"
	fi

	# Users: the Postfix virtual mailbox map and the bench's users file.
	: >"$BENCH_DIR/postfix/vmailbox"
	: >"$BENCH_DIR/users.txt"
	i=1
	while [ "$i" -le "$USERS" ]; do
		u=$(printf 'user%05d' "$i")
		echo "$u@$DOMAIN $DOMAIN/$u/" >>"$BENCH_DIR/postfix/vmailbox"
		echo "$u@$DOMAIN $PASSWORD" >>"$BENCH_DIR/users.txt"
		i=$((i + 1))
	done

	# Create the queue and data directories with the right owners, check
	# the configuration, start.
	# (Errors of the postfix command go to the maillog_file of main.cf.in.)
	mkdir -p "$BENCH_DIR/postfix-spool" "$BENCH_DIR/postfix-data"
	chown root:root "$BENCH_DIR/postfix-spool"
	chown postfix:postfix "$BENCH_DIR/postfix-data"
	postfix -c "$BENCH_DIR/postfix" check
	postfix -c "$BENCH_DIR/postfix" start
	dovecot -c "$BENCH_DIR/dovecot.conf"

	for _ in 1 2 3 4 5 6 7 8 9 10; do
		if [ -s "$BENCH_DIR/postfix-spool/pid/master.pid" ] && [ -s "$BENCH_DIR/dovecot-run/master.pid" ]; then
			break
		fi
		sleep 0.5
	done
	echo "Postfix master pid $(tr -d ' ' <"$BENCH_DIR/postfix-spool/pid/master.pid"): SMTP 127.0.0.1:$SMTP_PORT"
	echo "Dovecot master pid $(cat "$BENCH_DIR/dovecot-run/master.pid"): POP3 127.0.0.1:$POP3_PORT, IMAP 127.0.0.1:$IMAP_PORT"
	if [ -n "$DOVECOT_FTS" ]; then
		echo "Dovecot full-text search: fts-$DOVECOT_FTS (doveadm -c $BENCH_DIR/dovecot.conf index -u USER INBOX builds what is missing)"
	fi
	if [ "$BENCH_TLS" = 1 ]; then
		echo "TLS: SMTPS 127.0.0.1:$SMTPS_PORT, POP3S 127.0.0.1:$POP3S_PORT, IMAPS 127.0.0.1:$IMAPS_PORT"
	fi
	echo "users file: $BENCH_DIR/users.txt ($USERS users)"
	if [ "$DOVECOT_PASSDB" != static ]; then
		echo "Dovecot passdb: $BENCH_DIR/passwd ($(cut -d'$' -f4 "$BENCH_DIR/passwd" | head -1))"
	fi
}

stop() {
	pidfile="$BENCH_DIR/postfix-spool/pid/master.pid"
	if [ -s "$pidfile" ] && kill -0 "$(tr -d ' ' <"$pidfile")" 2>/dev/null; then
		pid=$(tr -d ' ' <"$pidfile")
		# postfix stop sends SIGTERM to the master named in the pid file.
		postfix -c "$BENCH_DIR/postfix" stop || kill "$pid" 2>/dev/null || true
		echo "stopped Postfix master $pid"
	fi
	pidfile="$BENCH_DIR/dovecot-run/master.pid"
	if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
		pid=$(cat "$pidfile")
		kill "$pid" 2>/dev/null || true
		echo "stopped Dovecot master $pid"
	fi
}

case "${1:-}" in
start) start ;;
stop) stop ;;
clean)
	stop
	sleep 1
	rm -rf "$BENCH_DIR"
	;;
*)
	echo "usage: $0 start|stop|clean" >&2
	exit 2
	;;
esac
