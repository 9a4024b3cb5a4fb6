"""`--container`: the runtime run as root on the outer host is chosen by the one trust rule.

On a podman sandbox host, /usr/local/sbin (first on root's login PATH, and first on the fixed
PATH the rule looks up) is bind-mounted, inside the host's own mount namespace, from a directory
a user could write: owned by "nobody" (uid 65534), or root's but group-writable. It holds a
`podman` and a `docker` that append to a marker when run. `patch --container` must run neither,
fail in one sentence naming the path and why (exit 3), and leave the container's file alone;
with only an untrusted `docker` there, `auto` still takes the real podman that knows the
container.
"""

from __future__ import annotations

import pwd

import pytest

from tests.cli.helpers import KIMI, KIMI_CLASS, METHODS, class_methods, run, run_json

UID = 65534
USER = pwd.getpwuid(UID).pw_name
NAME = "sglang-30000"
FILE = f"/sgl-workspace/sglang/python/sglang/{KIMI}"
BIN = "/home/alice/bin"
MARKER = "/home/alice/MARKER-runtime"
PODMAN = "/usr/bin/podman"  # the host's real one, named: the test's own calls never look it up

pytestmark = pytest.mark.ssh


def plant(host, shims, owner: int, mode: int) -> None:
    """`shims` in BIN, mounted over /usr/local/sbin: each appends `$0 $*` to MARKER when run."""
    script = [f"set -e; mkdir -p {BIN}; rm -f {BIN}/*"]
    for b in shims:
        script.append(f"printf '#!/bin/sh\\necho \"$0 $*\" >> {MARKER}\\nexit 1\\n' > {BIN}/{b}; chmod 755 {BIN}/{b}")
    script += [f"chown -R {owner}:{owner} {BIN}", f"chmod {mode:o} {BIN}", "chmod 755 /home/alice",
               f"mount --bind {BIN} /usr/local/sbin"]
    done = host.run("; ".join(script), check=False)
    assert done.returncode == 0, done.stderr
    # root's own shell on that host would run them: they are first on its PATH
    login = host.run("command -v " + " ".join(shims)).stdout.split()
    assert login == [f"/usr/local/sbin/{b}" for b in shims], login


@pytest.fixture
def host(podman_host, sglang_images):
    h = podman_host
    h.run(f"{PODMAN} run -d --name {NAME} --network host {sglang_images['0.5.9']} sleep 3600", timeout=180)
    try:
        yield h
    finally:
        h.run("umount /usr/local/sbin", check=False)


def marker(host) -> str:
    p = host.hostpath(MARKER)
    return p.read_text() if p.exists() else ""


def container_file(host) -> bytes:
    return host.run(f"{PODMAN} exec {NAME} cat {FILE}").stdout.encode()


@pytest.mark.parametrize("owner,mode,why", [
    (UID, 0o755, f"owned by {USER}"),
    (0, 0o775, "/usr/local/sbin is writable by group (mode 0775)"),
], ids=["owned-by-a-user", "group-writable-dir"])
@pytest.mark.parametrize("runtime", ["podman", "auto"])
def test_a_runtime_that_fails_the_rule_is_never_run(host, ssh_env, owner, mode, why, runtime):
    plant(host, ("podman", "docker"), owner, mode)
    before = container_file(host)
    proc = run("patch", *ssh_env.cli_args, "--host", host.name, "--container", NAME, "--runtime", runtime)
    assert marker(host) == "", "a runtime a user could have written was run as root"
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "failed" in lines[0] and "Traceback" not in proc.stderr, (proc.stdout, proc.stderr)
    said = "; ".join(f"/usr/local/sbin/{rt} not run: {why}" for rt in (("docker", "podman") if runtime == "auto"
                                                                      else (runtime,)))
    assert f"cannot reach container {NAME}: {said} (provision runs a container runtime as root only when it and " \
        "every directory above it are root's and not writable by group or others)" in lines[0], lines[0]
    assert container_file(host) == before


def test_auto_skips_an_untrusted_runtime_and_takes_the_one_that_knows_the_container(host, ssh_env):
    # docker comes first for auto; the one root's PATH finds is a user's: never asked, podman takes the step
    plant(host, ("docker",), UID, 0o755)
    proc, doc = run_json("patch", *ssh_env.cli_args, "--host", host.name, "--container", NAME)
    assert marker(host) == "", "a runtime a user could have written was run as root"
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert doc["hosts"][0]["verdict"] == "patched", doc["hosts"][0]
    assert class_methods(container_file(host), KIMI_CLASS)[-3:] == METHODS
