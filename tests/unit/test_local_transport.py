"""The local transport: the host-side step as a subprocess on this machine, with the deadlines,
Ctrl-C and "never started" sentences every transport has (base.Transport)."""

from __future__ import annotations

import threading
import time

import pytest

from provision.control.transport.base import Interrupted
from provision.control.transport.local import LocalTransport
from provision.errors import RemoteError, UnknownOutcome


def test_a_command_runs_with_its_stdin_and_a_login_environment(monkeypatch):
    monkeypatch.setenv("PROVISION_SECRET_OF_THIS_PROCESS", "x")
    t = LocalTransport("here").open()
    rc, out, err = t.exec("cat; pwd; env | grep -c PROVISION_SECRET_OF_THIS_PROCESS; echo e >&2; exit 3",
                          stdin=b"in\n")
    assert (rc, out, err) == (3, "in\n/\n0\n", "e\n")


def test_the_agent_answers_through_it(tmp_path):
    ans = LocalTransport("here", state_dir=str(tmp_path / "state")).open().call({"op": "backups",
                                                                                 "file": str(tmp_path / "x.py")})
    assert ans["ok"] is True and ans["state_dir"] == str(tmp_path / "state")


def test_a_step_past_its_deadline_is_unknown():
    t = LocalTransport("here").open()
    t0 = time.monotonic()
    with pytest.raises(UnknownOutcome):
        t.exec("sleep 30", timeout=0.5)
    assert time.monotonic() - t0 < 5


def test_ctrl_c_ends_the_wait_at_once():
    t = LocalTransport("here").open()
    threading.Timer(0.3, t.cancel).start()
    t0 = time.monotonic()
    with pytest.raises(UnknownOutcome):
        t.exec("sleep 30", timeout=60)
    assert time.monotonic() - t0 < 5
    with pytest.raises(Interrupted):  # and nothing more starts on it
        t.exec("true")


def test_no_python_is_one_sentence():
    with pytest.raises(RemoteError) as info:
        LocalTransport("here").open().call({"op": "status"}, python="/nonexistent/python3")
    assert str(info.value) == "here: /nonexistent/python3 not found on the machine (SGLang needs Python 3.10+)"
