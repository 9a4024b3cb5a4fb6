"""The suite's time bounds follow the machine's measured pace (tests/pace.py, tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests import pace


def test_the_run_has_a_measured_pace_and_it_is_never_below_one():
    assert pace.pace() >= 1.0
    assert pace.seconds(180) == pytest.approx(180 * pace.pace())


def test_a_test_without_its_own_mark_gets_the_default_bound_times_the_pace(request):
    mark = request.node.get_closest_marker("timeout")
    if pace.pace() == 1.0:
        assert mark is None or mark.args[0] == 180
    else:
        assert mark.args[0] == int(180 * pace.pace())


@pytest.mark.timeout(30)
def test_a_tests_own_bound_is_scaled_too(request):
    assert request.node.get_closest_marker("timeout").args[0] == int(30 * pace.pace())


def test_a_bad_or_low_value_reads_as_the_reference_pace(monkeypatch):
    for value, want in (("nonsense", 1.0), ("0.4", 1.0), ("2.5", 2.5), ("", 1.0)):
        monkeypatch.setenv(pace.ENV, value)
        assert pace.pace() == want
