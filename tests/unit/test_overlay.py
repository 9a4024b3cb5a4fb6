"""Overlay mode's pure parts: rendering, the releases that support it, the environment, which fix
a server uses, and how status counts a staged overlay. The rendering is checked on the real 0.5.9,
0.5.10 and 0.5.23 files (staged by the host op's own functions, no host)."""

from __future__ import annotations

import ast
import json

import pytest

from provision.config.playbook import load_patch_spec
from provision.host import inference
from provision.host.engine import overlay as render
from provision.sandbox import wheels
from provision.tasks.patch import overlay_state

SGLANG = inference.get("sglang")

METHODS = ["set_eagle3_layers_to_capture", "get_embed_and_head", "set_embed_and_head"]


def kimi():
    return load_patch_spec("kimi-k25-eagle3").to_engine()


@pytest.mark.parametrize("version, refused", [
    ("0.5.5.post3", True), ("0.5.5", True), ("0.4.10", True), ("0.5.6", False), ("0.5.6.post1", False),
    ("0.5.9", False), ("0.5.10", False), ("0.5.23", False), ("v0.5.9", False), ("1.0.0", False),
    (None, True), ("", True), ("main", True)])
def test_releases_below_0_5_6_or_unknown_are_refused_with_the_version(version, refused):
    why = render.refusal_for_version(version, SGLANG)
    assert (why is not None) == refused
    if refused:
        assert "0.5.6 or later" in why and "provision patch" in why
        assert (str(version) in why) if version else "unknown" in why


def test_module_per_spec_name():
    assert render.module_for("kimi-k25-eagle3") == "kimi_k25_eagle3"
    assert render.module_for("kimi-vl.eagle3") == "kimi_vl_eagle3"
    assert render.module_for("1st-fix") == "spec_1st_fix"


def test_rendered_module_is_a_same_named_subclass_with_the_engines_methods():
    text = render.render_module(kimi(), METHODS[:2], "0.5.9", SGLANG)
    tree = ast.parse(text)
    imp = next(n for n in tree.body if isinstance(n, ast.ImportFrom))
    assert imp.module == "sglang.srt.models.kimi_k25" and imp.names[0].name == "KimiK25ForConditionalGeneration"
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    assert cls.name == "KimiK25ForConditionalGeneration" and ast.unparse(cls.bases[0]) == imp.names[0].asname
    assert [n.name for n in cls.body if isinstance(n, ast.FunctionDef)] == METHODS[:2]
    entry = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "EntryClass")
    assert ast.unparse(entry.value) == "[KimiK25ForConditionalGeneration]"
    # the methods are the engine's own rendering, said once
    from provision.host.engine import core

    assert core.render_methods(core.validate_spec(kimi()), "    ", "\n", names=METHODS[:2]) in text


def test_environment_puts_the_overlay_first_and_keeps_the_rest():
    assert render.server_env("/o", None, SGLANG) == {"SGLANG_EXTERNAL_MODEL_PACKAGE": "provision_overlay", "PYTHONPATH": "/o"}
    assert render.server_env("/o", "/a:/b", SGLANG)["PYTHONPATH"] == "/o:/a:/b"
    assert render.server_env("/o", "/a:/o::/b", SGLANG)["PYTHONPATH"] == "/o:/a:/b"   # no duplicate, no empty entry
    assert render.env_lines("/o", None, SGLANG) == ["SGLANG_EXTERNAL_MODEL_PACKAGE=provision_overlay", "PYTHONPATH=/o"]
    assert render.env_lines("/o", "/src/python", SGLANG)[1] == "PYTHONPATH=/o:/src/python"


def test_a_profile_that_owns_the_variable_is_refused_by_name():
    assert render.refusal_for_env({}, SGLANG) is None
    assert render.refusal_for_env({"SGLANG_EXTERNAL_MODEL_PACKAGE": "provision_overlay"}, SGLANG) is None
    why = render.refusal_for_env({"SGLANG_EXTERNAL_MODEL_PACKAGE": "atom.plugin.sglang.models"}, SGLANG)
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE=atom.plugin.sglang.models" in why and "will not replace" in why


