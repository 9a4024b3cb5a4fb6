"""What a spec writes, and the sha its begin marker carries.  STDLIB ONLY, Python 3.10.

The delegation block's text (``render_methods``, ``render_block``) and every kind's marker sha
(``block_shas``: the delegation block's, or a mapping-entry / replace spec's own ``spec_sha``).
Needs the spec only, never a file: the engine (engine/core.py, engine/edits.py) writes with it,
the overlay renders the same methods, and the unchanged fast path (ops/fastpath.py) and the
control side compare a file's marker with it without loading the engine's parser.
"""

from __future__ import annotations

import hashlib
import json

from provision.host.engine.markers import begin_line, end_line
from provision.host.engine.spec import KIND_KEYS, validate_spec

# the kinds that edit one place in a file (engine/edits.py); the rest are delegation blocks
EDIT_KINDS = ("mapping-entry", "replace", "list-entry")


def spec_sha(s: dict) -> str:
    """The sha a kind's begin marker carries: of the spec's own fields (not of the file), so
    the control side can compute it (reconcile's cheap check) without the file."""
    fields = {k: s.get(k) for k in KIND_KEYS[s["kind"]]}
    fields["kind"] = s["kind"]
    text = json.dumps(fields, sort_keys=True, default=repr).encode("utf-8")
    return hashlib.sha256(text).hexdigest()[:12]


def block_sha(s: dict, names) -> str:
    """The delegation block's sha: of its attributes and methods `names`, rendered as in a class body."""
    text = render_methods(s, "    ", "\n", names=names)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def block_shas(spec: dict) -> tuple:
    """The block sha(s) a spec's begin marker carries when its edit is current: the
    delegation block of all its methods, or another kind's spec sha."""
    s = validate_spec(spec)
    if isinstance(s, dict) and s.get("kind") in EDIT_KINDS:
        return (spec_sha(s),)
    if s.get("kind") == "interface":
        return ()  # its members are read from the installed release: the host judges it in full
    return (block_sha(s, [m["name"] for m in s["methods"]]),)


def render_methods(spec: dict, indent: str = "    ", newline: str = "\n", names=None, unit: str | None = None) -> str:
    """The delegation methods (no markers), each line ending with `newline`; first the
    class attributes an interface spec sets (`name = value`), when it has any.

    `indent` is the indentation of the `def` lines (the class body's), `unit`
    one more level inside a method (defaults to `indent`, right for a module-level
    class). `names` limits and orders nothing: methods keep the spec's order.
    """
    s = spec if is_normalised(spec) else validate_spec(spec)
    unit = indent if unit is None else unit
    d = s["delegate"]
    chunks = []
    attrs = [f"{indent}{a['name']} = {a['value']}" for a in s.get("attributes") or []
             if names is None or a["name"] in names]
    if attrs:
        chunks.append(attrs)
    for m in s["methods"]:
        if names is not None and m["name"] not in names:
            continue
        name, inner = m["name"], m["inner"]
        i1, i2, i3 = indent + unit, indent + unit * 2, indent + unit * 3
        chunks.append([
            f"{indent}def {name}({m['params']}):",
            f'{i1}"""EAGLE-3: delegate to self.{d} (added by provision)."""',
            f"{i1}{inner} = self.{d}",
            f'{i1}if not hasattr({inner}, "{name}"):',
            f"{i2}raise AttributeError(",
            f'{i3}f"{{type(self).__name__}}.{d} ({{type({inner}).__name__}}) has no {name}(); cannot delegate"',
            f"{i2})",
            f"{i1}return {inner}.{name}({m['call']})",
        ])
    lines = []
    for c in chunks:
        if lines:
            lines.append("")
        lines.extend(c)
    return "".join(line + newline for line in lines)


def is_normalised(spec) -> bool:
    return (isinstance(spec, dict) and isinstance(spec.get("methods"), list)
            and all(isinstance(m, dict) and "call" in m and "inner" in m for m in spec["methods"]))


def render_block(spec: dict, indent: str = "    ", newline: str = "\n", names=None, unit: str | None = None) -> str:
    """Markers plus methods, as they appear in the file (no leading blank line)."""
    s = spec if is_normalised(spec) else validate_spec(spec)
    if names is None:
        names = [m["name"] for m in s["methods"]]
    sha = block_sha(s, names)
    return (indent + begin_line(s["name"], sha) + newline
            + render_methods(s, indent, newline, names, unit)
            + indent + end_line(s["name"]) + newline)
