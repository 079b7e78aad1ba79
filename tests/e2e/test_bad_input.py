"""Hostile and broken clients: the node answers with errors, stores nothing
partial, and keeps serving everyone else."""

from __future__ import annotations

import base64
import random
import socket
import struct
import time

import pytest

from mailutil import Raw, count, fetch_all, pop3_login, send, split_trace

DOMAIN = "bad.test"
ALICE = f"alice@{DOMAIN}"
PW = "pw-alice"
HUGE = 100 * 1024


def msg(subject: str) -> bytes:
    return (b"From: s@remote.test\r\nTo: " + ALICE.encode() + b"\r\nSubject: " + subject.encode()
            + b"\r\n\r\nbody of " + subject.encode() + b"\r\n")


@pytest.fixture
def node(quill_factory):
    n = quill_factory()
    n.add_user(ALICE, PW)
    return n


def assert_healthy(node, expect_count: int | None = None):
    """A normal delivery and retrieval still work after the abuse."""
    before = count(node, ALICE, PW)
    if expect_count is not None:
        assert before == expect_count
    m = msg(f"healthy {time.monotonic_ns()}")
    assert send(node, ALICE, m) == {}
    got = fetch_all(node, ALICE, PW)
    assert len(got) == before + 1
    split_trace(got[-1][1], m, mail_from="sender@remote.test")


