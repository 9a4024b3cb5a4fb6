"""The few lines sent as the remote command's argument.  STDLIB ONLY.

Everything else travels on stdin, written straight to the SSH channel (fast,
and never visible in the host's process list):

    <header json>\\n<zlib(json{module name: source})><request json>

The control side uses ``cached_bootstrap_code``: the command line also names the bundle's
sha256, and stdin is ``{"q": n}\\n<request>`` (written at once, as before), then, once the
host's ready line said ``miss``, ``<length>\\n<bundle>`` (nothing after ``hit``: it has a verified
copy). Either way one command, one stdin: a miss costs the bytes, never a round trip.

The bootstrap installs an import hook serving the bundled modules under their
real names (``provision.host.engine.core`` ...) and calls ``agent.main``. Every
package on the way (``provision``, ``provision.host``, ``provision.host.ops`` ...) gets a
module with ``__path__``, from its ``__init__`` source when the bundle has one, else empty.
"""

def bootstrap_code(entry: str = "provision.host.agent") -> str:
    """The bootstrap for an entry module (one that has ``main(request, bundle)``)."""
    return BOOTSTRAP.replace("provision.host.agent", entry)


# Reads the bundle and the request from stdin, then runs the entry module from the bundle.
READ = "r=sys.stdin.buffer;h=json.loads(r.readline());B=r.read(h[\"b\"]);Q=r.read(h[\"q\"])\n"
RUN = "M=json.loads(B if B[:1]==b\"{\" else zlib.decompress(B))\n"  # a host's own re-run sends its kept copy as is
LOAD = (
    "P={n[:i] for n in M for i in range(len(n)) if n[i]==\".\"}\n"
    "class F:\n"
    " def find_spec(s,n,p=None,t=None):\n"
    "  return u.spec_from_loader(n,s,is_package=n in P) if n in M or n in P else None\n"
    " def create_module(s,sp):return None\n"
    " def exec_module(s,m):exec(compile(M.get(m.__name__,\"\"),\"<provision:\"+m.__name__+\">\",\"exec\"),m.__dict__)\n"
    "sys.meta_path.insert(0,F())\n"
    "import provision.host.agent as a\n"
    "sys.exit(a.main(Q,B))\n"
)
BOOTSTRAP = "import sys,json,zlib,importlib.util as u\n" + READ + RUN + LOAD

# The host's copy of bundles: <state dir>/bundles/<sha256 of the bundle's sources>, kept as those
# sources (JSON, not compressed: a call that finds it pays a sha256, never a decompression). The
# directory is the user's own (root's: /var/lib/provision/bundles) and 0700, or it is not used. A
# copy is used only when its bytes hash to the name the control side sent; they are read once
# into memory and run from there (no file is read twice). The command line holds only this first
# stage; the rest (keeping a copy, the compiled modules, the import hook) is ``run`` below, taken
# from the verified bundle.
BUNDLES_DIR = "bundles"
KEEP = 12
CACHED = (
    "import sys,os,json,zlib,hashlib\n"
    "H=%(digest)s;D=os.path.join(%(state_dir)s or(\"/var/lib/provision\"if os.geteuid()==0 else os.path.join("
    "os.environ.get(\"XDG_STATE_HOME\")or os.path.expanduser(\"~/.local/state\"),\"provision\")),%(bundles)s)\n"
    "J=None\n"
    "try:\n"
    " t=os.lstat(D)\n"
    " if t.st_uid==os.geteuid()and t.st_mode&0o170077==0o40000:\n"
    "  J=open(os.path.join(D,H),\"rb\").read();J=J if hashlib.sha256(J).hexdigest()==H else None\n"
    "except OSError:J=None\n"
    "sys.stdout.write(%(ready)s+(\" hit\\n\"if J else\" miss\\n\"));sys.stdout.flush()\n"
    "r=sys.stdin.buffer;Q=r.read(json.loads(r.readline())[\"q\"]);K=not J\n"
    "if K:J=zlib.decompress(r.read(int(r.readline())))\n"
    "M=json.loads(J);G={\"__name__\":\"provision.host.bootstrap\"}\n"
    "exec(compile(M[\"provision.host.bootstrap\"],\"<provision:provision.host.bootstrap>\",\"exec\"),G)\n"
    "sys.exit(G[\"run\"](M,J,Q,D,H,K and hashlib.sha256(J).hexdigest()==H,%(entry)s))\n"
)


def _private_dir(d: str) -> bool:
    """The user's own directory, open to nobody else (not a symlink)."""
    import os

    try:
        st = os.lstat(d)
    except OSError:
        return False
    return st.st_uid == os.geteuid() and st.st_mode & 0o170077 == 0o040000


