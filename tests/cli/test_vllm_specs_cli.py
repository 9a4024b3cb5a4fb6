"""The shipped vLLM specs over real sshd, on sandbox hosts that carry a real vLLM release's files
(0.16 and 0.32, their source archives' .py files and metadata, beside SGLang in a venv): patch,
patch again (unchanged), --check (no-op, exit 0), unpatch (the release's bytes back); the audit;
status and reconcile after an upgrade to 0.18, which fixed Kimi-K2.5 upstream."""

from __future__ import annotations

import shutil

import pytest

from tests.cli.helpers import run, run_json

K25 = "model_executor/models/kimi_k25.py"
SPECULATIVE = "config/speculative.py"
KIMI_VL = "model_executor/models/kimi_vl.py"


@pytest.fixture(scope="module")
def v016(sandbox_factory):
    host = sandbox_factory.host("v016", sglang="0.5.9", layout="venv", vllm="0.16.0")
    yield host
    sandbox_factory.remove(host)


@pytest.fixture(scope="module")
def v032(sandbox_factory):
    host = sandbox_factory.host("v032", sglang="0.5.9", layout="venv", vllm="0.32.0")
    yield host
    sandbox_factory.remove(host)


def vllm_file(host, rel: str):
    return host.hostpath(f"{host.site_packages}/vllm/{rel}")


def rows(doc) -> dict:
    return {r["data"]["spec"]: r for r in doc["hosts"]}


def test_kimi_k25_on_016_both_halves_patched_checked_and_unpatched(v016, ssh_env):
    host = v016
    host.reset()
    before = {rel: vllm_file(host, rel).read_bytes() for rel in (K25, SPECULATIVE)}
    books = ["--playbook", "kimi-k25-eagle3-vllm", "--playbook", "kimi-k25-allow-list-vllm"]

    proc, doc = run_json("patch", *ssh_env.cli_args, "--host", host.name, *books)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    got = rows(doc)
    assert got["kimi-k25-eagle3-vllm"]["verdict"] == "patched", got["kimi-k25-eagle3-vllm"]["detail"]
    assert got["kimi-k25-eagle3-vllm"]["added"] == ["supports_eagle3", "has_own_lm_head", "has_own_embed_tokens",
                                                   "set_aux_hidden_state_layers", "get_eagle3_aux_hidden_state_layers"]
    assert got["kimi-k25-allow-list-vllm"]["verdict"] == "patched"
    assert all(r["version"] == "0.16.0" and r["install"].endswith("/vllm") for r in got.values())
    patched = {rel: vllm_file(host, rel).read_bytes() for rel in (K25, SPECULATIVE)}
    assert b'            "kimi_k2",\n' in patched[SPECULATIVE]
    assert b"eagle3_target_supported = [" in patched[SPECULATIVE]

    again = run("patch", *ssh_env.cli_args, "--host", host.name, *books, "--check")
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("  unchanged  ") == 2, again.stdout
    assert {rel: vllm_file(host, rel).read_bytes() for rel in (K25, SPECULATIVE)} == patched

    _, status = run_json("status", *ssh_env.cli_args, "--host", host.name, *books)
    assert {r["data"]["spec"]: r["data"]["patch"] for r in status["hosts"]} == \
        {"kimi-k25-eagle3-vllm": "patched", "kimi-k25-allow-list-vllm": "patched"}, status

    gone = run("unpatch", *ssh_env.cli_args, "--host", host.name, *books, check_rc=0)
    assert gone.stdout.count("  unpatched  ") == 2, gone.stdout
    assert {rel: vllm_file(host, rel).read_bytes() for rel in (K25, SPECULATIVE)} == before


