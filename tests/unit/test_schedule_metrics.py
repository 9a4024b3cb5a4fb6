"""`provision schedule --metrics-file`: the timer also writes the fleet's state as Prometheus text."""

from __future__ import annotations

import shlex

from click.testing import CliRunner

from provision.cli.main import main

INVENTORY = "hosts:\n  gpu01: {address: 10.0.0.1}\n"


def test_metrics_file_adds_a_status_run_after_every_reconcile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    res = CliRunner().invoke(main, ["schedule", "-i", "inv.yaml", "--user", "ops", "--forks", "3", "--force",
                                    "--playbook", "kimi-k25-eagle3", "--metrics-file", "m/provision.prom"])
    assert res.exit_code == 0, res.output
    service = res.output.split("# ---- provision-reconcile.service\n")[1].split("# ---- ")[0]
    start = next(ln for ln in service.splitlines() if ln.startswith("ExecStart="))
    post = next(ln for ln in service.splitlines() if ln.startswith("ExecStopPost=-"))
    assert "--metrics-file" not in start, "reconcile itself has no such option"
    argv = shlex.split(post[len("ExecStopPost=-"):])
    assert argv[argv.index("status") + 1:] == [
        "--inventory", str(tmp_path / "inv.yaml"), "--user", "ops", "--forks", "3", "--playbook", "kimi-k25-eagle3",
        "--format", "prometheus", "--metrics-file", str(tmp_path / "m" / "provision.prom")]
    assert "--force" not in argv, "only options status has are passed on"
    cron = res.output.split("# ---- crontab line")[1]
    assert "; " in cron and "status --inventory" in cron and "--format prometheus" in cron


def test_without_metrics_file_the_unit_is_unchanged(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    res = CliRunner().invoke(main, ["schedule", "-i", "inv.yaml"])
    assert res.exit_code == 0 and "ExecStopPost" not in res.output and " status " not in res.output
