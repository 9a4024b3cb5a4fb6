"""stdout and stderr when their reader goes away (`provision history -n 0 | head -2`).

Click's answer to EPIPE is exit 1 at the next write, which would end a fleet run in the middle of
its hosts (and call itself a bug). Here a closed pipe only stops the output: the run goes on to
its end, journals what it did, and exits with its own code; what it still prints goes to
/dev/null."""

from __future__ import annotations

import io
import os
import sys


class QuietPipe(io.TextIOWrapper):
    """A text stream whose reader may leave: EPIPE sends the rest of the output to /dev/null."""

    def write(self, s: str) -> int:
        try:
            return super().write(s)
        except BrokenPipeError:
            self._reader_gone()
            return len(s)

    def flush(self) -> None:
        try:
            super().flush()
        except BrokenPipeError:
            self._reader_gone()
            try:
                super().flush()  # the rest of the buffer, now to /dev/null
            except OSError:
                pass

    def _reader_gone(self) -> None:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, self.fileno())
        finally:
            os.close(null)


def quiet_broken_pipes() -> None:
    """Make the process's own stdout and stderr QuietPipes where they are pipes or files (a
    terminal cannot close; a test runner's streams are its own and left alone)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if type(stream) is not io.TextIOWrapper or stream is not getattr(sys, f"__{name}__") or stream.isatty():
            continue
        stream.flush()
        quiet = QuietPipe(stream.detach(), encoding=stream.encoding, errors=stream.errors,
                          line_buffering=stream.line_buffering, write_through=stream.write_through)
        setattr(sys, name, quiet)
        setattr(sys, f"__{name}__", quiet)
