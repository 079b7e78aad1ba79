"""IMAP against a real `quill serve` process: Python's imaplib, mbsync, fetchmail, curl."""

from __future__ import annotations

import imaplib
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import zlib

import pytest

from mailutil import count, fetch_all, mbsync_rc, ok, pop3, retr, send, smtp, wait_for

DOMAIN = "quill.test"
ALICE = f"alice@{DOMAIN}"
PW = "imap pass"
TIMEOUT = 30.0


def imap(node, login: bool = True) -> imaplib.IMAP4:
    host, port = node.addrs["imap"]
    m = imaplib.IMAP4(host, port, timeout=TIMEOUT)
    if login:
        m.login(ALICE, PW)
    return m


def msg(subject: str, body: bytes = b"body\r\n") -> bytes:
    return (b"From: Sender <sender@remote.test>\r\nTo: " + ALICE.encode() + b"\r\n"
            b"Subject: " + subject.encode() + b"\r\nMessage-ID: <" + os.urandom(6).hex().encode()
            + b"@remote.test>\r\n\r\n" + body)


@pytest.fixture
def inode(node):
    node.add_user(ALICE, PW)
    return node


def test_login_list_and_special_use(inode):
    with pytest.raises(imaplib.IMAP4.error, match="AUTHENTICATIONFAILED"):
        imap(inode, login=False).login(ALICE, "wrong")
    m = imap(inode)
    caps = ok(m.capability())[0].decode().upper().split()
    for c in ("IMAP4REV1", "IMAP4REV2", "IDLE", "UIDPLUS", "MOVE", "SPECIAL-USE", "CONDSTORE", "NAMESPACE", "ID"):
        assert c in caps, caps
    names = {}
    for line in ok(m.list()):
        attrs, _, name = re.match(rb'\((.*?)\) "(.)" (.*)', line).groups()
        names[name.strip(b'"').decode()] = attrs.decode()
    for box, use in (("Sent", r"\Sent"), ("Drafts", r"\Drafts"), ("Trash", r"\Trash"),
                     ("Junk", r"\Junk"), ("Archive", r"\Archive")):
        assert use in names[box], names
    assert "INBOX" in names
    m.logout()


def test_create_rename_delete(inode):
    m = imap(inode)
    ok(m.create("Projects/2026/Q1"))
    ok(m.rename("Projects", "Work"))
    listed = b"".join(ok(m.list('""', "*")))
    assert b"Work/2026/Q1" in listed and b"Projects" not in listed
    ok(m.delete("Work/2026/Q1"))
    assert b"Work/2026/Q1" not in b"".join(ok(m.list('""', "*")))
    typ, _ = m.delete("INBOX")
    assert typ == "NO"
    m.logout()


def test_append_fetch_exact_bytes(inode):
    raw = msg("exact", b".dot\r\n\xc3\xa9\xff\x80 8-bit\r\n" + b"x" * 5000 + b"\r\nno final newline")
    m = imap(inode)
    typ, data = m.append("INBOX", r"(\Flagged)", imaplib.Time2Internaldate(time.time()), raw)
    assert typ == "OK" and b"APPENDUID" in data[0], data
    ok(m.select("INBOX"))
    data = ok(m.fetch("1", "(RFC822.SIZE BODY.PEEK[] FLAGS)"))
    assert data[0][1] == raw
    assert f"RFC822.SIZE {len(raw)}".encode() in data[0][0]
    assert b"\\Flagged" in data[0][0]
    data = ok(m.fetch("1", "(BODY.PEEK[TEXT]<2.5>)"))
    body = raw[raw.index(b"\r\n\r\n") + 4:]
    assert data[0][1] == body[2:7]
    m.logout()


