"""Follow an SGLang start-up log: text in, state out (pure; no IO).

Feed it whatever a log tail returns, in any chunking (partial lines, ``\\r``-separated tqdm
updates split anywhere); it tracks the load phases, the target and draft weight progress
bars, readiness and crashes::

    log = LoadLog()
    for chunk in tail:
        for event in log.feed(chunk):
            ...
    log.state.phase, log.state.target, log.state.crashed

Phases, in order: ``starting``, ``target-weights``, ``kv-cache``, ``cuda-graphs``,
``draft-weights``, ``draft-graphs``, ``warmup``, ``ready``; or ``crashed``.  The phase never
moves backwards, so interleaved rank lines (``[ts TP3] ...``) cannot confuse it.  The first
100 % bar is not the end: the draft model loads the same way after the target's CUDA graphs.
Target and draft are told apart per rank by counting ``Load weight begin`` lines (the first is
the target, the second the draft); the bar belongs to rank 0.

Stored lines (``last_line``, crash lines, warnings) are passed through :func:`provision.logs.redact.redact`.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, replace
from typing import Iterable

from provision.host import inference
from provision.logs.redact import redact

PHASES = (
    "starting",
    "target-weights",
    "kv-cache",
    "cuda-graphs",
    "draft-weights",
    "draft-graphs",
    "warmup",
    "ready",
)
CRASHED = "crashed"
_PHASE_INDEX = {p: i for i, p in enumerate(PHASES)}

CRASH_KINDS = (
    "missing-eagle3-method",
    "architecture-not-supported",
    "oom",
    "warmup-failed",
    "child-failed",
    "sm120-torch-symm-mem",               # KeyError: 12 from torch_symm_mem.py (Crash.spec names the fix)
    "sm120-flashinfer-allreduce-fusion",  # flashinfer's "No supported CUDA architectures ..."
    "exception",
)
_ENGINE = inference.get("sglang")  # this reader's engine: the methods its EAGLE-3 worker calls
EAGLE3_METHODS = _ENGINE.eagle3_methods + (_ENGINE.eagle3_parity_method,)
# Crashes a shipped hotfix spec fixes: crash kind -> the spec's name (playbooks/).
SPEC_FIXES = {"sm120-torch-symm-mem": "sm120-torch-symm-mem",
              "sm120-flashinfer-allreduce-fusion": "sm120-flashinfer-allreduce-fusion"}
_SPECIFIC = {"missing-eagle3-method", "architecture-not-supported", "oom", "warmup-failed", "overlay-import",
             *SPEC_FIXES}
MAX_CRASH_LINES = 30
MAX_WARNINGS = 50


@dataclass(frozen=True)
class Progress:
    phase: str  # "target-weights" | "draft-weights"
    shards_done: int | None
    shards_total: int | None
    percent: float | None
    eta_seconds: float | None
    model: str  # "target" | "draft"
    description: str = ""

    @property
    def complete(self) -> bool:
        return self.shards_total is not None and self.shards_done == self.shards_total


@dataclass(frozen=True)
class Crash:
    kind: str
    summary: str
    lines: tuple[str, ...] = ()
    method: str | None = None  # missing-eagle3-method: the method SGLang called
    class_name: str | None = None  # missing-eagle3-method: the wrapper class
    rank: str | None = None  # "TP3" when a rank logged it
    exit_code: int | None = None  # child-failed: the dead rank's exit code, when the log says it
    oom_killer: bool = False  # child-failed: SIGKILL (-9), which SGLang names as a common OOM-killer sign
    spec: str | None = None  # the shipped spec that fixes this crash (SPEC_FIXES), e.g. sm120-torch-symm-mem


@dataclass(frozen=True)
class DecodeStats:
    accept_length: float | None
    accept_rate: float | None
    gen_throughput: float | None
    running_requests: int | None
    line: str = ""


@dataclass(frozen=True)
class LoadState:
    phase: str = "starting"
    target: Progress | None = None
    draft: Progress | None = None
    crashed: Crash | None = None
    ready: bool = False
    uvicorn_up: bool = False
    last_line: str = ""
    warnings: tuple[str, ...] = ()
    url: str | None = None  # from "Uvicorn running on http://HOST:PORT"
    target_class: str | None = None  # "Load weight end ... type=" of the target
    draft_class: str | None = None
    tp_size: int | None = None  # from server_args=ServerArgs(... tp_size=N ...)
    ranks: tuple[str, ...] = ()  # rank prefixes seen ("TP0", "TP1", ...)
    decode: DecodeStats | None = None  # last "Decode batch" line
    import_errors: tuple[str, ...] = ()  # "Ignore import error when loading X: ..."


@dataclass(frozen=True)
class Event:
    kind: str  # phase | progress | crash | uvicorn | ready | warning | decode
    phase: str
    line: str = ""
    progress: Progress | None = None
    crash: Crash | None = None


# --------------------------------------------------------------------------- patterns

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_PREFIX = re.compile(
    r"^\[(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)(?P<ranks>(?:\s+[A-Z]{2,4}\d+)*)\s*\]\s?(?P<msg>.*)$"
)
_BAR = re.compile(
    r"(?P<desc>[^:\r\n|\[\]]{1,200}):\s*(?P<pct>\d{1,3})%\s*(?:Completed\s*)?\|(?:[^|\n]*\|)?\s*(?P<n>\d+)/(?P<total>\d+)"
    r"\s*\[(?P<elapsed>[^<\]]*)<(?P<remaining>[^,\]]*)(?:,\s*(?P<rate>[^\]]*))?\]"
)
_TS_INNER = re.compile(r"\[\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}")
_WEIGHT_BAR_DESC = re.compile(r"shard|checkpoint|safetensor|weights", re.I)
_LOAD_BEGIN = re.compile(r"Load weight begin\b")
_LOAD_END = re.compile(r"Load weight end\b.*?type=(?P<type>[\w.]+)")
_UVICORN = re.compile(r"Uvicorn running on (?P<url>\S+)")
_READY = "The server is fired up and ready to roll"
_UVICORN_LEVELS = ("INFO:", "ERROR:", "WARNING:")
_TB_HEAD = "Traceback (most recent call last):"
_EXC_LINE = re.compile(
    r"^(?P<type>(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure|Warning))"
    r"(?::\s?(?P<msg>.*))?$"
)
# an exception's line with no traceback above it: an error's type only (never a warning's)
_BARE_EXC = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception))(?::\s?(?P<msg>.*))?$")
_ANY_EXC_LINE = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)(?::\s?(?P<msg>.*))?$")
_MISSING_ATTR = re.compile(r"'(?P<cls>[\w.]+)' object has no attribute '(?P<attr>\w+)'")
_TP_SIZE = re.compile(r"\btp_size=(\d+)")
_DECODE = re.compile(r"Decode batch\b")
_OOM = re.compile(r"OutOfMemoryError|CUDA out of memory|out of memory|Not enough memory", re.I)
_ARCH = re.compile(r"Model architectures (?P<archs>\[.*?\]) (?:are not supported|failed to be inspected)")
# 0.5.9 writes "loading X: reason"; older releases (and 0.5.23's external-package loader) "loading X. reason"
_IMPORT_ERROR = re.compile(r"Ignore import error when loading (?P<mod>[\w]+(?:\.[\w]+)*?)[:.] (?P<err>.*)")
# 0.5.23: "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL),
# a common cause is the OS OOM killer..."; 0.5.9: "Rank 0 scheduler is dead. Please check if there are relevant logs."
_RANK_DEAD = re.compile(r"(?:RuntimeError: )?Rank (?P<rank>\d+) scheduler (?:is dead\b|died during initialization"
                        r"(?: \(exit code: (?P<code>-?\d+)\))?)")
_OOM_KILLER = re.compile(r"OOM killer", re.I)
# 0.5.23 (model_runner_components/attention_backend_setup.py): a missing EAGLE-3 method is a ValueError
# SM120 (compute capability 12.x) crashes of the released files (issue 11): torch_symm_mem.py indexing
# TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES with the device's major (SGLang < 0.5.14), and flashinfer's JIT
# building the allreduce-fusion kernels only for majors 9 and 10.
_SYMM_MEM_FRAME = re.compile(r"torch_symm_mem\.py")
_NO_CUDA_ARCH = re.compile(r"No supported CUDA architectures found for major versions (?P<majors>\[[\d, ]*\])")
_NOT_IMPLEMENTED = re.compile(r"Model (?P<cls>[\w.]+) does not implement (?P<attr>\w+)")
MAX_TAIL = 200
_WARNING_HINT = re.compile(r"Ignore import error|deprecated|[Ww]arning|is adjusted to|WARNING")
_USAGE_ERROR = re.compile(r"^(?:usage: |[\w.-]+: error: )")


def _num(pattern: str, text: str) -> float | None:
    m = re.search(pattern, text)
    if not m:
        return None
    try:
        return float(m.group(1))
    except ValueError:
        return None


def _interval(text: str) -> float | None:
    text = text.strip()
    if not text or "?" in text:
        return None
    try:
        parts = [float(p) for p in text.split(":")]
    except ValueError:
        return None
    seconds = 0.0
    for p in parts:
        seconds = seconds * 60 + p
    return seconds


def _is_rank0(key: str) -> bool:
    nums = re.findall(r"\d+", key)
    return all(n == "0" for n in nums)


class _Traceback:
    """A traceback block being collected (header line plus the un-timestamped lines after it)."""

    def __init__(self, header: str, rank: str | None, context: str):
        self.lines: list[str] = [header]
        self.rank = rank
        self.context = context  # scheduler | warmup | uncaught | request
        self.exc_type: str | None = None
        self.exc_msg: str = ""
        self.awaiting_exc = False  # a "File ..." frame was seen; the next unindented line is the exception


class LoadLog:
    """Incremental SGLang start-up log parser."""

    def __init__(self, secrets: Iterable[str] = (), overlay_package: str | None = None):
        """`overlay_package`: the server runs with provision's overlay (SGLANG_EXTERNAL_MODEL_PACKAGE);
        SGLang skipping one of its modules is then a crash ("overlay-import"), not a warning."""
        self._secrets = tuple(secrets)
        self._overlay = overlay_package
        self._buf = ""
        self._s = LoadState()
        self._phase_i = 0
        self._begins: dict[str, int] = {}
        self._ends: dict[str, int] = {}
        self._tb: _Traceback | None = None
        self._bar_model_hint = "target"
        self._after_request_error = False
        self._crash_tb: _Traceback | None = None
        self._tail: deque[str] = deque(maxlen=MAX_TAIL)
        self._tail_bar = False

    # ----------------------------------------------------------------- public API

    def feed(self, chunk: str) -> list[Event]:
        """Consume more log text; return the events it completed."""
        if not chunk:
            return []
        self._buf += chunk
        events: list[Event] = []
        parts = re.split(r"[\r\n]", self._buf)
        self._buf = parts.pop()  # incomplete tail (maybe "")
        for seg in parts:
            self._segment(seg, events)
        return events

    def flush(self) -> list[Event]:
        """Treat the pending partial line as complete (end of the log)."""
        events: list[Event] = []
        if self._buf:
            seg, self._buf = self._buf, ""
            self._segment(seg, events)
        self._end_traceback(events)
        return events

    def tail(self, n: int = 30) -> list[str]:
        """The last `n` lines of the log (redacted; a run of tqdm updates counts as its last one),
        whatever they say: what to show when the parser recognised nothing (e.g. ``Killed``)."""
        lines = list(self._tail)
        pending = self._buf.strip()
        if pending:
            lines.append(self._red(_ANSI.sub("", pending)))
        return lines[-n:] if n > 0 else []

    @property
    def state(self) -> LoadState:
        """The state so far.  A pending, not yet terminated tqdm update is shown as progress too."""
        pending = self._buf.strip()
        if pending and self._s.crashed is None:
            m = _BAR.match(_ANSI.sub("", pending))
            if m and _WEIGHT_BAR_DESC.search(m.group("desc")):
                model, prog = self._bar_progress(m)
                return replace(self._s, **{model: prog})
        return self._s

    # ----------------------------------------------------------------- internals

    def _set(self, **kw) -> None:
        self._s = replace(self._s, **kw)

    def _red(self, line: str) -> str:
        return redact(line, self._secrets)

    def _advance(self, phase: str, events: list[Event], line: str) -> None:
        if self._s.crashed is not None:
            return
        i = _PHASE_INDEX[phase]
        if i > self._phase_i:
            self._phase_i = i
            self._set(phase=phase)
            events.append(Event("phase", phase, self._red(line)))

    def _warn(self, line: str, events: list[Event]) -> None:
        red = self._red(line)
        self._set(warnings=(self._s.warnings + (red,))[-MAX_WARNINGS:])
        events.append(Event("warning", self._s.phase, red))

    def _segment(self, raw: str, events: list[Event]) -> None:
        # a "\r"-only tqdm update has no newline: another rank's log line can be glued to it
        cuts = [m.start() for m in _TS_INNER.finditer(raw) if m.start() > 0]
        if cuts:
            for a, b in zip([0] + cuts, cuts + [len(raw)]):
                self._line(raw[a:b], events)
        else:
            self._line(raw, events)

    def _line(self, raw: str, events: list[Event]) -> None:
        seg = _ANSI.sub("", raw).rstrip()
        stripped = seg.strip()
        if not stripped:
            return
        red = self._red(stripped)
        self._set(last_line=red)
        is_bar = "%" in stripped and _BAR.match(stripped) is not None
        if is_bar and self._tail_bar and self._tail:
            self._tail[-1] = red
        else:
            self._tail.append(red)
        self._tail_bar = is_bar

        # tqdm weight bar (no timestamp, rank 0 only)
        bar = _BAR.match(stripped) if "%" in stripped else None
        if bar and _WEIGHT_BAR_DESC.search(bar.group("desc")) and not _PREFIX.match(stripped):
            self._on_bar(bar, stripped, events)
            return

        m = _PREFIX.match(stripped)
        if m is None:
            self._on_plain(seg, stripped, events)
            return
        self._end_traceback(events)
        rank = " ".join(m.group("ranks").split())
        msg = m.group("msg")
        if rank and rank not in self._s.ranks:
            self._set(ranks=self._s.ranks + (rank,))
        self._on_message(rank, msg, stripped, events)

    # plain (un-timestamped) lines: tracebacks, uvicorn, argparse
    def _on_uvicorn(self, msg: str, line: str, events: list[Event]) -> None:
        """A uvicorn line: bare (``INFO:     ...``) or, as 0.5.9 configures uvicorn's formatter
        (``[%(asctime)s] %(levelprefix)s %(message)s``), with a ``[date]`` prefix."""
        self._end_traceback(events)
        self._after_request_error = msg.startswith("ERROR:") and "Exception in ASGI application" in msg
        up = _UVICORN.search(msg)
        if up:
            self._set(uvicorn_up=True, url=up.group("url"))
            events.append(Event("uvicorn", self._s.phase, self._red(line)))
            self._advance("warmup", events, line)
        elif msg.startswith("ERROR:") and ("error while attempting to bind" in msg or "address already in use" in msg):
            self._crash("exception", f"HTTP server could not bind: {msg[6:].strip()}", [line], None, events)

    def _on_plain(self, seg: str, line: str, events: list[Event]) -> None:
        if line.startswith(_UVICORN_LEVELS):
            self._on_uvicorn(line, line, events)
            return
        if line == _TB_HEAD or line.endswith(_TB_HEAD):
            if self._tb is not None and self._tb.lines and (
                self._tb.lines[-1].startswith("During handling") or self._tb.lines[-1].startswith("The above exception")
            ):
                self._tb.lines.append(line)
                return
            context = "request" if self._after_request_error else "uncaught"
            self._end_traceback(events)
            self._tb = _Traceback(line, None, context)
            return
        if _USAGE_ERROR.match(line) and self._tb is None:
            if line.startswith("usage: "):
                return
            msg = line.split(": error: ", 1)[-1]
            self._crash("exception", f"bad launch flags: {msg}", [line], None, events)
            return
        tb = self._tb
        if tb is None:
            # a tail that starts inside a traceback (its header was in an earlier chunk, or cut off
            # by the tail's window): the fatal line itself still says the server is dead
            dead = _RANK_DEAD.match(line)
            if dead:
                self._rank_dead(dead, line, [line], None, events)
                return
            if seg[:1].isspace() and line.startswith('File "'):  # its frames: collected as a traceback
                self._tb = _Traceback(seg.rstrip(), None, "request" if self._after_request_error else "uncaught")
                self._tb.awaiting_exc = True
                return
            bare = _BARE_EXC.match(line)
            if bare and not self._after_request_error:  # an exception's line alone (its header above the tail)
                self._tb = _Traceback(line, None, "uncaught")
                self._tb.exc_type, self._tb.exc_msg = bare.group("type"), bare.group("msg") or ""
                self._classify_traceback(events)
            return
        tb.lines.append(seg.rstrip())
        if seg[:1].isspace():
            if line.startswith("File "):
                tb.awaiting_exc = True
            return
        exc = _ANY_EXC_LINE.match(line) if tb.awaiting_exc else _EXC_LINE.match(line)
        if exc and not line.startswith(("During handling", "The above exception")):
            tb.exc_type = exc.group("type")
            tb.exc_msg = exc.group("msg") or ""
            tb.awaiting_exc = False
            self._classify_traceback(events)
        elif tb.exc_type is not None:
            # continuation of a multi-line exception message
            self._classify_traceback(events, update_only=True)

    def _on_message(self, rank: str, msg: str, line: str, events: list[Event]) -> None:
        if msg.startswith(_UVICORN_LEVELS):
            self._on_uvicorn(msg, line, events)
            return
        if msg.startswith("server_args="):
            tp = _TP_SIZE.search(msg)
            if tp:
                self._set(tp_size=int(tp.group(1)))
            return
        if _LOAD_BEGIN.search(msg):
            n = self._begins.get(rank, 0) + 1
            self._begins[rank] = n
            self._advance("target-weights" if n == 1 else "draft-weights", events, line)
            if _is_rank0(rank):
                self._bar_model_hint = "target" if n == 1 else "draft"
            return
        end = _LOAD_END.search(msg)
        if end:
            n = self._ends.get(rank, 0) + 1
            self._ends[rank] = n
            if n == 1:
                if self._s.target_class is None:
                    self._set(target_class=end.group("type"))
                if _is_rank0(rank):
                    self._advance("kv-cache", events, line)
                    self._finish_bar("target")
            else:
                if self._s.draft_class is None:
                    self._set(draft_class=end.group("type"))
                if _is_rank0(rank):
                    self._finish_bar("draft")
            return
        if msg.startswith("KV Cache is allocated"):
            self._advance("kv-cache", events, line)
            return
        if msg.startswith("Capture cuda graph begin"):
            self._advance("cuda-graphs", events, line)
            return
        if msg.startswith("Capture draft"):
            self._advance("draft-graphs", events, line)
            return
        if msg.startswith("Scheduler hit an exception"):
            self._tb = _Traceback(msg, rank or None, "scheduler")
            return
        if msg.startswith("Initialization failed. warmup error"):
            self._tb = _Traceback(msg, rank or None, "warmup")
            rest = msg.split("warmup error:", 1)[-1].strip()
            summary = "the warm-up request failed" + (f": {rest}" if rest and rest != _TB_HEAD else "")
            self._crash("warmup-failed", summary, [msg], rank, events, tb=self._tb)
            return
        if msg.startswith("Received sigquit from a child process"):
            self._crash("child-failed", "a scheduler process failed and the server killed itself: " + msg,
                        [line], rank, events)
            return
        dead = _RANK_DEAD.match(msg)
        if dead:
            self._rank_dead(dead, msg, [line], rank, events)
            return
        code = re.match(r"Exit code: (-?\d+)\s*$", msg)
        cur = self._s.crashed
        if code and cur is not None and cur.kind == "child-failed" and cur.exit_code is None:
            # 0.5.9 logs the dead rank's exit code on the line after "Rank N scheduler is dead"
            self._set(crashed=replace(cur, exit_code=int(code.group(1)), oom_killer=int(code.group(1)) == -9,
                                      lines=self._tail_lines(list(cur.lines) + [self._red(line)])))
            return
        imp = _IMPORT_ERROR.search(msg)
        if imp:
            self._set(import_errors=self._s.import_errors + (self._red(msg),))
            mod = imp.group("mod")
            if self._overlay and (mod == self._overlay or mod.startswith(self._overlay + ".")):
                self._crash("overlay-import", f"SGLang skipped the overlay module {mod} (it does not import: "
                            f"{imp.group('err')}) and would load the built-in class without the EAGLE-3 methods",
                            [line], rank, events)
                return
            self._warn(line, events)
            return
        if _READY in msg:
            if self._s.crashed is None:
                self._set(ready=True)
                self._advance("ready", events, line)
                events.append(Event("ready", "ready", self._red(line)))
            return
        if _DECODE.search(msg):
            stats = DecodeStats(
                accept_length=_num(r"accept len: ([\d.]+)", msg),
                accept_rate=_num(r"accept rate: ([\d.]+)", msg),
                gen_throughput=_num(r"gen throughput \(token/s\): ([\d.]+)", msg),
                running_requests=int(v) if (v := _num(r"#running-req: (\d+)", msg)) is not None else None,
                line=msg,
            )
            self._set(decode=stats)
            events.append(Event("decode", self._s.phase, self._red(line)))
            return
        if _WARNING_HINT.search(msg):
            self._warn(line, events)

    # ----------------------------------------------------------------- progress bars

    def _bar_progress(self, m: re.Match) -> tuple[str, Progress]:
        n, total = int(m.group("n")), int(m.group("total"))
        model = self._bar_model_hint
        tgt = self._s.target
        # no rank-0 "Load weight begin" seen (log cut): a new bar after a complete target bar is the draft
        if model == "target" and tgt is not None and tgt.complete and (total != tgt.shards_total or n < tgt.shards_done):
            model = "draft"
        if model == "target" and self._phase_i >= _PHASE_INDEX["draft-weights"]:
            model = "draft"
        prog = Progress(
            phase="target-weights" if model == "target" else "draft-weights",
            shards_done=n,
            shards_total=total,
            percent=(n / total * 100.0) if total else float(m.group("pct")),
            eta_seconds=_interval(m.group("remaining")),
            model=model,
            description=m.group("desc").strip(),
        )
        return model, prog

    def _on_bar(self, m: re.Match, line: str, events: list[Event]) -> None:
        if self._s.crashed is not None:
            return
        model, prog = self._bar_progress(m)
        self._set(**{model: prog})
        self._advance(prog.phase, events, line)
        events.append(Event("progress", self._s.phase, self._red(line), progress=prog))

    def _finish_bar(self, model: str) -> None:
        prog = getattr(self._s, model)
        if prog is not None and prog.shards_total and not prog.complete:
            # rank 0 reported "Load weight end": whatever the last bar said, the weights are in
            self._set(**{model: replace(prog, shards_done=prog.shards_total, percent=100.0, eta_seconds=0.0)})

    # ----------------------------------------------------------------- crashes

    def _end_traceback(self, events: list[Event]) -> None:
        tb, self._tb = self._tb, None
        if tb is None:
            return
        if tb.exc_type is None and tb.context == "scheduler":
            last = tb.lines[-1].strip() if tb.lines else "Scheduler hit an exception"
            self._crash("exception", last, tb.lines, tb.rank, events, tb=tb)

    def _classify_traceback(self, events: list[Event], update_only: bool = False) -> None:
        tb = self._tb
        assert tb is not None
        exc_type, exc_msg = tb.exc_type or "", tb.exc_msg
        full = f"{exc_type}: {exc_msg}" if exc_msg else exc_type
        if update_only:
            cur = self._s.crashed
            if cur is not None and tb is self._crash_tb:
                extra = list(self._s.import_errors) if cur.kind == "architecture-not-supported" else []
                self._set(crashed=replace(cur, lines=self._tail_lines(extra + tb.lines)))
            return
        if tb.context == "request":
            return  # an HTTP request failed; the server is still up
        kind, method, cls, summary, spec = "exception", None, None, full, None
        attr = _MISSING_ATTR.search(exc_msg)
        absent = _NOT_IMPLEMENTED.search(exc_msg)
        dead = _RANK_DEAD.search(full)
        if dead and tb.context != "scheduler":
            self._rank_dead(dead, full, tb.lines, tb.rank, events, tb=tb)
            return
        if tb.context == "warmup":
            kind, summary = "warmup-failed", f"the warm-up request failed: {full}"
        elif absent and absent.group("attr") in EAGLE3_METHODS:
            # 0.5.23: ValueError("Model X does not implement set_eagle3_layers_to_capture ...")
            kind, method, cls = "missing-eagle3-method", absent.group("attr"), absent.group("cls")
            summary = f"{cls} has no {method}(): the EAGLE-3 delegation methods are missing"
        elif exc_type.endswith("AttributeError") and attr and attr.group("attr") in EAGLE3_METHODS:
            kind, method, cls = "missing-eagle3-method", attr.group("attr"), attr.group("cls")
            summary = f"{cls} has no {method}(): the EAGLE-3 delegation methods are missing"
        elif exc_type.endswith("AttributeError") and any(mth in exc_msg for mth in EAGLE3_METHODS):
            method = next(mth for mth in EAGLE3_METHODS if mth in exc_msg)
            kind, summary = "missing-eagle3-method", f"{method}(): {exc_msg}"
        elif exc_type.endswith("AttributeError") and ("EAGLE3" in exc_msg or "EAGLE" in exc_msg):
            method = next((mth for line in reversed(tb.lines) for mth in EAGLE3_METHODS if mth in line), None)
            kind, summary = "missing-eagle3-method", f"{method or 'EAGLE-3 method'}(): {exc_msg}"
        elif (exc_type.endswith("KeyError") and exc_msg.strip() in ("12", "'12'")
              and any(_SYMM_MEM_FRAME.search(x) for x in tb.lines)):
            kind = spec = "sm120-torch-symm-mem"
            summary = ("torch symmetric memory has no sizes for compute capability 12 (SM120): "
                       "KeyError: 12 in torch_symm_mem.py")
        elif _NO_CUDA_ARCH.search(exc_msg):
            kind = spec = "sm120-flashinfer-allreduce-fusion"
            summary = (f"flashinfer builds its allreduce-fusion kernels only for compute capability majors "
                       f"{_NO_CUDA_ARCH.search(exc_msg).group('majors')}: {full}")
        elif _ARCH.search(exc_msg):
            kind = "architecture-not-supported"
            summary = f"Model architectures {_ARCH.search(exc_msg).group('archs')} are not supported"
            if self._s.import_errors:
                summary += f" ({self._s.import_errors[-1]})"
        elif _OOM.search(full):
            kind = "oom"
        lines = list(tb.lines)
        if kind == "architecture-not-supported" and self._s.import_errors:
            lines = list(self._s.import_errors) + lines
        self._crash(kind, summary, lines, tb.rank, events, method=method, cls=cls, tb=tb, spec=spec)

    def _rank_dead(self, m: re.Match, msg: str, lines, rank, events, tb=None) -> None:
        code = int(m.group("code")) if m.group("code") is not None else None
        summary = f"rank {m.group('rank')} scheduler died"
        if "during initialization" in msg:
            summary += " during initialization"
        if code is not None:
            summary += f" (exit code {code})"
        self._crash("child-failed", summary, lines, rank, events, tb=tb, exit_code=code,
                    oom_hint=bool(_OOM_KILLER.search(msg)))

    def _tail_lines(self, lines) -> tuple[str, ...]:
        return tuple(self._red(x) for x in list(lines)[-MAX_CRASH_LINES:])

    def _crash(self, kind, summary, lines, rank, events, method=None, cls=None, tb=None, exit_code=None,
               oom_hint=False, spec=None) -> None:
        new = Crash(kind=kind, summary=self._red(summary), lines=self._tail_lines(lines), method=method,
                    class_name=cls, rank=rank, exit_code=exit_code, spec=spec)
        if oom_hint or (kind == "child-failed" and exit_code == -9):
            new = replace(new, oom_killer=True)
        cur = self._s.crashed
        if cur is not None:
            if tb is not None and tb is self._crash_tb:
                # the same traceback, read further (the exception line after the warm-up header,
                # or the last exception of a chained traceback)
                if _rank(kind) >= _rank(cur.kind):
                    self._set(crashed=new)
                    if (new.kind, new.summary) != (cur.kind, cur.summary):
                        events.append(Event("crash", CRASHED, new.summary, crash=new))
                return
            # keep the most specific diagnosis: a later sigquit does not hide the AttributeError
            if _rank(kind) <= _rank(cur.kind):
                return
            if cur.kind == "child-failed" and (tb is None or tb.context != "scheduler"):
                return
        self._crash_tb = tb
        self._set(crashed=new, phase=CRASHED, ready=False)
        events.append(Event("crash", CRASHED, new.summary, crash=new))


def _rank(kind: str) -> int:
    return 3 if kind in _SPECIFIC else (2 if kind == "exception" else 1)


def parse(text: str, secrets: Iterable[str] = ()) -> LoadState:
    """Parse a whole log at once."""
    log = LoadLog(secrets)
    log.feed(text)
    log.flush()
    return log.state


def hint(crash: Crash | None, host: str | None = None, shipped: Iterable[str] | None = None) -> str | None:
    """What the user should do about a crash, or None when there is no specific advice.

    ``shipped``: the classes a shipped patch spec covers (None: not known, assume covered)."""
    if crash is None:
        return None
    h = host or "HOST"
    # the caller may give the host as it was selected (`-i INV --host NAME`), so the hint pastes
    sel = h if h.startswith("-") else f"--host {h}"
    h = h.rsplit(" ", 1)[-1].strip("'")
    if crash.kind == "missing-eagle3-method":
        what = f" ({crash.class_name}.{crash.method})" if crash.class_name and crash.method else ""
        if shipped is not None and crash.class_name and crash.class_name.rsplit(".", 1)[-1] not in set(shipped):
            cls = crash.class_name.rsplit(".", 1)[-1]
            return (f"the wrapper lacks EAGLE-3 delegation methods{what} and no shipped spec covers {cls}: "
                    f"run `provision audit {sel}`, then `provision spec new {cls} {sel} > "
                    f"playbooks/{cls}.yaml` and `provision patch --playbook playbooks/{cls}.yaml {sel}`")
        return (f"the wrapper lacks EAGLE-3 delegation methods{what}: "
                f"run `provision patch {sel}`")
    if crash.spec is not None:
        what = {"sm120-torch-symm-mem": "the SM120 key of SGLang's TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES",
                "sm120-flashinfer-allreduce-fusion": "SM120 in flashinfer's allreduce-fusion architectures"}
        return (f"the spec {crash.spec} fixes this ({what.get(crash.spec, 'the hand patch')}): "
                f"run `provision patch --playbook {crash.spec} {sel}`, then restart the server")
    if crash.kind == "overlay-import":
        return ("the overlay provision staged does not import under the server (a spec whose parameter defaults "
                "name something of the model file's own module?): fix the spec, or edit the file instead: "
                f"`provision launch --patch {sel}`")
    if crash.kind == "architecture-not-supported":
        return ("kimi_k25.py does not import (a broken hand patch?): "
                f"run `provision patch {sel}` to repair it")
    if crash.kind == "oom":
        return ("CUDA out of memory: a leftover SGLang process may still hold GPU memory "
                f"(run `provision stop {sel}` and check nvidia-smi), or lower --mem-fraction-static")
    if crash.kind == "warmup-failed":
        return "the server loaded but its warm-up request failed: check the log above the warm-up error"
    if "Duplicated model implementation" in crash.summary:
        return ("two files in sglang/srt/models register the same model class (a backup .py copy left "
                f"there?): remove the copy, or run `provision patch {sel}`")
    if crash.kind == "child-failed" and crash.oom_killer:
        return ("a scheduler process was killed with SIGKILL (exit code -9); a common cause is the OS OOM killer "
                f"(host memory, not GPU memory): check `dmesg -T | grep -i oom` on {h}, free host memory or "
                "lower the loader's threads")
    if crash.kind == "child-failed":
        return "a scheduler process died: the log lines above its death say why"
    return None
