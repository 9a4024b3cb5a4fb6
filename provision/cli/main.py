"""The `provision` command line. Thin: parse flags, pick hosts, run, report.

This module holds the group, the ONE set of option decorators every command shares, and the
fleet runner; the commands live in cli/patch.py, cli/launch.py, cli/fleet.py and cli/audit.py.
Heavy modules (fabric, paramiko, rich) are imported inside commands so that
`provision --help` and no-op runs start fast.
"""

from __future__ import annotations

import functools

import click

from provision import __version__
from provision.errors import (EXIT_CODES, EXIT_INTERRUPTED, EXIT_NOTHING, ProvisionError, UsageError)

EXIT_HELP = "\n".join(f"  {code:<4}{text}" for code, text in EXIT_CODES.items())


class Ctx:
    """What every fleet command shares: hosts, connection options, output mode."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


FORMATS = ("auto", "table", "lines", "json")


def format_options(json_is: str = "one document", prometheus: bool = False):
    """--format and --json: how the report is printed (fleet commands, and `history`). With
    `prometheus`, --format prometheus is a choice too (fleet_options: only commands decorated with
    metrics_options accept it)."""
    def deco(fn):
        fn = click.option("--json", "as_json", is_flag=True, help="Same as --format json.")(fn)
        choices = FORMATS + (("prometheus",) if prometheus else ())
        prom = "; prometheus: the text exposition format" if prometheus else ""
        return click.option("--format", "fmt", type=click.Choice(choices), default="auto", show_default=True,
                            help="table: aligned columns; lines: one line per row, fields separated by two spaces, "
                                 f"nothing truncated; json: {json_is}{prom}. auto: table on a terminal, "
                                 "else lines.")(fn)
    return deco


def fleet_options(fn):
    """Host selection and connection flags, shared by every fleet command."""
    opts = [
        click.option("--host", "hosts", multiple=True, metavar="HOST",
                     help="Host name or address (repeatable). Names go through your OpenSSH config. With -i, "
                          "it must name a host of the inventory."),
        click.option("-i", "--inventory", "inventory", metavar="SRC",
                     help="Inventory, as in Ansible: a file (ours, Ansible YAML or INI), a directory, or a "
                          "comma-separated host list ending in a comma (-i gpu01,gpu02,)."),
        click.option("--limit", "-l", metavar="PATTERN",
                     help="Select inventory hosts: names, groups or globs, comma-separated; !x excludes."),
        click.option("--private-key", "--identity", "identity", metavar="KEY",
                     help="Private key file (default: IdentityFile from ssh config, then ssh-agent and ~/.ssh)."),
        click.option("--user", "-u", metavar="USER", help="SSH user (default: inventory, ssh config, then root)."),
        click.option("--port", "-p", type=int, metavar="PORT",
                     help="SSH port (default: inventory, ssh config, then 22). --server-port is the inference "
                          "server's."),
        click.option("--ssh-config", metavar="FILE", envvar="PROVISION_SSH_CONFIG",
                     help="OpenSSH client config to read instead of ~/.ssh/config (and /etc/ssh/ssh_config); "
                          "env PROVISION_SSH_CONFIG."),
        click.option("--known-hosts", metavar="FILE", envvar="PROVISION_KNOWN_HOSTS",
                     help="known_hosts file (default: UserKnownHostsFile from ssh config, then ~/.ssh/known_hosts)."),
        click.option("--accept-new-host-keys", is_flag=True,
                     help="Record unknown host keys (appending to known_hosts); changed keys are still refused."),
        click.option("--forks", "-f", type=click.IntRange(1, 512), default=16, show_default=True,
                     help="Hosts worked on at once (-f as in Ansible; --force is never shortened)."),
        click.option("--connect-timeout", type=click.FloatRange(min=0.1), default=None, metavar="S",
                     help="Seconds to wait for a host's SSH handshake (default: ConnectTimeout from ssh config, "
                          "then 10)."),
        click.option("--timeout", "command_timeout", type=float, default=300.0, show_default=True, metavar="S",
                     help="Deadline for each remote step; a host that exceeds it fails on its own."),
        click.option("--sudo/--no-sudo", default=None,
                     help="Run remote steps through `sudo -n` (default: inventory `sudo:`/ansible_become, "
                          "then when the SSH user is not root)."),
        click.option("--sudo-password-file", metavar="FILE", envvar="PROVISION_SUDO_PASSWORD_FILE",
                     help="sudo password (first line of FILE): sent on stdin when sudo asks, never on a "
                          "command line; sudo then runs as `sudo -S` instead of `sudo -n`."),
    ]
    # --format offers prometheus only where it is taken (commands under metrics_options)
    fn = format_options(prometheus=getattr(fn, "prometheus", False))(fn)
    for opt in reversed(opts):
        fn = opt(fn)

    @functools.wraps(fn)
    def wrapper(hosts, inventory, limit, identity, user, port, ssh_config, known_hosts,
                accept_new_host_keys, forks, connect_timeout, command_timeout, sudo, sudo_password_file, fmt,
                as_json, **kw):
        from provision.output.report import resolve_format
        from provision.control.runner import ConnOptions

        fmt = resolve_format("json" if as_json else fmt)
        if fmt == "prometheus" and not getattr(fn, "prometheus", False):
            raise UsageError("--format prometheus is for `status` and `bench`")
        ctx = Ctx(hosts=list(hosts), inventory=inventory, limit=limit, as_json=fmt == "json", fmt=fmt,
                  conn=ConnOptions(user=user, port=port, identity=identity, ssh_config=ssh_config,
                                   known_hosts=known_hosts, accept_new_host_keys=accept_new_host_keys,
                                   connect_timeout=connect_timeout, command_timeout=command_timeout, forks=forks,
                                   sudo=sudo, sudo_password_file=sudo_password_file))
        return fn(ctx, **kw)

    return wrapper


def transport_options(*, container: bool = True):
    """--local (this machine, no SSH) and, unless ``container=False``, --container/--runtime
    (a running container on the host): which way the host-side step travels. Apply under
    fleet_options. The runner picks the transport (control/runner.py Fleet.session)."""
    def deco(fn):
        opts = [
            click.option("--local", is_flag=True,
                         help="Work on this machine itself, with no SSH: the same host-side code, journal and exit "
                              "codes (a Dockerfile's RUN, a host's own timer). Takes no --host/-i."),
            click.option("--state-dir", metavar="DIR",
                         help="With --local: where this machine keeps provision's backups, state and lock (default "
                              "/var/lib/provision as root, else ~/.local/state/provision)."),
        ]
        if container:
            opts += [
                click.option("--container", metavar="NAME",
                             help="Act inside this running container on the host (through `RUNTIME exec -i`): its "
                                  "SGLang, its files, its own state dir. The edit survives `RUNTIME restart`, not "
                                  "recreating the container."),
                click.option("--runtime", type=click.Choice(["auto", "docker", "podman"]), default=None,
                             help="With --container: the host's container runtime (default auto: the first of "
                                  "docker and podman on the host's PATH that knows the container)."),
            ]
        for opt in reversed(opts):
            fn = opt(fn)

        @functools.wraps(fn)
        def wrapper(ctx, local, state_dir, container=None, runtime=None, **kw):
            check_transport(hosts=ctx.hosts, inventory=ctx.inventory, limit=ctx.limit, local=local,
                            state_dir=state_dir, container=container, runtime=runtime)
            ctx.conn.local, ctx.conn.container, ctx.conn.runtime = local, container, runtime
            if local:
                import os

                ctx.conn.state_dir = os.path.abspath(state_dir) if state_dir else None
                for key in ("install_path", "python_"):  # the step runs in /, as on a host
                    if kw.get(key) and os.sep in kw[key]:
                        kw[key] = os.path.abspath(kw[key])
            return fn(ctx, **kw)

        return wrapper

    return deco


def check_transport(*, hosts=(), inventory=None, limit=None, local=False, state_dir=None, container=None,
                    runtime=None) -> None:
    """The transport flags make sense together, or exit 2 before anything runs."""
    if local and (hosts or inventory or limit):
        raise UsageError("--local works on this machine itself: drop --host/-i/--limit, or drop --local")
    if state_dir and not local:
        raise UsageError("--state-dir is this machine's state directory: it goes with --local")
    if state_dir and container:
        raise UsageError("--state-dir is this machine's; a container keeps its own: drop --state-dir")
    if runtime and not container:
        raise UsageError("--runtime says how to reach --container NAME: give --container too, or drop --runtime")
    if container:
        from provision.control.transport.container import check_name

        check_name(container)


def selected_hosts(ctx: Ctx):
    """The hosts to work on. An unknown --host (with -i) or a --limit matching nothing is exit 5,
    naming the hosts that do exist."""
    from provision.errors import NoHostsError
    from provision.config.inventory import adhoc, existing_names, load_inventory, select
    from provision.tasks.selection import set_inventory

    # every hint names a host the way this run was given it (`-i INVENTORY --host NAME`): it pastes
    set_inventory(None if getattr(ctx.conn, "local", False) else ctx.inventory)
    if getattr(ctx.conn, "local", False):
        from provision.config.inventory import Host
        from provision.control.transport.local import machine_name

        return [Host(name=machine_name())]
    if not ctx.hosts and not ctx.inventory:
        raise UsageError("say which hosts: --host HOST (repeatable) or -i INVENTORY (or --local: this machine)")
    if not ctx.inventory:
        if ctx.limit:
            raise UsageError("--limit selects inventory hosts: give -i INVENTORY too, or drop --limit")
        return adhoc(ctx.hosts).hosts
    inv = getattr(ctx, "_inventory", None) or load_inventory(ctx.inventory)
    if getattr(ctx, "_inventory", None) is None:
        ctx._inventory = inv
        for note in inv.notes:
            click.echo(f"note: {note}", err=True)
    hosts = select(inv, ctx.limit)
    if ctx.limit and not hosts:
        raise NoHostsError(f"--limit {ctx.limit} matches no host of {inv.path}; nothing was done. "
                           f"It has: {existing_names(inv)}")
    if ctx.hosts:
        known = {h.name for h in hosts}
        unknown = [n for n in ctx.hosts if n not in known]
        if unknown:
            where = f"{inv.path}" + (f" (--limit {ctx.limit})" if ctx.limit else "")
            raise NoHostsError(f"--host {', '.join(unknown)}: not {'a host' if len(unknown) == 1 else 'hosts'} of "
                               f"{where}; nothing was done. It has: {existing_names(inv, hosts if ctx.limit else None)}")
        wanted = set(ctx.hosts)
        hosts = [h for h in hosts if h.name in wanted]
    return hosts


def check_specs(ctx: Ctx, pspec) -> None:
    """Load every selected host's patch specs (`specs:`/`spec:` in the inventory) before any host
    is touched: a spec the host-side engine would reject, or two specs of one host editing the
    same file, is exit 2 here, once, not exit 3 per host."""
    from provision.config.inventory import host_spec_names
    from provision.config.playbook import load_patch_spec
    from provision.tasks.specs import check_distinct

    if pspec is not None:
        check_distinct(pspec if isinstance(pspec, list) else [pspec], "--playbook")
        return
    loaded: dict = {}
    for h in selected_hosts(ctx):
        names = host_spec_names(h)
        for name in names:
            if name not in loaded:
                loaded[name] = load_patch_spec(name)
        check_distinct([loaded[n] for n in names], f"host {h.name}")


def print_result(ctx: Ctx, r, *, check: bool = False, show_diff: bool = False) -> None:
    """One host's line (and its notes and diff) as it arrives; nothing in JSON mode."""
    from provision.output import report

    if ctx.as_json or ctx.fmt == "prometheus":
        return
    # With a table to follow (several hosts), the lines as they arrive are progress: stderr, so that
    # stdout (`> out`, a pipe) holds the table once, not every host twice.
    progress = ctx.fmt == "table" and getattr(ctx, "many_hosts", False)
    click.echo(report.host_line(r, check=check), err=progress)
    for note in r.notes:
        click.echo(f"    note: {note}", err=progress)
    if show_diff and r.diff:
        click.echo(r.diff, nl=not r.diff.endswith("\n"))


