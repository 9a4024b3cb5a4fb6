"""issue 64: the SGLang reader held to the kinds the vLLM reader missed, where SGLang prints them: an
exception's line alone (its traceback's header above the tail read, or the log behind a collector
that cut it), and a traceback whose header is above the tail (its frames first)."""

from __future__ import annotations

import pytest

from provision.logs.loadlog import LoadLog

TS = "[2026-02-03 10:11:12"
LOADING = f"{TS} TP0] Load weight begin. avail mem=78.00 GB\n"


def read(text: str, chunk: int | None):
    log = LoadLog()
    pieces = [text] if chunk is None else [text[i:i + chunk] for i in range(0, len(text), chunk)]
    for piece in pieces:
        log.feed(piece)
    log.flush()
    return log.state


@pytest.mark.parametrize("chunk", [None, 1, 17])
@pytest.mark.parametrize("tail,summary", [
    ("ValueError: Unsupported architectures: ['FooForCausalLM']\n",
     "ValueError: Unsupported architectures: ['FooForCausalLM']"),
    ('  File "/usr/lib/python3/sglang/srt/managers/scheduler.py", line 2400, in run_scheduler_process\n'
     "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank)\n"
     "                ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
     "RuntimeError: CUDA error: no kernel image is available for execution on the device\n",
     "RuntimeError: CUDA error: no kernel image is available for execution on the device"),
])
def test_a_tail_that_starts_below_the_traceback_header_is_still_the_crash(tail, summary, chunk):
    st = read(LOADING + tail, chunk)
    assert st.crashed is not None and st.crashed.summary == summary, st.crashed
    assert not st.ready


def test_a_warning_line_alone_is_no_crash():
    st = read(LOADING + "FutureWarning: `torch_dtype` is deprecated! Use `dtype` instead!\n", None)
    assert st.crashed is None
