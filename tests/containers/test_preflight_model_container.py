"""Launch knows the model (issue 19) for a server in a container: the registry and the argument
parser are the image's (read in a throw-away container of it), the model folders are read through
the profile's volumes. Real podman on a sandbox host, the SGLang 0.5.9 image.

A refused launch creates no container at all (so no server process ever ran); each launch has a
600 s stand-in load and a short deadline, so a refusal came before a load could end.
"""

from __future__ import annotations

import json

from tests.cli.helpers import run, run_json
from tests.containers.test_container_launch import containers, inventory

MODEL = "/data/models/Kimi-K2.5"
DRAFTER = "/data/models/Kimi-K25-eagle3"


def launch_only(tmp_path, image, load="600", **args) -> str:
    """A user's own profile: `launch:` only, no `patch:` section."""
    a = {"model-path": MODEL, "tp-size": 2, "speculative-algorithm": "EAGLE3", "speculative-draft-model-path": DRAFTER,
         "speculative-num-steps": 3, "speculative-eagle-topk": 1, "speculative-num-draft-tokens": 4,
         "host": "127.0.0.1", "port": 30000}
    a.update(args)
    doc = {"name": "my-kimi-container",
           "launch": {"container": {"runtime": "podman", "image": image, "network": "host",
                                    "volumes": ["/data:/data:ro"]},
                      "args": a, "env": {"PROVISION_STANDIN_LOAD_SECONDS": load}}}
    path = tmp_path / "my-kimi-container.yaml"
    path.write_text(json.dumps(doc))
    return str(path)


def refused(tmp_path, ssh_env, host, profile, *extra) -> str:
    inv = inventory(tmp_path, ssh_env, host)
    proc, doc = run_json("launch", "-i", inv, "--playbook", profile, "--poll", "0.5", "--deadline", "30", *extra,
                         timeout=420)
    r = doc["hosts"][0]
    assert proc.returncode == 3 and r["verdict"] == "refused", (r, proc.stderr)
    assert containers(ssh_env, host) == [], "a refused launch creates no container"
    return r["detail"]


def test_launch_only_profile_on_the_059_image_gets_the_shipped_spec_in_the_overlay(tmp_path, ssh_env, podman_host,
                                                                                   sglang_images):
    host = podman_host
    pb, inv = launch_only(tmp_path, sglang_images["0.5.9"], load="2"), inventory(tmp_path, ssh_env, host)
    proc, doc = run_json("launch", "-i", inv, "--playbook", pb, "--poll", "0.5", timeout=420)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", doc["hosts"][0]["detail"] + proc.stderr
    assert "overlay staged in /var/lib/provision/overlay/" in proc.stderr
    assert "KimiK25ForConditionalGeneration" in proc.stderr
    run("stop", "-i", inv, "--playbook", pb, check_rc=0)
    assert containers(ssh_env, podman_host) == []


def test_misspelt_flag_is_refused_by_the_images_parser(tmp_path, ssh_env, podman_host, sglang_images):
    pb = launch_only(tmp_path, sglang_images["0.5.9"], **{"speculative-num-stpes": 3})
    detail = refused(tmp_path, ssh_env, podman_host, pb)
    assert "--speculative-num-stpes is not a flag of SGLang 0.5.9: did you mean --speculative-num-steps" in detail


def test_mla_drafter_gemma3_and_a_truncated_shard_are_refused(tmp_path, ssh_env, podman_host, sglang_images):
    host = podman_host
    host.run(f"rm -rf /data/models/pf-*; cp -r {DRAFTER} /data/models/pf-mla && printf '%s' "
             "'{\"architectures\": [\"Eagle3DeepseekV2ForCausalLM\"]}' > /data/models/pf-mla/config.json && "
             f"cp -r {MODEL} /data/models/pf-gemma3 && printf '%s' "
             "'{\"architectures\": [\"Gemma3ForConditionalGeneration\"]}' > /data/models/pf-gemma3/config.json && "
             f"cp -r {MODEL} /data/models/pf-trunc && "
             "truncate -s -3 /data/models/pf-trunc/model-00005-of-00064.safetensors")
    try:
        image = sglang_images["0.5.9"]
        detail = refused(tmp_path, ssh_env, host,
                         launch_only(tmp_path, image, **{"speculative-draft-model-path": "/data/models/pf-mla"}))
        assert "drafter architecture Eagle3DeepseekV2ForCausalLM is not registered in SGLang 0.5.9" in detail
        detail = refused(tmp_path, ssh_env, host, launch_only(tmp_path, image, **{"model-path": "/data/models/pf-gemma3"}))
        assert "Gemma3ForConditionalGeneration lacks set_eagle3_layers_to_capture" in detail
        assert "provision spec new Gemma3ForConditionalGeneration" in detail
        detail = refused(tmp_path, ssh_env, host, launch_only(tmp_path, image, **{"model-path": "/data/models/pf-trunc"}))
        assert "1 of 64 shards are not whole: model-00005-of-00064.safetensors" in detail
    finally:
        host.run("rm -rf /data/models/pf-*", check=False)


def test_a_model_on_no_volume_is_read_in_the_image_refused_when_absent_accepted_when_baked_in(
        tmp_path, ssh_env, podman_host, sglang_images):
    """issue 43 item 2: a profile with no `volumes:` names model folders the image must hold.
    Preflight reads them in a throw-away container of the image: on the plain image they are
    refused before any server container exists; baked into the image, the launch is ready."""
    from provision.sandbox.sglang_image import BAKED_DRAFTER, BAKED_MODEL, ensure_baked_image

    def no_volumes(image, load):
        pb = json.loads(open(launch_only(tmp_path, image, load=load, **{
            "model-path": BAKED_MODEL, "speculative-draft-model-path": BAKED_DRAFTER})).read())
        del pb["launch"]["container"]["volumes"]
        path = tmp_path / "no-volumes.yaml"
        path.write_text(json.dumps(pb))
        return str(path)

    detail = refused(tmp_path, ssh_env, podman_host, no_volumes(sglang_images["0.5.9"], "600"))
    assert (f"model {BAKED_MODEL} is neither on a volume nor in image {sglang_images['0.5.9']}: the server would "
            "die after it starts; mount the host folder that holds it") in detail, detail
    assert f"drafter {BAKED_DRAFTER} is neither on a volume nor in image" in detail, detail

    baked = ensure_baked_image("0.5.9")
    pb, inv = no_volumes(baked, "2"), inventory(tmp_path, ssh_env, podman_host)
    proc, doc = run_json("launch", "-i", inv, "--playbook", pb, "--poll", "0.5", timeout=420)
    try:
        assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", doc["hosts"][0]["detail"] + proc.stderr
        assert "not checked" not in proc.stderr and "on a volume" not in proc.stderr, proc.stderr  # read, and found
    finally:
        run("stop", "-i", inv, "--playbook", pb, check_rc=0)
    assert containers(ssh_env, podman_host) == []
