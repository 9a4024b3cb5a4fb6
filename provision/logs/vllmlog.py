"""Follow a vLLM start-up log: text in, state out (pure; no IO).

The reader of the second engine (logs/readers.py picks it for ``engine: vllm``); it answers with
loadlog.py's types (LoadState, Event, Crash), so `launch`, `wait` and `logs` follow either engine
the same way. Feed it whatever a log tail returns, in any chunking.

vLLM (0.32, read from a real server) writes stdout and stderr together, each process's lines
prefixed with its name and pid (``(APIServer pid=N)``, ``(EngineCore pid=N)``, ``(Worker pid=N)``),
then ``LEVEL MM-DD HH:MM:SS [file.py:line]``. Its phases, in the order it goes through them:
``starting`` (the API server's version and args, the engine's config), ``target-weights``
(``Starting to load model``), ``draft-weights`` (``Loading drafter model...``), ``kv-cache``
(``KV cache size``), ``cuda-graphs`` (CUDA graph capture or torch.compile on a GPU; on a CPU
``init engine (...) took``), and ``ready`` (``Application startup complete.``). The phase never
moves backwards.

Crashes, each with its own sentence: the EAGLE-3 interface missing (``Model does not support
EAGLE3 interface``), out of memory, the engine core's failure (``Engine core initialization
failed``: the root cause above it wins), and any other traceback's last line. An ``ERROR`` vLLM
logs while it shuts down (``EngineDeadError`` after a stop) is not a crash.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import replace
from typing import Iterable

from provision.logs.loadlog import Crash, Event, LoadState, Progress
from provision.logs.redact import redact

PHASES = ("starting", "target-weights", "draft-weights", "kv-cache", "cuda-graphs", "ready")
CRASHED = "crashed"
_INDEX = {p: i for i, p in enumerate(PHASES)}
MAX_CRASH_LINES = 30

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# what a log collector puts before vLLM's own line: docker compose's `vllm-1  | `, journald's
# `Dec 07 10:00:00 gpu01 vllm[1234]: `
_COLLECTOR = re.compile(r"^(?:[\w.-]+\s+\| ?|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [^\s:\[]+(?:\[\d+\])?: )")
_PROC = re.compile(r"^\((?P<proc>[A-Za-z][\w-]*)(?: pid=(?P<pid>\d+))?\)\s?")
_LEVEL = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+"
                    r"\[[^\]]*\]\s?")
# a process supervisor's one-line verdict (V1 engine): the start-up is over, whatever follows
_FAILED_START = re.compile(r"\b(?:WorkerProc|EngineCore\w*|Engine core|Engine process|API server process)"
                           r" (?:failed to start|initialization failed)")
# the lines of a traceback that are not its message: source, carets, frames
_CODE = re.compile(r"^\s*(?:File \"|\^+\s*$|~+[~^]*\s*$|raise\b|\s{4})")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
# pydantic's validation error of an engine config: the cause is on the lines after it
_PYDANTIC = re.compile(r"ValidationError: \d+ validation errors? for (?P<cls>\w+)")
_PYDANTIC_CAUSE = re.compile(r"^\s+(?:Value error, |Assertion failed, )?(?P<cause>.+?)(?: \[type=[^\]]*\])?$")
# an older multi-process worker's header at the end of its message line
_WORKER_EXC = re.compile(r"Exception in worker \S+ while processing method \w+: (?P<msg>.*)$")
_PHASE_LINES = (
    (re.compile(r"Starting to load model\b"), "target-weights"),
    (re.compile(r"Loading drafter model\b"), "draft-weights"),
    (re.compile(r"Loading model weights took\b"), "target-weights"),  # (releases before "Starting to load model")
    (re.compile(r"KV cache size:|Available KV cache memory|EAGLE drafter KV cache initialized|# GPU blocks: \d+|"
                r"# cpu blocks: \d+"), "kv-cache"),
    (re.compile(r"Capturing CUDA graphs|Capturing cudagraphs|Capturing the model for CUDA graphs|"
                r"Graph capturing finished|torch\.compile takes|init engine \(profile, create kv cache, warmup model\) "
                r"took"), "cuda-graphs"),
    (re.compile(r"Application startup complete\."), "ready"),
)
_VERSION = re.compile(r"\bvLLM API server version (?P<v>\S+)|\bversion (?P<v2>\d+\.\d+\.\d+\S*)")
_ARCH = re.compile(r"Resolved architecture: (?P<cls>\w+)")
_URL = re.compile(r"Starting vLLM server on (?P<url>\S+)")
_EAGLE3 = re.compile(r"Model does not support EAGLE3 interface")
# 0.32's EAGLE proposer copies the target's image token from config.image_token_index for every
# multimodal class it does not name (llm_base_proposer.py): a config without it dies in the drafter's load
_IMAGE_TOKEN = re.compile(r"has no attribute 'image_token_index'")
_OOM = re.compile(r"OutOfMemoryError|CUDA out of memory|out of memory|Not enough memory|"
                  r"No available memory for the cache blocks", re.I)
_CORE_FAILED = re.compile(r"Engine core initialization failed")
_TB_HEAD = "Traceback (most recent call last):"
_EXC_LINE = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt))"
                       r"(?::\s?(?P<msg>.*))?$")
_SHUTDOWN = re.compile(r"\[shutdown\]|Shutting down|Waiting for application shutdown|Application shutdown complete|"
                       r"Received (?:SIGINT|SIGTERM)")
_SHARDS = re.compile(r"Loading safetensors checkpoint shards:\s+(?P<pct>\d+)% Completed \| (?P<done>\d+)/(?P<total>\d+)"
                     r"(?: \[(?P<elapsed>[\d:]+)<(?P<eta>[\d:?]+))?")
# crash kinds, most specific first: the root cause wins over the engine core's summary
_RANK = {"overlay-import": 0, "missing-eagle3-method": 0, "missing-image-token": 0, "oom": 1, "exception": 2,
         "child-failed": 3}
_PLUGIN_FAILED = re.compile(r"Failed to load plugin (?P<name>\S+)")


def strip(line: str) -> tuple[str, str]:
    """(process name or "", the message) of one log line: its process and level prefixes off."""
    proc, msg, _ = split(line)
    return proc, msg


def split(line: str) -> tuple[str, str, str]:
    """(process name or "", the message, its level or "") of one log line: a log collector's
    prefix (docker compose, journald), then vLLM's process and level prefixes, off."""
    line = _ANSI.sub("", line).rstrip()
    m = _COLLECTOR.match(line)
    if m and not _PROC.match(line):
        line = line[m.end():]
    proc = level = ""
    m = _PROC.match(line)
    if m:
        proc, line = m.group("proc"), line[m.end():]
    m = _LEVEL.match(line)
    if m:
        level, line = m.group("level"), line[m.end():]
    return proc, line, level


