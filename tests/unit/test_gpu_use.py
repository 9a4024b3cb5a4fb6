"""Which GPUs a server uses and who holds them (host/facts/gpu_use.py): pure readers and decision."""

from __future__ import annotations

import pytest

from provision.host.facts.gpu_use import describe, parse_compute_apps, parse_gpu_list, server_gpus

LIST = "\n".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-{i:02d}aa-bbbb)" for i in range(8)) + "\n"
GPUS = parse_gpu_list(LIST)


def test_the_gpu_list_and_the_apps_are_read_as_nvidia_smi_prints_them():
    assert GPUS[3] == {"index": 3, "uuid": "GPU-03aa-bbbb"} and len(GPUS) == 8
    apps = parse_compute_apps("GPU-03aa-bbbb, 4242, /usr/bin/python3, 71234 MiB\n[N/A], x, y, z\n")
    assert apps == [{"uuid": "GPU-03aa-bbbb", "pid": 4242, "name": "/usr/bin/python3", "memory": "71234 MiB"}]
    assert parse_gpu_list("No devices were found\n") == []


@pytest.mark.parametrize("args, visible, want", [
    ({}, None, [0]),
    ({"tp-size": 8}, None, list(range(8))),
    ({"tp-size": 4, "base-gpu-id": 4}, None, [4, 5, 6, 7]),
    ({"tp-size": 4}, None, [0, 1, 2, 3]),
    ({"tp-size": 2, "base-gpu-id": 1, "gpu-id-step": 2}, None, [1, 3]),
    ({"tp-size": 16, "nnodes": 2}, None, list(range(8))),
    ({"tp-size": 2, "pp-size": 2}, None, [0, 1, 2, 3]),
    ({"tp-size": 2}, "6,7", [6, 7]),
    ({"tp-size": 2, "base-gpu-id": 1}, "0,5,2", [5, 2]),
    ({"tp-size": 1}, "GPU-07aa", [7]),
])
def test_the_servers_gpus(args, visible, want):
    used, why = server_gpus(args, visible, GPUS)
    assert why is None and [g["index"] for g in used] == want


@pytest.mark.parametrize("args, visible, words", [
    ({"tp-size": 4, "base-gpu-id": 6}, None, "needs GPU 8 (base-gpu-id 6, 4 ranks on this node) and 8 GPUs"),
    ({"tp-size": 4}, "0,1", "needs CUDA device 2 (base-gpu-id 0, 4 ranks on this node) and CUDA_VISIBLE_DEVICES=0,1 lists 2"),
    ({}, "", "CUDA_VISIBLE_DEVICES= lists 0"),
    ({}, "GPU-nope", "entry 'GPU-nope' is none of the host's 8 GPUs"),
])
def test_a_server_that_cannot_have_its_gpus_is_told_why(args, visible, words):
    used, why = server_gpus(args, visible, GPUS)
    assert used == [] and words in why


def test_describe():
    assert describe(GPUS[4:8]) == "GPUs 4-7" and describe(GPUS[2:3]) == "GPU 2"
    assert describe([GPUS[0], GPUS[2]]) == "GPUs 0, 2"
