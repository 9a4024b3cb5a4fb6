"""A stand-in for ``python -m sglang.launch_server`` (SGLang 0.5.9 start-up), for hosts without a GPU.

STDLIB ONLY, one file, Python 3.10+.  On a sandbox host it is installed as
``/opt/provision-standin/sglang_standin.py`` and the host's ``<sglang>/launch_server.py``
is replaced by a shim that calls ``sglang_standin.main(sglang_dir)``, where ``sglang_dir``
is the installed ``sglang`` package directory (the one holding ``srt/``).  Flags come
from ``sys.argv[1:]``.

What it reproduces, and how
---------------------------
* Flags: the flag set is read with ``ast`` from the INSTALLED ``<sglang_dir>/srt/server_args.py``
  (every ``parser.add_argument(...)`` call: names, aliases, actions, choices, nargs, literal
  types/defaults) and fed to a real ``argparse`` parser, so unknown flags exit 2 with an
  argparse usage error exactly like SGLang.  ``--config FILE`` is merged like 0.5.9's
  ``server_args_config_parser.py`` (only the separate token pair; ``--config=FILE`` is parsed
  and silently ignored; ``.yaml``/``.yml`` only; command-line flags win).  PyYAML is used when
  importable, else a built-in parser for flat ``key: value`` maps (scalars, quoted strings,
  booleans, numbers, simple lists).  ``--speculative-eagle-topk`` / ``--speculative-num-draft-tokens``
  without ``--speculative-num-steps`` fail with an ``AssertionError`` traceback (exit 1).
* The EAGLE-3 crash is decided the way Python does: the installed model file (default
  ``srt/models/kimi_k25.py`` / ``KimiK25ForConditionalGeneration``, or the file defining the
  class named by ``<model-path>/config.json`` ``architectures[0]``) is compiled and executed with
  every non-stdlib import served by stub modules.  A file that does not import gives
  ``Ignore import error when loading sglang.srt.models.X: <error>`` then ``ValueError: Model
  architectures [...] are not supported for now`` (exit 1).  Otherwise an instance is made with
  ``object.__new__`` and a recorder model is set as ``language_model``/``model``/``llm``; the
  scheduler children then really call ``set_eagle3_layers_to_capture()`` (during target CUDA
  graph capture, EAGLE3 only) and ``get_embed_and_head()`` (after the draft weights load,
  EAGLE/EAGLE3/NEXTN).  Any exception there is the crash: ``Scheduler hit an exception:
  Traceback ...``, SIGQUIT to the main process, which logs ``Received sigquit from a child
  process. It usually means the child failed.`` and SIGKILLs its whole tree, itself included.
  ``SGLANG_EXTERNAL_MODEL_PACKAGE`` is honoured where the installed ``registry.py`` reads it (0.5.6+):
  the package is found on ``PYTHONPATH`` and each of its modules executed with the same stubbed
  imports (its ``from sglang.srt.models.X import ...`` gets the module executed above); an
  ``EntryClass`` class of the same name replaces the built-in one, a module that fails to import
  is skipped with ``Ignore import error when loading PKG.mod: ...`` (the built-in class is then
  used, and crashes as it would), and two model modules registering the same class name fail with
  ``AssertionError: Duplicated model implementation for X`` (exit 1), as in SGLang's registry.
* Processes: the main process forks one scheduler per TP rank (``sglang::scheduler_TPn``) and a
  detokenizer (``sglang::detokenizer``); they mostly sleep, die with the parent (PR_SET_PDEATHSIG
  plus a parent poll), and are SIGKILLed by the main process on any exit path.  Ranks meet in a
  barrier after the target and after the draft weights (as SGLang's collectives make them), so
  no rank reaches CUDA graph capture before rank 0's progress bar is done.
* Logs go to stderr as ``[%Y-%m-%d %H:%M:%S TPn] message`` (`` TPn`` only when tp > 1), the
  rank-0 tqdm bar without timestamp, ``\\r``-separated like tqdm.  uvicorn lines go to stderr, HTTP
  access lines to stdout, both as 0.5.9 formats them: ``[%Y-%m-%d %H:%M:%S] INFO:     Uvicorn running
  on ...``.  A rank that dies before it is ready is reported as the installed release does (0.5.9:
  ``Rank 0 scheduler is dead. Please check if there are relevant logs.`` and ``Exit code: -9``).
* HTTP (``http.server.ThreadingHTTPServer``) binds only after every rank reported ready:
  ``GET /health``, ``/health_generate`` (empty body; 503 while starting, shutting down, or when a
  scheduler child has died), ``/model_info`` (``/get_model_info``), ``/server_info``
  (``/get_server_info``, includes the server args), ``/v1/models``, ``/get_load``, ``/metrics``
  (Prometheus, only with ``--enable-metrics``, else 404), ``POST /generate`` (``meta_info`` with
  ``prompt_tokens``, ``completion_tokens``, ``e2e_latency`` and, with speculative decoding,
  ``spec_accept_length`` 3.1 / ``spec_accept_rate`` 0.78), ``POST /v1/chat/completions``,
  ``/v1/completions``, ``/flush_cache``.  ``--api-key`` guards every path except ``/health*`` and
  ``/metrics*`` (401 ``{"error": "Unauthorized"}``).  Each generation logs SGLang's
  ``Prefill batch`` / ``Decode batch, ... accept len: 3.10, accept rate: 0.78, ... gen throughput
  (token/s): 96.20`` lines (54 tok/s and no accept figures without EAGLE-3).

Readiness and exit status (what a launcher should rely on)
----------------------------------------------------------
* Ready: ``GET /health`` returns 200 (or the log line ``The server is fired up and ready to
  roll!``).  The port is closed during the whole load; ``/health`` is 503 during warm-up and
  shutdown; ``/model_info``, ``/server_info``, ``/v1/models`` answer as soon as the port is open.
* Exit 0 after SIGTERM/SIGINT (drain: /health 503, ~0.5 s, children killed).
* Exit 1: start-up errors (architecture not supported, config errors, assertion failures,
  duplicated model implementation, port already in use, a rank died without SIGQUIT).
* Exit 2: argparse usage error (unknown flag, bad choice, missing --model-path).
* Killed by SIGKILL (status -9, 137 under a shell): a scheduler failed (EAGLE-3 AttributeError,
  ``crash-mid-load``, ``oom``) or warm-up failed.

Environment variables
---------------------
``PROVISION_STANDIN_LOAD_SECONDS``   total target weight-load time in seconds (default 3); the draft
                                     load takes 1/5 of it, graphs/KV cache small fractions.
``PROVISION_STANDIN_WARMUP_SECONDS`` how long /health stays 503 after the port opens (default 0.5).
``PROVISION_STANDIN_SHARDS``         target shard count (default: distinct files in
                                     ``<model-path>/model.safetensors.index.json``, else 64).
``PROVISION_STANDIN_FAULT``          one of:
    ``crash-mid-load``  rank 0 dies during the target shards with a CUDA RuntimeError traceback;
                        the tree is SIGKILLed.
    ``hang``            every rank stops progressing forever at ``PROVISION_STANDIN_HANG_AT``
                        percent of the target shards (default 45); the port stays closed.
    ``flap``            after ready, /health alternates 200/503 every
                        ``PROVISION_STANDIN_FLAP_EVERY`` requests (default 2), or every
                        ``PROVISION_STANDIN_FLAP_SECONDS`` seconds when that is set (starting with 200).
    ``oom``             ``torch.OutOfMemoryError: CUDA out of memory ...`` during KV cache
                        allocation; the tree is SIGKILLed.
    ``warmup-fail``     ``Initialization failed. warmup error: ...`` after uvicorn starts, then
                        the tree (itself included) is SIGKILLed.
    ``rank-killed``     rank 0 is SIGKILLed during the target shards (as the OOM killer does: no
                        traceback); the main process reports the dead rank in the installed
                        release's words and exits 1.
``PROVISION_STANDIN_RANKS_OUTLIVE``  set to 1: the ranks and the detokenizer neither set PR_SET_PDEATHSIG
                                     nor follow a dead main process; they live on (as when the OOM
                                     killer SIGKILLs only the main process) until killed.
``PROVISION_STANDIN_LOG_FORMS``      print the log lines of this release instead of the installed one's
                                     (``0.5.23``: the RuntimeError for a dead rank, the ValueError for a
                                     missing EAGLE-3 method; below ``0.5``: ``Ignore import error when
                                     loading X. <reason>``).
``PROVISION_STANDIN_MODEL_FILE``     model file to execute (absolute, or relative to
                                     ``<sglang_dir>/srt/models``), overriding the lookup.
``PROVISION_STANDIN_MODEL_CLASS``    class name to look up in it (default from config.json, else
                                     ``KimiK25ForConditionalGeneration``).
``PROVISION_STANDIN_BAR_STYLE``      ``tqdm`` (default: ``\\r<bar>\\n`` per refresh, as SGLang's
                                     BAR_FORMAT ends in a newline) or ``cr`` (``\\r`` only).
``PROVISION_STANDIN_NO_YAML``        set to 1 to ignore an installed PyYAML and use the built-in
                                     flat-YAML parser.
``PROVISION_STANDIN_DRAIN_SECONDS``  SIGTERM drain time (default 0.5).
``PROVISION_STANDIN_SGLANG_DIR``     used when this file is run directly (see below).

The shim
--------
``main(sglang_dir)`` never returns: it raises ``SystemExit`` with the exit code (or the tree is
SIGKILLed), so a shim can simply call it.  :func:`run` returns the code instead.  Note that
``python -m sglang.launch_server`` first imports ``sglang/__init__.py``, which needs SGLang's
own dependencies (numpy, requests, ...); a shim that must work under a bare system python
should be started in a way that avoids that import (or the host must have those packages).

Running it directly (tests)
---------------------------
``python3 standin.py --sglang-dir DIR <sglang flags>`` or
``PROVISION_STANDIN_SGLANG_DIR=DIR python3 standin.py <sglang flags>``.
"""

