"""Launch, follow, status, logs, restart and stop on a real vLLM server running EAGLE-3 on this
machine's CPU, over real sshd (issue 40). The server is vLLM 0.32.0 (the CPU build), its models
tiny ones built here; nothing of it is a stand-in. The host sees the cached venv read-only at
/opt/vllm-env (discovery finds it there, as a venv under /opt), and its models in its own /data.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest

from provision.sandbox.hosts import HostSpec
from tests.cli.helpers import run, run_json
from tests.promtool import lint

pytestmark = [pytest.mark.realvllm, pytest.mark.ssh]

VENV_IN_HOST = "/opt/vllm-env"
MODELS_IN_HOST = "/data/models"
KEY = "sk-realvllm-canary-5e1"
DEADLINE = "400"  # a start takes 35-60 s alone; the rest of the suite shares the 2 cores


@pytest.fixture(scope="module")
def vhost(sandbox_factory, vllm_venv):
    spec = HostSpec("vllm1", "auto", None, "none", sandbox_factory.port, ro_binds=((VENV_IN_HOST, str(vllm_venv)),))
    (host,) = sandbox_factory.up(spec)
    try:
        yield host
    finally:
        host.run("pkill -9 -f vllm", check=False)  # whatever a failing test left on this host
        sandbox_factory.remove(host)


def playbook(tmp_path, models: str, **extra_args) -> str:
    args = {"model": f"{models}/target", "dtype": "float32", "max-model-len": 512, "enforce-eager": True,
            "kv-cache-memory-bytes": "64M",
            "speculative-config": {"method": "eagle3", "model": f"{models}/draft", "num_speculative_tokens": 3},
            **extra_args}
    doc = {"name": "tiny-vllm", "engine": "vllm",
           "launch": {"args": args, "env": {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                                            "VLLM_CPU_OMP_THREADS_BIND": "nobind"}, "grace": 20}}
    path = tmp_path / "tiny-vllm.yaml"
    path.write_text(json.dumps(doc))
    return str(path)


def inventory(tmp_path, ssh_env, host, pb: str) -> str:
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts)},
           "hosts": {host.name: {"address": host.address, "port": host.port, "profile": pb}}}
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inv))
    return str(path)


def put_models(host, src, name: str) -> str:
    dest = host.hostpath(f"{MODELS_IN_HOST}/{name}")
    if not dest.exists():
        shutil.copytree(src, dest)
    return f"{MODELS_IN_HOST}/{name}"


def vllm_pids(host) -> list[int]:
    """vLLM's processes on the host: the API server, EngineCore, Worker, and anything run from its venv."""
    out = host.run("ps -eo pid=,args=", check=False).stdout
    return [int(l.split()[0]) for l in out.splitlines()
            if ("vllm.entrypoints" in l or "VLLM::" in l or VENV_IN_HOST in l) and "ps -eo" not in l
            and "init.py" not in l]  # the host's init names the bind mount


def curl(host, path: str, key: str | None = None, address: str = "127.0.0.1") -> int:
    """The HTTP status of the server's `path`, asked from inside the host (0: nothing answers)."""
    prog = ("import sys, urllib.request, urllib.error\n"
            "req = urllib.request.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + sys.argv[2]} "
            "if sys.argv[2] else {})\n"
            "try:\n    print(urllib.request.urlopen(req, timeout=10).status)\n"
            "except urllib.error.HTTPError as e:\n    print(e.code)\n"
            "except OSError:\n    print(0)\n")
    out = host.run(["python3", "-c", prog, f"http://{address}:30000{path}", key or ""], check=False)
    return int(out.stdout.strip() or 0)


def spec_counters(host, address: str = "127.0.0.1") -> dict:
    """vLLM's spec-decoding counters read straight from /metrics on the host (summed over labels
    with a regex here, not with provision's reader)."""
    import re

    prog = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
    text = host.run(["python3", "-c", prog, f"http://{address}:30000/metrics"]).stdout
    out = {}
    for name in ("drafts", "draft_tokens", "accepted_tokens"):
        vals = re.findall(rf"^vllm:spec_decode_num_{name}_total(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)
        out[name] = sum(float(v) for v in vals)
    return out


def bench(cli: list, *args) -> tuple:
    """`provision bench --json` with few short requests and no warm-up (so /metrics read around it
    counts exactly its requests): (process, its one row)."""
    proc = run("bench", *cli, "--requests", "3", "--max-new-tokens", "48", "--warmup", "0", *args, "--json",
               timeout=600)
    assert proc.stdout.strip(), (proc.returncode, proc.stderr[-3000:])
    return proc, json.loads(proc.stdout)["hosts"][0]


def record(host) -> dict:
    return json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())


