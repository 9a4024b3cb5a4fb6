"""EAGLE-3 on a real vLLM server (0.32.0, the CPU build) where it goes wrong and where provision fixes it,
over real sshd: a drafter whose tokens are never accepted, a drafter that does not fit, and a wrapper from
the audit's list (Qwen2AudioForConditionalGeneration) that dies without its specs and drafts with them
(issue 45). A host of its own, so this module and test_realvllm.py run on two workers.
"""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import run
from tests.realvllm.tier import (QWEN2_AUDIO_SPECS, VENV_IN_HOST, bench, gone, launch, playbook, private_vllm,
                                 put_models, record, spec_counters, vllm_pids)

# each test starts a real vLLM (45-90 s alone, past 150 s with the other real-vLLM module and the rest
# of the suite on a 2-core machine) and then works on it: past the default 180 s under load
pytestmark = [pytest.mark.realvllm, pytest.mark.ssh, pytest.mark.timeout(480)]


def test_bench_flags_a_drafter_whose_tokens_are_never_accepted(tmp_path, ssh_env, vhost, vllm_models):
    models = put_models(vhost, vllm_models["rejecting"], "rejecting")
    pb = playbook(tmp_path, models)
    cli = [*ssh_env.cli_args, "--host", vhost.name]
    proc, row, _ = launch(cli, "--playbook", pb)
    try:
        assert row["verdict"] == "ready", (row, proc.stderr[-3000:])
        before = spec_counters(vhost)
        proc, b = bench(cli)
        after = spec_counters(vhost)
        d = {k: after[k] - before[k] for k in after}
        print(f"\nbench, the rejecting drafter: {b['detail']}; /metrics: {d}")
        assert d["drafts"] > 0 and d["accepted_tokens"] == 0, d
        assert proc.returncode == 8 and b["verdict"] == "measured", (b, proc.stderr[-2000:])
        assert (b["accept_length"], b["accept_rate"]) == (1.0, 0.0) and b["flags"] == ["underperforming"], b
        assert "accept length 1.00 < 1.8" in " ".join(b["notes"]), b["notes"]
    finally:
        run("stop", *cli, "--playbook", pb, check_rc=0)


def test_a_drafter_that_does_not_fit_is_reported_with_vllms_own_sentence(tmp_path, ssh_env, vhost, vllm_models):
    models = put_models(vhost, vllm_models["bad"], "bad")
    pb = playbook(tmp_path, models)
    cli = [*ssh_env.cli_args, "--host", vhost.name]
    proc, row, took = launch(cli, "--playbook", pb)
    print(f"\nthe drafter's crash reported after {took:.1f} s")
    assert proc.returncode == 3 and row["verdict"] == "crashed", (row, proc.stderr[-3000:])
    assert "AssertionError: Tried to load weights of size torch.Size([128, 512])" in row["detail"], row["detail"]
    assert row["data"]["phase"] == "crashed" and "draft-weights" in row["data"]["phases_seen"], row["data"]
    assert gone(vhost) == [], "nothing of the crashed server is left running"
    run("stop", *cli, "--playbook", pb)


def test_a_wrapper_without_the_interface_is_refused_and_with_force_dies_with_vllms_own_sentence_and_the_hint(
        tmp_path, ssh_env, vhost, vllm_models):
    """Qwen2AudioForConditionalGeneration (from the audit's list: its Qwen2 text model has SupportsEagle3, the
    wrapper lacks it) with an EAGLE-3 drafter. Preflight refuses it in seconds, starting nothing; past it with
    --force the real server dies with vLLM's own sentence (on 0.32 first the proposer's image_token_index read,
    which Qwen2Audio's config lacks), and launch reports it with what fixes it."""
    models = put_models(vhost, vllm_models["qwen2-audio"], "qwen2-audio")
    pb = playbook(tmp_path, models)
    cli = [*ssh_env.cli_args, "--host", vhost.name]

    proc, row, took = launch(cli, "--playbook", pb)
    print(f"\nrefused by preflight after {took:.1f} s")
    assert proc.returncode == 3 and row["verdict"] == "refused", (row, proc.stderr[-3000:])
    assert "Qwen2AudioForConditionalGeneration lacks the EAGLE-3 interface" in row["detail"], row["detail"]
    assert "provision patch --playbook qwen2-audio-eagle3-vllm" in row["detail"]
    assert vllm_pids(vhost) == [], "a refused launch starts no server process"

    proc, row, took = launch(cli, "--playbook", pb, "--force")
    print(f"the server's own crash reported after {took:.1f} s")
    try:
        assert proc.returncode == 3 and row["verdict"] == "crashed", (row, proc.stderr[-3000:])
        assert "AttributeError: 'Qwen2AudioConfig' object has no attribute 'image_token_index'" in row["detail"], \
            row["detail"]
        assert "hint: spec qwen2-audio-proposer-vllm makes the proposer read Qwen2AudioForConditionalGeneration's " \
            "own image token" in row["detail"], row["detail"]
        assert gone(vhost) == [], "nothing of the crashed server is left running"
    finally:
        run("stop", *cli, "--playbook", pb)


