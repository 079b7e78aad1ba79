"""Message submission (RFC 6409) on a real `quill serve`: Python's smtplib and
swaks submit over STARTTLS with AUTH; the sender must be the user's own,
Date and Message-ID are added when missing, local recipients get the mail
(read back over POP3), and what is not allowed is refused with 5.7.x."""

from __future__ import annotations

import base64
import poplib
import smtplib
import ssl
import subprocess

import pytest

DOMAIN = "submit.test"
ALICE, BOB = f"alice@{DOMAIN}", f"bob@{DOMAIN}"
PW = "submit pass"
TIMEOUT = 30.0


@pytest.fixture
def node(quill_factory):
    n = quill_factory()
    n.add_user(ALICE, PW)
    n.add_user(BOB, PW)
    return n


def tls_ctx() -> ssl.SSLContext:
    c = ssl.create_default_context()
    c.check_hostname = False
    c.verify_mode = ssl.CERT_NONE  # the node's self-signed certificate; trust is test_tls.py's subject
    return c


def submit(node) -> smtplib.SMTP:
    host, port = node.addrs["submission"]
    s = smtplib.SMTP(host, port, timeout=TIMEOUT)
    s.ehlo("client.test")
    s.starttls(context=tls_ctx())
    s.ehlo("client.test")
    return s


def messages(node, user: str) -> list[bytes]:
    host, port = node.addrs["pop3"]
    p = poplib.POP3(host, port, timeout=TIMEOUT)
    p.user(user)
    p.pass_(PW)
    out = [b"\r\n".join(p.retr(i)[1]) for i in range(1, len(p.list()[1]) + 1)]
    p.quit()
    return out


def test_submit_to_a_local_user(node):
    s = submit(node)
    assert "auth" in s.esmtp_features
    s.login(ALICE, PW)
    s.sendmail(ALICE, [BOB], f"From: Alice <{ALICE}>\r\nTo: {BOB}\r\nSubject: hello\r\n\r\nhi bob\r\n".encode())
    s.quit()
    [raw] = messages(node, BOB)
    head = raw.split(b"\r\n\r\n", 1)[0]
    assert b"with ESMTPSA" in head, head        # RFC 3848: TLS and AUTH
    assert b"\r\nDate: " in head and b"\r\nMessage-ID: <" in head, head
    assert raw.endswith(b"hi bob"), raw[-40:]


def test_auth_required_and_sender_checked(node):
    s = submit(node)
    with pytest.raises(smtplib.SMTPSenderRefused) as e:
        s.sendmail(ALICE, [BOB], b"From: x\r\n\r\nx\r\n")
    assert e.value.smtp_code == 530
    s.login(ALICE, PW)
    with pytest.raises(smtplib.SMTPSenderRefused) as e:
        s.sendmail(BOB, [BOB], b"From: bob@submit.test\r\n\r\nx\r\n")
    assert e.value.smtp_code == 553 and b"5.7.1" in e.value.smtp_error
    with pytest.raises(smtplib.SMTPDataError) as e:
        s.sendmail(ALICE, [BOB], f"From: {BOB}\r\n\r\nforged author\r\n".encode())
    assert e.value.smtp_code == 553
    s.quit()
    assert messages(node, BOB) == []


def test_starttls_offered(node):
    host, port = node.addrs["submission"]
    with smtplib.SMTP(host, port, timeout=TIMEOUT) as s:
        s.ehlo("client.test")
        assert s.has_extn("starttls")


def test_swaks_submits_with_starttls_and_auth(node):
    host, port = node.addrs["submission"]
    r = subprocess.run(["swaks", "--server", f"{host}:{port}", "--tls", "--auth", "PLAIN",
                        "--auth-user", ALICE, "--auth-password", PW, "--from", ALICE, "--to", BOB,
                        "--header", f"From: {ALICE}", "--header", "Subject: via swaks"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-500:]
    [raw] = messages(node, BOB)
    assert b"Subject: via swaks" in raw


def test_per_user_limits(quill_factory):
    """--submit-max-recipients bounds one message's recipients (452 4.5.3
    for the one too many); --submit-max-per-hour bounds a user's messages
    (451 4.7.1 at MAIL once reached), whichever listener they use."""
    n = quill_factory("--submit-max-recipients", "2", "--submit-max-per-hour", "2")
    n.add_user(ALICE, PW)
    n.add_user(BOB, PW)
    s = submit(n)
    s.login(ALICE, PW)
    s.mail(ALICE)
    assert s.rcpt(BOB)[0] == 250 and s.rcpt(ALICE)[0] == 250
    code, text = s.rcpt(BOB)
    assert code == 452 and b"4.5.3" in text, text
    s.rset()
    for i in range(2):
        s.sendmail(ALICE, [BOB], f"From: {ALICE}\r\nSubject: n{i}\r\n\r\nx\r\n".encode())
    with pytest.raises(smtplib.SMTPSenderRefused) as e:
        s.sendmail(ALICE, [BOB], f"From: {ALICE}\r\n\r\nthird\r\n".encode())
    assert e.value.smtp_code == 451 and b"4.7.1" in e.value.smtp_error and b"limit is 2" in e.value.smtp_error
    s.quit()
    # Another user is not held back by alice's count.
    s = submit(n)
    s.login(BOB, PW)
    s.sendmail(BOB, [ALICE], f"From: {BOB}\r\n\r\nfrom bob\r\n".encode())
    s.quit()
    assert len(messages(n, BOB)) == 2


def test_auth_refused_inside_a_transaction(node):
    """RFC 4954 §4: no AUTH during a mail transaction; otherwise a sender
    named before AUTH would escape the submission's sender check."""
    host, port = node.addrs["smtps"]
    with smtplib.SMTP_SSL(host, port, timeout=TIMEOUT, context=tls_ctx()) as s:
        s.ehlo("client.test")
        assert s.mail("ceo@bank.example")[0] == 250  # unauthenticated mail for local users is allowed here
        code, text = s.docmd("AUTH", "PLAIN " + base64.b64encode(f"\0{ALICE}\0{PW}".encode()).decode())
        assert code == 503 and b"5.5.1" in text, text
