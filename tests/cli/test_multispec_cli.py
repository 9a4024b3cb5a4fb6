"""Several patch specs per host over real sshd: one connection and one remote call per host for
all of them, one row per host and spec; `applies:` and not-applicable; launch `requires:`."""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from tests.cli.helpers import run, run_json

KIMI = "srt/models/kimi_k25.py"
KIMI_VL = "srt/models/kimi_vl.py"
BOTH = ["kimi-k25-eagle3", "kimi-vl-eagle3"]


def model_file(host, rel):
    return host.hostpath(os.path.join(host.sglang_dir, rel))


class SshdLog:
    """What a host's sshd accepted: connections and the sessions (remote commands) on them.
    Turns the host's sshd to LogLevel VERBOSE (each `sshd -i` reads its config anew)."""

    def __init__(self, host):
        self.host = host
        self.config = host.fs_dir / "etc-ssh" / "sshd_config"
        self.original = self.config.read_text()
        self.config.write_text(self.original.replace("LogLevel ERROR", "LogLevel VERBOSE"))
        self.log = host.state_dir / "host.log"
        self.mark()

    def mark(self) -> None:
        self.start = self.log.stat().st_size if self.log.exists() else 0

    def counts(self) -> tuple[int, int]:
        """(connections, remote commands) since the last mark."""
        with open(self.log, "rb") as fh:
            fh.seek(self.start)
            text = fh.read().decode("utf-8", "replace")
        return text.count("Accepted publickey"), len(re.findall(r"Starting session: command", text))

    def restore(self) -> None:
        self.config.write_text(self.original)


@pytest.fixture
def sshd_log():
    made = []

    def make(host):
        made.append(SshdLog(host))
        return made[-1]
    yield make
    for s in made:
        s.restore()


def inventory(ssh_env, tmp_path, hosts, **vars_by_host) -> str:
    """The sandbox inventory for these hosts, with extra variables per host."""
    path = ssh_env.inventory(tmp_path / "inv.yaml", hosts)
    data = yaml.safe_load(path.read_text())
    for name, extra in vars_by_host.items():
        data["hosts"][name].update(extra)
    path.write_text(yaml.safe_dump(data))
    return str(path)


def rows(doc) -> dict:
    return {(h["host"], h["data"].get("spec")): h for h in doc["hosts"]}


def test_two_specs_one_connection_one_call(sandbox_factory, ssh_env, tmp_path, sshd_log):
    host = sandbox_factory.host(sglang="0.5.9", layout="venv")
    before = {rel: model_file(host, rel).read_bytes() for rel in (KIMI, KIMI_VL)}
    inv = inventory(ssh_env, tmp_path, [host], **{host.name: {"specs": BOTH}})
    log = sshd_log(host)

    proc, doc = run_json("patch", "-i", inv)
    assert proc.returncode == 0, proc.stderr
    got = rows(doc)
    assert {k: v["verdict"] for k, v in got.items()} == {(host.name, s): "patched" for s in BOTH}
    assert [h["data"]["spec"] for h in doc["hosts"]] == BOTH               # the inventory's order
    assert got[(host.name, "kimi-vl-eagle3")]["file"].endswith(KIMI_VL)
    assert log.counts() == (1, 1), "one connection and one remote command for both specs"
    for rel in (KIMI, KIMI_VL):
        assert model_file(host, rel).read_bytes() != before[rel]

    log.mark()
    proc = run("patch", "-i", inv, "--format", "lines", check_rc=0)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(host.name)]
    assert [ln.split("  ")[1] for ln in lines] == ["unchanged", "unchanged"], proc.stdout
    assert "spec kimi-vl-eagle3" in lines[1]
    assert proc.stdout.rstrip().endswith("1 host, 2 host-specs: 2 unchanged"), proc.stdout
    assert log.counts() == (1, 1)

    # --playbook, repeated, means the same as the inventory's specs:
    log.mark()
    proc, doc = run_json("status", *ssh_env.cli_args, "--host", host.name, "--playbook", BOTH[1], "--playbook", BOTH[0])
    assert proc.returncode == 0, proc.stdout
    assert [(h["data"]["spec"], h["verdict"]) for h in doc["hosts"]] == [(BOTH[1], "patched"), (BOTH[0], "patched")]
    assert log.counts() == (1, 1)

    log.mark()
    proc, doc = run_json("reconcile", "-i", inv)
    assert proc.returncode == 0, proc.stdout
    assert [(h["data"]["spec"], h["verdict"]) for h in doc["hosts"]] == [(s, "unchanged") for s in BOTH]
    assert log.counts() == (1, 1)

    # an upgrade that wipes one file: reconcile re-patches that spec only
    model_file(host, KIMI_VL).write_bytes(before[KIMI_VL])
    proc, doc = run_json("reconcile", "-i", inv)
    assert proc.returncode == 0, proc.stdout
    assert [(h["data"]["spec"], h["verdict"]) for h in doc["hosts"]] == [(BOTH[0], "unchanged"), (BOTH[1], "patched")]

    log.mark()
    proc, doc = run_json("unpatch", "-i", inv)
    assert proc.returncode == 0, proc.stdout
    assert [h["verdict"] for h in doc["hosts"]] == ["unpatched", "unpatched"]
    assert log.counts() == (1, 1)
    for rel in (KIMI, KIMI_VL):
        assert model_file(host, rel).read_bytes() == before[rel], "unpatch restores every byte"

    # the journal has a row per host and spec; --playbook picks one spec's
    proc = run("history", "--playbook", "kimi-vl-eagle3", "--json", check_rc=0)
    recs = [json.loads(ln) for ln in proc.stdout.splitlines()]
    assert [(r["command"], r["verdict"]) for r in recs if r["host"] == host.name] == \
        [("patch", "patched"), ("reconcile", "patched"), ("unpatch", "unpatched")]
    assert {r["spec"] for r in recs} == {"kimi-vl-eagle3"}
    proc = run("history", "--host", host.name, "--format", "lines", check_rc=0)
    header = proc.stdout.splitlines()[0].split("  ")
    assert header[:3] == ["time", "host", "spec"]