def server_argv(host) -> list[str]:
    """The running server's command line, read from /proc on the host."""
    return host.run(f"tr '\\0' '\\n' < /proc/{record(host)['pid']}/cmdline", check=False).stdout.splitlines()


def launch(cli: list, *args, env=None) -> tuple:
    """`provision launch --json` on the tier's host: (process, its one row, seconds it took)."""
    t0 = time.monotonic()
    proc = run("launch", *cli, *args, "--deadline", DEADLINE, "--poll", "1", "--json", env=env, timeout=600)
    assert proc.stdout.strip(), (proc.returncode, proc.stderr[-3000:])
    return proc, json.loads(proc.stdout)["hosts"][0], time.monotonic() - t0


def gone(host, within: float = 30.0) -> list[int]:
    """vLLM's processes on the host once they are gone, or those still there after `within` s
    (a crashed tree's children end a moment after its report)."""
    end = time.monotonic() + within
    while (left := vllm_pids(host)) and time.monotonic() < end:
        time.sleep(0.2)
    return left


def test_launch_follows_the_real_log_to_ready_then_status_logs_and_stop_leave_nothing(
        tmp_path, ssh_env, vhost, vllm_models):
    models = put_models(vhost, vllm_models["good"], "good")
    pb = playbook(tmp_path, models)
    cli = [*ssh_env.cli_args, "--host", vhost.name]
    proc, row, took = launch(cli, "--playbook", pb)
    assert proc.returncode == 0 and row["verdict"] == "ready", (row, proc.stderr[-3000:])
    print(f"\nlaunch -> ready on the real vLLM: {took:.1f} s")
    phases = row["data"].get("phases_seen") or []
    assert {"target-weights", "draft-weights", "kv-cache", "ready"} <= set(phases), phases
    assert curl(vhost, "/health") == 200

    # status: the host's profile (the inventory's `profile:`) runs vLLM, so its install is the one
    # shown, with its version and the server; the shipped SGLang spec does not apply to it
    inv = inventory(tmp_path, ssh_env, vhost, pb)
    proc, doc = run_json("status", "-i", inv)
    row = doc["hosts"][0]
    assert row["version"] == "0.32.0" and row["install"].endswith("/site-packages/vllm"), row
    assert row["verdict"] == "not-applicable" and "runs vLLM" in row["detail"], row
    # the metrics name the engine and its version (provision_sglang_info is SGLang's alone), the server up
    text = run("status", "-i", inv, "--format", "prometheus").stdout
    assert (f'provision_engine_info{{host="{vhost.name}",engine="vllm",version="0.32.0",' in text
            and "provision_sglang_info{" not in text), text
    assert lint(text) == "", "promtool check metrics finds nothing to say"
    assert f'provision_server_up{{host="{vhost.name}",port="30000"}} 1' in text, text
    # the timer's reconcile on a vLLM host: nothing of SGLang's to put back, and no error
    proc, doc = run_json("reconcile", "-i", inv)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "not-applicable", (doc, proc.stderr[-2000:])

    proc = run("logs", *cli, "--playbook", pb, check_rc=0)
    assert "Starting vLLM server on http://127.0.0.1:30000" in proc.stdout
    header = next(line for line in proc.stdout.splitlines() if line.startswith("--- "))
    assert header.endswith("(vLLM 0.32.0) ---"), header

    # bench: the spec-decoding figures are /metrics' counters over its requests; this drafter
    # proposes what the target picks, so every draft token is accepted (3 a step: length 4)
    before = spec_counters(vhost)
    proc, b = bench(cli, "--metrics-file", str(tmp_path / "bench.prom"))
    after = spec_counters(vhost)
    d = {k: after[k] - before[k] for k in after}
    print(f"bench, the accepting drafter: {b['detail']}; /metrics: {d}")
    prom = (tmp_path / "bench.prom").read_text()
    assert f'provision_bench_accept_length{{host="{vhost.name}"}} 4' in prom and lint(prom) == "", prom
    assert proc.returncode == 0 and b["verdict"] == "measured", (b, proc.stderr[-2000:])
    assert d["drafts"] > 0 and b["accept_length"] == round(1 + d["accepted_tokens"] / d["drafts"], 3) == 4.0, (b, d)
    assert b["accept_rate"] == round(d["accepted_tokens"] / d["draft_tokens"], 3) == 1.0, (b, d)
    assert b["flags"] == [] and b["engine"] == "vllm" and b["version"] == "0.32.0" and b["decode_tok_s"] > 0, b
    assert b["spec"]["speculative_algorithm"] == "EAGLE3" and "|vllm 0.32.0|" in b["key"], b

    assert len(vllm_pids(vhost)) >= 3, "the API server, EngineCore and Worker run"
    t0 = time.monotonic()
    run("stop", *cli, "--playbook", pb, check_rc=0)
    print(f"stop: {time.monotonic() - t0:.1f} s")
    assert vllm_pids(vhost) == [], "stop ended vLLM's whole tree (APIServer, EngineCore, Worker)"
    assert curl(vhost, "/health") == 0


