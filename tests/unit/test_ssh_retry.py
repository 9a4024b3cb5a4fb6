"""The SSH connect retry policy (ssh._retrying): transient failures are tried again with backoff,
at most `attempts` times and never past the time limit; anything else is raised at once, as it is."""

from __future__ import annotations

import pytest

from provision.control.transport.ssh import _retrying
from provision.errors import AuthError, ConnectError


def _flaky(fails: int, exc: Exception):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= fails:
            raise exc
    return fn, calls


def transient(exc: BaseException) -> bool:
    return bool(getattr(exc, "transient", False))


def _refused() -> ConnectError:
    err = ConnectError("h: cannot connect to 10.0.0.1:22: connection refused")
    err.transient = True  # type: ignore[attr-defined]
    return err


def test_transient_failures_are_retried_with_backoff():
    fn, calls = _flaky(2, _refused())
    waits: list = []
    _retrying(fn, transient, 4, waits.append)
    assert len(calls) == 3
    assert 0.5 <= waits[0] <= 0.7 and 1.0 <= waits[1] <= 1.2


def test_at_most_the_attempts_then_the_last_error_as_it_is():
    err = _refused()
    fn, calls = _flaky(10, err)
    with pytest.raises(ConnectError) as info:
        _retrying(fn, transient, 4, lambda s: None)
    assert info.value is err and len(calls) == 4


def test_auth_failures_and_a_spent_time_limit_are_never_retried():
    fn, calls = _flaky(10, AuthError("h: authentication as root refused"))
    with pytest.raises(AuthError):
        _retrying(fn, transient, 4, lambda s: None)
    assert len(calls) == 1
    fn, calls = _flaky(10, _refused())
    with pytest.raises(ConnectError):
        _retrying(fn, transient, 4, lambda s: None, give_up_after=0.0)
    assert len(calls) == 1