def drafts_all_accepted(host, cli: list) -> None:
    """`bench` on the running Qwen2-Audio server drafts, and /metrics (read around it without provision's
    reader) counts every draft token accepted: the drafter proposes what the zero-norm target picks."""
    before = spec_counters(host)
    _, brow = bench(cli)
    after = spec_counters(host)
    drafts = after["drafts"] - before["drafts"]
    accepted = after["accepted_tokens"] - before["accepted_tokens"]
    print(f"bench: {brow['detail']}; /metrics: {drafts:.0f} drafts, {accepted:.0f} of "
          f"{after['draft_tokens'] - before['draft_tokens']:.0f} draft tokens accepted")
    assert drafts > 0 and brow["verdict"] == "measured", (before, after, brow)
    assert brow["accept_length"] == round(1 + accepted / drafts, 3) == 4.0, (brow, before, after)


def test_with_both_specs_the_wrapper_starts_and_drafts_and_unpatch_gives_the_release_back(
        tmp_path, ssh_env, vhost, vllm_models, vllm_venv):
    """The before/after proof: the same Qwen2-Audio target and drafter the test above saw die start and
    draft once the two shipped specs are patched in (a private, writable copy of the tier's read-only
    vLLM, which the server imports first through PYTHONPATH)."""
    models = put_models(vhost, vllm_models["qwen2-audio"], "qwen2-audio")
    private = private_vllm(vhost, vllm_venv)
    pb = json.loads(open(playbook(tmp_path, models)).read())
    pb["launch"]["env"]["PYTHONPATH"] = private
    pb["launch"]["python"] = f"{VENV_IN_HOST}/bin/python"
    (tmp_path / "q2a.yaml").write_text(json.dumps(pb))
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts)},
           "hosts": {vhost.name: {"address": vhost.address, "port": vhost.port, "sglang_path": f"{private}/vllm",
                                  "python": f"{VENV_IN_HOST}/bin/python"}}}
    (tmp_path / "inv.yaml").write_text(json.dumps(inv))
    cli = ["-i", str(tmp_path / "inv.yaml"), "--host", vhost.name]
    books = [a for name in QWEN2_AUDIO_SPECS for a in ("--playbook", name)]
    site = next(vllm_venv.glob("lib/python3*/site-packages"))

    # the proposer's gap fixed alone: the next crash is the interface's, in vLLM's own words, after the load
    run("patch", *cli, "--playbook", "qwen2-audio-proposer-vllm", check_rc=0)
    try:
        proc, row, took = launch(cli, "--playbook", str(tmp_path / "q2a.yaml"), "--force")
        print(f"\nthe proposer fixed alone: the interface's crash reported after {took:.1f} s")
        assert proc.returncode == 3 and row["verdict"] == "crashed", (row, proc.stderr[-3000:])
        assert "Model does not support EAGLE3 interface" in row["detail"], row["detail"]
        assert ("hint: Qwen2AudioForConditionalGeneration lacks SupportsEagle3 in this vLLM release; spec "
                "qwen2-audio-eagle3-vllm adds it") in row["detail"], row["detail"]
        assert gone(vhost) == []
    finally:
        run("stop", *cli, "--playbook", str(tmp_path / "q2a.yaml"))

    proc = run("patch", *cli, *books, "--json")
    rows = {r["data"]["spec"]: r for r in json.loads(proc.stdout)["hosts"]}
    assert proc.returncode == 0 and {s: r["verdict"] for s, r in rows.items()} == \
        {"qwen2-audio-eagle3-vllm": "patched", "qwen2-audio-proposer-vllm": "unchanged"}, (proc.stdout, proc.stderr)
    try:
        proc, row, took = launch(cli, "--playbook", str(tmp_path / "q2a.yaml"))
        print(f"\nwith both specs: ready after {took:.1f} s")
        assert proc.returncode == 0 and row["verdict"] == "ready", (row, proc.stderr[-3000:])
        drafts_all_accepted(vhost, cli)
    finally:
        run("stop", *cli, "--playbook", str(tmp_path / "q2a.yaml"))
    assert gone(vhost) == []
    run("unpatch", *cli, *books, check_rc=0)
    for rel in QWEN2_AUDIO_SPECS.values():
        assert vhost.hostpath(f"{private}/vllm/{rel}").read_bytes() == (site / "vllm" / rel).read_bytes()


