"""One line in the host's syslog.  STDLIB ONLY (a leaf)."""

from __future__ import annotations


def host_log(message: str) -> None:
    """One line in the host's syslog (best effort, never raises)."""
    try:
        import syslog

        syslog.openlog("provision", 0, syslog.LOG_USER)
        syslog.syslog(syslog.LOG_NOTICE, message[:900])
        syslog.closelog()
    except Exception:  # noqa: BLE001
        pass
