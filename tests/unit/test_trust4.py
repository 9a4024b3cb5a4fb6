"""Trust, fourth round (issue 60), the pure parts: secrets read once and validated, a secret an engine
has no flag for refused before any host is touched, redaction of the shapes logs print secrets in,
a spec's `params:` as names and literal defaults only, and a host's answer read bounded, checked and
with its control characters escaped before any of it reaches a terminal."""

from __future__ import annotations

import json

import pytest

from provision.config.inventory import Host
from provision.config.profile import secret_value, secrets_from_env
from provision.control.transport import answer
from provision.control.transport.base import KEEP_TAIL, _bound
from provision.errors import ConfigError, RemoteError
from provision.host.engine.core import EngineError
from provision.host.engine.spec import _parse_params
from provision.host.lib.redact import redact
from provision.output.report import host_line, lines
from provision.output.results import HostResult
from provision.tasks.options import LaunchOptions, engine_secrets, resolve


# --------------------------------------------------------------------------- secrets
@pytest.mark.parametrize("raw, why", [(b"", "is empty"), (b"\n", "is empty"), (b"  \t\n", "is empty"),
                                      (b"\xff\xfekey", "not UTF-8 text (byte 0 is b'\\xff')"),
                                      (b"key\nother\n", "holds more than one line"),
                                      (b"ke\x1by", "holds a control character")])
def test_a_secret_that_is_not_one_line_of_text_is_refused_with_a_sentence(raw, why):
    with pytest.raises(ConfigError, match="^/k: " + __import__("re").escape(why)):
        secret_value(raw, "/k")


def test_a_secret_file_keeps_its_one_line_without_the_final_newline(tmp_path):
    f = tmp_path / "key"
    f.write_bytes(b"sk-123\r\n")
    assert secrets_from_env({}, files={"api-key": str(f)})["args"] == {"api-key": "sk-123"}
    f.write_bytes(b"")  # an empty key file: before, a server started with no key at all
    with pytest.raises(ConfigError, match="is empty: a server would start without the key"):
        secrets_from_env({}, files={"api-key": str(f)})
    with pytest.raises(ConfigError, match=r"\$PROVISION_API_KEY: holds more than one line"):
        secrets_from_env({"PROVISION_API_KEY": "a\nb"})


def test_an_admin_key_file_for_a_vllm_host_is_refused_before_anything_and_the_env_one_left_out(tmp_path):
    pb = tmp_path / "v.yaml"
    pb.write_text(json.dumps({"name": "v", "engine": "vllm", "launch": {"args": {"model": "/m"}}}))
    host = Host("gpu1", {"profile": str(pb)})
    with pytest.raises(ConfigError, match=r"--admin-api-key-file: vLLM has no --admin-api-key .*nothing was "
                                          r"started or stopped"):
        resolve(host, LaunchOptions(secret_files=("admin-api-key",)))
    resolve(host, LaunchOptions(secret_files=("api-key",)))  # vLLM takes --api-key
    both = {"args": {"api-key": "k1", "admin-api-key": "k2"}, "env": {"HF_TOKEN": "t"}}
    assert engine_secrets(both, "vllm") == {"args": {"api-key": "k1"}, "env": {"HF_TOKEN": "t"}}
    assert engine_secrets(both, "sglang") == both


@pytest.mark.parametrize("text, secret", [
    ("non-default args: {'model': '/m', 'api_key': ['sk-live-42'], 'port': 8000}", "sk-live-42"),  # vLLM 0.16
    ("args: {'api_key': ('tok-9', 'tok-10')}", "tok-9"),
    ('{"api-key": ["abc123xyz"]}', "abc123xyz"),
    ("fetching https://bob:pa55word9@huggingface.co/m", "pa55word9"),
    ("ServerArgs(api_key='zz-top-1', port=1)", "zz-top-1"),
])
def test_redaction_understands_lists_tuples_and_urls(text, secret):
    out = redact(text)
    assert secret not in out and "***" in out, out


