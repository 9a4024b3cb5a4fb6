"""Audit an installed SGLang ``models/`` directory for EAGLE-3 delegation gaps.

Shipped to a GPU host in the bundle with the rest of provision/host/ and run there by the
host's own python (3.10 or later). It imports nothing but the standard library and the
engine's AST helpers (engine/pysource.py: statement blocks, imports made absolute, the same
for every spec kind), and nothing from SGLang: every model file is read with ``ast``, never
imported. (It used to run as a lone file, ``python3 audit.py``, from before the bundle
carried the whole host package; nothing of provision uses that any more and it would need
its own copy of those helpers, so it is gone. ``python3 -m provision.host.engine.audit``
from a checkout does the same.)

``audit_models(models_dir)`` parses each ``*.py`` in ``sglang/srt/models/``
once, builds the class graph across those files (bases resolved through each
file's imports, methods defined or inherited), finds the WRAPPERS (a class
listed in an ``EntryClass`` whose ``__init__`` stores another ``EntryClass``
model on ``self.<attr>``) and classifies each wrapper that lacks one of the
EAGLE-3 target methods (``set_eagle3_layers_to_capture``, ``get_embed_and_head``):

``fixable``      every inner class has both target methods and the wrapper's
                 ``forward`` runs the inner model's own forward;
``conditional``  some possible inner classes have the methods, some don't;
``needs-more``   the forward bypasses the inner forward, or no inner class has
                 the methods, so delegation alone can't work;
``unknown``      the inner class is chosen at run time (registry or config
                 lookup, ``getattr``, ``__getattr__`` delegation).

``spec_for(gap)`` turns a fixable gap into the patch-spec dict the patch engine
consumes; ``spec_yaml(spec, note)`` renders it as a playbook without PyYAML.

``python3 -m provision.host.engine.audit [MODELS_DIR [PACKAGE_ROOT]]`` prints the audit as JSON.
"""

from __future__ import annotations

import ast
import gc
import json
import os
import re
import sys
import textwrap

from provision.host.engine.pysource import Module, Resolver, body_statements, import_bindings

TARGET_METHODS = ("set_eagle3_layers_to_capture", "get_embed_and_head")
PARITY_METHOD = "set_embed_and_head"  # called on the draft; injected for parity
SPEC_METHODS = TARGET_METHODS + (PARITY_METHOD,)
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
_MAX_DEPTH = 12
_SKIP_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.expr_context)


# --------------------------------------------------------------------------
# parsed modules
# --------------------------------------------------------------------------

