"""The pure decisions of preflight's model checks, exhaustively on small inputs: argparse's
judgement of one flag (engine/serverargs.decide), the dataclass-field reader on hand-written
field modules, the shard and memory rows (engine/modelcheck), the safetensors size reader."""

from __future__ import annotations

import json
import struct

import pytest

from provision.host import inference
from provision.host.engine import modelcheck, safetensors, serverargs

SGLANG_EAGLE3 = inference.get("sglang").eagle3_methods  # what SGLang's EAGLE-3 worker calls on a target

SRC_059 = '''
ALGOS = ["EAGLE", "EAGLE3"]
class ServerArgs:
    model_path: str = None
    def add_cli_args(parser):
        parser.add_argument("--model-path", "--model", type=str)
        parser.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
        parser.add_argument("--speculative-algorithm", choices=ALGOS)
        parser.add_argument("--speculative-num-steps", type=int)
        parser.add_argument("--speculative-num-draft-tokens", type=int)
        parser.add_argument("--quant", choices=[1, 2, 4])
        parser.add_argument("--enable-x", action=argparse.BooleanOptionalAction)
        parser.add_argument("--dyn", choices=compute_choices())
'''


@pytest.fixture(scope="module")
def t():
    return serverargs.flag_table(serverargs.parse_server_args(SRC_059))


@pytest.mark.parametrize("flag,value,level,needle", [
    ("model-path", "/m", "ok", "--model-path"),
    ("--model-path", "/m", "ok", "--model-path"),
    ("model", "/m", "ok", "--model"),                              # an exact alias
    ("tensor-parallel-size", 8, "ok", ""),
    ("tensor", 8, "warn", "spell it out as --tensor-parallel-size"),  # a unique prefix
    ("tp", 8, "warn", "as --tp-size"),
    ("speculative-num", 3, "fail", "ambiguous"),
    ("speculative-num-s", 3, "warn", "--speculative-num-steps"),
    ("speculative-num-stpes", 3, "fail", "did you mean --speculative-num-steps"),
    ("totally-unknown", 1, "fail", "is not a flag of SGLang 0.5.9"),
    ("speculative-algorithm", "EAGLE3", "ok", ""),
    ("speculative-algorithm", "MEDUSA", "fail", "takes one of EAGLE, EAGLE3"),
    ("speculative-alg", "MEDUSA", "fail", "takes one of"),          # prefix, then the choices
    ("quant", 4, "ok", ""),
    ("quant", "4", "ok", ""),                                       # argparse converts with type
    ("quant", 3, "fail", "takes one of 1, 2, 4"),
    ("dyn", "anything", "ok", ""),                                  # choices computed at run time
    ("enable-x", True, "ok", ""),
    ("no-enable-x", True, "ok", ""),                                # BooleanOptionalAction
    ("mod", "/m", "warn", "--model"),                               # prefix of two aliases of one flag
])
def test_decide_as_argparse(t, flag, value, level, needle):
    got, msg = serverargs.decide(flag, value, t, "0.5.9")
    assert got == level, msg
    assert needle in msg


def test_dataclass_fields_reader():
    fields = {"spec.py": '''
from typing import Literal, Optional
class Base(msgspec.Struct):
    inherited_flag: A[int, "from a base"] = 1
class Spec(Base):
    plain: A[int, "help"] = 3
    renamed: A[str, Arg(help="x", cli_name="--other-name", aliases=["--alias-one"])] = "a"
    hidden: A[str, Arg(no_cli=True)] = "x"
    lit: A[Literal["a", "b"], "choose"] = "a"
    opt_lit: A[Optional[Literal["x", "y"]], "choose"] = None
    named: A[str, Arg(help="x", choices=LOAD_CHOICES)] = "auto"
    flag: A[bool, "switch"] = False
    bo: A[bool, Arg(help="x", action=argparse.BooleanOptionalAction)] = True
    not_an_arg: int = 4
    derived: A[int, Derived(doc="x")] = 0
    f_help: A[int, f"computed {1}"] = 0
class Unlisted(msgspec.Struct):
    nope: A[int, "not in the namespaces"] = 0
'''}
    src = ("_INPUT_NAMESPACES = [Spec]\nclass ServerArgs:\n    def add_cli_args(parser):\n"
           "        add_cli_args_from_dataclass(parser, ServerArgs)\n        parser.add_argument('--config')\n")
    spec = serverargs.parse_server_args(src, "server_args.py", fields, "LOAD_CHOICES = ['auto', 'pt']\n")
    t = serverargs.flag_table(spec)
    assert spec.source == "dataclass"
    assert {"--plain", "--other-name", "--alias-one", "--lit", "--opt-lit", "--named", "--flag", "--bo", "--no-bo",
            "--inherited-flag", "--f-help", "--config"} <= set(t)
    assert not {"--hidden", "--renamed", "--not-an-arg", "--derived", "--nope"} & set(t)
    assert t["--lit"]["choices"] == ["a", "b"] and t["--opt-lit"]["choices"] == ["x", "y"]
    assert t["--named"]["choices"] == ["auto", "pt"]
    assert t["--other-name"]["dest"] == "renamed"


