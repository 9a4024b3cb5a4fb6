"""Overlay mode for vLLM, the pure parts and the staging on real releases' files: a general plugin
(its entry point in a dist-info beside the package, register() pointing each architecture at the
subclass) and a replace spec's method bound in place. The real server that starts on it is in
tests/realvllm/test_realvllm_eagle3.py."""

from __future__ import annotations

import ast
import configparser
import json

import pytest

from provision.config.playbook import load_patch_spec
from provision.host import inference
from provision.host.engine import overlay as render
from provision.host.engine.spec import EngineError
from provision.host.ops import overlay
from provision.tasks.patch import overlay_state

VLLM = inference.get("vllm")


def spec(name: str) -> dict:
    return load_patch_spec(name).to_engine()


def _vllm(version: str):
    from provision.sandbox.vllm_sources import SourceUnavailable, package_dir
    try:
        return package_dir(version)
    except SourceUnavailable as exc:  # pragma: no cover - depends on the registry
        pytest.skip(f"vLLM {version} sources unavailable: {exc}")


def inst_of(version: str) -> dict:
    return {"path": str(_vllm(version)), "version": version, "engine": "vllm", "interpreters": [],
            "kind": "source", "pythonpath": str(_vllm(version).parent)}


@pytest.mark.parametrize("version, refused", [("0.15.1", True), ("0.10.0", True), (None, True), ("main", True),
                                              ("0.16.0", False), ("0.32.0", False), ("0.34.0", False)])
def test_vllm_releases_before_the_ones_read_or_unknown_are_refused(version, refused):
    why = render.refusal_for_version(version, VLLM)
    assert (why is not None) == refused, why
    if refused:
        assert "vLLM 0.16.0 or later" in why and "provision patch" in why


@pytest.mark.parametrize("name, expected", [
    ("qwen2-audio-eagle3-vllm", True),     # interface: a subclass
    ("qwen2-audio-proposer-vllm", True),   # replace in Class.method: bound in place
    ("kimi-vl-proposer-vllm", True),
    ("kimi-k25-allow-list-vllm", False),   # a value in a list: neither
    ("kimi-k25-eagle3", True),             # SGLang's delegation
])
def test_what_can_be_an_overlay(name, expected):
    assert render.is_overlayable(spec(name)) is expected


def test_a_replace_outside_one_method_or_of_sglang_is_not_an_overlay():
    s = spec("qwen2-audio-proposer-vllm")
    assert not render.is_overlayable(dict(s, scope="SpecDecodeBaseProposer"))      # a class: not one method
    assert not render.is_overlayable(dict(s, scope="load_model"))                  # a module-level function
    assert not render.is_overlayable(dict(s, package="sglang"))                    # SGLang imports modules, runs none
    assert not render.is_overlayable(dict(s, package="flashinfer"))


def test_the_environment_marks_the_server_and_adds_the_plugin_only_to_a_list_the_profile_sets():
    assert render.server_env("/o", "/a", VLLM) == {"PROVISION_OVERLAY": "provision_overlay", "PYTHONPATH": "/o:/a"}
    assert render.server_env("/o", None, VLLM, plugins="acme")["VLLM_PLUGINS"] == "acme,provision_overlay"
    assert render.server_env("/o", None, VLLM, plugins="")["VLLM_PLUGINS"] == "provision_overlay"
    assert render.server_env("/o", None, VLLM, plugins="provision_overlay,acme")["VLLM_PLUGINS"] == \
        "provision_overlay,acme"
    assert render.refusal_for_env({"VLLM_PLUGINS": "acme"}, VLLM) is None
    assert render.fix_in_use({"PROVISION_OVERLAY": "provision_overlay"}, {"a": "missing"}, False, VLLM) == "overlay"
    assert render.fix_in_use({"SGLANG_EXTERNAL_MODEL_PACKAGE": "provision_overlay"}, {"a": "missing"}, False,
                             VLLM) == "none"


def test_the_package_is_a_general_plugin_that_registers_the_subclass_under_its_architectures():
    files = render.render_package({"m": "class X: pass\n"}, VLLM, {"m": {"ArchA": "X", "ArchB": "X"}}, [])
    ep = configparser.ConfigParser()
    ep.read_string(files["provision_overlay-0.1.dist-info/entry_points.txt"])
    assert dict(ep["vllm.general_plugins"]) == {"provision_overlay": "provision_overlay:register"}
    assert "Name: provision_overlay" in files["provision_overlay-0.1.dist-info/METADATA"]
    init = files["provision_overlay/__init__.py"]
    ns: dict = {}
    exec(compile(init, "__init__", "exec"), ns)
    assert ns["ARCHITECTURES"] == {"ArchA": "provision_overlay.m:X", "ArchB": "provision_overlay.m:X"}
    assert ns["METHODS"] == [] and callable(ns["register"])
    # SGLang's package has no dist-info (it imports the package by name)
    assert set(render.render_package({"m": "x = 1\n"}, "sglang")) == {"provision_overlay/__init__.py", "provision_overlay/m.py"}


