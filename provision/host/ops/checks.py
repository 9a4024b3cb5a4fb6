"""Preflight checks a host's launch and a container's share (model and drafter paths).  STDLIB ONLY."""

from __future__ import annotations

import json
import os

from provision.host.facts import model as model_facts


def check_model(path: str, what: str, offline: bool, env: dict | None = None, revision: str | None = None) -> list[dict]:
    """The model (or drafter) folder and its shards. A hub id is looked up in the host's Hugging Face
    cache when the server's environment `env` is given (facts/model.py, huggingface_hub's order):
    found there, it is checked as a folder, offline or not; an offline host without it is refused."""
    items = []
    if not (path.startswith("/") or path.startswith(".") or path.startswith("~")):
        where = model_facts.resolve(path, env, revision) if env is not None else {"dir": None, "error": None}
        if where["dir"] is None:
            level = "fail" if offline else "warn"
            items.append({"level": level, "check": what,
                          "message": f"{what} {path} is a hub id: the host downloads it at start"
                                     + (" but is marked offline" + (f" and {where['error']}" if where["error"] else "")
                                        if offline else "")})
            return items
        items.append({"level": "ok", "check": what, "message": f"{what} {path} is in the host's Hugging Face cache: "
                                                              f"{where['dir']}"})
        path = where["dir"]
    p = os.path.expanduser(path)
    if not os.path.isdir(p):
        items.append({"level": "fail", "check": what, "message": f"{what} {p} does not exist"})
        return items
    index = os.path.join(p, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index) as fh:
                shards = sorted(set(json.load(fh).get("weight_map", {}).values()))
        except (OSError, ValueError) as exc:
            items.append({"level": "fail", "check": what, "message": f"{index}: unreadable ({exc})"})
            return items
        missing = [s for s in shards if not os.path.exists(os.path.join(p, s))]
        if missing:
            items.append({"level": "fail", "check": what,
                          "message": f"{what} {p}: {len(missing)} of {len(shards)} shards missing "
                                     f"(first: {missing[0]})"})
        else:
            items.append({"level": "ok", "check": what, "message": f"{what} {p}: all {len(shards)} shards present"})
    else:
        items.append({"level": "ok", "check": what, "message": f"{what} {p} exists (no shard index to check)"})
    return items
