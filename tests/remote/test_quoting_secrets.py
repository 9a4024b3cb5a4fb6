"""Paths and values that a shell would mangle stay literal; secrets go nowhere but the 0600 file.

Over real sshd: an interpreter under ``/opt/my envs/$weird 'quote'/``, flag and
profile values holding ``; touch /tmp/pwned``, and a canary API key and HF token
looked for everywhere a user (or another user of the host) could see them.
"""

from __future__ import annotations

import json
import os
import secrets
import stat

import pytest

from tests.cli.helpers import KIMI, KIMI_CLASS, METHODS, class_methods, run, run_json

pytestmark = pytest.mark.ssh

WEIRD = "/opt/my envs/$weird 'quote'"
TAG = secrets.token_hex(4)
PWNED = f"/tmp/pwned-{TAG}"


@pytest.fixture(scope="module")
def vhost_module(sandbox_factory):
    host = sandbox_factory.host("quote1", sglang="0.5.9", layout="venv")
    yield host
    sandbox_factory.remove(host)


@pytest.fixture
def vhost(vhost_module):
    vhost_module.reset()
    return vhost_module


@pytest.fixture
def journal(tmp_path):
    return tmp_path / "journal.jsonl"


def no_pwned(host) -> None:
    leftovers = [p.name for p in host.hostpath("/tmp").iterdir() if p.name.startswith("pwned")]
    assert leftovers == [], f"a value was run by a shell on the host: {leftovers}"
    assert not [p for p in os.listdir("/tmp") if p.startswith(f"pwned-{TAG}")], "... or on this machine"


@pytest.fixture
def weird_venv(vhost) -> str:
    """A copy of the host's venv under WEIRD, whose python is a binary of its own (not a symlink
    to the system one), so the engine re-runs itself under it: quoting on that path too.
    Hard links for the rest: fast, and the patch must replace the copy's file, not write through it."""
    vhost.run(["bash", "-c", 'mkdir -p "$(dirname "$1")" && cp -al /opt/venv "$1" && '
                             'real=$(readlink -f /opt/venv/bin/python3) && rm "$1/bin/python3" && '
                             'cp "$real" "$1/bin/python3"', "_", WEIRD])
    return WEIRD + vhost.site_packages[len("/opt/venv"):]


def test_interpreter_and_install_under_a_path_with_spaces_quotes_and_dollar(vhost, weird_venv, ssh_env, tmp_path,
                                                                            journal):
    env = {"PROVISION_JOURNAL": str(journal)}
    site = weird_venv
    weird_kimi = vhost.hostpath(f"{site}/sglang/{KIMI}")
    plain_kimi = vhost.hostpath(f"{vhost.site_packages}/sglang/{KIMI}")
    original = weird_kimi.read_bytes()
    assert plain_kimi.read_bytes() == original

    proc, doc = run_json("patch", *ssh_env.cli_args, "--host", vhost.name, "--python", f"{WEIRD}/bin/python", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = doc["hosts"][0]
    assert rec["verdict"] == "patched" and rec["install"] == f"{site}/sglang", rec
    assert class_methods(weird_kimi.read_bytes(), KIMI_CLASS)[-3:] == METHODS
    assert plain_kimi.read_bytes() == original, "the other install is left alone"
    assert rec["data"]["interpreters"][0].startswith(WEIRD)

    proc, doc = run_json("status", *ssh_env.cli_args, "--host", vhost.name, "--sglang-path", f"{site}/sglang",
                         env=env)
    assert proc.returncode == 0 and doc["hosts"][0]["data"]["patch_state"] == "patched", proc.stdout
    assert doc["hosts"][0]["install"] == f"{site}/sglang"

    # the inventory's `python:` (YAML, here written as JSON) works the same
    inv = tmp_path / "inv.yaml"
    inv.write_text(json.dumps({"defaults": {"user": "root", "identity": str(ssh_env.identity),
                                            "known_hosts": str(ssh_env.known_hosts)},
                               "hosts": {vhost.name: {"address": vhost.address, "port": vhost.port,
                                                      "python": f"{WEIRD}/bin/python"}}}))
    proc = run("unpatch", "-i", str(inv), env=env)
    assert proc.returncode == 0 and "unpatched" in proc.stdout, proc.stdout + proc.stderr
    assert weird_kimi.read_bytes() == original
    no_pwned(vhost)


FLAG_VALUES = [
    ("--python", f"/usr/bin/python3; touch {PWNED}-a"),
    ("--python", f"$(touch {PWNED}-b)"),
    ("--sglang-path", f"/opt/venv'; touch {PWNED}-c; echo '"),
    ("--sglang-path", f"`touch {PWNED}-d`"),
]


def test_flag_values_never_reach_a_shell(vhost, ssh_env, journal):
    from tests.remote.test_faults import start
    env = {"PROVISION_JOURNAL": str(journal)}
    procs = [start("patch", *ssh_env.cli_args, "--host", vhost.name, flag, value, "--check", env=env)
             for flag, value in FLAG_VALUES]
    for (flag, value), proc in zip(FLAG_VALUES, procs):
        out, err = proc.communicate(timeout=120)
        assert "Traceback" not in err
        if flag == "--sglang-path":  # a pinned path that does not exist: refused, named literally
            assert proc.returncode == 3 and "failed" in out and value in out, out
    no_pwned(vhost)


def test_a_kill_in_the_owner_interpreter_is_unknown(vhost, weird_venv, ssh_env, journal):
    proc, doc = run_json("patch", *ssh_env.cli_args, "--host", vhost.name, "--python", f"{WEIRD}/bin/python",
                         env={"PROVISION_JOURNAL": str(journal), "PROVISION_FAILPOINTS": "after_replace=kill"})
    assert class_methods(vhost.hostpath(f"{weird_venv}/sglang/{KIMI}").read_bytes(), KIMI_CLASS)[-3:] == METHODS
    assert doc["hosts"][0]["verdict"] == "unknown", doc["hosts"][0]


def test_a_missing_python_is_not_silently_replaced(vhost, ssh_env, journal):
    proc = run("patch", *ssh_env.cli_args, "--host", vhost.name, "--python", "/opt/nowhere/bin/python", "--check",
               env={"PROVISION_JOURNAL": str(journal)})
    assert proc.returncode == 3 and "/opt/nowhere/bin/python does not exist" in proc.stdout, proc.stdout


LOG_FINDINGS: list[tuple[str, int]] = []


def _inventory(tmp_path, ssh_env, host) -> str:
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts),
                        "args": {"model-path": "/data/models/Kimi-K2.5",
                                 "speculative-draft-model-path": "/data/models/Kimi-K25-eagle3",
                                 "served-model-name": f"kimi; touch {PWNED}-e $(touch {PWNED}-f)"},
                        "env": {"PROVISION_STANDIN_LOAD_SECONDS": "1",
                                "PROVISION_TEST_NOTE": f"`touch {PWNED}-g`"}},
           "hosts": {host.name: {"address": host.address, "port": host.port}}}
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inv))
    return str(path)


