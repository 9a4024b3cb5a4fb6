"""`provision ... --local` on a venv of real SGLang, then Python itself imports what it left.

Each test has its own small venv (conftest.py): a private copy of `sglang` in its site-packages,
torch and the rest from the cached venv. What is asserted is what a fresh interpreter sees: where
the methods live (the class's own __dict__ or the module), whether a call on an instance reaches
`language_model` with its arguments and comes back with its return value, and which class SGLang's
own ModelRegistry resolves the architecture to.
"""

from __future__ import annotations

import os

import pytest

from tests.cli.helpers import KIMI, run, run_json
from tests.realimport.conftest import KIMI_MODULE, METHODS, python_sees, sm120_sees

# each test imports a real SGLang on CPU torch in a scratch venv of its own, some twice: 150-190 s
# on CI's machine beside the real-vLLM modules, at the edge of the default 180 s x pace there
pytestmark = [pytest.mark.realimport, pytest.mark.timeout(420)]

ALL_OK = {m: "ok" for m in METHODS}
BOUND = {m: True for m in METHODS}
ABSENT = {m: False for m in METHODS}
# The seed's hand patch, as users pasted it: at column 0 (imports, binds nothing) ...
HAND_COLUMN0 = b"""

# EAGLE-3 fix (added by hand)
def set_eagle3_layers_to_capture(self, layer_ids=None):
    return self.language_model.set_eagle3_layers_to_capture(layer_ids)

def get_embed_and_head(self):
    return self.language_model.get_embed_and_head()

def set_embed_and_head(self, embed, head):
    return self.language_model.set_embed_and_head(embed, head)
"""
# ... and indented, after the module-level EntryClass line (an IndentationError at import).
HAND_INDENTED = b"""
    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.language_model.set_eagle3_layers_to_capture(layer_ids)

    def get_embed_and_head(self):
        return self.language_model.get_embed_and_head()

    def set_embed_and_head(self, embed, head):
        self.language_model.set_embed_and_head(embed, head)
"""


def local(venv, state):
    return ["--local", "--sglang-path", str(venv.sglang), "--state-dir", str(state)]


def notes(doc) -> str:
    return "\n".join(doc["hosts"][0]["notes"])


def assert_bound(seen, venv, where="class"):
    """Python binds the three methods on the class, and each delegates to language_model."""
    assert "import_error" not in seen, seen
    assert seen["file"] == os.path.realpath(venv.file(KIMI)), "Python must import the test's own copy"
    assert seen["module_functions"] == []
    cls = seen[where]
    assert cls["in_class_dict"] == BOUND, cls
    assert cls["delegates"] == ALL_OK, cls


def test_patch_local_then_python_binds_the_methods_and_registry_resolves_it(base_059, trusted_dir, make_venv):
    venv = make_venv(base_059, trusted_dir / "env")
    original = venv.file(KIMI).read_bytes()
    before = python_sees(venv.python)
    assert before["class"]["hasattr"] == ABSENT  # the released 0.5.9 class lacks them

    proc, doc = run_json("patch", *local(venv, trusted_dir / "state"), "--verify-import")
    assert proc.returncode == 0, proc.stderr
    assert doc["hosts"][0]["verdict"] == "patched"
    assert "verify-import: ok" in notes(doc)
    seen = python_sees(venv.python, registry=True)
    assert_bound(seen, venv)
    reg = seen["registry"]
    assert reg["arch"] == "KimiK25ForConditionalGeneration" and reg["same_as_module_class"], reg
    assert reg["module"] == KIMI_MODULE and reg["file"] == seen["file"]

    # unpatch: the released bytes, and Python sees the class without the methods again
    run("unpatch", *local(venv, trusted_dir / "state"), check_rc=0)
    assert venv.file(KIMI).read_bytes() == original
    after = python_sees(venv.python)
    assert after["class"]["in_class_dict"] == ABSENT and after["class"]["hasattr"] == ABSENT
    assert after["module_functions"] == []


