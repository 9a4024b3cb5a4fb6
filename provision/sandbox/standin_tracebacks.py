"""Tracebacks as Python prints them, forged from the installed SGLang's own source lines (file, line
number, the line itself), for the failures the stand-in reproduces (CUDA errors, OOM, EAGLE-3).
STDLIB ONLY; installed beside the stand-in.
"""

from __future__ import annotations

import os
import re
import traceback
from pathlib import Path

if __package__:  # provision.sandbox in a checkout
    from provision.sandbox.standin_log import log
else:  # flat, beside the stand-in (/opt/provision-standin on a host, or run as a script)
    from standin_log import log


def _frame(sglang_dir: Path, rel: str, snippet: str, anchor: str | None = None) -> str | None:
    """A traceback frame for the first line of ``rel`` containing ``snippet`` (after the line
    containing ``anchor``, if given) in the installed tree; None when the text is not there."""
    path = (sglang_dir / rel) if rel == "launch_server.py" else (sglang_dir / "srt" / rel)
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    start = 0
    if anchor is not None:
        start = next((i for i, line in enumerate(lines) if anchor in line), len(lines))
    for i in range(start, len(lines)):
        line = lines[i]
        if snippet in line:
            indent = len(line) - len(line.lstrip())
            func = "<module>"
            for j in range(i - 1, -1, -1):
                text = lines[j]
                body = text.lstrip()
                if not body or body[0] in "#)]}'\"" or len(text) - len(body) >= indent:
                    continue
                indent = len(text) - len(body)
                m = re.match(r"(async\s+)?def\s+(\w+)", body)
                if m:
                    func = m.group(2)
                    break
                if indent == 0:
                    break
            return f'  File "{path}", line {i + 1}, in {func}\n    {line.strip()}\n'
    if rel == "launch_server.py":  # the shim replaced it: show what SGLang's would say
        return f'  File "{path}", line 33, in <module>\n    {snippet.strip()}\n'
    return None


def _frames(sglang_dir: Path, chain: list[tuple]) -> str:
    return "".join(f for f in (_frame(sglang_dir, *link) for link in chain) if f)


_SCHED_HEAD = [
    ("managers/scheduler.py", "scheduler = Scheduler("),
    ("managers/scheduler.py", "self.init_model_worker()"),
]
_TARGET_RUNNER = [
    ("managers/scheduler.py", "self.init_tp_model_worker()"),
    ("managers/scheduler.py", "self.tp_worker = TpModelWorker("),
    ("managers/tp_worker.py", "self._init_model_runner()"),
    ("managers/tp_worker.py", "self._model_runner = ModelRunner("),
    ("model_executor/model_runner.py", "self.initialize(min_per_gpu_memory)"),
]
CHAIN_EAGLE3 = _SCHED_HEAD + _TARGET_RUNNER + [
    ("model_executor/model_runner.py", "self.init_device_graphs()"),
    ("model_executor/model_runner.py", "self.graph_runner = graph_runners[self.device](self)"),
    ("model_executor/cuda_graph_runner.py", "set_eagle3_layers_to_capture("),
]
CHAIN_EMBED = _SCHED_HEAD + [
    ("managers/scheduler.py", "self.maybe_init_draft_worker()"),
    ("managers/scheduler.py", "self.draft_worker = DraftWorkerClass("),
    ("speculative/eagle_worker.py", "get_embed_and_head()"),
]
CHAIN_LOAD = _SCHED_HEAD + _TARGET_RUNNER + [
    ("model_executor/model_runner.py", "self.load_model()"),
    ("model_executor/model_runner.py", "self.model = get_model("),
    ("model_loader/__init__.py", "return loader.load_model("),
    ("model_loader/loader.py", "self.load_weights_and_postprocess("),
    ("model_loader/loader.py", "model.load_weights(self._get_all_weights("),
    ("models/kimi_k25.py", "for name, loaded_weight in weights:"),
    ("model_loader/weight_utils.py", "for st_file in tqdm("),
]
CHAIN_KV = _SCHED_HEAD + _TARGET_RUNNER + [
    ("model_executor/model_runner.py", "self.init_memory_pool("),
    ("model_executor/model_runner_kv_cache_mixin.py", "self.token_to_kv_pool = "),
    ("mem_cache/memory_pool.py", "self._create_buffers()"),
    ("mem_cache/memory_pool.py", "torch.zeros("),
]

CUDA_ERROR = (
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
    "below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)
OOM_ERROR = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {gpu} has a total "
    "capacity of 79.11 GiB of which 1.05 GiB is free. Including non-PyTorch memory, this process has "
    "78.04 GiB memory in use. Of the allocated memory 76.50 GiB is allocated by PyTorch, and 120.00 MiB "
    "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
    "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n"
)


def _real_frames(exc: BaseException, sglang_dir: Path) -> str:
    """Frames of a real exception raised while calling into the model, minus this file's own frames;
    an AttributeError from the stub nn.Module gets torch's __getattr__ frame instead."""
    me = os.path.abspath(__file__)
    out = []
    tb = traceback.extract_tb(exc.__traceback__)
    from_stub = False
    for fs in tb:
        if os.path.abspath(fs.filename) == me:
            if fs.name == "__getattr__":
                from_stub = True
            continue
        out.append(f'  File "{fs.filename}", line {fs.lineno}, in {fs.name}\n')
        if fs.line:
            out.append(f"    {fs.line.strip()}\n")
    if from_stub or (isinstance(exc, AttributeError) and not out):
        torch_file = sglang_dir.parent / "torch" / "nn" / "modules" / "module.py"
        out.append(f'  File "{torch_file}", line 1964, in __getattr__\n    raise AttributeError(\n')
    return "".join(out)


def _exc_line(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc))


def _print_traceback(sglang_dir: Path, chain: list[tuple], exc_text: str) -> None:
    """An uncaught exception in the main process, as Python prints it."""
    log.raw("Traceback (most recent call last):\n" + _frames(sglang_dir, chain) + exc_text)
