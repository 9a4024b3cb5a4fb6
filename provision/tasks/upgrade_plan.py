"""`provision upgrade`'s decisions, pure: where a new install goes, which old ones go, whether a
host passes the speed gate, and the order hosts go in.

An upgrade is a restart into another install (issue 61): the new release goes into a venv beside
the serving one, named for the engine and the version (`/root/sglang-0.5.10` beside
`/root/sglang-0.5.9`), so the way back is a restart into the old one, never a reinstall. Nothing
here reads a host or runs anything; the host op (host/ops/upgrade.py) and the verb
(tasks/upgrade.py) act on what these say.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from packaging.version import InvalidVersion, Version

# The default speed gate: the new release's decode speed over the old one's, per host.
MIN_SPEEDUP = 0.95
# How many upgrade-made installs a host keeps (besides the serving one and the way back).
KEEP = 2

_NAME = re.compile(r"^(?P<engine>sglang|vllm)-(?P<version>[0-9][0-9A-Za-z.+!-]*)$")


def venv_of(python: str | None) -> str | None:
    """The venv directory a serving interpreter lives in (`/root/sglang-0.5.9/bin/python` ->
    `/root/sglang-0.5.9`), or None when the path is not `<dir>/bin/<python...>` below a parent."""
    if not python:
        return None
    p = PurePosixPath(python)
    if not p.is_absolute() or p.parent.name != "bin" or not p.name.startswith("python") or len(p.parts) < 4:
        return None
    return str(p.parent.parent)


def venv_beside(serving_venv: str, engine: str, version: str) -> str:
    """Where `version` of `engine` goes: beside the serving venv, named ENGINE-VERSION."""
    Version(version)  # a version, never a path: InvalidVersion for "../x" or "1.0; rm"
    return str(PurePosixPath(serving_venv).parent / f"{engine}-{version}")


def named_install(path: str, engine: str) -> str | None:
    """The version an upgrade-made venv's name says (`/root/sglang-0.5.10` -> "0.5.10"), else None."""
    m = _NAME.match(PurePosixPath(path).name)
    if m is None or m.group("engine") != engine:
        return None
    try:
        Version(m.group("version"))
    except InvalidVersion:
        return None
    return m.group("version")


def to_prune(installs: list[str], engine: str, *, serving: str | None, way_back: str | None,
             keep: int = KEEP) -> list[str]:
    """Which of a host's venvs to remove after an upgrade: of those named ENGINE-VERSION (made by
    an upgrade), all but the `keep` newest by version; never the serving one nor the way back,
    which are kept beside the `keep`. Anything else (the venv the fleet started from, named as
    its owner chose) is never pruned."""
    if keep < 0:
        raise ValueError("keep must be 0 or more")
    named = sorted(((Version(v), p) for p in installs if (v := named_install(p, engine)) is not None),
                   reverse=True)
    protected = {serving, way_back} - {None}
    kept = 0
    out = []
    for _, path in named:
        if path in protected:
            continue
        if kept < keep:
            kept += 1
            continue
        out.append(path)
    return out


@dataclass(frozen=True)
class Figure:
    """One host's decode speed and accept length, and where the figure came from."""
    tok_s: float
    accept_length: float | None = None
    source: str = "measured"  # "measured now", "journal 2026-12-06 10:02", ...

    def said(self) -> str:
        acc = f", accept length {self.accept_length:g}" if self.accept_length is not None else ""
        return f"{self.tok_s:.1f} tok/s{acc}"


@dataclass(frozen=True)
class Verdict:
    passed: bool
    words: str
    ratio: float | None = None


def gate(before: Figure | None, after: Figure | None, min_speedup: float = MIN_SPEEDUP,
         force: bool = False) -> Verdict:
    """Whether the new release is fast enough to keep: `after` over `before` at least
    `min_speedup`. No figure after the restart fails; no figure before passes only with `force`
    (the gate then says it judged nothing)."""
    if after is None or not math.isfinite(after.tok_s) or after.tok_s <= 0:
        return Verdict(False, "no speed measured on the new release: the gate cannot pass it")
    if before is None or not math.isfinite(before.tok_s) or before.tok_s <= 0:
        if force:
            return Verdict(True, f"after {after.said()}; no figure from before: not gated (--force)")
        return Verdict(False, f"after {after.said()}; no figure from before to gate against "
                              "(--force goes on without the gate)")
    ratio = after.tok_s / before.tok_s
    words = (f"{before.said()} -> {after.said()}: {ratio:.2f}x of before ({before.source}), "
             f"gate {min_speedup:g}x")
    return Verdict(ratio >= min_speedup, words, ratio)


