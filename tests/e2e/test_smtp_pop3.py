"""SMTP delivery and POP3 retrieval against a real `quill serve` process."""

from __future__ import annotations

import base64
import json
import os
import poplib
import random
import signal
import smtplib
import time

import pytest

from mailutil import (AUTH_FAIL_DELAY, CRLF, Raw, count, curl_retr, curl_send, fetch_all, pop3, pop3_login, retr,
                      send, smtp, split_trace, uidl)

DOMAIN = "quill.test"
ALICE, BOB, CAROL = (f"{n}@{DOMAIN}" for n in ("alice", "bob", "carol"))
PW = "s3cret pass"  # a space on purpose: PASS takes the rest of the line


def message(subject: str, body: bytes, extra_headers: bytes = b"") -> bytes:
    return (b"From: Sender <sender@remote.test>\r\n"
            b"To: Alice <" + ALICE.encode() + b">\r\n"
            b"Subject: " + subject.encode() + b"\r\n"
            b"Message-ID: <" + os.urandom(8).hex().encode() + b"@remote.test>\r\n"
            + extra_headers +
            b"\r\n" + body)


def tricky_body() -> bytes:
    """8-bit bytes, CRLF endings, dot lines, whitespace: all must survive."""
    high = bytes(range(0x80, 0x100))
    return CRLF.join([
        b"plain ascii line",
        b".a line starting with a dot",
        b"..two dots",
        b".",  # a lone dot: would end DATA if not stuffed
        b"...",
        b". space after dot",
        b"",
        b"8-bit: " + high[:64],
        b"8-bit: " + high[64:],
        "utf-8: héllo wörld ✉ 日本語".encode(),
        b"tab\there and trailing spaces   ",
        b"ctrl \x01\x02\x1b[0m \x7f bytes",
        b"\tindented",
        b"",
        b"",
        b"last line",
    ]) + CRLF


@pytest.fixture
def users(node):
    for u in (ALICE, BOB, CAROL):
        node.add_user(u, PW)
    return node


# ---- EHLO, VRFY -------------------------------------------------------------

def test_ehlo_advertises_extensions(node):
    with smtp(node) as s:
        code, _ = s.ehlo()
        assert code == 250
        for ext in ("pipelining", "size", "8bitmime", "enhancedstatuscodes"):
            assert s.has_extn(ext), f"{ext} not in EHLO: {s.esmtp_features}"
        # SIZE is advertised without a number (RFC 1870 §4): go-smtp's own
        # limit is off by one, so the limit is enforced by Quill at MAIL
        # (declared SIZE=) and DATA; see internal/smtp.
        assert s.esmtp_features["size"] == ""


def test_vrfy_does_not_disclose_users(users):
    with smtp(users) as s:
        s.ehlo()
        known = s.verify(ALICE)
        unknown = s.verify(f"nobody@{DOMAIN}")
        foreign = s.verify("someone@elsewhere.test")
        bare_known = s.verify("alice")
        bare_unknown = s.verify("nobody")
    norm = lambda r, a: (r[0], r[1].replace(a.encode(), b"ADDR"))  # noqa: E731
    assert norm(known, ALICE) == norm(unknown, f"nobody@{DOMAIN}") == norm(foreign, "someone@elsewhere.test")
    assert norm(bare_known, "alice") == norm(bare_unknown, "nobody")
    assert known[0] in (252, 502, 550), known  # never a 250 confirming the user


def test_smtp_pipelining(users):
    """RFC 2920: a whole transaction sent in one write gets its replies in order."""
    msg = message("pipelined", b"one write\r\n")
    with Raw(users.smtp_addr) as r:
        assert r.line().startswith(b"220")
        r.cmd("EHLO client.test")
        assert r.smtp_reply()[0] == 250
        r.send(b"MAIL FROM:<sender@remote.test>\r\n"
               b"RCPT TO:<" + ALICE.encode() + b">\r\n"
               b"RCPT TO:<nobody@" + DOMAIN.encode() + b">\r\n"
               b"RCPT TO:<" + BOB.encode() + b">\r\n"
               b"DATA\r\n")
        codes = [r.smtp_reply()[0] for _ in range(5)]
        assert codes == [250, 250, 550, 250, 354], codes
        r.send(msg + b".\r\n" + b"RSET\r\nNOOP\r\nQUIT\r\n")
        codes = [r.smtp_reply()[0] for _ in range(4)]
        assert codes == [250, 250, 250, 221], codes
    for u in (ALICE, BOB):
        got = fetch_all(users, u, PW)
        assert len(got) == 1
        split_trace(got[0][1], msg)


