"""Mask secrets in text before it is shown or stored: the one redactor, shared with the host side
(provision/host/lib/redact.py, stdlib only, where it lives so the host's facts use it too)."""

from __future__ import annotations

from provision.host.lib.redact import MASK, redact, redact_argv, redact_doc  # noqa: F401

__all__ = ["MASK", "redact", "redact_argv", "redact_doc"]