@pytest.mark.parametrize("form", ["column0", "indented"])
def test_seed_hand_patch_is_repaired_and_python_binds_the_methods(base_059, trusted_dir, make_venv, form):
    venv = make_venv(base_059, trusted_dir / "env")
    kimi = venv.file(KIMI)
    original = kimi.read_bytes()
    kimi.write_bytes(original + (HAND_COLUMN0 if form == "column0" else HAND_INDENTED))
    hand = python_sees(venv.python)
    if form == "column0":  # imports, but the methods are module-level functions: the class has none
        assert hand["module_functions"] == METHODS and hand["class"]["hasattr"] == ABSENT, hand
    else:
        assert hand.get("import_error") == "IndentationError", hand

    proc, doc = run_json("patch", *local(venv, trusted_dir / "state"))
    assert proc.returncode == 0, proc.stderr
    assert doc["hosts"][0]["verdict"] == "repaired"
    assert_bound(python_sees(venv.python), venv)
    run("unpatch", *local(venv, trusted_dir / "state"), check_rc=0)
    assert kimi.read_bytes() == original


def env_lines(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key in ("SGLANG_EXTERNAL_MODEL_PACKAGE", "PYTHONPATH"):
            out[key] = value
    return out


def test_overlay_write_and_patch_overlay_registry_resolves_to_the_overlay(base_059, trusted_dir, make_venv):
    venv = make_venv(base_059, trusted_dir / "env")
    original = venv.file(KIMI).read_bytes()
    models = sorted(os.listdir(venv.file("srt/models")))

    # `overlay write` (an init container's step): the two lines on stdout
    proc = run("overlay", "write", "--out", str(trusted_dir / "ov"), "--sglang-version", "0.5.9", check_rc=0)
    written = env_lines(proc.stdout)
    assert set(written) == {"SGLANG_EXTERNAL_MODEL_PACKAGE", "PYTHONPATH"}, proc.stdout
    # `patch --overlay` on the install: staged in the state dir, the two lines said
    proc, doc = run_json("patch", *local(venv, trusted_dir / "state"), "--overlay")
    assert proc.returncode == 0, proc.stderr
    staged = env_lines("\n".join(doc["hosts"][0]["notes"]) + "\n" + proc.stdout)
    if not staged:  # the lines are also in the overlay's env file
        found = [os.path.join(d, f) for d, _, fs in os.walk(trusted_dir / "state") for f in fs if f == "overlay.env"]
        assert found, doc
        staged = env_lines(open(found[0]).read())
    assert set(staged) == {"SGLANG_EXTERNAL_MODEL_PACKAGE", "PYTHONPATH"}, doc

    for env in (written, staged):
        seen = python_sees(venv.python, registry=True, env=env)
        reg = seen["registry"]
        assert reg["module"].startswith(env["SGLANG_EXTERNAL_MODEL_PACKAGE"] + "."), reg
        assert reg["name"] == "KimiK25ForConditionalGeneration" and not reg["same_as_module_class"]
        assert reg["in_class_dict"] == BOUND and reg["delegates"] == ALL_OK, reg
        # the built-in class Python imports beside it is the released one
        assert seen["class"]["hasattr"] == ABSENT
    assert venv.file(KIMI).read_bytes() == original, "the overlay leaves kimi_k25.py byte-identical"
    assert sorted(os.listdir(venv.file("srt/models"))) == models


def test_verify_import_runs_the_venvs_own_interpreter(base_059, trusted_dir, make_venv):
    """--sglang-path into a venv no discovery glob finds: the venv's interpreter (its .pth files put
    torch and the CUDA stand-ins on the path) imports the patched class, not python3 from PATH."""
    venv = make_venv(base_059, trusted_dir / "env")
    proc, doc = run_json("patch", *local(venv, trusted_dir / "state"), "--verify-import")
    assert proc.returncode == 0, proc.stderr
    assert doc["hosts"][0]["verdict"] == "patched"
    assert "verify-import: ok (imported; every method is callable on the class)" in notes(doc), notes(doc)


def test_verify_import_of_a_venv_nobody_trusts_names_python(base_059, tmp_path, make_venv):
    """A venv under /tmp (writable by all on the way up) is not run: not-verifiable, naming --python;
    named with --python, it is used (with discovery's warning) and the import is verified."""
    from provision.host.facts.installs import untrusted_reason
    if untrusted_reason(str(tmp_path)) is None:
        pytest.skip(f"{tmp_path} passes the trust rule here (pytest's --basetemp)")
    venv = make_venv(base_059, tmp_path / "env")
    proc, doc = run_json("patch", *local(venv, tmp_path / "state"), "--verify-import")
    assert proc.returncode == 0, proc.stderr
    text = notes(doc)
    assert "verify-import: not-verifiable" in text and "not trusted" in text and "--python" in text, text
    assert "No module named" not in text  # nothing was guessed
    proc, doc = run_json("patch", *local(venv, tmp_path / "state"), "--verify-import", "--python", venv.python)
    assert proc.returncode == 0, proc.stderr
    assert "verify-import: ok" in notes(doc), notes(doc)


def test_verify_import_with_no_owning_interpreter_is_not_verifiable(base_059, trusted_dir):
    """A bare site-packages tree (no venv around it, no interpreter imports it): never python3 +
    PYTHONPATH; not-verifiable, naming --python."""
    import shutil
    from provision.sandbox import realimport_venv as rv
    site = trusted_dir / "site-packages"
    shutil.copytree(rv.site_packages(base_059) / "sglang", site / "sglang", symlinks=True)
    proc, doc = run_json("patch", "--local", "--sglang-path", str(site / "sglang"), "--state-dir",
                         str(trusted_dir / "state"), "--verify-import")
    assert proc.returncode == 0, proc.stderr
    text = notes(doc)
    assert "verify-import: not-verifiable" in text and "--python" in text and "no venv layout" in text, text


def test_sm120_mapping_entry_imports_with_key_12_equal_to_key_10(base_059, trusted_dir, make_venv):
    venv = make_venv(base_059, trusted_dir / "env")
    before = sm120_sees(venv.python)
    assert 12 not in before["keys"] and 10 in before["keys"], before
    proc, doc = run_json("patch", *local(venv, trusted_dir / "state"), "--playbook", "sm120-torch-symm-mem",
                         "--gpu-capability", "12.0")
    assert proc.returncode == 0, proc.stderr
    assert doc["hosts"][0]["verdict"] == "patched", doc
    after = sm120_sees(venv.python)
    assert after["same"] and 12 in after["keys"], after
    assert os.path.realpath(after["file"]) == os.path.realpath(
        venv.file("srt/distributed/device_communicators/all_reduce_utils.py"))


def test_0523_class_is_native_and_verify_import_is_ok(base_0523, trusted_dir, make_venv):
    venv = make_venv(base_0523, trusted_dir / "env")
    original = venv.file(KIMI).read_bytes()
    proc, doc = run_json("patch", *local(venv, trusted_dir / "state"), "--verify-import")
    assert proc.returncode == 0, proc.stderr
    assert doc["hosts"][0]["verdict"] == "native" and doc["hosts"][0]["version"] == "0.5.23"
    assert "verify-import: ok" in notes(doc), notes(doc)
    assert venv.file(KIMI).read_bytes() == original
    seen = python_sees(venv.python, registry=True)
    # upstream's own setters delegate without returning the inner model's value
    native = {"set_eagle3_layers_to_capture": "ok, returns None", "get_embed_and_head": "ok",
              "set_embed_and_head": "ok, returns None"}
    assert seen["file"] == os.path.realpath(venv.file(KIMI)) and seen["module_functions"] == []
    assert seen["class"]["in_class_dict"] == BOUND and seen["class"]["delegates"] == native, seen
    assert seen["registry"]["same_as_module_class"] and seen["registry"]["delegates"] == native
    # the overlay is not needed: nothing staged
    proc, doc = run_json("patch", *local(venv, trusted_dir / "state"), "--overlay")
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "native", doc
    assert venv.file(KIMI).read_bytes() == original
    # the SM120 map still lacks key 12 in 0.5.23: the mapping-entry spec adds it, and it imports
    proc, doc = run_json("patch", *local(venv, trusted_dir / "state"), "--playbook", "sm120-torch-symm-mem",
                         "--gpu-capability", "12.0")
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "patched", doc
    after = sm120_sees(venv.python)
    assert after["same"] and 12 in after["keys"], after
