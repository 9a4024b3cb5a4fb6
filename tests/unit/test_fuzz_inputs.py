"""issue 64: no input the loaders accept reaches a traceback. Playbooks (their `patch:` and `launch:`
profiles), inventories, --arg values and journal lines built from the schema's own keys with values of
every type YAML gives (words, numbers, mappings, lists, nulls, dates, !!binary) and nesting far past
what is read: each is a result or a sentence (a ProvisionError: exit 2), never another exception.

Seeded (hypothesis, derandomized): the same cases on every run; bounded to stay in the quick tier.
"""

from __future__ import annotations

import datetime
import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provision.errors import ProvisionError

FUZZ = settings(max_examples=80, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
    st.text(max_size=12), st.sampled_from(["EAGLE3", "sglang", "vllm", "8", "eight", "0.85", "/m", "yes", "~",
                                           "-1", "1e9", "{a: 1}", "[1, 2]", "--tp-size", "a=b"]),
    st.dates(min_value=datetime.date(2000, 1, 1), max_value=datetime.date(2030, 1, 1)),
    st.binary(max_size=6),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)

PLAYBOOK_KEYS = ["name", "description", "engine", "patch", "launch"]
PATCH_KEYS = ["kind", "package", "file", "applies", "class", "delegate", "methods", "mapping", "key", "value",
              "copy_of", "scope", "find", "replace", "native_if", "protocol", "list"]
LAUNCH_KEYS = ["engine", "python", "module", "args", "env", "log_dir", "keep_logs", "health_timeout", "grace",
               "offline", "fix", "container", "requires"]
ARG_KEYS = ["model-path", "model", "tp-size", "port", "speculative-algorithm", "speculative-config",
            "speculative-draft-model-path", "mem-fraction-static", "host", "cuda-graph-bs"]
HOST_KEYS = ["address", "user", "port", "identity", "jump", "proxy_command", "known_hosts", "python", "sglang_path",
             "spec", "specs", "router", "router_worker", "gpu_capability", "profile", "offline", "sudo",
             "sudo_password_file", "args", "sglang_args", "vllm_args", "env", "node_rank", "server"]


def some_keys(keys, values=VALUES):
    return st.dictionaries(st.sampled_from(keys), values, max_size=len(keys))


def deep(n: int, leaf="1") -> str:
    return "{a: " * n + leaf + "}" * n


def dump(doc) -> str:
    return yaml.safe_dump(doc, allow_unicode=True)  # dates as timestamps, bytes as !!binary


def sentence_or_result(fn, *args):
    try:
        fn(*args)
    except ProvisionError as exc:
        assert exc.message and "Traceback" not in exc.message, exc.message
        assert exc.exit_code == 2, (exc.exit_code, exc.message)


def load_playbook_and_profile(text: str) -> None:
    from provision.config.playbook import parse_playbook
    from provision.config.profile import build_profile

    pb = parse_playbook(text, "fuzz.yaml")
    if pb.launch is not None:
        build_profile(pb.launch, "fuzz.yaml", pb.name or "fuzz", None, {})


@FUZZ
@given(top=some_keys(PLAYBOOK_KEYS), patch=some_keys(PATCH_KEYS), launch=some_keys(LAUNCH_KEYS),
       args=some_keys(ARG_KEYS), which=st.integers(0, 3))
def test_a_playbook_of_any_shape_is_a_sentence_never_a_traceback(top, patch, launch, args, which):
    doc = dict(top)
    if which & 1:
        doc["patch"] = patch
    if which & 2:  # past the required keys, into every value's own check
        base = {"model": "/m"} if launch.get("engine") == "vllm" else {"model-path": "/m"}
        doc["launch"] = dict(launch, args=dict(base, **args))
    sentence_or_result(load_playbook_and_profile, dump(doc))


@FUZZ
@given(host=some_keys(HOST_KEYS), defaults=some_keys(HOST_KEYS), name=st.text(min_size=1, max_size=8))
def test_an_inventory_of_any_shape_is_a_sentence_never_a_traceback(host, defaults, name):
    from provision.config.inventory.formats import parse_inventory

    sentence_or_result(parse_inventory, dump({"defaults": defaults, "hosts": {name: host}}), "inv.yaml")


@FUZZ
@given(key=st.sampled_from(ARG_KEYS + ["x"]), value=st.one_of(st.text(max_size=20), VALUES.map(lambda v: json.dumps(v, default=str))))
def test_an_arg_value_of_any_shape_is_a_sentence_never_a_traceback(key, value):
    from provision.cli.launch import _parse_overrides
    from provision.config.profile import build_profile

    def both(a):
        over = _parse_overrides([a])
        build_profile({"args": {"model-path": "/m"}}, "fuzz.yaml", "fuzz", None, over)

    sentence_or_result(both, f"{key}={value}")


