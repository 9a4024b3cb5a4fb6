"""The stand-in's flag parser: the installed release's own ``ServerArgs.add_cli_args``, run.  STDLIB ONLY.

The stand-in must not read flags with provision's reader (host/engine/serverargs.py): a test and the
product that agree by construction prove nothing. Where SGLang really imports (its torch and the
rest installed), the stand-in uses ``ServerArgs.add_cli_args`` itself. On a sandbox host it does
not (no torch), so this module runs the same function's code from the installed
``server_args.py``: every top-level statement is executed with SGLang's and third-party imports
bound to permissive stand-ins, then ``add_cli_args`` is compiled out of the ``ServerArgs`` class and
called on a real ``argparse`` parser. Every ``add_argument`` call, its nargs, action, type and
default is the release's own. A ``type=`` function imported from another SGLang module
(``nullable_str``, ``json_list_type``) is that module's own definition, executed alone; ``choices``
that come from another module (the reasoning and tool-call parsers, LoRA modules) accept anything.

Releases whose ``add_cli_args`` derives its flags from dataclass fields (0.5.14 and later call
``add_cli_args_from_dataclass``) give None here: the stand-in then falls back to the reader it
was given (see standin.py).
"""

from __future__ import annotations

import argparse
import ast
import functools
import sys
from pathlib import Path


class _Any:
    """Stands for an imported name: absorbs calls, attributes, items, `+`, `|`, `in`."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and isinstance(args[0], str):
            return args[0]  # as a type= function: the token unchanged
        return _Any()

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Any()

    def __getitem__(self, key):
        return _Any()

    def __iter__(self):
        return iter(())

    def __contains__(self, item):
        return True

    def __len__(self):
        return 0

    def __bool__(self):
        return False

    def __add__(self, other):
        return _Any()

    __radd__ = __or__ = __ror__ = __add__

    def __mro_entries__(self, bases):
        return (object,)


def _stdlib(module: str | None) -> bool:
    return bool(module) and module.split(".")[0] in sys.stdlib_module_names


def _module_files(package_root: Path, module: str) -> list[Path]:
    """The source files of an SGLang module: itself, or a package's __init__ and its modules."""
    rel = Path(*module.split("."))
    one = package_root / rel.with_suffix(".py")
    if one.is_file():
        return [one]
    pkg = package_root / rel
    if pkg.is_dir():
        init = pkg / "__init__.py"
        return ([init] if init.is_file() else []) + sorted(p for p in pkg.glob("*.py") if p.name != "__init__.py")
    return []


@functools.lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module | None:
    """A module file's syntax tree, parsed once per process (server_args.py imports a dozen names from
    each of a few large modules: parsing them per name was most of a stand-in's start-up)."""
    try:
        return ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, ValueError):
        return None


def _own_function(package_root: Path, module: str, name: str):
    """`name`, a plain function defined in SGLang's `module` (or a module of that package), executed
    alone with its file's standard-library imports; None when there is none."""
    for path in _module_files(package_root, module):
        tree = _tree(path)
        if tree is None:
            continue
        hit = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
        if not hit:
            continue
        ns: dict = {"__name__": module, "__builtins__": __builtins__}
        for node in tree.body:
            if isinstance(node, ast.Import) and all(_stdlib(a.name) for a in node.names):
                _exec(node, ns, str(path))
        hit[0].decorator_list = []
        _exec(hit[0], ns, str(path))
        return ns.get(name)
    return None


def _exec(node: ast.stmt, ns: dict, filename: str) -> bool:
    try:
        exec(compile(ast.fix_missing_locations(ast.Module([node], [])), filename, "exec"), ns)
        return True
    except Exception:  # noqa: BLE001 - a statement that needs what is stubbed is skipped
        return False


def _bind_import(node: ast.Import | ast.ImportFrom, ns: dict, package_root: Path) -> None:
    if isinstance(node, ast.Import):
        for a in node.names:
            if _stdlib(a.name):
                _exec(ast.Import(names=[a]), ns, "<imports>")
            else:
                ns[(a.asname or a.name).split(".")[0]] = _Any()
        return
    module = "" if node.level else (node.module or "")  # a relative import: stubbed
    for a in node.names:
        bound = a.asname or a.name
        if a.name == "*":
            continue
        if module and _stdlib(module):
            _exec(ast.ImportFrom(module=module, names=[a], level=0), ns, "<imports>")
            continue
        own = _own_function(package_root, module, a.name) if module.split(".")[0] == "sglang" else None
        ns[bound] = own if own is not None else _Any()


def _field_defaults(cls: ast.ClassDef, ns: dict, filename: str) -> type:
    """The class's field defaults, each evaluated alone (a default that needs what is stubbed is None)."""
    out: dict = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            try:
                out[node.target.id] = eval(compile(ast.Expression(node.value), filename, "eval"), ns) \
                    if node.value is not None else None
            except Exception:  # noqa: BLE001
                out[node.target.id] = None
    return type(cls.name, (), out)


def own_parser(server_args_py: str | Path) -> argparse.ArgumentParser | None:
    """A parser made by the release's own ``ServerArgs.add_cli_args``, or None where this file's
    flags come from elsewhere (dataclass-derived releases) or it cannot be run."""
    path = Path(server_args_py)
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    package_root = path.parents[2]  # .../site-packages (sglang/srt/server_args.py)
    ns: dict = {"__name__": "sglang.srt.server_args", "__builtins__": __builtins__}
    fn = None
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            _bind_import(node, ns, package_root)
            continue
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            fn = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "add_cli_args"), None)
            if not _exec(node, ns, str(path)):  # add_cli_args reads its defaults off the class
                ns["ServerArgs"] = _field_defaults(node, ns, str(path))
            continue
        _exec(node, ns, str(path))
    if fn is None:
        return None
    if any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "add_cli_args_from_dataclass"
           for n in ast.walk(fn)):
        return None
    fn.decorator_list = []
    if not _exec(fn, ns, str(path)):
        return None
    parser = argparse.ArgumentParser(prog="launch_server.py")
    try:
        ns["add_cli_args"](parser)
    except Exception:  # noqa: BLE001 - a release this cannot run: the caller falls back
        return None
    return parser
