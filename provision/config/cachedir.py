"""Where the control machine's caches live: ``$XDG_CACHE_HOME/provision/NAME`` (default
``~/.cache/provision/NAME``). Each is a cache: deleting it is always safe."""

from __future__ import annotations

import os


def cache_dir(name: str) -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "provision", name)
