"""`provision launch` of a vLLM image (issue 58): the image's vLLM release files are read from the
image as SGLang's are, so a container launch tells missing / native / patched (provision's block
baked into the image), carries the overlay where the class lacks the interface, and refuses in
seconds a model path that is neither on a volume nor in the image.

Real podman on a sandbox host running the vLLM 0.18.0 image (provision/sandbox/vllm_image.py: the
real release's files laid out as vllm/vllm-openai has them, the sandbox's vLLM stand-in server
beside them). Kimi-VL's wrapper lacks SupportsEagle3 on 0.18; Kimi-K2.5's has it natively there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.cli.helpers import run, run_json
from tests.containers.test_container_launch import containers, inventory

VERSION = "0.18.0"
SITE = "/usr/local/lib/python3.11/dist-packages"
PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"


@pytest.fixture(scope="module")
def vllm_image():
    from provision.sandbox import images, vllm_image

    bad = images.problems()
    if bad:
        pytest.skip("container images unavailable: " + "; ".join(bad))
    return vllm_image.ensure_vllm_image(VERSION)[0]


def shipped_patch(name: str) -> dict:
    """A shipped vLLM spec's `patch:` (its `applies:` judges a host's install, not an image's: left out)."""
    doc = yaml.safe_load((PLAYBOOKS / f"{name}.yaml").read_text())
    return {k: v for k, v in doc["patch"].items() if k != "applies"}


def models(host) -> None:
    """The target checkpoints and a drafter on the host's /data (the volume), as config.json says them."""
    for name, archs in (("kimi-vl", ["KimiVLForConditionalGeneration"]), ("kimi-k25", ["KimiK25ForConditionalGeneration"]),
                        ("eagle3", ["LlamaForCausalLMEagle3"])):
        host.run(f"mkdir -p /data/models/{name} && echo '{json.dumps({'architectures': archs})}' "
                 f"> /data/models/{name}/config.json")


def playbook(tmp_path, image, spec_name, model, *, fix=None) -> str:
    launch = {"engine": "vllm", "module": "vllm_standin",
              "container": {"runtime": "podman", "image": image, "network": "host", "volumes": ["/data:/data:ro"]},
              "args": {"model": model, "host": "127.0.0.1", "port": 30000,
                       "speculative-config": {"method": "eagle3", "model": "/data/models/eagle3",
                                              "num_speculative_tokens": 3}},
              "env": {"PROVISION_STANDIN_LOAD_SECONDS": "1"}}
    if fix:
        launch["fix"] = fix
    doc = {"name": f"{spec_name}-container", "engine": "vllm", "patch": shipped_patch(spec_name), "launch": launch}
    path = tmp_path / f"{spec_name}-{fix or 'edit'}.yaml"
    path.write_text(json.dumps(doc))
    return str(path)


def launch(tmp_path, ssh_env, host, pb, *extra):
    return run_json("launch", "-i", inventory(tmp_path, ssh_env, host), "--playbook", pb, "--poll", "0.5",
                    "--deadline", "120", *extra, timeout=420)


def launch_ready(tmp_path, ssh_env, host, pb):
    """Launch to ready: (the run's stderr, the host's row)."""
    proc, doc = launch(tmp_path, ssh_env, host, pb)
    r = doc["hosts"][0]
    assert proc.returncode == 0 and r["verdict"] == "ready", (r, proc.stderr)
    return proc.stderr, r


def stop(tmp_path, ssh_env, host, pb) -> None:
    run("stop", "-i", inventory(tmp_path, ssh_env, host), "--playbook", pb, check_rc=0)
    assert containers(ssh_env, host) == []


def status(tmp_path, ssh_env, host, pb) -> dict:
    proc, doc = run_json("status", "-i", inventory(tmp_path, ssh_env, host), "--playbook", pb, timeout=120)
    return doc["hosts"][0]


