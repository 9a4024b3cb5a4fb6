"""Log lines as real SGLang servers print them: the parser on them, and the stand-in printing them.

The formats come from the releases' own code (0.5.9's wheel: ``srt/utils/common.py``
``set_uvicorn_logging_configs``, ``entrypoints/engine.py`` ``_wait_for_scheduler_ready``,
``models/registry.py``) and, for 0.5.23, from its ``entrypoints/engine.py`` and
``model_runner_components/attention_backend_setup.py`` as quoted in real users' logs.
"""

from __future__ import annotations

import re
import signal

from provision.logs.loadlog import LoadLog, hint, parse
from provision.sandbox import standin_log
from tests.engine.test_standin import EAGLE3_FLAGS, base_flags, free_port, port_open, running, trees  # noqa: F401

TS = "[2026-01-05 10:27:27]"
UVICORN = f"{TS} INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)"
SHIPPED = {"KimiK25ForConditionalGeneration", "KimiVLForConditionalGeneration"}


def _load_to_graphs() -> str:
    return (f"{TS} Load weight begin. avail mem=78.50 GB\n"
            f"{TS} Load weight end. elapsed=3.00 s, type=KimiK25ForConditionalGeneration, dtype=torch.bfloat16, "
            "avail mem=14.23 GB, mem usage=64.27 GB.\n"
            f"{TS} KV Cache is allocated. #tokens: 421376, KV size: 10.12 GB\n"
            f"{TS} Capture cuda graph begin. This can take up to several minutes. avail mem=3.71 GB\n"
            f"{TS} Capture cuda graph end. Time elapsed: 1.10 s. mem usage=0.86 GB. avail mem=2.85 GB.\n")


# --------------------------------------------------------------------------- the parser (pure)

def test_prefixed_uvicorn_line_shows_the_warmup_phase():
    log = LoadLog()
    events = log.feed(_load_to_graphs() + f"{TS} INFO:     Started server process [4242]\n" + UVICORN + "\n")
    st = log.state
    assert st.uvicorn_up and st.url == "http://127.0.0.1:30000" and st.phase == "warmup"
    assert [e.phase for e in events if e.kind == "phase"][-1] == "warmup"
    events = log.feed(f"{TS} The server is fired up and ready to roll!\n")
    assert log.state.phase == "ready"
    # the bare form (other uvicorn configurations) still counts
    assert parse("INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)\n").uvicorn_up


def test_prefixed_uvicorn_bind_error_is_a_crash():
    st = parse(f"{TS} ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): "
               "address already in use\n")
    assert st.crashed is not None and "could not bind" in st.crashed.summary


def test_rank_death_059_is_a_child_failure_with_the_oom_killer_hint():
    st = parse(_load_to_graphs()
               + f"{TS} Rank 0 scheduler is dead. Please check if there are relevant logs.\n"
               + f"{TS} Exit code: -9\n"
               + "Traceback (most recent call last):\n  File \"/x/engine.py\", line 893, in _wait\n"
               + "    data = scheduler_pipe_readers[i].recv()\nEOFError\n")
    c = st.crashed
    assert c is not None and c.kind == "child-failed" and c.exit_code == -9 and c.oom_killer
    assert "rank 0 scheduler died" in c.summary
    h = hint(c, "gpu01")
    assert "OOM killer" in h and "dmesg" in h and "gpu01" in h


def test_rank_death_059_other_exit_code_has_no_oom_hint():
    st = parse(f"{TS} Rank 3 scheduler is dead. Please check if there are relevant logs.\n{TS} Exit code: 1\n")
    assert st.crashed.kind == "child-failed" and st.crashed.exit_code == 1 and not st.crashed.oom_killer
    assert "OOM" not in hint(st.crashed)


def test_rank_death_0523_runtime_error():
    text = ("Traceback (most recent call last):\n"
            "  File \"/usr/local/lib/python3.11/site-packages/sglang/srt/entrypoints/engine.py\", line 1, in x\n"
            "    raise RuntimeError(\n"
            "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 "
            "(SIGKILL), a common cause is the OS OOM killer. "
            "Run `dmesg -T | grep -i oom` to check.\n")
    c = parse(_load_to_graphs() + text).crashed
    assert c.kind == "child-failed" and c.exit_code == -9 and c.oom_killer
    assert c.summary == "rank 0 scheduler died during initialization (exit code -9)"
    assert "OOM killer" in hint(c)
    c3 = parse(text.replace("(exit code: -9)", "(exit code: -3)")).crashed
    assert c3.kind == "child-failed" and c3.exit_code == -3
    assert c3.oom_killer  # the message itself names the OOM killer: say so, the user decides


