"""`provision spec new`: a patch spec drafted from an audit gap, and its YAML.  Control side only.

Pure: an audit record in, a spec dict / YAML text out. Kept off the hosts (the audit
itself runs there, provision/host/engine/audit.py; drafting a spec never does).
"""

from __future__ import annotations

import json
import re
import textwrap

from provision.host.engine.audit import DEFAULT_PARAMS, SPEC_METHODS


_SUFFIXES = ("ForConditionalGeneration", "ForCausalLM", "LMHeadModel")


def _kebab(class_name: str) -> str:
    base = class_name
    for suffix in _SUFFIXES:
        if base.endswith(suffix) and len(base) > len(suffix):
            base = base[: -len(suffix)]
            break
    words = []
    for chunk in re.split(r"[\W_]+", base):
        words += re.findall(r"[A-Z]+[0-9]*(?=[A-Z][a-z]|$)|[A-Z]?[a-z]+[0-9]*|[A-Z]+[0-9]*|[0-9]+", chunk)
    return "-".join(w.lower() for w in words if w) or "model"


def spec_for(gap: dict, allow_conditional: bool = False) -> dict:
    """The patch spec (the dict the patch engine consumes) for one gap from audit_models().

    Lists, in the order set_eagle3_layers_to_capture, get_embed_and_head,
    set_embed_and_head, only the methods the wrapper doesn't already have (a
    second definition next to a native one would silently replace it), each with
    the parameter list the inner class defines.
    """
    for key in ("class", "file", "attr", "verdict"):
        if not gap.get(key):
            raise ValueError(f"the gap record has no {key!r}: pass a record from audit_models()['wrappers'].")
    cls, verdict, reason = gap["class"], gap["verdict"], gap.get("reason", "")
    if verdict in ("needs-more", "unknown"):
        raise ValueError(f"{cls} is {verdict}, so delegating methods cannot fix it: {reason}")
    if verdict == "conditional" and not allow_conditional:
        lacking = " or ".join(gap.get("inner_lack") or []) or "an inner class without the methods"
        raise ValueError(
            f"{cls} is conditional: its inner model may be {lacking}, which lacks the EAGLE-3 "
            "methods; pass allow_conditional=True to patch it anyway."
        )
    if verdict not in ("fixable", "conditional"):
        raise ValueError(f"{cls} has an unrecognised verdict {verdict!r}.")
    if gap.get("kind") == "interface":  # vLLM's: the members are read from the release's protocol
        return {"name": _kebab(cls) + "-eagle3-vllm", "kind": "interface", "package": "vllm",
                "file": gap["file"], "class": cls, "delegate": gap["attr"], "protocol": gap["protocol"],
                "missing": list(gap.get("missing") or [])}
    already = set(gap.get("has") or [])
    params = gap.get("methods") or {}
    methods = [{"name": m, "params": params.get(m) or DEFAULT_PARAMS[m]} for m in SPEC_METHODS if m not in already]
    return {
        "name": _kebab(cls) + "-eagle3",
        "file": gap["file"],
        "class": cls,
        "delegate": gap["attr"],
        "methods": methods,
    }


_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "none"}


def _scalar(value) -> str:
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in _YAML_WORDS:
        return text
    return json.dumps(text)  # a JSON string is a valid YAML double-quoted scalar


def _commented(line: str, comment: str, column: int = 40) -> str:
    """``line`` with ``# comment`` starting at ``column`` (0-based), as in the shipped playbooks."""
    return f"{line.ljust(column)}# {comment}" if len(line) < column else f"{line}  # {comment}"


