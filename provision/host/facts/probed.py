"""One host call's answers of the interpreter probe (facts/installs.probe_interpreter).  STDLIB ONLY.

A call resolves its engine and then discovers for its op, each asking every candidate interpreter
where it finds the engine's package: a process each, most of a status call's CPU. Within `once()`
(the agent's dispatch) each interpreter is asked once per package; outside it (tests, readers in a
long-lived process) always afresh. Kept apart from installs.py so the agent enters it without
importing discovery (a no-op patch's fast path imports none of it).
"""

from __future__ import annotations

import contextlib

answers: dict | None = None


@contextlib.contextmanager
def once():
    """Within: what an interpreter imports does not change during one host call (an upgrade's new
    venv is a new interpreter; a patch edits files, not where they are found)."""
    global answers
    outer, answers = answers, ({} if answers is None else answers)
    try:
        yield
    finally:
        answers = outer
