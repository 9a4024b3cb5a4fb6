"""What the image's class needs and how status shows a container server (pure)."""

import pytest

from provision.host.ops.container import image_fix
from provision.tasks.container import container_status


@pytest.mark.parametrize("methods,kind,missing", [
    ({"a": "native", "b": "native"}, "native", []),
    ({"a": "patched", "b": "native"}, "in-image", []),   # provision's block baked into the image
    ({"a": "missing", "b": "native"}, "missing", ["a"]),
    ({"a": "missing", "b": "missing"}, "missing", ["a", "b"]),
])
def test_image_fix_from_the_engine_inspection(methods, kind, missing):
    assert image_fix({"methods": methods, "file": "/f.py"}) == {"kind": kind, "missing": missing, "file": "/f.py"}


def test_image_fix_without_a_judgement_is_none():
    assert image_fix(None)["kind"] == "none"
    assert image_fix({"error": {"message": "class not found"}})["kind"] == "none"


def _answer(kind, *, fix=None, overlay=None, running=True, health=200, missing=("get_embed_and_head",)):
    rec = {"port": 30000, "fix": fix, "overlay": overlay,
           "container": {"name": "sglang-30000", "runtime": "podman", "id": "abc123", "image": "img:1",
                         "sglang": "0.5.9", "install_path": "/sgl-workspace/sglang/python/sglang",
                         "fix": {"kind": kind, "missing": list(missing) if kind == "missing" else [],
                                 "file": "/sgl-workspace/sglang/python/sglang/srt/models/kimi_k25.py"}}}
    return {"ok": False, "error": {"kind": "not-found", "message": "no SGLang install"},
            "server": {"record": rec, "running": running, "health": health, "uptime": 3.0,
                       "container": {"status": "running" if running else "exited"}}}


@pytest.mark.parametrize("kind,fix,overlay,verdict", [
    ("native", "native", None, "native"),
    ("in-image", None, None, "patched"),
    ("missing", "overlay", {"root": "/var/lib/provision/overlay/k"}, "overlay"),
    ("missing", None, None, "missing"),
    ("none", None, None, "error"),
])
def test_status_verdict_follows_the_image_and_the_fix(kind, fix, overlay, verdict):
    r = container_status("gpu01", _answer(kind, fix=fix, overlay=overlay))
    assert r.verdict == verdict
    assert "container sglang-30000 (podman, id abc123, running) image img:1 with SGLang 0.5.9" in r.detail
    assert r.version == "0.5.9" and r.data["install_kind"] == "container"
    assert r.data["server_state"] == "up"


def test_status_of_a_stopped_or_exited_container():
    r = container_status("gpu01", _answer("native", running=False))
    assert r.data["server_state"] == "gone"
    a = _answer("native", running=False)
    a["server"]["exit"] = 1
    assert container_status("gpu01", a).data["server_state"] == "exited 1"
    a["server"]["record"]["stopped_at"] = 1.0
    assert container_status("gpu01", a).data["server_state"] == "stopped"