@pytest.mark.parametrize("env, methods, stale, fix", [
    ({"SGLANG_EXTERNAL_MODEL_PACKAGE": "provision_overlay"}, {"a": "missing"}, False, "overlay"),
    ({"SGLANG_EXTERNAL_MODEL_PACKAGE": "acme"}, {"a": "missing"}, False, "none"),
    ({}, {"a": "native", "b": "native"}, False, "native"),
    ({}, {"a": "ours", "b": "native"}, False, "edited file"),
    ({}, {"a": "ours"}, True, "old code"),               # started before the file was patched
    ({}, {"a": "native", "b": "native"}, True, "old code"),  # ... or upgraded in place: not "native" (issue 63)
    ({}, {"a": "missing", "b": "ours"}, False, "none"),
    ({}, {}, False, "none"),
])
def test_which_fix_a_running_server_uses(env, methods, stale, fix):
    assert render.fix_in_use(env, methods, stale, SGLANG) == fix


def test_status_counts_a_current_overlay_that_holds_the_missing_methods():
    ov = {"root": "/r", "package": "provision_overlay", "current": True, "verdict": "unchanged",
          "specs": [{"methods": METHODS}]}
    missing = {m: "missing" for m in METHODS}
    assert overlay_state("missing", "missing: ...", missing, ov)[0] == "overlay"
    part = dict(ov, specs=[{"methods": METHODS[:1]}])
    assert overlay_state("missing", "why", missing, part)[0] == "missing"
    stale = dict(ov, current=False, verdict="staged")
    v, _, notes = overlay_state("missing", "why", missing, stale)
    assert v == "missing" and "differs from the spec" in notes[0]
    gone = dict(ov, current=False, verdict="native")
    v, _, notes = overlay_state("native", "why", {m: "native" for m in METHODS}, gone)
    assert v == "native" and "no longer needed" in notes[0] and "reconcile" in notes[0]
    named = dict(gone, kept_for=["the persistent server of server-30000.spec.json"])
    v, _, notes = overlay_state("native", "why", {m: "native" for m in METHODS}, named)
    assert v == "native" and "but the persistent server of server-30000.spec.json still names it" in notes[0]
    assert "`provision launch --restart`), then `provision reconcile` removes it" in notes[0]


@pytest.mark.parametrize("version, held", [("0.5.9", METHODS), ("0.5.10", []), ("0.5.23", [])])
def test_staged_on_the_real_files_only_what_the_release_lacks(tmp_path, version, held):
    from provision.host.ops import overlay

    inst = {"path": str(wheels.extracted(version) / "sglang"), "version": version,
            "interpreters": ["/usr/bin/python3"], "pythonpath": ""}
    st = overlay.stage(inst, [kimi()], str(tmp_path))
    assert st["verdict"] == ("staged" if held else "native"), st.get("error")
    assert [m for r in st["specs"] for m in r["methods"]] == held
    if held:
        assert overlay.stage(inst, [kimi()], str(tmp_path))["verdict"] == "unchanged"
        manifest = json.loads((tmp_path / "overlay").glob("*/manifest.json").__next__().read_text())
        assert manifest["digest"] == st["digest"] and manifest["version"] == version
    else:
        assert not (tmp_path / "overlay").exists()


def test_a_spec_whose_class_is_missing_is_refused_by_the_stage(tmp_path):
    from provision.host.ops import overlay

    inst = {"path": str(wheels.extracted("0.5.9") / "sglang"), "version": "0.5.9",
            "interpreters": ["/usr/bin/python3"], "pythonpath": ""}
    st = overlay.stage(inst, [dict(kimi(), **{"class": "NoSuchClass"})], str(tmp_path))
    assert st["verdict"] == "failed" and "NoSuchClass" in st["error"]["message"]


