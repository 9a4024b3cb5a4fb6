"""The pure patch engine, against the real SGLang files and crafted variants."""

from __future__ import annotations

import ast
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provision.host.engine import core as engine
from tests.engine.conftest import (
    KIMI_SPEC, METHODS, class_node, inserted_chunk, method_names, module_level_defs,
    tree_resolver, write_tree,
)

CLS = KIMI_SPEC["class"]

WRAPPER = """\
import torch
from torch import nn


class KimiK25ForConditionalGeneration(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.language_model = Inner(config)

    def forward(self, x):
        return self.language_model(x)


EntryClass = [KimiK25ForConditionalGeneration]
"""

HAND_MODULE_LEVEL = """

# EAGLE-3 fix (added by hand)
def set_eagle3_layers_to_capture(self, layer_ids=None):
    return self.language_model.set_eagle3_layers_to_capture(layer_ids)

def get_embed_and_head(self):
    return self.language_model.get_embed_and_head()

def set_embed_and_head(self, embed, head):
    return self.language_model.set_embed_and_head(embed, head)
"""

HAND_INDENTED = """
    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.language_model.set_eagle3_layers_to_capture(layer_ids)

    def get_embed_and_head(self):
        return self.language_model.get_embed_and_head()

    def set_embed_and_head(self, embed, head):
        self.language_model.set_embed_and_head(embed, head)
"""


def public(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "new"}


def assert_failed(result: dict, kind: str, *words: str) -> None:
    assert result["verdict"] == "failed", public(result)
    assert result["new"] is None
    assert result["error"]["kind"] == kind, result["error"]
    for w in words:
        assert w in result["error"]["message"], (w, result["error"]["message"])
    json.dumps(public(result))


def with_spec(**changes) -> dict:
    s = copy.deepcopy(KIMI_SPEC)
    s.update(changes)
    return s


# ------------------------------------------------------------------------- real 0.5.9 / 0.5.10

def test_real_059_gets_exactly_three_methods_inside_the_class(src_059, spec, resolver_059):
    r = engine.plan_patch(src_059, spec, resolver_059)
    assert r["verdict"] == "patched", public(r)
    assert r["added"] == METHODS and r["native"] == [] and r["kept"] == [] and r["updated"] is False
    assert r["repaired"] == [] and r["error"] is None
    new = r["new"]
    before = method_names(src_059)
    after = method_names(new)
    assert after == before + METHODS  # appended at the end of the class body, as real methods
    assert not set(METHODS) & set(module_level_defs(new))
    # exactly one insertion; every other byte preserved
    offset, chunk = inserted_chunk(src_059, new)
    text = chunk.decode()
    assert text.count("\n    def ") == 3
    assert text.count("# >>> provision managed block: spec=kimi-k25-eagle3 sha=") == 1
    assert text.count("    # <<< provision managed block: spec=kimi-k25-eagle3\n") == 1
    assert (b"            self.language_model.load_weights(language_weights)\n"
            b"\n    # >>> provision managed block: spec=kimi-k25-eagle3 sha=") in new
    assert b"    # <<< provision managed block: spec=kimi-k25-eagle3\n\n\nEntryClass" in new
    # the EntryClass line is unchanged and still after the class
    entry = [ln for ln in new.decode().splitlines() if ln.startswith("EntryClass")]
    assert entry == ["EntryClass = [KimiK25ForConditionalGeneration]"]
    assert new.endswith(b"\n\n\nEntryClass = [KimiK25ForConditionalGeneration]\n")
    cls = class_node(new)
    for n in cls.body[-3:]:
        assert isinstance(n, ast.FunctionDef) and n.col_offset == 4
    assert engine.check_structure(new, spec, resolver_059) == []
    compile(new, "kimi_k25.py", "exec")
    json.dumps(public(r))


def test_real_059_rendered_block_matches_the_documented_shape(src_059, spec):
    new = engine.plan_patch(src_059, spec)["new"].decode()
    expected_first = '''    def set_eagle3_layers_to_capture(self, layer_ids=None):
        """EAGLE-3: delegate to self.language_model (added by provision)."""
        inner = self.language_model
        if not hasattr(inner, "set_eagle3_layers_to_capture"):
            raise AttributeError(
                f"{type(self).__name__}.language_model ({type(inner).__name__}) has no set_eagle3_layers_to_capture(); cannot delegate"
            )
        return inner.set_eagle3_layers_to_capture(layer_ids)
'''
    assert expected_first in new
    assert "        return inner.get_embed_and_head()\n" in new
    assert "        return inner.set_embed_and_head(embed, head)\n" in new
    sha = engine.render_methods(spec, "    ", "\n")
    import hashlib
    assert f"sha={hashlib.sha256(sha.encode()).hexdigest()[:12]} (remove with `provision unpatch`)" in new


def test_real_0510_is_native_and_untouched(src_0510, spec, resolver_0510):
    r = engine.plan_patch(src_0510, spec, resolver_0510)
    assert r["verdict"] == "native", public(r)
    assert r["new"] is None and r["added"] == [] and r["native"] == METHODS and r["error"] is None
    assert engine.check_structure(src_0510, spec, resolver_0510) == []
    assert engine.plan_unpatch(src_0510, spec)["verdict"] == "absent"
    info = engine.inspect(src_0510, spec, resolver_0510)
    assert info["methods"] == {m: "native" for m in METHODS}
    assert info["block"]["present"] is False and info["would_change"] is False


def test_second_run_is_unchanged_and_byte_identical(src_059, spec):
    new = engine.plan_patch(src_059, spec)["new"]
    r2 = engine.plan_patch(new, spec)
    assert r2["verdict"] == "unchanged" and r2["new"] is None
    assert r2["kept"] == METHODS and r2["added"] == [] and r2["updated"] is False