def print_summary(ctx: Ctx, command: str, results, code: int, columns: list[str] | None = None,
                  extra: dict | None = None, check: bool = False) -> None:
    """After the run: the JSON document, or (for several hosts) the table and the summary line."""
    from provision.output import report

    if ctx.as_json:
        click.echo(report.to_document(command, results, code, extra, secrets=getattr(ctx, "secrets", ())))
    elif ctx.fmt == "prometheus":
        return  # the command prints the metrics (output/prometheus.py)
    elif len(results) > 1:
        if ctx.fmt == "table":
            report.print_table(report.host_columns(columns), report.host_rows(results, columns, check))
        click.echo(report.summary_line(results, check))


def run_fleet(ctx: Ctx, command: str, fn, *, check: bool = False, show_diff: bool = False,
              columns: list[str] | None = None, journal: bool = True, exit_code=None, extra: dict | None = None) -> int:
    """Run fn on the selected hosts, print as results arrive, return the exit code."""
    from provision.output import report
    from provision.control.runner import Fleet, run_hosts

    hosts = selected_hosts(ctx)
    if not hosts:
        click.echo("error: no host matched the selection; nothing was done", err=True)
        return EXIT_NOTHING
    fleet = Fleet(ctx.conn)
    ctx.many_hosts = len(hosts) > 1
    writer = journal_writer(command) if journal and not check else None

    def arrived(r) -> None:
        if writer is not None:
            writer(r)  # journaled (fsync'd) before anything else: Ctrl-C/SIGTERM later keeps it
        print_result(ctx, r, check=check, show_diff=show_diff)

    try:
        results = run_hosts(fleet, hosts, fn, on_result=arrived)
    finally:
        fleet.close()
        if writer is not None:
            fleet.warnings.extend(writer.warnings)
    ctx.results = results  # for a command's own output after the run (status --format prometheus)
    for w in dict.fromkeys(fleet.warnings):
        click.echo(f"warning: {w}", err=True)
    code = exit_code(results) if exit_code else report.exit_code(results, check=check)
    print_summary(ctx, command, results, code, columns, extra=extra, check=check)
    return code


