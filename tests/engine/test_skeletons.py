"""Preflight's registry read keeps each model file's skeleton between reads (engine/skeletons.py):
the registry from kept skeletons is the registry from the files read whole, over every model file of
real SGLang releases, and a file changed since (a patch, an edit, a removal) is read again."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from provision.host.engine import audit, skeletons

KIMI = "KimiK25ForConditionalGeneration"


@pytest.fixture(params=["sglang_059", "sglang_0523"])
def release(request):
    return request.getfixturevalue(request.param)


def test_the_registry_from_kept_skeletons_is_the_registry_of_the_files(release, tmp_path):
    models = str(release / "srt" / "models")
    whole = audit.registry_of(models, str(release))
    state = str(tmp_path / "state")
    first = audit.registry_of(models, str(release), state)  # reads every file whole and keeps them
    kept = json.load(open(skeletons.cache_path(state, models)))["files"]
    assert len(kept) >= 150, len(kept)  # every model file, and the base classes' files outside models/
    assert oct(os.stat(skeletons.cache_path(state, models)).st_mode & 0o777) == "0o600"
    second = audit.registry_of(models, str(release), state)  # from the skeletons alone
    assert first == whole and second == whole
    assert len(whole) > 150


def test_a_file_changed_since_is_read_again(sglang_059, tmp_path):
    root = tmp_path / "sglang"
    shutil.copytree(sglang_059, root)
    models = str(root / "srt" / "models")
    state = str(tmp_path / "state")
    before = audit.registry_of(models, str(root), state)
    assert before[KIMI]["missing"] == ["set_eagle3_layers_to_capture", "get_embed_and_head"]
    # the fix written into the class (what `provision patch` does), in a skeleton-kept file
    path = root / "srt" / "models" / "kimi_k25.py"
    text = path.read_text()
    at = text.index("    def load_weights(")
    path.write_text(text[:at] + "    def set_eagle3_layers_to_capture(self, layer_ids=None):\n"
                    "        return self.language_model.set_eagle3_layers_to_capture(layer_ids)\n\n"
                    "    def get_embed_and_head(self):\n        return self.language_model.get_embed_and_head()\n\n"
                    + text[at:])
    after = audit.registry_of(models, str(root), state)
    assert after[KIMI]["missing"] == [] and after == audit.registry_of(models, str(root))
    # a model file removed: its class is gone, and so is its kept copy
    (root / "srt" / "models" / "kimi_k25.py").unlink()
    gone = audit.registry_of(models, str(root), state)
    assert KIMI not in gone
    assert not any(p.endswith("kimi_k25.py") for p in json.load(open(skeletons.cache_path(state, models)))["files"])


def test_a_damaged_copy_or_a_file_that_does_not_parse_is_read_from_the_file(sglang_059, tmp_path):
    root = tmp_path / "sglang"
    shutil.copytree(sglang_059, root)
    models = str(root / "srt" / "models")
    state = str(tmp_path / "state")
    whole = audit.registry_of(models, str(root))
    audit.registry_of(models, str(root), state)
    cache = skeletons.cache_path(state, models)
    doc = json.load(open(cache))
    key = next(p for p in doc["files"] if p.endswith("kimi_k25.py"))
    doc["files"][key][2] = "class (:\n"  # a copy that does not parse: the file is read instead
    json.dump(doc, open(cache, "w"))
    assert audit.registry_of(models, str(root), state) == whole
    open(cache, "w").write("{not json")  # a cache that does not load: every file read whole
    assert audit.registry_of(models, str(root), state) == whole
    (root / "srt" / "models" / "kimi_k25.py").write_text("class Broken(:\n")
    assert KIMI not in audit.registry_of(models, str(root), state)
    assert not any(p.endswith("kimi_k25.py") for p in json.load(open(cache))["files"])


def test_a_function_whose_body_is_on_its_def_line_is_kept_whole():
    import ast

    text = ("import os\n\nclass A(Base):\n    x = 1\n\n    def f(self): return 1\n\n"
            "    @property\n    def g(\n        self,\n    ) -> int:\n        y = 2\n        return y\n\n"
            "def h():\n    def inner():\n        pass\n    return inner\n\nEntryClass = [A]\n")
    out = skeletons.skeleton(text, ast.parse(text))
    assert out == ("import os\n\nclass A(Base):\n    x = 1\n\n    def f(self): return 1\n\n"
                   "    @property\n    def g(\n        self,\n    ) -> int:\n        ...\n\n"
                   "def h():\n    ...\n\nEntryClass = [A]\n")
