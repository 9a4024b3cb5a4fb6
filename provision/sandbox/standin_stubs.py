"""The model file executed the way SGLang imports it, with every non-stdlib import served by stub
modules: the architecture lookup (``config.json``, ``EntryClass``), ``SGLANG_EXTERNAL_MODEL_PACKAGE``,
and a recorder model that the scheduler children call the EAGLE-3 methods on (:func:`probe_model`).
STDLIB ONLY; installed beside the stand-in.
"""

from __future__ import annotations

import abc
import ast
import importlib.abc
import importlib.machinery
import inspect
import os
import re
import sys
import types
from pathlib import Path

if __package__:  # provision.sandbox in a checkout
    from provision.sandbox.standin_log import forms_version, import_error_line
else:  # flat, beside the stand-in (/opt/provision-standin on a host, or run as a script)
    from standin_log import forms_version, import_error_line

DEFAULT_ARCH = "KimiK25ForConditionalGeneration"
DEFAULT_MODEL_FILE = "kimi_k25.py"


_STDLIB = set(getattr(sys, "stdlib_module_names", ())) | set(sys.builtin_module_names) | {"__future__"}


def _is_decoratee(obj) -> bool:
    return inspect.isfunction(obj) or inspect.isclass(obj) or isinstance(obj, (staticmethod, classmethod, property))


class _StubMeta(abc.ABCMeta):
    """Metaclass of stub classes: attribute access, calls and subscripts all succeed on stubs
    themselves; classes *derived* from a stub (the real model classes) behave normally."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if type.__getattribute__(cls, "__dict__").get("_stub_root"):
            return _stub_class(f"{type.__getattribute__(cls, '_stub_path')}.{name}")
        raise AttributeError(f"type object '{cls.__name__}' has no attribute '{name}'")

    def __call__(cls, *args, **kwargs):
        if type.__getattribute__(cls, "__dict__").get("_stub_root"):
            if len(args) == 1 and not kwargs and _is_decoratee(args[0]):
                return args[0]  # used as a decorator
            inst = object.__new__(cls)
            return inst
        return super().__call__(*args, **kwargs)

    def __getitem__(cls, item):
        return cls

    def __setitem__(cls, key, value):
        pass

    def __iter__(cls):
        return iter(())

    def __or__(cls, other):
        if other is None or isinstance(other, type):
            return type.__or__(cls, other)
        return cls

    def __ror__(cls, other):
        if other is None or isinstance(other, type):
            return type.__ror__(cls, other)
        return cls

    def register(cls, *args, **kwargs):
        # ABCMeta.register would shadow stub attributes such as AutoConfig.register(...)
        if type.__getattribute__(cls, "__dict__").get("_stub_root"):
            return _StubMeta.__call__(_stub_class(f"{type.__getattribute__(cls, '_stub_path')}.register"), *args, **kwargs)
        return super().register(*args, **kwargs)

    def __repr__(cls):
        d = type.__getattribute__(cls, "__dict__")
        if d.get("_stub_root"):
            return f"<stub {d.get('_stub_path')}>"
        return super().__repr__()


class _StubBase(metaclass=_StubMeta):
    _stub_root = False
    _stub_path = "stub"

    def __init__(self, *args, **kwargs):
        pass

    def __init_subclass__(cls, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if type(self).__dict__.get("_stub_root"):
            return _stub_class(f"{type(self)._stub_path}().{name}")
        # what torch.nn.Module.__getattr__ raises
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and _is_decoratee(args[0]):
            return args[0]
        return _stub_class(f"{type(self)._stub_path}()")()

    def __getitem__(self, item):
        return self

    def __setitem__(self, key, value):
        pass

    def __iter__(self):
        return iter(())

    def __contains__(self, item):
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __bool__(self):
        return True

    def __int__(self):
        return 0

    def __index__(self):
        return 0

    def __float__(self):
        return 0.0

    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        return self is other

    def __lt__(self, other):
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def _self(self, *a, **k):
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _self
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _self
    __pow__ = __rpow__ = __matmul__ = __rmatmul__ = __neg__ = __pos__ = __invert__ = _self
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = __lshift__ = __rshift__ = _self


_STUB_CLASSES: dict[str, type] = {}


def _stub_class(path: str) -> type:
    cls = _STUB_CLASSES.get(path)
    if cls is None:
        name = path.rsplit(".", 1)[-1].replace("()", "") or "stub"
        if not name.isidentifier():
            name = "stub"
        cls = _StubMeta(name, (_StubBase,), {"_stub_root": True, "_stub_path": path, "__module__": path.rsplit(".", 1)[0]})
        _STUB_CLASSES[path] = cls
    return cls


_STAR_EXPORTS: dict[str, list[str]] = {}  # stub module -> names a star-import of it must provide


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            if name == "__version__":
                return "99.0.0"
            if name == "__all__" and self.__name__ in _STAR_EXPORTS:
                return _STAR_EXPORTS[self.__name__]
            raise AttributeError(name)
        return _stub_class(f"{self.__name__}.{name}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves a stub module for every non-stdlib import (torch, transformers, sglang.*, ...)."""

    def __init__(self, passthrough: set[str]):
        self.passthrough = passthrough
        self.created: list[str] = []

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top in _STDLIB or top in self.passthrough:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        mod = _StubModule(spec.name)
        self.created.append(spec.name)
        return mod

    def exec_module(self, module):
        module.__path__ = []