def test_smtp_delivery_search_store_copy_move_expunge(inode):
    for i in range(4):
        send(inode, ALICE, msg(f"note {i}", f"word{i}\r\n".encode()))
    m = imap(inode)
    ok(m.select("INBOX"))
    assert ok(m.search(None, "ALL")) == [b"1 2 3 4"]
    assert ok(m.search(None, "SUBJECT", '"note 2"')) == [b"3"]
    assert ok(m.search(None, "BODY", "word3")) == [b"4"]
    ok(m.store("1", "+FLAGS", r"(\Seen $Done)"))
    assert ok(m.search(None, "SEEN")) == [b"1"]
    assert ok(m.search(None, "KEYWORD", "$Done")) == [b"1"]
    typ, data = m.copy("1:2", "Archive")
    assert typ == "OK" and b"COPYUID" in data[0], data
    typ, data = m.uid("MOVE", "3", "Trash")
    assert typ == "OK", data
    ok(m.store("1", "+FLAGS", r"(\Deleted)"))
    ok(m.expunge())
    assert ok(m.uid("SEARCH", None, "ALL")) == [b"2 4"]
    ok(m.select("Archive"))
    assert ok(m.search(None, "ALL")) == [b"1 2"]
    ok(m.select("Trash"))
    assert ok(m.search(None, "BODY", "word2")) == [b"1"]
    m.logout()


def test_imaplib_sort_and_thread(inode):
    """SORT and THREAD (RFC 5256) as Python's imaplib sends them, on mail delivered over SMTP."""
    def threaded(subject, mid, date, refs=b""):
        return (b"From: Sender <sender@remote.test>\r\nTo: " + ALICE.encode() + b"\r\n"
                b"Subject: " + subject + b"\r\nMessage-ID: <" + mid + b">\r\nDate: " + date + b"\r\n"
                + refs + b"\r\nbody\r\n")
    send(inode, ALICE, threaded(b"Re: plan", b"p2@t", b"Tue, 03 Mar 2026 10:00:00 +0000", b"References: <p1@t>\r\n"))
    send(inode, ALICE, threaded(b"plan", b"p1@t", b"Mon, 02 Mar 2026 10:00:00 +0000"))
    send(inode, ALICE, threaded(b"another", b"o1@t", b"Sun, 01 Mar 2026 10:00:00 +0000"))
    send(inode, ALICE, threaded(b"Re: Re: plan", b"p3@t", b"Wed, 04 Mar 2026 10:00:00 +0000", b"In-Reply-To: <p2@t>\r\n"))
    m = imap(inode)
    typ, caps = m.capability()
    assert b"THREAD=REFERENCES" in caps[0] and b" SORT" in caps[0], caps
    ok(m.select("INBOX"))
    assert ok(m.sort("(DATE)", "UTF-8", "ALL")) == [b"3 2 1 4"]
    assert ok(m.sort("(REVERSE DATE)", "UTF-8", "ALL")) == [b"4 1 2 3"]
    assert ok(m.sort("(SUBJECT)", "UTF-8", "ALL")) == [b"3 1 2 4"]
    assert ok(m.uid("SORT", "(SUBJECT)", "UTF-8", "SUBJECT", "plan")) == [b"1 2 4"]
    assert ok(m.thread("REFERENCES", "UTF-8", "ALL")) == [b"(3)(2 1 4)"]
    assert ok(m.thread("ORDEREDSUBJECT", "UTF-8", "ALL")) == [b"(3)(2 (1)(4))"]
    m.logout()


