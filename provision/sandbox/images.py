"""Container images for the sandbox, built with no registry: debootstrap + ``podman import``.

One builder for every sandbox image (the systemd host's in ``systemd.py``, the SGLang
images in ``sglang_image.py``):

* ``ensure_rootfs_image``: ``debootstrap --variant=minbase --include=PACKAGES bookworm``,
  an optional script run in the tree (chroot), then ``tar | podman import``. The tag is a
  content hash of what goes in, so a machine pays debootstrap once per recipe.
* ``ensure_layer_image``: a cheap layer over such an image (``podman create``, copy files
  into its mounted root, ``podman commit``), again tagged by a content hash of its files:
  changing a file the layer holds costs seconds, not another debootstrap.

podman runs with runc and cgroupfs given on its command line (SSH_NOTES.md: this machine
needs them); no ``containers.conf`` is read or written. ``store`` selects a podman image
store other than the machine's default (``--root``/``--runroot``): the SGLang images live
in their own store, which sandbox hosts mount read-only as an additional image store.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

PODMAN = "/usr/bin/podman"
RUNC = "/usr/sbin/runc"
DEBOOTSTRAP = "/usr/sbin/debootstrap"
SUITE = "bookworm"
MIRROR = os.environ.get("PROVISION_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PODMAN_GLOBAL = ["--runtime", "runc", "--cgroup-manager", "cgroupfs"]


class ImageUnavailable(RuntimeError):
    """podman or debootstrap is missing, or an image cannot be built here (one sentence)."""


@dataclass(frozen=True)
class Store:
    """A podman image store of its own: ``graph`` (images, layers) and ``run`` (its locks' runroot)."""

    graph: Path
    run: Path

    def argv(self) -> list[str]:
        return ["--root", str(self.graph), "--runroot", str(self.run), "--storage-driver", "overlay"]


def shared_store() -> Store:
    """The store of the SGLang images (sglang_image.py): sandbox hosts mount its graph dir
    read-only as their podman's additional image store (hosts.py), so every host can run
    the images without a copy in its own store."""
    return Store(image_cache_dir() / "store", Path("/run/provision-image-store"))


def init_store(store: Store) -> None:
    """Create the store's files once (a read-only additional image store needs its lock files)."""
    if (store.graph / "overlay-images").is_dir() and (store.graph / "overlay-layers").is_dir():
        return
    store.graph.mkdir(parents=True, exist_ok=True)
    podman("images", "-q", store=store)


def podman_argv(*args: str, store: Store | None = None) -> list[str]:
    return [PODMAN, *PODMAN_GLOBAL, *(store.argv() if store else []), *args]


def podman(*args: str, check: bool = True, timeout: float = 120, input: str | None = None,
           capture: bool = True, store: Store | None = None, error=ImageUnavailable) -> subprocess.CompletedProcess:
    proc = subprocess.run(podman_argv(*args, store=store), capture_output=capture, text=True, timeout=timeout,
                          input=input, stdin=subprocess.DEVNULL if input is None else None)
    if check and proc.returncode != 0:
        why = ((proc.stderr or "").strip().splitlines() or ["no output"])[-1]
        raise error(f"podman {' '.join(args[:2])} failed: {why}")
    return proc


def problems(root_reason: str = "podman images are built as root") -> list[str]:
    """What this machine lacks to build and run sandbox images (empty: all good)."""
    out = []
    for tool, fix in ((PODMAN, "apt-get install -y podman"), (RUNC, "apt-get install -y runc"),
                      (DEBOOTSTRAP, "apt-get install -y debootstrap")):
        if not os.access(tool, os.X_OK):
            out.append(f"no {tool} ({fix})")
    if os.geteuid() != 0:
        out.append(f"must run as root ({root_reason})")
    return out


def content_hash(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def image_cache_dir() -> Path:
    import pwd

    home = pwd.getpwuid(os.getuid()).pw_dir  # the machine's cache, whatever HOME a test session sets
    root = os.environ.get("PROVISION_IMAGE_CACHE") or os.path.join(home, ".cache", "provision-images")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def image_exists(tag: str, store: Store | None = None) -> bool:
    return podman("image", "exists", tag, check=False, store=store).returncode == 0


def _build_lock(name: str):
    lock = open(image_cache_dir() / f".build-{name}.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)  # one build of an image per machine at a time
    return lock


def _record(name: str, tag: str, seconds: float) -> None:
    (image_cache_dir() / f"{name}-image.json").write_text(json.dumps(
        {"tag": tag, "build_seconds": round(seconds, 1), "built_at": time.time()}) + "\n")


def rootfs_tag(repo: str, packages: tuple[str, ...], customize: str, version: int = 1) -> str:
    """The tag for a debootstrapped image: a hash of suite, packages, customisation, format."""
    return f"{repo}:" + content_hash({"suite": SUITE, "packages": packages, "customize": customize,
                                       "variant": "minbase", "v": version})


def ensure_rootfs_image(tag: str, packages: tuple[str, ...], customize: str = "", *, name: str,
                        store: Store | None = None, log: Callable[[str], object] | None = None) -> tuple[str, float]:
    """The image ``tag`` (made by ``rootfs_tag``), built when absent. Returns (tag, seconds spent building)."""
    if image_exists(tag, store):
        return tag, 0.0
    bad = problems()
    if bad:
        raise ImageUnavailable(f"cannot build the {name} image: " + "; ".join(bad))
    with _build_lock(name):
        if image_exists(tag, store):
            return tag, 0.0
        t0 = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=f"{name}-image-", dir="/var/tmp"))
        try:
            root = work / "root"
            if log:
                log(f"building {tag}: debootstrap {SUITE} (about a minute, once per machine)")
            proc = subprocess.run([DEBOOTSTRAP, "--variant=minbase", "--include=" + ",".join(packages), SUITE,
                                   str(root), MIRROR], capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
                raise ImageUnavailable(f"debootstrap {SUITE} failed: {tail[0]}")
            if customize:
                subprocess.run(["chroot", str(root), "/bin/sh", "-c", customize], check=True, capture_output=True,
                               text=True, timeout=120)
            tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
            imp = subprocess.run(podman_argv("import", "-", tag, store=store), stdin=tar.stdout,
                                 capture_output=True, text=True, timeout=900)
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait()
            if imp.returncode != 0 or tar.returncode != 0:
                raise ImageUnavailable(f"podman import failed: {(imp.stderr.strip().splitlines() or ['?'])[-1]}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        seconds = time.monotonic() - t0
        _record(name, tag, seconds)
        return tag, seconds


def ensure_layer_image(tag: str, base: str, populate: Callable[[Path], None], *, name: str,
                       changes: tuple[str, ...] = (), aliases: tuple[str, ...] = (), store: Store | None = None,
                       log: Callable[[str], object] | None = None) -> tuple[str, float]:
    """The image ``tag``: ``base`` plus what ``populate(root)`` writes into its root, and the
    ``podman commit --change`` instructions ``changes`` (CMD, WORKDIR, ENV...). ``aliases``
    are tagged onto it too (moved there from an older build). Returns (tag, seconds building)."""
    if image_exists(tag, store):
        tag_aliases(tag, aliases, store)
        return tag, 0.0
    with _build_lock(name):
        if image_exists(tag, store):
            tag_aliases(tag, aliases, store)
            return tag, 0.0
        t0 = time.monotonic()
        if log:
            log(f"building {tag} from {base}")
        work = f"provision-build-{name}-{os.getpid()}"
        podman("rm", "-f", work, check=False, store=store)
        podman("create", "--name", work, base, "/bin/true", store=store)
        try:
            merged = Path(podman("mount", work, store=store).stdout.strip())
            populate(merged)
            podman("unmount", work, store=store)
            argv = ["commit", "-q"]
            for change in changes:
                argv += ["--change", change]
            podman(*argv, work, tag, store=store, timeout=600)
        finally:
            podman("rm", "-f", work, check=False, store=store)
        tag_aliases(tag, aliases, store)
        seconds = time.monotonic() - t0
        _record(name, tag, seconds)
        return tag, seconds


def tag_aliases(tag: str, aliases: tuple[str, ...], store: Store | None) -> None:
    """Point each alias at ``tag`` (moving it from an older build)."""
    for alias in aliases:
        have = podman("image", "inspect", "-f", "{{.Id}}", alias, check=False, store=store).stdout.strip()
        want = podman("image", "inspect", "-f", "{{.Id}}", tag, store=store).stdout.strip()
        if have != want:
            podman("tag", tag, alias, store=store)