def send_ignoring_reset(r: Raw, data: bytes) -> None:
    """The server may close while we are still sending garbage: fine."""
    try:
        r.send(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def drain_lines(r: Raw, limit: int = 10000) -> list[bytes]:
    """Reads reply lines until the server closes or goes quiet for a moment."""
    out = []
    r.sock.settimeout(2)
    try:
        for _ in range(limit):
            line = r.line()
            if not line and not r.buf:
                break
            out.append(line)
    except (socket.timeout, ConnectionResetError):
        pass
    return out


# ---- huge lines ---------------------------------------------------------------

def test_smtp_huge_line_without_newline(node):
    with Raw(node.smtp_addr) as r:
        assert r.line().startswith(b"220")
        send_ignoring_reset(r, b"A" * HUGE)
        code, texts = r.smtp_reply()
        assert 500 <= code < 600, (code, texts)
    assert_healthy(node, 0)


def test_smtp_huge_command_line(node):
    with Raw(node.smtp_addr) as r:
        assert r.line().startswith(b"220")
        send_ignoring_reset(r, b"EHLO " + b"h" * HUGE + b"\r\n")
        code, texts = r.smtp_reply()
        assert 500 <= code < 600, (code, texts)
    assert_healthy(node, 0)


def test_smtp_huge_line_in_data_stores_nothing(node):
    with Raw(node.smtp_addr) as r:
        assert r.line().startswith(b"220")
        assert r.cmd("EHLO client.test") and r.smtp_reply()[0] == 250
        assert r.cmd("MAIL FROM:<s@remote.test>").startswith(b"250")
        assert r.cmd(f"RCPT TO:<{ALICE}>").startswith(b"250")
        assert r.cmd("DATA").startswith(b"354")
        send_ignoring_reset(r, b"Subject: long\r\n\r\n" + b"x" * HUGE + b"\r\n.\r\n")
        code, texts = r.smtp_reply()
        assert 500 <= code < 600, (code, texts)
    assert_healthy(node, 0)


def test_pop3_huge_line(node):
    send(node, ALICE, msg("keep"))
    with Raw(node.pop3_addr) as r:
        assert r.line().startswith(b"+OK")
        r.send(b"U" * HUGE)
        time.sleep(0.2)
        r.send(b"\r\n")
        assert r.line().startswith(b"-ERR")
        # The session goes on.
        assert r.cmd(f"USER {ALICE}").startswith(b"+OK")
        assert r.cmd(f"PASS {PW}").startswith(b"+OK")
        # And in the TRANSACTION state too.
        r.send(b"RETR " + b"1" * HUGE + b"\r\n")
        assert r.line().startswith(b"-ERR")
        assert r.cmd("STAT").startswith(b"+OK 1 ")
        assert r.cmd("QUIT").startswith(b"+OK")
    assert_healthy(node, 1)


def test_pop3_endless_line_then_close(node):
    # Megabytes without a newline, then a hang-up: memory stays bounded and
    # nothing breaks for the next client.
    with Raw(node.pop3_addr) as r:
        assert r.line().startswith(b"+OK")
        send_ignoring_reset(r, b"Z" * (4 << 20))
    assert_healthy(node, 0)


def test_pop3_huge_auth_plain(node):
    with Raw(node.pop3_addr) as r:
        assert r.line().startswith(b"+OK")
        assert r.cmd("AUTH PLAIN").startswith(b"+")
        r.send(base64.b64encode(b"\0" + b"a" * HUGE + b"\0pw") + b"\r\n")
        assert r.line().startswith(b"-ERR")
        assert r.cmd("AUTH PLAIN !!notbase64!!").startswith(b"-ERR")
        cred = base64.b64encode(f"\0{ALICE}\0{PW}".encode()).decode()
        assert r.cmd(f"AUTH PLAIN {cred}").startswith(b"+OK")
        assert r.cmd("QUIT").startswith(b"+OK")


# ---- binary garbage -------------------------------------------------------------

@pytest.mark.parametrize("proto", ["smtp", "pop3"])
def test_binary_garbage(node, proto):
    send(node, ALICE, msg("before garbage"))
    rnd = random.Random(1234)
    addr = node.smtp_addr if proto == "smtp" else node.pop3_addr
    for i in range(3):
        with Raw(addr) as r:
            greeting = r.line()
            assert greeting.startswith(b"220" if proto == "smtp" else b"+OK"), greeting
            garbage = rnd.randbytes(64 * 1024)
            if i == 1:  # many short garbage lines
                garbage = b"\r\n".join(rnd.randbytes(rnd.randint(0, 40)) for _ in range(3000))
            if i == 2:  # NULs and 8-bit inside otherwise plausible commands
                garbage = b"".join(c + b" \x00\xff\xfe" + rnd.randbytes(8) + b"\r\n"
                                   for c in [b"MAIL FROM:<", b"RCPT TO:<", b"USER", b"PASS", b"DATA"] * 50)
            send_ignoring_reset(r, garbage)
            replies = drain_lines(r)
            # Garbage never logs in, and never delivers (checked below).
            assert not any(b"maildrop" in line for line in replies), replies
            if proto == "pop3":
                assert any(line.startswith(b"-ERR") for line in replies), replies[:5]
            else:
                assert any(line[:1] == b"5" for line in replies), replies[:5]
    assert_healthy(node, 1)


def test_pop3_too_many_bad_commands_closes_connection(node):
    with Raw(node.pop3_addr) as r:
        assert r.line().startswith(b"+OK")
        replies = []
        for _ in range(100):
            try:
                line = r.cmd("BOGUS")
            except (BrokenPipeError, ConnectionResetError):
                break
            if not line:
                break
            replies.append(line)
        assert replies and all(x.startswith(b"-ERR") for x in replies)
        assert len(replies) < 100, "server never gave up on a client sending only garbage"
        assert r.closed_by_peer()
    assert_healthy(node, 0)


def test_many_connections_dropped_at_once(node):
    socks = []
    for proto in ("smtp", "pop3"):
        for _ in range(30):
            socks.append(socket.create_connection(node.addrs[proto], timeout=10))
    for i, s in enumerate(socks):
        if i % 2:
            # RST instead of FIN.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    assert_healthy(node, 0)


# ---- connections that die mid-DATA ------------------------------------------------

CUTS = {
    "mid-line": b"Subject: cut\r\n\r\nhalf a li",
    "after-crlf": b"Subject: cut\r\n\r\na whole line\r\n",
    "after-dot": b"Subject: cut\r\n\r\nline\r\n.",  # no CRLF after the dot
    "after-dot-cr": b"Subject: cut\r\n\r\nline\r\n.\r",
}


@pytest.mark.parametrize("cut", sorted(CUTS))
@pytest.mark.parametrize("rst", [False, True], ids=["fin", "rst"])
def test_connection_closed_mid_data_leaves_no_message(node, cut, rst):
    r = Raw(node.smtp_addr)
    assert r.line().startswith(b"220")
    r.cmd("EHLO client.test")
    assert r.smtp_reply()[0] == 250
    assert r.cmd("MAIL FROM:<s@remote.test>").startswith(b"250")
    assert r.cmd(f"RCPT TO:<{ALICE}>").startswith(b"250")
    assert r.cmd("DATA").startswith(b"354")
    r.send(CUTS[cut] + b"x" * 50000 if cut == "mid-line" else CUTS[cut])
    time.sleep(0.1)
    if rst:
        r.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    r.close()
    time.sleep(0.5)  # let the server see the close
    assert count(node, ALICE, PW) == 0
    # A whole message afterwards is stored exactly once, alone.
    assert_healthy(node, 0)
    assert count(node, ALICE, PW) == 1


def test_pop3_client_vanishes_mid_retr(node):
    big = b"From: s@remote.test\r\nSubject: big\r\n\r\n" + (b"y" * 78 + b"\r\n") * 30000
    send(node, ALICE, big)
    send(node, ALICE, msg("small"))
    r = pop3_login(node, ALICE, PW)
    assert r.cmd("DELE 2").startswith(b"+OK")  # marked, but no QUIT will come
    r.send(b"RETR 1\r\n")  # 2.4 MB that we never read
    assert r.line().startswith(b"+OK")
    r.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    r.close()
    time.sleep(0.3)
    got = fetch_all(node, ALICE, PW)
    assert len(got) == 2
    split_trace(got[0][1], big, mail_from="sender@remote.test")
    assert_healthy(node, 2)