from __future__ import annotations

import abc
import argparse
import ast
import ctypes
import importlib.abc
import importlib.machinery
import inspect
import json
import os
import random
import re
import select
import signal
import socket
import sys
import threading
import time
import traceback
import types
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NoReturn

DEFAULT_ARCH = "KimiK25ForConditionalGeneration"
DEFAULT_MODEL_FILE = "kimi_k25.py"
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


# --------------------------------------------------------------------------- logging


class _Log:
    """SGLang's log format; one os.write per message so ranks interleave by line, not by byte."""

    prefix = ""

    @staticmethod
    def _write(fd: int, data: str) -> None:
        raw = data.encode("utf-8", "replace")
        while raw:
            try:
                n = os.write(fd, raw)
            except InterruptedError:
                continue
            except OSError:
                return
            raw = raw[n:]

    def info(self, msg: str) -> None:
        ts = time.strftime("%Y-%m-%d %H:%M:%S")
        self._write(2, f"[{ts}{self.prefix}] {msg}\n")

    warning = error = info

    def raw(self, text: str, fd: int = 2) -> None:
        self._write(fd, text)


log = _Log()


def _uvicorn(level: str, msg: str, fd: int = 2) -> None:
    """A uvicorn line as 0.5.9 formats it: ``set_uvicorn_logging_configs`` (srt/utils/common.py) sets
    ``[%(asctime)s] %(levelprefix)s %(message)s`` with datefmt ``%Y-%m-%d %H:%M:%S``; the level prefix
    is uvicorn's ``INFO:`` padded to 9 columns (``INFO:     Uvicorn running on ...``)."""
    ts = time.strftime("%Y-%m-%d %H:%M:%S")
    log.raw(f"[{ts}] {(level + ':').ljust(9)} {msg}\n", fd)


def _version_tuple(text: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:3]) or (0,)


def forms_version(sglang_dir) -> tuple:
    """Which release's log lines to print: ``PROVISION_STANDIN_LOG_FORMS`` (e.g. ``0.5.23``), else the
    installed version."""
    return _version_tuple(os.environ.get("PROVISION_STANDIN_LOG_FORMS") or _sglang_version(Path(sglang_dir)))


def import_error_line(version: tuple, name: str, err: BaseException | str) -> str:
    """``models/registry.py``: 0.5.9 writes ``loading {name}: {e}``; older releases ``loading {name}. {e}``."""
    return f"Ignore import error when loading {name}{'.' if version < (0, 5) else ':'} {err}"


def rank_dead_lines(version: tuple, rank: int, code) -> tuple[list[str], str]:
    """(logged messages, the main process's exception line) when rank `rank` died before it was ready.
    0.5.9 (``entrypoints/engine.py`` ``_wait_for_scheduler_ready``) logs two errors and re-raises EOFError;
    0.5.23 raises a RuntimeError that names the exit code and the OOM killer."""
    if version >= (0, 5, 23):
        return [], (f"RuntimeError: Rank {rank} scheduler died during initialization (exit code: {code}). "
                    "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. "
                    "Run `dmesg -T | grep -i oom` to check.")
    return [f"Rank {rank} scheduler is dead. Please check if there are relevant logs.", f"Exit code: {code}"], \
        "EOFError"


def missing_method_exception(version: tuple, cls: str, method: str) -> str | None:
    """0.5.23 checks the method before calling it (``model_runner_components/attention_backend_setup.py``)
    and raises a ValueError; earlier releases call it and Python raises the AttributeError (None here)."""
    if version >= (0, 5, 23) and method == "set_eagle3_layers_to_capture":
        return (f"ValueError: Model {cls} does not implement {method}, "
                "which EAGLE3 aux hidden-state capture requires.")
    return None


# --------------------------------------------------------------------------- flags from server_args.py


class _Unknown:
    pass


_UNKNOWN = _Unknown()


def _lit(node: ast.AST, consts: dict):
    """Evaluate a literal-ish expression; names resolve through ``consts``. _UNKNOWN if impossible."""
    try:
        return ast.literal_eval(node)
    except Exception:
        pass
    if isinstance(node, ast.Name):
        return consts.get(node.id, _UNKNOWN)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        vals = [_lit(e, consts) for e in node.elts]
        if any(v is _UNKNOWN for v in vals):
            return _UNKNOWN
        return list(vals) if not isinstance(node, ast.Tuple) else tuple(vals)
    if isinstance(node, ast.BinOp):
        left, right = _lit(node.left, consts), _lit(node.right, consts)
        if left is _UNKNOWN or right is _UNKNOWN:
            return _UNKNOWN
        try:
            if isinstance(node.op, ast.Add):
                if isinstance(left, tuple) and isinstance(right, list):
                    left = list(left)
                return left + right
            if isinstance(node.op, ast.Mult):
                return left * right
            if isinstance(node.op, ast.Sub):
                return left - right
        except Exception:
            return _UNKNOWN
    if isinstance(node, ast.Subscript):
        base, idx = _lit(node.value, consts), _lit(node.slice, consts)
        if base is _UNKNOWN or idx is _UNKNOWN:
            return _UNKNOWN
        try:
            return base[idx]
        except Exception:
            return _UNKNOWN
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("list", "sorted", "tuple"):
        if len(node.args) == 1 and not node.keywords:
            inner = _lit(node.args[0], consts)
            if inner is _UNKNOWN:
                return _UNKNOWN
            try:
                return {"list": list, "sorted": sorted, "tuple": tuple}[node.func.id](inner)
            except Exception:
                return _UNKNOWN
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "field":
        for kw in node.keywords:
            if kw.arg == "default":
                return _lit(kw.value, consts)
            if kw.arg == "default_factory":
                if isinstance(kw.value, ast.Name) and kw.value.id in ("list", "dict"):
                    return [] if kw.value.id == "list" else {}
                if isinstance(kw.value, ast.Lambda):
                    return _lit(kw.value.body, consts)
        return _UNKNOWN
    return _UNKNOWN


class FlagSpec:
    def __init__(self, options, kwargs, lineno):
        self.options: list[str] = options
        self.kw: dict = kwargs  # resolved keyword values (may hold _UNKNOWN)
        self.lineno = lineno

    @property
    def dest(self) -> str:
        if "dest" in self.kw and isinstance(self.kw["dest"], str):
            return self.kw["dest"]
        longs = [o for o in self.options if o.startswith("--")]
        return (longs[0] if longs else self.options[0]).lstrip("-").replace("-", "_")


class ServerArgsSpec:
    """Everything read from an installed ``server_args.py``."""

    def __init__(self, flags, fields, action_classes):
        self.flags: list[FlagSpec] = flags
        self.fields: list[tuple[str, object]] = fields  # ServerArgs dataclass order, default
        self.action_classes: dict[str, dict] = action_classes  # custom Action class -> init defaults

    @property
    def store_true_dests(self) -> set:
        return {f.dest for f in self.flags if f.kw.get("action") == "store_true"}

    @property
    def unsupported_config_dests(self) -> dict:
        out = {}
        for f in self.flags:
            act = f.kw.get("action")
            if act in (None, "store", "store_true"):
                continue
            if "--config" in f.options or "--help" in f.options or "-h" in f.options:
                continue
            out[f.dest] = act
        return out


