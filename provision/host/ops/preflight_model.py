"""Preflight of the model: will the installed engine (SGLang by default) load what the profile names?  STDLIB ONLY.

One entry point, :func:`model_checks`, called by the preflight of a host's server
(ops/server.py) and of a container's (ops/container.py, on the image's files). It reads
(facts/model.py), judges (engine/modelcheck.py) and returns check rows; it starts nothing and
does not look at the port, so a restart can run it while the old server still holds the port.

The two costly reads of an install, its model registry (engine/audit.py's index of the engine's
``models_subdir``, SGLang's ``srt/models/*.py``) and its argument parser (the engine's
``flag_reader``: SGLang's reads srt/server_args.py with engine/serverargs.py; vLLM's, OWN_PARSER, is its
real parser asked in the server's interpreter, facts/own_parser.py, the only process preflight
starts), are cached per install in ``<state>/cache/preflight-<hash of the install path>.json``,
keyed by the path, mtime and size of every file they read (and the interpreter asked).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING, Callable

from provision.host import inference
from provision.host.inference.base import OWN_PARSER
from provision.host.engine import modelcheck, safetensors, serverargs
from provision.host.facts import model as facts
from provision.host.facts import own_parser
from provision.host.lib import atomic

if TYPE_CHECKING:
    from provision.host.inference.base import InferenceEngine

CACHE_VERSION = 2  # 2: the flag table has each flag's shape (nargs, type, switch)


def _cache_path(state_dir: str, sglang_dir: str) -> str:
    key = hashlib.sha256(os.path.abspath(sglang_dir).encode()).hexdigest()[:16]
    return os.path.join(state_dir, "cache", f"preflight-{key}.json")


def sglang_flags(src: dict) -> tuple[dict | None, str | None]:
    """SGLang's flag table from srt/server_args.py (and 0.5.14+'s arg_groups): (table, None) or (None, why)."""
    text, err = facts.read_text(src["server_args"])
    if text is None:
        return None, err
    fields = {}
    for name, path in src["fields"].items():
        t, _ = facts.read_text(path)
        if t is not None:
            fields[name] = t
    choices = facts.read_text(src["choices"])[0] if src.get("choices") else None
    try:
        return serverargs.flag_table(serverargs.parse_server_args(text, src["server_args"], fields or None, choices)), None
    except serverargs.ServerArgsUnreadable as exc:
        return None, str(exc)
    except (RecursionError, MemoryError, ValueError, TypeError) as exc:  # a parser this reader does not know
        return None, f"{src['server_args']}: not read ({type(exc).__name__}: {exc})"


def entry_class_registry(install_dir: str, engine: "InferenceEngine",
                         state_dir: str | None = None) -> tuple[dict | None, str | None]:
    """SGLang's registry: each module's EntryClass with the EAGLE-3 methods it lacks (engine/audit.py),
    each file's skeleton kept in `state_dir` between reads."""
    from provision.host.engine import audit

    models_dir = os.path.join(install_dir, engine.models_subdir)
    try:
        reg = {k: {"missing": v["missing"], "getattr": v["getattr"]}
               for k, v in audit.registry_of(models_dir, install_dir, state_dir).items()}
    except (OSError, RecursionError, ValueError) as exc:
        return None, f"{models_dir}: not read ({exc})"
    return (reg, None) if reg else (None, f"{models_dir}: no EntryClass found")


def _read_tables(install_dir: str, src: dict, engine: "InferenceEngine", python: str | None, env: dict | None,
                 state_dir: str | None = None) -> dict:
    out: dict = {"registry": None, "registry_error": None, "flags": None, "flags_error": None}
    asked: dict | None = None
    why = None
    if OWN_PARSER in (engine.flag_reader, engine.registry_reader):  # the release's own parser, in its interpreter
        asked, why = own_parser.ask(engine.parser_probe, python or "python3", dict(env or os.environ))
        why = f"{engine.title}'s own parser was not asked: {why}" if why else None
    if engine.flag_reader == OWN_PARSER:
        out["flags"], out["flags_error"] = (asked or {}).get("flags"), why
        out["spec_methods"] = (asked or {}).get("spec_methods")
    elif engine.flag_reader:  # the engine's reader of its declarations ("module:function")
        out["flags"], out["flags_error"] = inference.load(engine.flag_reader)(src)
    else:  # an engine whose declarations provision does not read: its own parser judges them at start
        out["flags_error"] = f"{engine.title}'s flags are not read by preflight; its own parser judges them at start"
    if engine.registry_reader == OWN_PARSER:
        archs = (asked or {}).get("archs")
        out["registry"] = {a: {"missing": None, "getattr": False} for a in archs} if isinstance(archs, list) else None
        out["registry_error"] = why or (None if out["registry"] else f"{engine.title}'s registry did not say its classes")
    elif engine.registry_reader:
        out["registry"], out["registry_error"] = inference.load(engine.registry_reader)(install_dir, engine, state_dir)
    else:
        out["registry_error"] = (f"{engine.title}'s model registry is not read by preflight; it says itself "
                                 "at start whether it has the class")
    return out


