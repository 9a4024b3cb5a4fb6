"""The follow's probe on the host (provision/host/ops/server_probe.py): light, as it runs every poll."""

from __future__ import annotations

PROBE_IMPORTS = r"""
import json, sys
from provision.host import agent
ans = agent.dispatch(json.loads(sys.argv[1]), b"")
heavy = [m for m in ("provision.host.ops.server", "provision.host.ops.server_transaction",
                     "provision.host.ops.server_preflight", "provision.host.engine.serverargs", "urllib.request",
                     "concurrent.futures", "ast") if m in sys.modules]
print(json.dumps({"error": (ans.get("error") or {}).get("kind"), "heavy": heavy}))
"""


def test_a_follows_probe_imports_neither_the_restart_transaction_nor_the_engine_parser(tmp_path):
    """A follow runs the probe every second or two for a whole start-up, each in a fresh interpreter
    on the host: it loads the record's and the backend's readers, not the verbs that change a server
    (0.26 -> 0.16 s of CPU a poll once they were apart)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    req = {"op": "probe", "port": 30000, "offset": 0, "health_timeout": 2, "health_url": None, "confirm": 0,
           "install_path": None, "state_dir": str(tmp_path)}
    out = subprocess.run([sys.executable, "-S", "-c", PROBE_IMPORTS, json.dumps(req)], capture_output=True,
                         text=True, env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"error": "no-server", "heavy": []}, out.stdout
