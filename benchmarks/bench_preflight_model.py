"""What the model checks (issue 19) add to a launch's preflight on one host: before (main) vs after.

    python3 benchmarks/bench_preflight_model.py [--runs 9] [--first-address 236] [--main /work/main]

Needs root (the sandbox). One SGLang 0.5.9 venv host on 127.0.2.<first>.. (checked by binding),
patched so both preflights pass, torn down at the end.

The same `preflight` request a launch sends (the profile of the shipped kimi-k25-eagle3 playbook,
with its sandbox model: 64 shards, and the drafter) is replayed inside the host with nsenter (no
SSH, so only the host's work differs), with the host bundle of `--main` (before) and of this tree
(after, plus the shipped specs as candidates, as launch sends them):
  before           main's preflight
  after, cold      the first preflight of an install (the registry and the parser are read: the
                   audit index of srt/models/*.py and server_args.py), the cache file removed first
  after, cached    every later preflight (the cache hit: the mtimes of the files read, config.json,
                   the shards' first bytes)
Target: after (cached) - before <= 150 ms. Always exits 0.
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

TARGET = 0.150


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def payload_from(tree: str, req: dict) -> bytes:
    """The framed bundle + request, built by the bundle code of `tree` from `tree`'s host files."""
    code = ("import sys,json\nfrom provision.control.transport.bundle import payload\n"
            "sys.stdout.buffer.write(payload(json.loads(sys.stdin.read())))\n")
    env = dict(os.environ, PYTHONPATH=tree)
    return subprocess.run([sys.executable, "-c", code], input=json.dumps(req).encode(), env=env,
                          capture_output=True, check=True).stdout


def replay_once(host, data: bytes) -> tuple[float, float, dict]:
    from provision.host.bootstrap import BOOTSTRAP, RESULT_PREFIX

    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    p = subprocess.run(host.nsenter_argv() + ["/usr/bin/python3", "-S", "-c", BOOTSTRAP], input=data,
                       capture_output=True, env=env)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    ans: dict = {}
    for line in p.stdout.decode().splitlines():
        if line.startswith(RESULT_PREFIX):
            ans = json.loads(line[len(RESULT_PREFIX):])
    return time.perf_counter() - t0, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime, ans


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--first-address", type=int, default=236)
    ap.add_argument("--main", default="/work/main", help="the tree of `before`")
    args = ap.parse_args()
    problems = Sandbox.check_prereqs()
    if problems:
        print("sandbox unavailable: " + "; ".join(problems))
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench-preflight-model-", dir="/tmp"))
    os.environ["PROVISION_JOURNAL"] = str(work / "journal.jsonl")
    box = Sandbox(work / "box", owner_pid=os.getpid())
    cli = provision_argv()
    res: dict = {"before": [], "cold": [], "cached": []}
    cpu: dict = {"before": [], "cold": [], "cached": []}
    rows: list = []
    try:
        port = ssh_port()
        (addr,) = free_addresses(1, args.first_address, port)
        (host,) = box.up([HostSpec("bp01", addr, "0.5.9", "venv", port)])
        inv = box.write_inventory(work / "inv.yaml", ["bp01"])
        subprocess.run(cli + ["patch", "-i", str(inv)], check=True, capture_output=True)

        from provision.config.inventory import load_inventory
        from provision.config.profile import host_profile
        from provision.tasks.launch import candidate_specs
        from provision.tasks.options import LaunchOptions, server_request

        h = load_inventory(str(inv)).hosts[0]
        prof, spec = host_profile(h)
        base = server_request("preflight", h, prof, LaunchOptions(), spec=spec.to_engine(), patch_specs=[spec.to_engine()])
        before = payload_from(args.main, base)
        after = payload_from(str(REPO), dict(base, candidate_specs=candidate_specs(spec)))
        cache_glob = "/var/lib/provision/cache/preflight-*.json"
        replay_once(host, before)  # warm the page cache for both
        for _ in range(args.runs):
            for kind, data in (("before", before), ("cold", after), ("cached", after)):
                if kind == "cold":
                    host.run(f"rm -f {cache_glob}", check=False)
                wall, c, ans = replay_once(host, data)
                res[kind].append(wall)
                cpu[kind].append(c)
                if kind == "cached":
                    rows = [f"{x['level']} {x['check']}: {x['message']}" for x in ans.get("checks") or []]
    finally:
        box.down()
        shutil.rmtree(work, ignore_errors=True)

    print(f"\npreflight model-check benchmark ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, "
          f"sglang 0.5.9 venv host, 64 shards + drafter, median of {args.runs})")
    fmt = "  {:<44} {:>9}  {}"
    print(fmt.format("measurement", "wall", "note"))
    for kind, label in (("before", "preflight on the host, before (main)"), ("cold", "after, first run (cache cold)"),
                        ("cached", "after, cached")):
        print(fmt.format(label, f"{med(res[kind]):.3f} s", f"CPU {med(cpu[kind]):.3f} s"))
    extra = med(res["cached"]) - med(res["before"])
    print(fmt.format("extra per preflight (cached)", f"{extra * 1000:+.0f} ms",
                     f"target <= {TARGET * 1000:.0f} ms: {'met' if extra <= TARGET else 'MISSED'}"))
    print(fmt.format("extra on an install's first preflight", f"{(med(res['cold']) - med(res['before'])) * 1000:+.0f} ms",
                     "once per install and per change of its files"))
    print("\n  rows of the last cached preflight:")
    for r in rows:
        print("    " + r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
