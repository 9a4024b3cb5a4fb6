"""The one trust rule (provision/host/lib/trust.py) on real files: interpreters, installs, binaries.

Runs as root (the rule is about what root runs); files are handed to an unprivileged uid with
chown. The scratch directory must itself sit in a trusted chain, so it is made under the first
of the repository root and /var/lib that passes the rule (never /tmp: it is 1777)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from provision.host.lib import trust
from provision.host.lib.trust import (trusted_binary, untrusted_install_reason, untrusted_path_reason,
                                      untrusted_reason)

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the rule is about what root runs: needs root")


@pytest.fixture
def base():
    for cand in (str(Path(__file__).resolve().parents[2]), "/var/lib"):
        if untrusted_path_reason(cand) is None:
            d = tempfile.mkdtemp(prefix=".trust-test-", dir=cand)
            os.chmod(d, 0o755)
            try:
                yield Path(d)
            finally:
                shutil.rmtree(d, ignore_errors=True)
            return
    pytest.skip("no directory in a trusted chain to work in")


def pkg(base: Path, name="sglang") -> Path:
    p = base / name
    (p / "srt" / "models").mkdir(parents=True)
    (p / "__init__.py").write_text("")
    (p / "srt" / "models" / "kimi_k25.py").write_text("")
    for d in (p, p / "srt", p / "srt" / "models"):
        os.chmod(d, 0o755)
    return p


def test_a_root_owned_install_passes(base):
    assert untrusted_install_reason(str(pkg(base))) is None


def test_an_install_under_a_users_directory_fails_at_that_directory(base):
    home = base / "alice"
    home.mkdir()
    p = pkg(home)
    os.chown(home, NOBODY, NOBODY)
    assert untrusted_install_reason(str(p)) == f"{home} is owned by {trust.owner_name(NOBODY)}"


def test_an_install_owned_by_a_user_fails_at_itself(base):
    p = pkg(base)
    os.chown(p, NOBODY, NOBODY)
    assert untrusted_install_reason(str(p)) == f"owned by {trust.owner_name(NOBODY)}"


@pytest.mark.parametrize("mode,who", [(0o775, "group"), (0o757, "others"), (0o777, "group and others")])
def test_a_writable_directory_above_fails(base, mode, who):
    mid = base / "opt"
    mid.mkdir()
    p = pkg(mid)
    os.chmod(mid, mode)
    assert untrusted_install_reason(str(p)) == f"{mid} is writable by {who} (mode {mode:04o})"


@pytest.mark.parametrize("what", ["owner", "mode"])
def test_one_file_inside_the_install_that_is_not_roots_alone_fails(base, what):
    p = pkg(base)
    f = p / "srt" / "models" / "kimi_k25.py"
    if what == "owner":
        os.chown(f, NOBODY, NOBODY)
        assert untrusted_install_reason(str(p)) == f"{f} is owned by {trust.owner_name(NOBODY)}"
    else:
        os.chmod(f, 0o664)
        assert untrusted_install_reason(str(p)) == f"{f} is writable by group (mode 0664)"
    assert untrusted_path_reason(str(p)) is None, "the chain alone passes: the files inside decide"


def test_a_symlink_inside_the_install_is_judged_at_its_target(base):
    p = pkg(base)
    evil = base / "alice"
    evil.mkdir()
    (evil / "x.py").write_text("")
    os.chown(evil, NOBODY, NOBODY)
    (p / "srt" / "models" / "x.py").symlink_to(evil / "x.py")
    why = untrusted_install_reason(str(p))
    assert why is not None and why.startswith(f"{p}/srt/models/x.py (a symlink): ") and "owned by" in why


def test_a_symlinked_install_is_judged_as_resolved(base):
    evil = base / "alice"
    evil.mkdir()
    real = pkg(evil)
    os.chown(evil, NOBODY, NOBODY)
    link = base / "sglang"
    link.symlink_to(real)
    assert untrusted_install_reason(str(link)) == f"{evil} is owned by {trust.owner_name(NOBODY)}"


def test_the_interpreter_rule_is_the_path_rule_and_more(base):
    bindir = base / "venv" / "bin"
    bindir.mkdir(parents=True)
    os.chmod(base / "venv", 0o755)
    py = bindir / "python3"
    py.symlink_to("/usr/bin/python3")
    assert untrusted_reason(str(py)) is None
    (base / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    os.chown(base / "venv" / "pyvenv.cfg", NOBODY, NOBODY)
    assert untrusted_path_reason(str(py)) is None
    assert untrusted_reason(str(py)) == f"{base}/venv/pyvenv.cfg is owned by {trust.owner_name(NOBODY)}"


def test_a_binary_is_looked_up_on_the_fixed_path_only_and_the_first_decides(base, monkeypatch):
    first, second = base / "first", base / "second"
    for d in (first, second):
        d.mkdir()
        os.chmod(d, 0o755)
        tool = d / "tool"
        tool.write_text("#!/bin/sh\nexit 0\n")
        os.chmod(tool, 0o755)
    monkeypatch.setattr(trust, "SAFE_PATH", f"{first}:{second}")
    monkeypatch.setenv("PATH", str(second))  # the caller's PATH never counts
    assert trusted_binary("tool") == (str(first / "tool"), None)
    os.chown(first / "tool", NOBODY, NOBODY)
    path, why = trusted_binary("tool")
    assert path == str(first / "tool") and why == f"{first}/tool not run: owned by {trust.owner_name(NOBODY)}"
    assert trusted_binary("absent") == (None, f"no absent on {first}:{second}")
