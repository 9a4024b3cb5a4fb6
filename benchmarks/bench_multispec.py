"""Several specs per host: what a second and third spec cost, and what the `facts` call costs.

One sandbox host like issue 11's (SGLang 0.5.9 in a venv, flashinfer-python 0.6.3 beside it,
a stand-in nvidia-smi saying 12.0), patched once with the three specs
(kimi-k25-eagle3, sm120-torch-symm-mem, sm120-flashinfer-allreduce-fusion). Then, timed
(the real CLI in a subprocess, medians of --runs):

* no-op `patch` with 1 spec, and with 3 specs given the GPU (`--gpu-capability 12.0`: no
  facts call, one remote call) and not given it (the SM120 specs' `applies:` names the GPU:
  one extra `facts` call on the same connection, nvidia-smi run on the host);
* unchanged `reconcile`, the same three ways (without the GPU given, the SM120 specs go in the
  one call as "pending": the fast path answers unchanged, no facts are gathered);
* `status` with 3 specs (always one call: the facts come with the answer).

Timing goals: the 3-spec no-op patch given the GPU within 1.3x of the 1-spec one (one call
for all specs); the facts call (and undecided specs on reconcile) add at most 0.5 s. Prints a table, says met/MISSED, exits 0.
Loopback only: 127.0.2.180+.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _sandbox import BENCH_HOME, free_addresses, provision_argv, ssh_port  # noqa: E402,F401

from provision.sandbox.hosts import HostSpec, Sandbox  # noqa: E402

SPECS = ["kimi-k25-eagle3", "sm120-torch-symm-mem", "sm120-flashinfer-allreduce-fusion"]


def timed(argv: list[str], want_rc: int = 0) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    dt = time.monotonic() - t0
    if proc.returncode != want_rc:
        raise SystemExit(f"{' '.join(argv[1:3])}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    port = ssh_port()
    base = Path(tempfile.mkdtemp(prefix="bench-multispec-"))
    import os

    box = Sandbox(base, owner_pid=os.getpid())
    try:
        addr = free_addresses(1, 180, port)[0]
        host = box.up([HostSpec("ms01", addr, "0.5.9", "venv", port, flashinfer="0.6.3", gpu_capability="12.0")])[0]
        conn = ["--ssh-config", str(box.ssh_config_path), "--identity", str(box.key_path),
                "--known-hosts", str(box.known_hosts_path), "--host", host.name]
        one = ["--playbook", SPECS[0]]
        three = [a for s in SPECS for a in ("--playbook", s)]
        cli = provision_argv()
        timed(cli + ["patch", *conn, *three])                      # the first patch, not timed
        cases = {
            "patch no-op, 1 spec": cli + ["patch", *conn, *one],
            "patch no-op, 3 specs, --gpu-capability (1 call)": cli + ["patch", *conn, *three, "--gpu-capability", "12.0"],
            "patch no-op, 3 specs, nvidia-smi (facts + 1 call)": cli + ["patch", *conn, *three],
            "reconcile unchanged, 1 spec": cli + ["reconcile", *conn, *one],
            "reconcile unchanged, 3 specs, --gpu-capability": cli + ["reconcile", *conn, *three, "--gpu-capability",
                                                                     "12.0"],
            "reconcile unchanged, 3 specs, applies pending (1 call)": cli + ["reconcile", *conn, *three],
            "status, 3 specs (1 call)": cli + ["status", *conn, *three],
        }
        got: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(args.runs):
            for name, argv in cases.items():  # interleaved: the shared machine's load hits every case alike
                got[name].append(timed(argv))
        med = {k: statistics.median(v) for k, v in got.items()}
        width = max(map(len, med))
        print(f"{'case':<{width}}  median   max   (runs: {args.runs})")
        for k, v in med.items():
            print(f"{k:<{width}}  {v:5.2f} s  {max(got[k]):5.2f} s")
        ratio = med["patch no-op, 3 specs, --gpu-capability (1 call)"] / med["patch no-op, 1 spec"]
        facts = med["patch no-op, 3 specs, nvidia-smi (facts + 1 call)"] - \
            med["patch no-op, 3 specs, --gpu-capability (1 call)"]
        rfacts = med["reconcile unchanged, 3 specs, applies pending (1 call)"] - \
            med["reconcile unchanged, 3 specs, --gpu-capability"]
        print(f"3 specs vs 1, one call: {ratio:.2f}x (target <= 1.3x: {'met' if ratio <= 1.3 else 'MISSED'})")
        print(f"the facts call: +{facts:.2f} s on patch; undecided applies: on an unchanged reconcile: +{rfacts:.2f} s "
              f"(target <= 0.5 s: {'met' if max(facts, rfacts) <= 0.5 else 'MISSED'})")
    finally:
        box.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
