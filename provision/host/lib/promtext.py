"""Reading a Prometheus text page (an engine's /metrics).  STDLIB ONLY, pure."""

from __future__ import annotations


def gauge_sum(text: str, name: str) -> float:
    """The sum of a gauge's samples over its labels (0 when absent). Pure."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            try:
                total += float(line.rsplit(None, 1)[-1])
            except (ValueError, IndexError):
                continue
    return total
