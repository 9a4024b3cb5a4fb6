"""The SGLang stand-in (provision/sandbox/standin.py) against real SGLang 0.5.9 / 0.5.10 trees.

The stand-in runs as a subprocess on a copy of the real ``sglang`` package from the wheel
(``extracted(version)``).  Only ``srt/models/`` is copied byte for byte; the rest of the tree
is hard-linked (the tests never write outside ``srt/models``, and they replace files there
instead of writing through a link).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from provision.logs.loadlog import LoadLog
from provision.sandbox import standin, standin_stubs, standin_yaml
from provision.sandbox.wheels import WheelUnavailable, extracted

STANDIN = Path(standin.__file__).resolve()
KIMI = "srt/models/kimi_k25.py"
EAGLE3_FLAGS = [
    "--trust-remote-code",
    "--speculative-algorithm", "EAGLE3",
    "--speculative-draft-model-path", "AQ-MedAI/Kimi-K25-eagle3",
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
]
METHODS = {
    "set_eagle3_layers_to_capture": (
        "    def set_eagle3_layers_to_capture(self, layer_ids=None):\n"
        "        self.language_model.set_eagle3_layers_to_capture(layer_ids)\n"
    ),
    "get_embed_and_head": (
        "    def get_embed_and_head(self):\n"
        "        return self.language_model.get_embed_and_head()\n"
    ),
    "set_embed_and_head": (
        "    def set_embed_and_head(self, embed, head):\n"
        "        self.language_model.set_embed_and_head(embed, head)\n"
    ),
}


# --------------------------------------------------------------------------- helpers (also used by test_loadlog)


def wheel_root(version: str) -> Path:
    try:
        return extracted(version)
    except WheelUnavailable as e:  # pragma: no cover - offline without a cache
        pytest.skip(f"sglang {version} wheel unavailable: {e}")


def _link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def copy_sglang(version: str, dest: Path) -> Path:
    """``dest/sglang``: a copy of the real package; ``srt/models`` is a real copy, the rest hard links."""
    src = wheel_root(version) / "sglang"
    out = dest / "sglang"
    shutil.copytree(src, out, copy_function=_link_or_copy, ignore=shutil.ignore_patterns("models"))
    for sub in sorted(src.rglob("models")):  # srt/models and any other "models" dir the ignore skipped
        rel = sub.relative_to(src)
        if sub.is_dir() and not (out / rel).exists():
            shutil.copytree(sub, out / rel)
    return out


def replace_file(path: Path, text: str) -> None:
    path.unlink()
    path.write_text(text, encoding="utf-8")


def add_methods(sglang_dir: Path, names) -> None:
    """Insert methods at the end of the KimiK25ForConditionalGeneration body (before EntryClass)."""
    path = sglang_dir / KIMI
    src = path.read_text(encoding="utf-8")
    i = src.index("\nEntryClass = [")
    body = "".join("\n" + METHODS[n] for n in names)
    replace_file(path, src[:i].rstrip("\n") + "\n" + body + "\n" + src[i:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def proc_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().decode().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def children_of(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (scan of /proc)."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                ppid = int(fh.read().decode().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    out, stack = set(), [pid]
    while stack:
        for c in kids.get(stack.pop(), []):
            out.add(c)
            stack.append(c)
    return out


class Standin:
    """A running stand-in with its stderr collected (and fed to a LoadLog) by a thread."""

    def __init__(self, sglang_dir: Path, flags: list[str], env: dict | None = None,
                 load_seconds: float = 0.3, warmup_seconds: float = 0.3, cwd: Path | None = None):
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("PROVISION_STANDIN_")}
        full_env.update({
            "PROVISION_STANDIN_LOAD_SECONDS": str(load_seconds),
            "PROVISION_STANDIN_WARMUP_SECONDS": str(warmup_seconds),
            "PROVISION_STANDIN_DRAIN_SECONDS": "0.3",
            "PYTHONUNBUFFERED": "1",
        })
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, str(STANDIN), "--sglang-dir", str(sglang_dir), *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env, cwd=cwd,
        )
        self.err = ""
        self.out = ""
        self.log = LoadLog()
        self.lock = threading.Lock()
        self.children_seen: set[int] = set()
        self._t_err = threading.Thread(target=self._pump, args=(self.proc.stderr, "err"), daemon=True)
        self._t_out = threading.Thread(target=self._pump, args=(self.proc.stdout, "out"), daemon=True)
        self._t_err.start()
        self._t_out.start()

    def _pump(self, stream, which):
        while True:
            data = stream.read1(65536) if hasattr(stream, "read1") else stream.read(4096)
            if not data:
                return
            text = data.decode("utf-8", "replace")
            with self.lock:
                if which == "err":
                    self.err += text
                    self.log.feed(text)
                else:
                    self.out += text

    def record_children(self) -> set[int]:
        kids = children_of(self.proc.pid)
        self.children_seen |= kids
        return kids

    def wait_for(self, predicate, timeout: float = 15.0, what: str = "condition") -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.record_children()
            with self.lock:
                if predicate(self):
                    return
            if self.proc.poll() is not None:
                self.finish()
                with self.lock:
                    if predicate(self):
                        return
                raise AssertionError(f"stand-in exited ({self.proc.returncode}) before {what}:\n{self.err[-3000:]}")
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}:\n{self.err[-3000:]}")

    def wait_text(self, text: str, timeout: float = 15.0) -> None:
        self.wait_for(lambda s: text in s.err, timeout, repr(text))

    def finish(self, timeout: float = 15.0) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._t_err.join(5)
        self._t_out.join(5)
        with self.lock:
            self.log.flush()
        return rc

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.finish()

    def kill(self) -> None:
        for pid in children_of(self.proc.pid) | self.children_seen:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def assert_tree_gone(self, timeout: float = 3.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            alive = [p for p in self.children_seen if proc_alive(p)]
            if not alive:
                return
            time.sleep(0.05)
        raise AssertionError(f"children still alive: {alive}")


def http(port: int, path: str, key: str | None = None, body: dict | None = None, timeout: float = 5.0):
    """(status, body bytes) of a request to the stand-in."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 data=json.dumps(body).encode() if body is not None else None)
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def base_flags(port: int, tp: int = 2) -> list[str]:
    return ["--model-path", "/models/Kimi-K2.5", "--tp-size", str(tp), "--host", "127.0.0.1", "--port", str(port)]


