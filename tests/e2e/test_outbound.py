"""The outbound queue on a real `quill serve`, sending to a real Postfix found
through a real dnsmasq: a message submitted for another domain is queued,
looked up (MX, then the host's address through --dns), sent over STARTTLS,
and delivered into Postfix's Maildir; a recipient Postfix refuses gets the
sender a DSN (RFC 3464) in their mailbox; a domain whose server does not
answer keeps its message queued across a kill -9, visible and removable with
`quill queue`.

Postfix is a private instance on 127.0.0.2 (own config, queue and Maildir
under a temporary directory, stopped by its master's PID); dnsmasq answers
only for the test's domains. Both need root (CI runs as root)."""

from __future__ import annotations

import base64
import email
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
import tempfile
import time
from pathlib import Path

import pytest

from mailutil import free_dns_port, free_port, wait_for

LOCAL = "local.test"
ALICE = f"alice@{LOCAL}"
PW = "outbound pass"
REMOTE = "remote.example"
BOB = f"bob@{REMOTE}"
NOBODY = f"nobody@{REMOTE}"
DOWN = "down.example"
QUILL2 = "quill2.example"  # served by a second Quill on 127.0.0.4
TIMEOUT = 30.0
WAIT = 30.0  # for a queued message to arrive or be reported

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("postfix") or not shutil.which("dnsmasq"),
                                reason="needs root, Postfix and dnsmasq (scripts/test-deps.sh installs them)")


