"""Python source as the engine reads it: decoding, lines, and AST location.  STDLIB ONLY, Python 3.10.

The one place for what every spec kind (engine/core.py's delegation, engine/mapping_entry.py,
engine/replace.py) and the model auditor (engine/audit.py) need to find things in a file:

- the file's text: ``decode`` (bytes -> text and encoding, refusing what would not
  round-trip), ``split_lines`` (lines with their endings, as the tokenizer counts them);
- the names a module or class body binds (``scope_bindings``, ``Module.bindings``), with
  imports made absolute (``absolute_module``, ``import_bindings``);
- a dotted scope (``find_scope``: ``func``, ``Class``, ``Class.method``);
- what a name or dotted expression stands for, followed through imports into other SGLang
  modules (``Resolver.resolve``: a class, a function or a module), and so base classes
  (``resolve_class``, ``inherited``, ``base_classes``). The patch engine reads modules through
  a callback (bytes in); the audit subclasses the resolver to read them through its index.
"""

from __future__ import annotations

import ast
import io
import tokenize

from provision.host.engine.spec import MAX_BASE_DEPTH, EngineError, _NEWLINE
from provision.host.lib.modules import MAX_SOURCE_BYTES, PACKAGE

def split_lines(text: str) -> list:
    """Lines with their endings, split the way Python's tokenizer counts lines."""
    out, pos = [], 0
    for m in _NEWLINE.finditer(text):
        out.append(text[pos:m.end()])
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return out


def ending(line: str) -> str:
    if line.endswith("\r\n"):
        return "\r\n"
    if line.endswith("\n") or line.endswith("\r"):
        return line[-1]
    return ""


def body(line: str) -> str:
    return line[: len(line) - len(ending(line))]


def is_blank(line: str) -> bool:
    return not body(line).strip(" \t\f")


def is_comment_or_blank(line: str) -> bool:
    b = body(line).lstrip(" \t\f")
    return not b or b.startswith("#")


def decode(source) -> tuple:
    if isinstance(source, (bytearray, memoryview)):
        source = bytes(source)
    if not isinstance(source, bytes):
        raise EngineError("encoding", f"expected the file's bytes, found {type(source).__name__}")
    if len(source) > MAX_SOURCE_BYTES:
        raise EngineError("too-large", f"expected a model file of at most {MAX_SOURCE_BYTES // (1024 * 1024)} MiB, found {len(source)} bytes; refusing to parse it")
    try:
        enc, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    except SyntaxError as e:
        try:  # detect_encoding also fails on undecodable first lines: say which byte
            source.decode("utf-8")
        except UnicodeDecodeError:
            enc = "utf-8"
        else:
            raise EngineError("encoding", f"expected UTF-8 source or a valid PEP 263 coding line, found: {e}")
    try:
        text = source.decode(enc)
    except (UnicodeDecodeError, LookupError) as e:
        if isinstance(e, UnicodeDecodeError):
            line = source.count(b"\n", 0, e.start) + 1
            bad = source[e.start:e.start + 1]
            raise EngineError("encoding", f"expected {enc} text, found byte 0x{bad.hex()} at offset {e.start} (line {line}) that is not valid {enc}")
        raise EngineError("encoding", f"expected a known source encoding, found {enc!r}")
    if text.encode(enc) != source:
        raise EngineError("encoding", f"expected {enc} text that re-encodes to the same bytes, found text that does not; refusing to rewrite it")
    return text, enc


def parse(text: str, filename: str = "<source>"):
    """ast.parse or EngineError("syntax")."""
    try:
        return ast.parse(text, filename=filename)
    except SyntaxError as e:
        raise EngineError("syntax", f"{filename} does not parse: {type(e).__name__}: {e.msg} (line {e.lineno})")
    except ValueError as e:  # null bytes on 3.10/3.11
        raise EngineError("syntax", f"{filename} does not parse: {e}")
    except (RecursionError, MemoryError) as e:
        raise EngineError("syntax", f"{filename} does not parse: {type(e).__name__} (nested too deeply)")


def try_parse(text: str):
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def first_line(node) -> int:
    decos = getattr(node, "decorator_list", None) or []
    return min([node.lineno] + [d.lineno for d in decos])


# --------------------------------------------------------------------------- class-scope bindings

