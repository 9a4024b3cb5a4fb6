"""Preflight asks an engine's own parser (vLLM's flags are generated from its config dataclasses):
the table it makes of a real argparse parser, the probe run in a real interpreter, and what a
probe that fails or hangs gives (a sentence, and nothing left running). The real vLLM 0.32 parser
is asked in the real-vLLM tier (tests/realvllm)."""

from __future__ import annotations

import argparse
import os
import sys
import time

import pytest

from provision.host.engine import modelcheck, serverargs
from provision.host.facts import own_parser
from provision.host.inference import vllm

VLLM = vllm.ENGINE


def stdlib_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--model", type=str)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--api-key", nargs="+")
    p.add_argument("--middleware", action="append")
    p.add_argument("--speculative-config", type=lambda s: s)
    return p


def table_of(parser):
    ns: dict = {}
    exec(own_parser.TABLE_OF, ns)
    return ns["table_of"](parser)


def test_a_real_parser_becomes_the_table_decide_judges():
    t = table_of(stdlib_parser())
    assert t["--tensor-parallel-size"] == t["-tp"] == {"dest": "tensor_parallel_size", "choices": None, "nargs": None,
                                                      "type": "int"}
    assert t["--enforce-eager"]["switch"] == "BooleanOptionalAction" and t["--enforce-eager"]["default"] is False
    assert t["--no-enforce-eager"] == {"dest": "enforce_eager", "choices": None, "switch": "negation"}
    assert t["--trust-remote-code"]["switch"] == "store_true"
    assert t["--dtype"]["choices"] == ["auto", "float32", "bfloat16"]
    assert t["--api-key"]["nargs"] == "+"
    assert t["--middleware"] == {"dest": "middleware", "choices": None, "custom": True}
    assert t["--speculative-config"]["type"] is None and "--help" in t
    assert serverargs.decide("tensor-parallel-size", "eight", t, "0.32.0", "vLLM") == (
        "fail", "--tensor-parallel-size: invalid int value: 'eight' (vLLM 0.32.0's parser exits 2)")
    level, msg = serverargs.decide("tensor-paralel-size", 8, t, "0.32.0", "vLLM")
    assert level == "fail" and msg == ("--tensor-paralel-size is not a flag of vLLM 0.32.0: did you mean "
                                       "--tensor-parallel-size?")
    assert serverargs.decide("dtype", "float64", t, "0.32.0", "vLLM")[0] == "fail"
    # SGLang's name for a vLLM flag: vLLM's own offered (issue 63: it said --ubatch-size or --block-size)
    assert serverargs.decide("tp-size", 8, t, "0.32.0", "vLLM") == (
        "fail", "--tp-size is not a flag of vLLM 0.32.0: did you mean --tensor-parallel-size?")
    assert serverargs.decide("enforce-eager", "yes", t, None, "vLLM")[1].startswith(
        "--enforce-eager is a switch in the installed vLLM")


def test_the_probe_runs_in_the_interpreter_it_is_given_and_hands_back_the_table(tmp_path):
    probe = ("import argparse\nPARSER = argparse.ArgumentParser()\nPARSER.add_argument('--max-model-len', type=int)\n"
             "METHODS = literal_values(typing.Literal['eagle', 'eagle3'])\nARCHS = ['LlamaForCausalLM']\n"
             "VERSION = '9.9'\n")
    doc, why = own_parser.ask(probe, sys.executable, dict(os.environ), timeout=60)
    assert why is None
    assert doc["flags"]["--max-model-len"]["type"] == "int"
    assert doc["spec_methods"] == ["eagle", "eagle3"] and doc["archs"] == ["LlamaForCausalLM"]
    assert doc["version"] == "9.9"


def test_a_probe_that_cannot_import_the_engine_is_one_sentence():
    doc, why = own_parser.ask("import vllm_not_here\n", sys.executable, dict(os.environ), timeout=60)
    assert doc is None and why == "ModuleNotFoundError: No module named 'vllm_not_here'"
    doc, why = own_parser.ask("", "/nonexistent/python3", {}, timeout=5)
    assert doc is None and why.startswith("/nonexistent/python3 did not run")


def test_a_probe_that_hangs_is_killed_with_everything_it_started(tmp_path):
    """A parser that never comes back (a release that blocks on import) costs `timeout`, and the
    probe's whole process group is gone after it: nothing of preflight is left running."""
    pidfile = tmp_path / "child"
    probe = (f"import subprocess, time\nc = subprocess.Popen(['sleep', '300'])\n"
             f"open({str(pidfile)!r}, 'w').write(str(c.pid))\ntime.sleep(300)\n")
    t0 = time.monotonic()
    doc, why = own_parser.ask(probe, sys.executable, dict(os.environ), timeout=3)
    assert doc is None and why == f"{sys.executable} did not build the parser within 3 s"
    assert time.monotonic() - t0 < 30
    child = int(pidfile.read_text())
    end = time.monotonic() + 10
    while time.monotonic() < end and os.path.exists(f"/proc/{child}") and \
            open(f"/proc/{child}/stat").read().split()[2] != "Z":
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z", \
        "the probe's child was killed with it"


