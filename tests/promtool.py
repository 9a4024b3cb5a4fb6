"""Prometheus's own linter on the text provision writes: `promtool check metrics` (Debian's
prometheus package; .ci/run extracts the one binary to ~/.cache/provision-tools, nothing installed)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess

import pytest

# the user's real home: an ssh test's fixtures point HOME elsewhere
CACHED = os.path.join(pwd.getpwuid(os.getuid()).pw_dir, ".cache", "provision-tools", "promtool")


def promtool() -> str:
    found = shutil.which("promtool") or (CACHED if os.access(CACHED, os.X_OK) else None)
    if found is None:
        pytest.skip("promtool is not on this machine: .ci/run extracts it from Debian's prometheus package "
                    f"to {CACHED}")
    return found


def lint(text: str) -> str:
    """What `promtool check metrics` says of `text` ("" when clean); a failure is its own words."""
    p = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    said = (p.stdout + p.stderr).strip()
    return said if p.returncode or said else ""