def test_with_the_overlay_the_read_only_install_starts_and_drafts_and_unpatch_overlay_takes_it_away(
        tmp_path, ssh_env, vhost, vllm_models, vllm_venv):
    """The same Qwen2-Audio target and drafter on the tier's read-only vLLM, none of its files edited:
    `launch --overlay` stages both specs as a vLLM general plugin (the interface's subclass registered
    under the architecture, the proposer's load_model bound in place of the installed one), and the real
    server starts and drafts; status says which fix it runs; `unpatch --overlay` takes the overlay away."""
    models = put_models(vhost, vllm_models["qwen2-audio"], "qwen2-audio")
    pb = json.loads(open(playbook(tmp_path, models)).read())
    pb["launch"]["requires"] = list(QWEN2_AUDIO_SPECS)
    (tmp_path / "q2a.yaml").write_text(json.dumps(pb))
    cli = [*ssh_env.cli_args, "--host", vhost.name]
    site = next(vllm_venv.glob("lib/python3*/site-packages"))
    released = {rel: (site / "vllm" / rel).read_bytes() for rel in QWEN2_AUDIO_SPECS.values()}
    books = [a for name in QWEN2_AUDIO_SPECS for a in ("--playbook", name)]

    proc, row, took = launch(cli, "--playbook", str(tmp_path / "q2a.yaml"), "--overlay")
    print(f"\nwith the overlay: ready after {took:.1f} s")
    try:
        assert proc.returncode == 0 and row["verdict"] == "ready", (row, proc.stderr[-3000:])
        rec = record(vhost)
        assert rec["fix"] == "overlay" and rec["overlay"]["modules"] == [
            "provision_overlay.qwen2_audio_eagle3_vllm", "provision_overlay.qwen2_audio_proposer_vllm"], rec
        assert row["detail"].endswith("tp 1, speculative EAGLE3 draft_tokens=3"), row["detail"]
        env = vhost.run(f"tr '\\0' '\\n' < /proc/{record(vhost)['pid']}/environ", check=False).stdout.splitlines()
        root = next(e for e in env if e.startswith("PYTHONPATH=")).split("=", 1)[1].split(":")[0]
        assert vhost.hostpath(f"{root}/provision_overlay-0.1.dist-info/entry_points.txt").read_text() == \
            "[vllm.general_plugins]\nprovision_overlay = provision_overlay:register\n"
        drafts_all_accepted(vhost, cli)
        proc = run("status", *cli, *books, "--format", "lines")
        print(f"status:\n{proc.stdout}")
        assert proc.returncode == 0 and proc.stdout.count("fix: overlay") == 2, (proc.stdout, proc.stderr[-2000:])
    finally:
        run("stop", *cli, "--playbook", str(tmp_path / "q2a.yaml"))
    assert gone(vhost) == []
    proc = run("unpatch", *cli, *books, "--overlay", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["hosts"][0]["verdict"] == "removed", proc.stdout
    assert not vhost.hostpath(root).exists()
    assert {rel: (site / "vllm" / rel).read_bytes() for rel in QWEN2_AUDIO_SPECS.values()} == released

