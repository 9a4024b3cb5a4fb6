"""No-op `provision patch --host` against Ansible's blockinfile no-op, as ratios inside each round.

    python3 benchmarks/bench_ansible_ratio.py [--runs 5]

Needs root (the sandbox) and ansible-core (`ansible`, `ansible-playbook` on PATH: a test extra).
Two 0.5.9 source-checkout hosts: provision patches host A, Ansible's blockinfile (the same three
methods, validated with py_compile: bench_patch.PLAYBOOK) host B, so both stay no-ops and can be
interleaved. Per round, one after the other:

  floor       the bare Fabric floor (bench_scale.FLOOR: import fabric, connect to A, `python3 -c pass`)
  provision   no-op `provision patch --host A` (the CLI as a user runs it, .pyc files kept)
  playbook    no-op `ansible-playbook` with blockinfile on B (gather_facts: false, a tuned playbook)
  playbook+facts  the same playbook as Ansible runs it by default (gather_facts left on: the setup
              module runs first, as in any play that does not turn it off)
  ad-hoc      no-op `ansible B -m ansible.builtin.blockinfile -a JSON` (the same arguments)

Wall and control-side CPU (user+sys of the child and its children) per row; the ratio
provision / Ansible is taken inside each round, and printed as the median and the range over
the rounds (goal: <= 0.15), next to the floor's own ratio. Ansible keeps its default OpenSSH
ControlPersist master between rounds (closed at the end). Always exits 0.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from benchmarks._sandbox import provision_argv, ssh_port, up_hosts  # noqa: E402
from bench_patch import CLASS, MODEL_FILE, PLAYBOOK, ansible_inventory, recap_changed  # noqa: E402
from bench_scale import FLOOR, run  # noqa: E402
from provision.sandbox.hosts import Sandbox  # noqa: E402

BLOCK = """    def set_eagle3_layers_to_capture(self, layer_ids=None):
        return self.language_model.set_eagle3_layers_to_capture(layer_ids)

    def get_embed_and_head(self):
        return self.language_model.get_embed_and_head()

    def set_embed_and_head(self, embed, head):
        return self.language_model.set_embed_and_head(embed, head)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    opts = ap.parse_args()
    if not (shutil.which("ansible") and shutil.which("ansible-playbook")):
        print("ansible-core is not installed (ansible, ansible-playbook): nothing measured")
        return 0
    problems = Sandbox.check_prereqs()
    if problems:
        print("cannot run the sandbox here: " + "; ".join(problems))
        return 0
    port = ssh_port()
    box = Sandbox(tempfile.mkdtemp(prefix="/tmp/bench-ansible-"), owner_pid=os.getpid())
    work = Path(tempfile.mkdtemp(prefix="bench-ansible-work-"))
    try:
        a, b = up_hosts(box, ["ba01", "ba02"], 60, port, net="127.0.5")
        env = dict(os.environ, PROVISION_JOURNAL=str(work / "journal.jsonl"), PROVISION_LOCK=str(work / "lock"),
                   PYTHONPYCACHEPREFIX=str(work / "pyc"), PYTHONPATH=str(ROOT))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        aw = work / "ansible"
        aw.mkdir()
        aenv = dict(env, ANSIBLE_HOME=str(aw / "home"), ANSIBLE_NOCOLOR="1", ANSIBLE_RETRY_FILES_ENABLED="false",
                    ANSIBLE_LOCAL_TEMP=str(aw / "tmp"), ANSIBLE_HOST_KEY_CHECKING="true",
                    ANSIBLE_DEPRECATION_WARNINGS="false")
        aenv.pop("ANSIBLE_CONFIG", None)
        ainv = aw / "hosts.yaml"
        ansible_inventory(ainv, b, box)
        play = aw / "patch.yaml"
        play.write_text(PLAYBOOK.format(facts="false", cls=CLASS, path=MODEL_FILE))
        play_facts = aw / "patch-facts.yaml"
        play_facts.write_text(PLAYBOOK.format(facts="true", cls=CLASS, path=MODEL_FILE))
        args = {"path": MODEL_FILE, "insertbefore": "^EntryClass", "marker": "    # {mark} ANSIBLE MANAGED BLOCK",
                "validate": "/usr/bin/python3 -m py_compile %s", "block": BLOCK}
        conn = ["--ssh-config", str(box.ssh_config_path), "--identity", str(box.key_path),
                "--known-hosts", str(box.known_hosts_path)]
        rows = {
            "floor": ([sys.executable, "-c", FLOOR, a.address, str(port), str(box.key_path)], env),
            "provision": (provision_argv() + ["patch", *conn, "--host", a.name, "--json"], env),
            "playbook": (["ansible-playbook", "-i", str(ainv), str(play)], aenv),
            "playbook+facts": (["ansible-playbook", "-i", str(ainv), str(play_facts)], aenv),
            "ad-hoc": (["ansible", "-i", str(ainv), b.name, "-m", "ansible.builtin.blockinfile", "-a",
                        json.dumps(args)], aenv),
        }
        first = {k: run(argv, e) for k, (argv, e) in rows.items()}   # the first patch; the caches filled
        if first["provision"]["rc"] not in (0, 2) or recap_changed(first["playbook"]["out"]) != 1:
            raise SystemExit(f"first runs failed: {first['provision']['err'][-300:]} {first['playbook']['out'][-300:]}")
        results: dict = {k: [] for k in rows}
        for r in range(opts.runs):
            for k, (argv, e) in rows.items():
                res = run(argv, e)
                if k == "floor":
                    ok = res["rc"] == 0
                elif k == "provision":
                    ok = {h["verdict"] for h in json.loads(res["out"] or "{}").get("hosts", [])} == {"unchanged"}
                elif k.startswith("playbook"):
                    ok = recap_changed(res["out"]) == 0
                else:
                    ok = res["rc"] == 0 and '"changed": false' in res["out"]
                if not ok:
                    print(f"  warning: {k} was not a no-op: {(res['out'] + res['err'])[-300:]}")
                results[k].append(res)
            print(f"  round {r + 1}/{opts.runs} done (load average {os.getloadavg()[0]:.1f})")
    finally:
        # ControlPersist masters (Ansible's default) outlive ansible: close the ones it started.
        cp = aw / "home" / "cp" if "aw" in locals() else None
        for sock in cp.glob("*") if cp is not None and cp.is_dir() else []:
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True)
        box.down()
        shutil.rmtree(work, ignore_errors=True)

    ver = subprocess.run(["ansible", "--version"], capture_output=True, text=True).stdout.splitlines()
    print(f"\nmedians of {opts.runs} rounds ({time.strftime('%Y-%m-%d %H:%M')}), {ver[0] if ver else 'ansible'}, "
          f"2 hosts, load average now {os.getloadavg()[0]:.1f}")
    print(f"{'row':15} {'wall s':>8} {'CPU s':>8}")
    for k, rs in results.items():
        print(f"{k:15} {statistics.median(x['wall'] for x in rs):8.3f} {statistics.median(x['cpu'] for x in rs):8.3f}")
    for other in ("playbook", "playbook+facts", "ad-hoc"):
        for what in ("wall", "cpu"):
            ratios = [f[what] / o[what] for f, o in zip(results["floor"], results[other])]
            print(f"  bare Fabric floor / Ansible {other} no-op, {what}: {statistics.median(ratios):.3f} "
                  f"(rounds {min(ratios):.3f}-{max(ratios):.3f}): no tool on Fabric goes below this")
    for other in ("playbook", "playbook+facts", "ad-hoc"):
        for what in ("wall", "cpu"):
            ratios = [p[what] / o[what] for p, o in zip(results["provision"], results[other])]
            med = statistics.median(ratios)
            print(f"  provision / Ansible {other} no-op, {what}: {med:.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f}; "
                  f"goal <= 0.15: {'met' if med <= 0.15 else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
