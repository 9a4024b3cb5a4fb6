"""Audit an installed vLLM's model registry for EAGLE-3 interface gaps.  STDLIB ONLY, Python 3.10.

vLLM decides EAGLE-3 support with its runtime-checkable ``SupportsEagle3`` protocol
(``model_executor/models/interfaces.py``): a class has it when every member of the protocol is
bound on it, itself or through a base. Every model file is read with ``ast``, never imported.

``audit_registry(package_dir)`` reads the registry (``model_executor/models/registry.py``: every
module-level dict literal of ``"Arch": ("module", "Class")`` entries), then, for each registered
class that lacks a member of this release's protocol (engine/interface.py reads it), looks in its
``__init__`` for the model it holds on ``self.<attr>``:

- ``init_vllm_registered_model(..., architectures=["Arch", ...])``: the registry's classes for them;
- ``Class(...)``: that class, resolved through the module's imports;
- ``self.method(...)``: what that method (the class's own or inherited, the nearest first)
  returns, when it returns ``Class(...)`` (MiniCPM-V's ``init_llm``).

Verdicts, for a wrapper that lacks members:

``fixable``  every class it may hold there has the whole interface: delegation closes the gap
             (`provision spec new CLASS` writes an interface spec for it);
``unknown``  it builds its language model from the config (``architectures=config...``): the
             inner class is chosen at run time;
classes whose inner models lack the interface too (or that hold none) are not wrappers with a gap
this audit can close, and are counted, not listed.
"""

from __future__ import annotations

import ast
import os

from provision.host.engine.interface import protocol_members
from provision.host.engine.pysource import Module, Resolver, scope_bindings
from provision.host.engine.spec import EngineError
from provision.host.lib.modules import make_resolver

PACKAGE = "vllm"
MODELS = "model_executor/models"  # where the registry and the model classes live (the engine's models_subdir)
# vLLM 0.32's EAGLE proposer copies a multimodal target's placeholder token into the drafter's config, from
# `config.image_token_index` for every class it does not name (qwen2-audio-proposer-vllm says more)
PROPOSER = "v1/spec_decode/llm_base_proposer.py"
_PROPOSER_FALLBACK = "target_model.config.image_token_index"
LM_ATTRS = ("language_model", "llm", "lm", "text_model", "model")
VERDICTS = ("fixable", "unknown")


def _registry(resolver: Resolver) -> dict:
    """Arch -> (module name, class name) from the registry's dict literals."""
    mod = resolver.module(f"{PACKAGE}.{MODELS.replace('/', '.')}.registry")
    out: dict = {}
    if mod is None:
        return out
    for st in mod.tree.body:
        value = st.value if isinstance(st, (ast.Assign, ast.AnnAssign)) else None
        for d in ast.walk(value) if value is not None else ():
            if not isinstance(d, ast.Dict):
                continue
            for k, v in zip(d.keys, d.values):
                if (isinstance(k, ast.Constant) and isinstance(k.value, str) and isinstance(v, ast.Tuple)
                        and len(v.elts) == 2 and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in v.elts)):
                    out.setdefault(k.value, (v.elts[0].value, v.elts[1].value))
    return out


