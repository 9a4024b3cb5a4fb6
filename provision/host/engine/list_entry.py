"""Spec kind `list-entry`: in a list, tuple or set literal bound to a name, ensure an element.
STDLIB ONLY, Python 3.10.

    kind: list-entry
    package: vllm
    file: config/speculative.py
    scope: SpeculativeConfig._verify_args     # where the name is bound (a dotted def/class; none: the module)
    list: [eagle3_target_supported, aux_hidden_states_supported]   # its name, or the names releases gave it
    value: '"kimi_k2"'                         # the element, a literal as Python source

An allow-list is what this is for: vLLM 0.16-0.17 refuse EAGLE-3 for a target whose model type is
not in such a list, bound inside a method (renamed between releases: a spec may name each name a
release gave it; exactly one must be bound there). The element is inserted last, before the closing
bracket, at its siblings' indentation, between provision's markers, as mapping-entry inserts a key
(engine/mapping_entry.py): a comma added after the last sibling is said on the begin marker
(`comma-added`) and taken out again by `unpatch`. Native when the element is already there (==).
Refused when the name is not bound once to a literal of that shape, when an element is not a
literal (provision could not tell whether the value is there), or when the closing bracket does not
start its own line.
"""

from __future__ import annotations

import ast

from provision.host.engine.mapping_entry import COMMA_ADDED, _after_value_has_comma, _pos, remove_entry
from provision.host.engine.markers import begin_line, end_line, find_block
from provision.host.engine.pysource import (
    body, body_statements, ending, find_scope, line_offsets, literal_key, parse, split_lines,
)
from provision.host.engine.render import spec_sha
from provision.host.engine.spec import EngineError

_SHAPES = (ast.List, ast.Tuple, ast.Set)


def label(s: dict) -> str:
    return f"{s['value']} in {s['list'][0] if len(s['list']) == 1 else ' / '.join(s['list'])}"


def _locate(tree, s: dict):
    """(the literal bound to one of s["list"]'s names in the scope, that name). Raises EngineError."""
    scope = find_scope(tree, s["scope"], s["file"])
    where = f"{s['scope']} (line {scope.lineno})" if s["scope"] else "the module"
    hits = []
    for st in body_statements(scope.body):
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) \
                and st.targets[0].id in s["list"]:
            hits.append((st, st.targets[0].id))
        elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.target.id in s["list"] \
                and st.value is not None:
            hits.append((st, st.target.id))
    names = " or ".join(s["list"])
    if not hits:
        raise EngineError("mapping-missing", f"expected an assignment `{names} = [...]` in {where} of {s['file']}, found none")
    if len(hits) > 1:
        raise EngineError("mapping-ambiguous", f"expected {names} to be assigned once in {where} of {s['file']}, found {len(hits)} assignments (lines {', '.join(str(h.lineno) for h, _ in hits)}); refusing to guess which one counts")
    st, name = hits[0]
    if not isinstance(st.value, _SHAPES):
        text = " ".join(ast.unparse(st.value).split())
        raise EngineError("mapping-layout", f"expected {name} (line {st.lineno}) to be bound to a list, tuple or set literal, found `{text[:60]}`")
    for e in st.value.elts:
        if not literal_key(e)[0]:
            raise EngineError("mapping-layout", f"expected only literal elements in {name} (line {st.lineno}), found `{ast.unparse(e)[:40]}` at line {e.lineno}; provision cannot tell whether {s['value']} is there")
    return st.value, name


def _elements(node) -> list:
    return [literal_key(e)[1] for e in node.elts]


def analyse(text: str, s: dict) -> dict:
    lines = split_lines(text)
    block = find_block(lines, s["name"])
    base = remove(text, block, s) if block is not None else text
    node, name = _locate(parse(base, s["file"]), s)
    out = {"base": base, "block": block, "native": False, "via": None, "want": None, "notes": []}
    want = ast.literal_eval(s["value"])
    for v, e in zip(_elements(node), node.elts):
        if v == want:
            out["native"], out["via"] = True, f"{s['value']} is at line {e.lineno}, in {name}"
            return out
    out["want"] = _render(base, node, name, s)
    return out


def _render(base: str, node, name: str, s: dict) -> str:
    lines = split_lines(base)
    offs = line_offsets(lines)
    close = _pos(lines, offs, node.end_lineno, node.end_col_offset) - 1  # the closing bracket
    close_line = node.end_lineno - 1
    prefix = base[offs[close_line]:close]
    if node.lineno == node.end_lineno or prefix.strip(" \t\f"):
        raise EngineError("mapping-layout", f"expected the closing bracket of {name} (line {node.lineno}) on a line of its own, found `{body(lines[close_line]).strip()[:60]}` at line {node.end_lineno}; refusing to rewrite it")
    nl = ending(lines[close_line - 1]) or next((ending(x) for x in lines if ending(x)), "\n")
    comma_at = None
    value = s["value"]
    if node.elts:
        last = node.elts[-1]
        lline = body(lines[last.lineno - 1])
        indent = lline[: len(lline) - len(lline.lstrip(" \t\f"))]
        end = _pos(lines, offs, last.end_lineno, last.end_col_offset)
        if not _after_value_has_comma(base, end, close):
            comma_at = end
        quote = base[_pos(lines, offs, last.lineno, last.col_offset)]
        want = ast.literal_eval(value)
        if isinstance(want, str) and quote in "'\"" and quote not in want and "\\" not in want:
            value = quote + want + quote  # the siblings' quote style
    else:
        indent = prefix + "    "
    block = (indent + begin_line(s["name"], spec_sha(s), "kind=list-entry" + (" " + COMMA_ADDED if comma_at is not None else "")) + nl
             + indent + value + "," + nl + indent + end_line(s["name"]) + nl)
    at = offs[close_line]
    if comma_at is not None:
        return base[:comma_at] + "," + base[comma_at:at] + block + base[at:]
    return base[:at] + block + base[at:]


def remove(text: str, block: dict, s: dict) -> str:
    """The text without provision's element (and the comma it added to the last sibling)."""
    def last_end(out: str):
        node, _name = _locate(parse(out, s["file"]), s)
        if not node.elts:
            return None
        lines = split_lines(out)
        return _pos(lines, line_offsets(lines), node.elts[-1].end_lineno, node.elts[-1].end_col_offset)

    return remove_entry(text, block, last_end, f"the last element of {' / '.join(s['list'])}")


def check(text: str, s: dict) -> list:
    """Problems with a patched file: it parses, the element is in the literal exactly once, and
    provision's edit (if any) is well-formed."""
    try:
        node, name = _locate(parse(text, s["file"]), s)
        block = find_block(split_lines(text), s["name"])
        if block is not None:
            remove(text, block, s)
    except EngineError as e:
        return [e.message]
    n = sum(1 for v in _elements(node) if v == ast.literal_eval(s["value"]))
    if n == 1:
        return []
    return [f"{s['value']} is not in {name}" if n == 0 else f"{s['value']} is in {name} {n} times"]
