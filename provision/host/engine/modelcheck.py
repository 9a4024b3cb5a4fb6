"""Preflight's decision about the model: will the engine (SGLang, vLLM) load what the profile names?  STDLIB ONLY, pure.

Given what the host read (host/facts/model.py: the config.json of the model and of the drafter,
the shards; the registry and the flag table of the installed SGLang), the candidate patch specs
and how the server will run, :func:`check` returns check rows ``{"level", "check", "message"}``,
one sentence each. Levels: ``ok``; ``info``; ``warn`` (the launch goes on, the user should know);
``fail`` (SGLang would crash or exit on it: the launch is refused unless --force).

A ``fail`` is only ever returned for what SGLang itself would not start with; whenever the facts
are incomplete (a file missing or unreadable, a parser this reader does not understand) the row
is a ``warn`` naming the file.
"""

from __future__ import annotations

import difflib

from provision.host.engine import serverargs

# What an engine with EAGLE-3 target methods (SGLang: set_eagle3_layers_to_capture during target graph
# capture, get_embed_and_head after the draft loads; the engine's `eagle3_methods`, in the facts)
# calls on the target for the other EAGLE algorithms: only get_embed_and_head.
EAGLE_LIKE = ("EAGLE", "NEXTN")
EMBED_AND_HEAD = ("get_embed_and_head",)


def _row(level: str, check: str, message: str, **extra) -> dict:
    row = {"level": level, "check": check, "message": message}
    row.update(extra)
    return row


def flag_rows(args: dict, table: dict | None, version: str | None, unreadable: str | None, title: str,
              names: dict | None = None) -> list[dict]:
    """One row per flag that is not plainly right (and one ok row when all are). ``names``: a key
    of the args -> the option the engine's parser reads it as (vLLM's `max_model_len`), when not itself."""
    if table is None:
        return [_row("warn", "flags", f"flags not checked: {unreadable or 'the argument parser could not be read'}")]
    out = []
    for key, value in args.items():
        name = (names or {}).get(str(key)) or str(key)
        if value is None:
            continue  # not rendered on the command line (profile.render_flags)
        if value is False and not (table.get(f"--{name}") or {}).get("default") is True:
            continue  # left out, as it is off by default; a negatable switch that is on is judged below
        level, msg = serverargs.decide(name, value, table, version, title)
        if level != "ok":
            out.append(_row(level, "flags", msg))
    if not out:
        out.append(_row("ok", "flags", f"all {sum(1 for v in args.values() if v not in (None, False))} flags "
                                       f"are taken by {title} {version or ''}".replace("  ", " ").strip()))
    return out


def spec_method_rows(method: str | None, methods: list | None, title: str, version: str | None) -> list[dict]:
    """The speculative method the profile names, against the install's own list (vLLM's
    SpeculativeConfig): one it lacks is refused, as its config check would at start."""
    if method is None or not isinstance(methods, list) or not methods:
        return []
    if method in methods:
        return []
    near = difflib.get_close_matches(method, [str(m) for m in methods], n=3, cutoff=0.6)
    return [_row("fail", "flags", f"speculative-config: method {method!r} is not one {title} {version or ''} knows"
                                  .replace("  ", " ") + (f": did you mean {' or '.join(near)}?" if near else
                                                         f" (it takes {', '.join(str(m) for m in methods[:12])} ...)"))]


def _archs(cfg: dict) -> tuple[list[str] | None, str | None]:
    """(architectures, why not) of a config.json fact."""
    if cfg.get("error"):
        return None, cfg["error"]
    doc = cfg.get("config")
    archs = doc.get("architectures") if isinstance(doc, dict) else None
    if not (isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)):
        return None, f"{cfg.get('file')} has no `architectures` list"
    return archs, None


