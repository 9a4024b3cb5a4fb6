"""Build the payload shipped to a host: the stdlib-only modules of provision.host, read as files.

Control side only. The bundle is built once per process and reused for every host.
Modules are keyed by their real dotted names (``provision.host.ops.patch``); a package's
``__init__`` travels only when it has code (the bootstrap makes every package on the way).

A host is asked for the bundle by its digest, the sha256 of its sources. Reading and hashing
~100 files costs every run ~10 ms, so the digest is kept in
``$XDG_CACHE_HOME/provision/bundle-digest/KEY`` (default ``~/.cache/...``), KEY being the sha256
of every shipped file's (name, path, size, mtime_ns, ctime_ns, inode) and this module's own:
any edit, added or removed module is a new key and the sources are read and hashed again.
A digest is kept only when no file changed in the last seconds (git's "racily clean" rule: a
file written within one timestamp tick of the cache could change without its times changing),
and only the newest KEEP_DIGESTS are kept.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import time
import zlib
from pathlib import Path

from provision.host.bootstrap import bootstrap_code, cached_bootstrap_code, frame

HOST_DIR = Path(__file__).resolve().parents[2] / "host"
# Host modules that never run on a host: the protocol's types are imported there only under
# TYPE_CHECKING (mypy reads them; the control side's tasks import them), so they stay here.
CONTROL_ONLY = frozenset({"protocol"})
# Switches the host-side failpoints on (provision/host/lib/failpoints.py): forwarded in every request.
FAILPOINTS_ENV = "PROVISION_FAILPOINTS"


def host_modules(host_dir: Path = HOST_DIR) -> dict[str, Path]:
    """{name relative to provision.host (``ops.patch``, ``agent``): file} of every shipped module."""
    out = {}
    for path in sorted(host_dir.rglob("*.py")):
        rel = path.relative_to(host_dir).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


@functools.lru_cache(maxsize=None)
def bundle_source(exclude: frozenset = frozenset(), host_dir: Path = HOST_DIR) -> bytes:
    """The host modules, less ``exclude`` (names relative to provision.host, e.g. ``ops.server``),
    as JSON ``{module name: source}``: a caller that never needs some ships less."""
    modules = {}
    for rel, path in host_modules(host_dir).items():
        if rel in exclude or rel in CONTROL_ONLY:
            continue
        text = path.read_text(encoding="utf-8")
        if path.name == "__init__.py" and not text.strip():
            continue
        modules["provision.host" + ("." + rel if rel else "")] = text
    return json.dumps(modules).encode()


@functools.lru_cache(maxsize=None)
def bundle_bytes(exclude: frozenset = frozenset()) -> bytes:
    """What travels: ``bundle_source`` compressed (only needed when a host lacks it)."""
    return zlib.compress(bundle_source(exclude), 9)


@functools.lru_cache(maxsize=None)
def bundle_digest(exclude: frozenset = frozenset()) -> str:
    """The name the host keeps this bundle under (<state dir>/bundles/SHA256): the sha256 of its
    sources, so no compression is needed to ask whether a host has it."""
    return source_digest(exclude, HOST_DIR, digest_cache_dir())


_DIGEST = re.compile(r"[0-9a-f]{64}")
# a file changed less than this long ago may change again within the same timestamp tick
RACY_NS = 2_000_000_000
KEEP_DIGESTS = 32


def digest_cache_dir() -> str:
    from provision.config.cachedir import cache_dir

    return cache_dir("bundle-digest")


def source_digest(exclude: frozenset, host_dir: Path, cache: str, racy_ns: int = RACY_NS) -> str:
    """sha256 of ``bundle_source(exclude, host_dir)``, from ``cache`` when no shipped file (nor
    this module) changed since it was kept; else read, hashed, and kept unless a file changed
    less than ``racy_ns`` ago."""
    files = [*host_modules(host_dir).items(), ("", Path(__file__))]
    h = hashlib.sha256(json.dumps(sorted(exclude)).encode())
    newest = 0
    for rel, path in files:
        st = os.stat(path)
        h.update(f"{rel}\0{path}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}\n".encode())
        newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
    kept = os.path.join(cache, h.hexdigest())
    digest = _read_kept(kept)
    if digest:
        return digest
    digest = hashlib.sha256(bundle_source(exclude, host_dir)).hexdigest()
    if time.time_ns() - newest > racy_ns:
        _keep(kept, digest)
    return digest


def _read_kept(path: str) -> str | None:
    """A kept digest, only from a regular file of ours that nobody else can write (not a symlink)."""
    from provision.host.lib.atomic import read_own

    data = read_own(path, 65)
    digest = data.decode("ascii", "replace") if data is not None else ""
    return digest if _DIGEST.fullmatch(digest) else None


def _keep(path: str, digest: str) -> None:
    """Write atomically (a reader sees the whole digest or none); a cache that cannot be
    written is simply not used."""
    from provision.host.lib import atomic  # the one atomic writer (stdlib, both sides)

    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        atomic.write_text(path, digest, 0o600, durable=False)
    except OSError:
        return
    _prune(os.path.dirname(path))


def _prune(cache: str) -> None:
    """Keep the newest KEEP_DIGESTS entries (a new one is written only when a source changed)."""
    try:
        entries = [e for e in os.scandir(cache) if _DIGEST.fullmatch(e.name)]
        entries.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns, reverse=True)
        for e in entries[KEEP_DIGESTS:]:
            os.unlink(e.path)
    except OSError:
        pass


def with_failpoints(request: dict) -> dict:
    """The request with the control machine's PROVISION_FAILPOINTS forwarded (when set, and only
    in test mode: config/testmode.py)."""
    from provision.config.testmode import switch

    points = switch(FAILPOINTS_ENV)
    return dict(request, failpoints=points) if points else request


def payload(request: dict, exclude: frozenset = frozenset()) -> bytes:
    return frame(bundle_bytes(exclude), json.dumps(with_failpoints(request)).encode())


def payloads(request: dict, exclude: frozenset = frozenset()):
    """stdin for the caching bootstrap, in two parts: what is written at once (a header line,
    then the request), and what follows once its ready line says ``hit`` (nothing) or ``miss``
    (the bundle's length on a line, then the bundle). The bundle is compressed only when asked for."""
    body = json.dumps(with_failpoints(request)).encode()

    def rest(said: str) -> bytes:
        if said == "hit":
            return b""
        bundle = bundle_bytes(exclude)
        return str(len(bundle)).encode() + b"\n" + bundle

    return json.dumps({"q": len(body)}).encode() + b"\n" + body, rest


# The host entry module that answers the protocol's ops (host/protocol.py OPS).
AGENT = "provision.host.agent"


def bootstrap_command(python: str = "python3", *, ready: str | None = None, entry: str = AGENT,
                      digest: str | None = None, state_dir: str | None = None, isolated: bool = False) -> str:
    """The host-side command line: ``python -S -c BOOTSTRAP``, quoted for a shell.

    ``ready``: the interpreter first prints this line on stdout, before reading stdin, so the
    caller knows sudo is done and the request may follow. ``digest`` (with ``ready``): the
    caching bootstrap, which keeps the bundle in ``<state_dir>/bundles/`` (the host's default
    state dir when None) and ends its ready line with `` hit`` or `` miss``. ``isolated``: ``-I`` too
    (the container transport: an image's PYTHONPATH and WORKDIR are not ours).
    Nothing secret ever goes in here: the line is visible in the host's process list.
    """
    import shlex

    if ready is not None and ("\n" in ready or "'" in ready or "\\" in ready):
        raise ValueError("ready token must be one plain line")
    if digest is not None:
        if ready is None:
            raise ValueError("the caching bootstrap needs a ready line")
        code = cached_bootstrap_code(digest, ready, state_dir, entry)
    else:
        code = bootstrap_code(entry)
        if ready is not None:
            code = f"import sys as _s;_s.stdout.write('{ready}\\n');_s.stdout.flush()\n" + code
    # -S: the agent is stdlib-only, so skip site (and any .pth files) for a faster start.
    # isolated (-I): no PYTHON* variable, no cwd on sys.path (a container image's ENV and WORKDIR).
    return f"{shlex.quote(python)} {'-I -S' if isolated else '-S'} -c {shlex.quote(code)}"
