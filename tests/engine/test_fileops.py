"""The safe write transaction, over real files in tmp dirs (no ssh)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from provision.host.engine import core as engine
from provision.host.lib import failpoints
from provision.host.ops import fileops
from tests.engine.conftest import KIMI_SPEC, METHODS, method_names

REPO = Path(__file__).resolve().parents[2]


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture
def site(tmp_path, src_059):
    """A fake install: <tmp>/site/sglang/srt/models/kimi_k25.py (+ bytecode), and a state dir."""
    models = tmp_path / "site" / "sglang" / "srt" / "models"
    models.mkdir(parents=True)
    for d in (models, models.parent, models.parent.parent):
        (d / "__init__.py").write_text("")
    f = models / "kimi_k25.py"
    f.write_bytes(src_059)
    pyc = models / "__pycache__"
    pyc.mkdir()
    (pyc / "kimi_k25.cpython-311.pyc").write_bytes(b"stale")
    (pyc / "other.cpython-311.pyc").write_bytes(b"keep")
    return types_ns(path=f, models=models, state=tmp_path / "state", original=src_059, tmp=tmp_path)


class types_ns:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def patch(site, **kw):
    kw.setdefault("sglang_version", "0.5.9")
    return fileops.patch_file(str(site.path), KIMI_SPEC, state_dir=str(site.state), **kw)


def listing(d: Path) -> set:
    return {p.name for p in d.iterdir()}


def assert_clean(site):
    """No temp files, no stray .py, no backups next to the model file."""
    names = listing(site.models)
    assert names <= {"kimi_k25.py", "__init__.py", "__pycache__", "twin.py", "other.py", "basemod.py"}, names
    assert not [n for n in names if "provision" in n or n.endswith((".tmp", ".bak", ".orig"))]


def assert_result_shape(r: dict):
    json.dumps(r)
    for key in ("verdict", "file", "real_file", "added", "native", "kept", "repaired", "notes", "diff",
                "sha_before", "sha_after", "backup", "error"):
        assert key in r, key


# ----------------------------------------------------------------------- happy paths

def test_patch_writes_backup_state_and_nothing_else(site):
    r = patch(site)
    assert_result_shape(r)
    assert r["verdict"] == "patched" and r["added"] == METHODS and r["error"] is None
    new = site.path.read_bytes()
    assert new == engine.plan_patch(site.original, KIMI_SPEC)["new"]
    assert method_names(new)[-3:] == METHODS
    assert r["sha_before"] == sha(site.original) and r["sha_after"] == sha(new)
    assert r["real_file"] == str(site.path)
    # backup lives in the state dir, never next to the file
    bak = Path(r["backup"])
    assert bak.parent == site.state / "backups" and bak.read_bytes() == site.original
    assert not bak.name.endswith(".py")
    side = json.loads(bak.with_suffix(".json").read_text())
    assert side["path"] == str(site.path) and side["sha256"] == sha(site.original)
    assert side["sglang_version"] == "0.5.9" and side["spec"] == "kimi-k25-eagle3" and side["time"]
    assert side["original"] is True
    # state
    state = fileops.read_state(str(site.state))
    entry = state[str(site.path)]
    assert entry["sglang_version"] == "0.5.9" and entry["sha256_after"] == sha(new)
    assert entry["spec"] == "kimi-k25-eagle3" and len(entry["block_sha"]) == 12 and entry["time"]
    # stale bytecode dropped, other bytecode kept
    assert listing(site.models / "__pycache__") == {"other.cpython-311.pyc"}
    assert any("stale bytecode" in n for n in r["notes"])
    assert_clean(site)


def test_second_run_is_unchanged_and_writes_nothing(site):
    patch(site)
    st = site.path.stat()
    backups = fileops.list_backups(str(site.state))
    state = (site.state / "state.json").read_bytes()
    time.sleep(0.01)
    r = patch(site)
    assert r["verdict"] == "unchanged" and r["kept"] == METHODS and r["backup"] is None
    st2 = site.path.stat()
    assert (st2.st_ino, st2.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    assert fileops.list_backups(str(site.state)) == backups
    assert (site.state / "state.json").read_bytes() == state


def test_check_mode_writes_nothing_at_all(site):
    r = patch(site, check=True, want_diff=True)
    assert r["verdict"] == "patched" and r["check"] is True
    assert site.path.read_bytes() == site.original
    assert not site.state.exists()  # not even the lock file or a backup
    assert r["backup"] is None and r["sha_after"] == r["sha_before"]
    assert "+    def set_eagle3_layers_to_capture(self, layer_ids=None):" in r["diff"]
    assert (site.models / "__pycache__" / "kimi_k25.cpython-311.pyc").exists()


def test_native_0510_is_left_alone(site, src_0510):
    site.path.write_bytes(src_0510)
    r = patch(site, sglang_version="0.5.10", want_diff=True)
    assert r["verdict"] == "native" and r["native"] == METHODS and r["diff"] == ""
    assert site.path.read_bytes() == src_0510
    assert fileops.list_backups(str(site.state)) == []
    assert fileops.read_state(str(site.state)) == {}


def test_unpatch_restores_original_bytes(site):
    patch(site)
    patched = site.path.read_bytes()
    r = fileops.unpatch_file(str(site.path), KIMI_SPEC, state_dir=str(site.state), want_diff=True)
    assert_result_shape(r)
    assert r["verdict"] == "unpatched" and r["removed"] == METHODS
    assert site.path.read_bytes() == site.original
    assert Path(r["backup"]).read_bytes() == patched
    assert "-    def get_embed_and_head(self):" in r["diff"]
    again = fileops.unpatch_file(str(site.path), KIMI_SPEC, state_dir=str(site.state))
    assert again["verdict"] == "absent" and again["backup"] is None
    assert fileops.read_state(str(site.state))[str(site.path)]["op"] == "unpatch"
    assert_clean(site)


def test_unpatch_check_mode(site):
    patch(site)
    patched = site.path.read_bytes()
    r = fileops.unpatch_file(str(site.path), KIMI_SPEC, state_dir=str(site.state), check=True)
    assert r["verdict"] == "unpatched" and site.path.read_bytes() == patched


def test_mode_and_owner_are_kept(site):
    os.chmod(site.path, 0o640)
    if os.geteuid() == 0:
        os.chown(site.path, 1234, 5678)
    before = site.path.stat()
    r = patch(site)
    after = site.path.stat()
    assert r["verdict"] == "patched"
    assert after.st_ino != before.st_ino  # replaced, not written in place
    assert (after.st_mode, after.st_uid, after.st_gid) == (before.st_mode, before.st_uid, before.st_gid)
    fileops.unpatch_file(str(site.path), KIMI_SPEC, state_dir=str(site.state))
    again = site.path.stat()
    assert (again.st_mode, again.st_uid, again.st_gid) == (before.st_mode, before.st_uid, before.st_gid)


def test_symlink_target_is_patched_and_link_kept(site):
    real_dir = site.tmp / "real"
    real_dir.mkdir()
    target = real_dir / "kimi_k25.py"
    shutil.move(site.path, target)
    site.path.symlink_to(target)
    r = patch(site)
    assert r["verdict"] == "patched" and r["real_file"] == str(target)
    assert any(n == f"symlink: patched target {target}" for n in r["notes"])
    assert site.path.is_symlink() and os.readlink(site.path) == str(target)
    assert method_names(target.read_bytes())[-3:] == METHODS
    assert str(target) in fileops.read_state(str(site.state))
    assert not [n for n in listing(real_dir) if n != "kimi_k25.py"]
    u = fileops.unpatch_file(str(site.path), KIMI_SPEC, state_dir=str(site.state))
    assert u["verdict"] == "unpatched" and target.read_bytes() == site.original and site.path.is_symlink()


def test_hard_link_twin_keeps_the_old_bytes(site):
    twin = site.models / "twin.py"
    os.link(site.path, twin)
    r = patch(site)
    assert r["verdict"] == "patched"
    assert twin.read_bytes() == site.original
    assert site.path.read_bytes() != site.original
    assert site.path.stat().st_ino != twin.stat().st_ino
    assert any("hard links" in n for n in r["notes"])


def test_default_resolver_follows_sibling_modules(site):
    (site.models / "basemod.py").write_text(
        "class Base:\n    def get_embed_and_head(self):\n        return 1\n")
    site.path.write_text(
        "from .basemod import Base\n\n\nclass KimiK25ForConditionalGeneration(Base):\n"
        "    def __init__(self):\n        self.language_model = 1\n")
    r = patch(site)
    assert r["native"] == ["get_embed_and_head"]
    assert r["added"] == ["set_eagle3_layers_to_capture", "set_embed_and_head"]


# ----------------------------------------------------------------------- refusals / failures

def test_planning_failure_writes_nothing(site):
    site.path.write_bytes(site.original.replace(b"class KimiK25ForConditionalGeneration", b"class Renamed"))
    before = site.path.read_bytes()
    r = patch(site)
    assert r["verdict"] == "failed" and r["error"]["kind"] == "class-missing"
    assert site.path.read_bytes() == before and r["backup"] is None
    assert fileops.list_backups(str(site.state)) == []
    assert_clean(site)


def test_missing_file_is_an_io_error(site):
    site.path.unlink()
    r = patch(site)
    assert r["verdict"] == "failed" and r["error"]["kind"] == "io"
    assert str(site.path) in r["error"]["message"] and "No such file" in r["error"]["message"]


def test_changed_underfoot_is_refused(site):
    other = site.original + b"# someone else\n"

    def meddle(real):
        Path(real).write_bytes(other)

    with failpoints.enabled("before_replace", meddle):
        r = patch(site)
    assert r["verdict"] == "failed" and r["error"]["kind"] == "changed-underfoot"
    assert "changed while provision was working on it" in r["error"]["message"]
    assert site.path.read_bytes() == other  # their bytes, not ours
    assert_clean(site)
    assert fileops.read_state(str(site.state)) == {}
    r2 = patch(site)  # the next run works on the new content
    assert r2["verdict"] == "patched" and site.path.read_bytes().endswith(b"# someone else\n")


def test_verify_failure_rolls_back(site, monkeypatch):
    monkeypatch.setattr(fileops, "_verify_patch", lambda spec, resolver: lambda real, new: ["simulated structural problem"])
    st = site.path.stat()
    r = patch(site)
    assert r["verdict"] == "failed" and r["error"]["kind"] == "verify"
    assert "simulated structural problem" in r["error"]["message"] and "put back" in r["error"]["message"]
    assert site.path.read_bytes() == site.original and r["sha_after"] == r["sha_before"]
    assert site.path.stat().st_mode == st.st_mode
    assert fileops.read_state(str(site.state)) == {}
    assert_clean(site)


def test_verify_catches_a_file_that_does_not_compile(site, monkeypatch):
    real_plan = engine.plan_patch

    def broken(old, spec, resolve_module=None):
        r = real_plan(old, spec, resolve_module)
        r["new"] = r["new"] + b"\nreturn 1\n"  # parses, but does not compile
        return r

    monkeypatch.setattr(fileops.engine, "plan_patch", broken)
    r = patch(site)
    assert r["error"]["kind"] == "verify" and "does not compile" in r["error"]["message"]
    assert site.path.read_bytes() == site.original


def test_lock_held_by_another_process_fails_fast(site):
    site.state.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys, time
        fd = os.open({str(site.state / 'lock')!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0); os.write(fd, b"%d\\n" % os.getpid())
        print("held", flush=True)
        time.sleep(30)
    """)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        t = time.monotonic()
        r = patch(site, lock_timeout=0.3)
        assert time.monotonic() - t < 3
        assert r["verdict"] == "failed" and r["error"]["kind"] == "locked"
        assert f"pid {holder.pid}" in r["error"]["message"]
        assert site.path.read_bytes() == site.original
    finally:
        holder.kill()
        holder.wait()
    assert patch(site, lock_timeout=5)["verdict"] == "patched"


