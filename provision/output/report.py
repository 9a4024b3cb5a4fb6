"""Turn per-host results into what the user sees: lines, a table, JSON, the exit code.

Pure functions of the records, so the table, ``--json`` and the exit code agree.
"""

from __future__ import annotations

import json
import os
from typing import Iterable

from provision import __version__
from provision.errors import EXIT_CHANGES, EXIT_FAILED, EXIT_NOTHING, EXIT_OK  # noqa: F401
from provision.output.results import CHANGED_VERDICTS, HostResult

STYLE = {"not-applicable": "dim", "patched": "green", "repaired": "green", "unpatched": "green", "unchanged": "dim", "native": "cyan",
         "absent": "dim", "failed": "bold red", "unknown": "bold yellow", "ready": "green", "running": "green",
         "stopped": "green", "crashed": "bold red", "timeout": "bold red", "skipped": "yellow",
         "missing": "yellow", "stale": "yellow", "hand-patch": "bold yellow", "error": "bold red",
         "unreachable": "bold red"}


WOULD = {"patched": "would-patch", "repaired": "would-repair", "unpatched": "would-unpatch",
         "restored": "would-restore", "started": "would-start", "restarted": "would-restart", "stopped": "would-stop",
         "upgraded": "would-upgrade"}


def exit_code(results: list[HostResult], check: bool = False) -> int:
    if not results:
        return EXIT_NOTHING
    if any(r.failed for r in results):
        return EXIT_FAILED
    if check and any(r.verdict in CHANGED_VERDICTS for r in results):
        return EXIT_CHANGES
    return EXIT_OK


def host_line(r: HostResult, check: bool = False, *, verdict: str | None = None, added: bool = True) -> str:
    """One row as a line: host, verdict (with ``check``, what it would be), ``sglang VERSION``,
    ``spec NAME``, file, ``+added`` methods, ``- detail``. ``verdict`` puts another word in the
    verdict's place and ``added=False`` leaves the added methods out: reconcile's form
    (tasks/reconcile.host_line: "re-patched", and the detail says what it did)."""
    if verdict is None:
        verdict = said_verdict(r, check)
    parts = [r.host, verdict]
    if r.version:
        parts.append(f"{r.data.get('engine_package') or r.data.get('engine') or 'sglang'} {r.version}")
    if r.data.get("spec"):
        parts.append(f"spec {r.data['spec']}")
    if r.file:
        parts.append(r.file)
    if added and r.added:
        parts.append("+" + ", +".join(r.added))
    if r.detail:
        parts.append("- " + r.detail)
    return one_line("  ".join(parts))


def said_verdict(r: HostResult, check: bool = False) -> str:
    """The row's verdict as shown: with ``check`` (nothing was changed), what it would be
    ("would-patch"), in the line, the table and the summary alike. Pure."""
    if check and r.verdict in CHANGED_VERDICTS:
        return WOULD.get(r.verdict, f"would-be-{r.verdict}")
    return r.verdict


