"""Helpers the benchmarks share: the CLI to time, an SSH port, free loopback addresses, hosts."""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path

from provision.sandbox.homedir import isolate
from provision.sandbox.hosts import AddressInUse, HostSpec, Sandbox


def isolate_home() -> str:
    """A throwaway HOME and XDG state for this benchmark process and every `provision` it
    runs (as the test suite's `isolated_home` fixture): the user's journal, reconcile
    cache, lock and ~/.ssh are never touched. Done on import: every benchmark imports this."""
    import atexit
    import tempfile

    base = tempfile.mkdtemp(prefix="provision-bench-home-")
    isolate(base)
    atexit.register(shutil.rmtree, base, True)
    return base


BENCH_HOME = isolate_home()


def provision_argv() -> list[str]:
    """The console script next to this interpreter (not a pyenv shim, which adds ~0.2 s)."""
    exe = Path(sys.executable).with_name("provision")
    if not exe.exists():
        exe = shutil.which("provision")
    return [str(exe)] if exe else [sys.executable, "-m", "provision"]


def _bindable(addr: str, port: int) -> bool:
    s = socket.socket()
    try:
        s.bind((addr, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def ssh_port(probe: str = "127.0.2.254") -> int:
    """22 unless something listens on *:22 (as tests/conftest.py decides)."""
    for port in (22, 10022, 20022):
        if _bindable(probe, port):
            return port
    return 30022


def free_addresses(n: int, first: int, port: int, net: str = "127.0.2") -> list[str]:
    """n addresses <net>.<first..254> (then downwards) that nobody listens on at `port`."""
    out = []
    for last in list(range(first, 255)) + list(range(first - 1, 1, -1)):
        addr = f"{net}.{last}"
        if _bindable(addr, port):
            out.append(addr)
            if len(out) == n:
                return out
    raise SystemExit(f"only {len(out)} free addresses in {net}.x for port {port}; need {n}")


def up_hosts(box: Sandbox, names: list[str], first: int, port: int, net: str = "127.0.2"):
    """Start 0.5.9 source-checkout hosts; retry with fresh addresses if another sandbox took one."""
    for _ in range(5):
        addrs = free_addresses(len(names), first, port, net)
        try:
            return box.up([HostSpec(n, a, "0.5.9", "source", port) for n, a in zip(names, addrs)])
        except (AddressInUse, OSError) as exc:
            print(f"  (address race: {exc}; retrying)", file=sys.stderr)
            first = (first + len(names)) % 250 or 2
    raise SystemExit("could not find free loopback addresses")
