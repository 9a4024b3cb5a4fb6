"""What the real-vLLM tier's modules share: where the venv and models sit in a host, the tiny
playbook and inventory, and what a user would look at on the host (vLLM's processes, an HTTP status,
/metrics' spec-decoding counters, the server's record and argv), read here without provision's readers."""

from __future__ import annotations

import json
import shutil
import time

from tests.cli.helpers import run

VENV_IN_HOST = "/opt/vllm-env"
# the upgrade test's two releases side by side (under /data/venvs: discovery never sees them, so the other
# tests' plain launches find one vLLM)
UPGRADE_FROM = "/data/venvs/vllm-0.31.0"
UPGRADE_TO = "/data/venvs/vllm-0.32.0"
MODELS_IN_HOST = "/data/models"
KEY = "sk-realvllm-canary-5e1"
# The tier's bounds follow this machine's measured speed: the first real start of a worker (its launch to
# ready, as `launch` took it) sets the deadlines of the others and scales their pytest timeouts
# (conftest.py), so a loaded or slow machine is a slow run, not a red one. Until it is measured, the
# first start has the generous bound. The fixed bounds below were set for REFERENCE_START.
REFERENCE_START = 60.0  # s: a start alone takes 35-60 s on 2 cores
FIRST_DEADLINE = 600    # s: the first start's deadline, before anything is measured
_measured: dict[str, float] = {}


def measured(took: float) -> None:
    """The first real start's seconds to ready, kept for the worker's later bounds."""
    _measured.setdefault("start", took)


def started() -> bool:
    """Has this worker measured a real start yet?"""
    return "start" in _measured


def pace() -> float:
    """How much slower than REFERENCE_START this machine starts a real server (never below 1)."""
    return max(1.0, _measured.get("start", REFERENCE_START) / REFERENCE_START)


def deadline() -> str:
    """The --deadline of a real start: FIRST_DEADLINE until the first start is measured, then six of
    its starts (never under 240 s)."""
    if "start" not in _measured:
        return str(FIRST_DEADLINE)
    return str(int(max(240.0, 6 * _measured["start"])))


def playbook(tmp_path, models: str, grace: float = 20, processes: bool = False, **extra_args) -> str:
    """The tier's playbook. `processes`: vLLM's own process layout (API server, EngineCore, Worker,
    each importing vLLM: ~12 s of CPU each here); else VLLM_ENABLE_V1_MULTIPROCESSING=0 (the Worker
    runs in the EngineCore: 42-44 -> 30-31 s to ready here), for the tests that are not about the
    process tree."""
    args = {"model": f"{models}/target", "dtype": "float32", "max-model-len": 512, "enforce-eager": True,
            "kv-cache-memory-bytes": "64M",
            "speculative-config": {"method": "eagle3", "model": f"{models}/draft", "num_speculative_tokens": 3},
            **extra_args}
    doc = {"name": "tiny-vllm", "engine": "vllm",
           "launch": {"args": args, "env": {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                                            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                                            **({} if processes else {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})},
                      "grace": grace}}
    path = tmp_path / "tiny-vllm.yaml"
    path.write_text(json.dumps(doc))
    return str(path)


def inventory(tmp_path, ssh_env, host, pb: str) -> str:
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts)},
           "hosts": {host.name: {"address": host.address, "port": host.port, "profile": pb}}}
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inv))
    return str(path)


def put_models(host, src, name: str) -> str:
    dest = host.hostpath(f"{MODELS_IN_HOST}/{name}")
    if not dest.exists():
        shutil.copytree(src, dest)
    return f"{MODELS_IN_HOST}/{name}"


def vllm_pids(host) -> list[int]:
    """vLLM's processes on the host: the API server, EngineCore, Worker, and anything run from its venv."""
    out = host.run("ps -eo pid=,args=", check=False).stdout
    return [int(l.split()[0]) for l in out.splitlines()
            if ("vllm.entrypoints" in l or "VLLM::" in l or VENV_IN_HOST in l) and "ps -eo" not in l
            and "init.py" not in l]  # the host's init names the bind mount


def curl(host, path: str, key: str | None = None, address: str = "127.0.0.1") -> int:
    """The HTTP status of the server's `path`, asked from inside the host (0: nothing answers)."""
    prog = ("import sys, urllib.request, urllib.error\n"
            "req = urllib.request.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + sys.argv[2]} "
            "if sys.argv[2] else {})\n"
            "try:\n    print(urllib.request.urlopen(req, timeout=10).status)\n"
            "except urllib.error.HTTPError as e:\n    print(e.code)\n"
            "except OSError:\n    print(0)\n")
    out = host.run(["python3", "-c", prog, f"http://{address}:30000{path}", key or ""], check=False)
    return int(out.stdout.strip() or 0)


