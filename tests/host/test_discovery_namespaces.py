"""Discovery keeps a server that sees other files apart from the host's own servers: a process in
another mount namespace whose interpreter path is not our file (a container, a sandboxed service
with its own /opt) is not one of this host's servers, however its command line reads."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from provision.host.facts import installs

COMMAND = "import time; time.sleep(60)"


def _wait_for(pids_of, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = pids_of()
        if found:
            return found
        time.sleep(0.05)
    return []


def _matching(marker: str) -> list[int]:
    """Pids whose command line carries the marker and reads like an SGLang server."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if marker.encode() in b" ".join(argv) and b"sglang.launch_server" in b" ".join(argv):
            out.append(int(p))
    return out


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_a_server_in_another_mount_namespace_with_other_files_is_not_the_hosts(tmp_path):
    marker = f"ns-{os.getpid()}"
    # inside: a private tmpfs on a fresh directory holds the "interpreter" (a link to python3), so
    # that path names a file there and nothing here
    where = tmp_path / "ns"
    where.mkdir()
    inside = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
         f"mount -t tmpfs none {where} && ln -s /usr/bin/python3 {where}/python3 && "
         f"exec {where}/python3 -c '{COMMAND}' sglang.launch_server --port 39999 {marker}-in"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # here: the same command, with an interpreter path that is the same file for us
    link = tmp_path / "python3"
    link.symlink_to("/usr/bin/python3")
    here = subprocess.Popen([str(link), "-c", COMMAND, "sglang.launch_server", "--port", "39998", f"{marker}-out"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ins = _wait_for(lambda: _matching(f"{marker}-in"))
        outs = _wait_for(lambda: _matching(f"{marker}-out"))
        assert ins and outs, inside.stderr.read() if inside.poll() is not None else "not started"
        assert not os.path.exists(f"{where}/python3")  # the namespace's file is not ours
        listed = {s["pid"] for s in installs.running_servers()}
        assert here.pid in listed
        assert not set(ins) & listed, "a server that sees other files was taken for one of this host's"
    finally:
        for proc in (inside, here):
            proc.kill()
            proc.wait()
