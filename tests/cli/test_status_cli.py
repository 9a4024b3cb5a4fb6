"""`provision status` repeats "restart needed" where the running server predates its file."""

from __future__ import annotations

import pytest

from tests.cli.helpers import run, run_json
from tests.cli.test_launch_cli import inventory, launch

pytestmark = pytest.mark.ssh


@pytest.fixture(scope="module")
def shost(sandbox_factory):
    host = sandbox_factory.host("status1", sglang="0.5.9", layout="venv")
    yield host
    sandbox_factory.remove(host)


def test_status_repeats_restart_needed_when_the_server_predates_the_file(tmp_path, ssh_env, shost):
    shost.reset()
    inv = inventory(tmp_path, ssh_env, shost)
    run("patch", "-i", inv, check_rc=0)
    proc, doc = launch(inv)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", proc.stderr
    try:
        proc, doc = run_json("status", "-i", inv)
        assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "patched"
        assert not any("restart needed" in n for n in doc["hosts"][0]["notes"])
        run("unpatch", "-i", inv, check_rc=0)  # the file changes under the running server
        proc, doc = run_json("status", "-i", inv)
        r = doc["hosts"][0]
        assert proc.returncode == 4 and r["verdict"] == "missing"
        assert any(n.startswith("restart needed") for n in r["notes"]), r["notes"]
        plain = run("status", "-i", inv)
        assert "note: restart needed: the running server (pid " in plain.stdout, plain.stdout
    finally:
        run("stop", "-i", inv)


def test_status_metrics_of_a_healthy_an_errored_and_an_unreachable_host_pass_promtool(tmp_path, ssh_env, shost):
    """issue 43 item 4, over real `status` output: the same server seen by a host entry whose specs
    are the shipped one (healthy) and by one whose first spec's file is not in this SGLang (its
    first row an error), plus an entry nothing answers for. Each served host says
    provision_server_up 1; the unreachable one has no made-up sample; promtool finds nothing to say."""
    import json

    parser = pytest.importorskip("prometheus_client.parser")
    from tests.promtool import lint

    shost.reset()
    broken = tmp_path / "broken-spec.yaml"
    broken.write_text(json.dumps({"name": "broken-spec", "patch": {
        "file": "srt/models/no_such_model.py", "class": "NoSuchModel", "delegate": "language_model",
        "methods": [{"name": "get_embed_and_head", "params": "self"}]}}))
    inv = inventory(tmp_path, ssh_env, shost)
    data = json.loads(open(inv).read())
    entry = data["hosts"][shost.name]
    run("patch", "-i", inv, check_rc=0)
    proc, doc = launch(inv)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", proc.stderr
    try:
        data["hosts"] = {"healthy": dict(entry),
                         "first-row-error": dict(entry, specs=[str(broken), "kimi-k25-eagle3"]),
                         "unreachable": dict(entry, port=1)}
        open(inv, "w").write(json.dumps(data))
        proc = run("status", "-i", inv, "--format", "prometheus", "--metrics-file", tmp_path / "status.prom")
        assert proc.returncode == 3, (proc.stdout, proc.stderr)
        text = (tmp_path / "status.prom").read_text()
        assert text == proc.stdout
        got = {(s.name, frozenset(s.labels.items())): s.value
               for fam in parser.text_string_to_metric_families(text) for s in fam.samples}
        for host in ("healthy", "first-row-error"):
            assert got[("provision_server_up", frozenset({"host": host, "port": "30000"}.items()))] == 1, text
            assert ("provision_restart_needed", frozenset({"host": host}.items())) in got, text
        assert got[("provision_spec_state", frozenset({"host": "first-row-error", "spec": "broken-spec",
                                                       "state": "error"}.items()))] == 1, text
        assert not any(dict(k[1]).get("host") == "unreachable" and k[0] in ("provision_server_up",
                                                                            "provision_restart_needed")
                       for k in got), text
        assert lint(text) == ""
    finally:
        data["hosts"] = {shost.name: entry}
        open(inv, "w").write(json.dumps(data))
        run("stop", "-i", inv)
