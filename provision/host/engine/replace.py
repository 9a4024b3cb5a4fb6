"""Spec kind `replace`: within a scope (the module, or a dotted def/class path), a source
fragment that occurs exactly once is replaced by another.  STDLIB ONLY, Python 3.10.

    kind: replace
    package: flashinfer
    file: jit/comm.py
    scope: gen_trtllm_comm_module
    find: "supported_major_versions=[9, 10]"
    replace: "supported_major_versions=[9, 10, 12]"
    native_if: "..."        # optional: upstream fixed it differently

The lines that hold the fragment are replaced, between provision's markers, and each
original line is kept above them as a `# was:` comment, so `unpatch` puts back the exact
original bytes without the spec:

        # >>> provision managed block: spec=NAME sha=... (remove with `provision unpatch`)
        # was: supported_major_versions=[9, 10]
        supported_major_versions=[9, 10, 12]
        # <<< provision managed block: spec=NAME

Native when the replacement is already in the scope, or the `native_if` fragment is. Refused
when the fragment is in the scope zero times or more than once, or when the lines cannot take
comment lines around them (inside a string, after a backslash continuation): the engine checks
that the marked file has the same syntax tree as the plainly replaced one.
"""

from __future__ import annotations

import ast
import re

from provision.host.engine.render import spec_sha
from provision.host.engine.markers import begin_line, end_line, find_block
from provision.host.engine.pysource import (
    body, ending, find_scope, line_offsets, parse, scope_lines, split_lines, try_parse,
)
from provision.host.engine.spec import EngineError

_WAS = re.compile(r"([ \t\f]*)# was([:|]) ")


def label(s: dict) -> str:
    return f"replace in {s['scope'] or 'the module'}"


def _where(s: dict, lo: int, hi: int) -> str:
    return f"{'`' + s['scope'] + '`' if s['scope'] else 'the module'} (lines {lo}-{hi} of {s['file']})"


def _occurrences(text: str, frag: str) -> list:
    out, i = [], text.find(frag)
    while i >= 0:
        out.append(i)
        i = text.find(frag, i + 1)
    return out


def _uncovered(seg: str, frag: str, find: str) -> list:
    """Where `frag` occurs in `seg` other than inside an occurrence of `find` (a replacement
    that is part of the original fragment does not make the file native)."""
    spans = [(i, i + len(find)) for i in _occurrences(seg, find)]
    return [i for i in _occurrences(seg, frag) if not any(a <= i and i + len(frag) <= b for a, b in spans)]


def _line_of(offsets: list, pos: int) -> int:
    """Index of the line holding character `pos`."""
    lo, hi = 0, len(offsets) - 2
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if offsets[mid] <= pos:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _short(frag: str) -> str:
    one = " ".join(frag.split())
    return "`" + (one if len(one) <= 70 else one[:67] + "...") + "`"


def analyse(text: str, s: dict) -> dict:
    lines = split_lines(text)
    block = find_block(lines, s["name"])
    base = remove(text, block, s) if block is not None else text
    tree = parse(base, s["file"])
    blines = split_lines(base)
    node = find_scope(tree, s["scope"], s["file"])
    lo, hi = scope_lines(node, len(blines))
    offs = line_offsets(blines)
    start, stop = offs[lo - 1], offs[min(hi, len(blines))]
    seg = base[start:stop]
    out = {"base": base, "block": block, "native": False, "via": None, "want": None, "notes": []}
    for frag, why in ((s["native_if"], "its native_if fragment"), (s["replace"], "the replacement")):
        hits = _uncovered(seg, frag, s["find"]) if frag is not None else []
        if hits:
            at = _line_of(offs, start + hits[0]) + 1
            out["native"], out["via"] = True, f"{why} {_short(frag)} is at line {at}, in {_where(s, lo, hi)}"
            return out
    found = _occurrences(seg, s["find"])
    if not found:
        raise EngineError("fragment-missing", f"expected {_short(s['find'])} once in {_where(s, lo, hi)}, found it nowhere (nor the replacement {_short(s['replace'])}"
                          + (f" or the native_if fragment {_short(s['native_if'])}" if s["native_if"] else "") + "); the file is not the one the spec was written for")
    if len(found) > 1:
        at = ", ".join(str(_line_of(offs, start + i) + 1) for i in found)
        raise EngineError("fragment-ambiguous", f"expected {_short(s['find'])} once in {_where(s, lo, hi)}, found it {len(found)} times (lines {at}); narrow the spec's `scope` or `find`")
    out["want"] = _render(base, blines, offs, start + found[0], s)
    return out


