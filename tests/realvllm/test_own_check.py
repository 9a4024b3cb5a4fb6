"""vLLM's own verdict on an interface patch: `provision patch --local` on a private copy of vLLM
0.32's package (the real-vLLM tier's venv left untouched), then a fresh interpreter imports the
patched module and asks vLLM's own `supports_eagle3` (interfaces.py), which counts the protocol's
members. False before the patch, True after, and the members reach the inner model; `unpatch` gives
the release's bytes back and vLLM says False again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MODULE = "model_executor/models/kimi_vl.py"

# Run in the venv's interpreter with the private copy first on sys.path. The inner model is a
# stand-in object with the two methods (the test asks whether the wrapper delegates to whatever it
# holds); the verdict is vLLM's own function on the real class.
OWN_CHECK = r'''
import json, sys
import torch.nn as nn
import vllm
from vllm.model_executor.models.interfaces import supports_eagle3
from vllm.model_executor.models.kimi_vl import KimiVLForConditionalGeneration as C
out = {"vllm": vllm.__file__, "module": sys.modules[C.__module__].__file__, "class": supports_eagle3(C)}
if out["class"]:
    class Inner:
        calls = []
        def set_aux_hidden_state_layers(self, layers):
            self.calls.append(list(layers))
        def get_eagle3_default_aux_hidden_state_layers(self):
            return (1, 2, 3)
    obj = C.__new__(C)
    nn.Module.__init__(obj)
    obj.language_model = Inner()
    obj.set_aux_hidden_state_layers((0, 1))
    out["instance"] = supports_eagle3(obj)
    out["set"] = Inner.calls
    out["default"] = list(obj.get_eagle3_default_aux_hidden_state_layers())
print("RESULT " + json.dumps(out))
'''


def _private_copy(site: Path, root: Path) -> Path:
    """root/vllm: links to every entry of the venv's package, except the directories down to the
    patched module (real ones) and the module itself (a copy), plus the dist-info (its version)."""
    keep = MODULE.split("/")
    pkg = root / "vllm"

    def mirror(src: Path, dst: Path, depth: int) -> None:
        dst.mkdir(parents=True)
        for entry in src.iterdir():
            if entry.name == keep[depth] and depth < len(keep) - 1:
                mirror(entry, dst / entry.name, depth + 1)
            elif entry.name == keep[depth]:
                (dst / entry.name).write_bytes(entry.read_bytes())
            else:
                (dst / entry.name).symlink_to(entry)

    mirror(site / "vllm", pkg, 0)
    for info in site.glob("vllm*.dist-info"):
        (root / info.name).symlink_to(info)
    return pkg


def _vllm_says(venv: Path, root: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root), VLLM_CACHE_ROOT=str(root / ".cache"), HOME=str(root))
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", OWN_CHECK], capture_output=True, text=True,
                          timeout=300, cwd=str(root), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT "):])
    assert out["module"] == str(root / "vllm" / MODULE), out  # the private copy was imported
    return out


def _provision(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "provision", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(600)
def test_vllm_own_supports_eagle3_is_false_before_and_true_after_patch_local(vllm_venv, tmp_path):
    site = next(vllm_venv.glob("lib/python3*/site-packages"))
    root = tmp_path / "private"
    root.mkdir(mode=0o755)
    pkg = _private_copy(site, root)
    original = (pkg / MODULE).read_bytes()
    common = ["--local", "--playbook", "kimi-vl-eagle3-vllm", "--sglang-path", str(pkg),
              "--python", str(vllm_venv / "bin" / "python"), "--state-dir", str(tmp_path / "state")]

    assert _vllm_says(vllm_venv, root) == {"vllm": str(pkg / "__init__.py"), "module": str(pkg / MODULE), "class": False}

    done = _provision("patch", *common)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "patched" in done.stdout and "vllm 0.32.0" in done.stdout, done.stdout
    after = _vllm_says(vllm_venv, root)
    assert after["class"] is True and after["instance"] is True, after
    assert after["set"] == [[0, 1]] and after["default"] == [1, 2, 3], after
    # the venv's own copy was never touched
    assert (site / "vllm" / MODULE).read_bytes() == original

    again = _provision("patch", *common, "--check")
    assert again.returncode == 0 and "unchanged" in again.stdout, again.stdout + again.stderr

    gone = _provision("unpatch", *common)
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert (pkg / MODULE).read_bytes() == original
    assert _vllm_says(vllm_venv, root)["class"] is False
