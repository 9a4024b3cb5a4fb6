"""Who the stand-in server lets in: SGLang's own auth rule, read from the installed release.

Releases with ``srt/utils/auth.py`` (0.5.9 and later) decide each request with its pure
``decide_request_auth`` (loaded from that file, nothing else of SGLang imported) at the level the
release's ``srt/entrypoints/http_server.py`` gives the path (``@auth_level(AuthLevel.X)`` under its
route): ``/flush_cache`` is ADMIN_OPTIONAL, so with ``--admin-api-key`` set only that key opens it.
Older releases: ``--api-key`` guards every path but ``/health*`` and ``/metrics``.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Callable

ROUTE_LEVEL = re.compile(r'@app\.(?:api_route|get|post|put)\(\s*"(?P<path>[^"]+)"[^\n]*\n'
                         r'(?:@(?!auth_level)[^\n]*\n)*@auth_level\(AuthLevel\.(?P<level>\w+)\)')


def levels(http_server_text: str) -> dict[str, str]:
    """Each route's auth level as its decorator says (paths without one are NORMAL)."""
    return {m["path"]: m["level"] for m in ROUTE_LEVEL.finditer(http_server_text)}


def rule(sglang_dir: Path, api_key: str | None, admin_api_key: str | None) -> Callable[[str, str, str | None], bool]:
    """allowed(method, path, authorization_header) for this release and these keys."""
    auth_py = Path(sglang_dir) / "srt" / "utils" / "auth.py"
    try:
        spec = importlib.util.spec_from_file_location("_standin_sglang_auth", auth_py)
        mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[spec.name] = mod  # type: ignore[union-attr]  # its dataclass looks its module up
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        decide, level_enum = mod.decide_request_auth, mod.AuthLevel
        route_levels = levels((Path(sglang_dir) / "srt" / "entrypoints" / "http_server.py").read_text())
    except Exception:  # noqa: BLE001 - no readable rule in this release: the legacy one
        def legacy(method: str, path: str, header: str | None) -> bool:
            if not api_key or path.startswith("/health") or path.startswith("/metrics"):
                return True
            return header == f"Bearer {api_key}"
        return legacy

    def allowed(method: str, path: str, header: str | None) -> bool:
        level = getattr(level_enum, route_levels.get(path, "NORMAL"), level_enum.NORMAL)
        return bool(decide(method=method, path=path, authorization_header=header, api_key=api_key,
                           admin_api_key=admin_api_key, auth_level=level).allowed)
    return allowed
