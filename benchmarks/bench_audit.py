"""Time ``provision.host.engine.audit.audit_models`` on the real SGLang 0.5.9 models dir.

    python3 benchmarks/bench_audit.py [--runs 5] [--version 0.5.9]

Prints every run and the median. Target: median < 2 s (one remote command audits
the whole ``models/`` directory, so it should stay interactive).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from provision.host.engine.audit import audit_models  # noqa: E402
from provision.sandbox.wheels import extracted  # noqa: E402

TARGET_S = 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--version", default="0.5.9")
    args = parser.parse_args()

    models = extracted(args.version) / "sglang" / "srt" / "models"
    times = []
    result = None
    for i in range(args.runs):
        start = time.perf_counter()
        result = audit_models(str(models))
        times.append(time.perf_counter() - start)
        print(f"run {i + 1}: {times[-1]:.3f} s")
    median = statistics.median(times)
    verdicts: dict = {}
    for w in result["wrappers"]:
        verdicts[w["verdict"]] = verdicts.get(w["verdict"], 0) + 1
    print(
        f"audit_models(sglang {args.version}, {result['files_scanned']} files): "
        f"median {median:.3f} s over {args.runs} runs (target < {TARGET_S:.0f} s: "
        f"{'ok' if median < TARGET_S else 'SLOW'}); gaps {verdicts}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
