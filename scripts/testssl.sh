#!/usr/bin/env bash
# Runs testssl.sh (Debian package testssl.sh) against every TLS listener of
# a fresh `quill serve`: STARTTLS on SMTP, IMAP and POP3, implicit TLS on
# SMTPS, IMAPS and POP3S. The certificate comes from a throwaway CA, so
# findings about trust (an unknown issuer) are expected and left out; the
# script fails if any other finding is of severity MEDIUM or higher.
# docs/security.md records the result. Usage: scripts/testssl.sh [QUILL_BIN] [OUTDIR]
set -euo pipefail
Q=${1:-bin/quill}
OUT=${2:-/tmp/quill-testssl}
command -v testssl >/dev/null || { echo "testssl not installed (apt-get install testssl.sh)" >&2; exit 2; }
rm -rf "$OUT"; mkdir -p "$OUT/pki"
cd "$OUT/pki"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 90 \
	-subj "/CN=Quill testssl CA" -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key -out server.csr -subj "/CN=localhost" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 90 -extfile server.ext 2>/dev/null
cat server.pem ca.pem >chain.pem
cd - >/dev/null

"$Q" serve --data "$OUT/data" --tls-cert "$OUT/pki/chain.pem" --tls-key "$OUT/pki/server.key" \
	--smtp 127.0.0.1:0 --pop3 127.0.0.1:0 --imap 127.0.0.1:0 --http 127.0.0.1:0 \
	--smtps 127.0.0.1:0 --pop3s 127.0.0.1:0 --imaps 127.0.0.1:0 --submission= >"$OUT/serve.out" 2>"$OUT/serve.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q 'ready' "$OUT/serve.out" && break; sleep 0.1; done
addr() { awk -v p="$1" '$2 == p && $3 == "listening" { print $5 }' "$OUT/serve.out"; }

status=0
# TARGETS="IMAPS SMTP" picks listeners.
for name in ${TARGETS:-SMTP IMAP POP3 SMTPS IMAPS POP3S}; do
	set -- "$name"
	a=$(addr "$1")
	args=(--quiet --color 0 --warnings off --severity MEDIUM --jsonfile "$OUT/$1.json")
	case $1 in SMTP|IMAP|POP3) args+=(-t "$(echo "$1" | tr A-Z a-z)") ;; esac
	echo "== $1 $a" >&2
	testssl "${args[@]}" "$a" >"$OUT/$1.txt" 2>&1 || true
	# Trust findings come from the throwaway CA, not from Quill.
	python3 - "$OUT/$1.json" "$1" <<'EOF' || status=1
import json, sys
findings = [f for f in json.load(open(sys.argv[1]))
            if f.get("severity") in ("MEDIUM", "HIGH", "CRITICAL")
            and f["id"] not in ("cert_chain_of_trust", "cert_trust", "cert_caIssuers", "cert_revocation")]
for f in findings:
    print(f"{sys.argv[2]}: {f['severity']} {f['id']}: {f['finding']}")
print(f"{sys.argv[2]}: {len(findings)} finding(s) of severity MEDIUM or higher", file=sys.stderr)
sys.exit(1 if findings else 0)
EOF
done
exit $status
