"""`patch|unpatch|audit|status --container NAME`: the host-side step run inside a running container
on a sandbox host (podman over SSH), with the same engine, safe write, backup and journal; and
discovery naming the SGLang containers beside the host's installs."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from provision.sandbox.hosts import SYSTEM_PYTHON
from tests.cli.helpers import KIMI, KIMI_CLASS, METHODS, class_methods, module_level_functions, run, run_json
from tests.remote.test_privilege import PASSWORD, ProcWatch, users  # noqa: F401 - users is a fixture

SGLANG_DIR = "/sgl-workspace/sglang/python/sglang"
FILE = f"{SGLANG_DIR}/{KIMI}"
NAME = "sglang-30000"

pytestmark = pytest.mark.ssh


def _start(ssh_env, host, image, name=NAME, command="sleep 3600"):
    ssh_env.ssh(host, f"podman run -d --name {name} --network host {image} {command}", timeout=180)


def _file(ssh_env, host, name=NAME) -> bytes:
    return ssh_env.ssh(host, f"podman exec {name} cat {FILE}").stdout.encode()


def test_patch_container_then_restart_still_has_the_methods(podman_host, sglang_images, ssh_env):
    host = podman_host
    _start(ssh_env, host, sglang_images["0.5.9"])
    original = _file(ssh_env, host)
    args = [*ssh_env.cli_args, "--host", host.name, "--container", NAME]

    proc, doc = run_json("patch", *args)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    (rec,) = doc["hosts"]
    assert rec["host"] == f"{host.name}/{NAME}" and rec["verdict"] == "patched", rec
    assert rec["version"] == "0.5.9" and rec["file"] == FILE and rec["added"] == METHODS
    assert rec["data"]["transport"] == "container" and rec["data"]["install_kind"] == "editable"
    after = _file(ssh_env, host)
    assert class_methods(after, KIMI_CLASS)[-3:] == METHODS
    assert not set(METHODS) & set(module_level_functions(after))
    # the backup is in the container's own state dir; the host's has none
    backups = ssh_env.ssh(host, f"podman exec {NAME} sh -c 'cat /var/lib/provision/backups/*.bak'", check=False)
    assert original.decode() in backups.stdout
    assert not host.hostpath("/var/lib/provision/backups").exists()
    # the journal on the control machine names HOST/NAME
    last = json.loads(run("history", "--json", check_rc=0).stdout.splitlines()[-1])
    assert (last["host"], last["command"], last["verdict"]) == (f"{host.name}/{NAME}", "patch", "patched")

    # a second run is a no-op
    proc, doc = run_json("patch", *args)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "unchanged"

    # `podman restart`: the writable layer stays, so do the methods
    ssh_env.ssh(host, f"podman restart -t 0 {NAME}", timeout=120)
    assert class_methods(_file(ssh_env, host), KIMI_CLASS)[-3:] == METHODS
    proc, doc = run_json("status", *args)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "patched", (proc.stdout, proc.stderr)

    # audit reads the container's SGLang; unpatch gives its original bytes back
    proc, doc = run_json("audit", *args)
    assert proc.returncode == 6, proc.stderr  # 0.5.9 has fixable wrappers no shipped spec covers
    gaps = {g["class"]: g for g in doc["hosts"][0]["data"]["gaps"]}
    assert (gaps[KIMI_CLASS]["verdict"], gaps[KIMI_CLASS]["patch_state"]) == ("closed", "patched"), gaps[KIMI_CLASS]
    run("unpatch", *args, check_rc=0)
    assert _file(ssh_env, host) == original


def test_a_native_image_is_left_alone(podman_host, sglang_images, ssh_env):
    _start(ssh_env, podman_host, sglang_images["0.5.10"])
    before = _file(ssh_env, podman_host)
    proc, doc = run_json("patch", *ssh_env.cli_args, "--host", podman_host.name, "--container", NAME)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "native", doc["hosts"][0]
    assert _file(ssh_env, podman_host) == before


def test_what_cannot_be_reached_is_one_sentence(podman_host, sglang_images, ssh_env):
    host = podman_host
    base = [*ssh_env.cli_args, "--host", host.name]
    # no docker here: either no docker CLI at all, or (as on this machine) a CLI without its daemon
    docker = "docker is not installed on this host" if not shutil.which("docker") else \
        "the docker daemon is not running on this host"
    cases = [(["--container", "nosuch"], "no container named nosuch on this host"),
             (["--container", NAME, "--runtime", "docker"], docker)]
    _start(ssh_env, host, sglang_images["0.5.9"])
    ssh_env.ssh(host, f"podman stop -t 0 {NAME}", timeout=120)
    cases.append((["--container", NAME], f"container {NAME} is not running; start it (`podman start {NAME}`)"))
    for extra, words in cases:
        proc = run("patch", *base, *extra)
        assert proc.returncode == 3, (extra, proc.stdout, proc.stderr)
        lines = proc.stdout.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "failed" in lines[0], (extra, proc.stdout)


def test_status_names_the_sglang_containers_beside_the_host_installs(podman_host, sglang_images, ssh_env):
    host = podman_host
    image = sglang_images["0.5.9"]
    _start(ssh_env, host, image, command="python3 -m sglang.launch_server --model-path /tmp --port 30000")
    _start(ssh_env, host, image, name="idle")  # not an SGLang server: not named
    proc, doc = run_json("status", *ssh_env.cli_args, "--host", host.name)
    (rec,) = doc["hosts"]
    assert [(c["name"], c["runtime"], c["port"]) for c in rec["data"]["containers"]] == [(NAME, "podman", 30000)], rec
    assert rec["data"]["containers"][0]["image"].startswith("localhost/provision-sglang")
    proc = run("status", *ssh_env.cli_args, "--host", host.name)
    assert f"container {NAME} (podman, image " in proc.stdout
    assert f"`provision status --container {NAME}` looks inside" in proc.stdout
    # the container's server is not taken for one of the host's (the host has no SGLang of its own)
    assert rec["verdict"] == "error" and "no SGLang install found" in rec["detail"]


def test_a_sudo_user_reaches_the_container_with_sudo_around_the_runtime(podman_host, sglang_images, ssh_env, users,
                                                                        tmp_path):
    # sudo with a password (sent only on sudo's prompt) goes around `podman exec`, never into the
    # container and never onto a command line
    host = podman_host
    user = users["pw"]
    host.run(f"mkdir -p /home/{user}/.ssh && cp /root/.ssh/authorized_keys /home/{user}/.ssh/ && "
             f"chown -R {user}: /home/{user} && chmod 700 /home/{user}/.ssh")
    _start(ssh_env, host, sglang_images["0.5.9"])
    pwfile = tmp_path / "sudo.txt"
    pwfile.write_text(PASSWORD + "\n")
    pwfile.chmod(0o600)
    with ProcWatch(host, PASSWORD) as watch:
        proc, doc = run_json("patch", *ssh_env.cli_args, "--host", host.name, "--user", user,
                             "--sudo-password-file", pwfile, "--container", NAME)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert doc["hosts"][0]["verdict"] == "patched"
    assert class_methods(_file(ssh_env, host), KIMI_CLASS)[-3:] == METHODS
    assert watch.saw(b"sudo\x00-S\x00-p") and watch.saw(b"podman\x00exec\x00-i\x00-w\x00/\x00" + NAME.encode())
    assert not watch.leaks, watch.leaks


# What `provision patch --local --container` imports beyond the standard library (pure Python).
INSIDE_PACKAGES = ("provision", "click", "yaml", "tenacity", "packaging", "typeguard", "typing_extensions")


def _provision_inside(host) -> str:
    """How to run this provision inside the sandbox host, as on a machine of its own: Debian's
    python3 with a copy of this tree and its pure-Python dependencies in the host's own /opt,
    wherever they are installed here (a per-host directory such as /root is not visible there)."""
    import importlib

    site = "/opt/provision-under-test"
    dest = host.hostpath(site)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in INSIDE_PACKAGES:
        where = Path(importlib.import_module(name).__file__)
        if where.name == "__init__.py":
            shutil.copytree(where.parent, dest / name, ignore=skip)
        else:  # a one-file module (typing_extensions)
            shutil.copyfile(where, dest / where.name)
    repo = Path(__file__).resolve().parents[2]
    if not (dest / "provision" / "playbooks").is_dir():  # a checkout: installed, they are package data
        shutil.copytree(repo / "playbooks", dest / "provision" / "playbooks", ignore=skip)
    return f"PYTHONPATH={site} {SYSTEM_PYTHON} -m provision"


def test_local_container_on_the_machine_that_runs_it(podman_host, sglang_images, ssh_env):
    # --local --container: the container transport chained onto the local one, on a machine with
    # podman (provision runs inside the sandbox host, which is that machine)
    prov = _provision_inside(podman_host)
    _start(ssh_env, podman_host, sglang_images["0.5.9"])
    out = podman_host.run(f"{prov} patch --local --container {NAME} --json", check=False, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    (rec,) = json.loads(out.stdout)["hosts"]
    assert rec["verdict"] == "patched" and rec["data"]["transport"] == "container", rec
    assert rec["host"].endswith(f"/{NAME}")
    assert class_methods(_file(ssh_env, podman_host), KIMI_CLASS)[-3:] == METHODS
    # ... and the journal is that machine's (its own HOME), not this one's
    assert podman_host.hostpath("/root/.local/state/provision/journal.jsonl").exists()


def test_the_images_workdir_and_pythonpath_never_reach_the_step(podman_host, sglang_images, ssh_env):
    # An image whose WORKDIR (and PYTHONPATH) holds a json.py: `python -S -c` there would import it
    # before the standard library's, as root in the container. The step runs from / with -I.
    host = podman_host
    evil = ("printf '%s\\n' 'open(\"/tmp/MARKER-workdir\", \"a\").write(\"json.py ran\\\\n\")' "
            "'raise ImportError(\"not the real json\")' > /tmp/json.py && exec sleep 3600")
    ssh_env.ssh(host, f"podman run -d --name {NAME} --network host -w /tmp -e PYTHONPATH=/tmp "
                      f"--entrypoint sh {sglang_images['0.5.9']} -c {shlex.quote(evil)}", timeout=180)
    ssh_env.ssh(host, f"for i in $(seq 50); do podman exec {NAME} test -e /tmp/json.py && exit 0; sleep 0.1; "
                      "done; exit 1")
    proc, doc = run_json("status", *ssh_env.cli_args, "--host", host.name, "--container", NAME)
    marker = ssh_env.ssh(host, f"podman exec {NAME} cat /tmp/MARKER-workdir", check=False).stdout
    assert marker == "", "the image's WORKDIR/PYTHONPATH json.py was imported by the step"
    assert proc.returncode == 4, (proc.stdout, proc.stderr)  # judged: the image's 0.5.9 is not patched
    assert doc["hosts"][0]["version"] == "0.5.9"