def arch_rows(what: str, cfg: dict, registry: dict | None, version: str | None, draft: bool,
              overlay_classes: set | None = None, title: str = "SGLang") -> tuple[list[dict], str | None]:
    """(rows, the class the engine will instantiate or None) for the target or the drafter. A
    drafter's ``lookup`` (the names its engine looks its architectures up by) is used when set."""
    label = "drafter" if draft else "model"
    if cfg.get("missing"):  # a local folder that does not exist is the path check's fail row, said once
        return [], None
    if cfg.get("skip"):
        return [_row("warn", "architecture", f"{label} {cfg.get('path')}: {cfg['skip']}")], None
    archs, why = _archs(cfg)
    if archs is not None and draft and cfg.get("lookup"):
        archs = [str(a) for a in cfg["lookup"]]
    if archs is None:
        return [_row("warn", "architecture", f"{label} architecture not checked: {why}")], None
    if registry is None:
        return [_row("warn", "architecture", f"{label} architecture {archs[0]} not checked: the installed "
                                             f"{title}'s model registry could not be read")], None
    names = set(registry) | set(overlay_classes or ())
    found = [a for a in archs if a in names]
    if draft and not found:
        # SGLang renames some drafters' architectures (DeepseekV3ForCausalLM -> ...NextN, ...MTP)
        found = [a for a in archs if any(n.startswith(a) for n in names)]
    if found:
        return [_row("ok", "architecture", f"{label} architecture {found[0]} is registered in {title} {version}")], \
            found[0]
    if cfg.get("auto_model") or cfg.get("in_transformers"):
        how = "its config's auto_map" if cfg.get("auto_model") else "the installed Transformers"
        return [_row("warn", "architecture", f"{label} architecture {archs[0]} is not in {title} {version}'s registry: "
                                             f"{title} will try its Transformers backend ({how} has it)")], None
    return [_row("fail", "architecture", f"{label} architecture {', '.join(archs)} is not registered in {title} "
                                         f"{version} ({cfg.get('file')}): it would fail with `Model architectures "
                                         f"{archs} are not supported` after "
                                         + ("the target's weights load" if draft else "start-up")
                                         + f"; install {'an' if title[:1] in 'AEIOSU' else 'a'} {title} that has it")], None


def called_methods(algorithm: str | None, draft_config: object, eagle3: tuple) -> tuple:
    """What the engine calls on the target for `algorithm`: for EAGLE3 its `eagle3` methods, unless the
    drafter's eagle_config says use_aux_hidden_state: false (then the target's layers are never
    captured: only get_embed_and_head; SGLang 0.5.9's model_runner and eagle_worker read it so). Pure."""
    alg = str(algorithm or "").upper()
    called = tuple(eagle3) if alg == "EAGLE3" else EMBED_AND_HEAD
    ec = draft_config.get("eagle_config") if isinstance(draft_config, dict) else None
    if alg == "EAGLE3" and isinstance(ec, dict) and "use_aux_hidden_state" in ec and not ec["use_aux_hidden_state"]:
        return tuple(m for m in called if m == "get_embed_and_head")
    return tuple(called)