def test_unpatch_restores_the_original_bytes(src_059, spec):
    new = engine.plan_patch(src_059, spec)["new"]
    u = engine.plan_unpatch(new, spec)
    assert u["verdict"] == "unpatched" and u["new"] == src_059 and u["error"] is None
    assert u["removed"] == METHODS
    again = engine.plan_unpatch(src_059, spec)
    assert again["verdict"] == "absent" and again["new"] is None


def test_unpatch_under_a_new_name_removes_the_block_of_the_same_methods_only(src_059, spec):
    new = engine.plan_patch(src_059, spec)["new"]
    renamed = engine.plan_unpatch(new, with_spec(name="renamed-spec"))
    assert renamed["verdict"] == "unpatched" and renamed["new"] == src_059
    assert any("written under spec kimi-k25-eagle3" in n for n in renamed["notes"])
    fewer = with_spec(name="other-spec", methods=[{"name": "get_embed_and_head", "params": "self"}])
    r = engine.plan_unpatch(new, fewer)
    assert r["verdict"] == "absent" and r["new"] is None
    assert any("left the managed block of spec kimi-k25-eagle3" in n and "set_eagle3_layers_to_capture" in n
               for n in r["notes"])


def test_check_structure_reports_missing_methods_on_unpatched_059(src_059, spec):
    problems = engine.check_structure(src_059, spec)
    assert len(problems) == 3 and all("is not defined in class" in p for p in problems)


# ------------------------------------------------------------------------- hand patches

def _assert_repaired(src, hand_src, spec, native=False):
    r = engine.plan_patch(hand_src, spec)
    assert r["verdict"] == "repaired", public(r)
    assert len(r["repaired"]) == 3
    assert all("hand-appended def" in d for d in r["repaired"])
    new = r["new"]
    names = method_names(new)
    for m in METHODS:
        assert names.count(m) == 1
    assert not set(METHODS) & set(module_level_defs(new))
    assert engine.check_structure(new, spec) == []
    assert engine.plan_patch(new, spec)["verdict"] == ("native" if native else "unchanged")
    return r


def test_hand_patch_module_level_form_is_repaired(src_059, spec):
    hand = src_059 + HAND_MODULE_LEVEL.encode()
    ast.parse(hand)  # this form imports fine but never binds the methods
    r = _assert_repaired(src_059, hand, spec)
    assert r["added"] == METHODS
    assert "module-level" in r["repaired"][0]
    # unpatching the repaired file gives the pristine original (hand patch gone, block gone)
    assert engine.plan_unpatch(r["new"], spec)["new"] == src_059


def test_hand_patch_indented_form_is_repaired(src_059, spec):
    hand = src_059 + HAND_INDENTED.encode()
    with pytest.raises(IndentationError):
        compile(hand, "kimi_k25.py", "exec")
    r = _assert_repaired(src_059, hand, spec)
    assert "IndentationError" in r["repaired"][0]
    assert engine.plan_unpatch(r["new"], spec)["new"] == src_059
    info = engine.inspect(hand, spec)
    assert info["hand_patch"] is True and info["hand_patch_form"] == "indented"
    assert info["methods"] == {m: "missing" for m in METHODS}


def test_hand_patch_indented_with_comments_and_crlf(src_059, spec):
    crlf = src_059.replace(b"\n", b"\r\n")
    # the comment right on the first def is part of the hand patch (HAND_INDENTED starts with a newline)
    hand = crlf + b"\r\n# quick fix" + HAND_INDENTED.replace("\n", "\r\n").encode() + b"   # done\r\n"
    r = _assert_repaired(crlf, hand, spec)
    assert engine.plan_unpatch(r["new"], spec)["new"] == crlf
    assert b"\n" not in r["new"].replace(b"\r\n", b"")


def test_hand_patch_on_0510_is_removed_and_nothing_added(src_0510, spec):
    hand = src_0510 + HAND_MODULE_LEVEL.encode()
    r = _assert_repaired(src_0510, hand, spec, native=True)
    assert r["added"] == [] and r["native"] == METHODS
    assert r["new"] == src_0510


def test_partial_hand_patch_only_one_method(src_059, spec):
    hand = src_059 + b"\n\ndef get_embed_and_head(self):\n    return self.language_model.get_embed_and_head()\n"
    r = engine.plan_patch(hand, spec)
    assert r["verdict"] == "repaired" and len(r["repaired"]) == 1 and r["added"] == METHODS
    assert engine.plan_unpatch(r["new"], spec)["new"] == src_059


def test_trailing_block_with_other_code_is_left_alone_and_reported(src_059, spec):
    tail = HAND_MODULE_LEVEL + "\n\ndef helper(x):\n    return x\n"
    hand = src_059 + tail.encode()
    r = engine.plan_patch(hand, spec)
    assert r["verdict"] == "patched" and r["repaired"] == []
    assert len(r["module_level_leftovers"]) == 3
    assert all("left alone" in n for n in r["module_level_leftovers"])
    assert r["new"].endswith(tail.encode())  # untouched
    assert module_level_defs(r["new"]).count("get_embed_and_head") == 1


def test_module_level_def_in_the_middle_is_a_leftover(spec):
    src = WRAPPER.replace("EntryClass", "def get_embed_and_head(self):\n    return None\n\n\nEntryClass").encode()
    r = engine.plan_patch(src, spec)
    assert r["verdict"] == "patched"
    assert r["added"] == METHODS  # a module-level function does not define the method
    assert any("get_embed_and_head" in n and "left alone" in n for n in r["module_level_leftovers"])


def test_indented_tail_with_other_statements_is_a_syntax_failure(src_059, spec):
    hand = src_059 + (HAND_INDENTED + "    x = 1\n").encode()
    assert_failed(engine.plan_patch(hand, spec), "syntax", "does not parse", "IndentationError")