def read_server_args(path: str | os.PathLike) -> ServerArgsSpec:
    src = Path(path).read_text(encoding="utf-8")
    tree = ast.parse(src, filename=str(path))
    consts: dict = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            val = _lit(node.value, consts)
            if val is not _UNKNOWN:
                consts[node.targets[0].id] = val
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            val = _lit(node.value, consts)
            if val is not _UNKNOWN:
                consts[node.target.id] = val

    fields: list[tuple[str, object]] = []
    field_defaults: dict = {}
    action_classes: dict[str, dict] = {}
    server_cls = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            server_cls = node
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    val = _lit(stmt.value, consts) if stmt.value is not None else _UNKNOWN
                    fields.append((stmt.target.id, val))
                    field_defaults[stmt.target.id] = val
        elif isinstance(node, ast.ClassDef):
            # custom argparse.Action subclasses: remember their __init__ keyword defaults
            if any(ast.unparse(b).endswith("Action") for b in node.bases):
                info: dict = {}
                for stmt in node.body:
                    if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
                        args = stmt.args
                        pos = args.args[len(args.args) - len(args.defaults):] if args.defaults else []
                        for a, d in zip(pos, args.defaults):
                            info[a.arg] = _lit(d, consts)
                        for a, d in zip(args.kwonlyargs, args.kw_defaults):
                            if d is not None:
                                info[a.arg] = _lit(d, consts)
                        # super().__init__(..., nargs=nargs, ...) keeps them
                action_classes[node.name] = info

    scope = None
    if server_cls is not None:
        for stmt in server_cls.body:
            if isinstance(stmt, ast.FunctionDef) and stmt.name == "add_cli_args":
                scope = stmt
    calls = []
    for node in ast.walk(scope if scope is not None else tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            calls.append(node)
    calls.sort(key=lambda n: (n.lineno, n.col_offset))

    flags: list[FlagSpec] = []
    for call in calls:
        options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not options:
            continue
        kw: dict = {}
        for k in call.keywords:
            if k.arg is None:
                continue
            v = k.value
            if k.arg == "default":
                if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "ServerArgs":
                    kw["default"] = field_defaults.get(v.attr, _UNKNOWN)
                else:
                    kw["default"] = _lit(v, consts)
            elif k.arg in ("type", "action"):
                if isinstance(v, ast.Constant):
                    kw[k.arg] = v.value
                else:
                    kw[k.arg] = ast.unparse(v)
            elif k.arg == "help":
                continue
            else:
                kw[k.arg] = _lit(v, consts)
        flags.append(FlagSpec(options, kw, call.lineno))
    return ServerArgsSpec(flags, fields, action_classes)


def _human_readable_int(value: str) -> int:
    value = value.strip()
    for suf, mul in (("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30), ("Ti", 2**40)):
        if value.endswith(suf):
            return int(value[: -len(suf)]) * mul
    for suf, mul in (("k", 10**3), ("M", 10**6), ("G", 10**9), ("T", 10**12)):
        if value.endswith(suf):
            return int(float(value[: -len(suf)]) * mul)
    return int(value)


def _nullable_str(val: str):
    if not val or val == "None":
        return None
    return val


def _json_list(value: str):
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"Invalid JSON list: {value}. Please provide a valid JSON list.")


_TYPES = {
    "str": str,
    "int": int,
    "float": float,
    "json.loads": json.loads,
    "human_readable_int": _human_readable_int,
    "nullable_str": _nullable_str,
    "json_list_type": _json_list,
}


def _make_custom_action(name: str, defaults: dict):
    nargs_default = defaults.get("nargs", None)
    const_default = defaults.get("const", _UNKNOWN)
    deprecated = "Deprecated" in name

    class _Custom(argparse.Action):
        def __init__(self, option_strings, dest, nargs=nargs_default, const=None, default=None, **kwargs):
            kwargs = {k: v for k, v in kwargs.items() if k in ("type", "choices", "required", "help", "metavar")}
            if const is None and const_default is not _UNKNOWN:
                const = const_default
            if default is None and "default" in defaults and defaults["default"] is not _UNKNOWN:
                default = defaults["default"]
            super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kwargs)

        def __call__(self, parser, namespace, values, option_string=None):
            if deprecated:
                log.warning(
                    f"\033[1;33mThe command line argument '{option_string}' is deprecated and will be "
                    "removed in future versions.\033[0m"
                )
            if self.nargs == 0:
                if self.const is not None:
                    setattr(namespace, self.dest, self.const)
                return
            setattr(namespace, self.dest, values)

    _Custom.__name__ = name
    return _Custom


def build_parser(spec: ServerArgsSpec) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch_server.py")
    for flag in spec.flags:
        kw = {}
        for key, val in flag.kw.items():
            if val is _UNKNOWN:
                continue
            kw[key] = val
        act = flag.kw.get("action")
        if isinstance(act, str) and act not in ("store", "store_true", "store_false", "append", "count",
                                                 "store_const", "append_const", "extend"):
            if act in ("argparse.BooleanOptionalAction", "BooleanOptionalAction"):
                kw["action"] = argparse.BooleanOptionalAction
            else:
                short = act.rsplit(".", 1)[-1]
                kw["action"] = _make_custom_action(short, spec.action_classes.get(short, {}))
        typ = flag.kw.get("type")
        if typ is not None:
            kw["type"] = _TYPES.get(typ, str) if isinstance(typ, str) else str
        if isinstance(kw.get("choices"), (list, tuple, set)) is False:
            kw.pop("choices", None)
        for bad in ("new_flag",):
            kw.pop(bad, None)
        if kw.get("action") in ("store_true", "store_false"):
            for k in ("type", "nargs", "choices", "const", "metavar"):
                kw.pop(k, None)
        try:
            parser.add_argument(*flag.options, **kw)
        except (argparse.ArgumentError, TypeError, ValueError):
            try:
                kw.pop("choices", None)
                kw.pop("type", None)
                parser.add_argument(*flag.options, **kw)
            except Exception:
                continue
    return parser


# --------------------------------------------------------------------------- --config (YAML)


def _yaml_scalar(text: str):
    s = text.strip()
    if s == "" or s in ("~", "null", "Null", "NULL"):
        return None
    if s[0] == "'" and s.endswith("'") and len(s) >= 2:
        return s[1:-1].replace("''", "'")
    if s[0] == '"' and s.endswith('"') and len(s) >= 2:
        try:
            return json.loads(s)
        except json.JSONDecodeError:
            return s[1:-1]
    if s in ("true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"):
        return True
    if s in ("false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"):
        return False
    if re.fullmatch(r"[-+]?(0|[1-9][0-9_]*)", s):
        return int(s.replace("_", ""))
    if re.fullmatch(r"0x[0-9a-fA-F]+", s):
        return int(s, 16)
    if re.fullmatch(r"[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?", s) and any(
        c in s for c in ".eE"
    ):
        return float(s.replace("_", ""))
    if s in (".inf", ".Inf", "+.inf"):
        return float("inf")
    if s[0] == "[" and s.endswith("]"):
        inner = s[1:-1].strip()
        if not inner:
            return []
        return [_yaml_scalar(p) for p in _split_flow(inner)]
    if s[0] == "{" and s.endswith("}"):
        try:
            return json.loads(s)
        except json.JSONDecodeError:
            return s
    return s


def _split_flow(inner: str) -> list[str]:
    parts, cur, quote = [], [], None
    for ch in inner:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
            cur.append(ch)
        elif ch == ",":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _strip_comment(line: str) -> str:
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def parse_flat_yaml(text: str) -> dict | None:
    """A minimal YAML subset: a flat ``key: value`` map (plus ``- item`` lists under a key)."""
    data: dict = {}
    last_key = None
    seen_any = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw).rstrip()
        if not line.strip() or line.strip() in ("---", "..."):
            continue
        seen_any = True
        if line.lstrip().startswith("- ") or line.strip() == "-":
            if last_key is None:
                raise ValueError(f"line {lineno}: a list item outside a mapping")
            item = line.strip()[1:].strip()
            if data[last_key] is None:
                data[last_key] = []
            if not isinstance(data[last_key], list):
                raise ValueError(f"line {lineno}: mixed scalar and list for {last_key!r}")
            data[last_key].append(_yaml_scalar(item))
            continue
        if line[0] in " \t":
            raise ValueError(f"line {lineno}: nested mappings are not supported: {raw!r}")
        m = re.match(r"""^("[^"]*"|'[^']*'|[^:]+?)\s*:(\s+(.*))?$""", line)
        if not m:
            raise ValueError(f"line {lineno}: expected 'key: value', got {raw!r}")
        key = m.group(1)
        if key[0] in "'\"":
            key = key[1:-1]
        data[key] = _yaml_scalar(m.group(3) or "")
        last_key = key
    return data if seen_any else None


