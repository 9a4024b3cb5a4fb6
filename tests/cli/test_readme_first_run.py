"""The README's first run works as written: its fenced block is read out of README.md and run,
line by line, in one shell (so `eval "$(provision sandbox env)"` carries over), on a sandbox of
its own. Each line's comment is its promise: the exit code it names (`exit N`, else 0), and,
where it opens with a verdict (`missing:`, `patched`, ...), that verdict on sbx1's row.

A reader runs the README's command 1 first, and so does this test, in the same shell: it sets up
provision in a venv, runs the main job on a sandbox and takes the sandbox down again; the first run
then starts from a fresh host, with command 1's `provision` on PATH.

The only changes made to the lines: the sandbox lives in this test's own directory, on an
address and port the tests may use (`--base-dir`, `--first-address`, `--port` added to
`provision sandbox ...`, and the default base directory in a path replaced by it); in command 1, the
apt-get step is left out (.ci/run installed those packages), the venv is made in the test's own
directory, and pip installs offline from the wheelhouse .ci/run keeps (`--no-index --find-links`)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.cli.helpers import PROVISION
from tests.wheelhouse import wheelhouse  # noqa: F401  (a fixture)

pytestmark = pytest.mark.ssh

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
SECTION = "## A first run on the sandbox"
DEFAULT_BASE = "/var/tmp/provision-sandbox"
VERDICTS = ("missing", "would-patch", "patched", "unchanged", "unpatched", "ready", "stopped", "native", "failed",
            "measured")


def first_run_lines(text: str) -> list[tuple[str, str]]:
    """(command, comment) for each line of the section's first ```bash block."""
    section = text[text.index(SECTION):]
    block = section[section.index("```bash\n") + len("```bash\n"):]
    block = block[:block.index("```")]
    out = []
    for line in block.splitlines():
        if not line.strip():
            continue
        m = re.match(r"^(.*?)\s{2,}#\s?(.*)$", line)
        command, comment = (m.group(1), m.group(2)) if m else (line, "")
        out.append((command.strip(), comment.strip()))
    return out


def command_one(text: str) -> str:
    """The line under `# 1.` in the README's first ```bash block."""
    block = text[text.index("```bash\n") + len("```bash\n"):]
    block = block[:block.index("```")].splitlines()
    i = next(k for k, line in enumerate(block) if line.startswith("# 1."))
    return next(line for line in block[i + 1:] if line.strip()).strip()


def command_one_for_this_test(command: str, base: Path, address: str, port: int, venv: Path, wheels: Path) -> str:
    apt = re.match(r"^apt-get update && apt-get install -y [^&]+ && ", command)
    assert apt, command
    command = command[apt.end():]
    command = command.replace("/opt/provision", str(venv))
    command = command.replace(f"{venv}/bin/pip install .",
                              f"{venv}/bin/pip install -q --disable-pip-version-check --no-index --find-links {wheels} .")
    return for_this_test(command, base, address, port)


def expected_exit(comment: str) -> int:
    m = re.search(r"\bexit (\d+)", comment)
    return int(m.group(1)) if m else 0


def expected_verdict(comment: str) -> str | None:
    word = re.match(r"^([a-z-]+)\b", comment)
    return word.group(1) if word and word.group(1) in VERDICTS else None


def for_this_test(command: str, base: Path, address: str, port: int) -> str:
    command = command.replace(DEFAULT_BASE, str(base))
    for verb, extra in (("up", f" --first-address {address} --port {port}"), ("env", ""), ("down", "")):
        command = re.sub(rf"\bprovision sandbox {verb}\b", f"provision sandbox {verb} --base-dir {base}{extra}",
                         command)
    return command


def test_the_readme_block_is_what_this_test_reads():
    lines = first_run_lines(README.read_text())
    commands = [c for c, _ in lines]
    assert commands[0] == "provision sandbox up" and commands[-1] == "provision sandbox down", commands
    assert all(c.startswith("provision ") or c.startswith('eval "$(provision ') for c in commands), commands
    assert all(comment for _, comment in lines), "every line of the first run says what it does"
    assert [expected_exit(c) for _, c in lines[:4]] == [0, 0, 4, 4]


def test_command_one_is_what_the_first_run_follows():
    text = README.read_text()
    one = command_one(text)
    assert "python3 -m venv" in one and "pip install ." in one, "command 1 works with a stock Debian python3"
    assert one.endswith("provision sandbox down"), "command 1 leaves no sandbox for the first run to find"


@pytest.mark.timeout(400)  # a venv and an offline pip install of provision, then the two runs: 1-2 min
def test_the_readme_first_run_runs_as_written(tmp_path, sandbox_factory, wheelhouse):
    base = tmp_path / "sbx"
    address, port = sandbox_factory._address(), sandbox_factory.port
    text = README.read_text()
    lines = first_run_lines(text)
    marker = "@@provision-readme-line"
    own, deps = wheelhouse
    script = ["set +e", "export COLUMNS=200", f"cd {REPO}",
              "echo '@@provision-command-one start'",
              command_one_for_this_test(command_one(text), base, address, port, tmp_path / "venv", deps) + " 2>&1",
              'echo "@@provision-command-one rc=$?"',
              f'[ "$(command -v provision)" = "{tmp_path}/venv/bin/provision" ] || echo "@@not the venv\'s provision"']
    for i, (command, _) in enumerate(lines):
        script.append(f"echo '{marker} {i} start'")
        script.append(for_this_test(command, base, address, port) + " 2>&1")
        script.append(f"echo \"{marker} {i} rc=$?\"")
    try:
        proc = subprocess.run(["bash", "-c", "\n".join(script)], capture_output=True, text=True, timeout=900,
                              stdin=subprocess.DEVNULL, env=dict(os.environ))
    finally:
        subprocess.run([PROVISION or "provision", "sandbox", "down", "--base-dir", str(base)],
                       capture_output=True, text=True, timeout=300)
    one = proc.stdout.split("@@provision-command-one start\n", 1)[-1].split(f"{marker} 0 start", 1)[0]
    assert "@@provision-command-one rc=0" in one, f"README command 1:\n{one}\n{proc.stderr}"
    assert "@@not the venv" not in one, one
    assert re.search(r"^sbx1\s+ready\b", one, flags=re.M) and "Traceback" not in one, one
    outputs = re.split(rf"^{marker} (\d+) start\n", proc.stdout, flags=re.M)[1:]
    runs = dict(zip(outputs[0::2], outputs[1::2]))
    assert len(runs) == len(lines), proc.stdout + proc.stderr
    for i, (command, comment) in enumerate(lines):
        body = runs[str(i)]
        rc = int(re.search(rf"^{marker} {i} rc=(\d+)$", body, flags=re.M).group(1))
        shown = f"README line {command!r} (# {comment}):\n{body}"
        assert rc == expected_exit(comment), shown
        assert "Traceback" not in body, shown
        verdict = expected_verdict(comment)
        if verdict:
            assert re.search(rf"^sbx1\s+{verdict}\b", body, flags=re.M), shown
    history = runs[str(next(i for i, (c, _) in enumerate(lines) if c.startswith("provision history")))]
    assert "patched" in history and "unpatched" in history, history
