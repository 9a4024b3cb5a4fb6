"""The trust rule said twice must say one thing: trust.py's Python (untrusted_path_reason,
trusted_binary's lookup) and its sh rendition SH_RULE (run by the container transport's outer
host, before the runtime), on the same real files, in dash and in bash: the same verdict, the
same path blamed, the same words.

Runs as root, in a scratch directory inside a trusted chain (tests/unit/test_trust_rule.py's
`base`); files are handed to an unprivileged uid with chown."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from provision.host.lib import trust
from provision.host.lib.trust import SAFE_PATH, SH_RULE, sh_reason, untrusted_path_reason
from tests.unit.test_trust_rule import NOBODY, base  # noqa: F401 - base is a fixture

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the rule is about what root runs: needs root")

SHELLS = [sh for sh in ("/bin/dash", "/bin/bash") if os.path.exists(sh)]


def sh_verdict(shell: str, path: str) -> str | None:
    """What SH_RULE says of `path`: None when it passes, else untrusted_path_reason's words."""
    proc = subprocess.run([shell, "-c", SH_RULE + 'provision_untrusted "$1"', "sh", path],
                          capture_output=True, text=True, env={"PATH": "/nonexistent"}, timeout=30)
    assert proc.stderr == ""
    if proc.returncode == 0:
        assert proc.stdout == ""
        return None
    assert proc.returncode == 1 and proc.stdout.count("\n") == 1, proc.stdout
    named, why = sh_reason(proc.stdout)
    assert named == path
    return why


def tool(d: Path, name: str = "podman") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o755)
    f = d / name
    f.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(f, 0o755)
    return f


def _ok(base: Path) -> str:
    return str(tool(base / "bin"))


def _file_owned_by_a_user(base: Path) -> str:
    f = tool(base / "bin")
    os.chown(f, NOBODY, NOBODY)
    return str(f)


def _file_group_writable(base: Path) -> str:
    f = tool(base / "bin")
    os.chmod(f, 0o775)
    return str(f)


def _dir_owned_by_a_user(base: Path) -> str:
    f = tool(base / "bin")
    os.chown(f.parent, NOBODY, NOBODY)
    return str(f)


def _dir_mode(mode: int):
    def make(base: Path) -> str:
        f = tool(base / "opt" / "bin")
        os.chmod(base / "opt", mode)
        return str(f)
    make.__name__ = f"_dir_mode_{mode:04o}"
    return make


def _symlink_to_a_file_owned_by_a_user(base: Path) -> str:
    target = tool(base / "real")
    os.chown(target, NOBODY, NOBODY)
    (base / "bin").mkdir()
    os.chmod(base / "bin", 0o755)
    (base / "bin" / "podman").symlink_to(target)
    return str(base / "bin" / "podman")


def _symlink_into_a_users_directory(base: Path) -> str:
    target = tool(base / "home" / "alice")
    os.chown(target.parent, NOBODY, NOBODY)
    (base / "bin").mkdir()
    os.chmod(base / "bin", 0o755)
    (base / "bin" / "podman").symlink_to(target)
    return str(base / "bin" / "podman")


def _symlinked_directory_on_the_way(base: Path) -> str:
    tool(base / "real" / "bin")
    os.chmod(base / "real", 0o777)
    (base / "usr").symlink_to(base / "real")
    return str(base / "usr" / "bin" / "podman")


def _relative_symlink_to_a_trusted_file(base: Path) -> str:
    tool(base / "libexec")
    (base / "bin").mkdir()
    os.chmod(base / "bin", 0o755)
    (base / "bin" / "podman").symlink_to("../libexec/podman")
    return str(base / "bin" / "podman")


def _name_with_spaces_in_a_writable_dir(base: Path) -> str:
    f = tool(base / "a dir" / "b  c", name="pod man")
    os.chmod(base / "a dir", 0o757)
    return str(f)


def _missing(base: Path) -> str:
    return str(base / "bin" / "nothing")


CASES = [_ok, _file_owned_by_a_user, _file_group_writable, _dir_owned_by_a_user, _dir_mode(0o775), _dir_mode(0o757),
         _dir_mode(0o777), _dir_mode(0o1777), _dir_mode(0o2775), _symlink_to_a_file_owned_by_a_user,
         _symlink_into_a_users_directory, _symlinked_directory_on_the_way, _relative_symlink_to_a_trusted_file,
         _name_with_spaces_in_a_writable_dir]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__.lstrip("_"))
def test_sh_and_python_say_the_same_of_a_path(base, shell, case):  # noqa: F811 - base is a fixture
    path = case(base)
    want = untrusted_path_reason(path)
    assert sh_verdict(shell, path) == want
    passes = case in (_ok, _relative_symlink_to_a_trusted_file)
    assert (want is None) == passes, want


@pytest.mark.parametrize("shell", SHELLS)
def test_a_path_that_cannot_be_checked_fails_in_both(base, shell):  # noqa: F811
    path = _missing(base)
    assert untrusted_path_reason(path).startswith("cannot be checked")
    assert sh_verdict(shell, path) == "cannot be checked"


@pytest.mark.parametrize("shell", SHELLS)
def test_the_real_runtimes_and_shell_here_get_the_same_verdict(shell):
    for name in ("sh", "podman", "docker", "python3"):
        path = shutil.which(name, path=SAFE_PATH)
        if path:
            assert sh_verdict(shell, path) == untrusted_path_reason(path), path


@pytest.mark.parametrize("shell", SHELLS)
def test_the_lookup_is_trusted_binarys_lookup_on_the_fixed_path_only(base, shell, monkeypatch):  # noqa: F811
    first, second = base / "first", base / "second"
    tool(first, "tool")
    tool(second, "tool")
    tool(second, "only-second")
    (first / "not-exec").write_text("")
    tool(second, "not-exec")
    (first / "a-dir").mkdir()
    tool(second, "a-dir")
    safe = f"{first}:{second}"
    monkeypatch.setattr(trust, "SAFE_PATH", safe)
    rule = SH_RULE.replace(" ".join(SAFE_PATH.split(":")), f"{first} {second}")
    assert rule != SH_RULE
    for name in ("tool", "only-second", "not-exec", "a-dir", "absent"):
        proc = subprocess.run([shell, "-c", rule + 'provision_which "$1"', "sh", name], capture_output=True,
                              text=True, env={"PATH": str(second)})  # the caller's PATH never counts
        path, _ = trust.trusted_binary(name)
        assert (proc.stdout.strip() or None) == path, name
        assert (proc.returncode == 0) == (path is not None)
