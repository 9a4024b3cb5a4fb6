"""`applies:` (config/applies.py) and the nvidia-smi reader (host/facts/gpu.py): pure functions."""

from __future__ import annotations

import pytest

from provision.config.applies import HostView, decide, needs_host, normalise_capability, packages_named, parse_applies
from provision.errors import ConfigError
from provision.host.facts.gpu import parse_compute_cap


def test_parse_normalises_and_validates():
    got = parse_applies({"sglang": " >=0.5.6,<0.5.14 ", "flashinfer": "<0.7", "gpu_capability": 12.0}, "f: applies")
    assert got == {"sglang": ">=0.5.6,<0.5.14", "flashinfer": "<0.7", "gpu_capability": ["12.0"]}
    assert parse_applies({"gpu_capability": ["12.0", "12.1", 10]}, "w")["gpu_capability"] == ["12.0", "12.1", "10.0"]
    assert parse_applies(None, "w") is None
    assert packages_named(got) == ["flashinfer"]


@pytest.mark.parametrize("data, words", [
    ({"sglang": "0.5.9"}, "not a version specifier"),          # a bare version is not a specifier
    ({"sglang": ">=banana"}, "not a version specifier"),
    ({"sglang": 5}, "expected a version specifier string"),
    ({"sglang": ""}, "expected a version specifier string"),
    ({"gpu_capability": "sm120"}, "MAJOR.MINOR"),
    ({"gpu_capability": []}, "at least one"),
    ({"gpu_capability": True}, "compute capability"),
    ({"not a name!": ">=1"}, "not a package name"),
    ({}, "expected a mapping"),
    (["sglang"], "expected a mapping"),
])
def test_parse_refuses_with_the_place(data, words):
    with pytest.raises(ConfigError) as exc:
        parse_applies(data, "x.yaml: patch.applies")
    assert words in exc.value.message and exc.value.message.startswith("x.yaml: patch.applies")


def test_capability_forms():
    assert normalise_capability("12.0", "w") == "12.0"
    assert normalise_capability(" 9.0 ", "w") == "9.0"
    assert normalise_capability(12, "w") == "12.0"
    assert normalise_capability("08.09", "w") == "8.9"
    for bad in ("12", "12.0.1", "", "x.y", None):
        with pytest.raises(ConfigError):
            normalise_capability(bad, "w")


SYMM = {"sglang": ">=0.5.6", "gpu_capability": ["12.0"]}
FUSION = {"flashinfer": "<0.7", "gpu_capability": ["12.0"]}


@pytest.mark.parametrize("applies, view, ok, words", [
    (None, HostView(), True, "no applies"),
    (SYMM, HostView(sglang="0.5.9", gpu=("12.0",)), True, "GPU 12.0"),
    (SYMM, HostView(sglang="0.5.23", gpu=("12.0",)), True, "SGLang 0.5.23 >=0.5.6"),
    (SYMM, HostView(sglang="0.5.5.post3", gpu=("12.0",)), False, "SGLang 0.5.5.post3 is outside >=0.5.6"),
    (SYMM, HostView(sglang="0.5.10rc1", gpu=("12.0",)), True, "0.5.10rc1"),   # pre-releases count
    (SYMM, HostView(sglang=None, gpu=("12.0",)), False, "SGLang is not installed"),
    (SYMM, HostView(sglang="main", gpu=("12.0",)), False, "not a PEP 440 version"),
    (SYMM, HostView(sglang="0.5.9", gpu=(), gpu_unknown="no nvidia-smi on the host"), False,
     "GPU compute capability unknown (no nvidia-smi on the host)"),
    (SYMM, HostView(sglang="0.5.9", gpu=("9.0",)), False, "9.0 (nvidia-smi) is not 12.0"),
    (SYMM, HostView(sglang="0.5.9", gpu=("9.0", "12.0")), True, "GPU 12.0"),   # any GPU of the host
    (FUSION, HostView(sglang="0.5.9", packages={"flashinfer": "0.6.3"}, gpu=("12.0",)), True, "flashinfer 0.6.3 <0.7"),
    (FUSION, HostView(sglang="0.5.23", packages={"flashinfer": "0.7.2"}, gpu=("12.0",)), False,
     "flashinfer 0.7.2 is outside <0.7"),
    (FUSION, HostView(sglang="0.5.9", packages={"flashinfer": None}, gpu=("12.0",)), False,
     "flashinfer is not installed beside this SGLang"),
    (FUSION, HostView(sglang="0.5.9", packages={}, gpu=("12.0",)), False, "did not report flashinfer"),
    (FUSION, HostView(sglang="0.5.9", packages={"flashinfer": "0.6.3"}, gpu=("12.0",), gpu_source="--gpu-capability"),
     True, "GPU 12.0 (--gpu-capability)"),
])
def test_decide(applies, view, ok, words):
    got, why = decide(applies, view)
    assert got is ok and words in why, why


def test_needs_host():
    assert not needs_host(None, False)
    assert needs_host({"gpu_capability": ["12.0"]}, gpu_given=False)
    assert not needs_host({"gpu_capability": ["12.0"]}, gpu_given=True)
    assert needs_host({"sglang": ">=0.5.6", "gpu_capability": ["12.0"]}, gpu_given=True)


@pytest.mark.parametrize("out, caps, why", [
    ("12.0\n12.0\n12.0\n12.0\n12.0\n12.0\n12.0\n12.0\n", ["12.0"], None),
    ("9.0\n12.0\n", ["9.0", "12.0"], None),
    (" 8.9 \r\n", ["8.9"], None),
    ("", [], "listed no GPU"),
    ("\n\n", [], "listed no GPU"),
    ('Field "compute_cap" is not a valid field to query.\n', [], "not a compute capability"),
    ("[N/A]\n", [], "not a compute capability"),
])
def test_parse_compute_cap(out, caps, why):
    got, reason = parse_compute_cap(out)
    assert got == caps
    assert (reason is None) if why is None else (why in reason)
