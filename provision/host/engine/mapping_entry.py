"""Spec kind `mapping-entry`: in a dict literal bound to a name, ensure a key.  STDLIB ONLY, Python 3.10.

    kind: mapping-entry
    file: srt/distributed/device_communicators/all_reduce_utils.py
    mapping: TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES   # NAME = {...} at module level (or Class.NAME)
    key: 12
    copy_of: 10              # copy key 10's value expression as written; or value: "<expression>"

The entry is inserted last, before the closing brace, at its siblings' indentation, with their
key/value separator and quote style, between provision's markers:

    TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {
        9: {...},
        10: {...},
        # >>> provision managed block: spec=NAME sha=... (remove with `provision unpatch`)
        12: {...},
        # <<< provision managed block: spec=NAME
    }

When the last sibling has no trailing comma, one is added after its value and the begin marker
says `comma-added`, so `unpatch` takes it out again. Native when the key is already there (the
same test Python's dict uses: ==). Refused when the name is not bound once to a dict literal, when
a key is not a literal (provision could not tell whether the key is there), or when the closing
brace does not start its own line.
"""

from __future__ import annotations

import ast

from provision.host.engine.render import spec_sha
from provision.host.engine.markers import begin_line, end_line, find_block, has_word
from provision.host.engine.pysource import (
    body, body_statements, ending, find_scope, line_offsets, literal_key, parse, split_lines,
)
from provision.host.engine.spec import EngineError

COMMA_ADDED = "comma-added"


def label(s: dict) -> str:
    return f"{s['key']!r} in {s['mapping']}"


def _locate(tree, s: dict):
    """The ast.Dict bound to s["mapping"] and the line of its binding. Raises EngineError."""
    parts = s["mapping"].split(".")
    scope = find_scope(tree, parts[0], s["file"]) if len(parts) == 2 else tree
    name = parts[-1]
    where = f"class {parts[0]}" if len(parts) == 2 else "module"
    hits = []
    for st in body_statements(scope.body):
        if (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)
                and st.targets[0].id == name):
            hits.append(st)
        elif (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.target.id == name
              and st.value is not None):
            hits.append(st)
    if not hits:
        raise EngineError("mapping-missing", f"expected an assignment `{name} = {{...}}` in the {where} body of {s['file']}, found none")
    if len(hits) > 1:
        raise EngineError("mapping-ambiguous", f"expected {name} to be assigned once in the {where} body of {s['file']}, found {len(hits)} assignments (lines {', '.join(str(h.lineno) for h in hits)}); refusing to guess which one counts")
    st = hits[0]
    if not isinstance(st.value, ast.Dict):
        text = " ".join(ast.unparse(st.value).split())
        raise EngineError("mapping-layout", f"expected {s['mapping']} (line {st.lineno}) to be bound to a dict literal `{{...}}`, found `{text[:60]}`")
    d = st.value
    for k in d.keys:
        if k is None:
            raise EngineError("mapping-layout", f"expected only literal keys in {s['mapping']} (line {st.lineno}), found a `**` expansion at line {d.lineno}; provision cannot tell whether key {s['key']!r} is there")
        ok, _ = literal_key(k)
        if not ok:
            raise EngineError("mapping-layout", f"expected only literal keys in {s['mapping']} (line {st.lineno}), found `{ast.unparse(k)[:40]}` at line {k.lineno}; provision cannot tell whether key {s['key']!r} is there")
    return d


def _char_col(line: str, col: int) -> int:
    """ast's column (UTF-8 bytes) as an index into the line's characters."""
    return len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))


def _pos(lines: list, offs: list, lineno: int, col: int) -> int:
    return offs[lineno - 1] + _char_col(lines[lineno - 1], col)


def _keys(d) -> list:
    return [literal_key(k)[1] for k in d.keys]


def analyse(text: str, s: dict) -> dict:
    lines = split_lines(text)
    block = find_block(lines, s["name"])
    base = remove(text, block, s) if block is not None else text
    d = _locate(parse(base, s["file"]), s)
    out = {"base": base, "block": block, "native": False, "via": None, "want": None, "notes": []}
    for k, node in zip(_keys(d), d.keys):
        if k == s["key"]:
            out["native"], out["via"] = True, f"key {k!r} is at line {node.lineno}, in {s['mapping']}"
            return out
    out["want"] = _render(base, d, s)
    return out


def _after_value_has_comma(text: str, pos: int, stop: int) -> bool:
    """Between a value's end and the closing brace there are only blanks, comments and at
    most one comma: is the comma there?"""
    i = pos
    while i < stop:
        c = text[i]
        if c == ",":
            return True
        if c == "#":
            while i < stop and text[i] not in "\r\n":
                i += 1
            continue
        i += 1
    return False


def _key_src(s: dict, d, base: str, lines: list, offs: list) -> str:
    key = s["key"]
    if isinstance(key, str) and d.keys:
        last = d.keys[-1]
        first = base[_pos(lines, offs, last.lineno, last.col_offset)]
        if first == '"' and '"' not in key and "\\" not in key:
            return '"' + key + '"'
    return repr(key)


