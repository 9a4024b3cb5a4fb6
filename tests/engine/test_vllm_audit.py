"""The vLLM audit on the real releases' files (0.16-0.34, cached by .ci/run): every class that lacks a
member of the release's own SupportsEagle3 while the model it holds has them all, and a spec from
`spec new` that closes each such gap on the file it names."""

from __future__ import annotations

import ast
import functools

import pytest

from provision.host import inference
from provision.host.engine import core
from provision.host.engine.audit_vllm import audit_registry
from provision.host.lib.modules import make_resolver
from provision.tasks.spec_new import spec_for, spec_yaml

PROTOCOL = inference.get("vllm").eagle3_protocol
# the fixable count per release, as the closing note of issue 44 and docs/patching.md give them
FIXABLE = {"0.16.0": 28, "0.17.0": 30, "0.18.0": 31, "0.32.0": 31, "0.34.0": 28}


def _vllm(version: str):
    from provision.sandbox.vllm_sources import SourceUnavailable, package_dir
    try:
        return package_dir(version)
    except SourceUnavailable as exc:  # pragma: no cover - depends on the registry
        pytest.skip(f"vLLM {version} sources unavailable: {exc}")


@functools.lru_cache(maxsize=None)
def _audit(version: str) -> dict:
    return audit_registry(str(_vllm(version)), PROTOCOL)


def _fixable(version: str) -> dict:
    return {w["class"]: w for w in _audit(version)["wrappers"] if w["verdict"] == "fixable"}


@pytest.mark.parametrize("version", ["0.32.0", "0.34.0"])
def test_kimi_vl_is_a_fixable_gap_and_kimi_k25_is_not_on_032_and_034(version):
    fixable = _fixable(version)
    assert "KimiVLForConditionalGeneration" in fixable
    kimi_vl = fixable["KimiVLForConditionalGeneration"]
    assert kimi_vl["attr"] == "language_model" and kimi_vl["inner"] == ["DeepseekV2ForCausalLM"]
    assert "get_eagle3_default_aux_hidden_state_layers" in kimi_vl["missing"]
    assert {"Qwen2VLForConditionalGeneration", "Qwen2AudioForConditionalGeneration", "Phi3VForCausalLM",
            "MiniCPMV2_6", "MiniCPMV4_5"} <= set(fixable)
    assert all(w["class"] != "KimiK25ForConditionalGeneration" for w in _audit(version)["wrappers"])


@pytest.mark.parametrize("version", ["0.16.0", "0.17.0"])
def test_before_018_kimi_vls_inner_model_lacks_the_interface_too_so_it_is_no_delegation_gap(version):
    assert "KimiVLForConditionalGeneration" not in _fixable(version)
    assert "Qwen2VLForConditionalGeneration" in _fixable(version)


@pytest.mark.parametrize("version", sorted(FIXABLE))
def test_the_fixable_count_per_release(version):
    assert len(_fixable(version)) == FIXABLE[version], sorted(_fixable(version))


@pytest.mark.parametrize("version", ["0.32.0", "0.34.0"])
def test_the_spec_spec_new_writes_closes_every_fixable_gap_on_its_file(version):
    from provision.config.playbook import parse_playbook

    d = _vllm(version)
    resolve = make_resolver(str(d), "vllm")
    for cls, gap in sorted(_fixable(version).items()):
        spec = parse_playbook(spec_yaml(spec_for(gap), "test"), "<generated>").patch.to_engine()
        assert spec["kind"] == "interface" and spec["package"] == "vllm"
        src = (d / gap["file"]).read_bytes()
        plan = core.plan_patch(src, spec, resolve)
        assert plan["verdict"] == "patched", (cls, plan["error"])
        assert plan["added"] == gap["missing"], cls
        body = next(n for n in ast.parse(plan["new"]).body if isinstance(n, ast.ClassDef) and n.name == cls).body
        bound = {t.id for st in body if isinstance(st, ast.Assign) for t in st.targets if isinstance(t, ast.Name)}
        bound |= {st.name for st in body if isinstance(st, ast.FunctionDef)}
        assert set(gap["missing"]) <= bound, cls
        assert core.plan_unpatch(plan["new"], spec)["new"] == src


def _tree_with_fifo(tmp_path, rel: str):
    """The 0.32.0 package as symlinks to the cached files, `rel` a FIFO (no writer: a read blocks)."""
    import os
    import shutil

    dest = tmp_path / "vllm"
    shutil.copytree(_vllm("0.32.0"), dest, copy_function=os.symlink)
    target = dest / rel
    target.unlink()
    os.mkfifo(target)
    return dest


@pytest.mark.parametrize("rel, says", [
    ("model_executor/models/registry.py", "registry.py cannot be read ("),
    ("model_executor/models/kimi_vl.py", "kimi_vl.py is not a regular file"),
])
def test_an_install_it_cannot_read_is_not_judged_and_nothing_blocks(tmp_path, rel, says):
    """Issue 60: a registry or a model file that cannot be read (here a FIFO, which would block the
    host agent until its timeout) is an error naming the file, never a clean bill."""
    import signal

    tree = _tree_with_fifo(tmp_path, rel)
    signal.alarm(60)  # a blocked read fails the test instead of hanging it
    try:
        got = audit_registry(str(tree), PROTOCOL)
    finally:
        signal.alarm(0)
    assert got["wrappers"] == [] and got["error"]["kind"] == "unreadable", got
    assert says in got["error"]["message"] and "judges no install it cannot read" in got["error"]["message"], got


def test_the_classes_whose_proposer_reads_image_token_index_are_marked_on_032_only():
    """issue 64: vLLM 0.32's EAGLE proposer reads config.image_token_index of every multimodal class it
    does not name; a class spec new writes the interface for may also need the proposer fix. The audit
    marks exactly those rows, on the release whose proposer has that fallback (0.34 rewrote it)."""
    from provision.tasks.spec_new import proposer_note

    rows32 = {r["class"]: r for r in _audit("0.32.0")["wrappers"]}
    assert rows32["Qwen2AudioForConditionalGeneration"].get("proposer") == "v1/spec_decode/llm_base_proposer.py"
    for version in ("0.18.0", "0.34.0"):
        assert not [r["class"] for r in _audit(version)["wrappers"] if r.get("proposer")], version
    note = proposer_note("Qwen2AudioForConditionalGeneration", "v1/spec_decode/llm_base_proposer.py", "vLLM 0.32.0",
                         "qwen2-audio-eagle3-vllm")
    assert "qwen2-audio-proposer-vllm" in note and "--playbook qwen2-audio-eagle3-vllm" in note, note
    note = proposer_note("Qwen2VLForConditionalGeneration", "v1/spec_decode/llm_base_proposer.py", "vLLM 0.32.0",
                         "qwen2-vl-eagle3-vllm")
    assert "AttributeError" in note and "replace" in note and "qwen2-audio-proposer-vllm" in note, note
