"""The pure patch engine: source bytes and a spec in, a decision out.

STDLIB ONLY, Python 3.10 syntax: this module is shipped as text to the GPU hosts
and run by their own interpreter. It does no file IO; a caller that wants base
classes followed into other SGLang modules passes ``resolve_module(dotted_name)
-> bytes | None``.

The spec kinds: this module is the delegation (``kind: delegate``, the default) and the
dispatch: ``plan_patch``, ``plan_unpatch``, ``check_structure`` and ``inspect`` hand a
``mapping-entry``, ``list-entry`` or ``replace`` spec to engine/mapping_entry.py,
engine/list_entry.py or engine/replace.py (through engine/edits.py), with the same answer shapes,
so the ops never look at the kind. An ``interface`` spec (vLLM) is expanded first into the
delegation it is on the installed release (engine/interface.py: its protocol's members, read
through ``resolve_module``), then planned here like any delegation.

What the delegation does: inject delegation methods into a wrapper class, inside a marked
block, one level deeper than the ``class`` line and right after the class's last
statement, preserving every other byte (line endings, comments, a missing final
newline, code after the class). ``plan_unpatch`` removes exactly that block, so
``plan_unpatch(plan_patch(x)["new"])["new"] == x``.

Error kinds: "spec", "encoding", "too-large", "syntax", "class-missing",
"class-ambiguous", "class-layout", "delegate-missing", "block-corrupt",
"block-other-spec", "not-a-method", "internal".

Every provision-managed delegation block inside the class counts as provision's, whatever
spec name its markers carry (another kind's edit, marked `kind=...`, is left alone): a patch under a new spec name replaces a block
written under an old one (when the new spec provides every method the old block
holds) or refuses; it is never taken for the class's own code. A name counts as
native only when the class or an SGLang base binds it to a function; a property,
an assignment (``x = None``) or a ``def`` followed by ``del`` is refused.
"""

from __future__ import annotations

import ast
import difflib
import textwrap
from typing import Any, Mapping, TYPE_CHECKING, cast

from provision.host.engine.spec import (  # noqa: F401 (the engine's names, in one namespace)
    BEGIN_MARK,
    END_MARK,
    ERROR_KINDS,
    EngineError,
    MAX_BASE_DEPTH,
    _BEGIN_RE,
    _BODY_BUILTINS,
    _END_RE,
    _HAND_DEF_RE,
    _IDENT,
    _NEWLINE,
    _SPEC_NAME,
    _is_plain_ident,
    _mangled,
    _parse_params,
    validate_spec,
)
from provision.host.engine import edits
from provision.host.engine.render import (  # noqa: F401 (the engine's names, in one namespace)
    block_sha as _block_sha,
    block_shas,
    is_normalised as _is_normalised,
    render_block,
    render_methods,
)
from provision.host.engine.markers import (  # noqa: F401
    begin_line,
    end_line,
    find_block as _find_block,
    marker_kind,
    pair as _pair,
    scan_markers as _scan_markers,
)
from provision.host.engine.pysource import (  # noqa: F401 (the engine's names, in one namespace)
    Module as _Module,
    Resolver as _Resolver,
    body as _body,
    decode as _decode,
    ending as _ending,
    first_line as _first_line,
    is_blank as _is_blank,
    is_comment_or_blank as _is_comment_or_blank,
    parse as _parse,
    scope_bindings as _scope_bindings,
    split_lines as _split_lines,
    target_names as _target_names,
    try_parse as _try_parse,
)
from provision.host.lib.modules import MAX_SOURCE_BYTES, PACKAGE, module_name  # noqa: F401
if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.lib.modules import Resolver  # noqa: F401
    from provision.host.protocol import Core, ErrorInfo, Inspection

def _assigns_attr(cls, attr: str) -> bool:
    """Does any method of `cls` assign self.<attr> (=, annotated, augmented, setattr)?"""
    def is_target(t):
        if isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name) and t.value.id == "self":
            return True
        if isinstance(t, (ast.Tuple, ast.List)):
            return any(is_target(e) for e in t.elts)
        if isinstance(t, ast.Starred):
            return is_target(t.value)
        return False

    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and any(is_target(t) for t in node.targets):
            return True
        if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and is_target(node.target):
            return True
        if isinstance(node, ast.NamedExpr):
            continue
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id == "self"
                and isinstance(node.args[1], ast.Constant) and node.args[1].value == attr):
            return True
    return False


