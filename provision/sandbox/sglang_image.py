"""SGLang container images laid out as the official ones (``lmsysorg/sglang``), with no registry.

The official images hold a git checkout at ``/sgl-workspace/sglang``, installed editable
(``pip install -e "python[...]"``): the package is ``/sgl-workspace/sglang/python/sglang``,
and the interpreter's ``dist-packages`` holds ``sglang-VERSION.dist-info`` (``direct_url.json``
says editable, pointing at ``/sgl-workspace/sglang/python``) and a ``.pth`` line naming that
directory. Users start the server as ``python3 -m sglang.launch_server ...`` in it.

These images are the same thing, built here:

* **base** ``localhost/provision-sandbox-python:<hash>``: Debian 12 minbase with python3 and
  procps (``images.ensure_rootfs_image``: debootstrap + ``podman import``, once per machine);
* **SGLang** ``localhost/provision-sglang:<version>-<hash>`` (and the alias
  ``localhost/provision-sglang:v<version>``): the base plus a real SGLang release from the
  wheel cache in the official layout above, SGLang's third-party imports stubbed (the
  sandbox hosts' deps stub, hosts.py), and the sandbox's stand-in server (``standin.py`` and
  every ``standin_*.py`` module beside it) as its ``sglang.launch_server`` (the shim hosts.py
  installs on hosts). Tagged by a hash of all
  of that, so editing the stand-in rebuilds only this layer (seconds).

Both live in their own podman store (``images.shared_store()``), which sandbox hosts mount
read-only as their additional image store: ``podman run IMAGE`` on a host finds it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

from provision.sandbox import hosts as _hosts
from provision.sandbox import images as _images
from provision.sandbox.wheels import dist_info, extracted, wheel_path

BASE_REPO = "localhost/provision-sandbox-python"
BASE_PACKAGES = ("python3", "procps")
REPO = "localhost/provision-sglang"
WORKSPACE = "/sgl-workspace/sglang"           # the official images' checkout
PYTHON_DIR = f"{WORKSPACE}/python"            # what `pip install -e` installed
SGLANG_DIR = f"{PYTHON_DIR}/sglang"
IMAGE_PYTHON = "/usr/bin/python3"
LAYOUT_VERSION = 1                            # bump when populate() lays files out differently


def base_tag() -> str:
    return _images.rootfs_tag(BASE_REPO, BASE_PACKAGES, "")


def alias(version: str) -> str:
    """The stable name of the image for ``version`` (like ``lmsysorg/sglang:v0.5.9-cu129``)."""
    return f"{REPO}:v{version}"


def _recipe(version: str) -> dict:
    wheel = wheel_path(version)
    return {"base": base_tag(), "version": version, "wheel": [wheel.name, wheel.stat().st_size],
            "standin": _hosts.STANDIN_SOURCE.read_text(),
            "standin_modules": {m.name: m.read_text() for m in _hosts.STANDIN_MODULES},
            "serverargs": _hosts.SERVERARGS_SOURCE.read_text(), "shim": _hosts.LAUNCH_SERVER_SHIM,
            "deps": _hosts.DEPS_STUB_PY, "pyproject": _hosts.SOURCE_PYPROJECT, "layout": LAYOUT_VERSION}


def image_tag(version: str) -> str:
    return f"{REPO}:{version}-{_images.content_hash(_recipe(version))}"


def _dist_packages(root: Path) -> Path:
    """``/usr/local/lib/python3.X/dist-packages`` of the image's python (where pip -e writes as root)."""
    libs = sorted(p.name for p in (root / "usr/lib").glob("python3.*") if (p / "os.py").is_file())
    if not libs:
        raise _images.ImageUnavailable(f"no python3 standard library under {root}/usr/lib")
    return root / "usr/local/lib" / libs[-1] / "dist-packages"


