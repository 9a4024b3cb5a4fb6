"""provision's state file on a host (state.json in the state dir).  STDLIB ONLY (a leaf)."""

from __future__ import annotations

import hashlib
import json
import os

STATE_NAME = "state.json"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def read_state(state_dir: str) -> dict:
    """{real file path: entry} from state.json; {} when absent or unreadable."""
    try:
        data = json.loads(read_bytes(os.path.join(state_dir, STATE_NAME)).decode("utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