def vllm_inventory(ssh_env, host, tmp_path):
    """The sandbox's inventory for `host`, its server's profile the shipped vLLM playbook (the engine
    reconcile judges the host's specs by)."""
    import yaml

    doc = yaml.safe_load(ssh_env.inventory(tmp_path / "sandbox.yaml", [host]).read_text())
    doc["hosts"][host.name]["profile"] = "kimi-k25-eagle3-vllm"
    path = tmp_path / "vllm-inventory.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_an_upgrade_to_018_makes_kimi_k25_native_and_reconcile_takes_the_edit_out_cleanly(v016, ssh_env, tmp_path):
    from provision.sandbox.vllm_sources import package_dir

    host = v016
    host.reset()
    books = ["--playbook", "kimi-k25-eagle3-vllm", "--playbook", "kimi-k25-allow-list-vllm",
             "-i", str(vllm_inventory(ssh_env, host, tmp_path))]
    run("patch", *ssh_env.cli_args, "--host", host.name, *books, check_rc=0)
    # reconcile on 0.16 finds both edits in place
    proc, doc = run_json("reconcile", *ssh_env.cli_args, "--host", host.name, *books)
    assert proc.returncode == 0 and {r["verdict"] for r in doc["hosts"]} == {"unchanged"}, [(r["verdict"], r["detail"]) for r in doc["hosts"]]
    # what `pip install -U vllm==0.18.0` does to the files: the release's own replace ours
    site = host.hostpath(host.site_packages)
    shutil.rmtree(site / "vllm")
    shutil.rmtree(site / "vllm-0.16.0.dist-info")
    new = package_dir("0.18.0")
    shutil.copytree(new, site / "vllm", symlinks=True)
    shutil.copytree(new.parent / "vllm-0.18.0.dist-info", site / "vllm-0.18.0.dist-info")
    try:
        _, status = run_json("status", *ssh_env.cli_args, "--host", host.name, *books)
        assert {r["data"]["spec"]: r["data"]["patch"] for r in status["hosts"]} == \
            {"kimi-k25-eagle3-vllm": "native", "kimi-k25-allow-list-vllm": "native"}, status
        proc, doc = run_json("reconcile", *ssh_env.cli_args, "--host", host.name, *books)
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        assert {r["verdict"] for r in doc["hosts"]} == {"native"}, doc
        assert vllm_file(host, K25).read_bytes() == (new / K25).read_bytes()
        assert b"provision managed block" not in vllm_file(host, SPECULATIVE).read_bytes()
    finally:
        shutil.rmtree(site / "vllm")
        shutil.rmtree(site / "vllm-0.18.0.dist-info")
        host.reset()


def test_kimi_vl_on_032_patched_audited_and_the_allow_list_not_applicable(v032, ssh_env):
    host = v032
    host.reset()
    before = vllm_file(host, KIMI_VL).read_bytes()

    proc, audit = run_json("audit", *ssh_env.cli_args, "--host", host.name, "--engine", "vllm")
    assert proc.returncode == 6, (proc.stdout, proc.stderr)  # fixable gaps no spec covers
    gaps = {g["class"]: g for g in audit["hosts"][0]["data"]["gaps"]}
    assert gaps["KimiVLForConditionalGeneration"]["verdict"] == "fixable"
    assert gaps["KimiVLForConditionalGeneration"]["covered_by"] == "kimi-vl-eagle3-vllm"
    assert "KimiK25ForConditionalGeneration" not in gaps
    assert "Qwen2VLForConditionalGeneration" in audit["hosts"][0]["data"]["uncovered_fixable"]

    books = ["--playbook", "kimi-vl-eagle3-vllm", "--playbook", "kimi-vl-proposer-vllm",
             "--playbook", "kimi-k25-eagle3-vllm", "--playbook", "kimi-k25-allow-list-vllm"]
    proc, doc = run_json("patch", *ssh_env.cli_args, "--host", host.name, *books)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert {s: r["verdict"] for s, r in rows(doc).items()} == {
        "kimi-vl-eagle3-vllm": "patched", "kimi-vl-proposer-vllm": "patched",
        "kimi-k25-eagle3-vllm": "native", "kimi-k25-allow-list-vllm": "not-applicable"}, doc
    assert "get_eagle3_default_aux_hidden_state_layers" in rows(doc)["kimi-vl-eagle3-vllm"]["added"]

    _, after = run_json("audit", *ssh_env.cli_args, "--host", host.name, "--engine", "vllm")
    gaps = {g["class"]: g for g in after["hosts"][0]["data"]["gaps"]}
    assert "KimiVLForConditionalGeneration" not in gaps or gaps["KimiVLForConditionalGeneration"]["patch_state"] == "patched"

    run("unpatch", *ssh_env.cli_args, "--host", host.name, *books, check_rc=0)
    assert vllm_file(host, KIMI_VL).read_bytes() == before


# ---------------------------------------------------------------- preflight refuses in seconds

MODEL = "/data/models/Kimi-K2.5"      # the sandbox's stand-in weights (real headers, tiny tensors)
DRAFTER = "/data/models/Kimi-K25-eagle3"


