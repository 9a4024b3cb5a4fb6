"""A server in a container (profile `launch.container`) as `status` shows it: the container, its
image, the engine's version inside and what the image's class needs (the fix)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from provision.output.results import HostResult

if TYPE_CHECKING:
    from provision.host.protocol import StatusAnswer

# the image's class, as the start recorded it -> the status verdict of the host
FIX_VERDICT = {"native": "native", "in-image": "patched", "missing": "missing"}


def container_text(rec: dict, ans: dict) -> str:
    """`container NAME (RUNTIME, id ID, STATE) image IMAGE with ENGINE VERSION` (pure)."""
    from provision.host import inference

    c = rec.get("container") or {}
    now = ans.get("container") or {}
    title = inference.get(inference.of_record(rec)).title
    return (f"container {c.get('name')} ({c.get('runtime')}, id {c.get('id')}, {now.get('status') or 'gone'}) "
            f"image {c.get('image')} with {title} {c.get('sglang')}")


def container_status(host: str, answer: StatusAnswer) -> HostResult:
    """`provision status` of a host whose SGLang runs only in provision's container (pure)."""
    ours = answer.get("server") or {}
    rec = ours.get("record") or {}
    c = rec.get("container") or {}
    fix = c.get("fix") or {}
    verdict = FIX_VERDICT.get(fix.get("kind"), "error")
    if verdict == "missing" and rec.get("fix") == "overlay" and rec.get("overlay"):
        verdict = "overlay"  # the image lacks the methods; the server runs with provision's overlay
    state = {"native": "native: the image's class has every method",
             "patched": "the image's class has the methods (provision's block)",
             "overlay": "overlay: the image lacks " + ", ".join(fix.get("missing") or []) + "; provision's overlay "
                        f"{(rec.get('overlay') or {}).get('root')} supplies them",
             "missing": "missing in the image: " + ", ".join(fix.get("missing") or []),
             "error": "the image's class was not judged (no spec at start)"}[verdict]
    server = container_text(rec, ours)
    if rec.get("fix"):
        server += f"; fix: {rec['fix']}"
    if ours.get("running"):
        h = ours.get("health")
        server += f", health {h if h is not None else 'no answer'}, up {ours.get('uptime')} s"
        short = "up" if h == 200 else "starting"
    elif rec.get("stopped_at"):
        short = "stopped"
    else:
        short = f"exited {ours.get('exit')}" if ours.get("exit") is not None else "gone"
    return HostResult(host, verdict, f"{state}; server: {server}", version=c.get("sglang"), install=c.get("install_path"),
                      file=fix.get("file"), data={"patch": verdict, "patch_state": state, "server": server,
                                                  "server_state": short, "install_kind": "container",
                                                  "fix": rec.get("fix"), "overlay": rec.get("overlay"),
                                                  "container": {**c, **(ours.get("container") or {})}},
                      error_kind="status" if verdict == "error" else None)
