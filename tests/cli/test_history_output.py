"""`provision history` where its output goes to a pipe: a reader that stops early (`| head -2`)
ends the output, not the command with exit 1 (which the help calls a bug), and `--format table`
is an aligned table in a pipe or a file too (issue 37, item 9)."""

from __future__ import annotations

import json
import os
import subprocess

from tests.cli.helpers import PROVISION

ENTRY = {"time": "2026-12-04T18:34:01+00:00", "host": "gpu01", "spec": "kimi-k25-eagle3", "command": "patch",
         "verdict": "patched", "file": "/x/kimi_k25.py", "sha256_before": "e80e1823aa", "sha256_after": "73e8631cbb",
         "user": "root", "control_host": "vm", "detail": "methods injected"}


def journal(tmp_path, n: int) -> dict:
    path = tmp_path / "journal.jsonl"
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps(dict(ENTRY, host=f"gpu{i % 7:02d}", detail=f"entry {i}")) + "\n")
    return dict(os.environ, PROVISION_JOURNAL=str(path))


def test_history_into_a_reader_that_stops_early_exits_0(tmp_path):
    env = journal(tmp_path, 20000)
    proc = subprocess.run(["bash", "-c", f'"{PROVISION}" history -n 0 | head -2; echo "rc=${{PIPESTATUS[0]}}"'],
                          capture_output=True, text=True, timeout=120, env=env)
    lines = proc.stdout.splitlines()
    assert lines[-1] == "rc=0", (proc.stdout, proc.stderr)
    assert len(lines) == 3 and lines[0].startswith("time  host"), proc.stdout
    assert "Traceback" not in proc.stderr and "Broken pipe" not in proc.stderr, proc.stderr


def test_history_table_is_aligned_in_a_pipe(tmp_path):
    env = journal(tmp_path, 12)
    proc = subprocess.run([PROVISION, "history", "--format", "table"], capture_output=True, text=True, timeout=60,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = lines[0]
    assert header.split()[:5] == ["time", "host", "spec", "command", "verdict"], header
    for col in ("host", "command", "verdict", "detail"):
        at = header.index(col)
        assert all(line[at - 2:at] == "  " and line[at] != " " for line in lines[1:]), (col, proc.stdout)
    assert all("entry" in line for line in lines[1:]) and len(lines) == 13
