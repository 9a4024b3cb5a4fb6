"""The interface kind on real vLLM releases' files (0.16, 0.17, 0.18, 0.32, 0.34: their source
archives' .py files, cached by .ci/run, never copied here): the members come from the release's own
SupportsEagle3, named as that release names them; missing where the gap is, native where upstream
fixed it; patch, a second patch (unchanged), unpatch (the original bytes)."""

from __future__ import annotations

import ast

import pytest

from provision.host.engine import core
from provision.host.lib.modules import make_resolver

VERSIONS = ("0.16.0", "0.17.0", "0.18.0", "0.32.0", "0.34.0")
PROTOCOL = "model_executor/models/interfaces.py:SupportsEagle3"


def _spec(cls: str, file: str, name: str = "x-eagle3-vllm") -> dict:
    return {"name": name, "kind": "interface", "package": "vllm", "file": file, "class": cls,
            "delegate": "language_model", "protocol": PROTOCOL}


KIMI_K25 = _spec("KimiK25ForConditionalGeneration", "model_executor/models/kimi_k25.py", "kimi-k25-eagle3-vllm")
KIMI_VL = _spec("KimiVLForConditionalGeneration", "model_executor/models/kimi_vl.py", "kimi-vl-eagle3-vllm")


def _vllm(version: str):
    from provision.sandbox.vllm_sources import SourceUnavailable, package_dir
    try:
        return package_dir(version)
    except SourceUnavailable as exc:  # pragma: no cover - depends on the registry
        pytest.skip(f"vLLM {version} sources unavailable: {exc}")


def _plan(version: str, spec: dict):
    d = _vllm(version)
    src = (d / spec["file"]).read_bytes()
    return src, core.plan_patch(src, spec, make_resolver(str(d), "vllm")), make_resolver(str(d), "vllm")


def _class_members(new: bytes, cls: str) -> dict:
    tree = ast.parse(new)
    c = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    out = {}
    for st in c.body:
        if isinstance(st, ast.FunctionDef):
            out[st.name] = st
        elif isinstance(st, ast.Assign) and isinstance(st.targets[0], ast.Name):
            out[st.targets[0].id] = st
    return out


@pytest.mark.parametrize("version,default_layers", [("0.16.0", "get_eagle3_aux_hidden_state_layers"),
                                                    ("0.17.0", "get_eagle3_aux_hidden_state_layers")])
def test_kimi_k25_lacks_the_interface_on_016_and_017_and_gets_it_named_as_the_release_names_it(version, default_layers):
    src, plan, resolve = _plan(version, KIMI_K25)
    assert plan["verdict"] == "patched", plan
    assert plan["added"] == ["supports_eagle3", "has_own_lm_head", "has_own_embed_tokens",
                             "set_aux_hidden_state_layers", default_layers]
    members = _class_members(plan["new"], "KimiK25ForConditionalGeneration")
    assert ast.unparse(members["supports_eagle3"].value) == "True"
    for name in ("set_aux_hidden_state_layers", default_layers):
        body = ast.unparse(members[name])
        assert "inner = self.language_model" in body and f"inner.{name}(" in body
    # the second run changes nothing; unpatch gives back the release's bytes
    again = core.plan_patch(plan["new"], KIMI_K25, resolve)
    assert again["verdict"] == "unchanged" and again["new"] is None
    back = core.plan_unpatch(plan["new"], KIMI_K25)
    assert back["verdict"] == "unpatched" and back["new"] == src
    assert core.check_structure(plan["new"], KIMI_K25, resolve) == []
    # every other byte is the release's: the file is the original plus one block inside the class
    assert plan["new"].startswith(src[: src.index(b"    def load_weights")])


@pytest.mark.parametrize("version", ["0.18.0", "0.32.0", "0.34.0"])
def test_kimi_k25_is_native_from_018(version):
    src, plan, _ = _plan(version, KIMI_K25)
    assert plan["verdict"] == "native" and plan["new"] is None, plan
    assert "set_aux_hidden_state_layers" in plan["native"]


@pytest.mark.parametrize("version", ["0.32.0", "0.34.0"])
def test_kimi_vl_still_lacks_it_on_032_and_034_under_the_renamed_default_layers_method(version):
    src, plan, resolve = _plan(version, KIMI_VL)
    assert plan["verdict"] == "patched", plan
    assert "get_eagle3_default_aux_hidden_state_layers" in plan["added"]
    assert "get_eagle3_aux_hidden_state_layers" not in plan["added"]
    info = core.inspect(src, KIMI_VL, resolve)
    assert info["planned_verdict"] == "patched"
    assert info["methods"]["supports_eagle3"] == "missing"
    after = core.inspect(plan["new"], KIMI_VL, resolve)
    assert set(after["methods"].values()) == {"ours"} and after["block"]["matches"] is True
    assert core.plan_unpatch(plan["new"], KIMI_VL)["new"] == src


def test_a_protocol_the_release_does_not_declare_is_refused_with_a_sentence():
    spec = dict(KIMI_VL, protocol="model_executor/models/interfaces.py:SupportsEagle9")
    _, plan, _ = _plan("0.32.0", spec)
    assert plan["verdict"] == "failed" and plan["error"]["kind"] == "protocol-missing"
    assert "SupportsEagle9" in plan["error"]["message"]


