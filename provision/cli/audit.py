"""`provision audit` and `provision spec new`: find wrappers that break EAGLE-3, write their specs."""

from __future__ import annotations

import sys

import click

from provision.cli.main import fleet_options, install_options, renamed, run_fleet, transport_options
from provision.errors import EXIT_GAPS, EXIT_OK, UsageError


@click.command()
@fleet_options
@transport_options()
@renamed("--spec", "--playbook", "spec")
@click.option("--playbook", "spec", metavar="PLAYBOOK",
              help="Also count this playbook's spec as coverage (besides the shipped playbooks).")
@install_options
def audit(ctx, spec, install_path, python_):
    """Find every SGLang wrapper model whose EAGLE-3 methods are missing.

    Reads every file of the host's installed sglang/srt/models/ with `ast`
    (importing nothing), builds the class graph, and lists each registered
    class that lacks set_eagle3_layers_to_capture or get_embed_and_head while
    an attribute holds a model that has it (registered or not, the method its
    own or inherited, forward calling it or assigned from it), classified as
    fixable (delegation is enough), conditional (depends on the inner model),
    needs-more (forward bypasses the inner model) or unknown.

    Exit 0 when no fixable gap is left uncovered by a spec, 6 when one is.
    """
    from provision.tasks.audit import audit_fn, known_specs

    collected: list = []
    one = audit_fn(known_specs(spec), install_path=install_path, python=python_, timeout=ctx.conn.command_timeout)

    def fn(host, session, fleet):
        r = one(host, session, fleet)
        if r.verdict != "failed":
            collected.append(r)
        return r

    code = run_fleet(ctx, "audit", fn, columns=["host", "verdict", "version", "detail", "elapsed"])
    if not ctx.as_json:
        from provision.output.report import print_table

        cols = ["class", "verdict", "attr", "missing", "covered_by", "state", "why"]
        for r in collected:
            rows = [[g["class"], g["verdict"], g["attr"] or "", ", ".join(g["missing"]), g["covered_by"] or "-",
                     g["patch_state"] or "-", g["reason"]]
                    for g in sorted(r.data["gaps"], key=lambda g: (g["verdict"] != "fixable", g["class"]))]
            print_table(cols, rows, fmt=ctx.fmt, title=f"{r.host}: SGLang {r.version} ({r.install})",
                        wrap=("missing", "why"))
            if r.data["uncovered_fixable"]:
                click.echo("fixable and not covered by any spec: " + ", ".join(r.data["uncovered_fixable"])
                           + "\n  write one: provision spec new CLASS --host " + r.host + " > playbooks/NAME.yaml")
    if code == EXIT_OK and any(r.data.get("uncovered_fixable") for r in collected):
        code = EXIT_GAPS
    sys.exit(code)


@click.group()
def spec():
    """Patch specs: write one from the audit."""


@spec.command("new")
@click.argument("class_name", metavar="CLASS")
@fleet_options
@click.option("--allow-conditional", is_flag=True,
              help="Also write specs for conditionally fixable wrappers (right only for some inner models).")
@install_options
def spec_new(ctx, class_name, allow_conditional, install_path, python_):
    """Write a patch spec for CLASS from the host's SGLang source (to stdout).

    \b
    provision spec new KimiVLForConditionalGeneration --host gpu01 > playbooks/kimi-vl-eagle3.yaml
    """
    from provision.cli.main import selected_hosts
    from provision.config.playbook import parse_playbook
    from provision.tasks import spec_new as audit_mod
    from provision.control.runner import Fleet

    hosts = selected_hosts(ctx)
    if len(hosts) != 1:
        raise UsageError("spec new reads one host's SGLang: select exactly one with --host")
    fleet = Fleet(ctx.conn)
    try:
        with fleet.session(hosts[0]).open() as session:
            ans = session.call({"op": "audit", "specs": [], "install_path": hosts[0].install_path(install_path),
                                "python": python_ or hosts[0].get("python")},
                               timeout=ctx.conn.command_timeout, sudo=fleet.uses_sudo(hosts[0], session))
    finally:
        fleet.close()
    if not ans.get("ok"):
        raise UsageError((ans.get("error") or {}).get("message", "audit failed"))
    gaps = {g["class"]: g for g in ans["audit"]["wrappers"]}
    if class_name not in gaps:
        ok = class_name in (ans["audit"].get("ok_wrappers") or [])
        raise UsageError(f"{class_name}: " + ("already has the EAGLE-3 methods; no spec needed" if ok else
                                              "not an EAGLE-3 gap in this SGLang (not a wrapper, or not found)"))
    try:
        spec_dict = audit_mod.spec_for(gaps[class_name], allow_conditional=allow_conditional)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    inst = next((i for i in ans["facts"]["installs"] if i["path"] == ans["facts"]["chosen"]), {})
    text = audit_mod.spec_yaml(spec_dict, f"written by `provision spec new` from SGLang {inst.get('version')} "
                                          f"on {hosts[0].name}")
    parse_playbook(text, "<generated>")  # validated like a hand-written spec
    click.echo(text, nl=False)


COMMANDS = [audit, spec]
