"""`provision overlay write` (no SSH) and the shipped container/Kubernetes playbooks that use it.

The written package is executed the way SGLang's registry imports it, with stubbed imports over
the real 0.5.9 kimi_k25.py (the stand-in's probe): the class it registers has the three methods
bound, and they delegate to the inner model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provision.config.playbook import PACKAGE_PLAYBOOKS
from provision.sandbox import wheels
from tests.cli.helpers import KIMI_CLASS, METHODS, run

REPO = str(Path(__file__).resolve().parents[2])  # provision itself, for the stand-in's probe
PROBE = r"""
import json, sys
from pathlib import Path
from provision.sandbox import standin
probe = standin.probe_model(Path(sys.argv[1]), None)
inst = probe.make_instance()
calls = []
for name in sys.argv[2].split(",") if sys.argv[3] else []:
    getattr(inst, name)(*([None, None] if name == "set_embed_and_head" else []))
print(json.dumps({"module": probe.cls.__module__, "bound": {n: n in vars(probe.cls) for n in sys.argv[2].split(",")},
                  "calls": inst.language_model.calls, "warnings": probe.warnings, "mro": [c.__module__ for c in probe.cls.__mro__[:2]]}))
"""


def _probe(sglang_dir, root, env_pkg="provision_overlay", extra_env=None, call=True):
    env = {"PYTHONPATH": f"{root}:{REPO}", "SGLANG_EXTERNAL_MODEL_PACKAGE": env_pkg, "PATH": "/usr/bin:/bin",
           **(extra_env or {})}
    proc = subprocess.run([sys.executable, "-c", PROBE, str(sglang_dir), ",".join(METHODS), "1" if call else ""],
                          capture_output=True, text=True, env=env, timeout=120, cwd=str(root))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_written_overlay_binds_the_three_methods_under_stub_imports(tmp_path):
    out = tmp_path / "shared"
    proc = run("overlay", "write", "--out", out, "--mount-path", "/overlay", check_rc=0)
    assert proc.stdout.splitlines() == ["SGLANG_EXTERNAL_MODEL_PACKAGE=provision_overlay", "PYTHONPATH=/overlay"]
    assert (out / "overlay.env").read_text().splitlines() == proc.stdout.splitlines()
    assert sorted(p.name for p in (out / "provision_overlay").iterdir()) == ["__init__.py", "kimi_k25_eagle3.py"]
    sglang = wheels.extracted("0.5.9") / "sglang"
    got = _probe(sglang, out)
    assert got["module"] == "provision_overlay.kimi_k25_eagle3"   # the overlay's class won the registry
    assert got["mro"] == ["provision_overlay.kimi_k25_eagle3", "sglang.srt.models.kimi_k25"]
    assert got["bound"] == {m: True for m in METHODS}
    assert got["calls"] == METHODS                                  # each delegated to language_model
    # without the overlay the built-in 0.5.9 class has none of them
    bare = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                           "from provision.sandbox import standin; p = standin.probe_model(Path(sys.argv[1]), None); "
                           "print(sorted(n for n in sys.argv[2].split(',') if hasattr(p.cls, n)))",
                           str(sglang), ",".join(METHODS)], capture_output=True, text=True, timeout=120)
    assert bare.stdout.strip() == "[]"


def test_overlay_write_refuses_a_release_without_the_variable(tmp_path):
    proc = run("overlay", "write", "--out", tmp_path / "o", "--sglang-version", "0.5.5.post3")
    assert proc.returncode == 2
    assert "overlay mode needs SGLang 0.5.6 or later: SGLang 0.5.5.post3 does not read" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_the_stand_in_honours_the_variable_only_where_the_installed_registry_reads_it(tmp_path):
    """0.5.5.post3's registry.py has no SGLANG_EXTERNAL_MODEL_PACKAGE: there the built-in KimiVL class
    (which lacks the methods) is what SGLang uses, overlay or not; 0.5.9's registry lets it win."""
    out = tmp_path / "o"
    run("overlay", "write", "--playbook", "kimi-vl-eagle3", "--out", out, check_rc=0)
    env = {"PROVISION_STANDIN_MODEL_CLASS": "KimiVLForConditionalGeneration"}
    old = _probe(wheels.extracted("0.5.5.post3") / "sglang", out, extra_env=env, call=False)
    assert old["module"] == "sglang.srt.models.kimi_vl" and old["bound"] == {m: False for m in METHODS}
    new = _probe(wheels.extracted("0.5.9") / "sglang", out, extra_env=env)
    assert new["module"] == "provision_overlay.kimi_vl_eagle3" and new["bound"] == {m: True for m in METHODS}


# --------------------------------------------------------------------------- the shipped files

def test_dockerfile_snippet_builds_on_the_official_image_and_runs_overlay_write(tmp_path):
    text = (PACKAGE_PLAYBOOKS / "containers" / "Dockerfile.overlay").read_text()
    steps = [line.split(None, 1) for line in text.splitlines() if line.strip() and not line.startswith("#")]
    cmds = [s[0] for s in steps]
    assert cmds[0] == "FROM" and steps[0][1].startswith("lmsysorg/sglang:v0.5.9")
    run_lines = [s[1] for s in steps if s[0] == "RUN"]
    assert any("provision overlay write" in r for r in run_lines)
    env = [s[1] for s in steps if s[0] == "ENV"]
    assert any("SGLANG_EXTERNAL_MODEL_PACKAGE=provision_overlay" in e for e in env)
    assert any("PYTHONPATH=/opt/provision-overlay" in e for e in env)
    # its `provision overlay write` step, run here into a scratch directory, writes the package
    import shlex

    step = next(r for r in run_lines if "provision overlay write" in r).split("&& provision ", 1)[1]
    argv = shlex.split(step)
    out = argv[argv.index("--out") + 1]
    assert out == "/opt/provision-overlay"
    argv[argv.index("--out") + 1] = str(tmp_path)
    proc = run(*argv, check_rc=0)
    assert "PYTHONPATH=/opt/provision-overlay" in proc.stdout.replace(str(tmp_path), out)
    assert (tmp_path / "provision_overlay" / "kimi_k25_eagle3.py").exists()


