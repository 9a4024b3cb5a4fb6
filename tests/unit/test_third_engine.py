"""A third inference engine is one module and one `inference.register` line (issue 58): a fake
engine, written here as a module of its own with its readers named in it as data, is then found by
every verb that asks an engine, one test per member of the interface.

The fake is "tgi", whose installs are the Python package `fakegen`: nothing of SGLang or vLLM
is touched, and no table outside its module names it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from provision.host import inference

ROOT = Path(__file__).resolve().parents[2]

ENGINE_MODULE = '''
"""A fake third engine, for the test: data and pure functions, as the shipped engines are."""
import os
from provision.host.inference.base import InferenceEngine

SEEN = []  # what its readers were asked, for the test to look at


def read_flags(src):
    SEEN.append(("flags", src["server_args"]))
    return {"--max-batch": {"default": 8}}, None


def read_registry(install_dir, engine, state_dir=None):  # state_dir: where a reader may keep what it read
    SEEN.append(("registry", install_dir))
    return {"FakeForCausalLM": {"missing": [], "getattr": False}}, None


def audit(engine, package_dir):
    SEEN.append(("audit", package_dir))
    return {"wrappers": [], "engine": engine.name, "read": package_dir}


class LoadLog:
    def __init__(self, secrets=None, overlay_package=None):
        self.secrets = secrets


def hint(crash, selector, shipped):
    return "fakegen hint"


class TGI(InferenceEngine):
    name = "tgi"
    title = "FakeGen"
    package = "fakegen"
    install_marks = ("models",)
    launch_module = "fakegen.serve"
    models_subdir = "models"
    flag_reader = "tgi_fake_engine:read_flags"
    registry_reader = "tgi_fake_engine:read_registry"
    audit_reader = "tgi_fake_engine:audit"
    log_reader = "tgi_fake_engine"
    spec_file_example = "models/x.py"
    eagle3_methods = ("fake_eagle3",)

    def source_files(self, install_dir):
        return {"server_args": os.path.join(install_dir, "args.py"), "fields": {}, "choices": None, "models": []}

    def is_server(self, argv):
        return bool(argv) and argv[0].split()[0] == "fakegen-serve"

    def may_be_server(self, raw):
        return b"fakegen-serve" in raw

    def is_orphan_worker(self, argv, comm):
        return comm.startswith("FAKEGEN::")


ENGINE = TGI()
'''


@pytest.fixture
def tgi(tmp_path, monkeypatch):
    """The fake engine registered (its module on sys.path), and unregistered afterwards."""
    (tmp_path / "tgi_fake_engine.py").write_text(ENGINE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(inference, "_MODULES", dict(inference._MODULES))
    monkeypatch.setattr(inference, "PACKAGES", dict(inference.PACKAGES))
    monkeypatch.setattr(inference, "KNOWN", inference.KNOWN)
    inference.register("tgi", "tgi_fake_engine", "fakegen")
    mod = __import__("tgi_fake_engine")
    mod.SEEN.clear()
    yield mod
    sys.modules.pop("tgi_fake_engine", None)


def install(tmp_path):
    """A fake install of it: the package directory with its marks."""
    pkg = tmp_path / "site" / "fakegen"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '1.0'\n")
    (pkg / "args.py").write_text("# flags\n")
    return pkg


def test_it_is_known_by_name_by_package_and_by_a_request(tgi):
    e = inference.get("tgi")
    assert e.title == "FakeGen" and "tgi" in inference.KNOWN and e in inference.engines()
    assert inference.of_package("fakegen") == "tgi"
    assert inference.of_request({"spec": {"package": "fakegen", "file": "models/x.py"}}) == "tgi"
    assert inference.for_request({"profile": {"engine": "tgi"}}) is e
    assert inference.refusal("tgi") is None


def test_a_profile_may_name_it(tgi):
    from provision.config.playbook import load_playbook
    from provision.config.profile import build_profile

    pb = load_playbook(None)
    launch = {k: v for k, v in pb.launch.items() if k not in ("module", "args")}
    prof = build_profile(dict(launch, engine="tgi", args={"model-path": "/m"}), pb.path, "fake")
    assert prof.engine == "tgi" and prof.module == "fakegen.serve"


def test_follow_reads_its_log_with_its_own_reader(tgi):
    from provision.logs.readers import reader_for

    assert reader_for("tgi") is tgi and reader_for("tgi").hint(None, "h", None) == "fakegen hint"


def test_preflight_reads_its_flags_and_registry_with_its_own_readers(tgi, tmp_path):
    from provision.host.ops import preflight_model

    pkg = install(tmp_path)
    tables = preflight_model.install_tables(str(pkg), str(tmp_path / "state"), "tgi")
    assert tables["flags"] == {"--max-batch": {"default": 8}}
    assert set(tables["registry"]) == {"FakeForCausalLM"}
    assert ("flags", str(pkg / "args.py")) in tgi.SEEN and ("registry", str(pkg)) in tgi.SEEN


def test_the_audit_verb_runs_its_own_auditor(tgi, tmp_path):
    from provision.host.ops.audit import op_audit

    pkg = install(tmp_path)
    ans = op_audit({"op": "audit", "engine": "tgi", "install_path": str(pkg)}, b"")
    assert ans["ok"], ans
    assert ans["audit"] == {"wrappers": [], "engine": "tgi", "read": str(pkg)}


def test_discovery_finds_its_install_and_names_it(tgi, tmp_path):
    from provision.host.facts import installs

    pkg = install(tmp_path)
    facts = installs.discover(pinned=str(pkg), engine="tgi")
    assert facts["chosen"] == str(pkg) and installs.chosen_install(facts)["engine"] == "tgi"
    missing = installs.discover(pinned=str(tmp_path), engine="tgi")
    assert "not a fakegen package directory" in missing["error"]["message"]


def test_a_request_that_names_no_engine_is_given_the_hosts_install(tgi, tmp_path, monkeypatch):
    """The agent resolves the engine once, on entry: a status of a host whose only install is the
    fake engine's is that engine's."""
    from provision.host import agent
    from provision.host.facts import installs

    monkeypatch.setattr(inference, "KNOWN", ("tgi",) + tuple(n for n in inference.KNOWN if n != "tgi"))
    pkg = install(tmp_path)
    req = agent.resolve_engine({"op": "status", "install_path": str(pkg)})
    assert req["engine"] == "tgi"
    assert installs.installed_engine({"install_path": str(pkg)}) == "tgi"
    assert agent.resolve_engine({"op": "probe", "port": 1}) == {"op": "probe", "port": 1}  # a record says


def test_its_server_processes_are_found_by_its_own_rule(tgi):
    from provision.host.facts import containers, installs

    proc = subprocess.Popen(["bash", "-c", "exec -a fakegen-serve sleep 30"])
    try:
        deadline = time.monotonic() + 10
        found: list = []
        while time.monotonic() < deadline and not found:
            found = [s for s in installs.running_servers(inference.get("tgi")) if s["pid"] == proc.pid]
            time.sleep(0.05)
        assert found, "the fake engine's server was not found by its is_server rule"
        assert not [s for s in installs.running_servers(inference.get("sglang")) if s["pid"] == proc.pid]
        assert containers._is_server(["fakegen-serve"])  # any engine's server, for the container listing
        from provision.host.facts.servers import _server_candidates
        assert proc.pid in _server_candidates(inference.get("tgi"))
    finally:
        proc.kill()
        proc.wait()


def test_preflights_orphan_check_asks_its_rule(tgi):
    e = inference.get("tgi")
    assert e.is_orphan_worker([], "FAKEGEN::worker") and not e.is_orphan_worker(["sglang::scheduler"], "sglang::x")
    assert not inference.get("sglang").is_orphan_worker([], "FAKEGEN::worker")


def test_a_spec_of_its_files_is_validated_with_its_example_and_can_be_an_overlay(tgi):
    from provision.host.engine import overlay as render
    from provision.host.engine.spec import EngineError, validate_spec

    with pytest.raises(EngineError, match=r"like models/x.py inside the fakegen package"):
        validate_spec({"name": "x", "kind": "replace", "package": "fakegen", "file": "/abs.py",
                       "scope": "f", "old": "a", "new": "b"})
    assert render.is_overlayable({"name": "x", "kind": "delegate", "package": "fakegen", "file": "models/x.py"})


def test_the_server_start_uses_its_command_and_log_name(tgi):
    e = inference.get("tgi")
    assert e.start_argv("/py", None, ["--port", 1]) == ["/py", "-m", "fakegen.serve", "--port", "1"]
    assert e.log_name(8080, "20261206-000000") == "tgi-8080-20261206-000000.log"
    from provision.host.ops.backends import systemd, transient

    assert systemd.unit_name(8080, "tgi") == "provision-tgi-8080.service"
    assert transient.unit_name(8080, 1, "tgi").startswith("provision-tgi-8080")


def test_no_engine_is_a_sentence_never_sglang(tgi):
    with pytest.raises(inference.UnknownEngine, match="names no inference engine"):
        inference.for_request({"op": "audit"})
    with pytest.raises(inference.UnknownEngine, match="is not one provision knows: sglang, vllm, tgi"):
        inference.get(None)  # type: ignore[arg-type]


def test_the_module_says_nothing_of_the_others():
    """The registry is data: the fake's module names no other engine, and nothing outside
    host/inference and the sandbox compares an engine's name (the issue's grep, as a test)."""
    out = subprocess.run(["grep", "-rnE", r"""(==|!=) ?["'](sglang|vllm)["']""", "provision/",
                          "--include=*.py"], capture_output=True, text=True, cwd=ROOT)
    lines = [ln for ln in out.stdout.splitlines()
             if not ln.startswith(("provision/host/inference/", "provision/sandbox/", "provision/config/"))]
    assert lines == []
    out = subprocess.run(["grep", "-rn", "inference.get()", "provision/"], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout == ""
    assert textwrap.dedent(ENGINE_MODULE).count("sglang") == 0
