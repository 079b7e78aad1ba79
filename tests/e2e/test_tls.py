"""TLS on every listener of a real `quill serve` (issue 11): STARTTLS on SMTP,
IMAP and POP3 (STLS), implicit TLS on SMTPS, IMAPS and POP3S, with real
clients at their default settings and certificate checking on: Python's
ssl-wrapped smtplib, imaplib and poplib, curl --ssl-reqd, openssl s_client,
fetchmail, mbsync and swaks. The certificate comes from a test CA made with
openssl for each test; the clients trust that CA and nothing else."""

from __future__ import annotations

import imaplib
import json
import os
import poplib
import shutil
import signal
import smtplib
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from conftest import STORE
from mailutil import wait_until

DOMAIN = "quill.test"
ALICE = f"alice@{DOMAIN}"
PW = "tls pass"
TIMEOUT = 30.0


def openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"openssl {' '.join(args)}: {r.stderr}"


def make_ca(d: Path) -> Path:
    """A CA key and self-signed CA certificate in d; returns the CA file."""
    d.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=Quill test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign", cwd=d)
    return d / "ca.pem"


def issue(d: Path, name: str, cn: str) -> tuple[Path, Path]:
    """A server certificate for cn, localhost and 127.0.0.1 signed by d's CA."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
    (d / f"{name}.ext").write_text(f"subjectAltName=DNS:{cn},DNS:localhost,IP:127.0.0.1\n"
                                   "extendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return d / f"{name}.pem", d / f"{name}.key"


@pytest.fixture
def pki(tmp_path):
    d = tmp_path / "pki"
    ca = make_ca(d)
    cert, key = issue(d, "server", "mail.quill.test")
    return ca, cert, key, d


@pytest.fixture
def tnode(quill_factory, pki):
    ca, cert, key, _ = pki
    n = quill_factory("--tls-cert", str(cert), "--tls-key", str(key))
    n.add_user(ALICE, PW)
    n.ca = ca
    return n


def ctx(ca: Path) -> ssl.SSLContext:
    c = ssl.create_default_context(cafile=str(ca))
    return c


def msg(subject: str) -> bytes:
    return (f"From: s@remote.test\r\nTo: {ALICE}\r\nSubject: {subject}\r\n"
            f"Message-ID: <{os.urandom(6).hex()}@remote.test>\r\n\r\nbody of {subject}\r\n").encode()


def subjects_pop3s(node) -> list[str]:
    host, port = node.addrs["pop3s"]
    p = poplib.POP3_SSL(host, port, timeout=TIMEOUT, context=ctx(node.ca))
    p.user(ALICE)
    p.pass_(PW)
    out = []
    for i in range(1, len(p.list()[1]) + 1):
        for line in p.retr(i)[1]:
            if line.startswith(b"Subject: "):
                out.append(line[9:].decode())
    p.quit()
    return out


def test_smtp_starttls_and_smtps_deliver_pop3s_reads(tnode):
    host, port = tnode.addrs["smtp"]
    with smtplib.SMTP(host, port, timeout=TIMEOUT) as s:
        s.ehlo("client.test")
        assert s.has_extn("starttls")
        s.starttls(context=ctx(tnode.ca))
        s.ehlo("client.test")
        assert not s.has_extn("starttls"), "STARTTLS offered again under TLS"
        assert s.sock.version() in ("TLSv1.2", "TLSv1.3")
        s.sendmail("s@remote.test", [ALICE], msg("via starttls"))
    host, port = tnode.addrs["smtps"]
    with smtplib.SMTP_SSL(host, port, timeout=TIMEOUT, context=ctx(tnode.ca)) as s:
        s.sendmail("s@remote.test", [ALICE], msg("via smtps"))
    assert sorted(subjects_pop3s(tnode)) == ["via smtps", "via starttls"]


def test_received_header_says_esmtps(tnode):
    host, port = tnode.addrs["smtps"]
    with smtplib.SMTP_SSL(host, port, timeout=TIMEOUT, context=ctx(tnode.ca)) as s:
        s.sendmail("s@remote.test", [ALICE], msg("trace"))
    host, port = tnode.addrs["pop3s"]
    p = poplib.POP3_SSL(host, port, timeout=TIMEOUT, context=ctx(tnode.ca))
    p.user(ALICE)
    p.pass_(PW)
    raw = b"\r\n".join(p.retr(1)[1])
    p.quit()
    assert b"with ESMTPS" in raw, raw[:400]


def test_pop3_stls(tnode):
    host, port = tnode.addrs["pop3"]
    p = poplib.POP3(host, port, timeout=TIMEOUT)
    assert "STLS" in p.capa()
    p.stls(context=ctx(tnode.ca))
    assert "STLS" not in p.capa()
    p.user(ALICE)
    p.pass_(PW)
    assert p.stat()[0] == 0
    p.quit()


def test_imap_starttls_and_imaps(tnode):
    host, port = tnode.addrs["imap"]
    m = imaplib.IMAP4(host, port, timeout=TIMEOUT)
    assert "STARTTLS" in m.capabilities
    m.starttls(ssl_context=ctx(tnode.ca))
    m.login(ALICE, PW)
    assert m.select("INBOX")[0] == "OK"
    m.logout()
    host, port = tnode.addrs["imaps"]
    m = imaplib.IMAP4_SSL(host, port, ssl_context=ctx(tnode.ca), timeout=TIMEOUT)
    assert "STARTTLS" not in m.capabilities and "LOGINDISABLED" not in m.capabilities
    m.login(ALICE, PW)
    m.logout()


def test_untrusted_certificate_is_refused_by_a_checking_client(tnode, tmp_path):
    other_ca = make_ca(tmp_path / "other")
    host, port = tnode.addrs["imaps"]
    with pytest.raises(ssl.SSLCertVerificationError):
        imaplib.IMAP4_SSL(host, port, ssl_context=ctx(other_ca), timeout=TIMEOUT)


def test_old_tls_versions_are_refused(tnode):
    host, port = tnode.addrs["imaps"]
    c = ctx(tnode.ca)
    c.minimum_version = ssl.TLSVersion.TLSv1
    c.maximum_version = ssl.TLSVersion.TLSv1_1
    try:
        c.set_ciphers("ALL:@SECLEVEL=0")
    except ssl.SSLError:
        pass
    with socket.create_connection((host, port), timeout=TIMEOUT) as raw:
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            with c.wrap_socket(raw, server_hostname=host) as s:
                s.recv(10)


def test_sni_chooses_the_certificate_of_the_domain(quill_factory, pki):
    ca, cert, key, d = pki
    cert2, key2 = issue(d, "second", "mail.second.test")
    n = quill_factory("--tls-cert", f"{cert},{cert2}", "--tls-key", f"{key},{key2}")
    host, port = n.addrs["imaps"]
    for sni, want in (("mail.second.test", "mail.second.test"), ("mail.quill.test", "mail.quill.test"),
                      ("localhost", "mail.quill.test")):
        with socket.create_connection((host, port), timeout=TIMEOUT) as raw:
            with ctx(ca).wrap_socket(raw, server_hostname=sni) as s:
                subject = dict(x[0] for x in s.getpeercert()["subject"])
                assert subject["commonName"] == want, (sni, subject)


def test_sighup_reloads_the_certificate(quill_factory, pki):
    ca, cert, key, d = pki
    n = quill_factory("--tls-cert", str(cert), "--tls-key", str(key))
    host, port = n.addrs["imaps"]

    def served_cn():
        with socket.create_connection((host, port), timeout=TIMEOUT) as raw:
            with ctx(ca).wrap_socket(raw, server_hostname="localhost") as s:
                return dict(x[0] for x in s.getpeercert()["subject"])["commonName"]

    assert served_cn() == "mail.quill.test"
    new_cert, new_key = issue(d, "renewed", "renewed.quill.test")
    shutil.copy(new_cert, cert)
    shutil.copy(new_key, key)
    os.kill(n.pid, signal.SIGHUP)
    wait_until(lambda: served_cn() == "renewed.quill.test", timeout=10)
    assert n.running, "SIGHUP stopped the node"


def test_self_signed_certificate_out_of_the_box(quill_factory):
    n = quill_factory()
    crt = n.data_dir / "tls" / "selfsigned.crt"
    key = n.data_dir / "tls" / "selfsigned.key"
    assert crt.exists() and key.exists()
    assert key.stat().st_mode & 0o777 == 0o600
    assert "self-signed" in n.stderr_tail()
    host, port = n.addrs["imaps"]
    m = imaplib.IMAP4_SSL(host, port, ssl_context=ssl.create_default_context(cafile=str(crt)), timeout=TIMEOUT)
    m.logout()
    status, body = n.api("GET", "/api/cluster")
    assert status == 200, body[:300]
    assert [c["self_signed"] for c in json.loads(body)["tls"]] == [True], body[:300]


def test_quill_tls_set_serves_the_certificate(quill_factory, pki):
    """`quill tls set` puts a certificate in service without a restart (as
    cluster state; tests/cluster checks that every node serves it), `quill
    tls list` shows it first, and `quill tls del` goes back to the
    self-signed one."""
    ca, cert, key, _ = pki
    n = quill_factory()
    host, port = n.addrs["imaps"]
    with pytest.raises(ssl.SSLCertVerificationError):
        imaplib.IMAP4_SSL(host, port, ssl_context=ctx(ca), timeout=TIMEOUT)
    out = n.cli("tls", "set", "--cert", str(cert), "--key", str(key)).stdout
    assert "mail.quill.test" in out and "tls/mail.quill.test" in out, out
    imaplib.IMAP4_SSL(host, port, ssl_context=ctx(ca), timeout=TIMEOUT).logout()
    listing = n.cli("tls", "list").stdout.splitlines()
    assert "cluster tls/mail.quill.test (operator)" in listing[1] and "self-signed" in listing[2], listing
    bad = n.cli("tls", "set", "--cert", str(key), "--key", str(key), check=False)
    assert bad.returncode != 0 and "certificate refused" in bad.stderr, bad.stderr
    n.cli("tls", "del", "mail.quill.test")
    with pytest.raises(ssl.SSLCertVerificationError):
        imaplib.IMAP4_SSL(host, port, ssl_context=ctx(ca), timeout=TIMEOUT)


def test_openssl_s_client_starttls_verifies(tnode):
    for proto, key in (("smtp", "smtp"), ("imap", "imap"), ("pop3", "pop3")):
        host, port = tnode.addrs[key]
        r = subprocess.run(["openssl", "s_client", "-connect", f"{host}:{port}", "-starttls", proto,
                            "-CAfile", str(tnode.ca), "-verify_return_error", "-servername", "localhost"],
                           input="", capture_output=True, text=True, timeout=60)
        assert "Verify return code: 0 (ok)" in r.stdout, (proto, r.stdout[-800:], r.stderr[-800:])


def test_curl_ssl_reqd(tnode, tmp_path, curl):
    m = tmp_path / "m.eml"
    m.write_bytes(msg("via curl"))
    host, port = tnode.addrs["smtp"]
    r = subprocess.run([curl, "-sS", "--ssl-reqd", "--cacert", str(tnode.ca), "--url", f"smtp://{host}:{port}",
                        "--mail-from", "s@remote.test", "--mail-rcpt", ALICE, "-T", str(m)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    host, port = tnode.addrs["pop3"]
    r = subprocess.run([curl, "-sS", "--ssl-reqd", "--cacert", str(tnode.ca), "--user", f"{ALICE}:{PW}",
                        f"pop3://{host}:{port}/1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "via curl" in r.stdout, r.stderr
    host, port = tnode.addrs["imaps"]
    r = subprocess.run([curl, "-sS", "--cacert", str(tnode.ca), "--user", f"{ALICE}:{PW}",
                        f"imaps://{host}:{port}/INBOX;UID=1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "via curl" in r.stdout, r.stderr


@pytest.mark.skipif(not shutil.which("swaks"), reason="swaks not installed")
@pytest.mark.parametrize("mode", ["--tls", "--tls-on-connect"])
def test_swaks_tls(tnode, mode):
    host, port = tnode.addrs["smtp" if mode == "--tls" else "smtps"]
    r = subprocess.run(["swaks", "--server", f"{host}:{port}", "--from", "s@remote.test", "--to", ALICE,
                        mode, "--tls-verify", "--tls-ca-path", str(tnode.ca),
                        "--header", f"Subject: via swaks {mode}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-500:]
    assert f"via swaks {mode}" in subjects_pop3s(tnode)


@pytest.mark.skipif(not shutil.which("fetchmail"), reason="fetchmail not installed")
@pytest.mark.parametrize("mode", ["ssl", "sslproto tls1.2+"])
def test_fetchmail_checks_the_certificate(tnode, tmp_path, mode):
    for i in range(2):
        send_plain(tnode, msg(f"fm{i}"))
    port_key = "pop3s" if mode == "ssl" else "pop3"
    host, port = tnode.addrs[port_key]
    out = tmp_path / "fetched"
    rc = tmp_path / "fetchmailrc"
    rc.write_text(f'poll localhost port {port} protocol POP3\n'
                  f'  user "{ALICE}" password "{PW}" is "nobody" here\n'
                  f'  {mode} sslcertck sslcertfile "{tnode.ca}"\n'
                  f'  keep\n  mda "/bin/sh -c \'cat >> {out}\'"\n')
    rc.chmod(0o600)
    r = subprocess.run(["fetchmail", "-f", str(rc), "-a", "-v", "--idfile", str(tmp_path / "ids")],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-1000:]
    got = out.read_bytes()
    assert b"body of fm0" in got and b"body of fm1" in got


@pytest.mark.skipif(not shutil.which("mbsync"), reason="mbsync (isync) not installed")
@pytest.mark.parametrize("ssltype", ["IMAPS", "STARTTLS"])
def test_mbsync_checks_the_certificate(tnode, tmp_path, ssltype):
    send_plain(tnode, msg("for mbsync"))
    host, port = tnode.addrs["imaps" if ssltype == "IMAPS" else "imap"]
    maildir = tmp_path / "mail"
    maildir.mkdir()
    rc = tmp_path / "mbsyncrc"
    rc.write_text(f"""IMAPAccount quill