def _assigned_attrs(cls) -> list:
    out = []
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" and t.attr not in out:
                out.append(t.attr)
    return out


# --------------------------------------------------------------------------- document analysis

class _Doc:
    """One parsed text: the class, its body indentation, our block."""

    def __init__(self, text: str, tree, s: dict, filename: str):
        self.text = text
        self.tree = tree
        self.s = s
        self.filename = filename
        self.lines = _split_lines(text)
        self.cls = _find_class(tree, s["class"], filename)
        cls = self.cls
        first = cls.body[0]
        line = _body(self.lines[first.lineno - 1])
        prefix = line[: first.col_offset] if first.col_offset <= len(line) else line
        if prefix.strip(" \t\f"):
            raise EngineError("class-layout", f"expected class {s['class']} (line {cls.lineno}) to have its body on indented lines, found `{_body(self.lines[cls.lineno - 1]).strip()[:80]}` with the body on the class line; refusing to rewrite it")
        self.indent = prefix
        cls_line = _body(self.lines[cls.lineno - 1])
        cls_indent = cls_line[: len(cls_line) - len(cls_line.lstrip(" \t\f"))]
        self.unit = prefix[len(cls_indent):] if prefix.startswith(cls_indent) and len(prefix) > len(cls_indent) else prefix or "    "
        self.last_line = cls.body[-1].end_lineno  # 1-based
        # newline style: the class's last line, else the file's first, else LF
        self.nl = _ending(self.lines[self.last_line - 1]) or next((_ending(x) for x in self.lines if _ending(x)), "\n")
        # the class's region ends where the next module-level statement starts
        idx = tree.body.index(cls)
        self.region_end = _first_line(tree.body[idx + 1]) - 1 if idx + 1 < len(tree.body) else len(self.lines)
        self.block = _find_block(self.lines, s["name"])
        if self.block is not None:
            b, e = self.block["begin"], self.block["end"]
            if not (cls.lineno - 1 < b and e < self.region_end):
                raise EngineError("block-corrupt", f"expected the managed block for spec {s['name']} inside class {s['class']} (lines {cls.lineno}-{self.region_end}), found it at lines {b + 1}-{e + 1}; fix or remove it by hand")
        # blocks provision wrote into this class under other spec names (a renamed playbook)
        self.others = _other_blocks(self.lines, s["name"], cls.lineno - 1, self.region_end)

    def in_block(self, lineno: int) -> bool:
        return self.block is not None and self.block["begin"] < lineno - 1 < self.block["end"]

    def other_block_at(self, lineno: int):
        for b in self.others:
            if b["begin"] < lineno - 1 < b["end"]:
                return b
        return None


def _find_class(tree, name: str, filename: str):
    hits = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    if len(hits) > 1:
        raise EngineError("class-ambiguous", f"expected one class {name} in {filename}, found {len(hits)} (lines {', '.join(str(h.lineno) for h in hits)}); refusing to guess which one SGLang uses")
    if not hits:
        nested = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
        top = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
        found = (f"only a nested definition at line {nested[0]}" if nested
                 else f"module-level classes: {', '.join(top[:12])}{' ...' if len(top) > 12 else ''}" if top
                 else "no module-level classes")
        raise EngineError("class-missing", f"expected class {name} at module level in {filename}, found {found}")
    return hits[0]


def _other_blocks(lines: list, spec_name: str, lo: int, hi: int) -> list:
    """The managed blocks of other spec names whose markers lie between line indexes lo and
    hi (a class's region), oldest first. Raises block-corrupt for broken ones there."""
    out = []
    for name, marks in _scan_markers(lines).items():
        if name == spec_name or any(marker_kind(lines[i]) != "delegate" for i, _ in marks["begins"]):
            continue  # ours for this spec, or another kind's edit (mapping-entry, replace): not a block of methods
        at = [i for i, _ in marks["begins"]] + marks["ends"]
        if not any(lo < i < hi for i in at):
            continue
        b = _pair(name, marks)
        if not (lo < b["begin"] and b["end"] < hi):
            raise EngineError("block-corrupt", f"expected the managed block of spec {name} to lie wholly inside the class (lines {lo + 1}-{hi}), found it at lines {b['begin'] + 1}-{b['end'] + 1}; fix or remove it by hand")
        out.append(b)
    return sorted(out, key=lambda b: b["begin"])


