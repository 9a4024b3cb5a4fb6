"""The one check every YAML section goes through: no keys beyond the allowed ones.  Pure."""

from __future__ import annotations

from provision.errors import ConfigError


def check_keys(data: dict, allowed, where: str, kind: str = "key(s)") -> None:
    """ConfigError naming the unknown keys of `data` and the allowed ones; `where` is the
    place as the user reads it (``FILE: patch``)."""
    unknown = set(data) - set(allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown {kind} {', '.join(sorted(map(str, unknown)))}; "
                          f"allowed: {', '.join(sorted(allowed))}")
