"""The typed protocol catches a misspelt answer key, in both ways the control side reads one.

mypy alone flags ``answer["key"]`` but not ``answer.get("key")``; .ci/mypy_typeddict_get.py
(enabled in pyproject.toml) closes that gap. This runs mypy with the project's configuration
on a reader that misspells a key, the way ``status`` once read ``matches_spec``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

READER = '''
from provision.host.protocol import LogsAnswer, ProbeAnswer

def read(ans: LogsAnswer, p: ProbeAnswer) -> None:
    print(ans["text"], ans.get("offset"), p.get("chunk"))      # right
    print(ans.get("txet"))                                     # misspelt, read with .get
    print(p["port_opened"])                                    # misspelt, read as a subscript
'''


def test_mypy_flags_misspelt_keys_read_with_get_and_with_subscripts(tmp_path):
    reader = tmp_path / "reader.py"
    reader.write_text(READER)
    env = dict(os.environ, MYPYPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
                           "--cache-dir", str(tmp_path / "cache"), str(reader)],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert 'reader.py:6: error: TypedDict "LogsAnswer" has no key "txet"' in out
    assert 'reader.py:7: error: TypedDict "ProbeAnswer" has no key "port_opened"' in out
    assert "reader.py:5" not in out