def journal_writer(command: str):
    """The run's journal, written host by host as rows arrive (control/journal.py's Writer)."""
    from provision.control.journal import Writer

    return Writer(command)


def _journal(command: str, results) -> None:
    """Append every change to the control machine's journal (provision/journal.py), if present."""
    try:
        from provision.control import journal
    except ImportError:
        return
    try:
        journal.record(command, results)
    except OSError as exc:
        click.echo(f"warning: could not write the journal: {exc}", err=True)


# Commands in their own modules, imported only when used (a no-op `provision patch` must start fast).
LAZY_COMMANDS = {
    "patch": "provision.cli.patch:patch", "unpatch": "provision.cli.patch:unpatch",
    "status": "provision.cli.patch:status",
    "launch": "provision.cli.launch:launch", "wait": "provision.cli.launch:wait",
    "stop": "provision.cli.launch:stop", "logs": "provision.cli.launch:logs",
    "audit": "provision.cli.audit:audit", "spec": "provision.cli.audit:spec",
    "reconcile": "provision.cli.fleet:reconcile", "restore": "provision.cli.fleet:restore",
    "history": "provision.cli.fleet:history", "schedule": "provision.cli.fleet:schedule",
    "overlay": "provision.cli.overlay:overlay",
    "bench": "provision.cli.bench:bench",
    "upgrade": "provision.cli.upgrade:upgrade",
}


