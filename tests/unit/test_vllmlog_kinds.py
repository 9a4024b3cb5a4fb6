"""issue 64: the kinds of vLLM start-up failure real logs show, each read as crashed with the
sentence that names its cause, in any chunking; and the phases older formats go through.

The excerpts are written here in the shapes vLLM's own code prints them (its logger's
`(Proc pid=N) LEVEL MM-DD HH:MM:SS [file.py:line]` prefix, the V1 supervisor's one-line verdicts,
the V0 multi-process worker's `Exception in worker ... while processing method ...:` header,
pydantic's validation errors of its config classes), behind the collectors users paste from.
"""

from __future__ import annotations

import pytest

from provision.logs import vllmlog

CHUNKS = [None, 1, 9, 64]


def read(text: str, chunk: int | None):
    log = vllmlog.LoadLog()
    pieces = [text] if chunk is None else [text[i:i + chunk] for i in range(0, len(text), chunk)]
    seen = []
    for piece in pieces:
        seen += [e.phase for e in log.feed(piece) if e.kind in ("phase", "ready")]
    seen += [e.phase for e in log.flush() if e.kind in ("phase", "ready")]
    return log.state, seen


LOADING = """\
(APIServer pid=71) INFO 03-02 10:00:01 [api_server.py:1900] vLLM API server version 0.11.0
(EngineCore_DP0 pid=90) INFO 03-02 10:00:09 [gpu_model_runner.py:2602] Starting to load model /models/Kimi-K2.5...
"""

ONE_LINE_WORKER = LOADING + """\
(EngineCore_DP0 pid=90) ERROR 03-02 10:01:12 [multiproc_executor.py:597] WorkerProc failed to start.
"""

ONE_LINE_CORE = LOADING + """\
(EngineCore_DP0 pid=90) ERROR 03-02 10:01:12 [core.py:708] EngineCore failed to start.
"""

V0_WORKER = """\
INFO 06-11 08:12:40 [model_runner.py:1056] Starting to load model /models/llama...
(VllmWorkerProcess pid=4821) ERROR 06-11 08:12:41 [multiproc_worker_utils.py:233] Exception in worker VllmWorkerProcess while processing method init_device: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5, Traceback (most recent call last):
(VllmWorkerProcess pid=4821) ERROR 06-11 08:12:41 [multiproc_worker_utils.py:233]   File "/usr/lib/python3/vllm/executor/multiproc_worker_utils.py", line 226, in _run_worker_process
(VllmWorkerProcess pid=4821) ERROR 06-11 08:12:41 [multiproc_worker_utils.py:233]     output = executor(*args, **kwargs)
"""

BARE_EXCEPTION = """\
INFO 06-11 08:12:35 [config.py:520] This model supports multiple tasks.
ValueError: Model architectures ['FooForCausalLM'] are not supported for now. Supported architectures: dict_keys(['LlamaForCausalLM'])
"""

PYDANTIC = """\
(APIServer pid=12) INFO 11-20 09:00:00 [api_server.py:1900] vLLM API server version 0.11.0
(APIServer pid=12) Traceback (most recent call last):
(APIServer pid=12)   File "/usr/lib/python3/vllm/engine/arg_utils.py", line 1030, in create_model_config
(APIServer pid=12)     return ModelConfig(
(APIServer pid=12)            ^^^^^^^^^^^^
(APIServer pid=12) pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig
(APIServer pid=12)   Value error, User-specified max_model_len (100000) is greater than the derived max_model_len (max_position_embeddings=4096 or model_max_length=None in model's config.json). To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. [type=value_error, input_value=ArgsKwargs((), {'model': '/m'}), input_type=ArgsKwargs]
(APIServer pid=12)     For further information visit https://errors.pydantic.dev/2.11/v/value_error
"""

PYDANTIC_ARCH = PYDANTIC.replace(
    "User-specified max_model_len (100000) is greater than the derived max_model_len (max_position_embeddings=4096 "
    "or model_max_length=None in model's config.json). To allow overriding this maximum, set the env var "
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.",
    "Model architectures ['FooForCausalLM'] are not supported for now.")

PYDANTIC_FIELD = """\
pydantic_core._pydantic_core.ValidationError: 1 validation error for EngineArgs
max_num_seqs
  Input should be a valid integer, unable to parse string as an integer [type=int_parsing, input_value='many', input_type=str]
"""

HEADERLESS = """\
vllm-1  |   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 83, in __init__
vllm-1  |     self.model_executor = executor_class(vllm_config)
vllm-1  |                           ^^^^^^^^^^^^^^^^^^^^^^^^^^^
vllm-1  | RuntimeError: CUDA error: no kernel image is available for execution on the device
"""

JOURNALD = """\
Dec 07 10:00:00 gpu01 vllm[1234]: (EngineCore_DP0 pid=90) INFO 12-07 10:00:00 [gpu_model_runner.py:2602] Starting to load model /m...
Dec 07 10:00:05 gpu01 vllm[1234]: (EngineCore_DP0 pid=90) ERROR 12-07 10:00:05 [core.py:708] EngineCore failed to start.
"""

