"""Overlay mode, the pure part: the package an inference engine loads on purpose.  STDLIB ONLY.

Two engines, two ways in (the engine names its ``overlay_style``), one package and one rendering:

- SGLang (``external-package``): from 0.5.6 ``srt/models/registry.py`` imports every module of the
  package named by ``SGLANG_EXTERNAL_MODEL_PACKAGE`` and registers each ``EntryClass`` with
  ``overwrite=True``, keyed by the class's ``__name__``.
- vLLM (``general-plugin``): every process (API server, engine core, workers) calls the
  ``register()`` of each ``vllm.general_plugins`` entry point it finds on sys.path (those
  ``VLLM_PLUGINS`` lists, when it is set); ours points each architecture the fixed class serves at
  the subclass with ``ModelRegistry.register_model(arch, "module:Class")`` (imported lazily, as
  vLLM's own entries are). The entry point is a ``provision_overlay-0.1.dist-info`` beside the
  package, which ``importlib.metadata`` finds on PYTHONPATH.

Either way a subclass with the wrapper's own name and the delegation methods replaces the
built-in class, and the installed files are never touched. For vLLM a `replace` spec scoped to one
method of a class (``Class.method``: the EAGLE proposer's ``load_model``) is carried too: its
module holds that method's source as the spec's edit leaves it, read from the installed file, and
register() binds it on the class in place of the installed one (``render_rebind``). The methods
(and an interface spec's attributes) are the patch engine's own rendering
(``core.render_methods``), said once for both. No IO: ops/overlay.py writes, compiles and checks
what is rendered here.
"""

from __future__ import annotations

import ast
import hashlib
import re

from provision.host import inference
from provision.host.engine import core
from provision.host.engine.spec import DEFAULT_PACKAGE, EngineError
from provision.host.lib.modules import module_name

PACKAGE = "provision_overlay"          # the package's name (and SGLANG_EXTERNAL_MODEL_PACKAGE's value)
MARKER = "PROVISION_OVERLAY"           # names the package in a server's environment where the engine
                                       # reads no variable of its own (vLLM): how status knows the fix
ENV_FILE = "overlay.env"               # KEY=VALUE lines, for a unit's EnvironmentFile=
PLUGIN_GROUP = "vllm.general_plugins"  # vLLM's entry-point group
DIST_INFO = f"{PACKAGE}-0.1.dist-info"  # the entry point's home beside the package

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def _engine(engine):
    """An engine object from an engine or its name (always given: each function renders for one)."""
    return inference.get(engine) if isinstance(engine, str) else engine


def version_tuple(version: str | None) -> tuple | None:
    m = _VERSION.match(str(version or "").strip().lstrip("v"))
    if not m:
        return None
    return tuple(int(x or 0) for x in m.groups())


def _reads(e) -> str:
    """What the engine reads the overlay through, in a sentence."""
    return e.overlay_env or f"its general plugins ({PLUGIN_GROUP})"


def refusal_for_version(version: str | None, engine) -> str | None:
    """Why overlay mode cannot work with this release of the engine, or None when it can."""
    e = _engine(engine)
    if not e.overlay_style:
        return f"{e.title} has no overlay mode; use `provision patch` (edit the file) instead"
    need = ".".join(map(str, e.overlay_min_version))
    v = version_tuple(version)
    if v is None:
        return (f"overlay mode needs {e.title} {need} or later ({_reads(e)}), and this install's "
                f"version is unknown ({version!r}); use `provision patch` (edit the file) instead")
    if v < e.overlay_min_version:
        does = (f"does not read {e.overlay_env}" if e.overlay_env
                else "is older than any release provision's overlay was built on")
        return (f"overlay mode needs {e.title} {need} or later: {e.title} {version} {does}; "
                "use `provision patch` (edit the file) instead")
    return None


def module_for(spec_name: str) -> str:
    """The overlay module of a spec: `kimi-k25-eagle3` -> `kimi_k25_eagle3` (one module per spec)."""
    mod = re.sub(r"[^A-Za-z0-9_]", "_", spec_name)
    return mod if mod[:1].isalpha() else "spec_" + mod