# fleet_options' flags: which hosts and how to reach them, the same on every fleet command. `--help`
# shows them after the command's own options, under a heading of their own.
SHARED_PARAMS = ("hosts", "inventory", "limit", "identity", "user", "port", "ssh_config", "known_hosts",
                 "accept_new_host_keys", "forks", "connect_timeout", "command_timeout", "sudo", "sudo_password_file")


# Other tools' spellings of an option provision spells its own way: a mistyped one names ours.
SYNONYMS = {"--dry-run": "--check", "--dryrun": "--check", "--noop": "--check", "--what-if": "--check",
            "--spec": "--playbook", "--profile": "--playbook"}


class ProvisionCommand(click.Command):
    """A command whose --help puts its own options first, then the shared host and SSH ones."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            ours = SYNONYMS.get(exc.option_name)
            if ours and any(ours in p.opts for p in self.get_params(ctx)):
                exc.possibilities = [ours]
            raise

    def format_options(self, ctx, formatter):
        own, shared = [], []
        for param in self.get_params(ctx):
            rv = param.get_help_record(ctx)
            if rv is not None:
                (shared if param.name in SHARED_PARAMS else own).append(rv)
        if own:
            with formatter.section("Options"):
                formatter.write_dl(own)
        if shared:
            with formatter.section("Hosts and SSH (every fleet command)"):
                formatter.write_dl(shared)


class ProvisionGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS) | {"sandbox"})

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        if cmd is None and name == "sandbox":
            # the simulated hosts' commands: the product's one import of provision.sandbox
            from provision.sandbox.cli import sandbox

            return sandbox
        if cmd is None and name in LAZY_COMMANDS:
            import importlib

            modname, attr = LAZY_COMMANDS[name].split(":")
            cmd = getattr(importlib.import_module(modname), attr)
        for c in [cmd, *(getattr(cmd, "commands", {}) or {}).values()]:
            if c is not None and type(c) is click.Command:
                c.__class__ = ProvisionCommand  # the one help layout, said once for every command
        return cmd

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        if name != "sandbox":  # SIGTERM as Ctrl-C (control/signals.py); the simulated hosts keep the default
            from provision.control.signals import terminate_as_interrupt

            terminate_as_interrupt()
        return name, cmd, rest

    def invoke(self, ctx):
        from provision.control.signals import Terminated

        try:
            return super().invoke(ctx)
        except ProvisionError as exc:
            click.echo(f"error: {exc.message}", err=True)
            ctx.exit(exc.exit_code)
        except Terminated:
            click.echo("terminated (SIGTERM): stopped as on Ctrl-C (hosts mid-step are \"unknown\" and "
                       "journaled; no new host or batch was started)", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)


@click.group(cls=ProvisionGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog="Exit codes (every command):\n\n\b\n" + EXIT_HELP)
@click.version_option(__version__, prog_name="provision")
def main():
    """Provision GPU inference servers (SGLang, vLLM) over SSH: patch, launch, reconcile.

    \b
    provision patch --host gpu01             inject the EAGLE-3 delegation methods
    provision patch --host gpu01 --check --diff   show what would change
    provision status -i inventories/prod.yaml     version, install, patch state
    provision sandbox up                     a local simulated GPU host to try it on
    """
    from provision.cli.streams import quiet_broken_pipes
    from provision.config.testmode import check

    quiet_broken_pipes()  # `provision history | head` ends the output, never the run (cli/streams.py)
    check()  # a test-only switch (PROVISION_FAILPOINTS, ...) outside test mode: exit 2, nothing done


def renamed(old: str, new: str, dest: str, *, multiple: bool = False):
    """A retired spelling kept working: ``old`` is a hidden option that fills ``dest`` (the
    option now spelled ``new``) and says so on stderr, so no script breaks and its author learns
    the one name. Both given: exit 2. Apply above the option it stands for."""
    hidden_dest = "_old_" + old.lstrip("-").replace("-", "_")

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kw):
            value = kw.pop(hidden_dest)
            if value not in (None, ()):
                if kw.get(dest) not in (None, ()):
                    raise UsageError(f"{old} and {new} are one option: give {new} only")
                click.echo(f"note: {old} is now spelled {new}; the old spelling still works", err=True)
                kw[dest] = value
            return fn(*args, **kw)

        return click.option(old, hidden_dest, hidden=True, multiple=multiple)(wrapper)
    return deco


def spec_option(fn):
    """--playbook: the patch spec (restore: one file)."""
    fn = click.option("--playbook", "spec", metavar="PLAYBOOK",
                      help="The playbook whose patch spec names the file (a path, or a shipped name). "
                           "Default: the host's `spec:`, then kimi-k25-eagle3.")(fn)
    return renamed("--spec", "--playbook", "spec")(fn)


def specs_option(fn):
    """--playbook, repeatable: the patch specs a host carries (patch, unpatch, status, reconcile)."""
    fn = click.option("--playbook", "spec", metavar="PLAYBOOK", multiple=True,
                      help="The playbook whose patch spec to apply (a path, or a shipped name); repeat it for several "
                           "(one row per host and spec). Default: the host's "
                           "`specs:`/`spec:`, then kimi-k25-eagle3.")(fn)
    return renamed("--spec", "--playbook", "spec", multiple=True)(fn)


def gpu_option(fn):
    """--gpu-capability: what specs' `applies: gpu_capability` is decided from (patch, status, reconcile)."""
    return click.option("--gpu-capability", metavar="MAJOR.MINOR", callback=_capability,
                      help="The hosts' GPU compute capability (e.g. 12.0), for specs whose `applies:` names one, "
                           "where nvidia-smi cannot tell (default: the host's `gpu_capability`, then nvidia-smi; "
                           "without either such a spec is not-applicable).")(fn)


