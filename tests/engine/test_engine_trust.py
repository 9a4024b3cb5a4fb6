"""The engine's own blocks whatever their spec name, what counts as native, and a hand-patch
repair that removes exactly the hand patch. Each case on the real SGLang 0.5.9 file, checked
by what the class binds (ast) and by exact bytes."""

from __future__ import annotations

import ast
import copy

from provision.host.engine import core as engine
from tests.engine.conftest import KIMI_SPEC, METHODS, class_node, method_names, module_level_defs
from tests.engine.test_engine import HAND_INDENTED, HAND_MODULE_LEVEL, assert_failed, with_spec

CLASS_LINE = b"class KimiK25ForConditionalGeneration(nn.Module):\n"


def in_class(src: bytes, text: str) -> bytes:
    """`text` (class-body lines) as the first statements of the class body."""
    assert src.count(CLASS_LINE) == 1
    return src.replace(CLASS_LINE, CLASS_LINE + text.encode())


def line_of(src: bytes, needle: str) -> int:
    """The line number of the first line equal to `needle` after the class line."""
    lines = src.decode().splitlines()
    start = lines.index(CLASS_LINE.decode().rstrip("\n"))
    return lines.index(needle, start) + 1


# ------------------------------------------------------------------ blocks under another spec name

def test_a_renamed_spec_replaces_the_old_block_and_says_so(src_059, spec):
    old = engine.plan_patch(src_059, with_spec(name="kimi-eagle3-old"))["new"]
    assert method_names(old)[-3:] == METHODS
    info = engine.inspect(old, spec)
    assert info["methods"] == {m: "ours" for m in METHODS}, "provision's block, not the class's own code"
    assert info["block"]["present"] and info["block"]["matches"] is False
    assert info["block"]["other_specs"] == ["kimi-eagle3-old"]
    r = engine.plan_patch(old, spec)
    assert r["verdict"] == "patched" and r["native"] == [] and r["updated"] is True
    assert any("replaced the managed block written under spec kimi-eagle3-old" in n for n in r["notes"])
    assert r["new"] == engine.plan_patch(src_059, spec)["new"], "exactly as if patched under the new name"
    assert [method_names(r["new"]).count(m) for m in METHODS] == [1, 1, 1]
    assert b"spec=kimi-eagle3-old" not in r["new"]
    assert engine.plan_patch(r["new"], spec)["verdict"] == "unchanged"


def test_unpatch_under_the_new_name_gives_back_the_original(src_059, spec):
    old = engine.plan_patch(src_059, with_spec(name="kimi-eagle3-old"))["new"]
    r = engine.plan_unpatch(old, spec)
    assert r["verdict"] == "unpatched" and r["new"] == src_059 and r["removed"] == METHODS


def test_a_block_with_methods_the_new_spec_lacks_is_refused(src_059, spec):
    old = engine.plan_patch(src_059, with_spec(name="kimi-eagle3-old"))["new"]
    fewer = with_spec(methods=[m for m in KIMI_SPEC["methods"] if m["name"] != "set_embed_and_head"])
    r = engine.plan_patch(old, fewer)
    assert_failed(r, "block-other-spec", "spec kimi-eagle3-old", "set_embed_and_head",
                  "provision unpatch --playbook kimi-eagle3-old")
    assert engine.inspect(old, fewer)["error"]["kind"] == "block-other-spec"


# ------------------------------------------------------------------ native only when bound to a function

def test_an_assignment_is_not_a_method(src_059, spec):
    src = in_class(src_059, "    get_embed_and_head = None\n")
    line = line_of(src, "    get_embed_and_head = None")
    body = class_node(src).body
    assert any(isinstance(n, ast.Assign) and n.targets[0].id == "get_embed_and_head" for n in body)
    r = engine.plan_patch(src, spec)
    assert_failed(r, "not-a-method", "get_embed_and_head", f"an assignment at line {line}",
                  "`get_embed_and_head = None`")
    assert r["new"] is None


