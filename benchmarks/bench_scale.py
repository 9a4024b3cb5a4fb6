"""The hot path at scale: what a no-op `provision patch` costs on 1..N sandbox hosts, per host.

    python3 benchmarks/bench_scale.py [--sizes 1,16,32] [--runs 5] [--forks 64] [--before DIR]

Needs root and the sandbox prerequisites (`provision sandbox --help`). Starts max(sizes)
0.5.9 source-checkout hosts on free loopback addresses 127.0.4.x (checked by binding first),
patches them once, then, for --runs rounds, each measured in turn inside the round (so a
change in this shared machine's load hits every row the same way):

  floor      the bare Fabric floor: import fabric, connect to one host, run `python3 -c pass`
  --host     no-op `provision patch --host H` (ssh config alias), 1 host
  -i ini     no-op `provision patch -i hosts.ini`, 1 host, a static Ansible INI inventory read
             through ansible-inventory (when it is on PATH)
  -i N       no-op `provision patch -i invN.yaml` on N hosts, for every N in --sizes

Per row: the median wall time and the CLI's CPU (user+sys of it and its children, wait4).
Every answer must be `unchanged`. The host side alone: the exact command line and stdin the
`--host` row sends (captured in-process), replayed inside the host with nsenter (no SSH):
median CPU and the bytes sent per call. The CLI runs with PYTHONPYCACHEPREFIX (this machine
sets PYTHONDONTWRITEBYTECODE; an installed provision has its .pyc files). `--before DIR` runs every provision row a second time with PYTHONPATH=DIR (another
checkout, e.g. main): before and after in the same round.

Then a least-squares fit over the sizes: wall and CLI CPU = fixed + per-host * N, and the host
side's CPU per host. Ratios against the issue's goals are printed with met/MISSED.
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
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._sandbox import provision_argv, ssh_port, up_hosts  # noqa: E402
from provision.sandbox.hosts import Sandbox  # noqa: E402

FLOOR = r"""
import sys
import fabric, paramiko
addr, port, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
c = fabric.Connection(addr, user="root", port=port, connect_kwargs={"key_filename": [key], "allow_agent": False,
                      "look_for_keys": False}, config=fabric.Config(overrides={"load_ssh_configs": False}))
c.client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
r = c.run("python3 -c pass", hide=True)
c.close()
sys.exit(r.exited)
"""


def run(argv: list[str], env: dict) -> dict:
    """One child: wall, its CPU (and its children's), exit code, stdout. Run from / (a `python -c`
    child puts its working directory first on sys.path, which must not pick the tree)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
                            cwd="/")
    chunks: dict = {"out": [], "err": []}
    ts = [threading.Thread(target=lambda k, f: chunks[k].append(f.read()), args=(k, f))
          for k, f in (("out", proc.stdout), ("err", proc.stderr))]
    for t in ts:
        t.start()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    for t in ts:
        t.join()
    return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "rc": os.waitstatus_to_exitcode(status),
            "out": b"".join(chunks["out"]).decode(errors="replace"),
            "err": b"".join(chunks["err"]).decode(errors="replace")}


# In a child with the tree's PYTHONPATH: run one no-op through the CLI in-process and print the
# host-side command and the stdin it sends once the host has the bundle (hit), as JSON.
CAPTURE = r"""
import json, sys
from click.testing import CliRunner
from provision.control.transport import base
from provision.cli.main import main
rec = {}
orig = base.Transport._exec
def spy(self, command, stdin, timeout, on_line, started, **kw):
    then = kw.get("then")
    rec["cmd"], rec["stdin"] = command, (stdin + (then("hit") if then else b"")).hex()
    return orig(self, command, stdin, timeout, on_line, started, **kw)
base.Transport._exec = spy
CliRunner().invoke(main, sys.argv[1:])
print(json.dumps(rec))
"""
HOST_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}


