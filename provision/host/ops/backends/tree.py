"""What a watcher-run server is, shared by the detached and the systemd backends: the watcher
script, the server's state from its files, its log, and the stop of its process tree.  STDLIB ONLY.

The server runs under a small watcher (WATCHER) that records its exit status, so a crash is
reported with its real status even though nobody is attached. The watcher makes itself a child
subreaper: ranks that outlive the server are re-parented to it, so they stay provably the
server's (identity.py) and the watcher ends them after a grace period.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import time

from provision.host.lib import procfs
from provision.host.ops.backends import identity

START_FAILED = "[provision] the watcher could not start the server:"  # its line in the log

WATCHER = r"""
import ctypes, json, os, subprocess, sys, signal, time
START_FAILED = @START_FAILED@
try:  # PR_SET_CHILD_SUBREAPER: the server's orphaned ranks become ours, not init's
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
except Exception:
    pass
def put(path, text):  # a new file by a random name, never through a link, then renamed into place
    tmp = "%s.%s.tmp" % (path, os.urandom(8).hex())
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
def reap():  # orphans re-parented to us that died: wait for them (no zombies left behind)
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
def descendants(me):
    reap()
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            f = open("/proc/%s/stat" % d).read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if f[0] != "Z":
            kids.setdefault(int(f[1]), []).append(int(d))
    out, todo = [], [me]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return sorted(out)