def _load_yaml(path: str):
    text = Path(path).read_text(encoding="utf-8")
    if not os.environ.get("PROVISION_STANDIN_NO_YAML"):
        try:
            import yaml  # type: ignore

            return yaml.safe_load(text)
        except ImportError:
            pass
    return parse_flat_yaml(text)


def merge_config(argv: list[str], spec: ServerArgsSpec) -> list[str]:
    """0.5.9 ``ConfigArgumentMerger.merge_config_with_args``: CLI > config > defaults."""
    idx = [i for i, a in enumerate(argv) if a == "--config"]
    if len(idx) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    if not idx:
        return argv
    i = idx[0]
    if i == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    path = argv[i + 1]
    suffix = Path(path).suffix.lower()
    if suffix not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {suffix}")
    if not Path(path).exists():
        raise ValueError(f"Config file not found: {path}")
    try:
        data = _load_yaml(path)
    except Exception as e:
        log.error(f"Failed to read config file {path}: {e}")
        raise
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    store_true = spec.store_true_dests
    unsupported = spec.unsupported_config_dests
    out: list[str] = []
    for key, value in data.items():
        key = str(key)
        norm = key.replace("-", "_")
        if norm in unsupported:
            act = unsupported[norm]
            raise ValueError(f"Unsupported config option '{norm}' with action '{str(act).rsplit('.', 1)[-1]}'")
        if isinstance(value, bool):
            if norm in store_true:
                if value:
                    out.append(f"--{key}")
            else:
                out.extend([f"--{key}", str(value).lower()])
        elif isinstance(value, list):
            if value:
                out.append(f"--{key}")
                out.extend(str(v) for v in value)
        else:
            out.extend([f"--{key}", str(value)])
    return out + argv[:i] + argv[i + 2 :]


# --------------------------------------------------------------------------- stub importer


_STDLIB = set(getattr(sys, "stdlib_module_names", ())) | set(sys.builtin_module_names) | {"__future__"}


def _is_decoratee(obj) -> bool:
    return inspect.isfunction(obj) or inspect.isclass(obj) or isinstance(obj, (staticmethod, classmethod, property))


class _StubMeta(abc.ABCMeta):
    """Metaclass of stub classes: attribute access, calls and subscripts all succeed on stubs
    themselves; classes *derived* from a stub (the real model classes) behave normally."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if type.__getattribute__(cls, "__dict__").get("_stub_root"):
            return _stub_class(f"{type.__getattribute__(cls, '_stub_path')}.{name}")
        raise AttributeError(f"type object '{cls.__name__}' has no attribute '{name}'")

    def __call__(cls, *args, **kwargs):
        if type.__getattribute__(cls, "__dict__").get("_stub_root"):
            if len(args) == 1 and not kwargs and _is_decoratee(args[0]):
                return args[0]  # used as a decorator
            inst = object.__new__(cls)
            return inst
        return super().__call__(*args, **kwargs)

    def __getitem__(cls, item):
        return cls

    def __setitem__(cls, key, value):
        pass

    def __iter__(cls):
        return iter(())

    def __or__(cls, other):
        if other is None or isinstance(other, type):
            return type.__or__(cls, other)
        return cls

    def __ror__(cls, other):
        if other is None or isinstance(other, type):
            return type.__ror__(cls, other)
        return cls

    def register(cls, *args, **kwargs):
        # ABCMeta.register would shadow stub attributes such as AutoConfig.register(...)
        if type.__getattribute__(cls, "__dict__").get("_stub_root"):
            return _StubMeta.__call__(_stub_class(f"{type.__getattribute__(cls, '_stub_path')}.register"), *args, **kwargs)
        return super().register(*args, **kwargs)

    def __repr__(cls):
        d = type.__getattribute__(cls, "__dict__")
        if d.get("_stub_root"):
            return f"<stub {d.get('_stub_path')}>"
        return super().__repr__()


class _StubBase(metaclass=_StubMeta):
    _stub_root = False
    _stub_path = "stub"

    def __init__(self, *args, **kwargs):
        pass

    def __init_subclass__(cls, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if type(self).__dict__.get("_stub_root"):
            return _stub_class(f"{type(self)._stub_path}().{name}")
        # what torch.nn.Module.__getattr__ raises
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and _is_decoratee(args[0]):
            return args[0]
        return _stub_class(f"{type(self)._stub_path}()")()

    def __getitem__(self, item):
        return self

    def __setitem__(self, key, value):
        pass

    def __iter__(self):
        return iter(())

    def __contains__(self, item):
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __bool__(self):
        return True

    def __int__(self):
        return 0

    def __index__(self):
        return 0

    def __float__(self):
        return 0.0

    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        return self is other

    def __lt__(self, other):
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def _self(self, *a, **k):
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _self
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _self
    __pow__ = __rpow__ = __matmul__ = __rmatmul__ = __neg__ = __pos__ = __invert__ = _self
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = __lshift__ = __rshift__ = _self


_STUB_CLASSES: dict[str, type] = {}


def _stub_class(path: str) -> type:
    cls = _STUB_CLASSES.get(path)
    if cls is None:
        name = path.rsplit(".", 1)[-1].replace("()", "") or "stub"
        if not name.isidentifier():
            name = "stub"
        cls = _StubMeta(name, (_StubBase,), {"_stub_root": True, "_stub_path": path, "__module__": path.rsplit(".", 1)[0]})
        _STUB_CLASSES[path] = cls
    return cls


_STAR_EXPORTS: dict[str, list[str]] = {}  # stub module -> names a star-import of it must provide


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            if name == "__version__":
                return "99.0.0"
            if name == "__all__" and self.__name__ in _STAR_EXPORTS:
                return _STAR_EXPORTS[self.__name__]
            raise AttributeError(name)
        return _stub_class(f"{self.__name__}.{name}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves a stub module for every non-stdlib import (torch, transformers, sglang.*, ...)."""

    def __init__(self, passthrough: set[str]):
        self.passthrough = passthrough
        self.created: list[str] = []

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top in _STDLIB or top in self.passthrough:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        mod = _StubModule(spec.name)
        self.created.append(spec.name)
        return mod

    def exec_module(self, module):
        module.__path__ = []


class _StubImports:
    """Context manager: stub finder installed first on sys.meta_path; everything it (or the
    executed modules) added to sys.modules is removed on exit."""

    def __init__(self, passthrough=()):
        self.finder = _StubFinder(set(passthrough))

    def __enter__(self):
        self.before = set(sys.modules)
        self.dont_write = sys.dont_write_bytecode
        sys.dont_write_bytecode = True
        sys.meta_path.insert(0, self.finder)
        return self

    def __exit__(self, *exc):
        try:
            sys.meta_path.remove(self.finder)
        except ValueError:
            pass
        sys.dont_write_bytecode = self.dont_write
        for name in set(sys.modules) - self.before:
            if name.partition(".")[0] not in _STDLIB:  # stubs, executed model modules, external package
                sys.modules.pop(name, None)
        return False


def exec_model_file(path: str | os.PathLike, modname: str) -> types.ModuleType:
    """compile() + exec the file in a fresh module namespace (stub imports must be active).

    Raises whatever the import would raise (SyntaxError, IndentationError, NameError, ...)."""
    path = str(path)
    with open(path, "rb") as fh:
        source = fh.read()
    code = compile(source, path, "exec", dont_inherit=True)
    _prepare_star_imports(source, modname)
    mod = types.ModuleType(modname)
    mod.__file__ = path
    mod.__package__ = modname.rpartition(".")[0]
    mod.__spec__ = importlib.machinery.ModuleSpec(modname, None, origin=path)
    mod.__spec__.has_location = True
    mod.__builtins__ = __builtins__
    sys.modules[modname] = mod
    try:
        exec(code, mod.__dict__)
    except BaseException:
        sys.modules.pop(modname, None)
        raise
    return mod


