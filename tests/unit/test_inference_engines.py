"""The inference engines behind one interface (provision/host/inference): picked once from a
profile's `launch.engine`, SGLang the first implementation, an unknown engine refused with a
sentence that names the ones provision knows (issue 39)."""

import subprocess
import sys

import pytest

from provision.config.playbook import load_playbook
from provision.config.profile import build_profile, from_record
from provision.errors import ConfigError
from provision.host import inference
from provision.logs.readers import reader_for


def base():
    pb = load_playbook(None)
    return dict(pb.launch), pb.path


def test_the_default_engine_is_sglang_and_says_what_provision_always_did():
    e = inference.get(inference.DEFAULT)  # a playbook that names no engine is SGLang's
    assert e is inference.get("sglang") and e.name == "sglang" and e.title == "SGLang"
    assert e.start_argv("/opt/venv/bin/python3", None, ["--tp-size", 8]) == [
        "/opt/venv/bin/python3", "-m", "sglang.launch_server", "--tp-size", "8"]
    assert e.start_argv("python3", "my.launcher", []) == ["python3", "-m", "my.launcher"]
    assert e.log_name(30000, "20261205-031500") == "sglang-30000-20261205-031500.log"
    assert e.log_name(30000, "20261205-031500", 2) == "sglang-30000-20261205-031500-2.log"
    assert e.config_flag == "--config" and e.health_path == "/health" and e.generate_path == "/generate"
    assert e.server_info_paths == ("/server_info", "/get_server_info")
    assert e.overlay_env == "SGLANG_EXTERNAL_MODEL_PACKAGE"
    assert e.eagle3_methods == ("set_eagle3_layers_to_capture", "get_embed_and_head")
    assert e.source_files("/nonexistent/sglang")["server_args"] == "/nonexistent/sglang/srt/server_args.py"
    assert e.is_server(["python3", "-m", "sglang.launch_server", "--port", "30000"])
    assert not e.is_server(["bash", "-c", "python3 -m sglang.launch_server"])


@pytest.mark.parametrize("name", ["tgi", "SGLang", "vLLM", "", 3])
def test_an_engine_provision_does_not_know_is_refused_with_the_ones_it_knows(name):
    with pytest.raises(inference.UnknownEngine, match=r"is not one provision knows: sglang, vllm"):
        inference.get(name)


def test_a_profile_names_its_engine_and_an_unknown_one_is_a_config_error():
    launch, path = base()
    assert build_profile(launch, path, "kimi").engine == "sglang"
    assert build_profile(dict(launch, engine="sglang"), path, "kimi").module == "sglang.launch_server"
    with pytest.raises(ConfigError, match=r"launch.engine: engine 'tgi' is not one provision knows: sglang, vllm"):
        build_profile(dict(launch, engine="tgi"), path, "kimi")


def test_naming_the_default_engine_changes_no_digest_and_the_record_replays_it():
    launch, path = base()
    implicit, explicit = build_profile(launch, path, "kimi"), build_profile(dict(launch, engine="sglang"), path, "kimi")
    assert implicit.digest() == explicit.digest()
    kept = implicit.to_launch()
    assert kept["engine"] == "sglang"
    again = from_record(kept, "kimi", "the record")
    assert again.engine == "sglang" and again.digest() == implicit.digest()


def test_every_engine_provision_knows_has_a_log_reader():
    for name in inference.KNOWN:
        assert hasattr(reader_for(name), "LoadLog")


def test_the_engines_package_loads_no_implementation_until_one_is_asked_for():
    """The hot path stays light: importing the interface (as config/profile.py does) imports no engine."""
    code = ("import sys, provision.host.inference as i; assert 'provision.host.inference.sglang' not in sys.modules; "
            "i.get('sglang'); assert 'provision.host.inference.sglang' in sys.modules; "
            "assert 'provision.host.inference.vllm' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_each_engines_package_is_said_equal_in_the_picker_and_its_implementation():
    assert set(inference.PACKAGES) == set(inference.KNOWN)
    for name in inference.KNOWN:
        assert inference.PACKAGES[name] == inference.get(name).package


def test_a_request_names_its_engine_by_itself_its_profile_or_its_specs_package():
    assert inference.of_request({"engine": "sglang"}) == "sglang"
    assert inference.of_request({"profile": {"engine": "sglang"}}) == "sglang"
    assert inference.of_request({"spec": {"package": "sglang"}}) == "sglang"
    assert inference.of_request({"specs": [{"package": "flashinfer"}, {"package": "sglang"}]}) == "sglang"
    # a spec of another package (flashinfer) names no engine: the default's install is the one
    assert inference.of_request({"specs": [{"package": "flashinfer"}]}) is None
    assert inference.of_request({}) is None and inference.of_request(None) is None


def _playbook(tmp_path, text):
    from provision.config.playbook import parse_playbook

    return parse_playbook(text, str(tmp_path / "pb.yaml"))


PATCH = """patch:
  file: srt/models/kimi_k25.py
  class: KimiK25ForConditionalGeneration
  delegate: language_model
  methods: [{name: get_embed_and_head, params: self}]
"""


def test_a_playbook_names_its_engine_once_for_both_halves(tmp_path):
    pb = _playbook(tmp_path, "name: mine\nengine: sglang\n" + PATCH + "launch:\n  args: {model-path: /m}\n")
    assert pb.patch.package == "sglang" and pb.launch["engine"] == "sglang"
    plain = _playbook(tmp_path, "name: mine\n" + PATCH)
    assert pb.patch.sha == plain.patch.sha, "naming the default engine changes no spec's sha"
    assert build_profile(pb.launch, pb.path, pb.name).engine == "sglang"


def test_a_playbooks_unknown_or_disagreeing_engine_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"engine: engine 'vllm2' is not one provision knows: sglang, vllm"):
        _playbook(tmp_path, "name: mine\nengine: vllm2\n" + PATCH)
    with pytest.raises(ConfigError, match="disagrees with the playbook's engine"):
        _playbook(tmp_path, "name: mine\nengine: sglang\nlaunch:\n  engine: other\n  args: {model-path: /m}\n")