def journaled_figure(records: list[dict], version: str | None) -> Figure | None:
    """The host's last journaled bench of the release it serves (`version`), as the gate's figure
    from before when the server does not answer a bench now: journal records oldest first (one
    host's); a bench of another release, or without a decode figure, is not one."""
    for rec in reversed(records):
        fig = rec.get("bench") if rec.get("command") == "bench" and rec.get("verdict") == "measured" else None
        if not isinstance(fig, dict) or (version and fig.get("version") != version):
            continue
        tok_s, acc = fig.get("decode_tok_s"), fig.get("accept_length")
        if isinstance(tok_s, (int, float)) and math.isfinite(tok_s) and tok_s > 0:
            return Figure(float(tok_s), float(acc) if isinstance(acc, (int, float)) else None,
                          f"the journal's bench of {str(rec.get('time') or '')[:16].replace('T', ' ')}")
    return None


def needs_force(before: Figure | None, force: bool) -> str | None:
    """Before anything stops: a host with no figure to gate against is refused without --force."""
    if before is None and not force:
        return ("no speed figure from before (the server did not answer a bench, and the journal has none): "
                "the gate could not judge the new release; --force upgrades without it")
    return None


def canary_batches(units: list[list], canary: int, per: int) -> list[list]:
    """The order hosts go in: the first `canary` units alone, as one batch, then batches of `per`
    units. Units are lists of hosts (a multi-node group is one unit)."""
    if canary < 0 or per < 1:
        raise ValueError("canary must be 0 or more and a batch at least 1")
    head, tail = units[:canary], units[canary:]
    out = [[h for u in head for h in u]] if head else []
    out += [[h for u in tail[i:i + per] for h in u] for i in range(0, len(tail), per)]
    return out


def serving_install(installs: list[dict], serving_python: str | None) -> dict | None:
    """Of a host's installs (discovery's records: path, version, interpreters), the one the server's
    interpreter runs: named among its interpreters, or inside that interpreter's venv."""
    if not serving_python:
        return None
    venv = venv_of(serving_python)
    for inst in installs:
        if serving_python in (inst.get("interpreters") or []) or \
                (venv and str(inst.get("path") or "").startswith(venv + "/")):
            return inst
    return None


def installs_note(installs: list[dict], serving_python: str | None, port, judged: str | None) -> list[str]:
    """What `status` says of a host with more than one install of the engine: each install and its
    version, which one the server on `port` runs, and, when that is not the install judged (`judged`,
    discovery's choice), that the row above is about the other one."""
    if len(installs) < 2:
        return []
    serving = serving_install(installs, serving_python)
    parts = [f"{i.get('path')} ({i.get('version') or 'version unknown'}"
             + (f", serving port {port}" if i is serving else "") + ")" for i in installs]
    out = [f"{len(installs)} installs here: " + "; ".join(parts)]
    if serving is not None and judged and serving.get("path") != judged:
        out.append(f"the server on port {port} runs {serving.get('path')} ({serving.get('version')}), not the install "
                   f"judged above: `--python {serving_python}` (or the inventory's `python:`) to judge it")
    return out


# The journal's upgrade lines that end a host's swap, the one that begins it, and the one that
# begins its rollback (the restart back onto the old side).
SWAP_BEGUN = "swapping"
ROLLBACK_BEGUN = "rolling-back"
SWAP_ENDED = ("upgraded", "rolled-back", "failed", "refused")


def _unended(records: list[dict]) -> dict | None:
    """The last upgrade swap (or its rollback) begun on a host with no outcome after it: its journal
    record, or None. Records oldest first, one host's."""
    for rec in reversed(records):
        if rec.get("command") != "upgrade":
            continue
        if rec.get("verdict") in SWAP_ENDED:
            return None
        if rec.get("verdict") in (SWAP_BEGUN, ROLLBACK_BEGUN):
            return rec if isinstance(rec.get("upgrade"), dict) else None
    return None


def unfinished_swap(records: list[dict], to: str | None, image: str | None) -> dict | None:
    """The swap a run began on this host and never ended (stopped between the restart and the gate:
    a Ctrl-C, a lost connection, the control machine down), when it moved to the same release (`to`)
    or image: its journal figures (from, to, old and new sides, before), and `rollback` (why) when
    the last step begun was the rollback. Records oldest first, one host's; None when the last swap
    ended or was another release's. Pure."""
    rec = _unended(records)
    if rec is None:
        return None
    fig = rec["upgrade"]
    same = (image and fig.get("image") == image) or (not image and to and fig.get("to") == to)
    if not same:
        return None
    return {**fig, "rollback": fig.get("why") or "the gate"} if rec["verdict"] == ROLLBACK_BEGUN else fig


def unfinished_words(records: list[dict]) -> str | None:
    """What `status` says of a host an upgrade left mid-swap (the journal on this machine): which
    step, and the command that resumes it; None when none is unfinished. Pure."""
    rec = _unended(records)
    if rec is None:
        return None
    fig = rec["upgrade"]
    when = str(rec.get("time") or "")[:16].replace("T", " ")
    again = f"--image {fig['image']}" if fig.get("image") else f"--to {fig.get('to')}"
    step = (f"in its rollback to {fig.get('from')}" if rec["verdict"] == ROLLBACK_BEGUN
            else "between its restart and its gate")
    return (f"the upgrade {fig.get('from')} -> {fig.get('to')} begun {when} stopped {step}: the server above is the "
            f"side serving now; `provision upgrade {again}` again resumes it")
