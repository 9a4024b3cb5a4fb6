"""User data read within bounds: YAML and JSON no deeper than provision walks (pure).

YAML's and JSON's loaders accept documents nested thousands of levels deep, and both they and
provision's validators walk them recursively: such a document was a RecursionError, a traceback.
Every loader of user data (playbooks, profiles, inventories, --arg values, JSON-valued flags, the
journal's lines) reads through here: the text's nesting is measured before any recursive walk,
and a document deeper than MAX_DEPTH is a sentence naming the file (a ConfigError, exit 2).
"""

from __future__ import annotations

import json
from typing import Any, Callable

from provision.errors import ConfigError

# Far more than any playbook, inventory or engine config nests (a speculative config is 2-3 deep),
# far less than Python's recursion limit.
MAX_DEPTH = 64


def too_deep(where: str, limit: int = MAX_DEPTH) -> ConfigError:
    return ConfigError(f"{where}: nested deeper than {limit} levels (provision reads at most {limit}): "
                       "flatten it, or check that it was generated right")


def text_depth(text: str) -> int:
    """The deepest nesting of [ and { in `text`, outside quoted strings (JSON's, and YAML's flow
    style), in one pass with no recursion."""
    depth = best = 0
    quote = ""
    escaped = False
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote == '"':
                escaped = True
            elif ch == quote:
                quote = ""
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
            if depth > best:
                best = depth
        elif ch in "]}":
            depth = max(0, depth - 1)
        elif ch == "\n":  # a YAML plain scalar may hold an apostrophe: a quote never spans lines here
            quote = ""
    return best


def data_depth(obj: Any, limit: int = MAX_DEPTH) -> int:
    """How deep `obj` nests (lists and mappings), counted without recursion and no further than
    limit + 1."""
    best = 0
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        item, d = stack.pop()
        if isinstance(item, dict):
            children: Any = list(item.values()) + list(item.keys())
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        d += 1
        best = max(best, d)
        if best > limit:
            return best
        stack.extend((c, d) for c in children)
    return best


def check_depth(obj: Any, where: str, limit: int = MAX_DEPTH) -> Any:
    """`obj`, or ConfigError when it nests deeper than `limit`."""
    if data_depth(obj, limit) > limit:
        raise too_deep(where, limit)
    return obj


def load_yaml(text: str, where: str, load: Callable[[str], Any] | None = None, limit: int = MAX_DEPTH) -> Any:
    """`text` as YAML (`load`: the caller's loader, default yaml.safe_load), within `limit` levels
    whether nested in flow style ({a: {a: ...}}) or by indentation. YAML's own errors pass through
    for the caller to word (with their line)."""
    import yaml

    if text_depth(text) > limit:
        raise too_deep(where, limit)
    try:
        data = (load or yaml.safe_load)(text)
    except RecursionError:  # block style, deeper than the loader's own recursion goes
        raise too_deep(where, limit) from None
    return check_depth(data, where, limit)


def load_json(text: str, where: str, limit: int = MAX_DEPTH) -> Any:
    """`text` as JSON within `limit` levels (ValueError, as json.loads, for text that is not JSON)."""
    if text_depth(text) > limit:
        raise too_deep(where, limit)
    return json.loads(text)
