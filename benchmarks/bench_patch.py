"""Time `provision patch` on 1 and 16 sandbox hosts, count SSH work, compare with Ansible.

    python3 benchmarks/bench_patch.py [--runs 5] [--hosts 16] [--first-address 127.0.2.200]
                                      [--no-ansible] [--ansible-venv /tmp/ansible-venv]

Needs root (the sandbox: real sshd in namespaces, see provision/sandbox/hosts.py).
Hosts get free loopback addresses from 127.0.2.<first>.. (checked by binding), a base
dir under /tmp, and are torn down at the end (also on error or Ctrl-C).

Measures (medians; every run is the real CLI as a subprocess, `-i <inventory>`):
  * `provision --help` start-up (and the heaviest imports, from `python -X importtime`)
  * "first patch" (hosts pristine) and "no-op" (already patched) on 1 host and on N hosts:
    --runs cycles of reset SGLang -> first patch -> no-op
  * per-host SSH connections and remote commands (provision.control.transport.ssh.STATS, read from one
    in-process run through click's CliRunner, since the CLI subprocess keeps its own)
  * the same edit the Ansible way (ansible.builtin.blockinfile + validate py_compile),
    no-op ansible-playbook vs no-op provision patch on the same host
Targets (benchmarks only, never asserted in tests):
  one connection per host; at most 2 remote commands per host (1 expected);
  N hosts < 2.5x the wall time of 1 host; provision no-op < 1/4 of Ansible's no-op.
Always exits 0; a missed target is printed as MISSED.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from provision.sandbox.hosts import Sandbox  # noqa: E402

MODEL_FILE = "/root/sglang/python/sglang/srt/models/kimi_k25.py"
CLASS = "KimiK25ForConditionalGeneration"
METHODS = ("set_eagle3_layers_to_capture", "get_embed_and_head", "set_embed_and_head")


# --------------------------------------------------------------------------- helpers

from _sandbox import free_addresses, provision_argv, ssh_port, up_hosts  # noqa: E402,F401


LAST_CPU = {"cli": 0.0, "machine": 0.0}


def cpu_busy_seconds() -> float:
    """CPU-seconds the whole machine has been busy (all cores), from /proc/stat."""
    with open("/proc/stat") as fh:
        vals = [int(x) for x in fh.readline().split()[1:]]
    return (sum(vals) - vals[3] - vals[4]) / os.sysconf("SC_CLK_TCK")


def timed(argv: list[str], **kw) -> tuple[float, subprocess.CompletedProcess]:
    """Wall time of one child; its user+sys CPU and the machine's busy CPU go to LAST_CPU."""
    r0, m0 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_busy_seconds()
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kw)
    wall = time.perf_counter() - t0
    r1, m1 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_busy_seconds()
    LAST_CPU["cli"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    LAST_CPU["machine"] = m1 - m0
    return wall, proc


def verdicts(out: str, names: list[str]) -> dict[str, str]:
    """host -> verdict from provision's plain output (`host  verdict  ...` lines)."""
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in names and parts[0] not in found:
            found[parts[0]] = parts[1]
    return found


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def verdict_word(ok: bool) -> str:
    return "met" if ok else "MISSED"


def class_methods(host) -> list[str]:
    """Names of the methods defined in the wrapper class, as the host's python parses the file."""
    code = (f"import ast;t=ast.parse(open({MODEL_FILE!r}).read());"
            f"c=[n for n in t.body if isinstance(n,ast.ClassDef) and n.name=={CLASS!r}][0];"
            "print(' '.join(f.name for f in c.body if isinstance(f,ast.FunctionDef)))")
    return host.run(["/usr/bin/python3", "-c", code]).stdout.split()


# --------------------------------------------------------------------------- parts

def bench_startup(runs: int) -> dict:
    times = []
    for _ in range(runs):
        t, p = timed(provision_argv() + ["--help"])
        if p.returncode != 0:
            return {"error": p.stderr.strip()[-300:]}
        times.append(t)
    via_path = []
    exe = shutil.which("provision")
    if exe and Path(exe).resolve() != Path(provision_argv()[0]).resolve():
        for _ in range(runs):
            via_path.append(timed([exe, "--help"])[0])
    imp = subprocess.run([sys.executable, "-X", "importtime", "-c", "import provision.cli.main"],
                         capture_output=True, text=True)
    rows = []
    for line in imp.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+)\s+\|\s+(\d+)\s+\|(\s*)(\S+)", line)
        if m:
            rows.append((int(m.group(2)), len(m.group(3)), m.group(4)))
    total = next((c for c, _, name in rows if name == "provision.cli.main"), None)
    top = sorted((r for r in rows if r[1] <= 3 and not r[2].startswith("provision.cli.main")), reverse=True)[:5]
    return {"median": med(times), "times": times, "import_total_ms": (total or 0) / 1000,
            "via_path": (exe, med(via_path)) if via_path else None,
            "top": [(name, c / 1000) for c, _, name in top]}


