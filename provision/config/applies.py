"""Does a patch spec apply to a host? A spec's `applies:` against the host's facts.  Pure.

    applies:
      sglang: ">=0.5.6,<0.5.14"    # packaging specifier sets, keyed by package name
      flashinfer: "<0.7"
      gpu_capability: ["12.0"]     # compute capabilities (nvidia-smi --query-gpu=compute_cap)

Decided on the control machine (the host is stdlib-only) with `packaging`'s specifiers,
never a hand-written version comparison. Every condition must hold. A GPU condition holds
when any GPU of the host has one of the listed capabilities. A capability the host cannot
report ("unknown": no nvidia-smi) makes the spec not applicable, with that reason, unless
`--gpu-capability` or the inventory's `gpu_capability` says what the host has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from provision.errors import ConfigError

GPU_KEY = "gpu_capability"
_CAP = re.compile(r"^\d{1,2}\.\d{1,2}$")
_PKG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def normalise_capability(value: Any, where: str) -> str:
    """"12.0" (or the YAML number 12.0, or 12) as "MAJOR.MINOR"; ConfigError otherwise."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a compute capability like \"12.0\", got {value!r}")
    if isinstance(value, int):
        value = f"{value}.0"
    text = str(value).strip()
    if not _CAP.match(text):
        raise ConfigError(f"{where}: expected a compute capability like \"12.0\" (MAJOR.MINOR), got {value!r}")
    major, minor = text.split(".")
    return f"{int(major)}.{int(minor)}"


def parse_applies(data: Any, where: str) -> dict | None:
    """Validate `applies:`: {package: specifier string, gpu_capability: [capability, ...]}.
    Returns the normalised mapping (None when absent). ConfigError names `where` and the key."""
    if data is None:
        return None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{where}: expected a mapping of package name to a version specifier "
                          f"(sglang: \">=0.5.6\") and/or gpu_capability: [\"12.0\"]")
    out: dict = {}
    for key, value in data.items():
        k = str(key)
        if k == GPU_KEY:
            items = value if isinstance(value, list) else [value]
            if not items:
                raise ConfigError(f"{where}.{GPU_KEY}: expected at least one compute capability like \"12.0\"")
            out[GPU_KEY] = [normalise_capability(v, f"{where}.{GPU_KEY}") for v in items]
            continue
        if not _PKG.match(k):
            raise ConfigError(f"{where}: {k!r} is not a package name (nor {GPU_KEY})")
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where}.{k}: expected a version specifier string like \">=0.5.6,<0.7\", "
                              f"got {value!r}")
        from packaging.specifiers import InvalidSpecifier, SpecifierSet  # only a spec with `applies:` pays it

        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            raise ConfigError(f"{where}.{k}: {value!r} is not a version specifier (PEP 440, e.g. "
                              f"\">=0.5.6,<0.7\")") from None
        out[k] = value.strip()
    return out


def packages_named(applies: dict | None) -> list[str]:
    """The packages whose versions `applies` needs (not sglang: discovery reports that)."""
    return [k for k in (applies or {}) if k not in (GPU_KEY, "sglang")]


@dataclass(frozen=True)
class HostView:
    """What applicability is decided from, for one host.

    sglang: the chosen install's version (None: not known). packages: name -> version, or None
    when the host found no such package beside that SGLang. gpu: the capabilities of the host's
    GPUs; empty with `gpu_unknown` the reason when it cannot be told."""
    sglang: str | None = None
    packages: dict | None = None
    gpu: tuple = ()
    gpu_unknown: str | None = None
    gpu_source: str = "nvidia-smi"
    beside: str = "SGLang"  # the install whose neighbours `packages` are (the title of its engine)


def needs_host(applies: dict | None, gpu_given: bool) -> bool:
    """Must the host be asked before this spec can be decided? (Only a GPU condition with a
    capability given by --gpu-capability / the inventory can be decided without it.)"""
    if not applies:
        return False
    return any(k != GPU_KEY for k in applies) or not gpu_given


def _version_ok(name: str, spec: str, version: str | None, label: str, beside: str = "SGLang") -> str | None:
    """None when `version` satisfies `spec`; else why not (one phrase)."""
    if version is None:
        return f"{label} is not installed beside this {beside} (the spec needs {name} {spec})"
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(str(version))
    except InvalidVersion:
        return f"{label} reports version {version!r}, which is not a PEP 440 version to compare with {spec}"
    if SpecifierSet(spec).contains(v, prereleases=True):
        return None
    return f"{label} {version} is outside {spec}"


def decide(applies: dict | None, view: HostView) -> tuple[bool, str]:
    """(applies?, why). Every condition must hold; the reason names the first that does not
    (or, when all hold, what was checked). Pure."""
    if not applies:
        return True, "no applies: conditions"
    held: list[str] = []
    for key, want in applies.items():
        if key == GPU_KEY:
            if not view.gpu:
                why = view.gpu_unknown or "unknown"
                return False, (f"GPU compute capability unknown ({why}); the spec needs {', '.join(want)}: "
                               "pass --gpu-capability or set the host's gpu_capability if the host has it")
            hit = [c for c in view.gpu if c in want]
            if not hit:
                return False, (f"GPU compute capability {', '.join(view.gpu)} ({view.gpu_source}) is not "
                               f"{' or '.join(want)}")
            held.append(f"GPU {hit[0]} ({view.gpu_source})")
            continue
        if key == "sglang":
            why = _version_ok(key, want, view.sglang, "SGLang", view.beside)
            version = view.sglang
        else:
            pkgs = view.packages or {}
            if key not in pkgs:
                return False, f"the host did not report {key}'s version (the spec needs {key} {want})"
            version = pkgs[key]
            why = _version_ok(key, want, version, key, view.beside)
        if why:
            return False, why
        held.append(f"{'SGLang' if key == 'sglang' else key} {version} {want}")
    return True, "applies: " + ", ".join(held)
