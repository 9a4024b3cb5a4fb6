"""vLLM as the second engine (issue 40): its answers to the interface, its profile checks, and its
start-up log read by its own reader (logs/vllmlog.py) from lines a real vLLM 0.32 server printed
(../shared/VLLM_NOTES.md; the real-vLLM tier reads a live one)."""

import dataclasses
import json

import pytest

from provision.config.profile import build_profile, render_flags, validate
from provision.errors import ConfigError
from provision.host import inference
from provision.logs import vllmlog
from provision.logs.readers import reader_for

VLLM = inference.get("vllm")
DRAFT = {"method": "eagle3", "model": "/data/models/draft", "num_speculative_tokens": 3}


def profile(**args):
    return build_profile({"engine": "vllm", "args": {"model": "/data/models/target", **args}}, "pb.yaml", "mine")


def test_vllm_says_its_own_start_command_install_and_endpoints():
    assert VLLM.start_argv("/opt/v/bin/python3", None, ["--model", "/m"]) == [
        "/opt/v/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    assert VLLM.package == "vllm" and VLLM.log_name(30000, "20261205-070000") == "vllm-30000-20261205-070000.log"
    assert VLLM.health_path == "/health" and VLLM.config_flag == "--config"
    assert VLLM.is_server(["/opt/v/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"])
    assert VLLM.is_server(["/opt/v/bin/vllm", "serve", "/m"])
    assert not VLLM.is_server(["bash", "-c", "python3 -m vllm.entrypoints.openai.api_server"])
    assert not inference.get("sglang").is_server(["python3", "-m", "vllm.entrypoints.openai.api_server"])
    assert VLLM.eagle3_methods == ("set_aux_hidden_state_layers", "get_eagle3_default_aux_hidden_state_layers")


def test_a_vllm_profile_renders_vllms_flags_mappings_as_one_json_token_and_lists_one_per_item():
    p = profile(**{"speculative-config": DRAFT, "tp": 2, "enforce-eager": True, "allowed-origins": ["a", "b"]})
    assert p.engine == "vllm" and p.module == "vllm.entrypoints.openai.api_server" and p.tp == 2
    flags = render_flags(p.args)
    assert flags[:2] == ["--model", "/data/models/target"]
    i = flags.index("--speculative-config")
    assert json.loads(flags[i + 1]) == DRAFT
    assert "--tensor-parallel-size" in flags and "--enforce-eager" in flags
    assert flags[flags.index("--allowed-origins"):][:3] == ["--allowed-origins", "a", "b"]
    assert flags[flags.index("--host") + 1] == "127.0.0.1" and flags[flags.index("--port") + 1] == "30000", \
        "vLLM's own defaults are every address and port 8000: provision says loopback and 30000"
    assert p.port == 30000 and profile(port=30001).port == 30001
    assert VLLM.draft_path(p.args) == "/data/models/draft"
    assert VLLM.draft_path({"speculative-config": json.dumps(DRAFT)}) == "/data/models/draft"
    assert VLLM.draft_path({}) is None
    validate(p)


@pytest.mark.parametrize("args, says", [
    ({"model": None}, "launch.args.model is required"),
    ({"speculative-config": "{not json"}, "speculative-config must be a mapping"),
    ({"speculative-config": {"method": "eagle3", "num_speculative_tokens": 3}}, "needs the drafter's `model`"),
    ({"tensor-parallel-size": "eight"}, "tensor-parallel-size must be a whole number"),
    ({"gpu-memory-utilization": 1.5}, r"gpu-memory-utilization must be in \(0, 1\]"),
])
def test_what_vllm_refuses_at_start_up_is_refused_before_a_host_is_touched(args, says):
    with pytest.raises(ConfigError, match=says):
        validate(profile(**args))


def test_an_sglang_flag_name_in_a_vllm_profile_is_not_taken_for_the_model():
    with pytest.raises(ConfigError, match="launch.args.model is required"):
        validate(build_profile({"engine": "vllm", "args": {"model-path": "/m"}}, "pb.yaml", "mine"))


# --------------------------------------------------------------------------- the log, as vLLM 0.32 wrote it

START = """\
(APIServer pid=2101) INFO 12-05 07:01:02 [api_utils.py:347] vLLM API server version 0.32.0
(APIServer pid=2101) INFO 12-05 07:01:02 [utils.py:253] non-default args: {'model': '/m/target', 'port': 30000}
(APIServer pid=2101) INFO 12-05 07:01:09 [model.py:733] Resolved architecture: LlamaForCausalLM
(APIServer pid=2101) INFO 12-05 07:01:10 [model.py:733] Resolved architecture: LlamaForCausalLMEagle3
(EngineCore pid=2190) INFO 12-05 07:01:21 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/m/target'
(Worker pid=2231) INFO 12-05 07:01:30 [cpu_model_runner.py:71] Starting to load model /m/target...
(Worker pid=2231) INFO 12-05 07:01:30 [default_loader.py:501] Loading weights took 0.01 seconds
(Worker pid=2231) INFO 12-05 07:01:30 [cpu_model_runner.py:80] Loading drafter model...
(Worker pid=2231) INFO 12-05 07:01:31 [eagle.py:1012] Sharing target model embedding weights with the draft model.
(EngineCore pid=2190) INFO 12-05 07:01:32 [kv_cache_utils.py:1087] CPU KV cache size: 1,048,576 tokens
(EngineCore pid=2190) INFO 12-05 07:01:40 [core.py:402] init engine (profile, create kv cache, warmup model) took 9.29 s
(APIServer pid=2101) INFO 12-05 07:01:41 [entry.py:140] Starting vLLM server on http://127.0.0.1:30000
(APIServer pid=2101) INFO:     Started server process [2101]
(APIServer pid=2101) INFO:     Waiting for application startup.
(APIServer pid=2101) INFO:     Application startup complete.
"""

CRASH = """\
(Worker pid=2231) INFO 12-05 07:01:30 [cpu_model_runner.py:71] Starting to load model /m/target...
(Worker pid=2231) INFO 12-05 07:01:30 [cpu_model_runner.py:80] Loading drafter model...
(EngineCore pid=2190) ERROR 12-05 07:01:33 [core.py:1010] EngineCore failed to start.
(EngineCore pid=2190) ERROR 12-05 07:01:33 [core.py:1010] Traceback (most recent call last):
(EngineCore pid=2190) ERROR 12-05 07:01:33 [core.py:1010]   File "/v/vllm/v1/engine/core.py", line 1000, in run_engine_core
(EngineCore pid=2190) ERROR 12-05 07:01:33 [core.py:1010]     engine_core = EngineCoreProc(*args, **kwargs)
(EngineCore pid=2190) ERROR 12-05 07:01:33 [core.py:1010] RuntimeError: Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested
(APIServer pid=2101) Traceback (most recent call last):
(APIServer pid=2101)   File "<frozen runpy>", line 198, in _run_module_as_main
(APIServer pid=2101) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}
"""


def _phases(text, chunk=None):
    log = vllmlog.LoadLog()
    seen = []
    pieces = [text] if chunk is None else [text[i:i + chunk] for i in range(0, len(text), chunk)]
    for piece in pieces:
        seen += [e.phase for e in log.feed(piece) if e.kind in ("phase", "ready")]
    log.flush()
    return log, seen


@pytest.mark.parametrize("chunk", [None, 7, 100])
def test_a_vllm_start_up_goes_through_its_phases_to_ready_in_any_chunking(chunk):
    log, seen = _phases(START, chunk)
    assert seen == ["target-weights", "draft-weights", "kv-cache", "cuda-graphs", "ready"]
    st = log.state
    assert st.ready and st.crashed is None and st.url == "http://127.0.0.1:30000"
    assert (st.target_class, st.draft_class) == ("LlamaForCausalLM", "LlamaForCausalLMEagle3")
    assert log.version == "0.32.0"


@pytest.mark.parametrize("chunk", [None, 13])
def test_the_missing_eagle3_interface_is_the_crash_not_the_engine_cores_summary(chunk):
    log, _ = _phases(CRASH, chunk)
    crash = log.state.crashed
    assert crash is not None and crash.kind == "missing-eagle3-method", crash
    assert "Model does not support EAGLE3 interface" in crash.summary
    assert reader_for("vllm").hint(crash) and "SupportsEagle3" in reader_for("vllm").hint(crash)


def test_the_proposers_image_token_index_read_is_its_own_crash_with_the_spec_that_fixes_it():
    text = CRASH.replace("RuntimeError: Model does not support EAGLE3 interface but aux_hidden_state_outputs was "
                         "requested", "AttributeError: 'KimiVLConfig' object has no attribute 'image_token_index'")
    crash = vllmlog.parse(text).crashed
    assert crash.kind == "missing-image-token" and "image_token_index" in crash.summary
    crash = dataclasses.replace(crash, class_name="KimiVLForConditionalGeneration")
    from provision.config.playbook import shipped_fixes

    h = vllmlog.hint(crash, "gpu01", shipped_fixes("vllm"))
    assert "spec kimi-vl-proposer-vllm" in h and "`provision patch --playbook kimi-vl-proposer-vllm --host gpu01`" in h
    other = vllmlog.hint(dataclasses.replace(crash, class_name="Qwen2VLForConditionalGeneration"), "gpu01",
                         shipped_fixes("vllm"))
    assert "no shipped spec" in other


def test_the_missing_interface_hint_names_the_shipped_spec_or_spec_new():
    from provision.config.playbook import shipped_fixes

    crash = dataclasses.replace(vllmlog.parse(CRASH).crashed, class_name="KimiVLForConditionalGeneration")
    h = vllmlog.hint(crash, "gpu01", shipped_fixes("vllm"))
    assert "spec kimi-vl-eagle3-vllm adds it: `provision patch --playbook kimi-vl-eagle3-vllm --host gpu01`" in h
    other = vllmlog.hint(dataclasses.replace(crash, class_name="Qwen2VLForConditionalGeneration"), "gpu01",
                         shipped_fixes("vllm"))
    assert "`provision spec new Qwen2VLForConditionalGeneration --engine vllm --host gpu01" in other


PLUGIN_FAILED = """\
(APIServer pid=2101) INFO 12-05 07:01:02 [api_utils.py:347] vLLM API server version 0.32.0
(APIServer pid=2101) ERROR 12-05 07:01:03 [__init__.py:75] Failed to load plugin provision_overlay
(APIServer pid=2101) ERROR 12-05 07:01:03 [__init__.py:75] Traceback (most recent call last):
(APIServer pid=2101) ERROR 12-05 07:01:03 [__init__.py:75]   File "/v/vllm/plugins/__init__.py", line 69, in load_plugins_by_group
(APIServer pid=2101) ERROR 12-05 07:01:03 [__init__.py:75]     func = plugin.load()
(APIServer pid=2101) ERROR 12-05 07:01:03 [__init__.py:75] ImportError: broken overlay
"""

REGISTER_FAILED = """\
(APIServer pid=2101) INFO 12-05 07:01:02 [api_utils.py:347] vLLM API server version 0.32.0
(APIServer pid=2101) Traceback (most recent call last):
(APIServer pid=2101)   File "/v/vllm/plugins/__init__.py", line 90, in load_general_plugins
(APIServer pid=2101)     func()
(APIServer pid=2101)   File "/var/lib/provision/overlay/ab12/provision_overlay/__init__.py", line 17, in register
(APIServer pid=2101)     importlib.import_module(name).apply()
(APIServer pid=2101) KeyError: 'load_model'
"""


@pytest.mark.parametrize("text, says", [(PLUGIN_FAILED, "could not load provision's overlay plugin"),
                                        (REGISTER_FAILED, "KeyError: 'load_model'")])
def test_the_overlay_plugin_failing_under_the_server_is_its_own_crash(text, says):
    """vLLM logs a plugin that does not import and goes on without it (the fix missing); a register()
    that raises kills the server: either way, with provision's overlay, the overlay is named."""
    log = vllmlog.LoadLog(overlay_package="provision_overlay")
    log.feed(text)
    log.flush()
    crash = log.state.crashed
    assert crash is not None and crash.kind == "overlay-import" and says in crash.summary, crash
    assert "`provision launch --patch --host gpu01`" in vllmlog.hint(crash, "gpu01")
    # without an overlay the same lines are another plugin's business: not this crash
    plain = vllmlog.parse(text).crashed
    assert plain is None or plain.kind != "overlay-import"


def test_an_error_while_it_shuts_down_after_serving_is_not_a_crash():
    text = START + """\
(APIServer pid=2101) INFO 12-05 07:05:00 [launcher.py:110] Shutting down FastAPI HTTP server.
(EngineCore pid=2190) ERROR 12-05 07:05:01 [core.py:1010] Traceback (most recent call last):
(EngineCore pid=2190) ERROR 12-05 07:05:01 [core.py:1010] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.
"""
    st = vllmlog.parse(text)
    assert st.crashed is None and st.phase == "ready"


def test_the_api_key_never_reaches_a_stored_line():
    text = "(APIServer pid=1) INFO 12-05 07:01:02 [utils.py:253] non-default args: {'api_key': 'sk-canary-9'}\n"
    log = vllmlog.LoadLog(secrets=["sk-canary-9"])
    log.feed(text)
    assert "sk-canary-9" not in "\n".join(log.tail()) + log.state.last_line


# --------------------------------------------------------------------------- logs a real vLLM 0.32.0 wrote here
# (tests/data/vllm: the CPU build serving the tiny models of provision/sandbox/vllm_models.py; its
# venv's path, the models' and HOME rewritten to what a host would have; the teardown's noise cut)

DATA = __import__("pathlib").Path(__file__).resolve().parents[1] / "data" / "vllm"


@pytest.mark.parametrize("chunk", [None, 61, 4096])
def test_a_real_start_serve_and_stop_is_ready_and_its_teardown_error_is_no_crash(chunk):
    log, seen = _phases((DATA / "0.32.0-eagle3-start-serve-stop.log").read_text(), chunk)
    assert seen == ["target-weights", "draft-weights", "kv-cache", "cuda-graphs", "ready"]
    st = log.state
    assert st.crashed is None, st.crashed  # EngineDeadError after SIGINT: teardown, not a crash
    assert st.phase == "ready" and st.url == "http://127.0.0.1:18123" and log.version == "0.32.0"
    assert (st.target_class, st.draft_class) == ("LlamaForCausalLM", "LlamaForCausalLMEagle3")
    assert st.target.shards_total == 1 and st.draft.percent == 100.0


@pytest.mark.parametrize("chunk", [None, 97])
def test_a_real_drafter_that_does_not_fit_is_the_workers_own_sentence(chunk):
    log, seen = _phases((DATA / "0.32.0-draft-shape-crash.log").read_text(), chunk)
    crash = log.state.crashed
    assert crash is not None and crash.kind == "exception"
    assert crash.summary.startswith("AssertionError: Tried to load weights of size torch.Size([128, 512])"), crash
    assert "draft-weights" in seen and "ready" not in seen


def test_vllm_is_ready_only_once_its_models_route_names_the_profiles_model():
    listing = json.dumps({"object": "list", "data": [{"id": "/data/models/target", "root": "/data/models/target"}]})
    assert VLLM.serves(listing.encode(), {"model": "/data/models/target"})
    assert not VLLM.serves(listing.encode(), {"model": "/data/models/other"})
    assert VLLM.serves(json.dumps({"data": [{"id": "kimi"}]}).encode(), {"model": "/m", "served-model-name": ["kimi"]})
    assert not VLLM.serves(b"<html>", {"model": "/m"}) and not VLLM.serves(b'{"data": []}', {"model": "/m"})
    assert inference.get("sglang").serves_path == "" and VLLM.serves_path == "/v1/models"


def test_a_container_images_probe_asks_for_the_engines_package(tmp_path):
    """What runs inside an image (`python3 -I -S -c SCRIPT '[]' FILES`): with vLLM's package it
    finds vLLM and its version, not the SGLang beside it. Run here by this machine's python3 over
    a tree laid out as an image's site-packages (the image's own interpreter runs the same text)."""
    import subprocess
    import sys

    from provision.host.ops.container import image_probe_script

    site = tmp_path / "site"
    for pkg, version in (("vllm", "0.32.0"), ("sglang", "0.5.9")):
        (site / pkg).mkdir(parents=True)
        (site / pkg / "__init__.py").write_text("")
        (site / f"{pkg}-{version}.dist-info").mkdir()
        (site / f"{pkg}-{version}.dist-info" / "METADATA").write_text(f"Name: {pkg}\nVersion: {version}\n")
    (site / "vllm" / "model_executor").mkdir()
    (site / "vllm" / "model_executor" / "x.py").write_text("X = 1\n")
    found = {}
    for pkg in ("vllm", "sglang"):
        p = subprocess.run([sys.executable, "-I", "-S", "-c", image_probe_script(pkg), json.dumps([str(site)]),
                            json.dumps(["model_executor/x.py"] if pkg == "vllm" else [])],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        found[pkg] = json.loads(p.stdout.strip().splitlines()[-1])
    assert found["vllm"]["package"] == str(site / "vllm") and found["vllm"]["dist_version"] == "0.32.0"
    assert set(found["vllm"]["files"]) == {"model_executor/x.py"}
    assert found["sglang"]["package"] == str(site / "sglang") and found["sglang"]["dist_version"] == "0.5.9"


def test_preflight_warns_when_an_eagle3_drafter_names_no_auxiliary_layers(tmp_path):
    """vLLM then reads layers (2, n//2, n-3) without a word (vllm#50170): preflight says so, with the
    layers of this target; a drafter that names its layers, or SGLang, gets no such row."""
    from provision.host.ops.preflight_model import model_checks

    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir()
    draft.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"],
                                                    "num_hidden_layers": 61}))
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1}
    (draft / "config.json").write_text(json.dumps(cfg))

    def rows(engine, args):
        req = {"engine": engine, "state_dir": str(tmp_path / "state"), "profile": {"engine": engine, "args": args}}
        return [r for r in model_checks(req, str(tmp_path / "no-install"), "0.32.0", {}, mode="edit")
                if r["check"] == "drafter" and "eagle_aux_hidden_state_layer_ids" in r["message"]]

    vargs = {"model": str(target), "speculative-config": {"method": "eagle3", "model": str(draft)}}
    (row,) = rows("vllm", vargs)
    assert row["level"] == "warn" and "(2, 30, 58)" in row["message"] and str(draft) in row["message"]
    sargs = {"model-path": str(target), "speculative-algorithm": "EAGLE3", "speculative-draft-model-path": str(draft)}
    assert rows("sglang", sargs) == []
    (draft / "config.json").write_text(json.dumps(dict(cfg, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 29, 57]})))
    assert rows("vllm", vargs) == []


def test_the_shipped_vllm_playbook_is_the_published_recipe_and_passes_vllms_checks():
    from provision.config.inventory import Host
    from provision.config.profile import host_profile

    p = host_profile(Host("h1"), "kimi-k25-eagle3-vllm")[0]
    assert p.engine == "vllm" and p.tp == 8 and VLLM.check_args(p.args) == []
    flags = render_flags(p.args)
    conf = json.loads(flags[flags.index("--speculative-config") + 1])
    assert conf == {"method": "eagle3", "model": "AQ-MedAI/Kimi-K25-eagle3", "num_speculative_tokens": 3}
    assert flags[:2] == ["--model", "moonshotai/Kimi-K2.5"] and "--trust-remote-code" in flags