def _write(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (a same-directory temp file, renamed over it), 0600."""
    import os

    d, base = os.path.split(path)
    tmp = os.path.join(d, f".{base}.{os.getpid()}")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)  # a full disk leaves no half-written temp file behind
        except OSError:
            pass
        raise


def _keep(d: str, digest: str, bundle: bytes) -> None:
    """Store a verified bundle as d/digest and keep only the newest KEEP bundles (with their
    compiled modules)."""
    import os

    # The state dir first: the user's alone, as every op makes it (makedirs' mode covers only the leaf,
    # and this may be the first call that ever runs on the host).
    os.makedirs(os.path.dirname(d), 0o700, exist_ok=True)
    os.makedirs(d, 0o700, exist_ok=True)
    if not _private_dir(d):
        return
    _write(os.path.join(d, digest), bundle)
    newest = sorted((e for e in os.scandir(d) if len(e.name) == 64), key=lambda e: -e.stat().st_mtime)[:KEEP]
    keep = {e.name for e in newest}
    for e in os.scandir(d):
        if e.name.lstrip(".")[:64] not in keep:
            os.unlink(e.path)


def run(modules: dict, bundle: bytes, request: bytes, d: str, digest: str, keep: bool, entry: str) -> int:
    """The caching bootstrap's second stage, run from the verified bundle: keep a copy (``keep``:
    a miss whose bytes hashed right), load the modules compiled by earlier calls
    (d/<digest>.<cache tag>: marshal data, its own sha256 in front; a torn file is ignored),
    install the import hook, run the entry module, then add what this call compiled anew."""
    import hashlib
    import importlib
    import importlib.util as u
    import marshal
    import os
    import sys

    if keep:
        try:
            _keep(d, digest, bundle)
        except OSError:
            pass
    cache = os.path.join(d, f"{digest}.{sys.implementation.cache_tag}")
    code: dict = {}
    if not keep and _private_dir(d):
        try:
            with open(cache, "rb") as fh:
                blob = fh.read()
            if hashlib.sha256(blob[64:]).hexdigest().encode() == blob[:64]:
                code = marshal.loads(blob[64:])
        except Exception:  # noqa: BLE001 - no usable cache: compile
            code = {}
    new: dict = {}
    packages = {n[:i] for n in modules for i in range(len(n)) if n[i] == "."}

    class Finder:
        def find_spec(self, name, path=None, target=None):
            if name in modules or name in packages:
                return u.spec_from_loader(name, self, is_package=name in packages)
            return None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            name = module.__name__
            c = code.get(name)
            if c is None:
                c = new[name] = compile(modules.get(name, ""), f"<provision:{name}>", "exec")
            exec(c, module.__dict__)

    sys.meta_path.insert(0, Finder())
    rc: int = importlib.import_module(entry).main(request, bundle)
    if new and _private_dir(d):
        try:
            blob = marshal.dumps(dict(code, **new))
            _write(cache, hashlib.sha256(blob).hexdigest().encode() + blob)
        except (OSError, ValueError):
            pass
    return rc


def cached_bootstrap_code(digest: str, ready: str, state_dir: str | None = None,
                          entry: str = "provision.host.agent") -> str:
    """The bootstrap that keeps the bundle on the host (see CACHED): it says ``READY hit`` or
    ``READY miss`` on stdout before it reads stdin; it reads ``{"q": n}\\n`` and the request,
    then, only on a miss, ``<length>\\n`` and the bundle (control/transport/bundle.payloads)."""
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError("digest must be a sha256 in hex")
    import json

    return CACHED % {"digest": json.dumps(digest), "state_dir": json.dumps(state_dir) if state_dir else "None",
                     "ready": json.dumps(ready), "bundles": json.dumps(BUNDLES_DIR), "entry": json.dumps(entry)}

RESULT_PREFIX = "PROVISION-RESULT "
EVENT_PREFIX = "PROVISION-EVENT "


def emit(event: dict) -> None:
    """One progress event to the control machine, on the same stdout as the answer, before it
    (control/transport/base.py hands it to the call's ``on_event``). For the user's eyes only:
    an event the control side misses changes no outcome."""
    import json
    import sys

    sys.stdout.write(EVENT_PREFIX + json.dumps(event) + "\n")
    sys.stdout.flush()


def serve(dispatch, request: bytes, bundle: bytes) -> int:
    """Run one request through ``dispatch`` and print the answer; never lose the host's answer."""
    import json
    import sys

    try:
        out = dispatch(json.loads(request), bundle)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - report it as a value
        import traceback

        out = {"ok": False, "error": {"kind": "internal", "message": f"{type(exc).__name__}: {exc}",
                                      "traceback": traceback.format_exc()[-2000:]}}
    out.setdefault("host_python", sys.executable)
    sys.stdout.write(RESULT_PREFIX + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


def frame(bundle: bytes, request: bytes) -> bytes:
    """The stdin bytes for one remote call."""
    import json

    return json.dumps({"b": len(bundle), "q": len(request)}).encode() + b"\n" + bundle + request
