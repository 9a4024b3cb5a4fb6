"""`provision schedule`: every option of `reconcile` the user gives reaches the unit and the cron line."""

from __future__ import annotations

import os
import shlex

import click
from click.testing import CliRunner

from provision.cli.main import main
from provision.cli.fleet import LOCAL_PATHS, NOT_FORWARDED, reconcile, schedule

INVENTORY = "hosts:\n  gpu01: {address: 10.0.0.1}\n"


def _value(opt: click.Option):
    """A value for an option, as the user would type it and as reconcile should parse it."""
    special = {"inventory": "inv.yaml", "window": "02:00-05:00", "serial": "2",
               "spec": "kimi-vl-eagle3", "profile": "kimi-k25-eagle3", "install_path": "/opt/x/sglang",
               "python_": "/opt/venv/bin/python", "identity": "keys/id_ed25519", "ssh_config": "ssh/config",
               "known_hosts": "ssh/known_hosts", "sudo_password_file": "secret/sudo.txt", "user": "ops",
               "gpu_capability": "12.0"}
    if opt.is_flag and opt.secondary_opts:
        return ["--no-sudo"], False
    if opt.is_flag:
        return [opt.opts[-1]], True
    if opt.multiple and opt.name == "spec":  # repeatable --playbook: two shipped specs
        return [opt.opts[-1], "kimi-vl-eagle3", opt.opts[-1], "kimi-k25-eagle3"], ("kimi-vl-eagle3", "kimi-k25-eagle3")
    if opt.multiple:
        return [opt.opts[-1], "a", opt.opts[-1], "b"], ("a", "b")
    if opt.name in special:
        v = special[opt.name]
        return [opt.opts[-1], v], v
    if isinstance(opt.type, click.Choice):
        return [opt.opts[-1], opt.type.choices[-1]], opt.type.choices[-1]
    if isinstance(opt.type, (click.types.IntParamType, click.IntRange)):
        return [opt.opts[-1], "7"], 7
    if isinstance(opt.type, (click.types.FloatParamType, click.FloatRange)):
        return [opt.opts[-1], "3.5"], 3.5
    return [opt.opts[-1], f"value-{opt.name}"], f"value-{opt.name}"


def _exec_start(output: str) -> list[str]:
    line = next(x for x in output.splitlines() if x.startswith("ExecStart="))
    return shlex.split(line[len("ExecStart="):])


# --local (this machine) and its --state-dir exclude the host selection: given on their own (below)
LOCAL_MODE = {"local", "state_dir"}


