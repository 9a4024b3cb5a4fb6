"""Ansible's host ranges: `gpu[01:08]` (zero padding kept), `node-[a:c]`, `[0:10:2]` (a step),
as the INI and YAML readers and `-i a,b,` host lists take them. Pure."""

from __future__ import annotations

import itertools
import re
import string

from provision.errors import ConfigError


_RANGE = re.compile(r"\[([^\]:]+):([^\]:]+)(?::([^\]]+))?\]")


def expand_pattern(pattern: str, path: str = "<inventory>") -> list[str]:
    """Ansible host ranges: ``gpu[01:08]`` (zero padding kept), ``node-[a:c]``, ``[1:9:2]`` (a step). Pure."""
    parts = _RANGE.split(pattern)
    if len(parts) == 1:
        return [pattern]
    pieces: list[list[str]] = []
    for i in range(0, len(parts), 4):
        pieces.append([parts[i]])
        if i + 1 >= len(parts):
            break
        start, end, step = parts[i + 1], parts[i + 2], parts[i + 3]
        try:
            inc = int(step) if step else 1
        except ValueError:
            raise ConfigError(f"{path}: host range {pattern!r}: the step {step!r} is not a number") from None
        if inc < 1:
            raise ConfigError(f"{path}: host range {pattern!r}: the step must be at least 1")
        if start.isdigit() and end.isdigit():
            width = len(start) if start.startswith("0") and len(start) > 1 else 0
            lo, hi = int(start), int(end)
            values = [str(n).zfill(width) for n in range(lo, hi + 1, inc)]
        elif len(start) == 1 and len(end) == 1 and start.isalpha() and end.isalpha():
            letters = string.ascii_letters
            lo, hi = letters.index(start), letters.index(end)
            values = list(letters[lo:hi + 1:inc])
        else:
            raise ConfigError(f"{path}: host range {pattern!r}: expected [01:08] or [a:c], got [{start}:{end}]")
        if not values:
            raise ConfigError(f"{path}: host range {pattern!r}: the range is empty (start after end)")
        pieces.append(values)
    return ["".join(combo) for combo in itertools.product(*pieces)]