def _capability(ctx, param, value):
    if value is None:
        return None
    from provision.config.applies import normalise_capability
    from provision.errors import ConfigError

    try:
        return normalise_capability(value, "--gpu-capability")
    except ConfigError as exc:
        raise click.BadParameter(exc.message.split(": ", 1)[-1]) from None


def install_options(fn):
    """--sglang-path and --python: which install of the engine (SGLang, or vLLM for a vLLM spec or
    playbook) on the host a command acts on."""
    fn = click.option("--sglang-path", "install_path", metavar="DIR",
                      help="Pin the install: the `sglang` package directory itself (the one holding srt/).")(fn)
    fn = click.option("--python", "python_", metavar="PATH",
                      help="Interpreter whose SGLang to act on (default: the host's `python:`, then discovery: "
                           "a running server's, python3's, or the only install).")(fn)
    return fn


def metrics_options(fn):
    """--format prometheus is allowed, and --metrics-file PATH writes the same text atomically
    (status, bench; output/prometheus.py). Apply under fleet_options."""
    fn.prometheus = True
    return click.option("--metrics-file", metavar="PATH", type=click.Path(dir_okay=False),
                        help="Also write the metrics in Prometheus text format to PATH, atomically (a temp file, "
                             "then rename): for node_exporter's textfile collector (name it *.prom).")(fn)


