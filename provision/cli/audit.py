"""`provision audit` and `provision spec new`: find wrappers that break EAGLE-3, write their specs."""

from __future__ import annotations

import sys

import click

from provision.cli.main import fleet_options, install_options, renamed, run_fleet, transport_options
from provision.errors import EXIT_GAPS, EXIT_OK, UsageError


def engine_option(fn):
    """--engine: whose install the command reads (sglang, the default, or vllm)."""
    from provision.host import inference

    return click.option("--engine", type=click.Choice(list(inference.KNOWN)), default=None,
                        help="The inference engine whose install to read. Default: the host's own (the one "
                             "installed there); a host with both is refused, naming each install.")(fn)


@click.command()
@fleet_options
@transport_options()
@renamed("--spec", "--playbook", "spec")
@click.option("--playbook", "spec", metavar="PLAYBOOK",
              help="Also count this playbook's spec as coverage (besides the shipped playbooks).")
@install_options
@engine_option
def audit(ctx, spec, install_path, python_, engine):
    """Find every wrapper model whose EAGLE-3 interface is missing.

    SGLang (the default): reads every file of the host's installed
    sglang/srt/models/ with `ast` (importing nothing), builds the class graph,
    and lists each registered class that lacks set_eagle3_layers_to_capture or
    get_embed_and_head while an attribute holds a model that has it
    (registered or not, the method its own or inherited, forward calling it or
    assigned from it), classified as fixable (delegation is enough),
    conditional (depends on the inner model), needs-more (forward bypasses the
    inner model) or unknown.

    --engine vllm: reads vLLM's model registry and the release's own
    SupportsEagle3 protocol, and lists each model class that lacks a member of
    it while the model it holds (self.language_model, self.llm, ...) has them
    all: fixable (an interface spec closes it), or unknown (the inner model is
    picked from the config at run time).

    Exit 0 when no fixable gap is left uncovered by a spec, 6 when one is.
    """
    from provision.host import inference
    from provision.tasks.audit import audit_fn, known_specs

    collected: list = []
    one = audit_fn(known_specs(spec, engine), install_path=install_path, python=python_,
                   timeout=ctx.conn.command_timeout, engine=engine)

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
            title = inference.get(r.data.get("engine") or inference.DEFAULT).title
            print_table(cols, rows, fmt=ctx.fmt, title=f"{r.host}: {title} {r.version} ({r.install})",
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
@engine_option
def spec_new(ctx, class_name, allow_conditional, install_path, python_, engine):
    """Write a patch spec for CLASS from the host's SGLang (or vLLM) source (to stdout).

    \b
    provision spec new KimiVLForConditionalGeneration --host gpu01 > playbooks/kimi-vl-eagle3.yaml
    provision spec new Qwen2AudioForConditionalGeneration --engine vllm --host gpu01 \\
        > playbooks/qwen2-audio-eagle3-vllm.yaml
    """
    from provision.cli.main import selected_hosts
    from provision.config.playbook import parse_playbook
    from provision.tasks import spec_new as audit_mod
    from provision.control.runner import Fleet

    from provision.host import inference

    hosts = selected_hosts(ctx)
    if len(hosts) != 1:
        raise UsageError("spec new reads one host's install: select exactly one with --host")
    fleet = Fleet(ctx.conn)
    try:
        with fleet.session(hosts[0]).open() as session:
            ans = session.call({"op": "audit", "engine": engine or inference.FROM_HOST, "specs": [],
                                "install_path": hosts[0].install_path(install_path),
                                "python": python_ or hosts[0].get("python")},
                               timeout=ctx.conn.command_timeout, sudo=fleet.uses_sudo(hosts[0], session))
    finally:
        fleet.close()
    if not ans.get("ok"):
        raise UsageError((ans.get("error") or {}).get("message", "audit failed"))
    title = inference.get(ans.get("engine") or engine or inference.DEFAULT).title
    gaps = {g["class"]: g for g in ans["audit"]["wrappers"]}
    if class_name not in gaps:
        ok = class_name in (ans["audit"].get("ok_wrappers") or [])
        raise UsageError(f"{class_name}: " + ("already has the EAGLE-3 methods; no spec needed" if ok else
                                              f"not an EAGLE-3 gap in this {title} (not a wrapper, or not found)"))
    try:
        spec_dict = audit_mod.spec_for(gaps[class_name], allow_conditional=allow_conditional)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    inst = next((i for i in ans["facts"]["installs"] if i["path"] == ans["facts"]["chosen"]), {})
    text = audit_mod.spec_yaml(spec_dict, f"written by `provision spec new` from {title} {inst.get('version')} "
                                          f"on {hosts[0].name}")
    parse_playbook(text, "<generated>")  # validated like a hand-written spec
    click.echo(text, nl=False)
    if gaps[class_name].get("proposer"):  # the second half vLLM 0.32 needs for some multimodal classes
        click.echo(audit_mod.proposer_note(class_name, str(gaps[class_name]["proposer"]),
                                           f"{title} {inst.get('version')}", spec_dict.get("name", "")), err=True)


COMMANDS = [audit, spec]