def _block_defs(lines: list, block: dict) -> list:
    """Names of the methods a managed block defines (its `def` lines at the block's indentation)."""
    first = lines[block["begin"]]
    indent = first[: len(first) - len(first.lstrip(" \t\f"))]
    out = []
    for line in lines[block["begin"] + 1:block["end"]]:
        m = _HAND_DEF_RE.match(line)
        if m and line.startswith(indent) and not line[len(indent):len(indent) + 1].isspace():
            out.append(m.group(1))
    return out


def _where(b: dict) -> str:
    return f"spec {b['spec']} (lines {b['begin'] + 1}-{b['end'] + 1})"


def _remove_blocks(lines: list, blocks: list) -> str:
    """_remove_block for several blocks, the last first (so earlier line numbers hold)."""
    text = "".join(lines)
    for b in sorted(blocks, key=lambda x: -x["begin"]):
        text = _remove_block(_split_lines(text), b)
    return text


def _remove_block(lines: list, block: dict) -> str:
    """Exact inverse of _inject: drop the blank line we added, the markers and
    the methods; if the block ended the file without a newline, drop the newline
    we had to add to the line before."""
    b, e = block["begin"], block["end"]
    start = b - 1 if b >= 1 and _is_blank(lines[b - 1]) else b
    head = lines[:start]
    if not _ending(lines[e]) and e == len(lines) - 1 and head:
        head = head[:-1] + [_body(head[-1])]
    return "".join(head) + "".join(lines[e + 1:])


def _block_matches(doc: _Doc, names: list) -> bool:
    """Is the block (with the blank line before it) exactly what _inject writes?"""
    b, e = doc.block["begin"], doc.block["end"]
    if b < 1 or doc.lines[b - 1] != doc.nl:
        return False
    expected = doc.nl + render_block(doc.s, doc.indent, doc.nl, names, doc.unit)
    if not _ending(doc.lines[e]):
        expected = expected[: -len(doc.nl)]
    return "".join(doc.lines[b - 1:e + 1]) == expected


def _inject(doc: _Doc, names: list) -> str:
    block = render_block(doc.s, doc.indent, doc.nl, names, doc.unit)
    at = doc.last_line  # insert after this many lines
    head, tail = doc.lines[:at], doc.lines[at:]
    if head and not _ending(head[-1]):  # the class ends the file without a newline
        head = head[:-1] + [head[-1] + doc.nl]
        block = block[: -len(doc.nl)]
    return "".join(head) + doc.nl + block + "".join(tail)


# --------------------------------------------------------------------------- hand-patch repair

def _is_hand_def(node, names) -> bool:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.decorator_list:
        return False
    pos = list(node.args.posonlyargs) + list(node.args.args)
    return node.name in names and bool(pos) and pos[0].arg == "self"


def _describe_def(node, lines: list, offset: int, form: str) -> str:
    try:
        params = ast.unparse(node.args)
    except Exception:  # pragma: no cover - ast.unparse is total on parsed trees
        params = "..."
    first, last = node.lineno + offset, node.end_lineno + offset
    where = ("module-level (never bound to the class)" if form == "module-level"
             else "indented after the class's module-level code (the file did not import: IndentationError)")
    return f"hand-appended def {node.name}({params}) at lines {first}-{last}: {where}"


def _hand_patch_start(lines: list, cut: int, first_def: int) -> int:
    """Where an appended hand patch begins (a line index): the first appended def
    (`first_def`), with the comment lines directly above it (its header, no blank line
    between) and the blank lines above those, but never before `cut`, the end of the
    module's last real statement. Everything else there (e.g. a comment after
    `EntryClass`, set apart by a blank line) is the module's own and stays."""
    i = first_def
    while i > cut and not _is_blank(lines[i - 1]) and _is_comment_or_blank(lines[i - 1]):
        i -= 1
    while i > cut and _is_blank(lines[i - 1]):
        i -= 1
    return i


