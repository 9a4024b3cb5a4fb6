"""Patch specs: validated on load, errors name the file and the field."""

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from provision.errors import ConfigError
from provision.config.playbook import load_patch_spec, load_playbook, parse_playbook

GOOD = """
name: demo-eagle3
patch:
  file: srt/models/demo.py
  class: DemoForCausalLM
  delegate: llm
  methods:
    - {name: get_embed_and_head, params: self}
"""


def test_shipped_playbooks_load():
    spec = load_patch_spec(None)
    assert spec.cls == "KimiK25ForConditionalGeneration"
    assert [m.name for m in spec.methods] == ["set_eagle3_layers_to_capture", "get_embed_and_head",
                                              "set_embed_and_head"]
    assert spec.methods[0].params == "self, layer_ids=None"
    assert load_patch_spec("kimi-vl-eagle3").cls == "KimiVLForConditionalGeneration"
    assert load_playbook(None).launch["args"]["speculative-algorithm"] == "EAGLE3"


def test_good_spec_round_trips_to_engine_dict():
    spec = parse_playbook(GOOD, "x.yaml").patch
    assert spec.to_engine() == {"name": "demo-eagle3", "file": "srt/models/demo.py", "class": "DemoForCausalLM",
                                "delegate": "llm", "methods": [{"name": "get_embed_and_head", "params": "self"}]}


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d["patch"].pop("class"), "patch.class: missing"),
    (lambda d: d["patch"].update({"file": "/etc/passwd"}), "patch.file"),
    (lambda d: d["patch"].update({"file": "../x.py"}), "patch.file"),
    (lambda d: d["patch"].update({"delegate": "not an ident"}), "patch.delegate"),
    (lambda d: d["patch"].update({"methods": []}), "patch.methods"),
    (lambda d: d["patch"]["methods"][0].update({"params": "layer_ids"}), "first parameter must be `self`"),
    (lambda d: d["patch"]["methods"][0].update({"params": "self, ="}), "not a valid parameter list"),
    (lambda d: d["patch"]["methods"].append({"name": "get_embed_and_head"}), "listed twice"),
    (lambda d: d["patch"].update({"klass": "x"}), "unknown key(s) klass"),
    (lambda d: d.update({"name": "Bad Name"}), "name"),
    (lambda d: d["patch"]["methods"][0].update({"name": "__init__"}), "dunder"),
])
def test_bad_specs_name_the_field(mutate, needle):
    data = yaml.safe_load(GOOD)
    mutate(data)
    with pytest.raises(ConfigError) as exc:
        parse_playbook(yaml.safe_dump(data), "bad.yaml")
    assert "bad.yaml" in str(exc.value)
    assert needle in str(exc.value)


def test_missing_file_lists_shipped_playbooks():
    with pytest.raises(ConfigError, match="kimi-k25-eagle3.yaml"):
        load_patch_spec("no-such-playbook")


def test_invalid_yaml_names_the_line():
    with pytest.raises(ConfigError, match=r"bad.yaml: line 3"):
        parse_playbook("name: x\npatch:\n  - : :\n  file: [\n", "bad.yaml")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_fuzzed_text_never_crashes_the_loader(text):
    try:
        parse_playbook(text, "fuzz.yaml")
    except ConfigError:
        pass


yaml_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
                           max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(yaml_values)
def test_fuzzed_structures_give_config_errors_only(value):
    doc = {"name": "x", "patch": value}
    try:
        parse_playbook(yaml.safe_dump(doc), "fuzz.yaml")
    except ConfigError:
        pass


def test_one_playbook_is_parsed_once_per_content_whatever_name_it_is_asked_by(tmp_path):
    # a run asks for the default playbook before any host, then by each host's `specs:` name
    assert load_patch_spec(None) is load_patch_spec("kimi-k25-eagle3") is load_patch_spec("kimi-k25-eagle3.yaml")
    path = tmp_path / "demo.yaml"
    path.write_text(GOOD)
    first = load_patch_spec(str(path))
    assert load_patch_spec(str(path)) is first
    path.write_text(GOOD.replace("DemoForCausalLM", "OtherForCausalLM"))   # an edit is read
    assert load_patch_spec(str(path)).cls == "OtherForCausalLM"
    path.write_text(GOOD.replace("delegate: llm", "delegate: 1llm"))      # and still checked
    with pytest.raises(ConfigError):
        load_patch_spec(str(path))
    path.write_text("name: demo-eagle3\nlaunch: {module: x}\n")
    with pytest.raises(ConfigError, match="has no `patch:` section"):
        load_patch_spec(str(path))
