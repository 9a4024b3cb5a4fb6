"""The flags an installed SGLang's argument parser takes, read from its source with ``ast``.  STDLIB ONLY.

Pure: text in, data out; nothing is imported from SGLang, nothing is read from disk here
(host/facts/model.py reads the files). This module imports nothing of provision either, so
the sandbox's stand-in server can carry it as a lone file next to itself.

Two ways a release declares its flags, both read here:

* 0.5.9 and its neighbours: ``parser.add_argument(...)`` calls in ``ServerArgs.add_cli_args``
  of ``srt/server_args.py`` (names, aliases, action, choices, nargs, literal types/defaults).
* 0.5.23: ``add_cli_args_from_dataclass(parser, ServerArgs)`` turns each field annotated
  ``A[T, "help"]`` or ``A[T, Arg(...)]`` of the namespace classes in ``srt/arg_groups/fields/*.py``
  into ``--field-name`` (or ``Arg(cli_name=...)``, plus ``aliases=[...]``) unless ``no_cli``;
  ``Literal[...]`` types give the choices; the few remaining ``add_argument`` calls of
  ``add_cli_args`` come on top.

:func:`decide` then judges one flag as argparse does with its defaults (SGLang builds
``argparse.ArgumentParser()``, so ``allow_abbrev`` is on): an exact name is taken, a unique
prefix is taken (with a note to spell it out), an ambiguous prefix or an unknown name is an
error, and so is a value outside known ``choices``. When this reader cannot be sure (a choice
list computed at run time, a value it cannot compare), it accepts: a refusal here must never
stop a launch SGLang itself would accept.
"""

from __future__ import annotations

import ast
import difflib
import json


class _Unknown:
    def __repr__(self) -> str:
        return "<unknown>"


_UNKNOWN = _Unknown()
UNKNOWN = _UNKNOWN


class ServerArgsUnreadable(ValueError):
    """The file is not Python this reader understands (a syntax error, no flag declarations)."""


def _lit(node: ast.AST | None, consts: dict):
    """Evaluate a literal-ish expression; names resolve through ``consts``. _UNKNOWN if impossible."""
    if node is None:
        return _UNKNOWN
    try:
        return ast.literal_eval(node)
    except Exception:
        pass
    if isinstance(node, ast.Name):
        return consts.get(node.id, _UNKNOWN)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        vals = [_lit(e, consts) for e in node.elts]
        if any(v is _UNKNOWN for v in vals):
            return _UNKNOWN
        return list(vals) if not isinstance(node, ast.Tuple) else tuple(vals)
    if isinstance(node, ast.BinOp):
        left, right = _lit(node.left, consts), _lit(node.right, consts)
        if left is _UNKNOWN or right is _UNKNOWN:
            return _UNKNOWN
        try:
            if isinstance(node.op, ast.Add):
                if isinstance(left, tuple) and isinstance(right, list):
                    left = list(left)
                return left + right
            if isinstance(node.op, ast.Mult):
                return left * right
            if isinstance(node.op, ast.Sub):
                return left - right
        except Exception:
            return _UNKNOWN
    if isinstance(node, ast.Subscript):
        base, idx = _lit(node.value, consts), _lit(node.slice, consts)
        if base is _UNKNOWN or idx is _UNKNOWN:
            return _UNKNOWN
        try:
            return base[idx]
        except Exception:
            return _UNKNOWN
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("list", "sorted", "tuple"):
        if len(node.args) == 1 and not node.keywords:
            inner = _lit(node.args[0], consts)
            if inner is _UNKNOWN:
                return _UNKNOWN
            try:
                return {"list": list, "sorted": sorted, "tuple": tuple}[node.func.id](inner)
            except Exception:
                return _UNKNOWN
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "field":
        for kw in node.keywords:
            if kw.arg == "default":
                return _lit(kw.value, consts)
            if kw.arg == "default_factory":
                if isinstance(kw.value, ast.Name) and kw.value.id in ("list", "dict"):
                    return [] if kw.value.id == "list" else {}
                if isinstance(kw.value, ast.Lambda):
                    return _lit(kw.value.body, consts)
        return _UNKNOWN
    return _UNKNOWN