# --------------------------------------------------------------------------- specs
@pytest.mark.parametrize("params", ["self, x=__import__('os').system('id')", "self, x=open('/etc/shadow')",
                                    "self, *, k=(lambda: 1)()", "self, x: __import__('os').getcwd() = 1",
                                    "self, x=[1, f()]"])
def test_a_params_default_or_annotation_that_is_code_is_refused(params):
    with pytest.raises(EngineError, match=r"(not a literal or a name|has an annotation that is not a type)"):
        _parse_params("m", params, "spec.methods[0]")


def test_literal_defaults_stay_allowed():
    got = _parse_params("m", "self, layer_ids=None, n=-1, t=(1, 2), d={'a': [1.5]}, *a, s='x', **k", "w")
    assert got["call"] == "layer_ids, n, t, d, *a, s=s, **k"
    got = _parse_params("m", "self, x: int = 3, y: Optional[torch.Tensor] = None, z: list[int] | None = None", "w")
    assert got["call"] == "x, y, z"
    got = _parse_params("m", "self, limit=KIMIV_VT_INFER_MAX_PATCH_NUM, dt=torch.float16", "w")  # the module's names
    assert got["call"] == "limit, dt"


# --------------------------------------------------------------------------- a host's answers
@pytest.mark.parametrize("line, says", [
    ('{"ok": true, "files": [', "is not JSON"),              # truncated (a full disk, a killed writer)
    ("[1, 2, 3]", "is a JSON list, not the object"),
    ("Traceback (most recent call last):", "is not JSON"),
    ('{"a":' * 5000 + "1" + "}" * 5000, "nests deeper"),
    ('{"a":' * 40 + "1" + "}" * 40, "nests deeper than 32 levels"),
])
def test_a_broken_or_hostile_answer_is_a_sentence_naming_the_host(line, says):
    with pytest.raises(RemoteError, match="^gpu1: the host's answer " + says):
        answer.parse(line, "gpu1")


def test_an_answer_too_large_is_refused():
    with pytest.raises(RemoteError, match="more than provision reads"):
        answer.parse('{"x": "' + "a" * (answer.MAX_ANSWER_BYTES + 1) + '"}', "gpu1")


def test_terminal_control_characters_from_a_host_are_escaped_and_cannot_forge_a_row():
    doc = answer.parse(json.dumps({"ok": False, "error": {"message": "\x1b[2K\rgpu2  patched\x1b]0;pwn\x07 \x9b31m",
                                                         "\x1bkey": ["a\x00b"]}}), "gpu1")
    msg = doc["error"]["message"]
    assert "\x1b" not in msg and "\x07" not in msg and "\x9b" not in msg and msg.startswith("\\x1b[2K\rgpu2")
    assert doc["error"]["\\x1bkey"] == ["a\\x00b"]
    row = HostResult("gpu1", "failed", msg)
    assert "\r" not in host_line(row) and "\n" not in host_line(row)
    assert all("\r" not in x and "\n" not in x for x in lines(["host", "detail"], [["gpu1", "a\nb\rc"]]))
    # a server log keeps its lines (and the \r of its progress bars): only controls are escaped
    assert answer.escape_controls("line 1\r\nline 2\t|\x1b[0m") == "line 1\r\nline 2\t|\\x1b[0m"


