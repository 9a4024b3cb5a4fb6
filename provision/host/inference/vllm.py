"""vLLM, the second inference engine behind the one interface (base.py).  STDLIB ONLY.

Facts read from vLLM's released wheels (0.16-0.34) and a real server on a CPU build (0.32):
``python -m vllm.entrypoints.openai.api_server`` (the same server as ``vllm serve``), flags
generated from its config dataclasses (``vllm/engine/arg_utils.py``) and the frontend's
(``vllm/entrypoints/openai/cli_args.py``); ``--config FILE`` takes a YAML file of flags, so the
API key reaches it as SGLang's does, from a 0600 file, never the command line; ``/health``; the
OpenAI routes (``/v1/models``, ``/v1/completions``). Its EAGLE-3 interface is the runtime-checkable
``SupportsEagle3`` protocol of ``model_executor/models/interfaces.py``; model classes live in
``model_executor/models/``. Its extra model classes come from ``vllm.general_plugins`` entry
points (every one found on sys.path, or those ``VLLM_PLUGINS`` lists when it is set), whose
``register()`` may replace an architecture's class with ``ModelRegistry.register_model(arch,
"module:Class")``, loaded in every process (API server, engine core, workers): the overlay.
"""

from __future__ import annotations

import glob
import json
import os
import re

from provision.host.inference.base import OWN_PARSER, InferenceEngine


def is_vllm_server(argv: list[str]) -> bool:
    """Is this command line a vLLM server's main process (``python -m
    vllm.entrypoints.openai.api_server`` or ``vllm serve``)? Read by whole arguments, so a shell
    naming it in a ``-c`` string is not the server; a rewritten title is read by its words. Pure."""
    argv = (argv[0].split() + list(argv[1:])) if argv else []
    if any(a == "vllm.entrypoints.openai.api_server" or a.endswith("vllm/entrypoints/openai/api_server.py")
           for a in argv):
        return True
    return any(os.path.basename(a) == "vllm" and b == "serve" for a, b in zip(argv, argv[1:]))