def test_a_restart_replays_the_recorded_launch_and_keeps_the_api_key_off_the_command_line(
        tmp_path, ssh_env, vhost, vllm_models):
    models = put_models(vhost, vllm_models["good"], "good")
    pb = playbook(tmp_path, models)
    cli = [*ssh_env.cli_args, "--host", vhost.name]
    env = {"PROVISION_API_KEY": KEY}
    proc, row, _ = launch(cli, "--playbook", pb, env=env)
    assert row["verdict"] == "ready", (row, proc.stderr[-3000:])
    try:
        first = server_argv(vhost)
        assert KEY not in "\n".join(first), "the key reaches vLLM in its 0600 --config file, never argv"
        assert first[first.index("--config") + 1].startswith("/"), first
        assert (curl(vhost, "/v1/models"), curl(vhost, "/v1/models", KEY)) == (401, 200)

        # no --playbook: the record's launch is replayed; the key comes from this run's environment again
        proc, row, _ = launch(cli, "--restart", env=env)
        assert row["verdict"] == "ready", (row, proc.stderr[-3000:])
        again = server_argv(vhost)
        strip = lambda argv: [a for i, a in enumerate(argv) if not (i and argv[i - 1] == "--config")]  # noqa: E731
        assert strip(again) == strip(first), (first, again)
        assert (curl(vhost, "/v1/models"), curl(vhost, "/v1/models", KEY)) == (401, 200)
    finally:
        run("stop", *cli, env=env, check_rc=0)
    assert vllm_pids(vhost) == []


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


QWEN2_AUDIO_SPECS = {"qwen2-audio-eagle3-vllm": "model_executor/models/qwen2_audio.py",
                     "qwen2-audio-proposer-vllm": "v1/spec_decode/llm_base_proposer.py"}


def private_vllm(host, venv) -> str:
    """/root/vllm-private in the host: a `vllm` package of links into the tier's read-only venv, except
    the files the Qwen2-Audio specs edit (copies) and the directories down to them; the venv's
    dist-info linked beside it (its version). The venv itself is never written."""
    site = next(venv.glob("lib/python3*/site-packages"))
    in_host = f"{VENV_IN_HOST}/{site.relative_to(venv)}"
    root = host.hostpath("/root/vllm-private")
    shutil.rmtree(root, ignore_errors=True)
    edited = set(QWEN2_AUDIO_SPECS.values())
    dirs = {"/".join(f.split("/")[:i]) for f in edited for i in range(1, f.count("/") + 1)}

    def mirror(rel: str) -> None:
        (root / "vllm" / rel).mkdir(parents=True, exist_ok=True)
        for entry in (site / "vllm" / rel).iterdir():
            sub = f"{rel}/{entry.name}".lstrip("/")
            if sub in dirs:
                mirror(sub)
            elif sub in edited:
                (root / "vllm" / sub).write_bytes(entry.read_bytes())
            else:
                (root / "vllm" / sub).symlink_to(f"{in_host}/vllm/{sub}")

    mirror("")
    for info in site.glob("vllm*.dist-info"):
        (root / info.name).symlink_to(f"{in_host}/{info.name}")
    return "/root/vllm-private"


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
        before = spec_counters(vhost)
        _, brow = bench(cli)
        after = spec_counters(vhost)
        drafts = after["drafts"] - before["drafts"]
        accepted = after["accepted_tokens"] - before["accepted_tokens"]
        print(f"bench: {brow['detail']}; /metrics: {drafts:.0f} drafts, {accepted:.0f} of "
              f"{after['draft_tokens'] - before['draft_tokens']:.0f} draft tokens accepted")
        assert drafts > 0 and brow["verdict"] == "measured", (before, after, brow)
        # the drafter proposes what the zero-norm target picks (as the Llama pair's): every draft token accepted
        assert brow["accept_length"] == round(1 + accepted / drafts, 3) == 4.0, (brow, before, after)
    finally:
        run("stop", *cli, "--playbook", str(tmp_path / "q2a.yaml"))
    assert gone(vhost) == []
    run("unpatch", *cli, *books, check_rc=0)
    for rel in QWEN2_AUDIO_SPECS.values():
        assert vhost.hostpath(f"{private}/vllm/{rel}").read_bytes() == (site / "vllm" / rel).read_bytes()