def target_names(t, out):
    if isinstance(t, ast.Name):
        out.append(t.id)
    elif isinstance(t, (ast.Tuple, ast.List)):
        for e in t.elts:
            target_names(e, out)
    elif isinstance(t, ast.Starred):
        target_names(t.value, out)


def scope_bindings(body) -> list:
    """(name, first line, node, kind) for every name a class/module body binds,
    looking into if/try/with/for/match blocks (they run in the same scope) but not into
    function bodies."""
    out: list = []
    for st in body_statements(body):
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((st.name, first_line(st), st, "def"))
        elif isinstance(st, ast.ClassDef):
            out.append((st.name, first_line(st), st, "class"))
        elif isinstance(st, ast.Assign):
            names = []
            for t in st.targets:
                target_names(t, names)
            kind = "lambda" if isinstance(st.value, ast.Lambda) else "assignment"
            out.extend((n, st.lineno, st, kind) for n in names)
        elif isinstance(st, ast.AnnAssign):
            if st.value is not None and isinstance(st.target, ast.Name):
                out.append((st.target.id, st.lineno, st, "assignment"))
        elif isinstance(st, ast.AugAssign):
            names = []
            target_names(st.target, names)
            out.extend((n, st.lineno, st, "assignment") for n in names)
        elif isinstance(st, (ast.Import, ast.ImportFrom)):
            for a in st.names:
                if a.name != "*":
                    out.append(((a.asname or a.name).split(".")[0], st.lineno, st, "import"))
        elif isinstance(st, ast.Delete):
            names = []
            for t in st.targets:
                target_names(t, names)
            out.extend((n, st.lineno, st, "del") for n in names)
        elif isinstance(st, (ast.For, ast.AsyncFor)):
            names = []
            target_names(st.target, names)
            out.extend((n, st.lineno, st, "assignment") for n in names)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            for item in st.items:
                if item.optional_vars is not None:
                    names = []
                    target_names(item.optional_vars, names)
                    out.extend((n, st.lineno, st, "assignment") for n in names)
    return out


# --------------------------------------------------------------------------- base-class resolution

class Module:
    """One parsed module's bindings (name -> what it is bound to), for name resolution.
    `is_pkg`: the module is a package's __init__.py (None: not known, both readings of its
    relative imports are tried)."""

    def __init__(self, name: str, tree, is_pkg: bool | None = None):
        self.name = name
        self.tree = tree
        self.is_pkg = is_pkg
        self._bind = None
        self.stars = []

    def bindings(self) -> dict:
        if self._bind is None:
            self._bind = {}
            self._collect(self.tree.body)
        return self._bind

    def _collect(self, stmts):
        b = self._bind
        for st in body_statements(stmts):
            if isinstance(st, ast.ClassDef):
                b[st.name] = ("class", st)
            elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                b[st.name] = ("function", st)
            elif isinstance(st, (ast.Import, ast.ImportFrom)):
                for name, binding in import_bindings(st, package_candidates(self.name, self.is_pkg)):
                    if binding[0] == "*":
                        self.stars.extend(binding[1])
                    else:
                        b[name] = binding
            elif isinstance(st, ast.Assign):
                if (len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)
                        and isinstance(st.value, (ast.Name, ast.Attribute))):
                    b[st.targets[0].id] = ("alias", st.value)
                else:
                    names = []
                    for t in st.targets:
                        target_names(t, names)
                    for n in names:
                        b[n] = ("other", None)


# --------------------------------------------------------------------------- imports

def absolute_module(package: str, level: int, module: str | None) -> str | None:
    """The absolute name `from <level dots><module> import ...` refers to, inside `package`
    (the package the importing module is in); None when it climbs above the top."""
    if not level:
        return module
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return None
    base = parts[: len(parts) - (level - 1)]
    if module:
        base.append(module)
    return ".".join(base) or None


def package_candidates(name: str, is_pkg: bool | None) -> list:
    """The package(s) a module's relative imports are relative to: the parent for a plain
    module (x.py), the module itself for a package (__init__.py); both when the caller cannot
    tell (bytes alone do not say), the plain-module reading first."""
    parent = name.rpartition(".")[0]
    if is_pkg is None:
        return list(dict.fromkeys([parent, name]))
    return [name] if is_pkg else [parent]


