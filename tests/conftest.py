"""Shared fixtures: simulated SGLang hosts over real sshd (see provision/sandbox/hosts.py).

Fixtures
  sandbox_factory  session: one Sandbox in a tmp dir; ``sandbox_factory.host(...)`` /
                   ``.up(spec, ...)`` make hosts on fresh addresses (127.0.0.101 and up;
                   under xdist each worker has a block of its own: first_test_address()).
  three_hosts      per test: a 0.5.9 source checkout, a 0.5.9 venv and a 0.5.10 venv host,
                   built once per module and ``reset()`` before each test (processes
                   killed, files `up` did not make removed, SGLang pristine, sshd thawed).
  reset_sglang     a function: ``reset_sglang(host)`` undoes SGLang edits mid-test.
  ssh_env          paths a client needs (ssh config, identity, known_hosts), the CLI
                   arguments built from them, an inventory writer and an ``ssh()`` helper.

Every test that uses one of these is marked ``ssh`` and is skipped, with the reason,
where the sandbox cannot run (not root, no sshd, no namespaces, ...).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

SANDBOX_FIXTURES = {"sandbox_factory", "three_hosts", "ssh_env", "reset_sglang", "three_hosts_module"}
# The tiers that start hosts, containers, servers or real SGLang imports: `-m "not slow"` leaves
# them out (the quick tier: tests/unit, tests/engine, tests/host; docs/TESTING.md).
SLOW_TIERS = {"cli", "remote", "containers", "systemd", "realimport", "realvllm"}
# Modules of the quick tiers that start the stand-in server as a process (a real SGLang's parser, a
# load, an HTTP server) or read every model file of several real vLLM releases: seconds a test, 350
# test-seconds together, so they run in CI and not in the inner loop (issue 64: the quick tier <= 2 min).
SLOW_MODULES = {"engine/test_standin.py", "engine/test_standin_generate.py", "engine/test_vllm_audit.py",
                "engine/test_real_lines.py"}
# The modules that take longest (CI's machine, under the suite's load: test_realvllm.py ~40 min of
# one worker, test_realvllm_eagle3.py ~26), handed out first: pytest-xdist's `--dist loadscope` gives
# each worker the next module in the order it finds them, and by itself orders them by their number of
# tests, so these few-test, long modules went out last and the run waited on them alone (longest
# first: the tail is the suite's, not one module's). The rest: most tests first, as xdist would.
FIRST_MODULES = ("realvllm/test_realvllm.py", "realvllm/test_realvllm_eagle3.py", "cli/test_upgrade_fleet.py",
                 "remote/test_router_roll.py", "cli/test_upgrade.py", "realimport/test_realimport_local.py",
                 "cli/test_upgrade_group.py", "realvllm/test_own_check.py")

# Property tests are deterministic: a fixed seed (derandomize) and no example database, so a fresh
# clone and CI draw the same examples every run; an example that ever found a bug stays as an
# explicit @example beside its test. `--hypothesis-profile explore` draws new ones, for hunting.
hypothesis_settings.register_profile("deterministic", derandomize=True, database=None, print_blob=True)
hypothesis_settings.register_profile("explore", derandomize=False, database=None, print_blob=True)
hypothesis_settings.load_profile("deterministic")


def worker_index() -> int:
    """0 in a plain run; N on pytest-xdist's worker gwN."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


def first_test_address() -> str:
    """Each xdist worker makes its hosts in a loopback block of its own (127.N+1.0.0/16 for gwN), so
    workers never race for an address; a plain run uses 127.0.0.101 and up (`provision sandbox up`
    uses 127.0.0.11+ by default)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return "127.0.0.101"
    return f"127.{worker_index() + 1}.0.10"

_problems: list[str] | None = None


def sandbox_problems() -> list[str]:
    global _problems
    if _problems is None:
        from provision.sandbox.hosts import Sandbox
        _problems = Sandbox.check_prereqs()
    return _problems


def _source_of(item) -> str:
    """The test function's source (a test elsewhere that starts the stand-in says `Standin(`)."""
    import inspect

    try:
        return inspect.getsource(item.function)
    except (OSError, TypeError, AttributeError):
        return ""


def pytest_configure(config):
    """The controller measures the machine's pace once (tests/pace.py), before xdist starts its
    workers: they inherit it in the environment. A value already set (PROVISION_TEST_PACE=1 to keep
    the reference bounds) is kept."""
    from tests import pace

    if not os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get(pace.ENV):
        os.environ[pace.ENV] = f"{pace.measure():.2f}"
    if not os.environ.get("PYTEST_XDIST_WORKER") and os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
        # A machine that writes no bytecode (CI's sets PYTHONDONTWRITEBYTECODE) had every `provision` a
        # test runs compile provision from source again, ~0.1 s of CPU each, thousands of times a run:
        # the bytecode goes to a cache of its own instead (never into the checkout or an install)
        os.environ.setdefault("PYTHONPYCACHEPREFIX", str(Path(os.environ.get("XDG_CACHE_HOME")
                                                              or Path.home() / ".cache") / "provision-pyc"))
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False  # the modules' order is longest_first's (FIRST_MODULES)


