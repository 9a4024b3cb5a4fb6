"""The few lines sent as the remote command's argument.  STDLIB ONLY.

Everything else travels on stdin, written straight to the SSH channel (fast,
and never visible in the host's process list):

    <header json>\\n<zlib(json{module name: source})><request json>

The bootstrap installs an import hook serving the bundled modules under their
real names (``provision.host.engine.core`` ...) and calls ``agent.main``. Every
package on the way (``provision``, ``provision.host``, ``provision.host.ops`` ...) gets a
module with ``__path__``, from its ``__init__`` source when the bundle has one, else empty.
"""

def bootstrap_code(entry: str = "provision.host.agent") -> str:
    """The bootstrap for an entry module (one that has ``main(request, bundle)``)."""
    return BOOTSTRAP.replace("provision.host.agent", entry)


BOOTSTRAP = (
    "import sys,json,zlib,importlib.util as u\n"
    "r=sys.stdin.buffer;h=json.loads(r.readline());B=r.read(h['b']);Q=r.read(h['q'])\n"
    "M=json.loads(zlib.decompress(B))\n"
    "P={n[:i] for n in M for i in range(len(n)) if n[i]=='.'}\n"
    "class F:\n"
    " def find_spec(s,n,p=None,t=None):\n"
    "  return u.spec_from_loader(n,s,is_package=n in P) if n in M or n in P else None\n"
    " def create_module(s,sp):return None\n"
    " def exec_module(s,m):exec(compile(M.get(m.__name__,''),'<provision:'+m.__name__+'>','exec'),m.__dict__)\n"
    "sys.meta_path.insert(0,F())\n"
    "import provision.host.agent as a\n"
    "sys.exit(a.main(Q,B))\n"
)

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
