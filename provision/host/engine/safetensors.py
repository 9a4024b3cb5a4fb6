"""The size a safetensors shard must have, from its first bytes.  STDLIB ONLY, pure.

A safetensors file is: 8 bytes (little-endian u64) N, then N bytes of JSON header mapping each
tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into the data that
follows the header; ``__metadata__`` is the only other key), then the data. So the whole file is
``8 + N + max(end)`` bytes, and a copy that stopped early (an interrupted download or rsync) is
shorter. :func:`header_length` needs the first 8 bytes, :func:`expected_size` the first 8 + N:
never the whole file.
"""

from __future__ import annotations

import json
import struct

# SGLang / safetensors refuse larger headers (the Rust crate's limit is 100 MB).
MAX_HEADER = 100 * 1024 * 1024


class ShardError(ValueError):
    """The shard's first bytes are not a safetensors header."""


def header_length(first8: bytes) -> int:
    if len(first8) < 8:
        raise ShardError(f"{len(first8)} bytes long: not even the 8-byte header length of a safetensors file")
    (n,) = struct.unpack("<Q", first8[:8])
    if n == 0 or n > MAX_HEADER:
        raise ShardError(f"its header length {n} is not that of a safetensors file")
    return n


def expected_size(head: bytes) -> int:
    """8 + header length + the end of the last tensor's data, from ``head`` = the file's first
    8 + header-length bytes (more is fine). ShardError when they are not a safetensors header."""
    n = header_length(head)
    if len(head) < 8 + n:
        raise ShardError(f"ends inside its {n}-byte header")
    try:
        header = json.loads(head[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ShardError(f"its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ShardError("its header is not a JSON object")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offs = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(x, int) and x >= 0 for x in offs)
                and offs[0] <= offs[1]):
            raise ShardError(f"tensor {name!r} has no valid data_offsets")
        end = max(end, offs[1])
    return 8 + n + end