def _hand_patch(text: str, tree, names) -> dict | None:
    """Find a trailing block made only of delegation defs (plus blank lines and
    comments) appended after the module's real code. Returns {"head": the text
    without exactly that block, "removed": [descriptions], "form": ...} or None."""
    lines = _split_lines(text)
    if tree is not None:
        body = tree.body
        i = len(body)
        while i > 0 and _is_hand_def(body[i - 1], names):
            i -= 1
        if i == len(body) or i == 0:
            return None
        start = _hand_patch_start(lines, body[i - 1].end_lineno, _first_line(body[i]) - 1)
        return {"head": "".join(lines[:start]), "form": "module-level",
                "removed": [_describe_def(n, lines, 0, "module-level") for n in body[i:]],
                "lines": [start + 1, len(lines)]}
    for i, line in enumerate(lines):
        m = _HAND_DEF_RE.match(line)
        if not m or m.group(1) not in names or i == 0:
            continue
        tail_lines = ["\n" if _is_comment_or_blank(x) else _body(x) + "\n" for x in lines[i:]]
        tail = _try_parse(textwrap.dedent("".join(tail_lines)))
        if tail is None or not tail.body or not all(_is_hand_def(n, names) for n in tail.body):
            continue
        head_tree = _try_parse("".join(lines[:i]))
        if head_tree is None or not head_tree.body:
            continue
        start = _hand_patch_start(lines, head_tree.body[-1].end_lineno, i)
        return {"head": "".join(lines[:start]), "form": "indented",
                "removed": [_describe_def(n, lines, i, "indented") for n in tail.body],
                "lines": [start + 1, len(lines)]}
    return None


def _leftovers(tree, names, cls_name: str) -> list:
    out = []
    for st in tree.body:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)) and st.name in names:
            out.append(f"module-level def {st.name} at line {st.lineno} left alone: it is not part of a trailing hand patch (module-level functions are never bound to {cls_name})")
    return out


# --------------------------------------------------------------------------- the core

def _result(**kw) -> dict:
    r = {"verdict": "failed", "new": None, "added": [], "native": [], "kept": [], "updated": False,
         "repaired": [], "module_level_leftovers": [], "notes": [], "error": None}
    r.update(kw)
    return r


# Decorators that make a `def` something other than a method (its name is not callable
# as self.name(...)).
_NOT_METHOD_DECORATORS = {"property", "cached_property", "abstractproperty", "setter", "getter", "deleter"}


def _decorator_name(d):
    if isinstance(d, ast.Call):
        d = d.func
    if isinstance(d, ast.Attribute):
        return d.attr
    if isinstance(d, ast.Name):
        return d.id
    return None


def _not_a_method(name: str, bound: list):
    """None when the last of a class body's bindings of `name` ((line, kind, node), in
    source order) leaves it bound to a function; else what it is, naming the binding
    and its line."""
    line, kind, node = bound[-1]
    if kind == "def":
        for d in node.decorator_list:
            if _decorator_name(d) in _NOT_METHOD_DECORATORS:
                return f"a property: `@{ast.unparse(d)}` on `def {name}` at line {d.lineno}"
        return None
    if kind == "lambda":
        return None
    if kind == "del":
        defs = [b[0] for b in bound[:-1]]
        return f"`del {name}` at line {line}" + (f", after its definition at line {defs[-1]}" if defs else "") \
            + ": the class ends without it"
    text = " ".join(ast.unparse(node).split())
    text = text if len(text) <= 60 else text[:57] + "..."
    what = {"assignment": "an assignment", "import": "an import", "class": "a class"}.get(kind, kind)
    return f"{what} at line {line}: `{text}`"


