"""Real IMAP clients on a two-node cluster (issue 13, "Real clients").

A client keeps its state (neomutt's header cache with MODSEQs, mbsync's
sync state with UIDs) and comes back through node A after changes were
made through node B: a flag set, a message expunged, a new delivery. What
the client then does on the server shows whether it learned each change
(CONDSTORE's CHANGEDSINCE and QRESYNC's VANISHED for neomutt, UIDs and
flags for mbsync).
"""

from __future__ import annotations

import imaplib
import os
import pty
import select
import shutil
import signal
import subprocess
import time

import pytest

from mailutil import cluster_pair, imap_login, mbsync_rc, ok, send

DOMAIN = "quill.test"
ALICE = f"alice@{DOMAIN}"
PW = "cluster pass"
TIMEOUT = 30.0


def imap(node) -> imaplib.IMAP4:
    return imap_login(node, ALICE, PW, timeout=TIMEOUT)


def msg(subject: str) -> bytes:
    return (b"From: Sender <sender@remote.test>\r\nTo: " + ALICE.encode() + b"\r\nSubject: "
            + subject.encode() + b"\r\nMessage-ID: <" + os.urandom(6).hex().encode()
            + b"@remote.test>\r\n\r\nbody of " + subject.encode() + b"\r\n")


def subjects(node, mailbox: str) -> list[str]:
    m = imap(node)
    ok(m.select(mailbox, readonly=True))
    out = []
    for item in ok(m.fetch("1:*", "(BODY.PEEK[HEADER.FIELDS (SUBJECT)])")):
        if isinstance(item, tuple):
            out.append(item[1].decode().split(":", 1)[1].strip())
    m.logout()
    return sorted(out)


@pytest.fixture
def pair(quill_factory):
    """Nodes A and B of one cluster, with alice added through A and able
    to log in through B."""
    return cluster_pair(quill_factory, ALICE, PW)


def change_through(b, deliver_subject: str) -> None:
    """Through node B: flag "two", expunge "three", deliver one more."""
    m = imap(b)
    ok(m.select("INBOX"))
    for subject, flags in (("two", r"(\Flagged)"), ("three", r"(\Deleted)")):
        uid = ok(m.uid("SEARCH", "SUBJECT", subject))[0].decode()
        assert uid, subject
        ok(m.uid("STORE", uid, "+FLAGS", flags))
    ok(m.expunge())
    m.logout()
    send(b, ALICE, msg(deliver_subject))


def run_in_pty(argv: list[str], timeout: float = 60.0) -> bytes:
    """Runs an interactive client on a terminal of its own until it exits;
    what it drew on the screen is returned."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: neomutt on the terminal
        os.environ["TERM"] = "xterm"
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    out = b""
    deadline = time.monotonic() + timeout
    status = None
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([fd], [], [], 0.2)
            if r:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # the terminal closed: the client exited
                    data = b""
                out += data
            wpid, st = os.waitpid(pid, os.WNOHANG)
            if wpid:
                status = st
                break
    finally:
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    assert status == 0, (status, out[-2000:])
    return out


@pytest.mark.skipif(not shutil.which("neomutt"), reason="neomutt not installed")
def test_neomutt_condstore_qresync_across_nodes(pair, tmp_path):
    """neomutt with its header cache, CONDSTORE and QRESYNC, through node
    A; between its two visits the mailbox changes through node B. On the
    second visit it must learn the flag (UID FETCH CHANGEDSINCE), the
    expunge (VANISHED (EARLIER)) and the new message, then act on them:
    it moves the flagged message to Archive."""
    a, b = pair
    for s in ("one", "two", "three", "four"):
        send(a, ALICE, msg(s))
    host, port = a.addrs["imap"]
    hcache = tmp_path / "hcache"
    hcache.mkdir()
    rc = tmp_path / "muttrc"
    rc.write_text(f"""set folder = "imap://{host}:{port}/"
set spoolfile = "+INBOX"
set imap_user = "{ALICE}"
set imap_pass = "{PW}"
set ssl_starttls = no
set ssl_force_tls = no
set header_cache = "{hcache}"
set imap_condstore = yes
set imap_qresync = yes
set confirmcreate = no
set confirmappend = no
set delete = yes
set move = no
set record = ""
set mark_old = no
set wait_key = no
set sleep_time = 0
""")
    log = tmp_path / "neomutt.log"

    def neomutt(keys: str) -> str:
        for old in tmp_path.glob("neomutt.log*"):
            old.unlink()
        run_in_pty(["neomutt", "-n", "-F", str(rc), "-d", "5", "-l", str(log), "-e", f"push '{keys}'"])
        return "\n".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("neomutt.log*")))

    first = neomutt("<quit>")
    assert "ENABLE QRESYNC" in first and "SELECT \"INBOX\" (CONDSTORE)" in first, first[-3000:]

    change_through(b, "five")

    second = neomutt("<tag-pattern>~F<enter><tag-prefix><save-message>=Archive<enter><quit>")
    assert "CHANGEDSINCE" in second and "VANISHED)" in second, second[-3000:]
    assert "< * VANISHED (EARLIER) 3" in second, second[-3000:]
    # It saved the one message flagged through B into Archive, and on quit
    # expunged it from INBOX (save-message marks it \Deleted).
    assert subjects(b, "Archive") == ["two"]
    assert subjects(b, "INBOX") == ["five", "four", "one"]


@pytest.mark.skipif(not shutil.which("mbsync"), reason="mbsync (isync) not installed")
def test_mbsync_across_nodes(pair, tmp_path):
    """mbsync keeps a Maildir in step through node A while the mailbox
    changes through node B, and its own changes reach B."""
    a, b = pair
    for s in ("one", "two", "three"):
        send(a, ALICE, msg(s))
    maildir = tmp_path / "mail"
    maildir.mkdir()
    rc = mbsync_rc(tmp_path / "mbsyncrc", a, ALICE, PW, maildir, patterns="INBOX")

    def sync() -> dict[str, str]:
        time.sleep(1.1)  # mbsync skips maildirs modified within the last second
        r = subprocess.run(["mbsync", "-c", str(rc), "-a"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        files = {}
        for p in (maildir / "INBOX").glob("*/*"):
            if p.is_file() and p.parent.name in ("cur", "new"):
                subject = next(line for line in p.read_text().splitlines() if line.startswith("Subject: "))
                files[subject[len("Subject: "):]] = p.name
        return files

    files = sync()
    assert sorted(files) == ["one", "three", "two"], files

    change_through(b, "four")
    files = sync()
    assert sorted(files) == ["four", "one", "two"], files
    assert "F" in files["two"].split(":2,")[1], files  # \Flagged as a Maildir flag

    # Near side: "one" read, "four" deleted; both reach node B.
    cur = maildir / "INBOX" / "cur"
    one = next(p for p in (maildir / "INBOX").glob("*/*") if p.name == files["one"])
    one.rename(cur / (one.name.split(":2,")[0] + ":2," + "".join(sorted(one.name.split(":2,")[1] + "S"))))
    next(p for p in (maildir / "INBOX").glob("*/*") if p.name == files["four"]).unlink()
    files = sync()
    assert sorted(files) == ["one", "two"], files
    assert subjects(b, "INBOX") == ["one", "two"]
    m = imap(b)
    ok(m.select("INBOX", readonly=True))
    seen = ok(m.uid("SEARCH", "SEEN", "SUBJECT", "one"))[0].split()
    assert len(seen) == 1, seen
    m.logout()