def bench_cli(groups: dict, runs: int) -> dict:
    """groups: label -> (inventory, hosts). Each cycle: reset every group's hosts, then the
    first patch of each group in turn, then the no-op of each group in turn (interleaved, so
    a drift in this shared machine's load hits all groups alike)."""
    out = {g: {"first_all": [], "noop_all": [], "cpu_first": [], "cpu_noop": [], "machine_first": [],
               "machine_noop": [], "bad": []} for g in groups}
    for _ in range(runs):
        for _, hosts in groups.values():
            for h in hosts:
                h.reset_sglang()
        for label, want in (("first", "patched"), ("noop", "unchanged")):
            for g, (inv, hosts) in groups.items():
                names = [h.name for h in hosts]
                t, p = timed(provision_argv() + ["patch", "-i", str(inv)])
                r = out[g]
                r[f"{label}_all"].append(t)
                r[f"cpu_{label}"].append(LAST_CPU["cli"])
                r[f"machine_{label}"].append(LAST_CPU["machine"])
                got = verdicts(p.stdout, names)
                if p.returncode != 0 or set(got.values()) != {want} or len(got) != len(names):
                    r["bad"].append(f"{g} {label}: exit {p.returncode}, verdicts {sorted(set(got.values()))}, "
                                    f"{p.stderr.strip()[-200:]}")
    for r in out.values():
        r["first"], r["noop"] = med(r["first_all"]), med(r["noop_all"])
        for k in ("cpu_first", "cpu_noop", "machine_first", "machine_noop"):
            r[k] = med(r[k])
    return out


def count_in_process(inv: Path, hosts) -> dict:
    """provision.control.transport.ssh.STATS per host for one first patch and one no-op, run in this process."""
    from click.testing import CliRunner

    from provision.control.transport import ssh
    from provision.cli.main import main

    for h in hosts:
        h.reset_sglang()
    out = {}
    for label in ("first", "noop"):
        ssh.STATS.connections = 0
        ssh.STATS.commands = 0
        t0 = time.perf_counter()
        res = CliRunner().invoke(main, ["patch", "-i", str(inv)])
        out[label] = {"conn": ssh.STATS.connections / len(hosts), "cmds": ssh.STATS.commands / len(hosts),
                      "exit": res.exit_code, "wall": time.perf_counter() - t0}
    return out


def breakdown(inv: Path, host, runs: int) -> dict:
    """Where one host's no-op goes: SSH open vs the remote call (in-process), and the remote
    agent alone (the same request replayed inside the host with nsenter: no SSH)."""
    from click.testing import CliRunner

    from provision.control.transport import ssh
    from provision.cli.main import main
    from provision.config.inventory import load_inventory
    from provision.tasks.patch import request_for
    from provision.config.playbook import load_patch_spec
    from provision.host.bootstrap import BOOTSTRAP
    from provision.control.transport.bundle import payload

    opens, calls, totals = [], [], []
    orig_open, orig_call = ssh.Session.open, ssh.Session.call

    def open_(self):
        t = time.perf_counter()
        try:
            return orig_open(self)
        finally:
            opens.append(time.perf_counter() - t)

    def call(self, *a, **kw):
        t = time.perf_counter()
        try:
            return orig_call(self, *a, **kw)
        finally:
            calls.append(time.perf_counter() - t)

    ssh.Session.open, ssh.Session.call = open_, call
    try:
        for _ in range(runs):
            t = time.perf_counter()
            CliRunner().invoke(main, ["patch", "-i", str(inv)])
            totals.append(time.perf_counter() - t)
    finally:
        ssh.Session.open, ssh.Session.call = orig_open, orig_call
    h = load_inventory(str(inv)).hosts[0]
    data = payload(request_for("patch", h, load_patch_spec(h.get("spec"))))
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}

    def replay(argv, stdin=b""):
        walls, cpus = [], []
        for _ in range(runs):
            r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            subprocess.run(host.nsenter_argv() + argv, input=stdin, capture_output=True, env=env)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            walls.append(time.perf_counter() - t0)
            cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        return med(walls), med(cpus)

    agent = replay(["/usr/bin/python3", "-c", BOOTSTRAP], data)
    bare = replay(["/usr/bin/python3", "-c", "pass"])
    return {"inproc": med(totals), "open": med(opens), "call": med(calls), "agent": agent, "bare": bare,
            "payload_kb": len(data) / 1024}


