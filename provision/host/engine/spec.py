"""The patch spec: what a spec may say, checked once (``validate_spec``), and the
block markers.  STDLIB ONLY, Python 3.10.

Shipped to the hosts with the rest of the engine; the control side's playbook loader
imports this module too, so a spec is refused on the control machine by the same rules.
"""

from __future__ import annotations

import keyword
import re

from provision.host.lib.modules import MAX_SOURCE_BYTES, PACKAGE, module_name  # noqa: F401 (re-exported)

BEGIN_MARK = "# >>> provision managed block:"
END_MARK = "# <<< provision managed block:"

MAX_BASE_DEPTH = 32

ERROR_KINDS = (
    "spec", "encoding", "too-large", "syntax", "class-missing", "class-ambiguous",
    "class-layout", "delegate-missing", "block-corrupt", "block-other-spec", "not-a-method", "internal",
    # mapping-entry and replace (engine/mapping_entry.py, engine/replace.py)
    "scope-missing", "scope-ambiguous", "mapping-missing", "mapping-ambiguous", "mapping-layout",
    "key-missing", "fragment-missing", "fragment-ambiguous", "fragment-layout",
    # interface (engine/interface.py)
    "protocol-missing",
)

# The kinds of spec (what a spec's `kind:` may say); "delegate" when it says nothing.
KINDS = ("delegate", "mapping-entry", "replace", "interface", "list-entry")
DEFAULT_PACKAGE = PACKAGE
# The keys each kind's spec may carry besides the common ones.
COMMON_KEYS = ("name", "kind", "package", "file", "applies")
KIND_KEYS = {
    "delegate": ("class", "delegate", "methods", "unit", "attributes"),
    "mapping-entry": ("mapping", "key", "value", "copy_of"),
    "replace": ("scope", "find", "replace", "native_if"),
    "interface": ("class", "delegate", "protocol"),
    "list-entry": ("scope", "list", "value"),
}
_CAPABILITY = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}\Z")
_PKG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")

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
    """Check a spec defensively; return a normalised copy. Raises EngineError("spec").

    Every kind's copy has name, kind, package, file (and applies when given); the
    delegate kind adds class, delegate, methods; mapping-entry mapping, key and value or
    copy_of; replace scope, find, replace, native_if (None when not given)."""
    if not isinstance(spec, dict):
        raise EngineError("spec", f"spec: expected a mapping, found {type(spec).__name__}")
    kind = spec.get("kind", "delegate")
    if kind is None:
        kind = "delegate"
    if kind not in KINDS:
        raise EngineError("spec", f"spec `kind`: expected one of {', '.join(KINDS)}, found {kind!r}")
    package = spec.get("package", DEFAULT_PACKAGE)
    if package is None:
        package = DEFAULT_PACKAGE
    if not _is_plain_ident(package):
        raise EngineError("spec", f"spec `package`: expected the import name of an installed package (an identifier like flashinfer), found {package!r}")
    if kind == "delegate":
        out = _validate_delegate(spec, package)
    elif kind == "interface":
        out = _validate_interface(spec, package)
    else:
        out = _validate_common(spec, package)
        out.update(_validate_mapping_entry(spec) if kind == "mapping-entry"
                   else _validate_list_entry(spec) if kind == "list-entry" else _validate_replace(spec))
    out["kind"], out["package"] = kind, package
    if spec.get("applies") is not None:
        out["applies"] = validate_applies(spec["applies"])
    return out


