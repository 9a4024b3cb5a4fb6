"""Small safetensors checkpoints for the sandbox: real headers, tiny tensors.

A model folder as a hub download leaves it (config.json with its architectures,
model.safetensors.index.json, shards in the safetensors format), so preflight reads on a sandbox
host what it reads on a GPU host; only the tensors are a few bytes each.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path


def shard_bytes(tensors: list[tuple[str, int]], metadata: dict | None = None) -> bytes:
    """A safetensors file holding `tensors` ([(name, data bytes)], U8, 1-D, zero-filled)."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, n in tensors:
        header[name] = {"dtype": "U8", "shape": [n], "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes with spaces
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def write_checkpoint(folder: Path, architectures: list[str], shards: int, tensor_bytes: int = 16,
                     extra_config: dict | None = None) -> list[Path]:
    """config.json, model.safetensors.index.json and `shards` shards of one tensor each."""
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    weight_map = {f"layers.{i}.weight": name for i, name in enumerate(names)}
    paths = []
    for i, name in enumerate(names):
        p = folder / name
        p.write_bytes(shard_bytes([(f"layers.{i}.weight", tensor_bytes)], {"format": "pt"}))
        paths.append(p)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": tensor_bytes * shards}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({"architectures": architectures, **(extra_config or {})}))
    return paths
