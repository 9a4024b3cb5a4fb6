"""`--help` of every command teaches the command (issue 37, item 8): its own options come first, the
shared host and SSH options after them under a heading of their own, and no option is offered that
the command then refuses (`--format prometheus` only on `status` and `bench`)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from provision.cli.main import SHARED_PARAMS, main


def _commands():
    ctx = click.Context(main)
    out = []
    for name in main.list_commands(ctx):
        cmd = main.get_command(ctx, name)
        subs = getattr(cmd, "commands", None)
        if subs:
            out += [(f"{name} {sub}", [name, sub]) for sub in subs]
        else:
            out.append((name, [name]))
    return out


COMMANDS = _commands()


@pytest.mark.parametrize("argv", [a for _, a in COMMANDS], ids=[n for n, _ in COMMANDS])
def test_help_shows_the_commands_own_options_first_and_offers_nothing_it_refuses(argv):
    res = CliRunner().invoke(main, [*argv, "--help"])
    assert res.exit_code == 0, res.output
    text = res.output
    ctx = click.Context(main)
    cmd = main.get_command(ctx, argv[0])
    if len(argv) > 1:
        cmd = cmd.get_command(ctx, argv[1])
    names = {p.name for p in cmd.params}
    if {"ssh_config", "hosts", "inventory"} <= names:  # a fleet command (fleet_options)
        assert "Hosts and SSH (every fleet command):" in text, text
        own, _, shared = text.partition("Hosts and SSH (every fleet command):")
        assert "--ssh-config" in shared and "--ssh-config" not in own
        if names - set(SHARED_PARAMS) - {"help"}:
            assert "Options:" in own, text
    if argv[0] not in ("status", "bench"):
        assert "[auto|table|lines|json|prometheus]" not in text, text


# --------------------------------------------------------------------------- one name for one thing (item 5)

OLD_NAMES = ("--spec", "--profile")


@pytest.mark.parametrize("argv", [a for _, a in COMMANDS], ids=[n for n, _ in COMMANDS])
def test_help_offers_one_name_for_each_thing(argv):
    text = CliRunner().invoke(main, [*argv, "--help"]).output
    options = [line.split()[0].rstrip(",") for line in text.splitlines() if line.startswith("  -")]
    assert not set(options) & set(OLD_NAMES), (argv, options)
    if "--server-port" in options:
        assert "-p/--port" in text  # the server's port names SSH's, so the two are told apart
    if "-p" in options:
        assert "--server-port" in text


@pytest.mark.parametrize("argv,old,new", [
    (["patch", "--host", "h1", "--spec", "no/such/playbook.yaml"], "--spec", "--playbook"),
    (["launch", "--host", "h1", "--profile", "no/such/playbook.yaml"], "--profile", "--playbook"),
    (["stop", "--host", "h1", "--profile", "no/such/playbook.yaml"], "--profile", "--playbook"),
    (["reconcile", "--host", "h1", "--profile", "kimi-k25-eagle3", "--check"], "--profile",
     "--restart-playbook"),
    (["history", "--spec", "kimi-k25-eagle3", "-n", "1"], "--spec", "--playbook"),
])
def test_an_old_spelling_still_works_and_says_the_new_one(argv, old, new, tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISION_JOURNAL", str(tmp_path / "journal.jsonl"))
    res = CliRunner().invoke(main, argv)
    assert f"note: {old} is now spelled {new}; the old spelling still works" in res.stderr, res.output
    assert "No such option" not in res.stderr
    if "no/such/playbook.yaml" in argv:  # the value reached the option: the playbook itself is what fails
        assert res.exit_code == 2 and "no/such/playbook.yaml" in res.stderr, res.stderr


def test_both_spellings_at_once_are_a_usage_error():
    res = CliRunner().invoke(main, ["patch", "--host", "h1", "--spec", "a", "--playbook", "b"])
    assert res.exit_code == 2 and "--spec and --playbook are one option: give --playbook only" in res.stderr


@pytest.mark.parametrize("command", ["patch", "unpatch", "reconcile", "restore"])
def test_a_dry_run_spelling_names_check(command):
    res = CliRunner().invoke(main, [command, "--dry-run"])
    assert res.exit_code == 2 and "Did you mean '--check'?" in res.stderr, res.stderr


def test_launch_server_port_and_an_arg_port_that_disagree_are_refused():
    res = CliRunner().invoke(main, ["launch", "--host", "h1", "--server-port", "30001", "--arg", "port=30002"])
    assert res.exit_code == 2, res.output
    assert "--server-port 30001 and --arg port=30002 name two ports for one server" in res.stderr
