"""Which install discovery acts on (facts/installs.choose): the first rule of the documented order
that names one, for every combination of what a host can present. Pure."""

from __future__ import annotations

import itertools

import pytest

from provision.host import inference
from provision.host.facts import installs
from provision.host.facts.installs import SELECTION_ORDER


def choose(*args, **kw):
    """The install rule for SGLang's installs (the engine names itself in the sentences)."""
    return installs.choose(*args, engine=inference.get("sglang"), **kw)

A = {"path": "/opt/venv/lib/python3.11/site-packages/sglang", "interpreters": ["/opt/venv/bin/python3"],
     "version": "0.5.9"}
B = {"path": "/root/sglang/python/sglang", "interpreters": ["/usr/bin/python3"], "version": "0.5.10"}
SERVERS = {
    "none": [],
    "root-on-B": [{"pid": 40, "install": B["path"], "chooses": True, "uid": 0}],
    "two-root": [{"pid": 90, "install": A["path"], "chooses": True, "uid": 0},
                 {"pid": 41, "install": B["path"], "chooses": True, "uid": 0}],
    "alices": [{"pid": 7, "install": "/home/alice/sglang/python/sglang", "user": "alice", "uid": 1000}],
}
PYTHONS = {"none": None, "A's": "/opt/venv/bin/python3", "other": "/usr/local/bin/python3.12"}
PYTHON3 = {"none": None, "B's": "/usr/bin/python3", "other": "/usr/local/bin/python3"}
# the last record's interpreter: A's venv by another name of its python (bin/python, as upgrade records it)
RECORDED = {"none": None, "A's": {"python": "/opt/venv/bin/python", "port": 30000},
            "gone": {"python": "/opt/sglang-0.5.8/bin/python", "port": 30000}}
INSTALLS = {"none": [], "A": [A], "A+B": [A, B]}


def oracle(pinned, python, servers, python3, installs, recorded=None):
    if pinned:
        return pinned, "pinned"
    hit = [r["path"] for r in installs if python and python in r["interpreters"]]
    if hit:
        return hit[0], "python"
    live = sorted((s for s in servers if s.get("chooses")), key=lambda s: s["pid"])
    if live:
        return live[0]["install"], "server"
    if recorded and recorded["python"].startswith("/opt/venv/") and A in installs:
        return A["path"], "recorded"
    hit = [r["path"] for r in installs if python3 and python3 in r["interpreters"]]
    if hit:
        return hit[0], "python3"
    if len(installs) == 1:
        return installs[0]["path"], "only"
    return None, None


@pytest.mark.parametrize("pinned,python,servers,python3,installs,recorded", list(itertools.product(
    [None, "/srv/pinned/sglang"], PYTHONS, SERVERS, PYTHON3, INSTALLS, RECORDED)))
def test_the_first_rule_that_names_an_install_chooses_it(pinned, python, servers, python3, installs, recorded):
    got = choose(INSTALLS[installs], SERVERS[servers], pinned=pinned, configured_python=PYTHONS[python],
                 python3=PYTHON3[python3], recorded=RECORDED[recorded])
    chosen, rule, reason, error = got
    assert (chosen, rule) == oracle(pinned, PYTHONS[python], SERVERS[servers], PYTHON3[python3], INSTALLS[installs],
                                    RECORDED[recorded])
    if chosen:
        assert rule in SELECTION_ORDER and reason and error is None
    else:
        assert error["kind"] == ("ambiguous" if INSTALLS[installs] else "not-found"), error


def test_another_users_server_never_chooses_even_alone():
    chosen, rule, _, _ = choose([A], SERVERS["alices"])
    assert (chosen, rule) == (A["path"], "only")
    chosen, rule, _, err = choose([], SERVERS["alices"])
    assert chosen is None and err["kind"] == "not-found"


def test_the_reasons_say_which_rule_chose():
    assert choose([A, B], SERVERS["two-root"])[2] == "the running server pid 41 (run by root) imports it"
    assert choose([A], [], pinned="/x")[2] == "it was pinned with --sglang-path"
    assert choose([A, B], [], configured_python="/opt/venv/bin/python3")[2] == \
        "/opt/venv/bin/python3 (--python or `python:`) imports it"
    assert choose([A, B], [], python3="/usr/bin/python3")[2] == "python3 on PATH (/usr/bin/python3) imports it"
    assert choose([A], [])[2] == "it is the only trusted install on this host"
    assert choose([A, B], [], recorded=RECORDED["A's"])[2] == \
        "the server provision started last here (port 30000, /opt/venv/bin/python) ran it"


def test_nothing_found_names_the_installs_skipped_as_untrusted():
    skipped = [{"path": "/home/alice/sglang/python/sglang", "reason": "owned by alice", "what": "install"},
               {"path": "/home/alice/venv/bin/python3", "reason": "owned by alice"}]
    err = choose([], [], skipped=skipped)[3]
    assert "skipped as not root's alone: /home/alice/sglang/python/sglang (owned by alice)" in err["message"]
    assert "venv/bin/python3" not in err["message"] and "--sglang-path" in err["message"]
    assert "several SGLang installs" in choose([A, B], [])[3]["message"]