class _ModRef:
    """A module used as a value (``import a.b as m`` binds ``m`` to one)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class _Func:
    """A module-level function used as a value (a factory that returns a model)."""

    __slots__ = ("module", "node")

    def __init__(self, module, node) -> None:
        self.module = module
        self.node = node


class _Module:
    __slots__ = ("name", "rel", "is_pkg", "classes", "assigns", "entry", "src")

    def __init__(self, name: str, rel: str, is_pkg: bool) -> None:
        self.name = name
        self.rel = rel
        self.is_pkg = is_pkg
        self.classes: dict = {}
        self.assigns: dict = {}
        self.entry = None
        self.src = Module(name, ast.Module(body=[], type_ignores=[]), is_pkg)  # the engine's bindings

    def package(self) -> str:
        return self.name if self.is_pkg else self.name.rpartition(".")[0]


def _build_module(mod: _Module, tree) -> None:
    mod.src = Module(mod.name, tree, mod.is_pkg)
    for node in body_statements(tree.body):
        if isinstance(node, ast.ClassDef):
            mod.classes[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is None:
                continue
            for target in targets:
                if isinstance(target, ast.Name):
                    mod.assigns.setdefault(target.id, []).append(node.value)
                    if target.id == "EntryClass":
                        mod.entry = node.value
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            if node.target.id == "EntryClass" and isinstance(node.op, ast.Add):
                prev = mod.entry if mod.entry is not None else ast.List(elts=[], ctx=ast.Load())
                mod.entry = ast.BinOp(left=prev, op=ast.Add(), right=node.value)


# --------------------------------------------------------------------------
# classes and functions
# --------------------------------------------------------------------------

class _Class:
    __slots__ = ("module", "node", "name", "methods", "class_attrs", "bases", "all")

    def __init__(self, module: _Module, node) -> None:
        self.module = module
        self.node = node
        self.name = node.name
        self.methods: dict = {}      # name -> FunctionDef, or None when bound by assignment
        self.class_attrs: dict = {}  # name -> value expr, or a nested ClassDef
        for stmt in body_statements(node.body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.methods[stmt.name] = stmt
            elif isinstance(stmt, ast.ClassDef):
                self.class_attrs[stmt.name] = stmt
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        self.class_attrs[target.id] = stmt.value
                        if target.id in SPEC_METHODS:
                            self.methods.setdefault(target.id, None)
        self.bases = None  # resolved lazily: list of _Class
        self.all = None    # resolved lazily: name -> (defining _Class, FunctionDef | None)

    @property
    def key(self) -> tuple:
        return (self.module.name, self.name)


class _FnInfo:
    """One pass over a function body: its nodes, local names, self.<attr> stores, returns."""

    __slots__ = ("nodes", "imports", "assigns", "self_assigns", "returns", "calls_init")

    def __init__(self, fn, package: str) -> None:
        nodes = []
        stack = list(fn.body)
        AST = ast.AST
        while stack:
            node = stack.pop()
            nodes.append(node)
            for field in node._fields:
                value = getattr(node, field, None)
                if isinstance(value, list):
                    for item in value:
                        if isinstance(item, AST) and not isinstance(item, _SKIP_NODES):
                            stack.append(item)
                elif isinstance(value, AST) and not isinstance(value, _SKIP_NODES):
                    stack.append(value)
        self.nodes = nodes
        self.imports: dict = {}
        self.assigns: dict = {}
        self.self_assigns: list = []
        self.returns: list = []
        self.calls_init = False
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name, b in import_bindings(node, [package]):
                    if b[0] == "module" or (b[0] == "from" and b[1]):
                        self.imports[name] = b
            elif isinstance(node, ast.Return):
                if node.value is not None:
                    self.returns.append(node.value)
            elif isinstance(node, ast.Call):
                if isinstance(node.func, ast.Attribute) and node.func.attr == "__init__":
                    self.calls_init = True
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)):
                if node.value is None:
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        self.assigns.setdefault(target.id, []).append(node.value)
                    elif _is_self_attr(target):
                        self.self_assigns.append((target.attr, node.value))
        self.self_assigns.sort(key=lambda item: (item[1].lineno, item[1].col_offset))


def _is_self_attr(node, attr: str | None = None) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and (attr is None or node.attr == attr)
    )


def _short(node, limit: int = 70) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _params(fn) -> str:
    """``fn``'s parameter list without annotations, e.g. ``self, layer_ids=None``."""
    a = fn.args

    def bare(arg):
        return None if arg is None else ast.arg(arg=arg.arg)

    stripped = ast.arguments(
        posonlyargs=[bare(x) for x in a.posonlyargs],
        args=[bare(x) for x in a.args],
        vararg=bare(a.vararg),
        kwonlyargs=[bare(x) for x in a.kwonlyargs],
        kw_defaults=list(a.kw_defaults),
        kwarg=bare(a.kwarg),
        defaults=list(a.defaults),
    )
    return ast.unparse(stripped)


# --------------------------------------------------------------------------
# the index: parsed modules, class graph, name resolution
# --------------------------------------------------------------------------

class _IndexResolver(Resolver):
    """The engine's resolver, reading modules through the index (each parsed once)."""

    def __init__(self, index) -> None:
        super().__init__(None, [])
        self.index = index

    def module(self, name: str, load: bool = True):
        mod = self.index.module(name, load) if name else None
        return None if mod is None else mod.src

    def is_module(self, name: str) -> bool:
        return self.index.locate(name) is not None


