"""`provision sandbox up|down|status`: simulated SGLang hosts on this machine, over real sshd."""

from __future__ import annotations

import ipaddress
import os
import sys

import click

from provision.errors import EXIT_FAILED, EXIT_USAGE
from provision.sandbox.hosts import DEFAULT_BASE_DIR, AddressInUse, HostSpec, Sandbox, SandboxError
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
@base_dir_option
def up(count: int, version: str, layout: str, first_address: str, port: int, systemd_: bool, podman_: bool,
       gpu_capability: str | None, base_dir: str) -> None:
    """Start the hosts (kept if already running) and write inventory.yaml and an ssh config."""
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
    specs = [HostSpec(name=f"sbx{i + 1}", address=str(first + i), port=port,
                      sglang=None if layout == "none" else version, layout=layout,
                      kind="systemd" if systemd_ else "namespaces", podman=podman_, gpu_capability=gpu_capability)
             for i in range(count)]
    box = Sandbox(base_dir)
    why = differs(box, specs)
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
    except AddressInUse as exc:
        _fail(f"{exc} (another sandbox or sshd? try --first-address or --port)", EXIT_USAGE)
    except WheelUnavailable as exc:
        _fail(str(exc), EXIT_FAILED)
    except (SandboxError, SystemdUnavailable, ImageUnavailable) as exc:
        _fail(str(exc), EXIT_FAILED)
    inventory = box.write_inventory()
    suffix = "" if base_dir == DEFAULT_BASE_DIR else f" --base-dir {base_dir}"
    for h in hosts:
        where = {"source": "/root/sglang/python/sglang", "venv": "/opt/venv"}.get(h.layout, "no SGLang")
        sg = f"sglang {h.sglang_version} ({h.layout}: {where})" if h.sglang_version else "no SGLang"
        kind = "  systemd" if h.spec is not None and h.spec.kind == "systemd" else ""
        kind += f"  podman (image {image})" if image else ""
        click.echo(f"{h.name}  {h.address}:{h.port}  {sg}{kind}")
    click.echo(f"inventory:  {inventory}")
    click.echo(f"ssh config: {box.ssh_config_path}")
    click.echo("reach the hosts by name (this shell; `provision sandbox env` prints it again):")
    click.echo(f"  {env_line(box)}")
    click.echo(f"try:        provision status --host {hosts[0].name}")
    click.echo(f"            provision patch -i {inventory} --diff")
    click.echo(f"            ssh -F {box.ssh_config_path} {hosts[0].name}")
    gpus = hosts[0].spec.gpu_capability if hosts[0].spec is not None else None
    for line in STAND_INS:
        if gpus and "there are none: no nvidia-smi" in line:  # the stand-in nvidia-smi is there
            line = line.replace("there are none: no nvidia-smi",
                                f"a stand-in nvidia-smi reports 8 of compute capability {gpus}")
        click.echo(line)
    click.echo(f"            on this machine, {hosts[0].name}'s files are under {hosts[0].fs_dir}")
    click.echo(f"stop with:  provision sandbox down{suffix}")


def _options(spec: HostSpec) -> str:
    """The `up` options that made a host, as a user would type them."""
    out = [f"--version {spec.sglang}" if spec.sglang else "--layout none"]
    if spec.sglang and spec.layout != "source":
        out.append(f"--layout {spec.layout}")
    out += ["--systemd"] if spec.kind == "systemd" else []
    out += ["--podman"] if spec.podman else []
    out += [f"--gpu-capability {spec.gpu_capability}"] if spec.gpu_capability else []
    return " ".join(out)


def differs(box: Sandbox, specs: list) -> str | None:
    """Why this `up` would silently change the running sandbox (rebuild a host with other options,
    wiping its patches and servers, or stop listing one), or None. `up` keeps running hosts; it
    never rebuilds one behind the user's back (issue 37)."""
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
    return (f"{what}: repeat the options it runs with (`provision sandbox up --hosts {len(running)} {how}`), "
            "or `provision sandbox down` first to build it anew")


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