def refused(tmp_path, ssh_env, host, config: dict, *extra):
    """A user's own vLLM profile for a model whose config.json is `config`: launched, it must be refused
    by preflight (exit 3) with no server process; returns the reason."""
    import json

    name = f"pf-{host.name}"
    host.run(f"rm -rf /data/models/{name} && cp -r {MODEL} /data/models/{name}")
    host.hostpath(f"/data/models/{name}/config.json").write_text(json.dumps(config))
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts)},
           "hosts": {host.name: {"address": host.address, "port": host.port}}}
    (tmp_path / "inv.yaml").write_text(json.dumps(inv))
    profile = {"name": "my-vllm", "engine": "vllm", "launch": {"args": {
        "model": f"/data/models/{name}", "tensor-parallel-size": 2, "host": "127.0.0.1", "port": 30000,
        "speculative-config": {"method": "eagle3", "model": DRAFTER, "num_speculative_tokens": 3}}}}
    (tmp_path / "my-vllm.yaml").write_text(json.dumps(profile))
    proc, doc = run_json("launch", "-i", str(tmp_path / "inv.yaml"), "--playbook", str(tmp_path / "my-vllm.yaml"),
                         "--poll", "0.5", "--deadline", "30", *extra, timeout=240)
    r = doc["hosts"][0]
    assert proc.returncode == 3 and r["verdict"] == "refused", (r, proc.stderr)
    assert "vllm.entrypoints" not in host.run("ps -eo args", check=False).stdout
    return r["detail"]


def test_kimi_vl_without_the_interface_is_refused_naming_the_spec_and_passes_it_once_patched(v032, ssh_env, tmp_path):
    host = v032
    host.reset()
    config = {"architectures": ["KimiVLForConditionalGeneration"], "model_type": "kimi_vl",
              "text_config": {"model_type": "deepseek_v2", "num_hidden_layers": 4}}
    detail = refused(tmp_path, ssh_env, host, config)
    assert "KimiVLForConditionalGeneration lacks the EAGLE-3 interface" in detail, detail
    assert "get_eagle3_default_aux_hidden_state_layers" in detail
    assert "provision patch --playbook kimi-vl-eagle3-vllm" in detail
    assert "allow-list" not in detail  # 0.32 has none

    run("patch", *ssh_env.cli_args, "--host", host.name, "--playbook", "kimi-vl-eagle3-vllm", check_rc=0)
    try:
        inv = str(tmp_path / "inv.yaml")
        proc, doc = run_json("launch", "-i", inv, "--playbook", str(tmp_path / "my-vllm.yaml"), "--poll", "0.5",
                             "--deadline", "30", timeout=240)
        assert "lacks the EAGLE-3 interface" not in doc["hosts"][0]["detail"], doc["hosts"][0]
    finally:
        run("stop", "-i", inv, "--host", host.name, timeout=120)
        host.reset()


def test_kimi_k25_on_016_is_refused_for_the_interface_and_the_allow_list_naming_both_specs(v016, ssh_env, tmp_path):
    host = v016
    host.reset()
    config = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
              "text_config": {"model_type": "kimi_k2", "num_hidden_layers": 4}}
    detail = refused(tmp_path, ssh_env, host, config)
    assert "KimiK25ForConditionalGeneration lacks the EAGLE-3 interface" in detail, detail
    assert "provision patch --playbook kimi-k25-eagle3-vllm" in detail
    assert "model type kimi_k2 is not on vLLM 0.16.0's EAGLE-3 allow-list (eagle3_target_supported" in detail
    assert "provision patch --playbook kimi-k25-allow-list-vllm" in detail

    # both halves patched: vLLM's checks would pass, but what the delegation forwards to is not there
    # in 0.16 (DeepseekV2ForCausalLM gained the interface in 0.18): still refused, saying so
    books = ["--playbook", "kimi-k25-eagle3-vllm", "--playbook", "kimi-k25-allow-list-vllm"]
    run("patch", *ssh_env.cli_args, "--host", host.name, *books, check_rc=0)
    try:
        detail = refused(tmp_path, ssh_env, host, config)
        assert "allow-list" not in detail and "lacks the EAGLE-3 interface" not in detail, detail
        assert ("KimiK25ForConditionalGeneration delegates the EAGLE-3 interface to self.language_model "
                "(DeepseekV2ForCausalLM), which lacks get_eagle3_aux_hidden_state_layers, set_aux_hidden_state_layers "
                "in vLLM 0.16.0") in detail, detail
    finally:
        run("unpatch", *ssh_env.cli_args, "--host", host.name, *books, check_rc=0)