Host localhost
Port {port}
User {ALICE}
Pass "{PW}"
SSLType {ssltype}
CertificateFile {tnode.ca}

IMAPStore far
Account quill

MaildirStore near
Path {maildir}/
Inbox {maildir}/INBOX

Channel sync
Far :far:
Near :near:
Patterns INBOX
Create Near
SyncState *
""")
    r = subprocess.run(["mbsync", "-c", str(rc), "-a"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    pulled = [p for p in (maildir / "INBOX").rglob("*") if p.is_file() and "," in p.name]
    assert any(b"Subject: for mbsync" in p.read_bytes() for p in pulled), pulled


def send_plain(node, raw: bytes) -> None:
    host, port = node.addrs["smtp"]
    with smtplib.SMTP(host, port, timeout=TIMEOUT) as s:
        s.sendmail("s@remote.test", [ALICE], raw)


@pytest.mark.skipif(STORE != "native", reason="the handshake timeout is the listener's, whatever the store: run once (30 s), on the native run")
def test_time_to_handshake_is_bounded(tnode):
    """A client that connects to an implicit-TLS port and says nothing is
    cut off by the handshake timeout instead of holding the socket."""
    host, port = tnode.addrs["imaps"]
    with socket.create_connection((host, port), timeout=TIMEOUT) as raw:
        raw.settimeout(45)
        start = time.monotonic()
        assert raw.recv(10) == b""
        assert time.monotonic() - start < 40