def test_repaired_file_with_stale_block_and_hand_patch(src_059, spec):
    patched = engine.plan_patch(src_059, spec)["new"]
    hand = patched + HAND_MODULE_LEVEL.encode()
    r = engine.plan_patch(hand, spec)
    assert r["verdict"] == "repaired" and r["kept"] == METHODS and r["added"] == []
    assert r["new"] == patched


# ------------------------------------------------------------------------- layouts

def test_one_method_already_present_gets_only_the_other_two(spec):
    src = WRAPPER.replace(
        "    def forward(self, x):",
        "    def get_embed_and_head(self):\n        return self.language_model.get_embed_and_head()\n\n    def forward(self, x):",
    ).encode()
    r = engine.plan_patch(src, spec)
    assert r["verdict"] == "patched"
    assert r["added"] == ["set_eagle3_layers_to_capture", "set_embed_and_head"]
    assert r["native"] == ["get_embed_and_head"]
    names = method_names(r["new"])
    assert names.count("get_embed_and_head") == 1
    assert names[-2:] == ["set_eagle3_layers_to_capture", "set_embed_and_head"]
    assert engine.plan_unpatch(r["new"], spec)["new"] == src
    assert engine.plan_patch(r["new"], spec)["verdict"] == "unchanged"


def test_crlf_file_stays_crlf(src_059, spec):
    crlf = src_059.replace(b"\n", b"\r\n")
    r = engine.plan_patch(crlf, spec)
    new = r["new"]
    assert r["verdict"] == "patched"
    assert b"\n" not in new.replace(b"\r\n", b""), "a bare LF slipped in"
    assert new.count(b"\r\n") > crlf.count(b"\r\n")
    assert engine.plan_unpatch(new, spec)["new"] == crlf
    assert engine.plan_patch(new, spec)["verdict"] == "unchanged"
    assert method_names(new.replace(b"\r\n", b"\n"))[-3:] == METHODS


def test_file_without_trailing_newline(src_059, spec):
    src = src_059.rstrip(b"\n")
    r = engine.plan_patch(src, spec)
    assert r["new"].endswith(b"EntryClass = [KimiK25ForConditionalGeneration]")
    assert engine.plan_unpatch(r["new"], spec)["new"] == src


def test_class_is_last_thing_in_file_without_newline(spec):
    src = WRAPPER.split("\n\nEntryClass")[0].rstrip("\n").encode()
    assert not src.endswith(b"\n")
    r = engine.plan_patch(src, spec)
    assert r["verdict"] == "patched"
    new = r["new"]
    assert method_names(new)[-3:] == METHODS
    assert not new.endswith(b"\n")  # we don't add a final newline the file did not have
    assert new.endswith(b"    # <<< provision managed block: spec=kimi-k25-eagle3")
    assert engine.plan_unpatch(new, spec)["new"] == src
    assert engine.plan_patch(new, spec)["verdict"] == "unchanged"


def test_class_followed_by_more_module_code(spec):
    tail = (
        "\n\nclass Other(nn.Module):\n    def get_embed_and_head(self):\n        return 1\n\n\n"
        "def helper():\n    '''doc'''\n    return Other\n\n# trailing comment\nEntryClass = [KimiK25ForConditionalGeneration, Other]\n"
    )
    src = (WRAPPER.split("\n\nEntryClass")[0] + "\n" + tail).encode()
    r = engine.plan_patch(src, spec)
    assert r["verdict"] == "patched" and r["added"] == METHODS
    assert method_names(r["new"])[-3:] == METHODS
    assert method_names(r["new"], "Other") == ["get_embed_and_head"]
    assert r["new"].endswith(tail.encode())
    assert engine.plan_unpatch(r["new"], spec)["new"] == src


def test_class_ending_in_trailing_comments_multiline_string_and_decorator(spec):
    src = '''\
from torch import nn


@some_decorator(
    arg=1,
)
class KimiK25ForConditionalGeneration(nn.Module):  # the wrapper
    """Docstring.

    def fake(self): not code
    """

    def __init__(self):
        self.language_model = object()

    @property
    def dtype(self):
        return """
a multi-line string ending the class
    def set_embed_and_head(self, embed, head): not code
"""
        # trailing comment inside the class


# a comment after the class
EntryClass = [KimiK25ForConditionalGeneration]
'''.encode()
    r = engine.plan_patch(src, spec)
    assert r["verdict"] == "patched" and r["added"] == METHODS
    new = r["new"]
    assert method_names(new) == ["__init__", "dtype"] + METHODS
    assert engine.plan_unpatch(new, spec)["new"] == src
    assert b'"""\n\n    # >>> provision managed block' in new  # right after the string's last line
    assert b"    # <<< provision managed block: spec=kimi-k25-eagle3\n        # trailing comment inside" in new


def test_tab_indented_class_gets_tab_indented_block(spec):
    src = WRAPPER.replace("        ", "\t\t").replace("    ", "\t").encode()
    r = engine.plan_patch(src, spec)
    new = r["new"]
    _, chunk = inserted_chunk(src, new)
    assert b"\tdef set_eagle3_layers_to_capture(self, layer_ids=None):\n\t\t" in chunk
    assert b"    " not in chunk.replace(b"remove with", b"")
    assert method_names(new)[-3:] == METHODS


def test_two_space_indent_is_followed(spec):
    src = (
        "class KimiK25ForConditionalGeneration:\n"
        "  def __init__(self):\n"
        "    self.language_model = 1\n"
        "\n"
        "EntryClass = [KimiK25ForConditionalGeneration]\n"
    ).encode()
    r = engine.plan_patch(src, spec)
    assert b"\n  def get_embed_and_head(self):\n    \"\"\"EAGLE-3" in r["new"]
    assert b"\n      raise AttributeError(\n        f\"" in r["new"]
    assert method_names(r["new"])[-3:] == METHODS


