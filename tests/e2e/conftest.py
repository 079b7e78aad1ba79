"""End-to-end fixtures: build the quill binary once, run real nodes.

A QuillNode is one `quill serve` process on free loopback ports (every
listener is bound to 127.0.0.1:0 and the ports are read back from the
"listening on" lines the server prints on stdout). Its stderr goes to a log
file that is attached to the report of a failing test.

With QUILL_E2E_STORE=cassandra (`make e2e-cassandra`) every node quill_factory
starts is `quill serve --store cassandra` on one Cassandra node started once
for the run (pytest_configure, below; or QUILL_CASSANDRA_HOSTS): the nodes of
one cluster share a keyspace, and no two tests share one (keyspaces come
clean from tests/e2e/keyspacepool). Tests about the native store's own files
are marked native_only and skipped there.
"""

from __future__ import annotations

import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from mailutil import AUTH_FAIL_DELAY, free_port  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

# Every wait in this suite is bounded: a hung server fails a test.
START_TIMEOUT = 30.0  # from exec to the "ready" line
STOP_TIMEOUT = 40.0  # SIGTERM drain is 30 s in the server
CLI_TIMEOUT = 30.0


# Which store the nodes of quill_factory use: "native" (the default) or
# "cassandra" (`make e2e-cassandra`). Not QUILL_STORE: quill reads that as
# its own --store.
STORE = os.environ.get("QUILL_E2E_STORE", "native")
if STORE not in ("native", "cassandra"):
    raise RuntimeError(f"QUILL_E2E_STORE={STORE}: want native or cassandra")


_LISTEN_RE = re.compile(r"^quill: (SMTPS?|POP3S?|IMAPS?|SUBMISSION|HTTP) listening on (\S+)\s*$")
_READY_RE = re.compile(r"^quill: node (\S+) ready, data in (.*)$")


@pytest.fixture(scope="session")
def quill_bin(tmp_path_factory) -> str:
    """Path of the quill binary: $QUILL_BIN, or built once from the repo."""
    env_bin = os.environ.get("QUILL_BIN")
    if env_bin:
        if not os.access(env_bin, os.X_OK):
            pytest.fail(f"QUILL_BIN={env_bin} is not an executable file")
        return env_bin
    out = tmp_path_factory.mktemp("bin") / "quill"
    try:
        r = subprocess.run(
            ["go", "build", "-o", str(out), "./cmd/quill"],
            cwd=REPO, capture_output=True, text=True, timeout=600,
        )
    except FileNotFoundError:
        pytest.fail("go is not installed; set QUILL_BIN to a built quill binary")
    if r.returncode != 0:
        pytest.fail(f"go build ./cmd/quill failed:\n{r.stdout}\n{r.stderr}")
    return str(out)


