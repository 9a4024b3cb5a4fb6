"""Audit an installed SGLang ``models/`` directory for EAGLE-3 delegation gaps.

Shipped to a GPU host in the bundle with the rest of provision/host/ and run there by the
host's own python (3.10 or later). It imports nothing but the standard library and the
engine's class-graph index (engine/audit_index.py, built with engine/pysource.py's AST
helpers), and nothing from SGLang: every model file is read with ``ast``, never imported.

``audit_models(models_dir)`` parses each ``*.py`` in ``sglang/srt/models/``
once, builds the class graph across those files (bases resolved through each
file's imports, methods defined or inherited), finds the WRAPPERS (a class
listed in an ``EntryClass`` whose ``__init__`` stores a model on ``self.<attr>``:
another ``EntryClass`` class, or any class that has a target method the wrapper
lacks, defined or inherited; its ``forward`` may call it or be it,
``self.forward = self.<attr>.forward``) and classifies each wrapper that lacks one of the
EAGLE-3 target methods (``set_eagle3_layers_to_capture``, ``get_embed_and_head``):

``fixable``      every inner class has the target methods the wrapper lacks and the wrapper's
                 ``forward`` runs the inner model's own forward;
``conditional``  some possible inner classes have the methods, some don't;
``needs-more``   the forward bypasses the inner forward, or no inner class has
                 the methods, so delegation alone can't work;
``unknown``      the inner class is chosen at run time (registry or config
                 lookup, ``getattr``, ``__getattr__`` delegation).

A fixable gap becomes a patch spec on the control side (`provision spec new`:
provision/tasks/spec_new.py, ``spec_for`` and ``spec_yaml``), never here.
``python3 -m provision.host.engine.audit_cli [MODELS_DIR [PACKAGE_ROOT]]`` prints the audit as
JSON (engine/audit_cli.py).
"""

from __future__ import annotations

import ast
import gc
import os

from provision.host.engine.audit_index import (  # the method names are the audit's public names too
    MAX_DEPTH, PARITY_METHOD, SPEC_METHODS, TARGET_METHODS, FnInfo, Func, Index, IndexedClass, IndexedModule,
    is_self_attr, params_of, short)
from provision.host.engine.skeletons import Skeletons, cache_path

__all__ = ["DEFAULT_PARAMS", "PARITY_METHOD", "SPEC_METHODS", "TARGET_METHODS", "VERDICTS", "audit_models", "registry_of"]

DEFAULT_PARAMS = {
    "set_eagle3_layers_to_capture": "self, layer_ids=None",
    "get_embed_and_head": "self",
    "set_embed_and_head": "self, embed, head",
}
# Routines that run the language model they are handed: name -> positional index
# of their ``language_model`` parameter (``srt/managers/mm_utils.py``).
MM_ROUTINES = {"general_mm_embed_routine": 2}
# Attribute names that, when forward calls them, mark a run-time-chosen model as
# the wrapper's language model.
LM_ATTRS = ("language_model", "llm", "lm", "text_model")

VERDICTS = ("fixable", "conditional", "needs-more", "unknown")


class _Ctx:
    """Where an expression is evaluated: the instance's class, the module, the function."""

    __slots__ = ("inst", "mod", "info")

    def __init__(self, inst: IndexedClass | None, mod: IndexedModule, info: FnInfo) -> None:
        self.inst = inst
        self.mod = mod
        self.info = info


