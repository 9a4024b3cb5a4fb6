"""A sandbox host's server port, reachable from this machine: what a router in front of a fleet needs.

A sandbox host has its own network namespace (hosts.py): a server it runs on 127.0.0.1:PORT is
reachable only inside it. `forward(host, port)` binds the host's loopback address and that port on
this machine and starts one small relay (``forward.py`` below) *inside the host's network
namespace*, the bound socket inherited: each connection it accepts (from this machine) it connects
to 127.0.0.1:PORT there (a socket belongs to the namespace it was created in) and relays the bytes
both ways. So ``http://ADDRESS:PORT`` on this machine is the host's server, as a router on another
machine reaches a real host's server by its address.

The relay ends when the host's init dies, or the owner process (the test session) does; a second
`forward` of the same port finds the first one running and returns it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

FORWARD_PY = r'''# provision sandbox port relay (see provision/sandbox/forward.py)
import os, select, socket, sys, threading


def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def relay(conn, port):
    try:
        up = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        conn.close()  # nothing listens in the host: the client sees the connection closed
        return
    up.settimeout(None)
    t = threading.Thread(target=pump, args=(up, conn), daemon=True)
    t.start()
    pump(conn, up)
    t.join()
    conn.close()
    up.close()


def main():
    sock_fd, port, init_pid, owner_pid = (int(a) for a in sys.argv[1:5])
    sock = socket.socket(fileno=sock_fd)
    watch = [sock]
    for pid in (init_pid, owner_pid):
        if pid > 0:
            try:
                watch.append(os.pidfd_open(pid))
            except ProcessLookupError:
                return
    while True:
        ready, _, _ = select.select(watch, [], [])
        if any(r is not sock for r in ready):
            return
        try:
            conn, _ = sock.accept()
        except OSError:
            continue
        threading.Thread(target=relay, args=(conn, port), daemon=True).start()


main()
'''


def _pidfile(host, port: int) -> Path:
    return host.state_dir / f"forward-{port}.pid"


def _running(path: Path) -> int | None:
    """The relay's pid from its file, when that process (same start time) still runs."""
    from provision.sandbox.hosts import _alive

    try:
        pid, start = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid, start) else None


def forward(host, port: int) -> int:
    """Make the host's 127.0.0.1:`port` reachable at its address:`port` on this machine; the relay's pid."""
    from provision.sandbox.hosts import SYSTEM_PYTHON, _bind, _proc_start, _spawn_detached

    path = _pidfile(host, port)
    pid = _running(path)
    if pid is not None:
        return pid
    program = host.bin_dir / "forward.py"
    if not program.exists() or program.read_text() != FORWARD_PY:
        tmp = program.with_suffix(".tmp")
        tmp.write_text(FORWARD_PY)
        os.replace(tmp, program)
    sock = _bind(host.address, port)
    try:
        pid = _spawn_detached(["/usr/bin/nsenter", f"--target={host.init_pid}", "--net", "--",
                               SYSTEM_PYTHON, "-I", "-S", str(program), str(sock.fileno()), str(port),
                               str(host.init_pid), str(host.owner_pid)], host.log_path, pass_fds=(sock.fileno(),))
    finally:
        sock.close()
    path.write_text(f"{pid} {_proc_start(pid)}")
    return pid


def unforward(host, port: int) -> None:
    """End the host's relay of `port` (if it runs): the address:port is free again."""
    pid = _running(_pidfile(host, port))
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
    _pidfile(host, port).unlink(missing_ok=True)