def _core(source, spec, resolve_module) -> Core:
    """Everything plan_patch and inspect need. Raises EngineError."""
    s = validate_spec(spec)
    filename = s["file"]
    text, enc = _decode(source)
    attr_names = [a["name"] for a in s.get("attributes") or []]  # an interface spec's class attributes
    names = attr_names + [m["name"] for m in s["methods"]]
    notes = []
    tree = _try_parse(text)
    hand = _hand_patch(text, tree, set(names))
    if tree is None:
        if hand is None:
            _parse(text, filename)  # raises the real SyntaxError as EngineError
            raise EngineError("internal", "parser disagreement")  # pragma: no cover
        work = hand["head"]
        tree = _parse(work, filename)
    else:
        work = hand["head"] if hand else text
        tree = _parse(work, filename) if hand else tree
    leftovers = _leftovers(tree, set(names), s["class"])

    doc = _Doc(work, tree, s, filename)
    cls = doc.cls
    for b in doc.others:
        extra = [n for n in _block_defs(doc.lines, b) if n not in names]
        if extra:
            raise EngineError("block-other-spec", f"expected the managed blocks in class {s['class']} to hold only methods of spec {s['name']}, found the block of {_where(b)} with {', '.join(extra)}, which spec {s['name']} does not provide; run `provision unpatch --playbook {b['spec']}` first, or add those methods to this spec")
    local: dict = {}
    ours, old_ours = [], []
    for name, line, node, kind in _scope_bindings(cls.body):
        if doc.in_block(line):
            if (kind == "def" or name in attr_names) and node in cls.body:
                ours.append(name)
            continue
        if doc.other_block_at(line) is not None:
            if (kind == "def" or name in attr_names) and node in cls.body and name not in old_ours:
                old_ours.append(name)
            continue
        local.setdefault(name, []).append((line, kind, node))
    resolver = _Resolver(resolve_module, notes, s["package"])
    mod = _Module(module_name(filename, s["package"]), tree)
    inherited = resolver.inherited(mod, cls)
    native, via = [], {}
    for n in names:
        if n in local:
            bound = local[n]
            where = f"class {s['class']}"
        elif n in inherited:
            where, bound = inherited[n][0], inherited[n][1]
        else:
            continue
        why = None if n in attr_names else _not_a_method(n, bound)
        if why:
            raise EngineError("not-a-method", f"expected {n} in {where} to be a method (a def, or a function bound in the class body), found {why}; provision cannot tell whether the class has the method. Make it a def, or remove that binding")
        native.append(n)
        line, kind, _node = bound[-1]
        via[n] = (f"line {line}" + ("" if kind == "def" else f" ({kind})")) if n in local else f"inherited from {where}"
    want = [n for n in names if n not in native]

    # Re-derive the file from scratch: without provision's blocks (this spec's and any
    # written under another spec name), then with exactly the block the spec asks for.
    # Equal to the input means nothing to do.
    managed = ([doc.block] if doc.block is not None else []) + doc.others
    base = _remove_blocks(doc.lines, managed) if managed else work
    block_matches = doc.block is not None and not doc.others and bool(want) and _block_matches(doc, want)
    if block_matches:
        new_text = work  # our block is exactly what the spec asks for, wherever it sits in the class
    elif want:
        base_doc = _Doc(base, _parse(base, filename), s, filename) if managed else doc
        new_text = _inject(base_doc, want)
    else:
        new_text = base
    for n in native:
        if n in ours:
            notes.append(f"{n} is now defined natively ({via[n]}); dropped it from the managed block so the class has one definition")
    if doc.block is not None and not want:
        notes.append(f"every method of spec {s['name']} is now native; removed the managed block")
    for b in doc.others:
        notes.append(f"replaced the managed block written under {_where(b)} with one for spec {s['name']}"
                     if want else f"removed the managed block written under {_where(b)}: every method is native now")
    for n in native:
        if n not in ours and via[n].startswith("inherited"):
            notes.append(f"{n}: {via[n]}; not added")
        elif n not in ours and local[n][-1][1] != "def":
            notes.append(f"{n} is already bound to a function in the class body ({local[n][-1][1]} at line {local[n][-1][0]}); counted as defined, not added")
    return {
        "s": s, "enc": enc, "text": text, "work": work, "new_text": new_text, "doc": doc,
        "hand": hand, "leftovers": leftovers, "native": native, "via": via, "ours": ours,
        "want": want, "notes": notes, "block_matches": block_matches, "cls": cls, "old_ours": old_ours,
        "resolver": resolver, "mod": mod, "inherited": inherited, "base": base,
    }


def _delegate_check(c: dict) -> None:
    s, cls = c["s"], c["cls"]
    if _assigns_attr(cls, s["delegate"]):
        return
    for _bm, bc in c["resolver"].base_classes(c["mod"], cls):
        if _assigns_attr(bc, s["delegate"]):
            return
    seen = _assigned_attrs(cls)
    raise EngineError("delegate-missing", f"expected class {s['class']} to assign self.{s['delegate']} (the inner model to delegate to) in one of its methods, found no such assignment"
                      + (f" (it assigns: {', '.join('self.' + a for a in seen[:8])})" if seen else ""))


