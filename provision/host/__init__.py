"""The host side: stdlib-only Python 3.10, sent to each host as one bundle and run there as root.

Every call starts a fresh interpreter on the host, so what a module imports is paid on every
call (a no-op timer run is mostly interpreter start and imports). Hence: ``typing`` is never
imported at run time (``TYPE_CHECKING = False`` then ``if TYPE_CHECKING:`` for the names only
mypy needs: mypy reads that guard as it reads typing's; ``typing`` costs ~3-5 ms per call), and
heavy modules (discovery, the engine's parser, subprocess) are imported by the op that needs
them, not by the ones every call passes through (agent, ops/patch_fast.py, ops/fastpath.py).
"""