def eagle_rows(cls: str | None, registry: dict | None, algorithm: str | None, specs: list[dict],
               mode: str, in_place: set, version: str | None, called: tuple | None = None, *,
               eagle3: tuple) -> list[dict]:
    """The EAGLE-3 interface: the target class must have every method this SGLang calls on it.

    ``specs``: candidate delegation specs (shipped playbooks' and --playbook), each with ``name`` and
    ``class``. ``mode``: "edit" (the server imports the installed files), "patch" (launch --patch:
    the spec is applied before the start), "overlay" (launch --overlay, or a container: the
    overlay carries the spec). ``in_place``: classes whose spec the preflight already checks
    (the profile's own `patch:`/`requires:`; their names too): no second row for them."""
    alg = str(algorithm or "").upper()
    if not cls or registry is None or alg not in ("EAGLE3",) + EAGLE_LIKE or cls in in_place:
        return []
    info = registry.get(cls) or {}
    full = tuple(eagle3) if alg == "EAGLE3" else EMBED_AND_HEAD
    called = called or full
    missing = [m for m in called if m in (info.get("missing") or [])]
    if not missing:
        return [_row("ok", "eagle3", f"{cls} has {', '.join(called)} in SGLang {version}"
                     + ("" if tuple(called) == full or alg != "EAGLE3" else
                        " (the drafter's eagle_config.use_aux_hidden_state is false: SGLang calls nothing else)"))]
    if info.get("getattr"):
        return [_row("warn", "eagle3", f"{cls} lacks {', '.join(missing)} but forwards unknown attributes "
                                       "(__getattr__): not checked")]
    spec = next((s for s in specs if s.get("class") == cls and (s.get("kind") or "delegate") == "delegate"), None)
    lacks = f"{cls} lacks {', '.join(missing)} in SGLang {version}"
    if alg in EAGLE_LIKE:  # only get_embed_and_head, and not on every path: say it, start anyway
        return [_row("warn", "eagle3", f"{lacks}: {alg} may fail after the weights load"
                     + (f" (spec {spec['name']} adds it: `provision patch --playbook {spec['name']}`)" if spec else ""))]
    if spec is None:
        return [_row("fail", "eagle3", f"{lacks}: EAGLE-3 would crash after the weights load, and no spec "
                                       f"covers the class: write one with `provision spec new {cls}`", cls=cls,
                     missing=missing)]
    if mode == "overlay":
        return [_row("ok", "eagle3", f"{lacks}: the overlay carries spec {spec['name']}", spec=spec["name"],
                     cls=cls)]
    if mode == "patch":
        return [_row("ok", "eagle3", f"{lacks}: launch --patch applies spec {spec['name']}", spec=spec["name"],
                     cls=cls)]
    if mode == "container":
        return [_row("fail", "eagle3", f"{lacks}: EAGLE-3 would crash after the weights load; spec {spec['name']} "
                                       "fixes it: launch with --overlay (the image's files stay as they are)",
                     spec=spec["name"], cls=cls, missing=missing)]
    return [_row("fail", "eagle3", f"{lacks}: EAGLE-3 would crash after the weights load; spec {spec['name']} "
                                   f"fixes it: run `provision patch --playbook {spec['name']}` (or launch --patch, "
                                   "or --overlay)", spec=spec["name"], cls=cls, missing=missing)]


def _fix(spec: dict | None, mode: str, what: str, new: str) -> tuple[str, str]:
    """(level, the sentence's end) for a gap `spec` covers (or none does) in this launch `mode`."""
    if spec is None:
        return "fail", f"no spec covers it: {new}"
    name = spec["name"]
    if mode == "overlay":
        return "ok", f"the overlay carries spec {name}"
    if mode == "patch":
        return "ok", f"launch --patch applies spec {name}"
    if mode == "container":
        return "fail", f"spec {name} fixes {what}, in files the image holds: build an image with it applied"
    return "fail", f"spec {name} fixes {what}: run `provision patch --playbook {name}` (or launch --patch)"