class FlagSpec:
    """One ``add_argument`` call (or one dataclass field turned into one): its option strings and
    its keyword values (``_UNKNOWN`` where the reader cannot evaluate them)."""

    def __init__(self, options, kwargs, lineno):
        self.options: list[str] = options
        self.kw: dict = kwargs
        self.lineno = lineno

    @property
    def dest(self) -> str:
        if "dest" in self.kw and isinstance(self.kw["dest"], str):
            return self.kw["dest"]
        longs = [o for o in self.options if o.startswith("--")]
        return (longs[0] if longs else self.options[0]).lstrip("-").replace("-", "_")


class ServerArgsSpec:
    """Everything read from an installed ``server_args.py`` (and, for 0.5.23, its field modules)."""

    def __init__(self, flags, fields, action_classes, source="add_argument"):
        self.flags: list[FlagSpec] = flags
        self.fields: list[tuple[str, object]] = fields  # ServerArgs dataclass order, default
        self.action_classes: dict[str, dict] = action_classes  # custom Action class -> init defaults
        self.source = source  # "add_argument" or "dataclass"

    @property
    def store_true_dests(self) -> set:
        return {f.dest for f in self.flags if f.kw.get("action") == "store_true"}

    @property
    def unsupported_config_dests(self) -> dict:
        out = {}
        for f in self.flags:
            act = f.kw.get("action")
            if act in (None, "store", "store_true"):
                continue
            if "--config" in f.options or "--help" in f.options or "-h" in f.options:
                continue
            out[f.dest] = act
        return out


def _module_consts(tree: ast.Module, consts: dict | None = None) -> dict:
    consts = dict(consts or {})
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            val = _lit(node.value, consts)
            if val is not _UNKNOWN:
                consts[node.targets[0].id] = val
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            val = _lit(node.value, consts)
            if val is not _UNKNOWN:
                consts[node.target.id] = val
    return consts


def _parse(text: str, filename: str) -> ast.Module:
    try:
        return ast.parse(text, filename=filename)
    except (SyntaxError, ValueError) as exc:
        raise ServerArgsUnreadable(f"{filename}: not Python this reader can parse ({exc})") from None


def _add_argument_calls(scope: ast.AST, consts: dict, field_defaults: dict) -> list[FlagSpec]:
    calls = [n for n in ast.walk(scope)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "add_argument"]
    calls.sort(key=lambda n: (n.lineno, n.col_offset))
    flags: list[FlagSpec] = []
    for call in calls:
        options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not options:
            continue
        kw: dict = {}
        for k in call.keywords:
            if k.arg is None:
                continue
            v = k.value
            if k.arg == "default":
                if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "ServerArgs":
                    kw["default"] = field_defaults.get(v.attr, _UNKNOWN)
                else:
                    kw["default"] = _lit(v, consts)
            elif k.arg in ("type", "action"):
                kw[k.arg] = v.value if isinstance(v, ast.Constant) else ast.unparse(v)
            elif k.arg == "help":
                continue
            else:
                kw[k.arg] = _lit(v, consts)
        flags.append(FlagSpec(options, kw, call.lineno))
    return flags


def parse_server_args(text: str, filename: str = "server_args.py",
                      field_files: dict[str, str] | None = None, choices_text: str | None = None) -> ServerArgsSpec:
    """Read the flags of one release.

    ``text`` is ``srt/server_args.py``; ``field_files`` maps the file names of
    ``srt/arg_groups/fields/*.py`` to their text and ``choices_text`` is
    ``srt/arg_groups/choices.py`` (both only needed by releases that derive flags from dataclass
    fields, 0.5.23). Raises ServerArgsUnreadable when the files are not Python, or declare no flag
    this reader can see (a parser it does not understand)."""
    tree = _parse(text, filename)
    consts = _module_consts(tree)
    fields: list[tuple[str, object]] = []
    field_defaults: dict = {}
    action_classes: dict[str, dict] = {}
    server_cls = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            server_cls = node
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    val = _lit(stmt.value, consts) if stmt.value is not None else _UNKNOWN
                    fields.append((stmt.target.id, val))
                    field_defaults[stmt.target.id] = val
        elif isinstance(node, ast.ClassDef):
            # custom argparse.Action subclasses: remember their __init__ keyword defaults
            if any(ast.unparse(b).endswith("Action") for b in node.bases):
                info: dict = {}
                for stmt in node.body:
                    if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
                        args = stmt.args
                        pos = args.args[len(args.args) - len(args.defaults):] if args.defaults else []
                        for a, d in zip(pos, args.defaults):
                            info[a.arg] = _lit(d, consts)
                        for a, d in zip(args.kwonlyargs, args.kw_defaults):
                            if d is not None:
                                info[a.arg] = _lit(d, consts)
                action_classes[node.name] = info

    scope = None
    if server_cls is not None:
        for stmt in server_cls.body:
            if isinstance(stmt, ast.FunctionDef) and stmt.name == "add_cli_args":
                scope = stmt
    flags = _add_argument_calls(scope if scope is not None else tree, consts, field_defaults)
    source = "add_argument"
    uses_dataclass = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                         and n.func.id == "add_cli_args_from_dataclass"
                         for n in ast.walk(scope if scope is not None else tree))
    if uses_dataclass:
        source = "dataclass"
        if not field_files:
            raise ServerArgsUnreadable(f"{filename}: its flags come from dataclass fields, and "
                                       "srt/arg_groups/fields/ was not found")
        derived = dataclass_flags(field_files, choices_text, _namespace_names(tree))
        if server_cls is not None:  # fields declared on ServerArgs itself
            derived += _class_field_flags([server_cls], {"ServerArgs": server_cls}, consts)
        flags = derived + flags
    if not flags:
        raise ServerArgsUnreadable(f"{filename}: no flag declarations this reader understands")
    return ServerArgsSpec(flags, fields, action_classes, source)