class DeflateIMAP:
    """A raw IMAP session that speaks COMPRESS=DEFLATE (RFC 4978) the way
    Thunderbird does: zlib raw deflate, each command ended with a partial
    flush (Z_PARTIAL_FLUSH), which a reader that waits for the next block
    would never answer."""

    def __init__(self, node):
        host, port = node.addrs["imap"]
        self.s = socket.create_connection((host, port), timeout=TIMEOUT)
        self.buf = b""
        self.zin = None
        self.zout = None
        self.n = 0
        assert self.line().startswith(b"* OK")

    def _more(self):
        data = self.s.recv(65536)
        assert data, "connection closed"
        self.buf += self.zin.decompress(data) if self.zin else data

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._more()
        line, self.buf = self.buf.split(b"\r\n", 1)
        m = re.search(rb"\{(\d+)\}$", line)
        if m:  # a literal: inline it
            n = int(m.group(1))
            while len(self.buf) < n:
                self._more()
            line, self.buf = line + b"\r\n" + self.buf[:n], self.buf[n:]
            rest = self.line()
            line += rest
        return line

    def cmd(self, text: str) -> tuple[list[bytes], bytes]:
        self.n += 1
        tag = f"z{self.n}".encode()
        data = tag + b" " + text.encode() + b"\r\n"
        if self.zout:
            data = self.zout.compress(data) + self.zout.flush(zlib.Z_PARTIAL_FLUSH)
        self.s.sendall(data)
        lines = []
        while True:
            line = self.line()
            if line.startswith(tag + b" "):
                return lines, line[len(tag) + 1:]
            lines.append(line)

    def compress(self):
        _, st = self.cmd("COMPRESS DEFLATE")
        assert st.startswith(b"OK"), st
        assert self.buf == b"", self.buf
        self.zin = zlib.decompressobj(-15)
        self.zout = zlib.compressobj(6, zlib.DEFLATED, -15)


def test_compress_deflate_and_qresync(inode):
    """COMPRESS=DEFLATE with zlib's partial flushes (what mbsync and
    Thunderbird send), then QRESYNC through it: a session that comes back
    after another one expunged and flagged mail learns both in its SELECT."""
    for i in range(3):
        send(inode, ALICE, msg(f"resync {i}", ((f"line {i} " * 40 + "\r\n") * 40).encode()))
    a = imap(inode)
    ok(a.enable("QRESYNC"))
    assert a.response("ENABLED")[1] == [b"QRESYNC"], a.response("ENABLED")
    ok(a.select("INBOX"))
    uidvalidity = a.response("UIDVALIDITY")[1][0].decode()
    modseq = a.response("HIGHESTMODSEQ")[1][0].decode()
    a.logout()

    b = imap(inode)
    ok(b.select("INBOX"))
    ok(b.uid("STORE", "1", "+FLAGS", r"(\Deleted)"))
    ok(b.expunge())
    ok(b.uid("STORE", "3", "+FLAGS", r"(\Flagged)"))
    b.logout()

    z = DeflateIMAP(inode)
    _, st = z.cmd(f'LOGIN "{ALICE}" "{PW}"')
    assert st.startswith(b"OK"), st
    caps, _ = z.cmd("CAPABILITY")
    assert b"COMPRESS=DEFLATE" in caps[0] and b"QRESYNC" in caps[0], caps
    z.compress()
    _, st = z.cmd("COMPRESS DEFLATE")
    assert st.startswith(b"NO [COMPRESSIONACTIVE]"), st
    lines, st = z.cmd("ENABLE QRESYNC")
    assert st.startswith(b"OK") and b"* ENABLED QRESYNC" in lines, lines
    lines, st = z.cmd(f"SELECT INBOX (QRESYNC ({uidvalidity} {modseq}))")
    assert st.startswith(b"OK"), (lines, st)
    assert b"* VANISHED (EARLIER) 1" in lines, lines
    fetched = [l for l in lines if b"FETCH" in l]
    assert len(fetched) == 1 and b"UID 3 " in fetched[0] and b"\\Flagged" in fetched[0], lines
    lines, st = z.cmd("UID FETCH 2 (BODY.PEEK[TEXT])")
    assert st.startswith(b"OK") and (b"line 1 " * 40 + b"\r\n") * 40 in lines[0], (lines, st)
    z.cmd("LOGOUT")
    z.s.close()