def _internal(exc: BaseException) -> ErrorInfo:
    import traceback
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" at {where[0].name}:{where[0].lineno}" if where else ""
    return {"kind": "internal", "message": f"the patch engine failed{at}: {type(exc).__name__}: {exc} (a bug in provision; nothing was changed)"}


def _edit_kind(spec):
    """The module of a spec kind other than delegation (engine/mapping_entry.py,
    engine/replace.py), or None for a delegate spec (the rest of this module)."""
    kind = spec.get("kind") if isinstance(spec, dict) else None
    if kind == "mapping-entry":
        from provision.host.engine import mapping_entry
        return mapping_entry
    if kind == "replace":
        from provision.host.engine import replace
        return replace
    if kind == "list-entry":
        from provision.host.engine import list_entry
        return list_entry
    return None


def expanded(spec, resolve_module):
    """An interface spec as the delegation spec it is on this release (engine/interface.py, its
    protocol read through `resolve_module`); any other spec as it is. Raises EngineError."""
    if isinstance(spec, dict) and spec.get("kind") == "interface":
        from provision.host.engine import interface
        return interface.expand(spec, resolve_module)
    return spec


def plan_patch(source: bytes, spec: dict, resolve_module=None) -> dict:
    """Decide what patching `source` means. Pure; see the module docstring."""
    try:
        kind = _edit_kind(spec)
        if kind is not None:
            return edits.plan_patch(kind, source, spec)
        try:
            spec = expanded(spec, resolve_module)
        except EngineError as e:
            return _result(error=e.as_dict())
        return _plan_patch(source, spec, resolve_module)
    except Exception as e:  # a bug must become a verdict, never a traceback on a host
        return _result(error=_internal(e))


def _plan_patch(source: bytes, spec: dict, resolve_module=None) -> dict:
    try:
        c = _core(source, spec, resolve_module)
    except EngineError as e:
        return _result(error=e.as_dict())
    s, doc = c["s"], c["doc"]
    r = _result(native=list(c["native"]), notes=list(c["notes"]),
                module_level_leftovers=list(c["leftovers"]))
    r["notes"] += c["leftovers"]
    if c["new_text"] == c["text"]:
        r["verdict"] = "unchanged" if doc.block is not None else "native"
        r["kept"] = [n for n in c["want"] if n in c["ours"]]
        if r["verdict"] == "native":
            r["notes"].append(f"{s['class']} already has {', '.join(c['native'])}; nothing to add")
        return r
    try:
        if c["want"] and not c["block_matches"]:
            _delegate_check(c)
        new = c["new_text"].encode(c["enc"])
    except EngineError as e:
        return _result(error=e.as_dict(), native=list(c["native"]))
    except UnicodeEncodeError as e:
        return _result(error={"kind": "spec", "message": f"expected the rendered methods to fit the file's {c['enc']} encoding, found {e.object[e.start:e.end]!r}"})
    r["new"] = new
    had = c["ours"] + c["old_ours"]
    r["added"] = [n for n in c["want"] if n not in had]
    r["kept"] = [n for n in c["want"] if n in had]
    r["updated"] = (doc.block is not None and not c["block_matches"]) or bool(doc.others)
    if c["hand"]:
        r["verdict"] = "repaired"
        r["repaired"] = list(c["hand"]["removed"])
        r["notes"].append(f"removed a hand patch at lines {c['hand']['lines'][0]}-{c['hand']['lines'][1]} ({c['hand']['form']} defs appended after the module's code)")
    else:
        r["verdict"] = "patched"
    if doc.block is not None and not c["block_matches"]:
        r["notes"].append(f"the managed block for spec {s['name']} (sha {doc.block['sha']}) did not match the spec; re-rendered it")
    problems = _self_check(new, s, c, resolve_module)
    if problems:
        return _result(error={"kind": "internal", "message": "the planned file failed the engine's own check (a bug in provision): " + "; ".join(problems)})
    return r


