"""The journal's writer (control/journal.py): rows journaled one by one as they arrive, extras
(reconcile's restarts, launch --patch's edits) as lines of their own. Pure apart from the file."""

from __future__ import annotations

import json

from provision.control import journal
from provision.output.results import HostResult


def _lines(p):
    return [json.loads(x) for x in p.read_text().splitlines()]


def test_each_row_is_on_disk_when_the_writer_returns(tmp_path):
    p = tmp_path / "j.jsonl"
    w = journal.Writer("patch", where=str(p))
    w(HostResult("a", "patched", "ok", file="/f", data={"spec": "s", "sha_before": "1", "sha_after": "2"}))
    assert [(r["host"], r["verdict"], r["sha256_after"]) for r in _lines(p)] == [("a", "patched", "2")]
    w(HostResult("b", "unchanged", "already"))       # nothing changed: no line
    w(HostResult("c", "unknown", "interrupted", error_kind="interrupted"))  # an attempt: a line
    assert [r["host"] for r in _lines(p)] == ["a", "c"]
    assert w.written == 2 and not w.warnings


def test_a_failed_write_is_one_warning_not_an_exception(tmp_path):
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "j.jsonl").mkdir()  # a directory where the file should be
    w = journal.Writer("patch", where=str(tmp_path / "ro" / "j.jsonl"))
    for host in ("a", "b"):
        w(HostResult(host, "patched", "ok"))
    assert len(w.warnings) == 1 and "could not write the journal" in w.warnings[0]


def test_a_restart_added_later_is_journaled_as_its_own_line(tmp_path):
    p = tmp_path / "j.jsonl"
    w = journal.Writer("reconcile", where=str(p))
    row = HostResult("a", "repaired", "re-patched", file="/f", data={"spec": "s", "action": "patch"})
    w(row)
    w.extra(row, {"command": "restart", "verdict": "unknown", "detail": "interrupted", "file": "/f"})
    w.extra(row, {"command": "restart", "verdict": "skipped", "detail": "not started"})  # not a change
    assert [(r["command"], r["verdict"], r["spec"]) for r in _lines(p)] == [
        ("reconcile", "repaired", "s"), ("restart", "unknown", "s")]


def test_launch_patch_edits_are_patch_lines_of_the_launch_row():
    from provision.tasks.interrupt import patch_journal

    pres = [HostResult("a", "patched", "ok", file="/k.py", data={"spec": "kimi", "sha_before": "1", "sha_after": "2"}),
            HostResult("a", "unchanged", "already", file="/q.py", data={"spec": "req"})]
    row = HostResult("a", "ready", "healthy", data={"spec": "kimi", "journal_extra": patch_journal(pres)})
    got = journal.entries("launch", [row])
    assert [(r["command"], r["verdict"], r["file"], r["spec"], r["sha256_after"]) for r in got] == [
        ("patch", "patched", "/k.py", "kimi", "2")]


def test_an_interrupted_launch_still_carries_its_patch_edits():
    from provision.config.inventory import Host
    from provision.tasks.interrupt import RunState, interrupt_report
    from provision.tasks.options import LaunchOptions

    run = RunState()
    run.stages["a"] = "started"
    run.patched["a"] = [HostResult("a", "patched", "ok", file="/k.py", data={"spec": "kimi"})]
    rows = interrupt_report([Host("a")], run, LaunchOptions())
    assert [(r["command"], r["verdict"]) for r in journal.entries("launch", rows)] == [
        ("launch", "interrupted"), ("patch", "patched")]


def test_ctrl_c_before_the_worker_says_started_still_journals_the_start():
    """Ctrl-C after the start answer came back but before the worker's row did (a loaded machine, CI
    seen): the journal still says a server was started, with its pid, beside the interrupt."""
    from provision.config.inventory import Host
    from provision.tasks.interrupt import RunState, interrupt_report
    from provision.tasks.options import LaunchOptions

    run = RunState()
    run.stages["a"] = "started"
    run.started["a"] = {"pid": 4242, "log": "/var/log/x.log", "change": "started"}
    run.patched["a"] = [HostResult("a", "patched", "ok", file="/k.py", data={"spec": "kimi"})]
    rows = interrupt_report([Host("a")], run, LaunchOptions(stop_on_interrupt=True))
    assert "the server was started (pid 4242" in rows[0].detail
    got = [(r["command"], r["verdict"], r.get("detail", "")) for r in journal.entries("launch", rows)]
    # one line per attempt, as when the row comes back: the start's own, which says how it ended
    assert got == [("patch", "patched", "ok"), ("launch", "started", "started pid 4242; then interrupted")]


def test_every_launch_and_stop_attempt_is_a_line_refused_failed_unknown_included():
    rows = [HostResult("a", "refused", "preflight: model /m does not exist (--force to start anyway)"),
            HostResult("b", "failed", "start failed: no python3", error_kind="remote"),
            HostResult("c", "unknown", "connection lost during the remote step", error_kind="unknown"),
            HostResult("d", "running", "already running and healthy with this profile"),
            HostResult("e", "failed", "cannot connect", error_kind="connect")]
    got = [(r["host"], r["command"], r["verdict"]) for r in journal.entries("launch", rows)]
    # a host never reached (connect) changed nothing; one already running was not an attempt to change it
    assert got == [("a", "launch", "refused"), ("b", "launch", "failed"), ("c", "launch", "unknown")]
    stops = [HostResult("a", "refused", "the process on port 30000 is not provision's"),
             HostResult("b", "unknown", "connection lost", error_kind="unknown")]
    assert [(r["command"], r["verdict"]) for r in journal.entries("stop", stops)] == [
        ("stop", "refused"), ("stop", "unknown")]


def test_a_start_that_then_failed_is_one_line_its_start():
    row = HostResult("a", "failed", "crashed: rank 0 scheduler died", data={"journal_extra": [
        {"command": "launch", "verdict": "started", "detail": "started pid 7 port 30000; then failed"}]})
    got = journal.entries("launch", [row])
    assert [(r["command"], r["verdict"], r["detail"]) for r in got] == [
        ("launch", "started", "started pid 7 port 30000; then failed")]
