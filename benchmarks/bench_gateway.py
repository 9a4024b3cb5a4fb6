"""A dead bastion: 16 hosts behind a ProxyJump gateway whose packets are dropped (iptables DROP on
its 127.0.0.1 port), one host behind another gateway, `ConnectTimeout 2`, `--forks 17`.

Targets: the whole `provision status` ends within one ConnectTimeout plus start-up (< 6 s: the dead
bastion is dialled once, its hosts fail at once with its error), and the host behind the live
gateway is not held up by it (its own elapsed < 4 s: its two connections and one remote call,
not the dead bastion's ConnectTimeout per host).

Needs root, iptables, sshd and the sandbox prerequisites (skipped otherwise). ~30 s.
"""

from __future__ import annotations

import argparse
import json
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
from tests.remote.gateways import Gateway, can_run_gateways, host_key_line  # noqa: E402


def bench(runs: int, behind: int) -> dict:
    ipt = shutil.which("iptables")
    if os.geteuid() != 0 or not ipt or Sandbox.check_prereqs() or can_run_gateways():
        return {"skipped": "needs root, iptables, sshd and the sandbox prerequisites"}
    port = ssh_port()
    box = Sandbox(tempfile.mkdtemp(prefix="/tmp/bench-gateway-"), owner_pid=os.getpid())
    gws: list[Gateway] = []
    totals, fine, dead = [], [], []
    try:
        host = up_hosts(box, ["bg01"], 226, port)[0]
        pub = box.key_path.with_name(box.key_path.name + ".pub")
        permit = [f"{host.address}:{host.port}"]
        gws = [Gateway(box.base_dir, "gw-dead", pub, permit=permit, hosts={}),
               Gateway(box.base_dir, "gw-live", pub, permit=permit, hosts={})]
        kh = box.base_dir / "bench_known_hosts"
        kh.write_text("\n".join([g.known_hosts_line() for g in gws] + [host_key_line(host, host.address)]) + "\n")
        cfg = box.base_dir / "bench_gateway_config"
        cfg.write_text(f"Host bastion-dead\n  HostName 127.0.0.1\n  Port {gws[0].port}\n"
                       f"Host bastion-live\n  HostName 127.0.0.1\n  Port {gws[1].port}\n"
                       f"Host dead-*\n  HostName {host.address}\n  Port {host.port}\n  ProxyJump bastion-dead\n"
                       f"Host fine\n  HostName {host.address}\n  Port {host.port}\n  ProxyJump bastion-live\n"
                       f"Host *\n  User root\n  IdentityFile {box.key_path}\n  IdentitiesOnly yes\n"
                       f"  UserKnownHostsFile {kh}\n  ConnectTimeout 2\n")
        rules = [["INPUT", "-p", "tcp", "-d", "127.0.0.1", "--dport", str(gws[0].port), "-j", "DROP"],
                 ["INPUT", "-p", "tcp", "-s", "127.0.0.1", "--sport", str(gws[0].port), "-j", "DROP"]]
        for r in rules:
            subprocess.run([ipt, "-w", "-I", *r], check=True)
        hostargs = [a for i in range(behind) for a in ("--host", f"dead-{i}")] + ["--host", "fine"]
        try:
            for _ in range(runs):
                t0 = time.monotonic()
                p = subprocess.run(provision_argv() + ["status", "--ssh-config", str(cfg), *hostargs,
                                                       "--forks", str(behind + 1), "--json"],
                                   capture_output=True, text=True, timeout=600)
                totals.append(time.monotonic() - t0)
                rows = {h["host"]: h for h in json.loads(p.stdout)["hosts"]}
                fine.append(rows["fine"]["elapsed"])
                dead.append(max(rows[f"dead-{i}"]["elapsed"] for i in range(behind)))
                if rows["fine"]["verdict"] not in ("missing", "patched"):
                    print(f"  warning: fine: {rows['fine']['verdict']}: {rows['fine']['detail']}")
        finally:
            for r in rules:
                subprocess.run([ipt, "-w", "-D", *r])
    finally:
        for g in gws:
            g.stop()
        box.down()
    return {"total": statistics.median(totals), "fine": statistics.median(fine), "dead": statistics.median(dead),
            "runs": len(totals)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--behind", type=int, default=16, help="hosts behind the dead bastion")
    opts = ap.parse_args()
    res = bench(opts.runs, opts.behind)
    if "skipped" in res:
        print(f"dead bastion: SKIPPED ({res['skipped']})")
        return 0
    print(f"dead bastion, {opts.behind} hosts behind it + 1 behind a live gateway, ConnectTimeout 2 "
          f"(median of {res['runs']}):")
    print(f"  whole run {res['total']:.2f} s  [< 6 s: {'met' if res['total'] < 6 else 'MISSED'}]")
    print(f"  slowest dead host {res['dead']:.2f} s; host behind the live gateway {res['fine']:.2f} s  "
          f"[< 4 s: {'met' if res['fine'] < 4 else 'MISSED'}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