class _Auditor:
    def __init__(self, index: Index) -> None:
        self.ix = index
        self.entries: dict = {}  # key -> IndexedClass, every class listed in some EntryClass
        self._active: set = set()  # local names being followed (guards a = b; b = a)
        self._budget = 0           # evaluation steps left for the current class

    def _local(self, ctx: _Ctx, name: str, pick, depth: int) -> list:
        """Follow every value a local name is given, once per evaluation path."""
        key = (id(ctx.info), name)
        if key in self._active:
            return []
        self._active.add(key)
        try:
            return [o for v in ctx.info.assigns[name] for o in pick(ctx, v, depth + 1)]
        finally:
            self._active.discard(key)

    # ---- EntryClass ------------------------------------------------------
    def entry_classes(self, mod: IndexedModule) -> list:
        out: list = []
        self._entry(mod, mod.entry, out, 0)
        return out

    def _entry(self, mod: IndexedModule, expr, out: list, depth: int) -> None:
        if expr is None or depth > MAX_DEPTH:
            return
        if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
            for elt in expr.elts:
                self._entry(mod, elt.value if isinstance(elt, ast.Starred) else elt, out, depth + 1)
        elif isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            self._entry(mod, expr.left, out, depth + 1)
            self._entry(mod, expr.right, out, depth + 1)
        elif isinstance(expr, ast.IfExp):
            self._entry(mod, expr.body, out, depth + 1)
            self._entry(mod, expr.orelse, out, depth + 1)
        elif isinstance(expr, (ast.Name, ast.Attribute)):
            r = self.ix.resolve_expr(mod, expr)
            if isinstance(r, IndexedClass):
                out.append(r)
            elif isinstance(expr, ast.Name) and expr.id != "EntryClass":
                values = mod.assigns.get(expr.id) or []
                if len(values) == 1:
                    self._entry(mod, values[0], out, depth + 1)

    # ---- what __init__ stores on self --------------------------------------
    def init_functions(self, c: IndexedClass) -> list:
        """(defining IndexedClass, FunctionDef) of every __init__ that runs, plus self-helpers they call."""
        out: list = []
        seen: set = set()
        cur = [c]
        while cur:
            k = cur.pop(0)
            if k.key in seen or len(seen) > MAX_DEPTH:
                continue
            seen.add(k.key)
            fn = k.methods.get("__init__")
            if fn is not None:
                out.append((k, fn))
                if not self.ix.info(fn, k.module).calls_init:
                    break
            cur.extend(self.ix.bases(k))
        # helpers: ``self._build_llm()`` called from __init__ that store on self themselves
        methods = self.ix.all_methods(c)
        done = {id(fn) for _, fn in out}
        i = 0
        while i < len(out) and len(out) < 32:
            owner, fn = out[i]
            i += 1
            for node in self.ix.info(fn, owner.module).nodes:
                if isinstance(node, ast.Call) and is_self_attr(node.func):
                    got = methods.get(node.func.attr)
                    if got and got[1] is not None and id(got[1]) not in done and node.func.attr != "__init__":
                        done.add(id(got[1]))
                        out.append(got)
        return out

    def outcomes(self, ctx: _Ctx, expr, depth: int = 0) -> list:
        """Instances ``expr`` may evaluate to: [("class", IndexedClass) | ("dynamic", why)]."""
        self._budget -= 1
        if depth > MAX_DEPTH or self._budget < 0:
            return []
        if isinstance(expr, ast.IfExp):
            return self.outcomes(ctx, expr.body, depth + 1) + self.outcomes(ctx, expr.orelse, depth + 1)
        if isinstance(expr, ast.BoolOp):
            return [o for v in expr.values for o in self.outcomes(ctx, v, depth + 1)]
        if isinstance(expr, ast.NamedExpr):
            return self.outcomes(ctx, expr.value, depth + 1)
        if isinstance(expr, ast.Name) and expr.id in ctx.info.assigns and expr.id not in ctx.info.imports:
            return self._local(ctx, expr.id, self.outcomes, depth)
        if isinstance(expr, ast.Call):
            followed = self._follow_call(ctx, expr, depth, instances=True)
            if followed is not None:
                return followed
            return self.candidates(ctx, expr.func, depth + 1)
        return []

    def _follow_call(self, ctx: _Ctx, call, depth: int, instances: bool):
        """What a call to a factory (a self-method or a module function) returns, else None."""
        f = call.func
        target = None
        if is_self_attr(f) and ctx.inst is not None:
            got = self.ix.all_methods(ctx.inst).get(f.attr)
            if got is not None and got[1] is not None:
                target = (ctx.inst, got[0].module, got[1])
        elif isinstance(f, (ast.Name, ast.Attribute)) and not (isinstance(f, ast.Name) and f.id in ctx.info.assigns):
            r = self.ix.resolve_expr(ctx.mod, f, ctx.info, load=False)
            if isinstance(r, Func):
                target = (None, r.module, r.node)
        if target is None:
            return None
        inst, mod, fn = target
        info = self.ix.info(fn, mod)
        sub = _Ctx(inst, mod, info)
        pick = self.outcomes if instances else self.candidates
        return [o for r in info.returns for o in pick(sub, r, depth + 1)]

    def candidates(self, ctx: _Ctx, expr, depth: int) -> list:
        """Classes ``expr`` may be when it is called: [("class", IndexedClass) | ("dynamic", why)]."""
        self._budget -= 1
        if depth > MAX_DEPTH or self._budget < 0:
            return []
        if isinstance(expr, ast.IfExp):
            return self.candidates(ctx, expr.body, depth + 1) + self.candidates(ctx, expr.orelse, depth + 1)
        if isinstance(expr, ast.BoolOp):
            return [o for v in expr.values for o in self.candidates(ctx, v, depth + 1)]
        if isinstance(expr, ast.Name) and expr.id in ctx.info.assigns and expr.id not in ctx.info.imports:
            return self._local(ctx, expr.id, self.candidates, depth)
        if is_self_attr(expr):
            if ctx.inst is None:
                return [("dynamic", f"`{short(expr)}`")]
            got = self.ix.class_attr(ctx.inst, expr.attr)
            if got is None:
                if expr.attr in self.ix.all_methods(ctx.inst):
                    return []  # calling a method: handled by _follow_call
                return [("dynamic", f"the attribute `{short(expr)}`")]
            owner, value = got
            if isinstance(value, ast.ClassDef):
                return []  # a nested helper class, never an EntryClass model
            return self.candidates(_Ctx(ctx.inst, owner.module, ctx.info), value, depth + 1)
        if isinstance(expr, (ast.Name, ast.Attribute)):
            r = self.ix.resolve_expr(ctx.mod, expr, ctx.info, load=False)
            return [("class", r)] if isinstance(r, IndexedClass) else []
        if isinstance(expr, ast.Subscript):
            values = self._dict_values(ctx, expr.value)
            if values is None:
                return [("dynamic", f"the lookup `{short(expr)}`")]
            return [o for v in values for o in self.candidates(ctx, v, depth + 1)]
        if isinstance(expr, ast.Call):
            f = expr.func
            if isinstance(f, ast.Attribute) and f.attr == "get":
                values = self._dict_values(ctx, f.value)
                if values is not None:
                    return [o for v in values for o in self.candidates(ctx, v, depth + 1)]
            followed = self._follow_call(ctx, expr, depth, instances=False)
            if followed is not None:
                return followed
            return [("dynamic", f"the call `{short(expr)}`")]
        return []

    def _dict_values(self, ctx: _Ctx, expr):
        """The values of the dict literal ``expr`` is or names (locally or at module level), else None."""
        if isinstance(expr, ast.Dict):
            return list(expr.values)
        if isinstance(expr, ast.Name):
            values = ctx.info.assigns.get(expr.id) or ctx.mod.assigns.get(expr.id) or []
            if len(values) == 1 and isinstance(values[0], ast.Dict):
                return list(values[0].values)
        return None

    # ---- delegation through __getattr__ / __call__ ------------------------------
    def delegate_of(self, c: IndexedClass, dunder: str) -> str | None:
        got = self.ix.all_methods(c).get(dunder)
        if got is None or got[1] is None:
            return None
        for node in self.ix.info(got[1], got[0].module).nodes:
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if dunder == "__getattr__":
                if isinstance(f, ast.Name) and f.id == "getattr" and node.args and is_self_attr(node.args[0]):
                    return node.args[0].attr
            elif is_self_attr(f):
                return f.attr
            elif isinstance(f, ast.Attribute) and f.attr == "forward" and is_self_attr(f.value):
                return f.value.attr
        return None

    # ---- forward -----------------------------------------------------------
    def forward_use(self, c: IndexedClass, attr: str) -> tuple:
        """(runs self.<attr>'s own forward, hands it over as language_model, other uses seen)."""
        methods = self.ix.all_methods(c)
        got = methods.get("forward")
        if got is None or got[1] is None:
            return False, False, ["defines no forward"]
        todo = [got]
        done: set = set()
        evidence: list = []
        runs = routed = False
        while todo:
            owner, fn = todo.pop()
            if id(fn) in done or len(done) > 16:
                continue
            done.add(id(fn))
            info = self.ix.info(fn, owner.module)
            aliases = {n for n, vals in info.assigns.items() if any(is_self_attr(v, attr) for v in vals)}

            def inner(node) -> bool:
                return is_self_attr(node, attr) or (isinstance(node, ast.Name) and node.id in aliases)

            for node in info.nodes:
                if isinstance(node, ast.Call):
                    f = node.func
                    if inner(f) or (isinstance(f, ast.Attribute) and f.attr == "forward" and inner(f.value)):
                        runs = True
                        continue
                    fname = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                    handed = [kw.value for kw in node.keywords if kw.arg == "language_model"]
                    pos = MM_ROUTINES.get(fname)
                    if pos is not None and len(node.args) > pos:
                        handed.append(node.args[pos])
                    for value in handed:
                        if inner(value):
                            runs = routed = True
                        elif isinstance(value, ast.Attribute) and inner(value.value):
                            evidence.append(f"hands {short(value)} to {fname}() as the language model")
                    if is_self_attr(f):
                        if f.attr in methods and methods[f.attr][1] is not None:
                            todo.append(methods[f.attr])
                        elif f.attr == "logits_processor":
                            evidence.append("applies its own self.logits_processor")
                elif (
                    isinstance(node, ast.Attribute)
                    and node.attr in ("model", "lm_head", "logits_processor")
                    and inner(node.value)
                ):
                    evidence.append(f"reads {short(node)}")
        handed_over = {e.split()[1] for e in evidence if e.startswith("hands ")}
        evidence = [e for e in evidence if not (e.startswith("reads ") and e.split()[1] in handed_over)]
        return runs, routed, sorted(set(evidence), key=lambda e: (not e.startswith("hands "), e))

    # ---- one EntryClass class -------------------------------------------------
    def analyse(self, c: IndexedClass):
        self._budget = 20000
        slots: dict = {}
        forward_of = None  # `self.forward = self.<attr>.forward` in __init__: forward is the inner one's
        lacks = [m for m in TARGET_METHODS if m not in self.ix.all_methods(c)]
        for owner, fn in self.init_functions(c):
            info = self.ix.info(fn, owner.module)
            ctx = _Ctx(c, owner.module, info)
            for attr, value in info.self_assigns:
                if attr == "forward":
                    inner_fn = value.value if isinstance(value, ast.Attribute) and value.attr == "forward" else value
                    if is_self_attr(inner_fn):
                        forward_of = inner_fn.attr
                outs = self.outcomes(ctx, value)
                if not outs:
                    continue
                slot = slots.setdefault(
                    attr, {"inner": [], "dynamic": [], "other": [], "line": getattr(value, "lineno", 0)}
                )
                for kind, what in outs:
                    if kind == "class":
                        # a model: registered itself, or any class that has a target method this one
                        # lacks, its own or inherited
                        if what is not c and (what.key in self.entries or
                                              any(m in self.ix.all_methods(what) for m in lacks)):
                            if what not in slot["inner"]:
                                slot["inner"].append(what)
                        elif what.name not in slot["other"]:
                            slot["other"].append(what.name)
                    elif what not in slot["dynamic"]:
                        slot["dynamic"].append(what)

        getattr_to = self.delegate_of(c, "__getattr__")
        call_to = self.delegate_of(c, "__call__")
        found = []
        for attr, slot in slots.items():
            if not slot["inner"] and not slot["dynamic"]:
                continue
            runs, routed, evidence = (True, False, []) if attr == forward_of else self.forward_use(c, attr)
            relevant = (
                bool(slot["inner"])
                or attr in (getattr_to, call_to)
                or routed
                or (runs and attr in LM_ATTRS)
            )
            if relevant:
                found.append((attr, slot, runs, evidence))
        if not found:
            if getattr_to is None:
                return None
            slot = slots.get(getattr_to) or {"inner": [], "dynamic": [], "other": [], "line": 0}
            found.append((getattr_to, slot, False, []))
        # The delegate: the attribute forward runs, then one holding an EntryClass model.
        found.sort(key=lambda t: (not t[2], not t[1]["inner"], t[1]["line"]))
        attr, slot, runs, evidence = found[0]
        return self.classify(c, attr, slot, runs, evidence, getattr_to, [t[0] for t in found[1:]])

    def classify(self, c, attr, slot, runs, evidence, getattr_to, others) -> dict:
        own = self.ix.all_methods(c)
        has = [m for m in SPEC_METHODS if m in own]
        missing = [m for m in TARGET_METHODS if m not in own]
        inner_recs, have, lack = [], [], []
        by_class = {}
        for inner in slot["inner"]:
            im = self.ix.all_methods(inner)
            by_class[inner.name] = im
            present = [m for m in SPEC_METHODS if m in im]
            inner_recs.append({
                "class": inner.name,
                "file": inner.module.rel,
                "has": present,
                "lacks": [m for m in SPEC_METHODS if m not in im],
            })
            (have if all(m in im for m in missing) else lack).append(inner.name)  # what the wrapper lacks
        methods: dict = {}
        for name in have + lack:  # params from classes that have both first
            for m in SPEC_METHODS:
                got = by_class[name].get(m)
                if m not in methods and got is not None:
                    methods[m] = params_of(got[1]) if got[1] is not None else DEFAULT_PARAMS[m]
        rec = {
            "class": c.name,
            "file": c.module.rel,
            "line": c.node.lineno,
            "attr": attr,
            "inner": inner_recs,
            "inner_have": have,
            "inner_lack": lack,
            "dynamic": list(slot["dynamic"]),
            "other_attrs": others,
            "forward_runs_inner": runs,
            "has": has,
            "missing": missing,
            "methods": methods,
        }
        if slot["dynamic"] or getattr_to is not None:
            why = []
            if slot["dynamic"]:
                why.append(f"self.{attr} is built from {'; '.join(slot['dynamic'])}, chosen at run time")
            if getattr_to is not None:
                why.append(f"__getattr__ forwards unknown attributes to self.{getattr_to}")
            visible = have + lack + [f"{n} (not an EntryClass model)" for n in slot.get("other", [])]
            seen = f" (statically visible: {', '.join(visible)})" if visible else ""
            verdict, reason = "unknown", " and ".join(why) + seen + "; read the real inner class before patching."
        elif not runs:
            how = "; ".join(evidence) if evidence else "never calls it"
            verdict = "needs-more"
            reason = (
                f"forward never runs self.{attr}(...) ({how}), so the inner forward that returns the "
                "captured EAGLE-3 hidden states is bypassed and delegation alone is not enough."
            )
        elif not lack:
            verdict = "fixable"
            reason = (
                f"self.{attr} is {' or '.join(have)}, which "
                f"{'has' if len(have) == 1 else 'all have'} "
                f"{'both target methods' if len(missing) == len(TARGET_METHODS) else ' and '.join(missing)}, "
                "and forward runs it, "
                "so delegating the methods is enough."
            )
        elif have:
            verdict = "conditional"
            reason = (
                f"self.{attr} is {' or '.join(have)} (with the methods) or {' or '.join(lack)} "
                "(without them) depending on the config, so delegation only helps the former."
            )
        else:
            verdict = "needs-more"
            reason = (
                f"self.{attr} is {' or '.join(lack)}, which lacks "
                f"{' and '.join(m for m in missing if not all(m in by_class[n] for n in lack))}, "
                "so the inner class needs the methods before delegation can help."
            )
        rec["verdict"] = verdict
        rec["reason"] = reason
        return rec


