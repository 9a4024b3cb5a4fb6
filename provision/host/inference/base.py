"""The one interface of an inference engine: what every verb asks of the server it launches.  STDLIB ONLY.

An implementation is data and pure functions (sglang.py): the layers above (facts, the patch
engine, ops, and on the control side config and tasks) ask it and do the work themselves. The
methods, by concern:

- install: ``package`` (the Python package an install is), ``title`` (its name in a sentence),
  ``is_install`` / ``install_marks`` (a package directory that is a real install), ``checkout_globs``
  (where source checkouts live; discovery in host/facts/installs.py)
- a profile's args: ``model_arg``, ``tp_arg``, ``draft_path``, ``check_args`` (what it refuses at
  start-up, said before a host is touched: config/profile.py)
- flags: ``source_files`` (where an install declares its flags and model classes), ``flag_reader``
  and ``registry_reader`` (the function that reads them, a ``module:function`` reference loaded by
  ``inference.load``; or ``OWN_PARSER``: ``parser_probe`` builds its real parser in the server's
  interpreter, host/facts/own_parser.py), ``flag_name`` (how its parser spells a profile's key),
  ``models_subdir`` (its model classes' folder: the registry), ``draft_architectures`` (the
  names it looks a drafter up by), ``spec_method`` (a speculative method only the install knows),
  ``spec_file_example`` (a spec's ``file`` in an error's example)
- start: ``launch_module`` (``python -m MODULE``), ``start_argv``, ``config_flag`` (how secrets reach
  it: a file its parser reads, never the command line), ``log_name``, ``log_reader`` (the module of
  the control side's reader of its start-up log: logs/readers.py loads it)
- processes: ``is_server`` (a command line of its server's main process), ``may_be_server`` (a cheap
  look at a raw command line first), ``is_orphan_worker`` (a worker of its tree, by its title)
- readiness: ``health_path``
- EAGLE-3: ``eagle3_methods`` (what a target class must have for its EAGLE-3 worker),
  ``eagle3_parity_method`` (what it calls on the draft), ``eagle3_protocol`` (where the release
  declares that interface, when it is a protocol), ``audit_reader`` (the function that finds the gaps:
  a ``module:function`` reference)
- overlay: ``overlay_style`` (how it loads a package of model classes on purpose: SGLang's
  ``external-package``, named by ``overlay_env``; vLLM's ``general-plugin``, an entry point whose
  ``register()`` replaces classes in its registry, filtered by ``overlay_plugins_env`` when set),
  ``overlay_min_version`` (the first release that does)
- bench: ``generate_path`` and ``generate_body`` (the streamed request it times), ``chunk_figures``
  (a chunk's tokens and speculative-decoding counts), ``server_info_paths`` and ``server_info``
  (the live state: version, tp size, the speculative settings and acceptance, newest name first),
  ``model_info_paths``, ``flush_path`` (host/ops/bench.py asks these)
"""

from __future__ import annotations

import os

# An engine's flag_reader or registry_reader that is its own parser, asked in the server's interpreter
# (host/facts/own_parser.py runs `parser_probe`): one run answers both.
OWN_PARSER = "own-parser"


