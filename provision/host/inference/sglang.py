"""SGLang, the first inference engine behind the one interface (base.py).  STDLIB ONLY.

Each answer is what provision always did for SGLang, said here once: the package and its
``srt/server_args.py``, ``python -m sglang.launch_server``, ``--config FILE`` for the secrets (the
separate-token form: SGLang ignores ``--config=FILE``), ``/health``, ``sglang-PORT-STAMP.log``,
``SGLANG_EXTERNAL_MODEL_PACKAGE`` (0.5.6+), and the two methods its EAGLE-3 worker calls on the
top-level model (the third, ``set_embed_and_head``, where a release's worker sets them back).
"""

from __future__ import annotations

import glob
import os
import re

from provision.host.inference.base import InferenceEngine


def is_sglang_server(argv: list[str]) -> bool:
    """Is this command line an SGLang server's main command: ``python -m sglang.launch_server``,
    its script, or ``sglang serve``? Pure. Read by whole arguments, so a shell that merely names
    the command in its ``-c`` string (``bash -c "python3 -m sglang.launch_server ..."``, a
    systemd ExecStart wrapper) is not taken for the server: its python child is. A first
    argument with spaces (a process that rewrote its title, setproctitle, ``exec -a``) is read
    by its words."""
    argv = (argv[0].split() + list(argv[1:])) if argv else []
    if any(a == "sglang.launch_server" or a.endswith("sglang/launch_server.py") for a in argv):
        return True
    return any(os.path.basename(a) == "sglang" and b == "serve" for a, b in zip(argv, argv[1:]))


DRAIN_LINE = re.compile(r"Gracefully exiting\.\.\. Remaining number of requests (\d+)")
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
META_FIELDS = ("completion_tokens", "prompt_tokens", "spec_verify_ct", "spec_accept_length", "spec_accept_rate",
               "spec_accept_token_num", "spec_draft_token_num", "spec_num_correct_drafts", "spec_num_proposed_drafts")
INFO_FIELDS = ("version", "tp_size", "tensor_parallel_size", "model_path", "served_model_name")