@pytest.mark.parametrize("text", [
    "name: x\nlaunch:\n  args:\n    model-path: /m\n    speculative-config: " + deep(3000) + "\n",
    "name: x\nlaunch:\n  args:\n    model-path: /m\n    x:\n" + "".join("      " + "  " * i + "a:\n" for i in range(1500)),
    "name: x\nlaunch:\n  args:\n    model-path: /m\n    speculative-config: '" + "[" * 3000 + "]" * 3000 + "'\n",
    "name: x\nlaunch:\n  engine: vllm\n  args:\n    model: /m\n    speculative-config: '" + "[" * 3000 + "]" * 3000
    + "'\n",
    "name: x\nlaunch:\n  args:\n    model-path: !!binary aGVsbG8=\n",
    "name: x\nlaunch:\n  args:\n    model-path: /m\n    tp-size: {a: 1}\n",
    "name: x\nlaunch:\n  args: [1, 2]\n",
    "name: x\nlaunch:\n  log_dir: relative/logs\n  args:\n    model-path: /m\n",
    "name: x\nlaunch:\n  health_timeout: eight\n  args:\n    model-path: /m\n",
    "name: x\nlaunch:\n  grace: {a: 1}\n  args:\n    model-path: /m\n",
    "name: x\nlaunch:\n  env: {A: {b: 1}}\n  args:\n    model-path: /m\n",
    "name: x\nlaunch:\n  module: [a]\n  args:\n    model-path: /m\n",
    "name: x\nlaunch:\n  args:\n    model-path: /m\n    port: null\n",
], ids=["deep-flow", "deep-block", "deep-json-text", "deep-json-text-vllm", "binary", "mapping-for-number",
        "list-for-args", "relative-log-dir", "word-for-seconds", "mapping-for-seconds", "mapping-in-env",
        "list-for-module", "null-port"])
def test_deep_and_mistyped_playbooks_are_sentences(text):
    sentence_or_result(load_playbook_and_profile, text)


def test_found_by_the_fuzzer_a_null_port_is_a_sentence_naming_the_arg():
    from provision.cli.launch import _parse_overrides
    from provision.config.profile import build_profile

    with pytest.raises(ProvisionError) as e:
        build_profile({"args": {"model-path": "/m"}}, "fuzz.yaml", "fuzz", None, _parse_overrides(["port=null"]))
    assert e.value.message == "--arg port=None: port must be a whole number, got None"


def test_a_relative_log_dir_is_refused_naming_the_file():
    from provision.config.profile import build_profile

    with pytest.raises(ProvisionError) as e:
        build_profile({"log_dir": "logs", "args": {"model-path": "/m"}}, "p.yaml", "p")
    assert e.value.message.startswith("p.yaml: launch.log_dir: expected an absolute path, got 'logs'")


def test_a_deep_inventory_and_arg_are_sentences_naming_where():
    from provision.cli.launch import _parse_overrides
    from provision.config.inventory.formats import parse_inventory

    with pytest.raises(ProvisionError) as e:
        parse_inventory("hosts:\n  h1:\n    args:\n      x: " + deep(2000) + "\n", "inv.yaml")
    assert "inv.yaml: nested deeper than 64 levels" in e.value.message
    with pytest.raises(ProvisionError) as e:
        _parse_overrides(["speculative-config=" + deep(2000)])
    assert "--arg 'speculative-config=" in e.value.message and "nested deeper than 64 levels" in e.value.message


def test_a_deep_journal_line_is_a_bad_line_not_a_traceback(tmp_path, monkeypatch):
    from provision.control import journal

    path = tmp_path / "journal.jsonl"
    monkeypatch.setenv("PROVISION_JOURNAL", str(path))
    path.write_text(json.dumps({"command": "patch", "host": "a", "verdict": "patched"}) + "\n"
                    + "[" * 100000 + "]" * 100000 + "\n")
    recs, bad = journal.read()
    assert [r["host"] for r in recs] == ["a"] and bad == [2]


def test_the_depth_reader_measures_without_recursion():
    from provision.config import bounded

    assert bounded.text_depth('{"a": "[[[[", "b": [1, [2]]}') == 3
    assert bounded.text_depth("[" * 100000) == 100000
    nested: object = 1
    for _ in range(100000):
        nested = [nested]
    assert bounded.data_depth(nested, 64) == 65
    assert bounded.data_depth({"a": [{"b": 1}]}) == 3
