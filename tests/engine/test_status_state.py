"""`provision status` verdicts from the engine's read-only view, on the real SGLang files."""

from __future__ import annotations

import copy

from provision.tasks.patch import patch_state
from provision.host.engine import core as engine
from tests.engine.test_engine import HAND_MODULE_LEVEL


def test_each_state_is_named(src_059, src_0510, spec, resolver_059, resolver_0510):
    assert patch_state(engine.inspect(src_059, spec, resolver_059))[0] == "missing"
    patched = engine.plan_patch(src_059, spec, resolver_059)["new"]
    assert patch_state(engine.inspect(patched, spec, resolver_059))[0] == "patched"
    assert patch_state(engine.inspect(src_0510, spec, resolver_0510))[0] == "native"
    assert patch_state(engine.inspect(src_059 + HAND_MODULE_LEVEL.encode(), spec, resolver_059))[0] == "hand-patch"
    assert patch_state(engine.inspect(b"class X:\n    pass\n", spec, resolver_059))[0] == "error"


def test_a_block_that_differs_from_the_spec_is_stale_not_patched(src_059, spec, resolver_059):
    """Issue 9: status read `matches_spec` where the engine writes `matches`, so this showed "patched"."""
    patched = engine.plan_patch(src_059, spec, resolver_059)["new"]
    changed = copy.deepcopy(spec)
    changed["methods"][-1]["params"] = "self, embed, head, extra=None"
    verdict, detail = patch_state(engine.inspect(patched, changed, resolver_059))
    assert verdict == "stale" and "differs from the spec" in detail
    grown = copy.deepcopy(spec)
    grown["methods"].append({"name": "get_input_embeddings", "params": "self"})
    verdict, detail = patch_state(engine.inspect(patched, grown, resolver_059))
    assert verdict == "stale" and "get_input_embeddings" in detail