@pytest.fixture
def peer():
    """Postfix on 127.0.0.2 for remote.example (user bob), with STARTTLS,
    and dnsmasq naming its MX; down.example's MX is 127.0.0.3, where nothing
    listens."""
    base = Path(tempfile.mkdtemp(prefix="quill-e2e-postfix-"))
    os.chmod(base, 0o755)  # Postfix's daemons and the Maildir owner traverse it
    port = free_port("127.0.0.2")
    nobody = subprocess.run(["id", "-u", "nobody"], capture_output=True, text=True).stdout.strip()
    nogroup = subprocess.run(["id", "-g", "nobody"], capture_output=True, text=True).stdout.strip()
    conf, spool, data, vmail = base / "postfix", base / "spool", base / "data", base / "vmail"
    for d in (conf, spool, data, vmail):
        d.mkdir()
    shutil.chown(data, "postfix", "postfix")
    os.chown(vmail, int(nobody), int(nogroup))
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "2", "-keyout", str(conf / "key.pem"), "-out", str(conf / "cert.pem"),
                    "-subj", f"/CN=mx.{REMOTE}"], check=True, capture_output=True)
    (conf / "main.cf").write_text(f"""compatibility_level = 3.6
config_directory = {conf}
queue_directory = {spool}
data_directory = {data}
maillog_file = /var/log/postfix-quill-e2e-{base.name}.log
syslog_name = postfix-quill-e2e
myhostname = mx.{REMOTE}
mydestination =
alias_maps =
alias_database =
# Any address may be named in master.cf (127.0.0.2 below): Postfix wants
# inet_interfaces to name an interface's own address.
inet_interfaces = all
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
smtpd_relay_restrictions = permit_mynetworks, reject_unauth_destination
# Empty unless a test makes Postfix answer a recipient with 4xx (postfix_access).
smtpd_recipient_restrictions = check_recipient_access texthash:{conf}/access
biff = no
smtputf8_enable = no
virtual_mailbox_domains = {REMOTE}
virtual_mailbox_maps = texthash:{conf}/vmailbox
virtual_mailbox_base = {vmail}
virtual_uid_maps = static:{nobody}
virtual_gid_maps = static:{nogroup}
virtual_minimum_uid = 1
smtpd_tls_cert_file = {conf}/cert.pem
smtpd_tls_key_file = {conf}/key.pem
smtpd_tls_security_level = may
smtpd_tls_received_header = yes
""")
    (conf / "vmailbox").write_text(f"{BOB} {REMOTE}/bob/\n")
    (conf / "access").write_text("")
    services = ["pickup unix n - n 60 1 pickup", "cleanup unix n - n - 0 cleanup", "qmgr unix n - n 300 1 qmgr",
                "rewrite unix - - n - - trivial-rewrite", "bounce unix - - n - 0 bounce",
                "defer unix - - n - 0 bounce", "trace unix - - n - 0 bounce", "verify unix - - n - 1 verify",
                "proxymap unix - - n - - proxymap", "smtp unix - - n - - smtp", "relay unix - - n - - smtp",
                "error unix - - n - - error", "retry unix - - n - - error", "discard unix - - n - - discard",
                "virtual unix - n n - - virtual", "anvil unix - - n - 1 anvil", "scache unix - - n - 1 scache",
                "tlsmgr unix - - n 1000? 1 tlsmgr", "postlog unix-dgram n - n - 1 postlogd"]
    (conf / "master.cf").write_text(f"127.0.0.2:{port} inet n - n - - smtpd\n" + "\n".join(services) + "\n")
    def postfix(step: str) -> None:
        # Postfix says why it refuses a configuration on a terminal only.
        r = subprocess.run(["script", "-qec", f"postfix -c {conf} {step}", "/dev/null"], capture_output=True, text=True)
        assert r.returncode == 0, f"postfix {step}: {r.stdout}{r.stderr}"

    pidfile = spool / "pid" / "master.pid"

    def master_pid(not_pid: int = 0) -> int:
        return int(wait_for("Postfix's master pid",
                            lambda: pidfile.exists() and pidfile.read_text().strip() not in ("", str(not_pid))
                            and pidfile.read_text().strip(), 15))

    for step in ("check", "start"):
        postfix(step)
    pf_pid = master_pid()

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False

    def stop_mta() -> None:
        """Stops Postfix (the destination is down: nothing listens)."""
        postfix("stop")
        wait_for("Postfix to stop", lambda: not alive(pf_pid), 30)

    def start_mta() -> None:
        """Starts Postfix again on the same configuration and Maildir."""
        nonlocal pf_pid
        postfix("start")
        pf_pid = master_pid(pf_pid)

    dns_port = free_dns_port("127.0.0.1")
    procs = []

    def start_dns(*records: str) -> None:
        """Starts dnsmasq with the test's domains and extra records (the
        node only looks up at delivery, so a test may start it late)."""
        p = subprocess.Popen(["dnsmasq", "--no-daemon", "--no-resolv", "--no-hosts", f"--port={dns_port}",
                              "--listen-address=127.0.0.1", "--bind-interfaces", "--local=/example/", "--local=/test/",
                              f"--mx-host={REMOTE},mx.{REMOTE},10", f"--host-record=mx.{REMOTE},127.0.0.2",
                              f"--mx-host={DOWN},mx.{DOWN},10", f"--host-record=mx.{DOWN},127.0.0.3",
                              f"--mx-host={QUILL2},mx.{QUILL2},10", f"--host-record=mx.{QUILL2},127.0.0.4", *records],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(p)
        time.sleep(0.3)
        assert p.poll() is None, p.stderr.read()

    try:
        yield {"port": port, "dns": f"127.0.0.1:{dns_port}", "start_dns": start_dns,
               "maildir": vmail / REMOTE / "bob" / "new", "conf": conf, "stop": stop_mta, "start": start_mta}
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
        if alive(pf_pid):
            os.kill(pf_pid, signal.SIGTERM)  # the master stops its children
        for _ in range(50):
            if not alive(pf_pid):
                break
            time.sleep(0.1)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def node(quill_factory, peer):
    n = quill_factory("--dns", peer["dns"], "--outbound-port", str(peer["port"]), "--queue-retry", "1s")
    n.add_user(ALICE, PW)
    return n


def submit(node, rcpts: list[str], subject: str, implicit_tls: bool = False) -> None:
    """Submits on the submission port (STARTTLS), or on the submissions
    port with implicit TLS (RFC 8314)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    if implicit_tls:
        host, port = node.addrs["smtps"]
        conn = smtplib.SMTP_SSL(host, port, timeout=TIMEOUT, context=ctx)
    else:
        host, port = node.addrs["submission"]
        conn = smtplib.SMTP(host, port, timeout=TIMEOUT)
        conn.starttls(context=ctx)
    with conn as s:
        s.login(ALICE, PW)
        s.sendmail(ALICE, rcpts, f"From: {ALICE}\r\nTo: {', '.join(rcpts)}\r\nSubject: {subject}\r\n\r\nbody of {subject}\r\n".encode())


def mailbox(node) -> list[email.message.Message]:
    host, port = node.addrs["pop3"]
    p = poplib.POP3(host, port, timeout=TIMEOUT)
    p.user(ALICE)
    p.pass_(PW)
    out = [email.message_from_bytes(b"\r\n".join(p.retr(i)[1])) for i in range(1, len(p.list()[1]) + 1)]
    p.quit()
    return out


def queue_list(node) -> list[dict]:
    status, body = node.api("GET", "/api/queue")
    assert status == 200, body
    return json.loads(body)["entries"] or []


def test_submitted_mail_reaches_postfix_over_starttls_and_a_refusal_is_reported(node, peer):
    peer["start_dns"]()
    submit(node, [BOB, NOBODY], "to the remote")
    files = wait_for("the message in Postfix's Maildir", lambda: list(peer["maildir"].glob("*")) if peer["maildir"].exists() else [])
    raw = files[0].read_bytes()
    head = raw.split(b"\n\n", 1)[0]
    # Postfix's Received line: from Quill's EHLO name, under TLS.
    assert b"from quill.test" in head and b"using TLS" in head, head
    assert b"Subject: to the remote" in head and b"with ESMTPSA" in head, head
    assert b"Return-Path: <alice@local.test>" in head, head  # added by Postfix's final delivery, not relayed

    # The same through the submissions port (465, implicit TLS).
    submit(node, [BOB], "through 465", implicit_tls=True)
    wait_for("the second message", lambda: len(list(peer["maildir"].glob("*"))) == 2)

    # Postfix refused nobody@ at RCPT (550 5.1.1): the sender gets a DSN.
    reports = wait_for("the failure report", lambda: [m for m in mailbox(node) if m.get_content_type() == "multipart/report"])
    rep = reports[0]
    assert rep.get_param("report-type") == "delivery-status"
    assert rep["Auto-Submitted"] == "auto-replied" and "MAILER-DAEMON@quill.test" in rep["From"]
    status = [p for p in rep.walk() if p.get_content_type() == "message/delivery-status"][0]
    text = status.as_string()
    assert f"Final-Recipient: rfc822; {NOBODY}" in text and "Action: failed" in text and "Status: 5.1.1" in text, text
    assert f"Remote-MTA: dns; mx.{REMOTE}" in text and "Diagnostic-Code: smtp; 550 5.1.1" in text, text
    assert text.count("Final-Recipient:") == 1, text  # only the refused recipient is reported
    wait_for("an empty queue", lambda: queue_list(node) == [])


def postfix_access(peer, table: str) -> None:
    """Replaces the peer's recipient access table and reloads Postfix (its
    smtpd processes read texthash tables when they start)."""
    (peer["conf"] / "access").write_text(table)
    r = subprocess.run(["script", "-qec", f"postfix -c {peer['conf']} reload", "/dev/null"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_4xx_from_postfix_is_retried_until_it_accepts(node, peer):
    """Postfix answers bob with 450 4.7.1 (as a greylisting server would):
    the message stays queued with that reply and no report to the sender;
    once Postfix takes bob, a later retry delivers it."""
    peer["start_dns"]()
    postfix_access(peer, f"{BOB} 450 4.7.1 greylisted, try again later\n")
    submit(node, [BOB], "greylisted first")
    entry = wait_for("two refused attempts", lambda: [e for e in queue_list(node) if e["recipients"][0]["attempts"] >= 2])[0]
    r = entry["recipients"][0]
    assert r["state"] == "queued" and "450 4.7.1" in r["last_reply"] and "greylisted" in r["last_reply"], r
    assert not (peer["maildir"].exists() and list(peer["maildir"].glob("*")))
    postfix_access(peer, "")
    files = wait_for("the message at Postfix", lambda: list(peer["maildir"].glob("*")) if peer["maildir"].exists() else [])
    assert b"Subject: greylisted first" in files[0].read_bytes()
    wait_for("an empty queue", lambda: queue_list(node) == [] or None)
    assert [m for m in mailbox(node) if m.get_content_type() == "multipart/report"] == []


def test_unreachable_domain_stays_queued_across_kill9_and_can_be_deleted(node, peer):
    peer["start_dns"]()
    submit(node, [f"carol@{DOWN}"], "to a dead server")
    entry = wait_for("a failed attempt", lambda: [e for e in queue_list(node) if e["recipients"][0]["attempts"] > 0])[0]
    r = entry["recipients"][0]
    assert r["state"] == "queued" and r["address"] == f"carol@{DOWN}", entry
    assert r["last_reply"].startswith("4.4.1 connection to mx.down.example [127.0.0.3:"), r
    assert entry["from"] == ALICE and entry["size"] > 0

    # The console counts it on the cluster page and lists it on the queue's.
    status, html = node.api("GET", "/")
    assert status == 200 and b"1 message(s) waiting to leave" in html, html[-2000:]
    status, html = node.api("GET", "/queue")
    assert status == 200 and b"Outbound queue" in html and entry["id"][:8].encode() in html, html[-2000:]

    node.kill9()
    node.start()
    out = node.cli("queue", "list").stdout
    assert entry["id"] in out and f"carol@{DOWN}" in out, out
    shown = json.loads(node.cli("queue", "show", entry["id"]).stdout)
    assert shown["recipients"][0]["attempts"] >= r["attempts"], shown

    node.cli("queue", "retry", entry["id"])
    node.cli("queue", "delete", entry["id"])
    assert queue_list(node) == []
    status, _ = node.api("GET", "/api/queue/" + entry["id"])
    assert status == 404
    r = node.cli("queue", "show", "0" * 32, check=False)
    assert r.returncode != 0 and "no such queue entry" in r.stderr, r.stderr
    # A deleted message is not reported to its sender.
    time.sleep(2)
    assert [m for m in mailbox(node) if m.get_content_type() == "multipart/report"] == []


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def issue_cert(ca: Path, name: str, out: Path) -> tuple[Path, Path]:
    """A P-256 key and a certificate for name signed by the test CA at ca
    (ca.pem, ca.key)."""
    key, csr, cert = out / f"{name}.key", out / f"{name}.csr", out / f"{name}.pem"
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
            "-out", str(csr), "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca / "ca.pem"), "-CAkey", str(ca / "ca.key"),
            "-CAcreateserial", "-days", "2", "-copy_extensions", "copy", "-out", str(cert))
    return key, cert


def test_mta_sts_enforce_holds_mail_until_postfix_has_a_trusted_certificate(quill_factory, peer, tmp_path):
    """MTA-STS (RFC 8461) against the real Postfix: remote.example publishes
    mode: enforce for mx.remote.example. While Postfix shows its self-signed
    certificate the message is held with 4.7.5 and never sent; once Postfix
    has a certificate from a CA the node trusts (SSL_CERT_FILE), the next
    retry delivers it over TLS."""
    import http.server
    import threading

    ca = tmp_path / "ca"
    ca.mkdir()
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
            "-keyout", str(ca / "ca.key"), "-out", str(ca / "ca.pem"), "-subj", "/CN=Quill e2e test CA")
    sts_key, sts_cert = issue_cert(ca, f"mta-sts.{REMOTE}", ca)
    policy = f"version: STSv1\nmode: enforce\nmx: mx.{REMOTE}\nmax_age: 86400\n".encode()
    fetched = []

    class Policy(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            fetched.append(self.path)
            ok = self.path == "/.well-known/mta-sts.txt"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(policy) if ok else 0))
            self.end_headers()
            if ok:
                self.wfile.write(policy)

        def log_message(self, *args):
            pass

    sts_port = free_port("127.0.0.5")
    srv = http.server.ThreadingHTTPServer(("127.0.0.5", sts_port), Policy)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(str(sts_cert), str(sts_key))
    srv.socket = tls.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        peer["start_dns"](f"--host-record=mta-sts.{REMOTE},127.0.0.5", f"--txt-record=_mta-sts.{REMOTE},v=STSv1; id=20261124")
        node = quill_factory("--dns", peer["dns"], "--outbound-port", str(peer["port"]), "--queue-retry", "1s",
                             "--mta-sts-port", str(sts_port), env={"SSL_CERT_FILE": str(ca / "ca.pem")})
        node.add_user(ALICE, PW)
        submit(node, [BOB], "only over verified TLS")
        entry = wait_for("an attempt refused by the policy",
                         lambda: [e for e in queue_list(node) if e["recipients"][0]["attempts"] >= 2])[0]
        r = entry["recipients"][0]
        assert r["state"] == "queued" and r["last_reply"].startswith("4.7.5"), r
        assert fetched and set(fetched) == {"/.well-known/mta-sts.txt"}, fetched
        assert not (peer["maildir"].exists() and list(peer["maildir"].glob("*"))), "delivered despite the policy"

        key, cert = issue_cert(ca, f"mx.{REMOTE}", ca)
        shutil.copy(key, peer["conf"] / "key.pem")
        shutil.copy(cert, peer["conf"] / "cert.pem")
        res = subprocess.run(["script", "-qec", f"postfix -c {peer['conf']} reload", "/dev/null"], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr
        files = wait_for("the message at Postfix", lambda: list(peer["maildir"].glob("*")) if peer["maildir"].exists() else [])
        got = files[0].read_bytes()
        assert b"Subject: only over verified TLS" in got and b"(using TLS" in got, got[:1500]
        wait_for("the queue empty", lambda: queue_list(node) == [] or None)
    finally:
        srv.shutdown()
        srv.server_close()


def test_delay_warning_then_expiry_report_to_the_sender(quill_factory, peer):
    """A message whose MX never answers: after --queue-warn the sender gets
    one delay warning (RFC 3464 Action: delayed, Will-Retry-Until), after
    --queue-lifetime a failure report (5.4.7) with the last reply, and the entry
    leaves the queue; no further reports come."""
    peer["start_dns"]()
    node = quill_factory("--dns", peer["dns"], "--outbound-port", str(peer["port"]), "--queue-retry", "1s",
                         "--queue-warn", "3s", "--queue-lifetime", "8s")
    node.add_user(ALICE, PW)
    submit(node, [f"carol@{DOWN}"], "into the void")

    def reports():
        return [m for m in mailbox(node) if m.get_content_type() == "multipart/report"]

    def status_of(m) -> str:
        for part in m.walk():
            if part.get_content_type() == "message/delivery-status":
                return "".join(str(p) for p in part.get_payload())
        return ""

    [warning] = wait_for("the delay warning", reports, 20)
    st = status_of(warning)
    assert "Action: delayed" in st and f"carol@{DOWN}" in st and "Will-Retry-Until:" in st, st
    assert warning["Auto-Submitted"] == "auto-replied" and "<MAILER-DAEMON@" in warning["From"], warning["From"]
    assert queue_list(node), "the entry left the queue at the warning"

    both = wait_for("the failure report", lambda: (lambda r: r if len(r) == 2 else None)(reports()), 30)
    failed = [m for m in both if "Action: failed" in status_of(m)]
    assert len(failed) == 1, [status_of(m) for m in both]
    st = status_of(failed[0])
    # RFC 3463 X.4.7: delivery time expired; the last reply is the diagnostic.
    assert "Status: 5.4.7" in st and "last reply: 4.4.1 connection to mx.down.example" in st, st
    assert "into the void" in failed[0].as_string(), failed[0].as_string()[:2000]
    wait_for("the queue empty", lambda: queue_list(node) == [] or None)
    time.sleep(3)
    assert len(reports()) == 2, "a report came twice"


def inbound(node, mail_from: str, rcpt: str, raw: bytes) -> None:
    """Hands a message to the node's port for other servers' mail."""
    host, port = node.addrs["smtp"]
    with smtplib.SMTP(host, port, timeout=TIMEOUT) as s:
        s.ehlo("mx.elsewhere.test")
        s.sendmail(mail_from, [rcpt], raw)


def test_dkim_signed_mail_passes_dmarc_and_a_forgery_is_refused(node, peer):
    """`quill dkim add` makes the key; what Postfix receives is signed; fed
    back to Quill's own port 25 (from 127.0.0.1, which local.test's SPF
    allows) it passes SPF, DKIM and DMARC; a message claiming to be from
    local.test without the signature, from a sender SPF does not cover, is
    refused under p=reject."""
    records = dkim_records(node, "e2e")
    assert any(f"e2er._domainkey.{LOCAL},v=DKIM1; k=rsa; p=" in r for r in records), records
    assert any(f"e2ee._domainkey.{LOCAL},v=DKIM1; k=ed25519; p=" in r for r in records), records
    listed = node.cli("dkim", "list").stdout
    assert LOCAL in listed and "e2er" in listed and "ed25519" in listed, listed
    peer["start_dns"](*records,
                      f"--txt-record={LOCAL},v=spf1 ip4:127.0.0.1 -all",
                      f"--txt-record=_dmarc.{LOCAL},v=DMARC1; p=reject",
                      "--txt-record=other.test,v=spf1 -all",
                      "--txt-record=_dmarc.soft.test,v=DMARC1; p=quarantine")
    submit(node, [BOB], "signed")
    files = wait_for("the signed message at Postfix", lambda: list(peer["maildir"].glob("*")) if peer["maildir"].exists() else [])
    raw = files[0].read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    assert raw.count(b"DKIM-Signature: ") == 2 and b"d=local.test" in raw and b"s=e2er" in raw and b"s=e2ee" in raw, raw[:1500]

    inbound(node, ALICE, ALICE, raw)
    [back] = wait_for("the message back in alice's mailbox", lambda: [m for m in mailbox(node) if m["Subject"] == "signed"])
    ar = back["Authentication-Results"]
    assert ar.startswith("quill.test;"), ar
    for want in ("spf=pass", "dkim=pass", "header.d=local.test", "dmarc=pass"):
        assert want in ar, ar
    assert ar.count("dkim=pass") == 2, ar  # rsa-sha256 and ed25519-sha256 both verified

    forged = f"From: {ALICE}\r\nTo: {ALICE}\r\nSubject: forged\r\nAuthentication-Results: quill.test; dmarc=pass\r\n\r\npay me\r\n".encode()
    with pytest.raises(smtplib.SMTPDataError) as e:
        inbound(node, "x@other.test", ALICE, forged)
    assert e.value.smtp_code == 550 and b"DMARC policy of local.test" in e.value.smtp_error, e.value

    # p=quarantine: taken, but into the Junk mailbox (RFC 6154 \Junk).
    suspect = b"From: someone@soft.test\r\nTo: alice@local.test\r\nSubject: suspect\r\n\r\nclick here\r\n"
    inbound(node, "x@other.test", ALICE, suspect)
    assert junk_subjects(node) == ["suspect"]
    assert [m for m in mailbox(node) if m["Subject"] == "suspect"] == []


def dkim_records(node, base: str) -> list[str]:
    """`quill domain dkim` (the same as `quill dkim add`) for LOCAL; the
    dnsmasq arguments that publish it."""
    out = node.cli("domain", "dkim", LOCAL, "--selector", base).stdout
    args = []
    for line in out.splitlines():
        if "._domainkey." in line:
            name, rec = line.split('. IN TXT "', 1)
            args.append(f"--txt-record={name},{rec.rstrip(chr(34))}")
    assert len(args) == 2, out
    return args


def test_a_second_quill_receives_verifies_and_keeps_the_bytes(quill_factory, peer):
    """Quill to Quill: the sender's queue finds the receiver by MX, the
    receiver checks SPF, both DKIM signatures and DMARC, and the body
    arrives byte for byte."""
    sender = quill_factory("--dns", peer["dns"], "--outbound-port", str(peer["port"]), "--queue-retry", "1s")
    sender.add_user(ALICE, PW)
    receiver = quill_factory("--dns", peer["dns"], "--smtp", f"127.0.0.4:{peer['port']}")
    carol = f"carol@{QUILL2}"
    receiver.add_user(carol, PW)
    peer["start_dns"](*dkim_records(sender, "q2"),
                      f"--txt-record={LOCAL},v=spf1 ip4:127.0.0.0/8 -all",
                      f"--txt-record=_dmarc.{LOCAL},v=DMARC1; p=reject")
    body = "line one\r\n\r\n  indented line, trailing space \r\n.dot-started line\r\n" + "x" * 900 + "\r\n"
    host, port = sender.addrs["submission"]
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with smtplib.SMTP(host, port, timeout=TIMEOUT) as s:
        s.starttls(context=ctx)
        s.login(ALICE, PW)
        s.sendmail(ALICE, [carol], f"From: {ALICE}\r\nTo: {carol}\r\nSubject: to quill2\r\n\r\n{body}".encode())

    def inbox():
        h, p = receiver.addrs["pop3"]
        c = poplib.POP3(h, p, timeout=TIMEOUT)
        c.user(carol)
        c.pass_(PW)
        out = [b"\r\n".join(c.retr(i)[1]) for i in range(1, len(c.list()[1]) + 1)]
        c.quit()
        return out

    [raw] = wait_for("the message at the second Quill", inbox)
    head, got = raw.split(b"\r\n\r\n", 1)
    # POP3 dot-stuffing is undone by poplib; the last CRLF is the terminator's.
    assert got + b"\r\n" == body.encode(), got
    ar = email.message_from_bytes(raw)["Authentication-Results"]
    assert ar.startswith("quill.test;") and ar.count("dkim=pass") == 2, ar
    assert "spf=pass" in ar and "dmarc=pass" in ar and "header.from=local.test" in ar, ar


def raw_mailbox(node) -> list[bytes]:
    """alice's messages over POP3, as the bytes Quill stored."""
    host, port = node.addrs["pop3"]
    p = poplib.POP3(host, port, timeout=TIMEOUT)
    p.user(ALICE)
    p.pass_(PW)
    out = [b"\r\n".join(p.retr(i)[1]) + b"\r\n" for i in range(1, len(p.list()[1]) + 1)]
    p.quit()
    return out


