"""What `provision upgrade` costs on one host: the install beside, the restart to ready, the benches;
and a no-op `upgrade` (already on that release) against a no-op `reconcile`.

    python3 benchmarks/bench_upgrade.py [--runs 3] [--first-address 210]

Needs root (the sandbox: a real sshd host in its namespaces). One host (SGLang 0.5.9 in a venv, the
stand-in with a 1 s load, patched and serving); the wheelhouse holds the real 0.5.10 wheel with the
stand-in behind launch_server (provision/sandbox/upgrade_wheels.py). Each run: `upgrade --to 0.5.10
--stage` (the install: venv + pip, timed alone), `upgrade --to 0.5.10` (bench before, the restart to
ready, bench after; the row's own figures split it), then `upgrade --to 0.5.10` again and
`reconcile` (both no-ops), then back to 0.5.9 for the next run (the venv removed). Prints medians;
target: a no-op upgrade within 2x a no-op reconcile (one survey call against reconcile's one). Exits 0.
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

from _sandbox import free_addresses, provision_argv, ssh_port  # noqa: E402
from provision.sandbox.hosts import HostSpec, Sandbox  # noqa: E402
from provision.sandbox.upgrade_wheels import standin_wheel  # noqa: E402

import yaml  # noqa: E402


def timed(*args: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    p = subprocess.run(provision_argv() + list(args) + ["--json"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=900)
    wall = time.perf_counter() - t0
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        doc = {"hosts": [{"verdict": f"no JSON (exit {p.returncode}): {p.stderr[-300:]}", "data": {}}]}
    return wall, doc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--first-address", type=int, default=210)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-upgrade-", dir="/tmp"))
    os.environ["PROVISION_JOURNAL"] = str(work / "journal.jsonl")
    wheels = work / "wheels"
    standin_wheel("0.5.10", wheels)
    box = Sandbox(work / "box", owner_pid=os.getpid())
    t: dict = {k: [] for k in ("install", "whole", "bench_before", "restart_to_ready", "bench_after", "noop_upgrade",
                               "noop_reconcile")}
    notes = []
    try:
        port = ssh_port()
        [addr] = free_addresses(1, args.first_address, port)
        [host] = box.up([HostSpec("bup01", addr, "0.5.9", "venv", port)])
        doc = yaml.safe_load(box.inventory_yaml(["bup01"]))
        doc["hosts"]["bup01"]["env"] = {"PROVISION_STANDIN_LOAD_SECONDS": "1",
                                        "PROVISION_STANDIN_WARMUP_SECONDS": "0.2"}
        doc["hosts"]["bup01"]["python"] = "/opt/venv/bin/python3"
        inv = work / "inv.yaml"
        inv.write_text(yaml.safe_dump(doc, sort_keys=False))
        base = ["-i", str(inv)]
        for i in range(args.runs):
            w, res = timed("launch", *base, "--patch", "--poll", "0.5", "--restart")
            if res["hosts"][0]["verdict"] not in ("ready", "running"):
                notes.append(f"run {i}: launch {res['hosts'][0]['verdict']}")
                continue
            w, res = timed("upgrade", *base, "--to", "0.5.10", "--stage", "--wheelhouse", str(wheels), "--no-deps")
            row = res["hosts"][0]
            if row["verdict"] != "staged":
                notes.append(f"run {i}: stage {row['verdict']}: {row.get('detail', '')[:200]}")
                continue
            t["install"].append(float(row["data"].get("install_seconds") or 0))
            w, res = timed("upgrade", *base, "--to", "0.5.10", "--poll", "0.5", "--bench-requests", "3",
                           "--bench-tokens", "128", "--no-deps")
            row = res["hosts"][0]
            if row["verdict"] != "upgraded":
                notes.append(f"run {i}: upgrade {row['verdict']}: {row.get('detail', '')[:200]}")
            else:
                t["whole"].append(w)
                secs = row["data"].get("seconds") or {}
                for k in ("bench_before", "restart_to_ready", "bench_after"):
                    t.setdefault(k, []).append(float(secs.get(k) or 0))
            w, res = timed("upgrade", *base, "--to", "0.5.10")
            if res["hosts"][0]["verdict"] == "unchanged":
                t["noop_upgrade"].append(w)
            w, res = timed("reconcile", *base)
            t["noop_reconcile"].append(w)
            # back to 0.5.9 for the next run: stop, remove the new venv
            timed("stop", *base)
            host.run("rm -rf /opt/sglang-0.5.10", check=False)
    finally:
        box.down()
    med = {k: (statistics.median(v) if v else float("nan")) for k, v in t.items()}
    print(f"one host, {args.runs} runs, load average {os.getloadavg()[0]:.1f} (2 cores, shared)")
    print(f"  install beside (venv + pip of the 6 MB 0.5.10 wheel, --no-deps): {med['install']:.1f} s")
    print(f"  upgrade, whole: {med['whole']:.1f} s = bench before {med['bench_before']:.1f} s + restart to ready "
          f"{med['restart_to_ready']:.1f} s + bench after {med['bench_after']:.1f} s + survey, judge, CLI")
    print(f"  no-op upgrade {med['noop_upgrade']:.2f} s, no-op reconcile {med['noop_reconcile']:.2f} s: "
          + ("met" if med["noop_upgrade"] <= 2 * med["noop_reconcile"] else "MISSED") + " (within 2x)")
    for n in notes:
        print("  note:", n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