def interface_rows(method: str | None, iface: dict | None, allow: dict | None, model_type: str | None,
                   specs: list[dict], mode: str, in_place: set, version: str | None, title: str) -> list[dict]:
    """vLLM's two EAGLE-3 refusals, read from the release's files: the target's class lacks a member
    of its SupportsEagle3 (after the weights load: "Model does not support EAGLE3 interface"), and,
    where the release has a model-type allow-list (0.16-0.17), no entry of it is in the target's text
    model type (SpeculativeConfig, at start). ``specs``: candidate specs; ``in_place``: classes and
    spec names this preflight already checks (the profile's own patch and `requires:`)."""
    if str(method or "").lower() != "eagle3":
        return []
    rows: list[dict] = []
    if iface is not None:
        cls, missing = iface["class"], list(iface.get("missing") or [])
        inner = iface.get("inner_lacks")
        if not missing and inner:  # provision's delegation forwards to a model that lacks the members
            rows.append(_row("fail", "eagle3", f"{cls} delegates the EAGLE-3 interface to self.{inner['attr']} "
                             f"({', '.join(inner['classes'])}), which lacks {', '.join(inner['missing'])} in {title} "
                             f"{version}: EAGLE-3 would stop at start-up; this release needs its inner model fixed "
                             "too (a later release that has it there: upgrade)", cls=cls))
        elif not missing:
            rows.append(_row("ok", "eagle3", f"{cls} has the EAGLE-3 interface in {title} {version}"))
        elif cls not in in_place:
            spec = next((s for s in specs if s.get("class") == cls and s.get("kind") == "interface"), None)
            level, end = _fix(spec, mode, "it", f"write one with `provision spec new {cls} --engine vllm`")
            lacks = f"{cls} lacks the EAGLE-3 interface ({', '.join(missing)}) in {title} {version}"
            rows.append(_row(level, "eagle3", f"{lacks}: {title} would stop after the weights load; {end}"
                             if level == "fail" else f"{lacks}: {end}", cls=cls, missing=missing,
                             **({"spec": spec["name"]} if spec else {})))
    if allow is not None and isinstance(model_type, str):
        entries = [e for e in allow.get("entries") or [] if isinstance(e, str)]
        if any(e in model_type for e in entries):
            rows.append(_row("ok", "eagle3", f"model type {model_type} is on {title} {version}'s EAGLE-3 "
                                             f"allow-list ({allow['name']})"))
        else:
            spec = next((s for s in specs if s.get("kind") == "list-entry" and s.get("file") == allow.get("file")
                         and _literal(s.get("value")) in model_type), None) if model_type else None
            if spec is None or spec.get("name") not in in_place:
                level, end = _fix(spec, mode, "the list", "add an entry with a list-entry spec (docs/patching.md)")
                said = (f"model type {model_type} is not on {title} {version}'s EAGLE-3 allow-list ({allow['name']} in "
                        f"{allow['file']})")
                rows.append(_row(level, "eagle3", f"{said}: {title} refuses it at start; {end}" if level == "fail"
                                 else f"{said}: {end}", **({"spec": spec["name"]} if spec else {})))
    return rows


def _literal(text) -> object:
    import ast

    try:
        value = ast.literal_eval(str(text))
    except (ValueError, SyntaxError):
        return "\x00never"
    return value if isinstance(value, str) and value else "\x00never"


def shard_rows(label: str, shards: dict | None) -> list[dict]:
    """``shards``: host/facts/model.py's shard facts: {"index", "error", "files": [{name, size,
    expected, error}], "total"}; None when the model is not a local folder."""
    if not shards:
        return []
    if shards.get("error"):
        return [_row("warn", "shards", f"{label} shards not checked: {shards['error']}")]
    bad = []
    for f in shards.get("files") or []:
        if f.get("error") == "is missing":
            continue  # the presence check (ops/server.py _check_model) says so already
        if f.get("error"):
            bad.append(f"{f['name']} {f['error']}")
        elif f.get("expected") is not None and f.get("size") != f["expected"]:
            bad.append(f"{f['name']} is {f['size']} bytes, its header says {f['expected']} (truncated copy?)")
    if bad:
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        return [_row("fail", "shards", f"{label}: {len(bad)} of {len(shards.get('files') or [])} shards are not whole: "
                                       + "; ".join(bad[:3]) + more + ": the load would fail part-way; copy them again")]
    n = len(shards.get("files") or [])
    return [_row("ok", "shards", f"{label}: {n} shard{'s' if n != 1 else ''} whole "
                                 f"({(shards.get('total') or 0) / 2**30:.1f} GiB)")] if n else []


def memory_rows(total: int, disk_free: int | None, mem_available: int | None) -> list[dict]:
    if not total:
        return []
    gib = total / 2**30
    parts = [f"weights {gib:.1f} GiB"]
    if disk_free is not None:
        parts.append(f"{disk_free / 2**30:.1f} GiB free on their disk")
    if mem_available is not None:
        parts.append(f"{mem_available / 2**30:.1f} GiB of memory available for the page cache")
    level = "warn" if mem_available is not None and total > mem_available else "info"
    tail = ": they will not stay in the page cache, so each start reads them from disk" if level == "warn" else ""
    return [_row(level, "weights", "; ".join(parts) + tail)]