def _render(base: str, d, s: dict) -> str:
    lines = split_lines(base)
    offs = line_offsets(lines)
    close = _pos(lines, offs, d.end_lineno, d.end_col_offset) - 1  # the `}`
    close_line = d.end_lineno - 1
    prefix = base[offs[close_line]:close]
    if d.lineno == d.end_lineno or prefix.strip(" \t\f"):
        raise EngineError("mapping-layout", f"expected the closing `}}` of {s['mapping']} (line {d.lineno}) on a line of its own, found `{body(lines[close_line]).strip()[:60]}` at line {d.end_lineno}; refusing to rewrite it")
    nl = ending(lines[close_line - 1]) or next((ending(x) for x in lines if ending(x)), "\n")
    sep, comma_at = ": ", None
    if d.keys:
        k, v = d.keys[-1], d.values[-1]
        kline = body(lines[k.lineno - 1])
        indent = kline[: len(kline) - len(kline.lstrip(" \t\f"))]
        if k.end_lineno == v.lineno:
            sep = base[_pos(lines, offs, k.end_lineno, k.end_col_offset):_pos(lines, offs, v.lineno, v.col_offset)]
        vend = _pos(lines, offs, v.end_lineno, v.end_col_offset)
        if not _after_value_has_comma(base, vend, close):
            comma_at = vend
    else:
        indent = prefix + "    "
    if s["value"] is not None:
        value = s["value"]
    else:
        value = _copied(base, lines, offs, d, s, indent)
    entry = indent + _key_src(s, d, base, lines, offs) + sep + value + "," + nl
    block = (indent + begin_line(s["name"], spec_sha(s), "kind=mapping-entry" + (" " + COMMA_ADDED if comma_at is not None else "")) + nl
             + entry + indent + end_line(s["name"]) + nl)
    at = offs[close_line]
    if comma_at is not None:
        return base[:comma_at] + "," + base[comma_at:at] + block + base[at:]
    return base[:at] + block + base[at:]


def _copied(base: str, lines: list, offs: list, d, s: dict, indent: str) -> str:
    """The value expression of key copy_of, as written (the last binding of that key wins, as
    in Python), its continuation lines moved to the new entry's indentation."""
    hits = [i for i, k in enumerate(_keys(d)) if k == s["copy_of"]]
    if not hits:
        have = ", ".join(repr(k) for k in _keys(d)) or "none"
        raise EngineError("key-missing", f"expected key {s['copy_of']!r} in {s['mapping']} (lines {d.lineno}-{d.end_lineno}) to copy its value from, found keys: {have}")
    k, v = d.keys[hits[-1]], d.values[hits[-1]]
    text = base[_pos(lines, offs, v.lineno, v.col_offset):_pos(lines, offs, v.end_lineno, v.end_col_offset)]
    kline = body(lines[k.lineno - 1])
    src_indent = kline[: len(kline) - len(kline.lstrip(" \t\f"))]
    if src_indent == indent:
        return text
    parts = split_lines(text)
    return parts[0] + "".join(indent + p[len(src_indent):] if p.startswith(src_indent) else p for p in parts[1:])


def remove(text: str, block: dict, s: dict) -> str:
    """The text without provision's entry (and the comma it added to the last sibling)."""
    def last_end(out: str):
        d = _locate(parse(out, s["file"]), s)
        if not d.values:
            return None
        lines = split_lines(out)
        return _pos(lines, line_offsets(lines), d.values[-1].end_lineno, d.values[-1].end_col_offset)

    return remove_entry(text, block, last_end, f"the last entry of {s['mapping']}")


def remove_entry(text: str, block: dict, last_end, what: str) -> str:
    """The text without provision's block, and without the comma it added after `what` when its
    marker says so; `last_end(text)` is the offset just after that sibling (None: there is none).
    The one undo of an inserted entry (mapping-entry, list-entry)."""
    lines = split_lines(text)
    b, e = block["begin"], block["end"]
    out = "".join(lines[:b]) + "".join(lines[e + 1:])
    if not has_word(lines[b], COMMA_ADDED):
        return out
    at = last_end(out)
    if at is not None and out[at:at + 1] == ",":
        return out[:at] + out[at + 1:]
    raise EngineError("block-corrupt", f"expected the comma provision added after {what} (its marker at line {b + 1} says {COMMA_ADDED}), found none; fix or remove the block by hand")


def check(text: str, s: dict) -> list:
    """Problems with a patched file: it parses, the key is in the dict exactly once, and
    provision's edit (if any) is well-formed."""
    try:
        d = _locate(parse(text, s["file"]), s)
        block = find_block(split_lines(text), s["name"])
        if block is not None:
            remove(text, block, s)
    except EngineError as e:
        return [e.message]
    n = sum(1 for k in _keys(d) if k == s["key"])
    if n == 1:
        return []
    if n == 0:
        return [f"key {s['key']!r} is not in {s['mapping']}"]
    return [f"key {s['key']!r} is in {s['mapping']} {n} times; the last one silently wins"]
