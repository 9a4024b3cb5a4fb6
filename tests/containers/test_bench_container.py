"""`provision bench` against a server in a container (profile `launch.container`), over real sshd,
with real podman on a sandbox host running the SGLang image: the image's stand-in must answer a
streaming /generate at the speed and accept length its environment sets, as on a plain host.

Regression (issue 22): the image carried only standin.py, not the modules beside it
(standin_generate.py among them), so bench on a container host failed ("stream cut after 0 chunks")."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import run, run_json
from tests.containers.test_container_launch import SPEC, inventory

RATE, ACCEPT = 80.0, 2.5
BENCH = ("--requests", "4", "--max-new-tokens", "64", "--warmup", "1")


def playbook(tmp_path, image) -> str:
    doc = {"name": "kimi-k25-eagle3-bench", "patch": SPEC,
           "launch": {"container": {"runtime": "podman", "image": image, "network": "host",
                                    "volumes": ["/data:/data:ro"]},
                      "args": {"model-path": "/data/models/Kimi-K2.5", "tp-size": 1,
                               "speculative-algorithm": "EAGLE3",
                               "speculative-draft-model-path": "/data/models/Kimi-K25-eagle3",
                               "speculative-num-steps": 3, "speculative-eagle-topk": 1,
                               "speculative-num-draft-tokens": 4, "host": "127.0.0.1", "port": 30000},
                      "env": {"PROVISION_STANDIN_LOAD_SECONDS": "0.5", "PROVISION_STANDIN_WARMUP_SECONDS": "0.2",
                              "PROVISION_STANDIN_DECODE_TOK_S": str(RATE),
                              "PROVISION_STANDIN_ACCEPT_LENGTH": str(ACCEPT),
                              "PROVISION_STANDIN_TTFT_SECONDS": "0.05"}}}
    path = tmp_path / "bench-container.yaml"
    path.write_text(json.dumps(doc))
    return str(path)


def test_bench_measures_the_server_in_a_container(tmp_path, ssh_env, podman_host, sglang_images):
    host = podman_host
    pb, inv = playbook(tmp_path, sglang_images["0.5.10"]), inventory(tmp_path, ssh_env, host)
    proc, doc = run_json("launch", "-i", inv, "--playbook", pb, "--poll", "0.5", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert doc["hosts"][0]["verdict"] == "ready", doc["hosts"][0]
    try:
        proc, doc = run_json("bench", "-i", inv, *BENCH, timeout=300)
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        (r,) = doc["hosts"]
        assert r["verdict"] == "measured", r
        assert r["version"] == "0.5.10" and r["spec"]["speculative_algorithm"] == "EAGLE3"
        assert r["decode_tok_s"] == pytest.approx(RATE, rel=0.15)
        assert r["accept_length"] == pytest.approx(ACCEPT, rel=0.15)
        assert r["flags"] == []
    finally:
        run("stop", "-i", inv, "--playbook", pb)