def test_a_method_that_needs_its_class_body_is_refused_by_name():
    base = {"name": "t", "kind": "replace", "package": "vllm", "file": "m.py", "scope": "C.f", "find": "a", "replace": "b"}
    for deco, body, says in (("", "super().f()", "super() without arguments"), ("", "__class__", "__class__"),
                             ("", "self.__x", "private name __x"),
                             ("@model_validator(mode='after')\n    ", "self", "decorator @model_validator")):
        text = f"class C(B):\n    {deco}def f(self):\n        return {body}\n"
        with pytest.raises(EngineError) as exc:
            render.render_rebind(base, text, "0.32.0", VLLM)
        assert says in str(exc.value) and "`provision patch` edits the file instead" in str(exc.value)
    ok = render.render_rebind(base, "class C(B):\n    @staticmethod\n    def f(x):\n        return super(C, x)\n",
                              "0.32.0", VLLM)
    ns: dict = {}
    exec(compile(ok, "m", "exec"), ns)
    assert ns["SOURCE"] == "@staticmethod\ndef f(x):\n    return super(C, x)\n"
    assert (ns["MODULE"], ns["CLASS"], ns["METHOD"]) == ("vllm.m", "C", "f")


def test_staged_on_032_the_interface_subclass_and_the_proposers_method_as_the_spec_leaves_it(tmp_path):
    inst = inst_of("0.32.0")
    specs = [spec("qwen2-audio-eagle3-vllm"), spec("qwen2-audio-proposer-vllm")]
    st = overlay.stage(inst, specs, str(tmp_path))
    assert st["verdict"] == "staged", st.get("error")
    root = st["root"]
    sub = (tmp_path / root / "provision_overlay" / "qwen2_audio_eagle3_vllm.py").read_text()
    cls = next(n for n in ast.parse(sub).body if isinstance(n, ast.ClassDef))
    assert cls.name == "Qwen2AudioForConditionalGeneration" and "EntryClass" not in sub
    assert [n.name for n in cls.body if isinstance(n, ast.FunctionDef)] == [
        "set_aux_hidden_state_layers", "get_eagle3_default_aux_hidden_state_layers"]
    ns: dict = {}
    exec(compile((tmp_path / root / "provision_overlay" / "qwen2_audio_proposer_vllm.py").read_text(), "p", "exec"), ns)
    method = ast.parse(ns["SOURCE"]).body[0]
    assert method.name == "load_model" and 'target_model.config.audio_token_index' in ns["SOURCE"]
    init: dict = {}
    exec(compile((tmp_path / root / "provision_overlay" / "__init__.py").read_text(), "i", "exec"), init)
    assert init["ARCHITECTURES"] == {"Qwen2AudioForConditionalGeneration":
                                     "provision_overlay.qwen2_audio_eagle3_vllm:Qwen2AudioForConditionalGeneration"}
    assert init["METHODS"] == ["provision_overlay.qwen2_audio_proposer_vllm"]
    assert st["env"]["PROVISION_OVERLAY"] == "provision_overlay" and st["env"]["PYTHONPATH"].startswith(root)
    # the installed files are the release's; again: unchanged; status per spec: current, and counted
    assert overlay.stage(inst, specs, str(tmp_path))["verdict"] == "unchanged"
    for s in specs:
        ov = overlay.status(inst, [s], str(tmp_path))
        assert ov["current"] and [r["spec"] for r in ov["specs"]] == [s["name"]], ov
    methods = {"replace in SpecDecodeBaseProposer.load_model": "missing"}
    verdict, why, _ = overlay_state("missing", "", methods, overlay.status(inst, [specs[1]], str(tmp_path)))
    assert verdict == "overlay" and "vLLM loads it as its general plugin provision_overlay" in why
    manifest = json.loads((tmp_path / root / "manifest.json").read_text())
    assert [d["name"] for d in manifest["spec_docs"]] == [s["name"] for s in specs]


def test_on_034_the_interface_is_planned_from_that_releases_protocol(tmp_path):
    inst = inst_of("0.34.0")
    p = overlay.plan(inst, [spec("qwen2-audio-eagle3-vllm")])
    assert list(p["modules"]) == ["qwen2_audio_eagle3_vllm"] and not p["errors"], p