def test_one_module_per_spec_and_a_spec_dropped_later_goes(tmp_path):
    from provision.host.ops import overlay

    inst = {"path": str(wheels.extracted("0.5.9") / "sglang"), "version": "0.5.9",
            "interpreters": ["/usr/bin/python3"], "pythonpath": ""}
    vl = load_patch_spec("kimi-vl-eagle3").to_engine()
    st = overlay.stage(inst, [kimi(), vl], str(tmp_path))
    assert st["verdict"] == "staged", st.get("error")
    assert st["modules"] == ["provision_overlay.kimi_k25_eagle3", "provision_overlay.kimi_vl_eagle3"]
    pkg = next((tmp_path / "overlay").glob("*/provision_overlay"))
    assert sorted(p.name for p in pkg.iterdir()) == ["__init__.py", "kimi_k25_eagle3.py", "kimi_vl_eagle3.py"]
    assert overlay.stage(inst, [kimi()], str(tmp_path))["verdict"] == "staged"   # kimi-vl no longer asked for
    assert sorted(p.name for p in pkg.iterdir()) == ["__init__.py", "kimi_k25_eagle3.py"]


def test_non_delegate_specs_are_not_overlays():
    assert render.is_overlayable(kimi())
    assert not render.is_overlayable(dict(kimi(), kind="replace"))
    assert not render.is_overlayable(dict(kimi(), package="flashinfer"))


def test_a_checkouts_overlay_env_keeps_its_pythonpath_and_an_old_one_is_rewritten(tmp_path):
    # A source checkout (no interpreter of its own: python3 finds it through PYTHONPATH). A unit's
    # EnvironmentFile= replaces the PYTHONPATH its Environment= set, so overlay.env must carry it.
    from provision.host.ops import overlay

    src = wheels.extracted("0.5.9")
    inst = {"path": str(src / "sglang"), "version": "0.5.9", "interpreters": [], "pythonpath": str(src)}
    st = overlay.stage(inst, [kimi()], str(tmp_path / "state"))
    assert st["verdict"] == "staged", st.get("error")
    want = f"PYTHONPATH={st['root']}:{src}"
    assert st["env_lines"][1] == want and st["env"]["PYTHONPATH"] == f"{st['root']}:{src}"
    env_file = next((tmp_path / "state" / "overlay").glob("*/overlay.env"))
    assert env_file.read_text().splitlines()[1] == want
    env_file.write_text(f"SGLANG_EXTERNAL_MODEL_PACKAGE=provision_overlay\nPYTHONPATH={st['root']}\n")  # older provision
    assert overlay.stage(inst, [kimi()], str(tmp_path / "state"), check=True)["verdict"] == "unchanged"
    assert env_file.read_text().splitlines()[1] == f"PYTHONPATH={st['root']}"  # --check writes nothing
    assert overlay.stage(inst, [kimi()], str(tmp_path / "state"))["verdict"] == "unchanged"
    assert env_file.read_text().splitlines()[1] == want


def test_staged_files_are_readable_by_the_server_whatever_the_umask(tmp_path):
    """A container's non-root user reads the overlay through its read-only mount: every staged file
    is 0644 even under root's umask 077 (a hardened host), and no temp file is left beside them."""
    import os

    from provision.host.ops import overlay

    inst = {"path": str(wheels.extracted("0.5.9") / "sglang"), "version": "0.5.9",
            "interpreters": ["/usr/bin/python3"], "pythonpath": ""}
    old = os.umask(0o077)
    try:
        st = overlay.stage(inst, [kimi()], str(tmp_path))
    finally:
        os.umask(old)
    assert st["verdict"] == "staged", st.get("error")
    files = [p for p in (tmp_path / "overlay").rglob("*") if p.is_file()]
    assert files and not [p for p in files if p.name.endswith(".tmp")]
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {p.name: "0o644" for p in files}
