"""The one atomic writer in a directory another account can write (issue 29, item 2).

`--metrics-file` and the timer's status run write as root into the textfile collector's directory,
which the exporter's own account can often write. That account may plant a link at a temp name,
or swap the temp file for a link between the write and the rename: root must never write, truncate
or chmod a file through it. Real files, a real non-root owner (nobody) of the directory; the swap
is made at the writer's own failpoint, between its last write and its rename.
"""

from __future__ import annotations

import os
import stat

import pytest

from provision.host.lib import atomic, failpoints
from provision.output.prometheus import write_atomic

VICTIM_BYTES = b"root:x:0:0:the file an attacker wants root to overwrite\n"
METRICS = "# TYPE provision_spec_state gauge\nprovision_spec_state 1\n"


@pytest.fixture
def shared_dir(tmp_path):
    """A collector directory the exporter's account (nobody) owns and writes, and a victim file
    outside it that only root should ever change."""
    d = tmp_path / "textfile"
    d.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM_BYTES)
    victim.chmod(0o600)
    if os.geteuid() == 0:
        os.chown(d, 65534, 65534)
    d.chmod(0o755)
    return d, victim


def _unchanged(victim):
    st = victim.lstat()
    return victim.read_bytes() == VICTIM_BYTES and stat.S_IMODE(st.st_mode) == 0o600 and stat.S_ISREG(st.st_mode)


def _regular(path, mode, text):
    st = path.lstat()
    return stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == mode and path.read_text() == text


def test_a_link_planted_at_the_old_temp_name_is_never_followed(shared_dir):
    d, victim = shared_dir
    target = d / "provision.prom"
    # the names the old writer used (pid and thread id: guessable) and any other hidden .tmp
    import threading
    for name in (f".provision.prom.{os.getpid()}.{threading.get_ident()}.tmp", ".provision.prom.tmp"):
        (d / name).symlink_to(victim)
    write_atomic(str(target), METRICS)
    assert _unchanged(victim)
    assert _regular(target, 0o644, METRICS)


def test_a_link_at_the_very_temp_name_chosen_is_refused_by_o_excl(shared_dir, monkeypatch):
    """Even a link at the exact name the writer picks (as if guessed) is neither followed nor
    truncated: O_EXCL|O_NOFOLLOW refuses it and the writer takes another name."""
    d, victim = shared_dir
    target = d / "provision.prom"
    planted = str(d / ".provision.prom.guessed.tmp")
    os.symlink(victim, planted)
    names = iter([planted])
    real = atomic._tmp
    monkeypatch.setattr(atomic, "_tmp", lambda p: next(names, None) or real(p))
    write_atomic(str(target), METRICS)
    assert _unchanged(victim)
    assert _regular(target, 0o644, METRICS)
    assert os.path.islink(planted), "the planted link is left alone, not written through"


def test_the_destination_being_a_link_is_replaced_not_followed(shared_dir):
    d, victim = shared_dir
    target = d / "provision.prom"
    target.symlink_to(victim)
    write_atomic(str(target), METRICS)
    assert _unchanged(victim)
    assert _regular(target, 0o644, METRICS)


def test_a_swap_between_the_write_and_the_rename_never_reaches_the_victim(shared_dir):
    """The other account renames the written temp file away and puts a link to the victim in its
    place, just before the rename: the link lands at the destination, the writer sees the inode is
    not the one it wrote, and writes again; the victim keeps its bytes and its mode."""
    d, victim = shared_dir
    target = d / "provision.prom"
    swaps = []

    def swap(tmp):
        if len(swaps) < 1:
            os.rename(tmp, str(d / f"stolen{len(swaps)}"))
            os.symlink(victim, tmp)
            swaps.append(tmp)

    with failpoints.enabled("atomic_before_rename", swap):
        write_atomic(str(target), METRICS)
    assert swaps, "the failpoint ran"
    assert _unchanged(victim)
    assert _regular(target, 0o644, METRICS)


def test_a_writer_swapped_every_time_gives_up_with_a_sentence(shared_dir):
    d, victim = shared_dir
    target = d / "provision.prom"

    def swap(tmp):
        os.unlink(tmp)
        os.symlink(victim, tmp)

    with failpoints.enabled("atomic_before_rename", swap), pytest.raises(OSError, match="replaced by another process"):
        atomic.write_text(str(target), METRICS, 0o644)
    assert _unchanged(victim)
    assert not [p for p in os.listdir(d) if p.endswith(".tmp")], "no temp file of ours is left behind"


def test_the_mode_is_set_on_the_descriptor_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        atomic.write_text(str(tmp_path / "m.prom"), "x\n", 0o644)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m.prom").stat().st_mode) == 0o644
