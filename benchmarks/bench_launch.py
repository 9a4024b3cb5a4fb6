"""How fast `provision launch` notices readiness and death, and what following costs.

    python3 benchmarks/bench_launch.py [--runs 5] [--hosts 16] [--load-seconds 30]
                                       [--first-address 230] [--skip-fleet]

Needs root (the sandbox: real sshd in namespaces, see provision/sandbox/hosts.py).
Hosts get free loopback addresses from 127.0.2.<first>.. (checked by binding), a base
dir under /tmp, and are torn down at the end (also on error or Ctrl-C).

(a) ready -> return (PROVISION_STANDIN_LOAD_SECONDS=1): a small poller runs INSIDE the
    host (its network namespace) and GETs /health every 10 ms, printing the wall-clock
    time of the first 200; the CLI's exit time is taken when `provision launch --json`
    exits (same machine, same clock).
    Cross-checked against the log's "fired up" line (second resolution) and the JSON's
    time_to_ready. Default --poll (2 s) and --poll 1. Target: <= poll + 0.5 s.
(b) death -> return: PROVISION_STANDIN_FAULT=crash-mid-load (the host's inventory `env:`);
    death time = mtime of the watcher's /var/lib/provision/server/server-30000.exit.
    Target: <= 3 s (default poll).
(c) control-side CPU while following N hosts (PROVISION_STANDIN_LOAD_SECONDS=30): the
    CLI's user+sys CPU (getrusage(RUSAGE_CHILDREN) delta) / wall time. Servers are stopped
    afterwards with `provision stop`.
Always exits 0; a missed target is printed as MISSED.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from provision.sandbox.hosts import HOST_PATH, Sandbox  # noqa: E402

EXITFILE = "/var/lib/provision/server/server-30000.exit"
READY_LINE = "The server is fired up and ready to roll!"

# Runs inside the host: first wall-clock time /health answers 200 (stdout), then exits.
POLLER = r"""
import sys, time, urllib.request, urllib.error
deadline = time.time() + float(sys.argv[1])
print("started", flush=True)
while time.time() < deadline:
    try:
        with urllib.request.urlopen("http://127.0.0.1:30000/health", timeout=1) as r:
            if r.status == 200:
                print(repr(time.time()), flush=True)
                sys.exit(0)
    except (OSError, urllib.error.HTTPError):
        pass
    time.sleep(0.01)
