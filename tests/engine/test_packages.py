"""facts/packages.py: a spec's `package:` found on the search path of the interpreter that owns
the SGLang install, with the version of the dist-info that installed it (real flashinfer-python
0.6.3 metadata from its wheel)."""

from __future__ import annotations

import os

import pytest

from provision.host.facts import packages


@pytest.fixture(scope="module")
def flashinfer_063():
    from provision.sandbox.wheels import FLASHINFER, WheelUnavailable, extracted
    try:
        return extracted("0.6.3", FLASHINFER)
    except WheelUnavailable as exc:  # pragma: no cover - depends on the network
        pytest.skip(str(exc))


def _site(tmp_path, name, unpacked):
    site = tmp_path / name / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    for entry in unpacked.iterdir():
        if entry.name.startswith("flashinfer"):
            os.symlink(entry, site / entry.name)
    return site


def test_found_on_the_owning_interpreters_path_with_its_version(tmp_path, flashinfer_063):
    first = tmp_path / "empty"
    first.mkdir()
    site = _site(tmp_path, "venv", flashinfer_063)
    inst = {"path": "/x/sglang", "interpreters": ["/venv/bin/python3"], "search_path": [str(first), str(site)],
            "version": "0.5.9"}
    info = packages.locate(inst, "flashinfer")
    assert info["dir"] == os.path.realpath(site / "flashinfer") and info["version"] == "0.6.3"
    assert info["dist_info"].endswith("flashinfer_python-0.6.3.dist-info") and info["error"] is None
    path, _ = packages.spec_file(inst, {"file": "jit/comm.py", "package": "flashinfer"})
    assert path == os.path.join(info["dir"], "jit", "comm.py") and os.path.isfile(path)
    # sglang is the install itself
    assert packages.locate(inst, "sglang") == {"name": "sglang", "dir": "/x/sglang", "version": "0.5.9",
                                               "dist_info": None, "error": None}


def test_another_interpreters_package_is_not_used(tmp_path, flashinfer_063):
    other = _site(tmp_path, "other-venv", flashinfer_063)
    mine = tmp_path / "venv" / "site-packages"
    mine.mkdir(parents=True)
    inst = {"path": str(tmp_path / "venv" / "site-packages" / "sglang"), "interpreters": ["/venv/bin/python3"],
            "search_path": [str(mine)]}
    info = packages.locate(inst, "flashinfer")
    assert info["dir"] is None and info["error"]["kind"] == "package-missing"
    assert info["error"]["message"] == f"package flashinfer is not installed for /venv/bin/python3 (looked in: {mine})"
    assert str(other) not in info["error"]["message"]


def test_wanted_names_come_from_the_specs():
    specs = [{"package": "flashinfer", "applies": {"sglang": ">=0.5", "torch": ">=2", "gpu_capability": ["12.0"]}},
             {"file": "x.py"}]
    assert packages.wanted(specs, ["triton"]) == ["flashinfer", "sglang", "torch", "triton"]
