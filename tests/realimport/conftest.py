"""The realimport tier: Python itself imports the released SGLang modules provision edits.

The cached venvs (provision/sandbox/realimport_venv.py: CPU torch, SGLang's real imports, SGLang
--no-deps, CUDA-only stand-ins) are built by .ci/run once per machine. A test never writes into
them: each gets a small venv of its own whose site-packages holds a private copy of `sglang`
(first on sys.path) and a .pth that adds the cached site-packages behind it.

Fixtures
  base_059, base_0523  session: the cached venv (built here when absent, or the test is skipped
                       with the reason)
  trusted_dir          per test: a directory that discovery's trust rule accepts (root-owned, no
                       group/other write on the way up; /tmp is not), removed afterwards
  make_venv            make_venv(base, where) -> TestVenv (python, site, sglang)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from provision.sandbox import realimport_venv as rv

KIMI_MODULE = "sglang.srt.models.kimi_k25"
METHODS = ["set_eagle3_layers_to_capture", "get_embed_and_head", "set_embed_and_head"]
# What a fresh interpreter sees: imports the module (or says why not), reads the class's own
# __dict__, calls each method on an instance whose language_model records calls, and asks SGLang's
# own ModelRegistry which class the architecture resolves to. One JSON line.
SEES = r'''
import importlib, inspect, json, os, sys, warnings
warnings.simplefilter("ignore")
mod_name, cls_name, names, registry = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4] == "1"
out = {}
try:
    m = importlib.import_module(mod_name)
except BaseException as exc:
    print(json.dumps({"import_error": type(exc).__name__, "message": str(exc)})); sys.exit(0)
out["file"] = os.path.realpath(m.__file__)


def describe(cls):
    import torch.nn as nn
    d = {"module": cls.__module__, "name": cls.__name__,
         "in_class_dict": {n: inspect.isfunction(cls.__dict__.get(n)) for n in names},
         "hasattr": {n: hasattr(cls, n) for n in names}}

    class Recorder:
        def __init__(self):
            self.calls = []

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)

            def method(*args, **kwargs):
                ret = object()
                self.calls.append((name, args, kwargs, ret))
                return ret
            return method

    rec = Recorder()
    obj = cls.__new__(cls)
    nn.Module.__init__(obj)
    obj.language_model = rec
    delegated = {}
    for n in names:
        if not hasattr(cls, n):
            continue
        params = [p for p in inspect.signature(getattr(cls, n)).parameters if p != "self"]
        args = [object() for _ in params]
        rec.calls.clear()
        try:
            got = getattr(obj, n)(*args)
        except BaseException as exc:
            delegated[n] = "raised %s: %s" % (type(exc).__name__, exc); continue
        if len(rec.calls) != 1:
            delegated[n] = "%d calls to language_model" % len(rec.calls); continue
        name, a, k, ret = rec.calls[0]
        passed = list(a) + list(k.values())
        same_args = name == n and len(passed) == len(args) and all(x is y for x, y in zip(passed, args))
        delegated[n] = ("ok" if same_args and got is ret else
                        "ok, returns None" if same_args and got is None else
                        "wrong: %s %r -> %r" % (name, passed, got))
    d["delegates"] = delegated
    return d


cls = getattr(m, cls_name, None)
out["module_functions"] = [n for n in names if inspect.isfunction(m.__dict__.get(n))]
if cls is not None:
    out["class"] = describe(cls)
if registry:
    from sglang.srt.models.registry import ModelRegistry
    got, arch = ModelRegistry.resolve_model_cls([cls_name])
    out["registry"] = dict(describe(got), arch=arch, same_as_module_class=got is cls,
                           file=os.path.realpath(inspect.getfile(got)))
print(json.dumps(out))
'''
# The SM120 map, as the patched module holds it.
SM120 = r'''
import json, warnings
warnings.simplefilter("ignore")
from sglang.srt.distributed.device_communicators import all_reduce_utils as m
d = m.TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES
print(json.dumps({"keys": sorted(d), "same": d.get(12) == d.get(10) and 12 in d, "file": m.__file__}))
'''
CLEAN_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def last_json(text: str) -> dict:
    lines = [line for line in text.strip().splitlines() if line.startswith("{")]
    assert lines, text[-2000:]
    return json.loads(lines[-1])


def python_sees(python: str, registry: bool = False, env: dict | None = None, run=None,
                cls: str = "KimiK25ForConditionalGeneration", module: str = KIMI_MODULE) -> dict:
    """Run SEES in a fresh `python` (a clean environment plus `env`); `run` runs argv elsewhere
    (a sandbox host's run)."""
    argv = [python, "-c", SEES, module, cls, ",".join(METHODS), "1" if registry else "0"]
    if run is not None:
        proc = run(argv, env=env or {})
    else:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd="/",
                              env={**CLEAN_ENV, **(env or {})})
    return last_json(proc.stdout + "\n" + proc.stderr if not proc.stdout.strip() else proc.stdout)


def sm120_sees(python: str) -> dict:
    proc = subprocess.run([python, "-c", SM120], capture_output=True, text=True, timeout=600, cwd="/",
                          env=CLEAN_ENV)
    return last_json(proc.stdout or proc.stderr)


def _base(version: str) -> Path:
    try:
        venv, _seconds = rv.ensure_venv(version)
    except rv.VenvUnavailable as exc:
        pytest.skip(f"realimport venv for SGLang {version} unavailable: {exc}")
    return venv


def tree_digest(path: Path) -> str:
    h = hashlib.sha256()
    for top, dirs, files in sorted(os.walk(path)):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(top, f)
            if "__pycache__" in p:
                continue
            h.update(p.encode() + b"\0" + Path(p).read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="session")
def base_059():
    venv = _base("0.5.9")
    pkg = rv.site_packages(venv) / "sglang"
    before = tree_digest(pkg / "srt" / "models")
    yield venv
    assert tree_digest(pkg / "srt" / "models") == before, "a test wrote into the cached venv"


@pytest.fixture(scope="session")
def base_0523():
    return _base("0.5.23")


@pytest.fixture
def trusted_dir():
    """A scratch dir whose every ancestor is root's and closed to group/other writes (discovery's
    trust rule): beside the cache, never in the cached venvs."""
    root = rv.cache_root() / "scratch"
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    path = root / uuid.uuid4().hex[:12]
    path.mkdir(mode=0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class TestVenv:
    root: Path
    site: Path

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    @property
    def sglang(self) -> Path:
        return self.site / "sglang"

    def file(self, rel: str) -> Path:
        return self.sglang / rel


@pytest.fixture
def make_venv():
    def make(base: Path, where: Path, base_site_seen_as: str | None = None) -> TestVenv:
        site = rv.overlay_venv(base, where, base_site_seen_as)
        return TestVenv(where, site)
    return make