def pytest_report_header(config):
    from tests import pace

    return f"machine pace: {pace.pace():.2f} (time bounds x that; tests/pace.py)"


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Every test's pytest timeout (its own mark, else pyproject's) scaled by the machine's pace,
    set before pytest-timeout reads it. The real-vLLM tier scales its own (tests/realvllm/conftest.py)."""
    from tests import pace

    if pace.pace() > 1.0 and item.get_closest_marker("realvllm") is None:
        mark = item.get_closest_marker("timeout")
        bound = float(mark.args[0]) if mark is not None and mark.args else float(item.config.getini("timeout") or 0)
        if bound > 0:
            item.add_marker(pytest.mark.timeout(int(pace.seconds(bound))), append=False)
    yield


def pytest_collection_modifyitems(config, items):
    marked = []
    tests_dir = Path(__file__).parent
    for item in items:
        if "ssh" in item.keywords or SANDBOX_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ssh)
            marked.append(item)
        module = _module_of(item, tests_dir)
        tier = module.split("/")[0]
        if tier in SLOW_TIERS or module in SLOW_MODULES or "ssh" in item.keywords or "realimport" in item.keywords \
                or "Standin(" in _source_of(item):
            item.add_marker(pytest.mark.slow)
    if marked and sandbox_problems():
        skip = pytest.mark.skip(reason="sandbox hosts unavailable: " + "; ".join(sandbox_problems()))
        for item in marked:
            item.add_marker(skip)
    items[:] = longest_first(items, tests_dir)


def _module_of(item, tests_dir: Path) -> str:
    """The item's module relative to tests/ ("cli/test_upgrade.py"); "" outside it."""
    try:
        return "/".join(Path(str(item.fspath)).relative_to(tests_dir).parts)
    except ValueError:
        return ""


def longest_first(items: list, tests_dir: Path) -> list:
    """The items module by module (each module's own order kept): FIRST_MODULES in their order, then
    the rest by their number of tests, most first (xdist's own order, which it no longer applies)."""
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(_module_of(item, tests_dir) or str(item.fspath), []).append(item)

    def rank(key: str) -> tuple:
        first = FIRST_MODULES.index(key) if key in FIRST_MODULES else len(FIRST_MODULES)
        return first, -len(modules[key])

    return [item for key in sorted(modules, key=rank) for item in modules[key]]


@pytest.fixture(scope="session", autouse=True)
def isolated_home(tmp_path_factory):
    """Every test, and every `provision` it runs, works in its own HOME and XDG dirs, with
    its own journal and lock: the user's ~/.local/state/provision, ~/.ssh and ~/.config
    are never read or written (.ci/run checks the journal, known_hosts and ssh config are
    byte-identical afterwards). The real HOME stays in $PROVISION_REAL_HOME for tests that
    look for things installed there (other Pythons under ~/.pyenv), and the wheel cache
    stays where it is."""
    from provision.sandbox.homedir import isolate, restore

    old = isolate(tmp_path_factory.mktemp("home"))
    try:
        yield os.environ["HOME"]
    finally:
        restore(old)


