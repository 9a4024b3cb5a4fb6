"""`provision upgrade --check` of a vLLM host over real sshd (issue 61): 0.17.0 to 0.18.0 on the real
releases' files.

The sandbox host's venv (/opt/venv) carries vLLM 0.17.0's files as its source archive has them; the
sandbox's vLLM stand-in (sandbox/vllm_standin.py, stdlib only: no torch here) answers for the server,
run as the playbook's `launch.module` in that venv's interpreter. Kimi-K2.5's wrapper lacks
SupportsEagle3 in 0.17 (the shipped spec patches it at launch) and has it in 0.18: staged from a
wheel of 0.18.0's own files, the spec is judged native there, and the server is never touched.
The profile's flags through 0.18's own parser need vLLM importable (torch): the real-vLLM tier
judges them (tests/realvllm, 0.31 -> 0.32); here the plan says they were not checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.cli.helpers import run_json
from tests.cli.test_server_lifecycle import record

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
STANDIN = Path(__file__).resolve().parents[2] / "provision" / "sandbox" / "vllm_standin.py"


@pytest.fixture(scope="module")
def v017(sandbox_factory):
    host = sandbox_factory.host("upv017", sglang="0.5.9", layout="venv", vllm="0.17.0")
    yield host
    sandbox_factory.remove(host)


def _setup(tmp_path, ssh_env, host) -> str:
    """The stand-in beside the host's venv, the models' configs, the playbook (the shipped Kimi-K2.5
    vLLM spec, the stand-in as its module) and the inventory: its path."""
    where = host.hostpath("/opt/provision-vllm-standin")
    where.mkdir(parents=True, exist_ok=True)
    (where / "vllm_standin.py").write_bytes(STANDIN.read_bytes())
    for name, archs in (("kimi-k25", ["KimiK25ForConditionalGeneration"]), ("eagle3", ["LlamaForCausalLMEagle3"])):
        d = host.hostpath(f"/data/models/{name}")
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps({"architectures": archs}))
    shipped = yaml.safe_load((PLAYBOOKS / "kimi-k25-eagle3-vllm.yaml").read_text())
    pb = {"name": "kimi-k25-eagle3-vllm", "engine": "vllm", "patch": shipped["patch"],
          "launch": {"engine": "vllm", "module": "vllm_standin",
                     "args": {"model": "/data/models/kimi-k25", "max-model-len": 4096,
                              "speculative-config": {"method": "eagle3", "model": "/data/models/eagle3",
                                                     "num_speculative_tokens": 3}},
                     "env": {"PYTHONPATH": "/opt/provision-vllm-standin", "PROVISION_STANDIN_LOAD_SECONDS": "1"}}}
    (tmp_path / "pb.yaml").write_text(json.dumps(pb))
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts)},
           "hosts": {host.name: {"address": host.address, "port": host.port, "profile": str(tmp_path / "pb.yaml"),
                                 "python": "/opt/venv/bin/python3"}}}
    (tmp_path / "inv.yaml").write_text(json.dumps(inv))
    return str(tmp_path / "inv.yaml")


def test_check_from_0_17_to_0_18_finds_the_kimi_spec_native_and_touches_nothing(tmp_path, tmp_path_factory, ssh_env,
                                                                               v017):
    from provision.sandbox.upgrade_wheels import vllm_files_wheel

    inv = _setup(tmp_path, ssh_env, v017)
    house = tmp_path_factory.mktemp("vllm-wheelhouse")
    vllm_files_wheel("0.18.0", house)
    # 0.17's inner model (DeepseekV2ForCausalLM) lacks the EAGLE-3 methods too: preflight says a later
    # release has them, which is this upgrade; the stand-in starts anyway (--force)
    proc, doc = run_json("launch", "-i", inv, "--patch", "--force", "--poll", "0.5", "--deadline", "120",
                         timeout=300)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", json.dumps(doc)[-3000:]
    fails = [line for line in proc.stderr.splitlines() if "preflight fail" in line]
    assert len(fails) == 1 and "a later release that has it there: upgrade" in fails[0], proc.stderr[-3000:]
    # (and not the spec: in place, its protocol read in vLLM's own package)
    try:
        rec = record(v017)
        assert rec["version"] == "0.17.0" and rec["python"].startswith("/opt/venv/bin/python"), rec
        pid = rec["pid"]

        proc, doc = run_json("upgrade", "-i", inv, "--to", "0.18.0", "--check", timeout=120)
        row = doc["hosts"][0]
        assert proc.returncode == 4, doc
        assert "vllm 0.17.0 -> 0.18.0: would install 0.18.0 into /opt/vllm-0.18.0 beside /opt/venv" in row["detail"]

        proc, doc = run_json("upgrade", "-i", inv, "--to", "0.18.0", "--stage", "--wheelhouse", str(house),
                             "--no-deps", timeout=400)
        row = doc["hosts"][0]
        print(f"\nupgrade --stage: {row['detail']}")
        assert proc.returncode == 0 and row["verdict"] == "staged", doc
        assert "spec kimi-k25-eagle3-vllm: native in 0.18.0" in row["detail"], row
        eagle3 = [c for c in row["data"]["plan"]["checks"] if c["check"] == "eagle3"]
        assert [c["level"] for c in eagle3] == ["ok"], row["data"]["plan"]  # 0.18's inner model has them
        got = v017.run("/opt/vllm-0.18.0/bin/python -c 'import importlib.metadata as m; print(m.version(\"vllm\"))'")
        assert got.stdout.strip() == "0.18.0"

        proc, doc = run_json("upgrade", "-i", inv, "--to", "0.18.0", "--check", timeout=120)
        row = doc["hosts"][0]
        assert proc.returncode == 4 and "would restart port 30000 into /opt/vllm-0.18.0" in row["detail"], row
        assert "spec kimi-k25-eagle3-vllm: native in 0.18.0" in row["detail"], row
        assert record(v017)["pid"] == pid and record(v017)["version"] == "0.17.0"  # never touched
    finally:
        run_json("stop", "-i", inv, timeout=120)
