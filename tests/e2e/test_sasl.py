"""SASL on a real `quill serve` (issue 11): SCRAM-SHA-256 (RFC 7677) driven
by scramp (the SCRAM library of pg8000) through Python's imaplib and
poplib, AUTH LOGIN and PLAIN driven by curl, over IMAPS and POP3S. The SCRAM
keys are the ones the node derived when the password was set, so these
tests also show that a password change replaces them."""

from __future__ import annotations

import base64
import imaplib
import poplib
import smtplib
import ssl
import subprocess

import pytest
from scramp import ScramClient, ScramException

DOMAIN = "sasl.test"
ALICE = f"alice@{DOMAIN}"
PW = "sasl pass"
TIMEOUT = 30.0


@pytest.fixture
def node(quill_factory):
    n = quill_factory()
    n.add_user(ALICE, PW)
    return n


def tls_ctx() -> ssl.SSLContext:
    # The node's own self-signed certificate: trust is tested in
    # test_tls.py; here the subject is authentication.
    c = ssl.create_default_context()
    c.check_hostname = False
    c.verify_mode = ssl.CERT_NONE
    return c


class ScramExchange:
    """imaplib's authobject for SCRAM-SHA-256: called with each challenge
    (decoded), returns each response (encoded by imaplib)."""

    def __init__(self, user: str, pw: str):
        self.c = ScramClient(["SCRAM-SHA-256"], user, pw)
        self.step = 0
        self.server_verified = False

    def __call__(self, challenge: bytes) -> bytes:
        self.step += 1
        if self.step == 1:
            return self.c.get_client_first().encode()
        if self.step == 2:
            self.c.set_server_first(challenge.decode())
            return self.c.get_client_final().encode()
        self.c.set_server_final(challenge.decode())  # raises unless the server knows the keys
        self.server_verified = True
        return b""


def imap_scram(node, user: str, pw: str) -> tuple[imaplib.IMAP4_SSL, ScramExchange]:
    host, port = node.addrs["imaps"]
    m = imaplib.IMAP4_SSL(host, port, ssl_context=tls_ctx(), timeout=TIMEOUT)
    assert "AUTH=SCRAM-SHA-256" in m.capabilities, m.capabilities
    ex = ScramExchange(user, pw)
    m.authenticate("SCRAM-SHA-256", ex)
    return m, ex


def test_imap_scram_sha256(node):
    m, ex = imap_scram(node, ALICE, PW)
    assert ex.server_verified, "the server's final message was not checked"
    assert m.select("INBOX")[0] == "OK"
    m.logout()


def test_imap_scram_wrong_password_and_unknown_user(node):
    for user, pw in ((ALICE, "not it"), (f"nobody@{DOMAIN}", PW)):
        with pytest.raises(imaplib.IMAP4.error, match="AUTHENTICATIONFAILED"):
            imap_scram(node, user, pw)


def test_scram_keys_follow_a_password_change(node):
    node.cli("user", "passwd", ALICE, "--password", "new sasl pass")
    with pytest.raises(imaplib.IMAP4.error, match="AUTHENTICATIONFAILED"):
        imap_scram(node, ALICE, PW)
    m, ex = imap_scram(node, ALICE, "new sasl pass")
    assert ex.server_verified
    m.logout()


def pop3_auth(p: poplib.POP3_SSL, mech: str, steps) -> bytes:
    """Runs AUTH mech over poplib: steps is called with each challenge
    (decoded) and returns each response; returns the final reply."""
    p._putcmd(f"AUTH {mech}")
    while True:
        resp = p._getline()[0]
        if not resp.startswith(b"+ ") and resp != b"+":
            return resp
        challenge = base64.b64decode(resp[2:])
        p._putcmd(base64.b64encode(steps(challenge)).decode())


def test_pop3_scram_sha256(node):
    host, port = node.addrs["pop3s"]
    p = poplib.POP3_SSL(host, port, timeout=TIMEOUT, context=tls_ctx())
    assert "SCRAM-SHA-256" in p.capa().get("SASL", []), p.capa()
    ex = ScramExchange(ALICE, PW)
    reply = pop3_auth(p, "SCRAM-SHA-256", ex)
    assert reply.startswith(b"+OK"), reply
    assert ex.server_verified
    assert p.stat() == (0, 0)
    p.quit()


