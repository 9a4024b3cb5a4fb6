"""The arithmetic of `provision bench`: requests in, a host's figures and flags out.  Pure.

The host side (host/ops/bench.py) times each streamed ``/generate`` and hands back, per request,
``ttft_s``, ``decode_s`` (first to last token, client side, on the host), ``completion_tokens``
and the final chunk's ``meta_info`` spec fields. Everything computed from those lives here, so
the table, ``--json``, the journal, the Prometheus text and the exit code agree.

* decode tok/s of one request = (completion_tokens - 1) / (t_last - t_first);
* a host's decode figure is the median over its requests, with p10 and p90 (linear
  interpolation between the closest ranks, as numpy's default);
* accept length = sum(completion_tokens) / sum(spec_verify_ct): the two fields whose names are
  the same in every release (a per-request ``spec_accept_length`` averaged would weigh a short
  answer like a long one);
* accept rate = sum(accepted drafts) / sum(proposed drafts), from 0.5.9's
  ``spec_accept_token_num``/``spec_draft_token_num`` or 0.5.23's
  ``spec_num_correct_drafts``/``spec_num_proposed_drafts``; None where the release gives neither;
* an engine that reports speculative decoding on /metrics (vLLM) instead: the counters' growth
  over the measured requests (output/metricsdelta.py), accept length = 1 + accepted / drafts,
  accept rate = accepted / draft tokens;
* a baseline entry is keyed by what makes two servers comparable: model path, tp-size, engine
  version and GPU name (SGLang's version alone, as baseline files have always had it; another
  engine's named: `vllm 0.32.0`).
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable

from provision.errors import ConfigError
from provision.host.inference import DEFAULT as DEFAULT_ENGINE
from provision.output.metricsdelta import deltas

# Draft-count field pairs (accepted, proposed) by release; the first present pair is used.
DRAFT_FIELDS = (("spec_accept_token_num", "spec_draft_token_num"),            # 0.5.9
                ("spec_num_correct_drafts", "spec_num_proposed_drafts"))      # 0.5.23
FLAGS = ("no-spec", "net-negative", "underperforming", "outlier")
DEFAULT_MIN_SPEEDUP = 1.3
DEFAULT_MIN_ACCEPT_LENGTH = 1.8   # at steps 3, topk 1, 4 draft tokens
OUTLIER_FRACTION = 0.85
BASELINE_FORMAT = "provision-bench-baseline/1"


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks; None if empty."""
    xs = sorted(float(v) for v in values)
    if not xs:
        return None
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * min(max(q, 0.0), 100.0) / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Iterable[float]) -> float | None:
    return percentile(values, 50)


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


# A stream whose chunks all arrived within this (a burst: buffered by a loaded machine or a proxy, read
# at once) has no decode interval to time: CI once measured 172,349 tok/s that way, and a speed gate fed
# such a figure would pass anything.
BURST_S = 0.002


def decode_rate(req: dict) -> float | None:
    """(completion_tokens - first) / decode_s: the tokens after the first chunk over the time from
    the first chunk to the last (first = the first chunk's tokens, 1 unless a chunk carried several);
    None when there is no interval to time (one chunk, or a burst: under BURST_S)."""
    toks, secs = _num(req.get("completion_tokens")), _num(req.get("decode_s"))
    first = _num(req.get("first_chunk_tokens")) or 1.0
    if toks is None or secs is None or toks - first < 1 or secs < BURST_S:
        return None
    return (toks - first) / secs


def accept_length(reqs: list[dict]) -> float | None:
    """sum(completion_tokens) / sum(spec_verify_ct) over the requests that carry spec_verify_ct > 0."""
    toks = verify = 0.0
    for r in reqs:
        v, t = _num(r.get("spec_verify_ct")), _num(r.get("completion_tokens"))
        if v and v > 0 and t is not None:
            toks += t
            verify += v
    return toks / verify if verify > 0 else None


def accept_rate(reqs: list[dict]) -> float | None:
    """sum(accepted) / sum(proposed) from whichever release's field names the answers carry."""
    acc = prop = 0.0
    for r in reqs:
        for a_name, p_name in DRAFT_FIELDS:
            a, p = _num(r.get(a_name)), _num(r.get(p_name))
            if a is not None and p is not None:
                acc += a
                prop += p
                break
    return acc / prop if prop > 0 else None


