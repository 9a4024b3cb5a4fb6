"""What `provision bench` itself costs, and what `status --format prometheus` costs at fleet scale.

    python3 benchmarks/bench_bench.py [--rates 54,96,400] [--requests 8] [--tokens 256] [--hosts 16] [--runs 3]

1. Bench's own overhead per request, against the stand-in's configured speed. A stand-in server
   (a patched 0.5.9 tree, EAGLE3, on loopback, no SSH) is set to R tok/s and a TTFT of 50 ms; the
   host op (host/ops/bench.py) measures it in-process. Reported per R: the measured decode tok/s
   and its error against R, and the overhead per request = the request's wall time on the client
   minus what the stand-in was told to take (TTFT + (tokens - 1) / R). Then the whole CLI,
   `provision bench --local`, at the highest R: its wall time minus the requests' ideal time,
   per request (process start, bundle, the judge, output).
2. `status --format prometheus` against `status --json` on --hosts sandbox hosts (real sshd, 0.5.9
   source checkouts): median wall time of --runs runs each, and the size of the output.

Needs root (the sandbox) for part 2 only; part 1 needs the 0.5.9 wheel in the wheel cache.
On a shared 2-core machine other work inflates every figure: the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import _sandbox  # noqa: E402,F401 - a throwaway HOME for this run

from provision.host.ops import bench as op  # noqa: E402
from provision.output import benchfigures as bf  # noqa: E402

TTFT = 0.05


def standin(tree: Path, port: int, rate: float) -> subprocess.Popen:
    from tests.engine.test_standin import EAGLE3_FLAGS, STANDIN

    env = {k: v for k, v in os.environ.items() if not k.startswith("PROVISION_STANDIN_")}
    env.update({"PROVISION_STANDIN_LOAD_SECONDS": "0.1", "PROVISION_STANDIN_WARMUP_SECONDS": "0.1",
                "PROVISION_STANDIN_DECODE_TOK_S": str(rate), "PROVISION_STANDIN_TTFT_SECONDS": str(TTFT),
                "PROVISION_STANDIN_ACCEPT_LENGTH": "3.1"})
    return subprocess.Popen([sys.executable, str(STANDIN), "--sglang-dir", str(tree), "--model-path", "/m/Kimi-K2.5",
                             "--tp-size", "1", "--port", str(port)] + EAGLE3_FLAGS,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def wait_up(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    import urllib.request

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"the stand-in exited {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("the stand-in did not come up")


def part1(opts) -> None:
    from tests.engine.test_standin import METHODS, add_methods, copy_sglang, free_port

    work = Path(tempfile.mkdtemp(prefix="bench-bench-"))
    tree = copy_sglang("0.5.9", work)
    add_methods(tree, list(METHODS))
    rates = [float(x) for x in opts.rates.split(",")]
    print(f"1. bench's own overhead: {opts.requests} requests of {opts.tokens} tokens, TTFT {TTFT * 1000:.0f} ms")
    print(f"{'set tok/s':>10} {'measured':>9} {'error':>7} {'accept len':>10} {'overhead/request ms':>20}")
    last_port = None
    procs = []
    try:
        for rate in rates:
            port = free_port()
            p = standin(tree, port, rate)
            procs.append(p)
            wait_up(port, p)
            t0 = time.monotonic()
            ans = op.op_bench({"op": "bench", "port": port, "warmup": 1, "requests": opts.requests,
                               "max_new_tokens": opts.tokens, "state_dir": str(work / "state")}, b"")
            wall = time.monotonic() - t0
            if not ans.get("ok"):
                raise SystemExit(f"bench failed: {ans.get('error')}")
            fig = bf.host_figures(ans)
            overheads = [(r["ttft_s"] + r["decode_s"]) - (TTFT + (opts.tokens - 1) / rate) for r in ans["requests"]]
            err = (fig["decode_tok_s"] - rate) / rate * 100
            print(f"{rate:>10.1f} {fig['decode_tok_s']:>9.1f} {err:>+6.1f}% {fig['accept_length']:>10.2f} "
                  f"{statistics.median(overheads) * 1000:>20.1f}")
            last_port, last_rate, last_wall = port, rate, wall
        # the whole CLI, --local, at the last rate
        ideal = (opts.requests + 1) * (TTFT + (opts.tokens - 1) / last_rate)
        walls = []
        for _ in range(opts.runs):
            t0 = time.monotonic()
            proc = subprocess.run(_sandbox.provision_argv() + [
                "bench", "--local", "--state-dir", str(work / "state"), "--server-port", str(last_port),
                "--requests", str(opts.requests), "--max-new-tokens", str(opts.tokens), "--warmup", "1", "--json"],
                capture_output=True, text=True, env=dict(os.environ, PROVISION_JOURNAL=str(work / "j.jsonl")))
            walls.append(time.monotonic() - t0)
            if proc.returncode not in (0, 8):
                print(f"  warning: provision bench --local exited {proc.returncode}: {proc.stderr[-300:]}")
        w = statistics.median(walls)
        print(f"   provision bench --local at {last_rate:g} tok/s: {w:.2f} s wall for {opts.requests}+1 requests "
              f"(the stand-in's ideal {ideal:.2f} s): {w - ideal:.2f} s on top per run (process start, "
              f"/server_info, flush, output); the host op alone took {last_wall:.2f} s")
    finally:
        for p in procs:
            p.kill()
            p.wait()


def part2(opts) -> None:
    from provision.sandbox.hosts import Sandbox

    problems = Sandbox.check_prereqs()
    if problems:
        print("2. skipped: cannot run the sandbox here: " + "; ".join(problems))
        return
    base = Path(tempfile.mkdtemp(prefix="bench-prom-", dir="/var/tmp"))
    box = Sandbox(base, owner_pid=os.getpid())
    work = Path(tempfile.mkdtemp(prefix="bench-prom-work-"))
    try:
        port = _sandbox.ssh_port()
        hosts = _sandbox.up_hosts(box, [f"bp{i:02d}" for i in range(opts.hosts)], 40, port)
        inv = box.write_inventory(work / "inv.yaml", [h.name for h in hosts])
        common = ["-i", str(inv), "--ssh-config", str(box.ssh_config_path), "--identity", str(box.key_path),
                  "--known-hosts", str(box.known_hosts_path)]
        env = dict(os.environ, PROVISION_JOURNAL=str(work / "journal.jsonl"))
        subprocess.run(_sandbox.provision_argv() + ["patch"] + common, capture_output=True, env=env)
        print(f"2. status on {opts.hosts} hosts (median of {opts.runs} runs)")
        for label, extra in (("--json", ["--json"]), ("--format prometheus", ["--format", "prometheus"]),
                             ("--format prometheus --metrics-file", ["--format", "prometheus", "--metrics-file",
                                                                     str(work / "s.prom")])):
            walls, size = [], 0
            for _ in range(opts.runs):
                t0 = time.monotonic()
                proc = subprocess.run(_sandbox.provision_argv() + ["status"] + common + extra, capture_output=True,
                                      env=env)
                walls.append(time.monotonic() - t0)
                size = len(proc.stdout)
                if proc.returncode != 0:
                    print(f"  warning: status {label} exited {proc.returncode}")
            print(f"   status {label:<38} {statistics.median(walls):6.2f} s  {size / 1024:7.1f} KiB of output")
    finally:
        box.down()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="54,96,400")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--skip-fleet", action="store_true", help="only part 1")
    opts = ap.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    part1(opts)
    if not opts.skip_fleet:
        part2(opts)
    print(f"load average now {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