def _audit(index: Index, models_dir: str, files: list, prefix: str) -> tuple:
    scanned = []
    for name in files:
        is_pkg = name == "__init__.py"
        dotted = prefix if is_pkg else prefix + "." + name[:-3]
        mod = index.load(dotted, os.path.join(models_dir, name), is_pkg, record=True)
        if mod is not None:
            scanned.append(mod)

    auditor = _Auditor(index)
    ordered = []
    for mod in scanned:
        for c in auditor.entry_classes(mod):
            if c.key not in auditor.entries:
                auditor.entries[c.key] = c
                ordered.append(c)

    gaps, ok = [], []
    for c in ordered:
        rec = auditor.analyse(c)
        if rec is not None:
            (gaps if rec["missing"] else ok).append(rec)
    return gaps, ok, len(auditor.entries), _registry(index, ordered)


def _registry(index: Index, ordered: list) -> dict:
    """The registry (every EntryClass name, as models/registry.py collects them) and, per class, the
    EAGLE-3 target methods it neither defines nor inherits: what preflight needs (ops/preflight_model.py)."""
    registry: dict = {}
    for c in ordered:
        own = index.all_methods(c)
        registry.setdefault(c.name, {"file": c.module.rel,
                                     "missing": [m for m in TARGET_METHODS if m not in own],
                                     "getattr": "__getattr__" in own})
    return registry