def _self_check(new: bytes, s: dict, c: dict, resolve_module) -> list:
    """The engine checks its own output before anyone writes it."""
    problems = check_structure(new, s, resolve_module)
    if c["want"]:
        back = plan_unpatch(new, s)
        if back.get("new") != c["base"].encode(c["enc"]):
            problems.append("unpatching the result would not give back the file without the block")
    return problems


def plan_unpatch(source: bytes, spec: dict) -> dict:
    """Remove exactly our block (this spec's markers); every other byte stays."""
    try:
        kind = _edit_kind(spec)
        if kind is not None:
            return edits.plan_unpatch(kind, source, spec)
        return _plan_unpatch(source, spec)
    except Exception as e:
        return {"verdict": "failed", "new": None, "removed": [], "notes": [], "error": _internal(e)}


def _plan_unpatch(source: bytes, spec: dict) -> dict:
    out = {"verdict": "failed", "new": None, "removed": [], "notes": [], "error": None}
    try:
        s = validate_spec(spec)
        text, enc = _decode(source)
        lines = _split_lines(text)
        block = _find_block(lines, s["name"])
        others = _renamed_blocks(text, lines, s, out["notes"])
    except EngineError as e:
        out["error"] = e.as_dict()
        return out
    if block is None and not others:
        out["verdict"] = "absent"
        out["notes"].append(f"no managed block for spec {s['name']}; nothing to remove")
        return out
    managed = ([block] if block is not None else []) + others
    for b in sorted(managed, key=lambda x: x["begin"]):
        out["removed"] += [n for n in _block_defs(lines, b) if n not in out["removed"]]
    for b in others:
        out["notes"].append(f"removed the managed block written under {_where(b)}: it holds only methods of spec {s['name']}")
    out["new"] = _remove_blocks(lines, managed).encode(enc)
    out["verdict"] = "unpatched"
    return out


def _renamed_blocks(text: str, lines: list, s: dict, notes: list) -> list:
    """Blocks in the spec's class written under another spec name that hold only this
    spec's methods (the same patch under an old playbook name): unpatch removes them too.
    Others are named in `notes` and left. Needs the file to parse; else none."""
    tree = _try_parse(text)
    if tree is None:
        return []
    hits = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == s["class"]]
    if len(hits) != 1:
        return []
    idx = tree.body.index(hits[0])
    hi = _first_line(tree.body[idx + 1]) - 1 if idx + 1 < len(tree.body) else len(lines)
    names = {m["name"] for m in s.get("methods") or []}  # an interface spec's are the release's: none here
    out = []
    for b in _other_blocks(lines, s["name"], hits[0].lineno - 1, hi):
        extra = [n for n in _block_defs(lines, b) if n not in names]
        if extra:
            notes.append(f"left the managed block of {_where(b)} alone: it holds {', '.join(extra)}, which spec {s['name']} does not")
        else:
            out.append(b)
    return out


def check_structure(source: bytes, spec: dict, resolve_module=None) -> list:
    """Problems with a (patched) file; empty means good: it parses, the class is
    there once, every spec method is bound in the class body exactly once (or
    inherited from an SGLang base), our block is well-formed and holds defs."""
    try:
        kind = _edit_kind(spec)
        if kind is not None:
            return edits.check_structure(kind, source, spec)
        try:
            spec = expanded(spec, resolve_module)
        except EngineError as e:
            return [e.message]
        return _check_structure(source, spec, resolve_module)
    except Exception as e:
        return [_internal(e)["message"]]


def _check_structure(source: bytes, spec: dict, resolve_module=None) -> list:
    try:
        s = validate_spec(spec)
        text, _ = _decode(source)
        tree = _parse(text, s["file"])
        doc = _Doc(text, tree, s, s["file"])
    except EngineError as e:
        return [e.message]
    problems = []
    counts = {}
    for name, line, node, kind in _scope_bindings(doc.cls.body):
        if kind != "del":
            counts.setdefault(name, []).append((line, kind, node))
    inherited = None
    for m in (s.get("attributes") or []) + s["methods"]:
        n = m["name"]
        found = counts.get(n, [])
        if len(found) > 1:
            problems.append(f"{n} is defined {len(found)} times in class {s['class']} (lines {', '.join(str(f[0]) for f in found)}); the last one silently wins")
        elif not found:
            if inherited is None:
                inherited = _Resolver(resolve_module, [], s["package"]).inherited(_Module(module_name(s["file"], s["package"]), tree), doc.cls)
            if n not in inherited:
                problems.append(f"{n} is not defined in class {s['class']}")
        elif "params" in m and doc.in_block(found[0][0]) and (found[0][1] != "def" or found[0][2] not in doc.cls.body):
            problems.append(f"{n} in the managed block is not a method directly in class {s['class']}")
    return problems


