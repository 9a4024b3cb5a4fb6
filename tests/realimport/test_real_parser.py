"""The oracle for the flags provision renders is the release's own parser (issue 38, item 3):
every shipped launch profile's argv, and `--arg` values of each shape (lists for `nargs` flags,
ints, floats, switches), are parsed by SGLang's real `ServerArgs.add_cli_args` parser, imported
in the realimport venvs (0.5.9 and 0.5.23). Where the real parser exits 2, preflight's judgement
(host/engine/serverargs.decide over the same release's files) is `fail`; where it takes the argv,
preflight takes it too, and the parsed values are what the profile said."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from provision.config.inventory import Host
from provision.config.profile import host_profile, render_flags
from provision.host.engine import serverargs
from provision.sandbox import realimport_venv as rv
from tests.realimport.conftest import CLEAN_ENV

# argv cases in, one JSON line per case out: {"rc": 0, "ns": {dest: value}} or {"rc": 2, "error": "..."}
PARSE = r'''
import argparse, contextlib, io, json, sys, warnings
warnings.simplefilter("ignore")
from sglang.srt.server_args import ServerArgs
for argv in json.loads(sys.stdin.read()):
    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = p.parse_args(argv)
        print(json.dumps({"rc": 0, "ns": {k: v for k, v in vars(ns).items() if isinstance(v, (int, float, str, list, bool, type(None)))}}))
    except SystemExit as exc:
        print(json.dumps({"rc": exc.code, "error": err.getvalue().strip().splitlines()[-1:]}))
'''

SHIPPED = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "playbooks").glob("*.yaml")
                 if "launch:" in p.read_text() and "engine: vllm" not in p.read_text())  # SGLang's profiles
# (--arg values, what the real parser should give for each dest, or None: it refuses them)
CASES = [
    ({"cuda-graph-bs": [1, 2, 4, 8]}, {"cuda_graph_bs": [1, 2, 4, 8]}),
    ({"lora-target-modules": ["q_proj", "v_proj"]}, {"lora_target_modules": ["q_proj", "v_proj"]}),
    ({"mem-fraction-static": 0.85, "tp-size": 8, "enable-metrics": True},
     {"mem_fraction_static": 0.85, "enable_metrics": True}),
    ({"cuda-graph-bs": [1, "two"]}, None),
    ({"tp-size": [1, 2]}, None),
    ({"tp-size": "eight"}, None),
    ({"enable-metrics": "yes"}, None),
]


def parse(venv: Path, argvs: list[list[str]]) -> list[dict]:
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", PARSE], input=json.dumps(argvs), capture_output=True,
                          text=True, timeout=600, cwd="/", env=CLEAN_ENV)
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == len(argvs), proc.stdout[-2000:] + proc.stderr[-2000:]
    return lines


def tables(version: str) -> dict:
    srt = rv.site_packages(rv.ensure_venv(version)[0]) / "sglang" / "srt"
    fields = {p.name: p.read_text() for p in sorted((srt / "arg_groups" / "fields").glob("*.py"))}
    choices = srt / "arg_groups" / "choices.py"
    spec = serverargs.parse_server_args((srt / "server_args.py").read_text(), "server_args.py", fields or None,
                                        choices.read_text() if choices.exists() else None)
    return serverargs.flag_table(spec)


def preflight(args: dict, table: dict, version: str) -> str:
    levels = [serverargs.decide(k, v, table, version)[0] for k, v in args.items() if v is not None]
    return "fail" if "fail" in levels else "ok"


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_every_rendered_argv_is_judged_as_the_real_parser_judges_it(version, base_059, base_0523):
    venv = base_059 if version == "0.5.9" else base_0523
    table = tables(version)
    base = host_profile(Host("h1"), "kimi-k25-eagle3")[0].args
    profiles = {name: host_profile(Host("h1"), name)[0].args for name in SHIPPED}
    cases = [(f"profile {n}", a, None) for n, a in profiles.items()] + [
        (f"--arg {json.dumps(extra)}", {**base, **extra}, want) for extra, want in CASES]
    answers = parse(venv, [render_flags(a) for _, a, _ in cases])
    for (what, args, want), got in zip(cases, answers):
        judged = preflight(args, table, version)
        real = "ok" if got["rc"] == 0 else "fail"
        assert judged == real, (version, what, got)
        if what.startswith("profile") and version == "0.5.9":
            assert got["rc"] == 0, (what, got)  # every shipped profile parses on the release it is for
        if want is not None and got["rc"] == 0:
            assert {k: got["ns"][k] for k in want} == want, (what, got["ns"])
        if want is None and what.startswith("--arg"):
            assert got["rc"] == 2, (what, got)


SIGNATURE = r'''
import argparse, json, sys, warnings
warnings.simplefilter("ignore")
if sys.argv[1] == "real":
    from sglang.srt.server_args import ServerArgs
    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
else:
    sys.path.insert(0, sys.argv[2])
    from provision.sandbox.standin_flags import own_parser
    p = own_parser(sys.argv[3])
print(json.dumps({",".join(a.option_strings): [a.dest, str(a.nargs), getattr(a.type, "__name__", repr(a.type)),
                  type(a).__name__, repr(a.default)] for a in p._actions}))
'''


def test_the_standins_parser_is_the_releases_own(base_059):
    """The sandbox's stand-in server parses its argv with 0.5.9's own `add_cli_args`, run from the
    installed server_args.py with its imports stubbed (sandbox/standin_flags.py), not with
    provision's reader: every flag has the real parser's dest, nargs, type, action and default."""
    repo = Path(__file__).resolve().parents[2]
    srt = rv.site_packages(base_059) / "sglang" / "srt"

    def sig(*argv: str) -> dict:
        proc = subprocess.run([str(base_059 / "bin" / "python"), "-c", SIGNATURE, *argv], capture_output=True,
                              text=True, timeout=600, cwd="/", env=CLEAN_ENV)
        return json.loads(proc.stdout.splitlines()[-1])

    real, own = sig("real"), sig("own", str(repo), str(srt / "server_args.py"))
    assert len(real) > 300 and own == real
