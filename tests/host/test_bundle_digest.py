"""The bundle's digest kept on the control side: a run that changed nothing reads no source, and
any change to a shipped file (even one that keeps its size and its mtime) names a new bundle."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import pytest

from provision.control.transport import bundle
from provision.control.transport.bundle import HOST_DIR, RACY_NS, bundle_source

OLD = 1_700_000_000_000_000_000  # a time well in the past (ns)
# No test can set a ctime back: here a file is "racily" new for 50 ms (longer than a kernel
# timestamp tick), and the tree is 100 ms old when a test starts.
RACY_TEST_NS = 50_000_000


def source_digest(exclude, tree, cache, racy_ns=RACY_TEST_NS):
    """What a new run (a new process: nothing read yet) takes as the digest."""
    bundle_source.cache_clear()
    return bundle.source_digest(exclude, tree, cache, racy_ns)


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of provision/host whose files all look old."""
    copy = tmp_path / "host"
    shutil.copytree(HOST_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for path in copy.rglob("*.py"):
        os.utime(path, ns=(OLD, OLD))
    time.sleep(2 * RACY_TEST_NS / 1e9)
    return copy


def fresh(tree: Path, exclude: frozenset = frozenset()) -> str:
    bundle_source.cache_clear()
    return hashlib.sha256(bundle_source(exclude, tree)).hexdigest()


def test_the_digest_is_the_sha256_of_the_sources_and_is_kept(tree, tmp_path):
    cache = str(tmp_path / "cache")
    first = source_digest(frozenset(), tree, cache)
    assert first == fresh(tree)
    kept = os.listdir(cache)
    assert len(kept) == 1 and (Path(cache) / kept[0]).read_text() == first
    assert source_digest(frozenset(), tree, cache) == first


def test_an_unchanged_tree_is_answered_from_the_cache_without_reading_the_sources(tree, tmp_path):
    cache = tmp_path / "cache"
    source_digest(frozenset(), tree, str(cache))
    (entry,) = cache.iterdir()
    planted = "0" * 64           # what only the cache could answer
    entry.write_text(planted)
    assert source_digest(frozenset(), tree, str(cache)) == planted
    assert bundle_source.cache_info().currsize == 0   # no source was read


def test_an_edited_file_of_the_same_size_and_mtime_names_a_new_bundle(tree, tmp_path):
    cache = str(tmp_path / "cache")
    before = source_digest(frozenset(), tree, cache)
    agent = tree / "agent.py"
    text = agent.read_text()
    agent.write_text(text[:-1] + "#")   # the last newline becomes a comment sign: same size
    os.utime(agent, ns=(OLD, OLD))   # a coarse clock: the same size and mtime as before
    after = source_digest(frozenset(), tree, cache)
    assert after != before
    assert after == fresh(tree)


def test_an_added_or_removed_module_names_a_new_bundle(tree, tmp_path):
    cache = str(tmp_path / "cache")
    before = source_digest(frozenset(), tree, cache)
    extra = tree / "lib" / "extra.py"
    extra.write_text("X = 1\n")
    os.utime(extra, ns=(OLD, OLD))
    added = source_digest(frozenset(), tree, cache)
    assert added != before and added == fresh(tree)
    extra.unlink()
    assert source_digest(frozenset(), tree, cache) == before == fresh(tree)


def test_each_exclusion_has_its_own_digest(tree, tmp_path):
    cache = str(tmp_path / "cache")
    light = frozenset({"ops.server"})
    assert source_digest(frozenset(), tree, cache) == fresh(tree)
    assert source_digest(light, tree, cache) == fresh(tree, light) != fresh(tree)


def test_a_file_written_just_now_is_hashed_but_not_kept(tree, tmp_path):
    cache = tmp_path / "cache"
    (tree / "agent.py").write_text((tree / "agent.py").read_text() + "\n")   # mtime: now
    assert source_digest(frozenset(), tree, str(cache), RACY_NS) == fresh(tree)
    assert not cache.exists() or not list(cache.iterdir())


def test_a_corrupt_entry_is_ignored(tree, tmp_path):
    cache = tmp_path / "cache"
    good = source_digest(frozenset(), tree, str(cache))
    (entry,) = cache.iterdir()
    entry.write_text("not a digest")
    assert source_digest(frozenset(), tree, str(cache)) == good
    assert entry.read_text() == good


def test_the_shipped_digest_is_the_sha256_of_the_shipped_sources(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    bundle.bundle_digest.cache_clear()
    bundle_source.cache_clear()
    try:
        assert bundle.bundle_digest() == hashlib.sha256(bundle_source()).hexdigest()
    finally:
        bundle.bundle_digest.cache_clear()


def test_an_entry_others_can_write_is_not_believed(tree, tmp_path):
    cache = tmp_path / "cache"
    good = source_digest(frozenset(), tree, str(cache))
    (entry,) = cache.iterdir()
    entry.write_text("0" * 64)
    entry.chmod(0o666)
    assert source_digest(frozenset(), tree, str(cache)) == good
    target = tmp_path / "elsewhere"
    target.write_text("1" * 64)
    entry.unlink()
    entry.symlink_to(target)
    assert source_digest(frozenset(), tree, str(cache)) == good


def test_only_the_newest_digests_are_kept(tree, tmp_path, monkeypatch):
    monkeypatch.setattr(bundle, "KEEP_DIGESTS", 2)
    cache = tmp_path / "cache"
    agent = tree / "agent.py"
    for n in range(4):    # four versions of the tree, each kept in turn
        agent.write_text(agent.read_text() + f"# {n}\n")
        os.utime(agent, ns=(OLD + n, OLD + n))
        time.sleep(2 * RACY_TEST_NS / 1e9)
        last = source_digest(frozenset(), tree, str(cache))
    assert len(list(cache.iterdir())) == 2
    assert last in {e.read_text() for e in cache.iterdir()}