def test_without_the_release_to_read_the_protocol_from_nothing_is_guessed():
    d = _vllm("0.32.0")
    plan = core.plan_patch((d / KIMI_VL["file"]).read_bytes(), KIMI_VL, None)
    assert plan["error"]["kind"] == "protocol-missing"


# ---------------------------------------------------------------- the allow-list (list-entry)

ALLOW = {"name": "kimi-k25-allow-list-vllm", "kind": "list-entry", "package": "vllm", "file": "config/speculative.py",
         "scope": "SpeculativeConfig._verify_args", "list": ["eagle3_target_supported", "aux_hidden_states_supported"],
         "value": '"kimi_k2"'}


def _allow_list(text: bytes) -> list:
    tree = ast.parse(text)
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) \
                and n.targets[0].id in ALLOW["list"]:
            return ast.literal_eval(n.value)
    return []


@pytest.mark.parametrize("version,name", [("0.16.0", "eagle3_target_supported"), ("0.17.0", "aux_hidden_states_supported")])
def test_the_allow_list_gets_the_entry_under_the_name_each_release_gave_it(version, name):
    src = (_vllm(version) / ALLOW["file"]).read_bytes()
    assert "kimi_k2" not in _allow_list(src)
    plan = core.plan_patch(src, ALLOW)
    assert plan["verdict"] == "patched", plan
    assert _allow_list(plan["new"]) == _allow_list(src) + ["kimi_k2"]
    assert f"{name} = [" in plan["new"].decode()
    assert core.plan_patch(plan["new"], ALLOW)["verdict"] == "unchanged"
    assert core.check_structure(plan["new"], ALLOW) == []
    back = core.plan_unpatch(plan["new"], ALLOW)
    assert back["verdict"] == "unpatched" and back["new"] == src


def test_the_allow_list_has_it_from_018():
    plan = core.plan_patch((_vllm("0.18.0") / ALLOW["file"]).read_bytes(), ALLOW)
    assert plan["verdict"] == "native" and plan["new"] is None


@pytest.mark.parametrize("version", ["0.32.0", "0.34.0"])
def test_a_release_without_the_allow_list_is_said_not_guessed(version):
    plan = core.plan_patch((_vllm(version) / ALLOW["file"]).read_bytes(), ALLOW)
    assert plan["error"]["kind"] == "mapping-missing"
    assert "eagle3_target_supported or aux_hidden_states_supported" in plan["error"]["message"]


def test_list_entry_keeps_every_byte_adds_the_comma_it_needs_and_takes_it_out_again():
    src = b"def f():\n    xs = (\r\n        'a',\r\n        'b'  # last\r\n    )\r\n    return xs\n"
    spec = {"name": "t", "kind": "list-entry", "file": "m.py", "scope": "f", "list": "xs", "value": "'c'"}
    plan = core.plan_patch(src, spec)
    assert plan["verdict"] == "patched", plan
    ns: dict = {}
    exec(plan["new"].decode(), ns)
    assert ns["f"]() == ("a", "b", "c")
    assert b"'b',  # last\r\n" in plan["new"] and b"        'c',\r\n" in plan["new"]
    assert core.plan_unpatch(plan["new"], spec)["new"] == src
    bad = dict(spec, value="some_name")
    with pytest.raises(Exception):
        from provision.host.engine.spec import validate_spec
        validate_spec(bad)


# ---------------------------------------------------------------- the shipped vLLM specs, per release

P, N, NA = "patched", "native", "not-applicable"
SHIPPED = {  # spec -> its verdict on 0.16, 0.17, 0.18, 0.32, 0.34 (patched: the gap is there)
    "kimi-k25-eagle3-vllm": (P, P, N, N, N),
    "kimi-k25-allow-list-vllm": (P, P, N, NA, NA),
    "kimi-vl-eagle3-vllm": (NA, NA, P, P, P),
    "kimi-vl-proposer-vllm": (NA, NA, NA, P, NA),
    "qwen2-audio-eagle3-vllm": (P, P, P, P, P),
    "qwen2-audio-proposer-vllm": (NA, NA, NA, P, NA),
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_each_shipped_vllm_spec_is_missing_where_the_gap_is_and_native_where_upstream_fixed_it(name):
    from packaging.specifiers import SpecifierSet

    from provision.config.playbook import load_playbook

    spec = load_playbook(name).patch.to_engine()
    assert spec["package"] == "vllm" and "vllm" in spec["applies"]
    got = []
    for version in VERSIONS:
        if version not in SpecifierSet(spec["applies"]["vllm"]):
            got.append(NA)
            continue
        d = _vllm(version)
        src = (d / spec["file"]).read_bytes()
        plan = core.plan_patch(src, spec, make_resolver(str(d), "vllm"))
        got.append(plan["verdict"])
        if plan["new"] is not None:
            assert core.plan_patch(plan["new"], spec, make_resolver(str(d), "vllm"))["verdict"] == "unchanged"
            assert core.plan_unpatch(plan["new"], spec)["new"] == src
    assert tuple(got) == SHIPPED[name], dict(zip(VERSIONS, got))