def _namespace_names(tree: ast.Module) -> list[str] | None:
    """The classes listed in ``_INPUT_NAMESPACES = [Model, ...]`` (0.5.23), None when absent."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id == "_INPUT_NAMESPACES" and isinstance(node.value, (ast.List, ast.Tuple)):
            names = [e.id for e in node.value.elts if isinstance(e, ast.Name)]
            return names or None
    return None


def _is_annotated(ann: ast.AST) -> bool:
    return isinstance(ann, ast.Subscript) and (
        (isinstance(ann.value, ast.Name) and ann.value.id in ("A", "Annotated"))
        or (isinstance(ann.value, ast.Attribute) and ann.value.attr == "Annotated"))


def _stringish(node: ast.AST, consts: dict) -> bool | None:
    """Is this annotation metadata a str (a help text)? None when it cannot be told."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp):
        return _stringish(node.left, consts)
    if isinstance(node, ast.Name):
        val = consts.get(node.id, _UNKNOWN)
        return None if val is _UNKNOWN else isinstance(val, str)
    if isinstance(node, ast.Call):
        return False  # NS(...), Derived(...): not an Arg
    return None


def _literal_values(tp: ast.AST, consts: dict):
    """``Literal[...]`` (inside ``Optional[...]`` too) -> its values; else None."""
    if isinstance(tp, ast.Subscript):
        head = ast.unparse(tp.value).rsplit(".", 1)[-1]
        if head == "Optional":
            return _literal_values(tp.slice, consts)
        if head == "Literal":
            elts = tp.slice.elts if isinstance(tp.slice, ast.Tuple) else [tp.slice]
            vals = [_lit(e, consts) for e in elts]
            return _UNKNOWN if any(v is _UNKNOWN for v in vals) else vals
        if head == "Union":
            elts = tp.slice.elts if isinstance(tp.slice, ast.Tuple) else [tp.slice]
            non_none = [e for e in elts if ast.unparse(e) != "None"]
            if len(non_none) == 1:
                return _literal_values(non_none[0], consts)
    if isinstance(tp, ast.BinOp) and isinstance(tp.op, ast.BitOr):
        parts = [p for p in (tp.left, tp.right) if ast.unparse(p) != "None"]
        if len(parts) == 1:
            return _literal_values(parts[0], consts)
    return None


def _is_bool(tp: ast.AST) -> bool:
    text = ast.unparse(tp).replace(" ", "")
    return text in ("bool", "Optional[bool]", "bool|None", "None|bool")


def _value_shape(tp: ast.AST, arg: dict) -> dict:
    """What add_cli_args_from_dataclass gives a non-Literal, non-bool field (0.5.23,
    arg_groups/arg_utils.py): ``list[X]`` -> nargs "+" (or the Arg's) of X's converter, unless a
    ``type_parser`` takes the whole value; ``int``/``float`` -> that converter; Optional unwrapped."""
    if arg.get("type_parser") is not None:
        return {}
    text = ast.unparse(tp).replace(" ", "").replace("|None", "").replace("None|", "")
    if text.startswith("Optional[") and text.endswith("]"):
        text = text[len("Optional["):-1]
    if text[:5].lower() == "list[" and text.endswith("]"):
        elem, nargs = text[5:-1], arg.get("nargs")
        return {"nargs": nargs if isinstance(nargs, (int, str)) else "+",
                **({"type": elem} if elem in ("int", "float", "str") else {})}
    if text in ("int", "float"):
        return {"type": text}
    return {}


