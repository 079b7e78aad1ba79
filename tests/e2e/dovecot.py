"""A real Dovecot (Debian's dovecot-imapd) for the migration tests: IMAP on
a free loopback port, serving one Maildir as user bob, started by the test
and stopped by its PID. Needs root: Dovecot serves mail as the system user
vmail (made if missing)."""

from __future__ import annotations

import imaplib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from datetime import datetime
from pathlib import Path

import pytest

from mailutil import free_port, ok, wait_for

DOVECOT = "/usr/sbin/dovecot"
USER = "bob"
PASSWORD = "dovecot-pass"  # no space: the static passdb splits its args at spaces
TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


def need_dovecot() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: Dovecot serves the Maildir as the user vmail")
    if not os.path.exists(DOVECOT):
        pytest.fail("Dovecot is missing (apt-get install dovecot-imapd; scripts/test-deps.sh installs it)")
    try:
        pwd.getpwnam("vmail")
    except KeyError:
        subprocess.run(["useradd", "-r", "-M", "-d", "/nonexistent", "-s", "/usr/sbin/nologin", "vmail"], check=True)


def scratch_dir() -> Path:
    """A directory the user vmail can enter (pytest's tmp_path is 0700)."""
    d = Path(tempfile.mkdtemp(prefix="quill-dovecot-"))
    d.chmod(0o755)
    return d


class Dovecot:
    """One Dovecot serving maildir (its INBOX) with IMAP on a free port.
    special_use names the folders marked \\Sent, \\Drafts... (RFC 6154)."""

    def __init__(self, root: Path, maildir: Path, special_use: dict[str, str] | None = None):
        self.root, self.maildir = root, maildir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        vmail = pwd.getpwnam("vmail")
        boxes = "".join(f"  mailbox \"{name}\" {{\n    special_use = {use}\n  }}\n"
                        for name, use in (special_use or {}).items())
        for d in ("run", "state"):
            (root / d).mkdir(exist_ok=True)
        self.conf = root / "dovecot.conf"
        self.conf.write_text(f"""protocols = imap
listen = 127.0.0.1
base_dir = {root}/run
state_dir = {root}/state
log_path = {root}/dovecot.log
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain
default_internal_user = dovecot
default_login_user = dovenull
first_valid_uid = 100
passdb {{
  driver = static
  args = password={PASSWORD}
}}
userdb {{
  driver = static
  args = uid={vmail.pw_uid} gid={vmail.pw_gid} home={root}
}}
mail_location = maildir:{maildir}
namespace inbox {{
  inbox = yes
  separator = /
{boxes}}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {self.port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
""")

    def start(self) -> "Dovecot":
        vmail = pwd.getpwnam("vmail")
        for p in [self.maildir, *self.maildir.rglob("*")]:
            os.chown(p, vmail.pw_uid, vmail.pw_gid, follow_symlinks=False)
        self.proc = subprocess.Popen([DOVECOT, "-F", "-c", str(self.conf)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=open(self.root / "stderr.log", "ab"))

        def listening() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"dovecot exited with {self.proc.returncode}:\n{self.log()}")
            try:
                self.login().logout()
                return True
            except (OSError, imaplib.IMAP4.error):
                return False

        try:
            wait_for(f"Dovecot on port {self.port}", listening, timeout=TIMEOUT)
        except BaseException:
            self.stop()
            raise AssertionError(f"Dovecot did not serve on port {self.port}:\n{self.log()}")
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=STOP_TIMEOUT)

    def log(self) -> str:
        out = []
        for name in ("dovecot.log", "stderr.log"):
            p = self.root / name
            if p.exists():
                out.append(p.read_text("utf-8", "replace")[-5000:])
        return "\n".join(out)

    def login(self) -> imaplib.IMAP4:
        m = imaplib.IMAP4("127.0.0.1", self.port, timeout=TIMEOUT)
        m.login(USER, PASSWORD)
        return m

    @property
    def url(self) -> str:
        return f"imap://{USER}@127.0.0.1:{self.port}"


_LIST_RE = re.compile(rb'^\((?P<attrs>[^)]*)\) (?:NIL|"[^"]*") (?P<name>.+)$')
_FETCH_RE = re.compile(rb"UID (\d+)|FLAGS \(([^)]*)\)|INTERNALDATE \"([^\"]+)\"")


def folders(m: imaplib.IMAP4, subscribed: bool = False) -> dict[str, set[str]]:
    """The folders LIST (or LSUB) shows, as sent (modified UTF-7), with
    their attributes; \\Noselect ones left out."""
    out = {}
    for line in ok(m.lsub() if subscribed else m.list()):
        g = _LIST_RE.match(line)
        assert g, line
        attrs = set(g["attrs"].decode().split())
        name = g["name"].decode()
        if name.startswith('"'):
            name = name[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        if "\\Noselect" not in attrs and "\\NonExistent" not in attrs:
            out[name] = attrs
    return out


def quote(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def messages(m: imaplib.IMAP4, folder: str) -> tuple[int, list[tuple[int, bytes, frozenset, float]]]:
    """A folder's UIDVALIDITY and its messages in UID order: (UID, bytes,
    flags without \\Recent, internal date as a timestamp)."""
    ok(m.select(quote(folder), readonly=True))
    validity = int(m.response("UIDVALIDITY")[1][0])
    typ, data = m.uid("FETCH", "1:*", "(UID FLAGS INTERNALDATE BODY.PEEK[])")
    assert typ == "OK", (typ, data)
    out = []
    for item in data:
        if not isinstance(item, tuple):
            continue
        uid, flags, date = None, frozenset(), None
        for g in _FETCH_RE.finditer(item[0]):
            if g.group(1):
                uid = int(g.group(1))
            elif g.group(2) is not None:
                flags = frozenset(f for f in g.group(2).decode().split() if f != "\\Recent")
            else:
                date = datetime.strptime(g.group(3).decode(), "%d-%b-%Y %H:%M:%S %z").timestamp()
        assert uid is not None and date is not None, item[0]
        out.append((uid, item[1], flags, date))
    out.sort()
    return validity, out


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