@pytest.mark.parametrize("stdout, stderr, rc, says", [
    ("noise\nPROVISION-PARSER {\"flags\": {}}\n", "", 0, None),
    ("PROVISION-PARSER {not json\n", "", 0, "its answer was not read"),
    ("PROVISION-PARSER {\"archs\": []}\n", "", 0, "its answer has no flag table"),
    ("", "Traceback ...\n  File x\nImportError: libnuma.so.1: cannot open\n\n", 1,
     "ImportError: libnuma.so.1: cannot open"),
    ("", "", -9, "it exited with status -9 and said nothing"),
])
def test_the_probes_answer_is_its_table_or_why_not(stdout, stderr, rc, says):
    doc, why = own_parser.answer_of(stdout, stderr, rc)
    if says is None:
        assert doc == {"flags": {}} and why is None
    else:
        assert doc is None and why.startswith(says)


def test_vllm_reads_underscores_as_dashes_and_dotted_keys_as_its_json_flags():
    assert VLLM.flag_name("max_model_len") == "max-model-len"
    assert VLLM.flag_name("speculative-config.method") == "speculative-config"
    assert VLLM.flag_name("speculative_config.num_speculative_tokens") == "speculative-config"
    t = table_of(stdlib_parser())
    args = {"max_model_len": 512, "model": "/m", "speculative-config.method": "eagle3", "tensor_parallel_size": 2}
    names = {k: VLLM.flag_name(k) for k in args}
    t["--max-model-len"] = {"dest": "max_model_len", "choices": None, "nargs": None, "type": "int"}
    assert modelcheck.flag_rows(args, t, "0.32.0", None, "vLLM", names) == [
        {"level": "ok", "check": "flags", "message": "all 4 flags are taken by vLLM 0.32.0"}]
    (row,) = modelcheck.flag_rows({"max_modle_len": 512}, t, "0.32.0", None, "vLLM", {"max_modle_len": "max-modle-len"})
    assert row["level"] == "fail" and "did you mean --max-model-len" in row["message"]


@pytest.mark.parametrize("method, methods, level, says", [
    ("eagle3", ["eagle", "eagle3", "mtp"], None, None),
    ("eagel3", ["eagle", "eagle3", "mtp"], "fail", "method 'eagel3' is not one vLLM 0.32.0 knows: did you mean eagle3"),
    ("lookahead", ["eagle", "eagle3", "mtp"], "fail", "(it takes eagle, eagle3, mtp ...)"),
    ("eagle3", None, None, None),      # an older release: the methods were not read, nothing said
    (None, ["eagle3"], None, None),    # no speculative decoding
])
def test_a_speculative_method_the_install_does_not_know_is_refused(method, methods, level, says):
    rows = modelcheck.spec_method_rows(method, methods, "vLLM", "0.32.0")
    if level is None:
        assert rows == []
    else:
        (row,) = rows
        assert row["level"] == level and says in row["message"]


def test_the_drafters_architecture_is_looked_up_by_the_name_vllm_gives_it():
    """vLLM's EAGLEConfig renames a drafter's architectures by method: LlamaForCausalLM is looked up
    as Eagle3LlamaForCausalLM for eagle3; a name that already says Eagle3 is kept."""
    eagle3 = {"speculative-config": {"method": "eagle3", "model": "/d"}}
    assert VLLM.draft_architectures(["LlamaForCausalLM"], eagle3) == ["Eagle3LlamaForCausalLM"]
    assert VLLM.draft_architectures(["LlamaForCausalLMEagle3"], eagle3) == ["LlamaForCausalLMEagle3"]
    assert VLLM.draft_architectures(["LlamaForCausalLM"], {"speculative-config": '{"method": "eagle"}'}) == \
        ["EagleLlamaForCausalLM"]
    assert VLLM.draft_architectures(["Qwen3ForCausalLM"], {"speculative-config": {"method": "draft_model"}}) == \
        ["Qwen3ForCausalLM"]
    registry = {"Eagle3LlamaForCausalLM": {}, "DeepseekV3ForCausalLM": {}}
    cfg = {"file": "/d/config.json", "config": {"architectures": ["LlamaForCausalLM"]}}
    rows, cls = modelcheck.arch_rows("drafter", dict(cfg, lookup=["Eagle3LlamaForCausalLM"]), registry, "0.32.0",
                                     True, title="vLLM")
    assert cls == "Eagle3LlamaForCausalLM" and rows[0]["message"] == \
        "drafter architecture Eagle3LlamaForCausalLM is registered in vLLM 0.32.0"
    rows, cls = modelcheck.arch_rows("drafter", dict(cfg, lookup=["Eagle3GemmaForCausalLM"]), registry, "0.32.0",
                                     True, title="vLLM")
    assert cls is None and rows[0]["level"] == "fail" and rows[0]["message"].endswith(
        "; install a vLLM that has it")
