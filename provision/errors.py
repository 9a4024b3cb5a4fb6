"""Errors the user can act on, and the one exit-code scheme every command shares.

Expected failures are values: a class, one sentence, and an exit code. The CLI
prints ``error: <sentence>`` and exits with the code; no traceback.
"""

from __future__ import annotations

# The exit-code scheme, documented in docs/faults.md ("Exit codes"). Never reuse a number.
EXIT_OK = 0             # everything asked for is done (or already was)
EXIT_INTERNAL = 1       # a bug in provision: a traceback was printed
EXIT_USAGE = 2          # bad flags, bad inventory/spec/profile file: nothing was touched
EXIT_FAILED = 3         # at least one host failed (or its outcome is unknown)
EXIT_CHANGES = 4        # --check found changes to make (nothing was changed)
EXIT_NOTHING = 5        # no host selected: nothing was done
EXIT_GAPS = 6           # audit: wrappers with uncovered, fixable EAGLE-3 gaps
EXIT_LOCKED = 7         # another provision run holds the control-machine lock
EXIT_BENCH_FLAGGED = 8  # bench: a host is flagged (no-spec, net-negative, underperforming, outlier)
EXIT_ROLLED_BACK = 9    # upgrade: a host was rolled back (not ready, or below the speed gate); the run stopped
EXIT_INTERRUPTED = 130  # Ctrl-C

EXIT_CODES = {
    EXIT_OK: "success: every selected host is in the wanted state",
    EXIT_INTERNAL: "internal error in provision (a bug: please report the traceback)",
    EXIT_USAGE: "usage or configuration error: nothing was touched",
    EXIT_FAILED: "at least one host failed, or its outcome is unknown; status: a server provision started is down "
                 "or unhealthy",
    EXIT_CHANGES: "--check: changes would be made (none were: a file to patch, a server to restart); status: a "
                  "host is missing, stale or hand-patch",
    EXIT_NOTHING: "no host matched the selection: nothing was done",
    EXIT_GAPS: "audit: uncovered EAGLE-3 gaps that a spec could fix",
    EXIT_LOCKED: "another provision run is in progress (control-machine lock held)",
    EXIT_BENCH_FLAGGED: "bench: a host is flagged (no-spec, net-negative, underperforming or outlier)",
    EXIT_ROLLED_BACK: "upgrade: a host was rolled back to its old release (not ready, or below the speed gate); "
                      "the run stopped there",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}


class ProvisionError(Exception):
    """An expected failure with a sentence for the user and an exit code."""

    exit_code = EXIT_FAILED
    kind = "error"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.message


class ConfigError(ProvisionError):
    """A spec, profile or inventory file is invalid. Names the file and field."""

    exit_code = EXIT_USAGE
    kind = "config"


class UsageError(ProvisionError):
    exit_code = EXIT_USAGE
    kind = "usage"


class NoHostsError(ProvisionError):
    """The selection matched no host (an unknown --host name, a --limit matching nothing)."""

    exit_code = EXIT_NOTHING
    kind = "no-hosts"


class LockedError(ProvisionError):
    exit_code = EXIT_LOCKED
    kind = "locked"


class HostError(ProvisionError):
    """One host failed; the run goes on with the others."""

    exit_code = EXIT_FAILED
    kind = "host"


class ConnectError(HostError):
    """Could not open an SSH session (refused, unreachable, timeout)."""

    kind = "connect"


class AuthError(HostError):
    """The host refused our credentials. Never retried."""

    kind = "auth"


class HostKeyError(HostError):
    """Unknown or changed host key. Never retried."""

    kind = "hostkey"


class RemoteError(HostError):
    """The remote step failed with a reason it reported."""

    kind = "remote"


class UnknownOutcome(HostError):
    """The connection died after the remote step began: state unknown until `status` looks."""

    kind = "unknown"
