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

from provision.host.inference.base import InferenceEngine
from provision.host.lib.procfs import is_sglang_server


class SGLang(InferenceEngine):
    name = "sglang"
    title = "SGLang"
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
    flag_reader = "sglang-server-args"  # srt/server_args.py (+ 0.5.14's arg_groups): host/engine/serverargs.py
    models_subdir = "srt/models"
    overlay_env = "SGLANG_EXTERNAL_MODEL_PACKAGE"
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

    def is_server(self, argv: list[str]) -> bool:
        return is_sglang_server(argv)


ENGINE = SGLang()
