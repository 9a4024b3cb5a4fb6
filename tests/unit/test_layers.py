"""The control side's pieces that the layers restructure made one: failpoints, the audit's patch state."""

from __future__ import annotations

from provision.config.inventory import Host
from provision.tasks.audit import spec_state
from provision.tasks.patch import kill_point, request_for


def test_failpoints_name_the_engine_kill_point(monkeypatch):
    assert kill_point(None) is None and kill_point("") is None
    assert kill_point("after_replace=kill") == "after_replace"
    assert kill_point("x=off; before_read=kill") == "before_read"
    assert kill_point("after_replace") is None  # no action: nothing happens
    monkeypatch.delenv("PROVISION_FAILPOINTS", raising=False)
    assert "kill_at" not in request_for("patch", Host("h"), None)
    monkeypatch.setenv("PROVISION_FAILPOINTS", "before_verify=kill")
    assert request_for("patch", Host("h"), None)["kill_at"] == "before_verify"


def test_audit_patch_state_is_the_status_summary():
    assert spec_state({"spec": "s", "state": "file-missing"}) == "file-missing"
    assert spec_state({"spec": "s", "state": "error: bad", "methods": {}}) == "error: bad"
    assert spec_state({"spec": "s", "methods": {"a": "native", "b": "native"}}) == "native"
    assert spec_state({"spec": "s", "methods": {"a": "native", "b": "ours"}}) == "patched"
    assert spec_state({"spec": "s", "methods": {"a": "ours", "b": "missing"}}) == "not patched"
    assert spec_state({"spec": "s", "methods": {}}) == "not patched"
