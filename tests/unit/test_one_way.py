"""One way to do each thing on the host (issue 43 item 6): nvidia-smi is found and run by one
module, the server's interpreter is decided by one rule, the secrets file has one renderer."""

from __future__ import annotations

import re
from pathlib import Path

from provision.host.facts import installs
from provision.host.ops import server_secrets

HOST = Path(installs.__file__).resolve().parents[1]


def sources() -> dict:
    return {str(p.relative_to(HOST)): p.read_text() for p in HOST.rglob("*.py")}


def test_only_facts_nvidia_smi_finds_and_runs_nvidia_smi():
    runs = sorted(name for name, text in sources().items()
                  if re.search(r"""(trusted_binary|which)\(\s*["']nvidia-smi["']""", text))
    assert runs == ["facts/nvidia_smi.py"], runs
    for reader in ("facts/gpu.py", "facts/gpu_name.py", "facts/gpu_use.py"):
        text = sources()[reader]
        assert "nvidia_smi.run(" in text and "subprocess" not in text, reader


def test_the_servers_interpreter_is_the_profiles_else_the_owners_with_the_owners_env():
    checkout = {"interpreters": [], "kind": "checkout", "pythonpath": "/src/sglang/python", "path": "/src/sglang/python/sglang"}
    owner, env = installs.owner_python(checkout)
    assert installs.server_python(checkout, {}) == (owner, env) and env == {"PYTHONPATH": "/src/sglang/python"}
    assert installs.server_python(checkout, {"python": "/opt/wrap/bin/python3"}) == ("/opt/wrap/bin/python3", env)
    venv = {"interpreters": ["/opt/venv/bin/python3"], "kind": "site-packages", "pythonpath": "/opt/venv/lib",
            "path": "/opt/venv/lib/python3.11/site-packages/sglang"}
    assert installs.server_python(venv, {}) == ("/opt/venv/bin/python3", {})
    server = sources()["ops/server.py"]
    assert "owner_python" not in server, "ops/server.py decides the server's interpreter through server_python"


def test_the_secrets_config_file_has_one_renderer():
    renders = sorted(name for name, text in sources().items() if "json.dumps(str(v))" in text)
    assert renders == ["ops/server_secrets.py"], renders
    assert "server_secrets.render_config(" in sources()["ops/backends/container.py"]
    text = server_secrets.render_config({"api-key": 'k"1', "admin-api-key": "a"})
    assert server_secrets.parse_config(text) == {"api-key": 'k"1', "admin-api-key": "a"}


def test_a_wheel_another_worker_unpacked_first_is_used_not_an_error(tmp_path, monkeypatch):
    """A cold cache and the suite in parallel: two workers unpack the same wheel; the one that
    renames second finds the other's complete copy (CI failed on `Directory not empty`)."""
    import os
    import zipfile

    from provision.sandbox import wheels

    monkeypatch.setenv("PROVISION_WHEEL_CACHE", str(tmp_path))
    with zipfile.ZipFile(tmp_path / "sglang-9.9.9-py3-none-any.whl", "w") as zf:
        zf.writestr("sglang/__init__.py", "")
    real_replace = os.replace

    def other_worker_first(src, dst):
        os.makedirs(os.path.join(dst, "sglang"))
        with open(os.path.join(dst, ".complete"), "w") as fh:
            fh.write("9.9.9")
        monkeypatch.setattr(os, "replace", real_replace)
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", other_worker_first)
    dest = wheels.extracted("9.9.9")
    assert (dest / ".complete").exists() and not list(tmp_path.glob(".unpacking-*"))