class SGLang(InferenceEngine):
    name = "sglang"
    title = "SGLang"
    article = "an"
    package = "sglang"
    install_marks = ("srt/models",)
    checkout_globs = (
        "/root/sglang/python/sglang", "/root/*/sglang/python/sglang", "/root/*/python/sglang",
        "/opt/sglang/python/sglang", "/opt/*/sglang/python/sglang", "/opt/*/python/sglang",
        "/home/*/sglang/python/sglang", "/home/*/*/sglang/python/sglang",
        "/data/sglang/python/sglang", "/data/*/sglang/python/sglang",
        "/workspace/sglang/python/sglang", "/workspace/*/sglang/python/sglang",
        "/sgl-workspace/sglang/python/sglang",
    )
    checkout_hint = "*/sglang/python/sglang"
    launch_module = "sglang.launch_server"
    config_flag = "--config"
    health_path = "/health"
    generate_path = "/generate"    # native, streamed: the bench's figures per chunk
    server_info_paths = ("/server_info", "/get_server_info")  # 0.5.x renamed it; older keep the second
    # srt/server_args.py (+ 0.5.14's arg_groups), parsed by host/engine/serverargs.py
    flag_reader = "provision.host.ops.preflight_model:sglang_flags"
    models_subdir = "srt/models"
    registry_reader = "provision.host.ops.preflight_model:entry_class_registry"  # each module's EntryClass
    audit_reader = "provision.host.ops.audit:entry_classes"  # EntryClass wrappers and their delegation: engine/audit.py
    log_reader = "provision.logs.loadlog"   # the control side's reader of its start-up log
    spec_file_example = "srt/models/x.py"   # a spec's `file`, in an error's example
    model_info_paths = ("/model_info", "/get_model_info")
    flush_path = "/flush_cache"
    secret_flags = ("api-key", "admin-api-key")
    multinode_addr_flags = ("dist-init-addr",)

    def multinode_args(self, nnodes: int, rank: int, addr: str, port: int) -> dict:
        """SGLang's --nnodes, --node-rank and --dist-init-addr HOST:PORT (server_args.py)."""
        return {"nnodes": nnodes, "node-rank": rank, "dist-init-addr": f"{addr}:{port}"}
    flush_secret = "admin-api-key"  # ADMIN_OPTIONAL: with --admin-api-key set, only that key opens it
    overlay_env = "SGLANG_EXTERNAL_MODEL_PACKAGE"
    overlay_style = "external-package"  # each module's EntryClass, registered with overwrite=True
    overlay_min_version = (0, 5, 6)     # SGLANG_EXTERNAL_MODEL_PACKAGE appeared in 0.5.6 (PR #13429)
    overlay_offline = True              # a subclass with the spec's delegation methods: nothing to read
    eagle3_methods = ("set_eagle3_layers_to_capture", "get_embed_and_head")
    eagle3_parity_method = "set_embed_and_head"

    def source_files(self, install_dir: str) -> dict:
        """srt/server_args.py; 0.5.14+ declares fields in srt/arg_groups/fields/*.py and choices in
        srt/arg_groups/choices.py; the model classes in srt/models/*.py."""
        srt = os.path.join(install_dir, "srt")
        fields_dir = os.path.join(srt, "arg_groups", "fields")
        choices = os.path.join(srt, "arg_groups", "choices.py")
        try:
            models_dir = os.path.join(install_dir, self.models_subdir)
            models = sorted(os.path.join(models_dir, n) for n in os.listdir(models_dir) if n.endswith(".py"))
        except OSError:
            models = []
        return {"server_args": os.path.join(srt, "server_args.py"),
                "fields": {os.path.basename(p): p for p in sorted(glob.glob(os.path.join(fields_dir, "*.py")))},
                "choices": choices if os.path.isfile(choices) else None, "models": models}

    def draft_path(self, args: dict) -> str | None:
        value = args.get("speculative-draft-model-path")
        return str(value) if value else None

    def check_args(self, args: dict) -> list[str]:
        """What SGLang 0.5.9 refuses at start-up (or asserts on), said before a host is touched."""
        out = super().check_args(args)
        steps = args.get("speculative-num-steps")
        for k in ("speculative-eagle-topk", "speculative-num-draft-tokens"):
            if args.get(k) is not None and steps is None:
                out.append(f"{k} is set without speculative-num-steps; SGLang 0.5.9 fails an assertion at start-up. "
                           "Set all three, or none (auto: 3, 1, 4)")
        alg = args.get("speculative-algorithm")
        if alg is not None and str(alg) not in SPECULATIVE_ALGORITHMS:
            out.append(f"speculative-algorithm {alg!r}: expected one of {', '.join(SPECULATIVE_ALGORITHMS)}")
        if alg in ("EAGLE", "EAGLE3") and not args.get("speculative-draft-model-path"):
            out.append(f"speculative-algorithm {alg} needs speculative-draft-model-path")
        for k in ("tp-size", "speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens"):
            v = args.get(k)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                out.append(f"{k} must be a whole number, got {v!r}")
        mfs = args.get("mem-fraction-static")
        if mfs is not None and not (isinstance(mfs, (int, float)) and 0 < float(mfs) <= 1):
            out.append(f"mem-fraction-static must be in (0, 1], got {mfs!r}")
        return out

    def generate_body(self, text: str, max_new_tokens: int) -> dict:
        """Native /generate: `sampling_params`, streamed as `data:` lines ending in [DONE]."""
        return {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens}, "stream": True}

    def chunk_figures(self, chunk: dict) -> dict:
        """A chunk's `meta_info`: completion tokens, and per request the verify count and the
        release's draft counts (names vary by release: all kept, the control side picks)."""
        meta = chunk.get("meta_info") if isinstance(chunk, dict) else None
        return {k: meta[k] for k in META_FIELDS if k in meta} if isinstance(meta, dict) else {}

    def server_info(self, info: object) -> dict:
        """Version, tp size, model, every `speculative_*` setting, and each rank's
        avg_spec_accept_length and last_gen_throughput."""
        if not isinstance(info, dict):
            return {}
        out = {k: info[k] for k in INFO_FIELDS if k in info}
        out.update({k: v for k, v in info.items() if k.startswith("speculative_")})
        states = info.get("internal_states")
        if isinstance(states, list):
            out["internal_states"] = [{k: s.get(k) for k in ("avg_spec_accept_length", "last_gen_throughput")}
                                      for s in states if isinstance(s, dict)]
        return out

    def is_server(self, argv: list[str]) -> bool:
        return is_sglang_server(argv)

    def drain_remaining(self, log_text: str) -> int | None:
        """0.5.9's sigterm_watchdog logs `Gracefully exiting... Remaining number of requests N.` every
        5 s while it drains (tokenizer_manager.py): the last one."""
        found = DRAIN_LINE.findall(log_text)
        return int(found[-1]) if found else None

    def may_be_server(self, raw: bytes) -> bool:
        return b"sglang" in raw and (b"launch_server" in raw or b"serve" in raw)

    def is_orphan_worker(self, argv: list[str], comm: str) -> bool:
        """A scheduler or detokenizer: SGLang names them `sglang::scheduler_TP0`, `sglang::detokenizer`."""
        joined = " ".join(argv)
        return "sglang" in joined and "launch_server" not in joined and comm.startswith("sglang::")


ENGINE = SGLang()