def _class_field_flags(classes: list[ast.ClassDef], by_name: dict[str, ast.ClassDef], consts: dict,
                       _seen: set | None = None) -> list[FlagSpec]:
    """What add_cli_args_from_dataclass registers for the annotated fields of these classes
    (bases among ``by_name`` first, as a Struct's fields are)."""
    seen = set() if _seen is None else _seen
    out: list[FlagSpec] = []
    for cls in classes:
        if cls.name in seen:
            continue
        seen.add(cls.name)
        bases = [by_name[b.id] for b in cls.bases if isinstance(b, ast.Name) and b.id in by_name]
        out += _class_field_flags(bases, by_name, consts, seen)
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            ann = stmt.annotation
            if isinstance(ann, ast.Constant) and isinstance(ann.value, str):  # a quoted annotation
                try:
                    ann = ast.parse(ann.value, mode="eval").body
                except SyntaxError:
                    continue
            if not _is_annotated(ann):
                continue
            assert isinstance(ann, ast.Subscript)
            elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            if len(elts) < 2:
                continue
            tp, meta = elts[0], elts[1:]
            arg: dict | None = None
            for m in meta:
                if isinstance(m, ast.Call) and ast.unparse(m.func).rsplit(".", 1)[-1] == "Arg":
                    arg = {}
                    for k in m.keywords:
                        if k.arg is None:
                            continue
                        if k.arg == "action":
                            arg["action"] = k.value.value if isinstance(k.value, ast.Constant) else ast.unparse(k.value)
                        elif k.arg != "help":
                            arg[k.arg] = _lit(k.value, consts)
                    break
                s = _stringish(m, consts)
                if s is None:  # cannot tell: count it as a flag (never refuse what SGLang takes)
                    arg = {}
                    break
                if s:
                    arg = {}
                    break
            if arg is None or arg.get("no_cli") is True:
                continue
            name = stmt.target.id
            cli = arg.get("cli_name")
            cli = cli if isinstance(cli, str) else "--" + name.replace("_", "-")
            aliases = arg.get("aliases")
            options = [cli] + ([a for a in aliases if isinstance(a, str)] if isinstance(aliases, (list, tuple)) else [])
            kw: dict = {"dest": name}
            if arg.get("action") is not None:
                kw["action"] = arg["action"]
                for k2, v2 in (arg.get("action_kwargs") or {}).items() if isinstance(arg.get("action_kwargs"), dict) else ():
                    kw[k2] = v2
            else:
                literal = _literal_values(tp, consts)
                choices = arg.get("choices")
                if choices is None or choices is _UNKNOWN:
                    choices = literal if literal is not None else (None if "choices" not in arg else _UNKNOWN)
                if choices is not None:
                    kw["choices"] = choices
                if _is_bool(tp) and literal is None:
                    kw["action"] = "store_true"
                elif literal is None:
                    kw.update(_value_shape(tp, arg))
                if arg.get("nargs") not in (None, _UNKNOWN):
                    kw["nargs"] = arg["nargs"]
            if stmt.value is not None:
                kw["default"] = _lit(stmt.value, consts)
            out.append(FlagSpec(options, kw, stmt.lineno))
    return out


def dataclass_flags(field_files: dict[str, str], choices_text: str | None = None,
                    namespaces: list[str] | None = None) -> list[FlagSpec]:
    """The flags ``add_cli_args_from_dataclass`` derives from the namespace classes of
    ``srt/arg_groups/fields/*.py`` (only those named in ``namespaces`` when given)."""
    base_consts: dict = {}
    if choices_text:
        try:
            base_consts = _module_consts(ast.parse(choices_text))
        except (SyntaxError, ValueError):
            base_consts = {}
    by_name: dict[str, ast.ClassDef] = {}
    consts_of: dict[str, dict] = {}
    order: list[str] = []
    for fname in sorted(field_files):
        tree = _parse(field_files[fname], fname)
        consts = _module_consts(tree, base_consts)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                by_name[node.name] = node
                consts_of[node.name] = consts
                order.append(node.name)
    wanted = [n for n in (namespaces or order) if n in by_name]
    out: list[FlagSpec] = []
    seen: set = set()
    for n in wanted:
        out += _class_field_flags([by_name[n]], by_name, consts_of[n], seen)
    return out


