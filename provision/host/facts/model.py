"""What SGLang will read at start-up, read on the host before anything is started.  STDLIB ONLY.

Facts only (nothing is written): where a model path or hub id lives on this host (the Hugging
Face cache for a hub id), its ``config.json``, the first bytes of its safetensors shards, the
source files of the installed SGLang that preflight reads (the argument parser, the model
registry) and their mtimes, free disk and available memory. The judging is elsewhere
(engine/modelcheck.py, ops/preflight_model.py). Every reader returns an ``error`` sentence
naming the file rather than raising.
"""

from __future__ import annotations

import glob
import json
import os
import struct


HEAD_LIMIT = 100 * 1024 * 1024  # the safetensors header-size limit


def _hub_caches(env: dict) -> list[str]:
    """HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub (huggingface_hub's order)."""
    out = []
    if env.get("HF_HUB_CACHE"):
        out.append(env["HF_HUB_CACHE"])
    if env.get("HUGGINGFACE_HUB_CACHE"):
        out.append(env["HUGGINGFACE_HUB_CACHE"])
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".cache"), "huggingface")
    out.append(os.path.join(home, "hub"))
    return list(dict.fromkeys(os.path.expanduser(p) for p in out))


def is_hub_id(path: str) -> bool:
    return not (path.startswith("/") or path.startswith(".") or path.startswith("~")) and path.count("/") == 1


def resolve(path: str, env: dict, revision: str | None = None) -> dict:
    """{"dir": the folder SGLang will read, or None; "hub": bool; "error": why not, or None}."""
    if not is_hub_id(path):
        p = os.path.expanduser(path)
        if os.path.isdir(p):
            return {"dir": p, "hub": False, "error": None}
        return {"dir": None, "hub": False, "error": f"{p} does not exist"}
    org, name = path.split("/", 1)
    for cache in _hub_caches(env):
        repo = os.path.join(cache, f"models--{org}--{name}")
        if not os.path.isdir(repo):
            continue
        snap = None
        try:
            with open(os.path.join(repo, "refs", revision or "main")) as fh:
                ref = fh.read().strip()
            if ref and os.path.isdir(os.path.join(repo, "snapshots", ref)):
                snap = os.path.join(repo, "snapshots", ref)
        except OSError:
            pass
        if snap is None and revision and os.path.isdir(os.path.join(repo, "snapshots", revision)):
            snap = os.path.join(repo, "snapshots", revision)
        if snap is None:
            snaps = [d for d in glob.glob(os.path.join(repo, "snapshots", "*")) if os.path.isdir(d)]
            snap = max(snaps, key=os.path.getmtime) if snaps else None
        if snap is not None:
            return {"dir": snap, "hub": True, "error": None}
    return {"dir": None, "hub": True,
            "error": f"hub id {path} is not in this host's Hugging Face cache ({', '.join(_hub_caches(env))}): "
                     "it is downloaded at start, and cannot be checked before"}


def read_json(path: str) -> tuple[object, str | None]:
    """(document, None) or (None, one sentence naming the file)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return None, f"{path} is missing"
    except OSError as exc:
        return None, f"{path} is unreadable ({exc.strerror})"
    try:
        return json.loads(data.decode("utf-8")), None
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"{path} is not JSON ({exc})"


def config(model_dir: str) -> dict:
    """{"file", "config" (a dict or None), "error"}; ``auto_model`` when its auto_map names an AutoModel."""
    path = os.path.join(model_dir, "config.json")
    doc, err = read_json(path)
    if err is None and not isinstance(doc, dict):
        doc, err = None, f"{path} is not a JSON object"
    out = {"file": path, "config": doc, "error": err}
    if isinstance(doc, dict) and isinstance(doc.get("auto_map"), dict):
        out["auto_model"] = any(str(k).startswith("AutoModel") for k in doc["auto_map"])
    return out


def shard_heads(model_dir: str) -> dict | None:
    """The shards SGLang will load, each with its size and first bytes (8 + its header length,
    never more): {"index", "error", "files": [{"name", "size", "head" (bytes) | "error"}]}.
    None when the folder has neither an index nor a model.safetensors."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        doc, err = read_json(index)
        if err:
            return {"index": index, "error": err, "files": []}
        wm = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(wm, dict):
            return {"index": index, "error": f"{index} has no weight_map", "files": []}
        names = sorted(set(str(v) for v in wm.values()))
    elif os.path.exists(os.path.join(model_dir, "model.safetensors")):
        index, names = None, ["model.safetensors"]
    else:
        return None
    files = []
    for name in names:
        path = os.path.join(model_dir, name)
        f: dict = {"name": name}
        try:
            with open(path, "rb") as fh:
                f["size"] = os.fstat(fh.fileno()).st_size
                first = fh.read(8)
                if len(first) == 8:
                    (n,) = struct.unpack("<Q", first)
                    first += fh.read(n) if 0 < n <= HEAD_LIMIT else b""
                f["head"] = first
        except FileNotFoundError:
            f["error"] = "is missing"
        except OSError as exc:
            f["error"] = f"is unreadable ({exc.strerror})"
        files.append(f)
    return {"index": index, "error": None, "files": files}


def mtimes(paths: list[str]) -> list:
    """[path, mtime_ns, size] per path (None for a missing one): the cache key of what was read."""
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append([p, st.st_mtime_ns, st.st_size])
        except OSError:
            out.append([p, None, None])
    return out


def read_text(path: str) -> tuple[str | None, str | None]:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read(), None
    except FileNotFoundError:
        return None, f"{path} is missing"
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"{path} is unreadable ({getattr(exc, 'strerror', None) or exc})"


def transformers_has(sglang_dir: str, arch: str) -> bool:
    """Does the Transformers package beside this SGLang define class ``arch`` (SGLang's fallback for
    an architecture it does not register)? Read as text, on the rare path only."""
    site = os.path.dirname(os.path.abspath(sglang_dir))
    needle = f"class {arch}("
    for path in glob.glob(os.path.join(site, "transformers", "models", "*", "modeling_*.py")):
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                if needle in fh.read():
                    return True
        except OSError:
            continue
    return False


def external_package(env: dict, variable: str) -> tuple[str | None, str | None]:
    """(the folder of the package `variable` names (SGLANG_EXTERNAL_MODEL_PACKAGE) found on the
    server's PYTHONPATH, its name); (None, None) when the variable is unset or "" (an engine that reads none)."""
    name = (env.get(variable) or "").strip() if variable else ""
    if not name:
        return None, None
    rel = name.replace(".", os.sep)
    for entry in (env.get("PYTHONPATH") or "").split(os.pathsep):
        if entry and os.path.isdir(os.path.join(entry, rel)):
            return os.path.join(entry, rel), name
    return None, name


def disk_free(path: str) -> int | None:
    try:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize
    except OSError:
        return None


def mem_available() -> int | None:
    """MemAvailable of /proc/meminfo: what the page cache may grow to without swapping."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
