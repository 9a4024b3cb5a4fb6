"""vLLM container images laid out as the official one (``vllm/vllm-openai``), with no registry.

The official image installs vLLM with pip into the system interpreter's ``dist-packages``
(``/usr/local/lib/python3.X/dist-packages/vllm`` beside ``vllm-VERSION.dist-info``) and runs
``python3 -m vllm.entrypoints.openai.api_server`` (``vllm serve``). These images are the same
layout, built here:

* **base** the SGLang images' base (``sglang_image.base_tag()``: Debian 12 minbase, python3, procps);
* **vLLM** ``localhost/provision-vllm:<version>-<hash>`` (alias ``localhost/provision-vllm:v<version>``):
  the base plus the real vLLM release's ``.py`` files (``vllm_sources.py``: the registry's source
  archive, sha256-checked) and its dist-info (METADATA, top_level.txt, as pip leaves them), and the
  sandbox's vLLM stand-in server (``vllm_standin.py``) beside them, which a playbook runs as its
  ``module:`` (no torch here: ``vllm.entrypoints.openai.api_server`` itself cannot import).

Tagged by a hash of what goes in; kept in the shared store the sandbox hosts mount read-only.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

from provision.sandbox import images as _images
from provision.sandbox import sglang_image

REPO = "localhost/provision-vllm"
STANDIN_SOURCE = Path(__file__).with_name("vllm_standin.py")
STANDIN_MODULE = "vllm_standin"   # a playbook's `launch.module`
LAYOUT_VERSION = 1


def alias(version: str) -> str:
    return f"{REPO}:v{version}"


def _recipe(version: str) -> dict:
    from provision.sandbox.vllm_sources import sdist_path

    sdist = sdist_path(version)
    return {"base": sglang_image.base_tag(), "version": version, "sdist": [sdist.name, sdist.stat().st_size],
            "standin": STANDIN_SOURCE.read_text(), "layout": LAYOUT_VERSION}


def image_tag(version: str) -> str:
    return f"{REPO}:{version}-{_images.content_hash(_recipe(version))}"


def populate(root: Path, version: str) -> None:
    """Lay vLLM ``version`` out under ``root`` as pip does in the official image, the stand-in beside it."""
    from provision.sandbox.vllm_sources import extracted

    src = extracted(version)
    site = sglang_image._dist_packages(root)
    site.mkdir(parents=True, exist_ok=True)
    for entry in sorted(src.iterdir()):
        if entry.name.startswith("."):
            continue
        dst = site / entry.name
        if entry.is_dir():
            shutil.copytree(entry, dst)
        else:
            shutil.copyfile(entry, dst)
    info = next(site.glob("vllm-*.dist-info"))
    (info / "INSTALLER").write_text("pip\n")
    shutil.copyfile(STANDIN_SOURCE, site / f"{STANDIN_MODULE}.py")


def ensure_vllm_image(version: str = "0.18.0", log: Callable[[str], object] | None = None) -> tuple[str, float]:
    """The vLLM ``version`` image in the shared store, built when absent (the base too).
    Returns (tag, seconds spent building). Also tags ``alias(version)``."""
    store = _images.shared_store()
    tag = image_tag(version)
    if _images.image_exists(tag, store):
        _images.tag_aliases(tag, (alias(version),), store)
        return tag, 0.0
    bad = _images.problems()
    if bad:
        raise _images.ImageUnavailable("cannot build the vLLM image: " + "; ".join(bad))
    _images.init_store(store)
    base, base_seconds = _images.ensure_rootfs_image(sglang_image.base_tag(), sglang_image.BASE_PACKAGES,
                                                     name="python", store=store, log=log)
    _, seconds = _images.ensure_layer_image(
        tag, base, lambda root: populate(root, version), name=f"vllm-{version}",
        changes=("WORKDIR /", 'CMD ["/bin/bash"]', f"LABEL provision.sandbox=vllm-{version}"),
        aliases=(alias(version),), store=store, log=log)
    return tag, base_seconds + seconds
