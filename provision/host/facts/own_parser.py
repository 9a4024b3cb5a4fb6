"""An install's flags, model registry and speculative methods, asked of the engine's own parser in
the interpreter the server would run.  STDLIB ONLY.

vLLM's flags are generated at run time from its config dataclasses: reading its source cannot say
which it takes, so preflight asks the installed release itself. The engine's ``parser_probe``
(data of host/inference: the imports that build its real parser, its speculative methods and its
registry's architectures) runs after :data:`TABLE_OF`, which turns any argparse parser into the
flag table engine/serverargs.py's ``decide`` judges (the shape SGLang's source reader makes). The
probe only builds a parser and reads tables: it starts no server, binds nothing, and is killed
with its process group at :data:`TIMEOUT`. The caller caches the answer per install
(ops/preflight_model.py), so it runs once per install and release.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

PREFIX = "PROVISION-PARSER "
TIMEOUT = 180.0  # importing vLLM takes 6 s alone on 2 cores, several times that beside a busy server

# Runs in the engine's interpreter (any Python 3.8+), before the engine's probe. Pure but for argparse.
TABLE_OF = r'''
import argparse, json, sys, typing

SWITCHES = {argparse._StoreTrueAction: "store_true", argparse._StoreFalseAction: "store_false",
            argparse._StoreConstAction: "store_const", argparse._CountAction: "count",
            argparse._HelpAction: "store_true", argparse._VersionAction: "store_true"}
TYPES = {int: "int", float: "float", str: "str"}


def _choices(a):
    ch = a.choices
    if ch is None or isinstance(ch, range) and len(ch) > 256:
        return None
    try:
        return [c if isinstance(c, (str, int, float, bool)) or c is None else str(c) for c in ch]
    except TypeError:
        return None


def _shape(a):
    boolean_opt = getattr(argparse, "BooleanOptionalAction", None)
    if boolean_opt is not None and isinstance(a, boolean_opt):
        return {"switch": "BooleanOptionalAction", "default": a.default if isinstance(a.default, bool) else None}
    for cls, name in SWITCHES.items():
        if type(a) is cls:
            return {"switch": name, "default": a.default if isinstance(a.default, bool) else None}
    if type(a) is not argparse._StoreAction:
        return {"custom": True}  # append, extend, a release's own Action: not judged
    nargs = a.nargs if isinstance(a.nargs, (int, str)) else None
    return {"nargs": nargs, "type": TYPES.get(a.type) if a.type is not None else "str"}


def table_of(parser):
    """{option string: {"dest", "choices", and its shape}} of every dashed option of `parser`."""
    table = {}
    for a in parser._actions:
        shape = _shape(a)
        for opt in a.option_strings:
            if not opt.startswith("-"):
                continue
            if shape.get("switch") == "BooleanOptionalAction" and opt.startswith("--no-"):
                table.setdefault(opt, {"dest": a.dest, "choices": None, "switch": "negation"})
            else:
                table.setdefault(opt, dict({"dest": a.dest, "choices": _choices(a)}, **shape))
    return table


def literal_values(tp):
    """The strings of a Literal, or of a Union of Literals (vLLM's SpeculativeMethod)."""
    out = []
    for x in typing.get_args(tp):
        out += [x] if isinstance(x, str) else literal_values(x)
    return out
'''

TAIL = r'''
sys.stdout.write(PREFIX + json.dumps({"flags": table_of(PARSER), "spec_methods": METHODS, "archs": ARCHS,
                                      "version": VERSION}) + "\n")
'''


def probe_code(engine_probe: str) -> str:
    """The program run in the engine's interpreter: the table maker, the engine's probe (it sets
    PARSER, METHODS, ARCHS and VERSION), and the line that prints them."""
    return f"PREFIX = {PREFIX!r}\n" + TABLE_OF + "\n" + engine_probe + "\n" + TAIL


def answer_of(stdout: str, stderr: str, returncode: int) -> tuple[dict | None, str | None]:
    """(the probe's tables, None) from its output, else (None, why in a sentence). Pure."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(PREFIX):
            try:
                doc = json.loads(line[len(PREFIX):])
            except ValueError as exc:
                return None, f"its answer was not read ({exc})"
            if isinstance(doc, dict) and isinstance(doc.get("flags"), dict):
                return doc, None
            return None, "its answer has no flag table"
    last = [l.strip() for l in stderr.splitlines() if l.strip()]
    return None, (last[-1][:300] if last else f"it exited with status {returncode} and said nothing")


def ask(engine_probe: str, python: str, env: dict, timeout: float = TIMEOUT) -> tuple[dict | None, str | None]:
    """Run the probe in `python` with the server's `env`: (tables, None) or (None, why). The probe's
    process group is killed when it outlives `timeout`."""
    try:
        proc = subprocess.Popen([python, "-c", probe_code(engine_probe)], env=env, cwd="/", stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        return None, f"{python} did not run ({exc.strerror or exc})"
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.communicate()
        return None, f"{python} did not build the parser within {timeout:.0f} s"
    return answer_of(out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), proc.returncode)