def _st(tensors, pad=True) -> bytes:
    hdr, off = {}, 0
    for name, n in tensors:
        hdr[name] = {"dtype": "U8", "shape": [n], "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(hdr).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + bytes(off)


def test_safetensors_expected_size_edges():
    whole = _st([("a", 10), ("b", 0), ("c", 7)])
    assert safetensors.expected_size(whole) == len(whole)
    assert safetensors.expected_size(whole[:-5]) == len(whole)  # only the head is needed
    assert safetensors.expected_size(_st([])) == len(_st([]))
    for bad, why in ((b"", "8-byte"), (b"\0" * 8, "header length 0"), (struct.pack("<Q", 2**40), "header length"),
                     (struct.pack("<Q", 100) + b"{}", "ends inside"), (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
                     (struct.pack("<Q", 2) + b"{x", "not JSON"),
                     (struct.pack("<Q", 31) + b'{"a": {"data_offsets": [5, 1]}}', "no valid data_offsets")):
        with pytest.raises(safetensors.ShardError, match=why):
            safetensors.expected_size(bad)


def test_shard_and_memory_rows():
    assert modelcheck.shard_rows("model", None) == []
    ok = {"files": [{"name": "a", "size": 10, "expected": 10}], "total": 10}
    assert modelcheck.shard_rows("model", ok)[0]["level"] == "ok"
    missing_only = {"files": [{"name": "a", "error": "is missing"}], "total": 0}
    assert modelcheck.shard_rows("model", missing_only)[0]["level"] == "ok"  # the presence check says it
    many = {"files": [{"name": f"s{i}", "size": 1, "expected": 2} for i in range(5)], "total": 5}
    msg = modelcheck.shard_rows("model", many)[0]["message"]
    assert "5 of 5 shards are not whole" in msg and "(and 2 more)" in msg
    assert modelcheck.memory_rows(0, 1, 1) == []
    assert modelcheck.memory_rows(2**30, 2**40, 2**31)[0]["level"] == "info"
    row = modelcheck.memory_rows(2**31, 2**40, 2**30)[0]
    assert row["level"] == "warn" and "page cache" in row["message"]


def test_flag_rows_skip_what_is_not_rendered(t):
    rows = modelcheck.flag_rows({"model-path": "/m", "unknown-off": False, "unknown-none": None}, t, "0.5.9", None, "SGLang")
    assert [r["level"] for r in rows] == ["ok"]
    rows = modelcheck.flag_rows({"tp": 8, "bogus": 1}, t, "0.5.9", None, "SGLang")
    assert [r["level"] for r in rows] == ["warn", "fail"]


def test_eagle_rows_by_algorithm_and_mode():
    reg = {"W": {"missing": ["set_eagle3_layers_to_capture", "get_embed_and_head"], "getattr": False},
           "G": {"missing": ["set_eagle3_layers_to_capture"], "getattr": True},
           "N": {"missing": ["set_eagle3_layers_to_capture"], "getattr": False}}
    specs = [{"name": "w-spec", "class": "W"}]
    assert modelcheck.eagle_rows("W", reg, "EAGLE3", specs, "edit", {"W"}, "v", eagle3=SGLANG_EAGLE3) == []  # the profile's spec checks it
    assert modelcheck.eagle_rows("W", reg, "EAGLE", specs, "edit", set(), "v", eagle3=SGLANG_EAGLE3)[0]["level"] == "warn"
    assert modelcheck.eagle_rows("N", reg, "EAGLE", specs, "edit", set(), "v", eagle3=SGLANG_EAGLE3)[0]["level"] == "ok"
    assert modelcheck.eagle_rows("G", reg, "EAGLE3", specs, "edit", set(), "v", eagle3=SGLANG_EAGLE3)[0]["level"] == "warn"
    row = modelcheck.eagle_rows("W", reg, "EAGLE3", specs, "container", set(), "v", eagle3=SGLANG_EAGLE3)[0]
    assert row["level"] == "fail" and "launch with --overlay" in row["message"]
    assert modelcheck.eagle_rows("W", reg, "eagle3", specs, "overlay", set(), "v", eagle3=SGLANG_EAGLE3)[0]["level"] == "ok"


def test_a_drafter_that_captures_no_target_layers_needs_only_get_embed_and_head():
    """issue 43 item 1: with eagle_config.use_aux_hidden_state: false in the drafter's config.json,
    SGLang 0.5.9 never calls set_eagle3_layers_to_capture (model_runner reads the flag), so a class
    lacking only that is not refused; one lacking get_embed_and_head still is."""
    no_aux = {"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {"use_aux_hidden_state": False}}
    assert modelcheck.called_methods("EAGLE3", no_aux, SGLANG_EAGLE3) == ("get_embed_and_head",)
    assert modelcheck.called_methods("EAGLE3", {"eagle_config": {"use_aux_hidden_state": True}}, SGLANG_EAGLE3) == \
        SGLANG_EAGLE3
    assert modelcheck.called_methods("EAGLE3", {}, SGLANG_EAGLE3) == SGLANG_EAGLE3
    assert modelcheck.called_methods("EAGLE", no_aux, SGLANG_EAGLE3) == ("get_embed_and_head",)
    reg = {"S": {"missing": ["set_eagle3_layers_to_capture"], "getattr": False},
           "W": {"missing": ["set_eagle3_layers_to_capture", "get_embed_and_head"], "getattr": False}}
    (row,) = modelcheck.eagle_rows("S", reg, "EAGLE3", [], "edit", set(), "0.5.9",
                                   modelcheck.called_methods("EAGLE3", no_aux, SGLANG_EAGLE3), eagle3=SGLANG_EAGLE3)
    assert row["level"] == "ok" and "use_aux_hidden_state is false" in row["message"], row
    (row,) = modelcheck.eagle_rows("S", reg, "EAGLE3", [], "edit", set(), "0.5.9", eagle3=SGLANG_EAGLE3)
    assert row["level"] == "fail"
    (row,) = modelcheck.eagle_rows("W", reg, "EAGLE3", [], "edit", set(), "0.5.9",
                                   modelcheck.called_methods("EAGLE3", no_aux, SGLANG_EAGLE3), eagle3=SGLANG_EAGLE3)
    assert row["level"] == "fail" and "lacks get_embed_and_head in SGLang 0.5.9" in row["message"], row


# ---------------------------------------------------------------- vLLM's interface and allow-list

from provision.host.engine.modelcheck import interface_rows  # noqa: E402

IFACE = {"class": "KimiK25ForConditionalGeneration", "missing": ["supports_eagle3", "set_aux_hidden_state_layers"]}
ALLOW = {"name": "eagle3_target_supported", "entries": ["llama", "qwen"], "file": "config/speculative.py"}
VSPECS = [{"name": "kimi-k25-eagle3-vllm", "kind": "interface", "class": "KimiK25ForConditionalGeneration"},
          {"name": "kimi-k25-allow-list-vllm", "kind": "list-entry", "file": "config/speculative.py", "value": '"kimi_k2"'}]


def _rows(**kw):
    args = dict(method="eagle3", iface=IFACE, allow=ALLOW, model_type="kimi_k2", specs=VSPECS, mode="edit",
                in_place=set(), version="0.16.0", title="vLLM")
    args.update(kw)
    return interface_rows(**args)


def test_vllm_interface_and_allow_list_refused_naming_each_spec():
    rows = _rows()
    assert [r["level"] for r in rows] == ["fail", "fail"]
    assert "lacks the EAGLE-3 interface (supports_eagle3, set_aux_hidden_state_layers) in vLLM 0.16.0" in rows[0]["message"]
    assert "provision patch --playbook kimi-k25-eagle3-vllm" in rows[0]["message"]
    assert "model type kimi_k2 is not on vLLM 0.16.0's EAGLE-3 allow-list (eagle3_target_supported" in rows[1]["message"]
    assert "provision patch --playbook kimi-k25-allow-list-vllm" in rows[1]["message"]


def test_vllm_without_a_covering_spec_says_how_to_write_one():
    rows = _rows(specs=[], model_type="gemma3")
    assert "provision spec new KimiK25ForConditionalGeneration --engine vllm" in rows[0]["message"]
    assert rows[1]["level"] == "fail" and "list-entry spec" in rows[1]["message"]


def test_vllm_rows_pass_where_the_release_has_it_or_the_launch_applies_it():
    assert [r["level"] for r in _rows(iface=dict(IFACE, missing=[]), model_type="qwen2")] == ["ok", "ok"]
    assert [r["level"] for r in _rows(mode="patch")] == ["ok", "ok"]
    assert _rows(in_place={"KimiK25ForConditionalGeneration", "kimi-k25-allow-list-vllm"}) == []
    assert _rows(allow=None, iface=None) == []          # 0.32: no allow-list; a class the registry lacks
    assert _rows(method="ngram") == []                  # only EAGLE-3 needs the interface
    # vLLM's own rule is a substring test: "kimi_k2" admits kimi_k25 too
    assert _rows(allow=dict(ALLOW, entries=["kimi_k2"]), model_type="kimi_k25")[1]["level"] == "ok"


def test_vllm_a_delegation_to_a_model_that_lacks_the_members_is_refused():
    inner = {"attr": "language_model", "classes": ["DeepseekV2ForCausalLM"], "missing": ["set_aux_hidden_state_layers"]}
    rows = _rows(iface=dict(IFACE, missing=[], inner_lacks=inner), allow=None)
    assert [r["level"] for r in rows] == ["fail"]
    assert "delegates the EAGLE-3 interface to self.language_model (DeepseekV2ForCausalLM), which lacks " \
           "set_aux_hidden_state_layers in vLLM 0.16.0" in rows[0]["message"]