def _playbook(tmp_path, name: str, base: str, applies: dict) -> str:
    """A copy of a shipped spec under another name, with `applies:`."""
    from provision.config.playbook import PACKAGE_PLAYBOOKS

    data = yaml.safe_load((PACKAGE_PLAYBOOKS / f"{base}.yaml").read_text())
    data["name"] = name
    data.pop("launch", None)
    data["patch"]["applies"] = applies
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_applies_decided_from_the_hosts_facts(sandbox_factory, ssh_env, tmp_path, sshd_log):
    plain = sandbox_factory.host(sglang="0.5.9", layout="venv")            # no nvidia-smi
    sm120 = sandbox_factory.host(sglang="0.5.9", layout="source", gpu_capability="12.0")
    gpu_spec = _playbook(tmp_path, "vl-on-sm120", "kimi-vl-eagle3", {"gpu_capability": ["12.0"]})
    newer = _playbook(tmp_path, "k25-from-0510", "kimi-k25-eagle3", {"sglang": ">=0.5.10"})
    before = model_file(plain, KIMI_VL).read_bytes()
    log, log_sm120 = sshd_log(plain), sshd_log(sm120)

    proc, doc = run_json("patch", *ssh_env.cli_args, "--host", plain.name, "--host", sm120.name,
                         "--playbook", gpu_spec, "--playbook", newer)
    assert proc.returncode == 0, proc.stdout
    got = rows(doc)
    na = got[(plain.name, "vl-on-sm120")]
    assert na["verdict"] == "not-applicable"
    assert "GPU compute capability unknown (no nvidia-smi on the host)" in na["detail"]
    assert "--gpu-capability" in na["detail"]
    assert got[(sm120.name, "vl-on-sm120")]["verdict"] == "patched"       # the stand-in nvidia-smi says 12.0
    for h in (plain, sm120):
        r = got[(h.name, "k25-from-0510")]
        assert r["verdict"] == "not-applicable" and "SGLang 0.5.9 is outside >=0.5.10" in r["detail"]
    assert model_file(plain, KIMI_VL).read_bytes() == before
    # The facts first, then the patch: one connection, two remote commands (none when nothing applies).
    assert log.counts() == (1, 1), "nothing applied on this host: the facts call only"
    assert log_sm120.counts() == (1, 2), "the facts call, then one patch call, on one connection"

    log.mark()
    proc, doc = run_json("patch", *ssh_env.cli_args, "--host", plain.name, "--playbook", gpu_spec,
                         "--gpu-capability", "12.0")
    assert proc.returncode == 0, proc.stdout
    assert doc["hosts"][0]["verdict"] == "patched"
    assert log.counts() == (1, 1), "a stated capability needs no facts call"

    # status: one call, applicability decided from its answer; not-applicable is a wanted state
    log.mark()
    proc, doc = run_json("status", *ssh_env.cli_args, "--host", plain.name, "--playbook", gpu_spec, "--playbook", newer)
    assert proc.returncode == 0, proc.stdout
    assert [h["verdict"] for h in doc["hosts"]] == ["not-applicable", "not-applicable"]
    assert log.counts() == (1, 1)

    # the inventory's gpu_capability says what nvidia-smi cannot
    inv = inventory(ssh_env, tmp_path, [plain], **{plain.name: {"gpu_capability": "12.0", "specs": [gpu_spec]}})
    proc, doc = run_json("status", "-i", inv)
    assert [h["verdict"] for h in doc["hosts"]] == ["patched"], proc.stdout

    # a host whose GPUs are another architecture
    proc, doc = run_json("reconcile", *ssh_env.cli_args, "--host", sm120.name, "--playbook", gpu_spec,
                         "--gpu-capability", "9.0")
    assert proc.returncode == 0, proc.stdout
    assert doc["hosts"][0]["verdict"] == "not-applicable"
    assert "9.0 (--gpu-capability) is not 12.0" in doc["hosts"][0]["detail"]