def install_tables(install_dir: str, state_dir: str | None, engine: str, python: str | None = None,
                   env: dict | None = None) -> dict:
    """The registry and the flag table of an install of `engine`, from the cache
    when no file it read changed (and, for an engine asked through its own parser, the interpreter
    `python` with the server's `env` is the same)."""
    eng = inference.get(engine)
    src = eng.source_files(install_dir)
    key = {"v": CACHE_VERSION, "dir": os.path.abspath(install_dir), "engine": eng.name,
           "files": facts.mtimes([src["server_args"], *src["fields"].values(), *([src["choices"]] if src["choices"]
                                                                                 else []), *src["models"]])}
    if OWN_PARSER in (eng.flag_reader, eng.registry_reader):
        key["python"] = python or "python3"
    path = _cache_path(state_dir, install_dir) if state_dir else None
    if path:
        try:
            with open(path) as fh:
                doc = json.load(fh)
            if doc.get("key") == key:
                return dict(doc["tables"], cached=True)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    tables = _read_tables(install_dir, src, eng, python, env, state_dir)
    if path and not (tables.get("flags") is None and eng.flag_reader == OWN_PARSER):
        try:  # an own-parser run that failed is asked again next time, not cached
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            atomic.write_json(path, {"key": key, "tables": tables}, durable=False)
        except OSError:
            pass  # a cache that cannot be written is only slower next time
    return dict(tables, cached=False)


def _overlay_classes(env: dict, eng: "InferenceEngine") -> tuple[list[str], str | None]:
    """The EntryClass names of the engine's external model package (SGLANG_EXTERNAL_MODEL_PACKAGE:
    they register over the built-ins); none for an engine that reads no such variable."""
    from provision.host.engine import audit

    pkg_dir, name = facts.external_package(env, eng.overlay_env)
    if name is None:
        return [], None
    if pkg_dir is None:
        return [], f"{eng.overlay_env}={name} is not on the server's PYTHONPATH: its classes not checked"
    try:
        return sorted(audit.registry_of(pkg_dir, pkg_dir)), None
    except (OSError, RecursionError, ValueError) as exc:
        return [], f"{pkg_dir}: not read ({exc})"


def _model_fact(path: str, env: dict, revision, locate: Callable[[str], str | None] | None,
                in_image: dict | None = None) -> dict:
    if locate is not None and not path.startswith("/"):
        return {"path": path, "skip": f"{path} is a hub id, read inside the container: not checked"}
    if locate is not None:
        host_path = locate(path)
        if host_path is None:  # only in the image: read there (image_models), else not checked
            got = (in_image or {}).get(path) or {}
            return got.get("fact") or {"path": path, "skip": got.get("error") or
                                       f"{path} is not on a volume and was not read in the image: not checked"}
        path_on_host = host_path
    else:
        path_on_host = path
    where = facts.resolve(path_on_host, env, revision)
    if where["dir"] is None:  # a local path that is not there: the path check (ops/checks.py) fails it, once
        return {"path": path, "skip": where["error"], "missing": not where["hub"]}
    fact = dict(facts.config(where["dir"]), path=path, dir=where["dir"])
    heads = facts.shard_heads(where["dir"])
    if heads is not None:
        total = 0
        for f in heads["files"]:
            head = f.pop("head", None)
            if "error" in f:
                continue
            total += f.get("size") or 0
            try:
                f["expected"] = safetensors.expected_size(head or b"")
            except safetensors.ShardError as exc:
                f["error"] = f"is not a whole safetensors file: {exc} ({f.get('size')} bytes)"
        heads["total"] = total
    fact["shards"] = heads
    return fact


