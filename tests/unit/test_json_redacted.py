"""Every `--json` document goes through the redactor: whatever a host sent back (a detail, a note,
a log tail, a command line in `data`), no secret value this run knows and no secret-carrying
pattern reaches stdout, and the document keeps its shape."""

from __future__ import annotations

import json

from provision.output import report
from provision.output.results import HostResult

ENV_KEY = "sk-from-the-environment-4242"
FILE_KEY = "sk-from-an-api-key-file-7777"
HF = "hf_abcdefghijklmnopqrstuvwxyz0123"


def _result() -> HostResult:
    return HostResult(
        host="gpu01", verdict="crashed",
        detail=f"server exited: ServerArgs(model_path='/m', api_key='{FILE_KEY}', port=30000)",
        notes=[f"the key in use is {ENV_KEY}", "log: --admin-api-key s3cr3t-admin --port 30000"],
        data={"log_tail": [f"HF_TOKEN={HF}", "Authorization: Bearer abc.def.ghi"],
              "argv": ["python3", "-m", "sglang.launch_server", "--api-key", FILE_KEY],
              ENV_KEY: "a key as a key", "port": 30000, "ok": False, "nested": [{"x": f"token {HF}"}]})


def test_a_json_document_holds_no_secret_whatever_the_host_sent(monkeypatch):
    monkeypatch.setenv("PROVISION_API_KEY", ENV_KEY)
    text = report.to_document("launch", [_result()], 3, {"note": f"extra {ENV_KEY}"}, secrets=[FILE_KEY])
    for secret in (ENV_KEY, FILE_KEY, HF, "s3cr3t-admin", "abc.def.ghi"):
        assert secret not in text, secret
    doc = json.loads(text)
    host = doc["hosts"][0]
    assert (doc["command"], doc["exit_code"], host["host"], host["verdict"]) == ("launch", 3, "gpu01", "crashed")
    assert host["data"]["port"] == 30000 and host["data"]["ok"] is False
    assert host["data"]["argv"][:4] == ["python3", "-m", "sglang.launch_server", "--api-key"]
    assert "model_path='/m'" in host["detail"] and "port=30000" in host["detail"]


def test_bench_and_journal_documents_go_through_the_same_redactor(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", HF)
    out = report.dumps_redacted({"hosts": [{"notes": [f"x {HF} y"]}]}, indent=None)
    assert HF not in out and json.loads(out) == {"hosts": [{"notes": ["x *** y"]}]}


def test_an_unreadable_key_file_still_leaves_the_environments_own_secrets_redacted(monkeypatch, tmp_path):
    monkeypatch.setenv("PROVISION_ADMIN_API_KEY_FILE", str(tmp_path / "missing"))
    monkeypatch.setenv("PROVISION_API_KEY", ENV_KEY)
    out = report.dumps_redacted({"notes": [f"key {ENV_KEY}"]})
    assert ENV_KEY not in out