def test_pop3_pipelining(users):
    """RFC 2449 §6.6: commands sent together are answered in order."""
    msgs = [message(f"p{i}", f"pipelined {i}\r\n".encode()) for i in range(3)]
    for m in msgs:
        send(users, ALICE, m)
    with Raw(users.pop3_addr) as r:
        assert r.line().startswith(b"+OK")
        r.send(f"USER {ALICE}\r\nPASS {PW}\r\nSTAT\r\nRETR 1\r\nRETR 2\r\nUIDL\r\nRETR 3\r\n"
               "DELE 2\r\nQUIT\r\n".encode())
        assert r.line().startswith(b"+OK")
        assert r.line().startswith(b"+OK")
        assert r.line().startswith(b"+OK 3 ")
        got = []
        for _ in range(2):
            assert r.line().startswith(b"+OK")
            got.append(r.multiline())
        assert r.line().startswith(b"+OK")
        assert len(r.multiline().splitlines()) == 3
        assert r.line().startswith(b"+OK")
        got.append(r.multiline())
        assert r.line().startswith(b"+OK")  # DELE
        assert r.line().startswith(b"+OK")  # QUIT
    for g, m in zip(got, msgs):
        split_trace(g, m)
    assert count(users, ALICE, PW) == 2


# ---- byte-exact round trips ------------------------------------------------

def test_roundtrip_8bit_crlf_dots_smtplib_poplib(users):
    msg = message("tricky bytes", tricky_body())
    assert send(users, ALICE, msg) == {}
    with pop3(users, ALICE, PW) as p:
        n, size = p.stat()
        assert n == 1
        got = retr(p, 1)
        # LIST and STAT report the exact size RETR sends, before stuffing.
        assert size == len(got)
        assert p.list(1).split()[2] == str(len(got)).encode()
        resp, _, _ = p.retr(1)
        assert resp.split()[:2] == [b"+OK", str(len(got)).encode()], resp
    trace = split_trace(got, msg)
    assert b"quill.test" in trace  # --hostname names the node in Received


def test_roundtrip_with_curl(users, curl, tmp_path):
    msg = message("curl bytes", tricky_body())
    path = tmp_path / "m.eml"
    path.write_bytes(msg)
    r = curl_send(curl, users, [ALICE, BOB], path)
    assert r.returncode == 0, r.stderr
    for u in (ALICE, BOB):
        r = curl_retr(curl, users, u, PW, 1)
        assert r.returncode == 0, r.stderr
        split_trace(r.stdout, msg)
        # curl and poplib see the same bytes.
        assert fetch_all(users, u, PW)[0][1] == r.stdout
    # curl's LIST (no message number) shows one message.
    r = curl_retr(curl, users, ALICE, PW)
    assert r.returncode == 0 and r.stdout.strip().split(b" ")[0] == b"1", r


def test_roundtrip_10mb(users, curl, tmp_path):
    rnd = random.Random(7)
    lines = []
    size = 0
    i = 0
    while size < 10 * 1024 * 1024:
        # 8-bit content, occasional leading dots, lines well under 998 octets.
        ln = bytes(rnd.choice(b"abc .\t\x80\xe9\xff0123456789") for _ in range(rnd.randint(0, 200)))
        if i % 97 == 0:
            ln = b"." + ln
        ln = ln.replace(b"\r", b"").replace(b"\n", b"")
        lines.append(ln)
        size += len(ln) + 2
        i += 1
    msg = message("ten megabytes", CRLF.join(lines) + CRLF)
    assert len(msg) > 10 * 1024 * 1024
    t0 = time.monotonic()
    assert send(users, ALICE, msg) == {}
    with pop3(users, ALICE, PW) as p:
        got = retr(p, 1)
    split_trace(got, msg)
    r = curl_retr(curl, users, ALICE, PW, 1)
    assert r.returncode == 0, r.stderr
    assert r.stdout == got
    assert time.monotonic() - t0 < 60


def test_several_recipients_one_transaction(users):
    msg = message("to three", b"hello all\r\n")
    refused = send(users, [ALICE, BOB, CAROL, f"ghost@{DOMAIN}"], msg)
    # The unknown one is refused at RCPT; the others get the message.
    assert set(refused) == {f"ghost@{DOMAIN}"}
    assert refused[f"ghost@{DOMAIN}"][0] == 550
    for u in (ALICE, BOB, CAROL):
        got = fetch_all(users, u, PW)
        assert len(got) == 1, (u, got)
        split_trace(got[0][1], msg)


def test_recipient_case_insensitive_domain(users):
    msg = message("case", b"x\r\n")
    assert send(users, f"alice@{DOMAIN.upper()}", msg) == {}
    assert count(users, ALICE, PW) == 1


def test_null_reverse_path_and_8bitmime_param(users):
    # Bounces come from <>; BODY=8BITMIME is the 8-bit declaration.
    msg = message("bounce", b"8-bit \xe9\xff\r\n")
    with smtp(users) as s:
        s.ehlo()
        assert s.mail("", ["BODY=8BITMIME"])[0] == 250
        assert s.rcpt(ALICE)[0] == 250
        assert s.data(msg)[0] == 250
    got = fetch_all(users, ALICE, PW)
    split_trace(got[0][1], msg, mail_from="")