def speculative_config(value: object) -> object:
    """A profile's speculative-config as vLLM reads it: a mapping as is, a JSON text parsed (None, or
    the text itself when it is not JSON). Pure."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):  # (nested past Python's recursion: not a config vLLM takes)
            return value
    return value


ABORT_MODE = "[shutdown] API server: stopping engine client mode=abort"
ABORT_LINE = re.compile(r"\[shutdown\] EngineCore: aborting in-flight requests count=(\d+)")


class VLLM(InferenceEngine):
    name = "vllm"
    title = "vLLM"
    article = "a"
    package = "vllm"
    install_marks = ("model_executor/models", "entrypoints")
    checkout_globs = (
        "/root/vllm/vllm", "/root/*/vllm/vllm", "/opt/vllm/vllm", "/opt/*/vllm/vllm",
        "/home/*/vllm/vllm", "/home/*/*/vllm/vllm", "/data/vllm/vllm", "/workspace/vllm/vllm",
        "/workspace/*/vllm/vllm", "/vllm-workspace/vllm",
    )
    checkout_hint = "*/vllm/vllm"
    launch_module = "vllm.entrypoints.openai.api_server"
    config_flag = "--config"      # a YAML file of flags (its own parser reads it): the API key goes there
    health_path = "/health"
    generate_path = "/v1/completions"
    server_info_paths = ("/v1/models",)   # no server-info route: the served models are what it says of itself
    model_info_paths = ("/v1/models",)
    flush_path = "/reset_prefix_cache"  # 404 unless VLLM_SERVER_DEV_MODE: then not flushed, and said so
    metrics_path = "/metrics"
    metrics_names = {"drafts": "vllm:spec_decode_num_drafts", "draft_tokens": "vllm:spec_decode_num_draft_tokens",
                     "accepted": "vllm:spec_decode_num_accepted_tokens", "requests": "vllm:request_success"}
    busy_metric = "vllm:num_requests_running"
    waiting_metric = "vllm:num_requests_waiting"
    flag_reader = OWN_PARSER      # generated from config dataclasses: its own parser is asked (parser_probe)
    models_subdir = "model_executor/models"
    registry_reader = OWN_PARSER  # ModelRegistry's architectures, asked in the same run
    audit_reader = "provision.host.ops.audit:protocol"  # the registry against the release's SupportsEagle3:
                                                        # engine/audit_vllm.py
    log_reader = "provision.logs.vllmlog"   # the control side's reader of its start-up log
    spec_file_example = "model_executor/models/x.py"   # a spec's `file`, in an error's example
    eagle3_protocol = "model_executor/models/interfaces.py:SupportsEagle3"
    # 0.16's eagle3_target_supported, 0.17's aux_hidden_states_supported (SpeculativeConfig._verify_args,
    # matched by substring against the target's text model type); gone by 0.32
    eagle3_allow_list = ("config/speculative.py", ("eagle3_target_supported", "aux_hidden_states_supported"))
    # Run in the server's interpreter after host/facts/own_parser.py's TABLE_OF: the real parser of
    # `python -m vllm.entrypoints.openai.api_server` (0.32 moved make_arg_parser to launchers/, 0.11
    # FlexibleArgumentParser to utils/argparse_utils), the methods of SpeculativeConfig's Literal,
    # and the registry's architectures. What an older release lacks is None (not judged).
    parser_probe = r'''
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
PARSER = make_arg_parser(FlexibleArgumentParser())
try:
    from vllm.config.speculative import SpeculativeMethod
    METHODS = literal_values(SpeculativeMethod) or None
except Exception:
    METHODS = None
try:
    from vllm.model_executor.models.registry import ModelRegistry
    ARCHS = sorted(ModelRegistry.get_supported_archs())
except Exception:
    ARCHS = None
try:
    import vllm
    VERSION = str(vllm.__version__)
except Exception:
    VERSION = None
'''
    overlay_env = ""
    overlay_style = "general-plugin"    # a vllm.general_plugins entry point registering the fixed classes
    overlay_min_version = (0, 16, 0)    # the oldest release read (general plugins and lazy register_model
                                        # strings are older; provision claims only what it read)
    overlay_plugins_env = "VLLM_PLUGINS"
    eagle3_methods = ("set_aux_hidden_state_layers", "get_eagle3_default_aux_hidden_state_layers")
    eagle3_parity_method = ""
    implied_args = {"host": "127.0.0.1", "port": 30000}  # vLLM's own: every address, port 8000
    model_arg = "model"
    tp_arg = "tensor-parallel-size"

    def default_aux_layers(self, num_layers: int) -> tuple | None:
        """vLLM's fallback when the drafter's config has no eagle_aux_hidden_state_layer_ids:
        (2, n // 2, n - 3), silently (vllm#50170: 1.21% acceptance that way)."""
        return (2, num_layers // 2, num_layers - 3) if num_layers >= 4 else None

    def draft_path(self, args: dict) -> str | None:
        """The drafter named in `speculative-config` (a mapping, or its JSON text), when it names one."""
        conf = speculative_config(args.get("speculative-config"))
        model = conf.get("model") if isinstance(conf, dict) else None
        return str(model) if model else None

    def flag_name(self, name: str) -> str:
        """FlexibleArgumentParser reads `max_model_len` as `max-model-len`, and `speculative-config.method`
        as a field of the JSON flag `speculative-config`."""
        return name.split(".", 1)[0].replace("_", "-")

    def spec_method(self, args: dict) -> str | None:
        conf = speculative_config(args.get("speculative-config"))
        method = conf.get("method") if isinstance(conf, dict) else None
        return str(method) if method is not None else None

    def draft_architectures(self, archs: list[str], args: dict) -> list[str]:
        """vLLM's EAGLEConfig renames the drafter's architectures by method (eagle: EagleX, eagle3:
        Eagle3X, unless the name already says it)."""
        method = str(self.spec_method(args) or "").lower()
        if method == "eagle":
            return [a if a.startswith("Eagle") else f"Eagle{a}" for a in archs]
        if method == "eagle3":
            return [a if a.startswith("Eagle3") or a.endswith("Eagle3") else f"Eagle3{a}" for a in archs]
        return list(archs)

    def check_args(self, args: dict) -> list[str]:
        """What vLLM refuses at start-up: no --model, a speculative-config that is not a JSON object,
        an EAGLE method without its drafter, a size that is not a whole number."""
        out = super().check_args(args)
        raw = args.get("speculative-config")
        if raw is not None:
            conf = speculative_config(raw)
            if not isinstance(conf, dict):
                out.append(f"speculative-config must be a mapping (vLLM takes it as one JSON object), got {raw!r}")
            elif str(conf.get("method", "")).lower() in ("eagle", "eagle3") and not conf.get("model"):
                out.append(f"speculative-config: method {conf['method']} needs the drafter's `model`")
        for k in ("tensor-parallel-size", "pipeline-parallel-size", "max-model-len"):
            v = args.get(k)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                out.append(f"{k} must be a whole number, got {v!r}")
        gmu = args.get("gpu-memory-utilization")
        if gmu is not None and not (isinstance(gmu, (int, float)) and 0 < float(gmu) <= 1):
            out.append(f"gpu-memory-utilization must be in (0, 1], got {gmu!r}")
        return out

    def spec_read_files(self, spec: dict) -> list[str]:
        """Besides the protocol: the model registry, where its overlay reads the architectures a
        class is served under (engine/audit_vllm.py `architectures`)."""
        return super().spec_read_files(spec) + [f"{self.models_subdir}/registry.py"]

    def source_files(self, install_dir: str) -> dict:
        """Its flags are declared in engine/arg_utils.py and the config dataclasses; its model classes
        in model_executor/models/*.py."""
        models_dir = os.path.join(install_dir, self.models_subdir)
        return {"server_args": os.path.join(install_dir, "engine", "arg_utils.py"),
                "fields": {os.path.basename(p): p for p in sorted(glob.glob(os.path.join(install_dir, "config", "*.py")))},
                "choices": None,
                "models": sorted(glob.glob(os.path.join(models_dir, "*.py")))}

    serves_path = "/v1/models"

    def serves(self, body: bytes, args: dict) -> bool:
        """/v1/models lists the served model: its `--served-model-name` (the first, when a list), else
        its `--model` path."""
        try:
            data = json.loads(body).get("data")
        except (ValueError, AttributeError):
            return False
        names = args.get("served-model-name") or args.get(self.model_arg)
        want = str(names[0] if isinstance(names, list) and names else names)
        return isinstance(data, list) and any(isinstance(m, dict) and m.get("id") == want for m in data)

    def generate_body(self, text: str, max_new_tokens: int) -> dict:
        """OpenAI completions, greedy, streamed, with the usage in the last chunk."""
        return {"prompt": text, "max_tokens": max_new_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}

    def chunk_figures(self, chunk: dict) -> dict:
        """The usage a chunk carries (the last one, with stream_options.include_usage); vLLM reports
        speculative decoding on /metrics, not per request."""
        usage = chunk.get("usage") if isinstance(chunk, dict) else None
        if not isinstance(usage, dict):
            return {}
        return {k: usage[k] for k in ("completion_tokens", "prompt_tokens") if isinstance(usage.get(k), int)}

    def server_info(self, info: object) -> dict:
        """The served model (/v1/models: its id, root and max_model_len)."""
        data = info.get("data") if isinstance(info, dict) else None
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            return {}
        first = data[0]
        return {"model_path": first.get("root") or first.get("id"), "served_model_name": first.get("id"),
                "max_model_len": first.get("max_model_len")}

    def is_server(self, argv: list[str]) -> bool:
        return is_vllm_server(argv)

    # 0.32's --shutdown-timeout (engine/arg_utils.py, int, default 0): 0 aborts every request in flight
    # on SIGTERM, N waits up to N s for them; older releases lack it (then SIGTERM aborts)
    drain_flag = "shutdown-timeout"
    multinode_addr_flags = ("master-addr", "master-port")

    def multinode_args(self, nnodes: int, rank: int, addr: str, port: int) -> dict:
        """0.32's --nnodes, --node-rank, --master-addr and --master-port (engine/arg_utils.py: the
        parallel group); SGLang's --dist-init-addr is no flag of vLLM's."""
        return {"nnodes": nnodes, "node-rank": rank, "master-addr": addr, "master-port": port}

    def drain_aborted(self, log_text: str, in_flight: int | None) -> int | None:
        """0.32 started with --shutdown-timeout 0 logs `[shutdown] API server: stopping engine client
        mode=abort` (entrypoints/launchers/launcher.py) and aborts what is in flight: its EngineCore says
        how many (`aborting in-flight requests count=N`, v1/engine/core.py) when it lives long enough to,
        else the running gauge read just before the signal does."""
        found = ABORT_LINE.findall(log_text)
        if found:
            return sum(int(n) for n in found) or None
        return in_flight or None if ABORT_MODE in log_text else None

    def may_be_server(self, raw: bytes) -> bool:
        return b"vllm" in raw

    def is_orphan_worker(self, argv: list[str], comm: str) -> bool:
        """An engine core or a worker: vLLM titles them `VLLM::EngineCore`, `VLLM::Worker_TP0`."""
        return comm.startswith("VLLM::") or any(a.startswith("VLLM::") for a in argv[:1])


ENGINE = VLLM()