def end_rest_of_tree(grace, reapfile):
    # The main server process is gone; ranks it did not take with it hold GPU memory. Give them
    # `grace` seconds to follow, then SIGKILL what is left of our tree (our descendants: never a
    # process that merely has the same numbers), and record it (reapfile) so `status` can say so.
    me = os.getpid()
    seen = descendants(me)
    if not seen:
        return
    end = time.monotonic() + grace
    while time.monotonic() < end and descendants(me):
        time.sleep(0.2)
    killed = descendants(me)
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    put(reapfile, json.dumps({"at": time.time(), "pids": seen, "killed": killed, "grace": grace}))
spec = json.loads(open(sys.argv[1]).read() if len(sys.argv) > 1 else sys.stdin.read())
env = dict(spec["env"])
log = os.fdopen(os.open(spec["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600), "ab", buffering=0)
try:
    p = subprocess.Popen(spec["argv"], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         env=env, cwd=spec["cwd"], preexec_fn=os.setpgrp)
except (OSError, ValueError, subprocess.SubprocessError) as exc:  # the server's own error goes in its log
    log.write(("%s %s: %s\n" % (START_FAILED, type(exc).__name__, exc)).encode())
    put(spec["exitfile"], "127")
    sys.exit(127)
put(spec["pidfile"], str(p.pid))
done = []
def fwd(sig, frame):
    if done:  # reaped: its number is no longer its own
        return
    try:
        os.killpg(p.pid, sig)
    except OSError:
        pass
stopping = []  # signals we forwarded: a stop asked for, not a failure
signal.signal(signal.SIGTERM, lambda sig, frame: (stopping.append(sig), fwd(sig, frame)))
signal.signal(signal.SIGINT, lambda sig, frame: (stopping.append(sig), fwd(sig, frame)))
rc = p.wait()
done.append(rc)
put(spec["exitfile"], str(rc))
if spec.get("reapfile"):
    end_rest_of_tree(float(spec.get("tree_grace", 10)), spec["reapfile"])
# The exit status carries the server's failure (a signal n as 128+n, like a shell), so that
# systemd's Restart=on-failure restarts a server that died; one stopped on purpose (we
# forwarded SIGTERM/SIGINT) ends in success.
if rc != 0 and not stopping:
    sys.exit(rc if rc > 0 else 128 - rc)
""".replace("@START_FAILED@", repr(START_FAILED))


def start_failure(spec: dict) -> str:
    """Why a server did not start, in a sentence: the watcher's own line from the log when it could
    not start it (an interpreter that does not run, say), and where the log is."""
    why = ""
    try:
        with open(spec["log"], "rb") as fh:
            fh.seek(max(0, os.path.getsize(spec["log"]) - 8192))
            for line in fh.read().decode("utf-8", "replace").splitlines():
                if line.startswith(START_FAILED):
                    why = line[len(START_FAILED):].strip()
    except OSError:
        pass
    return "the server did not start" + (f": {why}" if why else "") + f"; see {spec['log']}"


def clear_files(spec: dict, keys: tuple = ("pidfile", "exitfile", "reapfile")) -> None:
    """Remove the last server's pid, exit and reap files before a start: they are the new one's."""
    for key in keys:
        try:
            os.unlink(spec[key])
        except (OSError, KeyError):
            pass


def wait_pid(pidfile: str, gone, tries: int = 500) -> int | None:
    """The server's pid, once the watcher has written it to ``pidfile``; None when ``gone()`` says the
    watcher (or its unit) ended first, or after ``tries`` looks 20 ms apart. Shared by every backend
    that runs the watcher."""
    for _ in range(tries):
        try:
            with open(pidfile) as fh:
                return int(fh.read().strip())
        except (OSError, ValueError):
            if gone():
                return None
            time.sleep(0.02)
    return None


def alive(pid: int | None, starttime: str | None) -> bool:
    """`pid` lives (and, given a start time, is that process)."""
    if not pid:
        return False
    st = procfs.starttime(pid)
    s = procfs.state(pid)
    return st is not None and (starttime is None or st == str(starttime)) and s not in (None, "Z")


def survivors(rec: dict | None) -> list[int]:
    """Live processes of a server tree whose main process is dead (ranks it left behind): provably
    the tree's (identity.owned), never the watcher itself."""
    if not rec or alive(rec.get("pid"), rec.get("starttime")):
        return []
    return [p for p in identity.owned(rec) if p != rec.get("watcher")]


def state(rec: dict) -> dict:
    """running, exit status, survivors, what the watcher reaped: from the process table and the
    watcher's files."""
    out: dict = {"record": rec, "running": alive(rec.get("pid"), rec.get("starttime"))
                 and not rec.get("stopped_at") and identity.same_boot(rec)}
    out["survivors"] = [] if out["running"] else survivors(rec)
    out["exit"] = None
    try:
        with open(rec.get("reapfile") or "") as fh:
            out["reaped"] = json.load(fh)
    except (OSError, ValueError):
        pass
    try:
        with open(rec["exitfile"]) as fh:
            out["exit"] = int(fh.read().strip())
    except (OSError, ValueError, KeyError):
        pass
    return out


def read_chunk(path: str, offset: int, max_bytes: int) -> tuple[str, int]:
    """(new log text from `offset`, the new offset)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(max_bytes)
        return data.decode("utf-8", "replace"), offset + len(data)
    except OSError:
        return "", offset


def tail(rec: dict, lines: int) -> dict:
    try:
        with open(rec["log"], "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            data = fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return {"ok": False, "error": {"kind": "io", "message": f"{rec['log']}: {exc.strerror}"}}
    text = data.replace("\r", "\n")
    shown = "\n".join(text.splitlines()[-lines:]) if lines else ""
    return {"ok": True, "log": rec["log"], "text": shown, "offset": size,
            "record": rec}


def prune_logs(directory: str, pattern: str, keep: int, current: str | None) -> list[str]:
    """Remove all but the `keep` newest logs matching `pattern` (a port's, its engine's
    `log_glob`), newest by modification time (names made in the same second do not sort by age),
    never the current one."""
    logs = []
    for path in glob.glob(os.path.join(directory, pattern)):
        try:
            logs.append((os.stat(path).st_mtime_ns, path))
        except OSError:
            continue
    logs.sort()
    gone = []
    for _, old in logs[:-keep] if keep > 0 else []:
        if current and os.path.abspath(old) == os.path.abspath(current):
            continue
        try:
            os.unlink(old)
            gone.append(old)
        except OSError:
            pass
    return gone


def in_flight_now(rec: dict, engine) -> int | None:
    """The requests the server has in flight now, by its own gauges on its metrics page (the engine's
    `busy_metric`, running, and `waiting_metric`, queued); None when it has none or does not answer in 2 s."""
    if not engine.busy_metric or not engine.metrics_path:
        return None
    import urllib.request

    from provision.host.lib.promtext import gauge_sum

    host = str(rec.get("host") or "127.0.0.1")
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    try:
        with urllib.request.urlopen(f"http://{host}:{int(rec.get('port') or 30000)}{engine.metrics_path}",
                                    timeout=2) as resp:
            text = resp.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    return int(gauge_sum(text, engine.busy_metric) + (gauge_sum(text, engine.waiting_metric)
                                                      if engine.waiting_metric else 0))


def drain(rec: dict, grace: float) -> dict:
    """Let the server finish its requests in flight, as its engine drains: SIGTERM to its main
    process only (SGLang answers 503 and ends its tree once nothing is in flight; vLLM started with
    --shutdown-timeout waits for them), then wait for the whole tree to end, up to `grace` seconds.
    A signal to every rank instead would end them mid-request. What is still in flight at the
    deadline is read from the engine's own drain lines in the log written since the signal (its
    `drain_remaining`); an engine that aborted them instead says so there too (`drain_aborted`: vLLM
    started without --shutdown-timeout). {"drained": bool, "waited": s, "in_flight": N or None (not
    said), "aborted": N or None}."""
    from provision.host import inference

    t0 = time.monotonic()
    main = rec.get("pid")
    pids = identity.owned(rec)
    if not pids or main not in pids or not alive(main, rec.get("starttime")):
        return {"drained": False, "waited": 0.0, "in_flight": None, "skipped": True}
    known = identity.snapshot(pids)
    try:
        offset = os.path.getsize(rec.get("log") or "")
    except OSError:
        offset = None
    engine = inference.get(inference.of_record(rec))
    before = in_flight_now(rec, engine)
    try:
        os.kill(int(main), signal.SIGTERM)
    except OSError:
        pass
    deadline = t0 + grace
    while time.monotonic() < deadline and (identity.still_alive(known) or identity.owned(rec)):
        time.sleep(0.1)
    gone = not identity.still_alive(known) and not identity.owned(rec)
    in_flight = aborted = None
    if offset is not None:
        text, _ = read_chunk(rec["log"], offset, 4 << 20)
        in_flight = None if gone else engine.drain_remaining(text)
        aborted = engine.drain_aborted(text, before)
    return {"drained": gone and not aborted, "waited": round(time.monotonic() - t0, 2), "in_flight": in_flight,
            "aborted": aborted, "flag": engine.drain_flag if aborted else None}


def stop_tree(rec: dict, grace: float, drain_first: bool = False) -> dict:
    """SIGTERM the server's tree, SIGKILL what is left after `grace` seconds: only processes that are
    provably the record's (identity.owned, then the identities taken at the start, so ranks
    re-parented away mid-stop are still followed and a reused number never is). `drain_first`: the
    server drains first (`drain`), its requests in flight finished within the same `grace`; the
    answer's "cut" says how many were still in flight at the deadline (None: not said)."""
    t0 = time.monotonic()
    pids = identity.owned(rec)
    if not pids:
        return {"ok": True, "stopped": False, "pids": [], "escalated": False, "elapsed": 0.0}
    drained = drain(rec, grace) if drain_first else None
    if drained is not None and not drained.get("skipped"):
        grace = max(0.0, grace - drained["waited"])  # the rest of the deadline, for what is left
    known = identity.snapshot(pids)

    def left() -> list[int]:
        return sorted(set(identity.still_alive(known)) | set(identity.owned(rec)))

    main = rec.get("pid")
    group = None
    if main in pids and alive(main, rec.get("starttime")):
        group = int(main)
        try:
            os.killpg(group, signal.SIGTERM)  # its own group, and it leads it: the number is its
        except OSError:
            pass
    for pid in pids:  # the rest of the tree (ranks the server left, or in groups of their own)
        if pid != rec.get("watcher") and (group is None or procfs.pgid(pid) != group):
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and left():
        time.sleep(0.1)
    sent_kill = False
    rest = left()
    if rest:
        sent_kill = True
        for pid in rest:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        end = time.monotonic() + 10
        while time.monotonic() < end and left():
            time.sleep(0.05)
    rest = left()
    if rest:
        return {"ok": False, "error": {"kind": "stop", "message": f"processes still alive after SIGKILL: {rest}"}}
    out = {"ok": True, "stopped": True, "pids": pids, "escalated": sent_kill, "elapsed": round(time.monotonic() - t0, 2)}
    if drained is not None and not drained.get("skipped"):
        out["drain"] = {"drained": drained["drained"], "waited": drained["waited"]}
        if drained.get("aborted"):  # the engine aborted them itself (its drain flag off)
            out["drain"].update(aborted=drained["aborted"], flag=drained.get("flag"))
        if not drained["drained"]:
            # still in flight at the deadline, or aborted by the engine (None: the engine did not say)
            out["cut"] = drained.get("aborted") or drained["in_flight"]
    return out