def ansible_inventory(path: Path, host, box: Sandbox) -> None:
    common = f"-o UserKnownHostsFile={box.known_hosts_path} -o StrictHostKeyChecking=yes"
    path.write_text(textwrap.dedent(f"""\
        all:
          hosts:
            {host.name}:
              ansible_host: {host.address}
              ansible_port: {host.port}
              ansible_user: root
              ansible_ssh_private_key_file: {box.key_path}
              ansible_ssh_common_args: "{common}"
              ansible_python_interpreter: /usr/bin/python3
        """))


PLAYBOOK = """\
# The same edit the Ansible way: the three EAGLE-3 delegation methods, inside the class
# (indented 4 spaces, inserted before `EntryClass`), the result checked with py_compile.
- name: EAGLE-3 delegation for Kimi-K2.5
  hosts: all
  gather_facts: {facts}
  tasks:
    - name: delegation methods in {cls}
      ansible.builtin.blockinfile:
        path: {path}
        insertbefore: "^EntryClass"
        marker: "    # {{mark}} ANSIBLE MANAGED BLOCK"
        validate: "/usr/bin/python3 -m py_compile %s"
        block: |2
              def set_eagle3_layers_to_capture(self, layer_ids=None):
                  return self.language_model.set_eagle3_layers_to_capture(layer_ids)

              def get_embed_and_head(self):
                  return self.language_model.get_embed_and_head()

              def set_embed_and_head(self, embed, head):
                  return self.language_model.set_embed_and_head(embed, head)
"""


def recap_changed(out: str) -> int | None:
    m = re.search(r"ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", out)
    if not m or m.group(2) != "0" or m.group(3) != "0":
        return None
    return int(m.group(1))


def provision_noops(host, inv: Path, runs: int, res: dict) -> list[float]:
    """Pristine -> provision patch -> `runs` timed no-ops (verdict checked)."""
    host.reset_sglang()
    t_first, _ = timed(provision_argv() + ["patch", "-i", str(inv)])
    res.setdefault("provision_first", t_first)
    times = []
    for _ in range(runs):
        t, p = timed(provision_argv() + ["patch", "-i", str(inv)])
        if verdicts(p.stdout, [host.name]).get(host.name) != "unchanged":
            res.setdefault("errors", []).append(f"provision no-op verdict: {p.stdout.strip()[-200:]}")
        times.append(t)
        res.setdefault("provision_cpu", []).append(LAST_CPU["cli"])
    return times


