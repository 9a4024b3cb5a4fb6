"""``--config FILE`` as SGLang 0.5.9's ``server_args_config_parser.py`` merges it: PyYAML when
importable (unless ``PROVISION_STANDIN_NO_YAML=1``), else a built-in parser for flat ``key: value``
maps (scalars, quoted strings, booleans, numbers, simple lists).  STDLIB ONLY; installed beside the
stand-in.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

if __package__:  # provision.sandbox in a checkout
    from provision.sandbox.standin_log import log
else:  # flat, beside the stand-in (/opt/provision-standin on a host, or run as a script)
    from standin_log import log


def _yaml_scalar(text: str):
    s = text.strip()
    if s == "" or s in ("~", "null", "Null", "NULL"):
        return None
    if s[0] == "'" and s.endswith("'") and len(s) >= 2:
        return s[1:-1].replace("''", "'")
    if s[0] == '"' and s.endswith('"') and len(s) >= 2:
        try:
            return json.loads(s)
        except json.JSONDecodeError:
            return s[1:-1]
    if s in ("true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"):
        return True
    if s in ("false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"):
        return False
    if re.fullmatch(r"[-+]?(0|[1-9][0-9_]*)", s):
        return int(s.replace("_", ""))
    if re.fullmatch(r"0x[0-9a-fA-F]+", s):
        return int(s, 16)
    if re.fullmatch(r"[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?", s) and any(
        c in s for c in ".eE"
    ):
        return float(s.replace("_", ""))
    if s in (".inf", ".Inf", "+.inf"):
        return float("inf")
    if s[0] == "[" and s.endswith("]"):
        inner = s[1:-1].strip()
        if not inner:
            return []
        return [_yaml_scalar(p) for p in _split_flow(inner)]
    if s[0] == "{" and s.endswith("}"):
        try:
            return json.loads(s)
        except json.JSONDecodeError:
            return s
    return s


def _split_flow(inner: str) -> list[str]:
    parts, cur, quote = [], [], None
    for ch in inner:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
            cur.append(ch)
        elif ch == ",":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _strip_comment(line: str) -> str:
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def parse_flat_yaml(text: str) -> dict | None:
    """A minimal YAML subset: a flat ``key: value`` map (plus ``- item`` lists under a key)."""
    data: dict = {}
    last_key = None
    seen_any = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw).rstrip()
        if not line.strip() or line.strip() in ("---", "..."):
            continue
        seen_any = True
        if line.lstrip().startswith("- ") or line.strip() == "-":
            if last_key is None:
                raise ValueError(f"line {lineno}: a list item outside a mapping")
            item = line.strip()[1:].strip()
            if data[last_key] is None:
                data[last_key] = []
            if not isinstance(data[last_key], list):
                raise ValueError(f"line {lineno}: mixed scalar and list for {last_key!r}")
            data[last_key].append(_yaml_scalar(item))
            continue
        if line[0] in " \t":
            raise ValueError(f"line {lineno}: nested mappings are not supported: {raw!r}")
        m = re.match(r"""^("[^"]*"|'[^']*'|[^:]+?)\s*:(\s+(.*))?$""", line)
        if not m:
            raise ValueError(f"line {lineno}: expected 'key: value', got {raw!r}")
        key = m.group(1)
        if key[0] in "'\"":
            key = key[1:-1]
        data[key] = _yaml_scalar(m.group(3) or "")
        last_key = key
    return data if seen_any else None


def _load_yaml(path: str):
    text = Path(path).read_text(encoding="utf-8")
    if not os.environ.get("PROVISION_STANDIN_NO_YAML"):
        try:
            import yaml  # type: ignore

            return yaml.safe_load(text)
        except ImportError:
            pass
    return parse_flat_yaml(text)


def merge_config(argv: list[str], spec) -> list[str]:
    """0.5.9 ``ConfigArgumentMerger.merge_config_with_args``: CLI > config > defaults."""
    idx = [i for i, a in enumerate(argv) if a == "--config"]
    if len(idx) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    if not idx:
        return argv
    i = idx[0]
    if i == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    path = argv[i + 1]
    suffix = Path(path).suffix.lower()
    if suffix not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {suffix}")
    if not Path(path).exists():
        raise ValueError(f"Config file not found: {path}")
    try:
        data = _load_yaml(path)
    except Exception as e:
        log.error(f"Failed to read config file {path}: {e}")
        raise
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    store_true = spec.store_true_dests
    unsupported = spec.unsupported_config_dests
    out: list[str] = []
    for key, value in data.items():
        key = str(key)
        norm = key.replace("-", "_")
        if norm in unsupported:
            act = unsupported[norm]
            raise ValueError(f"Unsupported config option '{norm}' with action '{str(act).rsplit('.', 1)[-1]}'")
        if isinstance(value, bool):
            if norm in store_true:
                if value:
                    out.append(f"--{key}")
            else:
                out.extend([f"--{key}", str(value).lower()])
        elif isinstance(value, list):
            if value:
                out.append(f"--{key}")
                out.extend(str(v) for v in value)
        else:
            out.extend([f"--{key}", str(value)])
    return out + argv[:i] + argv[i + 2 :]
