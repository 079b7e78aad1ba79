"""Crash test: kill -9 in the middle of a delivery stream loses no
acknowledged message, duplicates none and tears none, large ones (kept as
files) included.

Porcupine's contract for delivery (§2.3.1, §4.1): the SMTP 250 after DATA
is sent only once the message is durable. Several client threads deliver
uniquely numbered messages over concurrent SMTP connections and record each
one that got its 250; the node is killed with SIGKILL after a random delay,
restarted on the same data directory, and every acknowledged message must
then be retrievable over POP3 exactly once with its exact bytes. Messages
whose 250 never arrived may or may not be there, but never twice and never
torn.
"""

from __future__ import annotations

import hashlib
import os
import poplib
import random
import re
import smtplib
import threading
import time

from mailutil import fetch_all, send, split_trace

DOMAIN = "crash.test"
USERS = [f"u{i}@{DOMAIN}" for i in range(3)]
PW = "crash-pw"
SENDERS = 4
ROUNDS = 3
MAX_PER_ROUND = 5000  # a bound on the stream, whatever the disk's speed
SUBJECT_RE = re.compile(rb"\r\nSubject: seq (\d+)\r\n")


def recipients(seq: int) -> list[str]:
    """Most messages go to one user, every fifth to all of them."""
    if seq % 5 == 0:
        return list(USERS)
    return [USERS[seq % len(USERS)]]


def make_message(seq: int) -> bytes:
    """A deterministic message for seq: 8-bit, dot lines, 0.2 to 12 KB; every
    tenth 80 to 200 KB, over mailbox.LargeBody (64 KiB), so its body is a file
    (to every user at once: one file three references share), and the crash
    also checks that a body file is durable before its 250."""
    rnd = random.Random(seq)
    count = rnd.randint(1000, 2500) if seq % 10 == 0 else rnd.randint(2, 150)
    lines = [f"line {i} of seq {seq}: ".encode() + rnd.randbytes(rnd.randint(0, 60)).hex().encode()
             for i in range(count)]
    lines.insert(1, b".leading dot " + bytes(range(0x80, 0x90)))
    lines.insert(2, b".")
    body = b"\r\n".join(lines) + b"\r\n"
    digest = hashlib.sha256(body).hexdigest().encode()
    return (b"From: stream@remote.test\r\n"
            b"To: " + ", ".join(recipients(seq)).encode() + b"\r\n"
            b"Subject: seq " + str(seq).encode() + b"\r\n"
            b"Message-ID: <seq-" + str(seq).encode() + b"@remote.test>\r\n"
            b"X-Body-SHA256: " + digest + b"\r\n"
            b"\r\n" + body)


class Stream:
    """SENDERS threads delivering seq numbers from a shared counter."""

    def __init__(self, node, first_seq: int):
        self.addr = node.smtp_addr
        self.next = first_seq
        self.lock = threading.Lock()
        self.acked: set[int] = set()
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, name=f"sender{i}", daemon=True)
                        for i in range(SENDERS)]

    def take(self) -> int | None:
        with self.lock:
            if self.next - self.first >= MAX_PER_ROUND:
                return None
            seq = self.next
            self.next += 1
            return seq

    def run(self):
        try:
            s = smtplib.SMTP(*self.addr, local_hostname="stream.test", timeout=10)
        except OSError as e:
            self.errors.append(f"connect: {e}")
            return
        try:
            while not self.stop.is_set():
                seq = self.take()
                if seq is None:
                    return
                # Any exception here is the node dying under us: the message
                # is unacknowledged and this sender stops.
                refused = s.sendmail("stream@remote.test", recipients(seq), make_message(seq))
                assert refused == {}, refused
                with self.lock:
                    self.acked.add(seq)
        except (OSError, smtplib.SMTPException) as e:
            self.errors.append(f"{type(e).__name__}: {e}")
        finally:
            s.close()

    def start(self):
        self.first = self.next
        for t in self.threads:
            t.start()

    def join(self, timeout: float = 30.0):
        self.stop.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self.threads if t.is_alive()]
        assert not alive, f"sender threads hung after the kill: {alive}"


def check_mailboxes(node, acked: set[int], attempted: int, round_no: int) -> dict[str, int]:
    """Every acked seq present exactly once per recipient, every stored one intact."""
    counts = {}
    for user in USERS:
        seen: dict[int, int] = {}
        for uid, stored in fetch_all(node, user, PW):
            m = SUBJECT_RE.search(stored)
            assert m, f"round {round_no}: {user} message {uid} has no seq Subject: {stored[:300]!r}"
            seq = int(m.group(1))
            assert seq < attempted, f"{user}: seq {seq} was never sent"
            assert user in recipients(seq), f"{user} got seq {seq}, addressed to {recipients(seq)}"
            seen[seq] = seen.get(seq, 0) + 1
            # Intact: the exact bytes sent, after the trace headers.
            split_trace(stored, make_message(seq), mail_from="stream@remote.test")
        dups = sorted(s for s, c in seen.items() if c > 1)
        assert not dups, f"round {round_no}: {user} has duplicates of seq {dups[:20]}"
        want = {s for s in acked if user in recipients(s)}
        lost = sorted(want - seen.keys())
        assert not lost, (f"round {round_no}: {user} lost {len(lost)} acknowledged "
                          f"messages, e.g. seq {lost[:20]}")
        counts[user] = len(seen)
    return counts


