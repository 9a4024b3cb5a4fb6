"""Counters read from a server's Prometheus text, and their change over a measurement.  Pure.

The parsing is prometheus_client's own (``text_string_to_metric_families``); what is here is
which samples count: a counter's ``_total`` samples summed over their labels (one per engine,
model or position), never its ``_created`` timestamps.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def counters(text: str | None) -> dict[str, float] | None:
    """{counter name (as written, without _total): its value summed over labels}; None when there
    is no text or it does not parse."""
    if text is None:
        return None
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name
                if name.endswith("_created"):
                    continue
                if name.endswith("_total"):
                    name = name[: -len("_total")]
                out[name] = out.get(name, 0.0) + float(sample.value)
    except (ValueError, TypeError):
        return None
    return out


def deltas(before: str | None, after: str | None) -> dict[str, float] | None:
    """How much each counter grew between two readings (a counter absent before counts from 0;
    a counter that went down, a restart between them, makes the whole answer None)."""
    b, a = counters(before), counters(after)
    if b is None or a is None:
        return None
    out = {}
    for name, value in a.items():
        d = value - b.get(name, 0.0)
        if d < 0:
            return None
        out[name] = d
    return out