def test_spec_new_writes_a_vllm_spec_that_patches_the_gap_it_was_written_for(v032, ssh_env, tmp_path):
    host = v032
    host.reset()
    rel = "model_executor/models/qwen2_vl.py"
    before = vllm_file(host, rel).read_bytes()
    proc = run("spec", "new", "Qwen2VLForConditionalGeneration", "--engine", "vllm", *ssh_env.cli_args,
               "--host", host.name, check_rc=0)
    assert "written by `provision spec new` from vLLM 0.32.0" in proc.stdout
    # 0.32's proposer reads image_token_index of Qwen2-VL too (it names no branch for it): said, with how to fix
    assert "reads config.image_token_index of Qwen2VLForConditionalGeneration" in proc.stderr, proc.stderr
    book = tmp_path / "qwen2-vl-eagle3-vllm.yaml"
    book.write_text(proc.stdout)
    proc, doc = run_json("patch", *ssh_env.cli_args, "--host", host.name, "--playbook", str(book))
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "patched", doc
    assert doc["hosts"][0]["file"].endswith(rel)
    _, audit = run_json("audit", *ssh_env.cli_args, "--host", host.name, "--engine", "vllm", "--playbook", str(book))
    gaps = {g["class"]: g for g in audit["hosts"][0]["data"]["gaps"]}
    assert "Qwen2VLForConditionalGeneration" not in audit["hosts"][0]["data"]["uncovered_fixable"]
    assert gaps.get("Qwen2VLForConditionalGeneration", {"patch_state": "patched"})["patch_state"] == "patched"
    run("unpatch", *ssh_env.cli_args, "--host", host.name, "--playbook", str(book), check_rc=0)
    assert vllm_file(host, rel).read_bytes() == before


def test_patch_overlay_on_032_stages_the_plugin_status_and_reconcile_count_it_and_unpatch_overlay_removes_it(
        v032, ssh_env, tmp_path):
    """vLLM's overlay over real sshd, the release's files never written: `patch --overlay` with both
    Qwen2-Audio specs stages a general plugin (checked statically: this host's python has no torch)
    and prints the lines a user's own unit needs; status counts it per spec (exit 0); reconcile finds
    it current; unpatch --overlay of one spec keeps the other's; of the last, takes it all away."""
    host = v032
    host.reset()
    q2a, proposer = "model_executor/models/qwen2_audio.py", "v1/spec_decode/llm_base_proposer.py"
    before = {rel: vllm_file(host, rel).read_bytes() for rel in (q2a, proposer)}
    cli = [*ssh_env.cli_args, "--host", host.name]
    books = ["--playbook", "qwen2-audio-eagle3-vllm", "--playbook", "qwen2-audio-proposer-vllm"]

    proc, doc = run_json("patch", *cli, *books, "--overlay")
    row = doc["hosts"][0]
    assert proc.returncode == 0 and row["verdict"] == "staged", (row, proc.stderr)
    root = row["data"]["overlay"]["root"]
    assert row["data"]["env_lines"] == ["PROVISION_OVERLAY=provision_overlay", f"PYTHONPATH={root}"], row["data"]
    assert "compiled, not imported (--verify-import" in " ".join(row["notes"]), row["notes"]  # nothing runs unasked
    assert host.hostpath(f"{root}/provision_overlay-0.1.dist-info/entry_points.txt").is_file()
    assert {p.name for p in host.hostpath(f"{root}/provision_overlay").glob("*.py")} == \
        {"__init__.py", "qwen2_audio_eagle3_vllm.py", "qwen2_audio_proposer_vllm.py"}
    assert {rel: vllm_file(host, rel).read_bytes() for rel in (q2a, proposer)} == before

    proc, doc = run_json("status", *cli, *books)
    assert proc.returncode == 0 and {r["data"]["spec"]: r["verdict"] for r in doc["hosts"]} == \
        {"qwen2-audio-eagle3-vllm": "overlay", "qwen2-audio-proposer-vllm": "overlay"}, doc
    assert all(r["version"] == "0.32.0" for r in doc["hosts"])
    inv = ["-i", str(vllm_inventory(ssh_env, host, tmp_path))]
    proc, doc = run_json("reconcile", *cli, *books, *inv)
    assert proc.returncode == 0 and {r["verdict"] for r in doc["hosts"]} == {"unchanged"}, \
        [(r["verdict"], r["detail"]) for r in doc["hosts"]]
    # a module someone edited by hand: status calls the overlay stale, reconcile writes it back, both modules kept
    module = host.hostpath(f"{root}/provision_overlay/qwen2_audio_proposer_vllm.py")
    good = module.read_text()
    module.write_text(good.replace("audio_token_index", "image_token_index"))
    proc, doc = run_json("status", *cli, *books)
    assert proc.returncode == 4 and any("differs from the spec" in n for r in doc["hosts"] for n in r["notes"]), doc
    proc, doc = run_json("reconcile", *cli, *books, *inv)
    assert proc.returncode == 0 and "staged" in {r["verdict"] for r in doc["hosts"]}, \
        [(r["verdict"], r["detail"]) for r in doc["hosts"]]
    assert module.read_text() == good
    assert {p.name for p in host.hostpath(f"{root}/provision_overlay").glob("*.py")} == \
        {"__init__.py", "qwen2_audio_eagle3_vllm.py", "qwen2_audio_proposer_vllm.py"}

    proc = run("unpatch", *cli, "--playbook", "qwen2-audio-proposer-vllm", "--overlay")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert {p.name for p in host.hostpath(f"{root}/provision_overlay").glob("*.py")} == \
        {"__init__.py", "qwen2_audio_eagle3_vllm.py"}
    _, doc = run_json("status", *cli, *books)
    assert {r["data"]["spec"]: r["verdict"] for r in doc["hosts"]} == \
        {"qwen2-audio-eagle3-vllm": "overlay", "qwen2-audio-proposer-vllm": "missing"}, doc
    run("unpatch", *cli, "--playbook", "qwen2-audio-eagle3-vllm", "--overlay", check_rc=0)
    assert not host.hostpath(root).exists()
    assert {rel: vllm_file(host, rel).read_bytes() for rel in (q2a, proposer)} == before