def test_quota_refuses_delivery_and_append(inode):
    """Per-user quota (RFC 9208) set with the CLI: RCPT past it is 452 4.2.2,
    APPEND is NO [OVERQUOTA], imaplib's GETQUOTAROOT shows the figures."""
    out = inode.cli("user", "quota", ALICE, "--messages", "2", "--storage", "1M").stdout
    assert "of 1.0M" in out and "0 of 2 messages" in out, out
    for i in range(2):
        assert send(inode, ALICE, msg(f"quota {i}")) == {}
    with smtp(inode) as s:
        s.ehlo()
        assert s.mail("sender@remote.test")[0] == 250
        code, text = s.rcpt(ALICE)
        assert code == 452 and b"4.2.2" in text and b"mailbox full" in text, (code, text)
    m = imap(inode)
    typ, data = m.getquotaroot("INBOX")
    assert typ == "OK", data
    roots, quotas = data
    assert roots == [b'INBOX ""'] and re.fullmatch(rb'"" \(STORAGE 1 1024 MESSAGE 2 2\)', quotas[0]), data
    typ, data = m.append("INBOX", None, None, msg("one too many"))
    assert typ == "NO" and b"OVERQUOTA" in data[0], (typ, data)
    ok(m.select("INBOX"))
    ok(m.store("1", "+FLAGS", r"(\Deleted)"))
    ok(m.expunge())
    m.logout()
    assert send(inode, ALICE, msg("room again")) == {}
    out = inode.cli("user", "quota", ALICE, "--messages", "0", "--storage", "0").stdout
    assert "2 of no limit messages" in out and "of no limit" in out, out


def test_quota_checked_again_at_data(quill_factory):
    """A message whose size MAIL did not declare is checked against the
    quotas at DATA with its real size: refused with 452 4.2.2 when no
    recipient has room; when one has, accepted into the outbound queue,
    which delivers to the one with room at once and to the full one once
    its quota allows."""
    node = quill_factory("--queue-retry", "1s")
    bob = f"bob@{DOMAIN}"
    node.add_user(ALICE, PW)
    node.add_user(bob, PW)
    node.cli("user", "quota", ALICE, "--storage", "4K")
    big = msg("big one", b"0123456789abcdef" * 62 + b"\r\n" * 1 + (b"x" * 62 + b"\r\n") * 100)

    def data(rcpts):
        with smtp(node) as s:
            s.ehlo()
            assert s.mail("sender@remote.test")[0] == 250  # no SIZE=
            for r in rcpts:
                assert s.rcpt(r)[0] == 250, r
            return s.data(big)

    code, text = data([ALICE])
    assert code == 452 and b"4.2.2" in text and b"mailbox full" in text, (code, text)
    code, text = data([ALICE, bob])
    assert code == 250, (code, text)
    wait_for("bob to get the queued message", lambda: count(node, bob, PW))
    assert count(node, ALICE, PW) == 0
    node.cli("user", "quota", ALICE, "--storage", "0")
    wait_for("alice to get the message once her quota allows it", lambda: count(node, ALICE, PW))
    got = fetch_all(node, ALICE, PW)[0][1]
    assert got.startswith(b"Return-Path: <sender@remote.test>\r\nReceived: from ") and got.endswith(big), got[:200]
    assert count(node, bob, PW) == 1


def test_smtputf8_sender_read_under_utf8_accept(inode):
    """SMTPUTF8 (RFC 6531) from Python's smtplib, read back by imaplib after ENABLE UTF8=ACCEPT (RFC 6855)."""
    import smtplib
    host, port = inode.smtp_addr
    msg = ("From: Jürgen <jürgen@münchen.example>\r\nTo: " + ALICE + "\r\nSubject: Grüße aus München\r\n\r\nHallo\r\n").encode()
    with smtplib.SMTP(host, port, timeout=TIMEOUT) as s:
        s.ehlo()
        assert s.has_extn("smtputf8")
        s.command_encoding = "utf-8"  # a UTF-8 address without SMTPUTF8: refused
        code, text = s.docmd("MAIL FROM:<jürgen@münchen.example>")
        assert code == 553 and b"5.6.7" in text, (code, text)
        s.command_encoding = "ascii"
        s.rset()
        assert s.sendmail("jürgen@münchen.example", [ALICE], msg, mail_options=["SMTPUTF8"]) == {}
    m = imap(inode)
    ok(m.enable("UTF8=ACCEPT"))
    ok(m.select("INBOX"))
    data = ok(m.fetch("1", "(BODY.PEEK[HEADER.FIELDS (FROM SUBJECT)])"))
    assert "Grüße aus München".encode() in data[0][1] and "jürgen@münchen".encode() in data[0][1], data
    m.logout()


