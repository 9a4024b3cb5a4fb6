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
