"""Run the installed `provision` command the way a user does."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys

PROVISION = shutil.which("provision") or ""


def run(*args, env=None, timeout=300, check_rc=None):
    argv = [PROVISION] if PROVISION else [sys.executable, "-m", "provision"]
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    proc = subprocess.run(argv + [str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                          env=full_env, stdin=subprocess.DEVNULL)
    if check_rc is not None:
        assert proc.returncode == check_rc, (proc.returncode, proc.stdout, proc.stderr)
    # No traceback of provision's own (a server's traceback in a shown log tail is fine).
    assert "/provision/" not in "".join(l for l in proc.stderr.splitlines(True) if l.lstrip().startswith("File ")), \
        proc.stderr
    return proc


def run_json(*args, **kw):
    proc = run(*args, "--json", **kw)
    return proc, json.loads(proc.stdout)


def class_methods(source: bytes, cls: str) -> list[str]:
    """Names of functions defined directly in the class body (what Python will bind)."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return [n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    raise AssertionError(f"class {cls} not found")


def module_level_functions(source: bytes) -> list[str]:
    return [n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]


KIMI = "srt/models/kimi_k25.py"
KIMI_CLASS = "KimiK25ForConditionalGeneration"
METHODS = ["set_eagle3_layers_to_capture", "get_embed_and_head", "set_embed_and_head"]