def test_kubernetes_pod_spec_parses_and_shares_the_overlay_volume(tmp_path):
    doc = yaml.safe_load((PACKAGE_PLAYBOOKS / "containers" / "k8s-sglang-overlay.yaml").read_text())
    assert doc["kind"] == "Pod"
    spec = doc["spec"]
    vols = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in vols["provision-overlay"]
    init = spec["initContainers"][0]
    cmd = " ".join(init["command"] + init.get("args", []))
    assert "provision overlay write" in cmd
    out = cmd.split("--out", 1)[1].split()[0]
    (mount,) = [m for m in init["volumeMounts"] if m["name"] == "provision-overlay"]
    assert mount["mountPath"] == out
    server = next(c for c in spec["containers"] if c["name"] == "sglang")
    env = {e["name"]: e["value"] for e in server["env"]}
    (smount,) = [m for m in server["volumeMounts"] if m["name"] == "provision-overlay"]
    assert smount.get("readOnly") is True
    assert env["SGLANG_EXTERNAL_MODEL_PACKAGE"] == "provision_overlay"
    assert env["PYTHONPATH"].split(":")[0] == smount["mountPath"]
    assert "--mount-path" in cmd and cmd.split("--mount-path", 1)[1].split()[0] == smount["mountPath"]
    argv = server["command"] + server.get("args", [])
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"] and "EAGLE3" in argv
    assert server["image"].startswith("lmsysorg/sglang:v0.5.9")
    # the init container's command, run here, prints exactly the server container's environment
    args = list(init["command"][1:])
    args[args.index("--out") + 1] = str(tmp_path)
    proc = run(*args, check_rc=0)
    assert proc.stdout.splitlines() == [f"{k}={env[k]}" for k in ("SGLANG_EXTERNAL_MODEL_PACKAGE", "PYTHONPATH")]


def test_links_another_account_planted_in_the_out_dir_are_never_followed(tmp_path):
    """`overlay write --out` into a directory every account can write (/tmp-like, sticky): an
    unprivileged account (nobody) plants a link at `overlay.env` and at the package's directory,
    pointing at root's files. Root replaces the first link with its file (the link's target
    untouched) and refuses the second with a sentence, writing nothing through it."""
    import shutil
    import tempfile

    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv (util-linux) to act as another account")
    victim = tmp_path / "root-owned"
    victim.write_text("root's own file\n")
    victim.chmod(0o600)
    victim_dir = tmp_path / "root-dir"
    victim_dir.mkdir()
    shared = Path(tempfile.mkdtemp(prefix="provision-shared-", dir="/tmp"))
    try:
        shared.chmod(0o1777)

        def plant(target, link):
            subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "ln", "-s",
                            str(target), str(link)], check=True, timeout=30)

        (shared / "a").mkdir(mode=0o777)
        (shared / "a").chmod(0o1777)
        plant(victim, shared / "a" / "overlay.env")
        run("overlay", "write", "--out", shared / "a", check_rc=0)
        assert victim.read_text() == "root's own file\n" and victim.stat().st_mode & 0o777 == 0o600
        env_file = shared / "a" / "overlay.env"
        assert not env_file.is_symlink() and "SGLANG_EXTERNAL_MODEL_PACKAGE" in env_file.read_text()

        (shared / "b").mkdir()
        (shared / "b").chmod(0o1777)
        plant(victim_dir, shared / "b" / "provision_overlay")
        proc = run("overlay", "write", "--out", shared / "b")
        assert proc.returncode == 2, proc.stderr
        assert "provision_overlay is not a directory (a symbolic link, or a file): overlay write does not follow it" \
            in proc.stderr and "Traceback" not in proc.stderr
        assert list(victim_dir.iterdir()) == []
    finally:
        shutil.rmtree(shared, ignore_errors=True)


SHIPPED = sorted(p.stem for p in (__import__("pathlib").Path(__file__).resolve().parents[2] / "playbooks").glob("*.yaml"))


@pytest.mark.parametrize("book", SHIPPED)
def test_overlay_write_of_every_shipped_playbook_writes_it_or_says_why_not(book, tmp_path):
    """issue 64: `overlay write --playbook` of a shipped vLLM replace or interface spec was a KeyError.
    Every shipped playbook now writes its overlay (exit 0, the two lines) or says in a sentence why it
    cannot (exit 2): never a traceback."""
    proc = run("overlay", "write", "--playbook", book, "--out", tmp_path / "o")
    assert proc.returncode in (0, 2), (proc.returncode, proc.stderr)
    if proc.returncode == 0:
        assert "PYTHONPATH=" in proc.stdout and (tmp_path / "o" / "provision_overlay").is_dir()
    else:
        assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
