"""A no-op `patch` takes reconcile's fast path: when the file holds exactly the bytes our last patch
of the same spec wrote, the host answers `unchanged` without discovery (no interpreter probed,
nothing written), with the same verdict, file, sha and methods as the full look gives; any
other file, spec or request takes the full look."""

from __future__ import annotations

import pytest

from provision.host.facts import installs
from provision.host.facts import servers as server_facts
from provision.host import agent


@pytest.fixture
def site(tmp_path, monkeypatch):
    from provision.sandbox import wheels

    try:
        src = wheels.models_file("0.5.9").read_bytes()
    except wheels.WheelUnavailable as exc:
        pytest.skip(str(exc))
    from provision.config.playbook import load_patch_spec

    spec = load_patch_spec(None).to_engine()
    pkg = tmp_path / "site" / "sglang"
    target = pkg / spec["file"]
    target.parent.mkdir(parents=True)
    target.write_bytes(src)
    (pkg / "__init__.py").write_text("")
    (pkg / "_version.py").write_text("__version__ = version = '0.5.9'\n")
    # this machine's own processes (other sessions' servers) are not this test's subject
    monkeypatch.setattr(server_facts, "_server_candidates", lambda *engine: [])
    monkeypatch.setattr(installs, "running_servers", lambda *engine: [])
    probes: list = []
    real = installs.probe_interpreter
    monkeypatch.setattr(installs, "probe_interpreter", lambda p, *a, **kw: probes.append(p) or real(p, *a, **kw))
    req = {"op": "patch", "check": False, "diff": False, "force": False, "install_path": str(pkg), "python": None,
           "verify_import": False, "specs": [spec], "state_dir": str(tmp_path / "state")}
    return req, target, probes


def _patch(req, bundle):
    """The `patch` op as the agent dispatches it (ops/patch_fast.py, then ops/patch.py)."""
    return agent.dispatch(req, bundle)


def _row(ans):
    r = ans["results"][0]["result"]
    return (ans["ok"], r["verdict"], r["file"], r["sha_after"], r["kept"], r["added"], ans["facts"]["chosen"])


def test_a_no_op_patch_takes_the_fast_path_and_answers_as_the_full_look(site):
    req, target, probes = site
    first = _patch(req, b"")
    assert first["results"][0]["result"]["verdict"] == "patched"
    state = target.parents[4] / "state" / "state.json"
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (target, state)}
    probes.clear()

    fast = _patch(req, b"")
    assert fast["results"][0]["result"]["path"] == "fast" and fast["facts"]["fast"] is True
    assert probes == [], "no interpreter was probed"
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in before} == before, "nothing was written"
    full = _patch(dict(req, diff=True), b"")  # --diff takes the full look
    assert probes, "the full look probes interpreters"
    assert "path" not in full["results"][0]["result"]
    assert _row(fast) == _row(full)
    assert _row(fast)[1] == "unchanged"
    # --check too
    assert _patch(dict(req, check=True), b"")["results"][0]["result"]["path"] == "fast"


def test_anything_else_takes_the_full_look(site):
    req, target, probes = site
    _patch(req, b"")
    spec = req["specs"][0]
    # a changed spec: its block is re-rendered, never called unchanged
    changed = dict(spec, methods=[dict(m, params=m["params"] + ", **kw") if m["name"] == "get_embed_and_head"
                                  else m for m in spec["methods"]])
    ans = _patch(dict(req, specs=[changed]), b"")
    assert "path" not in ans["results"][0]["result"] and ans["results"][0]["result"]["verdict"] != "unchanged"
    _patch(req, b"")  # back to the first spec
    assert _patch(req, b"")["results"][0]["result"].get("path") == "fast"
    # a named interpreter, --force, unpatch: the full look
    for r in (dict(req, python="/usr/bin/python3"), dict(req, force=True)):
        assert "path" not in _patch(r, b"")["results"][0]["result"]
    # someone appended a line: bytes differ from our last write
    with open(target, "a") as fh:
        fh.write("# edited\n")
    assert "path" not in _patch(req, b"")["results"][0]["result"]


NO_OP_IMPORTS = r"""
import json, sys
from provision.host import agent
from provision.host.facts import servers
servers._server_candidates = lambda *engine: []  # this machine's other servers are not this test's subject
ans = agent.dispatch(json.loads(sys.argv[1]), b"")
heavy = [m for m in ("provision.host.facts.installs", "provision.host.engine.core", "provision.host.engine.pysource",
                     "provision.host.ops.patch", "provision.host.ops.fileops", "subprocess", "typing", "ast") if m in sys.modules]
print(json.dumps({"path": (ans.get("results") or [{}])[0].get("result", {}).get("path"), "heavy": heavy}))
"""


def test_a_no_op_patch_imports_neither_discovery_nor_the_engine_parser(site):
    """The timer's hot path: on an unchanged host the patch op loads only the state file's and the
    file's readers (a fresh interpreter, as on a host); a changed file still gets the full look."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from provision.host.engine.render import block_shas

    req, target, _ = site
    req = dict(req, spec_block_shas={s["name"]: list(block_shas(s)) for s in req["specs"]})  # as tasks/patch.py sends
    _patch(req, b"")
    root = str(Path(__file__).resolve().parents[2])

    def run(r):
        out = subprocess.run([sys.executable, "-S", "-c", NO_OP_IMPORTS, json.dumps(r)], capture_output=True,
                             text=True, env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    assert run(req) == {"path": "fast", "heavy": []}
    with open(target, "a") as fh:
        fh.write("# edited\n")
    full = run(req)
    assert full["path"] is None and "provision.host.facts.installs" in full["heavy"]