CARET_SUMMARY = """\
(APIServer pid=5)   File "/usr/lib/python3/vllm/v1/engine/utils.py", line 720, in wait_for_engine_startup
(APIServer pid=5)     raise RuntimeError("Engine core initialization failed. "
(APIServer pid=5)     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
"""


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("text,kind,summary", [
    (ONE_LINE_WORKER, "child-failed", "WorkerProc failed to start."),
    (ONE_LINE_CORE, "child-failed", "EngineCore failed to start."),
    (V0_WORKER, "exception", "NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, unhandled system "
                             "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5"),
    (BARE_EXCEPTION, "exception", "ValueError: Model architectures ['FooForCausalLM'] are not supported for now. "
                                  "Supported architectures: dict_keys(['LlamaForCausalLM'])"),
    (PYDANTIC, "exception", "ModelConfig: User-specified max_model_len (100000) is greater than the derived "
                            "max_model_len (max_position_embeddings=4096 or model_max_length=None in model's "
                            "config.json). To allow overriding this maximum, set the env var "
                            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."),
    (PYDANTIC_ARCH, "exception", "ModelConfig: Model architectures ['FooForCausalLM'] are not supported for now."),
    (PYDANTIC_FIELD, "exception", "EngineArgs.max_num_seqs: Input should be a valid integer, unable to parse string "
                                  "as an integer"),
    (HEADERLESS, "exception", "RuntimeError: CUDA error: no kernel image is available for execution on the device"),
    (JOURNALD, "child-failed", "EngineCore failed to start."),
    # a tail of source lines only: where it was, never the quoted source line nor the caret line
    (CARET_SUMMARY, "child-failed", "the log ends inside a traceback, without its exception line (last frame: "
                                    "utils.py line 720, in wait_for_engine_startup)"),
])
def test_a_start_up_that_died_is_crashed_with_the_sentence_of_its_cause(text, kind, summary, chunk):
    st, _ = read(text, chunk)
    assert st.crashed is not None, f"read as {st.phase}, neither ready nor crashed"
    assert (st.crashed.kind, st.crashed.summary) == (kind, summary), st.crashed
    assert not st.ready


@pytest.mark.parametrize("chunk", CHUNKS)
def test_the_root_cause_below_a_one_line_verdict_wins(chunk):
    text = ONE_LINE_CORE + """\
(EngineCore_DP0 pid=90) ERROR 03-02 10:01:12 [core.py:708] Traceback (most recent call last):
(EngineCore_DP0 pid=90) ERROR 03-02 10:01:12 [core.py:708]   File "/v/vllm/v1/engine/core.py", line 699, in run_engine_core
(EngineCore_DP0 pid=90) ERROR 03-02 10:01:12 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
"""
    st, _ = read(text, chunk)
    assert st.crashed.kind == "oom" and "Tried to allocate 2.00 GiB" in st.crashed.summary, st.crashed


@pytest.mark.parametrize("chunk", CHUNKS)
def test_the_traceback_summary_is_never_a_source_or_caret_line(chunk):
    text = CARET_SUMMARY.replace("(APIServer pid=5)   File", "(APIServer pid=5) Traceback (most recent call last):\n"
                                 "(APIServer pid=5)   File", 1) + \
        "(APIServer pid=5) Traceback (most recent call last):\n(APIServer pid=5)   File \"x.py\", line 1, in y\n"
    st, _ = read(text, chunk)
    assert st.crashed is not None and not st.crashed.summary.startswith(("^", "raise")), st.crashed


@pytest.mark.parametrize("chunk", CHUNKS)
def test_shard_loading_and_older_cuda_graph_lines_move_the_phase(chunk):
    text = """\
INFO 06-11 08:12:35 [config.py:520] This model supports multiple tasks.
Loading safetensors checkpoint shards:  50% Completed | 32/64 [00:40<00:40,  1.25s/it]
Loading safetensors checkpoint shards: 100% Completed | 64/64 [01:20<00:00,  1.25s/it]
INFO 06-11 08:14:00 [model_runner.py:1067] Loading model weights took 78.3 GiB
INFO 06-11 08:14:10 [executor_base.py:113] # GPU blocks: 12000, # CPU blocks: 4096
INFO 06-11 08:14:12 [model_runner.py:1400] Capturing the model for CUDA graphs. This may lead to unexpected consequences if the model is not static.
INFO 06-11 08:14:40 [model_runner.py:1535] Graph capturing finished in 28 secs, took 1.2 GiB
INFO:     Application startup complete.
"""
    st, seen = read(text, chunk)
    assert seen == ["target-weights", "kv-cache", "cuda-graphs", "ready"], seen
    assert st.target.percent == 100.0 and st.target.shards_total == 64 and st.ready


def test_a_warning_that_quotes_an_exception_is_no_crash():
    text = LOADING + ("(APIServer pid=71) WARNING 03-02 10:00:02 [utils.py:12] ValueError: ignored, falling back\n"
                      "(APIServer pid=71) INFO 03-02 10:00:03 [x.py:1] Application startup complete.\n")
    st, _ = read(text, None)
    assert st.crashed is None and st.ready