def test_latin1_coding_line_is_honoured(spec):
    src = ("# -*- coding: latin-1 -*-\n" + WRAPPER.replace("import torch", "import torch  # caf\xe9")).encode("latin-1")
    r = engine.plan_patch(src, spec)
    assert r["verdict"] == "patched"
    assert "café".encode("latin-1") in r["new"]
    assert engine.plan_unpatch(r["new"], spec)["new"] == src


def test_utf8_bom_is_kept(spec):
    src = b"\xef\xbb\xbf" + WRAPPER.encode()
    r = engine.plan_patch(src, spec)
    assert r["new"].startswith(b"\xef\xbb\xbf")
    assert engine.plan_unpatch(r["new"], spec)["new"] == src


def test_a_block_of_another_spec_with_fewer_methods_is_replaced_never_native(spec):
    first = engine.plan_patch(WRAPPER.encode(), with_spec(name="other", methods=KIMI_SPEC["methods"][1:2]))["new"]
    r = engine.plan_patch(first, spec)
    assert r["verdict"] == "patched" and r["native"] == [] and r["updated"]
    assert r["new"] == engine.plan_patch(WRAPPER.encode(), spec)["new"]
    assert any("replaced the managed block written under spec other" in n for n in r["notes"])
    assert method_names(r["new"]).count("get_embed_and_head") == 1


# ------------------------------------------------------------------------- inheritance

BASE_MOD = """\
from torch import nn


class Grand(nn.Module):
    def get_embed_and_head(self):
        return 1


class Base(Grand):
    def set_eagle3_layers_to_capture(self, layer_ids=None):
        pass
"""

IMPORT_STYLES = {
    "absolute": ("from sglang.srt.models.basemod import Base", "Base"),
    "relative": ("from .basemod import Base", "Base"),
    "alias-module": ("import sglang.srt.models.basemod as bm", "bm.Base"),
    "dotted-module": ("import sglang.srt.models.basemod", "sglang.srt.models.basemod.Base"),
    "from-package": ("from sglang.srt.models import basemod", "basemod.Base"),
    "relative-package": ("from . import basemod", "basemod.Base"),
    "re-export": ("from .mid import Base", "Base"),
    "star": ("from .mid import *", "Base"),
    "as-name": ("from sglang.srt.models.basemod import Base as _B", "_B"),
    "module-alias": ("from sglang.srt.models.basemod import Base\nMyBase = Base", "MyBase"),
    "generic": ("from sglang.srt.models.basemod import Base", "Base[int]"),
}


def _wrapper_with_base(import_line: str, base_expr: str) -> str:
    return (
        f"{import_line}\n\n\nclass {CLS}({base_expr}):\n"
        "    def __init__(self):\n        self.language_model = None\n\n\n"
        f"EntryClass = [{CLS}]\n"
    )


@pytest.mark.parametrize("style", sorted(IMPORT_STYLES))
def test_methods_inherited_from_an_sglang_base_are_native(tmp_path, spec, style):
    imp, expr = IMPORT_STYLES[style]
    src = _wrapper_with_base(imp, expr)
    write_tree(tmp_path, {
        "sglang/srt/models/basemod.py": BASE_MOD,
        "sglang/srt/models/mid.py": "from sglang.srt.models.basemod import Base, Grand\n",
        "sglang/srt/models/kimi_k25.py": src,
    })
    r = engine.plan_patch(src.encode(), spec, tree_resolver(tmp_path))
    assert r["verdict"] == "patched", public(r)
    assert r["native"] == ["set_eagle3_layers_to_capture", "get_embed_and_head"]
    assert r["added"] == ["set_embed_and_head"]
    assert any("inherited from sglang.srt.models.basemod.Grand" in n for n in r["notes"])
    assert engine.check_structure(r["new"], spec, tree_resolver(tmp_path)) == []
    info = engine.inspect(r["new"], spec, tree_resolver(tmp_path))
    assert info["methods"] == {"set_eagle3_layers_to_capture": "native", "get_embed_and_head": "native",
                               "set_embed_and_head": "ours"}


def test_base_providing_everything_means_native(tmp_path, spec):
    base = BASE_MOD + "\n    def set_embed_and_head(self, embed, head):\n        pass\n"
    src = _wrapper_with_base("from .basemod import Base", "Base")
    write_tree(tmp_path, {"sglang/srt/models/basemod.py": base})
    r = engine.plan_patch(src.encode(), spec, tree_resolver(tmp_path))
    assert r["verdict"] == "native" and r["new"] is None


def test_unresolvable_or_foreign_bases_provide_nothing(tmp_path, spec):
    src = _wrapper_with_base("from .missing import Base", "Base")
    write_tree(tmp_path, {"sglang/srt/models/other.py": ""})
    for resolver in (None, tree_resolver(tmp_path), lambda name: None):
        r = engine.plan_patch(src.encode(), spec, resolver)
        assert r["added"] == METHODS and r["native"] == []
    boom = engine.plan_patch(src.encode(), spec, lambda name: (_ for _ in ()).throw(OSError("nope")))
    assert boom["added"] == METHODS and any("could not read module" in n for n in boom["notes"])
    # nn.Module (torch) is never looked up
    asked = []
    engine.plan_patch(WRAPPER.encode(), spec, lambda name: asked.append(name))
    assert asked == []


def test_cyclic_bases_do_not_hang(tmp_path, spec):
    write_tree(tmp_path, {
        "sglang/srt/models/a.py": "from .b import B\nclass A(B):\n    pass\n",
        "sglang/srt/models/b.py": "from .a import A\nclass B(A):\n    pass\n",
    })
    src = _wrapper_with_base("from .a import A", "A")
    r = engine.plan_patch(src.encode(), spec, tree_resolver(tmp_path))
    assert r["added"] == METHODS


def test_same_file_base_class(spec):
    src = BASE_MOD + "\n\n" + _wrapper_with_base("", "Base")
    r = engine.plan_patch(src.encode(), spec)
    assert r["native"] == ["set_eagle3_layers_to_capture", "get_embed_and_head"]


