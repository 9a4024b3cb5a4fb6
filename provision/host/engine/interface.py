"""The interface kind: a wrapper class given every member of an engine's protocol that it lacks,
the methods delegating to its inner model.  STDLIB ONLY, Python 3.10.

    kind: interface
    package: vllm
    file: model_executor/models/kimi_k25.py
    class: KimiK25ForConditionalGeneration
    delegate: language_model
    protocol: model_executor/models/interfaces.py:SupportsEagle3

vLLM decides EAGLE-3 support with a runtime-checkable protocol (``SupportsEagle3``): it counts
the protocol's members on the class (``supports_eagle3``, ``has_own_lm_head``,
``has_own_embed_tokens``, ``set_aux_hidden_state_layers`` and the default-layers method) and never
reads their values, and the members' names change between releases
(``get_eagle3_aux_hidden_state_layers`` in 0.16-0.17, ``get_eagle3_default_aux_hidden_state_layers``
by 0.32). So the members are not written in the spec: they are read from the protocol class of the
release installed on the host (``expand``), with its protocol bases, and the spec becomes a
delegation spec whose ``attributes`` (the protocol's class attributes and their values) and
``methods`` (its methods, parameters without annotations) go into one managed block, exactly as
the delegation kind writes, re-reads and removes it (engine/core.py). A member the class already
binds, itself or through a base (the protocol declared among its bases included), is native.

The marker carries the block's sha, which depends on the release: the control side cannot compute
it (``render.block_shas`` gives none), so such a spec always takes the host's full look.
"""

from __future__ import annotations

import ast

from provision.host.engine.pysource import Resolver
from provision.host.engine.spec import EngineError, validate_spec
from provision.host.lib.modules import module_name


def _members(body) -> tuple:
    """(attributes [(name, value text)], methods [(name, params text)]) a class body declares,
    its private names and dunders left out."""
    attrs, methods = [], []
    for st in body:
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
            attrs.append((st.target.id, ast.unparse(st.value)))
        elif isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
            attrs.append((st.targets[0].id, ast.unparse(st.value)))
        elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)) and not st.decorator_list:
            args = st.args
            for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                if a is not None:
                    a.annotation = None
            methods.append((st.name, ast.unparse(args)))
    keep = (lambda n: not n.startswith("_"))
    return [a for a in attrs if keep(a[0])], [m for m in methods if keep(m[0])]


def protocol_members(spec: dict, resolve_module) -> tuple:
    """The protocol's members as the installed release declares them: the class `protocol` names
    and its bases in the same package, nearest first (a name the protocol redeclares is its own).
    Raises EngineError("protocol-missing")."""
    s = validate_spec(spec)
    file, _, cls_name = s["protocol"].partition(":")
    notes: list = []
    resolver = Resolver(resolve_module, notes, s["package"])
    mod = resolver.module(module_name(file, s["package"]))
    hits = [n for n in mod.tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name] if mod else []
    if len(hits) != 1:
        found = "no such file" if mod is None else f"{len(hits)} classes {cls_name}"
        raise EngineError("protocol-missing", f"expected {s['package']}/{file} to declare the interface class {cls_name} once, found {found}{': ' + notes[0] if notes else ''}; is this a release the spec knows?")
    attrs, methods, seen = [], [], set()
    for body in [hits[0].body] + [bc.body for _m, bc in resolver.base_classes(mod, hits[0])]:
        a, m = _members(body)
        attrs += [x for x in a if x[0] not in seen]
        methods += [x for x in m if x[0] not in seen]
        seen.update(x[0] for x in a + m)
    if not methods:
        raise EngineError("protocol-missing", f"expected class {cls_name} in {s['package']}/{file} to declare methods (the interface), found none")
    return attrs, methods


def expand(spec: dict, resolve_module) -> dict:
    """The delegation spec an interface spec is on this release (validated): every attribute and
    method of its protocol, under the spec's name. Raises EngineError."""
    s = validate_spec(spec)
    attrs, methods = protocol_members(s, resolve_module)
    return validate_spec({
        "name": s["name"], "kind": "delegate", "package": s["package"], "file": s["file"],
        "class": s["class"], "delegate": s["delegate"],
        "methods": [{"name": n, "params": p} for n, p in methods],
        "attributes": [{"name": n, "value": v} for n, v in attrs],
    })