# --------------------------------------------------------------------------- the table and the decision

def _jsonable(v):
    if v is _UNKNOWN:
        return None
    if isinstance(v, (set, frozenset)):
        v = sorted(v, key=str)
    if isinstance(v, (list, tuple)):
        return [x if isinstance(x, (str, int, float, bool)) or x is None else str(x) for x in v]
    return None


# argparse's own type converters, as a release names them; a value they would refuse is a fail row
CONVERTERS = {"int": int, "float": float}


def _shape(f: FlagSpec) -> dict:
    """What the parser takes after the flag: "switch" (store_true/store_false/
    BooleanOptionalAction: nothing), else "nargs" (None: one value; "?", "*", "+" or a count) and
    "type" (the converter's name, when a literal name). None where the reader cannot tell."""
    act = f.kw.get("action")
    name = act.rsplit(".", 1)[-1] if isinstance(act, str) else None
    if name in ("store_true", "store_false", "store_const", "BooleanOptionalAction", "count"):
        default = f.kw.get("default")
        return {"switch": name, "default": default if isinstance(default, bool) else None}
    if act is not None and name != "store":
        return {"custom": True}  # a release's own Action (LoRAPathAction, DeprecatedAction): not judged
    nargs = f.kw.get("nargs")
    tp = f.kw.get("type")
    return {"nargs": nargs if isinstance(nargs, (int, str)) else None, "type": tp if isinstance(tp, str) else None}


def flag_table(spec: ServerArgsSpec) -> dict:
    """{option string: {"dest", "choices" (a list, or None when any value goes or they are not known),
    and the flag's shape (:func:`_shape`)}}, every ``--`` option of the parser, including ``--no-X``
    of a BooleanOptionalAction. JSON-able (cached)."""
    table: dict[str, dict] = {}
    for f in spec.flags:
        ch = f.kw.get("choices")
        choices = _jsonable(ch) if ch is not None else None
        act = f.kw.get("action")
        boolean_opt = isinstance(act, str) and act.rsplit(".", 1)[-1] == "BooleanOptionalAction"
        shape = _shape(f)
        for opt in f.options:
            if not opt.startswith("-"):
                continue
            table.setdefault(opt, {"dest": f.dest, "choices": choices, **shape})
            if boolean_opt and opt.startswith("--"):
                table.setdefault("--no-" + opt[2:], {"dest": f.dest, "choices": None, "switch": "negation"})
    table.setdefault("--help", {"dest": "help", "choices": None})
    table.setdefault("-h", {"dest": "help", "choices": None})
    return table


# Flags SGLang and vLLM spell differently: the other engine's name for the same setting, offered
# before any near miss (`--tp-size` on vLLM is `--tensor-parallel-size`, not `--ubatch-size`).
COUNTERPARTS = {
    "--tp-size": "--tensor-parallel-size", "--tensor-parallel-size": "--tp-size",
    "--dp-size": "--data-parallel-size", "--data-parallel-size": "--dp-size",
    "--pp-size": "--pipeline-parallel-size", "--pipeline-parallel-size": "--pp-size",
    "--model-path": "--model", "--mem-fraction-static": "--gpu-memory-utilization",
    "--gpu-memory-utilization": "--mem-fraction-static", "--context-length": "--max-model-len",
    "--max-model-len": "--context-length", "--max-running-requests": "--max-num-seqs",
    "--max-num-seqs": "--max-running-requests",
}


def closest(name: str, table: dict, n: int = 3) -> list[str]:
    """The flags the user may have meant: the other engine's name for it (when this parser has it),
    else the near misses."""
    other = COUNTERPARTS.get(name)
    if other is not None and other in table:
        return [other]
    longs = [o for o in table if o.startswith("--")]
    return difflib.get_close_matches(name, longs, n=n, cutoff=0.6)