class _Index:
    def __init__(self, package_root: str) -> None:
        self.root = os.path.abspath(package_root)
        self.pkg = os.path.basename(self.root.rstrip(os.sep)) or "sglang"
        self.modules: dict = {}   # dotted name -> _Module | None (parsed at most once)
        self.unparsable: list = []
        self._classes: dict = {}
        self._fninfo: dict = {}
        self._located: dict = {}
        self.resolver = _IndexResolver(self)

    def release(self) -> None:
        """Drop every parsed tree; break the class graph's reference cycles first."""
        for c in self._classes.values():
            c.all = None
            c.bases = None
        self._classes.clear()
        self._fninfo.clear()
        self.modules.clear()

    def rel(self, path: str) -> str:
        return os.path.relpath(path, self.root).replace(os.sep, "/")

    def locate(self, dotted: str):
        """(path or None for a namespace package, is_package) of a module in the package, else None."""
        if dotted in self._located:
            return self._located[dotted]
        parts = dotted.split(".")
        found = None
        if parts[0] == self.pkg:
            base = os.path.join(self.root, *parts[1:])
            if os.path.isfile(base + ".py"):
                found = (base + ".py", False)
            elif os.path.isfile(os.path.join(base, "__init__.py")):
                found = (os.path.join(base, "__init__.py"), True)
            elif os.path.isdir(base):
                found = (None, True)
        self._located[dotted] = found
        return found

    def load(self, dotted: str, path: str | None, is_pkg: bool, record: bool):
        if dotted in self.modules:
            return self.modules[dotted]
        mod = None
        if path is None:
            mod = _Module(dotted, self.rel(os.path.join(self.root, *dotted.split(".")[1:])), True)
        else:
            try:
                with open(path, "rb") as fh:
                    tree = ast.parse(fh.read(), filename=path)  # bytes: honours BOMs and coding cookies
            except (SyntaxError, ValueError, OSError, RecursionError, MemoryError) as exc:
                if record:
                    line = getattr(exc, "lineno", None)
                    msg = getattr(exc, "msg", None) or str(exc)
                    self.unparsable.append({
                        "file": self.rel(path),
                        "error": f"{type(exc).__name__}: {msg}" + (f" (line {line})" if line else ""),
                    })
            else:
                mod = _Module(dotted, self.rel(path), is_pkg)
                _build_module(mod, tree)
        self.modules[dotted] = mod
        return mod

    def module(self, dotted: str, load: bool = True):
        if dotted in self.modules:
            return self.modules[dotted]
        if not load:
            return None
        found = self.locate(dotted)
        if found is None:
            self.modules[dotted] = None
            return None
        return self.load(dotted, found[0], found[1], record=False)

    def cls(self, mod: _Module, name: str) -> _Class:
        key = (mod.name, name)
        c = self._classes.get(key)
        if c is None:
            c = self._classes[key] = _Class(mod, mod.classes[name])
        return c

    def info(self, fn, mod: _Module) -> _FnInfo:
        got = self._fninfo.get(id(fn))
        if got is None:
            got = self._fninfo[id(fn)] = _FnInfo(fn, mod.package())
        return got

    # ---- name resolution: -> _Class | _Func | _ModRef | None ------------------
    # The engine's resolver (pysource.Resolver) over this index's modules, its answers made the
    # audit's objects. ``load`` says whether modules outside the already parsed set (the
    # models directory plus whatever base classes needed) may be parsed to answer.
    def resolve_expr(self, mod: _Module, expr, info: _FnInfo | None = None, load: bool = True):
        r = self.resolver.resolve(mod.src, expr, info.imports if info is not None else None, load)
        if r is None:
            return None
        if r[0] == "module":
            return _ModRef(r[1])
        owner = self.modules.get(r[1].name)
        if owner is None:
            return None
        if r[0] == "function":
            return _Func(owner, r[2])
        return self.cls(owner, r[2].name) if owner.classes.get(r[2].name) is r[2] else None

    # ---- class graph -------------------------------------------------------
    def bases(self, c: _Class) -> list:
        """The class's bases that are SGLang classes, found as the patch engine finds them
        (pysource.Resolver over this index's parsed modules)."""
        if c.bases is None:
            c.bases = []
            for b in c.node.bases:
                r = self.resolve_expr(c.module, b)
                if isinstance(r, _Class) and r is not c:
                    c.bases.append(r)
        return c.bases

    def all_methods(self, c: _Class, _stack: tuple = ()) -> dict:
        """name -> (defining _Class, FunctionDef | None), the class's own definitions winning."""
        if c.all is not None:
            return c.all
        if c.key in _stack or len(_stack) > _MAX_DEPTH:
            return {}
        merged: dict = {}
        for base in self.bases(c):
            for name, val in self.all_methods(base, _stack + (c.key,)).items():
                merged.setdefault(name, val)
        for name, fn in c.methods.items():
            merged[name] = (c, fn)
        c.all = merged
        return merged

    def class_attr(self, c: _Class, name: str, _stack: tuple = ()):
        """(defining _Class, value) of a class-level attribute, through the bases."""
        if name in c.class_attrs:
            return c, c.class_attrs[name]
        if c.key in _stack or len(_stack) > _MAX_DEPTH:
            return None
        for base in self.bases(c):
            got = self.class_attr(base, name, _stack + (c.key,))
            if got is not None:
                return got
        return None


