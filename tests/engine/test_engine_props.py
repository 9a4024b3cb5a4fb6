"""Property tests: random module code around a small wrapper class."""

from __future__ import annotations

import ast
import copy

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from provision.host.engine import core as engine
from tests.engine.conftest import KIMI_SPEC, METHODS, inserted_chunk, method_names

SETTINGS = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

comment_text = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=16)


@st.composite
def module_chunk(draw, n: int, unit: str) -> list:
    """A few lines of module-level code (no endings)."""
    kind = draw(st.sampled_from(["comment", "blank", "assign", "def", "class", "string", "if", "decorated", "entry"]))
    if kind == "comment":
        return [draw(st.sampled_from(["", "    ", unit])) + "#" + draw(comment_text)]
    if kind == "blank":
        return [draw(st.sampled_from(["", "  ", "\t"]))]
    if kind == "assign":
        return [f"x_{n} = {n}  # {draw(comment_text)}"]
    if kind == "def":
        return [f"def f_{n}(a):", f"{unit}return a", ""]
    if kind == "class":
        return [f"class C_{n}:", f"{unit}def get_embed_and_head(self):", f"{unit * 2}return {n}", ""]
    if kind == "string":
        return [f's_{n} = """', draw(comment_text).replace('"', "'").replace("\\", "/"), '"""']
    if kind == "if":
        return ["if True:", f"{unit}y_{n} = {n}", "else:", f"{unit}pass"]
    if kind == "decorated":
        return ["@staticmethod", f"def g_{n}():", f"{unit}pass"]
    return ["EntryClass = [KimiK25ForConditionalGeneration]"]


@st.composite
def class_chunk(draw, n: int, unit: str) -> list:
    kind = draw(st.sampled_from(["method", "attr", "comment", "blank", "string", "decorated", "nested"]))
    u, u2 = unit, unit * 2
    if kind == "method":
        return [f"{u}def m_{n}(self, a=({n},\n{u2}1)):", f"{u2}return a  # {draw(comment_text)}"]
    if kind == "attr":
        return [f"{u}a_{n} = {n}; b_{n} = {n}"]
    if kind == "comment":
        return [draw(st.sampled_from(["", u, u2])) + "# " + draw(comment_text)]
    if kind == "blank":
        return [draw(st.sampled_from(["", u]))]
    if kind == "string":
        return [f'{u}doc_{n} = """', "text at column 0", f'{u2}"""']
    if kind == "decorated":
        return [f"{u}@property", f"{u}def p_{n}(self):", f"{u2}return self"]
    return [f"{u}class Inner_{n}:", f"{u2}pass"]


@st.composite
def wrapped_module(draw):
    unit = draw(st.sampled_from(["    ", "  ", "\t"]))
    newline_mode = draw(st.sampled_from(["\n", "\r\n", "mixed"]))
    natives = draw(st.lists(st.sampled_from(METHODS), unique=True, max_size=3))
    lines = []
    for i in range(draw(st.integers(0, 5))):
        lines += draw(module_chunk(i, unit))
    lines += ["", f"class KimiK25ForConditionalGeneration(Base, metaclass=Meta):"]
    if draw(st.booleans()):
        lines += [f'{unit}"""Docstring."""']
    lines += [f"{unit}def __init__(self):", f"{unit * 2}self.language_model = 0"]
    body = []
    for i in range(draw(st.integers(0, 4))):
        body.append(draw(class_chunk(100 + i, unit)))
    for name in natives:
        body.insert(draw(st.integers(0, len(body))), [f"{unit}def {name}(self, *a):", f"{unit * 2}return 1"])
    for chunk in body:
        lines += chunk
    if draw(st.booleans()):
        lines += [f"{unit}last = 1"]
    after = []
    for i in range(200, 200 + draw(st.integers(0, 5))):
        after += draw(module_chunk(i, unit))
    if after:
        lines += [""] + after
    text = ""
    for i, line in enumerate(lines):
        nl = draw(st.sampled_from(["\n", "\r\n"])) if newline_mode == "mixed" else newline_mode
        text += line + nl
    if not draw(st.booleans()):
        text = text.rstrip("\r\n")
    return text.encode("utf-8"), natives


@SETTINGS
@given(wrapped_module())
def test_patch_then_unpatch_is_identity_and_patch_is_idempotent(case):
    src, natives = case
    ast.parse(src)  # the generator makes valid Python
    spec = copy.deepcopy(KIMI_SPEC)
    r = engine.plan_patch(src, spec)
    missing = [m for m in METHODS if m not in natives]
    if not missing:
        assert r["verdict"] == "native" and r["new"] is None
        return
    assert r["verdict"] == "patched", r["error"]
    assert r["added"] == missing and sorted(r["native"]) == sorted(natives)
    new = r["new"]
    compile(new, "m.py", "exec")
    names = method_names(new)
    for m in METHODS:
        assert names.count(m) == 1, (m, names)
    assert names[-len(missing):] == missing
    inserted_chunk(src, new)  # one insertion, nothing else touched
    assert engine.check_structure(new, spec) == []
    assert engine.plan_unpatch(new, spec)["new"] == src
    again = engine.plan_patch(new, spec)
    assert again["verdict"] == "unchanged" and again["new"] is None