def test_pop3_and_imap_deletes_are_the_same(inode):
    for i in range(3):
        send(inode, ALICE, msg(f"p{i}"))
    with pop3(inode, ALICE, PW) as p:
        p.dele(1)
    m = imap(inode)
    ok(m.select("INBOX"))
    assert ok(m.uid("SEARCH", None, "ALL")) == [b"2 3"]
    ok(m.uid("STORE", "2", "+FLAGS", r"(\Deleted)"))
    ok(m.expunge())
    m.logout()
    with pop3(inode, ALICE, PW) as p:
        assert p.stat()[0] == 1
        assert b"Subject: p2" in retr(p, 1)


def test_idle_sees_smtp_delivery_within_a_second(inode):
    host, port = inode.addrs["imap"]
    s = socket.create_connection((host, port), timeout=TIMEOUT)
    f = s.makefile("rb")
    f.readline()
    s.sendall(f'a LOGIN "{ALICE}" "{PW}"\r\nb SELECT INBOX\r\n'.encode())
    while not f.readline().startswith(b"b OK"):
        pass
    s.sendall(b"c IDLE\r\n")
    assert f.readline().startswith(b"+")
    start = time.monotonic()
    threading.Thread(target=send, args=(inode, ALICE, msg("wake up"))).start()
    line = f.readline()
    took = time.monotonic() - start
    assert line == b"* 1 EXISTS\r\n", line
    assert took < 1.0 + 0.5, took  # delivery itself plus the notification
    s.sendall(b"DONE\r\n")
    while True:
        line = f.readline()
        if line.startswith(b"c "):
            assert line.startswith(b"c OK"), line
            break
    s.close()


def test_two_sessions_see_changes_at_allowed_points(inode):
    for i in range(3):
        send(inode, ALICE, msg(f"c{i}"))
    a, b = imap(inode), imap(inode)
    ok(a.select("INBOX"))
    ok(b.select("INBOX"))
    # imaplib keeps untagged responses across commands: clear before each.
    ok(a.store("2", "+FLAGS", r"(\Flagged)"))
    b.untagged_responses.clear()
    ok(b.noop())
    assert any(b"\\Flagged" in r for r in b.untagged_responses.get("FETCH", [])), b.untagged_responses
    ok(a.store("1", "+FLAGS", r"(\Deleted)"))
    ok(a.expunge())
    # b's numbering does not move during FETCH: message 3 is still UID 3.
    b.untagged_responses.clear()
    data = ok(b.fetch("3", "(UID)"))
    assert data == [b"3 (UID 3)"], data
    assert "EXPUNGE" not in b.untagged_responses
    b.untagged_responses.clear()
    ok(b.noop())
    assert b.untagged_responses.get("EXPUNGE") == [b"1"], b.untagged_responses
    b.untagged_responses.clear()
    data = ok(b.fetch("2", "(UID)"))
    assert data == [b"2 (UID 3)"], data
    a.logout()
    b.logout()


