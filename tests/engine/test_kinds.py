"""The spec kinds mapping-entry and replace, on the real released files (SGLang 0.5.9, 0.5.14,
0.5.23's all_reduce_utils.py; flashinfer-python 0.6.3's jit/comm.py, read from the cached
wheels), and on the layouts a real file may have (CRLF, a trailing comment, an odd indent)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from provision.config.playbook import load_patch_spec
from provision.host.engine import core as engine
from provision.tasks.patch import patch_state

SYMM_FILE = "srt/distributed/device_communicators/all_reduce_utils.py"
SYMM = {"name": "sm120-torch-symm-mem", "kind": "mapping-entry", "file": SYMM_FILE,
        "mapping": "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES", "key": 12, "copy_of": 10}
FUSION = {"name": "sm120-flashinfer-allreduce-fusion", "kind": "replace", "package": "flashinfer",
          "file": "jit/comm.py", "scope": "gen_trtllm_comm_module",
          "find": "supported_major_versions=[9, 10]", "replace": "supported_major_versions=[9, 10, 12]"}
BEGIN = "# >>> provision managed block: spec={} sha={} kind={} (remove with `provision unpatch`)"
END = "# <<< provision managed block: spec={}"


def _unpacked(version: str, dist: str = "sglang") -> Path:
    from provision.sandbox.wheels import WheelUnavailable, extracted
    try:
        return extracted(version, dist)
    except WheelUnavailable as exc:  # pragma: no cover - depends on the network
        pytest.skip(f"{dist} {version} wheel unavailable: {exc}")


def symm_src(version: str) -> bytes:
    return (_unpacked(version) / "sglang" / SYMM_FILE).read_bytes()


@pytest.fixture(scope="module")
def comm_src() -> bytes:
    from provision.sandbox.wheels import FLASHINFER
    return (_unpacked("0.6.3", FLASHINFER) / "flashinfer" / "jit" / "comm.py").read_bytes()


def sha(spec: dict) -> str:
    return engine.block_shas(spec)[0]


def assert_round_trip(src: bytes, spec: dict) -> bytes:
    """Patch, a byte-identical second run, unpatch back to the original bytes; the patched bytes."""
    r = engine.plan_patch(src, spec)
    assert r["verdict"] == "patched" and r["error"] is None, r
    new = r["new"]
    again = engine.plan_patch(new, spec)
    assert again["verdict"] == "unchanged" and again["new"] is None and again["error"] is None, again
    assert engine.check_structure(new, spec) == []
    back = engine.plan_unpatch(new, spec)
    assert back["verdict"] == "unpatched" and back["new"] == src
    assert engine.plan_unpatch(src, spec)["verdict"] == "absent"
    return new


def evaluated_map(text: str) -> dict:
    """TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES as data: its dict literal with `* MiB` taken out
    (sizes in MiB), through ast.literal_eval."""
    tree = ast.parse(text)
    node = next(st.value for st in tree.body if isinstance(st, ast.Assign)
                and getattr(st.targets[0], "id", None) == "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES")
    return ast.literal_eval(re.sub(r"\s*\*\s*MiB", "", ast.get_source_segment(text, node)))


# --------------------------------------------------------------------------- mapping-entry, real files

@pytest.mark.parametrize("version", ["0.5.9", "0.5.14", "0.5.23"])
def test_symm_mem_entry_on_the_released_file(version):
    src = symm_src(version)
    text = src.decode()
    ten = re.search(r"\n    10: (\{\n(?:        .*\n)+    \}),\n", text).group(1)
    expected = text.replace("\n}\n", "\n    " + BEGIN.format(SYMM["name"], sha(SYMM), "mapping-entry") + "\n"
                            + "    12: " + ten + ",\n" + "    " + END.format(SYMM["name"]) + "\n}\n", 1)
    assert expected != text
    new = assert_round_trip(src, SYMM)
    assert new.decode() == expected
    r = engine.plan_patch(src, SYMM)
    assert r["added"] == ["12 in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"]


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_the_patched_map_is_right(version):
    before = evaluated_map(symm_src(version).decode())
    after = evaluated_map(engine.plan_patch(symm_src(version), SYMM)["new"].decode())
    assert sorted(before) == [9, 10] and sorted(after) == [9, 10, 12]
    assert after[12] == after[10] == {2: 64, 4: 64, 6: 128, 8: 128}
    assert {k: after[k] for k in (9, 10)} == before


def test_key_already_present_is_native():
    # upstream fixed it: the released file with a key 12 of its own
    src = symm_src("0.5.9").replace(b"\n}\n", b"\n    12: {\n        8: 64 * MiB,\n    },\n}\n", 1)
    r = engine.plan_patch(src, SYMM)
    assert r["verdict"] == "native" and r["new"] is None and r["native"] == ["12 in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"]
    info = engine.inspect(src, SYMM)
    assert patch_state(info) == ("native", "upstream has it: key 12 is at line 16, in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES")
    # our entry in a file that then got the key natively (an upgrade merged by hand): ours goes
    ours = engine.plan_patch(symm_src("0.5.9"), SYMM)["new"]
    both = ours.replace(b"\n}\n", b"\n    12: {2: 1},\n}\n")
    r = engine.plan_patch(both, SYMM)
    assert r["verdict"] == "patched" and r["new"] == symm_src("0.5.9").replace(b"\n}\n", b"\n    12: {2: 1},\n}\n")
    assert any("now native" in n for n in r["notes"])


def test_symm_mem_states_for_status():
    src = symm_src("0.5.9")
    new = engine.plan_patch(src, SYMM)["new"]
    assert patch_state(engine.inspect(src, SYMM)) == ("missing", "missing: 12 in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES")
    verdict, why = patch_state(engine.inspect(new, SYMM))
    assert verdict == "patched" and "12 in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES" in why
    # someone edited our entry: stale, and patch puts back exactly the rendered entry
    edited = new.replace(b"    12: {\n        2: 64 * MiB", b"    12: {\n        2: 32 * MiB")
    assert patch_state(engine.inspect(edited, SYMM))[0] == "stale"
    r = engine.plan_patch(edited, SYMM)
    assert r["verdict"] == "patched" and r["updated"] and r["new"] == new


# --------------------------------------------------------------------------- mapping-entry, layouts

def test_crlf_odd_indent_and_a_trailing_comment_without_comma():
    src = (b"# sizes\r\nMiB = 1 << 20\r\n\r\nMAP = {\r\n"
           b"   9: {2: 64 * MiB},   # hopper\r\n"
           b"   10: {\r\n"
           b"         2: 64 * MiB,\r\n"
           b"   }  # blackwell: no comma after me\r\n"
           b"}\r\nx = 1")
    spec = dict(SYMM, mapping="MAP", file="x.py")
    new = assert_round_trip(src, spec)
    begin = f"# >>> provision managed block: spec={spec['name']} sha={sha(spec)} kind=mapping-entry comma-added (remove with `provision unpatch`)"
    assert new == (b"# sizes\r\nMiB = 1 << 20\r\n\r\nMAP = {\r\n"
                   b"   9: {2: 64 * MiB},   # hopper\r\n"
                   b"   10: {\r\n"
                   b"         2: 64 * MiB,\r\n"
                   b"   },  # blackwell: no comma after me\r\n"
                   b"   " + begin.encode() + b"\r\n"
                   b"   12: {\r\n"
                   b"         2: 64 * MiB,\r\n"
                   b"   },\r\n"
                   b"   " + END.format(spec["name"]).encode() + b"\r\n"
                   b"}\r\nx = 1")
    assert ast.literal_eval(re.sub(rb"\s*\*\s*MiB", b"", new.split(b"MAP = ")[1].split(b"\r\nx")[0]).decode())[12] == {2: 64}


def test_value_expression_string_keys_in_a_class_body():
    src = (b'class Table:\n'
           b'    ARCH = {\n'
           b'        "sm90": "hopper",\n'
           b'        "sm100": "blackwell",\n'
           b'    }\n')
    spec = {"name": "t", "kind": "mapping-entry", "file": "t.py", "mapping": "Table.ARCH", "key": "sm120",
            "value": '"blackwell-rtx"'}
    new = assert_round_trip(src, spec)
    assert b'        "sm120": "blackwell-rtx",\n' in new
    assert new.index(b'"sm120"') > new.index(b'"sm100"')


@pytest.mark.parametrize("text, kind", [
    ("MAP = dict(a=1)\n", "mapping-layout"),
    ("MAP = {9: 1, 10: 2}\n", "mapping-layout"),          # the closing brace is not on a line of its own
    ("MAP = {\n    **BASE,\n    9: 1,\n}\n", "mapping-layout"),
    ("MAP = {\n    NINE: 1,\n}\n", "mapping-layout"),
    ("OTHER = {\n    9: 1,\n}\n", "mapping-missing"),
    ("MAP = {\n    9: 1,\n}\nMAP = {\n    10: 1,\n}\n", "mapping-ambiguous"),
    ("MAP = {\n    9: 1,\n}\n", "key-missing"),
])
def test_mapping_entry_refusals(text, kind):
    spec = dict(SYMM, mapping="MAP", file="x.py")
    r = engine.plan_patch(text.encode(), spec)
    assert r["verdict"] == "failed" and r["error"]["kind"] == kind and r["new"] is None, r
    assert r["error"]["message"].startswith("expected")


# --------------------------------------------------------------------------- replace, the real file

def test_fusion_replace_on_the_released_file(comm_src):
    old = "        supported_major_versions=[9, 10]\n"
    assert comm_src.decode().count(old) == 1
    expected = comm_src.decode().replace(old, (
        "        " + BEGIN.format(FUSION["name"], sha(FUSION), "replace") + "\n"
        "        # was: supported_major_versions=[9, 10]\n"
        "        supported_major_versions=[9, 10, 12]\n"
        "        " + END.format(FUSION["name"]) + "\n"))
    new = assert_round_trip(comm_src, FUSION)
    assert new.decode() == expected
    assert patch_state(engine.inspect(comm_src, FUSION)) == ("missing", "missing: replace in gen_trtllm_comm_module")
    assert patch_state(engine.inspect(new, FUSION))[0] == "patched"


def test_fragment_twice_in_the_scope_is_refused(comm_src):
    # a later flashinfer has another function with the same call before this one: the module
    # scope holds the fragment twice, the function's scope once
    twice = comm_src.replace(b"def gen_trtllm_comm_module()", b"def gen_mixed_comm_module() -> JitSpec:\n"
                             b"    return current_compilation_context.get_nvcc_flags_list(\n"
                             b"        supported_major_versions=[9, 10]\n    )\n\n\ndef gen_trtllm_comm_module()")
    r = engine.plan_patch(twice, dict(FUSION, scope=None))
    assert r["verdict"] == "failed" and r["error"]["kind"] == "fragment-ambiguous"
    assert r["error"]["message"] == (
        "expected `supported_major_versions=[9, 10]` once in the module (lines 1-{} of jit/comm.py), found it 2 "
        "times (lines 61, 67); narrow the spec's `scope` or `find`".format(twice.count(b"\n")))
    assert_round_trip(twice, FUSION)


def test_fragment_missing_is_refused_with_what_was_expected_where(comm_src):
    other = comm_src.replace(b"supported_major_versions=[9, 10]\n", b"supported_major_versions=[9, 10, 11, 12]\n")
    r = engine.plan_patch(other, FUSION)
    assert r["error"]["kind"] == "fragment-missing"
    assert r["error"]["message"].startswith("expected `supported_major_versions=[9, 10]` once in "
                                            "`gen_trtllm_comm_module` (lines 59-71 of jit/comm.py), found it nowhere")
    # ...but with native_if for how upstream fixed it, it is native
    r = engine.plan_patch(other, dict(FUSION, native_if="supported_major_versions=[9, 10, 11, 12]"))
    assert r["verdict"] == "native" and r["new"] is None
    info = engine.inspect(other, dict(FUSION, native_if="supported_major_versions=[9, 10, 11, 12]"))
    assert patch_state(info)[0] == "native" and "native_if" in patch_state(info)[1]


def test_replacement_already_there_is_native(comm_src):
    fixed = comm_src.replace(b"supported_major_versions=[9, 10]\n", b"supported_major_versions=[9, 10, 12]\n")
    r = engine.plan_patch(fixed, FUSION)
    assert r["verdict"] == "native" and r["new"] is None
    assert r["native"] == ["replace in gen_trtllm_comm_module"]


def test_scope_missing_is_refused(comm_src):
    r = engine.plan_patch(comm_src, dict(FUSION, scope="gen_trtllm_comm_module_v2"))
    assert r["error"]["kind"] == "scope-missing"
    assert "gen_trtllm_comm_module" in r["error"]["message"]


# --------------------------------------------------------------------------- replace, layouts

def test_replace_crlf_trailing_comment_odd_indent_and_no_final_newline():
    src = (b"def f():\r\n"
           b"\tif True:\r\n"
           b"\t   flags = get(archs=[9, 10])  # hopper, blackwell\r\n"
           b"\treturn flags")
    spec = {"name": "r", "kind": "replace", "file": "r.py", "scope": "f", "find": "archs=[9, 10]",
            "replace": "archs=[9, 10, 12]"}
    new = assert_round_trip(src, spec)
    assert new == (b"def f():\r\n"
                   b"\tif True:\r\n"
                   b"\t   " + BEGIN.format("r", sha(spec), "replace").encode() + b"\r\n"
                   b"\t   # was: flags = get(archs=[9, 10])  # hopper, blackwell\r\n"
                   b"\t   flags = get(archs=[9, 10, 12])  # hopper, blackwell\r\n"
                   b"\t   " + END.format("r").encode() + b"\r\n"
                   b"\treturn flags")
    last = {"name": "r", "kind": "replace", "file": "r.py", "find": "return flags", "replace": "return list(flags)"}
    new = assert_round_trip(src, last)
    assert new.endswith(b"\treturn list(flags)\r\n\t" + END.format("r").encode())


def test_replace_refuses_what_comments_cannot_mark():
    inside = b'def f():\n    return """\n    archs=[9, 10]\n    """\n'
    spec = {"name": "r", "kind": "replace", "file": "r.py", "find": "archs=[9, 10]", "replace": "archs=[9, 10, 12]"}
    r = engine.plan_patch(inside, spec)
    assert r["error"]["kind"] == "fragment-layout" and "inside a string" in r["error"]["message"]
    cont = b"x = 1 + \\\n    f(archs=[9, 10])\n"
    assert engine.plan_patch(cont, spec)["error"]["kind"] == "fragment-layout"
    broken = dict(spec, replace="archs=[9, 10, 12")
    r = engine.plan_patch(b"f(archs=[9, 10])\n", broken)
    assert r["error"]["kind"] == "fragment-layout" and "syntax error" in r["error"]["message"]


def test_a_replacement_inside_the_original_is_not_native():
    spec = {"name": "r", "kind": "replace", "file": "r.py", "find": "archs=[9, 10, 11]", "replace": "archs=[9, 10]"}
    r = engine.plan_patch(b"f(archs=[9, 10, 11])\n", spec)
    assert r["verdict"] == "patched"


def test_unpatch_of_a_hand_edited_marker_block_refuses():
    spec = {"name": "r", "kind": "replace", "file": "r.py", "find": "a = 1", "replace": "a = 2"}
    new = engine.plan_patch(b"a = 1\n", spec)["new"]
    broken = b"\n".join(line for line in new.split(b"\n") if b"# was" not in line)
    r = engine.plan_unpatch(broken, spec)
    assert r["verdict"] == "failed" and r["error"]["kind"] == "block-corrupt"


# --------------------------------------------------------------------------- the shipped playbooks

def test_shipped_specs_are_these():
    assert load_patch_spec("sm120-torch-symm-mem").to_engine() == dict(SYMM, applies={"gpu_capability": ["12.0", "12.1"]})
    assert load_patch_spec("sm120-flashinfer-allreduce-fusion").to_engine() == dict(
        FUSION, applies={"gpu_capability": ["12.0", "12.1"]})


@pytest.mark.parametrize("bad, says", [
    ({"kind": "replace", "find": "a", "replace": "a"}, "differs from `find`"),
    ({"kind": "replace", "replace": "a"}, "`find`"),
    ({"kind": "mapping-entry", "mapping": "M", "key": 1}, "exactly one of `value`"),
    ({"kind": "mapping-entry", "mapping": "M", "key": 1, "value": "1", "copy_of": 2}, "exactly one of `value`"),
    ({"kind": "mapping-entry", "mapping": "M", "key": 1, "value": "1 +"}, "expected a Python expression"),
    ({"kind": "mapping-entry", "mapping": "a.b.c", "key": 1, "value": "1"}, "`mapping`"),
    ({"kind": "mapping-entry", "mapping": "M", "key": [1], "value": "1"}, "`key`"),
    ({"kind": "replace", "find": "a", "replace": "b", "scope": "f()"}, "`scope`"),
    ({"kind": "replace", "find": "a", "replace": "b", "package": "flash-infer"}, "`package`"),
    ({"kind": "replace", "find": "a", "replace": "b", "applies": {"flashinfer": "new"}}, "applies.flashinfer"),
    ({"kind": "replace", "find": "a", "replace": "b", "applies": {"gpu_capability": 12}}, "gpu_capability"),
    ({"kind": "patch-it"}, "`kind`"),
])
def test_bad_specs_are_refused_by_the_engine_and_the_playbook(bad, says, tmp_path):
    import yaml

    from provision.config.playbook import parse_playbook
    from provision.errors import ConfigError

    spec = dict({"name": "x", "file": "a/b.py"}, **bad)
    r = engine.plan_patch(b"a = 1\n", spec)
    assert r["error"]["kind"] == "spec" and says in r["error"]["message"], r
    body = {k: v for k, v in spec.items() if k != "name"}
    with pytest.raises(ConfigError, match=re.escape(says) if bad.get("kind") != "patch-it" else "patch.kind"):
        parse_playbook(yaml.safe_dump({"name": "x", "patch": body}), "x.yaml")


def test_a_delegate_spec_is_sent_as_before():
    # no kind/package/applies keys for today's specs: their sha (journal, state) stays the same
    spec = load_patch_spec("kimi-k25-eagle3")
    assert set(spec.to_engine()) == {"name", "file", "class", "delegate", "methods"}
    assert spec.sha == "f654f9839785"  # as before the spec kinds (checked against the parent commit)


def test_a_delegation_block_and_a_replace_edit_in_one_class_leave_each_other_alone(src_059, resolver_059):
    from tests.engine.conftest import KIMI_SPEC

    edit = {"name": "kimi-dtype", "kind": "replace", "file": KIMI_SPEC["file"],
            "scope": "KimiK25ForConditionalGeneration.__init__",
            "find": 'if hasattr(self.language_model, "dtype"):', "replace": 'if getattr(self.language_model, "dtype", None):'}
    one = engine.plan_patch(src_059, edit)["new"]
    both = engine.plan_patch(one, KIMI_SPEC, resolver_059)
    assert both["verdict"] == "patched" and both["notes"] == [], both
    assert engine.plan_patch(both["new"], edit)["verdict"] == "unchanged"
    assert engine.plan_patch(both["new"], KIMI_SPEC, resolver_059)["verdict"] == "unchanged"
    no_edit = engine.plan_unpatch(both["new"], edit)["new"]
    assert no_edit == engine.plan_patch(src_059, KIMI_SPEC, resolver_059)["new"]
    assert engine.plan_unpatch(no_edit, KIMI_SPEC)["new"] == src_059
    assert engine.plan_unpatch(engine.plan_unpatch(both["new"], KIMI_SPEC)["new"], edit)["new"] == src_059