def _prepare_star_imports(source: bytes, modname: str) -> None:
    """``from <stubbed> import *`` cannot know the names; give it the names this file uses
    but never binds (so only files with such a star-import get that leniency)."""
    if b"import *" not in source and b"import  *" not in source:
        return
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    package = modname.rpartition(".")[0]
    star = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1] if node.level > 1 else base
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.partition(".")[0] not in _STDLIB:
                star.append(target)
    if not star:
        return
    bound, loaded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                bound.add((a.asname or a.name).partition(".")[0])
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    import builtins

    names = sorted(n for n in loaded - bound if not hasattr(builtins, n))
    for target in star:
        _STAR_EXPORTS[target] = names


def _entry_classes(mod) -> list:
    entry = getattr(mod, "EntryClass", None)
    if entry is None:
        return []
    return list(entry) if isinstance(entry, (list, tuple)) else [entry]


class _Recorder:
    """Stands in for the inner language model; has the three EAGLE-3 methods."""

    def __init__(self):
        self.calls: list[str] = []

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.calls.append("set_eagle3_layers_to_capture")

    def get_embed_and_head(self):
        self.calls.append("get_embed_and_head")
        return ("embed", "head")

    def set_embed_and_head(self, embed, head):
        self.calls.append("set_embed_and_head")


class ModelProbe:
    """Outcome of 'importing' the model module the way SGLang's registry does."""

    def __init__(self):
        self.arch = DEFAULT_ARCH
        self.module_name = ""
        self.file = ""
        self.cls = None
        self.import_error: BaseException | None = None
        self.duplicated: str | None = None
        self.fatal: tuple[str, str] | None = None  # (exc type name, message) for a start-up traceback
        self.warnings: list[str] = []
        self.supported: list[str] = []

    def make_instance(self):
        """An instance without running __init__, whose inner model is a recorder.
        Returns (instance, None) or (None, class) when construction is impossible."""
        cls = self.cls
        try:
            inst = object.__new__(cls)
        except Exception:
            return None
        for attr in ("language_model", "model", "llm"):
            desc = inspect.getattr_static(cls, attr, None)
            if desc is not None and hasattr(desc, "__set__"):
                continue
            try:
                object.__setattr__(inst, attr, _Recorder())
            except Exception:
                pass
        return inst


def _find_model_file(models_dir: Path, arch: str) -> Path | None:
    pat = re.compile(rf"^class\s+{re.escape(arch)}\b", re.M)
    preferred = models_dir / DEFAULT_MODEL_FILE
    if arch == DEFAULT_ARCH and preferred.exists():
        return preferred
    for p in sorted(models_dir.glob("*.py")):
        try:
            if pat.search(p.read_text(encoding="utf-8", errors="replace")):
                return p
        except OSError:
            continue
    return None


_ENTRY_RE = re.compile(r"^EntryClass\s*=\s*(\[[^\]]*\]|\([^)]*\)|[^\n]+)", re.M)