def spec_yaml(spec: dict, source_note: str) -> str:
    """Render ``spec`` as a playbook in the layout of playbooks/kimi-k25-eagle3.yaml.

    ``source_note`` becomes the header comment (where the spec came from).
    yaml.safe_load of the result gives {"name", "description", "patch": {file,
    class, delegate, methods: [{name, params}]}}.
    """
    if spec.get("kind") == "interface":
        return _interface_yaml(spec, source_note)
    for key in ("name", "file", "class", "delegate", "methods"):
        if key not in spec:
            raise ValueError(f"the spec has no {key!r}: build it with spec_for().")
    lines = [("# " + line).rstrip() for line in (str(source_note or "").splitlines() or [""])]
    lines += [
        "#",
        "#   patch:  the delegation methods `provision patch` injects into the wrapper class",
        "#           (only those it lacks; each forwards to the inner model).",
        "# `provision patch --playbook FILE` reads `patch:`.",
        f"name: {_scalar(spec['name'])}",
    ]
    description = (
        f"EAGLE-3 delegation for {spec['class']}, which holds its inner model as "
        f"self.{spec['delegate']}."
    )
    if description.isprintable():
        lines.append("description: >-")
        lines += ["  " + w for w in textwrap.wrap(description, 76, break_on_hyphens=False, break_long_words=False)]
    else:
        lines.append(f"description: {json.dumps(description)}")
    lines += [
        "patch:",
        _commented(f"  file: {_scalar(spec['file'])}", "relative to the `sglang` package directory"),
        f"  class: {_scalar(spec['class'])}",
        _commented(f"  delegate: {_scalar(spec['delegate'])}", "the attribute that holds the inner model"),
        "  methods:",
    ]
    for m in spec["methods"]:
        lines.append(f"    - name: {_scalar(m['name'])}")
        lines.append(f"      params: {json.dumps(str(m['params']))}")
    return "\n".join(lines) + "\n"


def _interface_yaml(spec: dict, source_note: str) -> str:
    """An interface spec (vLLM) as a playbook, in the layout of playbooks/kimi-vl-eagle3-vllm.yaml."""
    lines = [("# " + line).rstrip() for line in (str(source_note or "").splitlines() or [""])]
    missing = ", ".join(spec.get("missing") or [])
    said = (f"the members of {spec['protocol'].partition(':')[2]} the class lacks" + (f" ({missing})" if missing else "")
            + ", read from the installed release's own protocol; its methods forward to the inner model.")
    wrapped = textwrap.wrap(said, 88, break_on_hyphens=False, break_long_words=False)
    lines += ["#", "#   patch:  " + wrapped[0]] + ["#           " + w for w in wrapped[1:]]
    lines += [
        "# `provision patch --playbook FILE` reads `patch:`.",
        f"name: {_scalar(spec['name'])}",
        "engine: vllm",
        "description: >-",
    ]
    description = (f"The EAGLE-3 interface for vLLM's {spec['class']}, delegating to its "
                   f"self.{spec['delegate']}.")
    lines += ["  " + w for w in textwrap.wrap(description, 76, break_on_hyphens=False, break_long_words=False)]
    lines += [
        "patch:",
        "  kind: interface",
        _commented(f"  file: {_scalar(spec['file'])}", f"relative to the `{spec['package']}` package directory"),
        f"  class: {_scalar(spec['class'])}",
        _commented(f"  delegate: {_scalar(spec['delegate'])}", "the attribute that holds the inner model"),
        f"  protocol: {_scalar(spec['protocol'])}",
    ]
    return "\n".join(lines) + "\n"


def proposer_note(cls: str, proposer: str, release: str, written: str) -> str:
    """What `spec new` says on stderr when the release's EAGLE proposer (`proposer`, a file of the
    package) reads config.image_token_index for `cls`: the shipped spec that fixes it for the class,
    to be patched with the one just written, or how to write one."""
    from provision.config.playbook import shipped_fixes

    fix = next((name for name, kind in shipped_fixes("vllm").get(cls, []) if kind == "replace"), None)
    where = (f"note: {release}'s EAGLE proposer ({proposer}) reads config.image_token_index of {cls} (it has no "
             "branch of its own for the class): ")
    if fix:
        return (where + f"the shipped spec {fix} gives it one. Patch both halves: "
                f"`provision patch --playbook {written or 'THIS-SPEC'} --playbook {fix}`; with this spec "
                "alone, preflight refuses the launch naming it.")
    return (where + "if the model's config has no image_token_index (its placeholder token is named otherwise), "
            "the drafter's load dies with AttributeError after the weights. Write a `replace` spec of that file "
            "that adds a branch for the class, as the shipped qwen2-audio-proposer-vllm does for Qwen2-Audio.")