def registry_of(models_dir: str, package_root: str | None = None, state_dir: str | None = None) -> dict:
    """Only the ``registry`` of :func:`audit_models` (no wrapper analysis: about a third of the time).
    `state_dir`: each file's skeleton kept there between reads (engine/skeletons.py: one changed
    file is one parse, not the directory's)."""
    models_dir = os.path.abspath(models_dir)
    if not os.path.isdir(models_dir):
        raise FileNotFoundError(f"no models directory at {models_dir}")
    kept = Skeletons(cache_path(state_dir, models_dir) if state_dir else None)
    index = Index(package_root or os.path.dirname(os.path.dirname(models_dir)), parse=kept.parse)
    rel_dir = os.path.relpath(models_dir, index.root)
    prefix = index.pkg + ".srt.models" if rel_dir.startswith("..") else \
        ".".join([index.pkg] + [p for p in rel_dir.split(os.sep) if p not in ("", ".")])
    files = sorted(n for n in os.listdir(models_dir) if n.endswith(".py") and os.path.isfile(os.path.join(models_dir, n)))
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        auditor = _Auditor(index)
        ordered: list = []
        for name in files:
            is_pkg = name == "__init__.py"
            mod = index.load(prefix if is_pkg else prefix + "." + name[:-3], os.path.join(models_dir, name), is_pkg,
                             record=True)
            for c in auditor.entry_classes(mod) if mod is not None else []:
                if c.key not in auditor.entries:
                    auditor.entries[c.key] = c
                    ordered.append(c)
        registry = _registry(index, ordered)
        kept.save()
        return registry
    finally:
        index.release()
        if was_enabled:
            gc.enable()


