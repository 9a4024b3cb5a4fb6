"""`provision audit` and `provision spec new` over a real sshd host with SGLang 0.5.9.

`spec new` then `patch` must close the gap for three wrappers, one of which holds its
inner model in another attribute (`llm`), and the patched classes must really delegate.
"""

from __future__ import annotations

import os

import pytest
import yaml

from tests.cli.helpers import run, run_json
import sys
import types

from tests.engine.test_delegation import Recorder, stub_imports  # noqa: F401 - fixture


def load(source: bytes, name: str) -> types.ModuleType:
    """Execute a patched model file (heavy imports stubbed) as the module SGLang would import."""
    mod = types.ModuleType(name)
    mod.__file__ = name.rsplit(".", 1)[-1] + ".py"
    sys.modules[name] = mod  # dataclasses and friends look the module up while it executes
    try:
        exec(compile(source, mod.__file__, "exec"), mod.__dict__)
    finally:
        sys.modules.pop(name, None)
    return mod

WRAPPERS = [  # class, file, delegate attribute
    ("KimiVLForConditionalGeneration", "srt/models/kimi_vl.py", "language_model"),
    ("LlavaQwenForCausalLM", "srt/models/llava.py", "language_model"),
    ("NVILAForConditionalGeneration", "srt/models/nvila.py", "llm"),
]


@pytest.fixture(scope="module")
def ahost(sandbox_factory):
    host = sandbox_factory.host("audit1", sglang="0.5.9", layout="venv")
    yield host
    sandbox_factory.remove(host)


def gaps(doc):
    return {g["class"]: g for g in doc["hosts"][0]["data"]["gaps"]}


def test_audit_spec_new_and_patch_close_three_gaps(ahost, ssh_env, tmp_path, stub_imports):  # noqa: F811
    ahost.reset()
    proc, doc = run_json("audit", *ssh_env.cli_args, "--host", ahost.name)
    assert proc.returncode == 6, "uncovered fixable gaps exist in 0.5.9"
    g = gaps(doc)
    assert g["KimiK25ForConditionalGeneration"]["covered_by"] == "kimi-k25-eagle3"
    assert g["DeepseekVL2ForCausalLM"]["verdict"] == "conditional"
    assert g["Sarashina2VisionForCausalLM"]["verdict"] == "needs-more"
    assert "Llama4ForConditionalGeneration" not in g
    for cls, _, attr in WRAPPERS:
        assert g[cls]["verdict"] == "fixable" and g[cls]["attr"] == attr

    table = run("audit", *ssh_env.cli_args, "--host", ahost.name)
    assert table.returncode == 6 and "NVILAForConditionalGeneration" in table.stdout

    refused = run("spec", "new", "Sarashina2VisionForCausalLM", *ssh_env.cli_args, "--host", ahost.name)
    assert refused.returncode == 2 and refused.stdout == ""

    site = ahost.site_packages
    for cls, rel, attr in WRAPPERS:
        out = run("spec", "new", cls, *ssh_env.cli_args, "--host", ahost.name, check_rc=0)
        spec_path = tmp_path / f"{cls}.yaml"
        spec_path.write_text(out.stdout)
        spec = yaml.safe_load(out.stdout)["patch"]
        assert (spec["class"], spec["file"], spec["delegate"]) == (cls, rel, attr)
        proc, doc = run_json("patch", *ssh_env.cli_args, "--host", ahost.name, "--playbook", str(spec_path))
        assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "patched", doc

        # the patched class really delegates to whatever the attribute holds
        source = ahost.hostpath(os.path.join(site, "sglang", rel)).read_bytes()
        mod = load(source, name="sglang." + rel[:-3].replace("/", "."))
        obj = object.__new__(getattr(mod, cls))
        inner = Recorder()
        setattr(obj, attr, inner)
        assert obj.set_eagle3_layers_to_capture([1, 2]) == ("captured", [1, 2])
        assert obj.get_embed_and_head() == (inner.embed, inner.head)
        assert inner.calls[:2] == [("set_eagle3_layers_to_capture", [1, 2]), ("get_embed_and_head",)]

    proc, doc = run_json("audit", *ssh_env.cli_args, "--host", ahost.name)
    g = gaps(doc)
    # Kimi-VL has a shipped spec, so the audit shows it as closed by that spec; the others vanish.
    assert (g["KimiVLForConditionalGeneration"]["verdict"], g["KimiVLForConditionalGeneration"]["patch_state"]) \
        == ("closed", "patched")
    for cls, _, _ in WRAPPERS[1:]:
        assert cls not in g, f"{cls} should no longer be a gap after its spec was applied"