def _render(base: str, lines: list, offs: list, pos: int, s: dict) -> str:
    find, repl = s["find"], s["replace"]
    l1, l2 = _line_of(offs, pos), _line_of(offs, pos + len(find) - 1)
    first = body(lines[l1])
    indent = first[: len(first) - len(first.lstrip(" \t\f"))]
    nl = ending(lines[l1]) or next((ending(x) for x in lines if ending(x)), "\n")
    last_end = ending(lines[l2])
    was = []
    for line in lines[l1:l2 + 1]:
        b = body(line)
        rest = ("# was: " + b[len(indent):]) if b.startswith(indent) else ("# was| " + b)
        was.append(indent + rest + (ending(line) or nl))
    head = base[offs[l1]:pos]
    tail = base[pos + len(find):offs[l2 + 1]]
    region = head + repl.replace("\n", nl) + tail + ("" if last_end else nl)
    new = (base[:offs[l1]] + indent + begin_line(s["name"], spec_sha(s), "kind=replace") + nl + "".join(was) + region
           + indent + end_line(s["name"]) + last_end + base[offs[l2 + 1]:])
    plain = base[:pos] + repl.replace("\n", nl) + base[pos + len(find):]
    plain_tree = try_parse(plain)
    if plain_tree is None:
        raise EngineError("fragment-layout", f"expected the file to parse after replacing {_short(find)} with {_short(repl)} at line {l1 + 1}, found a syntax error; fix the spec's `replace`")
    marked = try_parse(new)
    if marked is None or ast.dump(marked) != ast.dump(plain_tree):
        raise EngineError("fragment-layout", f"expected lines {l1 + 1}-{l2 + 1} of {s['file']} to take provision's marker comments around them, found them inside a string or a backslash continuation; refusing to mark the edit")
    return new


def remove(text: str, block: dict, s: dict) -> str:
    """The text with provision's replaced lines put back as they were (the `# was:` lines)."""
    lines = split_lines(text)
    b, e = block["begin"], block["end"]
    restored = []
    i = b + 1
    while i < e:
        m = _WAS.match(lines[i])
        if not m:
            break
        rest = body(lines[i])[m.end():]
        restored.append((m.group(1) + rest if m.group(2) == ":" else rest) + ending(lines[i]))
        i += 1
    if not restored:
        raise EngineError("block-corrupt", f"expected `# was:` lines after provision's begin marker for spec {s['name']} (line {b + 1}), found none; fix or remove the block by hand")
    if i == e:
        raise EngineError("block-corrupt", f"expected the replaced lines between the `# was:` lines and the end marker of spec {s['name']} (lines {b + 1}-{e + 1}), found none; fix or remove the block by hand")
    if not ending(lines[e]):  # the file ended on the replaced line without a newline
        restored[-1] = body(restored[-1])
    return "".join(lines[:b]) + "".join(restored) + "".join(lines[e + 1:])


def check(text: str, s: dict) -> list:
    """Problems with a patched file: it must parse and hold the replacement (or native_if)
    in the scope, and provision's edit must be well-formed."""
    try:
        tree = parse(text, s["file"])
        lines = split_lines(text)
        block = find_block(lines, s["name"])
        if block is not None:
            remove(text, block, s)
        node = find_scope(tree, s["scope"], s["file"])
    except EngineError as e:
        return [e.message]
    lo, hi = scope_lines(node, len(lines))
    seg = "".join(lines[lo - 1:hi])
    if s["replace"] in seg or (s["native_if"] is not None and s["native_if"] in seg):
        return []
    return [f"{_short(s['replace'])} is not in {_where(s, lo, hi)}"]
