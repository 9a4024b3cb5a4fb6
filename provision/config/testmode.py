"""Switches only tests may touch, and the ONE variable that lets them act.

Three environment variables exist for the test suite and the sandbox, never for a fleet:

    PROVISION_FAILPOINTS           forwarded to every host, where e.g. after_replace SIGKILLs a real patch
    PROVISION_NOW                  shifts the clock restart windows are checked against
    PROVISION_SYSTEM_KNOWN_HOSTS   replaces /etc/ssh/ssh_known_hosts, a trust root

They act only while ``PROVISION_TEST_MODE=1`` is set too (the suite's conftest and the
sandbox set it: provision/sandbox/homedir.py ``isolated_env``). A `provision` run that
finds any of them set without it is refused at once, exit 2, naming the variable, before
anything is read or touched: a shell left over from running the tests must not kill a
real patch, move a restart window or swap the known hosts. Pure but for os.environ.
"""

from __future__ import annotations

import os
from typing import Mapping

from provision.errors import UsageError

TEST_MODE_ENV = "PROVISION_TEST_MODE"
SWITCHES = ("PROVISION_FAILPOINTS", "PROVISION_NOW", "PROVISION_SYSTEM_KNOWN_HOSTS")


def test_mode(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(TEST_MODE_ENV) == "1"


def switch(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of test-only switch `name`, or None: unset, empty, or not in test mode."""
    if name not in SWITCHES:
        raise ValueError(f"{name} is not a test-only switch ({', '.join(SWITCHES)})")
    env = os.environ if environ is None else environ
    return (env.get(name) or None) if test_mode(env) else None


def refusal(environ: Mapping[str, str] | None = None) -> str | None:
    """Why this run must not go on (a switch is set outside test mode), or None. Pure."""
    env = os.environ if environ is None else environ
    if test_mode(env):
        return None
    found = [n for n in SWITCHES if env.get(n)]
    if not found:
        return None
    names = " and ".join(found)
    return (f"{names} {'is' if len(found) == 1 else 'are'} set, and only the test suite may set "
            f"{'it' if len(found) == 1 else 'them'} (it sets {TEST_MODE_ENV}=1 too); nothing was done: "
            f"unset {' '.join(found)} in this shell (`unset {' '.join(found)}`)")


def check(environ: Mapping[str, str] | None = None) -> None:
    """Raise UsageError (exit 2) when refusal() says so."""
    why = refusal(environ)
    if why:
        raise UsageError(why)