def test_duplicate_recipient_gets_one_copy(users):
    msg = message("dup", b"once\r\n")
    with smtp(users) as s:
        s.ehlo()
        s.mail("sender@remote.test")
        for r in (ALICE, ALICE, ALICE.upper()):
            assert s.rcpt(r)[0] == 250
        assert s.data(msg)[0] == 250
    assert len(fetch_all(users, ALICE, PW)) == 1


def test_bare_lf_message_size_matches_retr(users):
    """LIST/STAT/RETR sizes are the octets RETR really sends (RFC 1939 §5,
    "exact size"), even for a message that arrived with bare LF endings,
    which RETR sends as CRLF."""
    body = b"Subject: bare lf\n\nline one\nline two\r\n.dot line\nend\r\n"
    with Raw(users.smtp_addr) as r:
        assert r.line().startswith(b"220")
        r.cmd("EHLO client.test")
        assert r.smtp_reply()[0] == 250
        assert r.cmd("MAIL FROM:<sender@remote.test>").startswith(b"250")
        assert r.cmd(f"RCPT TO:<{ALICE}>").startswith(b"250")
        assert r.cmd("DATA").startswith(b"354")
        r.send(body.replace(b"\n.", b"\n..") + b".\r\n")
        reply = r.line()
        if not reply.startswith(b"250"):
            pytest.skip(f"server refuses bare LF, which is fine: {reply!r}")
        r.cmd("QUIT")
    with pop3(users, ALICE, PW) as p:
        _, listed = p.stat()
        got = retr(p, 1)
    assert b"\r\nline one\r\nline two\r\n" in got
    assert listed == len(got), f"LIST/STAT say {listed} octets, RETR sent {len(got)}"