def test_rank_death_does_not_hide_the_schedulers_own_traceback():
    text = (_load_to_graphs()
            + f"{TS} Scheduler hit an exception: Traceback (most recent call last):\n"
            + "  File \"/x/model_runner.py\", line 1, in init\n    self.model.set_eagle3_layers_to_capture(ids)\n"
            + "AttributeError: 'KimiK25ForConditionalGeneration' object has no attribute "
              "'set_eagle3_layers_to_capture'\n"
            + "Traceback (most recent call last):\n  File \"/x/engine.py\", line 1, in w\n    raise\n"
            + "RuntimeError: Rank 0 scheduler died during initialization (exit code: -3). If exit code is -9 "
              "(SIGKILL), a common cause is the OS OOM killer.\n")
    assert parse(text).crashed.kind == "missing-eagle3-method"


def test_import_error_both_forms():
    colon = "Ignore import error when loading sglang.srt.models.kimi_k25: unexpected indent (kimi_k25.py, line 775)"
    stop = "Ignore import error when loading sglang.srt.models.kimi_k25. unexpected indent (kimi_k25.py, line 775)"
    for line in (colon, stop):
        st = parse(f"{TS} {line}\n"
                   "Traceback (most recent call last):\n  File \"/x/registry.py\", line 1, in r\n    raise\n"
                   "ValueError: Model architectures ['KimiK25ForConditionalGeneration'] are not supported for now.\n")
        assert st.import_errors == (line,), line
        assert st.crashed.kind == "architecture-not-supported"
        assert "kimi_k25" in st.crashed.summary and st.crashed.lines[0] == line


def test_valueerror_missing_method_0523():
    tb = ("{ts} Scheduler hit an exception: Traceback (most recent call last):\n"
          "  File \"/x/attention_backend_setup.py\", line 1, in configure\n    raise ValueError(\n"
          "ValueError: Model {cls} does not implement set_eagle3_layers_to_capture, which EAGLE3 aux hidden-state "
          "capture requires.\n")
    c = parse(tb.format(ts=TS, cls="KimiK25ForConditionalGeneration")).crashed
    assert c.kind == "missing-eagle3-method" and c.method == "set_eagle3_layers_to_capture"
    assert c.class_name == "KimiK25ForConditionalGeneration"
    assert "provision patch --host g1" in hint(c, "g1", shipped=SHIPPED)
    c2 = parse(tb.format(ts=TS, cls="InternVLChatModel")).crashed
    h = hint(c2, "g1", shipped=SHIPPED)
    assert c2.kind == "missing-eagle3-method"
    assert "no shipped spec covers InternVLChatModel" in h
    assert "provision audit --host g1" in h and "provision spec new InternVLChatModel --host g1" in h


def test_tail_keeps_what_the_parser_does_not_recognise():
    log = LoadLog(secrets=["S3CRET"])
    log.feed(f"{TS} server_args=ServerArgs(api_key='S3CRET', tp_size=8)\n")
    for i in range(1, 5):
        log.feed(f"\rLoading safetensors checkpoint shards:  {i * 25}% Completed | {i}/4 [00:0{i}<00:00,  1.0s/it]")
    log.feed("\nKilled\n")
    log.flush()
    tail = log.tail(30)
    assert log.state.crashed is None
    assert tail[-1] == "Killed"
    assert sum("Loading safetensors" in x for x in tail) == 1 and "4/4" in tail[-2]
    assert not any("S3CRET" in x for x in tail)


# --------------------------------------------------------------------------- the stand-in prints them

def test_standin_uvicorn_lines_have_the_date_prefix(trees, running):  # noqa: F811
    port = free_port()
    s = running(trees("patched"), base_flags(port, tp=2) + EAGLE3_FLAGS)
    access = re.compile(r'^\[[\d: -]+\] INFO:     127\.0\.0\.1:\d+ - "GET /model_info HTTP/1\.1" 200 OK$', re.M)
    # Wait for each thing asserted, on the stream it is printed to: stdout and stderr are read by
    # two threads, so "ready" on stderr says nothing about how far stdout has been read.
    s.wait_for(lambda st: st.log.state.phase == "ready", 30, "ready")
    s.wait_for(lambda st: access.search(st.out), 30, "the /model_info access line on stdout")
    lines = [ln for ln in s.err.splitlines() if "Uvicorn running" in ln]
    assert len(lines) == 1
    assert re.fullmatch(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] INFO:     Uvicorn running on http://127\.0\.0\.1:"
                        + str(port) + r" \(Press CTRL\+C to quit\)", lines[0]), lines[0]
    assert s.log.state.uvicorn_up and s.log.state.url == f"http://127.0.0.1:{port}"
    s.terminate()


