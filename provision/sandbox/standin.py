"""A stand-in for ``python -m sglang.launch_server`` (SGLang 0.5.9 start-up), for hosts without a GPU.

STDLIB ONLY, Python 3.10+, one module per job (see "The modules").  On a sandbox host it is installed
as ``/opt/provision-standin/sglang_standin.py``, its modules beside it, and the host's ``<sglang>/launch_server.py``
is replaced by a shim that calls ``sglang_standin.main(sglang_dir)``, where ``sglang_dir``
is the installed ``sglang`` package directory (the one holding ``srt/``).  Flags come
from ``sys.argv[1:]``.

What it reproduces, and how
---------------------------
* Flags: argv is parsed by the INSTALLED release's own ``ServerArgs.add_cli_args``, run from its
  ``server_args.py`` with its imports stubbed (``standin_flags.py``): every flag, nargs, action, type
  and default is the release's, never provision's reader's.  For releases that derive flags from
  dataclass fields (0.5.14+), and for ``--config`` merging and the server-args dump, the flag set is
  read with ``ast`` from the INSTALLED ``<sglang_dir>/srt/server_args.py`` by the product's reader (provision/host/engine/serverargs.py: every ``parser.add_argument(...)``
  call, and 0.5.23's dataclass fields: names, aliases, actions, choices, nargs, literal
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
  ``/v1/completions``, ``/flush_cache``.  ``--api-key`` and ``--admin-api-key`` guard the paths as the
  installed release's own ``decide_request_auth`` says (``standin_auth.py``; ``/flush_cache`` takes
  only the admin key once there is one), never ``/health*`` nor ``/metrics*`` (401 ``{"error": "Unauthorized"}``).  Each generation logs SGLang's
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
``PROVISION_STANDIN_LOAD_GATE``      a path: the target load does not end while that file exists (tests
                                     act during the load, then remove it to let the server get ready).
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
``PROVISION_STANDIN_STARTED_FILE``   a file the process appends ``{"pid": ..., "argv": [...]}`` to the
                                     moment it starts (tests: "no server process was ever started").
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

The modules
-----------
This file reads the flags (the server-args reader, ``--config``, the checks of
``ServerArgs.__post_init__``) and runs the start-up; each other job has its module, beside it on a
host (``hosts.STANDIN_MODULES`` copies every ``standin_*.py``) and imported flat there, from
``provision.sandbox`` in a checkout:

* ``standin_log.py``         SGLang's log format, uvicorn's lines, each release's wording;
* ``standin_flags.py``       the release's own ``add_cli_args``, run with stubbed imports;
* ``standin_yaml.py``        ``--config FILE`` (PyYAML, or the built-in flat-YAML parser);
* ``standin_stubs.py``       the model file executed with stubbed imports (the EAGLE-3 probe);
* ``standin_tracebacks.py``  tracebacks forged from the installed SGLang's source lines;
* ``standin_ranks.py``       the parsed launch and the scheduler children (one per TP rank);
* ``standin_http.py``        the HTTP server and the process tree (the main process);
* ``standin_generate.py``    ``/generate``, ``/flush_cache``, ``internal_states``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import signal
import sys
import types  # noqa: F401  (the server-args reader's, being moved into the product)
from pathlib import Path
from typing import NoReturn

if __package__:  # provision.sandbox in a checkout
    from provision.sandbox.standin_flags import own_parser
    from provision.sandbox.standin_http import Main
    from provision.sandbox.standin_log import log
    from provision.sandbox.standin_ranks import Launch
    from provision.sandbox.standin_stubs import probe_model
    from provision.sandbox.standin_tracebacks import _exc_line, _print_traceback
    from provision.sandbox.standin_yaml import merge_config
else:  # flat, beside the stand-in (/opt/provision-standin on a host, or run as a script)
    from standin_flags import own_parser
    from standin_http import Main
    from standin_log import log
    from standin_ranks import Launch
    from standin_stubs import probe_model
    from standin_tracebacks import _exc_line, _print_traceback
    from standin_yaml import merge_config


# --------------------------------------------------------------------------- flags from server_args.py


# The reader is the product's (provision/host/engine/serverargs.py, stdlib only and free of provision
# imports): on a sandbox host it is installed next to this file as provision_serverargs.py; run from a
# checkout, it is read from the checkout this file is in (whatever PYTHONPATH the test gives).


def _load_serverargs() -> types.ModuleType:
    here = Path(__file__).resolve().parent
    for path in (here / "provision_serverargs.py", here.parent / "host" / "engine" / "serverargs.py"):
        if path.is_file():
            mod = types.ModuleType("provision_serverargs")
            mod.__file__ = str(path)
            sys.modules["provision_serverargs"] = mod
            exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), mod.__dict__)  # no bytecode written
            return mod
    from provision.host.engine import serverargs

    return serverargs


_serverargs = _load_serverargs()

_UNKNOWN = _serverargs.UNKNOWN
_lit = _serverargs._lit
FlagSpec = _serverargs.FlagSpec
ServerArgsSpec = _serverargs.ServerArgsSpec


def read_server_args(path: str | os.PathLike) -> ServerArgsSpec:
    """The installed release's flags: ``server_args.py`` and, for releases that derive flags from
    dataclass fields (0.5.23), ``arg_groups/fields/*.py`` and ``arg_groups/choices.py`` beside it."""
    path = Path(path)
    groups = path.parent / "arg_groups"
    fields_dir = groups / "fields"
    field_files = ({p.name: p.read_text(encoding="utf-8") for p in sorted(fields_dir.glob("*.py"))}
                   if fields_dir.is_dir() else None)
    choices = groups / "choices.py"
    return _serverargs.parse_server_args(path.read_text(encoding="utf-8"), str(path), field_files,
                                         choices.read_text(encoding="utf-8") if choices.is_file() else None)


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
    _mark_started(argv)
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


def _mark_started(argv: list[str]) -> None:
    """``PROVISION_STANDIN_STARTED_FILE``: append one line (pid and flags) the moment the process
    starts, before anything is parsed, so a test can tell that no server process was ever started."""
    path = os.environ.get("PROVISION_STANDIN_STARTED_FILE")
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (json.dumps({"pid": os.getpid(), "argv": argv}) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def _early_stop(signum, frame):
    raise SystemExit(0)  # stopped before any child exists


def _main(sglang_dir: Path, argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _early_stop)
    signal.signal(signal.SIGINT, _early_stop)
    server_args_py = sglang_dir / "srt" / "server_args.py"
    spec = read_server_args(server_args_py)
    # the release's own add_cli_args (standin_flags.py), never provision's reader where it runs;
    # dataclass-derived releases (0.5.14+) fall back to the reader's parser
    parser = own_parser(server_args_py) or build_parser(spec)
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
    L.server_args = _server_args_dict(L)  # /server_info's, without the live states
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

