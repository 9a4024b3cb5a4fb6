"""The stand-in's log lines: SGLang's log format (one ``os.write`` per message, so ranks interleave
by line), uvicorn's lines, and the words each SGLang release uses for the same events (the installed
release's, or ``PROVISION_STANDIN_LOG_FORMS``'s).  STDLIB ONLY; installed beside the stand-in.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path


class _Log:
    """SGLang's log format; one os.write per message so ranks interleave by line, not by byte."""

    prefix = ""

    @staticmethod
    def _write(fd: int, data: str) -> None:
        raw = data.encode("utf-8", "replace")
        while raw:
            try:
                n = os.write(fd, raw)
            except InterruptedError:
                continue
            except OSError:
                return
            raw = raw[n:]

    def info(self, msg: str) -> None:
        ts = time.strftime("%Y-%m-%d %H:%M:%S")
        self._write(2, f"[{ts}{self.prefix}] {msg}\n")

    warning = error = info

    def raw(self, text: str, fd: int = 2) -> None:
        self._write(fd, text)


log = _Log()


def _uvicorn(level: str, msg: str, fd: int = 2) -> None:
    """A uvicorn line as 0.5.9 formats it: ``set_uvicorn_logging_configs`` (srt/utils/common.py) sets
    ``[%(asctime)s] %(levelprefix)s %(message)s`` with datefmt ``%Y-%m-%d %H:%M:%S``; the level prefix
    is uvicorn's ``INFO:`` padded to 9 columns (``INFO:     Uvicorn running on ...``)."""
    ts = time.strftime("%Y-%m-%d %H:%M:%S")
    log.raw(f"[{ts}] {(level + ':').ljust(9)} {msg}\n", fd)


def _version_tuple(text: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:3]) or (0,)


def forms_version(sglang_dir) -> tuple:
    """Which release's log lines to print: ``PROVISION_STANDIN_LOG_FORMS`` (e.g. ``0.5.23``), else the
    installed version."""
    return _version_tuple(os.environ.get("PROVISION_STANDIN_LOG_FORMS") or _sglang_version(Path(sglang_dir)))


def import_error_line(version: tuple, name: str, err: BaseException | str) -> str:
    """``models/registry.py``: 0.5.9 writes ``loading {name}: {e}``; older releases ``loading {name}. {e}``."""
    return f"Ignore import error when loading {name}{'.' if version < (0, 5) else ':'} {err}"


def rank_dead_lines(version: tuple, rank: int, code) -> tuple[list[str], str]:
    """(logged messages, the main process's exception line) when rank `rank` died before it was ready.
    0.5.9 (``entrypoints/engine.py`` ``_wait_for_scheduler_ready``) logs two errors and re-raises EOFError;
    0.5.23 raises a RuntimeError that names the exit code and the OOM killer."""
    if version >= (0, 5, 23):
        return [], (f"RuntimeError: Rank {rank} scheduler died during initialization (exit code: {code}). "
                    "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. "
                    "Run `dmesg -T | grep -i oom` to check.")
    return [f"Rank {rank} scheduler is dead. Please check if there are relevant logs.", f"Exit code: {code}"], \
        "EOFError"


def missing_method_exception(version: tuple, cls: str, method: str) -> str | None:
    """0.5.23 checks the method before calling it (``model_runner_components/attention_backend_setup.py``)
    and raises a ValueError; earlier releases call it and Python raises the AttributeError (None here)."""
    if version >= (0, 5, 23) and method == "set_eagle3_layers_to_capture":
        return (f"ValueError: Model {cls} does not implement {method}, "
                "which EAGLE3 aux hidden-state capture requires.")
    return None


def _sglang_version(sglang_dir: Path) -> str:
    for name in ("_version.py", "version.py"):
        try:
            text = (sglang_dir / name).read_text(encoding="utf-8")
        except OSError:
            continue
        m = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
        if m:
            return m.group(1)
    for p in sglang_dir.parent.glob("sglang-*.dist-info"):
        return p.name[len("sglang-"): -len(".dist-info")]
    return "0.0.0"