def spec_counters(host, address: str = "127.0.0.1") -> dict:
    """vLLM's spec-decoding counters read straight from /metrics on the host (summed over labels
    with a regex here, not with provision's reader)."""
    import re

    prog = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
    text = host.run(["python3", "-c", prog, f"http://{address}:30000/metrics"]).stdout
    out = {}
    for name in ("drafts", "draft_tokens", "accepted_tokens"):
        vals = re.findall(rf"^vllm:spec_decode_num_{name}_total(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)
        out[name] = sum(float(v) for v in vals)
    return out


def bench(cli: list, *args) -> tuple:
    """`provision bench --json` with few short requests and no warm-up (so /metrics read around it
    counts exactly its requests): (process, its one row)."""
    proc = run("bench", *cli, "--requests", "3", "--max-new-tokens", "48", "--warmup", "0", *args, "--json",
               timeout=600)
    assert proc.stdout.strip(), (proc.returncode, proc.stderr[-3000:])
    return proc, json.loads(proc.stdout)["hosts"][0]


def record(host) -> dict:
    return json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())


def server_argv(host) -> list[str]:
    """The running server's command line, read from /proc on the host."""
    return host.run(f"tr '\\0' '\\n' < /proc/{record(host)['pid']}/cmdline", check=False).stdout.splitlines()


def launch(cli: list, *args, env=None) -> tuple:
    """`provision launch --json` on the tier's host: (process, its one row, seconds it took)."""
    t0 = time.monotonic()
    limit = int(deadline())
    proc = run("launch", *cli, *args, "--deadline", str(limit), "--poll", "1", "--json", env=env, timeout=limit + 200)
    assert proc.stdout.strip(), (proc.returncode, proc.stderr[-3000:])
    row, took = json.loads(proc.stdout)["hosts"][0], time.monotonic() - t0
    if row.get("verdict") == "ready":
        measured(took)
    return proc, row, took


def gone(host, within: float = 30.0) -> list[int]:
    """vLLM's processes on the host once they are gone, or those still there after `within` s
    (a crashed tree's children end a moment after its report)."""
    end = time.monotonic() + within
    while (left := vllm_pids(host)) and time.monotonic() < end:
        time.sleep(0.2)
    return left


QWEN2_AUDIO_SPECS = {"qwen2-audio-eagle3-vllm": "model_executor/models/qwen2_audio.py",
                     "qwen2-audio-proposer-vllm": "v1/spec_decode/llm_base_proposer.py"}


def private_vllm(host, venv) -> str:
    """/root/vllm-private in the host: a `vllm` package of links into the tier's read-only venv, except
    the files the Qwen2-Audio specs edit (copies) and the directories down to them; the venv's
    dist-info linked beside it (its version). The venv itself is never written."""
    site = next(venv.glob("lib/python3*/site-packages"))
    in_host = f"{VENV_IN_HOST}/{site.relative_to(venv)}"
    root = host.hostpath("/root/vllm-private")
    shutil.rmtree(root, ignore_errors=True)
    edited = set(QWEN2_AUDIO_SPECS.values())
    dirs = {"/".join(f.split("/")[:i]) for f in edited for i in range(1, f.count("/") + 1)}

    def mirror(rel: str) -> None:
        (root / "vllm" / rel).mkdir(parents=True, exist_ok=True)
        for entry in (site / "vllm" / rel).iterdir():
            sub = f"{rel}/{entry.name}".lstrip("/")
            if sub in dirs:
                mirror(sub)
            elif sub in edited:
                (root / "vllm" / sub).write_bytes(entry.read_bytes())
            else:
                (root / "vllm" / sub).symlink_to(f"{in_host}/vllm/{sub}")

    mirror("")
    for info in site.glob("vllm*.dist-info"):
        (root / info.name).symlink_to(f"{in_host}/{info.name}")
    return "/root/vllm-private"


def staged(venv) -> None:
    """The 0.32.0 venv as `provision upgrade --stage` leaves one beside the serving venv: its marker
    (host/ops/upgrade.py) naming its interpreter where the host sees it (UPGRADE_TO). Written once
    into the cached venv (the install step itself is tested on the sandbox's SGLang hosts: a real
    vLLM's 3.5 GB are not installed per test run)."""
    from provision.host.ops.upgrade import MARKER

    mark = venv / MARKER
    doc = {"engine": "vllm", "version": "0.32.0", "python": f"{UPGRADE_TO}/bin/python"}
    if not mark.exists() or json.loads(mark.read_text()) != doc:
        mark.write_text(json.dumps(doc))