def audit_models(models_dir: str, package_root: str | None = None) -> dict:
    """Audit every ``*.py`` in an installed ``sglang/srt/models`` directory.

    ``package_root`` is the ``sglang`` package directory (default: models_dir/../..);
    bases imported from elsewhere in it are resolved there, and nowhere else.
    Returns a JSON-serialisable dict: ``models_dir``, ``files_scanned``,
    ``unparsable`` ([{file, error}]), ``wrappers`` (one gap record per wrapper that
    lacks a target method), ``ok_wrappers`` (wrappers that have both) and ``registry`` (every
    EntryClass name: its file, the target methods it lacks, whether it defines ``__getattr__``).
    """
    models_dir = os.path.abspath(models_dir)
    if not os.path.isdir(models_dir):
        raise FileNotFoundError(f"no models directory at {models_dir}")
    if package_root is None:
        package_root = os.path.dirname(os.path.dirname(models_dir))
    index = Index(package_root)
    rel_dir = os.path.relpath(models_dir, index.root)
    if rel_dir.startswith(".."):
        prefix = index.pkg + ".srt.models"
    else:
        prefix = ".".join([index.pkg] + [p for p in rel_dir.split(os.sep) if p not in ("", ".")])

    files = sorted(
        name for name in os.listdir(models_dir)
        if name.endswith(".py") and os.path.isfile(os.path.join(models_dir, name))
    )
    for name in sorted(os.listdir(models_dir)):  # a FIFO or device named *.py: said, never opened (it would block)
        path = os.path.join(models_dir, name)
        if name.endswith(".py") and not os.path.isfile(path) and not os.path.isdir(path):
            index.unparsable.append({"file": index.rel(path), "error": "OSError: not a regular file"})
    was_enabled = gc.isenabled()
    # Parsing allocates millions of AST nodes and no garbage cycles: collecting
    # while they live would traverse all of them again and again. The index is
    # released (cycles broken, so plain refcounting frees it) before re-enabling.
    gc.disable()
    try:
        gaps, ok, n_entries, registry = _audit(index, models_dir, files, prefix)
    finally:
        index.release()
        if was_enabled:
            gc.enable()
    gaps.sort(key=lambda r: (r["file"], r["line"]))
    return {
        "models_dir": models_dir,
        "package_root": index.root,
        "files_scanned": len(files),
        "entry_classes": n_entries,
        "unparsable": index.unparsable,
        "wrappers": gaps,
        "ok_wrappers": sorted(r["class"] for r in ok),
        "registry": registry,
    }
