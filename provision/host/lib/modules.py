"""An engine package's module names and files: the one module resolver.  STDLIB ONLY (a leaf)."""

from __future__ import annotations

import os

PACKAGE = "sglang"
# SGLang model files are at most a few hundred KB. Parsing is ~2 s per MB on a
# slow host, so anything far beyond that is refused instead of parsed.
MAX_SOURCE_BYTES = 4 * 1024 * 1024

TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)
if TYPE_CHECKING:
    from typing import Callable, Optional

    Resolver = Callable[[str], Optional[bytes]]


def module_name(spec_file: str, package: str = PACKAGE) -> str:
    """`srt/models/kimi_k25.py` -> `sglang.srt.models.kimi_k25` (`jit/comm.py` in flashinfer ->
    `flashinfer.jit.comm`)."""
    parts = spec_file[:-3].split("/") if spec_file.endswith(".py") else spec_file.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([package] + parts)


def read_source(path: str) -> bytes | None:
    """A source file's bytes; None when there is none. A path that is there but is not a regular
    file (a FIFO would block the read forever, a device never end), too large or unreadable is an
    OSError whose text says which: the caller says it cannot judge the file, never skips it."""
    import stat

    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    if not stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            return None
        raise OSError(f"{path} is not a regular file")
    if st.st_size > MAX_SOURCE_BYTES:
        raise OSError(f"{path} is larger than {MAX_SOURCE_BYTES} bytes")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        return fh.read(MAX_SOURCE_BYTES + 1)


def make_resolver(package_dir: str, package: str = PACKAGE) -> Resolver:
    """resolve_module for the package at `package_dir` (sglang's: the directory that holds
    srt/; vllm's: model_executor/): `sglang.a.b` -> package_dir/a/b.py or package_dir/a/b/__init__.py."""
    root = os.path.abspath(package_dir)

    def resolve(name: str) -> bytes | None:
        parts = name.split(".")
        if parts[0] != package or not all(p.isidentifier() for p in parts):
            return None
        base = os.path.join(root, *parts[1:])
        for cand in (base + ".py", os.path.join(base, "__init__.py")):
            got = read_source(cand)
            if got is not None:
                return got
        return None

    return resolve
