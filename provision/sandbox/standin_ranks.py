"""The stand-in's launch and its scheduler children: the parsed launch (:class:`Launch`), the
model's shard facts, the tqdm bar, and one process per TP rank that loads, captures graphs, calls the
EAGLE-3 methods on the probed model, meets the others in barriers and reports ready.  STDLIB ONLY;
installed beside the stand-in.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import select
import signal
import time
from pathlib import Path

if __package__:  # provision.sandbox in a checkout
    from provision.sandbox.standin_log import forms_version, log, missing_method_exception, _sglang_version
    from provision.sandbox.standin_stubs import DEFAULT_ARCH, ModelProbe
    from provision.sandbox.standin_tracebacks import (CHAIN_EAGLE3, CHAIN_EMBED, CHAIN_KV, CHAIN_LOAD, CUDA_ERROR,
                                    OOM_ERROR, _exc_line, _frames, _real_frames)
else:  # flat, beside the stand-in (/opt/provision-standin on a host, or run as a script)
    from standin_log import forms_version, log, missing_method_exception, _sglang_version
    from standin_stubs import DEFAULT_ARCH, ModelProbe
    from standin_tracebacks import (CHAIN_EAGLE3, CHAIN_EMBED, CHAIN_KV, CHAIN_LOAD, CUDA_ERROR, OOM_ERROR,
                                    _exc_line, _frames, _real_frames)

DRAFT_TYPES = {
    "EAGLE3": "LlamaForCausalLMEagle3",
    "EAGLE": "DeepseekV3ForCausalLMNextN",
    "NEXTN": "DeepseekV3ForCausalLMNextN",
    "STANDALONE": "LlamaForCausalLM",
}
BAR_DESC = "Loading safetensors checkpoint shards"
BAR_DESC_MT = "Multi-thread loading shards"


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        return default


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _count_shards(model_path: str | None, default: int) -> int:
    if model_path:
        idx = _read_json(Path(model_path) / "model.safetensors.index.json")
        if isinstance(idx, dict) and isinstance(idx.get("weight_map"), dict):
            files = set(idx["weight_map"].values())
            if files:
                return len(files)
        try:
            n = len(list(Path(model_path).glob("*.safetensors")))
            if n:
                return n
        except OSError:
            pass
    return default


def _model_config(model_path: str | None) -> dict:
    cfg = _read_json(Path(model_path) / "config.json") if model_path else None
    return cfg if isinstance(cfg, dict) else {}


def _bar_interval(t: float) -> str:
    mins, s = divmod(int(t), 60)
    h, m = divmod(mins, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def format_bar(desc: str, n: int, total: int, elapsed: float) -> str:
    pct = (n / total * 100) if total else 100.0
    rate = (n / elapsed) if (elapsed > 0 and n) else None
    if rate:
        remaining = _bar_interval((total - n) / rate)
        rate_fmt = f"{1 / rate:5.2f}s/it" if rate < 1 else f"{rate:5.2f}it/s"
    else:
        remaining, rate_fmt = "?", "?it/s"
    return f"{desc}: {pct:3.0f}% Completed | {n}/{total} [{_bar_interval(elapsed)}<{remaining}, {rate_fmt}]"


class _Bar:
    """tqdm-ish writer: '\\r' + line (+ '\\n' from SGLang's BAR_FORMAT) + padding to the last length."""

    def __init__(self, desc: str, total: int):
        self.desc, self.total = desc, total
        self.start = time.monotonic()
        self.last_len = 0
        self.last_show = 0.0
        self.cr_only = os.environ.get("PROVISION_STANDIN_BAR_STYLE", "tqdm") == "cr"
        self.show(0)

    def update(self, n: int) -> None:
        if time.monotonic() - self.last_show >= 0.1:  # tqdm's default mininterval
            self.show(n)

    def show(self, n: int) -> None:
        self.last_show = time.monotonic()
        s = format_bar(self.desc, n, self.total, time.monotonic() - self.start)
        if not self.cr_only:
            s += "\n"
        pad = " " * max(self.last_len - len(s), 0)
        self.last_len = len(s)
        log.raw("\r" + s + pad)

    def close(self, n: int) -> None:
        self.show(n)
        log.raw("\n")


# --------------------------------------------------------------------------- the scheduler children


def _set_pdeathsig() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _set_comm(name: str) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)  # PR_SET_NAME
    except Exception:
        pass


