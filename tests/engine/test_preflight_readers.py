"""Preflight's readers on the real SGLang wheels 0.5.9, 0.5.10 and 0.5.23: the argument parser
(engine/serverargs.py), the registry (engine/audit.py's index), the EAGLE-3 decision
(engine/modelcheck.py), the shard sizes (engine/safetensors.py), and the host-side gathering
with its cache (ops/preflight_model.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from provision.host import inference
from provision.host.engine import modelcheck, safetensors, serverargs

SGLANG_EAGLE3 = inference.get("sglang").eagle3_methods  # what SGLang's EAGLE-3 worker calls on a target
from provision.host.engine.audit import audit_models

VERSIONS = ("0.5.9", "0.5.10", "0.5.23")


def _sglang(version: str) -> Path:
    from provision.sandbox.wheels import WheelUnavailable, extracted
    try:
        return extracted(version) / "sglang"
    except WheelUnavailable as exc:  # pragma: no cover - depends on the network
        pytest.skip(f"SGLang {version} wheel unavailable: {exc}")


_TABLES: dict = {}
_REGISTRY: dict = {}


def table(version: str) -> dict:
    if version not in _TABLES:
        srt = _sglang(version) / "srt"
        fields = {p.name: p.read_text() for p in sorted((srt / "arg_groups" / "fields").glob("*.py"))}
        choices = srt / "arg_groups" / "choices.py"
        spec = serverargs.parse_server_args((srt / "server_args.py").read_text(), "server_args.py", fields or None,
                                            choices.read_text() if choices.exists() else None)
        _TABLES[version] = serverargs.flag_table(spec)
    return _TABLES[version]


def registry(version: str) -> dict:
    if version not in _REGISTRY:
        d = _sglang(version)
        _REGISTRY[version] = audit_models(str(d / "srt" / "models"), str(d))["registry"]
    return _REGISTRY[version]


# ------------------------------------------------------------------ the flags

def _declared_options(version: str) -> set[str]:
    """Every option string the release declares, found independently of the reader: by regex over
    the add_argument calls of server_args.py, plus (dataclass releases) the annotated fields of
    arg_groups/fields/*.py, their cli_name and aliases, less the no_cli ones."""
    srt = _sglang(version) / "srt"
    text = (srt / "server_args.py").read_text()
    opts = set()
    for m in re.finditer(r"add_argument\(\s*((?:\"-[^\"]+\"\s*,\s*)+)", text):
        opts |= set(re.findall(r"\"(-[^\"]+)\"", m.group(1)))
    fields_dir = srt / "arg_groups" / "fields"
    for path in sorted(fields_dir.glob("*.py")) if fields_dir.is_dir() else []:
        src = path.read_text()
        starts = [(m.start(), m.group(1)) for m in re.finditer(r"^    (\w+): A\[", src, re.M)]
        for i, (pos, name) in enumerate(starts):
            block = src[pos:starts[i + 1][0] if i + 1 < len(starts) else len(src)]
            if "no_cli=True" in block:
                continue
            cli = re.search(r"cli_name=\"(--[\w-]+)\"", block)
            opts.add(cli.group(1) if cli else "--" + name.replace("_", "-"))
            al = re.search(r"aliases=\[([^\]]*)\]", block)
            if al:
                opts |= set(re.findall(r"\"(--[\w-]+)\"", al.group(1)))
    return opts


@pytest.mark.parametrize("version", VERSIONS)
def test_every_flag_of_the_release_is_known(version):
    declared = _declared_options(version)
    assert len(declared) > 300
    t = table(version)
    assert declared - set(t) == set()
    free = {k: dict(v, choices=None) for k, v in t.items()}
    for opt in declared:  # a switch is given as True (the bare flag), a flag with a value a number
        value = True if t[opt].get("switch") else "1"
        assert serverargs.decide(opt, value, free, version) == ("ok", opt), opt


@pytest.mark.parametrize("version", VERSIONS)
def test_misspelt_flag_is_refused_with_the_closest_name(version):
    level, msg = serverargs.decide("speculative-num-stpes", 3, table(version), version)
    assert level == "fail"
    assert f"--speculative-num-stpes is not a flag of SGLang {version}: did you mean --speculative-num-steps" in msg


@pytest.mark.parametrize("version", VERSIONS)
def test_unique_prefix_is_accepted_with_a_note_ambiguous_one_refused(version):
    level, msg = serverargs.decide("speculative-num-step", 3, table(version), version)
    assert level == "warn" and "spell it out as --speculative-num-steps" in msg
    level, msg = serverargs.decide("speculative-num", 3, table(version), version)
    assert level == "fail" and "ambiguous" in msg
    assert "--speculative-num-steps" in msg and "--speculative-num-draft-tokens" in msg


@pytest.mark.parametrize("version", VERSIONS)
def test_the_shipped_profile_flags_are_all_taken(version):
    import yaml
    prof = yaml.safe_load((Path(__file__).parents[2] / "playbooks/kimi-k25-eagle3.yaml").read_text())
    rows = modelcheck.flag_rows(prof["launch"]["args"], table(version), version, None, "SGLang")
    assert [r["level"] for r in rows] == ["ok"], rows


def test_choices_are_judged_where_the_release_declares_them():
    assert serverargs.decide("speculative-algorithm", "EAGLE3", table("0.5.9"), "0.5.9")[0] == "ok"
    level, msg = serverargs.decide("speculative-algorithm", "EAGLE9", table("0.5.9"), "0.5.9")
    assert level == "fail" and "takes one of EAGLE, EAGLE3" in msg
    # 0.5.23 lets algorithms register themselves: no choices, any value goes
    assert serverargs.decide("speculative-algorithm", "EAGLE9", table("0.5.23"), "0.5.23")[0] == "ok"
    assert serverargs.decide("load-format", "bogus", table("0.5.23"), "0.5.23")[0] == "fail"
    assert serverargs.decide("load-format", "safetensors", table("0.5.23"), "0.5.23")[0] == "ok"
    assert serverargs.decide("tp-size", 8, table("0.5.23"), "0.5.23")[0] == "ok"


def test_0523_dataclass_names_aliases_and_boolean_optional():
    t = table("0.5.23")
    assert t["--tensor-parallel-size"]["dest"] == "tp_size" == t["--tp-size"]["dest"]
    assert t["--speculative-draft-model"]["dest"] == "speculative_draft_model_path"
    assert "--speculative-boundary-reduction" not in t  # no_cli
    assert "--disable-cuda-graph" in t  # a remaining add_argument call
    boolopt = [o for o in t if o.startswith("--no-")]
    assert boolopt and all(("--" + o[5:]) in t for o in boolopt)


def test_a_parser_the_reader_does_not_understand_is_an_error_value():
    with pytest.raises(serverargs.ServerArgsUnreadable):
        serverargs.parse_server_args("def broken(:\n", "server_args.py")
    with pytest.raises(serverargs.ServerArgsUnreadable):
        serverargs.parse_server_args("x = 1\n", "server_args.py")
    src = "class ServerArgs:\n    def add_cli_args(parser):\n        add_cli_args_from_dataclass(parser, ServerArgs)\n"
    with pytest.raises(serverargs.ServerArgsUnreadable, match="arg_groups/fields"):
        serverargs.parse_server_args(src, "server_args.py")
    rows = modelcheck.flag_rows({"tp-size": 8}, None, "0.5.99", "server_args.py: no flag declarations", "SGLang")
    assert [r["level"] for r in rows] == ["warn"] and "server_args.py" in rows[0]["message"]


# ------------------------------------------------------------------ the registry and EAGLE-3

def test_mla_eagle3_drafter_is_registered_from_0512_only():
    assert "Eagle3DeepseekV2ForCausalLM" in registry("0.5.23")
    assert "Eagle3DeepseekV2ForCausalLM" not in registry("0.5.9")
    assert "Eagle3DeepseekV2ForCausalLM" not in registry("0.5.10")
    for v in VERSIONS:
        assert "LlamaForCausalLMEagle3" in registry(v) and "KimiK25ForConditionalGeneration" in registry(v)


def _shipped_specs() -> list[dict]:
    from provision.config.playbook import shipped_patch_specs
    return [s.to_engine() for s in shipped_patch_specs()]


def _cfg(arch: str) -> dict:
    return {"file": "/m/config.json", "config": {"architectures": [arch]}, "error": None}


def test_kimi_gap_on_059_maps_to_the_shipped_spec():
    rows = modelcheck.eagle_rows("KimiK25ForConditionalGeneration", registry("0.5.9"), "EAGLE3", _shipped_specs(),
                                 "edit", set(), "0.5.9", eagle3=SGLANG_EAGLE3)
    assert [r["level"] for r in rows] == ["fail"]
    assert rows[0]["spec"] == "kimi-k25-eagle3"
    assert "provision patch --playbook kimi-k25-eagle3" in rows[0]["message"]
    assert "lacks set_eagle3_layers_to_capture, get_embed_and_head" in rows[0]["message"]
    over = modelcheck.eagle_rows("KimiK25ForConditionalGeneration", registry("0.5.9"), "EAGLE3", _shipped_specs(),
                                 "overlay", set(), "0.5.9", eagle3=SGLANG_EAGLE3)
    assert over[0]["level"] == "ok" and "the overlay carries spec kimi-k25-eagle3" in over[0]["message"]
    for v in ("0.5.10", "0.5.23"):  # native from 0.5.10
        rows = modelcheck.eagle_rows("KimiK25ForConditionalGeneration", registry(v), "EAGLE3", _shipped_specs(),
                                     "edit", set(), v, eagle3=SGLANG_EAGLE3)
        assert [r["level"] for r in rows] == ["ok"]


def test_gemma3_gap_on_059_has_no_spec():
    rows = modelcheck.eagle_rows("Gemma3ForConditionalGeneration", registry("0.5.9"), "EAGLE3", _shipped_specs(),
                                 "edit", set(), "0.5.9", eagle3=SGLANG_EAGLE3)
    assert [r["level"] for r in rows] == ["fail"]
    assert "no spec covers the class" in rows[0]["message"]
    assert "provision spec new Gemma3ForConditionalGeneration" in rows[0]["message"]
    assert "set_eagle3_layers_to_capture" in rows[0]["message"]
    # the overlay cannot carry a spec that does not exist
    assert modelcheck.eagle_rows("Gemma3ForConditionalGeneration", registry("0.5.9"), "EAGLE3", _shipped_specs(),
                                 "overlay", set(), "0.5.9", eagle3=SGLANG_EAGLE3)[0]["level"] == "fail"


def test_no_speculative_decoding_no_eagle_check():
    assert modelcheck.eagle_rows("Gemma3ForConditionalGeneration", registry("0.5.9"), None, [], "edit", set(),
                                 "0.5.9", eagle3=SGLANG_EAGLE3) == []


def test_architecture_rows():
    rows, cls = modelcheck.arch_rows("drafter", _cfg("Eagle3DeepseekV2ForCausalLM"), registry("0.5.9"), "0.5.9", True)
    assert cls is None and rows[0]["level"] == "fail"
    assert "Eagle3DeepseekV2ForCausalLM is not registered in SGLang 0.5.9" in rows[0]["message"]
    rows, cls = modelcheck.arch_rows("drafter", _cfg("Eagle3DeepseekV2ForCausalLM"), registry("0.5.23"), "0.5.23",
                                     True)
    assert cls == "Eagle3DeepseekV2ForCausalLM" and rows[0]["level"] == "ok"
    # SGLang's Transformers fallback: not refused
    cfg = dict(_cfg("SomeNewModelForCausalLM"), auto_model=True)
    assert modelcheck.arch_rows("model", cfg, registry("0.5.9"), "0.5.9", False)[0][0]["level"] == "warn"
    # bad input: a warn naming the file, never a refusal
    for bad in ({"file": "/m/config.json", "config": None, "error": "/m/config.json is not JSON (x)"},
                {"file": "/m/config.json", "config": {"model_type": "x"}, "error": None},
                {"file": "/m/config.json", "config": {"architectures": []}, "error": None}):
        rows, cls = modelcheck.arch_rows("model", bad, registry("0.5.9"), "0.5.9", False)
        assert [r["level"] for r in rows] == ["warn"] and "/m/config.json" in rows[0]["message"]


# ------------------------------------------------------------------ safetensors

@pytest.fixture(scope="module")
def st_rust(tmp_path_factory):
    """The real safetensors library (its Rust serializer takes raw bytes: no numpy needed)."""
    from provision.sandbox.wheels import WheelUnavailable, wheel_path
    try:
        whl = wheel_path("0.8.0", "safetensors")
    except WheelUnavailable as exc:  # pragma: no cover
        pytest.skip(f"safetensors wheel unavailable: {exc}")
    dest = tmp_path_factory.mktemp("safetensors-lib")
    with zipfile.ZipFile(whl) as zf:
        zf.extractall(dest)
    sys.path.insert(0, str(dest))
    try:
        from safetensors import _safetensors_rust as rust
        yield rust
    finally:
        sys.path.remove(str(dest))


def _write(rust, path: Path, tensors: dict, metadata=None) -> None:
    """rust.serialize_file with raw zeroed buffers: {name: (dtype, shape, nbytes)}."""
    import ctypes
    bufs = {k: ctypes.create_string_buffer(n) for k, (_, _, n) in tensors.items()}
    specs = {k: rust.TensorSpec(dtype=dt, shape=shape, data_ptr=ctypes.addressof(bufs[k]), data_len=n) for k, (dt, shape, n) in tensors.items()}
    rust.serialize_file(specs, str(path), metadata)


def _head(path: Path) -> bytes:
    with open(path, "rb") as fh:
        first = fh.read(8)
        n = int.from_bytes(first, "little") if len(first) == 8 else 0
        return first + fh.read(n)


def test_shard_size_from_real_headers(st_rust, tmp_path):
    p = tmp_path / "model-00001-of-00001.safetensors"
    _write(st_rust, p, {"a.weight": ("bfloat16", [3, 5], 30), "b.bias": ("float32", [7], 28)}, {"format": "pt"})
    assert safetensors.expected_size(_head(p)) == p.stat().st_size
    # the sandbox's writer makes files the real library reads
    from provision.sandbox.weights import shard_bytes
    q = tmp_path / "sandbox.safetensors"
    q.write_bytes(shard_bytes([("x", 16), ("y", 5)], {"format": "pt"}))
    with st_rust.safe_open(str(q), framework="numpy") as fh:
        assert sorted(fh.keys()) == ["x", "y"]
    assert safetensors.expected_size(_head(q)) == q.stat().st_size


def test_truncated_and_empty_shards_are_caught(st_rust, tmp_path):
    from provision.host.ops.preflight_model import _model_fact
    m = tmp_path / "m"
    m.mkdir()
    names = []
    for i in range(3):
        name = f"model-{i + 1:05d}-of-00003.safetensors"
        _write(st_rust, m / name, {f"w{i}": ("float16", [64], 128)})
        names.append(name)
    (m / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {f"w{i}": n for i, n in enumerate(names)}}))
    (m / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert modelcheck.shard_rows("model", _model_fact(str(m), {}, None, None)["shards"])[0]["level"] == "ok"
    whole = (m / names[1]).read_bytes()
    (m / names[1]).write_bytes(whole[:-40])  # an interrupted copy
    (m / names[2]).write_bytes(b"")  # a zero-length file
    rows = modelcheck.shard_rows("model", _model_fact(str(m), {}, None, None)["shards"])
    assert [r["level"] for r in rows] == ["fail"]
    msg = rows[0]["message"]
    assert "2 of 3 shards are not whole" in msg
    assert f"{names[1]} is {len(whole) - 40} bytes, its header says {len(whole)}" in msg
    assert f"{names[2]} is not a whole safetensors file" in msg
    with pytest.raises(safetensors.ShardError):
        safetensors.expected_size(b"")
    # an index that is not JSON is a warn naming it
    (m / "model.safetensors.index.json").write_text("{nope")
    rows = modelcheck.shard_rows("model", _model_fact(str(m), {}, None, None)["shards"])
    assert [r["level"] for r in rows] == ["warn"] and "model.safetensors.index.json is not JSON" in rows[0]["message"]


# ------------------------------------------------------------------ the host side, on a copy of a real install

@pytest.fixture
def install_059(tmp_path):
    src = _sglang("0.5.9")
    dst = tmp_path / "site" / "sglang"
    shutil.copytree(src / "srt" / "models", dst / "srt" / "models")
    shutil.copy(src / "srt" / "server_args.py", dst / "srt" / "server_args.py")
    for rel in ("__init__.py", "srt/__init__.py"):
        (dst / rel).touch()
    return dst


def test_model_checks_on_an_install_and_the_cache(install_059, tmp_path):
    from provision.host.ops import preflight_model
    from provision.sandbox.weights import write_checkpoint

    write_checkpoint(tmp_path / "kimi", ["KimiK25ForConditionalGeneration"], 2)
    write_checkpoint(tmp_path / "draft", ["LlamaForCausalLMEagle3"], 1)
    req = {"state_dir": str(tmp_path / "state"), "candidate_specs": _shipped_specs(),
           "profile": {"engine": "sglang",
                       "args": {"model-path": str(tmp_path / "kimi"), "speculative-algorithm": "EAGLE3",
                                "speculative-draft-model-path": str(tmp_path / "draft"), "tp-size": 8}}}
    rows = preflight_model.model_checks(req, str(install_059), "0.5.9", {}, mode="edit")
    fails = [r for r in rows if r["level"] == "fail"]
    assert [r["check"] for r in fails] == ["eagle3"] and fails[0]["spec"] == "kimi-k25-eagle3"
    tables = preflight_model.install_tables(str(install_059), req["state_dir"], "sglang")
    assert tables["cached"] is True
    # an edited file is read again (mtime and size are the key)
    sa = install_059 / "srt" / "server_args.py"
    sa.write_text(sa.read_text().replace('"--speculative-num-steps"', '"--speculative-steps"'))
    req["profile"]["args"]["speculative-num-steps"] = 3
    rows = preflight_model.model_checks(req, str(install_059), "0.5.9", {}, mode="edit")
    assert any(r["level"] == "fail" and "--speculative-num-steps is not a flag" in r["message"] for r in rows)
    # a server_args.py the reader does not understand: a warn naming it, the rest still checked
    sa.write_text("def broken(:\n")
    rows = preflight_model.model_checks(req, str(install_059), "0.5.9", {}, mode="edit")
    flags = [r for r in rows if r["check"] == "flags"]
    assert [r["level"] for r in flags] == ["warn"] and "server_args.py" in flags[0]["message"]
    # a config.json that is missing, or not JSON: a warn naming it
    os.remove(tmp_path / "kimi" / "config.json")
    rows = preflight_model.model_checks(req, str(install_059), "0.5.9", {}, mode="edit")
    arch = [r for r in rows if r["check"] == "architecture" and r["message"].startswith("model")]
    assert [r["level"] for r in arch] == ["warn"] and "config.json is missing" in arch[0]["message"]
    assert not [r for r in rows if r["level"] == "fail" and r["check"] == "eagle3"]


def test_hub_id_is_read_from_the_hf_cache(tmp_path):
    from provision.host.facts import model as facts
    from provision.sandbox.weights import write_checkpoint

    repo = tmp_path / "hf" / "hub" / "models--AQ-MedAI--Kimi-K25-eagle3"
    write_checkpoint(repo / "snapshots" / "abc123", ["LlamaForCausalLMEagle3"], 1)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    got = facts.resolve("AQ-MedAI/Kimi-K25-eagle3", {"HF_HOME": str(tmp_path / "hf")})
    assert got["dir"] == str(repo / "snapshots" / "abc123")
    got = facts.resolve("AQ-MedAI/Kimi-K25-eagle3", {"HF_HUB_CACHE": str(tmp_path / "hf" / "hub")})
    assert got["dir"] == str(repo / "snapshots" / "abc123")
    got = facts.resolve("moonshotai/Kimi-K2.5", {"HF_HOME": str(tmp_path / "hf")})
    assert got["dir"] is None and "not in this host's Hugging Face cache" in got["error"]


def test_external_model_package_classes_count_as_registered(install_059, tmp_path):
    """SGLANG_EXTERNAL_MODEL_PACKAGE registers its EntryClass classes over the built-ins: an
    architecture only it has is not refused, and its class is not judged by the built-in's gap;
    a package that cannot be found downgrades those refusals to warnings."""
    from provision.host.ops import preflight_model
    from provision.sandbox.weights import write_checkpoint

    pkg = tmp_path / "site" / "my_models"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "gemma3_eagle3.py").write_text(
        "from sglang.srt.models.gemma3_mm import Gemma3ForConditionalGeneration as _Base\n\n\n"
        "class Gemma3ForConditionalGeneration(_Base):\n"
        "    def set_eagle3_layers_to_capture(self, layer_ids=None):\n        pass\n\n"
        "    def get_embed_and_head(self):\n        pass\n\n\n"
        "class BrandNewForCausalLM:\n    pass\n\n\n"
        "EntryClass = [Gemma3ForConditionalGeneration, BrandNewForCausalLM]\n")
    write_checkpoint(tmp_path / "gemma", ["Gemma3ForConditionalGeneration"], 1)
    write_checkpoint(tmp_path / "new", ["BrandNewForCausalLM"], 1)
    req = {"state_dir": str(tmp_path / "state"), "candidate_specs": _shipped_specs(),
           "profile": {"engine": "sglang", "args": {"model-path": str(tmp_path / "gemma"), "speculative-algorithm": "EAGLE3",
                                "speculative-draft-model-path": str(tmp_path / "new")}}}
    env = {"SGLANG_EXTERNAL_MODEL_PACKAGE": "my_models", "PYTHONPATH": str(tmp_path / "site")}
    rows = preflight_model.model_checks(req, str(install_059), "0.5.9", env, mode="edit")
    assert not [r for r in rows if r["level"] == "fail"], rows
    rows = preflight_model.model_checks(req, str(install_059), "0.5.9", {}, mode="edit")
    assert {r["check"] for r in rows if r["level"] == "fail"} == {"architecture", "eagle3"}
    rows = preflight_model.model_checks(req, str(install_059), "0.5.9",
                                        {"SGLANG_EXTERNAL_MODEL_PACKAGE": "not_there"}, mode="edit")
    assert not [r for r in rows if r["level"] == "fail"], rows
    assert any("SGLANG_EXTERNAL_MODEL_PACKAGE=not_there is not on the server's PYTHONPATH" in r["message"]
               for r in rows)


def test_a_model_folder_that_is_not_there_is_said_once_by_the_path_check(tmp_path):
    """A missing local model path is the path check's fail row; the architecture check says nothing
    more about it (it said it again as a warn). A hub id that is not cached still gets its warn."""
    from provision.host.ops import checks
    from provision.host.ops.preflight_model import _model_fact

    missing = str(tmp_path / "nope")
    fact = _model_fact(missing, {}, None, None)
    assert modelcheck.arch_rows("model", fact, registry("0.5.9"), "0.5.9", False) == ([], None)
    fails = checks.check_model(missing, "model", offline=False)
    assert [r["level"] for r in fails] == ["fail"] and "does not exist" in fails[0]["message"]
    hub = _model_fact("org/not-cached-model", {"HF_HOME": str(tmp_path / "hf")}, None, None)
    rows, _ = modelcheck.arch_rows("model", hub, registry("0.5.9"), "0.5.9", False)
    assert [r["level"] for r in rows] == ["warn"]


# --------------------------------------------------------------------------- flags as the parser takes them (issue 38, item 3)

def test_lists_render_one_token_per_item_and_mappings_as_json():
    from provision.config.profile import render_flags

    assert render_flags({"cuda-graph-bs": [1, 2, 4, 8], "lora-target-modules": ["q_proj", "v_proj"],
                         "enable-metrics": True, "disable-radix-cache": False, "json-model-override-args": {"a": 1},
                         "tp-size": 8}) == [
        "--cuda-graph-bs", "1", "2", "4", "8", "--lora-target-modules", "q_proj", "v_proj", "--enable-metrics",
        "--json-model-override-args", '{"a": 1}', "--tp-size", "8"]


@pytest.mark.parametrize("flag,value,fails_with", [
    ("cuda-graph-bs", [1, 2, 4, 8], None),
    ("cuda-graph-bs", 4, None),
    ("cuda-graph-bs", [1, "two"], "invalid int value: 'two'"),
    ("cuda-graph-bs", [], None),            # nargs "+" in 0.5.9: but an empty list is refused below
    ("lora-target-modules", ["q_proj", "v_proj"], None),
    ("tp-size", [1, 2], "takes one value"),
    ("tp-size", "eight", "invalid int value: 'eight'"),
    ("tp-size", True, "takes a value"),
    ("mem-fraction-static", "0.85", None),
    ("mem-fraction-static", "most", "invalid float value"),
    ("enable-metrics", "yes", "is a switch"),
    ("enable-metrics", True, None),
])
def test_a_value_is_judged_as_0_5_9s_parser_would(flag, value, fails_with):
    level, msg = serverargs.decide(flag, value, table("0.5.9"), "0.5.9")
    if flag == "cuda-graph-bs" and value == []:
        assert level == "fail" and "at least one value" in msg
    elif fails_with is None:
        assert level == "ok", msg
    else:
        assert level == "fail" and fails_with in msg, msg


def test_a_negatable_switch_that_is_on_by_default_says_how_to_turn_it_off():
    t = table("0.5.23")
    opt, hit = next((o, h) for o, h in t.items() if h.get("switch") == "BooleanOptionalAction" and h.get("default"))
    level, msg = serverargs.decide(opt, False, t, "0.5.23")
    assert level == "fail" and f"no-{opt[2:]}: true" in msg, msg
    assert serverargs.decide("no-" + opt[2:], True, t, "0.5.23") == ("ok", "--no-" + opt[2:])