def bench_ansible(venv: Path, work: Path, host, box: Sandbox, inv: Path, runs: int) -> dict:
    """No-op ansible-playbook vs no-op provision patch on the same host.

    The two cannot both be no-ops on one file at once, so the host alternates between
    blocks: provision x runs, each Ansible variant x runs, provision x runs again (the
    provision figure is the median of both blocks, to even out this machine's drifting load).
    """
    res: dict = {}
    play = venv / "bin" / "ansible-playbook"
    if not play.exists():
        t0 = time.perf_counter()
        r = subprocess.run(f"{sys.executable} -m venv {venv} && {venv}/bin/pip install -q ansible-core",
                           shell=True, capture_output=True, text=True)
        if r.returncode != 0 or not play.exists():
            return {"skipped": "ansible-core install failed: " + (r.stderr.strip().splitlines() or ["?"])[-1]}
        res["install_s"] = time.perf_counter() - t0
    ver = subprocess.run([str(play), "--version"], capture_output=True, text=True).stdout.splitlines()
    res["version"] = ver[0] if ver else "?"
    aw = work / "ansible"
    aw.mkdir(exist_ok=True)
    ainv = aw / "hosts.yaml"
    ansible_inventory(ainv, host, box)
    env = {**os.environ, "ANSIBLE_HOME": str(aw / "home"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_RETRY_FILES_ENABLED": "false", "ANSIBLE_LOCAL_TEMP": str(aw / "tmp"),
           "ANSIBLE_HOST_KEY_CHECKING": "true", "ANSIBLE_DEPRECATION_WARNINGS": "false"}
    env.pop("ANSIBLE_CONFIG", None)
    variants = [("ansible default (no facts)", False, {}),
                ("ansible + pipelining", False, {"ANSIBLE_PIPELINING": "true"}),
                ("ansible + gather_facts", True, {})]
    prov = provision_noops(host, inv, runs, res)
    try:
        for label, facts, extra in variants:
            pb = aw / f"patch-{'facts' if facts else 'nofacts'}.yaml"
            pb.write_text(PLAYBOOK.format(facts=str(facts).lower(), cls=CLASS, path=MODEL_FILE))
            host.reset_sglang()
            argv = [str(play), "-i", str(ainv), str(pb)]
            t_first, p = timed(argv, env={**env, **extra}, cwd=aw)
            if recap_changed(p.stdout) != 1:
                res.setdefault("errors", []).append(f"{label}: first run not changed=1: "
                                                    f"{(p.stdout + p.stderr).strip()[-400:]}")
                continue
            methods = class_methods(host)
            if not all(m in methods for m in METHODS):
                res.setdefault("errors", []).append(f"{label}: methods not in the class after the run")
            times, cpus = [], []
            n = runs if not facts else max(3, runs - 2)
            for _ in range(n):
                t, p = timed(argv, env={**env, **extra}, cwd=aw)
                if recap_changed(p.stdout) != 0:
                    res.setdefault("errors", []).append(f"{label}: no-op run not changed=0")
                times.append(t)
                cpus.append(LAST_CPU["cli"])
            res.setdefault("variants", []).append({"label": label, "first": t_first, "noop": med(times),
                                                   "noop_all": times, "runs": n, "cpu": med(cpus)})
    finally:
        # ControlPersist masters outlive ansible-playbook: close the ones we started.
        cp = aw / "home" / "cp"
        for sock in cp.glob("*") if cp.is_dir() else []:
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True)
    prov += provision_noops(host, inv, runs, res)
    res["provision_noop"] = med(prov)
    res["provision_noop_all"] = prov
    return res