class Launch:
    """Parsed arguments and derived facts shared by the main process and the forked children."""

    def __init__(self, sglang_dir: Path, args: argparse.Namespace, spec):
        self.sglang_dir = sglang_dir
        self.args = args
        self.spec = spec
        g = lambda name, default=None: getattr(args, name, default)  # noqa: E731
        self.tp = int(g("tensor_parallel_size", None) or g("tp_size", None) or 1)
        self.host = g("host", "127.0.0.1") or "127.0.0.1"
        self.port = int(g("port", 30000) or 30000)
        self.api_key = g("api_key")
        self.admin_api_key = g("admin_api_key")
        self.enable_metrics = bool(g("enable_metrics", False))
        self.model_path = g("model_path")
        self.spec_alg = g("speculative_algorithm")
        self.draft_path = g("speculative_draft_model_path")
        self.served_name = g("served_model_name") or self.model_path
        cfg = _model_config(self.model_path)
        archs = cfg.get("architectures") if isinstance(cfg.get("architectures"), list) else None
        self.archs = archs or [DEFAULT_ARCH]
        self.model_type = cfg.get("model_type", "kimi_k25")
        text_cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
        self.context_len = int(g("context_length", None) or text_cfg.get("max_position_embeddings") or 262144)
        self.load_seconds = max(_env_float("PROVISION_STANDIN_LOAD_SECONDS", 3.0), 0.0)
        self.warmup_seconds = max(_env_float("PROVISION_STANDIN_WARMUP_SECONDS", 0.5), 0.0)
        shards_env = _env_int("PROVISION_STANDIN_SHARDS", 0)
        self.shards = shards_env if shards_env > 0 else _count_shards(self.model_path, 64)
        self.draft_shards = _count_shards(self.draft_path, 1) if self.draft_path else 1
        # a fault for every release, or "0.5.10=hang,0.5.9=": one per installed release (an upgrade's test)
        fault = (os.environ.get("PROVISION_STANDIN_FAULT") or "").strip()
        if "=" in fault:
            per = dict(part.split("=", 1) for part in fault.split(",") if "=" in part)
            fault = per.get(_sglang_version(sglang_dir) or "", "").strip()
        self.fault = fault
        self.multithread = False
        extra = g("model_loader_extra_config")
        if extra:
            try:
                extra_d = json.loads(extra) if isinstance(extra, str) else extra
                self.multithread = bool(isinstance(extra_d, dict) and extra_d.get("enable_multithread_load"))
            except ValueError:
                pass
        self.has_draft = self.spec_alg in DRAFT_TYPES
        self.draft_type = DRAFT_TYPES.get(self.spec_alg or "", "LlamaForCausalLM")
        dcfg = _model_config(self.draft_path)
        if isinstance(dcfg.get("architectures"), list) and dcfg["architectures"]:
            self.draft_type = str(dcfg["architectures"][0])
        # SGLang 0.5.9's model_runner: target layers are captured unless the drafter's
        # eagle_config.use_aux_hidden_state is falsy (a config without eagle_config captures them).
        try:
            aux = dcfg.get("eagle_config").get("use_aux_hidden_state", True)
        except AttributeError:
            aux = True
        self.calls_eagle3_layers = self.spec_alg == "EAGLE3" and bool(aux)
        self.calls_embed_head = self.spec_alg in ("EAGLE", "EAGLE3", "NEXTN")
        self.max_total_tokens = 421376
        self.probe: ModelProbe | None = None
        self.version = _sglang_version(sglang_dir)
        self.server_args: dict = {}  # as ServerArgs holds them (standin.py fills it in)
        per_node = max(1, self.tp * int(g("pp_size", None) or g("pipeline_parallel_size", None) or 1)
                       // max(1, int(g("nnodes", 1) or 1)))
        self.devices = [int(g("base_gpu_id", 0) or 0) + r * int(g("gpu_id_step", 1) or 1) for r in range(per_node)]
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.visible = [v.strip() for v in visible.split(",")] if visible else None

    def gpu_of(self, rank: int) -> str:
        """The UUID of the GPU a TP rank runs on: CUDA device base-gpu-id + local rank * gpu-id-step,
        through CUDA_VISIBLE_DEVICES when it is set (the stand-in nvidia-smi's GPU-sandbox-N)."""
        dev = self.devices[rank % len(self.devices)]
        entry = self.visible[dev] if self.visible and dev < len(self.visible) else str(dev)
        return entry if not entry.isdigit() else f"GPU-sandbox-{entry}"


class _Rank:
    def __init__(self, launch: Launch, rank: int, ready_fd: int, go_fd: int):
        self.L = launch
        self.rank = rank
        self.ready_fd = ready_fd
        self.go_fd = go_fd
        self.gpu = rank  # its CUDA device index as torch names it in an error
        self.gpu_uuid = launch.gpu_of(rank)
        self.ppid = os.getppid()

    def orphaned(self) -> None:
        """The main process is gone. Normally the rank follows it; with PROVISION_STANDIN_RANKS_OUTLIVE=1
        it lives on holding its (pretend) GPU memory, as ranks do whose main process the OOM killer took."""
        if not RANKS_OUTLIVE:
            os._exit(1)
        while True:
            time.sleep(3600)

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + max(seconds, 0.0)
        while True:
            if os.getppid() != self.ppid:
                self.orphaned()
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.2))

    def barrier(self, stage: str) -> None:
        """Wait for every rank to reach ``stage`` (SGLang's ranks meet in collectives, e.g. the
        all-reduce that sizes the KV cache, so none runs ahead of the others)."""
        os.write(self.ready_fd, f"{stage}\n".encode())
        while True:
            if os.getppid() != self.ppid:
                self.orphaned()
            try:
                readable, _, _ = select.select([self.go_fd], [], [], 0.2)
            except InterruptedError:
                continue
            if readable:
                if not os.read(self.go_fd, 1):
                    self.orphaned()
                return

    def wait_gate(self) -> None:
        """``PROVISION_STANDIN_LOAD_GATE``: the target load does not end while that file exists, so a
        test acts "during the load" on an event (it removes the file), never on a guessed time."""
        gate = os.environ.get("PROVISION_STANDIN_LOAD_GATE")
        while gate and os.path.exists(gate):
            self.sleep(0.1)

    def hang(self) -> None:
        while True:
            self.sleep(3600)

    def fail(self, trace_body: str, exc_text: str) -> None:
        log.error("Scheduler hit an exception: Traceback (most recent call last):\n" + trace_body + exc_text.rstrip("\n"))
        try:
            os.kill(self.ppid, signal.SIGQUIT)
        except OSError:
            pass
        self.hang()

    def load_weights(self, shards: int, seconds: float, type_name: str, draft: bool) -> None:
        L = self.L
        avail = 78.50 if not draft else 3.03
        usage = 64.27 if not draft else 0.97
        log.info(f"Load weight begin. avail mem={avail:.2f} GB")
        t0 = time.monotonic()
        self.sleep(random.uniform(0.0, 0.03))
        per = seconds / max(shards, 1)
        crash_at = max(1, int(shards * 0.4)) if (L.fault in ("crash-mid-load", "rank-killed") and not draft) else None
        hang_at = None
        if L.fault == "hang" and not draft:
            hang_at = max(0, min(shards - 1, int(shards * _env_float("PROVISION_STANDIN_HANG_AT", 45) / 100)))
        if self.rank == 0:
            bar = _Bar(BAR_DESC_MT if L.multithread else BAR_DESC, shards)
            for i in range(1, shards + 1):
                if hang_at is not None and i > hang_at:
                    self.hang()
                self.sleep(per)
                if crash_at is not None and i == crash_at:
                    if L.fault == "rank-killed":  # the OOM killer's way: SIGKILL, no traceback
                        os.kill(os.getpid(), signal.SIGKILL)
                    self.fail(_frames(L.sglang_dir, CHAIN_LOAD), CUDA_ERROR)
                if i < shards:
                    bar.update(i)
            bar.close(shards)
        else:
            if hang_at is not None:
                self.sleep(per * hang_at)
                self.hang()
            self.sleep(seconds)
        if not draft:
            self.wait_gate()
        elapsed = time.monotonic() - t0
        log.info(
            f"Load weight end. elapsed={elapsed:.2f} s, type={type_name}, dtype=torch.bfloat16, "
            f"avail mem={avail - usage:.2f} GB, mem usage={usage:.2f} GB."
        )

    def call_model(self, method: str, chain: list, *args) -> None:
        probe = self.L.probe
        if probe is not None and probe.cls is not None and getattr(probe.cls, method, None) is None:
            exc = missing_method_exception(forms_version(self.L.sglang_dir), probe.arch, method)
            if exc is not None:
                self.fail(_frames(self.L.sglang_dir, chain), exc + "\n")
        inst = probe.make_instance() if probe and probe.cls is not None else None
        try:
            if inst is not None:
                getattr(inst, method)(*args)
            else:
                if probe is None or probe.cls is None or getattr(probe.cls, method, None) is None:
                    name = probe.arch if probe else DEFAULT_ARCH
                    raise AttributeError(f"'{name}' object has no attribute '{method}'")
        except Exception as e:  # noqa: BLE001 - whatever the model raises is the crash
            self.fail(_frames(self.L.sglang_dir, chain) + _real_frames(e, self.L.sglang_dir), _exc_line(e))

    def hold_gpu(self) -> None:
        """Say which GPU this rank holds memory on, where the sandbox's stand-in nvidia-smi reads it."""
        try:
            os.makedirs(GPU_APPS_DIR, exist_ok=True)
            with open(os.path.join(GPU_APPS_DIR, str(os.getpid())), "w") as fh:
                fh.write(self.gpu_uuid)
        except OSError:
            pass

    def run(self) -> None:
        L = self.L
        ls = L.load_seconds
        self.hold_gpu()
        self.load_weights(L.shards, ls, L.probe.arch if L.probe else DEFAULT_ARCH, draft=False)
        self.barrier("loaded")
        self.sleep(min(0.05 + ls * 0.02, 0.5))
        if L.fault == "oom":
            self.fail(_frames(L.sglang_dir, CHAIN_KV), OOM_ERROR.format(gpu=self.gpu))
        log.info(f"KV Cache is allocated. #tokens: {L.max_total_tokens}, KV size: 10.12 GB")
        log.info("Memory pool end. avail mem=3.71 GB")
        log.info("Capture cuda graph begin. This can take up to several minutes. avail mem=3.71 GB")
        log.info("Capture cuda graph bs [1, 2, 4, 8, 12, 16, 24, 32, 40, 48]")
        self.sleep(ls * 0.05)
        if L.calls_eagle3_layers:
            self.call_model("set_eagle3_layers_to_capture", CHAIN_EAGLE3)
        self.sleep(ls * 0.05)
        log.info("Capture cuda graph end. Time elapsed: %.2f s. mem usage=0.86 GB. avail mem=2.85 GB." % (ls * 0.1 + 0.8))
        if L.has_draft:
            self.load_weights(L.draft_shards, ls / 5.0, L.draft_type, draft=True)
            self.barrier("draft-loaded")
            if L.calls_embed_head:
                self.call_model("get_embed_and_head", CHAIN_EMBED)
            log.info("Capture draft cuda graph begin. This can take up to several minutes. avail mem=1.88 GB")
            self.sleep(ls * 0.03)
            log.info("Capture draft cuda graph end. Time elapsed: %.2f s. mem usage=0.21 GB. avail mem=1.67 GB." % (ls * 0.03 + 0.4))
            log.info("Capture draft extend cuda graph begin. This can take up to several minutes. avail mem=1.67 GB")
            self.sleep(ls * 0.02)
            log.info("Capture draft extend cuda graph end. Time elapsed: %.2f s. mem usage=0.15 GB. avail mem=1.52 GB." % (ls * 0.02 + 0.3))
        if self.rank == 0:
            log.info(
                f"max_total_num_tokens={L.max_total_tokens}, chunked_prefill_size=8192, "
                f"max_prefill_tokens=16384, max_running_requests=48, context_len={L.context_len}, "
                f"available_gpu_mem=1.52 GB"
            )
        os.write(self.ready_fd, b"ready\n")
        os.close(self.ready_fd)
        self.hang()


GPU_APPS_DIR = "/run/provision-standin/gpu-apps"  # hosts.py GPU_APPS_DIR: the stand-in nvidia-smi reads it
RANKS_OUTLIVE = os.environ.get("PROVISION_STANDIN_RANKS_OUTLIVE", "") == "1"


def _child_setup(name: str, prefix: str) -> None:
    if not RANKS_OUTLIVE:
        _set_pdeathsig()
    _set_comm(name)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    log.prefix = prefix
