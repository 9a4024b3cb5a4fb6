"""The few lines sent as the remote command's argument.  STDLIB ONLY.

Everything else travels on stdin, written straight to the SSH channel (fast,
and never visible in the host's process list):

    <header json>\\n<zlib(json{module name: source})><request json>

The control side uses ``cached_bootstrap_code``: the command line also names the bundle's
sha256, the host answers ``<ready> hit`` when it has a verified copy (then stdin carries
``{"b": 0, ...}`` and the request alone) or ``<ready> miss`` (then the bundle follows, and is
kept). Either way one command, one stdin: a miss costs the bytes, never a round trip.

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
RUN = "M=json.loads(zlib.decompress(B))\n"
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

# The host's copy of bundles: <state dir>/bundles/<sha256 of the bundle bytes>. The directory is
# the user's own (root's: /var/lib/provision/bundles) and 0700, or it is not used; a copy is
# used only when its bytes (the module sources, uncompressed) hash to the name the control side sent, read once into memory and
# run from there (no file is read twice). A miss stores what came on stdin, atomically, when
# it hashes right; the newest KEEP copies are kept. Nothing here can fail the step: any OS
# error is a miss.
BUNDLES_DIR = "bundles"
KEEP = 12
CACHED = (
    "import sys,os,json,zlib,hashlib,importlib.util as u\n"
    "H=%(digest)s;D=os.path.join(%(state_dir)s or(\"/var/lib/provision\"if os.geteuid()==0 else os.path.join("
    "os.environ.get(\"XDG_STATE_HOME\")or os.path.expanduser(\"~/.local/state\"),\"provision\")),%(bundles)s)\n"
    "def O():\n"
    " try:t=os.lstat(D);return t.st_uid==os.geteuid()and t.st_mode&0o170077==0o40000\n"
    " except OSError:return 0\n"
    "def S(B):\n"
    " os.makedirs(D,0o700,exist_ok=True)\n"
    " if not O():return\n"
    " t=os.path.join(D,\".%%s.%%d\"%%(H,os.getpid()))\n"
    " with open(os.open(t,os.O_WRONLY|os.O_CREAT|os.O_TRUNC,0o600),\"wb\")as f:f.write(B)\n"
    " os.replace(t,os.path.join(D,H))\n"
    " for e in sorted((e for e in os.scandir(D)if len(e.name)==64),key=lambda e:-e.stat().st_mtime)[%(keep)d:]:"
    "os.unlink(e.path)\n"
    "C=None\n"
    "try:\n"
    " if O():C=open(os.path.join(D,H),\"rb\").read();J=zlib.decompress(C);C=C if hashlib.sha256(J).hexdigest()==H else None\n"
    "except (OSError,zlib.error):C=None\n"
    "sys.stdout.write(%(ready)s+(\" hit\\n\"if C else\" miss\\n\"));sys.stdout.flush()\n"
    "r=sys.stdin.buffer;h=json.loads(r.readline());B=C or r.read(h[\"b\"]);Q=r.read(h[\"q\"])\n"
    "if not C:J=zlib.decompress(B)\n"
    "M=json.loads(J)\n"
    "if not C and hashlib.sha256(J).hexdigest()==H:\n"
    " try:S(B)\n"
    " except OSError:pass\n"
)


def cached_bootstrap_code(digest: str, ready: str, state_dir: str | None = None,
                          entry: str = "provision.host.agent") -> str:
    """The bootstrap that keeps the bundle on the host (see CACHED): it says ``READY hit`` or
    ``READY miss`` on stdout before it reads stdin, and reads the bundle's bytes only on a
    miss. The caller then sends ``frame(b"", request)`` or ``frame(bundle, request)``."""
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError("digest must be a sha256 in hex")
    import json

    head = CACHED % {"digest": json.dumps(digest), "state_dir": json.dumps(state_dir) if state_dir else "None",
                     "ready": json.dumps(ready), "keep": KEEP, "bundles": json.dumps(BUNDLES_DIR)}
    return head + LOAD.replace("provision.host.agent", entry)

RESULT_PREFIX = "PROVISION-RESULT "
EVENT_PREFIX = "PROVISION-EVENT "


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
