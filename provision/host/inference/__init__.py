"""The inference engines: the servers provision launches (SGLang, vLLM).  STDLIB ONLY.

Not to be confused with ``host/engine/``, the *patch* engine (AST edits of an engine's files):
this package says what each *inference* engine is, so that no verb asks "is it SGLang?".

One interface (base.py ``InferenceEngine``), one implementation per engine (sglang.py, vllm.py), picked once
from data: a profile's ``launch.engine`` (default ``sglang``), kept in the server's record. Every
layer above asks the engine it was given: discovery (what an install is), the flag reader (where
its flags are declared), the start command and its secrets, readiness, the log's name, the
overlay's variable, the EAGLE-3 interface a target class must have, the bench's endpoints.

An implementation is imported only when it is asked for (``get``): a no-op ``patch`` or
``reconcile`` loads none it does not need. The verbs (``tasks/``, ``cli/``) never import an
implementation's module directly (an import-linter contract says so): they name an engine by its
data, and this module picks.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from provision.host.inference.base import InferenceEngine

DEFAULT = "sglang"
# name -> the module holding its implementation (ENGINE): the one list of the engines provision knows
_MODULES = {"sglang": "provision.host.inference.sglang", "vllm": "provision.host.inference.vllm"}
KNOWN = tuple(_MODULES)
# name -> the Python package an install of it is (its implementation's `package`, said here too so
# that a request's specs name their engine without importing it; a unit test holds the two equal)
PACKAGES = {"sglang": "sglang", "vllm": "vllm"}


class UnknownEngine(ValueError):
    """An engine name provision does not know; its message is a sentence naming the ones it does."""


def refusal(name: object) -> str | None:
    """None for an engine provision knows, else the sentence that refuses it (pure)."""
    if isinstance(name, str) and name in _MODULES:
        return None
    return f"engine {name!r} is not one provision knows: {', '.join(KNOWN)}"


def get(name: str | None = None) -> "InferenceEngine":
    """The implementation for `name` (None: the default, sglang); UnknownEngine otherwise."""
    name = DEFAULT if name is None else name
    why = refusal(name)
    if why:
        raise UnknownEngine(why)
    return importlib.import_module(_MODULES[name]).ENGINE


def of_request(req: object) -> str | None:
    """The engine a host request names: its own "engine", else its profile's (a launch), else the
    first engine whose package one of its specs is relative to (a patch of vLLM's files looks for
    vLLM's installs; a spec of another package, flashinfer, names none), else None (the default).
    Pure."""
    if not isinstance(req, dict):
        return None
    name = req.get("engine") or (req.get("profile") or {}).get("engine")
    if isinstance(name, str):
        return name
    specs = ([req["spec"]] if isinstance(req.get("spec"), dict) else []) + list(req.get("specs") or [])
    by_package = {pkg: n for n, pkg in PACKAGES.items()}
    for spec in specs:
        if isinstance(spec, dict) and spec.get("package") in by_package:
            return by_package[spec["package"]]
    return None
