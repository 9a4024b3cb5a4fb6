"""Output a person and a monitor can read: in a pipe or CI log one line per row, nothing cut;
at 80 columns no identifier is broken mid-word (audit used to fold class names into 9-character
pieces, 617 lines)."""

from __future__ import annotations

import json

import pytest

from provision.output.report import lines, table_fits
from tests.cli.helpers import run

pytestmark = pytest.mark.ssh


def test_lines_and_fit_are_pure():
    assert lines(["a", "b"], [["x", ""], ["y z", "w"]]) == ["a  b", "x  -", "y z  w"]
    rows = [["KimiK25ForConditionalGeneration", "why " * 30]]
    assert table_fits(["class", "why"], rows, 80) and not table_fits(["class", "why"], rows, 40)


@pytest.fixture(scope="module")
def host(sandbox_factory):
    h = sandbox_factory.host()
    yield h
    sandbox_factory.remove(h)


def test_audit_in_a_pipe_and_at_80_columns(host, ssh_env):
    args = [*ssh_env.cli_args, "--host", host.name]
    doc = json.loads(run("audit", *args, "--json").stdout)
    classes = [g["class"] for g in doc["hosts"][0]["data"]["gaps"]]
    assert len(classes) > 5
    piped = run("audit", *args, env={"COLUMNS": "80"}).stdout.splitlines()
    for cls in classes:  # one line per row, the class first, whole
        assert sum(1 for ln in piped if ln.split("  ")[0] == cls) == 1, cls
    assert len(piped) < len(classes) + 10
    table = run("audit", *args, "--format", "table", env={"COLUMNS": "80"}).stdout
    words = set(table.split())
    assert all(cls in words for cls in classes), [c for c in classes if c not in words]


def test_a_fleet_table_at_80_columns_keeps_identifiers_whole(host, ssh_env, sandbox_factory):
    other = sandbox_factory.host()
    try:
        proc = run("status", *ssh_env.cli_args, "--host", host.name, "--host", other.name, "--format", "table",
                   env={"COLUMNS": "80"})
    finally:
        sandbox_factory.remove(other)
    out = proc.stdout
    words = set(out.split())
    assert {host.name, other.name, "0.5.9", "missing"} <= words, out
    assert out.strip().splitlines()[-1].startswith("2 hosts: ")
    # stdout holds the table once (`> out` keeps it), the lines as they arrived went to stderr
    # (issue 37, item 6: both were on stdout)
    for name in (host.name, other.name):
        assert sum(1 for line in out.splitlines() if line.split()[:1] == [name]) == 1, out
        assert any(line.startswith(name) for line in proc.stderr.splitlines()), proc.stderr
