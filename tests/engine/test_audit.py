"""provision.host.engine.audit against the real SGLang 0.5.9 / 0.5.10 wheels (no SSH).

Every expectation about a real class below was checked by reading the wheel's
source (``sglang/srt/models/<file>.py``); the synthetic packages at the end
exercise resolution rules the real wheels don't happen to use.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from provision.host.engine import audit as audit_mod
from provision.host.engine.audit import audit_models
from provision.tasks import spec_new
from provision.tasks.spec_new import spec_for, spec_yaml
from provision.sandbox.wheels import WheelUnavailable, extracted

AUDIT_PY = Path(audit_mod.__file__)
REPO = Path(__file__).resolve().parents[2]


def _models_dir(version: str) -> Path:
    try:
        return extracted(version) / "sglang" / "srt" / "models"
    except WheelUnavailable as exc:  # pragma: no cover - depends on the registry
        pytest.skip(f"sglang {version} wheel unavailable: {exc}")


@pytest.fixture(scope="module")
def audit59():
    models = _models_dir("0.5.9")
    start = time.perf_counter()
    result = audit_models(str(models))
    print(f"\naudit of sglang 0.5.9 models/ ({result['files_scanned']} files): "
          f"{time.perf_counter() - start:.2f}s")
    return result


@pytest.fixture(scope="module")
def audit510():
    return audit_models(str(_models_dir("0.5.10")))


def gaps(result) -> dict:
    return {w["class"]: w for w in result["wrappers"]}


def inner_names(gap) -> list:
    return [i["class"] for i in gap["inner"]]


# --------------------------------------------------------------------------
# the whole audit
# --------------------------------------------------------------------------

def test_audit_scans_every_model_file_and_is_json(audit59):
    models = _models_dir("0.5.9")
    assert audit59["files_scanned"] == len(list(models.glob("*.py")))
    assert audit59["unparsable"] == []
    assert audit59["models_dir"] == str(models)
    assert json.loads(json.dumps(audit59)) == audit59
    assert {w["verdict"] for w in audit59["wrappers"]} <= set(audit_mod.VERDICTS)
    for w in audit59["wrappers"]:
        assert w["missing"], w["class"]
        assert w["file"].startswith("srt/models/") and w["file"].endswith(".py")
        assert w["reason"].endswith(".")


@pytest.mark.parametrize("cls, file, attr, inner", [
    ("KimiK25ForConditionalGeneration", "srt/models/kimi_k25.py", "language_model", ["DeepseekV3ForCausalLM"]),
    ("KimiVLForConditionalGeneration", "srt/models/kimi_vl.py", "language_model", ["DeepseekV2ForCausalLM"]),
    ("LlavaQwenForCausalLM", "srt/models/llava.py", "language_model", ["Qwen2ForCausalLM"]),
    ("NVILAForConditionalGeneration", "srt/models/nvila.py", "llm", ["Qwen2ForCausalLM"]),
])
def test_fixable_wrappers_059(audit59, cls, file, attr, inner):
    g = gaps(audit59)[cls]
    assert g["verdict"] == "fixable", g["reason"]
    assert (g["file"], g["attr"], inner_names(g)) == (file, attr, inner)
    assert g["missing"] == ["set_eagle3_layers_to_capture", "get_embed_and_head"]
    assert g["forward_runs_inner"] is True
    assert g["inner"][0]["has"] == list(audit_mod.SPEC_METHODS)
    assert g["methods"] == {
        "set_eagle3_layers_to_capture": "self, layer_ids=None",
        "get_embed_and_head": "self",
        "set_embed_and_head": "self, embed, head",
    }


def test_inner_files_are_where_the_inner_class_is_defined(audit59):
    g = gaps(audit59)
    assert g["KimiK25ForConditionalGeneration"]["inner"][0]["file"] == "srt/models/deepseek_v2.py"
    assert g["NVILAForConditionalGeneration"]["inner"][0]["file"] == "srt/models/qwen2.py"
    # MistralLarge3ForCausalLM(DeepseekV3ForCausalLM): inherits all three methods from deepseek_v2.py
    assert g["PixtralForConditionalGeneration"]["inner"] == [{
        "class": "MistralLarge3ForCausalLM", "file": "srt/models/mistral_large_3.py",
        "has": list(audit_mod.SPEC_METHODS), "lacks": [],
    }]


def test_conditional_deepseek_vl2(audit59):
    # deepseek_vl2.py: use_mla -> DeepseekV2ForCausalLM, else DeepseekForCausalLM (deepseek.py, no methods)
    g = gaps(audit59)["DeepseekVL2ForCausalLM"]
    assert g["verdict"] == "conditional"
    assert g["attr"] == "language_model"
    assert g["inner_have"] == ["DeepseekV2ForCausalLM"]
    assert g["inner_lack"] == ["DeepseekForCausalLM"]
    assert "DeepseekForCausalLM" in g["reason"]


def test_conditional_internvl(audit59):
    # internvl.py: an if/elif chain over llm_config.architectures[0]; InternLM2ForCausalLM lacks the methods
    g = gaps(audit59)["InternVLChatModel"]
    assert g["verdict"] == "conditional"
    assert g["inner_lack"] == ["InternLM2ForCausalLM"]
    assert set(g["inner_have"]) == {"Qwen2ForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM", "Qwen3ForCausalLM"}
    lacking = next(i for i in g["inner"] if i["class"] == "InternLM2ForCausalLM")
    assert lacking["file"] == "srt/models/internlm2.py" and lacking["has"] == []


def test_conditional_deepseek_ocr_holds_inner_as_model(audit59):
    g = gaps(audit59)["DeepseekOCRForCausalLM"]
    assert (g["verdict"], g["attr"]) == ("conditional", "model")
    assert g["inner_lack"] == ["DeepseekForCausalLM"]


def test_sarashina2_vision_needs_more(audit59):
    # forward hands self.llm.model to general_mm_embed_routine and runs self.logits_processor itself
    g = gaps(audit59)["Sarashina2VisionForCausalLM"]
    assert g["verdict"] == "needs-more"
    assert g["attr"] == "llm"
    assert inner_names(g) == ["LlamaForCausalLM"]  # both branches of its if/else build a LlamaForCausalLM
    assert g["forward_runs_inner"] is False
    assert "self.llm.model" in g["reason"] and "logits_processor" in g["reason"]


def test_llama4_is_not_a_gap(audit59):
    assert "Llama4ForConditionalGeneration" not in gaps(audit59)
    assert "Llama4ForConditionalGeneration" in audit59["ok_wrappers"]


def test_pixtral_has_get_embed_and_head_but_not_the_other_two(audit59):
    # pixtral.py defines get_embed_and_head (delegating) and neither
    # set_eagle3_layers_to_capture nor set_embed_and_head.
    g = gaps(audit59)["PixtralForConditionalGeneration"]
    assert g["verdict"] == "fixable"
    assert g["missing"] == ["set_eagle3_layers_to_capture"]
    assert g["has"] == ["get_embed_and_head"]
    spec = spec_for(g)
    # no second get_embed_and_head next to the native one
    assert [m["name"] for m in spec["methods"]] == ["set_eagle3_layers_to_capture", "set_embed_and_head"]


def test_unknown_wrappers_say_why(audit59):
    g = gaps(audit59)
    llava = g["LlavaForConditionalGeneration"]  # inner class from ModelRegistry.resolve_model_cls
    assert llava["verdict"] == "unknown" and llava["attr"] == "language_model"
    assert "resolve_model_cls" in llava["reason"]
    mistral3 = g["Mistral3ForConditionalGeneration"]  # __getattr__ -> self.inner (a LlavaForConditionalGeneration)
    assert mistral3["verdict"] == "unknown" and mistral3["attr"] == "inner"
    assert inner_names(mistral3) == ["LlavaForConditionalGeneration"]
    assert "__getattr__" in mistral3["reason"]
    minicpmv = g["MiniCPMV"]  # version-keyed dict of classes + __getattr__ -> self.minicpmv
    assert minicpmv["verdict"] == "unknown" and minicpmv["attr"] == "minicpmv"


def test_inner_without_methods_needs_more(audit59):
    g = gaps(audit59)["Gemma3ForConditionalGeneration"]
    assert g["verdict"] == "needs-more"
    assert g["inner_lack"] == ["Gemma3ForCausalLM"]


def test_factory_method_inner_is_resolved(audit59):
    # minicpmo.py: self.llm = self.init_llm(...) and MiniCPMO.init_llm returns Qwen2ForCausalLM(...)
    g = gaps(audit59)["MiniCPMO"]
    assert (g["verdict"], g["attr"], inner_names(g)) == ("fixable", "llm", ["Qwen2ForCausalLM"])


def test_non_wrappers_are_never_listed(audit59):
    listed = set(gaps(audit59)) | set(audit59["ok_wrappers"])
    for plain in ("LlamaForCausalLM", "DeepseekV3ForCausalLM", "Qwen2ForCausalLM", "Qwen2VLForConditionalGeneration"):
        assert plain not in listed


def test_kimi_k25_is_not_a_gap_on_0510(audit510):
    assert "KimiK25ForConditionalGeneration" not in gaps(audit510)
    assert "KimiK25ForConditionalGeneration" in audit510["ok_wrappers"]
    assert gaps(audit510)["KimiVLForConditionalGeneration"]["verdict"] == "fixable"


# --------------------------------------------------------------------------
# specs and playbook YAML
# --------------------------------------------------------------------------

def test_spec_for_kimi_k25_matches_the_shipped_playbook(audit59):
    spec = spec_for(gaps(audit59)["KimiK25ForConditionalGeneration"])
    assert spec == {
        "name": "kimi-k25-eagle3",
        "file": "srt/models/kimi_k25.py",
        "class": "KimiK25ForConditionalGeneration",
        "delegate": "language_model",
        "methods": [
            {"name": "set_eagle3_layers_to_capture", "params": "self, layer_ids=None"},
            {"name": "get_embed_and_head", "params": "self"},
            {"name": "set_embed_and_head", "params": "self, embed, head"},
        ],
    }
    shipped = yaml.safe_load((REPO / "playbooks" / "kimi-k25-eagle3.yaml").read_text())
    assert {k: v for k, v in spec.items() if k != "name"} == shipped["patch"]
    assert spec["name"] == shipped["name"]


@pytest.mark.parametrize("cls, delegate", [
    ("KimiVLForConditionalGeneration", "language_model"),
    ("NVILAForConditionalGeneration", "llm"),
    ("DotsOCRForCausalLM", "model"),
])
def test_spec_yaml_round_trips(audit59, cls, delegate):
    gap = gaps(audit59)[cls]
    assert gap["verdict"] == "fixable"
    spec = spec_for(gap)
    assert spec["delegate"] == delegate
    text = spec_yaml(spec, f"Generated by `provision audit` from sglang 0.5.9: {cls}.\nsecond line: #1")
    print(text)
    loaded = yaml.safe_load(text)
    assert set(loaded) == {"name", "description", "patch"}
    assert loaded["name"] == spec["name"]
    assert loaded["patch"] == {k: v for k, v in spec.items() if k != "name"}
    assert cls in loaded["description"] and f"self.{delegate}" in loaded["description"]
    assert text.startswith("# Generated by `provision audit`")


def test_spec_names():
    assert spec_new._kebab("KimiK25ForConditionalGeneration") == "kimi-k25"
    assert spec_new._kebab("KimiVLForConditionalGeneration") == "kimi-vl"
    assert spec_new._kebab("DeepseekVL2ForCausalLM") == "deepseek-vl2"
    assert spec_new._kebab("NVILAForConditionalGeneration") == "nvila"
    assert spec_new._kebab("LlavaQwenForCausalLM") == "llava-qwen"
    assert spec_new._kebab("Qwen2AudioForConditionalGeneration") == "qwen2-audio"
    assert spec_new._kebab("NemotronH_Nano_VL_V2") == "nemotron-h-nano-vl-v2"


def test_spec_for_refuses_what_delegation_cannot_fix(audit59):
    g = gaps(audit59)
    with pytest.raises(ValueError, match="needs-more"):
        spec_for(g["Sarashina2VisionForCausalLM"])
    with pytest.raises(ValueError, match="unknown"):
        spec_for(g["LlavaForConditionalGeneration"])
    with pytest.raises(ValueError, match="conditional.*DeepseekForCausalLM.*allow_conditional"):
        spec_for(g["DeepseekVL2ForCausalLM"])
    with pytest.raises(ValueError, match="no 'attr'"):
        spec_for({"class": "X", "file": "srt/models/x.py", "verdict": "fixable"})
    spec = spec_for(g["DeepseekVL2ForCausalLM"], allow_conditional=True)
    assert (spec["name"], spec["delegate"]) == ("deepseek-vl2-eagle3", "language_model")
    assert spec["methods"][0] == {"name": "set_eagle3_layers_to_capture", "params": "self, layer_ids=None"}


def test_spec_yaml_quotes_awkward_values():
    spec = {
        "name": "odd-eagle3", "file": "srt/models/odd file.py", "class": "Odd", "delegate": "yes",
        "methods": [{"name": "set_eagle3_layers_to_capture", "params": 'self, layer_ids=None, tag="a: #b"'}],
    }
    loaded = yaml.safe_load(spec_yaml(spec, "note with: colon\n\nand # hash"))
    assert loaded["patch"] == {k: v for k, v in spec.items() if k != "name"}
    with pytest.raises(ValueError, match="no 'file'"):
        spec_yaml({"name": "x"}, "")


# --------------------------------------------------------------------------
# audit.py ships to the hosts in the bundle with the rest of provision/host/: stdlib only,
# Python 3.10, and of provision only the host package (its AST helpers are the engine's own,
# engine/pysource.py; it no longer runs as a lone file, see the module docstring)
# --------------------------------------------------------------------------

def test_audit_imports_only_stdlib_and_the_host_package():
    top, ours = set(), set()
    files = [AUDIT_PY, AUDIT_PY.with_name("audit_index.py"), AUDIT_PY.with_name("audit_cli.py"),
             AUDIT_PY.with_name("skeletons.py")]
    nodes = [node for f in files for node in ast.walk(ast.parse(f.read_text(), feature_version=(3, 10)))]
    for node in nodes:
        if isinstance(node, ast.Import):
            top |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            if node.module.startswith("provision."):
                ours.add(node.module)
            else:
                top.add(node.module.partition(".")[0])
    assert top, "expected some imports"
    assert top <= set(sys.stdlib_module_names) | {"__future__"}, top - set(sys.stdlib_module_names)
    assert "sglang" not in top
    assert ours == {"provision.host.engine.pysource", "provision.host.engine.audit_index", "provision.host.engine.audit",
                    "provision.host.engine.skeletons", "provision.host.lib"}


def test_audit_runs_as_a_module_of_the_host_package(tmp_path):
    models = _fake_package(tmp_path, {"wrap.py": WRAP_SRC, "inner.py": INNER_SRC})
    proc = subprocess.run(
        [sys.executable, "-m", "provision.host.engine.audit_cli", str(models)],
        capture_output=True, text=True, cwd=AUDIT_PY.parents[3], timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [w["class"] for w in out["wrappers"]] == ["Wrap"]


# --------------------------------------------------------------------------
# synthetic packages: resolution rules the real wheels don't all exercise
# --------------------------------------------------------------------------

INNER_SRC = """
from torch import nn

class InnerForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
    def forward(self, input_ids, positions, forward_batch):
        pass
    def set_eagle3_layers_to_capture(self, layer_ids: "list[int] | None" = None):
        pass
    def get_embed_and_head(self) -> tuple:
        pass
    def set_embed_and_head(self, embed, head):
        pass

class PlainForCausalLM(nn.Module):
    def forward(self, input_ids):
        pass

EntryClass = [InnerForCausalLM] + [PlainForCausalLM]
"""

WRAP_SRC = """
from sglang.srt.models.inner import InnerForCausalLM

class Wrap:
    def __init__(self, config):
        self.language_model = InnerForCausalLM(config)
    def forward(self, input_ids, positions, forward_batch):
        return self.language_model(input_ids, positions, forward_batch)

EntryClass = Wrap
"""


def _fake_package(root: Path, models: dict, extra: dict | None = None) -> Path:
    pkg = root / "sglang"
    (pkg / "srt" / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for name, src in models.items():
        (pkg / "srt" / "models" / name).write_text(textwrap.dedent(src))
    for rel, src in (extra or {}).items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(src))
    return pkg / "srt" / "models"


def _audit(tmp_path, models: dict, extra: dict | None = None) -> dict:
    return audit_models(str(_fake_package(tmp_path, models, extra)))


def test_synthetic_direct_wrapper_and_params(tmp_path):
    result = _audit(tmp_path, {"inner.py": INNER_SRC, "wrap.py": WRAP_SRC})
    (g,) = result["wrappers"]
    assert (g["class"], g["file"], g["attr"], g["verdict"]) == ("Wrap", "srt/models/wrap.py", "language_model", "fixable")
    assert g["methods"]["set_eagle3_layers_to_capture"] == "self, layer_ids=None"  # annotation stripped
    assert g["methods"]["get_embed_and_head"] == "self"


def test_synthetic_import_styles_and_entry_forms(tmp_path):
    models = {
        "inner.py": INNER_SRC,
        "rel.py": """
            from .inner import InnerForCausalLM as Inner
            class RelWrap:
                def __init__(self, config):
                    self.llm = Inner(config)
                def forward(self, input_ids, positions, forward_batch):
                    return general_mm_embed_routine(input_ids, forward_batch, self.llm, positions=positions)
            EntryClass = [RelWrap]
        """,
        "alias.py": """
            import sglang.srt.models.inner as m
            import sglang.srt.models.inner
            from sglang.srt.models import inner as inner_mod
            class A:
                def __init__(self, config):
                    self.model = m.InnerForCausalLM(config)
                def forward(self, *a):
                    return mm_utils.general_mm_embed_routine(language_model=self.model)
            class B:
                def __init__(self, config):
                    self.model = sglang.srt.models.inner.InnerForCausalLM(config)
                def forward(self, *a):
                    return self.model.forward(*a)
            class C:
                def __init__(self, config):
                    self.lm = inner_mod.InnerForCausalLM(config)
                def forward(self, *a):
                    lm = self.lm
                    return lm(*a)
            ENTRIES = [A, B]
            EntryClass = ENTRIES + [C]
        """,
    }
    g = gaps(_audit(tmp_path, models))
    assert {k: (v["attr"], v["verdict"]) for k, v in g.items()} == {
        "RelWrap": ("llm", "fixable"),
        "A": ("model", "fixable"),
        "B": ("model", "fixable"),
        "C": ("lm", "fixable"),
    }


def test_synthetic_conditionals_and_dynamic(tmp_path):
    models = {
        "inner.py": INNER_SRC,
        "cond.py": """
            from sglang.srt.models.inner import InnerForCausalLM, PlainForCausalLM
            import importlib
            CLASSES = {"a": InnerForCausalLM, "b": InnerForCausalLM}
            class Ternary:
                def __init__(self, config):
                    self.language_model = InnerForCausalLM(config) if config.x else PlainForCausalLM(config)
                def forward(self, *a):
                    return self.language_model(*a)
            class Lookup:
                def __init__(self, config):
                    cls = CLASSES[config.kind]
                    self.language_model = cls(config)
                def forward(self, *a):
                    return self.language_model(*a)
            class Dynamic:
                def __init__(self, config):
                    self.language_model = getattr(importlib.import_module(config.mod), config.name)(config)
                def forward(self, *a):
                    return self.language_model(*a)
            class Bypass:
                def __init__(self, config):
                    self.llm = InnerForCausalLM(config)
                def forward(self, *a):
                    h = general_mm_embed_routine(language_model=self.llm.model)
                    return self.logits_processor(h, self.llm.lm_head)
            class Loopy:  # self-referential locals must not hang the audit
                def __init__(self, config):
                    a = b
                    b = a or b
                    self.language_model = a(config) if config.x else InnerForCausalLM(config)
                def forward(self, *a):
                    return self.language_model(*a)
            EntryClass = [Ternary, Lookup, Dynamic, Bypass, Loopy]
        """,
        "broken.py": "class Broken(:\n    pass\n",
    }
    result = _audit(tmp_path, models)
    g = gaps(result)
    assert g["Ternary"]["verdict"] == "conditional"
    assert (g["Ternary"]["inner_have"], g["Ternary"]["inner_lack"]) == (["InnerForCausalLM"], ["PlainForCausalLM"])
    assert g["Lookup"]["verdict"] == "fixable"  # a literal dict of classes resolves statically
    assert g["Dynamic"]["verdict"] == "unknown" and "getattr" in g["Dynamic"]["reason"]
    assert g["Bypass"]["verdict"] == "needs-more"
    assert (g["Loopy"]["verdict"], g["Loopy"]["inner_have"]) == ("fixable", ["InnerForCausalLM"])
    assert [u["file"] for u in result["unparsable"]] == ["srt/models/broken.py"]
    assert result["files_scanned"] == 3


def test_synthetic_methods_inherited_from_outside_models(tmp_path):
    mixin = """
        class EagleMixin:
            def set_eagle3_layers_to_capture(self, layer_ids=None, *extra, strict: bool = False, **kw):
                pass
            def get_embed_and_head(self):
                pass
    """
    models = {
        "inner.py": """
            from torch import nn
            from sglang.srt.layers.mixins import EagleMixin
            class MixedForCausalLM(nn.Module, EagleMixin):
                pass
            class Backbone(nn.Module):
                pass
            EntryClass = MixedForCausalLM
        """,
        "wrap.py": """
            from sglang.srt.models.inner import MixedForCausalLM, Backbone
            from sglang.srt.layers.mixins import EagleMixin
            class Gap:
                def __init__(self, config):
                    self.language_model = MixedForCausalLM(config)
                    self.backbone = Backbone(config)
                def forward(self, *a):
                    return self.language_model(*a)
            class Covered(Gap, EagleMixin):
                pass
            class NotAWrapper:
                def __init__(self, config):
                    self.model = Backbone(config)
            EntryClass = [Gap, Covered, NotAWrapper]
        """,
    }
    result = _audit(tmp_path, models, {"srt/layers/mixins.py": mixin})
    g = gaps(result)
    assert list(g) == ["Gap"]
    assert g["Gap"]["verdict"] == "fixable"
    assert g["Gap"]["inner"][0]["lacks"] == ["set_embed_and_head"]
    assert g["Gap"]["methods"]["set_eagle3_layers_to_capture"] == "self, layer_ids=None, *extra, strict=False, **kw"
    assert result["ok_wrappers"] == ["Covered"]
    spec = spec_for(g["Gap"])
    # the inner has no set_embed_and_head: the parity method gets the default signature
    assert spec["methods"][2] == {"name": "set_embed_and_head", "params": "self, embed, head"}


def test_synthetic_inner_models_not_registered_inherited_or_run_by_assignment(tmp_path):
    """issue 43 item 5: an attribute holding a model that has a method the wrapper lacks counts,
    whether that model is registered or not, defines the method or inherits it, and whether the
    wrapper's forward calls it or is it (`self.forward = self.thinker.forward`); one holding a
    class with none of the lacking methods does not."""
    models = {
        "inner.py": """
            from torch import nn
            class Base(nn.Module):
                def set_eagle3_layers_to_capture(self, layer_ids=None):
                    pass
                def get_embed_and_head(self):
                    pass
            class Thinker(Base):
                def forward(self, *a):
                    pass
            class HalfModel(nn.Module):
                def set_eagle3_layers_to_capture(self, layer_ids=None):
                    pass
            class Vision(nn.Module):
                pass
        """,
        "wrap.py": """
            from sglang.srt.models.inner import Thinker, HalfModel, Vision
            class Omni:
                def __init__(self, config):
                    self.thinker = Thinker(config)
                    self.forward = self.thinker.forward
            class Mtp:
                def __init__(self, config):
                    self.model = HalfModel(config)
                def forward(self, *a):
                    return self.model(*a)
                def get_embed_and_head(self):
                    pass
            class OnlyVision:
                def __init__(self, config):
                    self.vision = Vision(config)
                def forward(self, *a):
                    return self.vision(*a)
            class HalfOfWhatItLacks:
                def __init__(self, config):
                    self.model = HalfModel(config)
                def forward(self, *a):
                    return self.model(*a)
            EntryClass = [Omni, Mtp, OnlyVision, HalfOfWhatItLacks]
        """,
    }
    g = gaps(_audit(tmp_path, models))
    assert sorted(g) == ["HalfOfWhatItLacks", "Mtp", "Omni"], g
    assert (g["Omni"]["attr"], g["Omni"]["verdict"], inner_names(g["Omni"])) == ("thinker", "fixable", ["Thinker"])
    assert g["Omni"]["forward_runs_inner"] is True
    assert (g["Mtp"]["missing"], g["Mtp"]["verdict"]) == (["set_eagle3_layers_to_capture"], "fixable")
    assert "HalfModel, which has set_eagle3_layers_to_capture, and forward runs it" in g["Mtp"]["reason"]
    assert g["HalfOfWhatItLacks"]["verdict"] == "needs-more"
    assert "lacks get_embed_and_head" in g["HalfOfWhatItLacks"]["reason"]
