"""Launch knows the model (issue 19), over real sshd hosts with the real SGLang 0.5.9 wheel: each
launch that could only fail after the weight load is refused by preflight, before any server
process exists.

The stand-in's load is made long (PROVISION_STANDIN_LOAD_SECONDS=600) and each launch has a short
deadline: a server that started anyway would still be loading when the launch gives up, so a
`refused` verdict is one that came before the load could end. The stand-in appends to
PROVISION_STANDIN_STARTED_FILE the moment its process starts: that file must not exist.
"""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import run, run_json

MARKER = "/root/standin-started"
MODEL = "/data/models/Kimi-K2.5"
DRAFTER = "/data/models/Kimi-K25-eagle3"


@pytest.fixture(scope="module")
def phost(sandbox_factory):
    host = sandbox_factory.host("pflt1", sglang="0.5.9", layout="venv")
    yield host
    sandbox_factory.remove(host)


@pytest.fixture
def host(phost):
    phost.reset()
    phost.run(f"rm -rf {MARKER} /data/models/pf-* /var/lib/provision/overlay", check=False)
    yield phost
    phost.run("rm -rf /data/models/pf-*", check=False)


def inventory(tmp_path, ssh_env, host, args=None, load="600"):
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts),
                        "env": {"PROVISION_STANDIN_LOAD_SECONDS": load, "PROVISION_STANDIN_STARTED_FILE": MARKER}},
           "hosts": {host.name: {"address": host.address, "port": host.port, **({"args": args} if args else {})}}}
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inv))  # JSON is YAML
    return str(path)


def launch_only_profile(tmp_path, **args) -> str:
    """A user's own profile for their model paths: `launch:` only, no `patch:` section."""
    a = {"model-path": MODEL, "trust-remote-code": True, "tp-size": 2, "speculative-algorithm": "EAGLE3",
         "speculative-draft-model-path": DRAFTER, "speculative-num-steps": 3, "speculative-eagle-topk": 1,
         "speculative-num-draft-tokens": 4, "host": "127.0.0.1", "port": 30000}
    a.update(args)
    path = tmp_path / "my-kimi.yaml"
    path.write_text(json.dumps({"name": "my-kimi", "launch": {"args": a}}))
    return str(path)


def never_started(host) -> bool:
    return host.run(f"test -e {MARKER}", check=False).returncode != 0


def refused(tmp_path, ssh_env, host, *extra, profile=None):
    inv = inventory(tmp_path, ssh_env, host)
    proc, doc = run_json("launch", "-i", inv, "--playbook", profile or launch_only_profile(tmp_path), "--poll", "0.5",
                         "--deadline", "30", *extra, timeout=240)
    r = doc["hosts"][0]
    assert proc.returncode == 3 and r["verdict"] == "refused", (r, proc.stderr)
    assert never_started(host), "a refused launch must not start a server process"
    return r["detail"]


def test_launch_only_profile_unpatched_059_names_the_shipped_spec(tmp_path, ssh_env, host):
    detail = refused(tmp_path, ssh_env, host)
    assert "KimiK25ForConditionalGeneration lacks set_eagle3_layers_to_capture, get_embed_and_head" in detail
    assert "provision patch --playbook kimi-k25-eagle3" in detail


def test_each_reason_is_one_line(tmp_path, ssh_env, host):
    host.run(f"cp -r {MODEL} /data/models/pf-trunc2 && : > /data/models/pf-trunc2/model-00002-of-00064.safetensors")
    inv = inventory(tmp_path, ssh_env, host)
    prof = launch_only_profile(tmp_path, **{"model-path": "/data/models/pf-trunc2"})
    proc = run("launch", "-i", inv, "--playbook", prof, "--arg", "speculative-num-stpes=3", "--poll", "0.5",
               "--deadline", "30", timeout=240)
    assert proc.returncode == 3
    fails = [l for l in (proc.stdout + proc.stderr).splitlines() if "preflight fail: " in l]
    assert len(fails) == 3, proc.stdout + proc.stderr
    assert any("did you mean --speculative-num-steps" in l for l in fails)
    assert any("provision patch --playbook kimi-k25-eagle3" in l for l in fails)
    assert any("1 of 64 shards are not whole" in l for l in fails)
    assert never_started(host)


def test_launch_only_profile_with_patch_applies_the_covering_spec_and_is_ready(tmp_path, ssh_env, host):
    inv = inventory(tmp_path, ssh_env, host, load="2")
    proc, doc = run_json("launch", "-i", inv, "--playbook", launch_only_profile(tmp_path), "--patch", "--poll", "0.5",
                         timeout=240)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", doc["hosts"][0]["detail"] + proc.stderr
    assert "patch: patched (kimi-k25-eagle3, which covers the model's class)" in proc.stderr
    run("stop", "-i", inv, check_rc=0)


def test_launch_only_profile_with_overlay_carries_the_shipped_spec(tmp_path, ssh_env, host):
    inv = inventory(tmp_path, ssh_env, host, load="2")
    proc, doc = run_json("launch", "-i", inv, "--playbook", launch_only_profile(tmp_path), "--overlay", "--poll",
                         "0.5", timeout=240)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", doc["hosts"][0]["detail"] + proc.stderr
    assert "the overlay carries spec kimi-k25-eagle3" not in doc["hosts"][0]["detail"]
    assert "preflight ok: overlay" in proc.stderr and "KimiK25ForConditionalGeneration" in proc.stderr
    run("stop", "-i", inv, check_rc=0)


