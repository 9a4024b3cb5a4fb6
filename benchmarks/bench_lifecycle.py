"""What one host's server lifecycle costs: `launch` -> ready, `launch --restart` -> ready, `stop`.

    python3 benchmarks/bench_lifecycle.py [--runs 5] [--tree DIR ...] [--first-address 200]

Needs root (the sandbox: a real sshd host in its namespaces). One host (SGLang 0.5.9 checkout, the
stand-in with a 1 s load); each run times, as wall clock of the CLI: `launch --poll 0.5` until
ready, `launch --restart --poll 0.5` until ready (the preflight under the port's lock, the stop of
the old tree, the start), and `stop`. With several --tree (e.g. /work/main and this worktree) the
same host measures each tree in turn (PYTHONPATH=TREE for the CLI), runs interleaved so load
drifts hit both. Prints medians; target: each tree's medians within 10% of the first's. Exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _sandbox import provision_argv, ssh_port, up_hosts  # noqa: E402
from provision.sandbox.hosts import Sandbox  # noqa: E402

import yaml  # noqa: E402


def timed(tree: str, *args: str) -> tuple[float, dict]:
    env = dict(os.environ, PYTHONPATH=tree)
    t0 = time.perf_counter()
    p = subprocess.run(provision_argv() + list(args) + ["--json"], capture_output=True, text=True, env=env,
                       stdin=subprocess.DEVNULL, timeout=600)
    wall = time.perf_counter() - t0
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        doc = {"hosts": [{"verdict": f"no JSON (exit {p.returncode}): {p.stderr[-300:]}"}]}
    return wall, doc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tree", action="append", default=[])
    ap.add_argument("--first-address", type=int, default=200)
    args = ap.parse_args()
    trees = args.tree or [str(REPO)]
    work = Path(tempfile.mkdtemp(prefix="bench-lifecycle-", dir="/tmp"))
    os.environ["PROVISION_JOURNAL"] = str(work / "journal.jsonl")
    box = Sandbox(work / "box", owner_pid=os.getpid())
    times: dict = {t: {"launch": [], "restart": [], "stop": []} for t in trees}
    notes = []
    try:
        port = ssh_port()
        [host] = up_hosts(box, ["blc01"], args.first_address, port)
        doc = yaml.safe_load(box.inventory_yaml(["blc01"]))
        doc["hosts"]["blc01"]["env"] = {"PROVISION_STANDIN_LOAD_SECONDS": "1"}
        inv = work / "inv.yaml"
        inv.write_text(yaml.safe_dump(doc, sort_keys=False))
        subprocess.run(provision_argv() + ["patch", "-i", str(inv)], capture_output=True, check=False,
                       env=dict(os.environ, PYTHONPATH=trees[0]))
        for i in range(args.runs):
            for tree in trees:
                for key, argv in (("launch", ["launch", "-i", str(inv), "--poll", "0.5"]),
                                  ("restart", ["launch", "-i", str(inv), "--poll", "0.5", "--restart"]),
                                  ("stop", ["stop", "-i", str(inv)])):
                    wall, res = timed(tree, *argv)
                    v = res["hosts"][0]["verdict"]
                    if v in ("ready", "stopped"):
                        times[tree][key].append(wall)
                    else:
                        notes.append(f"{tree} {key} run {i}: {v}")
                        timed(tree, "stop", "-i", str(inv))
    finally:
        box.down()
    base = trees[0]
    print(f"one host, {args.runs} runs, load average {os.getloadavg()[0]:.1f} (2 cores, shared)")
    for tree in trees:
        row = []
        for key in ("launch", "restart", "stop"):
            xs = times[tree][key]
            m = statistics.median(xs) if xs else float("nan")
            b = statistics.median(times[base][key]) if times[base][key] else float("nan")
            row.append(f"{key} {m:.2f} s" + ("" if tree == base else f" ({(m / b - 1) * 100:+.0f}%)"))
        print(f"  {tree}: " + ", ".join(row))
    for n in notes:
        print("  note:", n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
