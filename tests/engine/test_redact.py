"""provision.logs.redact: known secrets and the usual secret-carrying patterns are masked."""

from __future__ import annotations

import pytest

from provision.logs.redact import MASK, redact, redact_argv


def test_known_secret_values_anywhere():
    assert redact("key is s3cr3t-value, again s3cr3t-value", ["s3cr3t-value"]) == "key is ***, again ***"
    # short values are not replaced (too many false hits)
    assert redact("abc def", ["abc"]) == "abc def"
    # longest first, so a secret containing another is fully masked
    assert redact("tok=abcdefgh", ["abcd", "abcdefgh"]) == "tok=***"
    assert redact("", ["abcd"]) == ""
    assert redact("nothing here", []) == "nothing here"


def test_server_args_repr_is_masked_without_knowing_the_values():
    text = ("[2026-02-03 10:11:12] server_args=ServerArgs(model_path='/m', host='0.0.0.0', api_key='THEKEY', "
            "admin_api_key=\"AD'MIN\", hf_token=hf_abcdefghijklmnopqrstuvwxyz, served_model_name='kimi')")
    out = redact(text)
    assert "THEKEY" not in out and "AD'MIN" not in out and "hf_abcdef" not in out
    assert "api_key='***'" in out and "admin_api_key=\"***\"" in out and "hf_token=***" in out
    assert "model_path='/m'" in out and "served_model_name='kimi'" in out and "host='0.0.0.0'" in out


def test_none_values_stay_visible():
    out = redact("ServerArgs(api_key=None, admin_api_key=None)")
    assert out == "ServerArgs(api_key=None, admin_api_key=None)"


@pytest.mark.parametrize("text,secret", [
    ("python -m sglang.launch_server --api-key THEKEY --port 30000", "THEKEY"),
    ("python -m sglang.launch_server --api-key=THEKEY --port 30000", "THEKEY"),
    ("launch --admin-api-key 'multi word' --tp 8", "multi word"),
    ('launch --api-key "quoted key" --tp 8', "quoted key"),
    ("curl -H 'Authorization: Bearer THEKEY' http://h:30000/v1/models", "THEKEY"),
    ('{"headers": {"Authorization": "Bearer THEKEY"}}', "THEKEY"),
    ("authorization: bearer THEKEY", "THEKEY"),
    ("HF_TOKEN=hf_secret_value_123 python -m sglang.launch_server", "hf_secret_value_123"),
    ("export HF_TOKEN='abc def'", "abc def"),
    ('HUGGING_FACE_HUB_TOKEN="xyz123"', "xyz123"),
    ("api-key: THEKEY\nport: 30000\n", "THEKEY"),
    ('{"api_key": "THEKEY", "port": 30000}', "THEKEY"),
    ("token hf_ABCDEFGHIJKLMNOPQRSTUVWXYZ123456 leaked", "hf_ABCDEFGHIJKLMNOPQRSTUVWXYZ123456"),
])
def test_patterns_are_masked_even_when_unknown(text, secret):
    out = redact(text)
    assert secret not in out, out
    assert MASK in out


def test_surroundings_are_kept():
    assert redact("--api-key THEKEY --port 30000") == "--api-key *** --port 30000"
    assert redact("--api-key=THEKEY --port 30000") == "--api-key=*** --port 30000"
    assert redact("Authorization: Bearer THEKEY\nHost: x") == "Authorization: Bearer ***\nHost: x"
    assert redact("api_key='THEKEY', port=30000") == "api_key='***', port=30000"
    assert redact("port: 30000\napi-key: 'THEKEY'\n") == "port: 30000\napi-key: '***'\n"
    assert redact("HF_TOKEN=abc123 other=1") == "HF_TOKEN=*** other=1"


def test_idempotent():
    text = "api_key='THEKEY' --api-key X Authorization: Bearer Y HF_TOKEN=Z"
    once = redact(text, ["THEKEY"])
    assert redact(once, ["THEKEY"]) == once


def test_redact_argv():
    argv = ["python3", "-m", "sglang.launch_server", "--api-key", "THEKEY", "--port", "1", "--hf-token=hf_x"]
    assert redact_argv(argv) == ["python3", "-m", "sglang.launch_server", "--api-key", "***", "--port", "1",
                                 "--hf-token=***"]
    assert redact_argv(["--model-path", "/m/THEKEY"], ["THEKEY"]) == ["--model-path", "/m/***"]
