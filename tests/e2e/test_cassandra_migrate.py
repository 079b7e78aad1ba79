"""quill migrate between the native store and Apache Cassandra (issue 15,
item 5), with real processes: a quill node gets mail by SMTP and IMAP
changes, `quill migrate` refuses its data directory while it runs, the node
is stopped by its PID, its mail is copied into a real Cassandra 5.0 node
(scripts/cassandra.sh, the `cassandra` fixture of conftest.py: one for the run) and back into a new
data directory, and a quill started on that serves every folder, message,
flag, internal date, UID, UIDVALIDITY, UIDNEXT and HIGHESTMODSEQ as
before, with the same password.

Cassandra costs one JVM start (10-30 s) for the module; without Java 17
the test is skipped, except under CI=true."""

from __future__ import annotations

import imaplib
import random
import re
import subprocess

import pytest

# The source nodes are native on purpose: the test moves their mail into a
# keyspace and back.
pytestmark = [pytest.mark.cassandra, pytest.mark.native_store]

from conftest import REPO, QuillNode
from dovecot import folders, messages, quote
from mailutil import cluster_pair, ok, send

DOMAIN = "example.org"
USER = f"carol@{DOMAIN}"
PW = "migrate pass"
# A migration of this test's few messages takes seconds; most of it is
# Cassandra making the keyspace and its tables.
MIGRATE_TIMEOUT = 300.0


def imap(node) -> imaplib.IMAP4:
    host, port = node.addrs["imap"]
    m = imaplib.IMAP4(host, port, timeout=30)
    m.login(USER, PW)
    return m


_STATUS_RE = re.compile(rb"UIDNEXT (\d+).*HIGHESTMODSEQ (\d+)|HIGHESTMODSEQ (\d+).*UIDNEXT (\d+)")


def snapshot(node) -> dict:
    """Every folder: UIDVALIDITY, messages (UID, bytes, flags, internal
    date), UIDNEXT and HIGHESTMODSEQ; and the subscriptions."""
    m = imap(node)
    out = {}
    for name in folders(m):
        typ, data = m.status(quote(name), "(UIDNEXT HIGHESTMODSEQ)")
        assert typ == "OK", data
        g = _STATUS_RE.search(data[0])
        status = (int(g.group(1) or g.group(4)), int(g.group(2) or g.group(3)))
        out[name] = (messages(m, name), status)
    out["subscribed"] = sorted(folders(m, subscribed=True))
    m.logout()
    return out


def migrate(node, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [node.binary, "migrate", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=MIGRATE_TIMEOUT, stdin=subprocess.DEVNULL)
    if check:
        assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r


def fill(node) -> None:
    """Mail by SMTP, then IMAP changes: a folder with an appended message
    and a copy, flags, an unsubscription, and an expunge as the last
    change (UIDNEXT and HIGHESTMODSEQ then lie past every message left)."""
    for i in range(8):
        send(node, USER, f"Subject: delivered {i}\r\nMessage-ID: <m{i}@remote.test>\r\n\r\nbody {i} \xe9\r\n".encode("latin-1"))
    m = imap(node)
    ok(m.create(quote("Archive/2026")))
    ok(m.append(quote("Archive/2026"), "(\\Seen $Label1)", imaplib.Time2Internaldate(1_600_000_000),
                b"Subject: appended\r\n\r\nx\r\n"))
    ok(m.unsubscribe("Junk"))
    ok(m.select("INBOX"))
    ok(m.uid("STORE", "1:3", "+FLAGS", "(\\Seen)"))
    ok(m.uid("COPY", "4", quote("Archive/2026")))
    # The last change an expunge of the newest message: UIDNEXT and
    # HIGHESTMODSEQ lie past every message left.
    ok(m.uid("STORE", "2,8", "+FLAGS", "(\\Deleted)"))
    ok(m.expunge())
    m.logout()


def test_migrate_to_cassandra_and_back(quill_factory, cassandra, tmp_path, request):
    node = quill_factory()
    node.add_user(USER, PW)
    fill(node)
    before = snapshot(node)
    assert len(before["INBOX"][0][1]) == 6 and len(before["Archive/2026"][0][1]) == 2

    url = f"cassandra://{cassandra}/quill_e2e_{random.randrange(1 << 30):x}?rf=1"
    r = migrate(node, "--from", str(node.data_dir), "--to", url, check=False)
    assert r.returncode != 0 and f"data directory {node.data_dir} is in use by a running quill" in r.stderr, r.stderr

    assert node.stop() == 0
    r = migrate(node, "--from", str(node.data_dir), "--to", url)
    assert "copied 1 users" in r.stdout and "8 messages" in r.stdout and "0 differences" in r.stdout, r.stdout
    # Again: idempotent, still whole; and the verify pass alone.
    r = migrate(node, "--from", str(node.data_dir), "--to", url)
    assert "0 differences" in r.stdout, r.stdout
    r = migrate(node, "--from", str(node.data_dir), "--to", url, "--verify-only")
    assert "copied" not in r.stdout and "0 differences" in r.stdout, r.stdout

    back = QuillNode(node.binary, tmp_path / "back", node.extra_args, name="back")
    request.node._quill_nodes.append(back)  # stopped at teardown with the others
    r = migrate(node, "--from", url, "--to", str(back.data_dir))
    assert "0 differences" in r.stdout, r.stdout
    r = migrate(node, "--from", url, "--to", str(back.data_dir), check=False)
    assert r.returncode != 0 and "not empty" in r.stderr, r.stderr

    back.start()
    assert snapshot(back) == before
    # It works on: new mail takes a UID past every migrated one.
    send(back, USER, b"Subject: after the migration\r\n\r\nhere\r\n")
    m = imap(back)
    ok(m.select("INBOX", readonly=True))
    uids = [int(u) for u in ok(m.uid("SEARCH", "ALL"))[0].split()]
    assert len(uids) == 7 and uids[-1] >= before["INBOX"][1][0], (uids, before["INBOX"][1])
    m.logout()


def test_migrate_cluster(quill_factory, cassandra, tmp_path, request):
    """A two-node cluster (every message and the profile on both nodes,
    R=2), stopped, copied with both data directories into Cassandra (the
    replicas merged), and back into one new node that serves it all."""
    a, b = cluster_pair(quill_factory, USER, PW)
    fill(a)
    before = snapshot(b)
    assert a.stop() == 0 and b.stop() == 0
    url = f"cassandra://{cassandra}/quill_e2e_{random.randrange(1 << 30):x}"
    r = migrate(a, "--from", f"{a.data_dir},{b.data_dir}", "--to", url)
    assert "copied 1 users" in r.stdout and "8 messages" in r.stdout and "0 differences" in r.stdout, r.stdout

    back = QuillNode(a.binary, tmp_path / "back", a.extra_args, name="back")
    request.node._quill_nodes.append(back)
    r = migrate(a, "--from", url, "--to", str(back.data_dir))
    assert "0 differences" in r.stdout, r.stdout
    back.start()
    assert snapshot(back) == before

