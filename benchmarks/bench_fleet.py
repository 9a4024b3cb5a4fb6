"""Fleet-scale cost of `provision patch`, `status` and an unchanged `reconcile`.

    python3 benchmarks/bench_fleet.py [--sizes 1,16,64] [--runs 3] [--forks 16] [--keep]

Needs root (the sandbox: real sshd per host in namespaces, see provision/sandbox/hosts.py).
Builds max(sizes) hosts on free loopback addresses 127.0.1.x (port 22; every 4th host a
0.5.9 venv, the others 0.5.9 source checkouts), in a base dir under /var/tmp, and tears
them down at the end (also on error or Ctrl-C).

For each fleet size N (the first N hosts), the CLI is run as a subprocess, as a user runs it:
  patch      on pristine hosts (SGLang reset and /var/lib/provision removed before each run)
  status     on the patched hosts
  reconcile  on the patched, unchanged hosts (the fast path: nothing is written)
and reports the median wall time of --runs runs, the control process's peak RSS
(os.wait4 rusage of that child) and its CPU (user+sys), and SSH connections per host
(counted in-process by provision.control.transport.ssh.STATS for one extra status run: the design is
one Session per host). "ssh+true" is the floor: the same kind of process (imports,
Fleet, one Session per host) running only `true` on each host. The machine's load
average is printed too: on a shared 2-core machine other work inflates the wall times.
Target: reconcile of an unchanged 64-host fleet < 3 s.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from provision.sandbox.hosts import HostSpec, Sandbox  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sandbox  # noqa: E402,F401 - a throwaway HOME for this run (see _sandbox.isolate_home)

PROVISION = shutil.which("provision")


def free_addresses(n: int, port: int = 22) -> list[str]:
    from _sandbox import free_addresses as free

    return free(n, 1, port, net="127.0.1")


def cli(args: list[str], env: dict) -> dict:
    """Run the CLI; wall time, the child's own peak RSS and CPU, its JSON document."""
    argv = ([PROVISION] if PROVISION else [sys.executable, "-m", "provision"]) + args
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    out, err = b"", b""
    # communicate() waits with waitpid(); reap with wait4 ourselves to get this child's rusage
    import threading

    chunks = {"out": [], "err": []}
    ts = [threading.Thread(target=lambda k, f: chunks[k].append(f.read()), args=(k, f))
          for k, f in (("out", proc.stdout), ("err", proc.stderr))]
    for t in ts:
        t.start()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    for t in ts:
        t.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    out, err = b"".join(chunks["out"]), b"".join(chunks["err"])
    doc = None
    if "--json" in args:
        try:
            doc = json.loads(out)
        except ValueError:
            doc = None
    return {"wall": wall, "rss_mb": ru.ru_maxrss / 1024, "cpu": ru.ru_utime + ru.ru_stime, "rc": proc.returncode,
            "doc": doc, "stderr": err.decode(errors="replace")[-400:]}


FLOOR = r"""
import sys, time
t0 = time.monotonic()
from provision.config.inventory import load_inventory
from provision.control.runner import ConnOptions, Fleet, run_hosts
from provision.output.results import HostResult
a = sys.argv[1:]
opts = ConnOptions(ssh_config=a[1], identity=a[2], known_hosts=a[3], forks=int(a[4]))
def fn(host, session, fleet):
    rc, out, err = session.exec("true", timeout=60)
    return HostResult(host.name, "ok" if rc == 0 else "failed")
fleet = Fleet(opts)
res = run_hosts(fleet, load_inventory(a[0]).hosts, fn)
fleet.close()
sys.exit(0 if all(r.verdict == "ok" for r in res) else 3)
"""


def ssh_floor(inv: str, box, forks: int, env: dict) -> dict:
    """The same process shape (imports, Fleet, one Session per host) running only `true`
    on each host: what any per-host command costs here, before provision does anything."""
    argv = [sys.executable, "-c", FLOOR, inv, str(box.ssh_config_path), str(box.key_path),
            str(box.known_hosts_path), str(forks)]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            cwd=str(Path(__file__).resolve().parent.parent))
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"wall": time.monotonic() - t0, "rc": proc.returncode}


def connections_per_host(args: list[str], n: int) -> float:
    """One status run in-process, counting SSH connections (provision.control.transport.ssh.STATS)."""
    from provision.control.transport import ssh
    from provision.cli.main import main

    before = ssh.STATS.connections
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(args, standalone_mode=False)
        except SystemExit:
            pass
    return (ssh.STATS.connections - before) / n


