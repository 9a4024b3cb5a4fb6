"""Turn per-host results into what the user sees: lines, a table, JSON, the exit code.

Pure functions of the records, so the table, ``--json`` and the exit code agree.
"""

from __future__ import annotations

import json
from typing import Iterable

from provision import __version__
from provision.errors import EXIT_CHANGES, EXIT_FAILED, EXIT_NOTHING, EXIT_OK  # noqa: F401
from provision.results import CHANGED_VERDICTS, HostResult

STYLE = {"patched": "green", "repaired": "green", "unpatched": "green", "unchanged": "dim", "native": "cyan",
         "absent": "dim", "failed": "bold red", "unknown": "bold yellow", "ready": "green", "running": "green",
         "stopped": "green", "crashed": "bold red", "timeout": "bold red", "skipped": "yellow"}


WOULD = {"patched": "would-patch", "repaired": "would-repair", "unpatched": "would-unpatch",
         "restored": "would-restore", "started": "would-start", "restarted": "would-restart", "stopped": "would-stop"}


def exit_code(results: list[HostResult], check: bool = False) -> int:
    if not results:
        return EXIT_NOTHING
    if any(r.failed for r in results):
        return EXIT_FAILED
    if check and any(r.verdict in CHANGED_VERDICTS for r in results):
        return EXIT_CHANGES
    return EXIT_OK


def host_line(r: HostResult, check: bool = False) -> str:
    verdict = r.verdict
    if check and verdict in CHANGED_VERDICTS:
        verdict = WOULD.get(verdict, f"would-be-{verdict}")
    parts = [r.host, verdict]
    if r.version:
        parts.append(f"sglang {r.version}")
    if r.file:
        parts.append(r.file)
    if r.added:
        parts.append("+" + ", +".join(r.added))
    if r.detail:
        parts.append("- " + r.detail)
    return "  ".join(parts)


def summary_line(results: list[HostResult]) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    body = ", ".join(f"{n} {v}" for v, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{len(results)} host{'s' if len(results) != 1 else ''}: {body or 'none'}"


def to_document(command: str, results: Iterable[HostResult], code: int, extra: dict | None = None) -> str:
    doc = {"tool": "provision", "version": __version__, "command": command, "exit_code": code,
           "hosts": [r.to_json() for r in results]}
    if extra:
        doc.update(extra)
    return json.dumps(doc, indent=2, sort_keys=False)


def table(results: list[HostResult], columns: list[str] | None = None):
    """A rich Table: one row per host."""
    from rich.table import Table

    cols = columns or ["host", "verdict", "version", "detail", "elapsed"]
    t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for c in cols:
        t.add_column(c, overflow="fold")
    for r in results:
        row = []
        for c in cols:
            if c == "verdict":
                style = STYLE.get(r.verdict, "")
                row.append(f"[{style}]{r.verdict}[/]" if style else r.verdict)
            elif c == "elapsed":
                row.append(f"{r.elapsed:.1f}s")
            elif c == "methods":
                row.append(f"+{len(r.added)}" if r.added else "")
            elif c in r.data:
                row.append(str(r.data[c]))
            else:
                v = getattr(r, c, None)
                row.append("" if v is None else str(v))
        t.add_row(*row)
    return t