class InferenceEngine:
    """What one inference engine is. Subclasses set the attributes and may override the functions."""

    name = "base"                 # the value of a profile's `launch.engine`, kept in the record
    title = "an inference engine"  # its name in a sentence
    article = "a"                 # before its title: "an SGLang flag", "a vLLM flag"
    package = ""                  # the Python package an install of it is (discovery)
    install_marks: tuple[str, ...] = ()  # directories inside the package that make it an install (not a stub)
    checkout_globs: tuple[str, ...] = ()  # where source checkouts of it live on a host (discovery)
    checkout_hint = ""            # those places, in a sentence
    launch_module = ""            # `python -m launch_module FLAGS...`: the default start command
    config_flag = "--config"      # a file of flags its parser reads: how secrets reach it off the command line
    health_path = "/health"       # readiness: 200 when it serves
    generate_path = "/generate"   # the bench's streamed generation request
    server_info_paths: tuple[str, ...] = ("/server_info",)  # the live state (the speculative-decoding
                                                            # figures), newest name first
    model_info_paths: tuple[str, ...] = ("/model_info",)  # the served model's path and class, newest name first
    flush_path = "/flush_cache"   # empties the cache before the bench (400: busy serving others)
    flush_secret = "api-key"      # the launch secret that path takes (SGLang: the admin key when there is one)
    secret_flags: tuple = ("api-key",)  # the secret flags its server takes (in its 0600 --config file)
    # the flags that say where a multi-node server's ranks meet (rank 0's address), as its parser names them
    multinode_addr_flags: tuple = ()

    def multinode_args(self, nnodes: int, rank: int, addr: str, port: int) -> dict:
        """The flags that place one rank of a multi-node server (`addr`:`port`: where the ranks meet)."""
        raise NotImplementedError(f"{self.title} servers are not spread over several hosts by provision")
    overlay_env = ""              # the variable naming a package of model classes it imports on purpose
    overlay_style = ""            # how it loads provision's overlay (engine/overlay.py's STYLES); "": it cannot
    overlay_min_version: tuple = ()  # the first release that loads it that way
    overlay_plugins_env = ""      # a variable that, when set, lists the plugins it loads (ours must be on it)
    overlay_offline = False       # its overlay renders from the specs alone (`overlay write`, no install read)
    eagle3_methods: tuple[str, ...] = ()  # what a target class needs for EAGLE-3
    eagle3_parity_method = ""     # called on the draft; a spec injects it for parity (none: "")

    def start_argv(self, python: str, module: str | None, flags: list[str]) -> list[str]:
        """The server's command line: the interpreter, the module (the profile's, else the engine's), the flags."""
        return [python, "-m", module or self.launch_module] + [str(f) for f in flags]

    # Bench figures read from the server's Prometheus text (an engine that reports speculative
    # decoding there, not per request): its path, and the metric names the host hands back, before
    # and after the measured requests (the control side parses them: output/metricsdelta.py).
    metrics_path: str = ""
    metrics_names: dict = {}   # role (drafts, draft_tokens, accepted, requests) -> the counter's name
    busy_metric: str = ""      # a gauge of requests in flight: above 0 before a bench, the server is busy
    waiting_metric: str = ""   # a gauge of requests queued, not running yet (in flight too, for a drain)

    def default_aux_layers(self, num_layers: int) -> tuple | None:
        """The target layers an EAGLE-3 drafter reads when its config.json names none, where the
        engine picks them without a word (preflight warns); None where it does not."""
        return None

    def log_name(self, port: int, stamp: str, n: int = 1) -> str:
        """The start-up log's file name for a server on `port` started at `stamp` (the n-th that second)."""
        return f"{self.name}-{port}-{stamp}.log" if n <= 1 else f"{self.name}-{port}-{stamp}-{n}.log"

    def log_glob(self, port: int) -> str:
        """Every start-up log `log_name` makes for `port` (what `keep_logs` prunes)."""
        return f"{self.name}-{port}-*.log"

    @property
    def install_shape(self) -> str:
        """What an install's package directory holds, in a sentence."""
        return "the dir holding " + " and ".join(("__init__.py",) + tuple(m + "/" for m in self.install_marks))

    def is_install(self, path: str) -> bool:
        """Is `path` a package directory of this engine (``__init__.py`` and every ``install_marks``)?"""
        return os.path.isfile(os.path.join(path, "__init__.py")) and \
            all(os.path.isdir(os.path.join(path, m)) for m in self.install_marks)

    # flags provision states because the engine's own default differs from provision's (a server on
    # loopback port 30000 unless the profile says otherwise), added to a profile's args it lacks
    implied_args: dict = {}
    model_arg = "model-path"      # the flag naming the target model (a profile's args key)
    tp_arg = "tp-size"            # the flag naming its tensor-parallel size
    flag_reader = ""              # "module:function" reading its flag declarations (source_files) into a
                                  # flag table, or OWN_PARSER; "": not read (its parser judges them at start)
    models_subdir = ""            # where an install keeps its model classes (the registry), relative to it
    registry_reader = ""          # "module:function" reading which classes it serves (install dir, engine, state dir),
                                  # or OWN_PARSER; "": not read
    audit_reader = ""             # "module:function" finding its EAGLE-3 gaps (engine, install dir) for
                                  # `provision audit`; "": no audit
    log_reader = ""               # the module of the control side's start-up log reader (LoadLog, hint)
    spec_file_example = "x.py"    # a spec's `file` as an error's example, relative to the package
    eagle3_protocol = ""          # the interface a target class must have for EAGLE-3, FILE:Class in the
                                  # package, read from the release (an interface spec's `protocol`); "": none
    eagle3_allow_list: tuple = ()  # (FILE, (names...)): a list of model types EAGLE-3 is allowed for,
                                  # bound to one of the names in FILE where a release has one; (): none
    parser_probe = ""             # for flag_reader "own-parser": the code that builds its real parser
                                  # in the server's interpreter (host/facts/own_parser.py)

    def draft_path(self, args: dict) -> str | None:
        """The EAGLE drafter's model path the profile's args name, or None."""
        return None

    def flag_name(self, name: str) -> str:
        """The option a profile's args key names, as the engine's parser reads it (without dashes)."""
        return name

    def spec_method(self, args: dict) -> str | None:
        """The speculative method the args name where only the install knows the methods (judged
        against the probe's list), else None."""
        return None

    def draft_architectures(self, archs: list[str], args: dict) -> list[str]:
        """The registry names the engine looks the drafter's config.json architectures up by."""
        return list(archs)

    def check_args(self, args: dict) -> list[str]:
        """What the engine would refuse at start-up, read from a profile's args before any host is
        touched: one sentence each (the caller prefixes where). Pure."""
        return [] if args.get(self.model_arg) else [f"launch.args.{self.model_arg} is required"]

    def spec_read_files(self, spec: dict) -> list[str]:
        """The files of its package (relative paths) that judging `spec` reads besides the spec's own
        `file`: an interface spec's protocol (where the release declares the members). An image's
        files are read from it by this list (host/ops/container.py)."""
        out = []
        if spec.get("kind") == "interface" and spec.get("protocol"):
            out.append(str(spec["protocol"]).partition(":")[0])
        return out

    def source_files(self, install_dir: str) -> dict:
        """The files of an install (its package directory) preflight reads: {"server_args": where it
        declares its server's flags, "fields": {name: path} (flags declared elsewhere), "choices"
        (a file of choices or None), "models": [the model classes' files]} (paths that exist)."""
        raise NotImplementedError

    serves_path = ""              # readiness, second half: a route naming the models it serves ("": none)

    def serves(self, body: bytes, args: dict) -> bool:
        """Does `serves_path`'s answer name the model the profile's args serve? Pure."""
        return True

    def generate_body(self, text: str, max_new_tokens: int) -> dict:
        """The bench's request: `text` greedy (temperature 0), `max_new_tokens`, streamed."""
        raise NotImplementedError

    def chunk_figures(self, chunk: dict) -> dict:
        """The figures one streamed chunk carries (completion_tokens, and the speculative-decoding
        counts where the engine reports them per request); {} for none."""
        raise NotImplementedError

    def server_info(self, info: object) -> dict:
        """The fields of the server-info answer the bench keeps (never the server's args: they can
        hold the API key); {} for an answer that is not an object."""
        raise NotImplementedError

    def is_server(self, argv: list[str]) -> bool:
        """Is this command line its server's main process (not a shell that names it)?"""
        raise NotImplementedError

    # A start-time flag that makes SIGTERM drain instead of abort, given the grace as its seconds,
    # added where the install's parser has it and the profile does not set it ("": none needed)
    drain_flag = ""

    def drain_remaining(self, log_text: str) -> int | None:
        """The requests still in flight, as the engine's own drain lines in `log_text` last said
        (None: it says nothing while it drains)."""
        return None

    def drain_aborted(self, log_text: str, in_flight: int | None) -> int | None:
        """The requests the engine itself aborted on SIGTERM instead of draining them, as its log since
        the signal says (`in_flight`: its busy gauge just before the signal); None: none."""
        return None

    def may_be_server(self, raw: bytes) -> bool:
        """A cheap look at a raw /proc cmdline before `is_server`: False only when it cannot be one."""
        return True

    def is_orphan_worker(self, argv: list[str], comm: str) -> bool:
        """Is this process (its command line, its /proc comm) a worker of the engine's process tree
        (a rank, an engine core), whatever its parent? Preflight counts one re-parented to init as
        a leftover that holds GPU memory."""
        return False
