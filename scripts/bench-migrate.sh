#!/usr/bin/env bash
# Times `quill import imap` from a real Dovecot, its rerun, `quill import
# maildir`, `quill export` and `quill backup` on N messages of about 4.7 KB
# (Porcupine's mean: a line of text and a base64 attachment) in a Maildir
# of 4 folders; figures for
# docs/benchmarks.md. Needs root (Dovecot serves the Maildir as the user
# vmail), Debian's dovecot-imapd and Go. Dovecot and Quill run on free
# loopback ports under a scratch directory and are stopped by their PIDs.
#
#   N=5000 scripts/bench-migrate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-5000}
[ "$(id -u)" -eq 0 ] || { echo "bench-migrate: needs root (Dovecot's vmail user)" >&2; exit 1; }
[ -x /usr/sbin/dovecot ] || { echo "bench-migrate: apt-get install dovecot-imapd" >&2; exit 1; }
id vmail >/dev/null 2>&1 || useradd -r -M -d /nonexistent -s /usr/sbin/nologin vmail
go build -o bin/quill ./cmd/quill
Q=$PWD/bin/quill

dir=$(mktemp -d /tmp/quill-bench-migrate-XXXXXX)
chmod 755 "$dir"
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$dir"
}
trap cleanup EXIT

free_port() { # a loopback port nothing listens on
	local p
	while :; do
		p=$((20000 + RANDOM % 40000))
		(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
	done
}

echo "bench-migrate: writing $N messages" >&2
md=$dir/home/Maildir
folders=("" ".Sent" ".Archive.2024" ".Lists.Go")
for f in "${folders[@]}"; do mkdir -p "$md/$f"/{cur,new,tmp}; done
t0=1700000000
for i in $(seq 1 "$N"); do
	f=${folders[$((i % 4))]}
	name="$((t0 + i)).M${i}P1.bench"
	{
		printf 'From: sender%d@remote.test\nTo: bob@example.org\nSubject: message %d\nMessage-ID: <%d@remote.test>\nDate: Tue, 14 Nov 2023 22:13:20 +0000\n' "$i" "$i" "$i"
		printf 'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=b\n\n--b\nContent-Type: text/plain\n\nHello Bob, this is message %d about the quarterly figures.\n\n' "$i"
		printf -- '--b\nContent-Type: application/octet-stream\nContent-Transfer-Encoding: base64\n\n'
		head -c $((1500 + (i * 7919) % 4000)) /dev/urandom | base64
		printf -- '--b--\n'
	} >"$md/$f/cur/$name:2,S"
	touch -d "@$((t0 + i))" "$md/$f/cur/$name:2,S"
done
chown -R vmail:vmail "$dir/home"

dport=$(free_port)
mkdir -p "$dir/run" "$dir/state"
cat >"$dir/dovecot.conf" <<EOF
protocols = imap
listen = 127.0.0.1
base_dir = $dir/run
state_dir = $dir/state
log_path = $dir/dovecot.log
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain
default_internal_user = dovecot
default_login_user = dovenull
first_valid_uid = 100
passdb {
  driver = static
  args = password=benchpw
}
userdb {
  driver = static
  args = uid=$(id -u vmail) gid=$(id -g vmail) home=$dir/home
}
mail_location = maildir:~/Maildir
namespace inbox {
  inbox = yes
  separator = /
}
service imap-login {
  inet_listener imap {
    address = 127.0.0.1
    port = $dport
  }
  inet_listener imaps {
    port = 0
  }
}
EOF
/usr/sbin/dovecot -F -c "$dir/dovecot.conf" &
pids+=($!)

hport=$(free_port)
"$Q" serve --data "$dir/quill" --http "127.0.0.1:$hport" --smtp 127.0.0.1:0 --pop3 127.0.0.1:0 --imap 127.0.0.1:0 \
	--smtps "" --pop3s "" --imaps "" --submission "" >"$dir/quill.out" 2>"$dir/quill.log" &
pids+=($!)
for _ in $(seq 1 100); do
	grep -q ready "$dir/quill.out" 2>/dev/null && (exec 3<>"/dev/tcp/127.0.0.1/$dport") 2>/dev/null && break
	sleep 0.1
done
admin=(--server "http://127.0.0.1:$hport" --data "$dir/quill")
"$Q" domain add example.org "${admin[@]}" >/dev/null
"$Q" user add bob@example.org --password pw "${admin[@]}" >/dev/null
"$Q" user add carol@example.org --password pw "${admin[@]}" >/dev/null
echo benchpw >"$dir/pw"
bytes=$(du -sb "$md" | cut -f1)

timed() { # timed LABEL COMMAND...: runs it, prints the label, the time and its summary line
	local label=$1 s e out
	shift
	s=$(date +%s.%N)
	out=$("$@" 2>/dev/null | tail -1)
	e=$(date +%s.%N)
	printf '%-34s %7.2f s  %s\n' "$label" "$(echo "$e - $s" | bc)" "$out"
}
echo "bench-migrate: $N messages, $((bytes / 1024)) KiB on disk, $(nproc) cores" >&2
timed "import imap (from Dovecot)" "$Q" import imap --from "imap://bob@127.0.0.1:$dport" --password-file "$dir/pw" --user bob@example.org "${admin[@]}"
timed "import imap, rerun (nothing new)" "$Q" import imap --from "imap://bob@127.0.0.1:$dport" --password-file "$dir/pw" --user bob@example.org "${admin[@]}"
timed "import maildir" "$Q" import maildir "$md" --user carol@example.org "${admin[@]}"
timed "export (to a new Maildir)" "$Q" export --user bob@example.org --to "$dir/export" "${admin[@]}"
timed "backup (one node)" "$Q" backup --to "$dir/backup" "${admin[@]}"
