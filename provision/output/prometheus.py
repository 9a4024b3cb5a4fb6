"""The fleet's state as Prometheus text exposition format (version 0.0.4).  Pure.

`status --format prometheus` and `bench --format prometheus` print it; `--metrics-file PATH`
writes it atomically (write_atomic: a temp file in the same directory, fsync, rename) for
node_exporter's textfile collector, which must never read half a file.

    status:  provision_spec_state{host,spec,state}      1 for the row's verdict, 0 for the others
             provision_server_up{host,port}             1 when the server answers /health with 200
             provision_restart_needed{host}             1 when a running server predates its file
             provision_sglang_info{host,version,install} 1   (hosts whose engine is SGLang)
             provision_engine_info{host,engine,version,install} 1
    bench:   provision_bench_decode_tokens_per_second{host,stat="median|p10|p90"}
             provision_bench_ttft_seconds{host}
             provision_bench_accept_length{host}
             provision_bench_accept_rate{host}
             provision_bench_speedup{host}
             provision_bench_flag{host,flag}            1 when flagged, 0 otherwise
             provision_bench_measured{host}             1 measured, 0 failed or skipped (busy)

A figure that is unknown (no baseline: no speedup) has no sample, never a made-up 0.
"""

from __future__ import annotations

import os
import re
from typing import Iterable

from provision.host.inference import DEFAULT as DEFAULT_ENGINE
from provision.output.results import HostResult

SPEC_STATES = ("patched", "native", "overlay", "missing", "stale", "hand-patch", "not-applicable", "error",
               "unreachable")
BENCH_FLAGS = ("no-spec", "net-negative", "underperforming", "outlier")


def escape(value: object) -> str:
    """A label value as the exposition format wants it: backslash, double quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _labels(labels: dict) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in labels.items()) + "}"


def _num(v: float) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


class Family:
    def __init__(self, name: str, kind: str, help_: str):
        self.name, self.kind, self.help = name, kind, help_
        self.samples: list[tuple[dict, float]] = []

    def add(self, labels: dict, value: float | None) -> None:
        if value is not None:
            self.samples.append((labels, value))

    def render(self) -> str:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        out += [f"{self.name}{_labels(lb)} {_num(v)}" for lb, v in self.samples]
        return "\n".join(out) + "\n"


def render(families: Iterable[Family]) -> str:
    return "".join(f.render() for f in families)


def state_of(r: HostResult) -> str:
    """The status row's state label: its verdict, or `unreachable` for a host that failed."""
    if r.verdict in SPEC_STATES:
        return r.verdict
    return "unreachable" if r.failed else r.verdict


_PORT = re.compile(r"\bport (\d+)\b")


def status_metrics(results: list[HostResult]) -> str:
    spec = Family("provision_spec_state", "gauge",
                  "1 for the patch state provision status found for this host and spec, 0 for the others.")
    up = Family("provision_server_up", "gauge", "1 when the host's inference server answers /health with 200.")
    restart = Family("provision_restart_needed", "gauge",
                     "1 when a running server started before its model file last changed.")
    info = Family("provision_sglang_info", "gauge", "The SGLang version and install status found on the host.")
    engine_info = Family("provision_engine_info", "gauge",
                         "The inference engine of the host's profile, its version and install found on the host.")
    seen_host: set[str] = set()
    for r in results:
        state = state_of(r)
        states = SPEC_STATES if state in SPEC_STATES else SPEC_STATES + (state,)
        for s in states:
            spec.add({"host": r.host, "spec": r.data.get("spec") or "", "state": s}, 1 if s == state else 0)
        if r.host in seen_host:
            continue
        seen_host.add(r.host)
        rows = [x for x in results if x.host == r.host]
        if any(state_of(x) != "unreachable" for x in rows):  # an unreachable host has no figure, never a 0
            restart.add({"host": r.host}, 1 if any(x.data.get("restart_needed") for x in rows) else 0)
        # the server is the host's, not a spec's: from the first row that read it (a spec's error row
        # before it says nothing of the server)
        srv = next((x for x in rows if x.data.get("server_state") is not None or x.data.get("server")), None)
        if srv is not None:
            server = str(srv.data.get("server_state") or "")
            port = srv.data.get("server_port")
            if port is None:
                m = _PORT.search(str(srv.data.get("server") or ""))
                port = m.group(1) if m else ""
            up.add({"host": r.host, "port": port}, 1 if server.startswith("up") else 0)
        elif not r.failed:
            up.add({"host": r.host, "port": ""}, 0)
        if r.version or r.install:
            engine = str(r.data.get("engine") or DEFAULT_ENGINE)
            if engine == DEFAULT_ENGINE:
                info.add({"host": r.host, "version": r.version or "", "install": r.install or ""}, 1)
            engine_info.add({"host": r.host, "engine": engine, "version": r.version or "",
                             "install": r.install or ""}, 1)
    return render([spec, up, restart, info, engine_info])


def bench_metrics(results: list[HostResult]) -> str:
    dec = Family("provision_bench_decode_tokens_per_second", "gauge",
                 "Single-stream decode speed measured by provision bench (client side, on the host).")
    ttft = Family("provision_bench_ttft_seconds", "gauge", "Median time to first token measured by provision bench.")
    al = Family("provision_bench_accept_length", "gauge",
                "Speculative accept length, tokens per verify step over the bench requests (SGLang: "
                "sum(completion_tokens) / sum(spec_verify_ct); vLLM: 1 + accepted / drafts from /metrics).")
    ar = Family("provision_bench_accept_rate", "gauge", "Accepted / proposed draft tokens over the bench requests.")
    sp = Family("provision_bench_speedup", "gauge", "Median decode speed against the baseline entry with the "
                                                    "host's model, tp-size, engine and its version, and GPU.")
    fl = Family("provision_bench_flag", "gauge", "1 when provision bench flagged the host so, 0 otherwise.")
    ok = Family("provision_bench_measured", "gauge", "1 when provision bench measured the host, 0 when it "
                                                     "failed or skipped it.")
    for r in results:
        d = r.data
        ok.add({"host": r.host}, 1 if r.verdict == "measured" else 0)
        if r.verdict != "measured":
            continue
        for stat, key in (("median", "decode_tok_s"), ("p10", "decode_tok_s_p10"), ("p90", "decode_tok_s_p90")):
            dec.add({"host": r.host, "stat": stat}, d.get(key))
        ttft.add({"host": r.host}, d.get("ttft_s"))
        al.add({"host": r.host}, d.get("accept_length"))
        ar.add({"host": r.host}, d.get("accept_rate"))
        sp.add({"host": r.host}, d.get("speedup"))
        flags = d.get("flags") or []
        for f in BENCH_FLAGS:
            fl.add({"host": r.host, "flag": f}, 1 if f in flags else 0)
    return render([dec, ttft, al, ar, sp, fl, ok])


def write_atomic(path: str, text: str) -> None:
    """Write text to path so a reader sees the old file or the new one, never a part (a hidden
    same-directory temp file ending in .tmp, which node_exporter ignores; fsync; rename). Mode
    0644: metrics hold no secret, and the collector may run as another user. Raises OSError."""
    from provision.host.lib import atomic  # the one atomic writer (stdlib, both sides)

    atomic.write_text(os.path.abspath(path), text, 0o644)
