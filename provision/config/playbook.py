"""Playbooks: YAML files holding a patch spec (`patch:`) and a launch profile (`launch:`).

Pure: text in, validated data out. Every error names the file and the field.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import keyword
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:  # the engine's spec as the protocol types it (provision/host/protocol.py)
    from provision.host.protocol import Spec

from provision.config.bounded import load_yaml
from provision.config.keys import check_keys
from provision.host import inference
from provision.errors import ConfigError

from importlib.resources import files


def _shipped_playbooks() -> Path:
    """Where the shipped playbooks are: installed, package data inside the package
    (provision/playbooks/, mapped from the top-level playbooks/ by setup.py), found by
    importlib.resources in a `pip install .`, `pip install --user`, pipx or `uv tool install`
    layout (data files would land under a prefix nothing can predict); from a checkout or an
    editable install, the checkout's top-level playbooks/."""
    installed = Path(str(files("provision") / "playbooks"))
    if installed.is_dir():
        return installed
    return Path(__file__).resolve().parents[2] / "playbooks"


PACKAGE_PLAYBOOKS = _shipped_playbooks()
DEFAULT_PLAYBOOK = "kimi-k25-eagle3.yaml"
# The default playbook's counterpart for a host whose only engine is another (status with no
# --playbook on a vLLM host judges vLLM's Kimi-K2.5 wrapper: issue 63).
ENGINE_DEFAULT_PLAYBOOKS = {"vllm": "kimi-k25-eagle3-vllm.yaml"}

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_TOP_KEYS = {"name", "description", "engine", "patch", "launch"}
_COMMON_PATCH_KEYS = {"kind", "package", "file", "applies"}
# the keys each spec kind may carry (engine/spec.py KIND_KEYS says the same for the host)
_KIND_PATCH_KEYS = {
    "delegate": {"class", "delegate", "methods"},
    "mapping-entry": {"mapping", "key", "value", "copy_of"},
    "replace": {"scope", "find", "replace", "native_if"},
    "interface": {"class", "delegate", "protocol"},
    "list-entry": {"scope", "list", "value"},
}
_METHOD_KEYS = {"name", "params"}


@dataclass(frozen=True)
class MethodSpec:
    name: str
    params: str


# The package a spec's `file:` is relative to unless it names another: the default inference
# engine's (SGLang's), said once for the control side.
DEFAULT_PACKAGE = "sglang"


@dataclass(frozen=True)
class PatchSpec:
    """One spec. `kind` is delegate (cls, delegate, methods), mapping-entry or replace (their
    fields in `edit`, as the playbook says them); `package` is the installed package `file` is
    relative to; `applies` (package name -> specifier text, "gpu_capability" -> ["12.0", ...])
    is evaluated on the control side, never by the host."""
    name: str
    file: str
    cls: str
    delegate: str
    methods: tuple[MethodSpec, ...]
    source: str = ""
    kind: str = "delegate"
    package: str = DEFAULT_PACKAGE
    applies: dict | None = field(default=None, hash=False)
    edit: dict = field(default_factory=dict, hash=False)

    def to_engine(self) -> Spec:
        """The plain dict the remote engine consumes (a delegate spec in sglang without
        `applies` is exactly today's dict, so its sha and journal entries stay the same)."""
        out: dict[str, Any] = {"name": self.name, "file": self.file}
        if self.kind == "delegate":
            out.update({"class": self.cls, "delegate": self.delegate,
                        "methods": [{"name": m.name, "params": m.params} for m in self.methods]})
        else:
            out["kind"] = self.kind
            out.update(self.edit)
        if self.package != DEFAULT_PACKAGE:
            out["package"] = self.package
        if self.applies is not None:
            out["applies"] = self.applies
        return out  # type: ignore[return-value]

    @property
    def sha(self) -> str:
        text = json.dumps(self.to_engine(), sort_keys=True).encode()
        return hashlib.sha256(text).hexdigest()[:12]


@dataclass(frozen=True)
class Playbook:
    name: str
    description: str
    patch: PatchSpec | None
    launch: dict | None = None
    path: str = ""
    raw: dict = field(default_factory=dict)


def _where(path: str, key: str) -> str:
    return f"{path}: {key}"


def _check_params(path: str, where: str, params: str) -> None:
    try:
        tree = ast.parse(f"def _({params}):\n    pass\n")
    except SyntaxError as exc:
        raise ConfigError(f"{_where(path, where)}: not a valid parameter list ({exc.msg}): {params!r}") from None
    args = tree.body[0].args  # type: ignore[attr-defined]
    positional = args.posonlyargs + args.args
    if not positional or positional[0].arg != "self":
        raise ConfigError(f"{_where(path, where)}: the first parameter must be `self`, got {params!r}")


