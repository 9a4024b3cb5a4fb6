"""The audit's class-graph index of an installed SGLang package: each module parsed once with
``ast`` (never imported), its classes with their methods and class attributes, bases resolved
through each file's imports (the engine's own resolver, engine/pysource.py), methods defined or
inherited, and one pass over each function body (locals, ``self.<attr>`` stores, returns).

Stdlib only, shipped to hosts with the rest of provision/host/. The auditor that reads this
graph for EAGLE-3 gaps is engine/audit.py.
"""

from __future__ import annotations

import ast
import os

from provision.host.engine.pysource import Module, Resolver, body_statements, import_bindings

TARGET_METHODS = ("set_eagle3_layers_to_capture", "get_embed_and_head")
PARITY_METHOD = "set_embed_and_head"  # called on the draft; injected for parity
SPEC_METHODS = TARGET_METHODS + (PARITY_METHOD,)  # recorded even when bound by assignment
MAX_DEPTH = 12
_SKIP_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.expr_context)


class ModRef:
    """A module used as a value (``import a.b as m`` binds ``m`` to one)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class Func:
    """A module-level function used as a value (a factory that returns a model)."""

    __slots__ = ("module", "node")

    def __init__(self, module, node) -> None:
        self.module = module
        self.node = node


class IndexedModule:
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


def build_module(mod: IndexedModule, tree) -> None:
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


class IndexedClass:
    __slots__ = ("module", "node", "name", "methods", "class_attrs", "bases", "all")

    def __init__(self, module: IndexedModule, node) -> None:
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
        self.bases = None  # resolved lazily: list of IndexedClass
        self.all = None    # resolved lazily: name -> (defining IndexedClass, FunctionDef | None)

    @property
    def key(self) -> tuple:
        return (self.module.name, self.name)


class FnInfo:
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
                    elif is_self_attr(target):
                        self.self_assigns.append((target.attr, node.value))
        self.self_assigns.sort(key=lambda item: (item[1].lineno, item[1].col_offset))


def is_self_attr(node, attr: str | None = None) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and (attr is None or node.attr == attr)
    )


def short(node, limit: int = 70) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def params_of(fn) -> str:
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


class IndexResolver(Resolver):
    """The engine's resolver, reading modules through the index (each parsed once)."""

    def __init__(self, index) -> None:
        super().__init__(None, [])
        self.index = index

    def module(self, name: str, load: bool = True):
        mod = self.index.module(name, load) if name else None
        return None if mod is None else mod.src

    def is_module(self, name: str) -> bool:
        return self.index.locate(name) is not None


def parse_file(path: str) -> ast.Module:
    with open(path, "rb") as fh:
        return ast.parse(fh.read(), filename=path)  # bytes: honours BOMs and coding cookies


class Index:
    def __init__(self, package_root: str, parse=parse_file) -> None:
        """`parse`: path -> tree (engine/skeletons.py's kept skeletons for a registry read)."""
        self.root = os.path.abspath(package_root)
        self.parse = parse
        self.pkg = os.path.basename(self.root.rstrip(os.sep)) or "sglang"
        self.modules: dict = {}   # dotted name -> IndexedModule | None (parsed at most once)
        self.unparsable: list = []
        self._classes: dict = {}
        self._fninfo: dict = {}
        self._located: dict = {}
        self.resolver = IndexResolver(self)

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
            mod = IndexedModule(dotted, self.rel(os.path.join(self.root, *dotted.split(".")[1:])), True)
        else:
            try:
                tree = self.parse(path)
            except (SyntaxError, ValueError, OSError, RecursionError, MemoryError) as exc:
                if record:
                    line = getattr(exc, "lineno", None)
                    msg = getattr(exc, "msg", None) or str(exc)
                    self.unparsable.append({
                        "file": self.rel(path),
                        "error": f"{type(exc).__name__}: {msg}" + (f" (line {line})" if line else ""),
                    })
            else:
                mod = IndexedModule(dotted, self.rel(path), is_pkg)
                build_module(mod, tree)
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

    def cls(self, mod: IndexedModule, name: str) -> IndexedClass:
        key = (mod.name, name)
        c = self._classes.get(key)
        if c is None:
            c = self._classes[key] = IndexedClass(mod, mod.classes[name])
        return c

    def info(self, fn, mod: IndexedModule) -> FnInfo:
        got = self._fninfo.get(id(fn))
        if got is None:
            got = self._fninfo[id(fn)] = FnInfo(fn, mod.package())
        return got

    # ---- name resolution: -> IndexedClass | Func | ModRef | None ------------------
    # The engine's resolver (pysource.Resolver) over this index's modules, its answers made the
    # audit's objects. ``load`` says whether modules outside the already parsed set (the
    # models directory plus whatever base classes needed) may be parsed to answer.
    def resolve_expr(self, mod: IndexedModule, expr, info: FnInfo | None = None, load: bool = True):
        r = self.resolver.resolve(mod.src, expr, info.imports if info is not None else None, load)
        if r is None:
            return None
        if r[0] == "module":
            return ModRef(r[1])
        owner = self.modules.get(r[1].name)
        if owner is None:
            return None
        if r[0] == "function":
            return Func(owner, r[2])
        return self.cls(owner, r[2].name) if owner.classes.get(r[2].name) is r[2] else None

    # ---- class graph -------------------------------------------------------
    def bases(self, c: IndexedClass) -> list:
        """The class's bases that are SGLang classes, found as the patch engine finds them
        (pysource.Resolver over this index's parsed modules)."""
        if c.bases is None:
            c.bases = []
            for b in c.node.bases:
                r = self.resolve_expr(c.module, b)
                if isinstance(r, IndexedClass) and r is not c:
                    c.bases.append(r)
        return c.bases

    def all_methods(self, c: IndexedClass, _stack: tuple = ()) -> dict:
        """name -> (defining IndexedClass, FunctionDef | None), the class's own definitions winning."""
        if c.all is not None:
            return c.all
        if c.key in _stack or len(_stack) > MAX_DEPTH:
            return {}
        merged: dict = {}
        for base in self.bases(c):
            for name, val in self.all_methods(base, _stack + (c.key,)).items():
                merged.setdefault(name, val)
        for name, fn in c.methods.items():
            merged[name] = (c, fn)
        c.all = merged
        return merged

    def class_attr(self, c: IndexedClass, name: str, _stack: tuple = ()):
        """(defining IndexedClass, value) of a class-level attribute, through the bases."""
        if name in c.class_attrs:
            return c, c.class_attrs[name]
        if c.key in _stack or len(_stack) > MAX_DEPTH:
            return None
        for base in self.bases(c):
            got = self.class_attr(base, name, _stack + (c.key,))
            if got is not None:
                return got
        return None
