"""Reading a host's answer: what the control side takes from a host it does not trust (issue 60).

A host may be compromised, or a wrapper around its python may print anything: its answer line is
bounded in size, must be one JSON object whose nesting stays shallow, and every string in it has its
terminal control characters escaped before any part of provision sees it, so nothing a host says
can move the operator's cursor, recolour a row or forge one. Line breaks and tabs are kept (a
server's log is text with lines); the one-line places (a table's cells, a row's detail) flatten
them (output/terminal.py). Then the answer is held to its op's type in the protocol
(host/protocol.py OPS; typeguard checks every key, every item), so what the tasks read as a
`StartAnswer` is one. Pure; the transports call `parse` on each result line.
"""

from __future__ import annotations

import json
import re

from typing import is_typeddict

from typeguard import CollectionCheckStrategy, TypeCheckError, check_type, checker_lookup_functions
from typeguard._checkers import check_typed_dict

from provision.errors import RemoteError
from provision.host import protocol
from provision.host.protocol import OPS

# The largest answer a host may send (a log chunk is 1 MiB; a status with every install, a few KiB).
MAX_ANSWER_BYTES = 32 << 20
# The deepest nesting an answer may have (provision's own answers stay under 10).
MAX_DEPTH = 32

# C0 controls but tab, newline and carriage return; DEL; C1 controls (ESC [ ... as one code point).
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """`text` with every terminal control character but tab and line breaks written as \\xNN. Pure."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def clean(doc, depth: int = 0):
    """Every string of a decoded answer (keys and values) through `escape_controls`; ValueError when
    it nests deeper than MAX_DEPTH. Pure."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nests deeper than {MAX_DEPTH} levels")
    if isinstance(doc, str):
        return escape_controls(doc)
    if isinstance(doc, dict):
        return {escape_controls(k) if isinstance(k, str) else k: clean(v, depth + 1) for k, v in doc.items()}
    if isinstance(doc, list):
        return [clean(v, depth + 1) for v in doc]
    return doc


def _declared_keys(value, origin_type, args, memo) -> None:
    """typeguard's TypedDict check over the keys the protocol declares: a key it does not name is
    passed over, not refused (no task reads it: mypy holds the tasks to the declared keys, and a
    newer host may say more)."""
    if not isinstance(value, dict):
        raise TypeCheckError("is not a dict")
    declared = origin_type.__annotations__
    check_typed_dict({k: v for k, v in value.items() if k in declared}, origin_type, args, memo)


def _protocol_typed_dicts(origin_type, args, extras):
    """typeguard's lookup hook: the protocol's TypedDicts are checked by `_declared_keys`."""
    if is_typeddict(origin_type) and origin_type.__module__ == protocol.__name__:
        return _declared_keys
    return None


if _protocol_typed_dicts not in checker_lookup_functions:
    checker_lookup_functions.insert(0, _protocol_typed_dicts)


def conform(doc: dict, op: str | None, label: str) -> dict:
    """`doc` when it is what the protocol says `op` answers (an op the protocol does not type, as
    is); else RemoteError naming the host, the op and the first key that is wrong. Pure."""
    kinds = OPS.get(op) if op else None
    if kinds is None:
        return doc
    try:
        check_type(doc, kinds[1], collection_check_strategy=CollectionCheckStrategy.ALL_ITEMS)
    except TypeCheckError as exc:
        raise RemoteError(f"{label}: the host's answer to {op} is not what the protocol says it answers "
                          f"({' '.join(escape_controls(str(exc)).split())[:300]}): not used") from None
    return doc


def parse(text: str, label: str, what: str = "answer", op: str | None = None) -> dict:
    """One result (or event) line's JSON, checked and cleaned; RemoteError with a sentence naming the
    host when it is too long, not JSON, not an object, or nested too deep, or (given the request's
    `op`) not the protocol's answer to it."""
    if len(text) > MAX_ANSWER_BYTES:
        raise RemoteError(f"{label}: the host's {what} is {len(text)} bytes, more than provision reads "
                          f"({MAX_ANSWER_BYTES >> 20} MiB): not used")
    try:
        doc = json.loads(text)
    except RecursionError:
        raise RemoteError(f"{label}: the host's {what} nests deeper than provision reads: not used") from None
    except ValueError as exc:
        raise RemoteError(f"{label}: the host's {what} is not JSON ({exc.__class__.__name__}: {str(exc)[:80]}); "
                          f"it starts {escape_controls(text[:60])!r}") from None
    if not isinstance(doc, dict):
        raise RemoteError(f"{label}: the host's {what} is a JSON {type(doc).__name__}, not the object provision "
                          "expects: not used")
    try:
        doc = clean(doc)
    except (ValueError, RecursionError) as exc:
        raise RemoteError(f"{label}: the host's {what} {exc if isinstance(exc, ValueError) else 'nests too deep'}: "
                          "not used") from None
    return conform(doc, op, label)