def test_audit_and_spec_new_use_the_hosts_one_engine_and_refuse_a_host_with_two_naming_both(v032, ssh_env):
    """issue 63: on a host whose only engine is vLLM, `audit` and `spec new` answered `no SGLang install
    found` (exit 3 and 2) and never mentioned the vLLM there. Without --engine, the host's one engine is
    read; a host with both is refused, naming each install and the option that picks one."""
    host = v032
    host.reset()
    sglang = host.hostpath(host.site_packages) / "sglang"
    moved = sglang.with_name("sglang-moved-away")
    try:
        proc, doc = run_json("audit", *ssh_env.cli_args, "--host", host.name)
        row = doc["hosts"][0]
        assert proc.returncode == 3 and row["verdict"] == "refused", row
        assert "this host has SGLang 0.5.9 at" in row["detail"] and "vLLM 0.32.0 at" in row["detail"], row
        assert "--engine sglang or --engine vllm" in row["detail"], row
        proc = run("spec", "new", "Qwen2VLForConditionalGeneration", *ssh_env.cli_args, "--host", host.name)
        assert proc.returncode == 2 and "--engine sglang or --engine vllm" in proc.stderr, proc.stderr
        sglang.rename(moved)  # now vLLM is the host's one engine
        proc, doc = run_json("audit", *ssh_env.cli_args, "--host", host.name)
        row = doc["hosts"][0]
        assert row["data"]["engine"] == "vllm" and row["version"] == "0.32.0", row
        assert "Qwen2VLForConditionalGeneration" in row["data"]["uncovered_fixable"], row
        proc = run("spec", "new", "Qwen2VLForConditionalGeneration", *ssh_env.cli_args, "--host", host.name, check_rc=0)
        assert "written by `provision spec new` from vLLM 0.32.0" in proc.stdout
        # status with no --playbook judges the host's vLLM with the vLLM counterpart of the default playbook
        proc, doc = run_json("status", *ssh_env.cli_args, "--host", host.name)
        row = doc["hosts"][0]
        assert row["verdict"] != "error" and row["data"]["engine"] == "vllm" and row["version"] == "0.32.0", row
        assert row["data"]["spec"] == "kimi-k25-eagle3-vllm", row
        assert "this host's engine is vLLM" in row["notes"][0], row["notes"]
    finally:
        if moved.exists():
            moved.rename(sglang)
        host.reset()


