"""The two SM120 crashes of issue 11, as SGLang 0.5.9 logs them from a scheduler rank: each is
recognised and names the shipped spec that fixes it (frames from the released files' own code:
0.5.9 torch_symm_mem.py line 83, flashinfer 0.6.3 compilation_context.py line 62)."""

from __future__ import annotations

from provision.config.playbook import load_patch_spec
from provision.logs.loadlog import SPEC_FIXES, hint, parse

TS = "[2026-02-03 10:11:12 TP{}]"


def scheduler_tb(rank: int, frames: str, exc: str) -> str:
    return (f"{TS.format(rank)} Scheduler hit an exception: Traceback (most recent call last):\n"
            '  File "/opt/venv/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", line 2723, '
            "in run_scheduler_process\n"
            "    scheduler = Scheduler(\n" + frames + exc + "\n")


SYMM_FRAMES = (
    '  File "/opt/venv/lib/python3.11/site-packages/sglang/srt/distributed/parallel_state.py", line 337, in __init__\n'
    "    self.torch_symm_mem_comm = TorchSymmMemCommunicator(\n"
    '  File "/opt/venv/lib/python3.11/site-packages/sglang/srt/distributed/device_communicators/torch_symm_mem.py", '
    "line 83, in __init__\n"
    "    not in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability]\n")

FUSION_FRAMES = (
    '  File "/opt/venv/lib/python3.11/site-packages/flashinfer/comm/trtllm_ar.py", line 93, in get_trtllm_comm_module\n'
    "    module = gen_trtllm_comm_module().build_and_load()\n"
    '  File "/opt/venv/lib/python3.11/site-packages/flashinfer/jit/comm.py", line 60, in gen_trtllm_comm_module\n'
    "    nvcc_flags = current_compilation_context.get_nvcc_flags_list(\n"
    '  File "/opt/venv/lib/python3.11/site-packages/flashinfer/compilation_context.py", line 62, in get_nvcc_flags_list\n'
    "    raise RuntimeError(\n")


def test_keyerror_12_from_torch_symm_mem_names_its_spec():
    st = parse(scheduler_tb(3, SYMM_FRAMES, "KeyError: 12"))
    c = st.crashed
    assert c is not None and c.kind == "sm120-torch-symm-mem" and c.spec == "sm120-torch-symm-mem"
    assert c.rank == "TP3" and "KeyError: 12 in torch_symm_mem.py" in c.summary
    assert hint(c, "gpu1") == ("the spec sm120-torch-symm-mem fixes this (the SM120 key of SGLang's "
                               "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES): run `provision patch --playbook "
                               "sm120-torch-symm-mem --host gpu1`, then restart the server")


def test_another_keyerror_12_is_not_that_crash():
    other = ('  File "/opt/venv/lib/python3.11/site-packages/sglang/srt/layers/quantization/fp8.py", line 9, in f\n'
             "    x = table[major]\n")
    c = parse(scheduler_tb(0, other, "KeyError: 12")).crashed
    assert c is not None and c.kind == "exception" and c.spec is None


def test_no_supported_cuda_architectures_names_the_flashinfer_spec():
    exc = "RuntimeError: No supported CUDA architectures found for major versions [9, 10]."
    c = parse(scheduler_tb(0, FUSION_FRAMES, exc)).crashed
    assert c is not None and c.kind == "sm120-flashinfer-allreduce-fusion"
    assert c.spec == "sm120-flashinfer-allreduce-fusion"
    assert c.summary.startswith("flashinfer builds its allreduce-fusion kernels only for compute capability majors [9, 10]")
    assert "provision patch --playbook sm120-flashinfer-allreduce-fusion --host HOST" in hint(c)


def test_the_named_specs_ship():
    for name in SPEC_FIXES.values():
        assert load_patch_spec(name).name == name