HAND_DEFS = {
    "set_eagle3_layers_to_capture": ["def set_eagle3_layers_to_capture(self, layer_ids=None):",
                                     "    self.language_model.set_eagle3_layers_to_capture(layer_ids)"],
    "get_embed_and_head": ["def get_embed_and_head(self):", "    return self.language_model.get_embed_and_head()"],
    "set_embed_and_head": ["def set_embed_and_head(self, embed, head):",
                           "    self.language_model.set_embed_and_head(embed, head)"],
}


@SETTINGS
@given(wrapped_module(), st.lists(st.sampled_from(METHODS), min_size=1, max_size=4),
       st.sampled_from(["", "    ", "\t"]), st.lists(st.sampled_from(["", "# hand fix", "   "]), max_size=3),
       st.booleans(), st.integers(0, 2))
def test_hand_patches_are_repaired(case, defs, indent, extra, own_comment, blanks):
    src, _natives = case
    tree = ast.parse(src)
    if not tree.body or not isinstance(tree.body[-1], (ast.Assign, ast.ClassDef)):
        assume(False)  # a trailing module-level def/if could absorb an indented tail
    if indent and isinstance(tree.body[-1], ast.ClassDef):
        assume(False)  # indented defs after a class become its methods (valid code, no hand patch)
    nl = b"\r\n" if src.count(b"\r\n") * 2 > src.count(b"\n") else b"\n"
    # `cat >> file <<EOF`: blank lines, a comment header right on the first def, the defs
    tail = [""] * (1 + blanks) + [c for c in extra if c.strip()]
    for k, d in enumerate(defs):
        tail += ([""] if k else []) + [indent + ln for ln in HAND_DEFS[d]]
    if not src.endswith((b"\n", b"\r")):
        src += nl
    if own_comment:  # the module's own last line is a comment: it must survive the repair
        src += b"# the module's own comment after its last statement" + nl
    hand = src + nl.join(x.encode() for x in tail) + nl
    spec = copy.deepcopy(KIMI_SPEC)
    r = engine.plan_patch(hand, spec)
    assert r["verdict"] == "repaired", (r["error"], hand[-300:])
    assert len(r["repaired"]) == len(defs)
    new = r["new"]
    assert not any(isinstance(n, ast.FunctionDef) and n.name in METHODS for n in ast.parse(new).body)
    names = method_names(new)
    assert all(names.count(m) == 1 for m in METHODS)
    base = engine.plan_unpatch(new, spec)["new"] or new
    # exactly the hand patch is gone: at most blank lines of the module's own end go with it
    assert src.startswith(base) and not src[len(base):].strip(), (src[-200:], base[-200:])


# ----------------------------------------------------------------------- forwarding

@st.composite
def param_list(draw):
    pool = iter(f"p{i}" for i in range(20))
    parts, spec_parts = [], []
    posonly = [next(pool) for _ in range(draw(st.integers(0, 2)))]
    regular = [next(pool) for _ in range(draw(st.integers(0, 3)))]
    n_default = draw(st.integers(0, len(posonly) + len(regular)))
    positional = posonly + regular
    defaults = {p: i for i, p in enumerate(positional[len(positional) - n_default:])}
    out = ["self"]
    for p in posonly:
        out.append(f"{p}={defaults[p]}" if p in defaults else p)
    if posonly:
        out.append("/")
    for p in regular:
        out.append(f"{p}={defaults[p]}" if p in defaults else p)
    vararg = draw(st.booleans())
    kwonly = [next(pool) for _ in range(draw(st.integers(0, 2)))]
    if vararg:
        out.append("*args")
    elif kwonly:
        out.append("*")
    for p in kwonly:
        out.append(f"{p}={draw(st.integers(0, 9))}" if draw(st.booleans()) else p)
    kwarg = draw(st.booleans())
    if kwarg:
        out.append("**kw")
    del parts, spec_parts
    return ", ".join(out), posonly, regular, vararg, kwonly, kwarg


@settings(max_examples=80, deadline=None, database=None)
@given(param_list(), st.data())
def test_rendered_methods_forward_every_argument(plist, data):
    params, posonly, regular, vararg, kwonly, kwarg = plist
    spec = copy.deepcopy(KIMI_SPEC)
    spec["methods"] = [{"name": "probe", "params": params}]
    code = "class W:\n" + engine.render_methods(spec, "    ", "\n")
    code += f"\n\nclass Inner:\n    def probe({params}):\n        return dict(locals())\n"
    ns: dict = {}
    exec(compile(code, "probe.py", "exec"), ns)
    w = object.__new__(ns["W"])
    w.language_model = ns["Inner"]()
    # build a call that binds every required parameter, sometimes more
    args = [data.draw(st.integers()) for _ in posonly]
    kwargs = {}
    for p in regular:
        if data.draw(st.booleans()):
            kwargs[p] = data.draw(st.integers())
        elif not kwargs:
            args.append(data.draw(st.integers()))
        else:
            kwargs[p] = data.draw(st.integers())
    if vararg and not kwargs and len(args) == len(posonly) + len(regular):
        args += data.draw(st.lists(st.integers(), max_size=2))
    for p in kwonly:
        kwargs[p] = data.draw(st.integers())
    if kwarg:
        kwargs["extra_kw"] = data.draw(st.integers())
    try:
        expected = ns["Inner"]().probe(*args, **kwargs)
    except TypeError:
        return  # our draw made an invalid call; the wrapper must fail the same way
    got = w.probe(*args, **kwargs)
    expected.pop("self")
    got.pop("self")
    assert got == expected
