"""SIGTERM means what Ctrl-C means, so a stopped timer unit still journals.

systemd stops a unit (``systemctl stop``, a start timeout) with SIGTERM, then SIGKILL
after TimeoutStopSec. Python's default for SIGTERM is to die on the spot: the hosts
mid-step would never get their row and nothing after would run. :func:`terminate_as_interrupt`
makes SIGTERM raise :class:`Terminated` (a KeyboardInterrupt) in the main thread, so every
path that handles Ctrl-C handles it: the runner stops starting hosts, cancels the ones
mid-step (their outcome is "unknown"), hands their rows to the journal, and no later batch
starts.
"""

from __future__ import annotations

import signal
import threading


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (handled as Ctrl-C is)."""


def _raise(signum, frame) -> None:  # noqa: ARG001 - the signal module's signature
    raise Terminated()


def terminate_as_interrupt() -> None:
    """From the main thread only (the signal module's rule); elsewhere a no-op."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise)
