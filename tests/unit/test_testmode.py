"""The test-only switches (PROVISION_FAILPOINTS, PROVISION_NOW, PROVISION_SYSTEM_KNOWN_HOSTS) act only in
test mode (PROVISION_TEST_MODE=1), and a run that finds one set outside it is refused, exit 2, naming it."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest

from provision.config import testmode
from provision.config.testmode import SWITCHES, TEST_MODE_ENV, refusal, switch

VALUES = {"PROVISION_FAILPOINTS": "after_replace", "PROVISION_NOW": "2026-01-01T04:59:57",
          "PROVISION_SYSTEM_KNOWN_HOSTS": "/tmp/somebody-elses-known-hosts"}


@pytest.mark.parametrize("mode", [None, "", "0", "yes", "1"])
@pytest.mark.parametrize("names", [c for n in range(len(SWITCHES) + 1) for c in itertools.combinations(SWITCHES, n)])
def test_every_switch_acts_only_in_test_mode_and_is_refused_outside_it(names, mode):
    env = {n: VALUES[n] for n in names}
    if mode is not None:
        env[TEST_MODE_ENV] = mode
    on = mode == "1"
    for n in SWITCHES:
        assert switch(n, env) == (VALUES[n] if on and n in names else None)
    why = refusal(env)
    if on or not names:
        assert why is None
    else:
        assert why is not None and all(n in why for n in names) and "nothing was done" in why
        assert not [n for n in SWITCHES if n not in names and n in why]
        with pytest.raises(testmode.UsageError) as info:
            testmode.check(env)
        assert info.value.exit_code == 2


def test_an_empty_switch_is_unset():
    assert refusal({"PROVISION_NOW": ""}) is None and switch("PROVISION_NOW", {TEST_MODE_ENV: "1",
                                                                              "PROVISION_NOW": ""}) is None


def test_only_the_three_switches_are_switches():
    with pytest.raises(ValueError):
        switch("PROVISION_JOURNAL", {})


def test_the_readers_ignore_the_switches_outside_test_mode(monkeypatch):
    from provision.control.transport.bundle import with_failpoints
    from provision.control.transport.hostkeys import SYSTEM_KNOWN_HOSTS, system_known_hosts
    from provision.tasks.reconcile import window_clock

    for n, v in VALUES.items():
        monkeypatch.setenv(n, v)
    monkeypatch.setenv(TEST_MODE_ENV, "1")  # the suite's own mode: they act
    assert with_failpoints({"op": "patch"})["failpoints"] == "after_replace"
    assert system_known_hosts() == VALUES["PROVISION_SYSTEM_KNOWN_HOSTS"]
    assert window_clock()().year == 2026 and window_clock()().month == 1
    monkeypatch.delenv(TEST_MODE_ENV)  # a shell left over from the tests: they do nothing
    assert "failpoints" not in with_failpoints({"op": "patch"})
    assert system_known_hosts() == SYSTEM_KNOWN_HOSTS
    assert window_clock().__name__ == "now"


@pytest.mark.parametrize("name", SWITCHES)
def test_the_cli_refuses_a_switch_outside_test_mode_with_exit_2_naming_it(name, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != TEST_MODE_ENV and k not in SWITCHES}
    env[name] = VALUES[name]
    for argv in (["status", "--host", "127.0.0.1"], ["history"]):
        proc = subprocess.run([sys.executable, "-m", "provision", *argv], capture_output=True, text=True, env=env,
                              cwd=tmp_path, stdin=subprocess.DEVNULL, timeout=60)
        assert proc.returncode == 2, (argv, proc.returncode, proc.stdout, proc.stderr)
        assert proc.stderr.startswith(f"error: {name} is set") and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stdout == ""


def test_the_suite_and_the_sandbox_run_in_test_mode():
    from provision.sandbox.homedir import isolated_env

    assert os.environ.get(TEST_MODE_ENV) == "1"
    assert isolated_env(os.environ["HOME"] + "/x")[TEST_MODE_ENV] == "1"
