"""provision's own cost on a real start: `launch` -> ready on the real vLLM server, against the same
server started by hand, side by side, alternating.

    python3 benchmarks/bench_vllm_start.py [--rounds 3] [--first-address 220]

Needs the real-vLLM venv (.ci/run builds it: provision/sandbox/vllm_venv.py) and what the sandbox
needs. One sandbox host on a free loopback address 127.0.2.<first>.. sees the venv read-only at
/opt/vllm-env, as the real-vLLM tier's does; the tiny models are built here (vllm_models.py), so no
hub. At most one vLLM server runs at any time (about 2 GB).

  cold      `provision launch --json` (CLI start -> its exit at ready) after the host's preflight
            cache was removed: preflight asks vLLM's own parser once (one import of vLLM).
  by hand   inside the host, the argv provision recorded (`python -m vllm.entrypoints.openai.api_server
            ...`, same env) started with Popen, /health polled every 0.25 s until it answers 200;
            then its process group is stopped.
  provision `provision launch --json` again, cache warm, with the default `--poll 2` and with
            `--poll 0.5`; then `provision stop`.
Each round runs by hand, provision (poll 2), provision (poll 0.5), in that order, so a slow
moment of the machine falls on both. Target: provision's median within 2 s or 5% of the by-hand
median, whichever is larger. Always exits 0.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _sandbox import free_addresses, provision_argv, ssh_port  # noqa: E402

from provision.sandbox import vllm_venv as vv  # noqa: E402
from provision.sandbox.hosts import AddressInUse, HostSpec, Sandbox  # noqa: E402

VENV_IN_HOST = "/opt/vllm-env"
ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}

# Run inside the host: start the server as a user would, poll /health, stop its whole group.
HAND = r'''
import json, os, signal, subprocess, sys, time, urllib.request
argv, env = json.loads(sys.argv[1]), dict(os.environ, **json.loads(sys.argv[2]))
t0 = time.monotonic()
p = subprocess.Popen(argv, env=env, cwd="/root", stdout=open("/tmp/by-hand.log", "wb"), stderr=subprocess.STDOUT,
                     start_new_session=True)
ready = None
while time.monotonic() - t0 < 600 and p.poll() is None:
    try:
        if urllib.request.urlopen("http://127.0.0.1:30000/health", timeout=2).status == 200:
            ready = time.monotonic() - t0
            break
    except Exception:
        pass
    time.sleep(0.25)
os.killpg(p.pid, signal.SIGTERM)
end = time.monotonic() + 30
while time.monotonic() < end:
    try:
        os.killpg(p.pid, 0)
    except ProcessLookupError:
        break
    p.poll()
    time.sleep(0.2)
else:
    os.killpg(p.pid, signal.SIGKILL)
p.wait()
print(json.dumps({"ready": ready, "rc": p.returncode}))
'''


def playbook(path: Path) -> Path:
    m = "/data/models"
    doc = {"name": "bench-vllm", "engine": "vllm",
           "launch": {"args": {"model": f"{m}/target", "dtype": "float32", "max-model-len": 512, "enforce-eager": True,
                               "kv-cache-memory-bytes": "64M",
                               "speculative-config": {"method": "eagle3", "model": f"{m}/draft",
                                                      "num_speculative_tokens": 3}},
                      "env": ENV, "grace": 20}}
    path.write_text(json.dumps(doc))
    return path


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f}, n={len(xs)})" if xs else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--first-address", type=int, default=220)
    a = ap.parse_args()
    venv = vv.cached()
    if venv is None:
        print("SKIPPED: the real-vLLM venv is not built (python3 -c 'from provision.sandbox import vllm_venv; "
              "vllm_venv.ensure_venv(print)')")
        return 0
    base = Path(tempfile.mkdtemp(prefix="bench-vllm-start-"))
    models = base / "models"
    p = subprocess.run([str(venv / "bin" / "python"), str(Path(vv.__file__).with_name("vllm_models.py")), str(models)],
                       capture_output=True, text=True, timeout=600, cwd=str(base))
    if p.returncode != 0:
        print("SKIPPED: the tiny models were not built:", p.stderr[-2000:])
        return 0
    box = Sandbox(base / "box", owner_pid=os.getpid())
    port = ssh_port()
    try:
        for _ in range(5):
            addr = free_addresses(1, a.first_address, port)[0]
            try:
                host, = box.up([HostSpec("bv01", addr, None, "none", port, ro_binds=((VENV_IN_HOST, str(venv)),))])
                break
            except AddressInUse:
                a.first_address += 1
        shutil.copytree(models, host.hostpath("/data/models"), dirs_exist_ok=True)
        # by name through the sandbox's ssh config (its inventory's defaults carry SGLang's flag names)
        where = ["--ssh-config", str(box.ssh_config_path), "--identity", str(box.key_path),
                 "--known-hosts", str(box.known_hosts_path), "--host", host.name]
        env = dict(os.environ)
        cli = provision_argv()
        pb = playbook(base / "pb.yaml")

        def launch(poll: str) -> tuple[float | None, dict]:
            t0 = time.monotonic()
            p = subprocess.run(cli + ["launch", *where, "--playbook", str(pb), "--poll", poll,
                                      "--deadline", "600", "--json"], capture_output=True, text=True, env=env,
                               timeout=900)
            took = time.monotonic() - t0
            rec = json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text()) \
                if host.hostpath("/var/lib/provision/server/server-30000.json").exists() else {}
            r = json.loads(p.stdout)["hosts"][0] if p.stdout.strip() else {"verdict": "?", "detail": p.stderr[-500:]}
            s = subprocess.run(cli + ["stop", *where, "--playbook", str(pb)], capture_output=True, text=True,
                               env=env, timeout=300)
            if r["verdict"] != "ready" or s.returncode != 0:
                print(f"  launch: {r['verdict']} {r.get('detail')}; stop rc {s.returncode}")
                return None, rec
            return took, rec

        def by_hand(argv: list[str]) -> float | None:
            out = host.run(["python3", "-c", HAND, json.dumps(argv), json.dumps(ENV)], timeout=900, check=False)
            try:
                doc = json.loads(out.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                print("  by hand: no answer:", out.stderr[-500:])
                return None
            if doc["ready"] is None:
                print(f"  by hand: not ready (exit {doc['rc']})")
            return doc["ready"]

        host.run("rm -rf /var/lib/provision/cache", check=False)
        cold, rec = launch("2")
        argv = [x for i, x in enumerate(rec.get("argv") or [])
                if not (x == "--config" or (i and rec["argv"][i - 1] == "--config"))]
        print(f"cold launch (parser asked): {cold}; argv by hand: {' '.join(argv)}")
        hand, prov2, prov05 = [], [], []
        for i in range(a.rounds):
            for label, fn, xs in (("by hand", lambda: by_hand(argv), hand), ("provision --poll 2", lambda: launch("2")[0],
                                                                             prov2),
                                  ("provision --poll 0.5", lambda: launch("0.5")[0], prov05)):
                t = fn()
                print(f"round {i + 1}: {label}: {t if t is None else f'{t:.2f} s'}")
                if t is not None:
                    xs.append(t)
        print()
        print("| what | measured |")
        print("|---|---|")
        print(f"| by hand: start -> /health 200 (poll 0.25 s) | {med(hand)} |")
        print(f"| `provision launch` -> ready, cache warm, --poll 2 (default) | {med(prov2)} |")
        print(f"| `provision launch` -> ready, cache warm, --poll 0.5 | {med(prov05)} |")
        print(f"| `provision launch` -> ready, first (asks vLLM's parser) | {cold if cold is None else f'{cold:.2f} s'} |")
        if hand:
            h = statistics.median(hand)
            allowed = max(2.0, 0.05 * h)
            for label, xs in (("--poll 2", prov2), ("--poll 0.5", prov05)):
                if xs:
                    d = statistics.median(xs) - h
                    print(f"provision {label} - by hand: {d:+.2f} s (allowed {allowed:.2f} s): "
                          + ("met" if d <= allowed else "MISSED"))
    finally:
        box.down()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