def test_pop3_scram_wrong_password(node):
    host, port = node.addrs["pop3s"]
    p = poplib.POP3_SSL(host, port, timeout=TIMEOUT, context=tls_ctx())
    ex = ScramExchange(ALICE, "wrong")
    reply = pop3_auth(p, "SCRAM-SHA-256", ex)
    assert reply.startswith(b"-ERR [AUTH]"), reply
    assert not ex.server_verified
    with pytest.raises(ScramException):
        ex.c.set_server_final("v=AAAA")  # nothing the client could accept
    p.quit()


@pytest.mark.parametrize("mech", ["LOGIN", "PLAIN"])
@pytest.mark.parametrize("proto", ["imaps", "pop3s"])
def test_curl_auth_mechanisms(node, curl, proto, mech):
    host, port = node.addrs[proto]
    url = f"{proto}://{host}:{port}/" + ("INBOX" if proto == "imaps" else "")
    r = subprocess.run([curl, "-sS", "-k", "--max-time", "30", "--login-options", f"AUTH={mech}",
                        "-u", f"{ALICE}:{PW}", "-v", url], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"AUTH{'ENTICATE' if proto == 'imaps' else ''} {mech}" in r.stderr, r.stderr[-2000:]
    r = subprocess.run([curl, "-sS", "-k", "--max-time", "30", "--login-options", f"AUTH={mech}",
                        "-u", f"{ALICE}:wrong", url], capture_output=True, text=True, timeout=60)
    assert r.returncode == 67, (r.returncode, r.stderr)  # CURLE_LOGIN_DENIED


def smtps(node) -> smtplib.SMTP_SSL:
    host, port = node.addrs["smtps"]
    s = smtplib.SMTP_SSL(host, port, timeout=TIMEOUT, context=tls_ctx())
    s.ehlo("client.test")
    return s


def test_smtp_auth_on_submissions(node):
    s = smtps(node)
    assert s.has_extn("auth"), s.esmtp_features
    assert s.esmtp_features["auth"].split() == ["SCRAM-SHA-256", "PLAIN", "LOGIN"]
    code, _ = s.login(ALICE, PW)  # smtplib picks PLAIN
    assert code == 235
    s.quit()
    s = smtps(node)
    s.user, s.password = ALICE, PW  # what smtplib's LOGIN authobject reads
    code, _ = s.auth("LOGIN", s.auth_login, initial_response_ok=False)
    assert code == 235
    s.quit()
    s = smtps(node)
    with pytest.raises(smtplib.SMTPAuthenticationError) as e:
        s.login(ALICE, "wrong")
    assert e.value.smtp_code == 535
    s.quit()


def test_smtp_auth_scram(node):
    for pw, ok in ((PW, True), ("wrong", False)):
        s = smtps(node)
        ex = ScramExchange(ALICE, pw)

        def step(challenge=None):
            return ex(challenge or b"").decode()

        if ok:
            code, _ = s.auth("SCRAM-SHA-256", step)
            assert code == 235 and ex.server_verified
        else:
            with pytest.raises(smtplib.SMTPAuthenticationError):
                s.auth("SCRAM-SHA-256", step)
        s.quit()


def test_smtp_port_for_other_servers_offers_no_auth(node):
    host, port = node.addrs["smtp"]
    with smtplib.SMTP(host, port, timeout=TIMEOUT) as s:
        s.ehlo("client.test")
        s.starttls(context=tls_ctx())
        s.ehlo("client.test")
        assert not s.has_extn("auth"), s.esmtp_features


def test_swaks_auth_login(node):
    host, port = node.addrs["smtps"]
    r = subprocess.run(["swaks", "--server", f"{host}:{port}", "--tls-on-connect", "--auth", "LOGIN",
                        "--auth-user", ALICE, "--auth-password", PW, "--from", ALICE, "--to", ALICE,
                        "--quit-after", "AUTH"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "235 " in r.stdout, r.stdout[-2000:] + r.stderr[-500:]
