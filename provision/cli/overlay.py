"""`provision overlay write`: the overlay package into a directory on this machine, no SSH."""

from __future__ import annotations

import click

from provision.cli.main import renamed


@click.group()
def overlay():
    """Overlay mode without a host: write the fix as a package SGLang loads itself.

    SGLang 0.5.6 and later import the package named by SGLANG_EXTERNAL_MODEL_PACKAGE and let its
    classes replace the built-in ones of the same name: the overlay is a subclass of the wrapper
    with the spec's delegation methods. Nothing of SGLang's is edited.
    """


@overlay.command()
@renamed("--spec", "--playbook", "specs", multiple=True)
@click.option("--playbook", "specs", multiple=True, metavar="PLAYBOOK",
              help="The playbook whose patch spec to render (a path, or a shipped name); repeatable, one module "
                   "per spec. Default: kimi-k25-eagle3.")
@click.option("--out", required=True, metavar="DIR",
              help="Directory to write the package into (DIR/provision_overlay/), e.g. a shared emptyDir volume.")
@click.option("--mount-path", metavar="PATH",
              help="Where the SGLang container sees DIR (its PYTHONPATH entry); default: DIR itself.")
@click.option("--sglang-version", "version", metavar="VERSION",
              help="The SGLang release the overlay is for: refused below 0.5.6 (no SGLANG_EXTERNAL_MODEL_PACKAGE).")
def write(specs, out, mount_path, version):
    """Write the overlay into DIR and print the environment the SGLang container needs.

    For a Kubernetes init container that fills a shared volume, or a Dockerfile step. Every
    method of each spec goes in (there is no install here to ask which ones it lacks): for
    SGLang 0.5.6 and later, left out where the release has the methods natively (Kimi-K2.5
    from 0.5.10).

    \b
    stdout: the two lines, KEY=VALUE (also written to DIR/overlay.env)
      SGLANG_EXTERNAL_MODEL_PACKAGE=provision_overlay
      PYTHONPATH=<mount path>     (a PYTHONPATH of the container's own goes after it)
    """
    from provision.config.playbook import load_patch_spec
    from provision.tasks.overlay import write as write_overlay

    loaded = [load_patch_spec(s) for s in specs] if specs else [load_patch_spec(None)]
    res = write_overlay(loaded, out, mount_path=mount_path, version=version)
    for path in res["files"]:
        click.echo(f"wrote {path}", err=True)
    for note in res["notes"]:
        click.echo(f"note: {note}", err=True)
    for line in res["env_lines"]:
        click.echo(line)