class LoadLog:
    """The state of one vLLM start-up, fed in chunks (as loadlog.LoadLog for SGLang)."""

    def __init__(self, secrets: Iterable[str] = (), overlay_package: str | None = None):
        self.secrets = tuple(secrets)
        self.overlay_package = overlay_package
        self.state = LoadState()
        self._partial = ""
        self._tail: deque[str] = deque(maxlen=200)
        self._tb: list[str] | None = None
        self._pydantic = False       # the traceback's message is pydantic's: its cause lines follow it
        self._tb_said = ""           # a worker's message on its traceback header's line
        self._archs: list[str] = []
        self._shutting_down = False
        self.version: str | None = None

    # ------------------------------------------------------------------ feeding
    def feed(self, chunk: str) -> list[Event]:
        text = self._partial + chunk.replace("\r\n", "\n").replace("\r", "\n")
        *lines, self._partial = text.split("\n")
        events: list[Event] = []
        for line in lines:
            events += self._line(line)
        return events

    def flush(self) -> list[Event]:
        """The last unterminated line, and a traceback that ended the log."""
        events = self._line(self._partial) if self._partial else []
        self._partial = ""
        if self._tb:
            events += self._end_traceback()
        return events

    def tail(self, n: int = 30) -> list[str]:
        return list(self._tail)[-n:]

    # ------------------------------------------------------------------ one line
    def _line(self, raw: str) -> list[Event]:
        proc, msg, level = split(raw)
        if not msg.strip():
            return []
        shown = redact(msg, self.secrets)
        self._tail.append(shown)
        self.state = replace(self.state, last_line=shown[:300])
        events: list[Event] = []
        if _SHUTDOWN.search(msg) and self.state.phase in ("ready", "starting") and self.state.crashed is None:
            self._shutting_down = self._shutting_down or self.state.phase == "ready"
        if self._tb is not None and self._pydantic:
            # pydantic's cause lines: indented, or a field's name alone; anything else ends it
            if msg.startswith((" ", "\t")) or re.fullmatch(r"[\w.\[\]]+", msg.strip()):
                self._tb.append(shown)
                return events
            events += self._end_traceback()
        if self._tb is not None:
            if msg.startswith((" ", "\t")) or msg.startswith(_TB_HEAD) or not _EXC_LINE.match(msg.strip()):
                if msg.startswith(_TB_HEAD) and len(self._tb) > 1:
                    events += self._end_traceback()
                    self._tb = [shown]
                else:
                    self._tb.append(shown)
                return events
            self._tb.append(shown)
            if _PYDANTIC.search(msg):
                self._pydantic = True
                return events
            events += self._end_traceback()
            return events
        if msg.startswith(_TB_HEAD):
            self._tb = [shown]
            return events
        if _TB_HEAD in msg:  # an older worker's message, then its traceback's header, on one line
            head = shown[:shown.index(_TB_HEAD)].rstrip(" ,:")
            m = _WORKER_EXC.search(head)
            self._tb_said = (m.group("msg") if m else head).rstrip(" ,:")
            self._tb = [head]
            return events
        if not level and re.match(r"\s+File \"", msg):  # a traceback whose header is above the tail read
            self._tb = [shown]
            return events
        if level in ("", "ERROR", "CRITICAL") and not msg.startswith((" ", "\t")) and _EXC_LINE.match(msg.strip()):
            # an exception's line with no traceback above it (above the tail, or logged alone)
            if _PYDANTIC.search(msg):
                self._tb, self._pydantic = [shown], True
                return events
            return events + self._crash([shown])
        if level in ("ERROR", "CRITICAL") and _FAILED_START.search(msg) and not _CODE.match(msg):
            return events + self._crash([shown], kind="child-failed")
        m = _VERSION.search(msg)
        if m and self.version is None and proc in ("APIServer", ""):
            self.version = m.group("v") or m.group("v2")
        m = _ARCH.search(msg)
        if m:
            self._archs.append(m.group("cls"))
            self.state = replace(self.state, target_class=self._archs[0],
                                 draft_class=self._archs[1] if len(self._archs) > 1 else None)
        m = _URL.search(msg)
        if m:
            self.state = replace(self.state, url=m.group("url"), uvicorn_up=True)
        for pattern, phase in _PHASE_LINES:
            if pattern.search(msg):
                events += self._advance(phase, shown)
        m = _SHARDS.search(msg)
        if m and self.state.phase == "starting":  # a release (or a tail) without "Starting to load model"
            events += self._advance("target-weights", shown)
        if m and self.state.phase in ("target-weights", "draft-weights"):
            model = "draft" if self.state.phase == "draft-weights" else "target"
            prog = Progress(phase=self.state.phase, shards_done=int(m.group("done")), shards_total=int(m.group("total")),
                            percent=float(m.group("pct")), eta_seconds=_seconds(m.group("eta")), model=model,
                            description="safetensors shards")
            self.state = replace(self.state, **{model: prog})
            events.append(Event("progress", self.state.phase, shown, progress=prog))
        m = _PLUGIN_FAILED.search(msg)
        if m and self.overlay_package and m.group("name") == self.overlay_package:
            # vLLM logs it and goes on without the fix: the server would die later, or run unfixed
            crash = Crash(kind="overlay-import", summary=f"vLLM could not load provision's overlay plugin "
                          f"{self.overlay_package} (its register() failed; the traceback follows in the log)",
                          lines=(shown,))
            self.state = replace(self.state, crashed=crash, phase=CRASHED)
            return events + [Event("crash", CRASHED, shown, crash=crash)]
        if (_EAGLE3.search(msg) or _OOM.search(msg) or _CORE_FAILED.search(msg)) and not _CODE.match(msg):
            events += self._crash([shown])
        return events

    def _advance(self, phase: str, line: str) -> list[Event]:
        if self.state.crashed is not None or _INDEX[phase] <= _INDEX.get(self.state.phase, -1):
            return []
        self.state = replace(self.state, phase=phase, ready=phase == "ready")
        return [Event("ready" if phase == "ready" else "phase", phase, line)]

    def _end_traceback(self) -> list[Event]:
        lines, self._tb = self._tb or [], None
        said, self._tb_said, self._pydantic = self._tb_said, "", False
        return self._crash(lines, said=said)

    def _crash(self, lines: list[str], kind: str | None = None, said: str = "") -> list[Event]:
        if self._shutting_down:
            return []  # an ERROR while it shuts down (EngineDeadError after a stop) is not a crash
        text = "\n".join(lines)
        last = message_of(lines, said)
        if self.overlay_package and f"/{self.overlay_package}/" in text:  # raised in the overlay's own code
            kind = "overlay-import"
            summary = f"provision's overlay plugin {self.overlay_package} failed under the server: {last}"
        elif _EAGLE3.search(text):
            kind = "missing-eagle3-method"
            summary = (f"{self.state.target_class or 'the target model'} does not have vLLM's EAGLE-3 interface "
                       f"(SupportsEagle3): {last}")
        elif _IMAGE_TOKEN.search(text):
            kind = "missing-image-token"
            summary = (f"vLLM's EAGLE proposer reads config.image_token_index of "
                       f"{self.state.target_class or 'the target model'}, whose config has none: {last}")
        elif _OOM.search(text):
            kind, summary = "oom", f"out of memory: {last}"
        elif kind == "child-failed" or _CORE_FAILED.search(text):
            kind, summary = "child-failed", last
        else:
            kind, summary = "exception", last
        old = self.state.crashed
        if old is not None and _RANK[old.kind] <= _RANK[kind]:
            return []  # the first, most specific cause stays
        crash = Crash(kind=kind, summary=summary, lines=tuple(lines[-MAX_CRASH_LINES:]),
                      class_name=self.state.target_class if kind in ("missing-eagle3-method", "missing-image-token")
                      else None)
        self.state = replace(self.state, crashed=crash, phase=CRASHED)
        return [Event("crash", CRASHED, last, crash=crash)]