class Forwarder:
    """A forwarder at fwd.test that seals with dkimpy's ARC (an independent
    implementation) under its own RSA key."""

    def __init__(self):
        self.key = subprocess.run(["openssl", "genrsa", "-traditional", "2048"], capture_output=True, check=True).stdout
        der = subprocess.run(["openssl", "rsa", "-pubout", "-outform", "DER"], input=self.key,
                             capture_output=True, check=True).stdout
        self.record = f"--txt-record=fwd._domainkey.fwd.test,v=DKIM1; k=rsa; p={base64.b64encode(der).decode()}"

    def seal(self, subject: str, sender: str = "ann@origin.test") -> bytes:
        import dkim  # dkimpy (scripts/test-deps.sh)
        msg = (f"Authentication-Results: mx.fwd.test; spf=pass smtp.mailfrom={sender}\r\n"
               f"From: Ann <{sender}>\r\nTo: list@fwd.test\r\nSubject: {subject}\r\n"
               f"Date: Tue, 24 Nov 2026 10:00:00 +0000\r\nMessage-ID: <{subject}@origin.test>\r\n\r\n"
               f"Hello  list \r\n").encode()
        return b"".join(dkim.arc_sign(msg, b"fwd", b"fwd.test", self.key, b"mx.fwd.test")) + msg