@pytest.mark.parametrize("op, doc, says", [
    ("start", {"ok": True, "record": "pid 1"}, "value of key 'record' of dict did not match any element in the union"),
    ("probe", {"ok": True, "offset": "12"}, "value of key 'offset' of dict is not an instance of int"),
    ("stop", {"ok": "yes"}, "value of key 'ok' of dict is not an instance of bool"),
    ("discover", {"ok": True, "facts": {"installs": [{"path": "/x"}, {"path": 7}]}}, "item 1 of value of key 'installs'"),
    ("facts", {"ok": True, "surprise": 1, "facts": {"installs": [{"path": 1, "new": 2}]}},
     "value of key 'path' of item 0 of value of key 'installs' of value of key 'facts' of dict is not an "
     "instance of str"),
    ("stop", {"ok": False, "error": {"message": ["a", "b"]}}, "ErrorInfo: value of key 'message' is not an instance of str"),
])
def test_an_answer_that_is_not_its_ops_type_is_a_sentence_naming_the_host_and_the_op(op, doc, says):
    """Every answer is held to host/protocol.py's type for its op before any task reads it: a
    wrapper's or a compromised host's well-formed JSON of the wrong shape is refused by name."""
    with pytest.raises(RemoteError, match=f"^gpu1: the host's answer to {op} is not what the protocol says "
                                          f"it answers .*{says}"):
        answer.parse(json.dumps(doc), "gpu1", op=op)


def test_well_typed_answers_pass_and_an_untyped_entry_is_taken_as_shape_only():
    assert answer.parse('{"ok": true, "offset": 3, "running": true}', "gpu1", op="probe")["offset"] == 3
    assert answer.parse('{"ok": false, "error": {"kind": "locked", "message": "m"}}', "gpu1", op="start")["ok"] is False
    assert answer.parse('{"anything": 1}', "gpu1", op=None) == {"anything": 1}
    assert answer.parse('{"anything": 1}', "gpu1", op="not-an-op") == {"anything": 1}
    # a key the protocol does not name is passed over (kept, not judged): no task reads it
    assert answer.parse('{"ok": true, "newer": [1], "facts": {"x": {}}}', "gpu1", op="facts")["newer"] == [1]


def test_every_op_the_agent_runs_has_its_answer_typed():
    from provision.host.agent import OP_MODULES
    from provision.host.protocol import OPS
    assert set(OP_MODULES) == set(OPS)


def test_a_flood_before_the_answer_is_read_and_dropped_not_kept():
    out, err = bytearray(b"x\n" * (2 << 20)), bytearray(b"e" * (3 << 20))
    fed, scan = _bound(out, err, len(out), len(err), "gpu1", True)
    assert len(out) == KEEP_TAIL and fed == KEEP_TAIL and len(err) == KEEP_TAIL and scan == KEEP_TAIL
    with pytest.raises(RemoteError, match="more than 32 MiB on one line"):
        _bound(bytearray(b"y" * (answer.MAX_ANSWER_BYTES + KEEP_TAIL + 1)), bytearray(), 0, 0, "gpu1", True)


# --------------------------------------------------------------------------- the vLLM sources fetcher
def test_the_sources_fetcher_fails_closed():
    from provision.sandbox.vllm_sources import SourceUnavailable, sdist_entry

    sha = "a" * 64
    ok = {"files": [{"filename": "vllm-0.32.0.tar.gz", "url": "https://files.example/v.tar.gz", "hashes": {"sha256": sha}}]}
    assert sdist_entry(ok, "0.32.0", "https://pypi.org/simple/") == ("https://files.example/v.tar.gz", sha)
    assert sdist_entry(ok, "0.32.0", "file:///opt/pypi/simple")[1] == sha
    for bad, says in (({"files": [{"filename": "vllm-0.32.0.tar.gz", "url": "https://x/v.tar.gz"}]}, "without a sha256"),
                      ({"files": [{"filename": "vllm-0.32.0.tar.gz", "url": "https://x/v.tar.gz",
                                   "hashes": {"sha256": "nothex"}}]}, "without a sha256"),
                      ({"files": [{"filename": "vllm-0.32.0.tar.gz", "url": "http://evil/v.tar.gz",
                                   "hashes": {"sha256": sha}}]}, "neither https nor the index's own"),
                      ({"files": []}, "lists no vllm-0.32.0.tar.gz")):
        with pytest.raises(SourceUnavailable, match=says):
            sdist_entry(bad, "0.32.0", "https://pypi.org/simple/")
