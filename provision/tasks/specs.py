"""Several patch specs per host: which specs a host carries, whether each applies to it.

A host carries the specs given with `--playbook` (repeatable), else its inventory `specs:`
(`spec:` is short for one), else the default spec. patch, unpatch, status and reconcile send
all of a host's specs in ONE remote call per engine (by_engine: SGLang's and vLLM's may be separate
installs) and turn its answer into one row per host and spec.

A spec with `applies:` is decided here, on the control machine, from the host's facts
(config/applies.py, `packaging` specifiers). Where the host must be asked first (a version
condition, or a GPU condition without `--gpu-capability` / the host's `gpu_capability`),
patch and launch make ONE extra remote call on the same connection (the `facts` op:
discovery and nvidia-smi, nothing written) before the call that acts; status asks for the
same facts in its one call and decides afterwards; reconcile sends such specs as "pending"
in its one call (tasks/reconcile.py). A spec that does not apply is the row
`not-applicable` with the reason, and counts as in the wanted state.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from provision.config.applies import GPU_KEY, HostView, decide, needs_host, packages_named
from provision.config.inventory import Host, host_spec_names
from provision.config.playbook import DEFAULT_PACKAGE, PatchSpec, load_patch_spec
from provision.errors import UsageError
from provision.output.results import HostResult
from provision.tasks.bundles import facts_exclude

if TYPE_CHECKING:  # the typed messages (provision/host/protocol.py), checked by mypy
    from provision.host.protocol import FactsAnswer, FactsRequest

NOT_APPLICABLE = "not-applicable"


@functools.lru_cache(maxsize=None)
def block_shas(spec: PatchSpec) -> tuple:
    """The block sha this spec renders (a delegate spec's full set of methods; another kind's
    spec sha), computed once per spec and sent with a patch or reconcile: the host's fast path
    accepts a file whose marker carries it without validating or rendering the spec itself.
    A file whose block holds fewer methods (the rest native) takes the full path, which judges
    it the same way."""
    from provision.host.engine.render import block_shas as render_shas

    return render_shas(spec.to_engine())


@functools.lru_cache(maxsize=None)
def _load(name: str | None) -> PatchSpec:
    return load_patch_spec(name)


def specs_for(host: Host, given: list[PatchSpec] | None) -> list[PatchSpec]:
    """The specs this host carries: `given` (--playbook), else its `specs:`/`spec:`, else the default."""
    specs = list(given) if given else [_load(n) for n in host_spec_names(host)]
    check_distinct(specs, f"host {host.name}")
    return specs


def _package(spec: PatchSpec) -> str:
    return str(getattr(spec, "package", None) or DEFAULT_PACKAGE)


def check_distinct(specs: list[PatchSpec], where: str) -> None:
    """Two specs of one host may not edit the same file (the host records one state per file).
    UsageError (exit 2) before any host is touched."""
    seen: dict[tuple, str] = {}
    names: set[str] = set()
    for s in specs:
        if s.name in names:
            raise UsageError(f"{where}: spec {s.name} is given twice")
        names.add(s.name)
        key = (_package(s), s.file)
        if key in seen:
            raise UsageError(f"{where}: specs {seen[key]} and {s.name} both edit {key[0]}/{key[1]}; "
                             "give one spec per file")
        seen[key] = s.name


def applies_of(spec: PatchSpec) -> dict | None:
    return getattr(spec, "applies", None) or None


def gpu_given(host: Host, override: str | None) -> str | None:
    """The compute capability the user stated: --gpu-capability, else the host's `gpu_capability`."""
    return override or host.get("gpu_capability")


def must_ask(specs: list[PatchSpec], host: Host, override: str | None) -> bool:
    """Does deciding these specs need the host's facts first?"""
    given = gpu_given(host, override) is not None
    return any(needs_host(applies_of(s), given) for s in specs)


