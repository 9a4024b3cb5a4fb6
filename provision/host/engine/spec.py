"""The patch spec: what a spec may say, checked once (``validate_spec``), and the
block markers.  STDLIB ONLY, Python 3.10.

Shipped to the hosts with the rest of the engine; the control side's playbook loader
imports this module too, so a spec is refused on the control machine by the same rules.
"""

from __future__ import annotations

import ast
import keyword
import re

from provision.host.lib.modules import MAX_SOURCE_BYTES, PACKAGE, module_name  # noqa: F401 (re-exported)

BEGIN_MARK = "# >>> provision managed block:"
END_MARK = "# <<< provision managed block:"

MAX_BASE_DEPTH = 32

ERROR_KINDS = (
    "spec", "encoding", "too-large", "syntax", "class-missing", "class-ambiguous",
    "class-layout", "delegate-missing", "block-corrupt", "block-other-spec", "not-a-method", "internal",
)

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SPEC_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")
_NEWLINE = re.compile(r"\r\n|\r|\n")
_BEGIN_RE = re.compile(
    r"[ \t\f]*" + re.escape(BEGIN_MARK) + r" spec=(\S+) sha=([0-9a-fA-F]*)")
_END_RE = re.compile(r"[ \t\f]*" + re.escape(END_MARK) + r" spec=(\S+)")
_HAND_DEF_RE = re.compile(r"[ \t]*(?:async[ \t]+)?def[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*\(")
# Names the rendered body relies on; a parameter must not shadow them.
_BODY_BUILTINS = ("type", "hasattr", "AttributeError")


class EngineError(Exception):
    """An expected refusal: a kind from ERROR_KINDS and one sentence."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message

    def as_dict(self) -> dict:
        return {"kind": self.kind, "message": self.message}


# --------------------------------------------------------------------------- spec

def validate_spec(spec) -> dict:
    """Check a spec defensively; return a normalised copy. Raises EngineError("spec")."""
    if not isinstance(spec, dict):
        raise EngineError("spec", f"spec: expected a mapping, found {type(spec).__name__}")

    def field(key, kind=str):
        if key not in spec:
            raise EngineError("spec", f"spec: expected a `{key}` field, found none")
        value = spec[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise EngineError("spec", f"spec `{key}`: expected {kind.__name__}, found {type(value).__name__}")
        return value

    name = field("name")
    if not _SPEC_NAME.match(name):
        raise EngineError("spec", f"spec `name`: expected letters, digits, '.', '_' or '-' (at most 100), found {name!r}")
    path = field("file")
    parts = path.split("/")
    if (not path.endswith(".py") or path.startswith("/") or "\\" in path
            or any(not _IDENT.match(p) for p in parts[:-1]) or not _IDENT.match(parts[-1][:-3])):
        raise EngineError("spec", f"spec `file`: expected a relative path like srt/models/x.py inside the sglang package, found {path!r}")
    cls = field("class")
    if not _is_plain_ident(cls):
        raise EngineError("spec", f"spec `class`: expected a Python identifier, found {cls!r}")
    delegate = field("delegate")
    if not _is_plain_ident(delegate) or _mangled(delegate):
        raise EngineError("spec", f"spec `delegate`: expected an attribute name (no leading '__'), found {delegate!r}")
    methods = field("methods", list)
    if not methods:
        raise EngineError("spec", "spec `methods`: expected at least one method, found an empty list")
    out, seen = [], set()
    for i, m in enumerate(methods):
        where = f"spec `methods[{i}]`"
        if not isinstance(m, dict):
            raise EngineError("spec", f"{where}: expected a mapping with name and params, found {type(m).__name__}")
        mname = m.get("name")
        if not isinstance(mname, str) or not _is_plain_ident(mname) or _mangled(mname):
            raise EngineError("spec", f"{where}.name: expected a method name (identifier, no leading '__'), found {mname!r}")
        if mname in seen:
            raise EngineError("spec", f"{where}.name: expected unique method names, found {mname!r} twice")
        if mname == delegate:
            raise EngineError("spec", f"{where}.name: a method cannot be named like the delegate attribute {delegate!r}")
        seen.add(mname)
        params = m.get("params", "self")
        if not isinstance(params, str):
            raise EngineError("spec", f"{where}.params: expected a string like 'self, x=None', found {type(params).__name__}")
        out.append(_parse_params(mname, params.strip(), where))
    return {"name": name, "file": path, "class": cls, "delegate": delegate, "methods": out}


def _is_plain_ident(s) -> bool:
    return isinstance(s, str) and bool(_IDENT.match(s)) and not keyword.iskeyword(s)


def _mangled(name: str) -> bool:
    return name.startswith("__") and not name.endswith("__")


def _parse_params(mname: str, params: str, where: str) -> dict:
    if any(ord(c) < 0x20 or c == "\x7f" for c in params):
        raise EngineError("spec", f"{where}.params: expected one line without control characters, found {params!r}")
    try:
        fn = ast.parse(f"def _({params}): pass").body[0]
        compile(f"def _({params}): pass", "<spec>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        raise EngineError("spec", f"{where}.params: expected a Python parameter list like 'self, layer_ids=None', found {params!r} ({e.msg if isinstance(e, SyntaxError) else e})")
    if not isinstance(fn, ast.FunctionDef) or len(ast.parse(f"def _({params}): pass").body) != 1:
        raise EngineError("spec", f"{where}.params: expected a parameter list, found {params!r}")
    a = fn.args
    positional = list(a.posonlyargs) + list(a.args)
    if not positional or positional[0].arg != "self":
        raise EngineError("spec", f"{where}.params: expected `self` as the first positional parameter, found {params!r}")
    names = [p.arg for p in positional + list(a.kwonlyargs)]
    if a.vararg:
        names.append(a.vararg.arg)
    if a.kwarg:
        names.append(a.kwarg.arg)
    for bad in _BODY_BUILTINS:
        if bad in names:
            raise EngineError("spec", f"{where}.params: parameter {bad!r} would shadow the builtin the delegation body uses; rename it")
    call = [p.arg for p in positional[1:]]
    if a.vararg:
        call.append("*" + a.vararg.arg)
    call += [f"{p.arg}={p.arg}" for p in a.kwonlyargs]
    if a.kwarg:
        call.append("**" + a.kwarg.arg)
    inner = "inner"
    while inner in names:
        inner = "_" + inner
    return {"name": mname, "params": params, "call": ", ".join(call), "inner": inner}