def message_of(lines: list[str], said: str = "") -> str:
    """The sentence a crash's lines say (pure): pydantic's cause (`ModelConfig: User-specified
    max_model_len ...`), else the last exception line, else the worker's message on its header's
    line (`said`), else the last line that is not source, a caret or a frame."""
    for i, ln in enumerate(lines):
        m = _PYDANTIC.search(ln)
        if m:
            field, cause = "", ""
            for nxt in lines[i + 1:]:
                if re.fullmatch(r"[\w.\[\]]+", nxt.strip()) and not nxt.startswith((" ", "\t")):
                    field = nxt.strip()
                    continue
                c = _PYDANTIC_CAUSE.match(nxt)
                if c and not c.group("cause").startswith("For further information"):
                    cause = c.group("cause").strip()
                    break
            if cause:
                return f"{m.group('cls')}{'.' + field if field else ''}: {cause}"
    exc = next((ln.strip() for ln in reversed(lines) if _EXC_LINE.match(ln.strip())), None)
    if exc:
        return exc
    if said:
        return said
    plain = next((ln.strip() for ln in reversed(lines) if not _CODE.match(ln)), None)
    if plain is not None:
        return plain
    frame = next((m for m in (_FRAME.match(ln) for ln in reversed(lines)) if m), None)
    if frame is not None:  # source lines only: where it was, never a quoted line or a caret
        return (f"the log ends inside a traceback, without its exception line (last frame: "
                f"{frame.group('file').rsplit('/', 1)[-1]} line {frame.group('line')}, in {frame.group('func')})")
    return lines[-1].strip() if lines else ""