def wants_gpu(specs: list[PatchSpec], host: Host, override: str | None) -> bool:
    return gpu_given(host, override) is None and any(GPU_KEY in (applies_of(s) or {}) for s in specs)


def packages_wanted(specs: list[PatchSpec]) -> list[str]:
    out: list[str] = []
    for s in specs:
        for name in [_package(s)] + packages_named(applies_of(s)):
            if name != DEFAULT_PACKAGE and name not in out:
                out.append(name)
    return out


def engine_of(spec: PatchSpec) -> str | None:
    """The inference engine whose install the spec edits (its package's), or None (a package of no
    engine's, flashinfer: the install beside which the host finds it)."""
    from provision.host import inference

    return inference.of_package(_package(spec))


def by_engine(specs: list[PatchSpec]) -> list[tuple[str | None, list[PatchSpec]]]:
    """The specs grouped by the engine whose install each edits, in the order each engine first
    appears: one host call per group, so each spec is judged and written against its own engine's
    install (a host may keep SGLang and vLLM in separate venvs). A spec of no engine's package joins
    the first group (the host finds its package beside that engine's install, as it always has).
    Pure."""
    groups: dict[str | None, list[PatchSpec]] = {}
    loose: list[PatchSpec] = []
    for s in specs:
        eng = engine_of(s)
        (groups.setdefault(eng, []) if eng else loose).append(s)
    if not groups:
        return [(None, loose)] if loose else []
    out = list(groups.items())
    out[0] = (out[0][0], out[0][1] + loose)
    return out


def facts_request(host: Host, specs: list[PatchSpec], override: str | None, *, install_path=None,
                  python=None, engine: str | None = None) -> FactsRequest:
    req: FactsRequest = {"op": "facts", "gpu": wants_gpu(specs, host, override), "packages": packages_wanted(specs),
                         "install_path": host.install_path(install_path), "python": python or host.get("python")}
    if engine:
        req["engine"] = engine  # the install of the engine the specs edit, not the host's first
    return req


def chosen_install(facts: dict | None) -> dict:
    for rec in (facts or {}).get("installs") or []:
        if rec.get("path") == (facts or {}).get("chosen"):
            return rec
    return {}


def host_view(answer: dict | Any, host: Host, override: str | None) -> HostView:
    """What applicability is decided from: the chosen install's SGLang version, the packages'
    versions (facts `packages`), and the GPUs (the stated capability, else nvidia-smi's)."""
    facts = answer.get("facts") or {}
    inst = chosen_install(facts)
    beside = _title(inst.get("engine"))
    pkgs = {}
    for name, info in (facts.get("packages") or {}).items():
        info = info or {}
        pkgs[name] = info.get("version") if info.get("dir") and not info.get("error") else None
    stated = gpu_given(host, override)
    if stated:
        src = "--gpu-capability" if override else "inventory gpu_capability"
        return HostView(sglang=_sglang(inst), packages=pkgs, gpu=(stated,), gpu_source=src, beside=beside)
    gpu = answer.get("gpu") or {}
    return HostView(sglang=_sglang(inst), packages=pkgs, gpu=tuple(gpu.get("capabilities") or ()),
                    gpu_unknown=gpu.get("unknown") or ("not asked" if not gpu else None),
                    gpu_source="nvidia-smi", beside=beside)


def _title(engine: object) -> str:
    from provision.host import inference

    return inference.get(engine).title if engine in inference.KNOWN else "SGLang"


def _sglang(inst: dict) -> str | None:
    """The chosen install's version when it is SGLang's (an `applies: sglang` condition is of SGLang)."""
    return inst.get("version") if inst.get("engine") in (None, "sglang") else None


def split(specs: list[PatchSpec], view: HostView | None) -> tuple[list[PatchSpec], dict[str, str]]:
    """(specs that apply, {name: why not} for the others). `view` None: only specs without
    `applies:` (or decidable without the host) are known to apply. Pure."""
    ok: list[PatchSpec] = []
    no: dict[str, str] = {}
    for s in specs:
        verdict, why = decide(applies_of(s), view or HostView())
        if verdict:
            ok.append(s)
        else:
            no[s.name] = why
    return ok, no