def _port_for_tests() -> int:
    """22 unless something listens on *:22 (then no 127.0.0.x:22 is free). Probed on an address of
    this worker's own block, so two workers probing at once never see each other."""
    probe = first_test_address().rsplit(".", 1)[0] + ".254"
    for port in (22, 10022, 20022):
        s = socket.socket()
        try:
            s.bind((probe, port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    return 30022


class SandboxFactory:
    """Makes hosts with unique names and addresses in one session-wide Sandbox."""

    def __init__(self, sandbox, port: int):
        self.sandbox = sandbox
        self.port = port
        self._next = ipaddress.IPv4Address(first_test_address())
        self._count = 0

    # paths
    @property
    def ssh_config_path(self) -> Path:
        return self.sandbox.ssh_config_path

    @property
    def key_path(self) -> Path:
        return self.sandbox.key_path

    @property
    def known_hosts_path(self) -> Path:
        return self.sandbox.known_hosts_path

    def _address(self) -> str:
        """The next loopback address whose sshd port is free: another sandbox on this machine (a
        `provision sandbox up`, another test session) may hold some of them."""
        addr = self._next
        self._next += 1
        if addr.packed[3] in (0, 255):  # skip .0/.255 when crossing into 127.0.1.x
            return self._address()
        if not addr.is_loopback:
            raise RuntimeError("sandbox_factory ran out of loopback addresses")
        s = socket.socket()
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((str(addr), self.port))
        except OSError:
            return self._address()
        finally:
            s.close()
        return str(addr)

    def up(self, *specs):
        """Start HostSpecs as given, but an address of None/"auto" gets the next free one
        (skipping addresses another sandbox on this machine already uses)."""
        from provision.sandbox.hosts import AddressInUse
        from provision.sandbox.wheels import WheelUnavailable
        auto = [s for s in specs if s.address in (None, "", "auto")]
        if len(specs) > 1:  # fast path: all at once (in parallel); one by one if an address is taken
            for spec in auto:
                spec.address, spec.port = self._address(), self.port
            try:
                return self.sandbox.up(list(specs))
            except AddressInUse:
                for spec in auto:
                    spec.address = "auto"
            except WheelUnavailable as exc:
                pytest.skip(f"SGLang wheel unavailable: {exc}")
        hosts = []
        for spec in specs:
            auto = spec.address in (None, "", "auto")
            for _ in range(64):
                if auto:
                    spec.address = self._address()
                    spec.port = self.port
                try:
                    hosts += self.sandbox.up([spec])
                    break
                except AddressInUse:
                    if not auto:
                        raise
                except WheelUnavailable as exc:  # no network and no cached wheel
                    pytest.skip(f"SGLang {spec.sglang} wheel unavailable: {exc}")
            else:
                raise RuntimeError("sandbox_factory found no free loopback address")
        return hosts

    def host(self, name: str | None = None, sglang: str | None = "0.5.9", layout: str = "source",
             git: bool = False, flashinfer: str | None = None, gpu_capability: str | None = None,
             vllm: str | None = None):
        """One new host (name defaults to h1, h2, ...); `flashinfer`: a version beside SGLang (venv);
        `gpu_capability`: a stand-in nvidia-smi reporting it; `vllm`: a vLLM release's .py files (venv)."""
        from provision.sandbox.hosts import HostSpec
        self._count += 1
        spec = HostSpec(name=name or f"h{self._count}", address="auto", sglang=sglang,
                        layout=layout if sglang else "none", port=self.port, git=git, flashinfer=flashinfer,
                        gpu_capability=gpu_capability, vllm=vllm)
        return self.up(spec)[0]

    def remove(self, *hosts) -> None:
        for h in hosts:
            self.sandbox.remove(getattr(h, "name", h))


@pytest.fixture(scope="session")
def sandbox_factory(tmp_path_factory):
    problems = sandbox_problems()
    if problems:
        pytest.skip("sandbox hosts unavailable: " + "; ".join(problems))
    from provision.sandbox.hosts import Sandbox
    # owner_pid: if this pytest dies without teardown, the hosts kill themselves.
    box = Sandbox(tmp_path_factory.mktemp("sandbox"), owner_pid=os.getpid())
    try:
        yield SandboxFactory(box, _port_for_tests())
    finally:
        box.down()


@dataclass
class ThreeHosts:
    source: object     # sglang 0.5.9, checkout at /root/sglang/python/sglang (PYTHONPATH needed)
    venv: object       # sglang 0.5.9 in /opt/venv
    venv_new: object   # sglang 0.5.10 in /opt/venv

    def __iter__(self):
        return iter((self.source, self.venv, self.venv_new))

    @property
    def names(self) -> list[str]:
        return [h.name for h in self]


@pytest.fixture(scope="module")
def three_hosts_module(sandbox_factory, request):
    from provision.sandbox.hosts import HostSpec
    tag = "".join(c for c in request.module.__name__.rsplit(".", 1)[-1] if c.isalnum())[-12:]
    n = sandbox_factory._count = sandbox_factory._count + 1
    specs = [HostSpec(f"src-{tag}{n}", "auto", "0.5.9", "source", sandbox_factory.port),
             HostSpec(f"venv-{tag}{n}", "auto", "0.5.9", "venv", sandbox_factory.port),
             HostSpec(f"new-{tag}{n}", "auto", "0.5.10", "venv", sandbox_factory.port)]
    hosts = ThreeHosts(*sandbox_factory.up(*specs))
    try:
        yield hosts
    finally:
        sandbox_factory.remove(*hosts)


@pytest.fixture
def three_hosts(three_hosts_module):
    """The module's three hosts, reset to as-built before the test."""
    for host in three_hosts_module:
        host.reset()
    return three_hosts_module


@pytest.fixture
def reset_sglang():
    def reset(host):
        host.reset_sglang()
    return reset


@dataclass
class SshEnv:
    ssh_config: Path
    identity: Path
    known_hosts: Path
    sandbox: object

    @property
    def cli_args(self) -> list[str]:
        """What `provision` needs to reach sandbox hosts by name."""
        return ["--ssh-config", str(self.ssh_config), "--identity", str(self.identity),
                "--known-hosts", str(self.known_hosts)]

    def inventory(self, path, hosts) -> Path:
        """Write an inventory (the `provision sandbox up` format) for these hosts only."""
        return self.sandbox.write_inventory(path, [getattr(h, "name", h) for h in hosts])

    def ssh_argv(self, host, *command: str) -> list[str]:
        return ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                getattr(host, "name", host), *command]

    def ssh(self, host, command: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run a command on a host with the OpenSSH client."""
        return subprocess.run(self.ssh_argv(host, command), capture_output=True, text=True,
                              check=check, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def ssh_env(sandbox_factory):
    box = sandbox_factory.sandbox
    return SshEnv(box.ssh_config_path, box.key_path, box.known_hosts_path, box)