class _StubImports:
    """Context manager: stub finder installed first on sys.meta_path; everything it (or the
    executed modules) added to sys.modules is removed on exit."""

    def __init__(self, passthrough=()):
        self.finder = _StubFinder(set(passthrough))

    def __enter__(self):
        self.before = set(sys.modules)
        self.dont_write = sys.dont_write_bytecode
        sys.dont_write_bytecode = True
        sys.meta_path.insert(0, self.finder)
        return self

    def __exit__(self, *exc):
        try:
            sys.meta_path.remove(self.finder)
        except ValueError:
            pass
        sys.dont_write_bytecode = self.dont_write
        for name in set(sys.modules) - self.before:
            if name.partition(".")[0] not in _STDLIB:  # stubs, executed model modules, external package
                sys.modules.pop(name, None)
        return False


def exec_model_file(path: str | os.PathLike, modname: str) -> types.ModuleType:
    """compile() + exec the file in a fresh module namespace (stub imports must be active).

    Raises whatever the import would raise (SyntaxError, IndentationError, NameError, ...)."""
    path = str(path)
    with open(path, "rb") as fh:
        source = fh.read()
    code = compile(source, path, "exec", dont_inherit=True)
    _prepare_star_imports(source, modname)
    mod = types.ModuleType(modname)
    mod.__file__ = path
    mod.__package__ = modname.rpartition(".")[0]
    mod.__spec__ = importlib.machinery.ModuleSpec(modname, None, origin=path)
    mod.__spec__.has_location = True
    mod.__builtins__ = __builtins__
    sys.modules[modname] = mod
    try:
        exec(code, mod.__dict__)
    except BaseException:
        sys.modules.pop(modname, None)
        raise
    return mod


def _prepare_star_imports(source: bytes, modname: str) -> None:
    """``from <stubbed> import *`` cannot know the names; give it the names this file uses
    but never binds (so only files with such a star-import get that leniency)."""
    if b"import *" not in source and b"import  *" not in source:
        return
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    package = modname.rpartition(".")[0]
    star = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1] if node.level > 1 else base
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.partition(".")[0] not in _STDLIB:
                star.append(target)
    if not star:
        return
    bound, loaded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                bound.add((a.asname or a.name).partition(".")[0])
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    import builtins

    names = sorted(n for n in loaded - bound if not hasattr(builtins, n))
    for target in star:
        _STAR_EXPORTS[target] = names