# --------------------------------------------------------------------------
# wrapper analysis
# --------------------------------------------------------------------------

class _Ctx:
    """Where an expression is evaluated: the instance's class, the module, the function."""

    __slots__ = ("inst", "mod", "info")

    def __init__(self, inst: _Class | None, mod: _Module, info: _FnInfo) -> None:
        self.inst = inst
        self.mod = mod
        self.info = info


class _Auditor:
    def __init__(self, index: _Index) -> None:
        self.ix = index
        self.entries: dict = {}  # key -> _Class, every class listed in some EntryClass
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
    def entry_classes(self, mod: _Module) -> list:
        out: list = []
        self._entry(mod, mod.entry, out, 0)
        return out

    def _entry(self, mod: _Module, expr, out: list, depth: int) -> None:
        if expr is None or depth > _MAX_DEPTH:
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
            if isinstance(r, _Class):
                out.append(r)
            elif isinstance(expr, ast.Name) and expr.id != "EntryClass":
                values = mod.assigns.get(expr.id) or []
                if len(values) == 1:
                    self._entry(mod, values[0], out, depth + 1)

    # ---- what __init__ stores on self --------------------------------------
    def init_functions(self, c: _Class) -> list:
        """(defining _Class, FunctionDef) of every __init__ that runs, plus self-helpers they call."""
        out: list = []
        seen: set = set()
        cur = [c]
        while cur:
            k = cur.pop(0)
            if k.key in seen or len(seen) > _MAX_DEPTH:
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
                if isinstance(node, ast.Call) and _is_self_attr(node.func):
                    got = methods.get(node.func.attr)
                    if got and got[1] is not None and id(got[1]) not in done and node.func.attr != "__init__":
                        done.add(id(got[1]))
                        out.append(got)
        return out

    def outcomes(self, ctx: _Ctx, expr, depth: int = 0) -> list:
        """Instances ``expr`` may evaluate to: [("class", _Class) | ("dynamic", why)]."""
        self._budget -= 1
        if depth > _MAX_DEPTH or self._budget < 0:
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
        if _is_self_attr(f) and ctx.inst is not None:
            got = self.ix.all_methods(ctx.inst).get(f.attr)
            if got is not None and got[1] is not None:
                target = (ctx.inst, got[0].module, got[1])
        elif isinstance(f, (ast.Name, ast.Attribute)) and not (isinstance(f, ast.Name) and f.id in ctx.info.assigns):
            r = self.ix.resolve_expr(ctx.mod, f, ctx.info, load=False)
            if isinstance(r, _Func):
                target = (None, r.module, r.node)
        if target is None:
            return None
        inst, mod, fn = target
        info = self.ix.info(fn, mod)
        sub = _Ctx(inst, mod, info)
        pick = self.outcomes if instances else self.candidates
        return [o for r in info.returns for o in pick(sub, r, depth + 1)]

    def candidates(self, ctx: _Ctx, expr, depth: int) -> list:
        """Classes ``expr`` may be when it is called: [("class", _Class) | ("dynamic", why)]."""
        self._budget -= 1
        if depth > _MAX_DEPTH or self._budget < 0:
            return []
        if isinstance(expr, ast.IfExp):
            return self.candidates(ctx, expr.body, depth + 1) + self.candidates(ctx, expr.orelse, depth + 1)
        if isinstance(expr, ast.BoolOp):
            return [o for v in expr.values for o in self.candidates(ctx, v, depth + 1)]
        if isinstance(expr, ast.Name) and expr.id in ctx.info.assigns and expr.id not in ctx.info.imports:
            return self._local(ctx, expr.id, self.candidates, depth)
        if _is_self_attr(expr):
            if ctx.inst is None:
                return [("dynamic", f"`{_short(expr)}`")]
            got = self.ix.class_attr(ctx.inst, expr.attr)
            if got is None:
                if expr.attr in self.ix.all_methods(ctx.inst):
                    return []  # calling a method: handled by _follow_call
                return [("dynamic", f"the attribute `{_short(expr)}`")]
            owner, value = got
            if isinstance(value, ast.ClassDef):
                return []  # a nested helper class, never an EntryClass model
            return self.candidates(_Ctx(ctx.inst, owner.module, ctx.info), value, depth + 1)
        if isinstance(expr, (ast.Name, ast.Attribute)):
            r = self.ix.resolve_expr(ctx.mod, expr, ctx.info, load=False)
            return [("class", r)] if isinstance(r, _Class) else []
        if isinstance(expr, ast.Subscript):
            values = self._dict_values(ctx, expr.value)
            if values is None:
                return [("dynamic", f"the lookup `{_short(expr)}`")]
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
            return [("dynamic", f"the call `{_short(expr)}`")]
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
    def delegate_of(self, c: _Class, dunder: str) -> str | None:
        got = self.ix.all_methods(c).get(dunder)
        if got is None or got[1] is None:
            return None
        for node in self.ix.info(got[1], got[0].module).nodes:
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if dunder == "__getattr__":
                if isinstance(f, ast.Name) and f.id == "getattr" and node.args and _is_self_attr(node.args[0]):
                    return node.args[0].attr
            elif _is_self_attr(f):
                return f.attr
            elif isinstance(f, ast.Attribute) and f.attr == "forward" and _is_self_attr(f.value):
                return f.value.attr
        return None

    # ---- forward -----------------------------------------------------------
    def forward_use(self, c: _Class, attr: str) -> tuple:
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
            aliases = {n for n, vals in info.assigns.items() if any(_is_self_attr(v, attr) for v in vals)}

            def inner(node) -> bool:
                return _is_self_attr(node, attr) or (isinstance(node, ast.Name) and node.id in aliases)

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
                            evidence.append(f"hands {_short(value)} to {fname}() as the language model")
                    if _is_self_attr(f):
                        if f.attr in methods and methods[f.attr][1] is not None:
                            todo.append(methods[f.attr])
                        elif f.attr == "logits_processor":
                            evidence.append("applies its own self.logits_processor")
                elif (
                    isinstance(node, ast.Attribute)
                    and node.attr in ("model", "lm_head", "logits_processor")
                    and inner(node.value)
                ):
                    evidence.append(f"reads {_short(node)}")
        handed_over = {e.split()[1] for e in evidence if e.startswith("hands ")}
        evidence = [e for e in evidence if not (e.startswith("reads ") and e.split()[1] in handed_over)]
        return runs, routed, sorted(set(evidence), key=lambda e: (not e.startswith("hands "), e))

    # ---- one EntryClass class -------------------------------------------------
    def analyse(self, c: _Class):
        self._budget = 20000
        slots: dict = {}
        for owner, fn in self.init_functions(c):
            info = self.ix.info(fn, owner.module)
            ctx = _Ctx(c, owner.module, info)
            for attr, value in info.self_assigns:
                outs = self.outcomes(ctx, value)
                if not outs:
                    continue
                slot = slots.setdefault(
                    attr, {"inner": [], "dynamic": [], "other": [], "line": getattr(value, "lineno", 0)}
                )
                for kind, what in outs:
                    if kind == "class":
                        if what.key in self.entries and what is not c:
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
            runs, routed, evidence = self.forward_use(c, attr)
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
            (have if all(m in im for m in TARGET_METHODS) else lack).append(inner.name)
        methods: dict = {}
        for name in have + lack:  # params from classes that have both first
            for m in SPEC_METHODS:
                got = by_class[name].get(m)
                if m not in methods and got is not None:
                    methods[m] = _params(got[1]) if got[1] is not None else DEFAULT_PARAMS[m]
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
                f"{'has' if len(have) == 1 else 'all have'} both target methods, and forward runs it, "
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
                f"{' and '.join(m for m in TARGET_METHODS if not all(m in by_class[n] for n in lack))}, "
                "so the inner class needs the methods before delegation can help."
            )
        rec["verdict"] = verdict
        rec["reason"] = reason
        return rec


