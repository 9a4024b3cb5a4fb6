"""Connection conventions, timed: ConnectTimeout from the ssh config, and the cost of asking
OpenSSH (`ssh -G`) for every host's settings.

  * a host whose packets are dropped (iptables DROP on its address:port), with
    `ConnectTimeout 2` in the ssh config and no --connect-timeout: seconds until
    `provision status` reports it unreachable (target: 2 s + start-up, well under 10 s);
  * `ssh -G` resolution: one process per host name, cached for the run (target: < 10 ms per
    name on this machine; the second lookup of a name costs nothing).

Usage: python3 benchmarks/bench_connect.py [--runs 5] [--names 64]
Needs root, the sandbox prerequisites and iptables for the first part (skipped otherwise).
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

from benchmarks._sandbox import provision_argv, ssh_port, up_hosts  # noqa: E402
from provision.sandbox.hosts import Sandbox  # noqa: E402
from provision.control.transport.settings import SshConfig  # noqa: E402


def bench_resolution(names: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "config"
        cfg.write_text("Host gpu*\n  User ops\n  ProxyJump bastion\nMatch host gpu1*\n  Port 2222\n")
        sc = SshConfig(str(cfg))
        if sc.ssh is None:
            return {"skipped": "no OpenSSH client"}
        t0 = time.perf_counter()
        for i in range(names):
            sc.lookup(f"gpu{i:03d}")
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(names):
            sc.lookup(f"gpu{i:03d}")
        again = time.perf_counter() - t0
        sc.close()
    return {"per_name_ms": 1000 * first / names, "cached_total_ms": 1000 * again, "processes": sc.asked}


def bench_timeout(runs: int) -> dict:
    ipt = shutil.which("iptables")
    if os.geteuid() != 0 or not ipt or Sandbox.check_prereqs():
        return {"skipped": "needs root, iptables and the sandbox prerequisites"}
    port = ssh_port()
    box = Sandbox(tempfile.mkdtemp(prefix="/tmp/bench-connect-"), owner_pid=os.getpid())
    times = []
    try:
        host = up_hosts(box, ["bc01"], 240, port)[0]
        cfg = box.base_dir / "bench_ssh_config"
        cfg.write_text(f"Host slow\n  HostName {host.address}\n  Port {host.port}\n  User root\n"
                       f"  IdentityFile {box.key_path}\n  UserKnownHostsFile {box.known_hosts_path}\n"
                       "  ConnectTimeout 2\n")
        rules = [["INPUT", "-p", "tcp", "-d", host.address, "--dport", str(host.port), "-j", "DROP"],
                 ["INPUT", "-p", "tcp", "-s", host.address, "--sport", str(host.port), "-j", "DROP"]]
        for r in rules:
            subprocess.run([ipt, "-w", "-I", *r], check=True)
        try:
            for _ in range(runs):
                t0 = time.monotonic()
                p = subprocess.run(provision_argv() + ["status", "--ssh-config", str(cfg), "--host", "slow"],
                                   capture_output=True, text=True, timeout=120)
                times.append(time.monotonic() - t0)
                if p.returncode != 3 or "within 2 s" not in p.stdout:
                    print(f"  warning: exit {p.returncode}: {p.stdout.strip()[-200:]}")
        finally:
            for r in rules:
                subprocess.run([ipt, "-w", "-D", *r])
    finally:
        box.down()
    return {"median_s": statistics.median(times), "max_s": max(times), "runs": len(times)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--names", type=int, default=64)
    opts = ap.parse_args()
    res = bench_resolution(opts.names)
    if "skipped" in res:
        print(f"ssh -G resolution: SKIPPED ({res['skipped']})")
    else:
        verdict = "met" if res["per_name_ms"] < 10 else "MISSED"
        print(f"ssh -G resolution: {res['per_name_ms']:.1f} ms per name ({res['processes']} processes for "
              f"{opts.names} names), cached lookups {res['cached_total_ms']:.2f} ms in all  [< 10 ms: {verdict}]")
    res = bench_timeout(opts.runs)
    if "skipped" in res:
        print(f"ConnectTimeout 2, dropped packets: SKIPPED ({res['skipped']})")
    else:
        verdict = "met" if res["max_s"] < 4 else "MISSED"
        print(f"ConnectTimeout 2, dropped packets -> unreachable: median {res['median_s']:.2f} s, max "
              f"{res['max_s']:.2f} s over {res['runs']} runs (whole `provision status`, start-up included)  "
              f"[< 4 s: {verdict}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