def test_arc_chains_cross_checked_with_dkimpy(node, peer):
    """ARC (RFC 8617) against dkimpy, an independent implementation. A
    forwarder's chain that dkimpy sealed is reported arc=pass, and arc=fail
    once the body changes after the seal. Quill adds its own set with
    local.test's key: cv=pass after the good chain and cv=fail after the
    broken one, and dkimpy verifies both chains as extended."""
    import dkim

    fwd = Forwarder()
    records = dkim_records(node, "arc") + [fwd.record]
    peer["start_dns"](*records)
    zone = dict(r.removeprefix("--txt-record=").split(",", 1) for r in records)

    def dnsfunc(name, timeout=5):
        return zone.get(name.decode().rstrip("."), "").encode()

    good = fwd.seal("sealed-once")
    assert dkim.arc_verify(good, dnsfunc=dnsfunc)[0] == b"pass"
    inbound(node, "list@fwd.test", ALICE, good)
    inbound(node, "list@fwd.test", ALICE, fwd.seal("changed-after").replace(b"Hello  list", b"Hello  all"))

    stored = wait_for("both forwarded messages in alice's mailbox",
                      lambda: (lambda got: got if len(got) == 2 else None)(
                          {email.message_from_bytes(r)["Subject"]: r for r in raw_mailbox(node)
                           if b"@origin.test" in r}))
    for subject, want in (("sealed-once", b"pass"), ("changed-after", b"fail")):
        raw = stored[subject]
        ar = email.message_from_bytes(raw)["Authentication-Results"]
        assert ar.startswith("quill.test;") and f"arc={want.decode()}" in ar, ar
        # Quill's set is its newest, below the trace fields (Return-Path first).
        assert raw.startswith(b"Return-Path: ") and b"\r\nARC-Seal: i=2; a=rsa-sha256; " in raw, raw[:600]
        assert f"cv={want.decode()};".encode() in raw.split(b"ARC-Message-Signature", 1)[0], raw[:300]
        cv, sets, why = dkim.arc_verify(raw, dnsfunc=dnsfunc)
        if want == b"fail":
            # dkimpy stops at Quill's cv=fail seal (a chain ended).
            assert cv != b"pass" and "ARC-Seal[2] reported failure" in why, (subject, cv, why, sets)
        else:
            assert cv == want, (subject, cv, why, sets)
            assert [s["instance"] for s in sets] == [2, 1] and all(s["ams-valid"] and s["as-valid"] for s in sets), sets
            assert sets[0]["as-domain"] == LOCAL.encode() and sets[0]["ams-domain"] == LOCAL.encode(), sets