def populate(root: Path, version: str) -> None:
    """Lay SGLang ``version`` out under ``root`` as the official images do (see the module doc)."""
    src = extracted(version)
    python_dir = root / PYTHON_DIR.lstrip("/")
    python_dir.mkdir(parents=True)
    for entry in sorted(src.iterdir()):
        if entry.name.startswith(".") or entry.name.endswith(".dist-info"):
            continue
        subprocess.run(["cp", "-a", "--", str(entry), str(python_dir / entry.name)], check=True)
    (python_dir / "pyproject.toml").write_text(_hosts.SOURCE_PYPROJECT)
    site = _dist_packages(root)
    site.mkdir(parents=True, exist_ok=True)
    # What `pip install -e` leaves: the dist-info (METADATA from the release, editable direct_url)
    # and a .pth line naming the project directory.
    info = site / f"sglang-{version}.dist-info"
    info.mkdir()
    shutil.copyfile(dist_info(version) / "METADATA", info / "METADATA")
    (info / "INSTALLER").write_text("pip\n")
    (info / "direct_url.json").write_text(json.dumps({"dir_info": {"editable": True},
                                                      "url": f"file://{PYTHON_DIR}"}) + "\n")
    (info / "top_level.txt").write_text("sglang\n")
    pth = site / f"__editable__.sglang-{version}.pth"
    pth.write_text(PYTHON_DIR + "\n")
    rel = os.path.relpath
    (info / "RECORD").write_text("".join(f"{rel(p, site)},,\n" for p in (
        info / "METADATA", info / "INSTALLER", info / "direct_url.json", info / "top_level.txt", pth))
        + f"{rel(info, site)}/RECORD,,\n")
    # SGLang's third-party imports (torch, numpy, ...) are not in the image: the hosts' stub finder.
    (site / f"{_hosts.DEPS_MODULE}.py").write_text(_hosts.DEPS_STUB_PY)
    (site / f"{_hosts.DEPS_MODULE}.pth").write_text(f"import {_hosts.DEPS_MODULE}\n")
    # The stand-in server as sglang.launch_server (no GPU here).
    standin = root / _hosts.STANDIN_DIR.lstrip("/") / _hosts.STANDIN_MODULE
    standin.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_hosts.STANDIN_SOURCE, standin)
    for module in _hosts.STANDIN_MODULES:  # its modules, imported from beside it (/generate among them)
        shutil.copyfile(module, standin.with_name(module.name))
    shutil.copyfile(_hosts.SERVERARGS_SOURCE, standin.with_name(_hosts.SERVERARGS_MODULE))
    (root / SGLANG_DIR.lstrip("/") / "launch_server.py").write_text(_hosts.LAUNCH_SERVER_SHIM)


def ensure_sglang_image(version: str = "0.5.9", log: Callable[[str], object] | None = None) -> tuple[str, float]:
    """The SGLang ``version`` image in the shared store, built when absent (the base too).
    Returns (tag, seconds spent building). Also tags ``alias(version)``."""
    bad = _images.problems()
    store = _images.shared_store()
    tag = image_tag(version)
    if _images.image_exists(tag, store):
        _images.tag_aliases(tag, (alias(version),), store)
        return tag, 0.0
    if bad:
        raise _images.ImageUnavailable("cannot build the SGLang image: " + "; ".join(bad))
    _images.init_store(store)
    base, base_seconds = _images.ensure_rootfs_image(base_tag(), BASE_PACKAGES, name="python", store=store, log=log)
    _, seconds = _images.ensure_layer_image(
        tag, base, lambda root: populate(root, version), name=f"sglang-{version}",
        changes=("WORKDIR /sgl-workspace", 'CMD ["/bin/bash"]', f"LABEL provision.sandbox=sglang-{version}"),
        aliases=(alias(version),), store=store, log=log)
    return tag, base_seconds + seconds


def podman_in_store(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    """podman on this machine against the shared store (for tests and the benchmark)."""
    return _images.podman(*args, check=check, timeout=timeout, store=_images.shared_store())


BAKED_REPO = "localhost/provision-sglang-baked"
# the sandbox hosts' /data/models laid out at /models: a user's image with its weights in it
BAKED_MODEL = "/" + str(Path(_hosts.SANDBOX_MODEL).relative_to("/data"))
BAKED_DRAFTER = "/" + str(Path(_hosts.SANDBOX_DRAFTER).relative_to("/data"))


def ensure_baked_image(version: str = "0.5.9", log: Callable[[str], object] | None = None) -> str:
    """The SGLang ``version`` image with the sandbox's checkpoint and drafter baked in at
    ``BAKED_MODEL`` and ``BAKED_DRAFTER``: model folders no volume holds."""
    base, _ = ensure_sglang_image(version, log)
    tag = f"{BAKED_REPO}:{version}-{_images.content_hash({'base': base, 'model': BAKED_MODEL, 'layout': 1})}"
    _images.ensure_layer_image(
        tag, base, _hosts._fake_weights, name=f"sglang-baked-{version}",
        changes=("WORKDIR /sgl-workspace", 'CMD ["/bin/bash"]', f"LABEL provision.sandbox=sglang-baked-{version}"),
        store=_images.shared_store(), log=log)
    return tag