@pytest.fixture
def running():
    """Collects stand-ins started by a test and kills whatever is left at the end."""
    started: list[Standin] = []

    def start(*args, **kwargs) -> Standin:
        s = Standin(*args, **kwargs)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """Lazily made sglang trees: pristine 0.5.9, 0.5.9 with some methods added, broken, 0.5.10."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name in made:
            return made[name]
        base = tmp_path_factory.mktemp(name)
        version = "0.5.10" if name == "0.5.10" else "0.5.9"
        d = copy_sglang(version, base)
        if name == "patched":
            add_methods(d, list(METHODS))
        elif name == "eagle3-only":
            add_methods(d, ["set_eagle3_layers_to_capture"])
        elif name == "no-set-embed":
            add_methods(d, ["set_eagle3_layers_to_capture", "get_embed_and_head"])
        elif name == "syntax-error":
            src = (d / KIMI).read_text(encoding="utf-8")
            i = src.index("\nEntryClass = [")
            replace_file(d / KIMI, src[:i] + "\n  def set_eagle3_layers_to_capture(self):\n   pass\n" + src[i:])
        made[name] = d
        return d

    return get


# --------------------------------------------------------------------------- unit: flags, yaml, stubs


@pytest.mark.parametrize("version", ["0.5.9", "0.5.10"])
def test_flag_set_is_read_from_installed_server_args(version):
    spec = standin.read_server_args(wheel_root(version) / "sglang" / "srt" / "server_args.py")
    by_opt = {o: f for f in spec.flags for o in f.options}
    assert "--tp-size" in by_opt and by_opt["--tp-size"] is by_opt["--tensor-parallel-size"]
    assert by_opt["--enable-metrics"].kw["action"] == "store_true"
    assert by_opt["--speculative-algorithm"].kw["choices"] == ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]
    assert by_opt["--model-path"].kw.get("required") is True and "--model" in by_opt["--model-path"].options
    assert "--config" in by_opt
    assert len(spec.flags) > 300
    parser = standin.build_parser(spec)
    ns = parser.parse_args(["--model-path", "m", "--tp", "8", "--mem-fraction-static", "0.9",
                            "--speculative-algorithm", "EAGLE3", "--enable-metrics"])
    assert (ns.tensor_parallel_size, ns.mem_fraction_static, ns.enable_metrics) == (8, 0.9, True)
    assert ns.port == 30000 and ns.host == "127.0.0.1"
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-path", "m", "--speculative-algorithm", "EAGLE4"])


def test_flat_yaml_parser():
    text = (
        "# written by provision\n"
        "model-path: /models/Kimi-K2.5\n"
        "tp-size: 8\n"
        "mem-fraction-static: 0.9\n"
        "trust-remote-code: true\n"
        "enable-metrics: false\n"
        "api-key: 'it''s: secret'   # comment\n"
        'served-model-name: "kimi \\"k2\\""\n'
        "model-loader-extra-config: '{\"enable_multithread_load\": true}'\n"
        "host: ~\n"
        "cuda-graph-bs: [1, 2, 4]\n"
        "lora-paths:\n"
        "  - a\n"
        "  - b\n"
    )
    assert standin_yaml.parse_flat_yaml(text) == {
        "model-path": "/models/Kimi-K2.5", "tp-size": 8, "mem-fraction-static": 0.9,
        "trust-remote-code": True, "enable-metrics": False, "api-key": "it's: secret",
        "served-model-name": 'kimi "k2"', "model-loader-extra-config": '{"enable_multithread_load": true}',
        "host": None, "cuda-graph-bs": [1, 2, 4], "lora-paths": ["a", "b"],
    }
    assert standin_yaml.parse_flat_yaml("# nothing\n") is None
    with pytest.raises(ValueError):
        standin_yaml.parse_flat_yaml("a:\n  b: 1\n")


def test_stub_exec_of_real_model_files():
    """Every 0.5.9 model module imports under the stubs (no false 'not supported')."""
    models = wheel_root("0.5.9") / "sglang" / "srt" / "models"
    failures = []
    for p in sorted(models.glob("*.py")):
        if p.name in ("registry.py", "__init__.py"):
            continue
        with standin_stubs._StubImports():
            try:
                standin_stubs.exec_model_file(p, f"sglang.srt.models.{p.stem}")
            except Exception as e:  # noqa: BLE001
                failures.append(f"{p.name}: {e!r}")
    assert failures == []
    assert not any(isinstance(f, standin_stubs._StubFinder) for f in sys.meta_path)
    assert "torch" not in sys.modules or not isinstance(sys.modules["torch"], standin_stubs._StubModule)


@pytest.mark.parametrize("version,has", [("0.5.9", False), ("0.5.10", True)])
def test_probe_calls_methods_for_real(version, has):
    probe = standin_stubs.probe_model(wheel_root(version) / "sglang", None)
    assert probe.cls is not None and probe.cls.__name__ == "KimiK25ForConditionalGeneration"
    inst = probe.make_instance()
    if has:
        inst.set_eagle3_layers_to_capture(None)
        assert inst.get_embed_and_head() == ("embed", "head")
        inst.set_embed_and_head(1, 2)
        assert inst.language_model.calls == ["set_eagle3_layers_to_capture", "get_embed_and_head",
                                             "set_embed_and_head"]
    else:
        with pytest.raises(AttributeError, match="'KimiK25ForConditionalGeneration' object has no attribute "
                                                 "'set_eagle3_layers_to_capture'"):
            inst.set_eagle3_layers_to_capture(None)
        assert getattr(probe.cls, "get_embed_and_head", None) is None


# --------------------------------------------------------------------------- start-up failures


def test_pristine_059_eagle3_crashes_after_target_load(trees, running):
    port = free_port()
    s = running(trees("0.5.9"), base_flags(port, tp=2) + ["--api-key", "THEKEY"] + EAGLE3_FLAGS)
    s.wait_text("Load weight begin")
    # rank 0 may log before the main process has forked the detokenizer (SGLang's order too)
    s.wait_for(lambda s: len(s.children_seen) >= 3, what="two schedulers and a detokenizer")
    kids = s.record_children()
    assert len(kids) == 3  # two schedulers and a detokenizer
    assert not port_open(port)
    rc = s.finish()
    assert rc == -signal.SIGKILL, s.err[-2000:]
    err = s.err
    attr = "AttributeError: 'KimiK25ForConditionalGeneration' object has no attribute 'set_eagle3_layers_to_capture'"
    assert attr in err
    assert err.index("Load weight end") < err.index("KV Cache is allocated") < err.index("Capture cuda graph begin") \
        < err.index("Scheduler hit an exception: Traceback (most recent call last):") < err.index(attr) \
        < err.index("Received sigquit from a child process. It usually means the child failed.")
    assert "cuda_graph_runner.py" in err and "Uvicorn running" not in err
    assert "api_key='THEKEY'" in err  # the stand-in logs secrets like SGLang does
    s.assert_tree_gone()
    assert not port_open(port)


def test_only_get_embed_and_head_missing_crashes_after_draft_load(trees, running):
    s = running(trees("eagle3-only"), base_flags(free_port(), tp=2) + EAGLE3_FLAGS)
    rc = s.finish()
    assert rc == -signal.SIGKILL
    attr = "AttributeError: 'KimiK25ForConditionalGeneration' object has no attribute 'get_embed_and_head'"
    assert attr in s.err and "set_eagle3_layers_to_capture'" not in s.err
    assert s.err.index("Capture cuda graph end") < s.err.index("type=LlamaForCausalLMEagle3") < s.err.index(attr)
    assert "eagle_worker.py" in s.err


def test_syntax_error_means_architecture_not_supported(trees, running):
    s = running(trees("syntax-error"), base_flags(free_port(), tp=2) + EAGLE3_FLAGS)
    assert s.finish() == 1
    assert "Ignore import error when loading sglang.srt.models.kimi_k25: " in s.err
    assert ("ValueError: Model architectures ['KimiK25ForConditionalGeneration'] are not supported for now. "
            "Supported architectures: ") in s.err
    assert "Load weight begin" not in s.err


def test_unknown_flag_is_an_argparse_error(trees, running):
    s = running(trees("0.5.9"), ["--model-path", "/m", "--no-such-flag", "1"])
    assert s.finish() == 2
    assert "usage: launch_server.py" in s.err
    assert "error: unrecognized arguments: --no-such-flag 1" in s.err
    s = running(trees("0.5.9"), ["--model-path", "/m", "--speculative-algorithm", "EAGLE4"])
    assert s.finish() == 2 and "invalid choice: 'EAGLE4'" in s.err


@pytest.mark.parametrize("flags", [["--speculative-eagle-topk", "1"], ["--speculative-num-draft-tokens", "4"]])
def test_topk_or_draft_tokens_without_num_steps_fails(trees, running, flags):
    s = running(trees("0.5.9"), ["--model-path", "/m", "--speculative-algorithm", "EAGLE3",
                                 "--speculative-draft-model-path", "/d", *flags])
    assert s.finish() == 1
    assert s.err.rstrip().endswith("AssertionError")
    assert "server_args=" not in s.err


@pytest.mark.parametrize("no_yaml", ["", "1"])
def test_config_file(trees, running, tmp_path, no_yaml):
    port_file, port_cli = free_port(), free_port()
    cfg = tmp_path / "sglang.yaml"
    cfg.write_text(f"port: {port_file}\nenable-metrics: true\napi-key: 'from-file'\ntp-size: 1\n"
                   "model-loader-extra-config: '{\"enable_multithread_load\": true}'\n")
    env = {"PROVISION_STANDIN_NO_YAML": no_yaml}
    # honoured; flags on the command line win
    s = running(trees("0.5.9"), ["--model-path", "/m", "--config", str(cfg), "--port", str(port_cli)], env=env)
    s.wait_text("Uvicorn running")
    assert f"port={port_cli}," in s.err and "api_key='from-file'" in s.err and "enable_metrics=True" in s.err
    assert f"Uvicorn running on http://127.0.0.1:{port_cli} " in s.err
    assert "Multi-thread loading shards" in s.err
    assert s.terminate() == 0
    # --config=FILE is parsed by argparse and silently ignored
    s = running(trees("0.5.9"), ["--model-path", "/m", f"--config={cfg}"], env=env, load_seconds=5)
    s.wait_text("server_args=")
    assert "port=30000," in s.err and "api_key=None" in s.err and "enable_metrics=False" in s.err
    assert s.terminate() == 0
    # not YAML
    bad = tmp_path / "sglang.json"
    bad.write_text("{}")
    s = running(trees("0.5.9"), ["--model-path", "/m", "--config", str(bad)], env=env)
    assert s.finish() == 1 and "ValueError: Config file must be YAML format, got: .json" in s.err


# --------------------------------------------------------------------------- reaching ready


def test_patched_059_reaches_ready_and_serves(trees, running):
    port = free_port()
    key = "THEKEY-1234"
    s = running(trees("patched"), base_flags(port, tp=2) + ["--api-key", key, "--enable-metrics"] + EAGLE3_FLAGS,
                load_seconds=0.6, warmup_seconds=1.0)
    s.wait_text("Load weight begin")
    phases_while_closed = set()
    while True:  # the port is closed for the whole load
        if s.proc.poll() is not None:
            raise AssertionError(s.err[-3000:])
        phase = s.log.state.phase
        if port_open(port):
            break
        phases_while_closed.add(phase)
        s.record_children()
        time.sleep(0.03)
    assert {"target-weights", "cuda-graphs", "draft-weights"} <= phases_while_closed
    s.wait_for(lambda x: x.log.state.uvicorn_up, what="uvicorn")
    assert s.err.index("max_total_num_tokens=") < s.err.index("Uvicorn running on http://127.0.0.1:")
    assert len(s.children_seen) == 3
    # warm-up: /health 503, the info endpoints already answer (not readiness signals)
    assert not s.log.state.ready
    assert http(port, "/health") == (503, b"")
    assert http(port, "/health_generate")[0] == 503
    status, body = http(port, "/v1/models", key)
    assert status == 200 and json.loads(body)["data"][0]["id"] == "/models/Kimi-K2.5"
    assert http(port, "/model_info", key)[0] == 200 and http(port, "/get_model_info", key)[0] == 200
    status, body = http(port, "/server_info", key)
    assert status == 200 and json.loads(body)["tp_size"] == 2 and http(port, "/get_server_info", key)[0] == 200
    # --api-key protects everything but /health* and /metrics*
    assert http(port, "/v1/models") == (401, b'{"error": "Unauthorized"}')
    assert http(port, "/v1/models", "wrong")[0] == 401
    assert http(port, "/generate", None, {"text": "hi"})[0] == 401
    assert http(port, "/metrics")[0] == 200
    s.wait_text("The server is fired up and ready to roll!")
    assert http(port, "/health") == (200, b"")
    assert http(port, "/health_generate", "whatever")[0] == 200
    status, body = http(port, "/generate", key, {"text": "Hello", "sampling_params": {"max_new_tokens": 32}})
    meta = json.loads(body)["meta_info"]
    assert status == 200 and meta["completion_tokens"] == 32 and meta["prompt_tokens"] > 0
    # as tokenizer_manager computes it: completion_tokens / spec_verify_ct (about the configured 3.1)
    assert meta["spec_accept_length"] == pytest.approx(32 / meta["spec_verify_ct"], abs=1e-3)
    assert meta["spec_accept_length"] == pytest.approx(3.1, rel=0.05) and 0 < meta["spec_accept_rate"] <= 1
    assert "spec_accept_token_num" in meta and "spec_draft_token_num" in meta  # 0.5.9's names
    assert meta["e2e_latency"] > 0
    s.wait_text("Decode batch, #running-req: 1")
    assert "accept len: 3.10, accept rate: 0.78" in s.err
    status, body = http(port, "/metrics")
    text = body.decode()
    for name in ("sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:gen_throughput",
                 "sglang:generation_tokens_total"):
        assert f"\n{name}{{" in text
    assert 'sglang:generation_tokens_total{' in text and "} 32.0" in text
    # SIGTERM: drain (503), exit 0, whole tree gone
    s.proc.send_signal(signal.SIGTERM)
    saw_503 = False
    end = time.monotonic() + 3
    while time.monotonic() < end and s.proc.poll() is None:
        try:
            if http(port, "/health", timeout=1)[0] == 503:
                saw_503 = True
                break
        except OSError:
            break
        time.sleep(0.02)
    assert saw_503
    assert s.finish() == 0
    s.assert_tree_gone()
    assert not port_open(port)
    st = s.log.state
    assert st.ready and st.crashed is None and st.target.complete and st.draft.complete


def test_set_embed_and_head_missing_alone_does_not_crash(trees, running):
    port = free_port()
    s = running(trees("no-set-embed"), base_flags(port, tp=2) + EAGLE3_FLAGS)
    s.wait_text("The server is fired up and ready to roll!")
    assert http(port, "/health")[0] == 200
    assert s.terminate() == 0


def test_0510_pristine_reaches_ready(trees, running):
    port = free_port()
    s = running(trees("0.5.10"), base_flags(port, tp=1) + EAGLE3_FLAGS)
    s.wait_text("The server is fired up and ready to roll!")
    assert http(port, "/health")[0] == 200
    assert "[" in s.err and " TP0]" not in s.err  # no rank prefix with tp=1
    assert s.terminate() == 0


def test_without_speculative_decoding_059_is_fine(trees, running):
    port = free_port()
    s = running(trees("0.5.9"), base_flags(port, tp=1))
    s.wait_text("The server is fired up and ready to roll!")
    assert "LlamaForCausalLMEagle3" not in s.err and "Capture draft" not in s.err
    assert s.terminate() == 0


# --------------------------------------------------------------------------- process tree, faults


def test_sigterm_during_load_stops_the_whole_tree(trees, running):
    s = running(trees("patched"), base_flags(free_port(), tp=4) + EAGLE3_FLAGS, load_seconds=20)
    s.wait_for(lambda x: len(x.record_children()) == 5, what="5 children")
    assert s.terminate() == 0
    s.assert_tree_gone()


def test_children_die_with_a_killed_parent(trees, running):
    s = running(trees("patched"), base_flags(free_port(), tp=2) + EAGLE3_FLAGS, load_seconds=20)
    s.wait_for(lambda x: len(x.record_children()) == 3, what="3 children")
    s.proc.kill()
    s.finish()
    s.assert_tree_gone()


def test_fault_hang_keeps_port_closed(trees, running):
    port = free_port()
    s = running(trees("patched"), base_flags(port, tp=2) + EAGLE3_FLAGS,
                env={"PROVISION_STANDIN_FAULT": "hang", "PROVISION_STANDIN_HANG_AT": "50",
                     "PROVISION_STANDIN_SHARDS": "8"}, load_seconds=0.4)
    s.wait_for(lambda x: x.log.state.target is not None, what="the target bar")
    time.sleep(1.0)
    assert s.proc.poll() is None and not port_open(port)
    assert "Load weight end" not in s.err
    target = s.log.state.target
    assert target.shards_total == 8 and target.shards_done <= 4 and s.log.state.phase == "target-weights"
    assert s.terminate() == 0
    s.assert_tree_gone()


def test_fault_flap(trees, running):
    port = free_port()
    s = running(trees("patched"), base_flags(port, tp=1) + EAGLE3_FLAGS,
                env={"PROVISION_STANDIN_FAULT": "flap", "PROVISION_STANDIN_FLAP_EVERY": "2"})
    s.wait_text("ready to roll")
    codes = [http(port, "/health")[0] for _ in range(6)]
    assert codes == [200, 200, 503, 503, 200, 200]
    assert s.terminate() == 0


def test_shard_count_from_index_and_port_in_use(trees, running, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    files = [f"model-{i:05d}-of-00005.safetensors" for i in range(1, 6)]
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {f"w{i}": files[i % 5] for i in range(20)}}))
    (model / "config.json").write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"],
                                                   "model_type": "kimi_k25"}))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        s = running(trees("patched"), ["--model-path", str(model), "--port", str(port)])
        assert s.finish() == 1
    assert "5/5" in s.err and "6/5" not in s.err
    assert "error while attempting to bind" in s.err
    s.assert_tree_gone()


# --------------------------------------------------------------------------- registry behaviour


EXTERNAL_MODULE = '''
from typing import List, Optional

from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration as _Base


class KimiK25ForConditionalGeneration(_Base):
    def set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None) -> None:
        self.language_model.set_eagle3_layers_to_capture(layer_ids)

    def get_embed_and_head(self):
        return self.language_model.get_embed_and_head()

    def set_embed_and_head(self, embed, head):
        self.language_model.set_embed_and_head(embed, head)


EntryClass = [KimiK25ForConditionalGeneration]
'''


def test_external_model_package_fixes_the_crash(trees, running, tmp_path):
    pkg = tmp_path / "site" / "provision_eagle3_models"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "kimi_k25_eagle3.py").write_text(EXTERNAL_MODULE)
    (pkg / "broken.py").write_text("def oops(:\n")
    port = free_port()
    env = {"SGLANG_EXTERNAL_MODEL_PACKAGE": "provision_eagle3_models", "PYTHONPATH": str(tmp_path / "site")}
    s = running(trees("0.5.9"), base_flags(port, tp=1) + EAGLE3_FLAGS, env=env)
    s.wait_text("The server is fired up and ready to roll!")
    assert "Ignore import error when loading provision_eagle3_models.broken" in s.err
    assert "Scheduler hit an exception" not in s.err
    assert s.terminate() == 0
    assert not list(pkg.rglob("__pycache__"))  # the stand-in writes no bytecode
    # a package that cannot be imported at all is fatal, as in SGLang's registry
    env["SGLANG_EXTERNAL_MODEL_PACKAGE"] = "no_such_models_pkg"
    s = running(trees("0.5.9"), base_flags(free_port(), tp=1) + EAGLE3_FLAGS, env=env)
    assert s.finish() == 1 and "ModuleNotFoundError" in s.err


def test_backup_copy_in_models_dir_is_a_duplicate(tmp_path, running):
    d = copy_sglang("0.5.9", tmp_path)
    shutil.copy(d / KIMI, d / "srt/models/kimi_k25_backup.py")
    s = running(d, base_flags(free_port(), tp=1) + EAGLE3_FLAGS)
    assert s.finish() == 1
    assert "AssertionError: Duplicated model implementation for KimiK25ForConditionalGeneration" in s.err
    assert "Load weight begin" not in s.err