def _field(spec: dict, key: str, kind=str):
    if key not in spec:
        raise EngineError("spec", f"spec: expected a `{key}` field, found none")
    value = spec[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise EngineError("spec", f"spec `{key}`: expected {kind.__name__}, found {type(value).__name__}")
    return value


def _file_example(package: str) -> str:
    """A relative path inside `package`, for an error's example: the engine's own, else a plain one."""
    from provision.host.inference import get, of_package

    name = of_package(package)
    return get(name).spec_file_example if name else "jit/x.py"


def _validate_common(spec: dict, package: str) -> dict:
    name = _field(spec, "name")
    if not _SPEC_NAME.match(name):
        raise EngineError("spec", f"spec `name`: expected letters, digits, '.', '_' or '-' (at most 100), found {name!r}")
    path = _field(spec, "file")
    parts = path.split("/")
    if (not path.endswith(".py") or path.startswith("/") or "\\" in path
            or any(not _IDENT.match(p) for p in parts[:-1]) or not _IDENT.match(parts[-1][:-3])):
        raise EngineError("spec", f"spec `file`: expected a relative path like {_file_example(package)} inside the {package} package, found {path!r}")
    return {"name": name, "file": path}


def _fragment(spec: dict, key: str, required: bool) -> str | None:
    value = spec.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise EngineError("spec", f"spec `{key}`: expected a non-empty source fragment (text), found {value!r}")
    if "\x00" in value or "provision managed block" in value:
        raise EngineError("spec", f"spec `{key}`: expected plain source text, found a NUL byte or provision's own marker text")
    return value


def _validate_replace(spec: dict) -> dict:
    scope = spec.get("scope")
    if scope is not None and (not isinstance(scope, str) or not all(_is_plain_ident(p) for p in scope.split("."))):
        raise EngineError("spec", f"spec `scope`: expected a dotted def or class path like gen_module or Class.method, found {scope!r}")
    find = _fragment(spec, "find", True)
    replace = _fragment(spec, "replace", True)
    if find == replace:
        raise EngineError("spec", "spec `replace`: expected text that differs from `find`, found the same text")
    native_if = _fragment(spec, "native_if", False)
    return {"scope": scope or None, "find": find, "replace": replace, "native_if": native_if}


def _validate_key(value, key: str):
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise EngineError("spec", f"spec `{key}`: expected a number or a string (the dict key as a literal), found {type(value).__name__} {value!r}")
    return value


def _validate_mapping_entry(spec: dict) -> dict:
    mapping = _field(spec, "mapping")
    parts = mapping.split(".")
    if len(parts) > 2 or not all(_is_plain_ident(p) for p in parts):
        raise EngineError("spec", f"spec `mapping`: expected the name a module-level dict literal is bound to (NAME, or Class.NAME for one in a class body), found {mapping!r}")
    if "key" not in spec:
        raise EngineError("spec", "spec: expected a `key` field (the dict key to ensure), found none")
    key = _validate_key(spec["key"], "key")
    has_value, has_copy = spec.get("value") is not None, spec.get("copy_of") is not None
    if has_value == has_copy:
        raise EngineError("spec", "spec: expected exactly one of `value` (a source expression) and `copy_of` (another key whose value to copy), found " + ("both" if has_value else "neither"))
    value = copy_of = None
    if has_value:
        value = spec["value"]
        if not isinstance(value, str) or not value.strip() or any(c in value for c in "\r\n\x00"):
            raise EngineError("spec", f"spec `value`: expected a one-line Python expression, found {value!r}")
        import ast  # here, not at the top: the fast path reads markers and never parses a spec

        try:
            ast.parse(value.strip(), mode="eval")
        except (SyntaxError, ValueError) as e:
            raise EngineError("spec", f"spec `value`: expected a Python expression, found {value!r} ({e.msg if isinstance(e, SyntaxError) else e})")
        value = value.strip()
    else:
        copy_of = _validate_key(spec["copy_of"], "copy_of")
        if copy_of == key:
            raise EngineError("spec", f"spec `copy_of`: expected another key than `key` ({key!r})")
    return {"mapping": mapping, "key": key, "value": value, "copy_of": copy_of}


def _validate_list_entry(spec: dict) -> dict:
    scope = spec.get("scope")
    if scope is not None and (not isinstance(scope, str) or not all(_is_plain_ident(p) for p in scope.split("."))):
        raise EngineError("spec", f"spec `scope`: expected a dotted def or class path like Class.method, found {scope!r}")
    names = spec.get("list")
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not names or not all(_is_plain_ident(n) for n in names) or len(set(names)) != len(names):
        raise EngineError("spec", f"spec `list`: expected the name a list literal is bound to, or a list of the names releases gave it, found {spec.get('list')!r}")
    value = spec.get("value")
    if not isinstance(value, str) or not value.strip() or any(c in value for c in "\r\n\x00"):
        raise EngineError("spec", f"spec `value`: expected a one-line Python literal (the element, like '\"kimi_k2\"'), found {value!r}")
    import ast  # here, not at the top: the fast path reads markers and never parses a spec

    try:
        ast.literal_eval(value.strip())
    except (SyntaxError, ValueError) as e:
        raise EngineError("spec", f"spec `value`: expected a Python literal (a string, number, ...: provision compares it with the elements), found {value!r} ({e})")
    return {"scope": scope or None, "list": list(names), "value": value.strip()}


def validate_applies(applies) -> dict:
    """`applies:` checked for shape only (the control side evaluates it with `packaging`):
    {package name: specifier text, "gpu_capability": ["12.0", ...]}. Returns a copy with
    gpu_capability always a list."""
    if not isinstance(applies, dict) or not applies:
        raise EngineError("spec", f"spec `applies`: expected a mapping like {{sglang: '>=0.5.6', gpu_capability: ['12.0']}}, found {applies!r}")
    out: dict = {}
    for k, v in applies.items():
        if k == "gpu_capability":
            caps = [v] if isinstance(v, str) else v
            if not isinstance(caps, list) or not caps or not all(isinstance(c, str) and _CAPABILITY.match(c) for c in caps):
                raise EngineError("spec", f"spec `applies.gpu_capability`: expected compute capabilities like ['12.0'], found {v!r}")
            out[k] = list(caps)
        elif isinstance(k, str) and _PKG_NAME.match(k):
            if not isinstance(v, str) or not v.strip() or not all(_SPECIFIER.match(p.strip()) for p in v.split(",")):
                raise EngineError("spec", f"spec `applies.{k}`: expected a version specifier like '>=0.5.6,<0.6', found {v!r}")
            out[k] = v.strip()
        else:
            raise EngineError("spec", f"spec `applies`: expected package names or gpu_capability as keys, found {k!r}")
    return out


_SPECIFIER = re.compile(r"(~=|==|!=|<=|>=|<|>|===)\s*[A-Za-z0-9_.*+!-]+\Z")


def _validate_delegate(spec: dict, package: str) -> dict:
    base = _validate_common(spec, package)
    cls = _field(spec, "class")
    if not _is_plain_ident(cls):
        raise EngineError("spec", f"spec `class`: expected a Python identifier, found {cls!r}")
    delegate = _field(spec, "delegate")
    if not _is_plain_ident(delegate) or _mangled(delegate):
        raise EngineError("spec", f"spec `delegate`: expected an attribute name (no leading '__'), found {delegate!r}")
    methods = _field(spec, "methods", list)
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
    base.update({"class": cls, "delegate": delegate, "methods": out})
    if spec.get("attributes"):
        base["attributes"] = _validate_attributes(spec["attributes"], delegate, seen)
    return base


def _validate_interface(spec: dict, package: str) -> dict:
    """An interface spec: the class, the attribute holding its inner model, and the protocol
    (`FILE:Class`, FILE relative to the package) whose members the class must have. The members
    are read from the installed release's protocol on the host (engine/interface.py)."""
    base = _validate_common(spec, package)
    for key in ("class", "delegate"):
        if not _is_plain_ident(_field(spec, key)) or _mangled(spec[key]):
            raise EngineError("spec", f"spec `{key}`: expected a Python identifier, found {spec[key]!r}")
    protocol = _field(spec, "protocol")
    file, _, cls = protocol.partition(":")
    try:
        _validate_common({"name": "x", "file": file}, package)
    except EngineError:
        file = ""
    if not file or not _is_plain_ident(cls):
        raise EngineError("spec", f"spec `protocol`: expected FILE:Class, the file relative to the {package} package that declares the interface and its class (like model_executor/models/interfaces.py:SupportsEagle3), found {protocol!r}")
    base.update({"class": spec["class"], "delegate": spec["delegate"], "protocol": protocol})
    return base


def _validate_attributes(attributes, delegate: str, method_names: set) -> list:
    """A delegate spec's `attributes:` (what an interface spec expands to: class attributes the
    block sets where the class lacks them): [{name, value}], value a one-line expression."""
    if not isinstance(attributes, list):
        raise EngineError("spec", f"spec `attributes`: expected a list of {{name, value}}, found {type(attributes).__name__}")
    out, seen = [], set()
    for i, a in enumerate(attributes):
        name = a.get("name") if isinstance(a, dict) else None
        value = a.get("value") if isinstance(a, dict) else None
        if not _is_plain_ident(name) or _mangled(name) or name in seen or name in method_names or name == delegate:
            raise EngineError("spec", f"spec `attributes[{i}].name`: expected a unique attribute name (not a method's or the delegate's), found {name!r}")
        if not isinstance(value, str) or not value.strip() or any(c in value for c in "\r\n\x00"):
            raise EngineError("spec", f"spec `attributes[{i}].value`: expected a one-line Python expression, found {value!r}")
        import ast

        try:
            ast.parse(value.strip(), mode="eval")
        except SyntaxError as e:
            raise EngineError("spec", f"spec `attributes[{i}].value`: expected a Python expression, found {value!r} ({e.msg})")
        seen.add(name)
        out.append({"name": name, "value": value.strip()})
    return out


def _is_plain_ident(s) -> bool:
    return isinstance(s, str) and bool(_IDENT.match(s)) and not keyword.iskeyword(s)


def _mangled(name: str) -> bool:
    return name.startswith("__") and not name.endswith("__")


def _literal_params(a, params: str, where: str, ast) -> None:
    """`params` is names, types and defaults that are literals or names, nothing else: a default or an annotation is
    evaluated when the class is defined (in the server, as root), so a call there would be code run
    from what the spec calls data."""
    every = list(a.posonlyargs) + list(a.args) + list(a.kwonlyargs) + [x for x in (a.vararg, a.kwarg) if x]
    typeish = (ast.Name, ast.Attribute, ast.Subscript, ast.Tuple, ast.List, ast.Constant, ast.BinOp, ast.BitOr,
               ast.Load, ast.Index if hasattr(ast, "Index") else ast.Load)
    for arg in every:
        if arg.annotation is not None and not all(isinstance(n, typeish) for n in ast.walk(arg.annotation)):
            raise EngineError("spec", f"{where}.params: parameter {arg.arg!r} has an annotation that is not a type "
                                      f"(names, dots and subscripts only: no call), found {params!r}")
    valueish = (ast.Constant, ast.Name, ast.Attribute, ast.Tuple, ast.List, ast.Dict, ast.Set, ast.UnaryOp,
                ast.USub, ast.UAdd, ast.Not, ast.Load)
    for default in list(a.defaults) + [d for d in a.kw_defaults if d is not None]:
        if not all(isinstance(n, valueish) for n in ast.walk(default)):
            raise EngineError("spec", f"{where}.params: the default {ast.unparse(default)!r} is not a literal or a "
                                      "name (a number, a string, None, True/False, a constant of the module, or a "
                                      "tuple/list/dict of them): a default is evaluated when the class is defined, "
                                      "so it may not be code")


def _parse_params(mname: str, params: str, where: str) -> dict:
    if any(ord(c) < 0x20 or c == "\x7f" for c in params):
        raise EngineError("spec", f"{where}.params: expected one line without control characters, found {params!r}")
    import ast  # here, not at the top: the fast path reads markers and never parses a spec

    try:
        fn = ast.parse(f"def _({params}): pass").body[0]
        compile(f"def _({params}): pass", "<spec>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        raise EngineError("spec", f"{where}.params: expected a Python parameter list like 'self, layer_ids=None', found {params!r} ({e.msg if isinstance(e, SyntaxError) else e})")
    if not isinstance(fn, ast.FunctionDef) or len(ast.parse(f"def _({params}): pass").body) != 1:
        raise EngineError("spec", f"{where}.params: expected a parameter list, found {params!r}")
    a = fn.args
    _literal_params(a, params, where, ast)
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