def test_launch_requires_every_applicable_spec(sandbox_factory, ssh_env, tmp_path):
    from provision.config.playbook import PACKAGE_PLAYBOOKS

    host = sandbox_factory.host(sglang="0.5.9", layout="source")
    gpu_only = _playbook(tmp_path, "vl-on-sm120", "kimi-vl-eagle3", {"gpu_capability": ["12.0"]})
    prof = yaml.safe_load((PACKAGE_PLAYBOOKS / "kimi-k25-eagle3.yaml").read_text())
    prof["name"] = "k25-plus-vl"
    del prof["patch"]
    prof["launch"]["requires"] = ["kimi-k25-eagle3", "kimi-vl-eagle3", gpu_only]
    (tmp_path / "k25-plus-vl.yaml").write_text(yaml.safe_dump(prof))
    inv = inventory(ssh_env, tmp_path, [host], **{host.name: {"profile": str(tmp_path / "k25-plus-vl.yaml")}})

    proc = run("launch", "-i", inv, "--poll", "0.5")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "refused" in proc.stdout
    assert "KimiK25ForConditionalGeneration lacks" in proc.stdout and "KimiVLForConditionalGeneration lacks" \
        in proc.stdout, proc.stdout
    assert "requires vl-on-sm120: not applicable (GPU compute capability unknown" in proc.stdout + proc.stderr

    try:
        proc = run("launch", "-i", inv, "--patch", "--poll", "0.5")
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        out = proc.stdout + proc.stderr
        assert "patch: patched (kimi-k25-eagle3)" in out and "patch: patched (kimi-vl-eagle3)" in out, out
        assert "ready" in proc.stdout
    finally:
        run("stop", "-i", inv)

    bad = dict(prof, name="bad-requires")
    bad["launch"] = dict(prof["launch"], requires=["no-such-spec"])
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    proc = run("launch", *ssh_env.cli_args, "--host", host.name, "--playbook", str(tmp_path / "bad.yaml"))
    assert proc.returncode == 2 and "launch.requires: no-such-spec" in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- the SM120 host of issue 11

SM120 = ["kimi-k25-eagle3", "sm120-torch-symm-mem", "sm120-flashinfer-allreduce-fusion"]
SYMM = "srt/distributed/device_communicators/all_reduce_utils.py"


def sm120_files(host) -> dict:
    return {"kimi-k25-eagle3": model_file(host, KIMI), "sm120-torch-symm-mem": model_file(host, SYMM),
            "sm120-flashinfer-allreduce-fusion": host.hostpath(f"{host.site_packages}/flashinfer/jit/comm.py")}


