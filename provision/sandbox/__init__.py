"""Simulated GPU hosts, the stand-in server and real SGLang wheels: for tests and trying provision out.

Importing the package registers every host kind with ``hosts.KIND_MODULES`` (systemd.py registers itself).
"""

from provision.sandbox import hosts, systemd  # noqa: F401
