"""One host, three transports: what a no-op `provision patch` costs over each.

  * `--local`: this machine, a real SGLang 0.5.9 tree unpacked in a temp dir (no connection);
  * SSH: one sandbox host (real sshd, 0.5.9 source checkout);
  * `--container`: a podman sandbox host (over SSH) running the 0.5.9 SGLang image, the step
    run inside it through `podman exec -i` (skipped when the images cannot be built here).

Each timed run is the real CLI in a subprocess, after one first patch; medians of --runs.
Targets: local <= SSH (it skips the connection); container - SSH = the cost of `podman exec`
(reported, no target).

Usage: python3 benchmarks/bench_transport.py [--runs 5]
Needs root and the sandbox prerequisites for the SSH and container parts (skipped otherwise).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._sandbox import free_addresses, provision_argv, ssh_port, up_hosts  # noqa: E402
from provision.sandbox import wheels  # noqa: E402
from provision.sandbox.hosts import HostSpec, Sandbox  # noqa: E402


# The PATH a host's login has (as the sandbox hosts do): no pyenv shim in front of python3, whose
# bash start-up (~0.4 s per probe here) belongs to this machine, not to provision.
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _timed(argv: list[str], runs: int, env: dict | None = None) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
        out.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stdout}{proc.stderr}")
    return out


def bench_local(runs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-local-") as tmp:
        site = Path(tmp) / "site-packages"
        src = wheels.extracted("0.5.9")
        shutil.copytree(src / "sglang", site / "sglang")
        shutil.copytree(src / "sglang-0.5.9.dist-info", site / "sglang-0.5.9.dist-info")
        argv = provision_argv() + ["patch", "--local", "--sglang-path", str(site / "sglang"),
                                   "--state-dir", str(Path(tmp) / "state")]
        env = dict(os.environ, PATH=HOST_PATH)
        _timed(argv, 1, env)
        return {"noop": _timed(argv, runs, env)}


def bench_ssh_and_container(runs: int) -> dict:
    if Sandbox.check_prereqs():
        return {"skipped": "sandbox prerequisites: " + "; ".join(Sandbox.check_prereqs())}
    port = ssh_port()
    box = Sandbox(tempfile.mkdtemp(prefix="/tmp/bench-transport-"), owner_pid=os.getpid())
    out: dict = {}
    try:
        host = up_hosts(box, ["bt01"], 220, port)[0]
        conn = ["--ssh-config", str(box.ssh_config_path), "--identity", str(box.key_path),
                "--known-hosts", str(box.known_hosts_path)]
        argv = provision_argv() + ["patch", *conn, "--host", host.name]
        _timed(argv, 1)
        out["ssh"] = _timed(argv, runs)
        try:
            from provision.sandbox import images, sglang_image
        except ImportError:
            out["container_skipped"] = "no SGLang images in this tree"
            return out
        if images.problems():
            out["container_skipped"] = "; ".join(images.problems())
            return out
        image, _ = sglang_image.ensure_sglang_image("0.5.9")
        addr = free_addresses(1, 225, port)[0]
        (ph,) = box.up([HostSpec("bt02", addr, None, "none", port, podman=True)])
        ssh = ["ssh", "-F", str(box.ssh_config_path), "-o", "BatchMode=yes", ph.name]
        subprocess.run(ssh + [f"podman run -d --name sglang-30000 --network host {image} sleep 3600"], check=True,
                       capture_output=True, timeout=300)
        argv = provision_argv() + ["patch", *conn, "--host", ph.name, "--container", "sglang-30000"]
        _timed(argv, 1)
        out["container"] = _timed(argv, runs)
        t0 = time.perf_counter()
        subprocess.run(ssh + ["podman exec -i sglang-30000 true"], check=True, capture_output=True, timeout=60)
        out["bare_exec"] = [time.perf_counter() - t0]
    finally:
        box.down()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    local = bench_local(args.runs)
    remote = bench_ssh_and_container(args.runs)
    med = statistics.median
    rows = [("no-op patch --local (this machine)", med(local["noop"]))]
    if "ssh" in remote:
        rows.append(("no-op patch over SSH (1 host)", med(remote["ssh"])))
    if "container" in remote:
        rows.append(("no-op patch --container over SSH (podman exec)", med(remote["container"])))
        rows.append(("  bare `ssh host podman exec -i C true` (OpenSSH client)", remote["bare_exec"][0]))
    for what, secs in rows:
        print(f"{what:<58} {secs:6.2f} s")
    if "ssh" in remote:
        ok = med(local["noop"]) <= med(remote["ssh"])
        print(f"local <= SSH: {'met' if ok else 'MISSED'}")
    if "container" in remote:
        print(f"container - SSH: {med(remote['container']) - med(remote['ssh']):+.2f} s (podman exec)")
    for k in ("skipped", "container_skipped"):
        if k in remote:
            print(f"{k.replace('_', ' ')}: {remote[k]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