def test_preflight_refuses_from_vllms_own_parser_and_registry_and_starts_nothing(tmp_path, ssh_env, vhost,
                                                                                   vllm_models):
    """What vLLM would refuse, refused before any vLLM process starts: a misspelt flag (with a "did you
    mean" from the installed parser's own table), a speculative method it does not know, a drafter
    that is not there, a drafter architecture not in its registry; and the warning for a drafter that
    names no auxiliary layers. The parser is asked once, in the venv's interpreter; then cached."""
    models = put_models(vhost, vllm_models["good"], "good")
    cli = [*ssh_env.cli_args, "--host", vhost.name]
    for name, change in (("noids", lambda c: {k: v for k, v in c.items() if k != "eagle_aux_hidden_state_layer_ids"}
                          | {"eagle_config": {"use_aux_hidden_state": True}}),
                         ("gemma", lambda c: dict(c, architectures=["Eagle3Gemma3ForCausalLM"])),
                         ("deep", lambda c: dict(c, num_hidden_layers=8))):  # vLLM's default layers need n >= 4
        dest = vhost.hostpath(f"{MODELS_IN_HOST}/{name}")
        if not dest.exists():
            shutil.copytree(vhost.hostpath(f"{models}/{'target' if name == 'deep' else 'draft'}"), dest)
            cfg = json.loads((dest / "config.json").read_text())
            (dest / "config.json").write_text(json.dumps(change(cfg)))

    def refused(label: str, **args) -> dict:
        pb = playbook(tmp_path, models, **args)
        proc, row, took = launch(cli, "--playbook", pb)
        print(f"\n{label}: refused after {took:.1f} s: {row['detail']}")
        assert proc.returncode == 3 and row["verdict"] == "refused", (row, proc.stderr[-3000:])
        assert vllm_pids(vhost) == [], "no vLLM process was started"
        return row

    spec = {"method": "eagle3", "model": f"{models}/draft", "num_speculative_tokens": 3}
    row = refused("misspelt flag (parser asked)", **{"max-modle-len": 512})
    assert "--max-modle-len is not a flag of vLLM 0.32.0: did you mean --max-model-len" in row["detail"], row
    row = refused("unknown method", **{"speculative-config": dict(spec, method="eagel3")})
    assert "method 'eagel3' is not one vLLM 0.32.0 knows: did you mean eagle3" in row["detail"], row
    row = refused("missing drafter", **{"speculative-config": dict(spec, model=f"{MODELS_IN_HOST}/nowhere")})
    assert f"drafter {MODELS_IN_HOST}/nowhere does not exist" in row["detail"], row
    row = refused("drafter not in the registry", **{"speculative-config": dict(spec, model=f"{MODELS_IN_HOST}/gemma")})
    assert "drafter architecture Eagle3Gemma3ForCausalLM is not registered in vLLM 0.32.0" in row["detail"], row
    # a drafter naming no layers: a warning (vLLM would start); the misspelt flag keeps it from starting
    row = refused("no layer ids", **{"max-modle-len": 512, "model": f"{MODELS_IN_HOST}/deep",
                                     "speculative-config": dict(spec, model=f"{MODELS_IN_HOST}/noids")})
    warns = [c["message"] for c in row["data"]["checks"] if c["level"] == "warn"]
    assert any("names no eagle_aux_hidden_state_layer_ids" in w and "(2, 4, 5)" in w for w in warns), warns
    ok = [c["message"] for c in row["data"]["checks"] if c["level"] == "ok"]
    assert "drafter architecture LlamaForCausalLMEagle3 is registered in vLLM 0.32.0" in ok, ok
    assert "model architecture LlamaForCausalLM is registered in vLLM 0.32.0" in ok, ok


@pytest.fixture(scope="module")
def vsdhost(sandbox_factory, vllm_venv):
    """A systemd-booted host (sandbox/systemd.py) with the same venv read-only: `--persistent`."""
    from provision.sandbox import systemd

    if systemd.problems():
        pytest.skip("systemd hosts unavailable: " + "; ".join(systemd.problems()))
    spec = HostSpec("vllmsd1", "auto", None, "none", sandbox_factory.port, kind="systemd",
                    ro_binds=((VENV_IN_HOST, str(vllm_venv)),))
    (host,) = sandbox_factory.up(spec)
    try:
        yield host
    finally:
        sandbox_factory.remove(host)


