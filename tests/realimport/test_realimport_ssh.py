"""`provision patch` over SSH into a sandbox host whose SGLang is a venv of the real release, then
Python on that host imports what provision left.

The host has its own mount namespace: the cached venv's site-packages is bind-mounted read-only
into it (HostSpec.ro_binds), and the host's own venv (a private copy of `sglang` in its
site-packages, a .pth adding the bound site-packages behind it) is written into the host's /opt or
/data. So a patch writes only into the host's copy, and the host's interpreter imports that copy.
"""

from __future__ import annotations

import shutil

import pytest

from provision.sandbox import realimport_venv as rv
from provision.sandbox.hosts import HostSpec
from tests.cli.helpers import KIMI, run, run_json
from tests.realimport.conftest import KIMI_MODULE, METHODS, python_sees

pytestmark = [pytest.mark.realimport, pytest.mark.ssh]

BASE_SITE_IN_HOST = "/opt/realimport-site"  # the cached venv's site-packages, read-only
ENV_IN_HOST = "/opt/sglang-env"             # the host's venv: discovery finds /opt/*/bin/python3
HIDDEN_ENV_IN_HOST = "/data/envs/kimi"      # a venv no discovery glob finds: only --sglang-path names it
BOUND = {m: True for m in METHODS}
ABSENT = {m: False for m in METHODS}
ALL_OK = {m: "ok" for m in METHODS}


@pytest.fixture(scope="module")
def import_host(sandbox_factory, base_059):
    spec = HostSpec("realimport", "auto", None, "none", sandbox_factory.port,
                    ro_binds=((BASE_SITE_IN_HOST, str(rv.site_packages(base_059))),))
    (host,) = sandbox_factory.up(spec)
    try:
        yield host
    finally:
        sandbox_factory.remove(host)


@pytest.fixture
def host_venv(import_host, base_059, make_venv):
    made = []

    def make(in_host: str):
        venv = make_venv(base_059, import_host.hostpath(in_host), BASE_SITE_IN_HOST)
        made.append(venv.root)
        in_site = in_host + "/" + str(venv.site.relative_to(venv.root))
        return venv, in_site
    yield make
    for root in made:
        shutil.rmtree(root, ignore_errors=True)


def sees_on(host, python: str, **kw) -> dict:
    return python_sees(python, run=lambda argv, env: host.run(argv, env=env, timeout=600), **kw)


def notes(doc) -> str:
    return "\n".join(doc["hosts"][0]["notes"])


def test_patch_over_ssh_then_the_hosts_python_binds_the_methods(import_host, host_venv, ssh_env):
    host = import_host
    venv, in_site = host_venv(ENV_IN_HOST)
    original = venv.file(KIMI).read_bytes()
    python = f"{ENV_IN_HOST}/bin/python"
    assert sees_on(host, python)["class"]["hasattr"] == ABSENT

    proc, doc = run_json("patch", *ssh_env.cli_args, "--host", host.name, "--verify-import")
    assert proc.returncode == 0, proc.stderr
    rec = doc["hosts"][0]
    assert rec["verdict"] == "patched" and rec["install"] == f"{in_site}/sglang", rec
    assert "verify-import: ok" in notes(doc), notes(doc)
    seen = sees_on(host, python, registry=True)
    assert seen["file"] == f"{in_site}/sglang/{KIMI}", "the host's own copy is what Python imports"
    assert seen["module_functions"] == []
    assert seen["class"]["in_class_dict"] == BOUND and seen["class"]["delegates"] == ALL_OK, seen
    reg = seen["registry"]
    assert reg["same_as_module_class"] and reg["module"] == KIMI_MODULE and reg["delegates"] == ALL_OK, reg

    run("unpatch", *ssh_env.cli_args, "--host", host.name, check_rc=0)
    assert venv.file(KIMI).read_bytes() == original
    back = sees_on(host, python)
    assert back["class"]["in_class_dict"] == ABSENT and back["class"]["hasattr"] == ABSENT


def test_verify_import_over_ssh_runs_the_pinned_venvs_interpreter(import_host, host_venv, ssh_env):
    """--sglang-path into a venv no discovery glob finds: the host's python3 on PATH (no torch, no
    .pth files of that venv) must not be the one asked; the venv's own interpreter is."""
    host = import_host
    _venv, in_site = host_venv(HIDDEN_ENV_IN_HOST)
    proc, doc = run_json("patch", *ssh_env.cli_args, "--host", host.name, "--sglang-path", f"{in_site}/sglang",
                         "--verify-import")
    assert proc.returncode == 0, proc.stderr
    assert doc["hosts"][0]["verdict"] == "patched"
    assert "verify-import: ok (imported; every method is callable on the class)" in notes(doc), notes(doc)