def test_misspelt_flag_is_refused_with_the_name_it_meant(tmp_path, ssh_env, host):
    detail = refused(tmp_path, ssh_env, host, "--patch", "--arg", "speculative-num-stpes=3")
    assert "--speculative-num-stpes is not a flag of SGLang 0.5.9: did you mean --speculative-num-steps" in detail
    assert "speculative-num-stpes" in detail.split("did you mean")[0]


def test_restart_into_a_misspelt_flag_leaves_the_old_server_running(tmp_path, ssh_env, host):
    inv = inventory(tmp_path, ssh_env, host, load="2")
    prof = launch_only_profile(tmp_path)
    proc, doc = run_json("launch", "-i", inv, "--playbook", prof, "--patch", "--poll", "0.5", timeout=240)
    assert doc["hosts"][0]["verdict"] == "ready", doc
    pid = doc["hosts"][0]["data"]["pid"]
    started = host.run(f"cat {MARKER}").stdout.count("\n")
    proc2, doc2 = run_json("launch", "-i", inv, "--playbook", prof, "--restart", "--arg", "speculative-num-stpes=3",
                           "--poll", "0.5", timeout=240)
    assert proc2.returncode == 3 and doc2["hosts"][0]["verdict"] == "refused", doc2
    assert "did you mean --speculative-num-steps" in doc2["hosts"][0]["detail"]
    assert host.run(f"cat {MARKER}").stdout.count("\n") == started, "no new server process"
    st = run("status", "-i", inv)
    assert "health 200" in st.stdout and str(pid) in st.stdout, st.stdout
    run("stop", "-i", inv, "--playbook", prof, check_rc=0)


def test_drafter_architecture_the_release_lacks_is_refused(tmp_path, ssh_env, host):
    host.run(f"cp -r {DRAFTER} /data/models/pf-mla-eagle3 && printf '%s' "
             "'{\"architectures\": [\"Eagle3DeepseekV2ForCausalLM\"], \"model_type\": \"deepseek_v2\"}' "
             "> /data/models/pf-mla-eagle3/config.json")
    detail = refused(tmp_path, ssh_env, host, "--patch", "--arg", "speculative-draft-model-path=/data/models/pf-mla-eagle3")
    assert "drafter architecture Eagle3DeepseekV2ForCausalLM is not registered in SGLang 0.5.9" in detail


def test_wrapper_without_eagle3_methods_and_no_spec_is_refused(tmp_path, ssh_env, host):
    host.run(f"cp -r {MODEL} /data/models/pf-gemma3 && printf '%s' "
             "'{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": \"gemma3\"}' "
             "> /data/models/pf-gemma3/config.json")
    detail = refused(tmp_path, ssh_env, host, "--overlay",
                     profile=launch_only_profile(tmp_path, **{"model-path": "/data/models/pf-gemma3"}))
    assert "Gemma3ForConditionalGeneration lacks set_eagle3_layers_to_capture" in detail
    assert "provision spec new Gemma3ForConditionalGeneration" in detail


def test_truncated_shard_is_refused(tmp_path, ssh_env, host):
    host.run(f"cp -r {MODEL} /data/models/pf-trunc && truncate -s -7 "
             "/data/models/pf-trunc/model-00017-of-00064.safetensors && : > "
             "/data/models/pf-trunc/model-00033-of-00064.safetensors")
    detail = refused(tmp_path, ssh_env, host, "--patch",
                     profile=launch_only_profile(tmp_path, **{"model-path": "/data/models/pf-trunc"}))
    assert "2 of 64 shards are not whole" in detail
    assert "model-00017-of-00064.safetensors is" in detail and "truncated copy" in detail
    assert "model-00033-of-00064.safetensors is not a whole safetensors file" in detail


def test_a_drafter_that_captures_no_layers_needs_only_get_embed_and_head(tmp_path, ssh_env, host):
    """issue 43 item 1: Glm4ForCausalLM (SGLang 0.5.9) has get_embed_and_head and lacks
    set_eagle3_layers_to_capture. With a drafter whose eagle_config says use_aux_hidden_state: false,
    SGLang never calls the latter: the launch proceeds. With the stock drafter it is refused."""
    host.run(f"cp -r {MODEL} /data/models/pf-glm4 && printf '%s' "
             "'{\"architectures\": [\"Glm4ForCausalLM\"], \"model_type\": \"glm4\"}' > /data/models/pf-glm4/config.json")
    host.run(f"cp -r {DRAFTER} /data/models/pf-noaux && python3 -c 'import json,sys; p=sys.argv[1]; "
             "c=json.load(open(p)); c[\"eagle_config\"]={\"use_aux_hidden_state\": False}; json.dump(c, open(p, \"w\"))' "
             "/data/models/pf-noaux/config.json")
    glm = launch_only_profile(tmp_path, **{"model-path": "/data/models/pf-glm4"})
    detail = refused(tmp_path, ssh_env, host, profile=glm)
    assert "Glm4ForCausalLM lacks set_eagle3_layers_to_capture in SGLang 0.5.9" in detail, detail
    inv = inventory(tmp_path, ssh_env, host, load="2")
    proc, doc = run_json("launch", "-i", inv, "--playbook", glm, "--arg",
                         "speculative-draft-model-path=/data/models/pf-noaux", "--poll", "0.5", timeout=240)
    try:
        r = doc["hosts"][0]
        assert proc.returncode == 0 and r["verdict"] == "ready", (r, proc.stderr[-3000:])
        assert "speculative EAGLE3" in r["detail"], r
    finally:
        run("stop", "-i", inv, "--playbook", glm)
