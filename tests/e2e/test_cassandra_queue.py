"""The outbound queue of `quill serve --store cassandra` (issue 15: front
ends are stateless) with real processes: a quill on a real Cassandra node
(the `cassandra` fixture) queues a submission for remote.example while its
server (the real Postfix of test_outbound.py's `peer` fixture, found
through a real dnsmasq) is down; the quill is killed with SIGKILL and its
data directory deleted; a new quill on the keyspace lists the entry and
delivers it once Postfix is up. Then two quill nodes of one cluster on one
keyspace: each lists the whole queue; the node that ran the entries is
killed with SIGKILL and wiped, and the other delivers them, each once."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time

import pytest

from conftest import QuillNode
from mailutil import wait_for
from test_cassandra_serve import START_TIMEOUT, two_nodes
from test_outbound import ALICE, BOB, PW, peer, queue_list, submit  # noqa: F401 - peer is a fixture

# A dead node's buckets go to the others after the failure detector's few
# seconds, and their entries run after queue.bucketSettle (10 s): a minute
# leaves room for two busy cores.
TAKEOVER = 90.0

pytestmark = [pytest.mark.cassandra, pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("postfix") or not shutil.which("dnsmasq"),
                                                         reason="needs root, Postfix and dnsmasq (scripts/test-deps.sh installs them)")]


def store_args(cassandra: str, keyspace: str, peer) -> list[str]:
    return ["--store", "cassandra", "--cassandra", cassandra, "--keyspace", keyspace, "--cassandra-rf", "1",
            "--dns", peer["dns"], "--outbound-port", str(peer["port"]), "--queue-retry", "1s"]


def delivered(peer) -> list:
    d = peer["maildir"]
    return sorted(d.glob("*")) if d.exists() else []


def attempted(node, entry_id: str) -> bool:
    """Whether node's log shows an attempt of the entry."""
    return re.search(rf'msg="queue delivery" id={entry_id}\b', node.log_path.read_text("utf-8", "replace")) is not None


def test_queue_on_cassandra_survives_kill9_and_wipe(quill_bin, cassandra, peer, tmp_path):
    peer["start_dns"]()
    peer["stop"]()  # remote.example's server is down
    keyspace = f"quill_queue_{random.randrange(1 << 30):x}"
    node = QuillNode(quill_bin, tmp_path / "q", store_args(cassandra, keyspace, peer), name="q", start_timeout=START_TIMEOUT)
    try:
        node.start()
        node.add_user(ALICE, PW)
        submit(node, [BOB], "queued on cassandra")
        entry = wait_for("a failed attempt", lambda: [e for e in queue_list(node) if e["recipients"][0]["attempts"] > 0],
                         timeout=60)[0]
        r = entry["recipients"][0]
        assert r["state"] == "queued" and r["last_reply"].startswith("4.4.1 connection to mx.remote.example"), entry

        # A crash and a lost disk: the queue is in the keyspace only.
        node.kill9()
        shutil.rmtree(node.data_dir)
        node.start()
        out = node.cli("queue", "list").stdout
        assert entry["id"] in out and BOB in out, out
        shown = json.loads(node.cli("queue", "show", entry["id"]).stdout)
        assert shown["from"] == ALICE and shown["recipients"][0]["attempts"] >= r["attempts"], shown

        peer["start"]()
        files = wait_for("the message at Postfix", lambda: delivered(peer), timeout=TAKEOVER)
        assert b"Subject: queued on cassandra" in files[0].read_bytes()
        wait_for("an empty queue", lambda: queue_list(node) == [], timeout=30)
        time.sleep(3)
        assert len(delivered(peer)) == 1, delivered(peer)
    finally:
        node.stop(timeout=15)


def test_queue_on_cassandra_taken_over_by_the_other_node(quill_bin, cassandra, peer, tmp_path):
    peer["start_dns"]()
    peer["stop"]()
    keyspace = f"quill_queuepair_{random.randrange(1 << 30):x}"
    a, b = two_nodes(quill_bin, tmp_path, store_args(cassandra, keyspace, peer))
    try:
        a.start()
        b.start()
        a.add_user(ALICE, PW)
        subjects = [f"pair {i}" for i in range(4)]
        for s in subjects:
            submit(a, [BOB], s)
        # Every entry tried once by its bucket's manager, and listed in full
        # by both nodes.
        tried = wait_for("an attempt of every entry", lambda: (lambda es: len(es) == len(subjects) and all(
            e["recipients"][0]["attempts"] > 0 for e in es) and es)(queue_list(a)), timeout=60)
        ids = sorted(e["id"] for e in tried)
        assert sorted(e["id"] for e in queue_list(b)) == ids
        ran = {e: [n.name for n in (a, b) if attempted(n, e)] for e in ids}
        assert all(len(v) == 1 for v in ran.values()), f"each entry run by one node: {ran}"

        # The node that ran the first entry dies with its disk.
        victim, other = (a, b) if ran[ids[0]] == ["a"] else (b, a)
        victim.kill9()
        shutil.rmtree(victim.data_dir)
        assert sorted(e["id"] for e in queue_list(other)) == ids
        peer["start"]()
        wait_for("every message at Postfix", lambda: len(delivered(peer)) == len(subjects), timeout=TAKEOVER)
        wait_for("an empty queue", lambda: queue_list(other) == [], timeout=30)
        assert attempted(other, ids[0]), f"node {other.name} never tried {ids[0]}"
        time.sleep(3)
        got = sorted(re.search(rb"Subject: (pair \d)", f.read_bytes()).group(1).decode() for f in delivered(peer))
        assert got == subjects, f"delivered {got}, want each of {subjects} once"
    finally:
        for n in (b, a):
            n.stop(timeout=15)
