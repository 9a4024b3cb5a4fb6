"""Fixtures for the engine tests: the real SGLang 0.5.9 / 0.5.10 model files
(read from the cached wheels, never copied into the repo) and small helpers."""

from __future__ import annotations

import ast
import copy
import os
from pathlib import Path

import pytest

KIMI_SPEC = {
    "name": "kimi-k25-eagle3",
    "file": "srt/models/kimi_k25.py",
    "class": "KimiK25ForConditionalGeneration",
    "delegate": "language_model",
    "methods": [
        {"name": "set_eagle3_layers_to_capture", "params": "self, layer_ids=None"},
        {"name": "get_embed_and_head", "params": "self"},
        {"name": "set_embed_and_head", "params": "self, embed, head"},
    ],
}
METHODS = [m["name"] for m in KIMI_SPEC["methods"]]


def _sglang_dir(version: str) -> Path:
    from provision.sandbox.wheels import WheelUnavailable, extracted
    try:
        return extracted(version) / "sglang"
    except WheelUnavailable as exc:  # pragma: no cover - depends on the network
        pytest.skip(f"SGLang {version} wheel unavailable: {exc}")


@pytest.fixture
def spec() -> dict:
    return copy.deepcopy(KIMI_SPEC)


@pytest.fixture(scope="session")
def sglang_059() -> Path:
    return _sglang_dir("0.5.9")


@pytest.fixture(scope="session")
def sglang_0510() -> Path:
    return _sglang_dir("0.5.10")


@pytest.fixture(scope="session")
def src_059(sglang_059) -> bytes:
    return (sglang_059 / "srt" / "models" / "kimi_k25.py").read_bytes()


@pytest.fixture(scope="session")
def src_0510(sglang_0510) -> bytes:
    return (sglang_0510 / "srt" / "models" / "kimi_k25.py").read_bytes()


@pytest.fixture(scope="session")
def resolver_059(sglang_059):
    from provision.host.lib.modules import make_resolver
    return make_resolver(str(sglang_059))


@pytest.fixture(scope="session")
def resolver_0510(sglang_0510):
    from provision.host.lib.modules import make_resolver
    return make_resolver(str(sglang_0510))


# ----------------------------------------------------------------- helpers (import from here)

def class_node(source: bytes | str, name: str = KIMI_SPEC["class"]) -> ast.ClassDef:
    text = source.decode("utf-8") if isinstance(source, bytes) else source
    tree = ast.parse(text)
    hits = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert len(hits) == 1, f"expected one class {name}, found {len(hits)}"
    return hits[0]


def method_names(source: bytes | str, name: str = KIMI_SPEC["class"]) -> list[str]:
    """Names of the functions defined directly in the class body, in order."""
    return [n.name for n in class_node(source, name).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def module_level_defs(source: bytes) -> list[str]:
    return [n.name for n in ast.parse(source.decode("utf-8")).body if isinstance(n, ast.FunctionDef)]


def inserted_chunk(old: bytes, new: bytes) -> tuple[int, bytes]:
    """Assert `new` is `old` with exactly one contiguous insertion; return (offset, inserted bytes)."""
    i = 0
    n = min(len(old), len(new))
    while i < n and old[i] == new[i]:
        i += 1
    extra = len(new) - len(old)
    assert extra > 0, "new is not longer than old"
    assert new[:i] + new[i + extra:] == old, "new is not old plus one insertion"
    return i, new[i:i + extra]


def write_tree(root: Path, files: dict[str, str]) -> None:
    """Write {"sglang/srt/models/x.py": text} under root (creating __init__.py files)."""
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        d = p.parent
        while d != root and d.is_relative_to(root):
            init = d / "__init__.py"
            if not init.exists():
                init.write_text("")
            d = d.parent
        p.write_text(text)


def tree_resolver(root: Path):
    from provision.host.lib.modules import make_resolver
    return make_resolver(os.fspath(root / "sglang"))


@pytest.fixture(scope="session")
def sglang_0523() -> Path:
    """The latest release (cp311 wheels; only its .py files are unpacked)."""
    return _sglang_dir("0.5.23")