def is_overlayable(spec: dict) -> bool:
    """Specs that add members to an engine's class (delegate, interface) become overlays; for an
    engine whose plugins run code (vLLM's general plugins) so does a `replace` within one method of
    a class (``Class.method``). Other kinds change module-level values or other packages' files,
    which neither a subclass nor a rebound method can replace."""
    name = inference.of_package(spec.get("package") or DEFAULT_PACKAGE)
    if name is None:
        return False
    kind = spec.get("kind", "delegate")
    if kind in ("delegate", "interface"):
        return True
    return (kind == "replace" and str(spec.get("scope") or "").count(".") == 1
            and inference.get(name).overlay_style == "general-plugin")


def _rebind_problem(fn) -> str | None:
    """Why a method cannot be compiled outside its class body and bound on it (None when it can):
    a zero-argument super() or __class__ needs the class's cell, a __private name its mangling, and a
    decorator (but staticmethod, classmethod) may have registered the original elsewhere at class
    creation (pydantic's model_validator: a rebound function would never be called)."""
    for d in fn.decorator_list:
        if not (isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod")):
            return (f"its decorator @{ast.unparse(d)} (line {d.lineno}) may have registered the installed function "
                    "where a rebound one is never seen")
    for node in ast.walk(fn):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
                and not node.args):
            return f"it calls super() without arguments (line {node.lineno})"
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name == "__class__":
            return f"it reads __class__ (line {node.lineno})"
        if name and name.startswith("__") and not name.endswith("__"):
            return f"it uses the private name {name} (line {node.lineno}), which its class body would mangle"
    return None


