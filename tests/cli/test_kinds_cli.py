"""The two SM120 specs over real sshd: a 0.5.9 venv host with flashinfer-python 0.6.3 beside
SGLang (both from their released wheels), patched, patched again, unpatched, as a user runs it."""

from __future__ import annotations

import ast
import re

import pytest

from tests.cli.helpers import run, run_json

SYMM = "srt/distributed/device_communicators/all_reduce_utils.py"


@pytest.fixture(scope="module")
def sm120_host(sandbox_factory):
    # gpu_capability: a stand-in nvidia-smi saying 12.0, so the specs' `applies:` holds
    host = sandbox_factory.host("sm120", sglang="0.5.9", layout="venv", flashinfer="0.6.3", gpu_capability="12.0")
    yield host
    sandbox_factory.remove(host)


def files(host):
    return {"symm": host.hostpath(f"{host.sglang_dir}/{SYMM}"),
            "comm": host.hostpath(f"{host.site_packages}/flashinfer/jit/comm.py")}


@pytest.mark.parametrize("spec, key", [("sm120-torch-symm-mem", "symm"), ("sm120-flashinfer-allreduce-fusion", "comm")])
def test_patch_again_unpatch_over_sshd(sm120_host, ssh_env, spec, key):
    host = sm120_host
    host.reset()
    path = files(host)[key]
    other = files(host)["comm" if key == "symm" else "symm"]
    before, other_before = path.read_bytes(), other.read_bytes()

    proc, doc = run_json("patch", *ssh_env.cli_args, "--host", host.name, "--playbook", spec)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    rec = doc["hosts"][0]
    assert rec["verdict"] == "patched", rec
    assert rec["file"] == (f"{host.sglang_dir}/{SYMM}" if key == "symm"
                           else f"{host.site_packages}/flashinfer/jit/comm.py")
    after = path.read_bytes()
    assert after != before and other.read_bytes() == other_before
    if key == "symm":
        text = after.decode()
        node = next(st.value for st in ast.parse(text).body if isinstance(st, ast.Assign)
                    and getattr(st.targets[0], "id", "") == "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES")
        sizes = ast.literal_eval(re.sub(r"\s*\*\s*MiB", "", ast.get_source_segment(text, node)))
        assert sizes[12] == sizes[10] and rec["data"]["package"]["name"] == "sglang"
    else:
        assert b"        supported_major_versions=[9, 10, 12]\n" in after
        pkg = rec["data"]["package"]
        assert pkg["name"] == "flashinfer" and pkg["version"] == "0.6.3"
        assert pkg["dir"] == f"{host.site_packages}/flashinfer"
        assert any("file in package flashinfer 0.6.3" in n for n in rec["notes"])

    proc2, doc2 = run_json("patch", *ssh_env.cli_args, "--host", host.name, "--playbook", spec)
    assert proc2.returncode == 0 and doc2["hosts"][0]["verdict"] == "unchanged", doc2
    assert path.read_bytes() == after

    proc3, doc3 = run_json("status", *ssh_env.cli_args, "--host", host.name, "--playbook", spec)
    assert doc3["hosts"][0]["data"]["patch"] == "patched", doc3

    proc4 = run("unpatch", *ssh_env.cli_args, "--host", host.name, "--playbook", spec, check_rc=0)
    assert "unpatched" in proc4.stdout
    assert path.read_bytes() == before


def test_a_host_without_flashinfer_is_told_so(sandbox_factory, ssh_env):
    host = sandbox_factory.host("nofi", sglang="0.5.9", layout="venv", gpu_capability="12.0")
    try:
        proc = run("patch", *ssh_env.cli_args, "--host", host.name, "--playbook", "sm120-flashinfer-allreduce-fusion")
        assert proc.returncode == 3, (proc.stdout, proc.stderr)
        assert "package flashinfer is not installed for /opt/venv/bin/python" in proc.stdout + proc.stderr
    finally:
        sandbox_factory.remove(host)


def test_reconcile_puts_the_flashinfer_fix_back_after_a_reinstall(sm120_host, ssh_env):
    host = sm120_host
    host.reset()
    spec = "sm120-flashinfer-allreduce-fusion"
    comm = files(host)["comm"]
    pristine = comm.read_bytes()
    run("patch", *ssh_env.cli_args, "--host", host.name, "--playbook", spec, check_rc=0)
    patched = comm.read_bytes()
    proc, doc = run_json("reconcile", *ssh_env.cli_args, "--host", host.name, "--playbook", spec)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "unchanged", doc
    host.reset_sglang()  # pip reinstalls the released wheels: our edit is gone
    assert comm.read_bytes() == pristine
    proc, doc = run_json("reconcile", *ssh_env.cli_args, "--host", host.name, "--playbook", spec)
    rec = doc["hosts"][0]
    assert proc.returncode == 0 and rec["verdict"] == "patched" and rec["data"]["state"] == "wiped", rec
    assert "the file is the release's own again (flashinfer reinstalled); re-patched" in rec["detail"]
    assert comm.read_bytes() == patched


def test_the_latest_release_still_needs_the_symm_mem_entry(sandbox_factory, ssh_env):
    host = sandbox_factory.host("sm120new", sglang="0.5.23", layout="venv", gpu_capability="12.0")
    try:
        path = host.hostpath(f"{host.sglang_dir}/{SYMM}")
        before = path.read_bytes()
        proc, doc = run_json("patch", *ssh_env.cli_args, "--host", host.name, "--playbook", "sm120-torch-symm-mem")
        assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "patched", doc
        assert doc["hosts"][0]["version"] == "0.5.23"
        assert b"    12: {\n" in path.read_bytes()
        run("unpatch", *ssh_env.cli_args, "--host", host.name, "--playbook", "sm120-torch-symm-mem", check_rc=0)
        assert path.read_bytes() == before
    finally:
        sandbox_factory.remove(host)
