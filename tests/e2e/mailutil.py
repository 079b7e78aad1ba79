"""Client helpers for the e2e tests: SMTP, POP3 (poplib and raw), curl.

Every socket gets a timeout so that a hung server fails a test instead of
hanging the run.
"""

from __future__ import annotations

import contextlib
import imaplib
import poplib
import random
import re
import smtplib
import socket
import subprocess
import time
from pathlib import Path

SOCK_TIMEOUT = 30.0
# The --auth-fail-delay the default test node runs with, in seconds.
AUTH_FAIL_DELAY = 0.2
CURL_TIMEOUT = 60

CRLF = b"\r\n"


# ---- SMTP -------------------------------------------------------------------

@contextlib.contextmanager
def smtp(node, helo: str = "client.test", timeout: float = SOCK_TIMEOUT):
    host, port = node.smtp_addr
    s = smtplib.SMTP(host, port, local_hostname=helo, timeout=timeout)
    try:
        yield s
    finally:
        try:
            s.quit()
        except (smtplib.SMTPException, OSError):
            s.close()


def send(node, rcpts, msg: bytes, mail_from: str = "sender@remote.test") -> dict:
    """Delivers msg in one transaction; returns sendmail's refused dict."""
    if isinstance(rcpts, str):
        rcpts = [rcpts]
    with smtp(node) as s:
        return s.sendmail(mail_from, rcpts, msg)


# ---- POP3 -------------------------------------------------------------------

@contextlib.contextmanager
def pop3(node, user: str | None = None, pw: str | None = None, timeout: float = SOCK_TIMEOUT,
         quit: bool = True):
    """A poplib session, logged in when user is given. QUIT at the end."""
    host, port = node.pop3_addr
    p = poplib.POP3(host, port, timeout=timeout)
    try:
        if user is not None:
            p.user(user)
            p.pass_(pw)
        yield p
    finally:
        if p.sock is None:  # the test already sent QUIT
            pass
        elif quit:
            try:
                p.quit()
            except (poplib.error_proto, OSError):
                p.close()
        else:
            p.close()


def retr(p: poplib.POP3, n: int) -> bytes:
    """RETR n, reassembled byte for byte (poplib strips CRLF and unstuffs dots)."""
    resp, lines, octets = p.retr(n)
    assert resp.startswith(b"+OK"), resp
    return b"".join(line + CRLF for line in lines)


def uidl(p: poplib.POP3) -> dict[int, str]:
    resp, lines, _ = p.uidl()
    assert resp.startswith(b"+OK"), resp
    out = {}
    for line in lines:
        num, uid = line.decode().split()
        out[int(num)] = uid
    return out


def fetch_all(node, user: str, pw: str) -> list[tuple[str, bytes]]:
    """(UID, message) of every message in the maildrop, in order."""
    with pop3(node, user, pw) as p:
        uids = uidl(p)
        return [(uids[n], retr(p, n)) for n in sorted(uids)]


def count(node, user: str, pw: str) -> int:
    with pop3(node, user, pw) as p:
        return p.stat()[0]


class Raw:
    """A line-level client for protocol abuse: raw bytes in, lines out."""

    def __init__(self, addr: tuple[str, int], timeout: float = SOCK_TIMEOUT):
        self.sock = socket.create_connection(addr, timeout=timeout)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def cmd(self, line: str | bytes) -> bytes:
        if isinstance(line, str):
            line = line.encode()
        self.send(line + CRLF)
        return self.line()

    def line(self) -> bytes:
        """Next line without CRLF; b"" at EOF."""
        while CRLF not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                rest, self.buf = self.buf, b""
                return rest
            self.buf += chunk
        line, self.buf = self.buf.split(CRLF, 1)
        return line

    def smtp_reply(self) -> tuple[int, list[bytes]]:
        """An SMTP reply, multi-line ones joined: (code, texts)."""
        texts = []
        while True:
            line = self.line()
            if not line:
                return 0, texts
            texts.append(line[4:])
            if line[3:4] != b"-":
                return int(line[:3]), texts

    def multiline(self) -> bytes:
        """A POP3 multi-line body after its +OK, unstuffed, CRLF kept."""
        out = []
        while True:
            line = self.line()
            if line == b".":
                return b"".join(out)
            if line.startswith(b"."):
                line = line[1:]
            out.append(line + CRLF)

    def closed_by_peer(self, wait: float = 5.0) -> bool:
        """True if the server closes the connection within wait seconds."""
        self.sock.settimeout(wait)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self.buf += chunk
        except socket.timeout:
            return False
        except ConnectionResetError:
            return True
        finally:
            self.sock.settimeout(SOCK_TIMEOUT)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def pop3_login(node, user: str, pw: str) -> Raw:
    r = Raw(node.pop3_addr)
    assert r.line().startswith(b"+OK")
    assert r.cmd(f"USER {user}").startswith(b"+OK")
    reply = r.cmd(f"PASS {pw}")
    assert reply.startswith(b"+OK"), reply
    return r


# ---- curl -------------------------------------------------------------------

def curl_send(curl: str, node, rcpts, path: Path, mail_from: str = "sender@remote.test"):
    host, port = node.smtp_addr
    cmd = [curl, "-sS", "--max-time", str(CURL_TIMEOUT), "--url", f"smtp://{host}:{port}",
           "--mail-from", mail_from]
    for r in ([rcpts] if isinstance(rcpts, str) else rcpts):
        cmd += ["--mail-rcpt", r]
    cmd += ["-T", str(path)]
    return subprocess.run(cmd, capture_output=True, timeout=CURL_TIMEOUT + 10)