def import_bindings(node, packages: list) -> list:
    """(bound name, binding) for each name an import statement binds: ("module", dotted) for
    `import a.b` (binds a) or `import a.b as m`; ("from", [absolute module candidates], symbol)
    for `from .x import y`; ("*", [candidates]) for `from x import *` (bound name None)."""
    out: list = []
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.asname:
                out.append((a.asname, ("module", a.name)))
            else:
                top = a.name.split(".")[0]
                out.append((top, ("module", top)))
        return out
    mods = [m for m in dict.fromkeys(absolute_module(p, node.level or 0, node.module) for p in packages) if m]
    for a in node.names:
        if a.name == "*":
            out.append((None, ("*", mods)))
        else:
            out.append((a.asname or a.name, ("from", mods, a.name)))
    return out


class Resolver:
    def __init__(self, resolve_module, notes: list, package: str = PACKAGE):
        self.cb = resolve_module
        self.notes = notes
        self.cache = {}
        self.package = package  # the package whose modules resolve_module reads (sglang, vllm)

    def module(self, name: str, load: bool = True):
        """The parsed module `name` of the package (read through the callback once), or None."""
        if not name or name.split(".")[0] != self.package or self.cb is None:
            return None
        if name in self.cache:
            return self.cache[name]
        self.cache[name] = None
        try:
            data = self.cb(name)
        except Exception as e:  # a caller's resolver must not crash the plan
            self.notes.append(f"could not read module {name}: {type(e).__name__}: {e}")
            return None
        if data is None:
            return None
        if isinstance(data, str):
            data = data.encode("utf-8")
        try:
            text, _ = decode(data)
            tree = parse(text, name)
        except EngineError as e:
            self.notes.append(f"could not use module {name} to look up base classes: {e.message}")
            return None
        mod = Module(name, tree)
        self.cache[name] = mod
        return mod

    def is_module(self, name: str) -> bool:
        """Is `name` a module (so `from a import b` may bind the submodule a.b)?"""
        return self.module(name) is not None

    def resolve(self, mod: Module, expr, local: dict | None = None, load: bool = True, depth: int = 0):
        """What an expression names: ("class", Module, ClassDef), ("function", Module, def),
        ("module", dotted name), or None (not an SGLang name, or not known). `local`: bindings
        that shadow the module's (a function's own imports); `load`: whether modules not read
        yet may be read to answer."""
        if depth > MAX_BASE_DEPTH:
            return None
        if isinstance(expr, ast.Subscript):  # Generic[T]-style bases
            return self.resolve(mod, expr.value, local, load, depth + 1)
        if isinstance(expr, ast.Name):
            if local and expr.id in local:
                return self._ref(mod, local[expr.id], load, depth + 1)
            return self._name(mod, expr.id, load, depth + 1)
        if isinstance(expr, ast.Attribute):
            base = self.resolve(mod, expr.value, local, load, depth + 1)
            if base is not None and base[0] == "module":
                return self._in_module(base[1], expr.attr, load, depth + 1)
        return None

    def resolve_class(self, mod: Module, expr):
        """The (module, ClassDef) an expression names, or None."""
        r = self.resolve(mod, expr)
        return (r[1], r[2]) if r is not None and r[0] == "class" else None

    def _name(self, mod: Module, name: str, load: bool, depth: int):
        if depth > MAX_BASE_DEPTH:
            return None
        b = mod.bindings().get(name)
        if b is None:
            for star in mod.stars:
                target = self.module(star, load)
                r = None if target is None else self._name(target, name, load, depth + 1)
                if r is not None:
                    return r
            return None
        return self._ref(mod, b, load, depth)

    def _ref(self, mod: Module, b: tuple, load: bool, depth: int):
        kind = b[0]
        if kind in ("class", "function"):
            return (kind, mod, b[1])
        if kind == "module":
            return ("module", b[1]) if self.is_module(b[1]) else None
        if kind == "alias":
            return self.resolve(mod, b[1], None, load, depth + 1)
        if kind == "from":
            for m in b[1]:
                r = self._in_module(m, b[2], load, depth + 1)
                if r is not None:
                    return r
        return None

    def _in_module(self, modname: str, name: str, load: bool, depth: int):
        sub = f"{modname}.{name}"
        if self.is_module(sub):
            return ("module", sub)
        target = self.module(modname, load)
        return None if target is None else self._name(target, name, load, depth)

    def inherited(self, mod: Module, cls) -> dict:
        """name -> ("module.Class", [(line, kind, node), ...]) for every name the SGLang bases
        of `cls` bind (the first base in lookup order that binds it)."""
        found = {}
        seen = set()

        def walk(m, c, depth):
            for base in c.bases:
                r = self.resolve_class(m, base)
                if r is None:
                    continue
                bm, bc = r
                key = (bm.name, bc.name, bc.lineno)
                if key in seen or depth > MAX_BASE_DEPTH:
                    continue
                seen.add(key)
                per: dict = {}
                for name, line, node, kind in scope_bindings(bc.body):
                    per.setdefault(name, []).append((line, kind, node))
                for name, bindings in per.items():
                    found.setdefault(name, (f"{bm.name}.{bc.name}", bindings))
                walk(bm, bc, depth + 1)

        walk(mod, cls, 0)
        return found

    def base_classes(self, mod: Module, cls) -> list:
        out, seen = [], set()

        def walk(m, c, depth):
            for base in c.bases:
                r = self.resolve_class(m, base)
                if r is None or depth > MAX_BASE_DEPTH:
                    continue
                key = (r[0].name, r[1].name, r[1].lineno)
                if key in seen:
                    continue
                seen.add(key)
                out.append(r)
                walk(r[0], r[1], depth + 1)

        walk(mod, cls, 0)
        return out