def model_checks(req: dict, sglang_dir: str, version: str | None, env: dict, *, mode: str,
                 in_place: set | None = None, locate: Callable[[str], str | None] | None = None,
                 tables: dict | None = None, python: str | None = None, in_image: dict | None = None) -> list[dict]:
    """Check rows for the profile's model, drafter, flags and EAGLE-3 interface on this install.

    ``mode``: "edit" (the server imports the installed files) or "overlay" (launch --overlay, or a
    container: the overlay carries a delegation spec). ``in_place``: classes whose spec this
    preflight already checks. ``locate``: for a container, the host folder of a path in it.
    ``tables``: the install's registry and flag table when already read (an image's). ``python``:
    the server's interpreter (an engine whose own parser is asked runs it there). ``in_image``: what
    :func:`image_models` read of the paths on no volume."""
    try:
        return _model_checks(req, sglang_dir, version, env, mode=mode, in_place=in_place or set(), locate=locate,
                             tables=tables, python=python, in_image=in_image)
    except Exception as exc:  # noqa: BLE001 - bad input never crashes preflight: one warn row instead
        return [{"level": "warn", "check": "model", "message": f"model checks skipped: {type(exc).__name__}: {exc}"}]


def _model_checks(req: dict, sglang_dir: str, version: str | None, env: dict, *, mode: str, in_place: set,
                  locate, tables: dict | None, python: str | None, in_image: dict | None = None) -> list[dict]:
    args = dict((req.get("profile") or {}).get("args") or {})
    eng = inference.for_request(req)
    if tables is None:
        tables = install_tables(sglang_dir, req.get("state_dir") or _default_state_dir(), eng.name, python, env)
    registry = tables.get("registry")
    overlay_classes, overlay_err = _overlay_classes(env, eng)
    revision = args.get("revision")
    found: dict = {"args": args, "flag_names": {str(k): eng.flag_name(str(k)) for k in args}, "version": version,
                   "flags": tables.get("flags"), "flags_error": tables.get("flags_error"), "registry": registry,
                   "registry_error": tables.get("registry_error"), "overlay_classes": overlay_classes,
                   "engine_title": eng.title, "eagle3_methods": eng.eagle3_methods,
                   "spec_method": eng.spec_method(args),
                   "spec_methods": tables.get("spec_methods")}
    found["target"] = _model_fact(str(args.get(eng.model_arg) or ""), env, revision, locate, in_image)
    if eng.draft_path(args):
        found["draft"] = _model_fact(str(eng.draft_path(args)), env,
                                     args.get("speculative-draft-model-revision"), locate, in_image)
    for key in ("target", "draft"):  # SGLang's Transformers fallback, read only when the registry lacks the class
        f = found.get(key) or {}
        archs = (f.get("config") or {}).get("architectures") if isinstance(f.get("config"), dict) else None
        if key == "draft" and isinstance(archs, list) and all(isinstance(a, str) for a in archs):
            f["lookup"] = archs = eng.draft_architectures(archs, args)  # the names the engine looks up
        if registry is not None and isinstance(archs, list) and archs and not any(
                isinstance(a, str) and a in registry for a in archs):
            f["in_transformers"] = any(isinstance(a, str) and facts.transformers_has(sglang_dir, a) for a in archs)
    tcfg = (found["target"] or {}).get("config")
    if isinstance(tcfg, dict):  # the layer count, of the language model where the config nests one
        n = tcfg.get("num_hidden_layers") or (tcfg.get("text_config") or {}).get("num_hidden_layers")
        if isinstance(n, int) and not isinstance(n, bool):
            found["aux_default"] = eng.default_aux_layers(n)
    if eng.eagle3_protocol and str(found["spec_method"] or "").lower() == "eagle3":
        _interface_facts(found, sglang_dir, eng)
    target_dir = (found["target"] or {}).get("dir")
    found["disk_free"] = facts.disk_free(target_dir) if target_dir else None
    found["mem_available"] = facts.mem_available()
    specs = list(req.get("candidate_specs") or [])
    specs += [s for s in (req.get("specs") or []) + ([req["spec"]] if req.get("spec") else []) if s not in specs]
    rows = modelcheck.check(found, specs, mode, in_place)
    if eng.eagle3_protocol and str(found["spec_method"] or "").lower() == "eagle3":
        rows += proposer_rows(found, specs, sglang_dir, in_place, eng.title, version)
    if overlay_err:  # the external package's classes are unknown: what it may register is not refused
        rows = [dict(r, level="warn") if r["level"] == "fail" and r["check"] in ("architecture", "eagle3") else r
                for r in rows]
        rows.append({"level": "warn", "check": "architecture", "message": overlay_err})
    return rows


