"""Migration (issue 14, item 6): `quill import imap` from a real Dovecot
serving a Maildir the test builds (nested folders, a non-ASCII name,
flags and keywords, 8-bit and non-UTF-8 messages, a large one, a
duplicate), compared folder by folder and message by message over IMAP on
both servers; reruns that copy nothing, then only what changed;
`quill import maildir` and `quill import mbox`; `quill export` to a
Maildir that Dovecot then serves with the same messages, flags, dates,
UIDs and UIDVALIDITY."""

from __future__ import annotations

import imaplib
import os
import re
import subprocess
from pathlib import Path

import pytest

import dovecot
from dovecot import Dovecot, folders, messages, need_dovecot, quote, remove, scratch_dir
from mailutil import ok, cluster_pair

DOMAIN = "example.org"
PW = "quill pass"
CLI_TIMEOUT = 180.0
T0 = 1_700_000_000  # internal dates of the built messages start here

# Dovecot's special-use folders in the built Maildir: "Sent Messages" is
# marked \Sent, and import maps it onto the user's own Sent.
SPECIAL = {"Sent Messages": "\\Sent", "Drafts": "\\Drafts", "Trash": "\\Trash"}


def msg(subject: str, body: bytes = b"hello\n", extra: bytes = b"", mid: bool = True) -> bytes:
    """A message as a Maildir file holds it: LF line ends."""
    h = b"From: Alice <alice@remote.test>\nTo: bob@example.org\nSubject: " + subject.encode() + b"\n"
    if mid:
        h += b"Message-ID: <" + os.urandom(6).hex().encode() + b"@remote.test>\n"
    return h + b"Date: Tue, 14 Nov 2023 22:13:20 +0000\n" + extra + b"\n" + body


def big_body() -> bytes:
    line = b"QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWZnaGlqa2xtbm9wcXJzdHV2d3h5ejAx\n"
    return b"--b\nContent-Type: application/octet-stream\nContent-Transfer-Encoding: base64\n\n" + line * 45000 + b"--b--\n"


# The built Maildir: directory (Maildir++) -> [(info flags, bytes, in new/)].
# Keywords a, b, c are $Label1, Work and $Forwarded (dovecot-keywords).
DUP = msg("the same twice")
TREE = {
    "": [("S", msg("plain, seen"), False),
         ("RS", msg("8-bit UTF-8", "Grüße aus Köln, 日本語\n".encode(), b"Content-Type: text/plain; charset=utf-8\nContent-Transfer-Encoding: 8bit\n"), False),
         ("F", msg("latin-1 caf\xe9".encode("latin-1").decode("latin-1"), "caf\xe9 cr\xe8me\n".encode("latin-1"),
                   b"Content-Type: text/plain; charset=iso-8859-1\nContent-Transfer-Encoding: 8bit\n"), False),
         ("Sab", msg("keywords"), False),
         ("Sc", msg("forwarded"), False),
         ("", DUP, False),
         ("", DUP, False),
         ("S", msg("no message id", mid=False), False),
         ("S", msg("big", big_body(), b"MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=b\n"), False),
         ("", msg("new, unseen"), True)],
    ".Sent Messages": [("S", msg("sent one"), False), ("RS", msg("sent two"), False)],
    ".Drafts": [("DS", msg("a draft"), False)],
    ".Trash": [("ST", msg("deleted"), False)],
    ".Archive.2024": [("S", msg("archived 2024"), False)],
    ".Foo.Bar.Baz": [("F", msg("deep"), False)],
    ".Caf&AOk-": [("S", msg("café folder"), False)],
    ".Empty": [],
}
SUBSCRIBED = ["Sent Messages", "Archive/2024", "Café", "Foo/Bar/Baz"]


