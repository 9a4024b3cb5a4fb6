"""`provision bench`: the request per host, its answer as a row, the fleet's figures and flags.

One remote call per host (ops/bench.py times the server from the host's own loopback); the
arithmetic is output/benchfigures.py's, the Prometheus text output/prometheus.py's. Verdicts:

    measured   the figures are in data (decode_tok_s, p10/p90, ttft_s, accept_length, ...)
    busy       the server was serving traffic (/flush_cache 400): not measured (--force measures)
    failed     nothing answers, still loading, 401, a stream cut or not JSON: the sentence says which
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from provision.config.inventory import Host
from provision.errors import EXIT_BENCH_FLAGGED, EXIT_FAILED, EXIT_NOTHING, EXIT_OK
from provision.host.protocol import BenchAnswer, BenchRequest
from provision.output import benchfigures as bf
from provision.output.results import HostResult
from provision.tasks import recorded

RECORD_KEYS = ("decode_tok_s", "decode_tok_s_p10", "decode_tok_s_p90", "ttft_s", "accept_length", "accept_rate",
               "speedup", "flags", "version")
# what the journal keeps of a measured host (`history --json` shows it; `history` the detail)
JOURNAL_KEYS = ("decode_tok_s", "decode_tok_s_p10", "decode_tok_s_p90", "ttft_s", "accept_length", "accept_rate",
                "speedup", "flags", "version", "key")


@dataclass
class BenchOptions:
    port: int | None = None            # --server-port; default: the host's launch profile's port
    requests: int = 15
    max_new_tokens: int = 512
    warmup: int = 2
    force: bool = False
    secrets: dict = field(default_factory=dict)
    timeout: float = 300.0             # the floor of one host's call; grows with the work asked
    read_timeout: float = 120.0


def call_timeout(opts: BenchOptions) -> float:
    """One host's call may take: every request at a slow 5 tok/s plus a minute, at least --timeout."""
    per = 30.0 + opts.max_new_tokens / 5.0
    return max(opts.timeout, (opts.requests + opts.warmup) * per + 60.0)


ASSUMED_TOK_S = 50.0   # the up-front estimate's speed: about a Kimi-K2.5 server without EAGLE-3


