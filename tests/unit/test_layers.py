"""The control side's pieces that the layers restructure made one: the audit's patch state.

(Failpoints: tests/host/test_bundle.py.)"""

from __future__ import annotations

from provision.tasks.audit import spec_state


def test_audit_patch_state_is_the_status_summary():
    assert spec_state({"spec": "s", "state": "file-missing"}) == "file-missing"
    assert spec_state({"spec": "s", "state": "error: bad", "methods": {}}) == "error: bad"
    assert spec_state({"spec": "s", "methods": {"a": "native", "b": "native"}}) == "native"
    assert spec_state({"spec": "s", "methods": {"a": "native", "b": "ours"}}) == "patched"
    assert spec_state({"spec": "s", "methods": {"a": "ours", "b": "missing"}}) == "not patched"
    assert spec_state({"spec": "s", "methods": {}}) == "not patched"