def write_metrics(path: str | None, text: str) -> None:
    """--metrics-file: the text, atomically; an unwritable path is a one-line warning, not a traceback."""
    if not path:
        return
    from provision.output.prometheus import write_atomic

    try:
        write_atomic(path, text)
    except OSError as exc:
        click.echo(f"warning: could not write the metrics to {path}: {exc.strerror or exc}", err=True)


def check_option(fn):
    return click.option("--check", is_flag=True,
                        help="Decide and report, change nothing (exit 4 if changes are due).")(fn)


def diff_option(fn):
    return click.option("--diff", is_flag=True, help="Show a unified diff of each change.")(fn)


def profile_option(when: str = "", name: str = "--playbook"):
    """--playbook: the playbook whose launch profile starts or finds the server (launch, wait,
    stop, logs); reconcile's is --restart-playbook, beside its patch --playbook."""
    def deco(fn):
        fn = click.option(name, "profile", metavar="PLAYBOOK",
                          help=f"{when}{'t' if when else 'T'}he playbook whose `launch:` profile to use (a path, "
                               "or a shipped name). "
                               "Default: the host's `profile:`, then kimi-k25-eagle3.")(fn)
        return renamed("--profile", name, "profile")(fn)
    return deco


def server_port_option(default: str = "the profile's, with the inventory's `args:`"):
    """--server-port: the inference server's port on the host, one name on every command (launch,
    wait, stop, logs, bench); -p/--port is SSH's."""
    return click.option("--server-port", type=click.IntRange(1, 65535), metavar="PORT",
                        help=f"The inference server's port on the host (default: {default}). Not SSH's "
                             "port: that is -p/--port.")


def load_spec(spec):
    """The --playbook playbook's patch spec (a list of them for a repeatable --playbook), or None (each
    host's own `specs:`/`spec:`). Either way a broken default playbook fails here, exit 2, before
    any host is touched."""
    from provision.config.playbook import load_patch_spec

    if isinstance(spec, (tuple, list)):
        pspec = [load_patch_spec(s) for s in spec] or None
        if pspec is None:
            load_patch_spec(None)
        return pspec
    pspec = load_patch_spec(spec) if spec else None
    if pspec is None:
        load_patch_spec(None)
    return pspec


def entry():  # pragma: no cover - console script
    main()