def test_restart_keeps_uidvalidity_uids_and_flags(inode):
    for i in range(3):
        send(inode, ALICE, msg(f"r{i}"))
    m = imap(inode)
    ok(m.select("INBOX"))
    ok(m.store("2", "+FLAGS", r"(\Answered $Keep)"))
    ok(m.store("1", "+FLAGS", r"(\Deleted)"))
    ok(m.expunge())
    before_status = ok(m.status("INBOX", "(UIDVALIDITY UIDNEXT)"))
    before = ok(m.uid("FETCH", "1:*", "(FLAGS)"))
    m.logout()
    inode.restart()
    m = imap(inode)
    assert ok(m.status("INBOX", "(UIDVALIDITY UIDNEXT)")) == before_status
    ok(m.select("INBOX"))
    after = ok(m.uid("FETCH", "1:*", "(FLAGS)"))
    strip = lambda rows: [r.replace(b" \\Recent", b"") for r in rows]  # noqa: E731 - \Recent is per session
    assert strip(after) == strip(before)
    send(inode, ALICE, msg("after restart"))
    ok(m.noop())
    assert ok(m.uid("SEARCH", None, "ALL")) == [b"2 3 4"]
    m.logout()


def test_curl_imap(inode, curl):
    send(inode, ALICE, msg("for curl", b"curl body\r\n"))
    host, port = inode.addrs["imap"]
    r = subprocess.run([curl, "-s", "--user", f"{ALICE}:{PW}", f"imap://{host}:{port}/INBOX;UID=1"],
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert b"Subject: for curl" in r.stdout and b"curl body" in r.stdout


@pytest.mark.skipif(not shutil.which("mbsync"), reason="mbsync (isync) not installed")
def test_mbsync_both_ways(inode, tmp_path):
    send(inode, ALICE, msg("far side", b"from the server\r\n"))
    maildir = tmp_path / "mail"
    maildir.mkdir()
    rc = mbsync_rc(tmp_path / "mbsyncrc", inode, ALICE, PW, maildir)
    run = lambda: subprocess.run(["mbsync", "-c", str(rc), "-a"], capture_output=True, text=True, timeout=120)  # noqa: E731
    r = run()
    assert r.returncode == 0, r.stdout + r.stderr
    pulled = [p for p in (maildir / "INBOX").rglob("*") if p.is_file() and "," in p.name]
    assert any(b"Subject: far side" in p.read_bytes() for p in pulled), pulled
    # A message made on the near side goes up, into a new folder too.
    (maildir / "Notes" / "new").mkdir(parents=True)
    (maildir / "Notes" / "cur").mkdir()
    (maildir / "Notes" / "tmp").mkdir()
    (maildir / "Notes" / "new" / "1.local").write_bytes(msg("near side", b"from the client\r\n"))
    time.sleep(1.1)  # mbsync skips maildirs modified within the last second
    r = run()
    assert r.returncode == 0, r.stdout + r.stderr
    m = imap(inode)
    ok(m.select("Notes"))
    data = ok(m.fetch("1", "(BODY.PEEK[TEXT])"))
    assert data[0][1] == b"from the client\r\n"
    m.logout()


@pytest.mark.skipif(not shutil.which("fetchmail"), reason="fetchmail not installed")
def test_fetchmail(inode, tmp_path):
    for i in range(2):
        send(inode, ALICE, msg(f"fm{i}", f"fetchmail body {i}\r\n".encode()))
    host, port = inode.addrs["imap"]
    out = tmp_path / "fetched"
    rc = tmp_path / "fetchmailrc"
    rc.write_text(f'poll {host} port {port} protocol IMAP\n'
                  f'  user "{ALICE}" password "{PW}" is "nobody" here\n'
                  f'  keep\n  mda "/bin/sh -c \'cat >> {out}\'"\n')
    rc.chmod(0o600)
    r = subprocess.run(["fetchmail", "-f", str(rc), "-a", "--nosslcertck", "--idfile", str(tmp_path / "ids")],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stdout + r.stderr
    got = out.read_bytes()
    assert b"fetchmail body 0" in got and b"fetchmail body 1" in got