def _engine_check(spec: PatchSpec, path: str) -> None:
    """The host-side engine's own validation, run here too: a spec the host would reject is
    rejected at load (exit 2), once, not once per host."""
    from provision.host.engine.spec import EngineError, validate_spec

    try:
        validate_spec(spec.to_engine())
    except EngineError as exc:
        raise ConfigError(f"{path}: patch: {exc.message}") from None


def parse_patch(data: Any, path: str, name: str, engine: str | None = None) -> PatchSpec:
    if not isinstance(data, dict):
        raise ConfigError(f"{_where(path, 'patch')}: expected a mapping with file, class, delegate, methods "
                          "(or kind: mapping-entry | replace | interface | list-entry and their fields)")
    kind = data.get("kind") or "delegate"
    if kind not in _KIND_PATCH_KEYS:
        raise ConfigError(f"{_where(path, 'patch.kind')}: expected one of {', '.join(_KIND_PATCH_KEYS)}, got {kind!r}")
    check_keys(data, _COMMON_PATCH_KEYS | _KIND_PATCH_KEYS[kind], _where(path, "patch"))
    # checked with the rest by the engine's validate_spec; the playbook's engine names the default
    package = data.get("package") or (inference.PACKAGES[engine] if engine else DEFAULT_PACKAGE)
    applies = data.get("applies")
    if applies is not None:
        from provision.host.engine.spec import EngineError, validate_applies

        from provision.config.applies import parse_applies

        try:
            applies = validate_applies(applies)
        except EngineError as exc:
            raise ConfigError(f"{path}: patch: {exc.message}") from None
        applies = parse_applies(applies, f"{path}: patch.applies")  # the specifiers as `packaging` reads them
    if kind != "delegate":
        file = data.get("file")
        if not isinstance(file, str):
            raise ConfigError(f"{_where(path, 'patch.file')}: missing (required): a .py path relative to the "
                              f"{package} package")
        edit = {k: data[k] for k in sorted(_KIND_PATCH_KEYS[kind]) if data.get(k) is not None}
        spec = PatchSpec(name=name, file=file, cls=str(edit.get("class") or ""), delegate=str(edit.get("delegate") or ""),
                         methods=(), source=path, kind=kind, package=package, applies=applies, edit=edit)
        _engine_check(spec, path)
        return spec
    for key in ("file", "class", "delegate", "methods"):
        if key not in data:
            raise ConfigError(f"{_where(path, 'patch.' + key)}: missing (required)")
    file = data["file"]
    if not isinstance(file, str) or not file.endswith(".py") or file.startswith("/") or ".." in file.split("/"):
        raise ConfigError(f"{_where(path, 'patch.file')}: expected a .py path relative to the {package} package "
                          f"(e.g. srt/models/kimi_k25.py), got {file!r}")
    for key in ("class", "delegate"):
        val = data[key]
        if not isinstance(val, str) or not _IDENT.match(val) or keyword.iskeyword(val):
            raise ConfigError(f"{_where(path, 'patch.' + key)}: expected a Python identifier, got {val!r}")
    methods = data["methods"]
    if not isinstance(methods, list) or not methods:
        raise ConfigError(f"{_where(path, 'patch.methods')}: expected a non-empty list of {{name, params}}")
    seen: set[str] = set()
    out: list[MethodSpec] = []
    for i, m in enumerate(methods):
        where = f"patch.methods[{i}]"
        if not isinstance(m, dict):
            raise ConfigError(f"{_where(path, where)}: expected a mapping with name and params")
        unknown = set(m) - _METHOD_KEYS
        if unknown:
            raise ConfigError(f"{_where(path, where)}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
        mname = m.get("name")
        if not isinstance(mname, str) or not _IDENT.match(mname) or keyword.iskeyword(mname):
            raise ConfigError(f"{_where(path, where + '.name')}: expected a method name, got {mname!r}")
        if mname.startswith("__"):
            raise ConfigError(f"{_where(path, where + '.name')}: dunder methods cannot be delegated: {mname}")
        if mname in seen:
            raise ConfigError(f"{_where(path, where + '.name')}: {mname} is listed twice")
        seen.add(mname)
        params = m.get("params", "self")
        if not isinstance(params, str):
            raise ConfigError(f"{_where(path, where + '.params')}: expected a string like 'self, layer_ids=None'")
        _check_params(path, where + ".params", params)
        out.append(MethodSpec(mname, params.strip()))
    spec = PatchSpec(name=name, file=file, cls=data["class"], delegate=data["delegate"],
                     methods=tuple(out), source=path, package=package, applies=applies)
    _engine_check(spec, path)
    return spec


def parse_playbook(text: str, path: str = "<playbook>") -> Playbook:
    try:
        data = load_yaml(text, path)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{loc} not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with name, patch and/or launch")
    check_keys(data, _TOP_KEYS, path, "top-level key(s)")
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{_where(path, 'name')}: expected a lower-case name like kimi-k25-eagle3, got {name!r}")
    desc = data.get("description") or ""
    if not isinstance(desc, str):
        raise ConfigError(f"{_where(path, 'description')}: expected text")
    engine = data.get("engine")  # both halves: the patch's package and the launch's engine
    if engine is not None and inference.refusal(engine):
        raise ConfigError(f"{_where(path, 'engine')}: {inference.refusal(engine)}")
    patch = parse_patch(data["patch"], path, name, engine) if data.get("patch") is not None else None
    launch = data.get("launch")
    if launch is not None and not isinstance(launch, dict):
        raise ConfigError(f"{_where(path, 'launch')}: expected a mapping (module, args, env, ...)")
    if engine is not None and launch is not None:
        if launch.get("engine", engine) != engine:
            raise ConfigError(f"{_where(path, 'launch.engine')}: {launch['engine']!r} disagrees with the playbook's "
                              f"engine: {engine!r} (say it once, at the top)")
        launch = dict(launch, engine=engine)
    if patch is None and launch is None:
        raise ConfigError(f"{path}: has neither `patch:` nor `launch:`")
    return Playbook(name=name, description=desc, patch=patch, launch=launch, path=path, raw=data)


def resolve_path(spec: str | None) -> Path:
    """A playbook path as given, or the name of a shipped playbook (playbooks/)."""
    if not spec:
        return PACKAGE_PLAYBOOKS / DEFAULT_PLAYBOOK
    p = Path(spec)
    if p.exists():
        return p
    for cand in (PACKAGE_PLAYBOOKS / spec, PACKAGE_PLAYBOOKS / f"{spec}.yaml"):
        if cand.exists():
            return cand
    raise ConfigError(f"{spec}: no such playbook file (shipped ones: "
                      f"{', '.join(sorted(x.name for x in PACKAGE_PLAYBOOKS.glob('*.yaml')))})")


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read ({exc})") from None


def load_playbook(spec: str | None) -> Playbook:
    path = resolve_path(spec)
    return parse_playbook(_read_text(path), str(path))


def load_patch_spec(spec: str | None) -> PatchSpec:
    """The playbook's patch spec. A run asks for the same one several times (the default playbook
    checked before any host, each host's `specs:`, under one name or another): the file is read
    every time and parsed once per content (PatchSpec is frozen)."""
    path = resolve_path(spec)
    return _patch_of(_read_text(path), str(path))


@functools.lru_cache(maxsize=64)
def _patch_of(text: str, path: str) -> PatchSpec:
    pb = parse_playbook(text, path)
    if pb.patch is None:
        raise ConfigError(f"{pb.path}: has no `patch:` section, so it cannot be used with --playbook")
    return pb.patch


# the kinds preflight names as the fix of an EAGLE-3 gap: a class's delegation (SGLang) or interface
# (vLLM), and a list entry (vLLM 0.16-0.17's model-type allow-list)
COVERING_KINDS = ("delegate", "interface", "list-entry")


def shipped_patch_specs(kinds: tuple = ("delegate",)) -> list[PatchSpec]:
    """The shipped playbooks' specs of `kinds` (unreadable ones are skipped): the candidates preflight
    looks through for the spec that covers a target class (COVERING_KINDS), SGLang's delegations by default."""
    out = []
    for path in sorted(PACKAGE_PLAYBOOKS.glob("*.yaml")):
        try:
            pb = load_playbook(str(path))
        except ConfigError:
            continue
        if pb.patch is not None and pb.patch.kind in kinds:
            out.append(pb.patch)
    return out


def shipped_patch_classes() -> set[str]:
    """The classes the shipped playbooks' patch specs cover (unreadable ones are skipped)."""
    return {spec.cls for spec in shipped_patch_specs()}


_QUOTED_NAME = re.compile(r"""["']([A-Za-z_]\w*)["']""")


def shipped_fixes(package: str = DEFAULT_PACKAGE) -> dict[str, list[tuple[str, str]]]:
    """{class name: [(spec name, kind), ...]} for the shipped specs of files in `package`: the class
    of a delegation or interface spec, and each class name a replace spec adds (a quoted name in its
    `replace` that its `find` lacks: vLLM's proposer lists classes so). What a crash hint names."""
    out: dict[str, list[tuple[str, str]]] = {}
    for spec in shipped_patch_specs(COVERING_KINDS + ("replace",)):
        if spec.package != package:
            continue
        if spec.kind == "replace":
            added = set(_QUOTED_NAME.findall(str(spec.edit.get("replace")))) - set(_QUOTED_NAME.findall(str(spec.edit.get("find"))))
        else:
            added = {spec.cls} if spec.cls else set()
        for cls in sorted(added):
            out.setdefault(cls, []).append((spec.name, spec.kind))
    return out