def _value_ok(value, choices: list) -> bool:
    texts = {str(c) for c in choices}
    if isinstance(value, (list, tuple)):
        return all(_value_ok(v, choices) for v in value)
    if str(value) in texts:
        return True
    try:  # argparse converts with `type` first: 3 and "3", 0.5 and "0.50"
        num = float(value)
        return any(isinstance(c, (int, float)) and not isinstance(c, bool) and float(c) == num for c in choices)
    except (TypeError, ValueError):
        return False


def decide(flag: str, value, table: dict, version: str | None = None, title: str = "SGLang") -> tuple[str, str]:
    """Judge one flag as the release's argparse parser would: (level, one sentence).

    ``flag`` is the name without dashes or with them (``speculative-num-steps``); ``value`` the
    profile's value (True for a bare switch). Levels: ``ok``; ``warn`` (accepted, but say so);
    ``fail`` (the engine's parser would exit 2). ``title``: the engine, in the sentence."""
    opt = flag if flag.startswith("-") else "--" + flag
    where = f"{title} {version}" if version else f"the installed {title}"
    hit = table.get(opt)
    if hit is None:
        matches = sorted(o for o in table if o.startswith(opt) and o.startswith("--"))
        dests = {table[o]["dest"] for o in matches}
        if len(matches) == 1:
            full = matches[0]
            hit = table[full]
            bad = _shape_problem(full, value, hit, where) or _choice_problem(opt, value, hit, where)
            if bad:
                return bad
            return "warn", (f"{opt} is taken by {where} as {full} (argparse accepts a unique prefix); "
                            f"spell it out as {full}")
        if len(matches) > 1 and len(dests) == 1:  # aliases of one flag: some argparse releases take it
            return "warn", (f"{opt} could be {', '.join(matches)} (one flag of {where}); spell it out")
        if len(matches) > 1:
            return "fail", (f"{opt} is ambiguous for {where}: it could be {', '.join(matches[:6])}"
                            + (" ..." if len(matches) > 6 else "") + "; spell the flag out")
        near = closest(opt, table)
        return "fail", (f"{opt} is not a flag of {where}"
                        + (f": did you mean {' or '.join(near)}?" if near else ""))
    bad = _shape_problem(opt, value, hit, where) or _choice_problem(opt, value, hit, where)
    return bad or ("ok", f"{opt}")


def _shape_problem(opt: str, value, hit: dict, where: str) -> tuple[str, str] | None:
    """What argparse would say of the tokens provision renders for ``value`` (profile.render_flags:
    True is the bare flag, False nothing, a list one token per item, anything else one token)."""
    if hit.get("custom"):
        return None
    switch = hit.get("switch")
    if switch is not None:
        if value is False and switch == "BooleanOptionalAction" and hit.get("default") is True:
            return "fail", (f"{opt} is on by default in {where}, and false only leaves it out: turn it off "
                            f"with no-{opt[2:]}: true")
        if value is True or value is False:
            return None
        return "fail", (f"{opt} is a switch in {where} (it takes no value): write {opt[2:]}: true, not "
                        f"{value!r}")
    if value is False:
        return None  # left out of the argv
    nargs = hit.get("nargs")
    if value is True:
        if nargs in ("?", "*"):
            return None
        return "fail", f"{opt} takes a value in {where}: `{opt[2:]}: true` would give it none"
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if isinstance(value, (list, tuple)):
        if nargs is None or nargs == "?":
            return "fail", (f"{opt} takes one value in {where}, not a list; a JSON value is written as a "
                            f"string: {opt[2:]}: '{json.dumps(value)}'")
        if nargs == "+" and not items:
            return "fail", f"{opt} takes at least one value in {where}; the list is empty"
        if isinstance(nargs, int) and len(items) != nargs:
            return "fail", f"{opt} takes {nargs} values in {where}, not {len(items)}"
    conv = CONVERTERS.get(hit.get("type") or "")
    if conv is not None and not isinstance(value, dict):
        for item in items:
            try:
                conv(str(item))
            except ValueError:
                return "fail", f"{opt}: invalid {hit['type']} value: {str(item)!r} ({where}'s parser exits 2)"
    return None


def _choice_problem(opt: str, value, hit: dict, where: str) -> tuple[str, str] | None:
    choices = hit.get("choices")
    if not choices or value is None or value is True or value is False:
        return None
    if isinstance(value, dict):
        return None
    if _value_ok(value, choices):
        return None
    shown = ", ".join(str(c) for c in choices[:12]) + (" ..." if len(choices) > 12 else "")
    return "fail", f"{opt} {value}: {where} takes one of {shown}"
