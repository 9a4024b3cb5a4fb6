"""The container transport's pure parts: the command it wraps, the sentences for a step that never
started (from the runtimes' own words), and the SGLang-server containers in `RUNTIME ps`."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest

from provision.control.transport.container import (MISSING, ContainerTransport, check_name, exec_command,
                                                   not_started_reason)
from provision.control.transport.local import LocalTransport
from provision.errors import UsageError
from provision.host.lib.trust import SAFE_PATH
from provision.host.facts.containers import parse_ps
from provision.host.inference.sglang import is_sglang_server

HOSTILE = """python3 -S -c 'print("it'"'"'s $HOME `x` \\\\n")'"""


@pytest.mark.parametrize("runtime", ["auto", "docker", "podman"])
def test_the_wrapped_command_runs_the_step_verbatim_in_the_container(runtime):
    wrapped = exec_command(runtime, "sglang-30000", HOSTILE)
    argv = shlex.split(wrapped)
    assert argv[:2] == ["/bin/sh", "-c"] and len(argv) == 3
    lexer = shlex.shlex(argv[2][argv[2].rindex('exec "$p" exec -i '):], posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tail = list(lexer)
    # -w /: the step runs in /, not in the image's WORKDIR (`python -c` puts the cwd on sys.path)
    assert tail[:10] == ["exec", "$p", "exec", "-i", "-w", "/", "sglang-30000", "sh", "-c", HOSTILE]
    assert tail[10:12] in ([], [";", "fi"]), tail  # auto: the exec is inside the runtime loop


def test_the_step_in_a_container_runs_isolated_from_the_images_python_settings():
    # -I: the image's PYTHONPATH (ENV) and WORKDIR never reach the agent's sys.path; a host's step is unchanged
    from provision.control.transport.bundle import bootstrap_command

    seen = []

    class Outer(LocalTransport):
        def _channel(self, command, timeout):
            seen.append(command)
            raise OSError("recorded")

    for transport in (ContainerTransport(Outer("here"), "c1", "podman"), Outer("here")):
        with pytest.raises(Exception):
            transport.call({"op": "status"}, timeout=5)
    inner = shlex.split(shlex.split(seen[0])[2].split(" sh -c ", 1)[1])[0]
    assert inner.startswith("python3 -I -S -c "), inner[:40]
    assert seen[1].startswith("python3 -S -c "), seen[1][:40]
    assert bootstrap_command("python3").startswith("python3 -S -c ")


@pytest.mark.parametrize("runtime", ["auto", "podman"])
def test_a_missing_runtime_stops_before_anything_runs(runtime, tmp_path):
    # real /bin/sh; runtimes no directory of the fixed PATH holds: the marker, exit 127, nothing executed
    absent = ("provision-test-no-docker", "provision-test-no-podman")
    asked = "provision-test-no-podman" if runtime == "podman" else "auto"
    proc = subprocess.run(["/bin/sh", "-c", exec_command(asked, "c1", f"touch {tmp_path}/ran", runtimes=absent)],
                          capture_output=True, text=True, env={"PATH": str(tmp_path)})
    assert proc.returncode == 127 and MISSING in proc.stderr
    assert not (tmp_path / "ran").exists()
    err = not_started_reason("gpu01/c1", "c1", runtime, proc.returncode, proc.stderr, "python3")
    assert err is not None and err.kind == "container"
    want = "neither docker nor podman is installed" if runtime == "auto" else "podman is not installed on this host"
    assert want in err.message and SAFE_PATH in err.message and "\n" not in err.message


FAKE = "#!/bin/sh\necho \"$0 $*\" >> {marker}\nexit 0\n"


def test_the_login_path_never_chooses_the_runtime(monkeypatch, tmp_path):
    # a `docker` first on the caller's PATH (a directory a user can write) is never run: the one on
    # the fixed PATH is (this machine's docker CLI, with no daemon: its own words come back)
    fake = tmp_path / "bin"
    fake.mkdir()
    marker = tmp_path / "MARKER"
    for rt in ("docker", "podman"):
        (fake / rt).write_text(FAKE.format(marker=marker))
        (fake / rt).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    if not shutil.which("docker", path=SAFE_PATH):
        pytest.skip(f"no docker CLI on {SAFE_PATH} here")
    t = ContainerTransport(LocalTransport("here"), "c1", "docker").open()
    with pytest.raises(Exception) as info:
        t.call({"op": "status"}, timeout=30)
    assert not marker.exists(), marker.read_text()
    # the real CLI answered (no daemon here), in one sentence
    assert getattr(info.value, "kind", None) == "container", info.value
    assert str(info.value).startswith("here/c1: cannot reach container c1: ")


# The runtimes' own words (podman 4.3 as run here; docker's from its daemon's error responses).
RUNTIME_ERRORS = [
    ("podman", 125, 'Error: no container with name or ID "c1" found: no such container', "no container named c1"),
    ("docker", 1, "Error response from daemon: No such container: c1", "no container named c1"),
    ("podman", 125, "Error: can only create exec sessions on running containers: container state improper",
     "container c1 is not running; start it (`podman start c1`)"),
    ("docker", 1, "Error response from daemon: Container 3f2a is not running", "container c1 is not running"),
    ("docker", 1, "Error response from daemon: Container 3f2a is paused, unpause the container before exec",
     "container c1 is not running"),
    ("podman", 127, "sh: 1: python3: not found", "python3 not found in container c1"),
    ("docker", 126, 'OCI runtime exec failed: exec failed: unable to start container process: exec: "sh": '
                    'executable file not found in $PATH: unknown', "has no /bin/sh"),
    ("docker", 1, "permission denied while trying to connect to the Docker daemon socket at "
                  "unix:///var/run/docker.sock", "the runtime refused this user"),
]


@pytest.mark.parametrize("runtime,rc,err,want", RUNTIME_ERRORS)
def test_a_step_that_never_started_in_the_container_is_one_sentence(runtime, rc, err, want):
    got = not_started_reason("gpu01/c1", "c1", runtime, rc, err, "python3")
    assert got is not None and want in got.message and got.message.startswith("gpu01/c1: "), got


def test_other_failures_are_left_to_the_generic_sentences():
    assert not_started_reason("h/c", "c", "podman", 1, "sudo: a password is required", "python3") is None


@pytest.mark.parametrize("name", ["", "a b", "-x", "a;rm", "$(x)", "a/b"])
def test_a_container_name_is_checked_before_anything_runs(name):
    with pytest.raises(UsageError):
        check_name(name)


@pytest.mark.parametrize("argv,yes", [
    (["python3", "-m", "sglang.launch_server", "--model-path", "/m"], True),
    (["/usr/bin/python3", "/sgl-workspace/sglang/python/sglang/launch_server.py"], True),
    (["/opt/venv/bin/sglang", "serve", "--model-path", "/m"], True),
    (["python3", "-m", "sglang.bench_serving"], False),
    (["sleep", "600"], False),
    (["sglang-router", "serve"], False),
    (["/bin/bash", "-c", "python3 -m sglang.launch_server --port 30000"], False),   # a wrapper shell
    (["/bin/sh", "-c", "exec /opt/venv/bin/sglang serve --model-path /m"], False),
    (["python3 -m sglang.launch_server --port 31999"], True),   # a rewritten title: one string
    (["python3 -m sglang.launch_server --port 31999", "300"], True),   # `exec -a TITLE sleep 300`
])
def test_what_counts_as_an_sglang_server(argv, yes):
    assert is_sglang_server(argv) is yes


def test_docker_ps_json_lines():
    # `docker ps --no-trunc --format '{{json .}}'`: one object per line, Command quoted, Names comma-joined
    text = ('{"Command":"\\"python3 -m sglang.launch_server --model-path /models/k --port 30001\\"",'
            '"ID":"3f2a1b0c9d8e7f6a5b4c","Image":"lmsysorg/sglang:v0.5.9-cu129","Names":"sglang-30001",'
            '"State":"running","Status":"Up 2 minutes"}\n'
            '{"Command":"\\"sleep 600\\"","ID":"aa","Image":"debian","Names":"idle","State":"running"}\n')
    (c,) = parse_ps("docker", text)
    assert c == {"runtime": "docker", "name": "sglang-30001", "id": "3f2a1b0c9d8e", "image": "lmsysorg/sglang:v0.5.9-cu129",
                 "command": ["python3", "-m", "sglang.launch_server", "--model-path", "/models/k", "--port", "30001"],
                 "state": "running", "port": 30001}


def test_ps_output_that_is_not_json_is_no_container():
    assert parse_ps("podman", "") == [] and parse_ps("podman", "[oops") == [] and parse_ps("docker", "x\ny") == []


def test_auto_names_the_runtime_that_took_the_step():
    err = "provision-container-runtime: podman\nError: can only create exec sessions on running containers: " \
          "container state improper\n"
    got = not_started_reason("h/c1", "c1", "auto", 125, err, "python3")
    assert got is not None and "(`podman start c1`)" in got.message
    err = "provision-no-runtime-knows-the-container: docker podman\n"
    got = not_started_reason("h/c1", "c1", "auto", 125, err, "python3")
    assert got is not None and "no container named c1 on this host (asked docker and podman" in got.message


REFUSED_LINE = ("provision-untrusted-container-runtime: podman mode\t775\t/usr/local/sbin/podman\t"
                "/usr/local/sbin/podman\t/usr/local/sbin\n")


@pytest.mark.parametrize("runtime", ["podman", "auto"])
def test_a_runtime_that_fails_the_rule_is_one_sentence_naming_it_and_why(runtime):
    err = REFUSED_LINE + ("provision-no-runtime-knows-the-container: docker\n" if runtime == "auto" else "")
    got = not_started_reason("gpu01/c1", "c1", runtime, 126, err, "python3")
    assert got is not None and got.kind == "container" and "\n" not in got.message
    assert got.message.startswith("gpu01/c1: cannot reach container c1: /usr/local/sbin/podman not run: "
                                  "/usr/local/sbin is writable by group (mode 0775) (provision runs a container "
                                  "runtime as root only when"), got.message
    assert got.message.endswith("; docker, asked too, does not know it") == (runtime == "auto")


def test_auto_names_every_runtime_it_refused():
    err = REFUSED_LINE.replace(": podman ", ": docker ").replace("podman", "docker") + REFUSED_LINE \
        + "provision-no-runtime-knows-the-container:\n"
    got = not_started_reason("h/c1", "c1", "auto", 126, err, "python3")
    assert got is not None and ("/usr/local/sbin/docker not run: /usr/local/sbin is writable by group (mode 0775); "
                                "/usr/local/sbin/podman not run: /usr/local/sbin is writable by group (mode 0775) "
                                "(provision runs") in got.message, got.message
    assert "asked too" not in got.message


def test_a_refused_runtime_is_not_the_reason_when_another_took_the_step():
    # auto skipped a refused docker and podman took the step: podman's own words decide
    err = REFUSED_LINE.replace(": podman ", ": docker ") + "provision-container-runtime: podman\n" \
        "Error: can only create exec sessions on running containers: container state improper\n"
    got = not_started_reason("h/c1", "c1", "auto", 125, err, "python3")
    assert got is not None and "container c1 is not running" in got.message