def summary_line(results: list[HostResult], check: bool = False) -> str:
    """"3 hosts: 2 patched, 1 failed": the rows' verdicts counted, as the rows say them. Pure."""
    counts: dict[str, int] = {}
    for r in results:
        v = said_verdict(r, check)
        counts[v] = counts.get(v, 0) + 1
    body = ", ".join(f"{n} {v}" for v, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{count_label(results)}: {body or 'none'}"


def count_label(results: list[HostResult]) -> str:
    """"3 hosts", or with several specs per host "2 hosts, 5 host-specs" (one row each). Pure."""
    hosts = len(dict.fromkeys(r.host for r in results))
    label = f"{hosts} host{'s' if hosts != 1 else ''}"
    if len(results) != hosts:
        label += f", {len(results)} host-specs"
    return label


def to_document(command: str, results: Iterable[HostResult], code: int, extra: dict | None = None,
                secrets: Iterable[str] = ()) -> str:
    """The ``--json`` document, every string in it through the redactor (the run's known secret
    values, ``secrets``, and the patterns that carry one: ``--api-key X``, ``api_key='X'``,
    ``Bearer X``, ``HF_TOKEN=X``, ``hf_...``), whatever a host sent back."""
    doc = {"tool": "provision", "version": __version__, "command": command, "exit_code": code,
           "hosts": [r.to_json() for r in results]}
    if extra:
        doc.update(extra)
    return dumps_redacted(doc, secrets)


def dumps_redacted(doc, secrets: Iterable[str] = (), indent: int | None = 2) -> str:
    """Any JSON document provision prints, redacted (see to_document)."""
    from provision.logs.redact import redact_doc

    return json.dumps(redact_doc(doc, known_secrets(secrets)), indent=indent, sort_keys=False)


def known_secrets(extra: Iterable[str] = ()) -> list[str]:
    """The secret values this run knows: the control machine's PROVISION_API_KEY,
    PROVISION_ADMIN_API_KEY and HF_TOKEN (or their *_FILE), plus ``extra`` (a launch's
    --api-key-file ...). A secrets file that cannot be read adds nothing here (the command that
    needs it says so)."""
    from provision.config.profile import secrets_from_env
    from provision.errors import ConfigError

    try:
        found = secrets_from_env()
    except ConfigError:  # an unreadable *_FILE: still the values the environment holds itself
        found = secrets_from_env({k: v for k, v in os.environ.items() if not k.endswith("_FILE")})
    return [str(v) for part in ("args", "env") for v in (found.get(part) or {}).values() if v] + \
        [str(v) for v in extra if v]


def resolve_format(fmt: str, stream=None) -> str:
    """--format auto: a table on a terminal, one line per row otherwise (pipes, CI logs)."""
    import sys

    if fmt != "auto":
        return fmt
    stream = stream or sys.stdout
    try:
        return "table" if stream.isatty() else "lines"
    except (AttributeError, ValueError):
        return "lines"


# Columns that hold identifiers (names, classes, versions, verdicts): never wrapped or cut.
# The last column of a table (a free-text detail) wraps at spaces.
def host_columns(columns: list[str] | None) -> list[str]:
    return columns or ["host", "verdict", "version", "detail", "elapsed"]


def _cell(r: HostResult, c: str, check: bool = False) -> str:
    if c == "verdict":
        return said_verdict(r, check)
    if c == "elapsed":
        return f"{r.elapsed:.1f}s"
    if c == "methods":
        return f"+{len(r.added)}" if r.added else ""
    if c in r.data:
        return str(r.data[c])
    v = getattr(r, c, None)
    return "" if v is None else str(v)


def host_rows(results: list[HostResult], columns: list[str] | None = None, check: bool = False) -> list[list[str]]:
    cols = host_columns(columns)
    return [[_cell(r, c, check) for c in cols] for r in results]


def lines(columns: list[str], rows: list[list[str]], header: bool = True) -> list[str]:
    """One line per row, fields separated by two spaces, nothing truncated; an empty field is '-'. Pure."""
    out = ["  ".join(columns)] if header else []
    out += ["  ".join(one_line(str(v)) if str(v) != "" else "-" for v in row) for row in rows]
    return out


def one_line(text: str) -> str:
    """`text` kept on one line: a line break inside a row's field (a host's words) is written as \\n,
    so no field can start a line that reads as another host's row. Pure."""
    return text.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\r")


def rich_table(columns: list[str], rows: list[list[str]], *, title: str | None = None, wrap: tuple = ()):
    """A rich Table: identifier columns are never wrapped (they keep their full width); the
    columns named in ``wrap`` (default: the last) wrap at spaces only when needed."""
    from rich.table import Table
    from rich.text import Text

    wrap = wrap or (("detail",) if "detail" in columns else (columns[-1],))
    t = Table(show_header=True, header_style="bold", box=None, pad_edge=False, title=title)
    for c in columns:
        if c in wrap:
            t.add_column(c, overflow="fold", ratio=1, min_width=12)
        else:
            t.add_column(c, no_wrap=True, overflow="ignore")
    for row in rows:
        cells = []
        for c, v in zip(columns, row):
            style = STYLE.get(v, "") if c == "verdict" else ""
            cells.append(Text(one_line(str(v)), style=style))
        t.add_row(*cells)
    return t


def table_fits(columns: list[str], rows: list[list[str]], width: int, wrap: tuple = ()) -> bool:
    """Whether the identifier columns at full width, plus 12 for each wrapping column, fit. Pure."""
    wrap = wrap or (("detail",) if "detail" in columns else (columns[-1],))
    need = 0
    for i, c in enumerate(columns):
        if c in wrap:
            need += min(12, max([len(c)] + [len(str(r[i])) for r in rows]))
        else:
            need += max([len(c)] + [len(str(r[i])) for r in rows])
    return need + 2 * (len(columns) - 1) <= width


def natural_width(columns: list[str], rows: list[list[str]]) -> int:
    """The width of a table whose every cell is on one line. Pure."""
    widths = [max([len(c)] + [len(str(r[i])) for r in rows]) for i, c in enumerate(columns)]
    return sum(widths) + 2 * (len(columns) - 1)


def print_table(columns: list[str], rows: list[list[str]], *, fmt: str = "table", title: str | None = None,
                wrap: tuple = (), echo=None) -> None:
    """Rows as an aligned table (fmt table) or as lines (fmt lines). A table too wide for the
    terminal falls back to lines rather than cut or break an identifier."""
    import click

    out = echo or click.echo
    if fmt != "lines":
        from rich.console import Console

        console = Console(highlight=False)
        if not console.is_terminal:  # a file or a pipe has no width to fit: the table at its natural width
            console = Console(highlight=False, width=natural_width(columns, rows))
        if table_fits(columns, rows, console.width, wrap):
            console.print(rich_table(columns, rows, title=title, wrap=wrap))
            return
    if title:
        out(title)
    for line in lines(columns, rows):
        out(line)


def table(results: list[HostResult], columns: list[str] | None = None):
    """A rich Table: one row per host."""
    cols = host_columns(columns)
    return rich_table(cols, host_rows(results, cols))