def spec_settings(server_info: dict) -> dict:
    """The server's `speculative_*` settings that are set (None and False dropped); {} when it runs
    no speculative algorithm (the server args list every speculative_* default even then)."""
    info = server_info or {}
    if not info.get("speculative_algorithm"):
        return {}
    return {k: v for k, v in sorted(info.items())
            if k.startswith("speculative_") and v is not None and v is not False}


def spec_settings_of_args(spec_args: dict | None) -> dict:
    """The speculative settings a launch's args give, in /server_info's names, for an engine whose
    server does not say them (vLLM's one `speculative-config` mapping, or its JSON text); {} for none."""
    conf = (spec_args or {}).get("speculative-config")
    if isinstance(conf, str):
        try:
            conf = json.loads(conf)
        except ValueError:
            return {}
    if not isinstance(conf, dict) or not conf.get("method"):
        return {}
    out = {"speculative_algorithm": str(conf["method"]).upper()}
    if conf.get("model"):
        out["speculative_draft_model_path"] = conf["model"]
    if conf.get("num_speculative_tokens") is not None:
        out["speculative_num_draft_tokens"] = conf["num_speculative_tokens"]
    return out


def metric_figures(answer: dict) -> dict | None:
    """(accept_length, accept_rate, drafts, requests) from the engine's counters around the measured
    requests; None when the answer has no such reading (an engine that reports per request)."""
    roles = answer.get("metrics_roles") or {}
    if not roles or "metrics_before" not in answer:
        return None
    d = deltas(answer.get("metrics_before"), answer.get("metrics_after"))
    if d is None:
        return {"accept_length": None, "accept_rate": None, "drafts": None, "requests": None}
    drafts, tokens = d.get(roles.get("drafts", ""), 0.0), d.get(roles.get("draft_tokens", ""), 0.0)
    acc = d.get(roles.get("accepted", ""), 0.0)
    return {"accept_length": 1 + acc / drafts if drafts > 0 else None,
            "accept_rate": acc / tokens if tokens > 0 else None, "drafts": drafts,
            "requests": d.get(roles.get("requests", ""))}


def spec_on(settings: dict) -> bool:
    return bool(settings.get("speculative_algorithm"))


def server_accept_length(server_info: dict) -> float | None:
    """/server_info's internal_states[0].avg_spec_accept_length (lags by up to 40 decode steps)."""
    states = (server_info or {}).get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        return _num(states[0].get("avg_spec_accept_length"))
    return None


def bench_key(model_path: Any, tp_size: Any, version: Any, gpu: Any, engine: str = DEFAULT_ENGINE) -> str:
    """What makes two servers comparable, as one string: model|tp|version|gpu (SGLang's version as
    baseline files have it; another engine's prefixed with its name: `vllm 0.32.0`)."""
    ver = str(version or "unknown") if engine == DEFAULT_ENGINE else f"{engine} {version or 'unknown'}"
    return "|".join([str(model_path or "unknown"), f"tp{tp_size or 1}", ver, str(gpu or "unknown")])