def _all_cmdlines(host) -> list[bytes]:
    out = []
    for pid in host.processes():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                out.append(fh.read())
        except OSError:
            pass
    return out


def test_canary_secrets_appear_nowhere_but_the_0600_config(vhost, ssh_env, tmp_path, journal):
    api_key, admin_key, hf = (f"canary-{secrets.token_hex(6)}", f"canary-admin-{secrets.token_hex(6)}",
                              f"hf_canary{secrets.token_hex(6)}")
    canaries = [api_key.encode(), admin_key.encode(), hf.encode()]
    env = {"PROVISION_API_KEY": api_key, "PROVISION_ADMIN_API_KEY": admin_key, "HF_TOKEN": hf,
           "PROVISION_JOURNAL": str(journal)}
    inv = _inventory(tmp_path, ssh_env, vhost)
    outputs: list[str] = []

    def cli(*args, **kw):
        proc = run(*args, env=env, timeout=240, **kw)
        outputs.extend([proc.stdout, proc.stderr])
        return proc

    cli("patch", "-i", inv, check_rc=0)
    launched = cli("launch", "-i", inv, "--poll", "0.5", "--json")
    assert launched.returncode == 0, launched.stdout[-400:]
    doc = json.loads(launched.stdout)
    assert doc["hosts"][0]["verdict"] == "ready", doc
    try:
        # while the server runs: the process list, every process's command line
        ps = vhost.run("ps -eo args=").stdout
        cmdlines = _all_cmdlines(vhost)
        assert any(b"sglang" in c for c in cmdlines), "the server is running"
        assert f"kimi; touch {PWNED}-e $(touch {PWNED}-f)".encode() in b"\n".join(cmdlines), \
            "the flag value reached the server as one literal argument"
        for c in canaries:
            assert c.decode() not in ps
            assert not [x for x in cmdlines if c in x], "a secret in a command line"
        cli("logs", "-i", inv, "-n", "400", check_rc=0)
        cli("status", "-i", inv, "--json", check_rc=0)
        # the host's state dir while it runs: only the secrets config (and HF_TOKEN's token file)
        # holds them, 0600
        state = vhost.hostpath("/var/lib/provision")
        secret_files = []
        for path in state.rglob("*"):
            if not path.is_file():
                continue
            data = path.read_bytes()
            if path.name.endswith(".secrets.yaml"):
                secret_files.append(path)
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
                assert api_key.encode() in data and admin_key.encode() in data
            elif path.name.endswith(".hf_token"):  # HF_TOKEN: only its own 0600 token file (HF_TOKEN_PATH)
                assert stat.S_IMODE(path.stat().st_mode) == 0o600 and data == hf.encode(), path
            else:
                assert not [c for c in canaries if c in data], f"a secret in {path}"
        assert secret_files, "the server got its keys through the 0600 config file"
    finally:
        cli("stop", "-i", inv)
    # after stop: the secret files went with their server, and nothing else holds a key
    for path in vhost.hostpath("/var/lib/provision").rglob("*"):
        if path.is_file():
            assert not path.name.endswith((".secrets.yaml", ".hf_token")), f"{path} outlived its server"
            assert not [c for c in canaries if c in path.read_bytes()], f"a secret in {path}"
    # the server's own log (SGLang prints its server_args, keys included): see the next test
    LOG_FINDINGS.clear()
    for path in vhost.hostpath("/var/log/provision").rglob("*"):
        if path.is_file() and [c for c in canaries if c in path.read_bytes()]:
            LOG_FINDINGS.append((str(path), stat.S_IMODE(path.stat().st_mode)))
    # nothing the user saw, and nothing in the control journal
    seen = "\n".join(outputs)
    assert journal.exists() and '"verdict": "stopped"' in journal.read_text(), "the run was journaled"
    for c in canaries:
        assert c.decode() not in seen
        assert c not in journal.read_bytes()
    no_pwned(vhost)


def test_a_server_log_holding_secrets_is_readable_by_root_only():
    """Runs after the canary test: any log in which it found a key must be 0600 (or 0640)."""
    assert LOG_FINDINGS, "the canary test found no server log holding a key (it should: SGLang logs server_args)"
    assert all(mode & 0o077 == 0 for _, mode in LOG_FINDINGS), LOG_FINDINGS