class _Audit:
    def __init__(self, package_dir: str, protocol: str) -> None:
        self.notes: list = []
        self.unreadable: list = []  # (module, why): files there that could not be read
        self.protocol = protocol
        base = make_resolver(package_dir, PACKAGE)

        def read(name: str):
            try:
                return base(name)
            except OSError as exc:
                self.unreadable.append((name, str(exc)))
                raise

        self.resolver = Resolver(read, self.notes, PACKAGE)
        spec = {"name": "audit", "kind": "interface", "package": PACKAGE, "file": protocol.partition(":")[0],
                "class": "X", "delegate": "x", "protocol": protocol}
        attrs, methods = protocol_members(spec, make_resolver(package_dir, PACKAGE))
        self.members = [n for n, _ in attrs] + [n for n, _ in methods]
        self.registry = _registry(self.resolver)
        self._lacks: dict = {}

    def load(self, module: str, cls: str):
        mod = self.resolver.module(f"{PACKAGE}.{MODELS.replace('/', '.')}.{module}")
        if mod is None:
            return None
        hits = [n for n in mod.tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
        return (mod, hits[0]) if len(hits) == 1 else None

    def lacks(self, mod: Module, cls) -> list:
        """The protocol's members `cls` does not bind, itself or through a base."""
        key = (mod.name, cls.name, cls.lineno)
        if key not in self._lacks:
            have = {b[0] for b in scope_bindings(cls.body)} | set(self.resolver.inherited(mod, cls))
            self._lacks[key] = [m for m in self.members if m not in have]
        return self._lacks[key]

    def _methods(self, mod: Module, cls) -> dict:
        """name -> (module, def) for the class's methods and its bases', the nearest first."""
        out: dict = {}
        for m, c in [(mod, cls)] + self.resolver.base_classes(mod, cls):
            for st in c.body:
                if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.setdefault(st.name, (m, st))
        return out

    def _value_classes(self, mod: Module, methods: dict, call, depth: int = 0):
        """The classes a call's value may be: a list of (module, ClassDef), or "config" (chosen from
        the config at run time), or None (not a model this audit can follow)."""
        if not isinstance(call, ast.Call) or depth > 3:
            return None
        f = call.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        if name == "init_vllm_registered_model":
            archs = next((kw.value for kw in call.keywords if kw.arg == "architectures"), None)
            if not isinstance(archs, (ast.List, ast.Tuple)) or not all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in archs.elts):
                return "config"
            found = [self.load(*self.registry[a.value]) for a in archs.elts if a.value in self.registry]
            return [x for x in found if x is not None] or None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self" and f.attr in methods:
            m, fn = methods[f.attr]
            for node in ast.walk(fn):
                if isinstance(node, ast.Return):
                    r = self._value_classes(m, methods, node.value, depth + 1)
                    if r is not None:
                        return r
            return None
        r = self.resolver.resolve_class(mod, f)
        return [r] if r is not None else None

    def inner(self, mod: Module, cls) -> list:
        """(attr, classes or "config") for each self.<attr> its __init__ gives a model."""
        methods = self._methods(mod, cls)
        out, seen = [], set()
        # every __init__ in the class's bases runs (super().__init__): the model may be set in any
        for m, c in [(mod, cls)] + self.resolver.base_classes(mod, cls):
            init = next((st for st in c.body if isinstance(st, ast.FunctionDef) and st.name == "__init__"), None)
            for node in ast.walk(init) if init is not None else ():
                if not isinstance(node, ast.Assign) or len(node.targets) != 1:
                    continue
                t = node.targets[0]
                if not (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self") \
                        or t.attr in seen:
                    continue
                got = self._value_classes(m, methods, node.value)
                if got is not None:
                    seen.add(t.attr)
                    out.append((t.attr, got))
        return out

    def judge(self, arch: str, module: str, cls_name: str) -> dict | None:
        found = self.load(module, cls_name)
        if found is None:
            return None
        mod, cls = found
        missing = self.lacks(mod, cls)
        if not missing:
            return None
        row = {"class": cls_name, "arch": arch, "file": f"{MODELS}/{module}.py", "missing": missing,
               "attr": None, "inner": [], "verdict": None, "reason": "", "kind": "interface",
               "protocol": self.protocol}
        for attr, classes in sorted(self.inner(mod, cls), key=lambda x: LM_ATTRS.index(x[0]) if x[0] in LM_ATTRS else 99):
            if classes == "config":
                if attr in LM_ATTRS and row["verdict"] is None:
                    row.update(attr=attr, verdict="unknown",
                               reason=f"self.{attr} is built from the config's architectures at run time")
                continue
            names = [c.name for _m, c in classes]
            if all(not self.lacks(m, c) for m, c in classes):
                row.update(attr=attr, inner=names, verdict="fixable",
                           reason=f"self.{attr} ({', '.join(names)}) has the whole interface")
                return row
        return row if row["verdict"] else None


def _cannot_judge(message: str) -> dict:
    return {"wrappers": [], "registered": 0, "files_scanned": 0, "notes": [message],
            "error": {"kind": "unreadable", "message": message}}


def audit_registry(package_dir: str, protocol: str) -> dict:
    """The gaps of the vLLM install at `package_dir` (the `vllm` package directory) against the
    interface `protocol` (FILE:Class, the engine's eagle3_protocol): {"wrappers": [rows: class, arch
    (None: not registered itself), file, missing, attr, inner, verdict, reason, kind, protocol],
    "registered": registry entries, "classes": classes judged, "files_scanned", "notes"}."""
    try:
        a = _Audit(package_dir, protocol)
    except EngineError as e:
        return {"wrappers": [], "registered": 0, "files_scanned": 0, "notes": [e.message], "error": e.as_dict()}
    if not a.registry:  # no registry read: nothing judged is no clean bill
        where = os.path.join(package_dir, MODELS, "registry.py")
        why = next((w for n, w in a.unreadable if n.endswith(".registry")), "no model registry in it")
        return _cannot_judge(f"{where} cannot be read ({why}): the audit judges no install it cannot read")
    rows, seen = [], set()
    for arch, (module, cls) in sorted(a.registry.items()):
        if (module, cls) in seen:
            continue
        seen.add((module, cls))
        row = a.judge(arch, module, cls)
        if row is not None:
            rows.append(row)
    # the classes a registered module defines besides the registered one: what a registered
    # dispatcher instantiates (MiniCPM-V's MiniCPMV picks MiniCPMV2_6, MiniCPMV4_5, ... by version)
    registered = {c for _m, c in seen}
    for module in sorted({m for m, _c in seen}):
        mod = a.resolver.module(f"{PACKAGE}.{MODELS.replace('/', '.')}.{module}")
        for node in (mod.tree.body if mod is not None else []):
            if isinstance(node, ast.ClassDef) and node.name not in registered and (module, node.name) not in seen:
                seen.add((module, node.name))
                row = a.judge(None, module, node.name)
                if row is not None and row["verdict"] == "fixable":
                    rows.append(row)
    if a.unreadable:  # a model file that cannot be read is not one without gaps
        name, why = a.unreadable[0]
        more = f" (and {len(a.unreadable) - 1} more)" if len(a.unreadable) > 1 else ""
        return _cannot_judge(f"{why}{more}: the audit judges no install it cannot read")
    rows.sort(key=lambda r: (r["verdict"] != "fixable", r["class"]))
    for row in rows:
        if proposer_reads_index(package_dir, row["class"]):
            row["proposer"] = PROPOSER
    files = len([m for m in a.resolver.cache.values() if m is not None])
    return {"wrappers": rows, "registered": len(a.registry), "classes": len(seen), "files_scanned": files, "notes": a.notes[:20],
            "models_dir": os.path.join(package_dir, MODELS)}


def proposer_reads_index(package_dir: str, cls: str) -> bool:
    """Does the release's EAGLE proposer read `config.image_token_index` of a multimodal target of class
    `cls` (a release whose proposer has the fallback and names no branch of its own for `cls`)? Such a
    class also needs the proposer fix where its config has no image_token_index (Qwen2-Audio's
    placeholder is audio_token_index): the drafter's load dies with AttributeError otherwise."""
    try:
        with open(os.path.join(package_dir, PROPOSER), encoding="utf-8") as fh:
            src = fh.read()
    except (OSError, UnicodeDecodeError):
        return False
    return _PROPOSER_FALLBACK in src and f'"{cls}"' not in src


def architectures(package_dir: str, file: str, cls: str) -> list:
    """The architectures vLLM's registry maps to class `cls` of `file` (relative to the package:
    model_executor/models/qwen2_audio.py), sorted: what a replacement class is registered under (the
    overlay's register()). [] when the registry names none (the class's own name is the caller's guess)."""
    rel = file[:-3] if file.endswith(".py") else file
    prefix = MODELS + "/"
    if not rel.startswith(prefix):
        return []
    module = rel[len(prefix):].replace("/", ".")
    reg = _registry(Resolver(make_resolver(package_dir, PACKAGE), [], PACKAGE))
    return sorted(arch for arch, (m, c) in reg.items() if (m, c) == (module, cls))


def target_interface(package_dir: str, protocol: str, arch: str) -> dict | None:
    """For preflight: {"class", "missing"} of the class vLLM's registry maps `arch` to, the members
    of the release's own protocol it lacks (none: it has the interface); None when the registry does
    not name it or its class cannot be read."""
    try:
        a = _Audit(package_dir, protocol)
    except EngineError:
        return None
    if arch not in a.registry:
        return None
    found = a.load(*a.registry[arch])
    if found is None:
        return None
    mod, cls = found
    out = {"class": cls.name, "missing": a.lacks(mod, cls)}
    ours = [] if out["missing"] else _ours(package_dir, a.registry[arch][0], cls)
    if ours:  # provision's delegation: does the model it delegates to have what it forwards to?
        for attr, classes in a.inner(mod, cls):
            if isinstance(classes, list) and classes and attr in LM_ATTRS:
                lacking = sorted({m for im, ic in classes for m in a.lacks(im, ic) if m in ours})
                if lacking and all(set(ours) & set(a.lacks(im, ic)) for im, ic in classes):
                    out["inner_lacks"] = {"attr": attr, "classes": [c.name for _m, c in classes], "missing": lacking}
                break
    return out


def _ours(package_dir: str, module: str, cls) -> list:
    """The methods of `cls` provision's managed blocks define (a delegation it wrote), by line."""
    from provision.host.engine.markers import scan_markers
    from provision.host.engine.pysource import split_lines

    try:
        with open(os.path.join(package_dir, *MODELS.split("/"), module + ".py"), encoding="utf-8") as fh:
            lines = split_lines(fh.read())
    except (OSError, UnicodeDecodeError):
        return []
    spans = [(b[0], m["ends"][0]) for m in scan_markers(lines).values() for b in m["begins"][:1] if m["ends"]]
    return [st.name for st in cls.body if isinstance(st, ast.FunctionDef)
            and any(lo < st.lineno - 1 < hi for lo, hi in spans)]


def allow_list(package_dir: str, file: str, names: tuple) -> dict | None:
    """For preflight: the release's EAGLE-3 model-type allow-list, {"name", "entries", "file"}: a list
    literal of strings bound to one of `names` anywhere in `file` (vLLM 0.16-0.17 bind it inside
    SpeculativeConfig._verify_args); None where the release has none (0.32 dropped it)."""
    try:
        with open(os.path.join(package_dir, file), "rb") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in names and isinstance(node.value, (ast.List, ast.Tuple, ast.Set)):
            entries = [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            return {"name": node.targets[0].id, "entries": entries, "file": file}
    return None