def _entry_classes(mod) -> list:
    entry = getattr(mod, "EntryClass", None)
    if entry is None:
        return []
    return list(entry) if isinstance(entry, (list, tuple)) else [entry]


class _Layer:
    """A loaded layer as the EAGLE-3 methods read it (``embed_tokens.weight``, ``lm_head.weight``)."""

    weight = "weight"


class _Recorder:
    """Stands in for the inner language model; has the three EAGLE-3 methods."""

    embed_tokens = _Layer()

    def __init__(self):
        self.calls: list[str] = []

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.calls.append("set_eagle3_layers_to_capture")

    def get_embed_and_head(self):
        self.calls.append("get_embed_and_head")
        return ("embed", "head")

    def set_embed_and_head(self, embed, head):
        self.calls.append("set_embed_and_head")


class ModelProbe:
    """Outcome of 'importing' the model module the way SGLang's registry does."""

    def __init__(self):
        self.arch = DEFAULT_ARCH
        self.module_name = ""
        self.file = ""
        self.cls = None
        self.import_error: BaseException | None = None
        self.duplicated: str | None = None
        self.fatal: tuple[str, str] | None = None  # (exc type name, message) for a start-up traceback
        self.warnings: list[str] = []
        self.supported: list[str] = []

    def make_instance(self):
        """An instance without running __init__, whose inner model is a recorder.
        Returns (instance, None) or (None, class) when construction is impossible."""
        cls = self.cls
        try:
            inst = object.__new__(cls)
        except Exception:
            return None
        for attr, make in (("language_model", _Recorder), ("model", _Recorder), ("llm", _Recorder),
                           ("lm_head", _Layer)):
            desc = inspect.getattr_static(cls, attr, None)
            if desc is not None and hasattr(desc, "__set__"):
                continue
            try:
                object.__setattr__(inst, attr, make())
            except Exception:
                pass
        return inst


def _find_model_file(models_dir: Path, arch: str) -> Path | None:
    pat = re.compile(rf"^class\s+{re.escape(arch)}\b", re.M)
    preferred = models_dir / DEFAULT_MODEL_FILE
    if arch == DEFAULT_ARCH and preferred.exists():
        return preferred
    for p in sorted(models_dir.glob("*.py")):
        try:
            if pat.search(p.read_text(encoding="utf-8", errors="replace")):
                return p
        except OSError:
            continue
    return None


_ENTRY_RE = re.compile(r"^EntryClass\s*=\s*(\[[^\]]*\]|\([^)]*\)|[^\n]+)", re.M)