@functools.lru_cache(maxsize=64)
def _playbook_engine(name: str) -> str:
    from provision.config.playbook import load_playbook
    from provision.errors import ConfigError
    from provision.host import inference

    try:
        return str((load_playbook(name).launch or {}).get("engine") or inference.DEFAULT)
    except ConfigError:  # the launch's own commands say what is wrong with it
        return inference.DEFAULT


def host_engine(host: Host) -> str:
    """The engine the host's server runs: its inventory `profile:` playbook's (the top-level or the
    launch's `engine:`), else the default. Reads a playbook only when the host names one."""
    from provision.host import inference

    name = host.get("profile")
    return _playbook_engine(str(name)) if name else inference.DEFAULT


def other_engines_specs(specs: list[PatchSpec], engine: str) -> dict[str, str]:
    """{spec name: why it does not apply} for the specs that edit another inference engine's files
    than `engine`'s (a host whose profile runs vLLM is not judged by an SGLang spec). Pure."""
    from provision.host import inference

    theirs = {pkg: name for name, pkg in inference.PACKAGES.items() if name != engine}
    title = inference.get(engine).title
    return {s.name: f"the host's server runs {title} (its profile's engine); this spec edits "
                    f"{inference.get(theirs[_package(s)]).title}'s files"
            for s in specs if _package(s) in theirs}


def not_applicable(host: str, spec: PatchSpec, why: str, facts: dict | None = None) -> HostResult:
    inst = chosen_install(facts)
    return HostResult(host, NOT_APPLICABLE, why, version=inst.get("version"), install=inst.get("path"),
                      file=spec.file, data={"spec": spec.name, "spec_hash": spec.sha, "applies": applies_of(spec),
                                            "install_kind": inst.get("kind")})


def applicable(session, host: Host, fleet, specs: list[PatchSpec], override: str | None, *, install_path=None,
               python=None, timeout: float = 120.0) -> tuple[list[PatchSpec], list[HostResult], dict | None]:
    """(the specs that apply, a not-applicable row for each other, the facts answer or None).
    Asks the host (the `facts` op, one extra call on this session) only when a spec's
    `applies:` cannot be decided without it."""
    if not any(applies_of(s) for s in specs):
        return specs, [], None
    answer: FactsAnswer | None = None
    ok, rows = [], []
    for engine, group in by_engine(specs):  # each spec judged against its own engine's install
        if not must_ask(group, host, override):  # decided from the stated GPU alone: no call
            g_ok, g_no = split(group, HostView(gpu=(gpu_given(host, override),),
                                               gpu_source="--gpu-capability" if override else
                                               "inventory gpu_capability"))
            ok += g_ok
            rows += [not_applicable(host.name, s, g_no[s.name]) for s in group if s.name in g_no]
            continue
        answer = session.call(facts_request(host, group, override, install_path=install_path, python=python,
                                            engine=engine),
                              timeout=timeout, sudo=fleet.uses_sudo(host, session), exclude=facts_exclude())
        if not answer.get("ok"):  # no install to judge: the act call reports the same error per spec
            ok += group
            continue
        g_ok, g_no = split(group, host_view(answer, host, override))
        ok += g_ok
        facts = answer.get("facts")
        rows += [not_applicable(host.name, s, g_no[s.name], facts) for s in group if s.name in g_no]
    return [s for s in specs if s in ok], rows, answer


def in_order(specs: list[PatchSpec], rows: list[HostResult]) -> list[HostResult]:
    """The rows in the order of the host's specs (rows without a spec last)."""
    pos = {s.name: i for i, s in enumerate(specs)}
    return sorted(rows, key=lambda r: pos.get(r.data.get("spec"), len(pos)))