def render_rebind(spec: dict, patched: str, version: str | None, engine) -> str:
    """The overlay module for a `replace` spec scoped to `Class.method`: the method's source as it
    stands in `patched` (the installed file with the spec's edit, engine/replace.py's), and
    `apply()`, which compiles it in the installed module's namespace and binds it on the class.
    Raises EngineError when the method cannot be bound from outside its class."""
    e = _engine(engine)
    s = core.validate_spec(dict(spec))
    cls_name, _, meth = str(s.get("scope") or "").partition(".")
    tree = ast.parse(patched)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
    fn = next((n for n in (cls.body if cls else []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and n.name == meth), None)
    if fn is None:
        raise EngineError("overlay", f"spec {s['name']}: expected a method {meth} in a module-level class {cls_name} "
                                     f"of {s['file']}, found none; `provision patch` edits the file instead")
    why = _rebind_problem(fn)
    if why:
        raise EngineError("overlay", f"spec {s['name']}: {cls_name}.{meth} cannot be bound from an overlay: {why}; "
                                     "`provision patch` edits the file instead")
    lines = patched.splitlines()
    first = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
    indent = lines[fn.lineno - 1][:fn.col_offset]
    body = []
    for line in lines[first - 1:fn.end_lineno]:
        if line.strip() and not line.startswith(indent):
            raise EngineError("overlay", f"spec {s['name']}: {cls_name}.{meth} has a line less indented than its def "
                                         "(a multi-line string?); `provision patch` edits the file instead")
        body.append(line[len(indent):] if line.strip() else "")
    source = "\n".join(body) + "\n"
    for_what = f"{e.title} {version}" if version else f"{e.title} releases"
    return (f"# Generated by provision from spec {s['name']}: {cls_name}.{meth}\n"
            f"# of {s['package']}/{s['file']} as the spec's edit leaves it in {for_what},\n"
            f"# bound on the class in place of the installed method by {PACKAGE}.register().\n"
            "# The installed files are not touched.\n"
            "# Do not edit: `provision reconcile` / `provision patch --overlay` rewrite it.\n"
            "import __future__\n"
            "import importlib\n"
            "\n"
            f"MODULE = {module_name(s['file'], s['package'])!r}\n"
            f"CLASS = {cls_name!r}\n"
            f"METHOD = {meth!r}\n"
            "SOURCE = (  # the method, one line per string\n"
            + "".join(f"    {line!r}\n" for line in source.splitlines(True)) + ")\n"
            "\n\n"
            "def apply():\n"
            "    module = importlib.import_module(MODULE)\n"
            f"    code = compile(SOURCE, '<provision overlay {s['name']}: ' + str(module.__file__) + '>', 'exec',\n"
            "                   flags=__future__.annotations.compiler_flag, dont_inherit=True)\n"
            "    names = {}\n"
            "    exec(code, vars(module), names)\n"
            "    setattr(getattr(module, CLASS), METHOD, names[METHOD])\n")


def render_module(spec: dict, names: list, version: str | None, engine) -> str:
    """The overlay module for one delegate spec (an interface spec expanded on the release first,
    core.expanded): a subclass of the installed class, of the same name, holding the spec's members
    `names` (in the spec's order); for SGLang its EntryClass."""
    e = _engine(engine)
    s = core.validate_spec(dict(spec))
    cls = s["class"]
    methods = core.render_methods(s, "    ", "\n", names=list(names))
    for_what = f"{e.title} {version}" if version else f"{e.title} releases"
    how = (f"loaded by SGLang through\n# {e.overlay_env}={PACKAGE} (0.5.6+)" if e.overlay_style == "external-package"
           else f"registered for vLLM by\n# {PACKAGE}.register() (entry point {PLUGIN_GROUP})")
    text = (f"# Generated by provision from spec {s['name']}: the EAGLE-3 members\n"
            f"# {cls} lacks in {for_what}, {how}. The installed files are not touched.\n"
            f"# Do not edit: `provision reconcile` / `provision patch --overlay` rewrite it.\n"
            f"from {module_name(s['file'], s['package'])} import {cls} as _Builtin\n"
            f"\n\n"
            f"class {cls}(_Builtin):\n"
            f'    """{cls} with the EAGLE-3 members (provision overlay, spec {s["name"]})."""\n'
            f"\n"
            f"{methods}")
    if e.overlay_style == "external-package":
        text += f"\n\nEntryClass = [{cls}]\n"
    return text


def render_init(engine, architectures: dict | None = None, rebinds: list | None = None) -> str:
    """The package's __init__.py: nothing for SGLang (it imports each module); for vLLM the
    register() its entry point names, pointing each architecture at its class ({arch: "module:Class"})
    and applying each rebound method's module (`rebinds`, their names)."""
    e = _engine(engine)
    if e.overlay_style != "general-plugin":
        return ("# The overlay package provision generates; SGLang imports each module beside this file\n"
                f"# ({e.overlay_env}={PACKAGE}). Nothing here: every module is one spec.\n")
    table = "".join(f"    {arch!r}: {target!r},\n" for arch, target in sorted((architectures or {}).items()))
    return ("# The overlay package provision generates: vLLM calls register() in every process, as the\n"
            f"# entry point {PLUGIN_GROUP} of {DIST_INFO} (beside this package) says.\n"
            "# Each architecture is pointed at provision's subclass, imported when vLLM needs it.\n"
            "# Do not edit: `provision reconcile` / `provision patch --overlay` rewrite it.\n"
            "import importlib\n"
            "\n"
            "ARCHITECTURES = {\n" + table + "}\n"
            f"METHODS = {sorted(rebinds or [])!r}  # modules whose apply() binds a method in place\n"
            "\n\n"
            "def register():\n"
            "    from vllm import ModelRegistry\n"
            "\n"
            "    for arch, target in ARCHITECTURES.items():\n"
            "        ModelRegistry.register_model(arch, target)\n"
            "    for name in METHODS:\n"
            "        importlib.import_module(name).apply()\n")


def render_package(modules: dict, engine, architectures: dict | None = None, rebinds: list | None = None) -> dict:
    """{relative path: text} of the whole package, from {module name: module text}; for vLLM also
    its dist-info (the entry point) and register()'s tables from {module name: {arch: class}} and
    the names of the modules that rebind a method."""
    e = _engine(engine)
    table = {arch: f"{PACKAGE}.{mod}:{cls}" for mod, archs in (architectures or {}).items() if mod in modules
             for arch, cls in archs.items()}
    methods = [f"{PACKAGE}.{mod}" for mod in (rebinds or []) if mod in modules]
    out = {f"{PACKAGE}/__init__.py": render_init(e, table, methods)}
    for mod, text in sorted(modules.items()):
        out[f"{PACKAGE}/{mod}.py"] = text
    if e.overlay_style == "general-plugin":
        out[f"{DIST_INFO}/METADATA"] = f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 0.1\n" \
            "Summary: EAGLE-3 members for vLLM's model classes, generated by provision\n"
        out[f"{DIST_INFO}/entry_points.txt"] = f"[{PLUGIN_GROUP}]\n{PACKAGE} = {PACKAGE}:register\n"
        out[f"{DIST_INFO}/top_level.txt"] = f"{PACKAGE}\n"
    return out


def digest(files: dict) -> str:
    """One sha for a rendered package (what reconcile compares)."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + files[rel].encode() + b"\0")
    return h.hexdigest()[:16]


def refusal_for_env(profile_env: dict | None, engine) -> str | None:
    """The profile must not point the engine's variable elsewhere (SGLang's): we never replace it."""
    e = _engine(engine)
    if not e.overlay_env:
        return None
    theirs = (profile_env or {}).get(e.overlay_env)
    if theirs in (None, "", PACKAGE):
        return None
    return (f"the profile sets {e.overlay_env}={theirs}, and overlay mode needs that variable for its own package "
            f"({PACKAGE}); provision will not replace yours: drop it from the profile's env, or edit the file "
            "instead (`provision launch --patch`)")


def loaded_by(engine) -> str:
    """How the engine loads the overlay, in a sentence (status says it)."""
    e = _engine(engine)
    if e.overlay_style == "general-plugin":
        return f"{e.title} loads it as its general plugin {PACKAGE}, entry point {PLUGIN_GROUP}"
    return f"{e.title} loads it with {e.overlay_env}={PACKAGE}"


def marker(engine) -> str:
    """The variable that names our package in a server's environment (SGLang's own, else MARKER)."""
    return _engine(engine).overlay_env or MARKER


def server_env(root: str, current_pythonpath: str | None, engine, plugins: str | None = None) -> dict:
    """The variables that switch the overlay on: the engine's (or provision's marker) naming our
    package, its directory first on PYTHONPATH with the PYTHONPATH the server would have had kept
    after it, and for vLLM with `plugins` (the VLLM_PLUGINS the server would have had, when set) our
    plugin added to that list; unset, vLLM loads every plugin."""
    e = _engine(engine)
    rest = [p for p in str(current_pythonpath or "").split(":") if p and p != root]
    out = {marker(e): PACKAGE, "PYTHONPATH": ":".join([root] + rest)}
    if e.overlay_plugins_env and plugins is not None:
        names = [n for n in str(plugins).split(",") if n]
        out[e.overlay_plugins_env] = ",".join(names + ([] if PACKAGE in names else [PACKAGE]))
    return out


def env_lines(root: str, current_pythonpath: str | None, engine, plugins: str | None = None) -> list:
    """What a user who starts the server themselves puts in its environment (overlay.env, for a
    unit's EnvironmentFile=): the PYTHONPATH the install itself needs (a checkout's) kept after the
    overlay, since a unit's EnvironmentFile= replaces the PYTHONPATH its Environment= set."""
    return [f"{k}={v}" for k, v in server_env(root, current_pythonpath, engine, plugins).items()]


def runs_overlay(env: dict | None, engine) -> bool:
    """Does a server with this environment run our overlay (its marker names the package)?"""
    return (env or {}).get(marker(engine)) == PACKAGE


def fix_in_use(server_env: dict, methods: dict, restart_needed: bool, engine) -> str:
    """Which fix a running server uses (pure): "overlay" (its environment names our package),
    "native" (the release has every method), "edited file" (the file holds provision's methods
    and the server started after they were written), "old code" (the file changed after the server
    started: it runs what the file held then, an upgrade in place or a patch it has not restarted
    onto; status says `restart needed`), else "none"."""
    if runs_overlay(server_env, engine):
        return "overlay"
    if restart_needed:
        return "old code"
    states = set((methods or {}).values())
    if states and states == {"native"}:
        return "native"
    if states and "missing" not in states and not restart_needed:
        return "edited file"
    return "none"
