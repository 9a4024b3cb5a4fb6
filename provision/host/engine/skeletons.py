"""The registry's parse of a models directory, kept per file between calls.  STDLIB ONLY.

Preflight reads SGLang's registry (every module's EntryClass and the EAGLE-3 methods each lacks,
engine/audit.py ``registry_of``) from the install's files with ``ast``: 165 files and 3.4 MB in 0.5.9,
about 1.4 s of CPU, nearly all of it ``ast.parse``. What the registry reads of a module is its
skeleton: imports, top-level assignments (EntryClass), classes with their bases, methods and class
attributes; never a function's body. This module keeps each file's skeleton (its source with every
function body cut to ``...``) in one JSON file under the state dir, keyed by
the file's mtime and size as preflight's table cache is: after a patch (one file changed) the
registry is read again from 164 skeletons and one full parse (about 0.15 s), not from 165 parses.
A file read whole gives the registry what its skeleton gives (tests/engine/test_skeletons.py holds
that over every model file of real releases).

A skeleton's line numbers are not the file's; the registry records files, never lines. A file that
does not parse is never kept (its error is read from the file itself, every time).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os

VERSION = 1


def skeleton(text: str, tree: ast.Module) -> str:
    """`text` (the module's source, `tree` its parse) with the body of every function not inside
    another reduced to ``...`` on a line of its own: the source's own lines otherwise (signatures,
    decorators, classes, imports and assignments as written). A function whose body begins on its
    ``def`` line is kept whole."""
    lines = text.splitlines(keepends=True)
    cuts = []  # (first body line, last line, indent), 1-based
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0]
            line = lines[first.lineno - 1] if first.lineno <= len(lines) else ""
            if first.lineno > node.lineno and not line[:first.col_offset].strip() and node.end_lineno:
                cuts.append((first.lineno, node.end_lineno, first.col_offset))
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            stack.extend(getattr(node, field, None) or [])
    out = []
    at = 1
    for first, last, indent in sorted(cuts):
        out += lines[at - 1:first - 1]
        out.append(" " * indent + "...\n")
        at = last + 1
    out += lines[at - 1:]
    return "".join(out)


def cache_path(state_dir: str, models_dir: str) -> str:
    key = hashlib.sha256(os.path.abspath(models_dir).encode()).hexdigest()[:16]
    return os.path.join(state_dir, "cache", f"skeletons-{key}.json")


class Skeletons:
    """``parse(path)``: the file's skeleton as a tree, from the kept copy while the file's mtime and
    size are the same, else parsed whole (SyntaxError and OSError raised as ``ast.parse`` and
    ``open`` raise them) and kept. ``save()`` writes the copies back when any changed (0600, the
    state dir's cache, atomically); a copy that cannot be read or written is only slower."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.files: dict = {}
        self.used: set = set()
        self.changed = False
        if path:
            try:
                with open(path) as fh:
                    doc = json.load(fh)
                if isinstance(doc, dict) and doc.get("v") == VERSION and isinstance(doc.get("files"), dict):
                    self.files = doc["files"]
            except (OSError, ValueError, RecursionError):
                pass

    def parse(self, path: str) -> ast.Module:
        self.used.add(path)
        st = os.stat(path)
        stamp = [st.st_mtime_ns, st.st_size]
        kept = self.files.get(path)
        if isinstance(kept, list) and len(kept) == 3 and kept[:2] == stamp and isinstance(kept[2], str):
            try:
                return ast.parse(kept[2])
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                pass  # a damaged copy: the file itself is read below
        if self.files.pop(path, None) is not None:  # stale or damaged: gone, even if the file no longer parses
            self.changed = True
        with open(path, "rb") as fh:
            data = fh.read()
        tree = ast.parse(data, filename=path)  # bytes: honours BOMs and coding cookies
        try:
            self.files[path] = [*stamp, skeleton(data.decode("utf-8-sig"), tree)]
            self.changed = True
        except UnicodeDecodeError:  # another coding (a cookie): read whole every time, not kept
            pass
        return tree

    def save(self) -> None:
        """Write the copies back when any changed, only those of the files this read parsed (a
        removed file's copy goes)."""
        if not self.path:
            return
        gone = set(self.files) - self.used
        if not self.changed and not gone:
            return
        for path in gone:
            del self.files[path]
        from provision.host.lib import atomic

        try:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            atomic.write_json(self.path, {"v": VERSION, "files": self.files}, durable=False)
        except OSError:
            pass
