"""How long a container launch takes to get the container started, and what the image probe costs.

    python3 benchmarks/bench_container.py [--runs 5] [--first-address 210]

Needs root, podman, runc and debootstrap (the sandbox's podman hosts and SGLang images, see
provision/sandbox/sglang_image.py). One namespace host with podman gets a free loopback
address 127.0.2.<first>.. (checked by binding), a base dir under /tmp, and is torn down at the
end (also on error or Ctrl-C).

Each run is the real CLI in a subprocess: `provision launch --json` of a container profile
(the 0.5.10 image, whose class is native: no overlay; then the 0.5.9 image, with the overlay,
the default fix for containers: staged from the image's file and checked in a throw-away
container before the start), `--network host`, the stand-in loading for 1 s; then `provision stop`.
  (a) launch -> container started: the CLI's start time (wall clock, this machine) to the
      container's `State.StartedAt` (podman, same clock). "cold": the first launch after the
      host's image facts cache was removed (the image's SGLang is read by running the discovery
      probe in a throw-away container); "warm": the cache holds them.
  (b) `podman run -d` alone (the host op's own timing, in the server record).
  (c) launch -> ready, and `provision stop` (stop -t, rm) wall time.
No targets: the issue asks for the numbers. Always exits 0.
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

from provision.sandbox import sglang_image  # noqa: E402
from provision.sandbox.hosts import AddressInUse, HostSpec, Sandbox  # noqa: E402

SPEC = {"file": "srt/models/kimi_k25.py", "class": "KimiK25ForConditionalGeneration", "delegate": "language_model",
        "methods": [{"name": "set_eagle3_layers_to_capture", "params": "self, layer_ids=None"},
                    {"name": "get_embed_and_head", "params": "self"},
                    {"name": "set_embed_and_head", "params": "self, embed, head"}]}


def playbook(path: Path, image: str) -> Path:
    doc = {"name": "bench-container", "patch": SPEC,
           "launch": {"container": {"runtime": "podman", "image": image, "network": "host",
                                    "volumes": ["/data:/data:ro"]},
                      "args": {"model-path": "/data/models/Kimi-K2.5", "tp-size": 8, "speculative-algorithm": "EAGLE3",
                               "speculative-draft-model-path": "/data/models/Kimi-K25-eagle3",
                               "speculative-num-steps": 3, "speculative-eagle-topk": 1,
                               "speculative-num-draft-tokens": 4, "host": "127.0.0.1", "port": 30000},
                      "env": {"PROVISION_STANDIN_LOAD_SECONDS": "1"}}}
    path.write_text(json.dumps(doc))
    return path


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f}, n={len(xs)})" if xs else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--first-address", type=int, default=210)
    a = ap.parse_args()
    images = {}
    for version in ("0.5.10", "0.5.9"):
        t_img = time.monotonic()
        images[version], built = sglang_image.ensure_sglang_image(version, log=print)
        print(f"image {images[version]}: " + (f"built in {built:.1f} s" if built
                                               else f"cached ({time.monotonic() - t_img:.2f} s)"))
    base = Path(tempfile.mkdtemp(prefix="bench-container-"))
    box = Sandbox(base / "box", owner_pid=os.getpid())
    port = ssh_port()
    try:
        for _ in range(5):
            addr = free_addresses(1, a.first_address, port)[0]
            try:
                host, = box.up([HostSpec("bc01", addr, None, "none", port, podman=True)])
                break
            except AddressInUse:
                a.first_address += 1
        inv = box.write_inventory(base / "inv.yaml")
        env = {**os.environ, "PROVISION_SSH_CONFIG": str(box.ssh_config_path)}
        cli = provision_argv()
        rows = []
        for version, what in (("0.5.10", "no overlay (native)"), ("0.5.9", "with the overlay")):
            pb = playbook(base / f"pb-{version}.yaml", images[version])
            cold, warm, run_only, ready, stop = [], [], [], [], []
            for i in range(a.runs + 1):
                if i % 2 == 0:
                    host.run("rm -rf /var/lib/provision/images")
                t0 = time.time()
                p = subprocess.run(cli + ["launch", "-i", str(inv), "--playbook", str(pb), "--poll", "0.5", "--json"],
                                   capture_output=True, text=True, env=env, timeout=300)
                t_end = time.time()
                r = json.loads(p.stdout)["hosts"][0]
                started = int(host.run(["podman", "inspect", "-f", "{{.State.StartedAt.UnixNano}}",
                                        "sglang-30000"]).stdout.strip()) / 1e9
                rec = json.loads(host.run("cat /var/lib/provision/server/server-30000.json").stdout)
                t1 = time.time()
                s = subprocess.run(cli + ["stop", "-i", str(inv), "--playbook", str(pb)], capture_output=True,
                                   text=True, env=env, timeout=120)
                t2 = time.time()
                if r["verdict"] != "ready" or s.returncode != 0:
                    print(f"{version} run {i}: launch {r['verdict']} {r['detail']}; stop rc {s.returncode} {s.stdout}")
                    continue
                if i == 0:
                    continue  # warm-up (first SSH, first page cache)
                (cold if i % 2 == 0 else warm).append(started - t0)
                run_only.append(float(rec["run_seconds"]))
                ready.append(t_end - t0)
                stop.append(t2 - t1)
            rows += [(f"{version} image, {what}: `launch` -> container started, image facts cached", med(warm)),
                     (f"{version} image, {what}: `launch` -> container started, image read in a throw-away container",
                      med(cold)),
                     (f"{version} image: `podman run -d` alone (host op)", med(run_only)),
                     (f"{version} image: `launch` -> ready (stand-in loads 1 s, --poll 0.5)", med(ready)),
                     (f"{version} image: `stop` (stop -t, rm)", med(stop))]
        print()
        print("| what | measured |")
        print("|---|---|")
        for what, val in rows:
            print(f"| {what} | {val} |")
    finally:
        box.down()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
