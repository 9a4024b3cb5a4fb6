"""One policy for binaries the host side runs as root (over real sshd).

On a host, an unprivileged user ("nobody", uid 65534) owns the first directory of PATH
(/usr/local/sbin, bind-mounted from /home/alice/bin inside the host's own mount namespace)
and has put there an `nvidia-smi`, a `podman` and a `docker` that write a marker when run
as root. `launch`'s preflight (which asks nvidia-smi for the GPUs) and a container launch's
preflight (which asks the runtime for the image) must run none of them, and say why.
"""

from __future__ import annotations

import json
import pwd

import pytest

from tests.cli.helpers import run_json

UID = 65534
USER = pwd.getpwuid(UID).pw_name
MARKER = "/home/alice/MARKER-bin"
SHIMS = ("nvidia-smi", "podman", "docker")
SPEC = {"file": "srt/models/kimi_k25.py", "class": "KimiK25ForConditionalGeneration", "delegate": "language_model",
        "methods": [{"name": "set_eagle3_layers_to_capture", "params": "self, layer_ids=None"},
                    {"name": "get_embed_and_head", "params": "self"},
                    {"name": "set_embed_and_head", "params": "self, embed, head"}]}

SETUP = f"""
set -e
mkdir -p /home/alice/bin
for b in {' '.join(SHIMS)}; do
  printf '#!/bin/sh\\n[ "$(id -u)" = 0 ] && echo "$0 $*" >> {MARKER}\\nexit 1\\n' > /home/alice/bin/$b
  chmod 755 /home/alice/bin/$b
done
chown -R {UID}:{UID} /home/alice
chmod 755 /home/alice
mount --bind /home/alice/bin /usr/local/sbin
"""


@pytest.fixture(scope="module")
def host(sandbox_factory):
    h = sandbox_factory.host(name="trust-bin", sglang="0.5.9", layout="venv")
    try:
        done = h.run(SETUP, check=False)
        assert done.returncode == 0, done.stderr
        # the host's root really would run them: they are first on root's PATH there
        assert h.run("command -v nvidia-smi podman").stdout.split() == ["/usr/local/sbin/nvidia-smi",
                                                                        "/usr/local/sbin/podman"]
        yield h
    finally:
        sandbox_factory.remove(h)


def marker(h) -> str:
    p = h.hostpath(MARKER)
    return p.read_text() if p.exists() else ""


def inventory(tmp_path, ssh_env, h) -> str:
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts)},
           "hosts": {h.name: {"address": h.address, "port": h.port}}}
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inv))
    return str(path)


def test_launch_preflight_never_runs_an_untrusted_nvidia_smi(host, ssh_env, tmp_path):
    # the file is not patched: preflight fails (exit 3) after all its checks, GPUs included
    proc, doc = run_json("launch", "-i", inventory(tmp_path, ssh_env, host), "--deadline", "30")
    assert marker(host) == "", "nvidia-smi of another user was run as root"
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    text = json.dumps(doc)
    assert f"/usr/local/sbin/nvidia-smi not run: owned by {USER}" in text, text[:3000]


@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_a_container_launch_never_runs_an_untrusted_runtime(host, ssh_env, tmp_path, runtime):
    play = {"name": "in-a-container", "patch": SPEC,
            "launch": {"container": {"runtime": runtime, "image": "localhost/none:1", "network": "host"},
                       "args": {"model-path": "/data/models/Kimi-K2.5", "port": 30000}}}
    play_path = tmp_path / "play.yaml"
    play_path.write_text(json.dumps(play))
    proc, doc = run_json("launch", "-i", inventory(tmp_path, ssh_env, host), "--playbook", str(play_path),
                         "--deadline", "30")
    assert marker(host) == "", f"{runtime} of another user was run as root"
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    detail = doc["hosts"][0]["detail"]
    assert f"/usr/local/sbin/{runtime} not run: owned by {USER}" in detail, detail