def test_domain_policy_softens_dmarc_and_trusts_an_arc_sealer(node, peer):
    """`quill domain policy`: mail from a p=reject domain that fails DMARC
    is refused by default, goes to Junk under --dmarc quarantine, to the
    inbox under --dmarc accept, and with --trust-arc fwd.test a copy that
    fwd.test forwarded with a passing ARC chain is let in while one without
    the chain is still refused."""
    fwd = Forwarder()
    peer["start_dns"](fwd.record, "--txt-record=_dmarc.strict.test,v=DMARC1; p=reject",
                      "--txt-record=strict.test,v=spf1 -all")
    ann = "ann@strict.test"

    def plain(subject):
        return f"From: {ann}\r\nTo: {ALICE}\r\nSubject: {subject}\r\n\r\nhello\r\n".encode()

    def refused(raw):
        with pytest.raises(smtplib.SMTPDataError) as e:
            inbound(node, "list@fwd.test", ALICE, raw)
        assert e.value.smtp_code == 550 and b"DMARC policy of strict.test" in e.value.smtp_error, e.value

    refused(plain("by default"))
    node.cli("domain", "policy", LOCAL, "--dmarc", "quarantine")
    inbound(node, "list@fwd.test", ALICE, plain("quarantined"))
    node.cli("domain", "policy", LOCAL, "--dmarc", "accept")
    inbound(node, "list@fwd.test", ALICE, plain("accepted"))
    out = node.cli("domain", "policy", LOCAL, "--trust-arc", "fwd.test").stdout
    assert "reject" in out and "fwd.test" in out, out
    listed = node.cli("domain", "policies").stdout
    assert LOCAL in listed and "fwd.test" in listed, listed
    inbound(node, "list@fwd.test", ALICE, fwd.seal("through the list", ann))
    refused(plain("not through the list"))
    node.cli("domain", "policy", LOCAL, "--default")
    refused(fwd.seal("after the default again", ann))

    assert junk_subjects(node) == ["quarantined"]
    inbox = {m["Subject"]: m for m in mailbox(node)}
    assert set(inbox) == {"accepted", "through the list"}, list(inbox)
    ar = inbox["through the list"]["Authentication-Results"]
    assert "arc=pass" in ar and "dmarc=fail" in ar, ar