def test_a_property_is_not_a_method(src_059, spec):
    src = in_class(src_059, "    @property\n    def set_embed_and_head(self):\n        return None\n\n")
    line = line_of(src, "    @property")
    assert "set_embed_and_head" in method_names(src)  # a def in the class, but bound to a property
    assert_failed(engine.plan_patch(src, spec), "not-a-method", "set_embed_and_head",
                  f"`@property` on `def set_embed_and_head` at line {line}")


def test_a_def_then_del_is_not_a_method(src_059, spec):
    src = in_class(src_059, "    def get_embed_and_head(self):\n        return None\n\n    del get_embed_and_head\n\n")
    d, gone = line_of(src, "    def get_embed_and_head(self):"), line_of(src, "    del get_embed_and_head")
    # what Python binds: the same class body leaves no such attribute
    ns: dict = {}
    exec("class C:\n    def get_embed_and_head(self):\n        return None\n\n    del get_embed_and_head\n", ns)
    assert not hasattr(ns["C"], "get_embed_and_head")
    assert_failed(engine.plan_patch(src, spec), "not-a-method", "get_embed_and_head",
                  f"`del get_embed_and_head` at line {gone}", f"after its definition at line {d}")


def test_a_def_and_a_lambda_are_methods(src_059, spec):
    src = in_class(src_059, "    def get_embed_and_head(self):\n        return self.language_model.get_embed_and_head()\n\n"
                            "    set_embed_and_head = lambda self, embed, head: None\n\n")
    r = engine.plan_patch(src, spec)
    assert r["verdict"] == "patched" and r["native"] == ["get_embed_and_head", "set_embed_and_head"]
    assert r["added"] == ["set_eagle3_layers_to_capture"]
    assert method_names(r["new"]).count("set_eagle3_layers_to_capture") == 1


def test_a_base_class_binding_none_is_not_a_method(tmp_path, spec):
    from tests.engine.conftest import tree_resolver, write_tree

    write_tree(tmp_path, {"sglang/srt/models/base.py": "class Base:\n    get_embed_and_head = None\n",
                          "sglang/srt/models/kimi_k25.py": ""})
    src = (b"from sglang.srt.models.base import Base\n\n\nclass KimiK25ForConditionalGeneration(Base):\n"
           b"    def __init__(self):\n        self.language_model = 1\n")
    assert_failed(engine.plan_patch(src, spec, tree_resolver(tmp_path)), "not-a-method",
                  "get_embed_and_head in sglang.srt.models.base.Base", "an assignment at line 2")


# ------------------------------------------------------------------ hand-patch repair keeps what is not the patch

def test_repair_keeps_a_comment_after_entryclass(src_059, spec):
    own = src_059 + b"# Kimi-K2.5 entry point (kept by the site's config management)\n"
    for tail in (HAND_MODULE_LEVEL, HAND_INDENTED):
        hand = own + tail.encode()
        r = engine.plan_patch(hand, spec)
        assert r["verdict"] == "repaired", r["error"]
        assert r["new"] == engine.plan_patch(own, spec)["new"], "exactly the hand patch is gone"
        assert engine.plan_unpatch(r["new"], spec)["new"] == own
        assert not set(METHODS) & set(module_level_defs(r["new"]))
        assert [method_names(r["new"]).count(m) for m in METHODS] == [1, 1, 1]


def test_repair_keeps_a_commented_out_block_set_apart_before_the_patch(src_059, spec):
    own = src_059 + b"\n# EntryClass = [KimiK25ForConditionalGeneration, KimiVL]\n"
    hand = own + b"\n\n# EAGLE-3 fix (by hand)\ndef get_embed_and_head(self):\n    return self.language_model.get_embed_and_head()\n"
    r = engine.plan_patch(hand, spec)
    assert r["verdict"] == "repaired"
    assert engine.plan_unpatch(r["new"], spec)["new"] == own
    assert copy.deepcopy(r["repaired"])[0].startswith("hand-appended def get_embed_and_head(self)")
