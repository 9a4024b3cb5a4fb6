"""The plan, unpatch, check and inspect of the spec kinds that edit one place in a file
(mapping-entry, replace), around each kind's own analysis.  STDLIB ONLY, Python 3.10.

A kind module (engine/mapping_entry.py, engine/replace.py) provides:

- ``label(s)``: the edit's name in answers ("12 in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES");
- ``analyse(text, s) -> dict``: ``base`` (the text without provision's edit), ``block`` (our
  markers, or None), ``native`` (upstream has it: no edit wanted), ``via`` (how native was
  decided), ``want`` (the text with exactly the edit the spec asks for, None when native),
  ``notes``; raises EngineError;
- ``remove(text, block, s) -> str``: the text without provision's edit (exact inverse);
- ``check(text, s) -> list``: problems with a patched file (empty means good).

Here those become the answers engine/core.py's public functions give for every kind, in the
same shapes as the delegation's (verdict, new, added, native, kept, notes, error, ...), so the
safe write, verify, rollback, backup and journal (ops/fileops.py) are the same for all.
"""

from __future__ import annotations

from provision.host.engine.markers import find_block
from provision.host.engine.pysource import decode, split_lines
from provision.host.engine.render import spec_sha
from provision.host.engine.spec import EngineError, validate_spec


def _result(**kw) -> dict:
    r = {"verdict": "failed", "new": None, "added": [], "native": [], "kept": [], "updated": False,
         "repaired": [], "module_level_leftovers": [], "notes": [], "error": None}
    r.update(kw)
    return r


def plan_patch(kind, source: bytes, spec: dict) -> dict:
    try:
        s = validate_spec(spec)
        text, enc = decode(source)
        a = kind.analyse(text, s)
    except EngineError as e:
        return _result(error=e.as_dict())
    label = kind.label(s)
    r = _result(notes=list(a["notes"]))
    new_text = a["base"] if a["native"] else a["want"]
    if a["native"]:
        r["native"] = [label]
        r["notes"].append(f"{label}: upstream has it ({a['via']}); nothing to add")
        if a["block"] is not None:
            r["notes"].append(f"{label} is now native; removed provision's edit (spec {s['name']})")
    if new_text == text:
        r["verdict"] = "native" if a["native"] else "unchanged"
        if not a["native"]:
            r["kept"] = [label]
        return r
    try:
        new = new_text.encode(enc)
    except UnicodeEncodeError as e:
        return _result(error={"kind": "spec", "message": f"expected the edit to fit the file's {enc} encoding, found {e.object[e.start:e.end]!r}"})
    r["new"] = new
    r["verdict"] = "patched"
    if not a["native"]:
        if a["block"] is None:
            r["added"] = [label]
        else:
            r["kept"], r["updated"] = [label], True
            r["notes"].append(f"provision's edit for spec {s['name']} (sha {a['block']['sha']}) did not match the spec or the file; re-rendered it")
    problems = [] if a["native"] else kind.check(new_text, s)
    if not a["native"]:
        back = plan_unpatch(kind, new, s)
        if back.get("new") != a["base"].encode(enc):
            problems.append("unpatching the result would not give back the file without the edit")
    if problems:
        return _result(error={"kind": "internal", "message": "the planned file failed the engine's own check (a bug in provision): " + "; ".join(problems)})
    return r


def plan_unpatch(kind, source: bytes, spec: dict) -> dict:
    out = {"verdict": "failed", "new": None, "removed": [], "notes": [], "error": None}
    try:
        s = validate_spec(spec)
        text, enc = decode(source)
        block = find_block(split_lines(text), s["name"])
        if block is None:
            out["verdict"] = "absent"
            out["notes"].append(f"no edit of spec {s['name']} in the file; nothing to remove")
            return out
        base = kind.remove(text, block, s)
    except EngineError as e:
        out["error"] = e.as_dict()
        return out
    out["new"] = base.encode(enc)
    out["removed"] = [kind.label(s)]
    out["verdict"] = "unpatched"
    return out


def check_structure(kind, source: bytes, spec: dict) -> list:
    try:
        s = validate_spec(spec)
        text, _ = decode(source)
        return kind.check(text, s)
    except EngineError as e:
        return [e.message]


def inspect(kind, source: bytes, spec: dict) -> dict:
    """The Inspection shape (protocol.py) for one edit: `methods` is {label: "native" | "ours" |
    "missing"}, `block` says whether provision's marked edit is there and matches the spec."""
    out = {"class": None, "kind": None, "methods": {}, "native_via": {},
           "block": {"present": False, "sha": None, "expected_sha": None, "matches": None, "names": []},
           "hand_patch": False, "hand_patch_form": None, "hand_patch_defs": [],
           "module_level_leftovers": [], "would_change": None, "planned_verdict": None,
           "notes": [], "error": None}
    try:
        s = validate_spec(spec)
        out["kind"] = s["kind"]
        label = kind.label(s)
        text, _ = decode(source)
        block = find_block(split_lines(text), s["name"])
        if block is not None:
            out["block"].update(present=True, sha=block["sha"], names=[label])
        a = kind.analyse(text, s)
    except EngineError as e:
        out["error"] = e.as_dict()
        return out
    out["block"]["expected_sha"] = None if a["native"] else spec_sha(s)
    if a["native"]:
        out["methods"][label] = "native"
        out["native_via"][label] = a["via"]
    elif block is not None:
        out["methods"][label] = "ours"
        out["block"]["matches"] = a["want"] == text
    else:
        out["methods"][label] = "missing"
    out["notes"] = list(a["notes"])
    return with_plan(out, plan_patch(kind, source, spec))


def with_plan(out: dict, plan: dict) -> dict:
    """An inspection completed with what `provision patch` would do (every kind's inspect)."""
    out["would_change"] = plan["new"] is not None
    out["planned_verdict"] = plan["verdict"]
    if plan["error"]:
        out["error"] = plan["error"]
    return out
