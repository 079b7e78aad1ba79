"""Prometheus metrics of a real two-node cluster (issue 14, "Metrics").

Two `quill serve` processes join one cluster; mail, logins and IMAP
commands go through them; then each node's /metrics is fetched with the
admin token and checked by Debian's `promtool check metrics` (the same
linter Prometheus' own tooling runs), the counters are checked to have
moved, and the Grafana dashboard (deploy/grafana/quill.json) is checked
against what the nodes export: every quill_* name its queries use exists,
and every quill_* family exported has a panel; promtool also parses every
panel's query (as a recording rule's expression).
"""

from __future__ import annotations

import imaplib
import json
import poplib
import re
import shutil
import smtplib
import subprocess
import urllib.request
from pathlib import Path

import pytest

from conftest import STORE
from mailutil import SOCK_TIMEOUT, cluster_pair, imap_login, ok, send, wait_for

DOMAIN = "quill.test"
ALICE = f"alice@{DOMAIN}"
PW = "metrics pass"
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "quill.json"
PROMTOOL_TIMEOUT = 30

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_TYPE = re.compile(r"^# TYPE (\S+) (\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(node) -> str:
    req = urllib.request.Request(node.http_url + "/metrics",
                                 headers={"Authorization": "Bearer " + node.admin_token})
    with urllib.request.urlopen(req, timeout=SOCK_TIMEOUT) as resp:
        assert resp.status == 200
        return resp.read().decode()


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


def value(text: str, name: str, **labels: str) -> float:
    """The sum of name's samples whose labels include labels."""
    return sum(v for n, ls, v in samples(text) if n == name and all(ls.get(k) == w for k, w in labels.items()))


def families(text: str) -> dict[str, str]:
    """quill_* family name -> type, from the # TYPE lines."""
    return {m.group(1): m.group(2) for m in map(_TYPE.match, text.splitlines()) if m and m.group(1).startswith("quill_")}


def promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        pytest.fail("promtool is required (Debian package prometheus; scripts/test-deps.sh installs it)")
    return path


def promtool_check(text: str) -> str:
    """What `promtool check metrics` says of an exposition: "" when clean."""
    r = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=PROMTOOL_TIMEOUT)
    said = (r.stdout + r.stderr).strip()
    return said if r.returncode != 0 or said else ""


def panel_exprs() -> list[str]:
    """The PromQL of every panel of the dashboard."""
    d = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in d["panels"] for t in p.get("targets", [])]


def dashboard_names() -> set[str]:
    """Every quill_* name a query of the dashboard (panels and variables) uses."""
    exprs = panel_exprs()
    for v in json.loads(DASHBOARD.read_text())["templating"]["list"]:
        q = v.get("query")
        exprs.append(q.get("query", "") if isinstance(q, dict) else q or "")
    return {n for e in exprs for n in re.findall(r"\bquill_[a-zA-Z0-9_]+", e)}


def test_dashboard_queries_are_promql(tmp_path):
    """Every panel's query parses as PromQL: promtool checks them as the
    expressions of recording rules, Grafana's variables filled in."""
    exprs = [e.replace("$__rate_interval", "1m").replace("$instance", ".*") for e in panel_exprs()]
    assert exprs, f"no queries in {DASHBOARD}"
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"quill_dashboard_query_{i}", "expr": e}
                                                          for i, e in enumerate(exprs)]}]}
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))  # YAML is a superset of JSON
    r = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True,
                       timeout=PROMTOOL_TIMEOUT)
    assert r.returncode == 0, f"promtool check rules on the dashboard's queries:\n{r.stdout}{r.stderr}"


@pytest.fixture
def pair(quill_factory):
    """Nodes A and B of one cluster, alice added through A and able to log
    in through B (so B's soft state has her)."""
    return cluster_pair(quill_factory, ALICE, PW)


