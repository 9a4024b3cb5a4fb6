"""CLI commands for the model file: patch, unpatch, status."""

from __future__ import annotations

import functools
import sys

import click

from provision.cli.main import (check_option, check_specs, diff_option, fleet_options, gpu_option, install_options,
                                load_spec, main, metrics_options, run_fleet, specs_option, transport_options,
                                write_metrics)


OVERLAY_HELP = {
    "patch": "Leave the engine's files alone: stage the fix as an overlay package in the host's state directory "
             "(SGLang 0.5.6+: SGLANG_EXTERNAL_MODEL_PACKAGE; vLLM 0.16+: a general plugin) and print the environment "
             "lines a server you start yourself needs. Several --playbook go in the install's one overlay.",
    "unpatch": "Take the specs given out of the overlay `patch --overlay` staged for the install, the whole "
               "overlay with the last (the engine's files are not touched).",
}


def _patch_like(command: str):
    def deco(fn):
        if command == "patch":  # unpatch takes our edit out wherever it is: applicability is not asked
            fn = gpu_option(fn)

        @fleet_options
        @transport_options()
        @specs_option
        @install_options
        @check_option
        @diff_option
        @click.option("--force", is_flag=True, help="Act even while an SGLang server is loading from this install.")
        @click.option("--overlay", is_flag=True, help=OVERLAY_HELP[command])
        @functools.wraps(fn)
        def wrapped(ctx, spec, install_path, python_, check, diff, force, overlay, gpu_capability=None, **kw):
            from provision.tasks.patch import do_patch

            pspec = load_spec(spec)
            check_specs(ctx, pspec)
            extra = fn(ctx, **kw) or {}
            if overlay:
                from provision.errors import UsageError
                from provision.tasks.overlay import do_overlay

                if diff:
                    raise UsageError("--diff shows a change to SGLang's file; --overlay changes none")
                op_fn = do_overlay(list(pspec) if pspec else None, check=check, remove=command == "unpatch",
                                   install_path=install_path, python=python_, timeout=ctx.conn.command_timeout,
                                   verify_import=bool(extra.get("verify_import")))
            else:
                op_fn = do_patch(command, pspec, check=check, diff=diff, force=force, install_path=install_path,
                                 python=python_, timeout=ctx.conn.command_timeout, gpu_capability=gpu_capability,
                                 **extra)
            code = run_fleet(ctx, command, op_fn, check=check, show_diff=diff,
                             columns=["host", "spec", "verdict", "version", "methods", "detail", "elapsed"])
            sys.exit(code)

        return wrapped

    return deco


@main.command()
@_patch_like("patch")
@click.option("--verify-import", is_flag=True,
              help="Also import the patched class (with --overlay: the overlay module, its rebound methods bound) "
                   "with the host's interpreter and check the methods are callable: the spec's code runs there, "
                   "as root, only when asked (a launch imports it in the server's interpreter anyway).")
def patch(ctx, verify_import=False):
    """Inject the missing EAGLE-3 delegation methods into the wrapper class.

    Finds the SGLang install on each host (the one a running server uses, else
    the one the configured python imports, else the only one), then adds exactly
    the methods the class lacks, inside the class, between marker comments.
    Methods the class already has natively are left alone; a broken hand patch
    (`cat >> kimi_k25.py`) is repaired. Idempotent: a second run is a no-op.

    Every spec a host carries (`--playbook`, repeatable, or the inventory's
    `specs:`) in one remote call: one row per host and spec. A spec whose
    `applies:` rules the host out is not-applicable (with the reason).

    \b
    Verdicts: patched, unchanged, native, repaired, not-applicable, failed, unknown;
    with --overlay: staged, unchanged, native, failed.
    """
    return {"verify_import": verify_import}


@main.command()
@_patch_like("unpatch")
def unpatch(ctx):
    """Remove provision's block again, leaving every other byte as before `patch`."""
    return {}


@main.command()
@fleet_options
@transport_options()
@specs_option
@gpu_option
@install_options
@metrics_options
def status(ctx, spec, gpu_capability, install_path, python_, metrics_file):
    """Show each host's SGLang version, install, patch state and server.

    \b
    Verdicts (the patch state of the spec's file):
      patched     provision's block is in the class and matches the spec
      native      the class has every method itself (SGLang 0.5.10+)
      overlay     the file lacks them; the overlay staged for the install holds them
      missing     methods are missing: `provision patch` adds them
      stale       provision's block differs from the spec: `patch` re-renders it
      hand-patch  a hand patch (`cat >>`) that binds nothing: `patch` repairs it
      error       the file could not be judged (no SGLang, no such file, ...)
      not-applicable  the spec's `applies:` rules the host out (the reason says why)

    One row per host and spec (`--playbook` repeatable, or the inventory's `specs:`).
    Exit 0 when every row is patched, native, overlay or not-applicable, 4 when one is missing,
    stale or hand-patch (what `patch --check` would change), 3 when a host
    failed, was unreachable or is in error. "restart needed" is noted where the
    running server started before the file last changed.

    --format prometheus prints provision_spec_state{host,spec,state},
    provision_server_up{host,port}, provision_restart_needed{host} and
    provision_sglang_info{host,version,install}; --metrics-file PATH writes them
    atomically for node_exporter's textfile collector.
    """
    from provision.tasks.patch import do_status, status_exit_code

    pspec = load_spec(spec)
    check_specs(ctx, pspec)
    fn = do_status(pspec, install_path=install_path, python=python_, timeout=ctx.conn.command_timeout,
                   gpu_capability=gpu_capability)
    code = run_fleet(ctx, "status", fn, columns=["host", "spec", "verdict", "version", "install_kind",
                                                 "server_state", "elapsed"], journal=False,
                     exit_code=status_exit_code)
    if ctx.fmt == "prometheus" or metrics_file:
        from provision.output.prometheus import status_metrics

        text = status_metrics(getattr(ctx, "results", []))
        if ctx.fmt == "prometheus":
            click.echo(text, nl=False)
        write_metrics(metrics_file, text)
    sys.exit(code)