def test_real_deepseek_inheritance_across_modules(tmp_path, spec, resolver_059, sglang_059):
    """A wrapper subclassing the real DeepseekV3ForCausalLM (which inherits all three
    from DeepseekV2ForCausalLM) needs nothing."""
    src = _wrapper_with_base("from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM", "DeepseekV3ForCausalLM")
    r = engine.plan_patch(src.encode(), spec, resolver_059)
    assert r["verdict"] == "native", public(r)
    assert all("DeepseekV2ForCausalLM" in n for n in r["notes"] if "inherited" in n)
    v3 = with_spec(file="srt/models/deepseek_v2.py", **{"class": "DeepseekV3ForCausalLM"}, delegate="model")
    ds = (sglang_059 / "srt" / "models" / "deepseek_v2.py").read_bytes()
    assert engine.plan_patch(ds, v3, resolver_059)["verdict"] == "native"


def test_delegate_assigned_only_in_a_base_class(tmp_path, spec):
    base = "class Base:\n    def __init__(self):\n        self.language_model = 1\n"
    src = (f"from .b import Base\n\n\nclass {CLS}(Base):\n    x = 1\n").encode()
    write_tree(tmp_path, {"sglang/srt/models/b.py": base})
    assert engine.plan_patch(src, spec, tree_resolver(tmp_path))["verdict"] == "patched"
    assert_failed(engine.plan_patch(src, spec), "delegate-missing")


# ------------------------------------------------------------------------- refusals

def test_two_classes_with_the_same_name(spec):
    src = (WRAPPER + "\n\nclass KimiK25ForConditionalGeneration:\n    pass\n").encode()
    assert_failed(engine.plan_patch(src, spec), "class-ambiguous", "expected one class", "found 2", "lines 5, 17")


def test_class_missing(spec):
    src = WRAPPER.replace("KimiK25ForConditionalGeneration", "SomethingElse").encode()
    assert_failed(engine.plan_patch(src, spec), "class-missing", "expected class KimiK25ForConditionalGeneration", "SomethingElse")


def test_class_only_nested_is_missing(spec):
    src = ("def make():\n" + "".join("    " + ln + "\n" for ln in WRAPPER.splitlines())).encode()
    assert_failed(engine.plan_patch(src, spec), "class-missing", "nested definition")


def test_delegate_missing(spec):
    src = WRAPPER.replace("self.language_model = Inner(config)", "self.lm = Inner(config)").encode()
    assert_failed(engine.plan_patch(src, spec), "delegate-missing", "self.language_model", "self.lm")


@pytest.mark.parametrize("assign", [
    "self.language_model: Inner = Inner(config)",
    "self.config, self.language_model = config, Inner(config)",
    "setattr(self, 'language_model', Inner(config))",
    "if config:\n            self.language_model = Inner(config)",
])
def test_delegate_assignment_forms(spec, assign):
    src = WRAPPER.replace("self.language_model = Inner(config)", assign).encode()
    assert engine.plan_patch(src, spec)["verdict"] == "patched"


def test_syntax_error(spec):
    src = WRAPPER.replace("def forward(self, x):", "def forward(self, x)").encode()
    assert_failed(engine.plan_patch(src, spec), "syntax", "does not parse", "line 10", "expected ':'")


def test_null_bytes_are_a_syntax_failure(spec):
    assert_failed(engine.plan_patch(WRAPPER.encode() + b"\x00", spec), "syntax")


def test_non_utf8_bytes(spec):
    src = WRAPPER.encode().replace(b"import torch", b"import torch  # caf\xe9")
    assert_failed(engine.plan_patch(src, spec), "encoding", "utf-8", "0xe9", "line 1")
    assert engine.check_structure(src, spec)
    assert engine.plan_unpatch(src, spec)["error"]["kind"] == "encoding"


def test_bad_coding_cookie(spec):
    src = b"# -*- coding: no-such-codec -*-\n" + WRAPPER.encode()
    assert_failed(engine.plan_patch(src, spec), "encoding")