def build_maildir(root: Path) -> None:
    n = 0
    for d, msgs in TREE.items():
        folder = root / d if d else root
        for sub in ("cur", "new", "tmp"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        if d:
            (folder / "maildirfolder").write_bytes(b"")
        (folder / "dovecot-keywords").write_text("0 $Label1\n1 Work\n2 $Forwarded\n")
        for info, raw, new in msgs:
            n += 1
            name = f"{T0 + n * 3600}.M{n}P1.builder"
            path = folder / ("new" if new else "cur") / (name if new else f"{name}:2,{info}")
            path.write_bytes(raw)
            os.utime(path, (T0 + n * 3600, T0 + n * 3600))
    (root / "subscriptions").write_text("V\t2\n\n" + "".join(s.replace("/", "\t") + "\n" for s in SUBSCRIBED))


@pytest.fixture
def source():
    """Dovecot serving the built Maildir."""
    need_dovecot()
    root = dovecot.scratch_dir()
    try:
        build_maildir(root / "Maildir")
        d = Dovecot(root, root / "Maildir", SPECIAL).start()
        try:
            yield d
        finally:
            d.stop()
    finally:
        remove(root)


def quill(node, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [node.binary, *args, "--server", node.http_url, "--data", str(node.data_dir)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=CLI_TIMEOUT, stdin=subprocess.DEVNULL)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def summary(r: subprocess.CompletedProcess) -> dict[str, int]:
    """The numbers of an import's or export's summary line."""
    m = re.search(r"(\d+) folders, (\d+) messages copied .*?, (\d+) already there, (\d+) with flags brought up to date, (\d+) errors",
                  r.stdout)
    assert m, r.stdout + r.stderr
    return dict(zip(("folders", "copied", "same", "flagged", "errors"), map(int, m.groups())))


def quill_imap(node, user: str) -> imaplib.IMAP4:
    host, port = node.addrs["imap"]
    m = imaplib.IMAP4(host, port, timeout=dovecot.TIMEOUT)
    m.login(user, PW)
    return m


def compare(src: imaplib.IMAP4, dst: imaplib.IMAP4, rename: dict[str, str], uids: bool = False) -> int:
    """Every selectable folder of src against its namesake in dst (after
    rename): the same messages in the same order, byte for byte, with the
    same flags and internal dates (and UIDs and UIDVALIDITY when asked).
    Returns how many messages were compared."""
    src_folders, dst_folders = folders(src), folders(dst)
    n = 0
    for name in src_folders:
        target = rename.get(name, name)
        assert target in dst_folders, f"{name!r} ({target!r}) missing at the destination: {sorted(dst_folders)}"
        sv, smsgs = messages(src, name)
        dv, dmsgs = messages(dst, target)
        assert len(dmsgs) == len(smsgs), f"{name!r}: {len(smsgs)} messages at the source, {len(dmsgs)} at the destination"
        for (suid, sraw, sflags, sdate), (duid, draw, dflags, ddate) in zip(smsgs, dmsgs):
            where = f"{name!r} source UID {suid}, destination UID {duid}"
            assert draw == sraw, f"{where}: bytes differ ({len(sraw)} and {len(draw)} bytes)"
            assert dflags == sflags, f"{where}: flags {sorted(sflags)} became {sorted(dflags)}"
            assert ddate == sdate, f"{where}: internal date {sdate} became {ddate}"
            if uids:
                assert duid == suid, where
        if uids:
            assert dv == sv, f"{name!r}: UIDVALIDITY {sv} became {dv}"
        n += len(smsgs)
    return n


def test_import_from_dovecot(quill_factory, source):
    node = quill_factory()
    user = f"bob@{DOMAIN}"
    node.add_user(user, PW)
    pwfile = source.root / "password"
    pwfile.write_text(dovecot.PASSWORD + "\n")
    args = ["import", "imap", "--from", source.url, "--password-file", str(pwfile), "--user", user]

    first = summary(quill(node, *args))
    total = sum(len(v) for v in TREE.values())
    assert first == {"folders": len(TREE), "copied": total, "same": 0, "flagged": 0, "errors": 0}, first
    src, dst = source.login(), quill_imap(node, user)
    assert compare(src, dst, {"Sent Messages": "Sent"}) == total
    # Special use: "Sent Messages" went into the user's \Sent mailbox, no
    # folder of that name was made; subscriptions came along.
    assert "Sent Messages" not in folders(dst) and "\\Sent" in folders(dst)["Sent"]
    subscribed = folders(dst, subscribed=True)
    for name in ("Sent", "Archive/2024", "Caf&AOk-", "Foo/Bar/Baz"):
        assert name in subscribed, (name, subscribed)
    assert "Empty" in folders(dst)

    # A rerun copies nothing and changes nothing.
    again = summary(quill(node, *args))
    assert again == {"folders": len(TREE), "copied": 0, "same": total, "flagged": 0, "errors": 0}, again
    assert compare(src, dst, {"Sent Messages": "Sent"}) == total

    # New mail and changed flags at the source: only those come.
    ok(src.append(quote("Archive/2024"), "(\\Seen $Label1)", imaplib.Time2Internaldate(T0 + 99 * 3600),
                  msg("arrived later").replace(b"\n", b"\r\n")))
    ok(src.select("INBOX"))
    ok(src.uid("STORE", "1", "+FLAGS", "(\\Flagged)"))
    ok(src.uid("STORE", "2", "-FLAGS", "(\\Seen)"))
    src.close()
    third = summary(quill(node, *args))
    assert third == {"folders": len(TREE), "copied": 1, "same": total - 2, "flagged": 2, "errors": 0}, third
    assert compare(src, dst, {"Sent Messages": "Sent"}) == total + 1
    src.logout()
    dst.logout()


def test_import_maildir_and_export_served_by_dovecot(quill_factory, source):
    """The Maildir itself, imported directly (after Dovecot has served it,
    as a migration from a live server would), equals what Dovecot serves;
    then `quill export` writes it out and a second Dovecot serves the
    export with the same messages, flags, dates, UIDs and UIDVALIDITY."""
    node = quill_factory()
    user = f"carol@{DOMAIN}"
    node.add_user(user, PW)
    src = source.login()
    folders(src)  # Dovecot has listed (and indexed) the Maildir
    r = quill(node, "import", "maildir", str(source.maildir), "--user", user)
    total = sum(len(v) for v in TREE.values())
    assert summary(r)["copied"] == total, r.stdout
    dst = quill_imap(node, user)
    assert compare(src, dst, {"Sent Messages": "Sent"}) == total
    assert summary(quill(node, "import", "maildir", str(source.maildir), "--user", user))["copied"] == 0
    src.logout()

    root = scratch_dir()
    try:
        out = root / "Maildir"
        exp = quill(node, "export", "--user", user, "--to", str(out))
        assert summary(exp)["copied"] == total and summary(exp)["errors"] == 0, exp.stdout
        # A rerun writes nothing again.
        again = summary(quill(node, "export", "--user", user, "--to", str(out)))
        assert again["copied"] == 0 and again["same"] == total, again
        served = Dovecot(root, out).start()
        try:
            back = served.login()
            assert compare(dst, back, {}, uids=True) == total
            sub = folders(back, subscribed=True)
            for name in ("Sent", "Archive/2024", "Caf&AOk-", "Foo/Bar/Baz"):
                assert name in sub, (name, sub)
            back.logout()
        finally:
            served.stop()
    finally:
        remove(root)
    dst.logout()


def test_import_mbox(quill_factory, tmp_path):
    """An mbox directory (Thunderbird's layout): From_ lines, mboxrd
    quoting, Status/X-Status flags and X-Keywords read and removed, dates
    from the From_ line; a rerun copies nothing."""
    node = quill_factory()
    user = f"dave@{DOMAIN}"
    node.add_user(user, PW)
    d = tmp_path / "mail"
    (d / "Lists.sbd").mkdir(parents=True)
    (d / "Inbox").write_bytes(
        b"From alice@remote.test Tue Nov 14 22:13:20 2023\n"
        b"Subject: one\nStatus: RO\nX-Status: AF\nX-Keywords: $Label1\n\n>From the quoted line\nbody \xe9\n\n"
        b"From bob@remote.test Wed Nov 15 08:00:00 2023\n"
        b"Subject: two\nStatus: O\n\nsecond\n\n")
    (d / "Lists.sbd" / "Go").write_bytes(b"From x@remote.test Thu Nov 16 09:30:00 2023\nSubject: three\n\nthird\n")
    (d / "Inbox.msf").write_bytes(b"// a Thunderbird index, not a folder\n")
    first = summary(quill(node, "import", "mbox", str(d), "--user", user))
    assert first["copied"] == 3 and first["errors"] == 0, first
    m = quill_imap(node, user)
    _, inbox = messages(m, "INBOX")
    assert [(raw, flags) for _, raw, flags, _ in inbox] == [
        (b"Subject: one\r\n\r\nFrom the quoted line\r\nbody \xe9\r\n", frozenset({"\\Seen", "\\Answered", "\\Flagged", "$Label1"})),
        (b"Subject: two\r\n\r\nsecond\r\n", frozenset()),
    ]
    assert [date for *_, date in inbox] == [1700000000.0, 1700035200.0]
    _, lists = messages(m, "Lists/Go")
    assert lists[0][1] == b"Subject: three\r\n\r\nthird\r\n"
    m.logout()
    assert summary(quill(node, "import", "mbox", str(d), "--user", user))["copied"] == 0
    # One file into a named folder.
    r = quill(node, "import", "mbox", str(d / "Lists.sbd" / "Go"), "--folder", "Single", "--user", user)
    assert summary(r)["copied"] == 1


def test_import_refusals(quill_factory, tmp_path):
    """Clear errors, no crash: an unknown user, a directory that is not a
    Maildir, a password in the URL, a source that refuses the login."""
    node = quill_factory()
    node.add_user(f"erin@{DOMAIN}", PW)
    r = quill(node, "import", "maildir", str(tmp_path), "--user", f"nobody@{DOMAIN}", check=False)
    assert r.returncode != 0 and "nobody@example.org" in r.stderr, r.stderr
    r = quill(node, "import", "maildir", str(tmp_path), "--user", f"erin@{DOMAIN}", check=False)
    assert r.returncode != 0 and "not a Maildir" in r.stderr, r.stderr
    r = quill(node, "import", "imap", "--from", "imap://u:secret@127.0.0.1:1", "--user", f"erin@{DOMAIN}", check=False)
    assert r.returncode != 0 and "password" in r.stderr and "secret" not in r.stderr, r.stderr
    host, port = node.addrs["imap"]
    pw = tmp_path / "pw"
    pw.write_text("wrong\n")
    r = quill(node, "import", "imap", "--from", f"imap://erin%40{DOMAIN}@{host}:{port}", "--password-file", str(pw),
              "--user", f"erin@{DOMAIN}", check=False)
    assert r.returncode != 0 and "login as erin@example.org" in r.stderr, r.stderr
    assert node.running


def test_import_through_any_node_of_a_cluster(quill_factory, tmp_path):
    """An import sent to node B of a two-node cluster is what node A
    serves, and a rerun through A finds all of it there."""
    user = f"frank@{DOMAIN}"
    a, b = cluster_pair(quill_factory, user, PW)
    box = tmp_path / "box.mbox"
    box.write_bytes(b"".join(
        b"From x@remote.test Tue Nov 14 22:13:%02d 2023\nSubject: %d\nStatus: RO\n\nbody %d\n\n" % (i, i, i) for i in range(20)))
    assert summary(quill(b, "import", "mbox", str(box), "--folder", "Imported", "--user", user))["copied"] == 20
    m = quill_imap(a, user)
    _, got = messages(m, "Imported")
    m.logout()
    assert [raw for _, raw, _, _ in got] == [b"Subject: %d\r\n\r\nbody %d\r\n" % (i, i) for i in range(20)]
    assert all(flags == {"\\Seen"} for _, _, flags, _ in got)
    assert summary(quill(a, "import", "mbox", str(box), "--folder", "Imported", "--user", user))["same"] == 20