print("none", flush=True)
"""


# --------------------------------------------------------------------------- helpers

from _sandbox import free_addresses, provision_argv, ssh_port, up_hosts  # noqa: E402,F401


def inventory(box: Sandbox, path: Path, names: list[str], env: dict | None = None) -> Path:
    """The sandbox's inventory for these hosts, with an `env:` mapping on each host."""
    doc = yaml.safe_load(box.inventory_yaml(names))
    if env:
        for name in names:
            doc["hosts"][name]["env"] = dict(env)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run_cli(argv: list[str]) -> dict:
    """Run the CLI; wall-clock exit time, wall and CPU (user+sys) of the child."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0, w0 = time.time(), time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True)
    out, err = proc.communicate()
    t_exit = time.time()
    wall = time.perf_counter() - w0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    doc = None
    try:
        doc = json.loads(out)
    except ValueError:
        pass
    return {"rc": proc.returncode, "out": out, "err": err, "doc": doc, "t_start": t0, "t_exit": t_exit,
            "wall": wall, "cpu": cpu}


def host_result(res: dict, name: str) -> dict:
    for h in (res["doc"] or {}).get("hosts", []):
        if h["host"] == name:
            return h
    return {"verdict": f"no JSON (exit {res['rc']}): {(res['err'] or res['out']).strip()[-300:]}", "data": {}}


def stop(inv: Path) -> None:
    subprocess.run(provision_argv() + ["stop", "-i", str(inv), "--grace", "5"], capture_output=True,
                   stdin=subprocess.DEVNULL, timeout=120)


def start_poller(host, seconds: float) -> subprocess.Popen:
    env = {"PATH": HOST_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
    p = subprocess.Popen(host.nsenter_argv() + ["/usr/bin/python3", "-c", POLLER, str(seconds)],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert p.stdout.readline().strip() == "started"
    return p


def log_ready_time(host, log: str | None) -> float | None:
    if not log:
        return None
    try:
        text = host.hostpath(log).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if READY_LINE in line:
            m = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", line)
            if m:
                return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
    return None


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def word(ok: bool) -> str:
    return "met" if ok else "MISSED"


def cpu_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as fh:
        vals = [int(x) for x in fh.readline().split()[1:]]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


# --------------------------------------------------------------------------- parts

def bench_ready(host, inv: Path, poll: float | None, runs: int) -> dict:
    lat, ttr, loglat, notes = [], [], [], []
    for _ in range(runs):
        poller = start_poller(host, 120)
        argv = provision_argv() + ["launch", "-i", str(inv), "--json"] + (["--poll", str(poll)] if poll else [])
        try:
            res = run_cli(argv)
        finally:
            try:
                line = poller.communicate(timeout=10)[0].strip()
            except subprocess.TimeoutExpired:
                poller.kill()
                line = poller.communicate()[0].strip()
        hr = host_result(res, host.name)
        if hr["verdict"] != "ready":
            notes.append(f"verdict {hr['verdict']}: {hr.get('detail', '')[:200]}")
            stop(inv)
            continue
        try:
            t_healthy = float(line)
        except ValueError:
            notes.append(f"in-host poller saw no 200 ({line!r})")
            stop(inv)
            continue
        lat.append(res["t_exit"] - t_healthy)
        ttr.append(hr["data"].get("time_to_ready") or float("nan"))
        t_log = log_ready_time(host, hr["data"].get("log"))
        if t_log is not None:
            loglat.append(res["t_exit"] - t_log)
        stop(inv)
    return {"lat": lat, "ttr": ttr, "loglat": loglat, "notes": notes}


def bench_crash(host, inv_crash: Path, inv: Path, poll: float | None, runs: int) -> dict:
    lat, notes = [], []
    for _ in range(runs):
        argv = provision_argv() + ["launch", "-i", str(inv_crash), "--json"] + (["--poll", str(poll)] if poll else [])
        res = run_cli(argv)
        hr = host_result(res, host.name)
        try:
            t_death = host.hostpath(EXITFILE).stat().st_mtime
        except OSError:
            t_death = None
        if hr["verdict"] != "crashed" or t_death is None:
            notes.append(f"verdict {hr['verdict']}, exit file {'found' if t_death else 'missing'}: "
                         f"{hr.get('detail', '')[:200]}")
        else:
            lat.append(res["t_exit"] - t_death)
        stop(inv)
    return {"lat": lat, "notes": notes}


def bench_follow_cpu(hosts, inv: Path) -> dict:
    b0 = cpu_busy()
    res = run_cli(provision_argv() + ["launch", "-i", str(inv), "--json"])
    b1 = cpu_busy()
    verdicts: dict[str, int] = {}
    for h in hosts:
        v = host_result(res, h.name)["verdict"]
        verdicts[v] = verdicts.get(v, 0) + 1
    t0 = time.perf_counter()
    stop(inv)
    return {"wall": res["wall"], "cpu": res["cpu"], "pct": 100 * res["cpu"] / res["wall"], "verdicts": verdicts,
            "machine_pct": 100 * (b1[0] - b0[0]) / max(1, b1[1] - b0[1]) * (os.cpu_count() or 1),
            "stop_s": time.perf_counter() - t0}


# --------------------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--load-seconds", type=float, default=30)
    ap.add_argument("--first-address", type=int, default=230, help="last octet to start at in 127.0.2.x")
    ap.add_argument("--skip-fleet", action="store_true", help="skip (c)")
    args = ap.parse_args()

    problems = Sandbox.check_prereqs()
    if problems:
        print("sandbox unavailable: " + "; ".join(problems))
        return 0
    t_all = time.perf_counter()
    load0 = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-launch-", dir="/tmp"))
    # provision journals every change (provision/journal.py): keep benchmark runs out of the real one
    os.environ["PROVISION_JOURNAL"] = str(work / "journal.jsonl")
    box = Sandbox(work / "box", owner_pid=os.getpid())
    n = 1 if args.skip_fleet else args.hosts
    names = [f"bl{i:02d}" for i in range(1, n + 1)]
    inv1 = invn = None
    try:
        port = ssh_port()
        hosts = up_hosts(box, names, args.first_address, port)
        print(f"{len(hosts)} sandbox hosts up ({hosts[0].address}..{hosts[-1].address}:{port})", file=sys.stderr)
        invn = inventory(box, work / "inv-n.yaml", names, {"PROVISION_STANDIN_LOAD_SECONDS": f"{args.load_seconds:g}"})
        inv1 = inventory(box, work / "inv-1.yaml", names[:1])
        # (a) measures healthy -> return, independent of the load time: keep the load short
        inv_fast = inventory(box, work / "inv-fast.yaml", names[:1], {"PROVISION_STANDIN_LOAD_SECONDS": "1"})
        inv_crash = inventory(box, work / "inv-crash.yaml", names[:1], {"PROVISION_STANDIN_FAULT": "crash-mid-load"})
        p = subprocess.run(provision_argv() + ["patch", "-i", str(invn)], capture_output=True, text=True)
        if p.returncode != 0:
            print(f"patch failed (exit {p.returncode}): {p.stdout[-500:]} {p.stderr[-500:]}")
            return 0
        print("(a) ready -> return ...", file=sys.stderr)
        ready = {poll: bench_ready(hosts[0], inv_fast, poll, args.runs) for poll in (None, 1.0)}
        print("(b) death -> return ...", file=sys.stderr)
        crash = bench_crash(hosts[0], inv_crash, inv1, None, args.runs)
        fleet = None
        if not args.skip_fleet:
            print(f"(c) following {n} hosts ...", file=sys.stderr)
            fleet = bench_follow_cpu(hosts, invn)
    finally:
        for inv in (invn, inv1):
            if inv is not None and inv.exists():
                try:
                    stop(inv)
                except Exception:  # noqa: BLE001 - teardown kills everything anyway
                    pass
        box.down()
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nprovision launch benchmark ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, "
          f"load avg {load0:.1f} -> {os.getloadavg()[0]:.1f}, stand-in SGLang, {args.runs} runs each; medians, [min..max])")
    fmt = "  {:<46} {:>16}  {}"
    print(fmt.format("measurement", "value", "target"))
    for poll, r in ready.items():
        p = poll or 2.0
        label = f"(a) healthy -> launch returns, poll {p:g} s"
        if r["lat"]:
            m = med(r["lat"])
            print(fmt.format(label, f"{m:.2f} s", f"<= {p + 0.5:g} s: median {word(m <= p + 0.5)}, "
                             f"max {max(r['lat']):.2f} s {word(max(r['lat']) <= p + 0.5)}  "
                             f"[{min(r['lat']):.2f}..{max(r['lat']):.2f}]"))
            print(fmt.format("      cross-check: exit - 'fired up' log line", f"{med(r['loglat']):.1f} s",
                             f"(1 s resolution); time_to_ready {med(r['ttr']):.1f} s"))
        else:
            print(fmt.format(label, "NO DATA", ""))
        for note in r["notes"]:
            print("  WARNING: " + note)
    if crash["lat"]:
        m = med(crash["lat"])
        print(fmt.format("(b) process death -> launch returns, poll 2 s", f"{m:.2f} s",
                         f"<= 3 s: median {word(m <= 3)}, max {max(crash['lat']):.2f} s {word(max(crash['lat']) <= 3)}"
                         f"  [{min(crash['lat']):.2f}..{max(crash['lat']):.2f}]"))
    else:
        print(fmt.format("(b) process death -> launch returns", "NO DATA", ""))
    for note in crash["notes"]:
        print("  WARNING: " + note)
    if fleet is not None:
        print(fmt.format(f"(c) CLI CPU following {n} hosts (load {args.load_seconds:g} s)",
                         f"{fleet['pct']:.1f} % of a core",
                         f"{fleet['cpu']:.2f} CPU-s over {fleet['wall']:.1f} s wall; verdicts {fleet['verdicts']}"))
        print(fmt.format("      whole machine meanwhile (all processes)", f"{fleet['machine_pct']:.0f} % of a core",
                         f"(hosts' sshd, probes, stand-ins, other users); stop took {fleet['stop_s']:.1f} s"))
    print(f"total benchmark time {time.perf_counter() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
