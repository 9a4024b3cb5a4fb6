"""Per-host verdict records. Every host ends in one of these, never in an exception."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Verdicts, across commands. FAILED_VERDICTS make the run exit non-zero.
CHANGED_VERDICTS = {"patched", "repaired", "unpatched", "restored", "started", "restarted", "stopped",
                    "staged", "removed", "upgraded"}  # (staged / removed: an overlay, `patch|unpatch --overlay`;
                    # staged, upgraded: `upgrade`)
OK_VERDICTS = {"unchanged", "native", "not-applicable", "absent", "ok", "overlay", "running", "ready", "not-running",
               "noop", "skipped-ok"}
FAILED_VERDICTS = {"failed", "unknown", "unreachable", "refused", "crashed", "timeout", "error", "interrupted",
                   "rolled-back"}


@dataclass
class HostResult:
    host: str
    verdict: str
    detail: str = ""
    version: str | None = None
    install: str | None = None
    file: str | None = None
    added: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    diff: str | None = None
    elapsed: float = 0.0
    error_kind: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.verdict in FAILED_VERDICTS

    def to_json(self) -> dict:
        d = asdict(self)
        d["failed"] = self.failed
        return d