def aux_layer_ids(cfg: dict) -> list | None:
    """The auxiliary layer ids an EAGLE-3 drafter's config.json names (top level or in eagle_config)."""
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    if ids is None and isinstance(cfg.get("eagle_config"), dict):
        ids = cfg["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
    return ids if isinstance(ids, list) and ids else None


def aux_layer_rows(draft: dict | None, engine_title: str, default: tuple | None) -> list[dict]:
    """A warning when an EAGLE-3 drafter names no auxiliary layers and the engine then picks
    `default` without a word: a drafter trained on other layers accepts almost nothing."""
    cfg = (draft or {}).get("config")
    if not default or not isinstance(cfg, dict):
        return []
    archs = [str(a) for a in cfg.get("architectures") or []]
    if not (any("eagle3" in a.lower() for a in archs) or isinstance(cfg.get("eagle_config"), dict)):
        return []
    if aux_layer_ids(cfg) is not None:
        return []
    return [_row("warn", "drafter", (
        f"drafter {draft.get('path')}: its config.json names no eagle_aux_hidden_state_layer_ids, so "
        f"{engine_title} reads the target's layers {tuple(default)} without saying so; a drafter trained on "
        "other layers then accepts almost nothing (1.21% measured, vllm#50170): add the ids it was trained "
        "with to its config.json (and to eagle_config)"))]


def check(facts: dict, specs: list[dict], mode: str, in_place: set) -> list[dict]:
    """All rows. ``facts``: what ops/preflight_model.py gathered (args, version, flags, registry,
    target and draft: config.json and shard facts, disk and memory)."""
    args = facts.get("args") or {}
    version = facts.get("version")
    title = str(facts["engine_title"])
    rows = flag_rows(args, facts.get("flags"), version, facts.get("flags_error"), title, facts.get("flag_names"))
    rows += spec_method_rows(facts.get("spec_method"), facts.get("spec_methods"), title, version)
    registry = facts.get("registry")
    impl = str(args.get("model-impl") or "auto").lower()
    overrides = args.get("json-model-override-args")
    if impl not in ("auto", "sglang") or (overrides and "architectures" in str(overrides)):
        rows.append(_row("info", "architecture", f"architectures not checked (model-impl {impl}"
                                                 + (", architectures overridden" if overrides else "") + ")"))
        registry_used = None
    else:
        registry_used = registry
    if registry is None and facts.get("registry_error"):
        rows.append(_row("warn", "architecture", f"registry not read: {facts['registry_error']}"))
    overlay_classes = set(facts.get("overlay_classes") or ())
    cls = None
    if registry_used is not None:
        t_rows, cls = arch_rows("model", facts.get("target") or {}, registry_used, version, False, overlay_classes,
                                title)
        rows += t_rows
        if facts.get("draft") is not None:  # the profile names a drafter (its engine's flag)
            rows += arch_rows("drafter", facts.get("draft") or {}, registry_used, version, True, overlay_classes,
                              title)[0]
    if cls is not None and cls not in overlay_classes:  # an external package's class replaces the built-in
        eagle3 = tuple(facts.get("eagle3_methods") or ())
        rows += eagle_rows(cls, registry_used, args.get("speculative-algorithm"), specs, mode, in_place, version,
                           called_methods(args.get("speculative-algorithm"),
                                          (facts.get("draft") or {}).get("config"), eagle3), eagle3=eagle3)
    rows += interface_rows(facts.get("spec_method"), facts.get("interface"), facts.get("allow_list"),
                           facts.get("model_type"), specs, mode, in_place, version, title)
    rows += aux_layer_rows(facts.get("draft"), str(facts.get("engine_title") or ""), facts.get("aux_default"))
    rows += shard_rows("model", (facts.get("target") or {}).get("shards"))
    if facts.get("draft") is not None:
        rows += shard_rows("drafter", (facts.get("draft") or {}).get("shards"))
    total = sum(((facts.get(k) or {}).get("shards") or {}).get("total") or 0 for k in ("target", "draft"))
    rows += memory_rows(total, facts.get("disk_free"), facts.get("mem_available"))
    return rows