def host_figures(answer: dict) -> dict:
    """A host's bench answer -> its figures (no speedup, no flags yet: those need the others).
    `speculative` holds the server's speculative_* settings (`spec` in a result's data is the
    patch spec's name everywhere else; the JSON record calls the settings `spec`)."""
    info = answer.get("server_info") or {}
    model = answer.get("model_info") or {}
    rec = answer.get("record") or {}
    reqs = [r for r in answer.get("requests") or [] if isinstance(r, dict) and r.get("ok")]
    rates = [x for x in (decode_rate(r) for r in reqs) if x is not None]
    ttfts = [x for x in (_num(r.get("ttft_s")) for r in reqs) if x is not None]
    settings = spec_settings(info) or spec_settings_of_args(rec.get("spec_args"))
    version = info.get("version") or answer.get("version") or rec.get("version")
    tp = info.get("tp_size") or info.get("tensor_parallel_size") or rec.get("tp") or 1
    gpu = (answer.get("gpu") or {}).get("name") or "unknown"
    model_path = model.get("model_path") or info.get("model_path") or rec.get("model")
    engine = rec.get("engine") or DEFAULT_ENGINE
    counted = metric_figures(answer)
    al, ar = (accept_length(reqs), accept_rate(reqs)) if counted is None else \
        (counted["accept_length"], counted["accept_rate"])
    fig = {"decode_tok_s": _round(median(rates)), "decode_tok_s_p10": _round(percentile(rates, 10)),
           "decode_tok_s_p90": _round(percentile(rates, 90)), "ttft_s": _round(median(ttfts), 4),
           "accept_length": _round(al, 3), "accept_rate": _round(ar, 3),
           "server_accept_length": _round(server_accept_length(answer.get("server_info_after") or {}), 3),
           "requests": len(reqs), "completion_tokens": int(sum(_num(r.get("completion_tokens")) or 0 for r in reqs)),
           "version": version, "engine": engine, "speculative": settings, "spec_on": spec_on(settings),
           "model_path": model_path, "tp_size": tp, "gpu": gpu, "key": bench_key(model_path, tp, version, gpu, engine),
           "speedup": None, "baseline_decode_tok_s": None, "flags": [], "notes": []}
    if reqs and not rates:  # said, never a made-up figure: each stream arrived at once (BURST_S)
        fig["notes"].append("no request's stream could be timed (each arrived at once: buffered by a loaded "
                            "machine or a proxy): no decode figure; bench again when the host is quieter")
    if counted is not None:
        fig["spec_drafts"] = counted["drafts"]
        if counted["drafts"] is None:
            fig["notes"].append("the server's /metrics could not be read before and after the requests: "
                                "no accept length")
        elif fig["spec_on"] and reqs and counted["drafts"] == 0:
            fig["flags"].append("no-spec")
            fig["notes"].append(f"the server runs {settings.get('speculative_algorithm')} but its /metrics counted "
                                "no drafts during the requests: speculative decoding never ran")
        if counted["requests"] is not None and counted["requests"] > len(reqs):
            fig["notes"].append(f"the server finished {counted['requests']:g} requests while {len(reqs)} were "
                                "measured: other traffic is in the figures")
    elif fig["spec_on"] and reqs and not any((_num(r.get("spec_verify_ct")) or 0) > 0 for r in reqs):
        fig["flags"].append("no-spec")
        fig["notes"].append(f"the server runs {settings.get('speculative_algorithm')} but its answers carry no "
                            "spec_verify_ct: speculative decoding never ran (or this release does not report it)")
    if fig["spec_on"] and fig["accept_length"] is not None and fig["server_accept_length"] is not None:
        a, s = fig["accept_length"], fig["server_accept_length"]
        if s > 0 and abs(a - s) / s > 0.15:
            fig["notes"].append(f"/server_info's avg_spec_accept_length {s:g} differs from the measured {a:g} "
                                "(it lags by up to 40 decode steps; other traffic counts too)")
    return fig


def _round(v: float | None, nd: int = 2) -> float | None:
    return None if v is None else round(v, nd)


def apply_baseline(fig: dict, baseline: dict | None) -> None:
    """Set speedup against the baseline entry with the same key (speculative hosts only)."""
    if baseline is None or not fig.get("spec_on") or fig.get("decode_tok_s") is None:
        return
    entry = baseline.get(fig["key"])
    if entry is None:
        fig["notes"].append(f"no baseline entry for {fig['key']}: no speedup (a baseline is a server of the same "
                            "model, tp-size, engine version and GPU launched without speculative decoding)")
        return
    base = _num(entry.get("decode_tok_s"))
    if not base or base <= 0:
        fig["notes"].append(f"the baseline entry for {fig['key']} has no decode figure: no speedup")
        return
    fig["baseline_decode_tok_s"] = base
    fig["speedup"] = round(fig["decode_tok_s"] / base, 3)


def flag(fig: dict, *, min_speedup: float = DEFAULT_MIN_SPEEDUP,
         min_accept_length: float = DEFAULT_MIN_ACCEPT_LENGTH) -> None:
    """Add net-negative / underperforming to a speculative host's flags (no-spec is set by host_figures)."""
    if not fig.get("spec_on"):
        return
    sp, al = fig.get("speedup"), fig.get("accept_length")
    if sp is not None and sp < 1.0:
        fig["flags"].append("net-negative")
        fig["notes"].append(f"speculative decoding makes it slower: {sp:.2f}x the baseline's "
                            f"{fig['baseline_decode_tok_s']:.1f} tok/s")
    why = []
    if sp is not None and sp < min_speedup:
        why.append(f"speedup {sp:.2f}x < {min_speedup:g}")
    if al is not None and al < min_accept_length:
        why.append(f"accept length {al:.2f} < {min_accept_length:g}")
    if why:
        fig["flags"].append("underperforming")
        fig["notes"].append("underperforming: " + ", ".join(why))


