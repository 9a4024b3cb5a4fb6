"""Property tests for the spec kinds: random dict layouts (mapping-entry) and random code
around a call (replace), in random line-ending styles: patch then unpatch is the identity, a
second patch is `unchanged`, and the result means what the spec says."""

from __future__ import annotations

import ast

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provision.host.engine import core as engine

SETTINGS = settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
comment = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\\"), max_size=12)
nl = st.sampled_from(["\n", "\r\n"])
indent = st.sampled_from(["    ", "  ", "\t", "        ", "   "])


@st.composite
def dict_module(draw):
    unit, end = draw(indent), draw(nl)
    keys = draw(st.lists(st.integers(0, 11), min_size=1, max_size=5, unique=True))
    lines = ["MiB = 1 << 20", "", "SIZES = {"]
    for i, k in enumerate(keys):
        comma = "," if i < len(keys) - 1 or draw(st.booleans()) else ""
        note = f"  # {draw(comment)}" if draw(st.booleans()) else ""
        if draw(st.booleans()):
            lines.append(f"{unit}{k}: {{{end}{unit}{unit}2: {k} * MiB,{end}{unit}}}{comma}{note}")
        else:
            lines.append(f"{unit}{k}: {k} * MiB{comma}{note}")
        if draw(st.booleans()):
            lines.append(f"{unit}# {draw(comment)}")
    lines.append("}")
    tail = draw(st.sampled_from(["", "x = SIZES", "def f():\n    return SIZES"]))
    text = end.join(line.replace("\n", end) for line in lines) + end + tail.replace("\n", end)
    return text, keys


@given(dict_module(), st.integers(0, 11), st.booleans())
@SETTINGS
def test_mapping_entry_identity_idempotence_and_meaning(mod, key, copy):
    text, keys = mod
    src = text.encode()
    spec = {"name": "p", "kind": "mapping-entry", "file": "p.py", "mapping": "SIZES", "key": key + 100}
    spec.update({"copy_of": keys[-1]} if copy else {"value": "3 * MiB"})
    r = engine.plan_patch(src, spec)
    assert r["verdict"] == "patched", r
    new = r["new"]
    assert engine.plan_patch(new, spec)["verdict"] == "unchanged"
    assert engine.plan_unpatch(new, spec)["new"] == src
    assert engine.check_structure(new, spec) == []
    ns: dict = {}
    exec(compile(new, "p.py", "exec"), ns)  # noqa: S102 - generated test code
    old: dict = {}
    exec(compile(src, "p.py", "exec"), old)  # noqa: S102
    want = old["SIZES"][keys[-1]] if copy else 3 << 20
    assert ns["SIZES"] == {**old["SIZES"], key + 100: want}
    assert list(ns["SIZES"])[-1] == key + 100
    # already there: native
    assert engine.plan_patch(src, {**spec, "key": keys[0], "copy_of": None, "value": "0"})["verdict"] == "native"


@st.composite
def call_module(draw):
    unit, end = draw(indent), draw(nl)
    before = draw(st.lists(st.sampled_from(["a = 1", "# " + "c", "", "def g():\n{u}return [9, 10]"]), max_size=3))
    args = draw(st.sampled_from(["archs=[9, 10]", "x, archs=[9, 10]", "archs=[9, 10], y=2"]))
    note = f"  # {draw(comment)}" if draw(st.booleans()) else ""
    split = draw(st.booleans())
    body = (f"{unit}flags = get({end}{unit}{unit}{args}{note}{end}{unit})" if split
            else f"{unit}flags = get({args}){note}")
    lines = [b.replace("{u}", unit) for b in before] + ["def f():", body, f"{unit}return flags"]
    final = draw(st.sampled_from([end, ""]))
    return end.join(line.replace("\n", end) for line in lines) + final


@given(call_module())
@SETTINGS
def test_replace_identity_idempotence_and_meaning(text):
    src = text.encode()
    spec = {"name": "r", "kind": "replace", "file": "r.py", "scope": "f", "find": "archs=[9, 10]",
            "replace": "archs=[9, 10, 12]"}
    r = engine.plan_patch(src, spec)
    assert r["verdict"] == "patched", r
    new = r["new"]
    assert engine.plan_patch(new, spec)["verdict"] == "unchanged"
    assert engine.plan_unpatch(new, spec)["new"] == src
    plain, i = text, text.index("def f():")
    plain = plain[:i] + plain[i:].replace("archs=[9, 10]", "archs=[9, 10, 12]", 1)
    assert ast.dump(ast.parse(new.decode())) == ast.dump(ast.parse(plain))
    assert engine.plan_patch(plain.encode(), spec)["verdict"] == "native"