# --------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------

def _audit(index: _Index, models_dir: str, files: list, prefix: str) -> tuple:
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


def _registry(index: _Index, ordered: list) -> dict:
    """The registry (every EntryClass name, as models/registry.py collects them) and, per class, the
    EAGLE-3 target methods it neither defines nor inherits: what preflight needs (ops/preflight_model.py)."""
    registry: dict = {}
    for c in ordered:
        own = index.all_methods(c)
        registry.setdefault(c.name, {"file": c.module.rel,
                                     "missing": [m for m in TARGET_METHODS if m not in own],
                                     "getattr": "__getattr__" in own})
    return registry


def registry_of(models_dir: str, package_root: str | None = None) -> dict:
    """Only the ``registry`` of :func:`audit_models` (no wrapper analysis: about a third of the time)."""
    models_dir = os.path.abspath(models_dir)
    if not os.path.isdir(models_dir):
        raise FileNotFoundError(f"no models directory at {models_dir}")
    index = _Index(package_root or os.path.dirname(os.path.dirname(models_dir)))
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
        return _registry(index, ordered)
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
    index = _Index(package_root)
    rel_dir = os.path.relpath(models_dir, index.root)
    if rel_dir.startswith(".."):
        prefix = index.pkg + ".srt.models"
    else:
        prefix = ".".join([index.pkg] + [p for p in rel_dir.split(os.sep) if p not in ("", ".")])

    files = sorted(
        name for name in os.listdir(models_dir)
        if name.endswith(".py") and os.path.isfile(os.path.join(models_dir, name))
    )
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


def _default_models_dir() -> str:
    import importlib.util

    found = importlib.util.find_spec("sglang")  # finds the package without importing it
    if found is None or not found.submodule_search_locations:
        raise SystemExit("audit: sglang is not installed for this python; pass MODELS_DIR")
    return os.path.join(list(found.submodule_search_locations)[0], "srt", "models")


def main(argv: list | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    models_dir = args[0] if args else _default_models_dir()
    package_root = args[1] if len(args) > 1 else None
    json.dump(audit_models(models_dir, package_root), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