def test_every_reconcile_option_given_to_schedule_reaches_reconcile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    every = [p for p in reconcile.params if isinstance(p, click.Option) and p.name not in NOT_FORWARDED]
    schedule_names = {p.name for p in schedule.params}
    assert {p.name for p in every} <= schedule_names  # every reconcile option is a schedule option
    options = [p for p in every if p.name not in LOCAL_MODE]
    args, want = ["--every", "30m"], {}
    for opt in options:
        typed, parsed = _value(opt)
        args += typed
        want[opt.name] = os.path.abspath(parsed) if opt.name in LOCAL_PATHS else parsed
    result = CliRunner().invoke(schedule, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    argv = _exec_start(result.output)
    assert argv[1] == "reconcile" and os.path.isabs(argv[0])
    got = reconcile.make_context("reconcile", argv[2:]).params
    for name, value in want.items():
        assert got[name] == value, (name, argv)
    cron = next(x for x in result.output.splitlines() if x.startswith("*/30 * * * * "))
    assert shlex.join(argv[2:]) in cron


def test_schedule_forwards_only_what_was_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    monkeypatch.delenv("PROVISION_SSH_CONFIG", raising=False)
    monkeypatch.setenv("PROVISION_KNOWN_HOSTS", "kh")  # from the environment: a timer would not have it
    result = CliRunner().invoke(schedule, ["-i", "inv.yaml"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert _exec_start(result.output)[1:] == ["reconcile", "--inventory", str(tmp_path / "inv.yaml"),
                                              "--known-hosts", str(tmp_path / "kh")]


def test_schedule_needs_hosts_and_checks_options_now(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    for args in ([], ["-i", "inv.yaml", "--window", "02:00-05:00"], ["-i", "inv.yaml", "--every", "45m"],
                 ["-i", "missing.yaml"], ["-i", "inv.yaml", "--playbook", "no-such-playbook"]):
        result = CliRunner().invoke(main, ["schedule", *args])
        assert result.exit_code == 2 and "error: " in result.output, (args, result.output)
        assert "[Service]" not in result.output


def test_cron_line_for_a_user_makes_its_log_directory():
    from provision.tasks.schedule import render_units

    home_log = "/home/ops/.local/state/provision/reconcile.log"
    cron = render_units(["/usr/local/bin/provision", "reconcile", "-i", "/home/ops/inv.yaml"], 900,
                        "*/15 * * * *", home_log)["cron"]
    assert cron == ("*/15 * * * * mkdir -p /home/ops/.local/state/provision && /usr/local/bin/provision "
                    f"reconcile -i /home/ops/inv.yaml >>{home_log} 2>&1")
    root = render_units(["/p", "reconcile", "--window", "50%"], 900, "*/15 * * * *", "/var/log/r.log")["cron"]
    assert root == "*/15 * * * * /p reconcile --window 50\\% >>/var/log/r.log 2>&1"


def test_unit_dir_is_a_documented_option_of_install(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    help_text = CliRunner().invoke(main, ["schedule", "--help"]).output
    assert "--unit-dir" in help_text
    result = CliRunner().invoke(main, ["schedule", "-i", "inv.yaml", "--unit-dir", str(tmp_path / "u")])
    assert result.exit_code == 2 and "--install" in result.output and not (tmp_path / "u").exists()
    result = CliRunner().invoke(main, ["schedule", "-i", "inv.yaml", "--install", "--unit-dir", str(tmp_path / "u")])
    assert result.exit_code == 0 and (tmp_path / "u" / "provision-reconcile.timer").exists(), result.output


def test_schedule_local_is_pull_mode_with_this_machines_paths_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(schedule, ["--local", "--state-dir", "state", "--sglang-path", "tree/sglang",
                                           "--every", "15m"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    argv = _exec_start(result.output)
    assert argv[1:] == ["reconcile", "--local", "--state-dir", str(tmp_path / "state"),
                        "--sglang-path", str(tmp_path / "tree/sglang")], argv
    got = reconcile.make_context("reconcile", argv[2:]).params
    assert got["local"] is True and got["state_dir"] == str(tmp_path / "state")
    # what a timer could never run is refused now, not at 3 am
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    for args in (["--local", "-i", "inv.yaml"], ["--local", "--host", "gpu01"], ["--state-dir", "s", "-i", "inv.yaml"],
                 ["--local", "--restart"]):
        result = CliRunner().invoke(main, ["schedule", *args])
        assert result.exit_code == 2 and "error: " in result.output, (args, result.output)
        assert "[Service]" not in result.output


def test_a_restarting_timer_has_no_start_limit_and_a_repatch_only_one_keeps_two_hours():
    """A rolling restart of eight Kimi loads (--serial 1) outlasts any fixed limit: systemd would
    SIGTERM it mid-roll. A re-patch-only reconcile keeps the 2 h catch for a hung run."""
    from provision.tasks.schedule import render_units

    svc = render_units(["/p", "reconcile", "-i", "/inv.yaml", "--restart", "--serial", "1"], 900, "*/15 * * * *",
                       "/var/log/r.log")["provision-reconcile.service"]
    limits = [ln for ln in svc.splitlines() if ln.startswith("TimeoutStartSec=")]
    assert limits == ["TimeoutStartSec=infinity"]
    assert "TimeoutStopSec=" in svc
    plain = render_units(["/p", "reconcile", "-i", "/inv.yaml"], 900, "*/15 * * * *",
                         "/var/log/r.log")["provision-reconcile.service"]
    assert [ln for ln in plain.splitlines() if ln.startswith("TimeoutStartSec=")] == ["TimeoutStartSec=2h"]