def test_missing_in_the_image_the_overlay_is_carried_and_the_server_loads_it(tmp_path, ssh_env, podman_host,
                                                                              vllm_image):
    """0.18's KimiVLForConditionalGeneration lacks the interface: read from the image, the overlay (the
    default fix for containers) is staged from its own files and mounted; the server finds its entry
    point; status says the image lacks the members and the overlay supplies them."""
    host = podman_host
    models(host)
    pb = playbook(tmp_path, vllm_image, "kimi-vl-eagle3-vllm", "/data/models/kimi-vl")
    err, r = launch_ready(tmp_path, ssh_env, host, pb)
    assert f"image {vllm_image}: vLLM {VERSION} inside" in err, err
    assert r["data"]["image"]["version"] == VERSION and r["data"]["image"]["install"] == f"{SITE}/vllm"
    assert "overlay staged in /var/lib/provision/overlay/" in err, err
    assert "KimiVLForConditionalGeneration" in err and "mounted read-only at" in err
    name = containers(ssh_env, host)[0].split()[0]
    env = json.loads(ssh_env.ssh(host, f"podman inspect {name}").stdout)[0]["Config"]["Env"]
    assert "PROVISION_OVERLAY=provision_overlay" in env
    # the server found the overlay's entry point (vllm.general_plugins) on its PYTHONPATH and loaded it
    logs = run("logs", "-i", inventory(tmp_path, ssh_env, host), "--playbook", pb, "-n", "200", check_rc=0).stdout
    assert "PROVISION_STANDIN plugins loaded: provision_overlay" in logs, logs
    st = status(tmp_path, ssh_env, host, pb)
    assert st["verdict"] == "overlay", st
    assert "overlay: the image lacks " in st["detail"] and "set_aux_hidden_state_layers" in st["detail"], st
    assert f"with vLLM {VERSION}" in st["detail"], st
    # the image's files are as released: the fix is the overlay, not an edit
    out = ssh_env.ssh(host, f"podman run --rm --entrypoint grep {vllm_image} -c 'provision' "
                            f"{SITE}/vllm/model_executor/models/kimi_vl.py || true").stdout.strip()
    assert out == "0"
    stop(tmp_path, ssh_env, host, pb)


def test_native_and_patched_in_the_image_are_told_from_its_own_files(tmp_path, ssh_env, podman_host, vllm_image):
    host = podman_host
    models(host)
    # native: 0.18's KimiK25ForConditionalGeneration has the interface: no overlay, status native
    pb = playbook(tmp_path, vllm_image, "kimi-k25-eagle3-vllm", "/data/models/kimi-k25")
    err, r = launch_ready(tmp_path, ssh_env, host, pb)
    assert f"the image's vLLM {VERSION} has every method natively: no overlay needed" in err, err
    assert status(tmp_path, ssh_env, host, pb)["verdict"] == "native"
    stop(tmp_path, ssh_env, host, pb)

    # patched: the same release with provision's block baked into the image's kimi_vl.py (a user's own
    # image built after `provision patch --local`): status says the image's class has the members
    from provision.host.engine import core
    from provision.host.lib.modules import make_resolver
    from provision.sandbox.vllm_sources import package_dir

    pkg = package_dir(VERSION)
    spec = dict(shipped_patch("kimi-vl-eagle3-vllm"), name="kimi-vl-eagle3-vllm", package="vllm")
    src = (pkg / spec["file"]).read_bytes()
    new = core.plan_patch(src, spec, resolve_module=make_resolver(str(pkg), "vllm"))["new"]
    host.hostpath("/root/kimi_vl.py").write_bytes(new)
    host.run(f"podman create --name bake {vllm_image} true >/dev/null && "
             f"podman cp /root/kimi_vl.py bake:{SITE}/vllm/{spec['file']} && "
             "podman commit -q bake localhost/my-vllm:patched >/dev/null && podman rm bake >/dev/null")
    pb = playbook(tmp_path, "localhost/my-vllm:patched", "kimi-vl-eagle3-vllm", "/data/models/kimi-vl")
    err, r = launch_ready(tmp_path, ssh_env, host, pb)
    st = status(tmp_path, ssh_env, host, pb)
    assert st["verdict"] == "patched" and "the image's class has the methods (provision's block)" in st["detail"], st
    stop(tmp_path, ssh_env, host, pb)


def test_a_model_path_on_no_volume_and_not_in_the_image_is_refused_before_any_start(tmp_path, ssh_env, podman_host,
                                                                                   vllm_image):
    host = podman_host
    models(host)
    pb = playbook(tmp_path, vllm_image, "kimi-k25-eagle3-vllm", "/models/not-there")
    proc, doc = launch(tmp_path, ssh_env, host, pb)
    r = doc["hosts"][0]
    assert proc.returncode == 3 and r["verdict"] == "refused", (r, proc.stderr)
    assert f"model /models/not-there is neither on a volume nor in image {vllm_image}" in r["detail"], r["detail"]
    assert containers(ssh_env, host) == []
