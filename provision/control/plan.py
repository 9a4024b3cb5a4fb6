"""Rolling batches: which hosts go together, in what order.  Pure.

A multi-node server (hosts sharing an inventory `server:` name) is one unit: its
hosts are always in the same batch.
"""

from __future__ import annotations

import math
import re

from provision.errors import UsageError


def parse_serial(serial: str | int | None, units: int) -> int:
    """`--serial 2` or `--serial 25%` -> units per batch (at least 1)."""
    if serial is None or serial == "":
        return max(1, units)
    s = str(serial).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)%", s)
    if m:
        pct = float(m.group(1))
        if not 0 < pct <= 100:
            raise UsageError(f"--serial {s}: a percentage must be in (0, 100]")
        return max(1, math.floor(units * pct / 100))
    if not s.isdigit() or int(s) < 1:
        raise UsageError(f"--serial {s}: expected a whole number >= 1 or a percentage like 25%")
    return int(s)


def units(hosts: list, key=lambda h: h.vars.get("server")) -> list[list]:
    """Group hosts into units: a multi-node server is one unit, other hosts one each; order kept."""
    out: list[list] = []
    index: dict[str, int] = {}
    for h in hosts:
        k = key(h)
        if k:
            if k in index:
                out[index[k]].append(h)
                continue
            index[k] = len(out)
        out.append([h])
    return out


def batches(hosts: list, serial: str | int | None, key=lambda h: h.vars.get("server")) -> list[list]:
    us = units(hosts, key)
    per = parse_serial(serial, len(us))
    return [[h for u in us[i:i + per] for h in u] for i in range(0, len(us), per)]


def should_stop(failed: int, max_fail: int | None) -> bool:
    """--max-fail N: stop the roll once more than N hosts failed (None: never stop)."""
    return max_fail is not None and failed > max_fail