def test_huge_file_is_refused_quickly(spec):
    pad = "".join(f"def pad_{i}(x):\n    return x + {i}\n\n\n" for i in range(20 * 1024 * 1024 // 40))
    src = (pad + WRAPPER).encode()
    assert len(src) > 20 * 1024 * 1024
    t = time.monotonic()
    r = engine.plan_patch(src, spec)
    assert time.monotonic() - t < 2
    assert_failed(r, "too-large", "at most 4 MiB")
    assert engine.inspect(src, spec)["error"]["kind"] == "too-large"


def test_big_but_allowed_file_still_works(spec):
    pad = "".join(f"def pad_{i}(x):\n    return x + {i}\n\n\n" for i in range(8000))
    src = (pad + WRAPPER).encode()
    assert 250_000 < len(src) < engine.MAX_SOURCE_BYTES
    r = engine.plan_patch(src, spec)
    assert r["verdict"] == "patched" and engine.plan_unpatch(r["new"], spec)["new"] == src


def test_a_lambda_counts_as_a_method_a_property_does_not(spec):
    lam = "    get_embed_and_head = lambda self: self.language_model.get_embed_and_head()\n"
    prop = "    @property\n    def set_eagle3_layers_to_capture(self):\n        return None\n\n"
    src = WRAPPER.replace("    def forward(self, x):", lam + "\n    def forward(self, x):").encode()
    r = engine.plan_patch(src, spec)
    assert r["verdict"] == "patched" and r["native"] == ["get_embed_and_head"]
    assert any("lambda at line" in n for n in r["notes"])
    src = WRAPPER.replace("    def forward(self, x):", lam + prop + "    def forward(self, x):").encode()
    assert_failed(engine.plan_patch(src, spec), "not-a-method", "set_eagle3_layers_to_capture", "`@property`")


def test_one_lambda_the_others_added(spec):
    src = WRAPPER.replace(
        "    def forward(self, x):",
        "    get_embed_and_head = lambda self: self.language_model.get_embed_and_head()\n\n    def forward(self, x):",
    ).encode()
    r = engine.plan_patch(src, spec)
    assert r["verdict"] == "patched" and r["added"] == ["set_eagle3_layers_to_capture", "set_embed_and_head"]
    assert engine.check_structure(r["new"], spec) == []


def test_method_defined_conditionally_in_class_body_counts(spec):
    src = WRAPPER.replace(
        "    def forward(self, x):",
        "    if True:\n        def get_embed_and_head(self):\n            return 1\n\n    def forward(self, x):",
    ).encode()
    assert engine.plan_patch(src, spec)["native"] == ["get_embed_and_head"]


def test_one_line_class_body_is_refused(spec):
    src = b"class KimiK25ForConditionalGeneration: language_model = None\n"
    assert_failed(engine.plan_patch(src, spec), "class-layout", "body on the class line")


def test_corrupt_block_markers(src_059, spec):
    new = engine.plan_patch(src_059, spec)["new"]
    lines = new.decode().splitlines(keepends=True)
    no_end = "".join(ln for ln in lines if "<<< provision managed block" not in ln).encode()
    assert_failed(engine.plan_patch(no_end, spec), "block-corrupt", "1 begin", "0 end")
    assert engine.plan_unpatch(no_end, spec)["error"]["kind"] == "block-corrupt"
    doubled = new.replace(b"EntryClass", b"# >>> provision managed block: spec=kimi-k25-eagle3 sha=0\nEntryClass")
    assert_failed(engine.plan_patch(doubled, spec), "block-corrupt")


def test_block_outside_the_class_is_refused(spec):
    src = (WRAPPER + "\n\nclass Other:\n    x = 1\n" + engine.render_block(spec, "    ", "\n")).encode()
    assert_failed(engine.plan_patch(src, spec), "block-corrupt", "inside class", "found it at lines")


def test_indented_block_pasted_after_entryclass_is_treated_as_a_hand_patch(spec):
    src = (WRAPPER + "\n" + engine.render_block(spec, "    ", "\n")).encode()
    r = engine.plan_patch(src, spec)
    assert r["verdict"] == "repaired"
    assert engine.plan_unpatch(r["new"], spec)["new"] == WRAPPER.encode()


@pytest.mark.parametrize("bad,field", [
    ("not a dict", "mapping"),
    ({**KIMI_SPEC, "name": "bad name!"}, "name"),
    ({**KIMI_SPEC, "name": 3}, "name"),
    ({**KIMI_SPEC, "file": "/abs/x.py"}, "file"),
    ({**KIMI_SPEC, "file": "srt/../x.py"}, "file"),
    ({**KIMI_SPEC, "class": "not-ident"}, "class"),
    ({**KIMI_SPEC, "class": "class"}, "class"),
    ({**KIMI_SPEC, "delegate": "__private"}, "delegate"),
    ({**KIMI_SPEC, "methods": []}, "methods"),
    ({**KIMI_SPEC, "methods": "x"}, "methods"),
    ({**KIMI_SPEC, "methods": [{"name": "a", "params": "layer_ids"}]}, "self"),
    ({**KIMI_SPEC, "methods": [{"name": "a", "params": "self, x=="}]}, "parameter list"),
    ({**KIMI_SPEC, "methods": [{"name": "a", "params": "self, x, x"}]}, "parameter list"),
    ({**KIMI_SPEC, "methods": [{"name": "a", "params": "self):\n    pass\ndef b(self"}]}, "one line"),
    ({**KIMI_SPEC, "methods": [{"name": "a", "params": "self) # "}]}, "parameter list"),
    ({**KIMI_SPEC, "methods": [{"name": "a", "params": "self, type"}]}, "shadow"),
    ({**KIMI_SPEC, "methods": [{"name": "a"}, {"name": "a"}]}, "unique"),
    ({**KIMI_SPEC, "methods": [{"name": "language_model"}]}, "delegate"),
    ({**KIMI_SPEC, "methods": [{"name": "x y"}]}, "name"),
    ({**KIMI_SPEC, "methods": [{"name": "a", "params": 5}]}, "params"),
    ({k: v for k, v in KIMI_SPEC.items() if k != "delegate"}, "delegate"),
])
def test_malformed_specs_are_refused(bad, field):
    r = engine.plan_patch(WRAPPER.encode(), bad)
    assert_failed(r, "spec", field)
    assert engine.plan_unpatch(WRAPPER.encode(), bad)["error"]["kind"] == "spec"
    assert engine.inspect(WRAPPER.encode(), bad)["error"]["kind"] == "spec"
    assert engine.check_structure(WRAPPER.encode(), bad)


# ------------------------------------------------------------------------- spec changes / stale blocks

def test_spec_with_an_extra_method_updates_the_block(src_059, spec):
    old = engine.plan_patch(src_059, spec)["new"]
    bigger = with_spec(methods=KIMI_SPEC["methods"] + [{"name": "get_layer_count", "params": "self, *, layer=0"}])
    r = engine.plan_patch(old, bigger)
    assert r["verdict"] == "patched" and r["updated"] is True
    assert r["added"] == ["get_layer_count"] and r["kept"] == METHODS
    assert method_names(r["new"])[-4:] == METHODS + ["get_layer_count"]
    assert b"return inner.get_layer_count(layer=layer)" in r["new"]
    assert engine.plan_unpatch(r["new"], bigger)["new"] == src_059
    assert engine.plan_patch(r["new"], bigger)["verdict"] == "unchanged"
    info = engine.inspect(old, bigger)
    assert info["block"]["matches"] is False and info["would_change"] is True


def test_spec_with_changed_params_updates_the_block(src_059, spec):
    old = engine.plan_patch(src_059, spec)["new"]
    changed = copy.deepcopy(spec)
    changed["methods"][0]["params"] = "self, layer_ids=None, *args, **kwargs"
    r = engine.plan_patch(old, changed)
    assert r["updated"] and r["kept"] == METHODS and r["added"] == []
    assert b"return inner.set_eagle3_layers_to_capture(layer_ids, *args, **kwargs)" in r["new"]


def test_spec_with_a_method_removed_shrinks_the_block(src_059, spec):
    old = engine.plan_patch(src_059, spec)["new"]
    smaller = with_spec(methods=KIMI_SPEC["methods"][:2])
    r = engine.plan_patch(old, smaller)
    assert r["updated"] and method_names(r["new"])[-2:] == METHODS[:2]
    assert "set_embed_and_head" not in method_names(r["new"])


def test_hand_edited_block_is_re_rendered(src_059, spec):
    old = engine.plan_patch(src_059, spec)["new"]
    edited = old.replace(b"cannot delegate", b"nope", 1)
    r = engine.plan_patch(edited, spec)
    assert r["updated"] and r["new"] == old


def test_stale_block_after_upstream_adds_a_method_natively(src_059, spec):
    old = engine.plan_patch(src_059, spec)["new"]
    native = old.replace(
        b"    def pad_input_ids(",
        b"    def get_embed_and_head(self):\n        return self.language_model.get_embed_and_head()\n\n    def pad_input_ids(",
    )
    assert method_names(native).count("get_embed_and_head") == 2
    r = engine.plan_patch(native, spec)
    assert r["verdict"] == "patched" and r["updated"] is True
    assert r["native"] == ["get_embed_and_head"] and r["kept"] == ["set_eagle3_layers_to_capture", "set_embed_and_head"]
    assert method_names(r["new"]).count("get_embed_and_head") == 1
    assert any("now defined natively" in n for n in r["notes"])
    assert engine.check_structure(r["new"], spec) == []


def test_stale_block_when_all_methods_became_native(src_059, src_0510, spec):
    patched = engine.plan_patch(src_059, spec)["new"]
    # graft our block into the 0.5.10 class (upgrade kept a stale block)
    chunk = b"\n" + engine.render_block(spec).encode()
    assert chunk in patched
    anchor = b"        self.language_model.set_embed_and_head(embed, head)\n"
    stale = src_0510.replace(anchor, anchor + chunk)
    assert engine.check_structure(stale, spec)  # duplicates
    r = engine.plan_patch(stale, spec)
    assert r["verdict"] == "patched" and r["new"] == src_0510 and r["updated"]
    assert any("removed the managed block" in n for n in r["notes"])


# ------------------------------------------------------------------------- rendering / forwarding

@pytest.mark.parametrize("params,call", [
    ("self", ""),
    ("self, layer_ids=None", "layer_ids"),
    ("self, embed, head", "embed, head"),
    ("self, *args, **kwargs", "*args, **kwargs"),
    ("self, a, /, b, *args, c, d=4, **kw", "a, b, *args, c=c, d=d, **kw"),
    ("self, /, a", "a"),
    ("self, *, key", "key=key"),
    ("self, inner, x: int = 3", "inner, x"),
])
def test_forwarding_call(params, call):
    s = with_spec(methods=[{"name": "m", "params": params}])
    text = engine.render_methods(s, "    ", "\n")
    assert f"return {'_inner' if 'inner,' in params else 'inner'}.m({call})" in text
    ast.parse("class X:\n" + text)


def test_render_methods_newline_and_indent():
    text = engine.render_methods(KIMI_SPEC, "\t", "\r\n")
    assert text.endswith("\r\n") and "\n" not in text.replace("\r\n", "")
    assert text.startswith("\tdef set_eagle3_layers_to_capture(self, layer_ids=None):\r\n\t\t")
    assert "\r\n\r\n\tdef get_embed_and_head(self):" in text
    assert engine.render_methods(KIMI_SPEC, names=["get_embed_and_head"]).count("def ") == 1


# ------------------------------------------------------------------------- inspect / diff / hygiene

def test_inspect_states(src_059, spec):
    before = engine.inspect(src_059, spec)
    assert before["methods"] == {m: "missing" for m in METHODS}
    assert before["block"]["present"] is False and before["would_change"] is True
    assert before["planned_verdict"] == "patched" and before["error"] is None
    after = engine.inspect(engine.plan_patch(src_059, spec)["new"], spec)
    assert after["methods"] == {m: "ours" for m in METHODS}
    assert after["block"]["present"] and after["block"]["matches"]
    assert after["block"]["sha"] == after["block"]["expected_sha"]
    assert after["would_change"] is False
    hand = engine.inspect(src_059 + HAND_MODULE_LEVEL.encode(), spec)
    assert hand["hand_patch"] and hand["hand_patch_form"] == "module-level" and len(hand["hand_patch_defs"]) == 3
    bad = engine.inspect(b"x = (", spec)
    assert bad["error"]["kind"] == "syntax"
    for r in (before, after, hand, bad):
        json.dumps(r)


def test_unified_diff(src_059, spec):
    new = engine.plan_patch(src_059, spec)["new"]
    d = engine.unified_diff(src_059, new, "sglang/srt/models/kimi_k25.py")
    assert d.startswith("--- a/sglang/srt/models/kimi_k25.py\n+++ b/sglang/srt/models/kimi_k25.py\n@@ ")
    assert "+    def get_embed_and_head(self):\n" in d
    assert sum(1 for ln in d.splitlines() if ln.startswith("-") and not ln.startswith("---")) == 0
    assert engine.unified_diff(src_059, src_059, "x") == ""
    nd = engine.unified_diff(b"a\nb", b"a\nc", "x")
    assert "\\ No newline at end of file" in nd


STDLIB = set(sys.stdlib_module_names)


@pytest.mark.parametrize("name", ["engine/core.py", "engine/spec.py", "ops/fileops.py"])
def test_shipped_modules_import_only_the_stdlib_and_parse_as_310(name):
    path = Path(engine.__file__).parents[1] / name
    src = path.read_text()
    tree = ast.parse(src, feature_version=(3, 10))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                assert a.name.split(".")[0] in STDLIB, a.name
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative imports break the bundle"
            if node.module.startswith("provision.host."):  # the bundle's own modules
                continue
            assert node.module.split(".")[0] in STDLIB or node.module == "__future__", node.module


def test_results_are_json_serialisable(src_059, spec):
    for src in (src_059, b"x = (", WRAPPER.encode()):
        json.dumps(public(engine.plan_patch(src, spec)))
        json.dumps(public(engine.plan_unpatch(src, spec)))
        json.dumps(engine.check_structure(src, spec))


def test_engine_bugs_become_internal_verdicts(monkeypatch, spec):
    def boom(*a, **k):
        raise KeyError("simulated bug")

    monkeypatch.setattr(engine, "_core", boom)
    monkeypatch.setattr(engine, "_find_block", boom)
    monkeypatch.setattr(engine, "_Doc", boom)
    assert_failed(engine.plan_patch(WRAPPER.encode(), spec), "internal", "simulated bug", "nothing was changed")
    assert engine.plan_unpatch(WRAPPER.encode(), spec)["error"]["kind"] == "internal"
    assert engine.inspect(WRAPPER.encode(), spec)["error"]["kind"] == "internal"
    assert "simulated bug" in engine.check_structure(WRAPPER.encode(), spec)[0]


def _other_pythons() -> list[str]:
    import glob
    import shutil
    found = {}
    for cand in ["python3.10", "python3.12", "python3.13"] + sorted(glob.glob(os.path.join(os.environ.get("PROVISION_REAL_HOME") or os.path.expanduser("~"), ".pyenv/versions/3.1[0-9]*/bin/python3"))):
        path = shutil.which(cand) if "/" not in cand else cand
        if not path or not os.access(path, os.X_OK):
            continue
        try:
            ver = subprocess.run([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        if ver and ver != "%d.%d" % sys.version_info[:2] and tuple(map(int, ver.split("."))) >= (3, 10):
            found.setdefault(ver, path)
    return [found[v] for v in sorted(found)]


SMOKE = r"""
import json, sys, os, tempfile
sys.path.insert(0, sys.argv[1])
from provision.host.engine import core as engine
from provision.host.ops import fileops
spec = json.loads(sys.argv[2])
src = open(sys.argv[3], "rb").read()
src10 = open(sys.argv[4], "rb").read()
out = {}
r = engine.plan_patch(src, spec)
out["patch"] = r["verdict"]
out["identity"] = engine.plan_unpatch(r["new"], spec)["new"] == src
out["again"] = engine.plan_patch(r["new"], spec)["verdict"]
out["native"] = engine.plan_patch(src10, spec)["verdict"]
hand = src + b"\n    def get_embed_and_head(self):\n        return self.language_model.get_embed_and_head()\n"
out["hand"] = engine.plan_patch(hand, spec)["verdict"]
out["crlf"] = engine.plan_unpatch(engine.plan_patch(src.replace(b"\n", b"\r\n"), spec)["new"], spec)["new"] == src.replace(b"\n", b"\r\n")
out["nul"] = engine.plan_patch(src + b"\0", spec)["error"]["kind"]
out["structure"] = engine.check_structure(r["new"], spec)
with tempfile.TemporaryDirectory() as d:
    p = os.path.join(d, "kimi_k25.py")
    open(p, "wb").write(src)
    fr = fileops.patch_file(p, spec, state_dir=os.path.join(d, "state"), sglang_version="0.5.9")
    out["file"] = fr["verdict"]
    out["file_bytes"] = open(p, "rb").read() == r["new"]
    out["unpatch"] = fileops.unpatch_file(p, spec, state_dir=os.path.join(d, "state"))["verdict"]
    out["restored"] = open(p, "rb").read() == src
    out["debris"] = sorted(n for n in os.listdir(d) if n not in ("kimi_k25.py", "state"))
print(json.dumps(out))
"""


@pytest.mark.parametrize("python", _other_pythons() or [pytest.param(None, marks=pytest.mark.skip(reason="no other Python 3.10+ interpreter found"))])
def test_engine_runs_on_other_host_interpreters(python, src_059, sglang_059, sglang_0510, spec):
    """The engine is shipped as text to hosts and run by their python3 (3.10+)."""
    repo = Path(engine.__file__).resolve().parents[2]
    p = subprocess.run([python, "-c", SMOKE, str(repo), json.dumps(spec),
                        str(sglang_059 / "srt/models/kimi_k25.py"), str(sglang_0510 / "srt/models/kimi_k25.py")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out == {"patch": "patched", "identity": True, "again": "unchanged", "native": "native",
                   "hand": "repaired", "crlf": True, "nul": "syntax", "structure": [], "file": "patched",
                   "file_bytes": True, "unpatch": "unpatched", "restored": True, "debris": []}


def test_block_followed_by_a_hand_added_method_is_left_where_it_is(spec):
    src = b"class KimiK25ForConditionalGeneration:\n    def __init__(self):\n        self.language_model = 1\n"
    extra = b"\n    def extra(self):\n        pass\n"
    new = engine.plan_patch(src, spec)["new"] + extra
    r = engine.plan_patch(new, spec)
    assert r["verdict"] == "unchanged" and r["new"] is None and r["kept"] == METHODS
    assert engine.plan_unpatch(new, spec)["new"] == src + extra
    # a changed spec re-renders it at the end of the class
    bigger = with_spec(methods=KIMI_SPEC["methods"] + [{"name": "extra2", "params": "self"}])
    r2 = engine.plan_patch(new, bigger)
    assert r2["updated"] and method_names(r2["new"]) == ["__init__", "extra"] + METHODS + ["extra2"]