def test_qwen2_audio_with_the_interface_alone_is_refused_naming_the_proposer_spec(v032, ssh_env, tmp_path):
    """issue 64: patched with the interface spec alone, a Qwen2-Audio EAGLE-3 launch passed preflight and
    the real 0.32 server died in the drafter's load (`'Qwen2AudioConfig' object has no attribute
    'image_token_index'`), after the weights. Preflight refuses it in seconds now, naming the proposer
    spec; with it in place that reason is gone."""
    host = v032
    host.reset()
    config = {"architectures": ["Qwen2AudioForConditionalGeneration"], "model_type": "qwen2_audio",
              "audio_token_index": 151646, "text_config": {"model_type": "qwen2", "num_hidden_layers": 4}}
    # `spec new` writes the interface half and says which shipped spec is the other
    proc = run("spec", "new", "Qwen2AudioForConditionalGeneration", "--engine", "vllm", *ssh_env.cli_args,
               "--host", host.name, check_rc=0)
    assert "name: qwen2-audio-eagle3-vllm" in proc.stdout, proc.stdout
    assert ("--playbook qwen2-audio-eagle3-vllm --playbook qwen2-audio-proposer-vllm" in proc.stderr), proc.stderr
    run("patch", *ssh_env.cli_args, "--host", host.name, "--playbook", "qwen2-audio-eagle3-vllm", check_rc=0)
    try:
        detail = refused(tmp_path, ssh_env, host, config)
        assert "reads config.image_token_index of Qwen2AudioForConditionalGeneration" in detail, detail
        assert "provision patch --playbook qwen2-audio-proposer-vllm" in detail, detail
        run("patch", *ssh_env.cli_args, "--host", host.name, "--playbook", "qwen2-audio-proposer-vllm", check_rc=0)
        inv = str(tmp_path / "inv.yaml")
        proc, doc = run_json("launch", "-i", inv, "--playbook", str(tmp_path / "my-vllm.yaml"), "--poll", "0.5",
                             "--deadline", "30", timeout=240)
        assert "image_token_index" not in doc["hosts"][0]["detail"], doc["hosts"][0]
    finally:
        run("stop", "-i", str(tmp_path / "inv.yaml"), "--host", host.name, timeout=120)
        host.reset()


def test_specs_of_sglang_and_vllm_in_separate_venvs_are_each_judged_against_their_own_install(v032, ssh_env):
    """issue 64: on a host whose SGLang and vLLM live in separate venvs (as most hosts that run both
    keep them), a shipped vLLM spec was judged against the SGLang install ("vllm is not installed beside
    this SGLang": not-applicable, nothing patched), and a patch of an SGLang and a vLLM spec together went
    to one install. Each spec is judged, patched and unpatched against its own engine's install."""
    host = v032
    host.reset()
    site = host.hostpath(host.site_packages)
    own = "/opt/vllm-own"
    host.run(f"rm -rf {own} && python3 -m venv --without-pip {own}")
    own_site = next(host.hostpath(own).glob("lib/python3*/site-packages"))
    moved = [p for p in site.iterdir() if p.name == "vllm" or (p.name.startswith("vllm-") and p.name.endswith(".dist-info"))]
    assert len(moved) == 2, moved
    for p in moved:
        p.rename(own_site / p.name)
    kimi_vl = own_site / "vllm" / KIMI_VL
    sglang_file = site / "sglang/srt/models/kimi_k25.py"
    vl_before, sg_before = kimi_vl.read_bytes(), sglang_file.read_bytes()
    books = ["--playbook", "kimi-k25-eagle3", "--playbook", "kimi-vl-eagle3-vllm"]
    try:
        proc, doc = run_json("patch", *ssh_env.cli_args, "--host", host.name, *books)
        got = rows(doc)
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        assert {s: r["verdict"] for s, r in got.items()} == {
            "kimi-k25-eagle3": "patched", "kimi-vl-eagle3-vllm": "patched"}, doc
        assert got["kimi-vl-eagle3-vllm"]["version"] == "0.32.0" and got["kimi-k25-eagle3"]["version"] == "0.5.9", doc
        assert kimi_vl.read_bytes() != vl_before and sglang_file.read_bytes() != sg_before
        proc, doc = run_json("status", *ssh_env.cli_args, "--host", host.name, *books)
        got = rows(doc)
        assert {s: (r["verdict"], r["version"]) for s, r in got.items()} == {
            "kimi-k25-eagle3": ("patched", "0.5.9"), "kimi-vl-eagle3-vllm": ("patched", "0.32.0")}, doc
        run("unpatch", *ssh_env.cli_args, "--host", host.name, *books, check_rc=0)
        assert kimi_vl.read_bytes() == vl_before and sglang_file.read_bytes() == sg_before
    finally:
        for p in moved:
            if (own_site / p.name).exists():
                (own_site / p.name).rename(p)
        host.run(f"rm -rf {own}")
        host.reset()
