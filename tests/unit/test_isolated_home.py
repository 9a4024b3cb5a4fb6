"""The suite's own HOME: nothing a test or its `provision` runs write reaches the user's files."""

from __future__ import annotations

import os
import subprocess
import sys

from provision.control import journal


def test_every_test_has_its_own_home_journal_and_lock():
    real = os.environ["PROVISION_REAL_HOME"]
    home = os.environ["HOME"]
    assert home != real and not home.startswith(real.rstrip("/") + "/.")
    assert journal.path().startswith(home) and os.environ["PROVISION_LOCK"].startswith(home)
    assert os.environ["XDG_STATE_HOME"].startswith(home) and os.environ["XDG_CONFIG_HOME"].startswith(home)
    # and so does a `provision` subprocess
    code = "from provision.control import journal; print(journal.path())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert all(line.startswith(home) for line in out.split()), out