# --------------------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--first-address", type=int, default=200, help="last octet to start at in 127.0.2.x")
    ap.add_argument("--no-ansible", action="store_true")
    ap.add_argument("--ansible-venv", default="/tmp/ansible-venv")
    args = ap.parse_args()

    problems = Sandbox.check_prereqs()
    if problems:
        print("sandbox unavailable: " + "; ".join(problems))
        return 0
    t_all = time.perf_counter()
    load0 = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-patch-", dir="/tmp"))
    # provision journals every change (provision/journal.py): keep benchmark runs out of the real one
    os.environ["PROVISION_JOURNAL"] = str(work / "journal.jsonl")
    box = Sandbox(work / "box", owner_pid=os.getpid())
    try:
        st = bench_startup(args.runs)
        port = ssh_port()
        # bp01 alone for the 1-host runs (and Ansible), bp02.. for the N-host runs
        names = [f"bp{i:02d}" for i in range(1, args.hosts + 2)]
        t0 = time.perf_counter()
        hosts = up_hosts(box, names, args.first_address, port)
        print(f"{len(hosts)} sandbox hosts up in {time.perf_counter() - t0:.1f} s "
              f"({hosts[0].address}..{hosts[-1].address}:{port})", file=sys.stderr)
        inv1 = box.write_inventory(work / "inv-1.yaml", names[:1])
        invn = box.write_inventory(work / f"inv-{args.hosts}.yaml", names[1:])

        res = bench_cli({"one": (inv1, hosts[:1]), "many": (invn, hosts[1:])}, args.runs)
        one, many = res["one"], res["many"]
        counts = count_in_process(invn, hosts[1:])
        split = breakdown(inv1, hosts[0], args.runs)
        ans = None if args.no_ansible else bench_ansible(Path(args.ansible_venv), work, hosts[0], box, inv1,
                                                          args.runs)
    finally:
        box.down()
        shutil.rmtree(work, ignore_errors=True)

    n = args.hosts
    print(f"\nprovision patch benchmark ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, "
          f"load avg {load0:.1f} -> {os.getloadavg()[0]:.1f}, sglang 0.5.9 source layout, median of {args.runs})")
    fmt = "  {:<44} {:>10}  {}"
    print(fmt.format("measurement", "value", "target"))
    if "error" in st:
        print(fmt.format("provision --help", "ERROR", st["error"]))
    else:
        print(fmt.format("provision --help start-up", f"{st['median']:.3f} s", provision_argv()[0]))
        if st.get("via_path"):
            print(fmt.format("  same, via PATH", f"{st['via_path'][1]:.3f} s", st["via_path"][0]))
        print(fmt.format("  import provision.cli.main (-X importtime)", f"{st['import_total_ms']:.0f} ms",
                         "heaviest: " + ", ".join(f"{k} {v:.0f} ms" for k, v in st["top"])))
    print(fmt.format("patch, 1 host, first patch", f"{one['first']:.3f} s", f"(min {min(one['first_all']):.3f} s)"))
    print(fmt.format("patch, 1 host, no-op", f"{one['noop']:.3f} s", f"(min {min(one['noop_all']):.3f} s)"))
    for key, label in (("first", "first patch"), ("noop", "no-op")):
        ratio = many[key] / one[key]
        best = min(many[f"{key}_all"]) / min(one[f"{key}_all"])
        print(fmt.format(f"patch, {n} hosts, {label}", f"{many[key]:.3f} s",
                         f"< 2.5x 1 host: {ratio:.2f}x {verdict_word(ratio < 2.5)} "
                         f"(min {min(many[f'{key}_all']):.3f} s, min/min {best:.2f}x)"))
    for tag, r in (("1 host", one), (f"{n} hosts", many)):
        print(fmt.format(f"CLI CPU (user+sys), {tag}, first / no-op",
                         f"{r['cpu_first']:.2f}/{r['cpu_noop']:.2f} s",
                         f"machine busy meanwhile {r['machine_first']:.1f}/{r['machine_noop']:.1f} CPU-s "
                         f"(sandbox sshd + remote python share these {os.cpu_count()} CPUs)"))
    for label in ("first", "noop"):
        c = counts[label]
        print(fmt.format(f"SSH connections / host ({label}, in-process)", f"{c['conn']:.2f}",
                         f"== 1: {verdict_word(c['conn'] == 1)}"))
        print(fmt.format(f"remote commands / host ({label}, in-process)", f"{c['cmds']:.2f}",
                         f"<= 2 (expect 1): {verdict_word(c['cmds'] <= 2)}"
                         + (f"  [exit {c['exit']}]" if c["exit"] else "")))
    print(fmt.format(f"  in-process wall, {n} hosts first / no-op",
                     f"{counts['first']['wall']:.2f}/{counts['noop']['wall']:.2f} s", "(no interpreter start-up)"))
    print(fmt.format("1-host no-op, in-process (no start-up)", f"{split['inproc']:.3f} s",
                     f"SSH open {split['open']:.3f} s + remote call {split['call']:.3f} s"))
    print(fmt.format("  remote agent alone (nsenter, no SSH)", f"{split['agent'][0]:.3f} s",
                     f"{split['agent'][1]:.2f} CPU-s on the host; bare python3 -c pass "
                     f"{split['bare'][0]:.3f} s / {split['bare'][1]:.2f} CPU-s; stdin {split['payload_kb']:.0f} KiB"))
    for b in one["bad"] + many["bad"]:
        print("  WARNING: unexpected outcome: " + b)
    if ans is not None:
        if "skipped" in ans:
            print(fmt.format("ansible comparison", "SKIPPED", ans["skipped"]))
        else:
            pn = ans["provision_noop"]
            print(fmt.format("provision patch no-op (same host)", f"{pn:.3f} s",
                             f"n={len(ans['provision_noop_all'])}; control-side CPU {med(ans['provision_cpu']):.2f} s; "
                             f"vs {ans.get('version', 'ansible')}"))
            for v in ans.get("variants", []):
                ratio = pn / v["noop"]
                print(fmt.format(v["label"][:44], f"{v['noop']:.3f} s",
                                 f"provision/ansible {ratio:.2f} (< 0.25: {verdict_word(ratio < 0.25)}); "
                                 f"control-side CPU {v['cpu']:.2f} s; first run {v['first']:.2f} s; n={v['runs']}"))
            for e in ans.get("errors", []):
                print("  WARNING: " + e)
    print(f"  raw: 1-host first {fmt_list(one['first_all'])} no-op {fmt_list(one['noop_all'])}; "
          f"{n}-host first {fmt_list(many['first_all'])} no-op {fmt_list(many['noop_all'])}")
    print(f"total benchmark time {time.perf_counter() - t_all:.0f} s")
    return 0


def fmt_list(xs) -> str:
    return "[" + " ".join(f"{x:.2f}" for x in xs) + "]"


if __name__ == "__main__":
    sys.exit(main())
