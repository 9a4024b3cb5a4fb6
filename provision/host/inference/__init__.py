"""The inference engines: the servers provision launches (SGLang, vLLM).  STDLIB ONLY.

Not to be confused with ``host/engine/``, the *patch* engine (AST edits of an engine's files):
this package says what each *inference* engine is, so that no verb asks "is it SGLang?".

One interface (base.py ``InferenceEngine``), one implementation per engine (sglang.py, vllm.py), picked once
from data: a profile's ``launch.engine`` (a playbook that names none is SGLang's: ``DEFAULT``, a
config default), kept in the server's record. The engine is resolved once, where a request enters
the host agent (``resolve``: the request's own, its profile's, its specs' package, else the engine
whose install the host has), and passed down: ``get`` takes a name, never none. Every layer above
asks the engine it was given: discovery (what an install is), the flag reader (where its flags are
declared), the start command and its secrets, readiness, the log's name and its reader, the
overlay's variable, the EAGLE-3 interface a target class must have, the server-process rule, the
bench's endpoints.

An implementation is imported only when it is asked for (``get``): a no-op ``patch`` or
``reconcile`` loads none it does not need. The verbs (``tasks/``, ``cli/``) never import an
implementation's module directly (an import-linter contract says so): they name an engine by its
data, and this module picks.
"""

from __future__ import annotations

import importlib

from provision.host.lib.modules import PACKAGE as SPEC_PACKAGE

TYPE_CHECKING = False  # not typing's: the fast path imports this module, and a host step never imports typing
if TYPE_CHECKING:
    from provision.host.inference.base import InferenceEngine

DEFAULT = "sglang"
# A request's `engine` that leaves the choice to the host: its one engine's install (agent.py);
# several: the request is refused, naming each (a command given no --engine: audit, spec new).
FROM_HOST = "host"
# name -> the module holding its implementation (ENGINE): the one list of the engines provision knows
_MODULES = {"sglang": "provision.host.inference.sglang", "vllm": "provision.host.inference.vllm"}
KNOWN = tuple(_MODULES)
# name -> the Python package an install of it is (its implementation's `package`, said here too so
# that a request's specs name their engine without importing it; a unit test holds the two equal)
PACKAGES = {"sglang": "sglang", "vllm": "vllm"}


def register(name: str, module: str, package: str) -> None:
    """Make one more engine known: `module` holds its implementation (ENGINE, an InferenceEngine)
    and `package` is the Python package an install of it is. A third engine is that module (its
    readers named in it as data) and this one line: every verb then finds it by its name."""
    global KNOWN
    _MODULES[name] = module
    PACKAGES[name] = package
    KNOWN = tuple(_MODULES)


class UnknownEngine(ValueError):
    """An engine name provision does not know; its message is a sentence naming the ones it does."""


def refusal(name: object) -> str | None:
    """None for an engine provision knows, else the sentence that refuses it (pure)."""
    if isinstance(name, str) and name in _MODULES:
        return None
    return f"engine {name!r} is not one provision knows: {', '.join(KNOWN)}"


def get(name: str) -> "InferenceEngine":
    """The implementation for `name`; UnknownEngine (a sentence naming the ones provision knows)
    for any other value, None included: an engine is always named."""
    why = refusal(name)
    if why:
        raise UnknownEngine(why)
    return importlib.import_module(_MODULES[name]).ENGINE


def engines() -> "list[InferenceEngine]":
    """Every engine provision knows, in KNOWN's order (what a question about any engine's server asks)."""
    return [get(n) for n in KNOWN]


def of_package(package: object) -> str | None:
    """The engine whose install the Python package `package` is, or None (flashinfer: no engine's)."""
    return next((n for n, pkg in PACKAGES.items() if pkg == package), None)


# A server record written before records named their engine (round 4's and older) is SGLang's: the
# only engine provision launched then. Said once, here, for every reader of an old record.
RECORD_BEFORE_ENGINES = "sglang"


def of_record(rec: dict) -> str:
    """The engine of a server's record: the one it names, else (an older record) SGLang's."""
    name = rec.get("engine") if isinstance(rec, dict) else None
    return name if isinstance(name, str) and name else RECORD_BEFORE_ENGINES


def load(ref: str):
    """The object a `module:attribute` reference names (an engine's reader: its module imported
    when it is asked for, so a verb loads only the readers of the engine it was given)."""
    module, _, attr = ref.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


def of_request(req: object) -> str | None:
    """The engine a host request names: its own "engine", else its profile's (a launch), else the
    first engine whose package one of its specs is relative to (a patch of vLLM's files looks for
    vLLM's installs; a spec of another package, flashinfer, names none), else None (the agent then
    resolves it from the host's install). Pure."""
    if not isinstance(req, dict):
        return None
    name = req.get("engine") or (req.get("profile") or {}).get("engine")
    if name == FROM_HOST:
        return None
    if isinstance(name, str):
        return name
    specs = ([req["spec"]] if isinstance(req.get("spec"), dict) else []) + list(req.get("specs") or [])
    for spec in specs:  # a spec that names no package is of the spec format's default one (lib/modules.py)
        name = of_package(spec.get("package") or SPEC_PACKAGE) if isinstance(spec, dict) else None
        if name:
            return name
    return None


def for_request(req: object) -> "InferenceEngine":
    """The engine of a host request: the one it names (the agent resolved it on entry: its own
    "engine", its profile's, its specs' package, or the host's install); UnknownEngine when none."""
    name = of_request(req)
    if name is None:
        raise UnknownEngine("the request names no inference engine (its `engine`, its profile's, or a spec's "
                            f"package: one of {', '.join(KNOWN)})")
    return get(name)