def test_sm120_host_gets_all_three_fixes_in_one_patch(sandbox_factory, ssh_env, tmp_path, sshd_log):
    """A 0.5.9 venv host with flashinfer 0.6.3 beside it and SM120 GPUs (the stand-in nvidia-smi)."""
    host = sandbox_factory.host(sglang="0.5.9", layout="venv", flashinfer="0.6.3", gpu_capability="12.0")
    files = sm120_files(host)
    pristine = {s: p.read_bytes() for s, p in files.items()}
    inv = inventory(ssh_env, tmp_path, [host], **{host.name: {"specs": SM120}})
    log = sshd_log(host)

    proc, doc = run_json("patch", "-i", inv)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert [(h["data"]["spec"], h["verdict"]) for h in doc["hosts"]] == [(s, "patched") for s in SM120]
    # one connection: the facts call (the specs' applies: needs the GPU), then one patch call for all three
    assert log.counts() == (1, 2)
    for s, p in files.items():
        assert p.read_bytes() != pristine[s], s
    patched = {s: p.read_bytes() for s, p in files.items()}
    assert b"supported_major_versions=[9, 10, 12]" in patched["sm120-flashinfer-allreduce-fusion"]

    log.mark()
    proc, doc = run_json("patch", "-i", inv)
    assert proc.returncode == 0
    assert [h["verdict"] for h in doc["hosts"]] == ["unchanged"] * 3
    assert log.counts() == (1, 2)
    assert {s: p.read_bytes() for s, p in files.items()} == patched, "a second run writes nothing"

    proc, doc = run_json("status", "-i", inv)
    assert proc.returncode == 0 and [h["verdict"] for h in doc["hosts"]] == ["patched"] * 3, proc.stdout

    # an unchanged reconcile: one call, the SM120 specs' applies: left undecided (our edits are intact)
    log.mark()
    proc, doc = run_json("reconcile", "-i", inv)
    assert proc.returncode == 0 and [h["verdict"] for h in doc["hosts"]] == ["unchanged"] * 3, proc.stdout
    assert [h["data"]["path"] for h in doc["hosts"]] == ["fast"] * 3
    assert log.counts() == (1, 1)

    # the launch profile that needs all three: preflight passes, the stand-in takes the two flags
    prof = yaml.safe_load(open(inv).read())
    prof["hosts"][host.name]["profile"] = "kimi-k25-eagle3-sm120"
    with open(inv, "w") as fh:
        yaml.safe_dump(prof, fh)
    try:
        proc = run("launch", "-i", inv, "--poll", "0.5")
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        assert "ready" in proc.stdout
        argv = ssh_env.ssh(host, "cat /proc/$(cat /var/lib/provision/server/server-30000.pid)/cmdline | tr '\\0' ' '"
                           ).stdout
        assert "--enable-flashinfer-allreduce-fusion" in argv and "--enable-torch-symm-mem" in argv, argv
    finally:
        run("stop", "-i", inv)

    # an upgrade (the pristine wheels reinstalled): reconcile puts all three back
    host.reset_sglang()
    assert {s: p.read_bytes() for s, p in files.items()} == pristine
    proc = run("launch", "-i", inv, "--poll", "0.5")
    assert proc.returncode == 3 and "refused" in proc.stdout, proc.stdout
    for what in ("KimiK25ForConditionalGeneration lacks", "spec sm120-torch-symm-mem is not in place",
                 "spec sm120-flashinfer-allreduce-fusion is not in place"):
        assert what in proc.stdout, (what, proc.stdout)
    log.mark()
    proc, doc = run_json("reconcile", "-i", inv)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert [(h["data"]["spec"], h["verdict"]) for h in doc["hosts"]] == [(s, "patched") for s in SM120]
    assert log.counts() == (1, 2), "the SM120 specs were decided from the first call's facts, patched in a second"
    assert {s: p.read_bytes() for s, p in files.items()} == patched

    # without the GPU fact (no nvidia-smi would say the same as another architecture) the SM120 specs stand aside
    proc, doc = run_json("status", "-i", inv, "--gpu-capability", "9.0")
    assert proc.returncode == 0
    assert [h["verdict"] for h in doc["hosts"]] == ["patched", "not-applicable", "not-applicable"]


def test_0523_delegation_native_while_symm_mem_applies(sandbox_factory, ssh_env, tmp_path):
    host = sandbox_factory.host(sglang="0.5.23", layout="venv", gpu_capability="12.0")
    specs = SM120[:2]
    inv = inventory(ssh_env, tmp_path, [host], **{host.name: {"specs": specs}})
    kimi_before = model_file(host, KIMI).read_bytes()
    proc, doc = run_json("patch", "-i", inv)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert [(h["data"]["spec"], h["verdict"], h["version"]) for h in doc["hosts"]] == \
        [("kimi-k25-eagle3", "native", "0.5.23"), ("sm120-torch-symm-mem", "patched", "0.5.23")]
    assert model_file(host, KIMI).read_bytes() == kimi_before
    proc, doc = run_json("patch", "-i", inv)
    assert [h["verdict"] for h in doc["hosts"]] == ["native", "unchanged"]