class QuillNode:
    """One `quill serve` process. Ports may change across restarts."""

    def __init__(self, binary: str, workdir: Path, extra_args=(), name="node", env: dict | None = None,
                 start_timeout: float = START_TIMEOUT):
        self.binary = binary
        self.start_timeout = start_timeout
        self.env = env
        self.name = name
        self.workdir = Path(workdir)
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / "stderr.log"
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen | None = None
        self.addrs: dict[str, tuple[str, int]] = {}
        self.node_id: str | None = None
        self.starts = 0
        self._stdout_lines: list[str] = []

    # ---- lifecycle -------------------------------------------------------

    def start(self) -> "QuillNode":
        assert self.proc is None, "node already running"
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [
            self.binary, "serve", "--data", str(self.data_dir),
            "--smtp", "127.0.0.1:0", "--pop3", "127.0.0.1:0",
            "--imap", "127.0.0.1:0", "--http", "127.0.0.1:0",
            "--smtps", "127.0.0.1:0", "--pop3s", "127.0.0.1:0", "--submission", "127.0.0.1:0",
            "--imaps", "127.0.0.1:0",
            "--hostname", "quill.test",
            *self.extra_args,
        ]
        self.starts += 1
        log = open(self.log_path, "ab")
        log.write(f"===== start #{self.starts}: {' '.join(cmd)}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
            cwd=self.workdir, env={**os.environ, **self.env} if self.env else None,
        )
        log.close()
        lines: queue.Queue = queue.Queue()
        proc = self.proc

        def pump():
            # Keeps draining stdout for the life of the process, so the
            # server never blocks on a full pipe.
            for raw in proc.stdout:
                lines.put(raw.decode("utf-8", "replace").rstrip("\n"))
            lines.put(None)

        threading.Thread(target=pump, daemon=True, name=f"{self.name}-stdout").start()

        self.addrs = {}
        self.node_id = None
        deadline = time.monotonic() + self.start_timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill9()
                raise RuntimeError(f"{self.name}: not ready after {self.start_timeout}s; "
                                   f"stdout so far: {self._stdout_lines}\n{self.stderr_tail()}")
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                rc = self.proc.wait(timeout=5)
                self.proc = None
                raise RuntimeError(f"{self.name}: exited with {rc} before ready\n{self.stderr_tail()}")
            self._stdout_lines.append(line)
            m = _LISTEN_RE.match(line)
            if m:
                host, _, port = m.group(2).rpartition(":")
                self.addrs[m.group(1).lower()] = (host, int(port))
                continue
            m = _READY_RE.match(line)
            if m:
                self.node_id = m.group(1)
                break
        for proto in ("smtp", "pop3", "http"):  # IMAP is optional for now
            if proto not in self.addrs:
                self.kill9()
                raise RuntimeError(f"{self.name}: no {proto.upper()} listening line in {self._stdout_lines}")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM by PID and wait; SIGKILL if it does not exit in time.

        Returns the exit status (negative for a signal), None if not running.
        """
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                return proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
                raise RuntimeError(f"{self.name}: did not exit {timeout}s after SIGTERM; killed")
        return proc.returncode

    def kill9(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)

    def restart(self) -> int | None:
        """Graceful stop, then start on the same data dir. Returns the exit status."""
        rc = self.stop()
        self.start()
        return rc

    # ---- addresses -------------------------------------------------------

    @property
    def smtp_addr(self) -> tuple[str, int]:
        return self.addrs["smtp"]

    @property
    def pop3_addr(self) -> tuple[str, int]:
        return self.addrs["pop3"]

    @property
    def http_url(self) -> str:
        h, p = self.addrs["http"]
        return f"http://{h}:{p}"

    # ---- admin -----------------------------------------------------------

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Runs `quill user ...`-style admin commands against this node."""
        cmd = [self.binary, *args, "--server", self.http_url, "--data", str(self.data_dir)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=CLI_TIMEOUT,
                           stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        return r

    def add_domain(self, domain: str) -> None:
        """Serves the domain (users are added only in served domains); one
        served already is left as it is."""
        r = self.cli("domain", "add", domain, check=False)
        if r.returncode != 0 and "already exists" not in r.stderr:
            raise AssertionError(f"quill domain add {domain} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")

    def add_user(self, addr: str, pw: str) -> None:
        self.add_domain(addr.rsplit("@", 1)[1].lower())
        self.cli("user", "add", addr, "--password", pw)

    @property
    def admin_token(self) -> str:
        return (self.data_dir / "admin.token").read_text().strip()

    def api(self, method: str, path: str, body: bytes | None = None, token: str | None = None) -> tuple[int, bytes]:
        """Calls the admin API with the node's token (or the given one)."""
        req = urllib.request.Request(self.http_url + path, data=body, method=method,
                                     headers={"Content-Type": "application/json",
                                              "Authorization": "Bearer " + (self.admin_token if token is None else token)})
        try:
            with urllib.request.urlopen(req, timeout=CLI_TIMEOUT) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    # ---- debugging -------------------------------------------------------

    def stderr_tail(self, max_lines: int = 200) -> str:
        try:
            text = self.log_path.read_text("utf-8", "replace")
        except OSError:
            return "(no stderr log)"
        lines = text.splitlines()
        cut = lines[-max_lines:]
        head = f"----- {self.name} stderr ({self.log_path}), last {len(cut)} of {len(lines)} lines -----\n"
        return head + "\n".join(cut)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for node in getattr(item, "_quill_nodes", []):
            rep.sections.append((f"quill {node.name} stderr", node.stderr_tail()))


def _flag(args, name: str) -> str | None:
    """The value of `--name value` in a serve command line, else None."""
    args = list(args)
    return args[args.index(name) + 1] if name in args[:-1] else None


@pytest.fixture
def quill_factory(quill_bin, tmp_path, request):
    """Starts nodes with extra `serve` flags; stops all of them at teardown.

    On the Cassandra store (QUILL_E2E_STORE=cassandra) each node gets
    `--store cassandra` and a keyspace from the pool: a node that joins
    (`--join ADDR`) the keyspace of the node it joins, any other a keyspace
    of its own, given back (emptied) after the test's nodes are stopped.
    A test marked native_store keeps native nodes (it moves mail between
    the stores itself)."""
    nodes: list[QuillNode] = []
    request.node._quill_nodes = nodes
    on_cassandra = STORE == "cassandra" and request.node.get_closest_marker("native_store") is None
    taken: list[str] = []
    by_gossip: dict[str, str] = {}  # --cluster address -> keyspace
    pools = []

    def store_args(extra_args) -> list[str]:
        if not on_cassandra or "--store" in extra_args:
            return []
        if not pools:
            pools.append(request.getfixturevalue("keyspace_pool"))
        pool = pools[0]
        keyspace = by_gossip.get(_flag(extra_args, "--join") or "")
        if keyspace is None:
            keyspace = pool.take()
            taken.append(keyspace)
        if gossip := _flag(extra_args, "--cluster"):
            by_gossip[gossip] = keyspace
        return ["--store", "cassandra", "--cassandra", pool.hosts, "--keyspace", keyspace, "--cassandra-rf", "1"]

    def make(*extra_args: str, auth_fail_delay: float = AUTH_FAIL_DELAY, env: dict | None = None) -> QuillNode:
        name = f"node{len(nodes)}"
        # A fixed delay and no lockout, so that tests which fail logins on
        # purpose keep their timing; test_abuse.py sets its own.
        delay = f"{int(auth_fail_delay * 1000)}ms"
        args = ["--auth-fail-delay", delay, "--auth-max-delay", delay, "--auth-lockout-after", "100000",
                *store_args(extra_args), *extra_args]
        node = QuillNode(quill_bin, tmp_path / name, args, name=name, env=env,
                         start_timeout=CASSANDRA_QUILL_START_TIMEOUT if on_cassandra else START_TIMEOUT)
        nodes.append(node)
        return node.start()

    yield make
    for node in nodes:
        try:
            # A test that leaked a session would make the drain wait 30 s;
            # the SIGTERM behaviour itself is tested explicitly.
            node.stop(timeout=15)
        except Exception as e:  # noqa: BLE001 - teardown must reach every node
            print(f"teardown of {node.name}: {e}", file=sys.stderr)
            node.kill9()
    # Only once no node of the test runs may its keyspaces be emptied.
    for keyspace in taken:
        pools[0].give(keyspace)


def pytest_configure(config):
    config.addinivalue_line("markers", "native_only(reason): tests the native store's own files; "
                            "skipped on the Cassandra store (QUILL_E2E_STORE=cassandra), the reason says why")
    config.addinivalue_line("markers", "native_store: quill_factory starts native nodes even with "
                            "QUILL_E2E_STORE=cassandra (the test moves mail between the stores itself)")
    config.addinivalue_line("markers", "cassandra: needs a Cassandra node (the `cassandra` fixture); "
                            "`make e2e` leaves these to `make e2e-cassandra`")
    # One Cassandra node for the whole run, started by the main process
    # (with pytest-xdist the controller, before its workers start: they
    # inherit QUILL_CASSANDRA_HOSTS) and stopped in pytest_unconfigure.
    if STORE == "cassandra" and not hasattr(config, "workerinput") and not os.environ.get("QUILL_CASSANDRA_HOSTS"):
        if not _have_java():
            raise pytest.UsageError("QUILL_E2E_STORE=cassandra: no Java 17 for Cassandra (scripts/test-deps.sh installs it)")
        d = Path(tempfile.mkdtemp(prefix="quill-e2e-cassandra-"))
        try:
            hosts, pid = _start_cassandra(d)
        except RuntimeError as e:
            raise pytest.UsageError(f"QUILL_E2E_STORE=cassandra: {e}") from e
        config._quill_cassandra = (pid, d)
        os.environ["QUILL_CASSANDRA_HOSTS"] = hosts
        os.environ["QUILL_E2E_OWN_CASSANDRA"] = "1"


def pytest_unconfigure(config):
    started = getattr(config, "_quill_cassandra", None)
    if started is not None:
        pid, d = started
        _stop_cassandra(pid)
        shutil.rmtree(d, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if STORE != "cassandra":
        return
    for item in items:
        m = item.get_closest_marker("native_only")
        if m is not None:
            reason = m.kwargs.get("reason") or (m.args[0] if m.args else "tests the native store")
            item.add_marker(pytest.mark.skip(reason=f"native store only: {reason}"))


@pytest.fixture
def node(quill_factory) -> QuillNode:
    """A running node with the default limits and a 200 ms auth-fail delay."""
    return quill_factory()


@pytest.fixture(scope="session")
def curl() -> str:
    path = shutil.which("curl")
    if not path:
        pytest.fail("curl is required by the e2e tests (apt-get install curl)")
    return path


# Apache Cassandra for the tests of the Cassandra store (issue 15).
CASSANDRA_SCRIPT = REPO / "scripts" / "cassandra.sh"
# A fetch of the jars (first run without the cache) takes about a
# minute; a node's start about 10-30 s on two busy cores.
CASSANDRA_FETCH_TIMEOUT = 600.0
CASSANDRA_START_TIMEOUT = 180.0
CASSANDRA_STOP_TIMEOUT = 60.0
# A quill on Cassandra opens the keyspace before it is ready: a second on
# a made keyspace, more while Cassandra is busy with other tests' writes.
CASSANDRA_QUILL_START_TIMEOUT = 90.0
# Building the keyspace pool (tests/e2e/keyspacepool), once per process.
POOL_BUILD_TIMEOUT = 600.0


def _have_java() -> bool:
    return subprocess.run(["bash", str(CASSANDRA_SCRIPT), "java"], capture_output=True, timeout=30).returncode == 0


def _start_cassandra(d: Path) -> tuple[str, int]:
    """Starts one Cassandra node on a loopback address of its own, its
    files in d: (host:port, pid)."""
    r = subprocess.run(["bash", str(CASSANDRA_SCRIPT), "fetch"], capture_output=True, text=True, timeout=CASSANDRA_FETCH_TIMEOUT)
    if r.returncode != 0:
        raise RuntimeError(f"scripts/cassandra.sh fetch failed:\n{r.stderr}")
    # 127.0.0.100-249 is cassandratest's range; the Go tests and this
    # suite may run at once, so the ports are found free on the address.
    addr = f"127.0.0.{random.randint(100, 249)}"
    port, storage = free_port(addr), free_port(addr)
    r = subprocess.run(["bash", str(CASSANDRA_SCRIPT), "start", "--dir", str(d), "--addr", addr, "--port", str(port),
                        "--storage-port", str(storage), "--short-lived"],
                       capture_output=True, text=True, timeout=CASSANDRA_START_TIMEOUT, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"Cassandra did not start:\n{r.stdout}\n{r.stderr}")
    return f"{addr}:{port}", int(r.stdout.split()[-1])


def _stop_cassandra(pid: int) -> None:
    subprocess.run(["bash", str(CASSANDRA_SCRIPT), "stop", str(pid)], capture_output=True, timeout=CASSANDRA_STOP_TIMEOUT)


@pytest.fixture(scope="session")
def cassandra(tmp_path_factory) -> str:
    """A Cassandra node for the run (tests use keyspaces of their own):
    host:port. QUILL_CASSANDRA_HOSTS (set by pytest_configure on the
    Cassandra store, or by hand for a running cluster) names it; otherwise
    one is started for this process and stopped at its end."""
    hosts = os.environ.get("QUILL_CASSANDRA_HOSTS")
    if hosts:
        yield hosts
        return
    if not _have_java():
        if os.environ.get("CI") == "true":
            pytest.fail("no Java 17 for Cassandra (scripts/test-deps.sh installs it)")
        pytest.skip("no Java 17 for Cassandra")
    hosts, pid = _start_cassandra(tmp_path_factory.mktemp("cassandra"))
    yield hosts
    _stop_cassandra(pid)


class KeyspacePool:
    """Client of tests/e2e/keyspacepool: clean keyspaces, one per take."""

    def __init__(self, binary: str, hosts: str, prefix: str, drop: bool, log: Path):
        self.hosts = hosts
        with open(log, "ab") as f:  # what it made and emptied, with timings
            self.proc = subprocess.Popen([binary, "--cassandra", hosts, "--prefix", prefix, *(["--drop"] if drop else [])],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=f, text=True, bufsize=1)

    def _ask(self, line: str) -> str:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(line + "\n")
        answer = self.proc.stdout.readline().strip()
        if not answer or answer.startswith("error "):
            raise RuntimeError(f"keyspace pool: {line}: {answer or 'exited'}")
        return answer

    def take(self) -> str:
        return self._ask("take")

    def give(self, keyspace: str) -> None:
        self._ask("give " + keyspace)

    def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=CASSANDRA_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def keyspace_pool(cassandra, tmp_path_factory):
    """Clean keyspaces for the tests' nodes on the Cassandra store. Names
    carry a random run id and the pytest-xdist worker, so runs and workers
    sharing a cluster never meet; a cluster this run did not start gets its
    keyspaces dropped at the end."""
    d = tmp_path_factory.mktemp("keyspacepool")
    binary = d / "keyspacepool"
    r = subprocess.run(["go", "build", "-o", str(binary), "./tests/e2e/keyspacepool"], cwd=REPO,
                       capture_output=True, text=True, timeout=POOL_BUILD_TIMEOUT)
    assert r.returncode == 0, f"go build ./tests/e2e/keyspacepool failed:\n{r.stdout}\n{r.stderr}"
    run = f"{random.randrange(1 << 24):06x}"
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    pool = KeyspacePool(str(binary), cassandra, f"e2e_{run}_{worker}",
                        drop=os.environ.get("QUILL_E2E_OWN_CASSANDRA") != "1", log=d / "pool.log")
    yield pool
    pool.close()
