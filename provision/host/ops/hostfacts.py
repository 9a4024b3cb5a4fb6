"""The `facts` op: what the control side decides a spec's `applies:` from.  STDLIB ONLY.

Discovery (the SGLang installs, which one is chosen, its version; the versions of the
packages the request names, beside that install) and, when asked, the GPUs' compute
capability (facts/gpu.py). Read-only: nothing is written. Sent before a patch or reconcile
whose specs say `applies:`, on the same connection (one extra remote call).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)

from provision.host.facts import installs

if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import FactsAnswer, FactsRequest


def op_facts(req: FactsRequest, bundle: bytes) -> FactsAnswer:
    facts = installs.for_request(req)
    out: FactsAnswer = {"ok": facts.get("error") is None, "facts": facts, "error": facts.get("error")}
    if req.get("gpu"):
        from provision.host.facts.gpu import compute_capability

        out["gpu"] = compute_capability()
    return out


OPS = {"facts": op_facts}
