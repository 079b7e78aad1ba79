"""Backup and restore (issue 14, item 6): `quill backup` of a running node
with mail, the node killed with kill -9 and its data directory wiped,
`quill restore` into it, the node started again: every mailbox, message,
flag, internal date, UID and UIDVALIDITY is back, the password and the
admin token too. The same for a two-node cluster backed up through one
node (`--cluster`: the other's archive comes over RPC)."""

from __future__ import annotations

import imaplib
import shutil
import subprocess

import pytest
from dovecot import folders, messages, quote
from mailutil import ok, send, cluster_pair, wait_for

DOMAIN = "example.org"
USER = f"bob@{DOMAIN}"
PW = "backup pass"
CLI_TIMEOUT = 120.0

pytestmark = pytest.mark.native_only(
    reason="quill backup and restore copy a node's data directory (a Pebble checkpoint); on the Cassandra "
           "store the mail is in the keyspace, which Cassandra's own snapshots back up")


def imap(node) -> imaplib.IMAP4:
    host, port = node.addrs["imap"]
    m = imaplib.IMAP4(host, port, timeout=30)
    m.login(USER, PW)
    return m


def fill(node) -> None:
    """Mail in several states: delivered, appended with flags and a date
    into a folder of its own (one large), flagged, one expunged."""
    for i in range(12):
        send(node, USER, f"Subject: delivered {i}\r\nMessage-ID: <d{i}@remote.test>\r\n\r\nbody {i} \xe9\r\n".encode("latin-1"))
    m = imap(node)
    ok(m.create(quote("Projects/Quill")))
    ok(m.subscribe(quote("Projects/Quill")))
    for i in range(3):
        ok(m.append(quote("Projects/Quill"), "(\\Seen $Label1)", imaplib.Time2Internaldate(1_600_000_000 + i),
                    f"Subject: appended {i}\r\n\r\nx\r\n".encode()))
    # Over 64 KiB: kept as a file beside the store (internal/mailbox/bodyfile.go).
    ok(m.append(quote("Projects/Quill"), None, None, b"Subject: large\r\n\r\n" + b"0123456789abcdef\r\n" * 10000))
    ok(m.select("INBOX"))
    ok(m.uid("STORE", "1:4", "+FLAGS", "(\\Seen)"))
    ok(m.uid("STORE", "2", "+FLAGS", "(\\Flagged Work)"))
    ok(m.uid("STORE", "5", "+FLAGS", "(\\Deleted)"))
    ok(m.expunge())
    m.logout()


def snapshot(node) -> dict:
    """Every folder with its UIDVALIDITY and messages (UID, bytes, flags,
    internal date), and the subscriptions."""
    m = imap(node)
    out = {name: messages(m, name) for name in folders(m)}
    out["subscribed"] = sorted(folders(m, subscribed=True))
    m.logout()
    return out


def _snapshot_or_none(node):
    """snapshot, or None while the node does not serve the user yet."""
    try:
        return snapshot(node)
    except (imaplib.IMAP4.error, OSError):
        return None


def cli(node, *args: str) -> subprocess.CompletedProcess:
    cmd = [node.binary, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=CLI_TIMEOUT, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r


def wipe_and_restore(node, backup_dir) -> None:
    node.kill9()
    shutil.rmtree(node.data_dir)
    r = cli(node, "restore", "--from", str(backup_dir / node.node_id), "--data", str(node.data_dir))
    assert f"restored node {node.node_id}" in r.stdout, r.stdout


def test_backup_kill_wipe_restore(quill_factory, tmp_path):
    node = quill_factory()
    node.add_user(USER, PW)
    fill(node)
    before = snapshot(node)
    assert len(before["INBOX"][1]) == 11 and len(before["Projects/Quill"][1]) == 4
    token = node.admin_token

    bk = tmp_path / "backup"
    r = cli(node, "backup", "--to", str(bk), "--server", node.http_url, "--data", str(node.data_dir))
    assert "backup: 1 nodes" in r.stdout, r.stdout
    # Mail after the backup is not in it.
    send(node, USER, b"Subject: after the backup\r\n\r\nlost\r\n")

    node_id = node.node_id
    wipe_and_restore(node, bk)
    node.start()
    assert node.node_id == node_id
    assert node.admin_token == token
    assert snapshot(node) == before
    # The node works on: new mail takes the next UID.
    send(node, USER, b"Subject: after the restore\r\n\r\nhere\r\n")
    m = imap(node)
    ok(m.select("INBOX", readonly=True))
    uids = [int(u) for u in ok(m.uid("SEARCH", "ALL"))[0].split()]
    assert len(uids) == 12 and uids[-1] > before["INBOX"][1][-1][0], uids
    m.logout()
    # A backup never lands on an earlier one, nor a restore on a used
    # data directory.
    r = subprocess.run([node.binary, "backup", "--to", str(bk), "--server", node.http_url, "--data", str(node.data_dir)],
                       capture_output=True, text=True, timeout=CLI_TIMEOUT)
    assert r.returncode != 0 and "exists already" in r.stderr, r.stderr
    r = subprocess.run([node.binary, "restore", "--from", str(bk / node_id), "--data", str(node.data_dir)],
                       capture_output=True, text=True, timeout=CLI_TIMEOUT)
    assert r.returncode != 0 and "not empty" in r.stderr, r.stderr


def test_cluster_backup_restore(quill_factory, tmp_path):
    a, b = cluster_pair(quill_factory, USER, PW)
    fill(a)
    before = snapshot(b)

    bk = tmp_path / "backup"
    r = cli(a, "backup", "--cluster", "--to", str(bk), "--server", a.http_url, "--data", str(a.data_dir))
    assert "backup: 2 nodes" in r.stdout, r.stdout
    assert sorted(p.name for p in bk.iterdir()) == sorted([a.node_id, b.node_id])

    for n in (a, b):
        wipe_and_restore(n, bk)
    a.start()
    b.start()
    wait_for("every message back through node B", lambda: _snapshot_or_none(b) == before, timeout=60)
    assert snapshot(a) == before