def _seconds(text: str | None) -> float | None:
    """tqdm's "MM:SS" or "H:MM:SS" (None for "?")."""
    if not text or "?" in text:
        return None
    total = 0.0
    for part in text.split(":"):
        total = total * 60 + float(part)
    return total


def parse(text: str, secrets: Iterable[str] = ()) -> LoadState:
    log = LoadLog(secrets)
    log.feed(text)
    log.flush()
    return log.state


READ_ONLY = "on a read-only install, `provision launch --overlay` carries it without editing a file"


def hint(crash: Crash | None, host: str | None = None, shipped: Iterable[str] | None = None) -> str | None:
    """What to do about a vLLM crash, or None. ``shipped``: {class: [(spec name, kind)]} the shipped
    vLLM specs fix (tasks/follow.py shipped_classes), to name the one that fixes this class."""
    if crash is None:
        return None
    h = host or "HOST"
    sel = h if h.startswith("-") else f"--host {h}"
    cls = crash.class_name or "the target class"
    fixes = dict(shipped).get(crash.class_name, []) if isinstance(shipped, dict) else []
    if crash.kind == "missing-eagle3-method":
        spec = next((n for n, kind in fixes if kind == "interface"), None)
        if spec:
            return (f"{cls} lacks SupportsEagle3 in this vLLM release; spec {spec} adds it: "
                    f"`provision patch --playbook {spec} {sel}` (or `provision launch --patch`), then launch again; "
                    + READ_ONLY)
        return (f"{cls} lacks SupportsEagle3 in this vLLM release and no shipped spec covers it: "
                f"`provision spec new {cls} --engine vllm {sel} > playbooks/{cls}.yaml`, then "
                f"`provision patch --playbook playbooks/{cls}.yaml {sel}`; `provision audit --engine vllm {sel}` "
                "lists the other gaps")
    if crash.kind == "missing-image-token":
        spec = next((n for n, kind in fixes if kind == "replace"), None)
        if spec:
            return (f"spec {spec} makes the proposer read {cls}'s own image token: "
                    f"`provision patch --playbook {spec} {sel}`, then launch again; " + READ_ONLY)
        return (f"no shipped spec makes the proposer read {cls}'s image token: a replace spec like "
                "kimi-vl-proposer-vllm adds the class where the proposer lists its multimodal classes "
                "(docs/patching.md), or launch without EAGLE-3")
    if crash.kind == "overlay-import":
        return ("the overlay provision staged does not load under the server (the traceback after vLLM's "
                f"'Failed to load plugin' line says why): fix the spec, or edit the file instead: "
                f"`provision launch --patch {sel}`")
    if crash.kind == "oom":
        return "lower --gpu-memory-utilization or --max-model-len, or free the GPUs (`provision status`)"
    return None
