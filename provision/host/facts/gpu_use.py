"""Which GPUs a server will use, and who holds memory on them.  STDLIB ONLY, read-only.

A host with 8 GPUs may run two servers side by side (``base-gpu-id 0 tp-size 4`` on port 30000,
``base-gpu-id 4 tp-size 4`` on 30001): launch's preflight judges GPU memory on the GPUs this
server will use, never the host's. SGLang places TP rank r of a node on CUDA device
``base-gpu-id + r * gpu-id-step``; with ``CUDA_VISIBLE_DEVICES`` set, CUDA device i is the i-th
entry listed there (an index or a UUID). A node runs ``tp-size * pp-size / nnodes`` ranks.

The readers (``parse_gpu_list``, ``parse_compute_apps``) and the decision (``server_gpus``) are pure;
``read`` runs nvidia-smi the one way (facts/nvidia_smi.py).
"""

from __future__ import annotations

import re

from provision.host.facts import nvidia_smi

APPS_QUERY = ["--query-compute-apps=gpu_uuid,pid,process_name,used_memory", "--format=csv,noheader"]
_GPU_LINE = re.compile(r"^GPU (\d+): .*\(UUID: ([^)\s]+)\)\s*$")


def parse_gpu_list(stdout: str) -> list[dict]:
    """`nvidia-smi -L`: [{"index": 0, "uuid": "GPU-..."}, ...] in the order listed. Pure."""
    out = []
    for line in stdout.splitlines():
        m = _GPU_LINE.match(line.strip())
        if m:
            out.append({"index": int(m.group(1)), "uuid": m.group(2)})
    return out


def parse_compute_apps(stdout: str) -> list[dict]:
    """`nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory`: one dict per
    process per GPU ({"uuid", "pid", "name", "memory"}). Pure."""
    out = []
    for line in stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) >= 4 and parts[1].isdigit():
            out.append({"uuid": parts[0], "pid": int(parts[1]), "name": parts[2], "memory": parts[3]})
    return out


def _int(value, default: int) -> int:
    try:
        return int(value) if value not in (None, "", False) else default
    except (TypeError, ValueError):
        return default


def server_gpus(args: dict, visible: str | None, gpus: list[dict]) -> tuple[list[dict], str | None]:
    """(the GPUs of `gpus` a server with these flags uses on this node, None), or ([], why) when it
    cannot have them. `visible` is the server's CUDA_VISIBLE_DEVICES (None: unset). Pure."""
    per_node = max(1, _int(args.get("tp-size"), 1) * _int(args.get("pp-size"), 1) // max(1, _int(args.get("nnodes"), 1)))
    base, step = _int(args.get("base-gpu-id"), 0), _int(args.get("gpu-id-step"), 1)
    wanted = [base + r * step for r in range(per_node)]
    entries = [e.strip() for e in visible.split(",")] if visible is not None else None
    if entries is not None and entries == [""]:
        entries = []
    table = list(gpus)
    out = []
    for dev in wanted:
        if entries is not None:
            if dev >= len(entries):
                return [], (f"the server needs CUDA device {dev} (base-gpu-id {base}, {per_node} ranks on this node) "
                            f"and CUDA_VISIBLE_DEVICES={visible} lists {len(entries)}")
            entry = entries[dev]
            hit = [g for g in table if (entry.isdigit() and g["index"] == int(entry))
                   or (not entry.isdigit() and entry and g["uuid"].startswith(entry))]
            if not hit:
                return [], f"CUDA_VISIBLE_DEVICES entry {entry!r} is none of the host's {len(table)} GPUs"
        else:
            hit = [g for g in table if g["index"] == dev]
            if not hit:
                return [], (f"the server needs GPU {dev} (base-gpu-id {base}, {per_node} ranks on this node) and "
                            f"{len(table)} GPUs are visible")
        out.append(hit[0])
    return out, None


def describe(gpus: list[dict]) -> str:
    """"GPUs 4-7", "GPU 2", "GPUs 0, 2, 4". Pure."""
    idx = sorted(g["index"] for g in gpus)
    if len(idx) == 1:
        return f"GPU {idx[0]}"
    if idx == list(range(idx[0], idx[-1] + 1)):
        return f"GPUs {idx[0]}-{idx[-1]}"
    return "GPUs " + ", ".join(str(i) for i in idx)


def read(timeout: float = 20) -> dict:
    """{"available": True, "gpus": [...], "apps": [...]} from nvidia-smi, or {"available": False,
    "why": ...}; "error" when a query failed."""
    listed = nvidia_smi.run(["-L"], timeout)
    if listed.get("refused"):
        return {"available": False, "why": listed["why"] if listed["path"] else "nvidia-smi not found"}
    out: dict = {"available": True, "gpus": [], "apps": []}
    if "why" in listed:
        return dict(out, error=listed["why"])
    out["gpus"] = parse_gpu_list(listed["stdout"])
    apps = nvidia_smi.run(APPS_QUERY, timeout)
    if "why" in apps:
        return dict(out, error=apps["why"])
    out["apps"] = parse_compute_apps(apps["stdout"])
    return out