def flag_outliers(figs: dict[str, dict], fraction: float = OUTLIER_FRACTION) -> None:
    """Flag `outlier` on hosts below fraction x the median decode of this run's hosts with their key
    and the same speculative setting (on or off), where there are at least two such hosts."""
    by_key: dict[tuple, list[str]] = {}
    for host, f in figs.items():
        if f.get("decode_tok_s") is not None:  # a baseline is not compared with speculative hosts
            by_key.setdefault((f["key"], bool(f.get("spec_on"))), []).append(host)
    for key, hosts in by_key.items():
        if len(hosts) < 2:
            continue
        med = round(median(figs[h]["decode_tok_s"] for h in hosts) or 0.0, 1)
        for h in hosts:
            if figs[h]["decode_tok_s"] < fraction * med:
                figs[h]["flags"].append("outlier")
                figs[h]["notes"].append(f"outlier: {figs[h]['decode_tok_s']:.1f} tok/s < {fraction:g} x the median "
                                        f"{med:.1f} tok/s of the {len(hosts)} hosts with its key")


def judge(figs: dict[str, dict], baseline: dict | None, *, min_speedup: float = DEFAULT_MIN_SPEEDUP,
          min_accept_length: float = DEFAULT_MIN_ACCEPT_LENGTH) -> dict[str, dict]:
    """Speedups, then every flag, for this run's hosts (in place; returned for convenience)."""
    for f in figs.values():
        apply_baseline(f, baseline)
        flag(f, min_speedup=min_speedup, min_accept_length=min_accept_length)
    flag_outliers(figs)
    return figs


# --------------------------------------------------------------------------- the baseline file

def spec_key(fig: dict) -> str:
    """A speculative server's baseline key: its bench key and its algorithm (`...|EAGLE3`). Pure."""
    algo = (fig.get("speculative") or {}).get("speculative_algorithm") or "spec"
    return f"{fig.get('key')}|{algo}"


def baseline_entries(figs: dict[str, dict], saved_at: str = "") -> tuple[dict, list[str]]:
    """(entries, notes) from the measured hosts: those without speculative decoding keyed by
    bench_key (the speedup's denominator), those with it by spec_key (the figure a later bench of
    the same model, tp-size, GPU and algorithm is held to, on any release: `--baseline`). Pure."""
    entries: dict[str, dict] = {}
    notes: list[str] = []
    for host, f in sorted(figs.items()):
        if f.get("decode_tok_s") is None:
            continue
        on = bool(f.get("spec_on"))
        e = entries.setdefault(spec_key(f) if on else f["key"], {
            "model_path": f.get("model_path"), "tp_size": f.get("tp_size"), "version": f.get("version"),
            "gpu": f.get("gpu"), "speculative": on, "saved_at": saved_at, "hosts": {}, "accept_lengths": {}})
        e["hosts"][host] = f["decode_tok_s"]
        if on and f.get("accept_length") is not None:
            e["accept_lengths"][host] = f["accept_length"]
    for e in entries.values():
        e["decode_tok_s"] = round(median(e["hosts"].values()) or 0.0, 2)
        lengths = e.pop("accept_lengths")
        if lengths:
            e["accept_length"] = round(median(lengths.values()) or 0.0, 3)
    return entries, notes


def spec_baseline(fig: dict, baseline: dict | None) -> dict | None:
    """The baseline entry a speculative host is held to (pure): of the same model, tp-size, GPU and
    algorithm, on any release; its own release's when the file has one, else the last saved. As
    flag_regressions reads an earlier figure: {decode_tok_s, version, key, time}."""
    if not baseline or not fig.get("spec_on"):
        return None
    mine = spec_key(fig).split("|")
    found = []
    for key, e in baseline.items():
        parts = str(key).split("|")
        if len(parts) == 5 and len(mine) == 5 and parts[0] == mine[0] and parts[1] == mine[1] and \
                parts[3] == mine[3] and parts[4] == mine[4] and _num(e.get("decode_tok_s")):
            found.append((parts[2] == mine[2], str(e.get("saved_at") or ""), key, e))
    if not found:
        return None
    _, when, key, e = max(found, key=lambda t: (t[0], t[1]))
    return {"decode_tok_s": float(e["decode_tok_s"]), "version": e.get("version"), "accept_length": e.get("accept_length"),
            "key": "|".join(str(key).split("|")[:4]), "time": when, "source": "baseline"}