def junk_subjects(node) -> list[str]:
    host, port = node.addrs["imap"]
    with imaplib.IMAP4(host, port, timeout=TIMEOUT) as c:
        c.login(ALICE, PW)
        typ, _ = c.select("Junk", readonly=True)
        assert typ == "OK"
        typ, data = c.fetch("1:*", "(BODY.PEEK[HEADER.FIELDS (SUBJECT)])")
        return [email.message_from_bytes(d[1])["Subject"] for d in data if isinstance(d, tuple)]


@pytest.mark.skipif(not shutil.which("neomutt"), reason="neomutt not installed")
def test_neomutt_sends_through_587(node, peer, tmp_path):
    """A real mail client: neomutt in batch mode submits over STARTTLS with
    AUTH, trusting the node's certificate; Postfix gets the message signed
    (both signatures verified by dkimpy, an independent verifier), and fed
    back to Quill it passes SPF and DMARC (p=reject) as well."""
    import dkim  # dkimpy (scripts/test-deps.sh)

    records = dkim_records(node, "mutt")
    peer["start_dns"](*records, f"--txt-record={LOCAL},v=spf1 ip4:127.0.0.1 -all",
                      f"--txt-record=_dmarc.{LOCAL},v=DMARC1; p=reject; adkim=s; aspf=s")
    zone = dict(r.removeprefix("--txt-record=").split(",", 1) for r in records)
    host, port = node.addrs["submission"]
    muttrc = tmp_path / "muttrc"
    muttrc.write_text(f"""set from="{ALICE}"
set realname="Alice"
set smtp_url="smtp://{ALICE.replace('@', '%40')}@{host}:{port}/"
set smtp_pass="{PW}"
set smtp_authenticators="plain"
set ssl_starttls=yes
set ssl_force_tls=yes
set certificate_file="{node.data_dir / 'tls' / 'selfsigned.crt'}"
set record=""
set use_from=yes
""")
    r = subprocess.run(["neomutt", "-n", "-F", str(muttrc), "-s", "via neomutt", "--", BOB],
                       input="hello from neomutt\n", capture_output=True, text=True, timeout=60,
                       env={**os.environ, "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stdout + r.stderr
    files = wait_for("neomutt's message at Postfix", lambda: list(peer["maildir"].glob("*")) if peer["maildir"].exists() else [])
    raw = files[0].read_bytes()
    assert b"Subject: via neomutt" in raw and b"hello from neomutt" in raw and b"with ESMTPSA" in raw, raw[:1500]
    raw = raw.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    assert b"from quill.test (localhost [127.0.0.1])" in raw, raw[:1500]  # the address SPF names
    d = dkim.DKIM(raw)
    sigs = [h for h in d.headers if h[0].lower() == b"dkim-signature"]
    assert len(sigs) == 2, sigs
    for i in range(len(sigs)):
        assert d.verify(idx=i, dnsfunc=lambda name, timeout=5: zone.get(name.decode().rstrip("."), "").encode()), (i, sigs[i])
    inbound(node, ALICE, ALICE, raw)
    [back] = wait_for("neomutt's message back at Quill", lambda: [m for m in mailbox(node) if m["Subject"] == "via neomutt"])
    ar = back["Authentication-Results"]
    for want in ("spf=pass", "dmarc=pass", "header.from=local.test"):
        assert want in ar, ar
    assert ar.count("dkim=pass") == 2, ar