# --------------------------------------------------------------------------- dotted scopes

def body_statements(body) -> list:
    """The statements of a module or class body that run in that scope, looking into
    if/try/with/for/while/match blocks (not into function or class bodies), in source order
    (a block's own statement before those inside it)."""
    out = []

    def visit(stmts):
        for st in stmts:
            out.append(st)
            if isinstance(st, (ast.If, ast.While, ast.For, ast.AsyncFor)):
                visit(st.body)
                visit(st.orelse)
            elif isinstance(st, (ast.With, ast.AsyncWith)):
                visit(st.body)
            elif isinstance(st, ast.Try) or type(st).__name__ == "TryStar":
                visit(st.body)
                for h in st.handlers:
                    visit(h.body)
                visit(st.orelse)
                visit(st.finalbody)
            elif type(st).__name__ == "Match":
                for case in st.cases:
                    visit(case.body)
    visit(body)
    return out


def line_offsets(lines: list) -> list:
    """The character offset where each line starts, and the text's length last."""
    out, pos = [], 0
    for line in lines:
        out.append(pos)
        pos += len(line)
    out.append(pos)
    return out


def find_scope(tree, dotted: str | None, filename: str = "<source>"):
    """The node a dotted scope names: None or "" is the module itself; `f`, `C`, `C.m`, `f.g`
    are defs and classes found by name, one level at a time, in the body of the one before
    (if/try blocks included). Raises EngineError("scope-missing" | "scope-ambiguous")."""
    node = tree
    if not dotted:
        return node
    walked: list = []
    for part in dotted.split("."):
        hits = [st for st in body_statements(node.body)
                if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and st.name == part]
        where = f"{'.'.join(walked)} (line {node.lineno})" if walked else filename
        if len(hits) > 1:
            raise EngineError("scope-ambiguous", f"expected one def or class {part} in {where}, found {len(hits)} (lines {', '.join(str(h.lineno) for h in hits)}); refusing to guess which one runs")
        if not hits:
            there = [st.name for st in body_statements(node.body)
                     if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
            found = f"defs and classes there: {', '.join(there[:12])}{' ...' if len(there) > 12 else ''}" if there else "no defs or classes there"
            raise EngineError("scope-missing", f"expected a def or class {part} in {where}, found none ({found})")
        node = hits[0]
        walked.append(part)
    return node


def scope_lines(node, nlines: int) -> tuple:
    """(first, last) 1-based line numbers a scope node spans (decorators included); the
    module spans every line."""
    if isinstance(node, ast.Module):
        return 1, nlines
    return first_line(node), node.end_lineno


def literal_key(node):
    """(True, value) when a dict key node is a literal (number, string, bytes, bool, None,
    a negative number or a tuple of those); else (False, None)."""
    if node is None:
        return False, None
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None