def proposer_rows(found: dict, specs: list, install_dir: str, in_place: set, title: str,
                  version: str | None) -> list[dict]:
    """The second half of EAGLE-3 on some multimodal targets (vLLM 0.32): the proposer copies
    config.image_token_index for every class it does not name, and a config without it dies in the
    drafter's load, after the weights. A `replace` spec whose `native_if` names the target's class
    and whose `find` the install's proposer still holds is not in place: refused, naming it (it is
    in place where the file holds `native_if`; a release without `find` does not read it)."""
    cfg = (found.get("target") or {}).get("config")
    archs = cfg.get("architectures") if isinstance(cfg, dict) else None
    if not (isinstance(archs, list) and archs and isinstance(archs[0], str)):
        return []
    cls = archs[0]
    text_cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    if "image_token_index" in cfg or "image_token_index" in text_cfg:
        return []
    rows = []
    for s in specs:
        if s.get("kind") != "replace" or s.get("native_if") != f'"{cls}"' or s.get("name") in in_place:
            continue
        try:
            with open(os.path.join(install_dir, str(s.get("file"))), encoding="utf-8") as fh:
                src = fh.read()
        except (OSError, UnicodeDecodeError):
            continue
        if str(s.get("native_if")) in src or str(s.get("find")) not in src or "image_token_index" not in src:
            continue
        rows.append({"level": "fail", "check": "eagle3", "spec": s.get("name"),
                     "message": f"{title} {version or ''}'s EAGLE proposer ({s.get('file')}) reads "
                                f"config.image_token_index of {cls}, whose config has none: the drafter's load "
                                f"would die with AttributeError after the weights; spec {s.get('name')} fixes it: "
                                f"`provision patch --playbook {s.get('name')}` (or launch --patch)"})
    return rows


def _interface_facts(found: dict, install_dir: str, eng: "InferenceEngine") -> None:
    """An engine whose EAGLE-3 interface is a protocol (vLLM): what the target's class lacks of it and
    the release's model-type allow-list with the target's text model type, read from the install's
    files (engine/audit_vllm.py); nothing when they cannot be read (an image's install)."""
    from provision.host.engine import audit_vllm

    cfg = (found.get("target") or {}).get("config")
    if not isinstance(cfg, dict):
        return
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str) and os.path.isdir(install_dir):
        found["interface"] = audit_vllm.target_interface(install_dir, eng.eagle3_protocol, archs[0])
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    found["model_type"] = text.get("model_type") if isinstance(text.get("model_type"), str) else None
    if eng.eagle3_allow_list and os.path.isdir(install_dir):
        found["allow_list"] = audit_vllm.allow_list(install_dir, *eng.eagle3_allow_list)


def _default_state_dir() -> str:
    from provision.host.lib.paths import default_state_dir

    return default_state_dir()


def with_covering_specs(req: dict, rows: list[dict]) -> dict:
    """launch --overlay without a spec of its own: the request with the candidate spec that covers
    the target class (found by the eagle3 row), so the overlay carries it. Specs it cannot carry
    (engine/overlay.is_overlayable: a value, another package's file) do not count as its own."""
    from provision.host.engine.overlay import is_overlayable

    own = [s for s in (req.get("specs") or ([req["spec"]] if req.get("spec") else [])) if is_overlayable(s)]
    if own:
        return req
    names = {r.get("spec") for r in rows if r.get("check") == "eagle3" and r.get("spec")}
    found = [s for s in req.get("candidate_specs") or [] if s.get("name") in names]
    return dict(req, specs=found) if found else req


# --------------------------------------------------------------------------- in a container image

IMAGE_TIMEOUT = 300.0


