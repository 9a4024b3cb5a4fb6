"""The container sandbox: SGLang images laid out as the official ones, run by podman on a
namespace sandbox host reached over SSH, without touching this machine's /etc/containers."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

PROBE = ("import importlib.metadata as m, importlib.util as u, json; d = m.distribution('sglang'); "
         "print(json.dumps({'pkg': u.find_spec('sglang').submodule_search_locations[0], 'version': d.version, "
         "'direct_url': json.loads(d.read_text('direct_url.json'))}))")


def _etc_fingerprint() -> dict:
    out = {}
    for top, _, files in os.walk("/etc/containers"):
        for f in files:
            p = Path(top) / f
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "special"
    return out


@pytest.mark.parametrize("version", ["0.5.9", "0.5.10"])
def test_podman_host_runs_the_sglang_image_over_ssh(podman_host, sglang_images, ssh_env, version):
    before = _etc_fingerprint()
    image = sglang_images[version]
    # SGLang as the official images have it: an editable install of /sgl-workspace/sglang/python.
    out = ssh_env.ssh(podman_host, f"podman run --rm --network host {image} python3 -c \"{PROBE}\"", timeout=120)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["pkg"] == "/sgl-workspace/sglang/python/sglang"
    assert got["version"] == version
    assert got["direct_url"] == {"dir_info": {"editable": True}, "url": "file:///sgl-workspace/sglang/python"}
    # `python3 -m sglang.launch_server` is the stand-in, with the release's own flags.
    out = ssh_env.ssh(podman_host, f"podman run --rm --network host {image} python3 -m sglang.launch_server --help",
                      timeout=120)
    assert "--speculative-draft-model-path" in out.stdout
    # The host's podman is set up in the host only: this machine's /etc/containers is as it was.
    assert _etc_fingerprint() == before
    assert not Path("/etc/containers/storage.conf").exists() or "provision sandbox" not in \
        Path("/etc/containers/storage.conf").read_text()


def _machine_cmdlines() -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return out


def test_podman_host_reset_removes_its_containers(podman_host, sglang_images, ssh_env):
    image = sglang_images["0.5.9"]
    marker = f"sleep 600.{os.getpid()}"  # a container's process lives in its own PID namespace
    ssh_env.ssh(podman_host, f"podman run -d --name idle --network host {image} {marker}", timeout=120)
    assert "idle" in ssh_env.ssh(podman_host, "podman ps --format '{{.Names}}'").stdout.split()
    assert any(c.strip() == marker for c in _machine_cmdlines())
    podman_host.reset()
    assert ssh_env.ssh(podman_host, "podman ps -a --format '{{.Names}}'").stdout.split() == []
    assert not any(c.strip() == marker for c in _machine_cmdlines())  # nothing of it is left running


def test_sglang_image_is_cached_by_content():
    from provision.sandbox import images, sglang_image

    if images.problems():
        pytest.skip("container images unavailable: " + "; ".join(images.problems()))
    tag, _ = sglang_image.ensure_sglang_image("0.5.9")
    again, seconds = sglang_image.ensure_sglang_image("0.5.9")
    assert (again, seconds) == (tag, 0.0)
    assert sglang_image.podman_in_store("image", "inspect", "-f", "{{.Id}}", sglang_image.alias("0.5.9")).stdout \
        == sglang_image.podman_in_store("image", "inspect", "-f", "{{.Id}}", tag).stdout