def test_lock_is_released_after_each_run(site):
    patch(site)
    import fcntl
    fd = os.open(site.state / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


@pytest.mark.parametrize("err,where", [
    (errno.ENOSPC, "_write_all"),
    (errno.EACCES, "_open_temp"),
    (errno.EROFS, "_open_temp"),
])
def test_simulated_io_errors_leave_no_debris(site, monkeypatch, err, where):
    real = getattr(fileops, where)
    models = str(site.models)

    def failing(*args, **kw):
        if where == "_write_all":
            fd, data = args
            if os.readlink(f"/proc/self/fd/{fd}").startswith(models):
                os.write(fd, data[: len(data) // 2])
                raise OSError(err, os.strerror(err))
            return real(*args, **kw)
        if str(args[0]).startswith(models):
            raise OSError(err, os.strerror(err), args[0])
        return real(*args, **kw)

    monkeypatch.setattr(fileops, where, failing)
    r = patch(site)
    assert r["verdict"] == "failed" and r["error"]["kind"] == "io"
    msg = r["error"]["message"]
    assert os.strerror(err) in msg and str(site.path) in msg and errno.errorcode[err] in msg
    assert site.path.read_bytes() == site.original
    assert_clean(site)


def test_replace_failure_leaves_no_debris(site, monkeypatch):
    real_replace = os.replace

    def failing(src, dst, *a, **k):
        if str(dst) == str(site.path):
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(dst))
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(fileops.os, "replace", failing)
    r = patch(site)
    assert r["error"]["kind"] == "io" and "EBUSY" in r["error"]["message"]
    assert site.path.read_bytes() == site.original
    assert_clean(site)


def test_state_write_failure_after_replace_rolls_back(site, monkeypatch):
    def failing(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(site.state / "state.json"))

    monkeypatch.setattr(fileops, "_record_state", failing)
    r = patch(site)
    assert r["error"]["kind"] == "io" and "previous bytes" in r["error"]["message"]
    assert site.path.read_bytes() == site.original
    assert_clean(site)


# ----------------------------------------------------------------------- real EROFS / ENOSPC (mount namespace)

def _can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    p = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    return p.returncode == 0


needs_mounts = pytest.mark.skipif(not _can_unshare(), reason="needs root and `unshare -m` for real mounts")

RUNNER = """
import json, os, sys
sys.path.insert(0, {repo!r})
from provision.host.ops import fileops
spec = json.loads({spec!r})
r = fileops.patch_file({path!r}, spec, state_dir={state!r}, sglang_version="0.5.9")
r["listing"] = sorted(os.listdir(os.path.dirname({path!r})))
r["bytes_sha"] = __import__("hashlib").sha256(open({path!r}, "rb").read()).hexdigest()
print(json.dumps(r))
"""


def _runner(site) -> str:
    code = RUNNER.format(repo=str(REPO), spec=json.dumps(KIMI_SPEC), path=str(site.path), state=str(site.state))
    f = site.tmp / "runner.py"
    f.write_text(code)
    return f"{sys.executable} {f}"


@needs_mounts
def test_read_only_filesystem(site):
    m = str(site.models)
    script = f"set -e; mount --bind {m} {m}; mount -o bind,remount,ro {m}; exec {_runner(site)}"
    p = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["verdict"] == "failed" and r["error"]["kind"] == "io"
    assert "Read-only file system" in r["error"]["message"] and str(site.path) in r["error"]["message"]
    assert r["bytes_sha"] == sha(site.original)
    assert not [n for n in r["listing"] if "provision" in n]
    assert site.path.read_bytes() == site.original


@needs_mounts
def test_disk_full(site):
    m = str(site.models)
    stash = site.tmp / "stash"
    shutil.copytree(site.models, stash)
    # a small tmpfs over the models dir, holding the original, then filled up
    # (dd is bounded by count= so it can never fill a real disk)
    script = (
        f"set -e; mount -t tmpfs -o size=256k tmpfs {m}; cp -a {stash}/. {m}/; "
        f"dd if=/dev/zero of={m}/.filler bs=1k count=512 2>/dev/null || true; exec {_runner(site)}"
    )
    p = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["verdict"] == "failed" and r["error"]["kind"] == "io", r
    assert "No space left on device" in r["error"]["message"]
    assert r["bytes_sha"] == sha(site.original)
    assert not [n for n in r["listing"] if "provision" in n]
    assert site.path.read_bytes() == site.original  # the tmpfs is gone; the real file never changed


# ----------------------------------------------------------------------- kill points

KILL_RUNNER = """
import json, sys
sys.path.insert(0, {repo!r})
from provision.host.lib import failpoints
from provision.host.ops import fileops
failpoints.configure({point!r})
fileops.patch_file({path!r}, json.loads({spec!r}), state_dir={state!r}, sglang_version="0.5.9")
print("not killed")
"""


@pytest.mark.parametrize("point,expect_new", [
    ("before_read", False), ("after_temp_write", False), ("after_replace", True), ("before_verify", True),
])
def test_kill_points_leave_old_or_new_bytes(site, point, expect_new):
    new = engine.plan_patch(site.original, KIMI_SPEC)["new"]
    code = KILL_RUNNER.format(repo=str(REPO), path=str(site.path), spec=json.dumps(KIMI_SPEC),
                              state=str(site.state), point=point)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == -9, (p.returncode, p.stdout, p.stderr)
    data = site.path.read_bytes()
    assert data == (new if expect_new else site.original)
    names = listing(site.models)
    assert not [n for n in names if n.endswith(".py") and n not in ("kimi_k25.py", "__init__.py")]
    leftovers = [n for n in names if n.endswith(".tmp")]
    if point == "after_temp_write":  # SIGKILL can leave the (non-.py) temp file behind
        assert len(leftovers) == 1 and re.fullmatch(r"\.kimi_k25\.py\.provision-\d+\.tmp", leftovers[0])
        assert (site.models / leftovers[0]).read_bytes() == new
    else:
        assert leftovers == []
    # the next run cleans up after the dead engine and ends in the patched state
    r = patch(site)
    assert r["verdict"] in ("patched", "unchanged")
    assert site.path.read_bytes() == new
    if point == "after_temp_write":
        assert any("stale temp file" in n for n in r["notes"])
    assert_clean(site)


def test_stale_temps_of_live_processes_are_kept(site):
    dead = site.models / ".kimi_k25.py.provision-999999999.tmp"
    live = site.models / ".kimi_k25.py.provision-1.tmp"
    dead.write_text("x")
    live.write_text("x")
    r = patch(site)
    assert not dead.exists() and live.exists()
    assert r["verdict"] == "patched"


def test_invalid_kill_point_is_a_programming_error(site):
    with pytest.raises(ValueError):
        failpoints.configure("sometime")


# ----------------------------------------------------------------------- backups / restore / state

def test_backups_keep_the_original_and_prune_the_rest(site):
    spec = KIMI_SPEC
    patch(site)
    for i in range(14):
        fileops.unpatch_file(str(site.path), spec, state_dir=str(site.state))
        site.path.write_bytes(site.path.read_bytes() + f"# edit {i}\n".encode())
        r = patch(site)
        assert r["verdict"] == "patched"
    backups = fileops.list_backups(str(site.state), str(site.path))
    assert len(backups) == 1 + fileops.KEEP_BACKUPS
    first = backups[0]
    assert first["original"] is True and Path(first["backup"]).read_bytes() == site.original
    assert all(b["original"] is False for b in backups[1:])
    assert len({b["sha256"] for b in backups}) == len(backups)
    assert fileops.list_backups(str(site.state), str(site.tmp / "elsewhere.py")) == []


def test_same_bytes_are_backed_up_once(site):
    r1 = patch(site)
    fileops.unpatch_file(str(site.path), KIMI_SPEC, state_dir=str(site.state))
    r2 = patch(site)
    assert r1["backup"] == r2["backup"]
    shas = [b["sha256"] for b in fileops.list_backups(str(site.state))]
    assert len(shas) == len(set(shas)) == 2  # original + patched


def test_restore_file(site):
    r = patch(site)
    patched = site.path.read_bytes()
    res = fileops.restore_file(str(site.path), r["backup"], state_dir=str(site.state))
    assert res["verdict"] == "restored" and site.path.read_bytes() == site.original
    assert Path(res["backup"]).read_bytes() == patched  # the state we left is kept too
    assert fileops.read_state(str(site.state))[str(site.path)]["restored_from"] == r["backup"]
    again = fileops.restore_file(str(site.path), r["backup"], state_dir=str(site.state))
    assert again["verdict"] == "unchanged"
    assert_clean(site)


def test_restore_refuses_a_damaged_backup(site):
    r = patch(site)
    Path(r["backup"]).write_bytes(b"garbage")
    res = fileops.restore_file(str(site.path), r["backup"], state_dir=str(site.state))
    assert res["verdict"] == "failed" and res["error"]["kind"] == "backup" and "damaged" in res["error"]["message"]
    assert method_names(site.path.read_bytes())[-3:] == METHODS


def test_repair_then_unpatch_points_to_the_hand_patched_backup(site):
    hand = site.original + b"\n    def get_embed_and_head(self):\n        return self.language_model.get_embed_and_head()\n"
    site.path.write_bytes(hand)
    r = patch(site)
    assert r["verdict"] == "repaired" and len(r["repaired"]) == 1
    assert Path(r["backup"]).read_bytes() == hand
    state = fileops.read_state(str(site.state))[str(site.path)]
    assert state["repaired"] is True
    u = fileops.unpatch_file(str(site.path), KIMI_SPEC, state_dir=str(site.state))
    assert u["verdict"] == "unpatched" and site.path.read_bytes() == site.original
    assert f"the hand-patched original is kept in the backup {r['backup']}" in " ".join(u["notes"])


def test_read_state_handles_missing_and_corrupt_files(site):
    assert fileops.read_state(str(site.state)) == {}
    site.state.mkdir()
    (site.state / "state.json").write_text("{not json")
    assert fileops.read_state(str(site.state)) == {}
    patch(site)
    assert str(site.path) in fileops.read_state(str(site.state))
    assert [p.name for p in site.state.iterdir() if p.name.startswith("state.json.corrupt-")]


def test_temp_names_never_end_in_py(site):
    name = fileops.temp_name(str(site.path))
    assert not name.endswith(".py") and os.path.dirname(name) == str(site.models)
    assert os.path.basename(name).startswith(".kimi_k25.py.provision-")


def test_unexpected_bug_after_replace_rolls_back(site, monkeypatch):
    def boom(*a, **k):
        raise KeyError("simulated bug")

    monkeypatch.setattr(fileops, "drop_bytecode", boom)
    r = patch(site)
    assert r["verdict"] == "failed" and r["error"]["kind"] == "internal"
    assert "previous bytes" in r["error"]["message"]
    assert site.path.read_bytes() == site.original
    assert_clean(site)