def main(request: bytes, bundle: bytes) -> int:
    """Entry in a throw-away container of an image (bootstrap_code(this module)): print the
    registry and flag table of the image's SGLang (the request's "sglang" path), nothing cached."""
    import sys

    from provision.host.bootstrap import RESULT_PREFIX

    req = json.loads(request)
    if "paths" in req:  # image_models: the model folders as the server will find them in the image
        from provision.host.ops.checks import check_model

        out: dict = {path: {"rows": check_model(path, what, False), "fact": _model_fact(path, {}, None, None)}
                     for path, what in req["paths"].items()}
    else:
        out = install_tables(req["sglang"], None, req.get("engine"), "python3")
    sys.stdout.write(RESULT_PREFIX + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


def _in_image(rt: str, img: dict, bundle: bytes, request: dict) -> tuple[object, str]:
    """:func:`main`'s answer to `request` from a throw-away container of the image
    (`RUNTIME run --rm -i --network none`, python3 -I -S, the host bundle on stdin): (answer, "")
    or (None, why not)."""
    import subprocess

    from provision.host.bootstrap import RESULT_PREFIX, bootstrap_code, frame

    try:
        p = subprocess.run([rt, "run", "--rm", "-i", "--network", "none", "--entrypoint", "python3",
                            str(img.get("image_id") or img.get("image")), "-I", "-S", "-c",
                            bootstrap_code("provision.host.ops.preflight_model")],
                           input=frame(bundle, json.dumps(request).encode()), capture_output=True,
                           timeout=IMAGE_TIMEOUT)
        for line in p.stdout.decode("utf-8", "replace").splitlines():
            if line.startswith(RESULT_PREFIX):
                return json.loads(line[len(RESULT_PREFIX):]), ""
        return None, (p.stderr.decode("utf-8", "replace").strip().splitlines() or [f"exit status {p.returncode}"])[-1]
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return None, str(exc)


def image_models(rt: str | None, img: dict, bundle: bytes, paths: dict[str, str]) -> dict:
    """The model folders on no volume (`paths`: container path -> "model"/"drafter"), read inside a
    throw-away container of the image, where the server will look: {path: {"rows": the path
    check's rows, "fact": what model_checks reads}} or {path: {"error": why not read}}."""
    if not paths or rt is None:
        return {}
    got, why = _in_image(rt, img, bundle, {"paths": paths})
    if not isinstance(got, dict):
        return {p: {"error": f"{p} is not on a volume and the image could not be read ({why}): not checked"}
                for p in paths}
    return got


def image_tables(rt: str, img: dict, bundle: bytes, state_dir: str, engine: str) -> dict:
    """The registry and flag table of an image's `engine`, read inside a throw-away container of it
    (`RUNTIME run --rm -i --network none`, python3 -I -S, the host bundle on stdin), cached per
    image id in <state>/images/."""
    key = str(img.get("image_id") or "unknown").replace(":", "-").replace("/", "-")
    cache = os.path.join(state_dir, "images", f"{key}-preflight-v{CACHE_VERSION}.json")
    try:
        with open(cache) as fh:
            doc = json.load(fh)
        if doc.get("sglang") == img.get("install") and doc.get("engine") == inference.get(engine).name:
            return dict(doc["tables"], cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    tables, why = _in_image(rt, img, bundle, {"sglang": img.get("install"), "engine": engine})
    if isinstance(tables, dict):
        try:
            os.makedirs(os.path.dirname(cache), mode=0o700, exist_ok=True)
            atomic.write_json(cache, {"sglang": img.get("install"), "engine": inference.get(engine).name,
                                      "tables": tables}, durable=False)
        except OSError:
            pass
        return dict(tables, cached=False)
    msg = f"the image's {inference.get(engine).title} was not read ({why})"
    return {"registry": None, "registry_error": msg, "flags": None, "flags_error": msg, "cached": False}


def image_model_checks(req: dict, rt: str | None, img: dict, bundle: bytes,
                       locate: Callable[[str], str | None], in_image: dict | None = None) -> list[dict]:
    """model_checks for a container launch: the image's registry and parser, the model paths
    through the volumes. The overlay carries a covering spec with --overlay; else the message
    says to launch with it."""
    if rt is None:
        return []
    eng = inference.for_request(req)
    try:
        tables = image_tables(rt, img, bundle, req.get("state_dir") or _default_state_dir(), eng.name)
    except Exception as exc:  # noqa: BLE001 - never crash preflight
        tables = {"registry": None, "registry_error": f"the image's {eng.title} was not read ({exc})", "flags": None,
                  "flags_error": f"the image's {eng.title} was not read ({exc})"}
    env = {str(k): str(v) for k, v in ((req.get("profile") or {}).get("env") or {}).items()}
    own = list(req.get("specs") or []) + ([req["spec"]] if req.get("spec") else [])
    return model_checks(req, str(img.get("install") or ""), img.get("version"), env,
                        mode="overlay" if req.get("overlay") else "container", locate=locate, tables=tables,
                        in_place={s.get("class") for s in own}, in_image=in_image)