def expected_seconds(opts: BenchOptions, tok_s: float = ASSUMED_TOK_S) -> float:
    """One host's bench, up front: every request decoding --max-new-tokens at tok_s (hosts run in
    parallel, so this is the run's too when they fit in --forks)."""
    return (opts.warmup + opts.requests) * (opts.max_new_tokens / tok_s + 0.1)


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds} s" if seconds < 60 else f"{seconds // 60} min {seconds % 60:02d} s"


def plan_line(opts: BenchOptions, hosts: int) -> str:
    """What the run will do and how long it should take, said before it starts."""
    n = opts.warmup + opts.requests
    line = (f"bench: {hosts} host{'s' if hosts != 1 else ''}, each {opts.warmup} warm-up + {opts.requests} measured "
            f"requests of {opts.max_new_tokens} tokens, one at a time: about {duration(expected_seconds(opts))} "
            f"per host at {ASSUMED_TOK_S:g} tok/s")
    if n * opts.max_new_tokens > 2000:
        line += "; `-n 3 --max-new-tokens 64` takes seconds"
    return line


def progress_text(event: dict, elapsed: float) -> str | None:
    """One host's progress after a request (the event of host/ops/bench.py): which request of how
    many, its decode speed, and the time left at this host's pace so far (elapsed: since its call
    began)."""
    stage, done, of = event.get("bench"), event.get("done"), event.get("of")
    step, steps = event.get("step"), event.get("steps")
    if stage not in ("warmup", "request") or not all(isinstance(v, int) and v > 0 for v in (done, of, step, steps)):
        return None
    rate = bf.decode_rate(event.get("request") or {})
    text = f"{'warm-up' if stage == 'warmup' else 'request'} {done}/{of}"
    if rate is not None:
        text += f": {rate:.1f} tok/s"
    return text + (f"; about {duration(elapsed / step * (steps - step))} left" if step < steps else "")


def port_for(host: Host, opts: BenchOptions) -> int:
    if opts.port:
        return opts.port
    try:
        from provision.config.profile import host_profile

        prof, _ = host_profile(host)
        return prof.port
    except Exception:  # noqa: BLE001 - bench works without a launch profile (a server started by hand)
        return 30000


def bench_fn(opts: BenchOptions, on_progress: Callable[[str, str, int, int], None] | None = None):
    """One host's bench; ``on_progress(host, text, step, steps)`` after each of its requests."""
    def fn(host: Host, session, fleet) -> HostResult:
        t0 = time.monotonic()
        rank = host.get("node_rank")
        if host.get("server") and isinstance(rank, int) and rank > 0:  # SGLang serves a group on rank 0 alone
            return HostResult(host.name, "not-applicable", f"rank {rank} of server {host.get('server')}: the ranks "
                              "above 0 serve no requests (only a health route); the group is measured on its rank 0",
                              data={"flags": [], "node_rank": rank})

        def on_event(event: dict) -> None:
            text = progress_text(event, time.monotonic() - t0)
            if text is not None and on_progress is not None:
                on_progress(host.name, text, event["step"], event["steps"])

        port, note = port_for(host, opts), ""
        if not recorded.named(host, None, opts.port):  # nothing names the server: the one recorded here
            got = recorded.port_for(host, session, port, fleet.uses_sudo(host, session))
            if isinstance(got, HostResult):
                return got
            port, note = got
        req: BenchRequest = {"op": "bench", "port": port, "warmup": opts.warmup,
                             "requests": opts.requests, "max_new_tokens": opts.max_new_tokens, "force": opts.force,
                             "read_timeout": opts.read_timeout}
        if opts.secrets.get("args"):
            req["secrets"] = {"args": dict(opts.secrets["args"])}
        answer: BenchAnswer = session.call(
            req, timeout=call_timeout(opts), sudo=fleet.uses_sudo(host, session),
            on_event=on_event if on_progress else None)
        res = result_from_answer(host.name, answer)
        if note:  # (a measured row's notes are its figures' notes, said again after the judge)
            res.notes.append(note)
            if isinstance(res.data.get("notes"), list):
                res.data["notes"].append(note)
        return res

    return fn


def result_from_answer(host: str, answer: BenchAnswer) -> HostResult:
    """One host's row; its figures in data (failed and busy rows keep what was measured before)."""
    fig = bf.host_figures(dict(answer))
    fig["port"] = answer.get("port")
    fig["gpu_unknown"] = (answer.get("gpu") or {}).get("unknown")
    if answer.get("busy_forced"):
        fig["notes"].append("--force: the server was serving other traffic; these figures include it")
    if answer.get("flushed") is False and not answer.get("busy_forced") and answer.get("flush_status"):
        fig["notes"].append(f"{answer.get('flush_path') or '/flush_cache'} answered HTTP {answer['flush_status']}: "
                            "the cache was not flushed")
    version = fig.get("version")
    if not answer.get("ok"):
        err = answer.get("error") or {}
        kind = err.get("kind") or "bench"
        verdict = "busy" if kind == "busy" else "failed"
        done = len(answer.get("requests") or [])
        msg = err.get("message") or "the bench failed"
        if done and verdict == "failed":
            msg += f" (after {done} measured request{'s' if done != 1 else ''})"
        return HostResult(host, verdict, msg, version=version, error_kind=None if verdict == "busy" else kind,
                          data=fig, notes=list(fig["notes"]))
    if not fig["requests"]:
        return HostResult(host, "failed", "no request was measured (--requests 0?)", version=version,
                          error_kind="bench", data=fig)
    return HostResult(host, "measured", "", version=version, data=fig)


def judge(results: list[HostResult], baseline: dict | None, *, min_speedup: float, min_accept_length: float,
          last: dict | None = None, min_ratio: float = bf.DEFAULT_MIN_RATIO) -> None:
    """Speedups, flags and their notes, across this run's measured hosts (in place); a speculative
    host against the baseline file's figure of the same model, tp-size, GPU and algorithm (any
    release); `last` (host -> its last journaled bench: --compare-last): each host against its own
    past too."""
    figs = {r.host: r.data for r in results if r.verdict == "measured"}
    bf.judge(figs, baseline, min_speedup=min_speedup, min_accept_length=min_accept_length)
    if baseline:  # a speculative host against the file's figure of its kind, on any release
        held = {h: b for h, b in ((h, bf.spec_baseline(f, baseline)) for h, f in figs.items()) if b is not None}
        bf.flag_regressions({h: figs[h] for h in held}, held, min_ratio)
    if last is not None:
        bf.flag_regressions(figs, last, min_ratio)
    for r in results:
        if r.verdict == "measured":
            r.notes = list(r.data["notes"])
            r.detail = detail(r.data)
            r.data["journal_fields"] = {"bench": {k: r.data.get(k) for k in JOURNAL_KEYS}}


def detail(f: dict) -> str:
    parts = [f"decode {fmt(f.get('decode_tok_s'))} tok/s (p10 {fmt(f.get('decode_tok_s_p10'))}, "
             f"p90 {fmt(f.get('decode_tok_s_p90'))})", f"ttft {fmt(f.get('ttft_s'), 3)} s"]
    if f.get("spec_on"):
        parts.append(f"accept length {fmt(f.get('accept_length'), 2)}")
        if f.get("accept_rate") is not None:
            parts.append(f"accept rate {fmt(f.get('accept_rate'), 2)}")
    else:
        parts.append("no speculative decoding")
    if f.get("speedup") is not None:
        parts.append(f"speedup {f['speedup']:.2f}x")
    if f.get("flags"):
        parts.append("flags: " + ", ".join(f["flags"]))
    return "; ".join(parts)


def fmt(v, nd: int = 1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def exit_code(results: list[HostResult]) -> int:
    """3 a host failed (or is unknown); else 8 a measured host is flagged; else 0 (busy hosts were
    skipped, not failed)."""
    if not results:
        return EXIT_NOTHING
    if any(r.failed for r in results):
        return EXIT_FAILED
    if any(r.data.get("flags") for r in results if r.verdict == "measured"):
        return EXIT_BENCH_FLAGGED
    return EXIT_OK


def record(r: HostResult) -> dict:
    """The JSON record of a host: the issue's fields first, then the rest of its figures."""
    out: dict = {"host": r.host, "verdict": r.verdict, "detail": r.detail}
    out.update({k: r.data.get(k) for k in RECORD_KEYS})
    out["flags"] = list(r.data.get("flags") or [])
    out["spec"] = dict(r.data.get("speculative") or {})  # the server's speculative_* settings
    out.update({k: v for k, v in r.data.items() if k not in out and k not in ("journal_fields", "speculative")})
    out["notes"] = list(r.notes)
    out["failed"] = r.failed
    out["error_kind"] = r.error_kind
    out["elapsed"] = r.elapsed
    return out


def summary_line(results: list[HostResult]) -> str:
    measured = [r for r in results if r.verdict == "measured"]
    flagged = [r for r in measured if r.data.get("flags")]
    busy = [r for r in results if r.verdict == "busy"]
    failed = [r for r in results if r.failed]
    parts = [f"{len(measured)} measured"]
    if flagged:
        parts.append(f"{len(flagged)} flagged ({', '.join(r.host for r in flagged)})")
    if busy:
        parts.append(f"{len(busy)} busy (skipped)")
    if failed:
        parts.append(f"{len(failed)} failed")
    n = len(results)
    return f"{n} host{'s' if n != 1 else ''}: " + ", ".join(parts)


def host_line(r: HostResult) -> str:
    if r.verdict != "measured":
        return f"{r.host}  {r.verdict}  - {r.detail}"
    return f"{r.host}  measured  {r.data.get('engine') or 'sglang'} {r.data.get('version') or '?'}  {r.detail}"