def curl_retr(curl: str, node, user: str, pw: str, n: int | None = None) -> subprocess.CompletedProcess:
    """curl pop3://HOST:PORT/N (or the LIST output when n is None)."""
    host, port = node.pop3_addr
    url = f"pop3://{host}:{port}/" + ("" if n is None else str(n))
    return subprocess.run([curl, "-sS", "--max-time", str(CURL_TIMEOUT), "--user", f"{user}:{pw}", url],
                          capture_output=True, timeout=CURL_TIMEOUT + 10)


# ---- trace headers ----------------------------------------------------------

_HEADER_LINE = re.compile(rb"^[!-9;-~]+:")


def split_trace(stored: bytes, original: bytes, mail_from: str = "sender@remote.test") -> bytes:
    """Checks stored == trace headers + original; returns the trace headers.

    The server prepends Return-Path and Received (RFC 5321 §4.4) and must
    leave every byte of the message it was given unchanged after them.
    """
    assert stored.endswith(original), (
        f"message body altered: stored {len(stored)} bytes, sent {len(original)}; "
        f"first difference near: {_first_diff(stored, original)}")
    trace = stored[: len(stored) - len(original)]
    assert trace.startswith(b"Return-Path: <" + mail_from.encode() + b">\r\n"), trace[:200]
    assert trace.endswith(CRLF), trace[-200:]
    lines = trace[:-2].split(CRLF)
    names = [ln.split(b":", 1)[0].lower() for ln in lines if _HEADER_LINE.match(ln)]
    for ln in lines:  # only header fields and their folded continuations
        assert _HEADER_LINE.match(ln) or ln[:1] in (b" ", b"\t"), ln
    assert names[0] == b"return-path"
    assert b"received" in names, trace
    return trace


def _first_diff(stored: bytes, original: bytes) -> str:
    # Aligns the ends, where the original should sit.
    a, b = stored[::-1], original[::-1]
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            pos = len(original) - 1 - i
            return f"original offset {pos}: sent {original[max(0, pos-20):pos+20]!r}, " \
                   f"stored {stored[len(stored)-len(original)+max(0, pos-20):len(stored)-len(original)+pos+20]!r}"
    return "(one is a suffix of the other)"


def wait_until(pred, timeout: float = 10.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(interval)


def mbsync_rc(path: Path, node, user: str, pw: str, maildir: Path, patterns: str = "*") -> Path:
    """Writes an mbsync configuration that keeps maildir in step with the
    user's mailboxes on node (channel "sync": Create and Expunge both
    ways), and returns its path."""
    host, port = node.addrs["imap"]
    path.write_text(f"""IMAPAccount quill
Host {host}
Port {port}
User {user}
Pass "{pw}"
SSLType None
AuthMechs LOGIN

IMAPStore far
Account quill

MaildirStore near
Path {maildir}/
Inbox {maildir}/INBOX
SubFolders Verbatim

Channel sync
Far :far:
Near :near:
Patterns {patterns}
Create Both
Expunge Both
SyncState *
""")
    return path


def free_port(host: str = "127.0.0.1", kind=socket.SOCK_STREAM) -> int:
    """A port nothing is bound to on host at the moment."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# A DNS server listens on one port for both UDP and TCP. A port the kernel
# hands out for bind(0) is from the ephemeral range, which every outgoing
# connection and every other test's listener also draw from, so under
# pytest-xdist the TCP side of a UDP port found free was sometimes taken by
# the time dnsmasq bound it. Below the ephemeral range (32768 on Linux)
# only ports picked like this one are used.
DNS_PORTS = (20000, 32000)


def free_dns_port(host: str = "127.0.0.1") -> int:
    """A port below the ephemeral range free for both UDP and TCP on host."""
    for _ in range(200):
        port = random.randrange(*DNS_PORTS)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u, socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
                u.bind((host, port))
                t.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no port in {DNS_PORTS} free for UDP and TCP on {host}")


def wait_for(what: str, fn, timeout: float = 30.0):
    """Polls fn until it returns something true, and returns that."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def ok(res):
    """The data of an imaplib answer that must be OK."""
    typ, data = res
    assert typ == "OK", (typ, data)
    return data


def imap_login(node, user: str, pw: str, timeout: float = SOCK_TIMEOUT) -> imaplib.IMAP4:
    """An imaplib session on node's plain IMAP port, logged in."""
    host, port = node.addrs["imap"]
    m = imaplib.IMAP4(host, port, timeout=timeout)
    m.login(user, pw)
    return m


def cluster_pair(quill_factory, user: str, pw: str):
    """Nodes A and B of one cluster (B joins A's gossip), user added through
    A and able to log in through B; returns (a, b)."""
    ga, gb = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    a = quill_factory("--cluster", ga)
    b = quill_factory("--cluster", gb, "--join", ga)
    a.add_user(user, pw)

    def logs_in() -> bool:
        try:
            imap_login(b, user, pw).logout()
            return True
        except (imaplib.IMAP4.error, OSError):
            return False

    wait_for(f"{user} to log in through node B", logs_in)
    return a, b