# three real vLLM start-ups or stops in a row (launch, systemd's restart, stop), each up to ~90 s on a
# loaded 2-core machine with a cold cache: past the default 180 s (CI's fresh-machine run took 213 s)
@pytest.mark.timeout(600)
def test_persistent_runs_vllm_as_an_enabled_unit_named_for_it_that_systemd_brings_back_and_stop_removes(
        tmp_path, ssh_env, vsdhost, vllm_models):
    host = vsdhost
    models = put_models(host, vllm_models["good"], "good")
    pb = playbook(tmp_path, models, host=host.address)  # the container shares this machine's network
    cli = [*ssh_env.cli_args, "--host", host.name]
    env = {"PROVISION_API_KEY": KEY}
    unit = "provision-vllm-30000.service"
    proc, row, took = launch(cli, "--playbook", pb, "--persistent", env=env)
    print(f"\nlaunch --persistent -> ready on the real vLLM: {took:.1f} s")
    try:
        assert proc.returncode == 0 and row["verdict"] == "ready", (row["detail"], proc.stderr[-3000:])
        shown = host.run(["systemctl", "show", unit, "-p", "Description,UnitFileState,ExecStart,Environment"]).stdout
        assert "Description=vLLM on port 30000 (managed by provision)" in shown and "UnitFileState=enabled" in shown
        assert KEY not in shown, "systemctl show prints the unit to every user: the key is in no part of it"
        assert (curl(host, "/v1/models", None, host.address), curl(host, "/v1/models", KEY, host.address)) == (401, 200)

        # the server dies: systemd ends the rest of its tree, starts it again (RestartSec=10), and a
        # `wait` asked for at once follows the new start-up (it is not reported as a crash)
        first = record(host)["pid"]
        host.run(["kill", "-9", str(first)])
        proc = run("wait", *cli, "--playbook", pb, "--deadline", DEADLINE, "--poll", "1", "--json", env=env, timeout=600)
        assert proc.stdout.strip(), (proc.returncode, proc.stderr[-3000:])
        doc = json.loads(proc.stdout)
        assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", (doc, proc.stderr[-3000:])
        assert record(host)["pid"] != first and record(host)["restarts"] == 1, record(host)
        proc = run("status", "-i", inventory(tmp_path, ssh_env, host, pb), "--json", env=env)
        assert proc.stdout.strip(), (proc.returncode, proc.stderr[-3000:])
        st = json.loads(proc.stdout)["hosts"][0]
        assert st["data"]["persistent"]["unit"] == unit and st["data"]["persistent"]["restarts"] == 1, st
        assert f"persistent: {unit} active (running), enabled, 1 restart by systemd" in st["detail"], st["detail"]
    finally:
        t0 = time.monotonic()
        run("stop", *cli, env=env, check_rc=0)
        print(f"stop (persistent): {time.monotonic() - t0:.1f} s")
    assert "could not be found" in host.run(["systemctl", "status", unit], check=False).stderr or \
        not host.hostpath(f"/etc/systemd/system/{unit}").exists()
    assert not host.hostpath(f"/etc/systemd/system/{unit}").exists(), "stop removed the unit"
    assert vllm_pids(host) == [], "nothing brings it back: no vLLM process is left"


PARSE = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
ns = make_arg_parser(FlexibleArgumentParser()).parse_args(json.loads(sys.argv[1]))
validate_parsed_serve_args(ns)
print(json.dumps({"model": ns.model, "tp": ns.tensor_parallel_size, "spec": ns.speculative_config,
                  "trust": ns.trust_remote_code, "host": ns.host, "port": ns.port}))
"""


def test_the_shipped_vllm_playbooks_argv_is_what_vllms_own_parser_reads(vllm_venv):
    """The argv `launch --playbook kimi-k25-eagle3-vllm` starts, parsed by vLLM 0.32's own parser
    (no server: the parse alone)."""
    import subprocess

    from provision.config.inventory import Host
    from provision.config.profile import host_profile, render_flags

    flags = render_flags(host_profile(Host("h1"), "kimi-k25-eagle3-vllm")[0].args)
    p = subprocess.run([str(vllm_venv / "bin" / "python"), "-c", PARSE, json.dumps(flags)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    ns = json.loads(p.stdout.strip().splitlines()[-1])
    assert ns == {"model": "moonshotai/Kimi-K2.5", "tp": 8, "trust": True, "host": "127.0.0.1", "port": 30000,
                  "spec": {"method": "eagle3", "model": "AQ-MedAI/Kimi-K25-eagle3", "num_speculative_tokens": 3}}, ns