def test_standin_rank_killed_059_and_0523_forms(trees, running):  # noqa: F811
    s = running(trees("patched"), base_flags(free_port(), tp=2) + EAGLE3_FLAGS,
                env={"PROVISION_STANDIN_FAULT": "rank-killed"})
    assert s.finish() == 1
    assert re.search(r"^\[[\d: -]+ TP0\] Rank 0 scheduler is dead\. Please check if there are relevant logs\.$"
                     r"|^\[[\d: -]+\] Rank 0 scheduler is dead\. Please check if there are relevant logs\.$",
                     s.err, re.M), s.err[-1500:]
    assert re.search(r"\] Exit code: -9$", s.err, re.M)
    c = s.log.state.crashed
    assert c.kind == "child-failed" and c.exit_code == -9 and "OOM killer" in hint(c)

    s2 = running(trees("patched"), base_flags(free_port(), tp=2) + EAGLE3_FLAGS,
                 env={"PROVISION_STANDIN_FAULT": "rank-killed", "PROVISION_STANDIN_LOG_FORMS": "0.5.23"})
    assert s2.finish() == 1
    assert ("\nRuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 "
            "(SIGKILL), a common cause is the OS OOM killer.") in s2.err
    assert "scheduler is dead" not in s2.err
    c2 = s2.log.state.crashed
    assert c2.kind == "child-failed" and c2.exit_code == -9 and c2.oom_killer


def test_standin_0523_missing_method_is_a_valueerror(trees, running):  # noqa: F811
    s = running(trees("0.5.9"), base_flags(free_port(), tp=2) + EAGLE3_FLAGS,
                env={"PROVISION_STANDIN_LOG_FORMS": "0.5.23"})
    assert s.finish() == -signal.SIGKILL
    assert ("ValueError: Model KimiK25ForConditionalGeneration does not implement set_eagle3_layers_to_capture"
            in s.err)
    assert "AttributeError" not in s.err
    c = s.log.state.crashed
    assert c.kind == "missing-eagle3-method" and c.method == "set_eagle3_layers_to_capture"


def test_standin_import_error_forms(trees, running):  # noqa: F811
    for forms, sep in (("0.5.9", ":"), ("0.4.10", ".")):
        s = running(trees("syntax-error"), base_flags(free_port(), tp=2) + EAGLE3_FLAGS,
                    env={"PROVISION_STANDIN_LOG_FORMS": forms})
        assert s.finish() == 1
        assert f"Ignore import error when loading sglang.srt.models.kimi_k25{sep} " in s.err
        c = s.log.state.crashed
        assert c.kind == "architecture-not-supported" and "kimi_k25" in c.summary


def test_stand_in_helpers_name_the_forms():
    assert standin_log.import_error_line((0, 5, 9), "m", "e") == "Ignore import error when loading m: e"
    assert standin_log.import_error_line((0, 4, 10), "m", "e") == "Ignore import error when loading m. e"
    assert standin_log.rank_dead_lines((0, 5, 9), 2, -9)[1] == "EOFError"
    assert standin_log.rank_dead_lines((0, 5, 23), 2, -9)[0] == []


def _fstring_template(path, exc: str, words: str) -> str:
    """The message of the ``exc(f"...")`` holding ``words`` in a real file, its replacement fields
    as ``{}``: what the real server prints, to hold the stand-in against."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == exc and node.args:
            parts = node.args[0].values if isinstance(node.args[0], ast.JoinedStr) else [node.args[0]]
            text = "".join(p.value if isinstance(p, ast.Constant) else "{}" for p in parts)
            if words in text:
                return text
    raise AssertionError(f"no {exc}(...{words}...) in {path}")


def test_standin_prints_0523s_crash_lines_as_the_release_does(sglang_0523):
    """The 0.5.23 wording, read from the released wheel, not from memory."""
    from provision.sandbox.standin_log import missing_method_exception, rank_dead_lines

    real = _fstring_template(sglang_0523 / "srt/model_executor/model_runner_components/attention_backend_setup.py",
                             "ValueError", "does not implement")
    ours = missing_method_exception((0, 5, 23), "{}", "set_eagle3_layers_to_capture")
    assert ours == "ValueError: " + real, (ours, real)

    real = _fstring_template(sglang_0523 / "srt/entrypoints/engine.py", "RuntimeError", "died during")
    _, line = rank_dead_lines((0, 5, 23), "{}", "{}")
    assert line == "RuntimeError: " + real, (line, real)


def test_uvicorn_format_is_the_releases(sglang_059, sglang_0523):
    """Both releases give uvicorn the dated format the stand-in prints."""
    for root in (sglang_059, sglang_0523):
        assert '"[%(asctime)s] %(levelprefix)s %(message)s"' in (root / "srt/utils/common.py").read_text()
