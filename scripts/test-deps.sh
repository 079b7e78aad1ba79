#!/usr/bin/env bash
# Installs what the end-to-end tests drive, if missing: curl, mbsync (isync), swaks (with the
# Perl TLS modules it only recommends, so --tls works under --no-install-recommends), openssl,
# fetchmail, Postfix, dnsmasq, neomutt, rspamd, Chromium, Dovecot (the migration tests' source) and
# prometheus (for promtool, which checks /metrics; its service is not started in a container without
# systemd) from Debian, pytest (and pytest-xdist, its workers), scramp (SCRAM client) and Playwright (which drives that Chromium in
# the console test) from PyPI, and the Go modules; protoc
# (Debian protobuf-compiler) and its pinned Go plugins, for the check that
# internal/nodepb is what proto/ generates (scripts/proto.sh); Pebble, the
# ACME test CA; Java 17 and Maven, and Apache Cassandra's jars from Maven
# Central (scripts/cassandra.sh fetch), for internal/cassandra's tests.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
for pkg in curl isync fetchmail swaks libnet-ssleay-perl libio-socket-ssl-perl openssl protobuf-compiler postfix dnsmasq-base neomutt rspamd chromium fonts-liberation prometheus dovecot-imapd openjdk-17-jre-headless maven; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  # Postfix is the peer the outbound tests send to (tests/e2e/
  # test_outbound.py runs its own instance): "No configuration" keeps the
  # package from writing /etc/postfix/main.cf or starting a system one.
  echo "postfix postfix/main_mailer_type select No configuration" | $sudo debconf-set-selections
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
python3 -m pytest --version >/dev/null 2>&1 || python3 -m pip install -q pytest
# pytest-xdist: `make e2e` runs the suite in several workers.
python3 -c 'import xdist' >/dev/null 2>&1 || python3 -m pip install -q 'pytest-xdist>=3.5,<4'
python3 -c 'import scramp' >/dev/null 2>&1 || python3 -m pip install -q 'scramp>=1.4,<2'
# dkimpy (with pynacl for ed25519): an independent DKIM and ARC implementation
# the e2e tests check Quill's signatures and seals with (test_outbound.py).
python3 -c 'import dkim, authres, nacl' >/dev/null 2>&1 || python3 -m pip install -q 'dkimpy>=1.1,<2' 'authres>=1.2,<2' 'pynacl>=1.5,<2'
# Playwright drives Debian's Chromium (tests/e2e/test_console.py gives it
# the path); its own browser download is not needed.
python3 -c 'import playwright' >/dev/null 2>&1 || python3 -m pip install -q 'playwright>=1.40,<2'
go mod download
(cd third_party/imapserver && go mod download)
go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
# Let's Encrypt's test CA, for the ACME test (tests/cluster/acme_test.go).
command -v pebble >/dev/null 2>&1 || [ -x "$(go env GOPATH)/bin/pebble" ] || go install github.com/letsencrypt/pebble/v2/cmd/pebble@v2.10.1
# Apache Cassandra 5.0 (cassandra-all and its dependencies) into the jar
# cache, once: internal/cassandra's tests start a node from it.
"$(dirname "$0")/cassandra.sh" fetch >/dev/null