def render_baseline(entries: dict, saved_at: str) -> str:
    return json.dumps({"format": BASELINE_FORMAT, "saved_at": saved_at, "entries": entries}, indent=2,
                      sort_keys=True) + "\n"


def merge_baseline(old: dict, new: dict) -> dict:
    """Entries of a new measurement replace the old ones with the same key; others are kept."""
    out = dict(old)
    out.update(new)
    return out


def parse_baseline(text: str, where: str) -> dict:
    """A baseline file's entries, or ConfigError naming the file and what is wrong."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: not a bench baseline (not JSON: {exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != BASELINE_FORMAT or not isinstance(doc.get("entries"), dict):
        raise ConfigError(f"{where}: not a bench baseline (expected \"format\": \"{BASELINE_FORMAT}\" and "
                          "\"entries\"); write one with `provision bench --save-baseline FILE`")
    for key, e in doc["entries"].items():
        if not isinstance(e, dict) or _num(e.get("decode_tok_s")) is None:
            raise ConfigError(f"{where}: entry {key!r} has no numeric decode_tok_s")
    return dict(doc["entries"])


def exit_flagged(figs: Iterable[dict]) -> bool:
    return any(f.get("flags") for f in figs)


# --------------------------------------------------------------------------- a host against its own past

DEFAULT_MIN_RATIO = 0.9


def _same_server(key_a: str, key_b: str) -> bool:
    """Two bench keys of the same model, tp-size and GPU (the release may differ: that is the point)."""
    a, b = str(key_a).split("|"), str(key_b).split("|")
    return len(a) == len(b) == 4 and a[0] == b[0] and a[1] == b[1] and a[3] == b[3]


def last_figures(records: list[dict]) -> dict[str, dict]:
    """Host -> its last journaled measured bench ({figures..., "time"}), from journal records oldest
    first. Pure."""
    out: dict[str, dict] = {}
    for rec in records:
        fig = rec.get("bench") if rec.get("command") == "bench" and rec.get("verdict") == "measured" else None
        if isinstance(fig, dict) and isinstance(fig.get("decode_tok_s"), (int, float)) and fig["decode_tok_s"] > 0:
            out[str(rec.get("host"))] = {**fig, "time": rec.get("time")}
    return out


def flag_regressions(figs: dict[str, dict], last: dict[str, dict], min_ratio: float = DEFAULT_MIN_RATIO) -> None:
    """`bench --compare-last`: each host's decode against its own last bench of the same model,
    tp-size, GPU and speculative setting, whatever the release (`--baseline FILE`: against the
    file's speculative entry, `spec_baseline`, given in `last` with "source": "baseline"): below
    `min_ratio` it is flagged `regressed` (a canary on a new release slower than it was; the outlier
    rule compares only hosts of one release). In place. Pure."""
    for host, f in figs.items():
        before = last.get(host)
        now = f.get("decode_tok_s")
        if before is None or now is None:
            if now is not None:
                f["notes"].append("no earlier bench of this host in the journal: nothing to compare with")
            continue
        if before.get("source") == "baseline":
            _held_to(f, now, before, min_ratio, "vs_baseline", "the baseline's {tok} tok/s on {ver} (saved {when})")
            continue
        if not _same_server(f.get("key") or "", before.get("key") or "") or \
                bool(f.get("spec_on")) != (before.get("accept_length") is not None):
            f["notes"].append(f"its last bench ({before.get('key')}) was of another model, tp-size, GPU or "
                              "speculative setting: not compared")
            continue
        _held_to(f, now, before, min_ratio, "vs_last", "its last bench ({tok} tok/s on {ver}, {when})")


def _held_to(f: dict, now: float, before: dict, min_ratio: float, field: str, words: str) -> None:
    """A host's decode against an earlier figure (`before`): the ratio in `field`, the note (`words`
    names the earlier figure), and `regressed` below `min_ratio`. In place. Pure."""
    ratio = now / before["decode_tok_s"]
    f[field] = round(ratio, 3)
    earlier = words.format(tok=f"{before['decode_tok_s']:.1f}", ver=before.get("version") or "?",
                           when=str(before.get("time") or "?")[:16].replace("T", " "))
    said = f"{now:.1f} tok/s on {f.get('version') or '?'} is {ratio:.2f}x {earlier}"
    if ratio < min_ratio:
        f["flags"].append("regressed")
        f["notes"].append(f"regressed: {said} < {min_ratio:g}")
    else:
        f["notes"].append(said)
