"""Which host modules a call ships: the bundle's exclude sets, one per kind of call.

A host runs only what its op imports, but every module in the bundle is hashed, and on a host's
first call of a provision version also sent and kept. The timer's calls (a no-op `patch` or
`reconcile`) share one lighter bundle, so a host keeps one copy and one set of compiled modules
for both; the facts call (deciding `applies:`) ships neither the engine nor any other op.
"""

from __future__ import annotations

import functools

# What patch and reconcile never import (the audit, the server control, the model checks, bench):
# left out of their bundle, so each host receives, keeps and parses ~40% less.
LIGHT_EXCLUDE = frozenset({"engine.audit", "engine.audit_index", "engine.audit_cli", "ops.audit", "ops.server",
                           "ops.server_preflight", "ops.server_launch", "ops.server_record",
                           "ops.restore", "ops.container", "ops.checks", "ops.server_secrets", "ops.backends",
                           "ops.backends.base", "ops.backends.container", "ops.backends.detached",
                           "ops.backends.identity", "ops.backends.lock", "ops.backends.record", "ops.backends.select",
                           "ops.backends.systemd", "ops.backends.tree", "ops.backends.systemctl",
                           "ops.backends.transient", "ops.preflight_model", "engine.modelcheck", "engine.serverargs",
                           "engine.safetensors", "facts.model", "ops.bench", "ops.bench_prompts", "facts.gpu_name"})


def call_light(session, request: dict, *, timeout: float, sudo: bool) -> dict:
    """Transport.call with the lighter bundle (LIGHT_EXCLUDE): for `patch` and `reconcile`."""
    return session.call(request, timeout=timeout, sudo=sudo, exclude=LIGHT_EXCLUDE)


@functools.lru_cache(maxsize=None)
def facts_exclude() -> frozenset:
    """The facts call's: the engine and every op but its own (ops/hostfacts.py)."""
    from provision.control.transport.bundle import host_modules

    return frozenset(m for m in host_modules()
                     if (m.startswith("engine") or m.startswith("ops.")) and m != "ops.hostfacts")
