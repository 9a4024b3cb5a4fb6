"""The fixed prompts `provision bench` sends, in order (shipped in the bundle).  STDLIB ONLY, data.

Realistic mixes matter: speculative decoding accepts more draft tokens on predictable text (code,
JSON) than on free prose, so a bench of one kind of prompt over- or under-states the gain. One
of each: code, prose, math, a JSON tool call, and one long context (about 3,000 words of an
incident log to summarise). Changing them changes every host's figures: keep them stable, and
say so in the changelog when they change.
"""

from __future__ import annotations

CODE = (
    "Write a Python function `merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]` "
    "that merges overlapping closed intervals and returns them sorted by start. Include type hints, a "
    "docstring with two doctest examples, handle the empty list, and then write five pytest test cases "
    "covering touching intervals, nested intervals, unsorted input, negative numbers and duplicates."
)

PROSE = (
    "Explain to a new site-reliability engineer, in about four paragraphs, why a GPU inference server "
    "can be healthy according to its /health endpoint and still serve requests slowly. Cover queueing, "
    "KV-cache pressure, speculative decoding that rejects most draft tokens, and thermal throttling, and "
    "end with a short checklist of what to look at first."
)

MATH = (
    "A train leaves city A at 08:15 travelling at 84 km/h towards city B, 390 km away. A second train "
    "leaves city B at 09:00 travelling towards city A at 96 km/h. At what time do they meet, and how far "
    "from city A? Solve step by step, showing each equation, then verify the answer by substituting it "
    "back. Finally, generalise: give the meeting time as a formula in the distances, speeds and delays."
)

TOOL_CALL = (
    "You can call these tools. Answer with a single JSON object only, no prose.\n"
    '[{"name": "get_weather", "description": "Current weather for a city", "parameters": {"type": "object", '
    '"properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, '
    '"required": ["city"]}}, {"name": "search_flights", "description": "Flights between two airports on a date", '
    '"parameters": {"type": "object", "properties": {"from": {"type": "string"}, "to": {"type": "string"}, '
    '"date": {"type": "string", "format": "date"}, "max_stops": {"type": "integer"}}, "required": ["from", "to", '
    '"date"]}}]\n'
    "User: I fly from Amsterdam to Tokyo on 2026-03-14, at most one stop, and I want to know whether to "
    "pack an umbrella for Tokyo. Call every tool you need, as a JSON list of {\"name\", \"arguments\"} objects, "
    "then a short JSON field \"reply\" for the user."
)

_SERVICES = ("api-gateway", "tokenizer", "scheduler", "kv-cache", "detokenizer", "metrics-exporter",
             "load-balancer", "model-loader")
_EVENTS = ("latency p99 rose from 180 ms to 2.4 s", "error rate reached 3.1 % on /generate",
           "GPU 3 reported an Xid 79 and fell off the bus", "the node was drained for maintenance",
           "a config push raised max_running_requests from 48 to 128", "health checks flapped for 90 s",
           "the on-call engineer rolled back the last deployment", "throughput recovered to 96 tok/s per stream")


def _long_context() -> str:
    lines = ["Below is the incident log of an inference cluster over one night. Read it all, then write a "
             "summary for the post-mortem: a timeline of the five most important events, the probable root "
             "cause, what made detection slow, and three concrete follow-up actions with owners.", ""]
    for i in range(96):
        svc = _SERVICES[(i * 5) % len(_SERVICES)]
        ev = _EVENTS[(i * 3) % len(_EVENTS)]
        hh, mm = 22 + (i * 7) // 60, (i * 7) % 60
        lines.append(f"[{hh % 24:02d}:{mm:02d}] host gpu{(i * 11) % 32:02d} {svc}: {ev}; ticket OPS-{4100 + i} "
                     f"updated by {'alice' if i % 3 == 0 else 'bob' if i % 3 == 1 else 'carol'}, "
                     f"dashboards show {40 + (i * 13) % 60} % GPU utilisation and {(i * 17) % 9} queued requests.")
    return "\n".join(lines)


LONG_CONTEXT = _long_context()

# (name, text), applied in this order, cycling when --requests is larger
PROMPTS = [("code", CODE), ("prose", PROSE), ("math", MATH), ("tool-call", TOOL_CALL), ("long-context", LONG_CONTEXT)]