def agent_cpu(host, cmd: str, stdin: bytes, runs: int) -> tuple[float, float, int]:
    """The host-side step alone, replayed inside the host (nsenter, no SSH): median CPU and wall,
    and the bytes a call sends (command line + stdin)."""
    import resource

    cpus, walls = [], []
    for _ in range(runs):
        r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        p = subprocess.run(host.nsenter_argv() + ["/bin/sh", "-c", cmd], input=stdin, capture_output=True,
                           env=HOST_ENV)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        walls.append(time.perf_counter() - t0)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        if cmd.startswith("python3 -S -c '") and b'"verdict": "unchanged"' not in p.stdout:
            print(f"  warning: replay did not answer unchanged: {p.stdout[-200:]!r} {p.stderr[-300:]!r}")
    return statistics.median(cpus), statistics.median(walls), len(cmd.encode()) + len(stdin)


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x: (a, b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def ini_inventory(path: Path, host, box: Sandbox) -> Path:
    path.write_text(
        f"[gpus]\n{host.name} ansible_host={host.address} ansible_port={host.port} ansible_user=root "
        f"ansible_ssh_private_key_file={box.key_path} "
        f"ansible_ssh_common_args='-o UserKnownHostsFile={box.known_hosts_path} -o StrictHostKeyChecking=yes'\n")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,16,32")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--forks", type=int, default=64)
    ap.add_argument("--before", help="another checkout of provision to measure in the same rounds (e.g. /work/main)")
    opts = ap.parse_args()
    sizes = sorted({int(x) for x in opts.sizes.split(",")} | {1})
    problems = Sandbox.check_prereqs()
    if problems:
        print("cannot run the sandbox here: " + "; ".join(problems))
        return 0
    port = ssh_port()
    box = Sandbox(tempfile.mkdtemp(prefix="/tmp/bench-scale-"), owner_pid=os.getpid())
    work = Path(tempfile.mkdtemp(prefix="bench-scale-work-"))
    trees = {"after": str(ROOT)}
    if opts.before:
        trees = {"before": str(Path(opts.before).resolve()), **trees}
    try:
        t0 = time.monotonic()
        hosts = up_hosts(box, [f"bs{i:02d}" for i in range(1, max(sizes) + 1)], 2, port, net="127.0.4")
        print(f"built {len(hosts)} hosts in {time.monotonic() - t0:.1f} s (load average {os.getloadavg()[0]:.1f})")
        # compiled modules cached as an installed package has them (this machine may set
        # PYTHONDONTWRITEBYTECODE; a pip-installed provision has its .pyc files)
        base_env = dict(os.environ, PROVISION_JOURNAL=str(work / "journal.jsonl"), PROVISION_LOCK=str(work / "lock"),
                        PYTHONPYCACHEPREFIX=str(work / "pyc"))
        base_env.pop("PYTHONDONTWRITEBYTECODE", None)
        envs = {t: dict(base_env, PYTHONPATH=p) for t, p in trees.items()}
        conn = ["--ssh-config", str(box.ssh_config_path), "--identity", str(box.key_path),
                "--known-hosts", str(box.known_hosts_path), "--forks", str(opts.forks)]
        invs = {n: box.write_inventory(work / f"inv{n}.yaml", [h.name for h in hosts[:n]]) for n in sizes}
        ini = ini_inventory(work / "hosts.ini", hosts[0], box)
        cli = provision_argv()
        rows: dict[str, tuple[list[str], int]] = {"--host": (["patch", *conn, "--host", hosts[0].name], 1)}
        if shutil.which("ansible-inventory"):
            rows["-i ini"] = (["patch", *conn, "-i", str(ini)], 1)
        for n in sizes:
            rows[f"-i {n}"] = (["patch", *conn, "-i", str(invs[n])], n)
        first = run(cli + ["patch", *conn, "-i", str(invs[max(sizes)]), "--json"], envs["after"])
        if first["rc"] not in (0, 2):
            raise SystemExit(f"first patch failed (exit {first['rc']}): {first['err'][-600:]}")
        for t, env in envs.items():  # warm-up: caches (ansible-inventory's, the hosts' bundles) filled once
            for argv, _ in rows.values():
                run(cli + argv + ["--json"], env)
        results: dict = {}
        for r in range(opts.runs):
            f = run([sys.executable, "-c", FLOOR, hosts[0].address, str(port), str(box.key_path)], base_env)
            results.setdefault("floor", []).append({**f, "host": 0.0})
            for t, env in envs.items():
                for name, (argv, n) in rows.items():
                    res = run(cli + argv + ["--json"], env)
                    try:
                        verdicts = {h["verdict"] for h in json.loads(res["out"])["hosts"]}
                    except (ValueError, KeyError, TypeError):
                        verdicts = {f"exit {res['rc']}"}
                    if verdicts != {"unchanged"}:
                        print(f"  warning: {t} {name}: {sorted(verdicts)} {res['err'][-300:]}")
                    results.setdefault((t, name), []).append(res)
            print(f"  round {r + 1}/{opts.runs} done (load average {os.getloadavg()[0]:.1f})")
        agent = {}
        for t, env in envs.items():
            cap = run([sys.executable, "-c", CAPTURE, *rows["--host"][0]], env)
            rec = json.loads(cap["out"].strip().splitlines()[-1])
            agent[t] = agent_cpu(hosts[0], rec["cmd"], bytes.fromhex(rec["stdin"]), opts.runs)
        agent["python3 -S -c pass"] = agent_cpu(hosts[0], "python3 -S -c pass", b"", opts.runs)
    finally:
        box.down()
        shutil.rmtree(work, ignore_errors=True)

    med = statistics.median

    def m(key, what="wall"):
        return med(x[what] for x in results[key])

    print(f"\nmedians of {opts.runs} rounds, --forks {opts.forks}, {os.cpu_count()} CPUs, "
          f"load average now {os.getloadavg()[0]:.1f}")
    print(f"{'row':<22}{'wall s':>8}{'CLI CPU s':>11}")
    print(f"{'floor (bare Fabric)':<22}{m('floor'):>8.3f}{m('floor', 'cpu'):>11.3f}")
    for t in trees:
        for name, (_, n) in rows.items():
            k = (t, name)
            print(f"{(t + ' ' + name):<22}{m(k):>8.3f}{m(k, 'cpu'):>11.3f}")
    print("\nthe host-side step alone (replayed inside the host, no SSH): CPU, wall, bytes sent per call")
    for what, (cpu, wall, sent) in agent.items():
        print(f"  {what:<22}{1000 * cpu:>6.0f} ms CPU {1000 * wall:>6.0f} ms wall {sent:>8} B")
    for t in trees:
        print(f"\n[{t}]")
        goals = []
        host1 = m((t, "--host"))
        goals.append(("no-op --host / bare Fabric floor", host1 / m("floor"), 1.2))
        if "-i ini" in rows:
            goals.append(("-i static Ansible INI / --host", m((t, "-i ini")) / host1, 1.1))
        if 16 in sizes:
            goals.append(("16 hosts / 1 host (same YAML)", m((t, "-i 16")) / m((t, "-i 1")), 2.5))
        goals.append(("  the same in CLI CPU: --host / floor", m((t, "--host"), "cpu") / m("floor", "cpu"), 1.2))
        if "-i ini" in rows:
            goals.append(("  the same in CLI CPU: -i ini / --host", m((t, "-i ini"), "cpu") / m((t, "--host"), "cpu"),
                          1.1))
        for what, ratio, goal in goals:
            print(f"  {what:<40} {ratio:5.2f}  (goal <= {goal}: {'met' if ratio <= goal else 'MISSED'})")
        xs = [float(n) for n in sizes]
        a_w, b_w = fit(xs, [m((t, f"-i {n}")) for n in sizes])
        a_c, b_c = fit(xs, [m((t, f"-i {n}"), "cpu") for n in sizes])
        print(f"  fit: wall = {a_w:.3f} + {1000 * b_w:.1f} ms x N; CLI CPU = {a_c:.3f} + {1000 * b_c:.1f} ms x N")
        if 16 in sizes:
            per = (m((t, "-i 16"), "cpu") - m((t, "-i 1"), "cpu")) / 15
            print(f"  CLI CPU per extra host, 1 -> 16: {1000 * per:.1f} ms (goal <= 15: {'met' if per <= 0.015 else 'MISSED'})")
        hc = agent[t][0]
        print(f"  host CPU per no-op call (the step alone): {1000 * hc:.0f} ms (goal <= 80: "
              f"{'met' if hc <= 0.08 else 'MISSED'}); {agent[t][2]} B sent per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
