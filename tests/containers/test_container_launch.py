"""`provision launch / stop / logs / wait` of a server in a container (profile `launch.container`),
over real sshd, with real podman on a sandbox host running the SGLang images."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from tests.cli.helpers import run, run_json

KEY = "sk-canary-container-7f3a9"
TOKEN = "hf_canaryContainerToken42"
SPEC = {"file": "srt/models/kimi_k25.py", "class": "KimiK25ForConditionalGeneration", "delegate": "language_model",
        "methods": [{"name": "set_eagle3_layers_to_capture", "params": "self, layer_ids=None"},
                    {"name": "get_embed_and_head", "params": "self"},
                    {"name": "set_embed_and_head", "params": "self, embed, head"}]}


def playbook(tmp_path, image, env=None, spec=None, **container) -> str:
    doc = {"name": "kimi-k25-eagle3-container", "patch": spec or SPEC,
           "launch": {"container": {"runtime": "podman", "image": image, "network": "host",
                                    "volumes": ["/data:/data:ro"], **container},
                      "args": {"model-path": "/data/models/Kimi-K2.5", "tp-size": 8,
                               "speculative-algorithm": "EAGLE3",
                               "speculative-draft-model-path": "/data/models/Kimi-K25-eagle3",
                               "speculative-num-steps": 3, "speculative-eagle-topk": 1,
                               "speculative-num-draft-tokens": 4, "host": "127.0.0.1", "port": 30000},
                      "env": {"PROVISION_STANDIN_LOAD_SECONDS": "2", **(env or {})}}}
    path = tmp_path / "container.yaml"
    path.write_text(json.dumps(doc))
    return str(path)


def inventory(tmp_path, ssh_env, host) -> str:
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts)},
           "hosts": {host.name: {"address": host.address, "port": host.port}}}
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inv))
    return str(path)


def containers(ssh_env, host) -> list[str]:
    """`NAME running|exited|...` for every container on the host."""
    out = ssh_env.ssh(host, "podman ps -a --format '{{.Names}}' | xargs -r podman inspect -f '{{.Name}} {{.State.Status}}'")
    return out.stdout.splitlines()


def http_status(host, path: str, key: str | None = None) -> int:
    hdr = f", headers={{'Authorization': 'Bearer {key}'}}" if key else ""
    code = ("import urllib.request, urllib.error\n"
            f"r = urllib.request.Request('http://127.0.0.1:30000{path}'{hdr})\n"
            "try:\n    print(urllib.request.urlopen(r, timeout=10).status)\n"
            "except urllib.error.HTTPError as e:\n    print(e.code)\n")
    return int(host.run(["/usr/bin/python3", "-c", code]).stdout.strip())


def test_container_launch_to_healthy_second_launch_noop_then_stop(tmp_path, ssh_env, podman_host, sglang_images):
    host = podman_host
    pb, inv = playbook(tmp_path, sglang_images["0.5.10"]), inventory(tmp_path, ssh_env, host)
    env = {"PROVISION_API_KEY": KEY, "PROVISION_HF_TOKEN": TOKEN}
    proc, doc = run_json("launch", "-i", inv, "--playbook", pb, "--poll", "0.5", env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = doc["hosts"][0]
    assert r["verdict"] == "ready", r
    assert "speculative EAGLE3" in r["detail"]
    assert r["data"]["progress_seen"] == {"target": 100.0, "draft": 100.0}  # followed through `podman logs`
    assert r["data"]["image"]["version"] == "0.5.10"  # read from inside the image
    assert r["data"]["image"]["install"] == "/sgl-workspace/sglang/python/sglang"
    # 0.5.10's class has the methods itself: no overlay, and launch says so.
    assert "has every method natively: no overlay needed" in proc.stderr
    assert containers(ssh_env, host) == ["sglang-30000 running"]
    cid = ssh_env.ssh(host, "podman inspect -f '{{.Id}}' sglang-30000").stdout.strip()

    # The secret reached the server (it guards /v1/models) only through the mounted 0600 --config file:
    # not in the container's command, environment or labels, not in any process's argv on the host.
    assert http_status(host, "/v1/models") == 401
    assert http_status(host, "/v1/models", KEY) == 200
    inspect = ssh_env.ssh(host, "podman inspect sglang-30000").stdout
    assert KEY not in inspect and TOKEN not in inspect
    # HF_TOKEN likewise: a 0600 token file the hub client reads through HF_TOKEN_PATH.
    assert ssh_env.ssh(host, "podman exec sglang-30000 cat /run/provision-secrets/hf_token").stdout == TOKEN
    assert "HF_TOKEN_PATH=/run/provision-secrets/hf_token" in json.loads(inspect)[0]["Config"]["Env"]
    cfg = json.loads(inspect)[0]
    assert cfg["Config"]["Cmd"][-2:] == ["--config", "/run/provision-secrets/config.yaml"]
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE" not in inspect
    assert [m["Destination"] for m in cfg["Mounts"]] == ["/data", "/run/provision-secrets"] or \
        sorted(m["Destination"] for m in cfg["Mounts"]) == ["/data", "/run/provision-secrets"]
    cmdlines = host.run("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '", check=False).stdout
    assert KEY not in cmdlines and TOKEN not in cmdlines
    mode = host.run("stat -c %a /var/lib/provision/server/container-30000/config.yaml").stdout.strip()
    assert mode == "600"

    # A second launch with the same profile is a no-op: same container, still running.
    proc2, doc2 = run_json("launch", "-i", inv, "--playbook", pb, "--poll", "0.5", env=env, timeout=300)
    assert proc2.returncode == 0, proc2.stdout + proc2.stderr
    assert doc2["hosts"][0]["verdict"] == "running"
    assert "nothing to do" in doc2["hosts"][0]["detail"]
    assert ssh_env.ssh(host, "podman inspect -f '{{.Id}}' sglang-30000").stdout.strip() == cid
    assert "read from the image just now" not in proc2.stderr, proc2.stderr  # cached per image id

    # status: the container, its image, the SGLang version inside, and the image's class (native in 0.5.10).
    proc_s, doc_s = run_json("status", "-i", inv, timeout=120)
    assert proc_s.returncode == 0, proc_s.stdout + proc_s.stderr
    st = doc_s["hosts"][0]
    assert st["verdict"] == "native"
    assert f"container sglang-30000 (podman, id {cid[:12]}, running) image {sglang_images['0.5.10']} with " \
        "SGLang 0.5.10" in st["detail"]
    assert st["data"]["server_state"] == "up"

    # logs: the container's log, the secret redacted (SGLang prints its server_args, api_key included).
    logs = run("logs", "-i", inv, "--playbook", pb, "-n", "400", env=env, check_rc=0).stdout
    assert "The server is fired up and ready to roll!" in logs
    assert KEY not in logs

    # wait re-attaches to the running container; --restart replaces it with a new one.
    proc_w, doc_w = run_json("wait", "-i", inv, "--playbook", pb, "--poll", "0.5", timeout=120)
    assert proc_w.returncode == 0 and doc_w["hosts"][0]["verdict"] == "ready", proc_w.stdout + proc_w.stderr
    proc_r, doc_r = run_json("launch", "-i", inv, "--playbook", pb, "--poll", "0.5", "--restart", env=env,
                             timeout=300)
    assert proc_r.returncode == 0 and doc_r["hosts"][0]["verdict"] == "ready", proc_r.stdout + proc_r.stderr
    assert doc_r["hosts"][0]["data"]["server_change"] == "restarted"
    assert ssh_env.ssh(host, "podman inspect -f '{{.Id}}' sglang-30000").stdout.strip() != cid
    assert containers(ssh_env, host) == ["sglang-30000 running"]

    # stop: RUNTIME stop -t GRACE, then rm: the container is gone, and so are the secret files.
    proc3, doc3 = run_json("stop", "-i", inv, "--playbook", pb, "--grace", "20", timeout=120)
    assert proc3.returncode == 0, proc3.stdout + proc3.stderr
    assert doc3["hosts"][0]["verdict"] == "stopped"
    assert "stopped and removed container sglang-30000" in doc3["hosts"][0]["detail"]
    assert containers(ssh_env, host) == []
    assert host.run("test -e /var/lib/provision/server/container-30000", check=False).returncode != 0


def test_059_image_runs_with_the_overlay_by_default_and_its_files_stay_as_released(tmp_path, ssh_env, podman_host,
                                                                                    sglang_images):
    """0.5.9's image lacks the methods: the overlay (the default fix for containers) is staged from the
    image's own kimi_k25.py, mounted read-only with its two variables, and the server comes up with
    EAGLE-3 on; nothing in the image is edited."""
    from provision.sandbox.wheels import models_file

    host = podman_host
    image = sglang_images["0.5.9"]
    pb, inv = playbook(tmp_path, image), inventory(tmp_path, ssh_env, host)
    proc, doc = run_json("launch", "-i", inv, "--playbook", pb, "--poll", "0.5", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = doc["hosts"][0]
    assert r["verdict"] == "ready", r
    assert "speculative EAGLE3" in r["detail"]
    assert "overlay staged in /var/lib/provision/overlay/" in proc.stderr
    assert "mounted read-only at /run/provision-overlay" in proc.stderr
    assert "import not verifiable here" in proc.stderr  # no torch in the image: checked statically
    cfg = json.loads(ssh_env.ssh(host, "podman inspect sglang-30000").stdout)[0]
    env = dict(e.split("=", 1) for e in cfg["Config"]["Env"])
    assert env["SGLANG_EXTERNAL_MODEL_PACKAGE"] == "provision_overlay"
    assert env["PYTHONPATH"].split(":")[0] == "/run/provision-overlay"
    mount = next(m for m in cfg["Mounts"] if m["Destination"] == "/run/provision-overlay")
    assert mount["Source"].startswith("/var/lib/provision/overlay/") and mount["RW"] is False
    # The server really used the overlay's class: the overlay module defines the three methods.
    overlay_py = host.run(f"cat {mount['Source']}/provision_overlay/kimi_k25_eagle3_container.py").stdout
    for name in ("set_eagle3_layers_to_capture", "get_embed_and_head", "set_embed_and_head"):
        assert f"def {name}(" in overlay_py
    # The image's kimi_k25.py is the released file, byte for byte.
    out = ssh_env.ssh(host, f"podman run --rm --entrypoint sha256sum {image} "
                            "/sgl-workspace/sglang/python/sglang/srt/models/kimi_k25.py", timeout=120)
    assert out.stdout.split()[0] == hashlib.sha256(models_file("0.5.9").read_bytes()).hexdigest()
    st = run_json("status", "-i", inv, timeout=120)[1]["hosts"][0]
    assert st["verdict"] == "overlay", st
    assert "SGLang 0.5.9" in st["detail"] and "fix: overlay" in st["detail"], st["detail"]
    run("stop", "-i", inv, "--playbook", pb, check_rc=0)
    assert containers(ssh_env, host) == []


def test_a_broken_overlay_in_a_container_is_reported_within_seconds_and_the_container_stopped(
        tmp_path, ssh_env, podman_host, sglang_images):
    """A default naming a constant of kimi_k25.py's own module: fine in the edited file, a NameError in
    the overlay's module. Compiled and statically checked it passes (no torch in the image to import
    it), and SGLang's registry skips it at start (`Ignore import error when loading provision_overlay...`):
    that line is a crash of its own, and the container is stopped at once, not after the load."""
    host = podman_host
    broken = dict(SPEC, methods=[dict(SPEC["methods"][0], params="self, layer_ids=None, "
                                      "limit=KIMIV_VT_INFER_MAX_PATCH_NUM")] + SPEC["methods"][1:])
    pb = playbook(tmp_path, sglang_images["0.5.9"], env={"PROVISION_STANDIN_LOAD_SECONDS": "60"}, spec=broken)
    inv = inventory(tmp_path, ssh_env, host)
    t0 = time.monotonic()
    proc, doc = run_json("launch", "-i", inv, "--playbook", pb, "--poll", "0.5", timeout=180)
    took = time.monotonic() - t0
    r = doc["hosts"][0]
    assert proc.returncode == 3 and r["verdict"] == "crashed", proc.stdout + proc.stderr
    assert r["data"]["crash_kind"] == "overlay-import"
    assert "KIMIV_VT_INFER_MAX_PATCH_NUM" in r["detail"]
    assert "the server was stopped at once" in r["detail"]
    assert took < 30, took
    assert containers(ssh_env, host) == []  # stopped and removed


def test_a_crash_in_the_container_is_reported_from_its_log(tmp_path, ssh_env, podman_host, sglang_images):
    """A profile that names its own SGLANG_EXTERNAL_MODEL_PACKAGE: overlay mode refuses (never replaces
    it); forced past preflight without a fix, the server fails as SGLang 0.5.9 does (its registry
    imports the named package first), and launch reports it from `podman logs`."""
    host = podman_host
    pb, inv = playbook(tmp_path, sglang_images["0.5.9"], env={"SGLANG_EXTERNAL_MODEL_PACKAGE": "their_models"}), \
        inventory(tmp_path, ssh_env, host)
    proc, doc = run_json("launch", "-i", inv, "--playbook", pb, "--poll", "0.5", timeout=300)
    assert proc.returncode == 3
    r = doc["hosts"][0]
    assert r["verdict"] == "refused"
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE=their_models" in r["detail"]
    assert containers(ssh_env, host) == []  # nothing was started
    proc, doc = run_json("launch", "-i", inv, "--playbook", pb, "--poll", "0.5", "--force", timeout=300)
    assert proc.returncode == 3
    r = doc["hosts"][0]
    assert r["verdict"] == "crashed", r
    assert "No module named 'their_models'" in r["data"]["log_tail"]
    # The container exited with the server's failure; the next launch replaces it (it is provision's).
    for _ in range(100):
        if containers(ssh_env, host) == ["sglang-30000 exited"]:
            break
        time.sleep(0.1)
    assert containers(ssh_env, host) == ["sglang-30000 exited"]
    assert ssh_env.ssh(host, "podman inspect -f '{{.State.ExitCode}}' sglang-30000").stdout.strip() not in ("", "0")


def test_missing_runtime_is_one_line(tmp_path, ssh_env, podman_host, sglang_images):
    host = podman_host
    pb, inv = playbook(tmp_path, sglang_images["0.5.10"]), inventory(tmp_path, ssh_env, host)
    # podman vanishes from this host only (a bind mount in its own mount namespace).
    host.run("mount --bind /dev/null /usr/bin/podman")
    try:
        proc = run("launch", "-i", inv, "--playbook", pb, "--format", "lines", timeout=120)
    finally:
        host.run("umount /usr/bin/podman")
    assert proc.returncode == 3
    lines = [line for line in proc.stdout.splitlines() if line.startswith(host.name)]
    assert len(lines) == 1, proc.stdout
    assert "podman is not installed on this host" in lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_vllm_playbook_reads_the_images_vllm_and_refuses_an_image_that_has_only_sglang(
        tmp_path, ssh_env, podman_host, sglang_images):
    host = podman_host
    doc = {"name": "vllm-container", "engine": "vllm",
           "launch": {"container": {"runtime": "podman", "image": sglang_images["0.5.10"], "network": "host"},
                      "args": {"model": "/data/models/Kimi-K2.5"}}}
    pb = tmp_path / "vllm.yaml"
    pb.write_text(json.dumps(doc))
    proc, out = run_json("launch", "-i", inventory(tmp_path, ssh_env, host), "--playbook", str(pb), timeout=300)
    r = out["hosts"][0]
    assert proc.returncode == 3 and r["verdict"] == "refused", r  # preflight's refusal (docs/containers.md)
    assert f"image {sglang_images['0.5.10']} has no vLLM that python3 imports" in r["detail"], r["detail"]
    assert containers(ssh_env, host) == [], "nothing was started"


def test_launch_check_on_a_host_without_the_image_says_it_would_pull_it_and_pulls_nothing(
        tmp_path, ssh_env, podman_host, sglang_images):
    """issue 64: `launch --check` asked podman to pull an image the host lacked (a check that changes the
    host, and on an air-gapped host a failed row). It pulls nothing: the row says the pull would come
    first, exit 4 (something would change), and the host's images are as before."""
    host = podman_host
    image = "localhost/provision-not-here:0.5.10"
    pb, inv = playbook(tmp_path, image), inventory(tmp_path, ssh_env, host)
    before = ssh_env.ssh(host, "podman images --format '{{.Repository}}:{{.Tag}}' | sort").stdout
    proc, doc = run_json("launch", "-i", inv, "--playbook", pb, "--check", timeout=120)
    r = doc["hosts"][0]
    assert proc.returncode == 4 and f"would pull image {image} first" in r["detail"], (r, proc.stderr)
    assert "pulled nothing" in r["detail"], r
    assert ssh_env.ssh(host, "podman images --format '{{.Repository}}:{{.Tag}}' | sort").stdout == before
    assert containers(ssh_env, host) == [] or all("running" not in c for c in containers(ssh_env, host))