def inspect(source: bytes, spec: Mapping[str, Any], resolve_module: Resolver | None = None) -> Inspection:
    """Read-only facts for `status`."""
    try:
        kind = _edit_kind(spec)
        if kind is not None:
            return cast("Inspection", edits.inspect(kind, source, cast(dict, spec)))
        try:
            spec = expanded(spec, resolve_module)
        except EngineError as e:  # the release's protocol could not be read: said, nothing judged
            return {"class": cast(dict, spec).get("class"), "methods": {}, "native_via": {},
                    "block": {"present": False, "sha": None, "expected_sha": None, "matches": None, "names": []},
                    "hand_patch": False, "hand_patch_form": None, "hand_patch_defs": [],
                    "module_level_leftovers": [], "would_change": None, "planned_verdict": None,
                    "notes": [], "error": cast("ErrorInfo", e.as_dict())}
        return cast("Inspection", _inspect(source, spec, resolve_module))
    except Exception as e:
        return {"class": None, "methods": {}, "native_via": {}, "block": {"present": False, "sha": None,
                "expected_sha": None, "matches": None, "names": []}, "hand_patch": False, "hand_patch_form": None,
                "hand_patch_defs": [], "module_level_leftovers": [], "would_change": None,
                "planned_verdict": None, "notes": [], "error": _internal(e)}


def _inspect(source: bytes, spec: dict, resolve_module=None) -> dict:
    out = {"class": None, "methods": {}, "native_via": {},
           "block": {"present": False, "sha": None, "expected_sha": None, "matches": None, "names": []},
           "hand_patch": False, "hand_patch_form": None, "hand_patch_defs": [],
           "module_level_leftovers": [], "would_change": None, "planned_verdict": None,
           "notes": [], "error": None}
    try:
        c = _core(source, spec, resolve_module)
    except EngineError as e:
        out["error"] = e.as_dict()
        try:
            s = validate_spec(spec)
            out["class"] = s["class"]
            text, _ = _decode(source)
            block = _find_block(_split_lines(text), s["name"])
            if block:
                out["block"].update(present=True, sha=block["sha"])
        except EngineError:
            pass
        return out
    s, doc = c["s"], c["doc"]
    out["class"] = s["class"]
    for m in (s.get("attributes") or []) + s["methods"]:
        n = m["name"]
        out["methods"][n] = ("native" if n in c["native"] else "ours" if n in c["ours"] or n in c["old_ours"]
                             else "missing")
        if n in c["via"]:
            out["native_via"][n] = c["via"][n]
    if doc.block is not None:
        out["block"].update(present=True, sha=doc.block["sha"], matches=c["block_matches"], names=list(c["ours"]))
    elif doc.others:
        out["block"].update(present=True, sha=doc.others[0]["sha"], matches=False, names=list(c["old_ours"]))
    if doc.others:
        out["block"]["other_specs"] = [b["spec"] for b in doc.others]
    if c["want"]:
        out["block"]["expected_sha"] = _block_sha(s, c["want"])
    if c["hand"]:
        out["hand_patch"] = True
        out["hand_patch_form"] = c["hand"]["form"]
        out["hand_patch_defs"] = list(c["hand"]["removed"])
    out["module_level_leftovers"] = list(c["leftovers"])
    out["notes"] = list(c["notes"])
    return edits.with_plan(out, plan_patch(source, spec, resolve_module))


def unified_diff(old: bytes, new: bytes, path: str) -> str:
    """A unified diff of two versions of a file (line endings kept as they are)."""
    def lines(b):
        return _split_lines(b.decode("utf-8", errors="replace"))
    a, b = lines(old), lines(new)
    out = []
    for line in difflib.unified_diff(a, b, fromfile=f"a/{path.lstrip('/')}", tofile=f"b/{path.lstrip('/')}", lineterm="\n"):
        if _ending(line):
            out.append(line)
        else:
            out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)
