"""What overlay mode adds to a launch's preflight on one host.

    python3 benchmarks/bench_overlay.py [--runs 7] [--first-address 240]

Needs root (the sandbox). One SGLang 0.5.9 venv host on 127.0.2.<first>.. (checked by binding),
torn down at the end.

(a) the host side alone: the same `preflight` request a launch sends, with and without
    `overlay: true`, replayed inside the host with nsenter (no SSH, so only the host's work
    differs): wall time and CPU of the agent. Edit mode gets the file patched first, so both
    preflights pass. The overlay preflight stages the overlay (written on the first run,
    `unchanged` after), compiles it with the server's interpreter, runs the engine's structure
    check and asks that interpreter whether torch imports (it does not here: "import not
    verifiable here"; on a GPU host the import itself is added, bounded by its 180 s timeout).
(b) end to end: `provision launch --json` (PROVISION_STANDIN_LOAD_SECONDS=1) with and without
    --overlay, then `provision stop`, alternating, median of the runs.
Always exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._sandbox import free_addresses, provision_argv, ssh_port  # noqa: E402
from provision.sandbox.hosts import HostSpec, Sandbox  # noqa: E402


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def replay(host, data: bytes, runs: int) -> tuple[float, float, dict]:
    from provision.host.bootstrap import BOOTSTRAP, RESULT_PREFIX

    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
    walls, cpus, last = [], [], {}
    for _ in range(runs):
        r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        p = subprocess.run(host.nsenter_argv() + ["/usr/bin/python3", "-S", "-c", BOOTSTRAP], input=data,
                           capture_output=True, env=env)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        walls.append(time.perf_counter() - t0)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        for line in p.stdout.decode().splitlines():
            if line.startswith(RESULT_PREFIX):
                last = json.loads(line[len(RESULT_PREFIX):])
    return med(walls), med(cpus), last


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--first-address", type=int, default=240)
    args = ap.parse_args()
    problems = Sandbox.check_prereqs()
    if problems:
        print("sandbox unavailable: " + "; ".join(problems))
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench-overlay-", dir="/tmp"))
    os.environ["PROVISION_JOURNAL"] = str(work / "journal.jsonl")
    box = Sandbox(work / "box", owner_pid=os.getpid())
    cli = provision_argv()
    out: dict = {}
    try:
        port = ssh_port()
        (addr,) = free_addresses(1, args.first_address, port)
        (host,) = box.up([HostSpec("bo01", addr, "0.5.9", "venv", port)])
        inv = box.write_inventory(work / "inv.yaml", ["bo01"])
        subprocess.run(cli + ["patch", "-i", str(inv)], check=True, capture_output=True)

        from provision.config.inventory import load_inventory
        from provision.config.profile import host_profile
        from provision.control.transport.bundle import payload
        from provision.tasks.options import LaunchOptions, server_request

        h = load_inventory(str(inv)).hosts[0]
        prof, spec = host_profile(h)
        base = server_request("preflight", h, prof, LaunchOptions(), spec=spec.to_engine())
        for mode, extra in (("edit", {}), ("overlay", {"overlay": True, "import_timeout": 180.0})):
            wall, cpu, ans = replay(host, payload(dict(base, **extra)), args.runs)
            checks = {c["check"]: c["message"] for c in ans.get("checks") or []}
            out[mode] = {"wall": wall, "cpu": cpu, "check": checks.get("overlay" if mode == "overlay" else "patch")}

        launches: dict = {"edit": [], "overlay": []}
        env = dict(os.environ, PROVISION_STANDIN_LOAD_SECONDS="1")
        for _ in range(args.runs):
            for mode in ("edit", "overlay"):
                argv = cli + ["launch", "-i", str(inv), "--poll", "0.5", "--json"] + (["--overlay"] if mode == "overlay"
                                                                                       else [])
                t0 = time.perf_counter()
                p = subprocess.run(argv, capture_output=True, text=True, env=env)
                took = time.perf_counter() - t0
                verdict = json.loads(p.stdout)["hosts"][0]["verdict"] if p.stdout.strip() else "?"
                if verdict == "ready":
                    launches[mode].append(took)
                subprocess.run(cli + ["stop", "-i", str(inv)], capture_output=True)
        out["launch"] = {m: med(v) for m, v in launches.items()}
        out["launch_n"] = {m: len(v) for m, v in launches.items()}
    finally:
        box.down()
        shutil.rmtree(work, ignore_errors=True)

    print(f"\noverlay preflight benchmark ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, "
          f"sglang 0.5.9 venv host, median of {args.runs})")
    fmt = "  {:<52} {:>10}  {}"
    print(fmt.format("measurement", "value", "note"))
    for mode in ("edit", "overlay"):
        r = out[mode]
        print(fmt.format(f"preflight on the host, {mode} mode (wall / CPU)", f"{r['wall']:.3f} s",
                         f"CPU {r['cpu']:.3f} s; {r['check']}"))
    print(fmt.format("overlay preflight, extra on the host", f"{out['overlay']['wall'] - out['edit']['wall']:+.3f} s",
                     f"CPU {out['overlay']['cpu'] - out['edit']['cpu']:+.3f} s"))
    for mode in ("edit", "overlay"):
        print(fmt.format(f"launch -> ready, {mode} mode (load 1 s)", f"{out['launch'][mode]:.2f} s",
                         f"{out['launch_n'][mode]} of {args.runs} runs ready"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
