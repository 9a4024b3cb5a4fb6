"""The injected methods really delegate: exec the whole patched real kimi_k25.py
with stub torch/transformers/sglang modules, then call the three methods."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

import pytest

from provision.host.engine import core as engine
from tests.engine.conftest import KIMI_SPEC, METHODS

STUBBED = ("torch", "numpy", "transformers", "sglang", "einops", "triton", "PIL")


class Stub:
    """Anything: attribute access, calls, subscripts, decorators, base classes."""

    def __init__(self, name="stub"):
        self._name = name

    def __getattr__(self, item):
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        return Stub(f"{self._name}.{item}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs and not isinstance(args[0], Stub):
            return args[0]  # used as a decorator: keep the function
        return Stub(f"{self._name}()")

    def __getitem__(self, item):
        return Stub(f"{self._name}[]")

    def __mro_entries__(self, bases):
        return (object,)  # `class X(nn.Module)` -> a plain class

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __repr__(self):
        return f"<Stub {self._name}>"


class StubModule(types.ModuleType):
    def __getattr__(self, item):
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        return Stub(f"{self.__name__}.{item}")


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = StubModule(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        pass


@pytest.fixture
def stub_imports():
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] in STUBBED}
    for k in saved:
        del sys.modules[k]
    finder = StubFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for k in [k for k in sys.modules if k.split(".")[0] in STUBBED]:
            del sys.modules[k]
        sys.modules.update(saved)


def load(source: bytes, name="sglang.srt.models.kimi_k25") -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__file__ = "kimi_k25.py"
    exec(compile(source, "kimi_k25.py", "exec"), mod.__dict__)
    return mod


class Recorder:
    def __init__(self):
        self.calls = []
        self.embed = object()
        self.head = object()

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.calls.append(("set_eagle3_layers_to_capture", layer_ids))
        return ("captured", layer_ids)

    def get_embed_and_head(self):
        self.calls.append(("get_embed_and_head",))
        return self.embed, self.head

    def set_embed_and_head(self, embed, head):
        self.calls.append(("set_embed_and_head", embed, head))
        return "set"


class NoEagle:
    """An inner model without the EAGLE-3 methods (a stand-in, say)."""


@pytest.fixture
def patched_module(src_059, stub_imports):
    new = engine.plan_patch(src_059, KIMI_SPEC)["new"]
    return load(new)


def make(mod, inner):
    cls = mod.KimiK25ForConditionalGeneration
    obj = object.__new__(cls)  # no __init__: no weights, no GPU
    obj.language_model = inner
    return obj


def test_unpatched_059_lacks_the_methods(src_059, stub_imports):
    mod = load(src_059)
    obj = make(mod, Recorder())
    for m in METHODS:
        assert not hasattr(obj, m)
    assert mod.EntryClass == [mod.KimiK25ForConditionalGeneration]


def test_patched_059_delegates_all_three(patched_module):
    inner = Recorder()
    obj = make(patched_module, inner)
    assert patched_module.EntryClass == [patched_module.KimiK25ForConditionalGeneration]
    assert obj.set_eagle3_layers_to_capture([1, 29, 57]) == ("captured", [1, 29, 57])
    assert obj.set_eagle3_layers_to_capture(layer_ids=[3]) == ("captured", [3])
    assert obj.set_eagle3_layers_to_capture() == ("captured", None)
    embed, head = obj.get_embed_and_head()
    assert embed is inner.embed and head is inner.head
    e, h = object(), object()
    assert obj.set_embed_and_head(e, h) == "set"
    assert obj.set_embed_and_head(embed=e, head=h) == "set"
    assert inner.calls == [
        ("set_eagle3_layers_to_capture", [1, 29, 57]),
        ("set_eagle3_layers_to_capture", [3]),
        ("set_eagle3_layers_to_capture", None),
        ("get_embed_and_head",),
        ("set_embed_and_head", e, h),
        ("set_embed_and_head", e, h),
    ]


def test_methods_are_real_methods_of_the_class(patched_module):
    cls = patched_module.KimiK25ForConditionalGeneration
    for m in METHODS:
        assert m in cls.__dict__ and callable(cls.__dict__[m])
    assert "added by provision" in cls.get_embed_and_head.__doc__


@pytest.mark.parametrize("method,args", [
    ("set_eagle3_layers_to_capture", ([1],)),
    ("get_embed_and_head", ()),
    ("set_embed_and_head", (1, 2)),
])
def test_inner_without_the_method_raises_a_clear_attribute_error(patched_module, method, args):
    obj = make(patched_module, NoEagle())
    with pytest.raises(AttributeError) as info:
        getattr(obj, method)(*args)
    msg = str(info.value)
    assert msg == (f"KimiK25ForConditionalGeneration.language_model (NoEagle) has no {method}(); cannot delegate")


def test_errors_raised_by_the_inner_model_pass_through(patched_module):
    class Boom(Recorder):
        def get_embed_and_head(self):
            raise RuntimeError("inner failure")

    obj = make(patched_module, Boom())
    with pytest.raises(RuntimeError, match="inner failure"):
        obj.get_embed_and_head()


def test_wrong_arguments_fail_like_a_normal_method(patched_module):
    obj = make(patched_module, Recorder())
    with pytest.raises(TypeError):
        obj.set_embed_and_head(1)
    with pytest.raises(TypeError):
        obj.get_embed_and_head(1)


def test_0510_native_methods_behave_the_same(src_0510, stub_imports):
    mod = load(src_0510)
    inner = Recorder()
    obj = make(mod, inner)
    obj.set_eagle3_layers_to_capture([2])
    assert obj.get_embed_and_head() == (inner.embed, inner.head)
    with pytest.raises(AttributeError):
        make(mod, NoEagle()).get_embed_and_head()


def test_repaired_hand_patch_delegates(src_059, stub_imports):
    hand = src_059 + (
        "\n    def set_eagle3_layers_to_capture(self, layer_ids=None):\n"
        "        self.language_model.set_eagle3_layers_to_capture(layer_ids)\n"
    ).encode()
    r = engine.plan_patch(hand, KIMI_SPEC)
    assert r["verdict"] == "repaired"
    obj = make(load(r["new"]), Recorder())
    assert obj.set_eagle3_layers_to_capture([5]) == ("captured", [5])


def test_varied_signature_forwarding(stub_imports):
    spec = dict(KIMI_SPEC, methods=[{"name": "probe", "params": "self, a, /, b=2, *rest, c, d=4, **extra"}])
    src = (
        "from torch import nn\n\n\nclass KimiK25ForConditionalGeneration(nn.Module):\n"
        "    def __init__(self):\n        self.language_model = None\n"
    ).encode()
    mod = load(engine.plan_patch(src, spec)["new"])

    class Inner:
        def probe(self, a, /, b=2, *rest, c, d=4, **extra):
            return (a, b, rest, c, d, extra)

    obj = make(mod, Inner())
    assert obj.probe(1, c=3) == (1, 2, (), 3, 4, {})
    assert obj.probe(1, 5, 6, 7, c=3, d=9, z=0) == (1, 5, (6, 7), 3, 9, {"z": 0})
    assert obj.probe(1, b=8, c=3) == (1, 8, (), 3, 4, {})