def _supported_sample(models_dir: Path, limit: int = 12) -> list[str]:
    names: list[str] = []
    for p in sorted(models_dir.glob("*.py")):
        try:
            text = p.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        m = _ENTRY_RE.search(text)
        if m:
            names.extend(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", m.group(1)))
        if len(names) >= limit:
            break
    return names[:limit]


def probe_model(sglang_dir: Path, arch: str | None) -> ModelProbe:
    """Import the model module(s) the way SGLang's registry does, with stubbed dependencies.

    The candidates are the file defining the architecture (``kimi_k25.py`` for Kimi-K2.5) and any
    other ``models/*.py`` whose text defines or registers the same class name (a backup copy left
    behind, say); they are executed in pkgutil (file name) order.  A module that fails to import is
    skipped with SGLang's warning; two modules registering the same class name are SGLang's
    ``Duplicated model implementation`` assertion; ``SGLANG_EXTERNAL_MODEL_PACKAGE`` overrides."""
    probe = ModelProbe()
    models_dir = sglang_dir / "srt" / "models"
    probe.arch = os.environ.get("PROVISION_STANDIN_MODEL_CLASS") or arch or DEFAULT_ARCH
    override = os.environ.get("PROVISION_STANDIN_MODEL_FILE")
    if override:
        path = Path(override)
        if not path.is_absolute():
            path = models_dir / path
    else:
        path = _find_model_file(models_dir, probe.arch)
    probe.supported = _supported_sample(models_dir)
    candidates: list[Path] = [path] if (path is not None and path.exists()) else []
    if not override:
        cls_re = re.compile(rf"^class\s+{re.escape(probe.arch)}\b", re.M)
        for p in sorted(models_dir.glob("*.py")):
            if path is not None and p.resolve() == path.resolve():
                continue
            try:
                text = p.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            m = _ENTRY_RE.search(text)
            if cls_re.search(text) or (m and probe.arch in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", m.group(1))):
                candidates.append(p)
    candidates.sort(key=lambda p: p.name)
    if path is not None:
        probe.file = str(path)
        probe.module_name = f"sglang.srt.models.{path.stem}"
    # Only a release whose registry reads the variable honours it (0.5.6+; 0.5.5.post3 does not).
    ext_pkg = os.environ.get("SGLANG_EXTERNAL_MODEL_PACKAGE", "").strip() if reads_external_package(sglang_dir) else ""
    passthrough = {ext_pkg.partition(".")[0]} if ext_pkg else set()

    with _StubImports(passthrough):
        registry: dict[str, object] = {}
        origin: dict[str, Path] = {}
        for p in candidates:
            modname = f"sglang.srt.models.{p.stem}"
            try:
                mod = exec_model_file(p, modname)
            except Exception as e:  # noqa: BLE001 - any import failure is what SGLang ignores
                if path is not None and p == path:
                    probe.import_error = e
                probe.warnings.append(import_error_line(forms_version(sglang_dir), modname, e))
                continue
            for c in _entry_classes(mod):
                name = getattr(c, "__name__", None)
                if not name:
                    continue
                if name in registry:
                    probe.duplicated = name
                    probe.fatal = ("AssertionError", f"Duplicated model implementation for {name}")
                    return probe
                registry[name] = c
                origin[name] = p
        if ext_pkg:
            _load_external(ext_pkg, registry, probe, forms_version(sglang_dir))
            if probe.fatal is not None:
                return probe
        cls = registry.get(probe.arch)
        if isinstance(cls, type):
            probe.cls = cls
            if probe.arch in origin:
                probe.file = str(origin[probe.arch])
                probe.module_name = f"sglang.srt.models.{origin[probe.arch].stem}"
    return probe


def reads_external_package(sglang_dir: Path) -> bool:
    """Whether the installed ``srt/models/registry.py`` reads ``SGLANG_EXTERNAL_MODEL_PACKAGE``."""
    try:
        return "SGLANG_EXTERNAL_MODEL_PACKAGE" in (Path(sglang_dir) / "srt" / "models" / "registry.py").read_text(
            encoding="utf-8", errors="replace")
    except OSError:
        return False


def _load_external(pkg: str, registry: dict, probe: ModelProbe, version: tuple = (0, 5, 9)) -> None:
    """``ModelRegistry.register(SGLANG_EXTERNAL_MODEL_PACKAGE, overwrite=True)``."""
    import importlib
    import pkgutil

    try:
        package = importlib.import_module(pkg)
    except Exception as e:  # noqa: BLE001 - SGLang does not catch this one
        probe.fatal = (type(e).__name__, str(e))
        return
    path = getattr(package, "__path__", None)
    if path is None:
        probe.fatal = ("AttributeError", f"module '{pkg}' has no attribute '__path__'")
        return
    for _, name, ispkg in pkgutil.iter_modules(path, pkg + "."):
        if ispkg:
            continue
        try:
            module = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001
            probe.warnings.append(import_error_line(version, name, e))
            continue
        for c in _entry_classes(module):
            cname = getattr(c, "__name__", None)
            if cname:
                registry[cname] = c  # overwrite=True


# --------------------------------------------------------------------------- tracebacks


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


# --------------------------------------------------------------------------- model / shard facts


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

    def __init__(self, sglang_dir: Path, args: argparse.Namespace, spec: ServerArgsSpec):
        self.sglang_dir = sglang_dir
        self.args = args
        self.spec = spec
        g = lambda name, default=None: getattr(args, name, default)  # noqa: E731
        self.tp = int(g("tensor_parallel_size", None) or g("tp_size", None) or 1)
        self.host = g("host", "127.0.0.1") or "127.0.0.1"
        self.port = int(g("port", 30000) or 30000)
        self.api_key = g("api_key")
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
        self.fault = (os.environ.get("PROVISION_STANDIN_FAULT") or "").strip()
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
        self.calls_eagle3_layers = self.spec_alg == "EAGLE3"
        self.calls_embed_head = self.spec_alg in ("EAGLE", "EAGLE3", "NEXTN")
        self.max_total_tokens = 421376
        self.probe: ModelProbe | None = None
        self.version = _sglang_version(sglang_dir)


def _sglang_version(sglang_dir: Path) -> str:
    for name in ("_version.py", "version.py"):
        try:
            text = (sglang_dir / name).read_text(encoding="utf-8")
        except OSError:
            continue
        m = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
        if m:
            return m.group(1)
    for p in sglang_dir.parent.glob("sglang-*.dist-info"):
        return p.name[len("sglang-"): -len(".dist-info")]
    return "0.0.0"


class _Rank:
    def __init__(self, launch: Launch, rank: int, ready_fd: int, go_fd: int):
        self.L = launch
        self.rank = rank
        self.ready_fd = ready_fd
        self.go_fd = go_fd
        self.gpu = rank
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

    def run(self) -> None:
        L = self.L
        ls = L.load_seconds
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


RANKS_OUTLIVE = os.environ.get("PROVISION_STANDIN_RANKS_OUTLIVE", "") == "1"


def _child_setup(name: str, prefix: str) -> None:
    if not RANKS_OUTLIVE:
        _set_pdeathsig()
    _set_comm(name)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    log.prefix = prefix


# --------------------------------------------------------------------------- HTTP


class _State:
    def __init__(self):
        self.status = "starting"  # starting | up | shutting_down
        self.health_hits = 0
        self.lock = threading.Lock()
        self.prompt_tokens_total = 0
        self.gen_tokens_total = 0
        self.requests_total = 0
        self.dead_ranks: set[int] = set()
        self.up_since = 0.0


def _make_handler(L: Launch, state: _State):
    spec_on = L.spec_alg is not None
    accept_len = 3.10 if L.has_draft else 1.0
    accept_rate = 0.78 if L.has_draft else 0.0
    throughput = 96.2 if L.spec_alg == "EAGLE3" else 54.0
    flap_every = max(_env_int("PROVISION_STANDIN_FLAP_EVERY", 2), 1)
    flap_seconds = _env_float("PROVISION_STANDIN_FLAP_SECONDS", 0.0)
    gen = _generator(L)  # /generate, /flush_cache, internal_states (standin_generate.py, when installed)
    if gen is not None:  # its per-host speed and accept length (environment) in the log and /metrics too
        accept_len, throughput = (gen.accept_len if L.has_draft else accept_len), gen.tok_s

    class Handler(BaseHTTPRequestHandler):
        server_version = "uvicorn"
        sys_version = ""
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):  # uvicorn access log goes to stdout
            pass

        def _access(self, code: int) -> None:
            phrase = {200: "OK", 401: "Unauthorized", 404: "Not Found", 503: "Service Unavailable",
                      400: "Bad Request"}.get(code, "")
            _uvicorn("INFO", f'{self.client_address[0]}:{self.client_address[1]} - "{self.command} {self.path} '
                             f'HTTP/1.1" {code} {phrase}', fd=1)

        def _send(self, code: int, body: bytes = b"", ctype: str = "application/json") -> None:
            self.send_response(code)
            if body or ctype != "application/json":
                self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self._access(code)

        def _json(self, code: int, obj) -> None:
            self._send(code, json.dumps(obj).encode())

        def _authorized(self, path: str) -> bool:
            if not L.api_key or path.startswith("/health") or path.startswith("/metrics"):
                return True
            return self.headers.get("Authorization", "") == f"Bearer {L.api_key}"

        def _body(self) -> dict:
            n = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(n) if n else b""
            try:
                obj = json.loads(raw or b"{}")
                return obj if isinstance(obj, dict) else {}
            except ValueError:
                return {}

        def _health(self) -> None:
            with state.lock:
                status = state.status
                state.health_hits += 1
                hits = state.health_hits
            ok = status == "up" and not state.dead_ranks
            if ok and L.fault == "flap":
                if flap_seconds > 0:
                    ok = int((time.monotonic() - state.up_since) / flap_seconds) % 2 == 0
                else:
                    ok = ((hits - 1) // flap_every) % 2 == 0
            self._send(200 if ok else 503, b"", ctype="text/plain")

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if not self._authorized(path):
                return self._json(401, {"error": "Unauthorized"})
            if path in ("/health", "/health_generate"):
                return self._health()
            if path in ("/model_info", "/get_model_info"):
                if path == "/get_model_info":
                    log.warning("Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                                "Please use '/model_info' instead.")
                return self._json(200, {
                    "model_path": L.model_path, "tokenizer_path": getattr(L.args, "tokenizer_path", None) or L.model_path,
                    "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                    "has_image_understanding": True, "has_audio_understanding": False,
                    "model_type": L.model_type, "architectures": L.archs,
                })
            if path in ("/server_info", "/get_server_info"):
                info = _server_args_dict(L)
                info.update({
                    "internal_states": gen.server_states() if gen else [{
                        "avg_spec_accept_length": accept_len if spec_on else None,
                        "last_gen_throughput": throughput, "memory_usage": {}}],
                    "version": L.version,
                })
                return self._json(200, info)
            if path == "/v1/models":
                return self._json(200, {"object": "list", "data": [{
                    "id": L.served_name, "object": "model", "created": int(time.time()),
                    "owned_by": "sglang", "root": L.served_name, "parent": None, "max_model_len": L.context_len}]})
            if path == "/metrics":
                if not L.enable_metrics:
                    return self._json(404, {"detail": "Not Found"})
                return self._send(200, _metrics(L, state, accept_len, accept_rate, throughput).encode(),
                                  ctype="text/plain; version=0.0.4; charset=utf-8")
            if path == "/get_load":
                return self._json(200, [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}])
            return self._json(404, {"detail": "Not Found"})

        do_HEAD = do_GET

        def do_POST(self):
            path = self.path.split("?", 1)[0]
            if not self._authorized(path):
                self._body()
                return self._json(401, {"error": "Unauthorized"})
            body = self._body()
            if path == "/generate" and gen:
                return gen.generate(self, body, lambda p, n: self._log_batch(p, n))
            if path == "/generate":
                text = body.get("text") or ""
                sp = body.get("sampling_params") or {}
                n = int(sp.get("max_new_tokens") or 16)
                prompt_tokens = max(1, len(str(text).split()) + 2)
                return self._json(200, self._complete(text, prompt_tokens, n, native=True))
            if path in ("/v1/chat/completions", "/v1/completions"):
                n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
                prompt = json.dumps(body.get("messages") or body.get("prompt") or "")
                res = self._complete(prompt, max(1, len(prompt.split())), n, native=False)
                usage = {"prompt_tokens": res["meta_info"]["prompt_tokens"],
                         "completion_tokens": n, "total_tokens": res["meta_info"]["prompt_tokens"] + n}
                if path == "/v1/chat/completions":
                    choice = {"index": 0, "message": {"role": "assistant", "content": res["text"]},
                              "finish_reason": "length"}
                else:
                    choice = {"index": 0, "text": res["text"], "finish_reason": "length"}
                return self._json(200, {"id": res["meta_info"]["id"], "object": "chat.completion",
                                        "created": int(time.time()), "model": L.served_name,
                                        "choices": [choice], "usage": usage})
            if path == "/flush_cache" and gen:
                return gen.flush(self)
            if path == "/flush_cache":
                return self._send(200, b"Cache flushed.\n", ctype="text/plain")
            return self._json(404, {"detail": "Not Found"})

        def _complete(self, text, prompt_tokens: int, n: int, native: bool) -> dict:
            latency = n / throughput
            time.sleep(min(latency, 0.05))
            self._log_batch(prompt_tokens, n)
            meta = {
                "id": uuid.uuid4().hex, "finish_reason": {"type": "length", "length": n},
                "prompt_tokens": prompt_tokens, "weight_version": "default", "completion_tokens": n,
                "cached_tokens": 0, "e2e_latency": round(latency, 4),
            }
            if spec_on:
                meta.update({"spec_verify_ct": max(1, round(n / accept_len)),
                             "spec_accept_length": accept_len, "spec_accept_rate": accept_rate})
            words = ("The quick brown fox jumps over the lazy dog " * (n // 9 + 1)).split()[:n]
            return {"text": " ".join(words), "meta_info": meta}

        def _log_batch(self, prompt_tokens: int, n: int) -> None:
            with state.lock:
                state.prompt_tokens_total += prompt_tokens
                state.gen_tokens_total += n
                state.requests_total += 1
            prefix = " TP0" if L.tp > 1 else ""  # the scheduler (rank 0) logs these
            ts = time.strftime("%Y-%m-%d %H:%M:%S")
            log.raw(f"[{ts}{prefix}] Prefill batch, #new-seq: 1, #new-token: {prompt_tokens}, #cached-token: 0, "
                    f"token usage: 0.00, #running-req: 0, #queue-req: 0, \n")
            msg = f"Decode batch, #running-req: 1, #token: {prompt_tokens + n}, token usage: 0.01, "
            if spec_on:
                msg += f"accept len: {accept_len:.2f}, accept rate: {accept_rate:.2f}, "
            msg += f"cuda graph: True, gen throughput (token/s): {throughput:.2f}, #queue-req: 0"
            log.raw(f"[{ts}{prefix}] {msg}\n")

    return Handler


def _generator(L: Launch):
    """standin_generate.Generator for this server, or None where that module is not installed."""
    try:
        import standin_generate  # beside this file (/opt/provision-standin on a sandbox host)
    except ImportError:
        return None
    return standin_generate.make(L)


def _metrics(L: Launch, state: _State, accept_len: float, accept_rate: float, throughput: float) -> str:
    labels = f'model_name="{L.served_name}",engine_type="unified",tp_rank="0",pp_rank="0"'
    rows = [
        ("sglang:num_running_reqs", "gauge", "The number of running requests.", 0),
        ("sglang:num_used_tokens", "gauge", "The number of used tokens.", 0),
        ("sglang:token_usage", "gauge", "The token usage.", 0.0),
        ("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", throughput),
        ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", 0),
        ("sglang:spec_accept_length", "gauge", "The average acceptance length of speculative decoding.",
         accept_len if L.has_draft else 0.0),
        ("sglang:spec_accept_rate", "gauge", "The average acceptance rate of speculative decoding.",
         accept_rate if L.has_draft else 0.0),
        ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", float(state.prompt_tokens_total)),
        ("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", float(state.gen_tokens_total)),
        ("sglang:num_requests_total", "counter", "Number of requests processed.", float(state.requests_total)),
    ]
    out = []
    for name, kind, help_, val in rows:
        out.append(f"# HELP {name} {help_}\n# TYPE {name} {kind}\n{name}{{{labels}}} {val}\n")
    return "".join(out)


_CLI_ALIASES = {  # ServerArgs.from_cli_args renames these
    "tp_size": "tensor_parallel_size",
    "pp_size": "pipeline_parallel_size",
    "attn_cp_size": "attention_context_parallel_size",
    "moe_dp_size": "moe_data_parallel_size",
    "dp_size": "data_parallel_size",
    "ep_size": "expert_parallel_size",
}


def _server_args_dict(L: Launch) -> dict:
    ns = vars(L.args)
    out: dict = {}
    for name, default in L.spec.fields:
        if name in ns:
            val = ns[name]
        elif _CLI_ALIASES.get(name) in ns:
            val = ns[_CLI_ALIASES[name]]
        elif default is _UNKNOWN:
            continue
        else:
            val = default
        if name == "tokenizer_path" and val is None:
            val = L.model_path
        if name == "served_model_name" and val is None:
            val = L.model_path
        out[name] = val
    if "tp_size" not in out:
        out["tp_size"] = L.tp
    return out


def server_args_repr(L: Launch) -> str:
    parts = []
    for k, v in _server_args_dict(L).items():
        try:
            parts.append(f"{k}={v!r}")
        except Exception:
            parts.append(f"{k}=None")
    return "ServerArgs(" + ", ".join(parts) + ")"


class _V6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


# --------------------------------------------------------------------------- process tree


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    try:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    stat = fh.read().decode("utf-8", "replace")
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    except OSError:
        return []
    out, stack = [], [pid]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


class Main:
    def __init__(self, L: Launch):
        self.L = L
        self.children: list[int] = []
        self.rank_pids: list[int] = []
        self.stop_requested = False
        self.quitting = False
        self.state = _State()
        self.httpd = None
        self.rank_dead_exc = "EOFError"

    def kill_children(self) -> None:
        pids = set(self.children) | set(_descendants(os.getpid()))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in self.children:
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass

    def kill_tree(self) -> None:
        """SGLang's kill_process_tree(os.getpid()): children then itself, with SIGKILL."""
        self.kill_children()
        os.kill(os.getpid(), signal.SIGKILL)

    def on_sigquit(self, signum, frame) -> None:
        if self.quitting:  # several ranks failing at once
            return
        self.quitting = True
        log.error("Received sigquit from a child process. It usually means the child failed.")
        self.kill_tree()

    def on_term(self, signum, frame) -> None:
        self.stop_requested = True

    def spawn(self) -> list[tuple[int, int]]:
        """Fork the ranks and the detokenizer; return (status read fd, go write fd) per rank."""
        L = self.L
        links: list[tuple[int, int]] = []
        for rank in range(L.tp):
            r, w = os.pipe()
            go_r, go_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(r)
                    os.close(go_w)
                    for a, b in links:
                        os.close(a)
                        os.close(b)
                    _child_setup(f"sglang::scheduler_TP{rank}", f" TP{rank}" if L.tp > 1 else "")
                    _Rank(L, rank, w, go_r).run()
                finally:
                    os._exit(0)
            os.close(w)
            os.close(go_r)
            links.append((r, go_w))
            self.children.append(pid)
            self.rank_pids.append(pid)
        pid = os.fork()
        if pid == 0:
            try:
                for a, b in links:
                    os.close(a)
                    os.close(b)
                _child_setup("sglang::detokenizer", "")
                ppid = os.getppid()
                while os.getppid() == ppid or RANKS_OUTLIVE:
                    time.sleep(0.5)
            finally:
                os._exit(0)
        self.children.append(pid)
        return links

    def wait_ready(self, links: list[tuple[int, int]]) -> int:
        """Run the rank barriers until every rank is ready.
        0 when all are ready; 1 when a rank died; -1 when stop was requested."""
        pending = {r: i for i, (r, _) in enumerate(links)}
        bufs = {r: b"" for r, _ in links}
        arrived: dict[str, set[int]] = {}
        n = len(links)
        while pending:
            if self.stop_requested:
                return -1
            try:
                readable, _, _ = select.select(list(pending), [], [], 0.2)
            except InterruptedError:
                continue
            for fd in readable:
                data = os.read(fd, 256)
                rank = pending[fd]
                if data:
                    bufs[fd] += data
                    while b"\n" in bufs[fd]:
                        msg, bufs[fd] = bufs[fd].split(b"\n", 1)
                        stage = msg.decode(errors="replace")
                        if stage == "ready":
                            pending.pop(fd)
                            os.close(fd)
                            break
                        arrived.setdefault(stage, set()).add(rank)
                        if len(arrived[stage]) == n:
                            for _, go in links:
                                try:
                                    os.write(go, b"g")
                                except OSError:
                                    pass
                    continue
                pending.pop(fd)
                os.close(fd)
                time.sleep(0.3)  # a SIGQUIT may be on its way
                if self.stop_requested:  # the whole group got SIGTERM: not a failure
                    return -1
                code = None
                try:
                    _, status = os.waitpid(self.rank_pids[rank], 0)
                    code = os.waitstatus_to_exitcode(status)
                except OSError:
                    pass
                messages, self.rank_dead_exc = rank_dead_lines(forms_version(self.L.sglang_dir), rank, code)
                for m in messages:
                    log.error(m)
                return 1
        for _, go in links:
            try:
                os.close(go)
            except OSError:
                pass
        return 0

    def serve(self) -> int:
        L = self.L
        cls = _V6Server if ":" in L.host else ThreadingHTTPServer
        try:
            httpd = cls((L.host, L.port), _make_handler(L, self.state))
        except OSError as e:
            _uvicorn("ERROR", f"[Errno {e.errno}] error while attempting to bind on address "
                              f"({L.host!r}, {L.port}): {e.strerror.lower() if e.strerror else e}")
            self.kill_children()
            return 1
        httpd.daemon_threads = True
        self.httpd = httpd
        _uvicorn("INFO", f"Started server process [{os.getpid()}]")
        _uvicorn("INFO", "Waiting for application startup.")
        _uvicorn("INFO", "Application startup complete.")
        shown = f"[{L.host}]" if ":" in L.host else L.host
        _uvicorn("INFO", f"Uvicorn running on http://{shown}:{L.port} (Press CTRL+C to quit)")
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        threading.Thread(target=self.warmup, daemon=True).start()
        while not self.stop_requested:
            time.sleep(0.1)
            self.reap()
        # drain: /health -> 503, give in-flight requests a moment, then stop the tree
        with self.state.lock:
            self.state.status = "shutting_down"
        time.sleep(_env_float("PROVISION_STANDIN_DRAIN_SECONDS", 0.5))
        httpd.shutdown()
        httpd.server_close()
        self.kill_children()
        return 0

    def reap(self) -> None:
        for rank, pid in enumerate(self.rank_pids):
            if rank in self.state.dead_ranks:
                continue
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.state.dead_ranks.add(rank)

    def warmup(self) -> None:
        L = self.L
        time.sleep(L.warmup_seconds)
        if self.stop_requested:
            return
        if L.fault == "warmup-fail":
            log.error(
                "Initialization failed. warmup error: Traceback (most recent call last):\n"
                f'  File "{L.sglang_dir}/srt/entrypoints/http_server.py", line 1790, in _execute_server_warmup\n'
                "    res = requests.post(\n"
                "requests.exceptions.ReadTimeout: HTTPConnectionPool(host='127.0.0.1', port="
                f"{L.port}): Read timed out. (read timeout=600)"
            )
            self.kill_tree()
        _uvicorn("INFO", '127.0.0.1:0 - "GET /model_info HTTP/1.1" 200 OK', fd=1)
        prefix = " TP0" if L.tp > 1 else ""
        ts = time.strftime("%Y-%m-%d %H:%M:%S")
        log.raw(f"[{ts}{prefix}] Prefill batch, #new-seq: 1, #new-token: 64, #cached-token: 0, token usage: 0.00, "
                f"#running-req: 0, #queue-req: 0, \n")
        _uvicorn("INFO", '127.0.0.1:0 - "POST /v1/chat/completions HTTP/1.1" 200 OK', fd=1)
        with self.state.lock:
            if self.state.status == "starting":
                self.state.status = "up"
                self.state.up_since = time.monotonic()
        log.info("The server is fired up and ready to roll!")

    def run(self) -> int:
        signal.signal(signal.SIGQUIT, self.on_sigquit)
        signal.signal(signal.SIGTERM, self.on_term)
        signal.signal(signal.SIGINT, self.on_term)
        try:
            links = self.spawn()
            rc = self.wait_ready(links)
            if rc == -1:
                self.kill_children()
                return 0
            if rc == 1:
                _print_traceback(self.L.sglang_dir, [
                    ("launch_server.py", "run_server(server_args)", '__name__ == "__main__"'),
                    ("entrypoints/http_server.py", "launch_server("),
                    ("entrypoints/engine.py", "_wait_for_scheduler_ready("),
                    ("entrypoints/engine.py", "data = scheduler_pipe_readers[i].recv()"),
                ], self.rank_dead_exc + "\n")
                self.kill_children()
                return 1
            if self.stop_requested:
                self.kill_children()
                return 0
            return self.serve()
        finally:
            if self.children:
                for pid in self.children:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass


def _print_traceback(sglang_dir: Path, chain: list[tuple], exc_text: str) -> None:
    """An uncaught exception in the main process, as Python prints it."""
    log.raw("Traceback (most recent call last):\n" + _frames(sglang_dir, chain) + exc_text)


# --------------------------------------------------------------------------- validation like ServerArgs.__post_init__


def _validate(args: argparse.Namespace) -> tuple[str, str] | None:
    alg = getattr(args, "speculative_algorithm", None)
    if alg in ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE"):
        steps = getattr(args, "speculative_num_steps", None)
        topk = getattr(args, "speculative_eagle_topk", None)
        draft = getattr(args, "speculative_num_draft_tokens", None)
        if steps is None:
            if topk is not None or draft is not None:
                return ("AssertionError", "")
            args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens = 3, 1, 4
        elif topk is None or draft is None:
            # SGLang would fail later with a TypeError; keep the defaults instead
            args.speculative_eagle_topk = topk if topk is not None else 1
            args.speculative_num_draft_tokens = draft if draft is not None else steps + 1
        if args.speculative_eagle_topk == 1 and args.speculative_num_draft_tokens != args.speculative_num_steps + 1:
            log.warning("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                        "speculative_eagle_topk == 1")
            args.speculative_num_draft_tokens = args.speculative_num_steps + 1
    return None


# --------------------------------------------------------------------------- entry point


def main(sglang_dir, argv: list[str] | None = None) -> NoReturn:
    """Run the stand-in and exit.  ``sglang_dir`` is the installed ``sglang`` package directory;
    flags come from ``argv`` (default ``sys.argv[1:]``).

    Always ends the process: ``SystemExit`` with 0/1/2, or SIGKILL of the whole tree on the
    fatal paths (a failed scheduler, a failed warm-up), like SGLang."""
    sys.exit(run(sglang_dir, argv))


def run(sglang_dir, argv: list[str] | None = None) -> int:
    """Like :func:`main` but returns the exit code (the fatal paths still SIGKILL the tree)."""
    sglang_dir = Path(sglang_dir)
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 2 and argv[0] == "--sglang-dir":  # direct-run convenience
        sglang_dir = Path(argv[1])
        argv = argv[2:]
    rc = _main(sglang_dir, argv)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    return rc


def _early_stop(signum, frame):
    raise SystemExit(0)  # stopped before any child exists


def _main(sglang_dir: Path, argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _early_stop)
    signal.signal(signal.SIGINT, _early_stop)
    server_args_py = sglang_dir / "srt" / "server_args.py"
    spec = read_server_args(server_args_py)
    parser = build_parser(spec)
    prep = [("launch_server.py", "server_args = prepare_server_args(sys.argv[1:])")]
    if "--config" in argv:
        try:
            argv = merge_config(argv, spec)
        except Exception as e:  # noqa: BLE001
            _print_traceback(sglang_dir, prep + [
                ("server_args.py", "argv = config_merger.merge_config_with_args(argv)"),
            ], _exc_line(e))
            return 1
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    failure = _validate(args)
    if failure:
        _print_traceback(sglang_dir, prep + [
            ("server_args.py", "return ServerArgs.from_cli_args(raw_args)"),
            ("server_args.py", "return cls(**{attr: getattr(args, attr) for attr in attrs})"),
            ("server_args.py", "self._handle_speculative_decoding()"),
            ("server_args.py", "self.speculative_eagle_topk is None"),
        ], f"{failure[0]}\n" if not failure[1] else f"{failure[0]}: {failure[1]}\n")
        return 1

    L = Launch(sglang_dir, args, spec)
    log.info(f"server_args={server_args_repr(L)}")

    probe = probe_model(sglang_dir, L.archs[0] if L.archs else None)
    L.probe = probe
    for w in probe.warnings:
        log.warning(w)
    if probe.fatal is not None:
        _print_traceback(sglang_dir, prep[:0] + [
            ("launch_server.py", "run_server(server_args)", '__name__ == "__main__"'),
            ("launch_server.py", "from sglang.srt.entrypoints.http_server import launch_server"),
            ("models/registry.py", "ModelRegistry.register(", "ModelRegistry = _ModelRegistry()"),
            ("models/registry.py", "model_arch_name_to_cls[tmp.__name__] = tmp" if probe.duplicated else "package = importlib.import_module(package_name)"),
        ], f"{probe.fatal[0]}: {probe.fatal[1]}\n")
        return 1
    if probe.cls is None:
        supported = probe.supported
        _print_traceback(sglang_dir, [
            ("launch_server.py", "run_server(server_args)", '__name__ == "__main__"'),
            ("launch_server.py", "launch_server(server_args)", "# Default mode: HTTP mode."),
            ("entrypoints/http_server.py", "_launch_subprocesses(", "def launch_server("),
            ("model_loader/utils.py", "return ModelRegistry.resolve_model_cls("),
            ("models/registry.py", "return self._raise_for_unsupported(architectures)"),
            ("models/registry.py", "raise ValueError(", "to be inspected"),
        ], f"ValueError: Model architectures {L.archs!r} are not supported for now. "
           f"Supported architectures: dict_keys({supported!r} + [...])\n")
        return 1

    return Main(L).run()


if __name__ == "__main__":
    main(os.environ.get("PROVISION_STANDIN_SGLANG_DIR", "."), sys.argv[1:])