def test_metrics_pass_promtool_move_and_match_the_dashboard(pair):
    a, b = pair
    before = scrape(a)

    msg = (b"From: Sender <sender@remote.test>\r\nTo: " + ALICE.encode()
           + b"\r\nSubject: metrics\r\n\r\nbody\r\n")
    for _ in range(3):
        assert send(a, ALICE, msg) == {}
    with pytest.raises(smtplib.SMTPRecipientsRefused):
        send(a, f"nobody@{DOMAIN}", msg)

    m = imap_login(a, ALICE, PW)
    ok(m.select("INBOX"))
    assert len(ok(m.search(None, "ALL"))[0].split()) == 3
    ok(m.fetch("1:*", "(FLAGS)"))
    with pytest.raises(imaplib.IMAP4.error, match="Unknown command"):
        m.xatom("FROBNICATE")  # BAD, counted as UNKNOWN
    m.logout()
    with pytest.raises(imaplib.IMAP4.error):
        imap_login(a, ALICE, "wrong password")
    host, port = b.pop3_addr
    p = poplib.POP3(host, port, timeout=SOCK_TIMEOUT)
    p.user(ALICE)
    p.pass_(PW)
    assert p.stat()[0] == 3
    p.quit()

    # The repair scan (every 5 s) and the node-to-node calls of both
    # sides have happened once these are there.
    def ready() -> tuple[str, str] | None:
        ta, tb = scrape(a), scrape(b)
        both = ta + tb
        if all(f"\n{n}" in both for n in ("quill_repair_last_timestamp_seconds{", "quill_rpc_server_seconds_bucket{",
                                            "quill_rpc_client_seconds_bucket{")) and "quill_repair_last_timestamp_seconds{" in ta:
            return ta, tb
        return None

    ta, tb = wait_for("the repair scan and RPC series on both nodes", ready)

    for node, text in ((a, ta), (b, tb)):
        said = promtool_check(text)
        assert said == "", f"promtool check metrics on {node.name}:\n{said}"

    def moved(name: str, by: float, **labels: str) -> None:
        d = value(ta, name, **labels) - value(before, name, **labels)
        assert d == by, f"{name}{labels} moved by {d}, want {by}"

    moved("quill_messages_delivered_total", 3)
    moved("quill_delivery_seconds_count", 3)
    moved("quill_smtp_refusals_total", 1, protocol="smtp", stage="rcpt", reason="unknown_user")
    moved("quill_commands_total", 1, protocol="smtp", command="RCPT", result="5xx")
    moved("quill_commands_total", 3, protocol="smtp", command="DATA", result="2xx")
    moved("quill_commands_total", 1, protocol="imap", command="SELECT", result="ok")
    moved("quill_commands_total", 1, protocol="imap", command="UNKNOWN", result="bad")
    moved("quill_logins_total", 1, protocol="imap", result="ok")
    moved("quill_logins_total", 1, protocol="imap", result="failed")
    moved("quill_auth_failures_total", 1, protocol="imap")
    assert value(tb, "quill_logins_total", protocol="pop3", result="ok") >= 1
    assert value(tb, "quill_commands_total", protocol="pop3", command="STAT", result="ok") == 1
    # State read at the scrape: two live members, the buckets split
    # between them, the messages held on their replicas.
    for node, text in ((a, ta), (b, tb)):
        assert value(text, "quill_members", node=node.node_id, state="alive") == 2, node.name
        assert value(text, "quill_node_info", node=node.node_id) == 1, node.name
    managed = value(ta, "quill_buckets_managed") + value(tb, "quill_buckets_managed")
    assert managed == 256, f"buckets managed by A and B: {managed}"
    if STORE == "native":
        # On the Cassandra store the nodes hold no replicas (Cassandra
        # does) and write nothing hard to their data directory's Pebble:
        # the queue and the clusterwide objects are in the keyspace too.
        assert value(ta, "quill_repair_objects") + value(tb, "quill_repair_objects") >= 3
        assert value(ta, "quill_pebble_wal_written_bytes_total") > 0
    assert value(ta, "quill_softstate_rebuild_seconds_count") + value(tb, "quill_softstate_rebuild_seconds_count") >= 1

    # The dashboard and the nodes agree: every name it queries is exported
    # (a histogram's _bucket, _sum and _count included), and every quill_*
    # family exported has a panel.
    exported = {n for n, _, _ in samples(ta) + samples(tb)}
    fams = families(ta) | families(tb)
    used = dashboard_names()
    missing = sorted(n for n in used if n not in exported)
    assert not missing, f"the dashboard queries names no node exports: {missing}"

    def in_dashboard(fam: str, kind: str) -> bool:
        names = [fam + s for s in ("_bucket", "_sum", "_count")] if kind == "histogram" else [fam]
        return any(n in used for n in names)

    unused = sorted(f for f, kind in fams.items() if not in_dashboard(f, kind))
    assert not unused, f"families with no panel in {DASHBOARD.name}: {unused}"