def kill9_rounds(node, rnd: random.Random, rounds: int, before_restart=lambda: None) -> tuple[set[int], int]:
    """rounds times: a delivery stream, node killed with SIGKILL after a
    random delay, before_restart() (a wipe, for a node whose mail is kept
    elsewhere), node started again, every acknowledged message checked.
    Returns the acknowledged seqs and the next seq."""
    acked: set[int] = set()
    next_seq = 0
    for round_no in range(1, rounds + 1):
        stream = Stream(node, next_seq)
        stream.start()
        delay = rnd.uniform(0.5, 2.0)
        time.sleep(delay)
        acked_before_kill = len(stream.acked)
        node.kill9()
        stream.join()
        next_seq = stream.next
        acked |= stream.acked
        print(f"round {round_no}: killed after {delay:.2f}s; sent {stream.next - stream.first}, "
              f"acked {len(stream.acked)} ({acked_before_kill} before the kill); "
              f"sender endings: {sorted(set(e.split(':')[0] for e in stream.errors))}")
        assert acked_before_kill > 0, "no message acknowledged before the kill: stream too slow"

        before_restart()
        node.start()
        counts = check_mailboxes(node, acked, next_seq, round_no)
        print(f"round {round_no}: stored per user {counts}")
    return acked, next_seq


def test_kill9_during_delivery_stream(quill_factory):
    seed = int(os.environ.get("QUILL_CRASH_SEED") or random.randrange(1 << 30))
    print(f"crash test seed {seed} (rerun with QUILL_CRASH_SEED={seed})")
    rnd = random.Random(seed)
    node = quill_factory()
    for u in USERS:
        node.add_user(u, PW)

    t_start = time.monotonic()
    acked, next_seq = kill9_rounds(node, rnd, ROUNDS)

    # The node is healthy after all that: a new message, then a clean stop.
    probe = make_message(next_seq)
    assert send(node, recipients(next_seq), probe, mail_from="stream@remote.test") == {}
    acked.add(next_seq)
    check_mailboxes(node, acked, next_seq + 1, ROUNDS + 1)
    assert node.stop() == 0
    assert time.monotonic() - t_start < 60


class Purger:
    """Deletes the oldest messages of one user over and over, recording the
    seq numbers whose deletion was confirmed by +OK at QUIT."""

    def __init__(self, node, user: str):
        self.addr = node.pop3_addr
        self.user = user
        self.confirmed: set[int] = set()
        self.unsure: set[int] = set()  # DELE sent, QUIT's reply never came
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="purger", daemon=True)

    def run(self):
        while not self.stop.is_set():
            pending: set[int] = set()
            try:
                p = poplib.POP3(*self.addr, timeout=10)
                try:
                    p.user(self.user)
                    p.pass_(PW)
                    n = p.stat()[0]
                    for i in range(1, min(n, 10) + 1):
                        _, lines, _ = p.top(i, 0)
                        m = SUBJECT_RE.search(b"\r\n" + b"\r\n".join(lines) + b"\r\n")
                        assert m, lines
                        p.dele(i)
                        pending.add(int(m.group(1)))
                    self.unsure |= pending
                    resp = p.quit()
                    assert resp.startswith(b"+OK"), resp
                    self.unsure -= pending
                    self.confirmed |= pending
                finally:
                    p.close()
            except (OSError, poplib.error_proto) as e:
                self.errors.append(f"{type(e).__name__}: {e}")
                return
            time.sleep(0.02)


def test_kill9_during_deliveries_and_deletes(quill_factory):
    """Acknowledged deliveries survive, and so do acknowledged deletions
    (+OK at QUIT): a message confirmed deleted never comes back."""
    seed = int(os.environ.get("QUILL_CRASH_SEED") or random.randrange(1 << 30))
    print(f"crash+delete test seed {seed} (rerun with QUILL_CRASH_SEED={seed})")
    rnd = random.Random(seed)
    node = quill_factory()
    for u in USERS:
        node.add_user(u, PW)
    purged_user = USERS[0]

    acked: set[int] = set()
    deleted: set[int] = set()
    unsure: set[int] = set()
    next_seq = 0
    for round_no in range(1, 3):
        stream = Stream(node, next_seq)
        purger = Purger(node, purged_user)
        stream.start()
        purger.thread.start()
        time.sleep(rnd.uniform(0.5, 2.0))
        node.kill9()
        stream.join()
        purger.stop.set()
        purger.thread.join(30)
        assert not purger.thread.is_alive(), "purger hung after the kill"
        next_seq = stream.next
        acked |= stream.acked
        deleted |= purger.confirmed
        unsure |= purger.unsure
        print(f"round {round_no}: acked {len(stream.acked)}, confirmed deleted "
              f"{len(purger.confirmed)}, unsure {len(purger.unsure)}")
        assert purger.confirmed, "no deletion confirmed before the kill"

        node.start()
        for user in USERS:
            seen: dict[int, int] = {}
            for uid, stored in fetch_all(node, user, PW):
                seq = int(SUBJECT_RE.search(stored).group(1))
                seen[seq] = seen.get(seq, 0) + 1
                split_trace(stored, make_message(seq), mail_from="stream@remote.test")
            assert all(c == 1 for c in seen.values()), f"{user}: duplicates"
            want = {s for s in acked if user in recipients(s)}
            if user == purged_user:
                back = sorted(deleted & seen.keys())
                assert not back, f"round {round_no}: deleted messages came back: seq {back[:20]}"
                want -= deleted | unsure
            lost = sorted(want - seen.keys())
            assert not lost, f"round {round_no}: {user} lost acknowledged seq {lost[:20]}"