def test_message_of_exactly_max_size_accepted(quill_factory):
    """SIZE advertises the largest message accepted: one of exactly that
    many octets is accepted, one more is refused."""
    limit = 20000
    n = quill_factory("--max-message-size", str(limit))
    n.add_user(ALICE, PW)

    def of_size(k: int) -> bytes:
        m = message("exact", b"")
        line = b"f" * 78 + CRLF
        m += line * ((k - len(m)) // len(line) - 1)
        m += b"g" * (k - len(m) - 2) + CRLF
        assert len(m) == k
        return m

    with smtp(n) as s:
        assert _send_undeclared(s, ALICE, of_size(limit + 1))[0] == 552
        assert _send_undeclared(s, ALICE, of_size(limit - 1))[0] == 250
        code, text = _send_undeclared(s, ALICE, of_size(limit))
        assert code == 250, f"message of exactly --max-message-size octets refused: {code} {text!r}"


# ---- SMTP refusals ---------------------------------------------------------

def test_unknown_user_at_served_domain_550_511(users):
    with smtp(users) as s:
        s.ehlo()
        assert s.mail("sender@remote.test")[0] == 250
        code, text = s.rcpt(f"nobody@{DOMAIN}")
        assert code == 550 and text.startswith(b"5.1.1"), (code, text)
        # The transaction goes on: a good recipient is still accepted.
        assert s.rcpt(ALICE)[0] == 250
        code, _ = s.data(message("after refusal", b"ok\r\n"))
        assert code == 250
    assert count(users, ALICE, PW) == 1


def test_foreign_domain_no_open_relay(users):
    with smtp(users) as s:
        s.ehlo()
        assert s.mail("sender@remote.test")[0] == 250
        for rcpt in ("victim@elsewhere.test", f"alice@sub.{DOMAIN}", f"alice@{DOMAIN}.evil.test",
                     "x@example.com"):
            code, text = s.rcpt(rcpt)
            assert code == 550 and text.startswith(b"5.7.1"), (rcpt, code, text)
        # DATA with no accepted recipient is refused.
        s.putcmd("data")
        code, _ = s.getreply()
        assert code >= 500


def test_mail_from_local_user_does_not_open_relay(users):
    # A forged local sender must not make relaying possible.
    with smtp(users) as s:
        s.ehlo()
        assert s.mail(ALICE)[0] == 250
        code, text = s.rcpt("victim@elsewhere.test")
        assert code == 550 and text.startswith(b"5.7.1"), (code, text)


def _send_undeclared(s: smtplib.SMTP, rcpt: str, msg: bytes) -> tuple[int, bytes]:
    """MAIL FROM without SIZE=, so only the bytes on the wire can be judged."""
    s.ehlo_or_helo_if_needed()
    assert s.mail("sender@remote.test")[0] == 250
    assert s.rcpt(rcpt)[0] == 250
    return s.data(msg)


def test_over_size_limit_552(quill_factory):
    limit = 20000
    n = quill_factory("--max-message-size", str(limit))
    n.add_user(ALICE, PW)
    with smtp(n) as s:
        s.ehlo()
        assert s.has_extn("size")
        # Declared too big in MAIL FROM SIZE=.
        code, text = s.mail("sender@remote.test", [f"SIZE={limit + 1}"])
        assert code == 552, (code, text)
        s.rset()
        # Not declared, too big on the wire.
        big = message("too big", (b"y" * 78 + CRLF) * (limit // 80 + 10))
        assert len(big) > limit
        code, text = _send_undeclared(s, ALICE, big)
        assert code == 552, (code, text)
    # The session and the node go on: one under the limit is accepted.
    small = message("fits", (b"z" * 78 + CRLF) * (limit // 80 - 20))
    assert len(small) < limit
    assert send(n, ALICE, small) == {}
    got = fetch_all(n, ALICE, PW)
    assert len(got) == 1
    split_trace(got[0][1], small)


def test_over_size_limit_same_session_continues(quill_factory):
    limit = 20000
    n = quill_factory("--max-message-size", str(limit))
    n.add_user(ALICE, PW)
    big = message("too big", (b"y" * 78 + CRLF) * (limit // 80 + 10))
    small = message("fits", b"small\r\n")
    with smtp(n) as s:
        assert _send_undeclared(s, ALICE, big)[0] == 552
        assert _send_undeclared(s, ALICE, small)[0] == 250
    got = fetch_all(n, ALICE, PW)
    assert len(got) == 1
    split_trace(got[0][1], small)


# ---- POP3 authentication ---------------------------------------------------

def _pass_reply(node, user, pw) -> tuple[bytes, bytes, float]:
    with pop3(node) as p:
        user_reply = p.user(user)
        t0 = time.monotonic()
        try:
            reply = p.pass_(pw)
        except poplib.error_proto as e:
            reply = e.args[0]
        return user_reply, reply, time.monotonic() - t0


def test_wrong_password_err_after_delay(users):
    _, reply, took = _pass_reply(users, ALICE, "wrong")
    assert reply.startswith(b"-ERR"), reply
    assert took >= AUTH_FAIL_DELAY * 0.95, took
    # The right password still works after a failure, on a new connection.
    assert count(users, ALICE, PW) == 0


def test_unknown_user_indistinguishable_from_wrong_password(users):
    u1, wrong_pw, t_wrong = _pass_reply(users, ALICE, "wrong")
    u2, no_user, t_none = _pass_reply(users, f"nobody@{DOMAIN}", "wrong")
    u3, foreign, t_foreign = _pass_reply(users, "nobody@elsewhere.test", "wrong")
    assert u1 == u2 == u3  # USER says nothing about the user
    assert wrong_pw.startswith(b"-ERR")
    assert wrong_pw == no_user == foreign
    assert min(t_wrong, t_none, t_foreign) >= AUTH_FAIL_DELAY * 0.95
    # Nor does the time taken: the median of a few tries of each is close
    # (an unknown user must cost a password hash too).
    tw = sorted(_pass_reply(users, ALICE, f"wrong{i}")[2] for i in range(5))[2]
    tn = sorted(_pass_reply(users, f"nobody{i}@{DOMAIN}", "wrong")[2] for i in range(5))[2]
    assert abs(tw - tn) < 0.1, (tw, tn)


def test_auth_plain_unknown_user_same_as_wrong_password(users):
    def auth(user, pw):
        with Raw(users.pop3_addr) as r:
            assert r.line().startswith(b"+OK")
            t0 = time.monotonic()
            cred = base64.b64encode(f"\0{user}\0{pw}".encode()).decode()
            reply = r.cmd(f"AUTH PLAIN {cred}")
            took = time.monotonic() - t0
            r.cmd("QUIT")
            return reply, took
    wrong, t1 = auth(ALICE, "wrong")
    unknown, t2 = auth(f"nobody@{DOMAIN}", "wrong")
    assert wrong.startswith(b"-ERR") and wrong == unknown
    assert min(t1, t2) >= AUTH_FAIL_DELAY * 0.95
    ok, _ = auth(ALICE, PW)
    assert ok.startswith(b"+OK"), ok


def test_bad_pop3_command_session_goes_on(users):
    send(users, ALICE, message("one", b"1\r\n"))
    with Raw(users.pop3_addr) as r:
        assert r.line().startswith(b"+OK")
        assert r.cmd("FOOBAR").startswith(b"-ERR")
        assert r.cmd("STAT").startswith(b"-ERR")  # not before login
        assert r.cmd(f"USER {ALICE}").startswith(b"+OK")
        assert r.cmd(f"PASS {PW}").startswith(b"+OK")
        assert r.cmd("XYZZY 1 2").startswith(b"-ERR")
        assert r.cmd("RETR 99").startswith(b"-ERR")
        assert r.cmd("RETR abc").startswith(b"-ERR")
        assert r.cmd("TOP 1").startswith(b"-ERR")
        assert r.cmd("DELE 0").startswith(b"-ERR")
        assert r.cmd("").startswith(b"-ERR")
        assert r.cmd("STAT").startswith(b"+OK 1 ")
        assert r.cmd("NOOP").startswith(b"+OK")
        assert r.cmd("QUIT").startswith(b"+OK")
    assert count(users, ALICE, PW) == 1


# ---- UIDL, DELE, RSET, TOP -------------------------------------------------

def _valid_uid(uid: str) -> bool:
    return 1 <= len(uid) <= 70 and all(0x21 <= ord(c) <= 0x7E for c in uid)


def test_uidl_stable_across_sessions_and_restart(users):
    for i in range(3):
        send(users, ALICE, message(f"m{i}", f"body {i}\r\n".encode()))
    with pop3(users, ALICE, PW) as p:
        first = uidl(p)
        bodies = {first[n]: retr(p, n) for n in first}
    assert len(first) == 3 and len(set(first.values())) == 3
    assert all(_valid_uid(u) for u in first.values()), first
    with pop3(users, ALICE, PW) as p:
        assert uidl(p) == first
        # UIDL n agrees with the listing.
        assert p.uidl(2).split()[2].decode() == first[2]
    assert users.restart() == 0
    with pop3(users, ALICE, PW) as p:
        assert uidl(p) == first
        assert {first[n]: retr(p, n) for n in first} == bodies
    # A new message gets a new UID; deleting one keeps the others' UIDs.
    send(users, ALICE, message("m3", b"body 3\r\n"))
    with pop3(users, ALICE, PW) as p:
        after = uidl(p)
        assert len(after) == 4 and set(first.values()) < set(after.values())
        p.dele(1)
    with pop3(users, ALICE, PW) as p:
        left = uidl(p)
    assert sorted(left.values()) == sorted(set(after.values()) - {first[1]})
    assert [left[n] for n in sorted(left)] == [after[n] for n in sorted(after)][1:]


def test_dele_takes_effect_only_at_quit(users):
    for i in range(3):
        send(users, ALICE, message(f"m{i}", f"body {i}\r\n".encode()))
    with pop3(users, ALICE, PW) as p:
        uids = uidl(p)

    # DELE then RSET: nothing deleted.
    with pop3(users, ALICE, PW) as p:
        p.dele(1)
        assert p.stat()[0] == 2
        with pytest.raises(poplib.error_proto):
            p.retr(1)  # a deleted message may not be referred to
        with pytest.raises(poplib.error_proto):
            p.dele(1)
        p.rset()
        assert p.stat()[0] == 3
        retr(p, 1)
    assert count(users, ALICE, PW) == 3

    # DELE then a dropped connection (no QUIT): nothing deleted.
    r = pop3_login(users, ALICE, PW)
    assert r.cmd("DELE 1").startswith(b"+OK")
    assert r.cmd("DELE 2").startswith(b"+OK")
    r.close()
    time.sleep(0.3)
    with pop3(users, ALICE, PW) as p:
        assert uidl(p) == uids

    # DELE then QUIT: deleted, the others untouched.
    with pop3(users, ALICE, PW) as p:
        p.dele(2)
        # Another session opened meanwhile still sees all three.
        with pop3(users, ALICE, PW) as q:
            assert q.stat()[0] == 3
        bye = p.quit()
        assert bye.startswith(b"+OK")
    with pop3(users, ALICE, PW) as p:
        assert list(uidl(p).values()) == [uids[1], uids[3]]


def test_top(users):
    body = CRLF.join(f"body line {i}".encode() for i in range(1, 11)) + CRLF
    msg = message("top test", body)
    send(users, ALICE, msg)
    with pop3(users, ALICE, PW) as p:
        full = retr(p, 1)
        head, sep, rest = full.partition(b"\r\n\r\n")
        assert sep and rest == body
        resp, lines, _ = p.top(1, 0)
        assert resp.startswith(b"+OK")
        assert b"".join(ln + CRLF for ln in lines) == head + b"\r\n\r\n"
        resp, lines, _ = p.top(1, 3)
        assert b"".join(ln + CRLF for ln in lines) == head + b"\r\n\r\n" + \
            b"body line 1\r\nbody line 2\r\nbody line 3\r\n"
        resp, lines, _ = p.top(1, 1000)
        assert b"".join(ln + CRLF for ln in lines) == full
        with pytest.raises(poplib.error_proto):
            p.top(2, 0)
        # TOP does not mark anything read or deleted.
        assert p.stat()[0] == 1
    assert count(users, ALICE, PW) == 1


def test_concurrent_sessions_delete_same_message(users):
    for i in range(3):
        send(users, ALICE, message(f"m{i}", b"x\r\n"))
    with pop3(users, ALICE, PW) as a, pop3(users, ALICE, PW) as b:
        uids = uidl(a)
        a.dele(1)
        b.dele(1)
        b.dele(2)
        assert a.quit().startswith(b"+OK")
        assert b.quit().startswith(b"+OK")  # already gone is not an error
    with pop3(users, ALICE, PW) as p:
        assert list(uidl(p).values()) == [uids[3]]


def test_mail_arriving_during_session(users):
    send(users, ALICE, message("old", b"old\r\n"))
    with pop3(users, ALICE, PW) as p:
        assert p.stat()[0] == 1
        send(users, ALICE, message("new", b"new\r\n"))
        # The session's maildrop is fixed at login (RFC 1939 §5) ...
        assert p.stat()[0] == 1
        with pytest.raises(poplib.error_proto):
            p.retr(2)
        p.dele(1)
    # ... and its QUIT deletes only what it saw.
    got = fetch_all(users, ALICE, PW)
    assert len(got) == 1 and b"Subject: new\r\n" in got[0][1]


# ---- restarts ---------------------------------------------------------------

def test_restart_between_delivery_and_retrieval(users):
    msgs = [message(f"r{i}", tricky_body()) for i in range(3)]
    for m in msgs:
        send(users, [ALICE, BOB], m)
    old_ports = dict(users.addrs)
    assert users.restart() == 0
    assert users.addrs.keys() >= {"smtp", "pop3", "http"}
    del old_ports  # ports may differ; the helpers use the new ones
    for u in (ALICE, BOB):
        got = fetch_all(users, u, PW)
        assert len(got) == 3
        for (_, stored), m in zip(got, msgs):
            split_trace(stored, m)
    # Users survive too: still accepted after restart.
    send(users, CAROL, message("after restart", b"ok\r\n"))
    assert count(users, CAROL, PW) == 1


def test_kill9_between_delivery_and_retrieval(users):
    msg = message("durable", tricky_body())
    send(users, ALICE, msg)  # 250 means fsync'd
    users.kill9()
    users.start()
    got = fetch_all(users, ALICE, PW)
    assert len(got) == 1
    split_trace(got[0][1], msg)


def test_sigterm_exits_zero(node):
    pid = node.pid
    t0 = time.monotonic()
    assert node.stop() == 0
    assert time.monotonic() - t0 < 10
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_sigterm_drains_open_sessions(users):
    """Sessions open at SIGTERM finish their work; then the node exits 0."""
    send(users, ALICE, message("one", b"1\r\n"))
    send(users, ALICE, message("two", b"2\r\n"))
    r = pop3_login(users, ALICE, PW)
    s = smtplib.SMTP(*users.smtp_addr, timeout=30)
    try:
        s.ehlo()
        os.kill(users.pid, signal.SIGTERM)
        time.sleep(0.3)
        assert users.proc.poll() is None, "exited with sessions still open"
        # The open POP3 session still works, and its QUIT updates.
        assert r.cmd("RETR 1").startswith(b"+OK")
        r.multiline()
        assert r.cmd("DELE 1").startswith(b"+OK")
        assert r.cmd("QUIT").startswith(b"+OK")
        r.close()
        # The open SMTP session may still deliver.
        assert s.sendmail("sender@remote.test", [ALICE], message("three", b"3\r\n")) == {}
        s.quit()
    finally:
        r.close()
        s.close()
    assert users.proc.wait(timeout=15) == 0
    users.proc = None
    users.start()
    subjects = [m.split(b"Subject: ")[1].split(b"\r\n")[0] for _, m in fetch_all(users, ALICE, PW)]
    assert subjects == [b"two", b"three"]


# ---- admin CLI ---------------------------------------------------------------

def _listed(node) -> set[str]:
    out = node.cli("user", "list").stdout.splitlines()
    assert out[0].split()[0] == "ADDRESS", out
    return {ln.split()[0] for ln in out[1:] if ln.strip()}


def test_admin_cli_user_lifecycle(node):
    node.add_user(ALICE, "first-pw")
    node.add_user(BOB, PW)
    assert _listed(node) == {ALICE, BOB}
    # Adding the same address twice fails.
    assert node.cli("user", "add", ALICE, "--password", "x", check=False).returncode != 0

    send(node, ALICE, message("before passwd", b"keep me\r\n"))
    # Log in first, so a cache of verified passwords would be warm.
    assert count(node, ALICE, "first-pw") == 1
    node.cli("user", "passwd", ALICE, "--password", "second-pw")
    _, reply, _ = _pass_reply(node, ALICE, "first-pw")
    assert reply.startswith(b"-ERR"), "old password still accepted after passwd"
    assert count(node, ALICE, "second-pw") == 1  # mail kept across passwd

    assert count(node, ALICE, "second-pw") == 1
    node.cli("user", "del", ALICE)
    assert _listed(node) == {BOB}
    _, reply, _ = _pass_reply(node, ALICE, "second-pw")
    assert reply.startswith(b"-ERR")
    with smtp(node) as s:
        s.ehlo()
        s.mail("sender@remote.test")
        code, text = s.rcpt(ALICE)
        assert code == 550 and text.startswith(b"5.1.1"), (code, text)
    # The domain is still served because bob is in it; deleting bob too
    # makes it foreign.
    node.cli("user", "del", BOB)
    assert _listed(node) == set()
    with smtp(node) as s:
        s.ehlo()
        s.mail("sender@remote.test")
        code, text = s.rcpt(BOB)
        assert code == 550, (code, text)

    # Re-adding a deleted address starts with an empty mailbox.
    node.add_user(ALICE, "third-pw")
    assert count(node, ALICE, "third-pw") == 0
    # Deleting or changing a user that does not exist is an error.
    assert node.cli("user", "del", f"ghost@{DOMAIN}", check=False).returncode != 0
    assert node.cli("user", "passwd", f"ghost@{DOMAIN}", "--password", "x", check=False).returncode != 0


def test_admin_cli_survives_restart_and_password_from_stdin(node, quill_bin):
    import subprocess
    node.add_domain(DOMAIN)
    r = subprocess.run([quill_bin, "user", "add", ALICE, "--server", node.http_url, "--data", str(node.data_dir)],
                       input="piped-pw\n", capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert node.restart() == 0
    assert _listed(node) == {ALICE}
    assert count(node, ALICE, "piped-pw") == 0


def test_admin_api_post_users(node):
    # A user only in a served domain.
    status, body = node.api("POST", "/api/users",
                            json.dumps({"address": ALICE, "password": PW}).encode())
    assert status == 400 and b"not served" in body, (status, body)
    status, body = node.api("POST", "/api/domains", json.dumps({"name": DOMAIN}).encode())
    assert status == 201, (status, body)
    status, body = node.api("POST", "/api/users",
                            json.dumps({"address": ALICE, "password": PW}).encode())
    assert 200 <= status < 300, (status, body)
    send(node, ALICE, message("via api", b"x\r\n"))
    assert count(node, ALICE, PW) == 1
    status, body = node.api("GET", "/api/users")
    assert status == 200 and ALICE in {u["address"] for u in json.loads(body)}
    status, _ = node.api("POST", "/api/users", b"{not json")
    assert 400 <= status < 500


def test_admin_cli_rejects_bad_input(node):
    node.add_domain(DOMAIN)
    for args in (["user", "add", "notanaddress", "--password", "x"],
                 ["user", "add", f"@{DOMAIN}", "--password", "x"],
                 ["user", "add", "sp ace@" + DOMAIN, "--password", "x"],
                 ["user", "add", "../x@" + DOMAIN, "--password", "x"],
                 ["user", "add", "a/b@" + DOMAIN, "--password", "x"],
                 ["user", "add", "victim@gmail.com", "--password", "x"],
                 ["domain", "add", "bad_name.org"],
                 ["user", "add", ALICE, "--password", "p" * 5000]):
        r = node.cli(*args, check=False)
        assert r.returncode != 0 and r.stderr.strip(), (args, r)
    assert _listed(node) == set()
    # With no password and nothing on stdin, add refuses rather than
    # creating a user without one.
    r = node.cli("user", "add", ALICE, check=False)
    assert r.returncode != 0
    assert _listed(node) == set()


def test_addresses_are_case_insensitive(node):
    node.add_user("Bob@Quill.TEST", PW)
    assert _listed(node) == {BOB}
    assert send(node, "BOB@quill.test", message("case", b"x\r\n")) == {}
    assert count(node, "BOB@QUILL.TEST", PW) == 1
    assert count(node, BOB, PW) == 1
    # The same user under another case is a duplicate.
    assert node.cli("user", "add", BOB.upper(), "--password", "x", check=False).returncode != 0


def test_user_deleted_during_pop3_session(users):
    send(users, ALICE, message("doomed", b"x\r\n"))
    r = pop3_login(users, ALICE, PW)
    try:
        users.cli("user", "del", ALICE)
        # Whatever the open session answers now, the node must not fall over,
        # and the deleted user's mail must not come back.
        r.cmd("STAT")
        r.cmd("DELE 1")
        r.cmd("QUIT")
    finally:
        r.close()
    assert _listed(users) == {BOB, CAROL}
    users.add_user(ALICE, PW)
    assert count(users, ALICE, PW) == 0
    send(users, ALICE, message("fresh", b"y\r\n"))
    got = fetch_all(users, ALICE, PW)
    assert len(got) == 1 and b"Subject: fresh" in got[0][1]


# ---- domains and aliases (issue 14) -----------------------------------------

def test_aliases_subaddresses_and_role_addresses(node):
    """What an operator sets with `quill domain` and `quill alias` reaches
    the users by SMTP: an alias (each user once however many recipients
    name them), user+tag@, postmaster@ and abuse@ (RFC 2142) and the
    catch-all; an address nothing takes is refused at RCPT."""
    node.cli("domain", "add", DOMAIN, "--postmaster", BOB)
    for u in (ALICE, BOB, CAROL):
        node.add_user(u, PW)
    r = node.cli("alias", "set", f"team@{DOMAIN}", ALICE, BOB)
    assert "alice@quill.test, bob@quill.test" in r.stdout, r.stdout
    assert f"team@{DOMAIN}" in node.cli("alias", "list", "--domain", DOMAIN).stdout
    assert BOB in node.cli("domain", "list").stdout

    assert send(node, [f"team@{DOMAIN}", f"alice+news@{DOMAIN}"], message("team", b"x\r\n")) == {}
    assert send(node, f"postmaster@{DOMAIN}", message("pm", b"x\r\n")) == {}
    assert send(node, f"Abuse@{DOMAIN}", message("abuse", b"x\r\n")) == {}
    with pytest.raises(smtplib.SMTPRecipientsRefused):
        send(node, f"nobody@{DOMAIN}", message("lost", b"x\r\n"))
    assert (count(node, ALICE, PW), count(node, BOB, PW), count(node, CAROL, PW)) == (1, 3, 0)

    node.cli("domain", "set", DOMAIN, "--catch-all", CAROL)
    assert send(node, f"nobody@{DOMAIN}", message("caught", b"x\r\n")) == {}
    assert count(node, CAROL, PW) == 1
    # A domain in use stays; an alias goes.
    assert node.cli("domain", "del", DOMAIN, check=False).returncode != 0
    node.cli("alias", "del", f"team@{DOMAIN}")
    assert f"team@{DOMAIN}" not in node.cli("alias", "list").stdout


# ---- the log an operator reads (issue 14) -----------------------------------

def _log_records(path) -> list[dict]:
    out = []
    for line in path.read_text("utf-8").splitlines():
        out.append(json.loads(line))  # every line is one JSON record
    return out


def _wait_record(path, pred, what: str, timeout: float = 10):
    deadline = time.monotonic() + timeout
    while True:
        recs = _log_records(path) if path.exists() else []
        found = [r for r in recs if pred(r)]
        if found:
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no log record for {what} in {path}: {recs[-20:]}")
        time.sleep(0.1)


def test_log_lines_json_file_reopened_on_sighup(quill_factory, tmp_path):
    """--log-format json --log-file: one record per accepted message, per
    refused recipient (with the code the client got), per login and failed
    login; SIGHUP after the file was moved away (logrotate) starts a new
    file of the same name."""
    log = tmp_path / "quill.log"
    node = quill_factory("--log-format", "json", "--log-file", str(log))
    node.add_user(ALICE, PW)
    assert send(node, ALICE, message("logged", b"x\r\n")) == {}
    rec = _wait_record(log, lambda r: r.get("msg") == "message accepted", "an accepted message")
    assert rec["rcpts"] == ALICE and rec["from"] == "sender@remote.test" and rec["size"] > 0 and rec["id"], rec
    with pytest.raises(smtplib.SMTPRecipientsRefused):
        send(node, f"nobody@{DOMAIN}", message("lost", b"x\r\n"))
    rec = _wait_record(log, lambda r: r.get("msg") == "recipient refused", "a refused recipient")
    assert rec["code"] == 550 and rec["status"] == "5.1.1" and rec["rcpt"] == f"nobody@{DOMAIN}", rec
    assert count(node, ALICE, PW) == 1
    _wait_record(log, lambda r: r.get("msg") == "pop3: logged in" and r.get("user") == ALICE, "a POP3 login")
    with pytest.raises(poplib.error_proto):
        count(node, ALICE, "wrong")
    _wait_record(log, lambda r: r.get("msg") == "pop3: login failed", "a failed login")

    rotated = tmp_path / "quill.log.1"
    log.rename(rotated)
    node.proc.send_signal(signal.SIGHUP)
    _wait_record(log, lambda r: r.get("msg") == "SIGHUP: log file reopened", "the reopen, in the new file")
    assert send(node, ALICE, message("after rotation", b"x\r\n")) == {}
    _wait_record(log, lambda r: r.get("msg") == "message accepted", "a message after the rotation")
    assert not [r for r in _log_records(rotated) if r.get("msg") == "SIGHUP: log file reopened"]