def _supported_sample(models_dir: Path, limit: int = 12) -> list[str]:
    names: list[str] = []
    for p in sorted(models_dir.glob("*.py")):
        try:
            text = p.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        m = _ENTRY_RE.search(text)
        if m:
            names.extend(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", m.group(1)))
        if len(names) >= limit:
            break
    return names[:limit]


def probe_model(sglang_dir: Path, arch: str | None) -> ModelProbe:
    """Import the model module(s) the way SGLang's registry does, with stubbed dependencies.

    The candidates are the file defining the architecture (``kimi_k25.py`` for Kimi-K2.5) and any
    other ``models/*.py`` whose text defines or registers the same class name (a backup copy left
    behind, say); they are executed in pkgutil (file name) order.  A module that fails to import is
    skipped with SGLang's warning; two modules registering the same class name are SGLang's
    ``Duplicated model implementation`` assertion; ``SGLANG_EXTERNAL_MODEL_PACKAGE`` overrides."""
    probe = ModelProbe()
    models_dir = sglang_dir / "srt" / "models"
    probe.arch = os.environ.get("PROVISION_STANDIN_MODEL_CLASS") or arch or DEFAULT_ARCH
    override = os.environ.get("PROVISION_STANDIN_MODEL_FILE")
    if override:
        path = Path(override)
        if not path.is_absolute():
            path = models_dir / path
    else:
        path = _find_model_file(models_dir, probe.arch)
    probe.supported = _supported_sample(models_dir)
    candidates: list[Path] = [path] if (path is not None and path.exists()) else []
    if not override:
        cls_re = re.compile(rf"^class\s+{re.escape(probe.arch)}\b", re.M)
        for p in sorted(models_dir.glob("*.py")):
            if path is not None and p.resolve() == path.resolve():
                continue
            try:
                text = p.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            m = _ENTRY_RE.search(text)
            if cls_re.search(text) or (m and probe.arch in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", m.group(1))):
                candidates.append(p)
    candidates.sort(key=lambda p: p.name)
    if path is not None:
        probe.file = str(path)
        probe.module_name = f"sglang.srt.models.{path.stem}"
    # Only a release whose registry reads the variable honours it (0.5.6+; 0.5.5.post3 does not).
    ext_pkg = os.environ.get("SGLANG_EXTERNAL_MODEL_PACKAGE", "").strip() if reads_external_package(sglang_dir) else ""
    passthrough = {ext_pkg.partition(".")[0]} if ext_pkg else set()

    with _StubImports(passthrough):
        registry: dict[str, object] = {}
        origin: dict[str, Path] = {}
        for p in candidates:
            modname = f"sglang.srt.models.{p.stem}"
            try:
                mod = exec_model_file(p, modname)
            except Exception as e:  # noqa: BLE001 - any import failure is what SGLang ignores
                if path is not None and p == path:
                    probe.import_error = e
                probe.warnings.append(import_error_line(forms_version(sglang_dir), modname, e))
                continue
            for c in _entry_classes(mod):
                name = getattr(c, "__name__", None)
                if not name:
                    continue
                if name in registry:
                    probe.duplicated = name
                    probe.fatal = ("AssertionError", f"Duplicated model implementation for {name}")
                    return probe
                registry[name] = c
                origin[name] = p
        if ext_pkg:
            _load_external(ext_pkg, registry, probe, forms_version(sglang_dir))
            if probe.fatal is not None:
                return probe
        cls = registry.get(probe.arch)
        if isinstance(cls, type):
            probe.cls = cls
            if probe.arch in origin:
                probe.file = str(origin[probe.arch])
                probe.module_name = f"sglang.srt.models.{origin[probe.arch].stem}"
    return probe


def reads_external_package(sglang_dir: Path) -> bool:
    """Whether the installed ``srt/models/registry.py`` reads ``SGLANG_EXTERNAL_MODEL_PACKAGE``."""
    try:
        return "SGLANG_EXTERNAL_MODEL_PACKAGE" in (Path(sglang_dir) / "srt" / "models" / "registry.py").read_text(
            encoding="utf-8", errors="replace")
    except OSError:
        return False


def _load_external(pkg: str, registry: dict, probe: ModelProbe, version: tuple = (0, 5, 9)) -> None:
    """``ModelRegistry.register(SGLANG_EXTERNAL_MODEL_PACKAGE, overwrite=True)``."""
    import importlib
    import pkgutil

    try:
        package = importlib.import_module(pkg)
    except Exception as e:  # noqa: BLE001 - SGLang does not catch this one
        probe.fatal = (type(e).__name__, str(e))
        return
    path = getattr(package, "__path__", None)
    if path is None:
        probe.fatal = ("AttributeError", f"module '{pkg}' has no attribute '__path__'")
        return
    for _, name, ispkg in pkgutil.iter_modules(path, pkg + "."):
        if ispkg:
            continue
        try:
            module = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001
            probe.warnings.append(import_error_line(version, name, e))
            continue
        for c in _entry_classes(module):
            cname = getattr(c, "__name__", None)
            if cname:
                registry[cname] = c  # overwrite=True
