"""Discovery keeps a server that sees other files apart from the host's own servers: a process in
another mount namespace whose interpreter path is not our file (a container, a sandboxed service
with its own /opt) is not one of this host's servers, however its command line reads."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from provision.host import inference
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


def _matching(marker: str, argv0: str | None = None) -> list[int]:
    """Pids whose command line carries the marker and reads like an SGLang server (and, with
    ``argv0``, already runs that program: the shell that execs it carries the marker too)."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if marker.encode() in b" ".join(argv) and b"sglang.launch_server" in b" ".join(argv) \
                and (argv0 is None or argv[0] == argv0.encode()):
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
        # the inside pid is the shell until it has mounted, linked and exec'd: wait for the exec
        ins = _wait_for(lambda: _matching(f"{marker}-in", argv0=f"{where}/python3"))
        outs = _wait_for(lambda: _matching(f"{marker}-out", argv0=str(link)))
        assert ins and outs, inside.stderr.read() if inside.poll() is not None else "not started"
        assert not os.path.exists(f"{where}/python3")  # the namespace's file is not ours
        listed = {s["pid"] for s in installs.running_servers(inference.get("sglang"))}
        assert here.pid in listed
        assert not set(ins) & listed, "a server that sees other files was taken for one of this host's"
    finally:
        for proc in (inside, here):
            proc.kill()
            proc.wait()


def test_a_wrapper_shell_is_not_taken_for_the_server_its_python_child_is():
    """`ExecStart=/bin/bash -c "python3 -m sglang.launch_server ..."` keeps a shell as the parent:
    discovery lists the python process (whose interpreter tells the install), not the shell."""
    marker = f"wrap-{os.getpid()}"
    shell = subprocess.Popen(["/bin/bash", "-c", f"/usr/bin/python3 -c '{COMMAND}' sglang.launch_server "
                                                 f"--port 39997 {marker}; true"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        child = _wait_for(lambda: _matching(marker, argv0="/usr/bin/python3"))
        assert child, "the python child did not start"
        servers = {s["pid"]: s for s in installs.running_servers(inference.get("sglang"))}
        assert shell.pid not in servers, "the wrapper shell was taken for the server"
        assert child[0] in servers and servers[child[0]]["python"] == "/usr/bin/python3"
    finally:
        for p in _matching(marker):
            try:
                os.kill(p, 9)
            except OSError:
                pass
        shell.kill()
        shell.wait()