def reset(hosts) -> None:
    for h in hosts:
        h.reset_sglang()
        shutil.rmtree(h.hostpath("/var/lib/provision"), ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1,16,64")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--forks", type=int, default=16, help="provision --forks (default: the CLI's default, 16)")
    ap.add_argument("--keep", action="store_true", help="leave the hosts up (prints the base dir)")
    opts = ap.parse_args()
    sizes = sorted({int(x) for x in opts.sizes.split(",")})
    problems = Sandbox.check_prereqs()
    if problems:
        print("cannot run the sandbox here: " + "; ".join(problems))
        return 0
    base = Path(tempfile.mkdtemp(prefix="bench-fleet-", dir="/var/tmp"))
    box = Sandbox(base, owner_pid=0 if opts.keep else os.getpid())  # owner_pid: hosts die with this process
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-work-"))
    try:
        n_max = max(sizes)
        addrs = free_addresses(n_max)
        specs = [HostSpec(f"bf{i:02d}", addr, "0.5.9", "venv" if i % 4 == 3 else "source", 22)
                 for i, addr in enumerate(addrs)]
        t0 = time.monotonic()
        hosts = box.up(specs)
        print(f"built {len(hosts)} hosts in {time.monotonic() - t0:.1f} s (base {base})")
        env = dict(os.environ, PROVISION_JOURNAL=str(work / "journal.jsonl"), PROVISION_LOCK=str(work / "lock"),
                   COLUMNS="200")
        common = ["--ssh-config", str(box.ssh_config_path), "--identity", str(box.key_path),
                  "--known-hosts", str(box.known_hosts_path), "--forks", str(opts.forks)]
        rows = []
        for n in sizes:
            subset = hosts[:n]
            inv = box.write_inventory(work / f"inv{n}.yaml", [h.name for h in subset])
            row = {"hosts": n}
            for what in ("patch", "status", "reconcile"):
                runs = []
                for _ in range(opts.runs):
                    if what == "patch":
                        reset(subset)
                    r = cli([what, "-i", str(inv), *common, "--json"], env)
                    want = {"patch": {"patched"}, "status": {"patched"}, "reconcile": {"unchanged"}}[what]
                    got = {h["verdict"] for h in (r["doc"] or {}).get("hosts", [])}
                    if r["rc"] != 0 or got != want:
                        print(f"  warning: {what} on {n} hosts: exit {r['rc']}, verdicts {sorted(got)} "
                              f"{r['stderr'].strip()[-200:]}")
                    if what == "reconcile" and r["doc"]:
                        paths = {h["data"].get("path") for h in r["doc"]["hosts"]}
                        if paths != {"fast"}:
                            print(f"  warning: reconcile left the fast path: {sorted(map(str, paths))}")
                    runs.append(r)
                row[what] = statistics.median(x["wall"] for x in runs)
                row[what + "_rss"] = max(x["rss_mb"] for x in runs)
                row[what + "_cpu"] = statistics.median(x["cpu"] for x in runs)
            floors = [ssh_floor(str(inv), box, opts.forks, env) for _ in range(opts.runs)]
            row["floor"] = statistics.median(f["wall"] for f in floors)
            row["conns"] = connections_per_host(["status", "-i", str(inv), *common, "--json"], n)
            rows.append(row)
            print(f"  {n} hosts done (load average {os.getloadavg()[0]:.1f})")
        print()
        print(f"median of {opts.runs} runs, --forks {opts.forks}, {os.cpu_count()} CPUs, "
              f"load average now {os.getloadavg()[0]:.1f}")
        head = ("hosts", "patch s", "status s", "reconcile s", "ssh+true s", "peak RSS MB (p/s/r)",
                "CLI CPU s (p/s/r)", "SSH conns/host")
        print("  ".join(f"{h:>{len(h)}}" for h in head))
        for r in rows:
            cells = [f"{r['hosts']:>5}", f"{r['patch']:>7.2f}", f"{r['status']:>8.2f}", f"{r['reconcile']:>11.2f}",
                     f"{r['floor']:>10.2f}",
                     f"{r['patch_rss']:.0f}/{r['status_rss']:.0f}/{r['reconcile_rss']:.0f}".rjust(19),
                     f"{r['patch_cpu']:.2f}/{r['status_cpu']:.2f}/{r['reconcile_cpu']:.2f}".rjust(17),
                     f"{r['conns']:>14.2f}"]
            print("  ".join(cells))
        big = [r for r in rows if r["hosts"] == 64]
        if big:
            ok = big[0]["reconcile"] < 3.0
            print(f"\nunchanged 64-host reconcile: {big[0]['reconcile']:.2f} s "
                  f"({'met' if ok else 'MISSED'} target < 3 s)")
    finally:
        if opts.keep:
            print(f"kept: {base} (tear down: python3 -c 'from provision.sandbox.hosts import Sandbox; "
                  f"Sandbox(\"{base}\").down()')")
        else:
            box.down()
            shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
