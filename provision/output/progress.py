"""Live start-up progress per host: rich bars on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import threading
import time


def fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


def describe(state) -> str:
    """One line for a LoadState: phase, shard counts, percent, ETA."""
    phase = getattr(state, "phase", "starting")
    prog = None
    if phase in ("target-weights",):
        prog = getattr(state, "target", None)
    elif phase in ("draft-weights",):
        prog = getattr(state, "draft", None)
    text = phase
    if prog is not None and getattr(prog, "shards_total", None):
        text += f" {prog.shards_done}/{prog.shards_total} ({prog.percent or 0:.0f}%) eta {fmt_eta(prog.eta_seconds)}"
    return text


class Display:
    """Plain: a line per host on phase change, and every `every` seconds."""

    def __init__(self, plain: bool, every: float = 15.0, stream=None):
        self.plain = plain
        self.every = every
        self.stream = stream or sys.stdout
        self.lock = threading.Lock()
        self._last: dict[str, tuple[str, float]] = {}
        self._rich = None
        self._tasks: dict[str, int] = {}

    def __enter__(self):
        if not self.plain:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            from rich.console import Console

            console = Console(stderr=True) if self.stream is sys.stderr else None
            self._rich = Progress(TextColumn("{task.fields[host]:<12}"), BarColumn(bar_width=30),
                                  TextColumn("{task.fields[what]}"), TimeElapsedColumn(), transient=False,
                                  console=console)
            self._rich.start()
        return self

    def __exit__(self, *exc):
        if self._rich is not None:
            self._rich.stop()

    def update(self, host: str, state, percent: float | None = None) -> None:
        line = describe(state)
        with self.lock:
            if self._rich is not None:
                if host not in self._tasks:
                    self._tasks[host] = self._rich.add_task("", total=100, host=host, what=line)
                self._rich.update(self._tasks[host], completed=percent or 0, what=line)
                return
            last = self._last.get(host)
            now = time.monotonic()
            phase = getattr(state, "phase", "")
            if last is None or last[0].split(" ")[0] != phase or now - last[1] >= self.every:
                self._last[host] = (line, now)
                print(f"{host}: {line}", file=self.stream, flush=True)

    def step(self, host: str, text: str, done: int, total: int) -> None:
        """A counted task's progress (bench's requests): the bar on a terminal; plain, the first
        line, the last, and one every `every` seconds between."""
        with self.lock:
            if self._rich is not None:
                if host not in self._tasks:
                    self._tasks[host] = self._rich.add_task("", total=total, host=host, what=text)
                self._rich.update(self._tasks[host], completed=done, total=total, what=text)
                return
            now = time.monotonic()
            last = self._last.get(host)
            if last is None or done >= total or now - last[1] >= self.every:
                self._last[host] = (text, now)
                print(f"{host}: {text}", file=self.stream, flush=True)

    def message(self, host: str, text: str) -> None:
        with self.lock:
            if self._rich is not None:
                self._rich.console.print(f"{host}: {text}", highlight=False, markup=False)
            else:
                print(f"{host}: {text}", file=self.stream, flush=True)
