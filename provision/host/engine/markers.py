"""provision's markers in a file: the managed block's begin and end comment lines, found
by spec name.  STDLIB ONLY, Python 3.10.  Every spec kind marks what it wrote with them
(engine/core.py's delegation block, engine/mapping_entry.py's entry, engine/replace.py's
replaced lines), so `unpatch` finds exactly what is provision's and the reconcile fast path
reads the block sha from the begin line.
"""

from __future__ import annotations

from provision.host.engine.spec import BEGIN_MARK, END_MARK, _BEGIN_RE, _END_RE, EngineError


def begin_line(spec_name: str, sha: str, extra: str = "") -> str:
    """The begin marker; `extra` is a word a kind records about its edit (e.g. mapping-entry's
    `comma-added`), read back with `has_word`."""
    return f"{BEGIN_MARK} spec={spec_name} sha={sha}{' ' + extra if extra else ''} (remove with `provision unpatch`)"


def marker_kind(line: str) -> str:
    """The spec kind a begin marker line was written for: its `kind=...` word (mapping-entry,
    replace), or "delegate" (the delegation block's markers carry none)."""
    head = line.split("(remove with", 1)[0]
    for w in head.split():
        if w.startswith("kind="):
            return w[len("kind="):]
    return "delegate"


def has_word(line: str, word: str) -> bool:
    """Does a begin marker line carry `word` (between its sha and `(remove with ...)`)?"""
    head = line.split("(remove with", 1)[0]
    return word in head.split()


def end_line(spec_name: str) -> str:
    return f"{END_MARK} spec={spec_name}"


def scan_markers(lines: list) -> dict:
    """{spec name: {"begins": [(line index, sha)], "ends": [line index]}} for every
    managed-block marker in the file, whatever its spec name."""
    out: dict = {}
    for i, line in enumerate(lines):
        if "provision managed block" not in line:
            continue
        m = _BEGIN_RE.match(line)
        if m:
            out.setdefault(m.group(1), {"begins": [], "ends": []})["begins"].append((i, m.group(2)))
            continue
        m = _END_RE.match(line)
        if m:
            out.setdefault(m.group(1), {"begins": [], "ends": []})["ends"].append(i)
    return out


def pair(spec_name: str, marks: dict) -> dict:
    begins, ends = marks["begins"], marks["ends"]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0][0]:
        raise EngineError("block-corrupt", f"expected one begin and one end marker for spec {spec_name}, found {len(begins)} begin (lines {', '.join(str(b[0] + 1) for b in begins) or '-'}) and {len(ends)} end (lines {', '.join(str(e + 1) for e in ends) or '-'}); fix or remove the block by hand")
    b, sha = begins[0]
    return {"begin": b, "end": ends[0], "sha": sha, "spec": spec_name}


def find_block(lines: list, spec_name: str):
    marks = scan_markers(lines).get(spec_name)
    return None if marks is None else pair(spec_name, marks)
